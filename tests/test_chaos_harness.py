"""The fault harness's own machinery, without processes or namespaces: the network faults go
in one `nft` transaction per namespace, and the harness's event loop records its stalls and
keeps its history out of the garbage collector's full passes."""
from __future__ import annotations

import asyncio
import gc
import json
import time
from typing import Any

import pytest

from tests.chaos import net
from tests.chaos.checker import check
from tests.chaos.history import History
from tests.chaos.loopwatch import LoopWatch
from tests.test_chaos_checker import clean_history


class Done:
    returncode = 0
    stdout = stderr = ""


@pytest.fixture
def commands(monkeypatch: pytest.MonkeyPatch) -> list[tuple[list[str], str | None]]:
    calls: list[tuple[list[str], str | None]] = []

    def run(argv: list[str], *, stdin: str | None = None, check: bool = True) -> Any:
        calls.append((argv, stdin))
        return Done()

    monkeypatch.setattr(net, "run", run)
    return calls


def network() -> net.Network:
    return net.Network(run_id="t", node_names=["c1", "c2", "c3", "b1", "b2", "b3"], subnet_octet=9)


def test_a_partition_is_one_nft_transaction_per_namespace(commands: list[tuple[list[str], str | None]]) -> None:
    """b2 and c1 cut from the other four: 16 rules, one `nft -f -` in each of the six
    namespaces, each holding exactly the drops of packets from the other side."""
    n = network()
    minority = ["b2", "c1"]
    across = [(a, b) for a in minority for b in n.nodes if b not in minority]
    n.cut(*across, *[(b, a) for a, b in across])
    assert len(commands) == 6
    by_netns = {argv[3]: stdin for argv, stdin in commands}
    assert all(argv[4:] == ["nft", "-f", "-"] for argv, _ in commands)
    address = {name: ep.address for name, ep in n.nodes.items()}
    for name in n.nodes:
        other_side = [o for o in n.nodes if (o in minority) != (name in minority)]
        stdin = by_netns[f"bpct-{name}"]
        assert stdin is not None
        assert sorted(stdin.splitlines()) == sorted(
            f"add rule inet {net.NFT_TABLE} input ip saddr {address[o]} drop" for o in other_side)
    assert n.dirty == set(n.nodes)


def test_heal_flushes_each_touched_namespace_once(commands: list[tuple[list[str], str | None]]) -> None:
    n = network()
    n.cut(("b1", "hub"), ("hub", "b1"))
    n.loss("c2", 30)
    commands.clear()
    n.heal_all()
    touched = {argv[3] for argv, _ in commands}
    assert len(commands) == len(touched) == 6   # loss: every namespace but c2's (b1's and the hub's among them)
    hub = [stdin for argv, stdin in commands if argv[3] == "bpct-hub"]
    assert hub == [f"flush chain inet {net.NFT_TABLE} input\n"]   # the hub has no dup table
    assert not n.dirty


def quiet_collector() -> None:
    """Freeze the test process's own heap first: in a long suite it is large, and the watch's
    first full collection over it stalls the loop by itself (0.2-0.3 s seen in CI)."""
    gc.collect()
    gc.freeze()


def test_the_loop_watch_records_a_stall_and_freezes_what_came_since() -> None:
    class Node:
        me: object = None

    async def main() -> tuple[LoopWatch, bool]:
        quiet_collector()
        watch = LoopWatch(now=time.monotonic, tick_s=0.01, stall_s=0.1, freeze_every_s=0.02)
        watch.start()
        await asyncio.sleep(0.05)
        node = Node()                     # tracked by the collector, born after the watch began
        node.me = node
        await asyncio.sleep(0.1)          # a freeze or more later
        frozen = not any(o is node for o in gc.get_objects())   # frozen: no generation holds it
        time.sleep(0.3)                   # the loop blocked, as by a long collector pass
        await asyncio.sleep(0.05)
        await watch.stop()
        return watch, frozen

    watch, frozen = asyncio.run(main())
    assert frozen
    assert [round(d, 1) for _, d in watch.stalls if d >= 0.25] == [0.3]
    assert gc.get_freeze_count() == 0     # stop unfreezes, so a later run starts clean
    assert watch.unreachable_at_stop is not None


def test_the_loop_watch_counts_its_own_collections(monkeypatch: pytest.MonkeyPatch) -> None:
    collect = gc.collect

    def slow_collect(*args: int) -> int:
        time.sleep(0.3)
        return collect(*args)

    async def main() -> LoopWatch:
        quiet_collector()
        watch = LoopWatch(now=time.monotonic, tick_s=0.01, stall_s=0.2, freeze_every_s=0.05)
        watch.start()
        await asyncio.sleep(0.1)
        monkeypatch.setattr(gc, "collect", slow_collect)
        await asyncio.sleep(0.15)         # the next freeze's collection runs slow
        monkeypatch.setattr(gc, "collect", collect)
        await watch.stop()
        return watch

    watch = asyncio.run(main())
    assert any(0.3 <= d < 0.6 for _, d in watch.stalls)


def test_harness_stalls_travel_in_the_history_and_the_figures() -> None:
    h = clean_history()
    h.harness_stalls = [(12.5, 0.4), (30.0, 1.25)]
    again = History.from_json(json.loads(json.dumps(h.to_json())))
    assert again.harness_stalls == h.harness_stalls
    figs = check(again).figures
    assert (figs["harness_stalls"], figs["harness_stall_longest_s"]) == (2, 1.25)
    older = h.to_json()
    del older["harness_stalls"]   # a history written before the field existed: not "no stalls"
    assert History.from_json(older).harness_stalls is None
    assert check(History.from_json(older)).figures["harness_stalls"] is None
