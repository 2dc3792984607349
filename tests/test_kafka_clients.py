"""Unmodified Kafka clients against the brokers' Kafka port: librdkafka (confluent-kafka,
kcat), kafka-python and aiokafka produce, and read back exactly what they produced.

One 3-broker cluster serves the module (each test makes its own topics, RF 3).
A new leader's first offset holds its epoch-start control record (Kafka's
LEADER_CHANGE), which consumers skip: a new partition's records start at offset 1.
Consumers here assign partitions by hand; groups are tests/test_kafka_groups.py's.
"""
from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
from typing import Iterator

import pytest

from cluster_harness import Cluster

pytestmark = pytest.mark.slow

confluent_kafka = pytest.importorskip("confluent_kafka")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("kafka"), brokers=3) as c:
        yield c


def consume_exactly(bootstrap: str, topic: str, count: int, *, partition: int = 0, offset: int = 0,
                    timeout_s: float = 30) -> list[tuple[int, bytes, int]]:
    """(offset, value, timestamp) of `count` records from `offset`, by manual assignment."""
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": "unused",
                                         "enable.auto.commit": False, "enable.partition.eof": False})
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, partition, offset)])
        got: list[tuple[int, bytes, int]] = []
        deadline = time.monotonic() + timeout_s
        while len(got) < count and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is None:
                continue
            assert m.error() is None, m.error()
            got.append((m.offset(), m.value(), m.timestamp()[1]))
        # Nothing more than was produced.
        extra = consumer.poll(1.0)
        assert extra is None, (extra.offset(), extra.value())
        return got
    finally:
        consumer.close()


@pytest.mark.parametrize("acks,idempotence", [("0", False), ("1", False), ("all", False), ("all", True)])
def test_confluent_producer_acks_read_back_exactly(cluster: Cluster, acks: str, idempotence: bool) -> None:
    """librdkafka produces with each acks setting (and idempotence, which needs
    InitProducerId and acks=all); a consumer reads every record back, in order, once."""
    topic = f"ck-{acks}-{int(idempotence)}"
    cluster.create_topic(topic, partitions=1, replication_factor=3)
    producer = confluent_kafka.Producer({"bootstrap.servers": cluster.kafka_bootstrap, "acks": acks,
                                         "enable.idempotence": idempotence, "linger.ms": 5})
    reports: list[tuple[object, int]] = []
    values = [b"%s-%05d" % (topic.encode(), i) for i in range(500)]
    for v in values:
        producer.produce(topic, value=v, on_delivery=lambda err, msg: reports.append((err, msg.offset())))
    assert producer.flush(30) == 0
    assert [e for e, _ in reports if e is not None] == []
    got = consume_exactly(cluster.kafka_bootstrap, topic, len(values))
    assert [v for _, v, _ in got] == values
    offsets = [o for o, _, _ in got]
    assert offsets == sorted(set(offsets))
    if acks != "0":
        assert sorted(o for _, o in reports) == offsets


def test_a_batch_larger_than_a_segment_is_refused_and_the_partition_takes_the_next(cluster: Cluster) -> None:
    """librdkafka, a topic whose segment size is lowered to 1 KiB after it was opened: a 2,000-byte
    record is refused at once with RECORD_LIST_TOO_LARGE (as Kafka does), and the next small record
    is acknowledged. Before, the broker never answered the first and the partition took nothing
    more; and a changed segment size (or retention) reached a replica only when it opened again."""
    from controller_harness import http
    topic = "ck-small-segments"
    cluster.create_topic(topic, partitions=1, replication_factor=3)
    producer = confluent_kafka.Producer({"bootstrap.servers": cluster.kafka_bootstrap, "acks": "all",
                                         "message.timeout.ms": 10000, "retries": 0})
    reports: list[tuple[object, int]] = []
    producer.produce(topic, value=b"x" * 2000, on_delivery=lambda err, msg: reports.append((err, msg.offset())))
    assert producer.flush(15) == 0 and reports[0][0] is None   # fits the default 128 MiB segments
    r = http("PATCH", f"{cluster.api_url}/v1/topics/{topic}/config", {"set": {"segment_bytes": 1024}})
    assert r.status == 200, r.body
    deadline = time.monotonic() + 15
    while True:   # the brokers apply the new config with the next metadata
        reports.clear()
        producer.produce(topic, value=b"x" * 2000, on_delivery=lambda err, msg: reports.append((err, msg.offset())))
        assert producer.flush(15) == 0
        if reports[0][0] is not None or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    producer.produce(topic, value=b"small", on_delivery=lambda err, msg: reports.append((err, msg.offset())))
    assert producer.flush(15) == 0
    (big_error, _), (small_error, small_offset) = reports
    assert big_error is not None and big_error.code() == confluent_kafka.KafkaError.RECORD_LIST_TOO_LARGE, big_error
    assert small_error is None
    assert [v for _, v, _ in consume_exactly(cluster.kafka_bootstrap, topic, 1, offset=small_offset)] == [b"small"]


