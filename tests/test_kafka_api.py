"""The Kafka API listener against real Kafka clients, and against bad input.

One cluster (3 brokers, 1 controller) serves every test of this module; each test uses
topics of its own. Clients: confluent-kafka (librdkafka), kafka-python and kcat
(Debian's package, librdkafka again, driven as a user would from a shell).
"""
from __future__ import annotations

import os
import shutil
import socket
import struct
import subprocess
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster_harness import Cluster

confluent_kafka = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with Cluster(tmp_path_factory.mktemp("kafka-api"), brokers=3) as c:
        yield c


def _consume_all(bootstrap: str, topic: str, partitions: int, expected: int, *, timeout_s: float = 30
                 ) -> list[tuple[int, int, bytes, bytes | None]]:
    """Every record of `topic` by manual assignment from offset 0 (no consumer groups yet)."""
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": "unused",
                                         "enable.auto.commit": False})
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, p, 0) for p in range(partitions)])
        got: list[tuple[int, int, bytes, bytes | None]] = []
        deadline = time.monotonic() + timeout_s
        while len(got) < expected and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is None:
                continue
            assert m.error() is None, m.error()
            got.append((m.partition(), m.offset(), m.value(), m.key()))
        return got
    finally:
        consumer.close()


@pytest.mark.parametrize("acks", ["0", "1", "all"])
def test_confluent_kafka_produces_with_every_acks_and_reads_back_exactly(cluster, acks):
    """Claim: librdkafka's producer (idempotent for acks=all) writes through the Kafka port;
    every acknowledged record is read back once, at the offset it was acknowledged with."""
    topic = f"ck-acks-{acks}"
    cluster.create_topic(topic, partitions=3)
    config = {"bootstrap.servers": cluster.kafka_bootstrap, "acks": acks, "linger.ms": 2}
    if acks == "all":
        config["enable.idempotence"] = True
    producer = confluent_kafka.Producer(config)
    delivered: dict[bytes, tuple[int, int]] = {}
    errors: list = []

    def on_delivery(err, msg):
        if err is not None:
            errors.append(err)
        else:
            delivered[msg.value()] = (msg.partition(), msg.offset())
    for i in range(300):
        producer.produce(topic, value=f"{acks}-{i}".encode(), key=f"k{i % 17}".encode(), on_delivery=on_delivery)
        producer.poll(0)
    assert producer.flush(30) == 0
    assert errors == [] and len(delivered) == 300
    got = _consume_all(cluster.kafka_bootstrap, topic, 3, 300)
    assert sorted(v for _, _, v, _ in got) == sorted(delivered)
    if acks != "0":  # acks=0 gets no answer, so no offset
        assert all(delivered[v] == (p, o) for p, o, v, _ in got)
    assert all(k == f"k{int(v.decode().split('-')[-1]) % 17}".encode() for _, _, v, k in got)


def test_confluent_kafka_looks_offsets_up_by_time(cluster):
    """Claim: ListOffsets by timestamp (offsets_for_times) finds the first record at or after it."""
    topic = "ck-times"
    cluster.create_topic(topic, partitions=1)
    producer = confluent_kafka.Producer({"bootstrap.servers": cluster.kafka_bootstrap, "enable.idempotence": True})
    base = int(time.time() * 1000) + 1000  # after the epoch-start control batch
    for i in range(10):
        producer.produce(topic, value=f"t{i}".encode(), timestamp=base + i * 1000)
        assert producer.flush(15) == 0
    consumer = confluent_kafka.Consumer({"bootstrap.servers": cluster.kafka_bootstrap, "group.id": "unused"})
    try:
        found = consumer.offsets_for_times([confluent_kafka.TopicPartition(topic, 0, base + 4500)], timeout=15)
        low, high = consumer.get_watermark_offsets(confluent_kafka.TopicPartition(topic, 0), timeout=15)
    finally:
        consumer.close()
    got = {o: v for _, o, v, _ in _consume_all(cluster.kafka_bootstrap, topic, 1, 10)}
    assert got[found[0].offset] == b"t5"
    assert (low, high) == (0, max(got) + 1)


