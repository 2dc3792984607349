"""One real broker process with a single-node controller, over the wire protocol.

Claims: a broker registers and is unfenced; produce with acks 0, 1 and all is
read back in order; list-offsets and metadata describe what is stored; bad
input (corrupt batch, stale and future epochs, unknown topic or partition,
oversized batch, oversized frame) is answered with its own error while the
same broker keeps serving everyone else; producer ids come from controller
blocks; a cleanly restarted broker keeps its log and says its shutdown was clean.
"""
from __future__ import annotations

import asyncio

import pytest

from common.errors import ErrorCode
from common.wire import ConnectionClosedError, WireClient
from common.wire import messages as wire
from cluster_harness import Cluster, fetch_values, make_batch, produce, produce_request
from controller_harness import http, wait_until
from metrics_scrape import scrape

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

FRAME_MAX = 512 * 1024


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("broker-basic"), brokers=1,
                broker_args=["--max-frame-bytes", str(FRAME_MAX)])
    with c:
        c.create_topic("events", partitions=2, replication_factor=1,
                       config={"max_message_bytes": 64 * 1024})
        yield c


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


async def connect(cluster: Cluster, broker_id: int = 1) -> WireClient:
    return await WireClient.connect(*cluster.address(broker_id))


def test_broker_registers_with_its_address_and_heartbeats_usage(cluster):
    brokers = http("GET", cluster.api_url + "/v1/brokers").body["brokers"]
    assert [(b["broker_id"], b["port"], b["fenced"]) for b in brokers] == [(1, cluster.brokers[1].port, False)]
    view = wait_until(lambda: (lambda b: b if b.get("disk_total_bytes") else None)(cluster.broker_info(1)),
                      10, "a heartbeat with usage")
    assert view["disk_total_bytes"] >= view["disk_used_bytes"] > 0
    assert view["metadata_offset"] >= view["registered_offset"]


def test_produce_with_every_acks_then_fetch_list_offsets_and_metadata(cluster):
    async def scenario():
        async with await connect(cluster) as c:
            before, hw0 = await fetch_values(c, "events", 1)
            r1 = await produce(c, "events", 1, make_batch([b"one-a", b"one-b"]), acks=1)
            r_all = await produce(c, "events", 1, make_batch([b"all-a"]), acks=-1)
            await c.send(produce_request("events", 1, make_batch([b"zero-a"]), acks=0))
            assert (r1.error_code, r_all.error_code) == (ErrorCode.NONE, ErrorCode.NONE)
            assert r_all.base_offset == r1.base_offset + 2
            values = []
            for _ in range(100):  # the acks=0 batch has no answer: poll until it shows
                values, hw = await fetch_values(c, "events", 1, offset=r1.base_offset)
                if len(values) == 4:
                    break
                await asyncio.sleep(0.05)
            assert values == [(r1.base_offset, b"one-a"), (r1.base_offset + 1, b"one-b"),
                              (r_all.base_offset, b"all-a"), (r_all.base_offset + 1, b"zero-a")]
            offsets = await c.request(wire.ListOffsetsRequest(topics=(wire.ListOffsetsTopic(
                topic="events", partitions=(wire.ListOffsetsPartition(partition=1, timestamp=-2),
                                            wire.ListOffsetsPartition(partition=1, timestamp=-1))),)))
            earliest, latest = offsets.topics[0].partitions
            assert (earliest.error_code, earliest.offset) == (ErrorCode.NONE, 0)
            assert (latest.error_code, latest.offset) == (ErrorCode.NONE, hw)
            assert hw == r_all.base_offset + 2
            meta = await c.request(wire.MetadataRequest(topics=("events", "nope")))
            assert [(b.node_id, b.port) for b in meta.brokers] == [(1, cluster.brokers[1].port)]
            events, nope = meta.topics
            assert nope.error_code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            assert [(p.partition, p.leader_id, p.replicas, p.isr) for p in events.partitions] == \
                [(0, 1, (1,), (1,)), (1, 1, (1,), (1,))]
            assert latest.leader_epoch == events.partitions[1].leader_epoch >= 0
    run(scenario())


