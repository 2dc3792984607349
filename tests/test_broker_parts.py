"""The broker's pieces without processes: config checks, the clean-shutdown marker,
replica directories and topic ids, producer-id blocks, the metadata learner's
ordering and drift handling, and the fetch session's express path."""
from __future__ import annotations

import asyncio
import time

import pytest
from pydantic import ValidationError

from common.control_client import MetadataBatch
from common.errors import ErrorCode
from common.metadata.config import TopicConfig
from common.metadata.records import CreateTopic, PartitionRecord, RegisterBroker, dump_record
from common.requests import HeartbeatAnswer, ProducerIdsAnswer
from common.tasks import cancel_and_wait
from common.wire import messages as wire
from dataplane.broker.config import BrokerConfig
from dataplane.broker.fetcher import Fetcher
from dataplane.broker.lifecycle import take_clean_shutdown_marker, write_clean_shutdown_marker
from dataplane.broker.metadata import MetadataLearner
from dataplane.broker.metadata_lag import MetadataLag
from dataplane.broker.producer_ids import ProducerIds
from dataplane.broker.replicas import TOPIC_ID_FILE, _prepare_dir
from dataplane.replica.events import FetchRequest


def test_config_rejects_bad_urls_and_names_the_field(tmp_path):
    with pytest.raises(ValidationError, match="controller URL 'c1:8080' must start with http"):
        BrokerConfig(broker_id=1, data_dir=str(tmp_path), controller_urls=("c1:8080",))
    with pytest.raises(ValidationError, match="heartbeat_interval_ms"):
        BrokerConfig(broker_id=1, data_dir=str(tmp_path), controller_urls=("http://c",), heartbeat_interval_ms=1)
    c = BrokerConfig(broker_id=1, data_dir=str(tmp_path), controller_urls=("http://c:1/",))
    assert c.controller_urls == ("http://c:1",) and c.client_host == "127.0.0.1"


def test_clean_shutdown_marker_is_taken_once(tmp_path):
    assert take_clean_shutdown_marker(str(tmp_path)) is False
    write_clean_shutdown_marker(str(tmp_path))
    assert take_clean_shutdown_marker(str(tmp_path)) is True
    assert take_clean_shutdown_marker(str(tmp_path)) is False  # a crash from now on shows


def test_replica_dir_of_another_topic_id_is_wiped(tmp_path):
    d = tmp_path / "t-0"
    assert _prepare_dir(str(d), "id-1") is False
    (d / "00000000000000000000.log").write_bytes(b"old data")
    assert _prepare_dir(str(d), "id-1") is True
    assert (d / "00000000000000000000.log").exists()
    assert _prepare_dir(str(d), "id-2") is False  # the topic was deleted and created again
    assert not (d / "00000000000000000000.log").exists()
    assert (d / TOPIC_ID_FILE).read_text().strip() == "id-2"


class FakeControl:
    def __init__(self, batches=()) -> None:
        self.blocks = [(100, 2), (500, 2)]
        self.batches = list(batches)
        self.asked_after: list[int] = []

    async def allocate_producer_ids(self, request):
        first_id, size = self.blocks.pop(0)
        return ProducerIdsAnswer(broker_id=request.broker_id, first_id=first_id, size=size)

    async def fetch_metadata(self, *, after_offset: int, wait_ms_max: int) -> MetadataBatch:
        self.asked_after.append(after_offset)
        if not self.batches:
            await asyncio.sleep(3600)
        return self.batches.pop(0)


def test_producer_ids_come_from_blocks_and_a_used_up_block_is_replaced():
    async def scenario():
        ids = ProducerIds(FakeControl(), broker_id=1, block_size=2)
        fresh = [await ids.init(-1, -1) for _ in range(3)]
        assert fresh == [(100, 0), (101, 0), (500, 0)]
        assert await ids.init(101, 4) == (101, 5)
        assert await ids.init(101, 32_767) == (501, 0)  # the epoch would overflow: a new id
    asyncio.run(scenario())


def _records():
    topic = TopicConfig(partitions=1, replication_factor=1)
    return [RegisterBroker(broker_id=1, incarnation_id="i1", host="h", port=1, at_ms=1),
            CreateTopic(name="t", topic_id="tid", config=topic),
            PartitionRecord(topic="t", partition=0, replicas=[1], isr=[1], leader=None)]


def test_learner_applies_in_order_saves_and_restarts_from_its_image(tmp_path):
    recs = _records()
    batches = [MetadataBatch(offset=1, records=((0, dump_record(recs[0])), (1, dump_record(recs[1])))),
               MetadataBatch(offset=2, records=((1, dump_record(recs[1])), (2, dump_record(recs[2]))))]
    seen: list[int] = []

    async def scenario(control):
        learner = MetadataLearner(control, data_dir=str(tmp_path), save_interval_ms=100)
        learner.add_listener(lambda image: seen.append(image.offset))
        task = asyncio.create_task(learner.run())
        for _ in range(300):
            # Saves come at most every save_interval_ms, the newest image each time: wait for
            # the listener and the file.
            if (learner.offset == 2 and seen[-1:] == [2]
                    and MetadataLearner(FakeControl(), data_dir=str(tmp_path)).offset == 2):
                break
            await asyncio.sleep(0.01)
        task.cancel()
        return learner

    learner = asyncio.run(scenario(FakeControl(batches)))
    assert learner.offset == 2 and seen == [1, 2]  # the repeated record 1 was skipped
    assert learner.image.partition("t", 0).replicas == (1,)
    again = MetadataLearner(FakeControl(), data_dir=str(tmp_path))
    assert again.offset == 2 and again.image == learner.image


