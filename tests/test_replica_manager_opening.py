"""The replica manager opens replicas off the metadata path: newer metadata applies while older
replicas open, a replica still opening answers "not available" (retriable), the newest open
first, in the same order on every broker, and idle replicas are ticked only when their own timer
is due."""
from __future__ import annotations

import asyncio

from dataplane.broker.replicas import NewestFirst


def test_newest_first_hands_a_freed_slot_to_the_smallest_key_then_the_first_arrival():
    async def scenario():
        slots = NewestFirst(1)
        order: list[str] = []
        release = asyncio.Event()

        async def holder():
            async with slots.entered((0, "", 0)):
                await release.wait()

        async def waiter(name: str, key):
            async with slots.entered(key):
                order.append(name)
        first = asyncio.ensure_future(holder())
        await asyncio.sleep(0)
        waiters = []
        for name, key in (("old", (-1, "a", 0)), ("new-1", (-3, "c", 1)), ("mid", (-2, "b", 0)),
                          ("new-0", (-3, "c", 0)), ("new-1 again", (-3, "c", 1))):
            waiters.append(asyncio.ensure_future(waiter(name, key)))
            await asyncio.sleep(0)
        release.set()
        await asyncio.gather(first, *waiters)
        return order
    assert asyncio.run(scenario()) == ["new-0", "new-1", "new-1 again", "mid", "old"]


def test_newest_first_bounds_holders_and_survives_cancelled_waiters():
    async def scenario():
        slots = NewestFirst(2)
        inside = 0
        peak = 0

        async def work():
            nonlocal inside, peak
            async with slots.entered((0, "t", 0)):
                inside += 1
                peak = max(peak, inside)
                await asyncio.sleep(0.001)
                inside -= 1
        tasks = [asyncio.ensure_future(work()) for _ in range(20)]
        await asyncio.sleep(0)
        tasks[10].cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        async with slots.entered((0, "t", 0)):  # every slot came back
            async with slots.entered((0, "t", 0)):
                pass
        return peak
    assert asyncio.run(scenario()) == 2


def _manager(tmp_path, *, clean_start: bool = True):
    """Broker 1's replica manager over `tmp_path`/data (created), with no peers."""
    import os

    from dataplane.broker.config import BrokerConfig
    from dataplane.broker.replicas import ReplicaManager
    from test_broker_parts import FakeControl
    config = BrokerConfig(broker_id=1, data_dir=str(tmp_path / "data"), controller_urls=("http://c:1",))
    os.makedirs(config.data_dir, exist_ok=True)
    return ReplicaManager(config=config, control=FakeControl(), clean_start=clean_start, send_fetch=lambda *a: None,
                          send_append_entries=lambda *a: None, refresh_metadata=lambda: None)


def hold_open(monkeypatch, directory_name: str):
    """Block the open of the replica directory `directory_name` in its opener thread until the
    returned event is set."""
    import threading

    from dataplane.broker import replicas as replicas_module
    gate = threading.Event()
    real_prepare = replicas_module._prepare_dir

    def prepare(directory, topic_id, *rest):
        if directory.endswith(directory_name):
            assert gate.wait(30), "test gate never opened"
        return real_prepare(directory, topic_id, *rest)
    monkeypatch.setattr(replicas_module, "_prepare_dir", prepare)
    return gate


