"""The one epoch comparison every handler makes before touching state (docs/style.md#fence-first)."""
from __future__ import annotations

import enum


class EpochCheck(enum.Enum):
    STALE = "stale"      # the sender's epoch is older than ours: refuse, name both epochs
    CURRENT = "current"  # same epoch: go on
    NEWER = "newer"      # the sender knows a newer epoch: our metadata is stale, stop acting


def check_epoch(*, theirs: int, ours: int) -> EpochCheck:
    if theirs < ours:
        return EpochCheck.STALE
    if theirs > ours:
        return EpochCheck.NEWER
    return EpochCheck.CURRENT