def test_a_wait_for_a_metadata_offset_ends_when_the_learner_applies_it_or_at_its_timeout(tmp_path):
    """Claim: wait_applied (what a Kafka admin write's answer awaits) returns True as soon as
    the image reaches the offset, False once its timeout passes without it."""
    recs = _records()
    batches = [MetadataBatch(offset=1, records=((0, dump_record(recs[0])), (1, dump_record(recs[1])))),
               MetadataBatch(offset=2, records=((2, dump_record(recs[2])),))]

    async def scenario():
        learner = MetadataLearner(FakeControl(), data_dir=str(tmp_path))
        reached = asyncio.create_task(learner.wait_applied(2, 5000))
        never = asyncio.create_task(learner.wait_applied(3, 300))
        await asyncio.sleep(0.05)
        assert not reached.done() and learner._offset_waiters
        learner.control = FakeControl(batches)
        task = asyncio.create_task(learner.run())
        started = time.monotonic()
        assert await reached is True
        assert time.monotonic() - started < 1.0 and learner.offset == 2
        assert await never is False
        assert await learner.wait_applied(1, 0) is True   # already there: no wait
        assert learner._offset_waiters == []
        task.cancel()
    asyncio.run(scenario())


def test_an_empty_or_repeated_metadata_batch_keeps_the_same_image_object(tmp_path):
    """Claim: the image object changes only when a record applies: an empty long-poll answer
    (every few seconds on an idle cluster) made a whole copy, and told every cache keyed on the
    image (the link check's expected links) to walk every partition again."""
    recs = _records()
    learner = MetadataLearner(FakeControl(), data_dir=str(tmp_path))
    assert learner._apply(MetadataBatch(offset=0, records=((0, dump_record(recs[0])),)))
    image = learner.image
    assert not learner._apply(MetadataBatch(offset=0, records=()))
    assert not learner._apply(MetadataBatch(offset=0, records=((0, dump_record(recs[0])),)))
    assert learner.image is image


def test_learner_saves_the_newest_image_at_most_once_per_interval(tmp_path, monkeypatch):
    """Claim: each save writes the whole image, so a burst of metadata batches (the ISR changes
    of thousands of replicas opening) is saved at most once per save_interval_ms, and the file
    ends at the newest image."""
    recs = _records()
    batches = [MetadataBatch(offset=i, records=((i, dump_record(recs[i])),)) for i in range(3)]
    saved: list[int] = []
    real_save = MetadataLearner._save

    def save(self):
        saved.append(self.image.offset)
        real_save(self)
    monkeypatch.setattr(MetadataLearner, "_save", save)

    class Paced(FakeControl):
        async def fetch_metadata(self, *, after_offset: int, wait_ms_max: int) -> MetadataBatch:
            await asyncio.sleep(0.05)   # a save finishes between two batches
            return await super().fetch_metadata(after_offset=after_offset, wait_ms_max=wait_ms_max)

    async def scenario():
        learner = MetadataLearner(Paced(batches), data_dir=str(tmp_path), save_interval_ms=400)
        task = asyncio.create_task(learner.run())
        for _ in range(200):
            if saved[-1:] == [2]:
                break
            await asyncio.sleep(0.01)
        task.cancel()

    asyncio.run(scenario())
    assert saved[0] == 0 and saved[-1] == 2 and len(saved) == 2, saved
    assert MetadataLearner(FakeControl(), data_dir=str(tmp_path)).offset == 2


def test_learner_keeps_learning_while_a_listener_is_slow_and_hands_it_the_newest_image(tmp_path):
    """Claim (the long fault run's fenced brokers): a listener still busy with an earlier image
    (the replica manager opening partitions after a restart) does not hold up fetching and
    applying metadata, so heartbeats report the newer offset; the listener then gets the newest
    image, not every one in between."""
    recs = _records()
    control = FakeControl([MetadataBatch(offset=0, records=((0, dump_record(recs[0])),)),
                           MetadataBatch(offset=1, records=((1, dump_record(recs[1])),)),
                           MetadataBatch(offset=2, records=((2, dump_record(recs[2])),))])
    seen: list[int] = []

    async def scenario():
        release = asyncio.Event()

        async def slow_listener(image):
            seen.append(image.offset)
            if len(seen) == 1:
                await release.wait()  # opening partitions
        learner = MetadataLearner(control, data_dir=str(tmp_path))
        learner.add_listener(slow_listener)
        task = asyncio.create_task(learner.run())
        for _ in range(200):
            if learner.offset == 2:
                break
            await asyncio.sleep(0.01)
        assert learner.offset == 2 and seen == [0], (learner.offset, seen)
        release.set()
        for _ in range(200):
            if seen[-1:] == [2]:
                break
            await asyncio.sleep(0.01)
        await cancel_and_wait(task)
    asyncio.run(scenario())
    assert seen == [0, 2]


def test_learner_tells_its_listeners_only_once_caught_up_with_the_committed_offset(tmp_path):
    """An answer holds at most a window of records: a first answer that leaves the image short
    of the offset it reflects is not caught up yet. The replicas open only on the whole image,
    never on a part of it that lacks a later record (one that says a topic was once under
    durability=write, say)."""
    recs = _records()
    control = FakeControl([MetadataBatch(offset=2, records=((0, dump_record(recs[0])), (1, dump_record(recs[1])))),
                           MetadataBatch(offset=2, records=((2, dump_record(recs[2])),))])
    seen: list[int] = []

    async def scenario():
        learner = MetadataLearner(control, data_dir=str(tmp_path))
        learner.add_listener(lambda image: seen.append(image.offset))
        task = asyncio.create_task(learner.run())
        for _ in range(300):
            if seen:
                break
            await asyncio.sleep(0.01)
        await cancel_and_wait(task)
        return control.asked_after[:2]
    assert asyncio.run(scenario()) == [-1, 1]   # the rest asked for at once
    assert seen == [2]


def test_learner_run_fails_when_a_listener_fails_unexpectedly(tmp_path):
    """A listener bug is not swallowed by its task: run() raises it (the broker stops, loudly)."""
    recs = _records()
    control = FakeControl([MetadataBatch(offset=0, records=((0, dump_record(recs[0])),))])

    def broken(image):
        raise KeyError("bug")

    async def scenario():
        learner = MetadataLearner(control, data_dir=str(tmp_path))
        learner.add_listener(broken)
        await asyncio.wait_for(learner.run(), 5)
    with pytest.raises(KeyError):
        asyncio.run(scenario())


