"""Helpers every decision shares: a scratch plan of records, and the leader choice."""
from __future__ import annotations

from typing import Iterable, TypedDict, Unpack

from common.metadata.image import MetadataImage, PartitionInfo
from common.metadata.records import NO_LEADER, PartitionChange, Record


class ReplicaSetFields(TypedDict, total=False):
    """The replica-set fields of a PartitionChange a decision may set with a fence."""

    isr: tuple[int, ...]
    replicas: tuple[int, ...]
    adding: tuple[int, ...]
    removing: tuple[int, ...]


class ChangeFields(ReplicaSetFields, total=False):
    """PartitionChange's fields a decision may set; unset ones stay as they are."""

    leader: int
    fenced_for_election: bool


class Plan:
    """Records decided so far, applied to a private copy of the image.

    Later steps of one decision see the effects of earlier ones (two brokers
    fenced in one call, an election after a fence). A record the copy rejects
    is a bug in a decision, so it propagates as RecordRejected, loudly.
    """

    __slots__ = ("image", "records")

    def __init__(self, image: MetadataImage) -> None:
        self.image = image.copy()
        self.records: list[Record] = []

    def add(self, record: Record) -> None:
        self.image.apply(record, self.image.offset + 1)
        self.records.append(record)

    def extend(self, records: Iterable[Record]) -> None:
        for record in records:
            self.add(record)


def choice_key(image: MetadataImage, p: PartitionInfo, broker_id: int) -> tuple[int, int, int]:
    """Higher is better: a broker not in maintenance first, then broker priority, then earlier
    in the replica order. A broker in maintenance still leads when no other replica can."""
    return (0 if image.in_maintenance(broker_id) else 1, image.priority(broker_id),
            -p.replicas.index(broker_id))


def choose_leader(image: MetadataImage, p: PartitionInfo,
                  candidates: Iterable[int]) -> int | None:
    """The unfenced replica among `candidates` that `choice_key` ranks first: not in
    maintenance, then the highest priority, ties by replica order."""
    eligible = [b for b in candidates if b in p.replicas and image.is_unfenced(b)]
    if not eligible:
        return None
    return max(eligible, key=lambda b: choice_key(image, p, b))


def change(p: PartitionInfo, *, reason: str, **fields: Unpack[ChangeFields]) -> PartitionChange:
    """A PartitionChange for `p` that only applies at p's current partition epoch."""
    return PartitionChange(topic=p.topic, partition=p.partition,
                           expected_partition_epoch=p.partition_epoch, reason=reason, **fields)


def fence_for_election(image: MetadataImage, p: PartitionInfo, *,
                       reason: str = "quorum election", **fields: Unpack[ReplicaSetFields]) -> PartitionChange:
    """Step one of a quorum election: no leader, leader epoch e+1, replicas stop taking <= e."""
    return change(p, fenced_for_election=True, leader=NO_LEADER, reason=reason, **fields)


def is_quorum(image: MetadataImage, p: PartitionInfo) -> bool:
    return image.topics[p.topic].config.commit_policy == "quorum"


def without_broker(image: MetadataImage, p: PartitionInfo, broker_id: int, *,
                   leave_isr: bool, reason: str) -> PartitionChange | None:
    """The change that takes `broker_id` (now fenced) out of leadership and, if asked, the ISR.

    The ISR never empties (Kafka's KRaft rule): a last member stays in it and the
    partition is left without a leader until that broker returns (or an unclean
    election, where allowed). Quorum topics never hand leadership over directly:
    losing the leader starts the two-step election.
    """
    isr = p.isr
    if leave_isr and broker_id in isr and len(isr) > 1:
        isr = tuple(b for b in isr if b != broker_id)
    fields: ReplicaSetFields = {}
    if isr != p.isr:
        fields["isr"] = isr
    if p.leader == broker_id:
        if is_quorum(image, p):
            return fence_for_election(image, p, reason=reason, **fields)
        leader = choose_leader(image, p, (b for b in isr if b != broker_id))
        return change(p, reason=reason, leader=NO_LEADER if leader is None else leader, **fields)
    if not fields:
        return None
    return change(p, reason=reason, **fields)