def test_confluent_consumer_by_offset_and_by_time(cluster: Cluster) -> None:
    """ListOffsets by timestamp (offsets_for_times), earliest and latest (watermarks),
    and a consumer starting at the offset found."""
    topic = "ck-time"
    cluster.create_topic(topic, partitions=1, replication_factor=3)
    # One batch of all 20 records (a long linger, one flush): a lookup by time must name the
    # record inside the batch, not the batch's first offset.
    producer = confluent_kafka.Producer({"bootstrap.servers": cluster.kafka_bootstrap, "acks": "all",
                                         "enable.idempotence": True, "linger.ms": 5000})
    # An hour before the epoch-start record's timestamp (the leader's clock when it took the
    # partition), as a replay's records are: a lookup by time must still name a data record.
    base_ms = int(time.time() * 1000) - 3_600_000
    offsets: list[int] = []
    for i in range(20):
        producer.produce(topic, value=b"%d" % i, timestamp=base_ms + i * 1000,
                         on_delivery=lambda err, msg: offsets.append(msg.offset()))
    producer.flush(20)
    first = offsets[0]
    assert offsets == list(range(first, first + 20))
    consumer = confluent_kafka.Consumer({"bootstrap.servers": cluster.kafka_bootstrap, "group.id": "unused",
                                         "enable.auto.commit": False})
    try:
        watermarks = consumer.get_watermark_offsets(confluent_kafka.TopicPartition(topic, 0), timeout=10)
        assert watermarks == (0, first + 20)
        found = consumer.offsets_for_times([confluent_kafka.TopicPartition(topic, 0, base_ms + 12_500)],
                                           timeout=10)
        assert found[0].error is None and found[0].offset == first + 13
        before_all = consumer.offsets_for_times([confluent_kafka.TopicPartition(topic, 0, base_ms - 60_000)],
                                                timeout=10)
        assert before_all[0].offset == first, "a lookup before every record names the first, not a control record"
        past_end = consumer.offsets_for_times([confluent_kafka.TopicPartition(topic, 0, base_ms + 99_000)],
                                              timeout=10)
        assert past_end[0].offset == -1  # no record at or after that time: Kafka's answer
    finally:
        consumer.close()
    got = consume_exactly(cluster.kafka_bootstrap, topic, 7, offset=first + 13)
    assert got == [(first + i, b"%d" % i, base_ms + i * 1000) for i in range(13, 20)]


def test_kafka_python_round_trip(cluster: Cluster) -> None:
    kafka = pytest.importorskip("kafka")
    topic = "kp"
    cluster.create_topic(topic, partitions=1, replication_factor=3)
    producer = kafka.KafkaProducer(bootstrap_servers=cluster.kafka_bootstrap, acks="all")
    try:
        futures = [producer.send(topic, value=b"kp-%d" % i, partition=0) for i in range(200)]
        producer.flush(30)
        offsets = [f.get(10).offset for f in futures]
        assert offsets == list(range(offsets[0], offsets[0] + 200))
    finally:
        producer.close(5)
    consumer = kafka.KafkaConsumer(bootstrap_servers=cluster.kafka_bootstrap, group_id=None,
                                   enable_auto_commit=False, consumer_timeout_ms=5000)
    try:
        tp = kafka.TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        got = []
        deadline = time.monotonic() + 30
        while len(got) < 200 and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                got += [(r.offset, r.value) for r in records]
        assert got == [(offsets[0] + i, b"kp-%d" % i) for i in range(200)]
        assert consumer.end_offsets([tp]) == {tp: offsets[0] + 200}
    finally:
        consumer.close()