def test_learner_that_drifted_starts_over_from_scratch(tmp_path):
    recs = _records()
    control = FakeControl([MetadataBatch(offset=0, records=((0, dump_record(recs[0])),)),
                           MetadataBatch(offset=5, records=((5, dump_record(recs[1])),))])

    async def scenario():
        learner = MetadataLearner(control, data_dir=str(tmp_path))
        task = asyncio.create_task(learner.run())
        for _ in range(100):
            if len(control.asked_after) >= 3:
                break
            await asyncio.sleep(0.01)
        task.cancel()
        return learner
    learner = asyncio.run(scenario())
    assert control.asked_after[:3] == [-1, 0, -1]  # record 5 after 0 does not apply: refetch everything
    assert learner.offset == -1


def test_fetch_session_sends_fresh_news_express_and_holds_repeats():
    """While the long-poll waits, a request for the same partition that says something new
    (another position) goes out at once with max_wait 0; a repeat of it waits for the
    long-poll to end (so an idle partition cannot spin on the express connection)."""
    delivered = []
    sent: list[tuple[str, int, int]] = []   # (connection, max_wait_ms, fetch_offset)

    class FakeClient:
        def __init__(self, name, gate) -> None:
            self.name, self.gate, self.closed = name, gate, False

        async def request(self, req):
            if not req.topics:
                await asyncio.Event().wait()   # a session fetch with nothing new: it waits
            p = req.topics[0].partitions[0]
            sent.append((self.name, req.max_wait_ms, p.fetch_offset))
            if req.max_wait_ms:
                await self.gate.wait()
            session_id = 1 if req.max_wait_ms else 0   # the long-poll's session; express has none
            return wire.FetchResponse(session_id=session_id, topics=(wire.FetchTopicResponse(topic="t", partitions=(
                wire.FetchPartitionResponse(partition=0, high_watermark=p.fetch_offset,
                                            current_leader=wire.LeaderIdAndEpoch(leader_id=2, leader_epoch=1)),)),))

        async def close(self):
            self.closed = True

    async def scenario():
        gate = asyncio.Event()  # holds the long-poll until the test lets it answer
        fetcher = Fetcher(broker_id=1, address_of=lambda b: ("127.0.0.1", 1),
                          deliver=lambda tp, ev: delivered.append((tp, ev.fetch_offset, ev.error)))

        def request(offset):
            return FetchRequest(replica_id=1, fetch_offset=offset, current_leader_epoch=1, partition=("t", 0))
        fetcher.submit(2, ("t", 0), request(10))
        session = fetcher.sessions[2]
        clients = {"main": FakeClient("main", gate), "express": FakeClient("express", gate)}

        async def client(which):
            return clients[which]
        session._client = client
        await asyncio.sleep(0.05)
        fetcher.submit(2, ("t", 0), request(11))
        await asyncio.sleep(0.05)
        fetcher.submit(2, ("t", 0), request(11))
        await asyncio.sleep(0.05)
        assert sent == [("main", 500, 10), ("express", 0, 11)]
        gate.set()
        await asyncio.sleep(0.05)
        assert sent[2] == ("main", 500, 11)
        await fetcher.close()
    asyncio.run(scenario())
    assert [(tp, off, err) for tp, off, err in delivered[:3]] == [
        (("t", 0), 11, ErrorCode.NONE), (("t", 0), 10, ErrorCode.NONE), (("t", 0), 11, ErrorCode.NONE)]


def test_heartbeat_refused_as_stale_registers_again():
    from common.errors import BiplaneError
    from common.usage import BrokerUsage
    from dataplane.broker.lifecycle import Lifecycle

    class Control:
        leader_url = "http://c1"
        urls = ["http://c1"]   # the leader alone: no follower to heartbeat

        def __init__(self) -> None:
            self.calls: list[str] = []

        async def register(self, request):
            self.calls.append(f"register:{request.clean_shutdown}")

        async def heartbeat(self, request):
            self.calls.append("heartbeat")
            if self.calls.count("heartbeat") == 2:
                raise BiplaneError("incarnation is stale", code=ErrorCode.STALE_BROKER_EPOCH)
            return HeartbeatAnswer(broker_id=1, fenced=False, metadata_offset=3, session_timeout_ms=1500)

    async def scenario():
        control = Control()
        life = Lifecycle(control, broker_id=1, host="h", port=1, rack=None, priority=0, clean_shutdown=False,
                         metadata_offset=lambda: 3, usage=lambda: BrokerUsage(
                             broker_id=1, at_ms=0, disk_total_bytes=1, disk_used_bytes=0, disk_free_bytes=1),
                         heartbeat_interval_ms=10)
        task = asyncio.create_task(life.run())
        while control.calls.count("heartbeat") < 3:
            await asyncio.sleep(0.01)
        task.cancel()
        return control.calls, life.fenced
    calls, fenced = asyncio.run(scenario())
    assert calls[:4] == ["register:False", "heartbeat", "heartbeat", "register:False"]
    assert fenced is False


def test_produce_to_a_leader_not_yet_serving_its_epoch_waits_in_order(tmp_path):
    """A new leader refuses produce until its epoch-start batch is flushed; the driver parks
    requests meanwhile and steps them in arrival order once it serves (none is refused)."""
    from common.batch import build_batch
    from dataplane.broker.partition import PartitionDriver
    from dataplane.log.interface import LogConfig
    from dataplane.replica.events import NewMetadata
    from dataplane.replica.state import PartitionState, ReplicationConfig

    class Hooks:
        def send_fetch(self, *a): pass
        def propose_isr(self, *a): pass
        def report_election(self, *a): pass
        def refresh_metadata(self, *a): pass
        def partition_offline(self, *a): pass

    async def scenario():
        driver = PartitionDriver(broker_id=1, tp=("t", 0), directory=str(tmp_path / "t-0"), log_config=LogConfig(),
                                 hooks=Hooks(), unclean_start=False)
        driver.step(NewMetadata(partition=PartitionState(replicas=(1,), isr=(1,), leader=1, leader_epoch=1,
                                                         partition_epoch=1), config=ReplicationConfig()))
        assert driver.is_leader and not driver.replica.epoch_durable
        futures = [driver.submit_produce(bytearray(build_batch([b"v%d" % i], timestamp_ms=1)), acks=-1,
                                         timeout_ms=10_000) for i in range(3)]
        releases = await asyncio.wait_for(asyncio.gather(*futures), 10)
        await driver.close()
        return releases
    releases = asyncio.run(scenario())
    assert [r.error for r in releases] == [ErrorCode.NONE] * 3
    first = releases[0].base_offset
    assert [r.base_offset for r in releases] == [first, first + 1, first + 2]


