"""High-watermark arithmetic: pure functions of offsets, no state.

All offsets are exclusive ends ("every offset below this"). A replica's
*stored* offset is what the commit rule may count for it:

- durability=fsync counts flushed data, durability=write counts written data;
- a follower counts only up to its *match offset*, the end of the prefix the
  leader has verified (through an epoch-checked fetch) to equal its own log.
  A follower's flushed data may reach into an old epoch's entries that the
  leader does not have; counting them would acknowledge records no replica
  keeps (the lazy-flush RFC's `match_committed_index`).

The high watermark (HW) is the greatest offset stored on a *required set*:
all of (ISR ∪ proposed ISR) for commit_policy=isr, any `quorum_required_acks`
replicas including the leader for commit_policy=quorum. It only counts
offsets of the leader's own epoch (Raft's rule against the "figure 8" loss):
until some required set stores past `epoch_start_offset` (the leader's
epoch-start batch), the HW does not move. It never moves back.
"""
from __future__ import annotations

from collections.abc import Collection, Mapping

DURABILITIES = ("fsync", "write")
COMMIT_POLICIES = ("isr", "quorum")


def stored_offset(*, written_offset: int, flushed_offset: int, durability: str) -> int:
    """What a replica holds for the commit rule under `durability`."""
    if durability == "fsync":
        return flushed_offset
    if durability == "write":
        return written_offset
    raise ValueError(f"durability {durability!r} is not one of {DURABILITIES}")


def follower_stored_offset(*, written_offset: int, flushed_offset: int, match_offset: int,
                           durability: str) -> int:
    """A follower counts only the part of its stored log known to match the leader's."""
    stored = stored_offset(written_offset=written_offset, flushed_offset=flushed_offset,
                           durability=durability)
    return min(stored, match_offset)


def commit_candidate(*, leader_id: int, stored: Mapping[int, int], commit_policy: str,
                     required_isr: Collection[int] = (), quorum_required_acks: int = 0) -> int | None:
    """The greatest offset stored on some required set, or None if no set can be formed.

    `stored` maps replica id -> stored offset (the leader's own entry included);
    a replica without an entry has stored nothing we know of (0).
    """
    leader_stored = stored.get(leader_id, 0)
    if commit_policy == "isr":
        # The leader always belongs to the set: it serves the committed data.
        return min([leader_stored] + [stored.get(r, 0) for r in required_isr if r != leader_id])
    if commit_policy == "quorum":
        if quorum_required_acks < 1:
            raise ValueError(f"quorum_required_acks must be >= 1, got {quorum_required_acks}")
        others = sorted((v for r, v in stored.items() if r != leader_id), reverse=True)
        need = quorum_required_acks - 1
        if need == 0:
            return leader_stored
        if len(others) < need:
            return None
        return min(leader_stored, others[need - 1])
    raise ValueError(f"commit_policy {commit_policy!r} is not one of {COMMIT_POLICIES}")


def next_high_watermark(*, high_watermark: int, epoch_start_offset: int, leader_id: int,
                        stored: Mapping[int, int], commit_policy: str,
                        required_isr: Collection[int] = (), quorum_required_acks: int = 0) -> int:
    """The leader's new HW: the commit candidate if it passes the epoch start, never lower."""
    candidate = commit_candidate(leader_id=leader_id, stored=stored, commit_policy=commit_policy,
                                 required_isr=required_isr, quorum_required_acks=quorum_required_acks)
    if candidate is None or candidate <= epoch_start_offset:
        return high_watermark
    return max(high_watermark, candidate)
