"""Broker-wide produce budget (dataplane/broker/budget.py)."""
from __future__ import annotations

import asyncio

import pytest

from dataplane.broker.budget import ProduceBudget


def test_waits_while_the_total_is_at_the_bound_and_goes_on_when_a_partition_replicates():
    """Claim: a produce waits (not refused) while the sum over partitions is at the bound, is let
    through when any partition's unreplicated bytes fall, and gives up after its timeout."""
    async def main():
        budget = ProduceBudget(unreplicated_bytes_max=100)
        budget.update(("a", 0), 60)
        assert await budget.wait_for_room(10)
        budget.update(("b", 0), 50)
        assert budget.total_bytes == 110
        assert not await budget.wait_for_room(20)
        waiter = asyncio.ensure_future(budget.wait_for_room(5000))
        await asyncio.sleep(0.01)
        assert not waiter.done()
        budget.update(("a", 0), 10)
        assert await asyncio.wait_for(waiter, 1)
        budget.forget(("b", 0))
        assert budget.total_bytes == 10
    asyncio.run(main())


def test_bound_must_be_positive():
    with pytest.raises(ValueError, match="unreplicated_bytes_max"):
        ProduceBudget(unreplicated_bytes_max=0)
