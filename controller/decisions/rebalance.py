"""Preferred-leader election: move leadership back to the replica that should lead.

The preferred leader is the eligible replica the election itself would pick:
in the ISR, unfenced, highest priority, ties by replica order (so with equal
priorities it is the first replica, as in Kafka, once that one is in sync).
Using the same choice as the election means a rebalance right after an
election changes nothing.

`isr` topics move leadership in one record: every ISR member holds every
committed record. `quorum` topics do not: an ISR member may still miss records
acknowledged by q others, so the move goes through the two-step election (the
preferred replica wins it when its flushed log ties the best, by priority and
replica order); and only when the preferred replica is in the ISR, so a
lagging one does not cost an election for nothing.
"""
from __future__ import annotations

from typing import Iterable

from common.metadata.errors import UnknownTopicOrPartitionError
from common.metadata.image import MetadataImage, PartitionInfo
from common.metadata.records import Record
from controller.decisions.plan import change, choose_leader, fence_for_election, is_quorum

REBALANCE_INTERVAL_MS = 300_000


def preferred_leader(image: MetadataImage, p: PartitionInfo) -> int | None:
    return choose_leader(image, p, p.isr)


def elect_preferred(image: MetadataImage,
                    partitions: Iterable[tuple[str, int]] | None = None) -> list[Record]:
    """Records moving leadership to the preferred replica, for the given or all partitions.

    Leaderless partitions are skipped: the regular election handles them.
    """
    if partitions is None:
        selected = list(image.partitions())
    else:
        selected = []
        for topic, partition in partitions:
            p = image.get_partition(topic, partition)
            if p is None:
                raise UnknownTopicOrPartitionError(topic, partition)
            selected.append(p)
    records: list[Record] = []
    for p in selected:
        if p.leader is None:
            continue
        preferred = preferred_leader(image, p)
        if preferred is None or preferred == p.leader:
            continue
        if is_quorum(image, p):
            records.append(fence_for_election(image, p, reason=f"preferred leader {preferred}"))
        else:
            records.append(change(p, leader=preferred, reason="preferred leader"))
    return records


class RebalanceTimer:
    """Says when the periodic preferred-leader rebalance is due (leader memory only)."""

    def __init__(self, *, rebalance_interval_ms: int = REBALANCE_INTERVAL_MS) -> None:
        if rebalance_interval_ms <= 0:
            raise ValueError(f"rebalance_interval_ms must be > 0, got {rebalance_interval_ms}")
        self.rebalance_interval_ms = rebalance_interval_ms
        self._last_ms: int | None = None

    def due(self, now_ms: int) -> bool:
        """True at most once per interval; the first call starts the clock."""
        if self._last_ms is None:
            self._last_ms = now_ms
            return False
        if now_ms - self._last_ms >= self.rebalance_interval_ms:
            self._last_ms = now_ms
            return True
        return False