def test_bad_partitions_get_their_own_errors_and_the_good_one_is_stored(cluster):
    good = make_batch([b"good"])
    corrupt = bytearray(make_batch([b"corrupt-me"]))
    corrupt[-3] ^= 0xFF  # inside the records: the CRC no longer matches
    too_big = make_batch([b"x" * (70 * 1024)])

    async def scenario():
        async with await connect(cluster) as c:
            r = await c.request(wire.ProduceRequest(acks=1, topics=(
                wire.ProduceTopic(topic="events", partitions=(
                    wire.ProducePartition(partition=0, records=bytes(corrupt)),
                    wire.ProducePartition(partition=1, records=good),
                    wire.ProducePartition(partition=7, records=good))),
                wire.ProduceTopic(topic="missing", partitions=(wire.ProducePartition(partition=0, records=good),)),
            )))
            codes = {(t.topic, p.partition): p.error_code for t in r.topics for p in t.partitions}
            assert codes == {("events", 0): ErrorCode.CORRUPT_MESSAGE, ("events", 1): ErrorCode.NONE,
                             ("events", 7): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                             ("missing", 0): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}
            big = await produce(c, "events", 0, too_big, acks=1)
            assert big.error_code is ErrorCode.MESSAGE_TOO_LARGE
            assert "max_message_bytes" in big.error_message
            ok = await produce(c, "events", 0, good, acks=-1)
            assert ok.error_code is ErrorCode.NONE
            values, _ = await fetch_values(c, "events", 0, offset=ok.base_offset)
            assert values == [(ok.base_offset, b"good")]
            fetched = await c.request(wire.FetchRequest(topics=(
                wire.FetchTopic(topic="missing", partitions=(wire.FetchPartition(partition=0),)),)))
            assert fetched.topics[0].partitions[0].error_code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    run(scenario())


def test_oversized_frame_closes_only_its_connection(cluster):
    async def scenario():
        async with await connect(cluster) as bystander, await connect(cluster) as offender:
            huge = make_batch([b"y" * (FRAME_MAX + 1024)])
            with pytest.raises(ConnectionClosedError):
                await offender.request(produce_request("events", 0, huge, acks=1))
            r = await produce(bystander, "events", 0, make_batch([b"still-served"]), acks=1)
            assert r.error_code is ErrorCode.NONE
            async with await connect(cluster) as fresh:
                versions = await fresh.request(wire.ApiVersionsRequest())
                assert ErrorCode.NONE is versions.error_code
                assert {v.api_key for v in versions.api_keys} >= {0, 1, 2, 3, 18, 22}
    run(scenario())


def test_producer_ids_are_distinct_and_epochs_bump(cluster):
    async def scenario():
        async with await connect(cluster) as c:
            a = await c.request(wire.InitProducerIdRequest())
            b = await c.request(wire.InitProducerIdRequest())
            assert (a.error_code, b.error_code) == (ErrorCode.NONE, ErrorCode.NONE)
            assert a.producer_id != b.producer_id and a.producer_epoch == b.producer_epoch == 0
            bumped = await c.request(wire.InitProducerIdRequest(producer_id=a.producer_id, producer_epoch=0))
            assert (bumped.producer_id, bumped.producer_epoch) == (a.producer_id, 1)
    run(scenario())


def test_metrics_endpoint_reports_partitions(cluster):
    scraped = scrape(cluster.brokers[1].metrics_port)
    assert scraped.samples("biplane_partition_log_end_offset", topic="events", partition="0")
    assert scraped.value("biplane_broker_requests_total") > 0


def test_restart_keeps_log_then_stale_and_future_epochs_are_refused(cluster):
    """Runs last in this module: it restarts the broker (clean stop, then kill -9)."""
    async def produce_some(value: bytes) -> int:
        async with await connect(cluster) as c:
            r = await produce(c, "events", 0, make_batch([value]), acks=-1)
            assert r.error_code is ErrorCode.NONE
            return r.base_offset

    offset = run(produce_some(b"before-restart"))
    info = cluster.restart(1)
    assert info["clean_shutdown"] is True
    cluster.wait_leader("events", 0)

    async def after_restart():
        values = await _values(cluster, offset)
        assert values[0] == (offset, b"before-restart")
        async with await connect(cluster) as c:
            meta = await c.request(wire.MetadataRequest(topics=("events",)))
            epoch = meta.topics[0].partitions[0].leader_epoch
            assert epoch >= 1  # the restart moved leadership away and back
            stale = await produce(c, "events", 0, make_batch([b"stale"]), acks=1, epoch=epoch - 1)
            future = await produce(c, "events", 0, make_batch([b"future"]), acks=1, epoch=epoch + 5)
            current = await produce(c, "events", 0, make_batch([b"current"]), acks=-1, epoch=epoch)
            assert stale.error_code is ErrorCode.FENCED_LEADER_EPOCH
            assert future.error_code is ErrorCode.UNKNOWN_LEADER_EPOCH
            assert current.error_code is ErrorCode.NONE  # a client's future epoch did not unseat the leader
            values, _ = await fetch_values(c, "events", 0, offset=current.base_offset - 1)
            assert b"stale" not in [v for _, v in values] and b"future" not in [v for _, v in values]
    run(after_restart())

    info = cluster.restart(1, kill=True)
    assert info["clean_shutdown"] is False
    cluster.wait_leader("events", 0)
    values = run(_values(cluster, offset))
    assert values[0] == (offset, b"before-restart")