def test_kafka_python_round_trip(cluster):
    """Claim: kafka-python (its own protocol code, older API versions) produces and consumes."""
    topic = "kp-round-trip"
    cluster.create_topic(topic, partitions=2)
    producer = kafka.KafkaProducer(bootstrap_servers=cluster.kafka_bootstrap, acks="all")
    futures = [producer.send(topic, value=f"kp{i}".encode(), partition=i % 2) for i in range(40)]
    producer.flush()
    offsets = {f.get(timeout=15).offset for f in futures}
    producer.close()
    consumer = kafka.KafkaConsumer(bootstrap_servers=cluster.kafka_bootstrap, enable_auto_commit=False,
                                   group_id=None, consumer_timeout_ms=5000, auto_offset_reset="earliest")
    consumer.assign([kafka.TopicPartition(topic, 0), kafka.TopicPartition(topic, 1)])
    values = sorted(m.value for m in consumer)
    consumer.close()
    assert values == sorted(f"kp{i}".encode() for i in range(40))
    assert len(offsets) == 20  # 20 per partition, offsets shared between the two


def test_aiokafka_round_trip(cluster):
    """Claim: aiokafka (asyncio, its own protocol code) produces with acks=all and idempotence
    and reads everything back by manual assignment."""
    import asyncio
    aiokafka = pytest.importorskip("aiokafka")
    topic = "aio-round-trip"
    cluster.create_topic(topic, partitions=2)

    async def scenario() -> list[bytes]:
        producer = aiokafka.AIOKafkaProducer(bootstrap_servers=cluster.kafka_bootstrap, acks="all",
                                             enable_idempotence=True)
        await producer.start()
        try:
            for i in range(30):
                await producer.send_and_wait(topic, f"aio{i}".encode(), partition=i % 2)
        finally:
            await producer.stop()
        consumer = aiokafka.AIOKafkaConsumer(bootstrap_servers=cluster.kafka_bootstrap, enable_auto_commit=False,
                                             auto_offset_reset="earliest")
        await consumer.start()
        try:
            consumer.assign([aiokafka.TopicPartition(topic, 0), aiokafka.TopicPartition(topic, 1)])
            got: list[bytes] = []
            deadline = time.monotonic() + 20
            while len(got) < 30 and time.monotonic() < deadline:
                batches = await consumer.getmany(timeout_ms=500)
                got += [m.value for ms in batches.values() for m in ms]
            return got
        finally:
            await consumer.stop()
    assert sorted(asyncio.run(scenario())) == sorted(f"aio{i}".encode() for i in range(30))


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is not installed (scripts/system-deps.sh installs it)")
def test_kcat_lists_produces_and_consumes(cluster):
    """Claim: kcat -L names the brokers by their Kafka ports and the topic's partitions; -P then
    -C -e round-trips the lines exactly."""
    topic = "kcat-lines"
    cluster.create_topic(topic, partitions=1)
    listing = subprocess.run(["kcat", "-b", cluster.kafka_bootstrap, "-L", "-t", topic],
                             capture_output=True, text=True, timeout=30)
    assert listing.returncode == 0, listing.stderr
    for b in cluster.brokers.values():
        assert f"127.0.0.1:{b.kafka_port}" in listing.stdout
    assert f'topic "{topic}" with 1 partitions' in listing.stdout
    lines = [f"line {i}" for i in range(25)]
    put = subprocess.run(["kcat", "-b", cluster.kafka_bootstrap, "-P", "-t", topic, "-p", "0"],
                         input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=30)
    assert put.returncode == 0, put.stderr
    got = subprocess.run(["kcat", "-b", cluster.kafka_bootstrap, "-C", "-t", topic, "-p", "0", "-o", "beginning",
                          "-e", "-q"], capture_output=True, text=True, timeout=30)
    assert got.returncode == 0, got.stderr
    assert got.stdout.splitlines() == lines


# ---------------------------------------------------------------- bad input


def _frame(api_key: int, version: int, correlation_id: int, rest: bytes = b"") -> bytes:
    payload = struct.pack(">hhih", api_key, version, correlation_id, -1) + rest
    return struct.pack(">i", len(payload)) + payload