def test_newer_metadata_applies_while_a_replica_is_still_opening(tmp_path, monkeypatch):
    """t-0's open blocks in its thread: on_metadata still returns, a later image's topic u opens
    and is served, t-0 answers LEADER_NOT_AVAILABLE meanwhile, and once open it is fed the
    image applied last, and leads."""
    from common.errors import ErrorCode
    from dataplane.replica.core import Role
    from metadata_builders import add_topic, cluster

    gate = hold_open(monkeypatch, "t-0")
    first = cluster(1)
    add_topic(first, "t", [[1]], min_insync_replicas=1)
    second = first.copy()
    add_topic(second, "u", [[1]], min_insync_replicas=1)

    async def scenario():
        manager = _manager(tmp_path)
        try:
            await asyncio.wait_for(manager.on_metadata(first), 5)
            assert ("t", 0) in manager.opening and manager.get("t", 0) is None
            await asyncio.wait_for(manager.on_metadata(second), 5)
            for _ in range(500):
                if manager.get("u", 0) is not None:
                    break
                await asyncio.sleep(0.01)
            assert manager.get("u", 0) is not None, "u waited behind t-0's open"
            assert manager.get("t", 0) is None and ("t", 0) in manager.opening
            server = _locate_only(manager, second)
            assert server._locate("t", 0) == (None, ErrorCode.LEADER_NOT_AVAILABLE)
            gate.set()
            await asyncio.wait_for(manager.settled(), 10)
            driver = manager.get("t", 0)
            assert driver is not None and driver.replica.role is Role.LEADER
            assert driver.replica.leader_epoch == second.get_partition("t", 0).leader_epoch
            assert not manager.opening
        finally:
            gate.set()
            await manager.close()
    asyncio.run(scenario())


def test_every_broker_opens_a_backlog_in_the_same_order_whatever_batches_it_learned_it_in(tmp_path, monkeypatch):
    """Two brokers' replica managers, one slot each, the first open held: broker A learns three
    topics in one image, broker B in two (the newest first). Both open the backlog in the
    same order, the newest topic first by its creation time in the metadata, its partitions in
    order, not by when each broker heard of it (opened in arrival order, newest first, A and
    B differed, and a follower opened long before or after its leader)."""
    from dataplane.broker.replicas import NewestFirst
    from metadata_builders import add_topic, cluster

    gate = hold_open(monkeypatch, "a-0")
    whole = cluster(1)
    add_topic(whole, "a", [[1]], now_ms=1000)
    part = whole.copy()
    add_topic(whole, "m", [[1], [1]], now_ms=2000)
    add_topic(whole, "x", [[1], [1]], now_ms=3000)
    add_topic(part, "x", [[1], [1]], now_ms=3000)

    async def opens(images, name):
        gate.clear()
        manager = _manager(tmp_path / name)
        manager._open_slots = NewestFirst(1)
        order = []
        real_open = manager._open

        async def record(topic, info):
            order.append(f"{info.topic}-{info.partition}")
            return await real_open(topic, info)
        manager._open = record
        try:
            for image in images:
                await asyncio.wait_for(manager.on_metadata(image), 5)
                await asyncio.sleep(0.05)   # every new replica waits for the slot a-0 holds
            gate.set()
            await asyncio.wait_for(manager.settled(), 10)
        finally:
            gate.set()
            await manager.close()
        return order
    one_batch = asyncio.run(opens([whole], "a"))
    two_batches = asyncio.run(opens([part, whole], "b"))
    assert one_batch == two_batches == ["a-0", "x-0", "x-1", "m-0", "m-1"], (one_batch, two_batches)


def test_the_replica_manager_tells_of_each_replica_it_opened_once_it_serves(tmp_path):
    """on_opened (the broker wires it to RequestHandler.replica_opened: a session long-poll
    holding the partition as still opening answers it at once) is told of each replica once,
    after it is open and fed, so what it wakes finds the replica."""
    from dataplane.broker.broker import Broker
    from metadata_builders import add_topic, cluster
    image = cluster(1)
    add_topic(image, "t", [[1], [1]], min_insync_replicas=1)

    async def scenario():
        manager = _manager(tmp_path)
        told = []
        manager.on_opened = lambda tp: told.append((tp, manager.get(*tp) is not None))
        try:
            await asyncio.wait_for(manager.on_metadata(image), 5)
            await asyncio.wait_for(manager.settled(), 10)
            await asyncio.wait_for(manager.on_metadata(image), 5)   # nothing new opens
        finally:
            await manager.close()
        return told
    assert sorted(asyncio.run(scenario())) == [(("t", 0), True), (("t", 1), True)]
    # The broker wires it (a broker without it would poll its unready partitions once a second).
    import inspect
    assert "replicas.on_opened = self.handler.replica_opened" in inspect.getsource(Broker)


