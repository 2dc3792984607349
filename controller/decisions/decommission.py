"""Broker decommission: move every replica off a broker, then fence it for good.

1. `start_decommission` marks the broker `decommissioning` (no new replica is placed on
   it: `MetadataImage.placeable_broker_ids`). It refuses when some partition on it could
   not keep its replication factor: no other live broker outside its replica set.
2. `decommission_moves`, on every periodic pass, starts reassignments of the broker's
   partitions: each replica set with the broker replaced, in its place, by the least
   loaded placeable broker not already in it (fewest replicas, then lowest id), counting
   the moves decided before it. At most `moves_max` partitions move off one broker at a
   time, so catching up does not take every link at once. A partition already being
   reassigned, or without a leader, waits. The reassignment's own steps (grow, catch up,
   shrink and re-elect if the leader leaves: `reassignment.py`) do the rest.
3. Once no partition lists the broker it is fenced (its session ends) and marked
   `decommissioned`; a decommissioned broker is never unfenced again, even when its
   process heartbeats or registers anew.
`recommission` cancels it: the moves still running go back to their original replicas
(where one of those is in sync), the marks are cleared, and a live broker is unfenced on
its next heartbeat. Moves already finished stay.
"""
from __future__ import annotations

from dataclasses import dataclass

from common.errors import InvalidFieldError, InvalidReplicationFactorError, UnknownBrokerError
from common.metadata.image import MetadataImage, PartitionInfo
from common.metadata.records import AlterBrokerState, Record
from common.requests import ReassignmentRequest
from controller.decisions.plan import Plan
from controller.decisions.reassignment import cancel_reassignment, start_reassignment
from controller.decisions.sessions import fence_broker

DECOMMISSION_MOVES_MAX = 8


def _hosted(image: MetadataImage, broker_id: int) -> list[PartitionInfo]:
    return [p for p in image.partitions() if broker_id in p.replicas]


def replica_load(image: MetadataImage) -> dict[int, int]:
    """Replicas per placeable broker (a reassignment's added replicas count already)."""
    load = {b: 0 for b in image.placeable_broker_ids()}
    for p in image.partitions():
        for b in p.replicas:
            if b in load:
                load[b] += 1
    return load


def replacement(load: dict[int, int], p: PartitionInfo) -> int | None:
    """The least loaded placeable broker (a key of `load`) not already a replica of `p`
    (fewest replicas, then lowest id); None when there is none."""
    candidates = [b for b in load if b not in p.replicas]
    if not candidates:
        return None
    return min(candidates, key=lambda b: (load[b], b))


def start_decommission(image: MetadataImage, broker_id: int, now_ms: int, *,
                       moves_max: int = DECOMMISSION_MOVES_MAX) -> list[Record]:
    """Mark the broker and decide its first moves. Idempotent: nothing when already marked."""
    info = image.brokers.get(broker_id)
    if info is None:
        raise UnknownBrokerError(broker_id)
    if info.decommissioning:
        return []
    others = [b for b in image.placeable_broker_ids() if b != broker_id]
    short = [p for p in _hosted(image, broker_id)
             if not [b for b in others if b not in p.replicas]]
    if short:
        p = short[0]
        raise InvalidReplicationFactorError(
            f"cannot decommission broker {broker_id}: {len(short)} partition(s) it hosts would lose a replica, "
            f"e.g. {p.topic}-{p.partition} with replication factor {len(p.target_replicas)} on brokers "
            f"{list(p.replicas)}, and no other live broker can take it (live brokers besides it: {others}); "
            "start another broker, or lower the replication factor by reassigning those partitions first",
            field="broker_id", value=broker_id)
    plan = Plan(image)
    plan.add(AlterBrokerState(broker_id=broker_id, decommissioning=True, reason="decommission"))
    plan.extend(decommission_moves(plan.image, now_ms, moves_max=moves_max))
    return plan.records


def decommission_moves(image: MetadataImage, now_ms: int, *,
                       moves_max: int = DECOMMISSION_MOVES_MAX) -> list[Record]:
    """For every broker being decommissioned: the next reassignments off it, or, once it
    hosts nothing, its fence and the `decommissioned` mark."""
    if moves_max < 1:
        raise ValueError(f"moves_max must be >= 1, got {moves_max}")
    plan = Plan(image)
    for broker_id in sorted(b for b, info in image.brokers.items()
                            if info.decommissioning and not info.decommissioned):
        hosted = _hosted(plan.image, broker_id)
        if not hosted:
            plan.extend(fence_broker(plan.image, broker_id, now_ms, reason="decommissioned"))
            if plan.image.brokers[broker_id].fenced:
                plan.add(AlterBrokerState(broker_id=broker_id, decommissioned=True,
                                          reason="every replica moved off"))
            continue
        moving = sum(1 for p in hosted if broker_id in p.removing)
        load = replica_load(plan.image)
        for p in hosted:
            if moving >= moves_max:
                break
            if p.reassigning or p.leader is None:
                continue
            new = replacement(load, p)
            if new is None:
                continue
            load[new] += 1
            target = tuple(new if b == broker_id else b for b in p.replicas)
            plan.extend(start_reassignment(plan.image, ReassignmentRequest(
                topic=p.topic, partition=p.partition, target_replicas=target)))
            moving += 1
    return plan.records


def recommission(image: MetadataImage, broker_id: int) -> list[Record]:
    """Cancel a decommission. Idempotent: nothing when the broker is not marked."""
    info = image.brokers.get(broker_id)
    if info is None:
        raise UnknownBrokerError(broker_id)
    if not info.decommissioning and not info.decommissioned:
        return []
    plan = Plan(image)
    for p in list(plan.image.partitions()):
        if broker_id in p.removing:
            try:
                plan.extend(cancel_reassignment(plan.image, p.topic, p.partition))
            except InvalidFieldError:
                continue   # none of its original replicas is in sync: the move finishes
    plan.add(AlterBrokerState(broker_id=broker_id, decommissioning=False, decommissioned=False,
                              reason="recommission"))
    return plan.records


@dataclass(frozen=True, kw_only=True)
class DecommissionProgress:
    hosted: tuple[tuple[str, int], ...]     # partitions still listing the broker
    moving: tuple[tuple[str, int], ...]     # of those, ones being moved off it now
    stuck: tuple[str, ...]                  # why some cannot move (one line each)


def decommission_progress(image: MetadataImage, broker_id: int) -> DecommissionProgress:
    hosted, moving, stuck = [], [], []
    load = replica_load(image)
    for p in _hosted(image, broker_id):
        hosted.append(p.tp)
        if broker_id in p.removing:
            moving.append(p.tp)
        elif p.leader is None:
            stuck.append(f"{p.topic}-{p.partition} has no leader; it moves once one is elected")
        elif not p.reassigning and replacement(load, p) is None:
            stuck.append(f"{p.topic}-{p.partition}: no live broker outside its replicas {list(p.replicas)}")
    return DecommissionProgress(hosted=tuple(hosted), moving=tuple(moving), stuck=tuple(stuck))
