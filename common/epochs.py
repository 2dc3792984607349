"""The one leader-epoch comparison, for every process that is handed an epoch.

A handler compares the sender's epoch with its own before it touches state
(docs/style.md#fence-first): the replica core on every replication message, the
broker on client requests, the controller on ISR changes. Each asks
`check_epoch` and answers from its result, so "older", "same" and "newer" mean
the same thing everywhere. `leader_epoch_error` is the answer for a requester
that acted on its own view (a client or a leader asking the controller): older
is fenced, newer means our view is the old one.
"""
from __future__ import annotations

import enum

from common.errors import ErrorCode


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


def leader_epoch_error(check: EpochCheck) -> ErrorCode:
    """The code a requester gets for its leader epoch: NONE when current,
    FENCED_LEADER_EPOCH when older than ours, UNKNOWN_LEADER_EPOCH when newer."""
    if check is EpochCheck.STALE:
        return ErrorCode.FENCED_LEADER_EPOCH
    if check is EpochCheck.NEWER:
        return ErrorCode.UNKNOWN_LEADER_EPOCH
    return ErrorCode.NONE
