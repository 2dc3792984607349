"""A broker-wide bound on produce bytes its leaders hold: written but not yet on their
required sets, or waiting in a core's backlog for room.

Each partition's core bounds its own backlog (Replica.unreplicated_bytes_max); this
bounds the sum, so many partitions cannot together hold unbounded memory. The
driver reports each leader partition's `replica.held_bytes()` after stepping it.
The total enters each leader's core as a BrokerBudget event; while it is at or above
`unreplicated_bytes_max`, the core holds new produce requests in order (it does not
refuse them; dataplane/replica/admission.py) and the driver registers `call_when_room`;
the budget calls it back, from the event loop, once a partition's HW frees room, and the
driver steps the core so that it takes what it holds.
`wait_for_room` is the same wait for code that can await. Partitions are keyed by
`(topic, partition)`: a `common.topic_partition.TopicPartition` or the plain pair.
"""
from __future__ import annotations

import asyncio
from typing import Callable

from common.topic_partition import TopicPartition


class ProduceBudget:
    def __init__(self, *, unreplicated_bytes_max: int = 64 * 1024 * 1024) -> None:
        if not isinstance(unreplicated_bytes_max, int) or unreplicated_bytes_max < 1:
            raise ValueError(f"unreplicated_bytes_max must be a positive int, got {unreplicated_bytes_max!r}")
        self.unreplicated_bytes_max = unreplicated_bytes_max
        self._by_partition: dict[TopicPartition, int] = {}
        self.total_bytes = 0
        self.peak_total_bytes = 0  # highest total seen (metrics, tests of the bound)
        self._room: asyncio.Event | None = None
        # Partitions whose cores hold requests, in the order they began waiting (insertion order).
        self._callbacks: dict[TopicPartition, Callable[[], None]] = {}
        self._wake_scheduled = False

    def has_room(self) -> bool:
        return self.total_bytes < self.unreplicated_bytes_max

    def update(self, tp: TopicPartition, held_bytes: int) -> None:
        old = self._by_partition.pop(tp, 0)
        if held_bytes > 0:
            self._by_partition[tp] = held_bytes
        self.total_bytes += held_bytes - old
        if self.total_bytes > self.peak_total_bytes:
            self.peak_total_bytes = self.total_bytes
        if self.total_bytes < self.unreplicated_bytes_max:
            if self._room is not None:
                self._room.set()
            if self._callbacks and not self._wake_scheduled:
                # Not inline: update() runs inside some partition's step, and the callback
                # steps another partition.
                self._wake_scheduled = True
                asyncio.get_running_loop().call_soon(self._wake)

    def forget(self, tp: TopicPartition) -> None:
        self._callbacks.pop(tp, None)
        self.update(tp, 0)

    def call_when_room(self, tp: TopicPartition, callback: Callable[[], None]) -> None:
        """Call `callback()` once, soon after the total is below the bound. A partition
        registered already keeps its place in line."""
        self._callbacks.setdefault(tp, callback)
        if self.has_room() and not self._wake_scheduled:
            self._wake_scheduled = True
            asyncio.get_running_loop().call_soon(self._wake)

    def _wake(self) -> None:
        self._wake_scheduled = False
        # Partitions in the order they began waiting; one that fills the budget again
        # registers again, at the end of the line.
        while self._callbacks and self.has_room():
            tp = next(iter(self._callbacks))
            self._callbacks.pop(tp)()

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