def test_kafka_python_idempotent_producer_with_records_stamped_in_the_past(cluster: Cluster) -> None:
    """kafka-python's producer (idempotent by default) replaying records stamped in 2020: every
    batch is acknowledged, in order. Before, the leader forgot the producer by the records'
    timestamps within a second of its first batch, refused the second UNKNOWN_PRODUCER_ID, and the
    client stopped."""
    kafka = pytest.importorskip("kafka")
    topic = "kp-old-timestamps"
    cluster.create_topic(topic, partitions=1, replication_factor=3)
    producer = kafka.KafkaProducer(bootstrap_servers=cluster.kafka_bootstrap, acks="all",
                                   enable_idempotence=True)
    try:
        offsets = []
        for i in range(3):
            offsets.append(producer.send(topic, value=b"old-%d" % i, partition=0,
                                         timestamp_ms=1_600_000_000_000 + i).get(15).offset)
            time.sleep(1.2)   # a few of the leader's Ticks, each of which expires idle producers
        assert offsets == [offsets[0], offsets[0] + 1, offsets[0] + 2]
    finally:
        producer.close(5)


def test_aiokafka_round_trip(cluster: Cluster) -> None:
    aiokafka = pytest.importorskip("aiokafka")
    topic = "aio"
    cluster.create_topic(topic, partitions=1, replication_factor=3)

    async def run() -> tuple[list[int], list[tuple[int, bytes]]]:
        producer = aiokafka.AIOKafkaProducer(bootstrap_servers=cluster.kafka_bootstrap, acks="all",
                                             enable_idempotence=True)
        await producer.start()
        try:
            sent = [(await producer.send_and_wait(topic, b"aio-%d" % i, partition=0)).offset
                    for i in range(100)]
        finally:
            await producer.stop()
        consumer = aiokafka.AIOKafkaConsumer(bootstrap_servers=cluster.kafka_bootstrap, group_id=None,
                                             enable_auto_commit=False)
        await consumer.start()
        try:
            tp = aiokafka.TopicPartition(topic, 0)
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            got: list[tuple[int, bytes]] = []
            while len(got) < 100:
                batch = await asyncio.wait_for(consumer.getmany(tp, timeout_ms=500), 30)
                got += [(r.offset, r.value) for r in batch.get(tp, [])]
            return sent, got
        finally:
            await consumer.stop()

    sent, got = asyncio.run(run())
    assert got == [(sent[0] + i, b"aio-%d" % i) for i in range(100)] and [o for o, _ in got] == sent


def test_kcat_list_produce_consume(cluster: Cluster) -> None:
    if shutil.which("kcat") is None:
        pytest.skip("kcat is not installed (Debian package kcat; scripts/system-deps.sh installs it)")
    topic = "kcat"
    cluster.create_topic(topic, partitions=1, replication_factor=3)
    broker = cluster.kafka_bootstrap.split(",")[0]
    listing = subprocess.run(["kcat", "-b", broker, "-L", "-t", topic], capture_output=True, text=True, timeout=30)
    assert listing.returncode == 0, listing.stderr
    assert 'topic "kcat" with 1 partitions' in listing.stdout and "3 brokers" in listing.stdout
    lines = "".join(f"line {i}\n" for i in range(50))
    produced = subprocess.run(["kcat", "-b", broker, "-P", "-t", topic, "-p", "0", "-X", "acks=all"],
                              input=lines, capture_output=True, text=True, timeout=30)
    assert produced.returncode == 0, produced.stderr
    consumed = subprocess.run(["kcat", "-b", broker, "-C", "-t", topic, "-p", "0", "-o", "beginning", "-e",
                               "-f", "%o %s\n"], capture_output=True, text=True, timeout=30)
    assert consumed.returncode == 0, consumed.stderr
    first = int(consumed.stdout.split()[0])
    assert consumed.stdout.splitlines() == [f"{first + i} line {i}" for i in range(50)]


def test_ports_file_names_the_kafka_port(cluster: Cluster) -> None:
    """The broker's ports file (what `--kafka-port 0` callers read) has the Kafka listener's port."""
    for b in cluster.brokers.values():
        ports = json.loads(b.ports_path.read_text())
        assert ports["kafka_port"] == b.kafka_port and ports["port"] == b.port


def test_a_transactional_producer_is_told_transactions_are_not_supported(cluster: Cluster) -> None:
    """Transaction APIs are not advertised; librdkafka still asks FindCoordinator (served for
    groups) for a transaction coordinator, and the answer stops init_transactions at once and
    fatally, saying why, instead of a retry loop until its timeout."""
    producer = confluent_kafka.Producer({"bootstrap.servers": cluster.kafka_bootstrap, "transactional.id": "tx"})
    with pytest.raises(confluent_kafka.KafkaException) as refused:
        producer.init_transactions(20)
    error = refused.value.args[0]
    assert error.fatal() and "does not support transactions" in error.str(), error
    # Not _TIMED_OUT: the answer itself stopped it.
    assert error.code() == confluent_kafka.KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, error
