"""A broker-wide bound on bytes its leaders wrote but have not yet got onto their required sets.

Each partition's core bounds its own backlog (Replica.unreplicated_bytes_max); this
bounds the sum, so many partitions cannot together hold unbounded memory. The
driver reports each partition's `replica.unreplicated_bytes()` after stepping it,
and a produce request waits in `wait_for_room` (it is not refused) while the total
is at or above `unreplicated_bytes_max`, until its own timeout.
"""
from __future__ import annotations

import asyncio

TopicPartition = tuple[str, int]


class ProduceBudget:
    def __init__(self, *, unreplicated_bytes_max: int = 64 * 1024 * 1024) -> None:
        if not isinstance(unreplicated_bytes_max, int) or unreplicated_bytes_max < 1:
            raise ValueError(f"unreplicated_bytes_max must be a positive int, got {unreplicated_bytes_max!r}")
        self.unreplicated_bytes_max = unreplicated_bytes_max
        self._by_partition: dict[TopicPartition, int] = {}
        self.total_bytes = 0
        self._room: asyncio.Event | None = None

    def update(self, tp: TopicPartition, unreplicated_bytes: int) -> None:
        old = self._by_partition.pop(tp, 0)
        if unreplicated_bytes > 0:
            self._by_partition[tp] = unreplicated_bytes
        self.total_bytes += unreplicated_bytes - old
        if self._room is not None and self.total_bytes < self.unreplicated_bytes_max:
            self._room.set()

    def forget(self, tp: TopicPartition) -> None:
        self.update(tp, 0)

    async def wait_for_room(self, timeout_ms: int) -> bool:
        """True once the total is below the bound (at once if it is), False after timeout_ms."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        while self.total_bytes >= self.unreplicated_bytes_max:
            if self._room is None or self._room.is_set():
                self._room = asyncio.Event()
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            try:
                await asyncio.wait_for(self._room.wait(), remaining)
            except asyncio.TimeoutError:
                return self.total_bytes < self.unreplicated_bytes_max
        return True
