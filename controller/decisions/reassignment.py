"""Partition reassignment in three recorded steps.

1. grow: replicas = target + (old − target), adding = target − old,
   removing = old − target (one record; the target's first broker becomes the
   preferred leader).
2. catch up: nothing to record; new replicas fetch and the leader adds them to
   the ISR through ordinary ISR changes.
3. shrink, once every target replica is in the ISR: replicas = target,
   ISR ∩ target, adding and removing cleared. If the leader is leaving, an
   `isr` topic elects from the new ISR in the same record; a `quorum` topic
   is fenced for a two-step election among the target replicas.
A leaderless partition does not progress (its election comes first).
"""
from __future__ import annotations

from common.errors import BiplaneError, InvalidFieldError, UnknownBrokerError
from common.metadata.image import MetadataImage, PartitionInfo
from common.metadata.records import NO_LEADER, AlterClusterConfig, PartitionChange, Record
from common.requests import CancelReassignmentsRequest, ReassignmentPlanRequest, ReassignmentRequest
from controller.decisions.plan import (
    Plan,
    ReplicaSetFields,
    change,
    choose_leader,
    fence_for_election,
    is_quorum,
)


def start_reassignment(image: MetadataImage, request: ReassignmentRequest) -> list[Record]:
    p = image.partition(request.topic, request.partition)
    target = tuple(request.target_replicas)
    if len(set(target)) != len(target) or not target:
        raise InvalidFieldError(f"target_replicas {list(target)} must be distinct and "
                                f"non-empty", field="target_replicas", value=target)
    for b in target:
        if b not in image.brokers:
            raise UnknownBrokerError(b, field="target_replicas")
        if image.brokers[b].decommissioning and b not in p.replicas:
            raise InvalidFieldError(f"broker {b} is being decommissioned; it takes no new replica "
                                    f"(recommission it first)", field="target_replicas", value=target)
    if p.reassigning:
        raise InvalidFieldError(
            f"{p.topic}-{p.partition} is already moving to {list(p.target_replicas)}; "
            f"cancel it first", field="target_replicas", value=target)
    if target == p.replicas:
        return []
    if set(target) == set(p.replicas):
        # Same brokers, new order: only the preferred leader changes.
        return [change(p, replicas=target, reason="reorder replicas")]
    adding = tuple(b for b in target if b not in p.replicas)
    removing = tuple(b for b in p.replicas if b not in target)
    replicas = target + removing
    return [change(p, replicas=replicas, adding=adding, removing=removing,
                   reason=f"reassign to {list(target)}")]


def _shrink(image: MetadataImage, p: PartitionInfo, target: tuple[int, ...],
            reason: str) -> PartitionChange:
    isr = tuple(b for b in p.isr if b in target)
    assert isr, f"{p.topic}-{p.partition}: shrink with no target replica in isr"
    fields = ReplicaSetFields(replicas=target, isr=isr, adding=(), removing=())
    if p.leader is not None and p.leader not in target:
        if is_quorum(image, p):
            return fence_for_election(image, p, reason=f"{reason}; leader leaves", **fields)
        leader = choose_leader(image, p, isr)
        return change(p, reason=reason, leader=NO_LEADER if leader is None else leader, **fields)
    return change(p, reason=reason, **fields)


def progress_reassignments(image: MetadataImage) -> list[Record]:
    """The shrink record of every reassignment whose target replicas are all in the ISR."""
    records: list[Record] = []
    for p in image.reassigning_partitions():
        if p.leader is None:
            continue
        target = p.target_replicas
        if set(target) <= set(p.isr):
            records.append(_shrink(image, p, target, reason="reassignment complete"))
    return records


def cancel_reassignment(image: MetadataImage, topic: str, partition: int) -> list[Record]:
    """Go back to the replicas before the reassignment (those not being added)."""
    p = image.partition(topic, partition)
    if not p.reassigning:
        return []
    original = tuple(b for b in p.replicas if b not in p.adding)
    if not set(original) & set(p.isr):
        raise InvalidFieldError(
            f"{topic}-{partition}: none of the original replicas {list(original)} is in "
            f"isr {list(p.isr)}; cancelling now would leave no in-sync replica",
            field="partition", value=partition)
    return [_shrink(image, p, original, reason="reassignment cancelled")]


def start_plan(image: MetadataImage, request: ReassignmentPlanRequest) -> list[Record]:
    """Every move of a plan, all or none: the first move refused refuses the plan, naming it.
    With a throttle, the cluster's `reassignment_throttle_bytes_per_s` is set in the same
    batch, so brokers learn it no later than the moves it paces."""
    seen: set[tuple[str, int]] = set()
    plan = Plan(image)
    if request.throttle_bytes_per_s is not None \
            and image.cluster_config.reassignment_throttle_bytes_per_s != request.throttle_bytes_per_s:
        plan.add(AlterClusterConfig(changes={"reassignment_throttle_bytes_per_s": request.throttle_bytes_per_s}))
    for i, move in enumerate(request.partitions):
        key = (move.topic, move.partition)
        if key in seen:
            raise InvalidFieldError(f"partitions[{i}]: {move.topic}-{move.partition} is in the plan twice",
                                    field=f"partitions.{i}", value=list(key))
        seen.add(key)
        try:
            plan.extend(start_reassignment(plan.image, ReassignmentRequest(
                topic=move.topic, partition=move.partition, target_replicas=move.replicas)))
        except BiplaneError as exc:
            raise _in_plan(exc, i, move.topic, move.partition) from None
    return plan.records


def _in_plan(exc: BiplaneError, i: int, topic: str, partition: int) -> BiplaneError:
    """The refusal of one move, saying which entry of the plan it was; nothing was changed."""
    return InvalidFieldError(f"partitions[{i}] ({topic}-{partition}): {exc}; nothing in the plan was started",
                             field=f"partitions.{i}", value=[topic, partition], code=exc.code)


def cancel_many(image: MetadataImage, request: CancelReassignmentsRequest) -> list[Record]:
    """Cancel the named reassignments (every running one when none is named), all or none."""
    plan = Plan(image)
    if request.partitions is None:
        targets = [(p.topic, p.partition) for p in image.reassigning_partitions()]
    else:
        targets = [(ref.topic, ref.partition) for ref in request.partitions]
    for topic, partition in targets:
        plan.extend(cancel_reassignment(plan.image, topic, partition))
    return plan.records