class _Hooks:
    def send_fetch(self, *a): pass
    def send_append_entries(self, *a): pass
    def propose_isr(self, *a): pass
    def report_election(self, *a): pass
    def refresh_metadata(self, *a): pass
    def partition_offline(self, *a): pass


def _leader_driver(tmp_path, name, replicas, budget):
    from dataplane.broker.partition import PartitionDriver
    from dataplane.log.interface import LogConfig
    from dataplane.replica.events import NewMetadata
    from dataplane.replica.state import PartitionState, ReplicationConfig
    driver = PartitionDriver(broker_id=1, tp=(name, 0), directory=str(tmp_path / f"{name}-0"),
                             log_config=LogConfig(), hooks=_Hooks(), unclean_start=False, budget=budget)
    driver.step(NewMetadata(partition=PartitionState(replicas=replicas, isr=replicas, leader=1, leader_epoch=1,
                                                     partition_epoch=1), config=ReplicationConfig()))
    return driver


async def _until_serving(driver):
    from dataplane.broker.partition import now_ms
    for _ in range(500):
        if driver.replica.epoch_durable:
            return
        await asyncio.sleep(0.01)
        driver.tick(now_ms())
    raise AssertionError("leader never served its epoch")


def test_produce_beyond_the_broker_wide_budget_waits_in_order_until_a_follower_catches_up(tmp_path):
    """Claim: with the broker-wide budget full (partition a's follower has not fetched its acks=1
    bytes), produce requests to another partition b — and to a — are parked, not refused, and not
    stepped; once a's follower fetches (a's HW passes them) they are stepped in arrival order."""
    from common.batch import build_batch
    from dataplane.broker.budget import ProduceBudget
    from dataplane.broker.partition import now_ms
    from dataplane.replica.events import FetchRequest

    async def scenario():
        budget = ProduceBudget(unreplicated_bytes_max=1)
        a = _leader_driver(tmp_path, "a", (1, 2), budget)
        b = _leader_driver(tmp_path, "b", (1,), budget)
        await _until_serving(a)
        await _until_serving(b)
        batch = lambda v: bytearray(build_batch([v], timestamp_ms=1))  # noqa: E731
        first = await asyncio.wait_for(a.submit_produce(batch(b"a0"), acks=1, timeout_ms=10_000), 5)
        assert first.error is ErrorCode.NONE
        assert budget.total_bytes == len(batch(b"a0")), "a's unreplicated acks=1 bytes count in the budget"
        b_futures = [b.submit_produce(batch(b"b%d" % i), acks=-1, timeout_ms=10_000)
                     for i in range(3)]
        a_future = a.submit_produce(batch(b"a1"), acks=1, timeout_ms=10_000)
        await asyncio.sleep(0.1)
        assert not any(f.done() for f in b_futures + [a_future]), "requests beyond the budget wait"
        assert b.log.log_end_offset == 1 and a.log.log_end_offset == 2  # epoch starts (+ a0): nothing stepped
        waiting = asyncio.gather(*b_futures, a_future)
        for _ in range(1000):  # a's follower now fetches (and reports itself flushed) what a has
            if waiting.done():
                break
            end = a.log.log_end_offset
            a.step(FetchRequest(replica_id=2, fetch_offset=end, last_fetched_epoch=1, flushed_offset=end,
                                current_leader_epoch=1))
            await asyncio.sleep(0.01)
            for d in (a, b):
                d.tick(now_ms())
        assert waiting.done(), "parked requests were never released"
        releases = waiting.result()
        for d in (a, b):
            await d.close()
        return releases, budget
    releases, budget = asyncio.run(scenario())
    assert [r.error for r in releases] == [ErrorCode.NONE] * 4
    first = releases[0].base_offset
    assert [r.base_offset for r in releases[:3]] == [first, first + 1, first + 2]
    assert budget.total_bytes == 0 and budget.peak_total_bytes > 0


def test_produce_parked_for_the_budget_times_out_with_request_timed_out_and_later_ones_go_on(tmp_path):
    """Claim: a request parked for broker-wide room is answered REQUEST_TIMED_OUT at its timeout
    (nothing written), and once room frees the next request is written normally."""
    from common.batch import build_batch
    from dataplane.broker.budget import ProduceBudget
    from dataplane.broker.partition import now_ms

    async def scenario():
        budget = ProduceBudget(unreplicated_bytes_max=1000)
        b = _leader_driver(tmp_path, "b", (1,), budget)
        await _until_serving(b)
        budget.update(("elsewhere", 0), 1000)  # another partition holds the whole budget
        end = b.log.log_end_offset
        timed = b.submit_produce(bytearray(build_batch([b"x"], timestamp_ms=1)), acks=-1, timeout_ms=50)
        while not timed.done():
            await asyncio.sleep(0.01)
            b.tick(now_ms())  # the broker ticks every partition; ticks see the timeout
        assert b.log.log_end_offset == end, "a timed-out request wrote nothing"
        budget.update(("elsewhere", 0), 0)
        later = await asyncio.wait_for(b.submit_produce(bytearray(build_batch([b"y"], timestamp_ms=1)), acks=-1,
                                                        timeout_ms=10_000), 5)
        await b.close()
        return timed.result(), later, end
    timed, later, end = asyncio.run(scenario())
    assert timed.error is ErrorCode.REQUEST_TIMED_OUT
    assert later.error is ErrorCode.NONE and later.base_offset == end


