"""Futures of produced records, resolved a batch at a time.

A batch of a thousand records is acknowledged by one answer; resolving a thousand
asyncio futures one by one (and scheduling each one's callbacks) was a large part of the
producer's time. Here the batch holds the outcome once (`BatchOutcome`) and each record's
`RecordFuture` is a small view of it: its offset is the batch's base offset plus its index.

`RecordFuture` behaves as an asyncio future (asyncio.isfuture() is true): it can be awaited,
passed to asyncio.gather / wait / wait_for, and has result(), exception(), done(),
cancelled(), cancel(), add_done_callback() and remove_done_callback(). Callbacks run on the
event loop through call_soon, as asyncio's own do. Cancelling a record's future only stops
that caller from waiting: the record is still sent (it shares its batch with others).
"""
from __future__ import annotations

import asyncio
import contextvars
from types import TracebackType
from typing import Any, Callable

from dataplane.client.records import RecordMetadata, TopicPartition

_PENDING, _DONE = 0, 1


class BatchOutcome:
    """What became of one batch: an offset for its first record, or an error for all of them."""

    __slots__ = ("tp", "loop", "state", "base_offset", "error", "error_traceback", "callbacks")

    def __init__(self, tp: TopicPartition, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.tp = tp
        self.loop = loop   # the loop the records' futures belong to (set before any future is made)
        self.state = _PENDING
        self.base_offset = -1
        self.error: BaseException | None = None
        self.error_traceback: TracebackType | None = None
        # (record future, callback, context), in registration order
        self.callbacks: list[tuple[RecordFuture, Callable[[Any], Any], contextvars.Context | None]] | None = None

    @property
    def done(self) -> bool:
        return self.state == _DONE

    def bound_loop(self) -> asyncio.AbstractEventLoop:
        """The loop of this outcome's futures: set before the first future is made."""
        assert self.loop is not None, "a record future was made before its batch had a loop"
        return self.loop

    def resolve(self, base_offset: int) -> None:
        """Acknowledged: record i landed at base_offset + i (-1 when nobody said where)."""
        if self.state == _PENDING:
            self.state = _DONE
            self.base_offset = base_offset
            self._run_callbacks()

    def fail(self, error: BaseException) -> None:
        if self.state == _PENDING:
            self.state = _DONE
            self.error = error
            self.error_traceback = error.__traceback__
            self._run_callbacks()

    def _run_callbacks(self) -> None:
        callbacks, self.callbacks = self.callbacks, None
        if not callbacks:
            return
        loop = self.bound_loop()
        for future, callback, context in callbacks:
            if not future._cancelled:
                loop.call_soon(callback, future, context=context)


class RecordFuture:
    """The future RecordMetadata(topic, partition, offset) of one record (see the module doc)."""

    # One is made per record sent, so it holds just two references; the rare per-future
    # state (cancelled, asyncio's blocking flag) lives in a __dict__ made only when set.
    __slots__ = ("_outcome", "_index", "__dict__")
    _cancelled = False
    _asyncio_future_blocking = False   # asyncio's protocol for future-likes

    def __init__(self, outcome: BatchOutcome, index: int) -> None:
        self._outcome = outcome
        self._index = index

    @property
    def _loop(self) -> asyncio.AbstractEventLoop:
        return self._outcome.bound_loop()

    # ------------------------------------------------------------ state

    def done(self) -> bool:
        return self._cancelled or self._outcome.state == _DONE

    def cancelled(self) -> bool:
        return self._cancelled

    def result(self) -> RecordMetadata:
        if self._cancelled:
            raise asyncio.CancelledError()
        outcome = self._outcome
        if outcome.state != _DONE:
            raise asyncio.InvalidStateError("the record is not acknowledged yet")
        if outcome.error is not None:
            # Every record of the batch raises the same error: restore its traceback each time,
            # as asyncio's futures do, so that it does not grow with every raise.
            raise outcome.error.with_traceback(outcome.error_traceback)
        base = outcome.base_offset
        return RecordMetadata(outcome.tp.topic, outcome.tp.partition, base + self._index if base >= 0 else -1)

    def exception(self) -> BaseException | None:
        if self._cancelled:
            raise asyncio.CancelledError()
        if self._outcome.state != _DONE:
            raise asyncio.InvalidStateError("the record is not acknowledged yet")
        return self._outcome.error

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._outcome.bound_loop()

    # ------------------------------------------------------------ callbacks

    def add_done_callback(self, fn: Callable[["RecordFuture"], Any], *,
                          context: contextvars.Context | None = None) -> None:
        if self.done():
            self._loop.call_soon(fn, self, context=context)
            return
        outcome = self._outcome
        if outcome.callbacks is None:
            outcome.callbacks = []
        outcome.callbacks.append((self, fn, context))

    def remove_done_callback(self, fn: Callable[["RecordFuture"], Any]) -> int:
        callbacks = self._outcome.callbacks
        if not callbacks:
            return 0
        keep = [entry for entry in callbacks if not (entry[0] is self and entry[1] == fn)]
        removed = len(callbacks) - len(keep)
        callbacks[:] = keep
        return removed

    def cancel(self, msg: Any = None) -> bool:
        """Stop waiting for this record (it is still sent with its batch)."""
        if self.done():
            return False
        self._cancelled = True
        callbacks = self._outcome.callbacks
        if callbacks:
            mine = [entry for entry in callbacks if entry[0] is self]
            callbacks[:] = [entry for entry in callbacks if entry[0] is not self]
            for _, fn, context in mine:
                self._loop.call_soon(fn, self, context=context)
        return True

    # asyncio.gather reads these when a child was cancelled.
    _cancel_message = None

    def _make_cancelled_error(self) -> asyncio.CancelledError:
        return asyncio.CancelledError()

    # ------------------------------------------------------------ awaiting

    def __await__(self):
        if not self.done():
            self._asyncio_future_blocking = True
            yield self  # the task waits here until a callback wakes it
        if not self.done():
            raise RuntimeError("await wasn't used with future")
        return self.result()

    __iter__ = __await__

    def __repr__(self) -> str:
        outcome = self._outcome
        if self._cancelled:
            state = "cancelled"
        elif outcome.state != _DONE:
            state = "pending"
        elif outcome.error is not None:
            state = f"failed: {outcome.error!r}"
        else:
            state = f"offset={outcome.base_offset + self._index if outcome.base_offset >= 0 else -1}"
        return f"<RecordFuture {outcome.tp} #{self._index} {state}>"
