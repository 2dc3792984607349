"""The harness's own event loop, kept moving and watched.

That loop runs the workload's producers and consumers. While it stands still, nothing is sent
and no answer is taken, so every acks=all gap in the history grows by the stall, whatever the
cluster did. Two things keep the figures honest:

- The history (a long run keeps about two million records) is kept out of the garbage
  collector's full passes. CPython runs a full pass each time the objects kept since the last
  one reach a quarter of those kept then, and each pass scans them all: in a 40-minute run
  that made 113 stalls of the whole workload over 0.3 s, up to 2.2 s each, longer as the run
  went on. Every second the watch collects what came since the last freeze and freezes what
  is alive (`gc.freeze`), so no pass scans the history again. A frozen object that later
  becomes cyclic garbage is not freed until the end (`stop`); `unreachable_at_stop` bounds
  how many were kept so (92,784 objects after a 40-minute run).
- Every stall over `stall_s` is recorded (when it began, how long), its own collections
  included, and the table shows them.
"""
from __future__ import annotations

import asyncio
import gc
import time
from typing import Callable

STALL_S = 0.25   # a stall recorded: longer than any turn of the workload's own work


class LoopWatch:
    def __init__(self, *, now: Callable[[], float], tick_s: float = 0.05, stall_s: float = STALL_S,
                 freeze_every_s: float = 1.0) -> None:
        self.now = now
        self.tick_s = tick_s
        self.stall_s = stall_s
        self.freeze_every_s = freeze_every_s
        self.stalls: list[tuple[float, float]] = []   # (run time the stall began, seconds)
        self.freezes = 0
        self.unreachable_at_stop: int | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        gc.unfreeze()
        self.unreachable_at_stop = gc.collect()

    def _stalled(self, seconds: float) -> None:
        if seconds > self.stall_s:
            self.stalls.append((round(self.now() - seconds, 3), round(seconds, 3)))

    async def _run(self) -> None:
        last_freeze = time.monotonic()
        while True:
            before = time.monotonic()
            await asyncio.sleep(self.tick_s)
            self._stalled(time.monotonic() - before - self.tick_s)
            if time.monotonic() - last_freeze >= self.freeze_every_s:
                before = time.monotonic()
                gc.collect()
                gc.freeze()
                self.freezes += 1
                last_freeze = time.monotonic()
                self._stalled(last_freeze - before)