def test_a_follower_long_poll_ends_for_records_not_for_a_new_high_watermark(tmp_path):
    """Claim: a follower's long-poll at the log end is not answered when only the HW moves (the
    other follower's fetch commits a record); it is answered when records arrive, and that answer
    carries the new HW. A long-poll ended for HW news alone would cost every acks=all request a
    second fetch round per follower."""
    import types
    from common.batch import build_batch
    from dataplane.broker.server import RequestHandler

    async def scenario():
        driver = _leader_driver(tmp_path, "hw", (1, 2, 3), None)
        await _until_serving(driver)
        info = types.SimpleNamespace(leader=1, leader_epoch=1)
        image = types.SimpleNamespace(get_partition=lambda topic, partition: info)
        replicas = types.SimpleNamespace(get=lambda topic, partition: driver)
        handler = RequestHandler(broker_id=1, image=lambda: image, replicas=replicas, producer_ids=None,
                                 refresh_metadata=lambda: None, fetch_wait_ms_max=5000)

        def fetch(replica_id, offset, wait_ms=5000):
            return asyncio.ensure_future(handler.fetch(wire.FetchRequest(
                replica_id=replica_id, max_wait_ms=wait_ms, min_bytes=1, max_bytes=1 << 20,
                topics=(wire.FetchTopic(topic="hw", partitions=(wire.FetchPartition(
                    partition=0, current_leader_epoch=1, fetch_offset=offset, last_fetched_epoch=1,
                    partition_max_bytes=1 << 20, flushed_offset=offset),)),))))

        def part(response):
            return response.topics[0].partitions[0]

        end = driver.log.log_end_offset
        for r in (2, 3):  # both followers at the log end: the HW is there too
            await asyncio.wait_for(fetch(r, end, wait_ms=0), 5)
        produced = driver.submit_produce(bytearray(build_batch([b"v"], timestamp_ms=1)), acks=-1,
                                         timeout_ms=10_000)
        got2 = part(await asyncio.wait_for(fetch(2, end), 5))
        got3 = part(await asyncio.wait_for(fetch(3, end), 5))
        assert got2.records and got3.records
        poll2 = fetch(2, end + 1)  # caught up and flushed: waits, as the HW needs follower 3
        await asyncio.sleep(0.05)
        poll3 = fetch(3, end + 1)  # commits the record: the HW moves
        release = await asyncio.wait_for(produced, 5)
        assert release.error is ErrorCode.NONE and driver.replica.high_watermark == end + 1
        await asyncio.sleep(0.2)
        assert not poll2.done() and not poll3.done(), "a new HW alone ended a follower's long-poll"
        driver.submit_produce(bytearray(build_batch([b"w"], timestamp_ms=1)), acks=1, timeout_ms=10_000)
        answers = [part(a) for a in await asyncio.wait_for(asyncio.gather(poll2, poll3), 5)]
        await driver.close()
        return answers, end

    answers, end = asyncio.run(scenario())
    assert all(a.records for a in answers)
    assert [a.high_watermark for a in answers] == [end + 1, end + 1]


def test_epoch_start_batch_and_producer_expiry_use_wall_clock_time(tmp_path):
    """The core's clock in a broker is wall-clock time: a new leader's epoch-start batch is
    stamped with it (a monotonic stamp looked decades old to retention, which then deleted
    that segment, and made time lookups land there), and a producer's idle time is counted on
    it, from its last batch written (not from that batch's own, older, timestamp)."""
    import time as _time

    from common.batch import build_batch, iter_batches
    from dataplane.replica.events import Tick
    before = int(_time.time() * 1000)

    async def scenario():
        driver = _leader_driver(tmp_path, "w", (1,), None)
        await _until_serving(driver)
        header = next(h for _, h in iter_batches(driver.log.read(0, max_bytes=1 << 20).records))
        state = driver.replica.producer_state
        batch = build_batch([b"v"], timestamp_ms=before - state.producer_idle_ms_max - 1000,
                            producer_id=7, producer_epoch=0, base_sequence=0)
        release = await asyncio.wait_for(driver.submit_produce(bytearray(batch), acks=1, timeout_ms=5000), 10)
        had = 7 in state.producers
        driver.step(Tick(now_ms=driver.replica.now_ms + 60_000))
        kept = 7 in state.producers   # written a minute ago: not idle, whatever its timestamp says
        driver.step(Tick(now_ms=driver.replica.now_ms + state.producer_idle_ms_max + 1000))
        await driver.close()
        return header, release, had, kept, 7 in state.producers
    header, release, had, kept, kept_later = asyncio.run(scenario())
    assert header.is_control and before <= header.max_timestamp <= int(_time.time() * 1000)
    assert release.error is ErrorCode.NONE and had and kept and not kept_later


def test_follower_driver_told_the_leaders_log_starts_past_its_end_starts_its_log_over_there(tmp_path):
    """Claim: a follower whose log ends below the leader's log start (the answer to its fetch is
    a divergence at epoch -1 ending at that start) empties its on-disk log, starts it there,
    fetches from there, and the log keeps that start when reopened."""
    from common.batch import build_batch
    from dataplane.log.interface import LogConfig
    from dataplane.log.log import PartitionLog
    from dataplane.replica.events import FetchResponse
    from driver_support import FetchHooks, follower_driver

    hooks = FetchHooks()
    fetches = hooks.fetches
    directory = str(tmp_path / "t-0")
    seed = PartitionLog(directory, config=LogConfig())
    for i in range(3):
        seed.append_as_leader(build_batch([b"old%d" % i], timestamp_ms=1), leader_epoch=0)
    seed.close()

    async def scenario():
        driver = follower_driver(directory, hooks, isr=(1,))
        first = fetches[-1]
        assert (first.fetch_offset, first.last_fetched_epoch) == (3, 0)
        driver.step(FetchResponse(leader_id=1, leader_epoch=1, fetch_offset=3, last_fetched_epoch=0,
                                  high_watermark=120, log_end_offset=130, diverging_epoch=-1,
                                  diverging_end_offset=100, partition=("t", 0)))
        offsets = (driver.log.log_start_offset, driver.log.log_end_offset, driver.log.flushed_offset)
        await driver.close()
        return offsets
    assert asyncio.run(scenario()) == (100, 100, 100)
    again = fetches[-1]
    assert (again.fetch_offset, again.last_fetched_epoch) == (100, -1)
    reopened = PartitionLog(directory, config=LogConfig())
    try:
        assert (reopened.log_start_offset, reopened.log_end_offset, reopened.epoch_entries()) == (100, 100, [])
    finally:
        reopened.close()


