"""The event loop our processes run on: uvloop when it is installed, else asyncio's own.

uvloop is optional: it serves the same asyncio API with less interpreter work per
socket event, which matters to a broker moving hundreds of MB/s on few cores.
BIPLANE_EVENT_LOOP=asyncio forces the standard loop (to compare, or to rule it out).
"""
from __future__ import annotations

import asyncio
import os
from typing import Any, Callable, Coroutine, TypeVar

T = TypeVar("T")


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


def run(main: Coroutine[Any, Any, T]) -> T:
    """asyncio.run(main) on the loop chosen above."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)
