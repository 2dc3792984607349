"""Where a group lives: the partition of the offsets topic that holds its records, whose
leader is the group's coordinator.

The topic is Kafka's `__consumer_offsets` (Kafka's tools list it as internal and hide
it). A group's partition is Kafka's rule, abs(Java's String.hashCode(group_id)) modulo the
partition count, so the same group id lands on the same partition number as in Kafka.
The partition count is fixed when the topic is created: changing it would move groups
away from their records.
"""
from __future__ import annotations

from common.metadata.config import OFFSETS_TOPIC, is_internal

__all__ = ["OFFSETS_TOPIC", "is_internal", "java_string_hash", "partition_for"]


def java_string_hash(text: str) -> int:
    """Java's String.hashCode: h = 31 * h + c over UTF-16 code units, as a signed 32-bit int."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(group_id: str, partitions: int) -> int:
    """The offsets-topic partition of `group_id` (Kafka's Utils.abs: the sign bit masked off)."""
    if partitions < 1:
        raise ValueError(f"the offsets topic needs at least one partition, got {partitions}")
    return (java_string_hash(group_id) & 0x7FFFFFFF) % partitions