def test_learner_reports_a_metadata_lag_once_while_a_listener_holds_it_up_and_once_when_it_ends(tmp_path, caplog):
    """The controller commits offsets 0..2 while the listener is still acting on offset 0's image
    (opening partitions): the lag (applied by the listener vs committed) passes its bound, one
    WARNING says so and the gauge source shows it; once the listener has the newest image, one
    INFO says it caught up and the lag is 0."""
    recs = _records()
    control = FakeControl([MetadataBatch(offset=i, records=((i, dump_record(recs[i])),)) for i in range(3)])
    lagged: list[int] = []

    async def scenario():
        release = asyncio.Event()

        async def slow_listener(image):
            if image.offset == 0:
                await release.wait()
        learner = MetadataLearner(control, data_dir=str(tmp_path))
        learner.lag.records_max, learner.lag.duration_ms_max = 1, 0
        learner.add_listener(slow_listener)
        task = asyncio.create_task(learner.run())
        for _ in range(200):
            if learner.lag.lagging:
                break
            await asyncio.sleep(0.01)
        lagged.append(learner.lag.records())
        release.set()
        for _ in range(200):
            if not learner.lag.lagging:
                break
            await asyncio.sleep(0.01)
        lagged.append(learner.lag.records())
        await cancel_and_wait(task)
    with caplog.at_level("INFO", logger="biplane.broker.metadata"):
        asyncio.run(scenario())
    assert lagged[0] > 1 and lagged[1] == 0, lagged  # over the bound while held up; none once acted on
    events = [(r.levelname, getattr(r, "event", None)) for r in caplog.records
              if getattr(r, "event", "").startswith("metadata.")]
    assert [e for e in events if e[1] in ("metadata.lagging", "metadata.caught_up")] == [
        ("WARNING", "metadata.lagging"), ("INFO", "metadata.caught_up")]


def test_a_metadata_fetch_stuck_behind_the_controller_is_reported_from_heartbeat_answers(tmp_path, caplog):
    """The learner's fetch hangs (a long-poll on a stopped controller, say) while heartbeat
    answers say the controller committed more: the lag rule hears of it from them
    (`note_committed`), and with the applied offset unmoved past the stuck bound one WARNING
    says the broker lags, though no fetch ever returned to show it."""
    recs = _records()
    control = FakeControl([MetadataBatch(offset=0, records=((0, dump_record(recs[0])),))])

    async def scenario():
        learner = MetadataLearner(control, data_dir=str(tmp_path),
                                  lag=MetadataLag(records_max=100, duration_ms_max=60_000, stuck_ms_max=100))
        task = asyncio.create_task(learner.run())
        for _ in range(100):
            if learner.offset == 0 and learner.lag.applied == 0:
                break
            await asyncio.sleep(0.01)
        for _ in range(50):   # as the broker's heartbeat support does, every usage interval
            learner.note_committed(3)
            if learner.lag.lagging:
                break
            await asyncio.sleep(0.01)
        await cancel_and_wait(task)
        return learner.lag.lagging, learner.lag.records()
    with caplog.at_level("WARNING", logger="biplane.broker.metadata"):
        lagging, records = asyncio.run(scenario())
    assert lagging and records == 3
    assert [getattr(r, "event", None) for r in caplog.records] == ["metadata.lagging"]


def test_a_wall_clock_stepped_forward_and_set_back_does_not_stop_a_push_leaders_heartbeats(tmp_path, monkeypatch):
    """Claim: the core's waits run on a clock that never follows the wall clock. A broker whose
    wall clock was stepped forward an hour and set right again kept its cores at the stepped
    reading (a clock stepped back was held), so a push leader sent its followers nothing for
    that hour: no heartbeat, no resend of a lost window, and they never rejoined its ISR. The
    epoch-start batch still carries wall-clock time."""
    import time as real_time

    from common.batch import iter_batches
    from dataplane.broker import partition
    from dataplane.broker.partition import PartitionDriver
    from dataplane.log.interface import LogConfig
    from dataplane.replica.events import AppendEntriesReply, NewMetadata
    from dataplane.replica.state import PartitionState, ReplicationConfig
    from stepped_clock import SteppedClock

    clock = SteppedClock()
    monkeypatch.setattr(partition, "time", clock)
    sent: list[tuple[int, float]] = []

    replies: list = []

    class Hooks(_Hooks):
        def send_append_entries(self, follower_id, tp, message):
            sent.append((follower_id, real_time.monotonic()))
            # The follower holds everything it is sent: it answers with the end it was sent.
            end = message.prev_offset + sum(h.record_count for _, h in iter_batches(message.records))
            replies.append(AppendEntriesReply(
                replica_id=follower_id, leader_epoch=message.leader_epoch, error=ErrorCode.NONE,
                log_end_offset=end, flushed_offset=end, match_offset=end, last_epoch=message.leader_epoch,
                partition=tp))

    async def scenario():
        driver = PartitionDriver(broker_id=1, tp=("push", 0), directory=str(tmp_path / "push-0"),
                                 log_config=LogConfig(), hooks=Hooks(), unclean_start=False, push_heartbeat_ms=50)
        driver.step(NewMetadata(partition=PartitionState(replicas=(1, 2), isr=(1, 2), leader=1, leader_epoch=1,
                                                         partition_epoch=1),
                                # a quiet follower hears every quarter lag time: 50 ms here
                                config=ReplicationConfig(replication_mode="push", replica_lag_time_max_ms=200)))
        await _until_serving(driver)

        async def ticking(seconds: float) -> None:
            end = real_time.monotonic() + seconds
            while real_time.monotonic() < end:
                while replies:
                    driver.step(replies.pop(0))
                driver.tick(partition.now_ms())
                await asyncio.sleep(0.01)

        clock.step_s = 3600.0
        await ticking(0.2)
        clock.step_s = 0.0   # set right again
        set_right = real_time.monotonic()
        await ticking(0.6)
        marker = next(h for _, h in iter_batches(driver.log.read(0, max_bytes=1 << 20).records))
        await driver.close()
        return set_right, marker

    before = real_time.time_ns() // 1_000_000
    set_right, marker = asyncio.run(scenario())
    after = [t for f, t in sent if f == 2 and t > set_right]
    # A heartbeat every 50 ms: about 12 in 0.6 s (none at all before the fix).
    assert len(after) >= 5, f"{len(after)} append-entries to the follower in 0.6 s after the clock was set right"
    assert marker.is_control and before <= marker.max_timestamp <= real_time.time_ns() // 1_000_000


