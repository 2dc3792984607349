"""Kafka semantics on the Kafka port, request by request over a raw socket: Metadata at
every version (a live controller, unknown topics), Fetch's leader-epoch checks and
long-poll, ListOffsets, OffsetForLeaderEpoch, and UNKNOWN_PRODUCER_ID for a producer
the partition has never seen."""
from __future__ import annotations

import struct
import time
from typing import Iterator

import pytest

from cluster_harness import Cluster, make_batch
from common.batch import build_batch
from dataplane.kafka import messages
from kafka_socket import KafkaSocket

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    # No preferred-leader elections: the leader stays put while a test talks to it.
    with Cluster(tmp_path_factory.mktemp("kafka-sem"), brokers=3,
                 controller_args=["--leader-imbalance-check-interval-ms", "0"]) as c:
        c.create_topic("t", partitions=1, replication_factor=3)
        # A restart of the first leader moves leadership: epoch >= 1, so an older one exists.
        c.restart(c.wait_leader("t", 0))
        c.wait_leader("t", 0)
        yield c


@pytest.fixture
def leader(cluster: Cluster) -> Iterator[KafkaSocket]:
    s = KafkaSocket(cluster.brokers[cluster.wait_leader("t", 0)].kafka_port)
    yield s
    s.close()


def produce(s: KafkaSocket, records: bytes, *, topic: str = "t") -> tuple[int, int]:
    answer = s.call(0, 8, {"acks": -1, "timeout": 5000, "topic_data": [
        {"name": topic, "partition_data": [{"index": 0, "records": records}]}]})
    p = answer.responses[0].partition_responses[0]
    return int(p.error_code), int(p.base_offset)


@pytest.mark.parametrize("version", range(0, 9))
def test_metadata_names_a_live_controller_and_unknown_topics(cluster: Cluster, version: int) -> None:
    s = KafkaSocket(cluster.brokers[2].kafka_port)
    try:
        body = {"topics": [{"name": "t"}, {"name": "nope"}, {"name": "bad name"}], "allow_auto_topic_creation": False}
        answer = s.call(3, version, body)
    finally:
        s.close()
    brokers = {b.node_id: b.port for b in answer.brokers}
    assert brokers == {i: b.kafka_port for i, b in cluster.brokers.items()}
    if version >= 1:
        assert answer.controller_id in brokers
    by_name = {t.name: t for t in answer.topics}
    assert by_name["nope"].error_code == 3  # UNKNOWN_TOPIC_OR_PARTITION
    assert by_name["bad name"].error_code == 17  # INVALID_TOPIC_EXCEPTION: no such topic could exist
    partition = by_name["t"].partitions[0]
    assert by_name["t"].error_code == 0 and partition.leader_id == cluster.wait_leader("t", 0)
    assert sorted(partition.replica_nodes) == [1, 2, 3]
    if version >= 7:
        assert partition.leader_epoch == cluster.partition("t", 0)["leader_epoch"]


def test_fetch_checks_the_clients_leader_epoch_and_long_polls(cluster: Cluster, leader: KafkaSocket) -> None:
    epoch = cluster.partition("t", 0)["leader_epoch"]
    assert epoch >= 1
    error, base = produce(leader, make_batch([b"a", b"b"]))
    assert error == 0

    def fetch(version: int, current_leader_epoch: int, offset: int, *, max_wait: int = 0, min_bytes: int = 1):
        return leader.call(1, version, {"replica_id": -1, "max_wait": max_wait, "min_bytes": min_bytes,
                                        "max_bytes": 1 << 20, "isolation_level": 1, "topics": [
            {"topic": "t", "partitions": [{"partition": 0, "current_leader_epoch": current_leader_epoch,
                                           "fetch_offset": offset, "log_start_offset": -1,
                                           "partition_max_bytes": 1 << 20}]}]}).responses[0].partitions[0]

    for version in range(4, 12):
        p = fetch(version, epoch if version >= 9 else -1, base)
        assert p.error_code == 0 and p.high_watermark == base + 2 and p.last_stable_offset == base + 2
        assert p.records is not None and b"a" in p.records and b"b" in p.records
    assert fetch(11, epoch - 1, base).error_code == 74  # FENCED_LEADER_EPOCH
    assert fetch(11, epoch + 1, base).error_code == 75  # UNKNOWN_LEADER_EPOCH
    assert fetch(11, epoch, base + 1000).error_code == 1  # OFFSET_OUT_OF_RANGE
    started = time.monotonic()
    p = fetch(11, epoch, base + 2, max_wait=400)
    assert time.monotonic() - started >= 0.35 and p.error_code == 0 and not p.records
    # min_bytes: records below it wait out max_wait (then come anyway); at or above it, at once.
    started = time.monotonic()
    p = fetch(11, epoch, base, max_wait=400, min_bytes=1 << 16)  # the broker caps waits at 500 ms
    assert time.monotonic() - started >= 0.35 and p.records is not None and b"a" in p.records
    started = time.monotonic()
    p = fetch(11, epoch, base, max_wait=5000, min_bytes=len(p.records))
    assert time.monotonic() - started < 2 and b"a" in p.records


