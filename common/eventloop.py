"""The event loop our processes run on: uvloop when it is installed, else asyncio's own.

uvloop is optional: it serves the same asyncio API with less interpreter work per
socket event, which matters to a broker moving hundreds of MB/s on few cores.
BIPLANE_EVENT_LOOP=asyncio forces the standard loop (to compare, or to rule it out).

LoopWatchdog measures how long the loop is kept from running its callbacks (the
stalls that starve heartbeats and fetch sessions); processes export what it sees.
"""
from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import time
import traceback
from typing import Any, AsyncIterator, Callable, Coroutine, Iterable, TypeVar

T = TypeVar("T")
STACK_FRAMES_MAX = 12


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop constructor, or None for asyncio's default."""
    if os.environ.get("BIPLANE_EVENT_LOOP", "").lower() == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def loop_name() -> str:
    factory = loop_factory()
    return "asyncio" if factory is None else "uvloop"


# How long a background pass steps aside between its slices. A request in flight needs
# several loop turns on each broker it crosses (read, step, write, flush, answer); a bare
# `sleep(0)` gives it one turn per slice, so a pass of many slices delayed it by most of the
# pass. A millisecond lets such a chain run to its end between two slices.
BACKGROUND_PAUSE_S = 0.001


async def step_aside() -> None:
    """Let the loop serve what is ready (and what that readies in turn) before a
    background pass goes on with its next slice."""
    await asyncio.sleep(BACKGROUND_PAUSE_S)


async def in_slices(items: Iterable[T], size: int) -> AsyncIterator[T]:
    """`items`, stepping aside after each `size` of them: a pass over thousands of
    partitions on the loop must let sockets and timers run between its slices."""
    for i, item in enumerate(items):
        if i and i % size == 0:
            await step_aside()
        yield item


def run(main: Coroutine[Any, Any, T]) -> T:
    """asyncio.run(main) on the loop chosen above."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)


# ---------------------------------------------------------------- stall watchdog

# Upper bounds (ms) of the lag histogram's buckets; a lag past the last is counted in +Inf.
LAG_BUCKETS_MS: tuple[float, ...] = (5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000)


class LoopStalls:
    """What a LoopWatchdog saw, as plain numbers (pure: it is handed lags, reads no clock).

    A lag is how late a callback ran after it was due: the time the loop spent in other
    callbacks meanwhile. `stall_max_ms` is the largest seen; `stalls_total` counts lags of
    at least `stall_ms_min`; `bucket_counts[i]` counts lags <= LAG_BUCKETS_MS[i]
    (cumulative, as a Prometheus histogram), `lag_count` and `lag_sum_ms` all of them."""

    def __init__(self, *, stall_ms_min: float = 100.0, buckets_ms: tuple[float, ...] = LAG_BUCKETS_MS) -> None:
        if list(buckets_ms) != sorted(buckets_ms) or not buckets_ms:
            raise ValueError(f"buckets_ms must be non-empty and ascending, got {buckets_ms!r}")
        self.stall_ms_min = stall_ms_min
        self.buckets_ms = buckets_ms
        self.bucket_counts = [0] * len(buckets_ms)
        self.lag_count = 0
        self.lag_sum_ms = 0.0
        self.stall_max_ms = 0.0
        self.stalls_total = 0

    def observe(self, lag_ms: float) -> None:
        lag_ms = max(lag_ms, 0.0)
        self.lag_count += 1
        self.lag_sum_ms += lag_ms
        for i, bound in enumerate(self.buckets_ms):
            if lag_ms <= bound:
                self.bucket_counts[i] += 1
        if lag_ms >= self.stall_ms_min:
            self.stalls_total += 1
        self.stall_max_ms = max(self.stall_max_ms, lag_ms)


class LoopWatchdog:
    """Measures the event loop's longest stalls: a callback due every `interval_ms` notes
    how late it runs (LoopStalls) and logs a structured WARNING (event "loop.stall") for a
    lag of `stall_warn_ms` or more. It costs one timer callback per interval.

        watchdog = LoopWatchdog(name="broker 1"); watchdog.start()   # on the running loop
        watchdog.stalls.stall_max_ms; watchdog.stop()                 # stop is idempotent
    """

    def __init__(self, *, name: str = "", interval_ms: float = 20.0, stall_warn_ms: float = 250.0,
                 stall_ms_min: float = 100.0, logger: logging.Logger | None = None) -> None:
        if interval_ms <= 0 or stall_warn_ms <= 0:
            raise ValueError(f"interval_ms ({interval_ms}) and stall_warn_ms ({stall_warn_ms}) must be > 0")
        self.name = name
        self.interval_ms = interval_ms
        self.stall_warn_ms = stall_warn_ms
        self.stalls = LoopStalls(stall_ms_min=stall_ms_min)
        self.logger = logger or logging.getLogger("biplane.eventloop")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._due = 0.0
        self._cpu_s = 0.0
        # time.monotonic() of the last tick: when the loop last ran callbacks. Read from other
        # threads (the broker's heartbeat thread), so a plain float written whole.
        self.last_progress_s = time.monotonic()
        self._thread_id: int | None = None

    def start(self) -> None:
        if self._handle is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._thread_id = threading.get_ident()
        self._due = self._loop.time() + self.interval_ms / 1000
        self._cpu_s = time.thread_time()
        self.last_progress_s = time.monotonic()
        self._handle = self._loop.call_at(self._due, self._tick)

    def _tick(self) -> None:
        assert self._loop is not None
        now = self._loop.time()
        lag_ms = (now - self._due) * 1000
        self.stalls.observe(lag_ms)
        cpu_s = time.thread_time()
        if lag_ms >= self.stall_warn_ms:
            # The loop thread's own CPU time tells a long callback (CPU ~ the stall) from a
            # thread kept off the CPU: a starved machine, the GIL held by another thread, or
            # a blocking call. They need different remedies.
            cpu_ms = (cpu_s - self._cpu_s) * 1000
            self.logger.warning("%s: event loop stalled for %.0f ms (%.0f ms of it on the CPU in this thread: %s)",
                                self.name, lag_ms, cpu_ms,
                                "a callback ran that long" if cpu_ms >= lag_ms / 2 else "kept off the CPU",
                                extra={"event": "loop.stall", "stall_ms": round(lag_ms, 1),
                                       "cpu_ms": round(cpu_ms, 1)})
        self._cpu_s = cpu_s
        self.last_progress_s = time.monotonic()
        self._due = now + self.interval_ms / 1000
        self._handle = self._loop.call_at(self._due, self._tick)

    def loop_stack(self, frames_max: int = STACK_FRAMES_MAX) -> str | None:
        """What the loop's thread is running now: its innermost `frames_max` frames as
        "dir/file.py:line function", outermost first, joined by " > "; None before start or
        once that thread is gone. Called from another thread while the loop is stalled, to name the
        callback that holds it (after the stall, the stack is gone)."""
        frame = sys._current_frames().get(self._thread_id) if self._thread_id is not None else None
        if frame is None:
            return None
        entries = traceback.extract_stack(frame)[-frames_max:]
        return " > ".join(f"{'/'.join(e.filename.split('/')[-2:])}:{e.lineno} {e.name}" for e in entries)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
