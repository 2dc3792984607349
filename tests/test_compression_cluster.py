"""Compressed batches across a real broker (tests/cluster_harness.py), both ways: librdkafka
(confluent-kafka) produces with a codec through the Kafka port and Biplane's SDK consumer
reads it; Biplane's SDK producer compresses and librdkafka's consumer reads it. The broker
stores each batch as it came: the fetched bytes carry the producer's codec."""
from __future__ import annotations

import asyncio
import time

import pytest

from cluster_harness import Cluster
from common import wire
from common.batch import Compression, iter_batches
from common.wire import WireClient
from dataplane.client import Consumer, Producer

confluent_kafka = pytest.importorskip("confluent_kafka")

pytestmark = pytest.mark.slow

COUNT = 200


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with Cluster(tmp_path_factory.mktemp("compression"), brokers=1) as c:
        yield c


def stored_codecs(c: Cluster, topic: str) -> set[Compression]:
    async def fetch() -> set[Compression]:
        client = await WireClient.connect(*c.address(1))
        try:
            r = await client.request(wire.FetchRequest(max_wait_ms=0, topics=(wire.FetchTopic(
                topic=topic, partitions=(wire.FetchPartition(partition=0, fetch_offset=0),)),)))
            records = bytes(r.topics[0].partitions[0].records or b"")
            return {h.compression for _, h in iter_batches(records) if not h.is_control}
        finally:
            await client.close()
    return asyncio.run(fetch())


def values(prefix: str) -> list[bytes]:
    return [f"{prefix} record {i} ".encode() * 8 for i in range(COUNT)]


# librdkafka sends lz4 only to brokers advertising FindCoordinator (served since consumer groups).
@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_librdkafka_compressed_batches_are_read_by_the_sdk_consumer(cluster, codec):
    topic = f"from-librdkafka-{codec}"
    cluster.create_topic(topic, partitions=1, replication_factor=1)
    producer = confluent_kafka.Producer({"bootstrap.servers": cluster.kafka_bootstrap, "acks": "all",
                                         "compression.type": codec, "linger.ms": 20})
    sent = values(codec)
    for v in sent:
        producer.produce(topic, value=v)
    assert producer.flush(30) == 0
    assert stored_codecs(cluster, topic) == {Compression[codec.upper()]}

    async def read() -> list[bytes | None]:
        async with Consumer(topic, bootstrap=f"127.0.0.1:{cluster.brokers[1].port}",
                            from_beginning=True) as consumer:
            got: list = []
            deadline = time.monotonic() + 30
            while len(got) < COUNT and time.monotonic() < deadline:
                got += await consumer.poll(500)
            return [r.value for r in got]
    assert asyncio.run(asyncio.wait_for(read(), 60)) == sent


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_sdk_compressed_batches_are_read_by_librdkafka(cluster, codec):
    topic = f"from-sdk-{codec}"
    cluster.create_topic(topic, partitions=1, replication_factor=1)
    sent = values(codec)

    async def write() -> None:
        async with Producer(bootstrap=f"127.0.0.1:{cluster.brokers[1].port}", compression=codec,
                            linger_ms=20) as producer:
            futures = [await producer.send(topic, v) for v in sent]
            await producer.flush()
            for f in futures:
                await f
    asyncio.run(asyncio.wait_for(write(), 60))
    assert stored_codecs(cluster, topic) == {Compression[codec.upper()]}

    consumer = confluent_kafka.Consumer({"bootstrap.servers": cluster.kafka_bootstrap, "group.id": "unused",
                                         "enable.auto.commit": False})
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, 0, 0)])
        got: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(got) < COUNT and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is None:
                continue
            assert m.error() is None, m.error()
            got.append(m.value())
    finally:
        consumer.close()
    assert got == sent
