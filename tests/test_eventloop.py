"""common/eventloop.py: uvloop when installed, asyncio's loop when it is not or when
BIPLANE_EVENT_LOOP=asyncio asks for it; either way the coroutine's result comes back."""
from __future__ import annotations

import asyncio
import importlib.util
import sys

import pytest

from common import eventloop


async def loop_module() -> str:
    await asyncio.sleep(0)
    return type(asyncio.get_running_loop()).__module__


@pytest.mark.skipif(importlib.util.find_spec("uvloop") is None, reason="uvloop is not installed")
def test_uvloop_is_used_when_installed(monkeypatch):
    monkeypatch.delenv("BIPLANE_EVENT_LOOP", raising=False)
    assert eventloop.run(loop_module()).startswith("uvloop")
    assert eventloop.loop_name() == "uvloop"


def test_environment_forces_the_standard_loop(monkeypatch):
    monkeypatch.setenv("BIPLANE_EVENT_LOOP", "asyncio")
    assert eventloop.run(loop_module()).startswith("asyncio")
    assert eventloop.loop_name() == "asyncio"


def test_falls_back_to_asyncio_without_uvloop(monkeypatch):
    monkeypatch.delenv("BIPLANE_EVENT_LOOP", raising=False)
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop now raises ImportError
    assert eventloop.run(loop_module()).startswith("asyncio")
    assert eventloop.loop_name() == "asyncio"


@pytest.mark.skipif(importlib.util.find_spec("uvloop") is None, reason="uvloop is not installed")
def test_the_blocking_clients_private_loop_is_the_chosen_one(monkeypatch):
    """A blocking send_and_wait pays its private loop's wake-up and socket events on the way
    out and back: that loop is uvloop too when installed, and follows BIPLANE_EVENT_LOOP."""
    from dataplane.client.sync import _LoopThread

    def private_loop_module() -> str:
        thread = _LoopThread("test")
        try:
            return thread.run(loop_module(), timeout_s=10)
        finally:
            thread.stop()

    monkeypatch.delenv("BIPLANE_EVENT_LOOP", raising=False)
    assert private_loop_module().startswith("uvloop")
    monkeypatch.setenv("BIPLANE_EVENT_LOOP", "asyncio")
    assert private_loop_module().startswith("asyncio")


def test_a_pass_in_slices_lets_a_request_of_several_loop_turns_finish_between_two_slices():
    """A request crossing a broker takes several loop turns (read, step, write, answer). With
    a bare `sleep(0)` between slices it got one turn per slice, so a pass of many slices
    (ticks due together at 10,000 partitions) delayed it by most of the pass: the steady
    load's slowest requests. Stepping aside lets the whole chain run between two slices."""
    order: list[str] = []

    async def request() -> None:
        for _ in range(5):
            await asyncio.sleep(0)
        order.append("request answered")

    async def background_pass() -> None:
        async for i in eventloop.in_slices(range(40), 10):
            if i % 10 == 0:
                order.append(f"slice {i // 10}")

    async def scenario() -> None:
        await asyncio.gather(background_pass(), request())

    eventloop.run(scenario())
    assert order.index("request answered") < order.index("slice 2"), order
