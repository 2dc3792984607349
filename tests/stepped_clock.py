"""The time module as a process sees it after its wall clock is stepped: tests set `step_s`
and patch it over a module's `time`; the monotonic clock is the real one, as a step leaves it."""
from __future__ import annotations

import time as real_time
from typing import Any


class SteppedClock:
    def __init__(self) -> None:
        self.step_s = 0.0

    def time(self) -> float:
        return real_time.time() + self.step_s

    def time_ns(self) -> int:
        return real_time.time_ns() + int(self.step_s * 1e9)

    def __getattr__(self, name: str) -> Any:
        return getattr(real_time, name)
