"""Broker maintenance mode: drain a broker's leaderships without taking it out of service.

A broker in maintenance stays in every ISR and keeps replicating; it is only ranked last
when a leader is chosen (`plan.choice_key`), so elections, preferred-leader rebalances and
the imbalance check all pass it over while another eligible replica exists, and it keeps a
leadership only where no other in-sync, unfenced replica could take it (better led than
leaderless).

`drain_leaders` moves its leaderships: an `isr` partition in one record to the replica
the election rule picks (every ISR member holds every committed record); a `quorum`
partition through the two-step election, which the broker in maintenance loses at equal
flushed logs (the tie-break) but wins if its flushed log is strictly ahead, since only
then is no acknowledged record lost. `MaintenanceDrain` remembers such a quorum attempt
and does not fence that partition again for `quorum_retry_ms`, so a partition is not
re-elected every controller tick while its followers catch up.
"""
from __future__ import annotations

from dataclasses import dataclass

from common.errors import UnknownBrokerError
from common.metadata.image import MetadataImage, PartitionInfo
from common.metadata.records import AlterBrokerState, PartitionChange, Record
from controller.decisions.plan import Plan, change, choose_leader, fence_for_election, is_quorum

MAINTENANCE_QUORUM_RETRY_MS = 5_000


def set_maintenance(image: MetadataImage, broker_id: int, enabled: bool) -> list[Record]:
    """Turn maintenance on (and drain at once) or off. Idempotent: no record when it already is.

    Turning it off moves nothing back by itself: the preferred-leader rebalance and the
    leader-imbalance check return leaderships to the broker as they would after a restart."""
    info = image.brokers.get(broker_id)
    if info is None:
        raise UnknownBrokerError(broker_id)
    if info.maintenance == enabled:
        return []
    plan = Plan(image)
    plan.add(AlterBrokerState(broker_id=broker_id, maintenance=enabled,
                              reason="maintenance on" if enabled else "maintenance off"))
    if enabled:
        plan.extend(drain_leaders(plan.image))
    return plan.records


def next_leader(image: MetadataImage, p: PartitionInfo) -> int | None:
    """Who should lead `p` instead of its leader in maintenance; None when nobody can."""
    chosen = choose_leader(image, p, p.isr)
    return None if chosen is None or chosen == p.leader else chosen


def drain_leaders(image: MetadataImage, skip: frozenset[tuple[str, int]] = frozenset()) -> list[Record]:
    """Records moving every leadership held by a broker in maintenance to a replica that can
    take it (partitions in `skip` excepted). Idempotent once applied: a moved partition is no
    longer led by a broker in maintenance, and a quorum partition fenced for its election has
    no leader."""
    records: list[Record] = []
    if not any(info.maintenance for info in image.brokers.values()):
        return records   # the common case, on every controller pass: nothing to look at
    for p in image.partitions():
        if p.leader is None or not image.in_maintenance(p.leader) or p.tp in skip:
            continue
        target = next_leader(image, p)
        if target is None:
            continue
        reason = f"broker {p.leader} is in maintenance"
        if is_quorum(image, p):
            records.append(fence_for_election(image, p, reason=reason))
        else:
            records.append(change(p, leader=target, reason=f"{reason}: leader {target}"))
    return records


@dataclass(frozen=True, kw_only=True)
class MaintenanceProgress:
    """What is left of draining one broker."""

    leaders: tuple[tuple[str, int], ...]       # partitions it still leads
    movable: tuple[tuple[str, int], ...]       # of those, ones another replica can take
    stuck: tuple[str, ...]                     # why the others stay (one line each)


def maintenance_progress(image: MetadataImage, broker_id: int) -> MaintenanceProgress:
    leaders, movable, stuck = [], [], []
    for p in image.partitions():
        if p.leader != broker_id:
            continue
        leaders.append(p.tp)
        if next_leader(image, p) is not None:
            movable.append(p.tp)
        else:
            stuck.append(f"{p.topic}-{p.partition}: no other in-sync, unfenced replica "
                         f"(isr {list(p.isr)}); it stays the leader")
    return MaintenanceProgress(leaders=tuple(leaders), movable=tuple(movable), stuck=tuple(stuck))


class MaintenanceDrain:
    """Runs `drain_leaders` on every periodic pass (leader memory only: the quorum retry).

    Bounded: at most one remembered attempt per partition, forgotten after `quorum_retry_ms`.
    """

    def __init__(self, *, quorum_retry_ms: int = MAINTENANCE_QUORUM_RETRY_MS) -> None:
        if quorum_retry_ms < 0:
            raise ValueError(f"quorum_retry_ms must be >= 0, got {quorum_retry_ms}")
        self.quorum_retry_ms = quorum_retry_ms
        self._quorum_tried_ms: dict[tuple[str, int], int] = {}

    def run(self, image: MetadataImage, now_ms: int) -> list[Record]:
        self._quorum_tried_ms = {tp: at for tp, at in self._quorum_tried_ms.items()
                                 if now_ms - at < self.quorum_retry_ms and image.get_partition(*tp) is not None}
        records = drain_leaders(image, skip=frozenset(self._quorum_tried_ms))
        for r in records:
            if isinstance(r, PartitionChange) and r.fenced_for_election:
                self._quorum_tried_ms[(r.topic, r.partition)] = now_ms
        return records