async def _values(cluster, offset):
    """What a consumer reads from `offset`; polls, since a new leader's HW catches up just after it leads."""
    async with await connect(cluster) as c:
        for _ in range(200):
            values, _ = await fetch_values(c, "events", 0, offset=offset)
            if values:
                return values
            await asyncio.sleep(0.05)
        return values


def test_deleting_a_topic_removes_its_replica_directory(cluster):
    data_dir = cluster.brokers[1].data_dir
    cluster.create_topic("doomed", partitions=1, replication_factor=1)

    async def scenario():
        async with await connect(cluster) as c:
            assert (await produce(c, "doomed", 0, make_batch([b"bye"]), acks=-1)).error_code is ErrorCode.NONE
    run(scenario())
    assert (data_dir / "doomed-0").is_dir()
    assert http("DELETE", cluster.api_url + "/v1/topics/doomed").status == 200
    wait_until(lambda: not (data_dir / "doomed-0").exists(), 10, "doomed-0 removed")
    assert (data_dir / "events-0").is_dir()


def test_pipelined_produce_on_one_connection_keeps_order(cluster):
    async def scenario():
        async with await connect(cluster) as c:
            answers = await asyncio.gather(*(produce(c, "events", 1, make_batch([b"p%d" % i]), acks=-1)
                                             for i in range(12)))
            assert [a.error_code for a in answers] == [ErrorCode.NONE] * 12
            offsets = [a.base_offset for a in answers]
            assert offsets == list(range(offsets[0], offsets[0] + 12))
            values, _ = await fetch_values(c, "events", 1, offset=offsets[0])
            assert [v for _, v in values[:12]] == [b"p%d" % i for i in range(12)]
    run(scenario())


def test_consumer_long_poll_returns_data_produced_while_it_waits(cluster):
    async def scenario():
        async with await connect(cluster) as consumer, await connect(cluster) as producer:
            _, hw = await fetch_values(consumer, "events", 1)
            poll = asyncio.ensure_future(consumer.request(wire.FetchRequest(max_wait_ms=20_000, topics=(
                wire.FetchTopic(topic="events", partitions=(wire.FetchPartition(partition=1, fetch_offset=hw),)),))))
            await asyncio.sleep(0.2)
            assert not poll.done()  # nothing to read yet: it waits
            r = await produce(producer, "events", 1, make_batch([b"wake-up"]), acks=-1)
            answer = (await asyncio.wait_for(poll, 15)).topics[0].partitions[0]
            assert answer.error_code is ErrorCode.NONE and bytes(answer.records)
            assert answer.high_watermark == r.base_offset + 1
    run(scenario())


def test_fetch_answer_stays_near_max_bytes_across_partitions(cluster):
    batch = make_batch([b"z" * 1000] * 8)  # ~8 KiB

    async def scenario():
        async with await connect(cluster) as c:
            for partition in (0, 1):
                for _ in range(4):
                    assert (await produce(c, "events", partition, batch, acks=-1)).error_code is ErrorCode.NONE
            r = await c.request(wire.FetchRequest(max_bytes=len(batch) + 10, topics=(wire.FetchTopic(
                topic="events", partitions=(wire.FetchPartition(partition=0), wire.FetchPartition(partition=1))),)))
            sizes = [len(p.records) for p in r.topics[0].partitions]
            assert all(p.error_code is ErrorCode.NONE for p in r.topics[0].partitions)
            # Each partition still makes progress (one batch at least), but far less than all it holds.
            assert 0 < sizes[0] <= 2 * len(batch) and 0 < sizes[1] <= 2 * len(batch), sizes
    run(scenario())


def test_second_broker_on_the_same_data_dir_refuses_to_start(cluster):
    import subprocess
    from controller_harness import BIPLANE, REPO
    b = cluster.brokers[1]
    done = subprocess.run([BIPLANE, "broker", "--broker-id", "1", "--data-dir", str(b.data_dir),
                           "--controller", cluster.api_url], capture_output=True, text=True, timeout=30, cwd=str(REPO))
    assert done.returncode == 1
    assert "already open by process" in done.stderr and str(b.pid) in done.stderr
    assert not (b.data_dir / "clean_shutdown").exists()  # it wrote nothing into the running broker's dir
