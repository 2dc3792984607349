"""The client's view of the cluster: brokers and partition leaders, from METADATA answers."""
from __future__ import annotations

import math
from dataclasses import dataclass

from common.errors import ErrorCode
from common.wire import MetadataResponse
from dataplane.client.records import TopicPartition


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionInfo:
    leader_id: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]


class ClusterMetadata:
    """Latest known brokers and leaders. `update` takes a METADATA response and never lets
    a partition's leader epoch go backwards (an answer from a lagging broker is older)."""

    def __init__(self) -> None:
        self.brokers: dict[int, tuple[str, int]] = {}
        # Updated in place, never reassigned: the producer keeps a reference and compares each
        # topic's entry by identity to know when its partitions may have changed.
        self.topics: dict[str, dict[int, PartitionInfo]] = {}
        self.unknown_topics: set[str] = set()
        self.topic_errors: dict[str, ErrorCode] = {}
        self.version = 0   # counts changes, so a reader can tell cheaply whether anything moved

    def update(self, response: MetadataResponse) -> None:
        self.version += 1
        if response.brokers:
            self.brokers = {b.node_id: (b.host, b.port) for b in response.brokers}
        for topic in response.topics:
            if topic.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                self.topics.pop(topic.topic, None)
                self.unknown_topics.add(topic.topic)
                continue
            if topic.error_code != ErrorCode.NONE:
                self.topic_errors[topic.topic] = topic.error_code
                continue
            self.unknown_topics.discard(topic.topic)
            self.topic_errors.pop(topic.topic, None)
            old = self.topics.get(topic.topic, {})
            new: dict[int, PartitionInfo] = {}
            for p in topic.partitions:
                info = PartitionInfo(leader_id=p.leader_id if p.error_code == ErrorCode.NONE else p.leader_id,
                                     leader_epoch=p.leader_epoch, replicas=tuple(p.replicas), isr=tuple(p.isr))
                prev = old.get(p.partition)
                if prev is not None and prev.leader_epoch > info.leader_epoch:
                    info = prev
                new[p.partition] = info
            self.topics[topic.topic] = new

    def partition_count(self, topic: str) -> int | None:
        parts = self.topics.get(topic)
        return len(parts) if parts else None

    def partition(self, tp: TopicPartition) -> PartitionInfo | None:
        return self.topics.get(tp.topic, {}).get(tp.partition)

    def leader(self, tp: TopicPartition) -> int | None:
        info = self.partition(tp)
        if info is None or info.leader_id < 0 or info.leader_id not in self.brokers:
            return None
        return info.leader_id

    def leader_epoch(self, tp: TopicPartition) -> int:
        info = self.partition(tp)
        return info.leader_epoch if info is not None else -1

    def forget_leader(self, tp: TopicPartition) -> None:
        """A broker said it does not lead tp: stop sending there until fresh metadata arrives."""
        parts = self.topics.get(tp.topic)
        if parts and tp.partition in parts:
            info = parts[tp.partition]
            parts[tp.partition] = PartitionInfo(leader_id=-1, leader_epoch=info.leader_epoch,
                                                replicas=info.replicas, isr=info.isr)

    def note_leader(self, tp: TopicPartition, leader_id: int, leader_epoch: int) -> None:
        """A response named a newer leader: use it at once."""
        parts = self.topics.get(tp.topic)
        if not parts or tp.partition not in parts or leader_id < 0:
            return
        info = parts[tp.partition]
        if leader_epoch > info.leader_epoch:
            parts[tp.partition] = PartitionInfo(leader_id=leader_id, leader_epoch=leader_epoch,
                                                replicas=info.replicas, isr=info.isr)
            self.version += 1


def metadata_refresh_due_ms(*, updated_ms: int | None, attempted_ms: int | None, max_age_ms: int,
                            retry_backoff_ms: int) -> float:
    """When metadata last applied at `updated_ms` should be fetched again without an error
    asking for it: once it is `max_age_ms` old. A failed attempt (`attempted_ms` after
    `updated_ms`) is retried `retry_backoff_ms` after it started, not at once, so a cluster
    that cannot answer is not asked in a loop. Never (math.inf) before a first answer: the
    first send or assignment fetches what it needs itself."""
    if updated_ms is None:
        return math.inf
    due = updated_ms + max_age_ms
    if attempted_ms is not None and attempted_ms > updated_ms:
        due = max(due, attempted_ms + retry_backoff_ms)
    return due