def test_list_offsets_and_offset_for_leader_epoch(cluster: Cluster, leader: KafkaSocket) -> None:
    epoch = cluster.partition("t", 0)["leader_epoch"]
    error, base = produce(leader, make_batch([b"x"]))
    assert error == 0
    for version in range(1, 6):
        answer = leader.call(2, version, {"replica_id": -1, "isolation_level": 0, "topics": [
            {"name": "t", "partitions": [{"partition_index": 0, "current_leader_epoch": -1, "timestamp": ts}
                                         for ts in (-1, -2)]}]})
        latest, earliest = answer.topics[0].partitions
        assert latest.error_code == 0 and latest.offset == base + 1
        assert earliest.error_code == 0 and earliest.offset == 0
    # The max-timestamp spec (-3) belongs to v7, not served: librdkafka sends it at v5 anyway.
    answer = leader.call(2, 5, {"replica_id": -1, "isolation_level": 0, "topics": [
        {"name": "t", "partitions": [{"partition_index": 0, "current_leader_epoch": -1, "timestamp": -3}]}]})
    assert answer.topics[0].partitions[0].error_code == 35   # UNSUPPORTED_VERSION
    for version in (2, 3):
        answer = leader.call(23, version, {"replica_id": -1, "topics": [
            {"topic": "t", "partitions": [{"partition": 0, "current_leader_epoch": epoch,
                                           "leader_epoch": epoch}]}]})
        p = answer.topics[0].partitions[0]
        assert (p.error_code, p.leader_epoch, p.end_offset) == (0, epoch, base + 1)
    stale = leader.call(23, 3, {"replica_id": -1, "topics": [{"topic": "t", "partitions": [
        {"partition": 0, "current_leader_epoch": epoch - 1, "leader_epoch": epoch}]}]})
    assert stale.topics[0].partitions[0].error_code == 74


def test_an_unknown_idempotent_producer_gets_unknown_producer_id(cluster: Cluster, leader: KafkaSocket) -> None:
    ids = leader.call(22, 1, {"transactional_id": None, "transaction_timeout": 1000,
                              "producer_id": -1, "producer_epoch": -1})
    assert ids.error_code == 0 and ids.producer_id >= 0

    def batch(sequence: int) -> bytes:
        return build_batch([b"i"], timestamp_ms=int(time.time() * 1000), producer_id=ids.producer_id,
                           producer_epoch=ids.producer_epoch, base_sequence=sequence)

    assert produce(leader, batch(5))[0] == 59  # UNKNOWN_PRODUCER_ID: its state is not here
    assert produce(leader, batch(0))[0] == 0
    assert produce(leader, batch(2))[0] == 45  # OUT_OF_ORDER_SEQUENCE_NUMBER


def test_pipelined_requests_are_answered_in_order(cluster: Cluster, leader: KafkaSocket) -> None:
    """A long-poll fetch, then requests that are ready at once, on one connection: the
    answers come in request order (Kafka's rule), the quick ones after the slow one."""
    epoch = cluster.partition("t", 0)["leader_epoch"]
    _, base = produce(leader, make_batch([b"p"]))
    fetch = messages.encode(messages.build(messages.request_schema(1, 11), {
        "replica_id": -1, "max_wait": 400, "min_bytes": 1, "max_bytes": 1 << 20, "topics": [
            {"topic": "t", "partitions": [{"partition": 0, "current_leader_epoch": epoch, "fetch_offset": base + 1,
                                           "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}]}))
    metadata = messages.encode(messages.build(messages.request_schema(3, 8), {"topics": None}))
    versions = messages.encode(messages.build(messages.request_schema(18, 0), {}))
    sent = []
    for api_key, version, body in ((1, 11, fetch), (3, 8, metadata), (18, 0, versions)):
        leader.send_frame(leader.header(api_key, version) + body)
        sent.append(leader.correlation_id)
    started = time.monotonic()
    answered = []
    for _ in sent:
        payload = leader.read_frame()
        assert payload is not None
        answered.append((struct.unpack_from(">i", payload)[0], time.monotonic() - started))
    assert [c for c, _ in answered] == sent
    assert answered[0][1] >= 0.3  # the fetch did long-poll, and the others waited behind it


def test_an_acks_0_produce_refused_closes_its_connection(cluster: Cluster, leader: KafkaSocket) -> None:
    """Kafka's rule: acks=0 gets no answer, so a refusal (here: not the leader) closes the
    connection, and the producer refreshes its metadata; an accepted one keeps it open."""
    def acks_0(s: KafkaSocket) -> None:
        s.send_frame(s.header(0, 8) + messages.encode(messages.build(messages.request_schema(0, 8), {
            "acks": 0, "timeout": 1000, "topic_data": [
                {"name": "t", "partition_data": [{"index": 0, "records": make_batch([b"zero"])}]}]})))

    acks_0(leader)
    assert leader.call(18, 0, {}).error_code == 0  # still open, and no answer came before this one
    follower_id = next(b for b in cluster.brokers if b != cluster.wait_leader("t", 0))
    follower = KafkaSocket(cluster.brokers[follower_id].kafka_port)
    try:
        assert follower.call(18, 0, {}).error_code == 0
        acks_0(follower)
        assert follower.closed_by_broker()
    finally:
        follower.close()
    log = cluster.brokers[follower_id].log_path.read_text()
    assert "acks=0 produce refused: t-0: NOT_LEADER_OR_FOLLOWER" in log