def _locate_only(manager, image):
    """A RequestHandler's partition lookup over `manager` (only _locate is used)."""
    from dataplane.broker.server import RequestHandler
    server = RequestHandler.__new__(RequestHandler)
    server.replicas = manager
    server.image = lambda: image
    return server


def test_timers_tick_only_what_is_due_and_skip_stale_entries(tmp_path):
    from common.topic_partition import TopicPartition
    manager = _manager(tmp_path)
    a, b, c = TopicPartition("a", 0), TopicPartition("b", 0), TopicPartition("c", 0)
    manager.schedule_tick(a, 100)
    manager.schedule_tick(b, 50)
    manager.schedule_tick(a, 200)   # moved later: its entry at 100 is stale
    manager.schedule_tick(c, 120)
    manager.schedule_tick(c, None)  # no timer any more
    assert manager._take_due(150) == [b]
    assert manager._take_due(199) == []
    assert manager._take_due(200) == [a]
    assert manager._take_due(10_000) == []


def test_a_metadata_change_walks_only_its_topic_and_a_fencing_walks_all(tmp_path, monkeypatch):
    """on_metadata skips a topic whose partitions and settings are the same objects as at its
    last walk (the image replaces, never edits, what a record touches): a leader change on one
    partition of `a` feeds `a`'s partitions alone, not `b`'s; a broker fenced or unfenced changes
    every partition's fenced replicas, so it walks them all; a partition gone from a topic's
    replicas here is stopped as before."""
    from common.metadata.records import FenceBroker, PartitionChange, UnfenceBroker
    from dataplane.broker import replicas as replicas_module
    from metadata_builders import add_broker, add_topic, apply, cluster

    image = cluster(1)
    add_broker(image, 2)
    add_topic(image, "a", [[1, 2]] * 3, min_insync_replicas=1)
    add_topic(image, "b", [[1, 2]] * 3, min_insync_replicas=1)
    looked: list[str] = []
    real_feed = replicas_module.ReplicaManager._feed

    def feed(self, driver, topic, info, image):
        looked.append(info.topic)
        return real_feed(self, driver, topic, info, image)
    monkeypatch.setattr(replicas_module.ReplicaManager, "_feed", feed)

    async def scenario():
        manager = _manager(tmp_path)
        try:
            await asyncio.wait_for(manager.on_metadata(image), 5)
            await asyncio.wait_for(manager.settled(), 10)
            looked.clear()
            second = apply(image.copy(), [PartitionChange(topic="a", partition=1, leader=2)])
            await asyncio.wait_for(manager.on_metadata(second), 5)
            one_topic = sorted(looked)
            looked.clear()
            third = apply(second.copy(), [FenceBroker(broker_id=2, at_ms=1)])
            await asyncio.wait_for(manager.on_metadata(third), 5)
            fenced = sorted(looked)
            looked.clear()
            await asyncio.wait_for(manager.on_metadata(third), 5)
            again = list(looked)
            moved = apply(third.copy(), [UnfenceBroker(broker_id=2, at_ms=2),
                                         PartitionChange(topic="b", partition=2, replicas=(2,), isr=(2,), leader=2)])
            await asyncio.wait_for(manager.on_metadata(moved), 5)
            await asyncio.wait_for(manager.settled(), 10)
            return one_topic, fenced, again, manager.get("b", 2), manager.get("b", 1)
        finally:
            await manager.close()

    one_topic, fenced, again, gone, kept = asyncio.run(scenario())
    assert one_topic == ["a"] * 3, one_topic
    assert fenced == ["a"] * 3 + ["b"] * 3, fenced
    assert again == [], again
    assert gone is None and kept is not None, "b-2 left this broker and stops; b-1 stays"
