"""FlushCoalescer: many asyncio waiters share one fsync run.

`await coalescer.flush_to(offset)` returns once flushed_offset >= offset. The
first waiter starts a run, which calls the log's synchronous `flush()` in a
thread executor (the event loop keeps serving appends and reads meanwhile).
Waiters covered by the result are released together; waiters and appends that
arrived during the fsync are covered by the next run, which starts as soon as
this one ends. That is group commit: the fsync itself is the window in which
others join, so no sleep is needed before it, and a lone synchronous producer
pays one fsync, not a timer plus an fsync. `debounce_ms` > 0 adds a sleep
before each run (fewer, bigger fsyncs for a disk where each fsync is costly).
A flush error is raised in every waiter of that run.

A small flush runs inline instead, on the event loop, a loop turn after it was asked for
(the appends of that turn join it): when the log says it is one file's fsync of at most
`inline_bytes_max` bytes (Log.flush_cost_bytes). Handing a small fsync to a thread costs
two thread wake-ups, each a scheduling delay on a busy machine, often longer than the
fsync of a few KiB itself; the bound keeps the loop's stall to one small fsync. A flush
run inline that took longer than `inline_stall_ms_max` stops the inline path for
`INLINE_COOL_DOWN_S` (the disk is slow now: let a thread wait for it).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from typing import Callable, Union

from common.errors import InvalidRequestError, LogTruncatedError, StorageError

from .interface import Log


Settle = Callable[[int | None, BaseException | None], None]
Waiter = Union["asyncio.Future[int]", Settle]


INLINE_BYTES_MAX = 64 * 1024
INLINE_STALL_MS_MAX = 2.0
INLINE_COOL_DOWN_S = 1.0


class FlushCoalescer:
    def __init__(self, log: Log, *, debounce_ms: float = 0.0,
                 executor: concurrent.futures.Executor | None = None,
                 on_fsync: Callable[[float], None] | None = None,
                 inline_bytes_max: int = INLINE_BYTES_MAX, inline_stall_ms_max: float = INLINE_STALL_MS_MAX) -> None:
        if debounce_ms < 0:
            raise InvalidRequestError(f"debounce_ms={debounce_ms} must be >= 0")
        if inline_bytes_max < 0 or inline_stall_ms_max < 0:
            raise InvalidRequestError(f"inline_bytes_max={inline_bytes_max} and inline_stall_ms_max="
                                      f"{inline_stall_ms_max} must be >= 0 (0 bytes: never flush inline)")
        self._inline_bytes_max = inline_bytes_max
        self._inline_stall_s = inline_stall_ms_max / 1000
        self._inline_after = 0.0     # time.monotonic() before which no flush runs inline
        self.inline_count = 0        # runs flushed inline so far, for tests and benchmarks
        self._log = log
        self._debounce_s = debounce_ms / 1000.0
        self._executor = executor
        # (offset, waiter): a future, or a callback called as (flushed_offset, None) or (None, error).
        self._waiters: list[tuple[int, Waiter]] = []
        # Set while a run (debounce, then fsync) is under way; resolved when runs stop.
        self._running: asyncio.Future[None] | None = None
        self._closed = False
        self.flush_count = 0  # fsync runs so far, for tests and benchmarks
        # Called with the seconds each successful flush took (metrics): on the executor's thread,
        # or on the loop's for a flush run inline.
        self._on_fsync = on_fsync

    async def flush_to(self, offset: int) -> int:
        """Wait until every offset below `offset` is durable; returns flushed_offset.

        `offset` is exclusive, like log_end_offset: flush_to(info.last_offset + 1)
        waits for an append. Raises InvalidRequestError past log_end_offset (that
        would wait for data nobody has written), StorageError if the flush fails,
        LogTruncatedError if the offset is truncated away first.
        """
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._add(offset, future)
        return await future

    def when_flushed(self, offset: int, settle: Settle) -> None:
        """flush_to for a callback: `settle(flushed_offset, None)` or `settle(None, error)` is
        called from the event loop once flush_to would return or raise (never before this
        returns). The fsync starts now if none runs; no task or future stands in between."""
        self._add(offset, settle)

    def _add(self, offset: int, waiter: Waiter) -> None:
        if self._closed:
            self._later(waiter, None, StorageError("flush coalescer is closed"))
        elif offset <= self._log.flushed_offset:
            self._later(waiter, self._log.flushed_offset, None)
        elif offset > self._log.log_end_offset:
            self._later(waiter, None, InvalidRequestError(
                f"flush_to({offset}) is past log_end_offset {self._log.log_end_offset}; append first"))
        else:
            self._waiters.append((offset, waiter))
            self._ensure_running()

    @staticmethod
    def _later(waiter: Waiter, flushed: int | None, exc: BaseException | None) -> None:
        """Settle a waiter that never joined a run: a future now (its awaiter resumes later
        anyway), a callback on the next loop round (never inside the call that added it)."""
        if asyncio.isfuture(waiter):
            _settle(waiter, flushed, exc)
        else:
            asyncio.get_running_loop().call_soon(_settle, waiter, flushed, exc)

    def flush_soon(self) -> None:
        """Start a flush run without waiting for it (lazy flush on a timer)."""
        if not self._closed and self._log.flushed_offset < self._log.log_end_offset:
            self._ensure_running()

    def _ensure_running(self) -> None:
        if self._running is None or self._running.done():
            self._running = asyncio.get_running_loop().create_future()
            self._start_run()

    # A run is driven by callbacks, not a task: the fsync is handed to the executor in
    # the step that asked for it, and the thread that ran it wakes the loop straight into
    # _finished, which calls the callback waiters itself: no scheduling round in between.

    def _start_run(self) -> None:
        loop = asyncio.get_running_loop()
        if self._debounce_s:
            loop.call_later(self._debounce_s, self._submit)
        elif self._may_run_inline():
            loop.call_soon(self._run_inline)
        else:
            self._submit()

    def _may_run_inline(self) -> bool:
        if not self._inline_bytes_max or time.monotonic() < self._inline_after:
            return False
        cost = self._log.flush_cost_bytes
        return cost is not None and cost <= self._inline_bytes_max

    def _run_inline(self) -> None:
        if not self._may_run_inline():   # the turn's appends made it bigger
            self._submit()
            return
        waiters, self._waiters = self._waiters, []
        started = time.perf_counter()
        try:
            flushed, exc = self._log.flush(), None
        except BaseException as e:  # noqa: BLE001 - handed to every waiter of this run
            flushed, exc = None, e
        took = time.perf_counter() - started
        if took > self._inline_stall_s:
            self._inline_after = time.monotonic() + INLINE_COOL_DOWN_S
        if exc is None:
            self.inline_count += 1
            if self._on_fsync is not None:
                self._on_fsync(took)
        self._finished(flushed, exc, waiters)

    def _submit(self) -> None:
        loop = asyncio.get_running_loop()
        waiters, self._waiters = self._waiters, []

        def fsync() -> None:  # on the executor's thread
            started = time.perf_counter()
            try:
                flushed, exc = self._log.flush(), None
            except BaseException as e:  # noqa: BLE001 - handed to every waiter of this run
                flushed, exc = None, e
            if exc is None and self._on_fsync is not None:
                self._on_fsync(time.perf_counter() - started)
            try:
                loop.call_soon_threadsafe(self._finished, flushed, exc, waiters)
            except RuntimeError:
                pass  # the loop is closed: nobody waits any more

        try:
            if self._executor is not None:
                # fsync reports back itself: no asyncio future chained to the pool's (whose
                # completion would wake the loop a second time per flush).
                self._executor.submit(fsync)
            else:
                loop.run_in_executor(None, fsync)
        except RuntimeError as exc:  # the executor is shut down (the loop is closing)
            loop.call_soon(self._finished, None, StorageError(f"flush could not start: {exc}"), waiters)

    def _finished(self, flushed: int | None, exc: BaseException | None,
                  waiters: list[tuple[int, Waiter]]) -> None:
        settled: list[tuple[Waiter, int | None, BaseException | None]] = []
        if exc is not None:  # every waiter of this run gets the same error
            settled = [(w, None, exc) for _, w in waiters]
            # Waiters that arrived during the failed run retry in a fresh run.
        else:
            assert flushed is not None, "a flush that raised nothing returns the flushed offset"
            self.flush_count += 1
            log_end_offset = self._log.log_end_offset
            remaining = []
            for offset, w in waiters + self._waiters:
                if offset <= flushed:
                    settled.append((w, flushed, None))
                elif offset > log_end_offset:
                    settled.append((w, None, LogTruncatedError(
                        f"offset {offset} was truncated (log_end_offset is now {log_end_offset}) "
                        f"before it was flushed")))
                else:
                    remaining.append((offset, w))
            self._waiters = remaining
        # Settled after the bookkeeping: a callback may ask for another flush right away.
        for w, value, error in settled:
            _settle(w, value, error)
        self._next_or_stop()

    def _next_or_stop(self) -> None:
        if self._waiters and not self._closed:
            self._start_run()
        elif self._running is not None and not self._running.done():
            self._running.set_result(None)

    async def close(self) -> None:
        """Finish the run in progress, then fail waiters that are still pending. Idempotent."""
        self._closed = True
        if self._running is not None:
            await asyncio.shield(self._running)
        waiters, self._waiters = self._waiters, []
        for _, w in waiters:
            self._later(w, None, StorageError("flush coalescer closed before the flush"))


def _settle(waiter: Waiter, value: int | None, exc: BaseException | None) -> None:
    """Resolve a future (unless its awaiter cancelled it) or call a callback waiter."""
    if not asyncio.isfuture(waiter):
        try:
            waiter(value, exc)
        except Exception:  # a waiter's bug must not stall the others
            logging.getLogger("biplane.log.flusher").exception("flush callback failed")
    elif waiter.done():
        return  # cancelled by its waiter
    elif exc is not None:
        waiter.set_exception(exc)
    else:
        assert value is not None, "a waiter settled without an error gets the flushed offset"
        waiter.set_result(value)