def _exchange(port: int, data: bytes, *, timeout_s: float = 5) -> bytes:
    """Send data, return what comes back until the peer closes or goes quiet."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
        s.sendall(data)
        out = b""
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                out += chunk
        except socket.timeout:
            pass
        return out


def _api_versions_works(port: int) -> None:
    answer = _exchange(port, _frame(18, 0, 99), timeout_s=2)
    assert len(answer) > 10 and struct.unpack_from(">ii", answer) [1] == 99, answer[:40]
    assert struct.unpack_from(">h", answer, 8)[0] == 0  # error_code NONE


def test_an_unsupported_api_versions_version_gets_the_v0_answer_with_error_35(cluster):
    """Claim: ApiVersions at a version not served is answered (v0 header and body) with
    UNSUPPORTED_VERSION and the served ranges, never a disconnect (Kafka's rule)."""
    port = cluster.brokers[1].kafka_port
    answer = _exchange(port, _frame(18, 77, 5), timeout_s=2)
    size, correlation_id, error_code = struct.unpack_from(">iih", answer)
    assert (correlation_id, error_code) == (5, 35) and size == len(answer) - 4
    assert struct.unpack_from(">i", answer, 10)[0] >= 6  # the list of API keys follows


@pytest.mark.parametrize("data,why", [
    (_frame(999, 0, 1), "unknown API key"),
    (_frame(1, 99, 1), "fetch version out of range"),
    (_frame(3, 4, 1, b"\xff\xff\xff\x7f"), "metadata body cut short"),
    (struct.pack(">i", 3) + b"abc", "shorter than a header"),
    (struct.pack(">i", 2**31 - 1) + b"x" * 10, "oversized frame"),
    (struct.pack(">i", -5), "negative size"),
])
def test_bad_frames_close_only_their_own_connection(cluster, data, why):
    """Claim: a frame that cannot be answered closes its connection (the WARNING names the peer),
    and the broker keeps serving other connections."""
    port = cluster.brokers[2].kafka_port
    with socket.create_connection(("127.0.0.1", port), timeout=5) as bystander:
        assert _exchange(port, data) == b"", why
        bystander.sendall(_frame(18, 0, 7))
        assert struct.unpack_from(">ii", bystander.recv(65536))[1] == 7
    _api_versions_works(port)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(api_key=st.sampled_from([0, 1, 2, 3, 18, 22]), version=st.integers(-1, 12),
       body=st.binary(max_size=200))
def test_fuzzed_requests_get_an_answer_or_a_closed_connection(cluster, api_key, version, body):
    """Claim: any bytes after a valid-looking header get an answer or a closed connection,
    never a hang or a dead broker."""
    port = cluster.brokers[3].kafka_port
    _exchange(port, _frame(api_key, version, 3, body), timeout_s=1)
    _api_versions_works(port)


def test_process_logs_name_the_refused_frames(cluster):
    """The refusals above are WARNINGs that say why, never ERRORs or tracebacks (the log check
    after each test enforces the second half)."""
    text = "".join(Path(b.log_path).read_text(errors="replace") for b in cluster.brokers.values())
    assert "Kafka request refused: API key 999" in text
    assert "Traceback" not in text


def test_leader_killed_under_an_idempotent_confluent_kafka_producer_loses_and_duplicates_nothing(tmp_path):
    """Claim: with librdkafka's idempotent producer (acks=all) sending throughout, kill -9 of the
    partition's leader and its restart lose no acknowledged record and write none twice; every
    acknowledged record is at the offset it was acknowledged with."""
    with Cluster(tmp_path / "kill", brokers=3) as c:
        topic = "ck-kill"
        c.create_topic(topic, partitions=1, config={"min_insync_replicas": 2})
        c.wait_leader(topic, 0)
        producer = confluent_kafka.Producer({"bootstrap.servers": c.kafka_bootstrap, "enable.idempotence": True,
                                             "linger.ms": 5, "message.timeout.ms": 60_000})
        acked: dict[bytes, int] = {}
        failed: list = []

        def on_delivery(err, msg):
            if err is not None:
                failed.append(err)
            else:
                acked[msg.value()] = msg.offset()
        sent = 0
        deadline = time.monotonic() + 8
        killed = False
        leader = -1
        while time.monotonic() < deadline:
            producer.produce(topic, value=f"r{sent}".encode(), on_delivery=on_delivery)
            sent += 1
            producer.poll(0.002)
            if not killed and len(acked) >= 200:  # acknowledged under the first leader
                leader = c.partition(topic, 0)["leader"]  # now: leadership may have moved since creation
                c.brokers[leader].kill()
                killed = True
        c.wait_leader(topic, 0, not_broker=leader)
        c.brokers[leader].start()
        assert producer.flush(60) == 0
        assert failed == [], failed[:5]
        assert len(acked) == sent
        got = _consume_all(c.kafka_bootstrap, topic, 1, sent, timeout_s=60)
        values = [v for _, _, v, _ in got]
        assert len(values) == len(set(values)), "a record was written twice"
        assert {v: o for _, o, v, _ in got} == acked
        # The mechanism: records were acknowledged in a later leader epoch too (its epoch-start
        # control batch is an offset the consumer skips, past the first one at offset 0).
        offsets = sorted(acked.values())
        assert any(b - a > 1 for a, b in zip(offsets, offsets[1:])), "the leader never changed under the producer"