def test_the_controllers_answer_to_an_isr_shrink_releases_acks_all_before_the_metadata_comes(tmp_path):
    """Claim: a leader whose follower stopped proposes it out; the controller's answer accepting
    the shrink settles it in the core at once (ReplicaManager._alter_isr), so the acks=all
    produce that waited on the follower completes while the metadata long-poll has brought
    nothing (in the fault harness it hung for seconds on a controller leader cut off)."""
    import os
    from common.api_models import PartitionView
    from common.batch import build_batch
    from common.requests import AlterIsrAnswer
    from dataplane.broker.replicas import ReplicaManager
    from metadata_builders import add_topic, cluster

    asked: list = []

    class Control(FakeControl):
        async def alter_isr(self, request):
            asked.append(request)
            return AlterIsrAnswer(metadata_offset=9, partition=PartitionView(
                topic="t", partition=0, replicas=[1, 2], isr=list(request.new_isr), leader=1,
                leader_epoch=request.leader_epoch, partition_epoch=request.partition_epoch + 1))

    image = cluster(2)
    add_topic(image, "t", [[1, 2]], replica_lag_time_max_ms=200, min_insync_replicas=1)

    async def scenario():
        config = BrokerConfig(broker_id=1, data_dir=str(tmp_path / "data"), controller_urls=("http://c:1",))
        os.makedirs(config.data_dir, exist_ok=True)
        manager = ReplicaManager(config=config, control=Control(), clean_start=True, send_fetch=lambda *a: None,
                                 send_append_entries=lambda *a: None, refresh_metadata=lambda: None)
        await manager.on_metadata(image)
        await manager.settled()
        driver = manager.get("t", 0)
        await _until_serving(driver)
        ticks = asyncio.get_running_loop().create_task(manager.run_ticks())   # the core's timers
        release = await asyncio.wait_for(
            driver.submit_produce(bytearray(build_batch([b"v"], timestamp_ms=1)), acks=-1, timeout_ms=5000), 5)
        await cancel_and_wait(ticks)
        await manager.close()
        return driver, release

    driver, release = asyncio.run(scenario())
    assert [r.new_isr for r in asked] == [(1,)]
    assert release.error is ErrorCode.NONE
    assert driver.replica.state.isr == (1,)


def test_a_metadata_long_poll_held_by_a_cut_off_controller_moves_to_the_leader_the_heartbeats_found(tmp_path):
    """Claim: the learner's long-poll to a controller that stopped answering (cut off with a
    follower broker, in the fault harness) moves to the controller the heartbeats found leading
    once the learner lags what that leader committed, instead of waiting out its bound (the wait
    plus the slack, 7 s) while new ISRs and leaders went unseen. Caught up, or told the same
    URL, it stays."""
    recs = _records()

    class Control(FakeControl):
        leader_url: str | None = "http://c1"

        async def fetch_metadata(self, *, after_offset: int, wait_ms_max: int) -> MetadataBatch:
            self.asked_after.append((self.leader_url, after_offset))
            if self.leader_url == "http://c1" and after_offset >= 0:
                await asyncio.sleep(3600)   # c1 was cut off after answering the first
            return self.batches.pop(0) if self.batches else await asyncio.sleep(3600)

    control = Control([MetadataBatch(offset=0, records=((0, dump_record(recs[0])),)),
                       MetadataBatch(offset=1, records=((1, dump_record(recs[1])),))])

    async def scenario():
        learner = MetadataLearner(control, data_dir=str(tmp_path))
        task = asyncio.create_task(learner.run())
        await asyncio.wait_for(learner.caught_up.wait(), 5)
        await asyncio.sleep(0.05)
        learner.follow_leader("http://c1", 5)   # the same controller: nothing to move
        learner.follow_leader("http://c2", 0)   # not behind it: nothing to move
        await asyncio.sleep(0.05)
        assert control.leader_url == "http://c1" and learner.offset == 0
        learner.follow_leader("http://c2", 1)
        for _ in range(100):
            if learner.offset == 1:
                break
            await asyncio.sleep(0.01)
        await cancel_and_wait(task)
        return learner

    learner = asyncio.run(scenario())
    assert learner.offset == 1 and control.leader_url == "http://c2"
    assert ("http://c2", 0) in control.asked_after


def _count_next_tick_ms(driver, monkeypatch) -> list[int]:
    """Each time the driver asks its core when a Tick is next due, a 1 goes in the list returned."""
    asked: list[int] = []
    real = driver.replica.next_tick_ms

    def counted():
        asked.append(1)
        return real()
    monkeypatch.setattr(driver.replica, "next_tick_ms", counted)
    return asked


