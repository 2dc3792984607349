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

from dataclasses import dataclass
from typing import Callable, Collection, Iterable

from common.errors import UnknownTopicOrPartitionError
from common.metadata.image import MetadataImage, PartitionInfo
from common.metadata.records import PartitionChange, Record
from controller.decisions.plan import change, choice_key, choose_leader, fence_for_election, is_quorum
from controller.decisions.reachability import ReachabilityReports

REBALANCE_INTERVAL_MS = 300_000
LEADER_IMBALANCE_CHECK_INTERVAL_MS = 5_000
LEADER_IMBALANCE_PER_BROKER_PERCENTAGE = 10
QUORUM_PREFERRED_RETRY_MS = 60_000


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


def ideal_leader(image: MetadataImage, p: PartitionInfo) -> int:
    """The replica that leads `p` when every replica is in sync and unfenced: the highest
    priority, ties by replica order (Kafka's preferred replica, the first, at equal priorities)."""
    return max(p.replicas, key=lambda b: choice_key(image, p, b))


@dataclass(frozen=True, slots=True, kw_only=True)
class BrokerImbalance:
    """One broker's leadership imbalance: of the partitions it ideally leads, how many it does not."""

    broker_id: int
    ideal: int
    not_led: int

    def exceeds(self, per_broker_percentage: int) -> bool:
        """Kafka's test: not_led / ideal > percentage / 100 (in integers, no rounding)."""
        return self.not_led * 100 > per_broker_percentage * self.ideal


def leader_imbalance(image: MetadataImage) -> dict[int, BrokerImbalance]:
    """Per broker that is the ideal leader of at least one partition, its imbalance."""
    ideal: dict[int, int] = {}
    not_led: dict[int, int] = {}
    for p in image.partitions():
        b = ideal_leader(image, p)
        ideal[b] = ideal.get(b, 0) + 1
        if p.leader != b:
            not_led[b] = not_led.get(b, 0) + 1
    return {b: BrokerImbalance(broker_id=b, ideal=n, not_led=not_led.get(b, 0))
            for b, n in sorted(ideal.items())}


def elect_imbalanced(image: MetadataImage, *, per_broker_percentage: int,
                     skip: Callable[[PartitionInfo], bool] | None = None,
                     only: Collection[tuple[str, int]] | None = None) -> list[Record]:
    """The leader-imbalance check: for every broker whose imbalance exceeds
    `per_broker_percentage`, move to it each of its ideal partitions it can lead now
    (it is unfenced and in the ISR; the partition has a leader; `skip` does not say no),
    among `only` those partitions when given.

    `isr` partitions move in one record, `quorum` ones are fenced for an election,
    as in `elect_preferred`. Idempotent: with these records applied, it returns nothing.
    """
    if not 0 <= per_broker_percentage <= 100:
        raise ValueError(f"per_broker_percentage must be in 0..100, got {per_broker_percentage}")
    over = {b: i for b, i in leader_imbalance(image).items()
            if i.exceeds(per_broker_percentage) and image.is_unfenced(b)}
    records: list[Record] = []
    if not over:
        return records
    if only is None:
        selected: Iterable[PartitionInfo] = image.partitions()
    else:
        selected = [p for p in (image.get_partition(*tp) for tp in sorted(only)) if p is not None]
    for p in selected:
        if p.leader is None:
            continue
        b = ideal_leader(image, p)
        if b not in over or b == p.leader or b not in p.isr or (skip is not None and skip(p)):
            continue
        i = over[b]
        reason = (f"preferred leader {b}: leader imbalance, it leads {i.ideal - i.not_led} of its "
                  f"{i.ideal} partitions (threshold {per_broker_percentage}%)")
        records.append(_move_to_preferred(image, p, b, reason=reason))
    return records


def _move_to_preferred(image: MetadataImage, p: PartitionInfo, preferred: int, *,
                       reason: str) -> PartitionChange:
    if is_quorum(image, p):
        return fence_for_election(image, p, reason=reason)
    return change(p, leader=preferred, reason=reason)


class IntervalTimer:
    """Says when a periodic step is due (leader memory only)."""

    def __init__(self, *, interval_ms: int) -> None:
        if interval_ms <= 0:
            raise ValueError(f"interval_ms must be > 0, got {interval_ms}")
        self.interval_ms = interval_ms
        self._last_ms: int | None = None

    def due(self, now_ms: int) -> bool:
        """True at most once per interval; the first call starts the clock."""
        if self._last_ms is None:
            self._last_ms = now_ms
            return False
        if now_ms - self._last_ms >= self.interval_ms:
            self._last_ms = now_ms
            return True
        return False


