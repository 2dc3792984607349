"""Kept so older imports work: the epoch comparison lives in common/epochs.py."""
from common.epochs import EpochCheck as EpochCheck, check_epoch as check_epoch
