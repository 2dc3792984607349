"""Producer ids for INIT_PRODUCER_ID, handed out from blocks the controller allocates.

A fresh producer gets the next id of the current block with epoch 0 (a new
block is fetched when it runs out); a producer that names its id and epoch gets
the epoch bumped, or a fresh id once the epoch would overflow int16.
"""
from __future__ import annotations

import asyncio

from common.control_client import ControlClient
from common.requests import AllocateProducerIdsRequest

PRODUCER_EPOCH_MAX = 32_767


class ProducerIds:
    def __init__(self, control: ControlClient, *, broker_id: int, block_size: int = 1000) -> None:
        self.control = control
        self.broker_id = broker_id
        self.block_size = block_size
        self._next = 0
        self._end = 0
        self._lock = asyncio.Lock()

    async def init(self, producer_id: int, producer_epoch: int) -> tuple[int, int]:
        """(producer_id, producer_epoch) for an InitProducerId request; raises BiplaneError."""
        if producer_id >= 0 and 0 <= producer_epoch < PRODUCER_EPOCH_MAX:
            return producer_id, producer_epoch + 1
        return await self._fresh(), 0

    async def _fresh(self) -> int:
        async with self._lock:
            if self._next >= self._end:
                block = await self.control.allocate_producer_ids(
                    AllocateProducerIdsRequest(broker_id=self.broker_id, count=self.block_size))
                self._next, self._end = block.first_id, block.first_id + block.size
            pid = self._next
            self._next += 1
            return pid
