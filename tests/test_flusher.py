"""FlushCoalescer without a debounce: group commit, where the running fsync is the window."""
from __future__ import annotations

import asyncio
import threading
import time

from common.batch import build_batch
from dataplane.log import FlushCoalescer, MemoryLog


class GatedLog(MemoryLog):
    """A log whose flush blocks (in the executor thread) until the test opens the gate."""

    def __init__(self) -> None:
        super().__init__()
        self.started = threading.Event()
        self.gate = threading.Event()
        self.flushes: list[int] = []

    @property
    def flush_cost_bytes(self) -> int | None:
        return None   # it blocks: never flushed inline (that would block the test's loop)

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


class CostedLog(MemoryLog):
    """A log that says what its next flush costs, and records which thread flushed it."""

    def __init__(self, cost: int | None, flush_s: float = 0.0) -> None:
        super().__init__()
        self.cost = cost
        self.flush_s = flush_s
        self.threads: list[int] = []

    @property
    def flush_cost_bytes(self) -> int | None:
        return self.cost

    def flush(self) -> int:
        self.threads.append(threading.get_ident())
        if self.flush_s:
            time.sleep(self.flush_s)
        return super().flush()


def test_a_small_flush_runs_inline_on_the_loop_and_settles_callbacks_only_after_the_call():
    """Claim: a flush the log says is small runs on the loop's own thread, in a later turn
    (a callback waiter is never called from inside when_flushed), and releases its waiters."""
    log = CostedLog(cost=1024)

    async def scenario():
        flusher = FlushCoalescer(log, inline_bytes_max=64 * 1024)
        settled = []
        flusher.when_flushed(append(log), lambda flushed, exc: settled.append((flushed, exc)))
        assert settled == []
        assert await flusher.flush_to(append(log)) == 2
        await asyncio.sleep(0)
        await flusher.close()
        return settled, flusher.inline_count, threading.get_ident()

    settled, inline_count, loop_thread = asyncio.run(scenario())
    assert settled == [(2, None)]   # the run came a turn later: the second append joined it
    assert inline_count >= 1 and set(log.threads) == {loop_thread}


def test_a_flush_over_the_inline_bound_or_of_unknown_cost_goes_to_a_thread():
    """Claim: a flush bigger than inline_bytes_max, or one the log cannot bound (None), runs
    in the executor, never on the loop."""
    for cost in (64 * 1024 + 1, None):
        log = CostedLog(cost=cost)

        async def scenario():
            flusher = FlushCoalescer(log, inline_bytes_max=64 * 1024)
            await flusher.flush_to(append(log))
            await flusher.close()
            return flusher.inline_count, threading.get_ident()

        inline_count, loop_thread = asyncio.run(scenario())
        assert inline_count == 0 and log.threads and loop_thread not in log.threads, cost


def test_an_inline_flush_slower_than_the_stall_bound_sends_the_next_ones_to_a_thread():
    """Claim: once a flush run inline stalled the loop longer than inline_stall_ms_max, the
    following flushes (within the cool-down) run in the executor."""
    log = CostedLog(cost=10, flush_s=0.02)

    async def scenario():
        flusher = FlushCoalescer(log, inline_stall_ms_max=5)
        for _ in range(3):
            await flusher.flush_to(append(log))
        await flusher.close()
        return flusher.inline_count, threading.get_ident()

    inline_count, loop_thread = asyncio.run(scenario())
    assert inline_count == 1
    assert log.threads[0] == loop_thread and loop_thread not in log.threads[1:]


def test_inline_bounds_are_validated():
    import pytest
    from common.errors import InvalidRequestError
    with pytest.raises(InvalidRequestError, match="inline_bytes_max=-1"):
        FlushCoalescer(MemoryLog(), inline_bytes_max=-1)
