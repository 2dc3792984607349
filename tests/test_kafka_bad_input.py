"""Bad input on the Kafka port: each bad request gets a clear error answer or closes its
own connection (with a WARNING naming the peer, never a traceback), and the broker keeps
serving other connections, including one opened before the bad input and held open."""
from __future__ import annotations

import dataclasses
import datetime
import struct
from typing import Any, Iterator

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from kio.static import primitive

from cluster_harness import Cluster
from dataplane.kafka import messages
from kafka_socket import KafkaSocket

pytestmark = pytest.mark.slow

MAX_FRAME_BYTES = 1 << 20


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("kafka-bad"), brokers=1,
                 broker_args=["--max-frame-bytes", str(MAX_FRAME_BYTES)]) as c:
        c.create_topic("t", partitions=1, replication_factor=1)
        yield c


@pytest.fixture(scope="module")
def bystander(cluster: Cluster) -> Iterator[KafkaSocket]:
    """A connection opened before any bad input and kept open: it must keep being served."""
    s = KafkaSocket(cluster.brokers[1].kafka_port)
    yield s
    s.close()


def still_served(cluster: Cluster, bystander: KafkaSocket) -> None:
    assert bystander.call(3, 8, {"topics": [{"name": "t"}]}).topics[0].name == "t"
    fresh = KafkaSocket(cluster.brokers[1].kafka_port)
    try:
        assert fresh.call(18, 3, {"client_software_name": "t", "client_software_version": "1"}).error_code == 0
    finally:
        fresh.close()


def test_api_versions_of_an_unknown_version_answers_v0_with_error_35(cluster: Cluster,
                                                                     bystander: KafkaSocket) -> None:
    s = KafkaSocket(cluster.brokers[1].kafka_port)
    try:
        s.send_frame(s.header(18, 99, flexible=True) + b"\0\0\0")
        payload = s.read_frame()
        assert payload is not None
        response = messages.response_schema(18, 0)
        header, used = messages.decode(response.__header_schema__, payload)
        body = messages.decode(response, payload, used)[0]
        assert header.correlation_id == s.correlation_id and body.error_code == 35
        assert {k.api_key: (k.min_version, k.max_version) for k in body.api_keys}[0] == (0, 8)
        # The connection stays open: the client retries with a version from the list.
        assert s.call(18, 0, {}).error_code == 0
    finally:
        s.close()
    still_served(cluster, bystander)


@pytest.mark.parametrize("api_key,version", [(10, 0), (9999, 0), (-1, 0), (3, 99), (1, 3), (3, -1)])
def test_unknown_api_or_version_closes_only_its_connection(cluster: Cluster, bystander: KafkaSocket,
                                                           api_key: int, version: int) -> None:
    s = KafkaSocket(cluster.brokers[1].kafka_port)
    try:
        s.send_frame(s.header(api_key, version) + b"\0" * 16)
        assert s.closed_by_broker()
    finally:
        s.close()
    still_served(cluster, bystander)
    log = cluster.brokers[1].log_path.read_text()
    assert f"API key {api_key}" in log and "closing connection from 127.0.0.1" in log


def test_old_produce_versions_and_transactions_get_clear_errors(cluster: Cluster, bystander: KafkaSocket) -> None:
    s = KafkaSocket(cluster.brokers[1].kafka_port)
    try:
        # kio has no schemas for Produce 0-2: v3's body without its transactional id.
        v3 = messages.encode(messages.build(messages.request_schema(0, 3), {"acks": 1, "timeout": 1000,
            "topic_data": [{"name": "t", "partition_data": [{"index": 3, "records": b""}]}]}))
        assert v3[:2] == b"\xff\xff"
        for version in (0, 1, 2):
            s.send_frame(s.header(0, version) + v3[2:])
            payload = s.read_frame()
            assert payload is not None
            # correlation id, 1 topic "t", 1 partition: index 3, UNSUPPORTED_VERSION (35), base offset -1
            assert payload.startswith(struct.pack(">ii", s.correlation_id, 1) + b"\0\1t" +
                                      struct.pack(">iihq", 1, 3, 35, -1))
            assert len(payload) == 4 + 4 + 3 + 4 + 14 + (4 if version >= 1 else 0) + (8 if version >= 2 else 0)
        answer = s.call(0, 8, {"transactional_id": "tx", "acks": -1, "timeout": 1000, "topic_data": [
            {"name": "t", "partition_data": [{"index": 0, "records": b""}]}]})
        partition = answer.responses[0].partition_responses[0]
        assert partition.error_code == 42 and "transactions are not supported" in partition.error_message
        assert s.call(22, 1, {"transactional_id": "tx", "transaction_timeout": 1000,
                              "producer_id": -1, "producer_epoch": -1}).error_code == 42
        # Garbage records go through the admission path and are refused there, not here.
        answer = s.call(0, 8, {"acks": -1, "timeout": 1000, "topic_data": [
            {"name": "t", "partition_data": [{"index": 0, "records": b"\0" * 70}]}]})
        assert answer.responses[0].partition_responses[0].error_code == 2  # CORRUPT_MESSAGE
    finally:
        s.close()
    still_served(cluster, bystander)


