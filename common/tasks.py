"""Owning asyncio tasks: every task a process starts is kept, and at stop it is
cancelled and then awaited (docs/style.md#processes-start-and-stop-cleanly).

A cancelled task has not ended until it has run its `finally` blocks (closing a
connection, releasing a lock); a stop that only cancels returns while they still
run, and the process may close what they use under them. `cancel_and_wait` is the
one way to stop tasks; `TaskOwner` keeps the tasks an object starts in the
background so that its close reaches every one (`wait` for those, like a connection's
close, that must finish rather than be cancelled).
"""
from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

T = TypeVar("T")


async def cancel_and_wait(*tasks: asyncio.Future[Any] | None) -> list[BaseException]:
    """Cancel every task not yet done (None is skipped) and wait until each has ended.

    Returns the exceptions tasks ended with, cancellation aside, so that a caller can
    log or raise them; a stop goes on closing the rest either way. If the caller is
    itself cancelled while waiting, the cancellation propagates.
    """
    waiting = [t for t in tasks if t is not None]
    for task in waiting:
        task.cancel()
    results = await asyncio.gather(*waiting, return_exceptions=True)
    return [r for r in results
            if isinstance(r, BaseException) and not isinstance(r, asyncio.CancelledError)]


def retrieve_exception(task: asyncio.Future[Any]) -> None:
    """A done callback for a task nobody awaits: its failure is read, so the loop does not log
    it as "never retrieved" (whoever cares reads it again)."""
    if not task.cancelled():
        task.exception()


class TaskOwner:
    """The background tasks of one object. A task leaves the set when it ends."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, T], *, name: str | None = None) -> asyncio.Task[T]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def __iter__(self) -> Iterator[asyncio.Task[Any]]:
        return iter(list(self._tasks))

    def __len__(self) -> int:
        return len(self._tasks)

    async def cancel_and_wait(self) -> list[BaseException]:
        """`cancel_and_wait` on every task started so far."""
        return await cancel_and_wait(*self._tasks)

    async def wait(self) -> list[BaseException]:
        """Wait, without cancelling, until every task started so far has ended; returns the
        exceptions they ended with. For tasks that must run to their end, such as closing a
        connection: a task cancelled before its first step runs none of its body."""
        results = await asyncio.gather(*self._tasks, return_exceptions=True)
        return [r for r in results
                if isinstance(r, BaseException) and not isinstance(r, asyncio.CancelledError)]