class LeaderImbalanceCheck:
    """Runs `elect_imbalanced` every `check_interval_ms`, and early for a partition whose
    ideal leader has just rejoined its ISR (`isr_changed`; leader memory only).

    The early run hands a leadership back within a periodic pass of the rejoin rather than
    up to a whole interval later: a move still pending when the next fault strikes lands in
    the middle of it. A new leader gives every ISR follower a whole
    `replica_lag_time_max_ms` from its epoch start (Kafka's rule), so a move while a
    follower is cut off keeps acks=all waiting on that follower that much longer than the
    old leader would have. For the same reason no `isr` partition is moved for balance while
    a link of its leader with an ISR follower is reported broken (`ReachabilityReports.broken`;
    a follower out of the ISR is waited for by no leader, and a `quorum` partition commits
    without the cut one under any leader). The reports come only after the brokers' link
    bound (a second or more), so the early run is what keeps moves out of a fault's first
    second. A partition is moved early at most once per interval.

    A quorum partition's move is an election the preferred replica can lose (a
    replica with a longer flushed log wins); such a partition is not fenced again
    by this check for `quorum_retry_ms`, so a busy partition is not re-elected every
    few seconds. Bounded: at most one remembered attempt per partition, and one rejoin
    and one early move per partition.
    """

    def __init__(self, *, check_interval_ms: int = LEADER_IMBALANCE_CHECK_INTERVAL_MS,
                 per_broker_percentage: int = LEADER_IMBALANCE_PER_BROKER_PERCENTAGE,
                 quorum_retry_ms: int = QUORUM_PREFERRED_RETRY_MS) -> None:
        if not 0 <= per_broker_percentage <= 100:
            raise ValueError(f"per_broker_percentage must be in 0..100, got {per_broker_percentage}")
        if quorum_retry_ms < 0:
            raise ValueError(f"quorum_retry_ms must be >= 0, got {quorum_retry_ms}")
        self.timer = IntervalTimer(interval_ms=check_interval_ms)
        self.per_broker_percentage = per_broker_percentage
        self.quorum_retry_ms = quorum_retry_ms
        self._quorum_tried_ms: dict[tuple[str, int], int] = {}
        self._rejoined: set[tuple[str, int]] = set()
        self._moved_early_ms: dict[tuple[str, int], int] = {}

    def isr_changed(self, image: MetadataImage, p: PartitionInfo, new_isr: Collection[int]) -> None:
        """An accepted change of `p`'s ISR (`image`, `p`: before it) to `new_isr`: when it
        brings back the ideal leader, which does not lead, the next run looks at `p`."""
        ideal = ideal_leader(image, p)
        if p.leader is not None and p.leader != ideal and ideal in new_isr and ideal not in p.isr:
            self._rejoined.add(p.tp)

    def run(self, image: MetadataImage, now_ms: int, reachability: ReachabilityReports | None = None) -> list[Record]:
        due = self.timer.due(now_ms)
        if not due and not self._rejoined:
            return []
        self._moved_early_ms = {tp: at for tp, at in self._moved_early_ms.items()
                                if now_ms - at < self.timer.interval_ms and image.get_partition(*tp) is not None}
        self._quorum_tried_ms = {tp: at for tp, at in self._quorum_tried_ms.items()
                                 if now_ms - at < self.quorum_retry_ms
                                 and image.get_partition(*tp) is not None}
        only = None if due else self._rejoined - self._moved_early_ms.keys()
        self._rejoined = set()
        if only is not None and not only:
            return []

        def skip(p: PartitionInfo) -> bool:
            if p.tp in self._quorum_tried_ms:
                return True
            if reachability is None or is_quorum(image, p):
                return False   # a quorum commits without the cut follower, under any leader
            return bool(reachability.broken(image, p, now_ms) & set(p.isr))

        records = elect_imbalanced(image, per_broker_percentage=self.per_broker_percentage, skip=skip, only=only)
        for r in records:
            if isinstance(r, PartitionChange) and r.fenced_for_election:
                self._quorum_tried_ms[(r.topic, r.partition)] = now_ms
            if only is not None and isinstance(r, PartitionChange):
                self._moved_early_ms[(r.topic, r.partition)] = now_ms
        return records
