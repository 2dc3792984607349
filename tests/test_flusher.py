"""FlushCoalescer without a debounce: group commit, where the running fsync is the window."""
from __future__ import annotations

import asyncio
import threading

from common.batch import build_batch
from dataplane.log import FlushCoalescer, MemoryLog


class GatedLog(MemoryLog):
    """A log whose flush blocks (in the executor thread) until the test opens the gate."""

    def __init__(self) -> None:
        super().__init__()
        self.started = threading.Event()
        self.gate = threading.Event()
        self.flushes: list[int] = []

    def flush(self) -> int:
        # Like PartitionLog.flush: makes durable what was written before the call.
        target = self.log_end_offset
        self.started.set()
        self.gate.wait(10)
        self.flushes.append(target)
        self._flushed_offset = max(self._flushed_offset, min(target, self.log_end_offset))
        return self._flushed_offset


def append(log: MemoryLog) -> int:
    return log.append_as_leader(build_batch([b"r"], timestamp_ms=0), leader_epoch=0).last_offset + 1


def test_waiters_arriving_during_an_fsync_share_the_next_one():
    """Claim: with debounce_ms=0 the first waiter's fsync starts at once; waiters that arrive
    while it runs are not covered by it and are all released by one next fsync (two in all)."""
    log = GatedLog()

    async def scenario():
        flusher = FlushCoalescer(log, debounce_ms=0)
        first = asyncio.ensure_future(flusher.flush_to(append(log)))
        loop = asyncio.get_running_loop()
        assert await loop.run_in_executor(None, log.started.wait, 10)
        later = [asyncio.ensure_future(flusher.flush_to(append(log))) for _ in range(5)]
        await asyncio.sleep(0)
        log.gate.set()
        results = await asyncio.gather(first, *later)
        await flusher.close()
        return results

    results = asyncio.run(scenario())
    assert log.flushes == [1, 6]
    assert results[0] >= 1 and results[1:] == [6] * 5


def test_a_truncation_during_the_fsync_fails_only_the_waiters_it_removed():
    """Claim: a waiter whose offset is truncated away while an fsync runs gets LogTruncatedError
    from the next run; a waiter below the cut is released."""
    from dataplane.log import LogTruncatedError
    log = GatedLog()

    async def scenario():
        flusher = FlushCoalescer(log, debounce_ms=0)
        low = asyncio.ensure_future(flusher.flush_to(append(log)))
        loop = asyncio.get_running_loop()
        assert await loop.run_in_executor(None, log.started.wait, 10)
        high = asyncio.ensure_future(flusher.flush_to(append(log)))
        await asyncio.sleep(0)
        log.truncate_to(1)
        log.gate.set()
        outcomes = await asyncio.gather(low, high, return_exceptions=True)
        await flusher.close()
        return outcomes

    low, high = asyncio.run(scenario())
    assert low == 1 and isinstance(high, LogTruncatedError)


def test_a_callback_waiter_may_ask_for_the_next_flush_from_inside_its_callback():
    """Claim: when_flushed calls back with the flushed offset (never before it returns), and a
    callback that appends and asks again (as a replica's FlushDone step does) is served by a
    further run rather than lost; an error reaches a callback as its second argument."""
    log = MemoryLog()
    calls = []

    async def scenario():
        flusher = FlushCoalescer(log, debounce_ms=0)
        done = asyncio.get_running_loop().create_future()

        def second(flushed, exc):
            calls.append(("second", flushed, exc))
            done.set_result(None)

        def first(flushed, exc):
            calls.append(("first", flushed, exc))
            flusher.when_flushed(append(log), second)

        flusher.when_flushed(append(log), first)
        assert calls == []
        await asyncio.wait_for(done, 10)
        flusher.when_flushed(5, lambda f, e: calls.append(("past the end", f, type(e).__name__)))
        await flusher.close()
        await asyncio.sleep(0)
        return flusher.flush_count

    assert asyncio.run(scenario()) == 2
    assert calls == [("first", 1, None), ("second", 2, None), ("past the end", None, "InvalidRequestError")]
