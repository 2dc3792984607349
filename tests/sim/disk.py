"""Performing a Ready's persist actions on a MemoryLog, the way the broker will on disk."""
from __future__ import annotations

from dataplane.log.memory import MemoryLog
from dataplane.replica.actions import Append, Flush, Truncate, TruncateFully


def apply_persist(log: MemoryLog, ready, *, now_ms: int | None = None) -> tuple[list[int], list[Flush]]:
    """Apply Appends and truncations at once; return (last offsets written, flushes asked for).

    Checks the core's offset prediction against what the log assigned: a
    mismatch is our own broken invariant and fails loudly.
    """
    written: list[int] = []
    flushes: list[Flush] = []
    for action in ready.persist:
        if isinstance(action, Append):
            if action.as_leader:
                info = log.append_as_leader(action.records, leader_epoch=action.leader_epoch, now_ms=now_ms)
            else:
                info = log.append_as_follower(action.records, now_ms=now_ms)
            assert info.base_offset == action.base_offset, (info, action.base_offset)
            assert info.last_offset == action.last_offset, (info, action.last_offset)
            written.append(info.last_offset)
        elif isinstance(action, Truncate):
            log.truncate_to(action.offset)
            assert log.log_end_offset == action.offset, (log.log_end_offset, action.offset)
        elif isinstance(action, TruncateFully):
            log.truncate_fully_and_start_at(action.offset)
        elif isinstance(action, Flush):
            flushes.append(action)
        else:
            raise TypeError(f"unknown persist action {action!r}")
    return written, flushes
