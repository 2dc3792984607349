"""Choosing a partition: murmur2 of the key (the same hash and mask as Kafka's Java
client, so keys land on the same partition numbers as there), and for keyless
records a sticky partition that changes only when its batch is sent."""
from __future__ import annotations

import random

_M = 0x5BD1E995
_SEED = 0x9747B28C
_MASK32 = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (signed 32-bit result)."""
    length = len(data)
    h = (_SEED ^ length) & _MASK32
    n4 = length & ~3
    for i in range(0, n4, 4):
        k = data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) | (data[i + 3] << 24)
        k = (k * _M) & _MASK32
        k ^= k >> 24
        k = (k * _M) & _MASK32
        h = (h * _M) & _MASK32
        h ^= k
    rest = length & 3
    if rest == 3:
        h ^= data[n4 + 2] << 16
    if rest >= 2:
        h ^= data[n4 + 1] << 8
    if rest >= 1:
        h ^= data[n4]
        h = (h * _M) & _MASK32
    h ^= h >> 13
    h = (h * _M) & _MASK32
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def key_partition(key: bytes, partition_count: int) -> int:
    """Kafka's rule: toPositive(murmur2(key)) % partitions."""
    if partition_count < 1:
        raise ValueError(f"partition_count {partition_count} must be at least 1")
    return (murmur2(key) & 0x7FFFFFFF) % partition_count


class StickyPartitioner:
    """Keyless records stick to one partition until `batch_sent(topic)` moves them on, so
    they fill whole batches instead of a sliver per partition. `rng` is injectable for tests."""

    def __init__(self, *, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()
        self._sticky: dict[str, int] = {}

    def partition(self, topic: str, key: bytes | None, partition_count: int) -> int:
        if key is not None:
            return key_partition(key, partition_count)
        current = self._sticky.get(topic)
        if current is None or current >= partition_count:
            current = self._rng.randrange(partition_count)
            self._sticky[topic] = current
        return current

    def batch_sent(self, topic: str, partition: int, partition_count: int) -> None:
        """The sticky partition's batch left: pick another partition for the next keyless records."""
        if self._sticky.get(topic) != partition or partition_count < 2:
            return
        choice = self._rng.randrange(partition_count - 1)
        self._sticky[topic] = choice if choice < partition else choice + 1
