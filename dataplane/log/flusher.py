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
"""
from __future__ import annotations

import asyncio
import concurrent.futures

from common.errors import InvalidRequestError, StorageError

from .interface import Log


class LogTruncatedError(StorageError):
    """The offset a waiter wanted flushed was truncated away before it became durable."""


class FlushCoalescer:
    def __init__(self, log: Log, *, debounce_ms: float = 0.0,
                 executor: concurrent.futures.Executor | None = None) -> None:
        if debounce_ms < 0:
            raise InvalidRequestError(f"debounce_ms={debounce_ms} must be >= 0")
        self._log = log
        self._debounce_s = debounce_ms / 1000.0
        self._executor = executor
        self._waiters: list[tuple[int, asyncio.Future[int]]] = []
        # Set while a run (debounce, then fsync) is under way; resolved when runs stop.
        self._running: asyncio.Future[None] | None = None
        self._closed = False
        self.flush_count = 0  # fsync runs so far, for tests and benchmarks

    async def flush_to(self, offset: int) -> int:
        """Wait until every offset below `offset` is durable; returns flushed_offset.

        `offset` is exclusive, like log_end_offset: flush_to(info.last_offset + 1)
        waits for an append. Raises InvalidRequestError past log_end_offset (that
        would wait for data nobody has written), StorageError if the flush fails,
        LogTruncatedError if the offset is truncated away first.
        """
        return await self.flush_future(offset)

    def flush_future(self, offset: int) -> asyncio.Future[int]:
        """flush_to without a coroutine: the waiter is registered (and the fsync started)
        before this returns; the future resolves or fails as flush_to would."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[int] = loop.create_future()
        if self._closed:
            future.set_exception(StorageError("flush coalescer is closed"))
        elif offset <= self._log.flushed_offset:
            future.set_result(self._log.flushed_offset)
        elif offset > self._log.log_end_offset:
            future.set_exception(InvalidRequestError(
                f"flush_to({offset}) is past log_end_offset {self._log.log_end_offset}; append first"))
        else:
            self._waiters.append((offset, future))
            self._ensure_running()
        return future

    def flush_soon(self) -> None:
        """Start a flush run without waiting for it (lazy flush on a timer)."""
        if not self._closed and self._log.flushed_offset < self._log.log_end_offset:
            self._ensure_running()

    def _ensure_running(self) -> None:
        if self._running is None or self._running.done():
            self._running = asyncio.get_running_loop().create_future()
            self._start_run()

    # A run is driven by callbacks, not a task: the fsync is handed to the executor in
    # the same step that asked for it, with no scheduling round in between.

    def _start_run(self) -> None:
        loop = asyncio.get_running_loop()
        if self._debounce_s:
            loop.call_later(self._debounce_s, self._submit)
        else:
            self._submit()

    def _submit(self) -> None:
        loop = asyncio.get_running_loop()
        waiters, self._waiters = self._waiters, []
        try:
            done = loop.run_in_executor(self._executor, self._log.flush)
        except RuntimeError as exc:  # the executor is shut down (the loop is closing)
            done = loop.create_future()
            done.set_exception(StorageError(f"flush could not start: {exc}"))
        done.add_done_callback(lambda f: self._finished(f, waiters))

    def _finished(self, done: asyncio.Future[int], waiters: list[tuple[int, asyncio.Future[int]]]) -> None:
        exc = done.exception() if not done.cancelled() else StorageError("flush was cancelled")
        if exc is not None:  # every waiter of this run gets the same error
            for _, future in waiters:
                if not future.done():
                    future.set_exception(exc)
            # Waiters that arrived during the failed run retry in a fresh run.
            self._next_or_stop()
            return
        flushed = done.result()
        self.flush_count += 1
        log_end_offset = self._log.log_end_offset
        for offset, future in waiters + self._waiters:
            if future.done():
                continue
            if offset <= flushed:
                future.set_result(flushed)
            elif offset > log_end_offset:
                future.set_exception(LogTruncatedError(
                    f"offset {offset} was truncated (log_end_offset is now {log_end_offset}) "
                    f"before it was flushed"))
        self._waiters = [(o, f) for o, f in waiters + self._waiters if not f.done()]
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
        for _, future in self._waiters:
            if not future.done():
                future.set_exception(StorageError("flush coalescer closed before the flush"))
        self._waiters = []
