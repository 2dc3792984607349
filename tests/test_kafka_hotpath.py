"""The hand-written Produce request reader, Produce and Fetch response writers
(dataplane/kafka/hotpath.py) and response headers (protocol.py) agree with kio's encoding of
the same values, byte for byte, and keep records as views."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from common.errors import ErrorCode
from common.wire import messages as wire
from dataplane.kafka import hotpath, messages, protocol
from dataplane.kafka.registry import Encoded

names = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=20)
records = st.one_of(st.none(), st.binary(max_size=200))
produce_topics = st.lists(st.tuples(names, st.lists(st.tuples(st.integers(0, 2**31 - 1), records), max_size=3)),
                          max_size=3)


def _produce_frame(version: int, transactional_id: str | None, acks: int, timeout_ms: int,
                   topics: list[tuple[str, list[tuple[int, bytes | None]]]]) -> tuple[bytearray, int]:
    schema = messages.request_schema(0, version)
    header = messages.encode(messages.build(schema.__header_schema__, {
        "request_api_key": 0, "request_api_version": version, "correlation_id": 5, "client_id": "c"}))
    body = messages.encode(messages.build(schema, {
        "transactional_id": transactional_id, "acks": acks, "timeout": timeout_ms,
        "topic_data": [{"name": n, "partition_data": [{"index": i, "records": r} for i, r in ps]}
                       for n, ps in topics]}))
    return bytearray(header + body), len(header)


@settings(max_examples=150, deadline=None)
@given(version=st.integers(3, 8), transactional_id=st.one_of(st.none(), names),
       acks=st.sampled_from([-1, 0, 1]), timeout_ms=st.integers(0, 2**31 - 1), topics=produce_topics)
def test_produce_reader_reads_what_kio_wrote(version, transactional_id, acks, timeout_ms, topics):
    frame, start = _produce_frame(version, transactional_id, acks, timeout_ms, topics)
    body = hotpath.read_produce(frame, start, version)
    assert (body.transactional_id, body.acks, body.timeout_ms) == (transactional_id, acks, timeout_ms)
    assert [(t.name, [(p.index, None if p.records is None else bytes(p.records)) for p in t.partition_data])
            for t in body.topic_data] == topics


def test_produce_records_are_views_into_the_frame():
    """Zero copy: a write into the frame shows through the records the reader returned."""
    frame, start = _produce_frame(8, None, -1, 1000, [("t", [(0, b"abcdef")])])
    view = hotpath.read_produce(frame, start, 8).topic_data[0].partition_data[0].records
    assert view is not None and view.obj is frame and not view.readonly
    frame[-1] = ord("Z")
    assert bytes(view) == b"abcdeZ"


def test_produce_reader_refuses_every_truncation_and_trailing_bytes():
    frame, start = _produce_frame(7, "tx", 1, 10, [("topic", [(0, b"x" * 30), (1, None)])])
    for cut in range(start, len(frame)):
        with pytest.raises(hotpath.BodyError):
            hotpath.read_produce(frame[:cut], start, 7)
    with pytest.raises(hotpath.BodyError, match="1 bytes after"):
        hotpath.read_produce(frame + b"\0", start, 7)


def test_produce_reader_does_not_believe_a_huge_array_count():
    frame = bytearray(b"\xff\xff" + b"\xff\xff" + b"\0\0\0\1" + b"\x7f\xff\xff\xff")
    with pytest.raises(hotpath.BodyError, match="cannot fit"):
        hotpath.read_produce(frame, 0, 8)


produce_partitions = st.lists(st.builds(
    wire.ProducePartitionResponse, partition=st.integers(0, 2**31 - 1),
    error_code=st.sampled_from(list(ErrorCode)), base_offset=st.integers(-1, 2**62),
    log_start_offset=st.integers(-1, 2**62), error_message=st.one_of(st.none(), names)), max_size=3)


@settings(max_examples=150, deadline=None)
@given(version=st.integers(3, 8), topics=st.lists(st.tuples(names, produce_partitions), max_size=3))
def test_produce_answer_writer_writes_what_kio_writes(version, topics):
    done = wire.ProduceResponse(topics=tuple(wire.ProduceTopicResponse(topic=n, partitions=tuple(ps))
                                             for n, ps in topics))
    ours = b"".join(bytes(p) for p in hotpath.produce_response(version, done))
    kio = messages.encode(messages.build(messages.response_schema(0, version), {
        "throttle_time": 0, "responses": [{"name": n, "partition_responses": [
            {"index": p.partition, "error_code": int(p.error_code), "base_offset": p.base_offset,
             "log_append_time": -1, "log_start_offset": p.log_start_offset, "error_message": p.error_message}
            for p in ps]} for n, ps in topics]}))
    assert ours == kio


def test_response_headers_are_what_kio_writes_for_every_served_version():
    """Header v0 (correlation id) or v1 (and no tagged fields), as each API version's schema says."""
    from dataplane.kafka import handlers  # noqa: F401  (registers every API)
    from dataplane.kafka.registry import APIS
    assert {0, 1, 3, 18} <= set(APIS)
    for api in APIS.values():
        for version in range(api.advertised_from, api.versions[1] + 1):
            schema = messages.response_header_schema(api.key, version)
            kio = messages.encode(messages.build(schema, {"correlation_id": 123456789}))
            frame = protocol.encode_response(api.key, version, 123456789, Encoded([b"body"]))
            assert frame[0] == (len(kio) + 4).to_bytes(4, "big") + kio, (api.name, version)


fetch_partitions = st.lists(st.builds(
    wire.FetchPartitionResponse, partition=st.integers(0, 2**31 - 1),
    error_code=st.sampled_from([ErrorCode.NONE, ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.OFFSET_OUT_OF_RANGE]),
    high_watermark=st.integers(-1, 2**62), log_start_offset=st.integers(-1, 2**62),
    records=st.binary(max_size=100)), max_size=3)


@settings(max_examples=150, deadline=None)
@given(version=st.integers(4, 11), topics=st.lists(st.tuples(names, fetch_partitions), max_size=3))
def test_fetch_writer_writes_what_kio_writes(version, topics):
    done = wire.FetchResponse(topics=tuple(wire.FetchTopicResponse(topic=n, partitions=tuple(ps))
                                           for n, ps in topics))
    ours = b"".join(bytes(p) for p in hotpath.fetch_response(version, done))
    kio = messages.encode(messages.build(messages.response_schema(1, version), {
        "throttle_time": 0, "error_code": 0, "session_id": 0,
        "responses": [{"topic": n, "partitions": [
            {"partition_index": p.partition, "error_code": int(p.error_code), "high_watermark": p.high_watermark,
             "last_stable_offset": p.high_watermark, "log_start_offset": p.log_start_offset,
             "aborted_transactions": [], "preferred_read_replica": -1, "records": p.records}
            for p in ps]} for n, ps in topics]}))
    assert ours == kio


def test_fetch_records_go_out_as_the_logs_own_buffer():
    log_bytes = memoryview(bytearray(b"r" * 64))
    done = wire.FetchResponse(topics=(wire.FetchTopicResponse(topic="t", partitions=(
        wire.FetchPartitionResponse(partition=0, high_watermark=3, records=log_bytes),)),))
    parts = hotpath.fetch_response(11, done)
    assert any(p is log_bytes for p in parts)
    frame = protocol.encode_response(1, 11, 9, Encoded(parts))
    assert any(p is log_bytes for p in frame)
    assert int.from_bytes(frame[0][:4], "big") == sum(len(p) for p in frame) - 4