def test_an_event_on_a_stale_clock_asks_the_core_when_it_is_due_once_not_twice(tmp_path, monkeypatch):
    """Before an event on a replica whose clock is CLOCK_STALE_MS old the driver moves the
    clock unless a timed rule is due; it knows that from the core's answer after the last step
    (only time has passed since), so the core works it out once per event, after the step,
    not before it too. A rule that is due still gets its Tick first, and the core is asked once
    after the Tick and the event, not after each."""
    from dataplane.broker.partition import now_ms
    from dataplane.replica.events import FetchRequest

    async def scenario():
        driver = _leader_driver(tmp_path, "a", (1, 2), None)
        await _until_serving(driver)
        asked = _count_next_tick_ms(driver, monkeypatch)
        ticks: list[object] = []
        real_tick = driver.tick
        monkeypatch.setattr(driver, "tick", lambda now: (ticks.append(now), real_tick(now)))
        await asyncio.sleep(0.03)   # the clock is now stale
        driver.step(FetchRequest(replica_id=2, fetch_offset=driver.log.log_end_offset, current_leader_epoch=1,
                                 partition=("a", 0), last_fetched_epoch=1))
        once = (len(asked), len(ticks))
        driver._due = now_ms() - 1   # as if a timed rule had come due since the last step
        await asyncio.sleep(0.03)
        asked.clear()
        driver.step(FetchRequest(replica_id=2, fetch_offset=driver.log.log_end_offset, current_leader_epoch=1,
                                 partition=("a", 0), last_fetched_epoch=1))
        await driver.close()
        return once, len(ticks), len(asked)

    (asked_once, ticked_before), ticked_after, asked_after_tick = asyncio.run(scenario())
    assert (asked_once, ticked_before) == (1, 0), (asked_once, ticked_before)
    assert ticked_after == 1, "a rule due by then gets its Tick before the event"
    assert asked_after_tick == 1, "the Tick and the event after it ask the core once, after both"


def test_a_produce_and_the_write_done_of_its_append_ask_the_core_when_it_is_due_once(tmp_path, monkeypatch):
    """Claim (the Kafka write benchmark's profile: a quarter of a broker's steps were the
    WriteDone of an append, each with the whole after-step work): the WriteDone that perform
    steps inside a produce's step leaves the timer, budget and watchers to that step, which
    looks once, after both; the timer it sets is the core's answer after both."""
    from common.batch import build_batch

    async def scenario():
        driver = _leader_driver(tmp_path, "a", (1,), None)
        await _until_serving(driver)
        asked = _count_next_tick_ms(driver, monkeypatch)
        dues: list[object] = []
        driver.on_due = lambda tp, due: dues.append(due)
        written_before = driver.replica.written_offset
        release = await asyncio.wait_for(driver.submit_produce(bytearray(build_batch([b"v"], timestamp_ms=1)),
                                                               acks=1, timeout_ms=10_000), 5)
        stepped = (len(asked), list(dues), driver._due)
        after_write = type(driver.replica).next_tick_ms(driver.replica)  # not counted
        await driver.close()
        return release, written_before, stepped, after_write

    release, written_before, (asked, dues, due), after_write = asyncio.run(scenario())
    assert release.error is ErrorCode.NONE and release.base_offset == written_before
    assert asked == 1, f"next_tick_ms asked {asked} times for one produce"
    assert dues == [after_write] and due == after_write


def test_a_fetch_answer_ticks_the_follower_only_when_a_timed_rule_is_due(tmp_path):
    """Claim (the Kafka write benchmark's profile: every fetch answer a follower got was followed
    by a Tick step, most for nothing): after an answer the broker ticks the replica only when
    the core's next timer is due by then. An answer with records leaves nothing due (the next
    fetch waits for the append's flush), so no Tick; an empty answer leaves the next fetch due at
    once, and it is sent at once."""
    from common.batch import build_batch
    from dataplane.broker.partition import now_ms
    from dataplane.replica.events import FetchResponse
    from driver_support import FetchHooks, follower_driver

    hooks = FetchHooks()
    fetches = hooks.fetches

    async def scenario():
        # The append's lazy flush is the next timed rule: 1 s away, so that a slow step on a
        # busy machine does not make it due before the driver looks (it was 5 ms).
        driver = follower_driver(tmp_path / "t-0", hooks)
        driver.replica.flush_debounce_ms = 1000
        stepped: list[str] = []
        real_step = driver.step
        driver.step = lambda event: (stepped.append(type(event).__name__), real_step(event))[1]
        asked = fetches[-1]
        records = build_batch([b"a", b"b", b"c"], timestamp_ms=1, leader_epoch=1)
        driver.step(FetchResponse(leader_id=1, leader_epoch=1, fetch_offset=asked.fetch_offset,
                                  last_fetched_epoch=asked.last_fetched_epoch, records=records, high_watermark=0,
                                  log_end_offset=3, partition=("t", 0)))
        now = now_ms()
        due_after_records = driver.replica.next_tick_ms()
        driver.tick_if_due(now)
        after_records = list(stepped)
        sent = len(fetches)
        for _ in range(500):   # the append's flush completes (in a thread); the next fetch goes
            await asyncio.sleep(0.01)
            driver.tick_if_due(now_ms())
            if len(fetches) > sent:
                break
        asked = fetches[-1]
        sent_before = len(fetches)
        stepped.clear()
        driver.step(FetchResponse(leader_id=1, leader_epoch=1, fetch_offset=asked.fetch_offset,
                                  last_fetched_epoch=asked.last_fetched_epoch, high_watermark=3, log_end_offset=3,
                                  partition=("t", 0)))
        driver.tick_if_due(now_ms())
        after_empty = (list(stepped), len(fetches) - sent_before, fetches[-1].fetch_offset)
        await driver.close()
        return due_after_records, now, after_records, after_empty

    due, now, after_records, (after_empty, sent, offset) = asyncio.run(scenario())
    assert due is None or due > now
    assert after_records == ["FetchResponse", "WriteDone"], after_records
    assert after_empty[:2] == ["FetchResponse", "Tick"] and sent == 1 and offset == 3, (after_empty, sent, offset)
