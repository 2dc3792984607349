"""The producer's batch-resolved record futures (dataplane/client/futures.py). The batch
encoder the producer writes records with is tested with the format, in tests/test_batch.py."""
from __future__ import annotations

import asyncio

import pytest

from dataplane.client.futures import BatchOutcome, RecordFuture
from dataplane.client.records import RecordMetadata, TopicPartition

TP = TopicPartition("t", 2)


def test_record_futures_resolve_with_their_offset_through_await_gather_and_callbacks():
    async def main():
        loop = asyncio.get_running_loop()
        outcome = BatchOutcome(TP, loop)
        futures = [RecordFuture(outcome, i) for i in range(3)]
        assert asyncio.isfuture(futures[0]) and not futures[0].done()
        seen = []
        futures[1].add_done_callback(lambda f: seen.append(f.result()))
        gathered = asyncio.gather(*futures)
        waiter = asyncio.ensure_future(futures[2])
        await asyncio.sleep(0)
        outcome.resolve(40)
        assert await gathered == [RecordMetadata("t", 2, 40), RecordMetadata("t", 2, 41), RecordMetadata("t", 2, 42)]
        assert await waiter == RecordMetadata("t", 2, 42)
        assert seen == [RecordMetadata("t", 2, 41)]
        late = []
        futures[0].add_done_callback(late.append)   # already done: still called, on the loop
        await asyncio.sleep(0)
        assert late == [futures[0]]
    asyncio.run(main())


def test_a_failed_batch_fails_every_record_future():
    async def main():
        outcome = BatchOutcome(TP, asyncio.get_running_loop())
        futures = [RecordFuture(outcome, i) for i in range(2)]
        outcome.fail(ValueError("boom"))
        assert all(isinstance(f.exception(), ValueError) for f in futures)
        with pytest.raises(ValueError, match="boom"):
            await futures[1]
        results = await asyncio.gather(*futures, return_exceptions=True)
        assert [type(r) for r in results] == [ValueError, ValueError]
        depths = []
        for f in futures * 3:
            try:
                f.result()
            except ValueError as exc:
                tb, depth = exc.__traceback__, 0
                while tb is not None:
                    tb, depth = tb.tb_next, depth + 1
                depths.append(depth)
        assert len(set(depths)) == 1   # raising it again and again does not grow its traceback
    asyncio.run(main())


def test_a_timed_out_wait_cancels_only_that_callers_future():
    """wait_for's timeout cancels the one record future it waited on; the others of the
    same batch still resolve (the record itself is still sent)."""
    async def main():
        loop = asyncio.get_running_loop()
        outcome = BatchOutcome(TP, loop)
        a, b = RecordFuture(outcome, 0), RecordFuture(outcome, 1)
        other = asyncio.ensure_future(b)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(a, 0.01)
        assert a.cancelled() and not b.done()
        outcome.resolve(0)
        assert await other == RecordMetadata("t", 2, 1)
        assert a.cancelled()
        with pytest.raises(asyncio.CancelledError):
            a.result()
    asyncio.run(main())


def test_a_pending_record_future_says_so():
    async def main():
        f = RecordFuture(BatchOutcome(TP, asyncio.get_running_loop()), 0)
        with pytest.raises(asyncio.InvalidStateError):
            f.result()
        assert "pending" in repr(f)
        cb = f.add_done_callback(print)
        assert cb is None and f.remove_done_callback(print) == 1
    asyncio.run(main())


def test_record_futures_work_with_asyncio_wait_and_as_completed():
    async def main():
        loop = asyncio.get_running_loop()
        first, second = BatchOutcome(TP, loop), BatchOutcome(TopicPartition("t", 3), loop)
        a, b = RecordFuture(first, 0), RecordFuture(second, 5)
        loop.call_soon(second.resolve, 10)
        done, pending = await asyncio.wait({a, b}, return_when=asyncio.FIRST_COMPLETED)
        assert done == {b} and pending == {a}
        first.fail(RuntimeError("gone"))
        outcomes = []
        for next_done in asyncio.as_completed([a, b]):
            try:
                outcomes.append(await next_done)
            except RuntimeError as exc:
                outcomes.append(str(exc))
        assert sorted(map(str, outcomes)) == sorted(["gone", str(RecordMetadata("t", 3, 15))])
    asyncio.run(main())