def test_oversized_and_truncated_frames_close_their_connection(cluster: Cluster, bystander: KafkaSocket) -> None:
    port = cluster.brokers[1].kafka_port
    oversized = KafkaSocket(port)
    oversized.sock.sendall(struct.pack(">i", MAX_FRAME_BYTES + 1) + b"\0" * 100)
    assert oversized.closed_by_broker()
    oversized.close()
    for size in (0, 3, 7):  # shorter than a request header
        short = KafkaSocket(port)
        short.send_frame(struct.pack(">hhi", 18, 0, 1)[:size])
        assert short.closed_by_broker()
        short.close()
    truncated = KafkaSocket(port)
    body = truncated.header(0, 8) + struct.pack(">hhi", -1, -1, 1000) + struct.pack(">i", 1) + b"\0\1t"
    truncated.send_frame(body)  # the topic array promises partitions the frame does not hold
    assert truncated.closed_by_broker()
    truncated.close()
    half = KafkaSocket(port)
    half.sock.sendall(struct.pack(">i", 100) + b"\0" * 10)  # the peer leaves inside a frame
    half.close()
    still_served(cluster, bystander)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(api_key=st.sampled_from([0, 1, 2, 3, 18, 22, 23]), version=st.integers(0, 12),
       flexible=st.booleans(), body=st.binary(max_size=200))
def test_fuzzed_frames_are_answered_or_close_their_connection(cluster: Cluster, bystander: KafkaSocket,
                                                              api_key: int, version: int, flexible: bool,
                                                              body: bytes) -> None:
    s = KafkaSocket(cluster.brokers[1].kafka_port)
    try:
        s.send_frame(s.header(api_key, version, flexible=flexible) + body)
        payload = s.read_frame()
        if payload is not None:
            assert struct.unpack_from(">i", payload)[0] == s.correlation_id
    finally:
        s.close()
    assert bystander.call(18, 0, {}).error_code == 0


def _aim(value: Any) -> Any:
    """The same request about topic "t" partition 0, so that it reaches a real partition."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {}
        for f in dataclasses.fields(value):
            v = getattr(value, f.name)
            if f.name in ("name", "topic") and isinstance(v, str):
                changes[f.name] = "t"
            elif f.name in ("partition", "partition_index", "index") and isinstance(v, int):
                changes[f.name] = 0
            else:
                changes[f.name] = _aim(v)
        return dataclasses.replace(value, **changes)
    if isinstance(value, tuple):
        return tuple(_aim(v) for v in value)
    return value


# kio gives no strategy for record batches: any bytes (the admission path refuses them).
st.register_type_strategy(primitive.Records, st.binary(max_size=80))

SERVED = [(key, version) for key, low, high in ((0, 3, 8), (1, 4, 11), (2, 1, 5), (3, 0, 8), (18, 0, 3),
                                                (22, 0, 1), (23, 2, 3)) for version in range(low, high + 1)]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data(), which=st.sampled_from(SERVED), aimed=st.booleans())
def test_well_formed_requests_with_any_values_are_answered(cluster: Cluster, bystander: KafkaSocket,
                                                            data: st.DataObject, which: tuple[int, int],
                                                            aimed: bool) -> None:
    """Requests that parse, with values drawn from their whole schema (kio's strategies): each
    is answered on a connection that then goes on serving (acks=0 produce: unanswered, and a
    refused one closes its connection, as Kafka does, while the broker serves a new one)."""
    api_key, version = which
    schema = messages.request_schema(api_key, version)
    body = data.draw(st.from_type(schema))
    if api_key == 1:
        body = dataclasses.replace(body, max_wait=datetime.timedelta(milliseconds=0))  # no waits: time
    if aimed:
        body = _aim(body)
    s = KafkaSocket(cluster.brokers[1].kafka_port)
    try:
        flexible = ".v2." in schema.__header_schema__.__module__
        s.send_frame(s.header(api_key, version, flexible=flexible) + messages.encode(body))
        sent = s.correlation_id
        if api_key == 0 and body.acks == 0:
            # Unanswered; a partition's refusal closes the connection (Kafka's only way to tell
            # an acks=0 producer), so the broker must go on serving a new one.
            s.send_frame(s.header(18, 0) + messages.encode(messages.build(messages.request_schema(18, 0), {})))
            if s.read_frame() is None:
                s.close()
                s = KafkaSocket(cluster.brokers[1].kafka_port)
        else:
            payload = s.read_frame()
            assert payload is not None, f"API {api_key} v{version}: connection closed"
            assert struct.unpack_from(">i", payload)[0] == sent
        assert s.call(18, 0, {}).error_code == 0
    finally:
        s.close()
