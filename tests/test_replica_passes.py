"""ReplicaManager's passes over every replica at thousands of partitions: the periodic ones
(retention, the cleaner) yield to the loop between slices, and the fetcher's follow check
is told which partitions changed rather than walking every one (each held the loop for
5-17 ms at 10,000 replicas: a steady load's slowest requests beside them)."""
from __future__ import annotations

import asyncio
import os

from dataplane.broker.config import BrokerConfig
from dataplane.broker.replicas import ReplicaManager
from test_disk_full import FakeControl

def test_the_retention_and_cleaner_passes_yield_to_the_loop_between_slices_of_replicas(tmp_path, monkeypatch):
    """Each pass looks at every replica for the few with work; at 10,000 replicas one pass in
    one go held the loop for 5-9 ms, the slowest requests of a steady load beside them. They
    now yield after LOOKS_PER_SLICE looks: no loop turn sees more looks than that."""
    import types

    from dataplane.broker import replicas as replicas_module
    monkeypatch.setattr(replicas_module, "LOOKS_PER_SLICE", 10, raising=False)
    config = BrokerConfig(broker_id=1, data_dir=str(tmp_path / "data"), controller_urls=("http://c:1",),
                          retention_check_interval_ms=100, log_cleaner_interval_ms=100)
    os.makedirs(config.data_dir, exist_ok=True)
    turn = [0]
    looks: dict[str, list[int]] = {"retention": [], "cleaner": []}

    class Looked:
        """A replica with nothing to do (one segment; no topic known): it notes the loop turn
        at which a pass looked at it."""
        failed = None
        log = types.SimpleNamespace(segment_count=1)

        @property
        def closed(self) -> bool:
            looks["retention"].append(turn[0])
            return False

    class Topics(dict):
        def get(self, key, default=None):
            looks["cleaner"].append(turn[0])
            return default

    async def scenario():
        manager = ReplicaManager(config=config, control=FakeControl(), clean_start=True, send_fetch=lambda *a: None,
                                 send_append_entries=lambda *a: None, refresh_metadata=lambda: None)
        loop = asyncio.get_running_loop()

        def count_turns():
            turn[0] += 1
            loop.call_soon(count_turns)
        loop.call_soon(count_turns)
        manager.drivers = {(f"t{i}", 0): Looked() for i in range(95)}
        manager._topics = Topics()
        tasks = [asyncio.create_task(manager.run_retention()), asyncio.create_task(manager.run_cleaner())]
        for _ in range(100):
            await asyncio.sleep(0.02)
            if min(len(v) for v in looks.values()) >= 95:
                break
        for task in tasks:
            task.cancel()
        manager.drivers = {}
        await manager.close()

    asyncio.run(scenario())
    for name, turns in looks.items():
        first = turns[:95]
        assert len(first) == 95, f"the {name} pass looked at {len(first)} of 95 replicas"
        per_turn = max(first.count(t) for t in set(first))
        assert per_turn <= 10, f"the {name} pass looked at {per_turn} replicas in one loop turn"


def test_the_replicas_say_which_partitions_changed_since_a_version_and_when_they_no_longer_know(tmp_path, monkeypatch):
    """The fetcher's follow check looks only at the partitions whose replica changed role,
    epoch or liveness since its last look (ReplicaManager.follow_changed_since): a caller that
    is new, or further behind than the changes kept, is told to look at all of its own."""
    from dataplane.broker import replicas as replicas_module
    monkeypatch.setattr(replicas_module, "FOLLOW_LOG_MAX", 8)
    config = BrokerConfig(broker_id=1, data_dir=str(tmp_path / "data"), controller_urls=("http://c:1",))
    manager = ReplicaManager(config=config, control=FakeControl(), clean_start=True, send_fetch=lambda *a: None,
                             send_append_entries=lambda *a: None, refresh_metadata=lambda: None)
    version, changed = manager.follow_changed_since(None)
    assert changed is None, "a new caller looks at all"
    assert manager.follow_changed_since(version) == (version, set())
    for t in ("a", "b", "a"):
        manager._follow_changed((t, 0))
    v2, changed = manager.follow_changed_since(version)
    assert (v2, changed) == (version + 3, {("a", 0), ("b", 0)})
    manager._follow_changed(("c", 0))
    assert manager.follow_changed_since(v2) == (v2 + 1, {("c", 0)})
    for i in range(20):
        manager._follow_changed((f"x{i}", 0))
    now, changed = manager.follow_changed_since(v2)
    assert changed is None and now == v2 + 21, "changes no longer kept: look at all"
    assert manager.follow_changed_since(now - 2) == (now, {("x18", 0), ("x19", 0)})


def test_the_tick_pass_lets_a_request_of_several_loop_turns_finish_between_two_slices(tmp_path, monkeypatch):
    """Replicas opened together fall due together (their ISR clocks): at 10,000 partitions a
    pass ticked a thousand of them, and a request that arrived meanwhile waited a slice for
    each of its loop turns. The pass steps aside between slices long enough for it to end."""
    from dataplane.broker import replicas as replicas_module
    monkeypatch.setattr(replicas_module, "PARTITIONS_PER_SLICE", 10)
    config = BrokerConfig(broker_id=1, data_dir=str(tmp_path / "data"), controller_urls=("http://c:1",))
    os.makedirs(config.data_dir, exist_ok=True)
    order: list[str] = []

    class Ticked:
        def __init__(self, n: int) -> None:
            self.n = n

        def tick(self, now: int) -> None:
            if self.n % 10 == 0:
                order.append(f"slice {self.n // 10}")

    async def request() -> None:
        for _ in range(5):
            await asyncio.sleep(0)
        order.append("request answered")

    async def scenario():
        manager = ReplicaManager(config=config, control=FakeControl(), clean_start=True, send_fetch=lambda *a: None,
                                 send_append_entries=lambda *a: None, refresh_metadata=lambda: None)
        manager.drivers = {(f"t{i}", 0): Ticked(i) for i in range(40)}
        for i in range(40):
            manager.schedule_tick((f"t{i}", 0), 1)
        ticks = asyncio.create_task(manager.run_ticks())
        await asyncio.sleep(0)   # the pass starts with its first slice
        await request()
        for _ in range(100):
            if len(order) >= 5:
                break
            await asyncio.sleep(0.01)
        ticks.cancel()
        manager.drivers = {}
        await manager.close()

    asyncio.run(scenario())
    assert "slice 3" in order, order
    assert order.index("request answered") < order.index("slice 2"), order
