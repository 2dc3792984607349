"""The broker's pieces without processes: config checks, the clean-shutdown marker,
replica directories and topic ids, producer-id blocks, the metadata learner's
ordering and drift handling, and the fetch session's express path."""
from __future__ import annotations

import asyncio

import pytest
from pydantic import ValidationError

from common.control_client import MetadataBatch
from common.errors import ErrorCode
from common.metadata.config import TopicConfig
from common.metadata.records import CreateTopic, PartitionRecord, RegisterBroker, dump_record
from common.wire import messages as wire
from dataplane.broker.config import BrokerConfig
from dataplane.broker.fetcher import Fetcher
from dataplane.broker.lifecycle import take_clean_shutdown_marker, write_clean_shutdown_marker
from dataplane.broker.metadata import MetadataLearner
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
        return self.blocks.pop(0)

    async def fetch_metadata(self, *, after_offset: int, max_wait_ms: int) -> MetadataBatch:
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
        learner = MetadataLearner(control, data_dir=str(tmp_path))
        learner.add_listener(lambda image: seen.append(image.offset))
        task = asyncio.create_task(learner.run())
        for _ in range(100):
            if learner.offset == 2:
                break
            await asyncio.sleep(0.01)
        task.cancel()
        return learner

    learner = asyncio.run(scenario(FakeControl(batches)))
    assert learner.offset == 2 and seen == [1, 2]  # the repeated record 1 was skipped
    assert learner.image.partition("t", 0).replicas == (1,)
    again = MetadataLearner(FakeControl(), data_dir=str(tmp_path))
    assert again.offset == 2 and again.image == learner.image


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
            p = req.topics[0].partitions[0]
            sent.append((self.name, req.max_wait_ms, p.fetch_offset))
            if req.max_wait_ms:
                await self.gate.wait()
            return wire.FetchResponse(topics=(wire.FetchTopicResponse(topic="t", partitions=(
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
        def __init__(self) -> None:
            self.calls: list[str] = []

        async def register(self, request):
            self.calls.append(f"register:{request.clean_shutdown}")

        async def heartbeat(self, request):
            self.calls.append("heartbeat")
            if self.calls.count("heartbeat") == 2:
                raise BiplaneError("incarnation is stale", code=ErrorCode.STALE_BROKER_EPOCH)
            return {"fenced": False}

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

    async def scenario():
        driver = PartitionDriver(broker_id=1, tp=("t", 0), directory=str(tmp_path / "t-0"), log_config=LogConfig(),
                                 hooks=Hooks(), unclean_start=False)
        driver.step(NewMetadata(partition=PartitionState(replicas=(1,), isr=(1,), leader=1, leader_epoch=1,
                                                         partition_epoch=1), config=ReplicationConfig()))
        assert driver.is_leader and not driver.replica.epoch_durable
        futures = [driver.submit_produce(bytearray(build_batch([b"v%d" % i], timestamp_ms=1)), acks=-1,
                                         timeout_ms=10_000, record_count=1) for i in range(3)]
        releases = await asyncio.wait_for(asyncio.gather(*futures), 10)
        await driver.close()
        return releases
    releases = asyncio.run(scenario())
    assert [r.error for r in releases] == [ErrorCode.NONE] * 3
    first = releases[0].base_offset
    assert [r.base_offset for r in releases] == [first, first + 1, first + 2]
