"""Wire protocol: frames, body codec, every message, and a real loopback server."""
from __future__ import annotations

import asyncio
import logging
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.batch import build_batch, validate_batch
from common.errors import ErrorCode, FrameTooLargeError, InvalidRequestError, ProtocolError
from common.wire import (
    ApiKey,
    ApiVersionsRequest,
    AppendEntriesRequest,
    ConnectionClosedError,
    AppendEntriesResponse,
    FetchPartitionResponse,
    FetchResponse,
    FetchTopicResponse,
    FrameDecoder,
    MetadataRequest,
    MetadataResponse,
    ProducePartition,
    ProduceRequest,
    ProduceTopic,
    REQUEST_TYPES,
    RESPONSE_TYPES,
    WireClient,
    api_versions_response,
    decode_request,
    decode_response,
    encode_frame,
    encode_request,
    encode_response,
    start_server,
    struct_fields,
)
from common.wire import codec

FUZZ = settings(max_examples=300, deadline=2000, suppress_health_check=[HealthCheck.too_slow])


# ------------------------------------------------ strategies from the field tables


def strategy_for(ftype) -> st.SearchStrategy:
    if ftype is codec.INT8:
        return st.integers(-(1 << 7), (1 << 7) - 1)
    if ftype is codec.INT16:
        return st.integers(-(1 << 15), (1 << 15) - 1)
    if ftype is codec.INT32:
        return st.integers(-(1 << 31), (1 << 31) - 1)
    if ftype is codec.INT64:
        return st.integers(-(1 << 63), (1 << 63) - 1)
    if ftype is codec.BOOL:
        return st.booleans()
    if ftype is codec.ERROR_CODE:
        return st.sampled_from(list(ErrorCode))
    if ftype is codec.STRING:
        return st.text(max_size=12)
    if ftype is codec.NULLABLE_STRING:
        return st.none() | st.text(max_size=12)
    if ftype in (codec.BYTES, codec.RECORDS):
        return st.none() | st.binary(max_size=40)
    if isinstance(ftype, codec.Array):
        items = st.lists(strategy_for(ftype.item), max_size=3).map(tuple)
        return st.none() | items if ftype.nullable else items
    if isinstance(ftype, codec.StructCodec):
        return message_strategy(ftype.cls)
    raise AssertionError(f"no strategy for {ftype!r}")


def message_strategy(cls) -> st.SearchStrategy:
    return st.builds(cls, **{name: strategy_for(ftype) for name, ftype in struct_fields(cls)})


ALL_REQUESTS = st.one_of(*[message_strategy(cls) for cls in REQUEST_TYPES.values()])
ALL_RESPONSES = st.one_of(*[message_strategy(cls) for cls in RESPONSE_TYPES.values()])


def payload_of(parts) -> bytes:
    frame = b"".join(parts)
    assert struct.unpack_from(">i", frame)[0] == len(frame) - 4
    return frame[4:]


# ------------------------------------------------------------------- round trips


@given(ALL_REQUESTS, st.integers(0, (1 << 31) - 1))
@settings(max_examples=400, deadline=2000)
def test_every_request_round_trips(request, correlation_id):
    header, decoded = decode_request(payload_of(encode_request(request, correlation_id=correlation_id)))
    assert decoded == request and type(decoded) is type(request)
    assert header.correlation_id == correlation_id
    assert REQUEST_TYPES[ApiKey(header.api_key)] is type(request)


@given(ALL_RESPONSES, st.integers(0, (1 << 31) - 1))
@settings(max_examples=400, deadline=2000)
def test_every_response_round_trips(response, correlation_id):
    key = next(k for k, cls in RESPONSE_TYPES.items() if cls is type(response))
    got_id, decoded = decode_response(payload_of(encode_response(response, correlation_id=correlation_id)), key)
    assert decoded == response and got_id == correlation_id


@given(ALL_REQUESTS | ALL_RESPONSES, st.data())
@settings(max_examples=300, deadline=2000)
def test_compiled_decoders_agree_with_the_general_one_on_values_and_errors(message, data):
    """Each struct's decode is compiled to straight-line code (StructCodec._compiled_decode);
    the general loop over its steps, all the way down, is the reference. Same value from a
    valid body; from a cut or altered one, the same error, with the same field path."""
    struct_codec = codec.codec_of(type(message))
    body = bytearray(codec.encode(message))
    if data.draw(st.booleans()) and body:
        if data.draw(st.booleans()):
            del body[data.draw(st.integers(0, len(body) - 1)):]
        else:
            body[data.draw(st.integers(0, len(body) - 1))] = data.draw(st.integers(0, 255))

    def outcome(decode):
        try:
            return decode(memoryview(bytes(body)), 0, len(body))
        except codec._FieldError as exc:
            return ("error", exc.message, list(exc.path))
    compiled = outcome(struct_codec.decode)
    with codec.general_decoding(type(message)):
        general = outcome(struct_codec.decode)
    assert compiled == general
    assert struct_codec.decode.__code__.co_filename == f"<decode {type(message).__name__}>"


def test_every_api_has_request_and_response_types():
    assert set(REQUEST_TYPES) == set(RESPONSE_TYPES) == set(ApiKey)
    assert {v.api_key for v in api_versions_response().api_keys} == {int(k) for k in ApiKey}


def test_records_cross_the_wire_without_decoding_or_copy():
    """A batch goes out as one frame part (the caller's object) and comes back as a view into the frame."""
    batch = build_batch([b"a" * 100, b"b" * 100], timestamp_ms=1)
    request = AppendEntriesRequest(leader_id=1, follower_id=2, leader_epoch=4, topic="t", partition=0,
                                   prev_log_offset=9, prev_log_epoch=3, high_watermark=7,
                                   flush_after_append=True, records=batch)
    parts = encode_request(request, correlation_id=1)
    assert any(part is batch for part in parts)
    _, decoded = decode_request(payload_of(parts))
    assert isinstance(decoded.records, memoryview) and decoded.records == batch
    assert validate_batch(decoded.records).record_count == 2


def test_nullable_array_distinguishes_none_from_empty():
    for topics in (None, (), ("a", "b")):
        _, decoded = decode_request(payload_of(encode_request(MetadataRequest(topics=topics), correlation_id=1)))
        assert decoded.topics == topics


def test_encoding_out_of_range_names_the_field():
    with pytest.raises(InvalidRequestError, match=r"ProducePartition\.partition: value 4294967296 does not fit int32"):
        encode_request(ProduceRequest(topics=(ProduceTopic(topic="t", partitions=(
            ProducePartition(partition=1 << 32),)),)), correlation_id=1)
    with pytest.raises(TypeError, match="response, not a request"):
        encode_request(FetchResponse(), correlation_id=1)


# ------------------------------------------------------------------ body errors


def fetch_response_payload() -> bytes:
    response = FetchResponse(topics=(FetchTopicResponse(topic="orders", partitions=(
        FetchPartitionResponse(partition=3, records=b"x" * 10),)),))
    return payload_of(encode_response(response, correlation_id=5))


def test_hostile_count_is_bounded_and_named():
    payload = bytearray(fetch_response_payload())
    # correlation id 4, error_code 2, session_id 4: the topics count follows
    struct.pack_into(">i", payload, 10, 0x7FFFFFFF)
    with pytest.raises(ProtocolError, match=r"FETCH v0 response: field topics: array count 2147483647 invalid"):
        decode_response(payload, ApiKey.FETCH)


def test_bad_length_deep_inside_names_the_path():
    payload = bytearray(fetch_response_payload())
    records_length_at = len(payload) - 4 - 10 - 4  # before records bytes and throttle_time_ms
    struct.pack_into(">i", payload, records_length_at, 1000)
    with pytest.raises(ProtocolError, match=r"topics\[0\]\.partitions\[0\]\.records: bytes length 1000 invalid"):
        decode_response(payload, ApiKey.FETCH)


def test_unknown_api_unsupported_version_bad_enum_and_trailing_bytes():
    with pytest.raises(ProtocolError, match="unknown api_key 77"):
        decode_request(struct.pack(">hhi", 77, 0, 1))
    with pytest.raises(ProtocolError, match="FETCH version 9 is not supported"):
        decode_request(struct.pack(">hhi", 1, 9, 1))
    body = payload_of(encode_response(api_versions_response(), correlation_id=1))
    with pytest.raises(ProtocolError, match="unknown error code 12345"):
        decode_response(body[:4] + struct.pack(">h", 12345) + body[6:], ApiKey.API_VERSIONS)
    with pytest.raises(ProtocolError, match="3 trailing bytes"):
        decode_response(body + b"abc", ApiKey.API_VERSIONS)
    with pytest.raises(ProtocolError, match="shorter than its 8-byte header"):
        decode_request(b"\x00\x01")


@given(st.integers(0, 1100), st.binary(max_size=200))
@FUZZ
def test_fuzzed_request_bodies_only_raise_protocol_error(api_key, body):
    """Any bytes after any header decode to a request or raise ProtocolError, nothing else."""
    try:
        decode_request(struct.pack(">hhi", api_key, 0, 1) + body)
    except ProtocolError:
        pass


@given(st.sampled_from(list(ApiKey)), st.binary(max_size=200))
@FUZZ
def test_fuzzed_response_bodies_only_raise_protocol_error(api_key, body):
    try:
        decode_response(struct.pack(">i", 1) + body, api_key)
    except ProtocolError:
        pass


@given(st.data())
@FUZZ
def test_mutated_valid_requests_only_raise_protocol_error(data):
    """Valid encodings with random byte edits or cuts decode or raise ProtocolError."""
    payload = bytearray(payload_of(encode_request(data.draw(ALL_REQUESTS), correlation_id=1)))
    for _ in range(data.draw(st.integers(1, 4))):
        payload[data.draw(st.integers(0, len(payload) - 1))] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(payload)))
    try:
        decode_request(bytes(payload[:cut]))
    except ProtocolError:
        pass


# ------------------------------------------------------------------------ frames


def frames_stream(payloads):
    return b"".join(b"".join(encode_frame([p])) for p in payloads)


@given(st.lists(st.binary(min_size=1, max_size=300), max_size=8), st.data())
@settings(max_examples=300, deadline=2000)
def test_decoder_recovers_frames_under_any_chunking(payloads, data):
    """Property: however the stream is split, the decoder returns the same frames in order."""
    stream = frames_stream(payloads)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=12)))
    decoder = FrameDecoder(max_frame_bytes=300)
    got = []
    for start, end in zip([0, *cuts], [*cuts, len(stream)]):
        got.extend(decoder.feed(stream[start:end]))
        assert decoder.buffered_bytes <= 4 + 300
    assert got == payloads and decoder.buffered_bytes == 0


@pytest.mark.parametrize("size, error, message", [
    (0, ProtocolError, "frame size 0 is not positive"),
    (-5, ProtocolError, "frame size -5 is not positive"),
    (1025, FrameTooLargeError, "frame size 1025 exceeds max_frame_bytes=1024"),
])
def test_decoder_rejects_bad_sizes_at_once(size, error, message):
    decoder = FrameDecoder(max_frame_bytes=1024)
    assert decoder.feed(frames_stream([b"ok"])) == [b"ok"]
    with pytest.raises(error, match=message):
        decoder.feed(struct.pack(">i", size))  # only the size: the body never has to arrive
    with pytest.raises(error):
        decoder.feed(b"more")  # a failed stream stays failed


def test_read_frame_limits_and_clean_eof():
    from common.wire import read_frame

    async def run():
        reader = asyncio.StreamReader()
        reader.feed_data(frames_stream([b"abc"]) + struct.pack(">i", 1 << 30))
        reader.feed_eof()
        assert await read_frame(reader, 1024) == b"abc"
        with pytest.raises(FrameTooLargeError):
            await read_frame(reader, 1024)
        empty = asyncio.StreamReader()
        empty.feed_eof()
        assert await read_frame(empty, 1024) is None
        torn = asyncio.StreamReader()
        torn.feed_data(struct.pack(">i", 10) + b"abc")
        torn.feed_eof()
        with pytest.raises(ProtocolError, match="3 of 10 bytes"):
            await read_frame(torn, 1024)

    asyncio.run(run())


# ---------------------------------------------------------------- loopback server


async def echo_handler(header, request):
    if header.api_key == ApiKey.API_VERSIONS:
        return api_versions_response()
    if header.api_key == ApiKey.APPEND_ENTRIES:
        return AppendEntriesResponse(follower_id=request.follower_id, leader_epoch=request.leader_epoch,
                                     topic=request.topic, partition=request.partition,
                                     log_end_offset=request.prev_log_offset + 1 + len(request.records))
    if header.api_key == ApiKey.METADATA:
        await asyncio.sleep(0)
        return MetadataResponse(controller_id=len(request.topics or ()))
    return None  # acks=0 produce and anything else: no response


def test_malformed_frame_closes_only_that_connection(caplog):
    """A client sending garbage is disconnected with a WARNING; another client keeps being served."""

    async def run():
        server = await start_server(echo_handler, "127.0.0.1", 0, max_frame_bytes=1 << 16)
        port = server.sockets[0].getsockname()[1]
        try:
            good = await WireClient.connect("127.0.0.1", port)
            assert (await good.request(MetadataRequest(topics=("a",)))).controller_id == 1

            bad_reader, bad_writer = await asyncio.open_connection("127.0.0.1", port)
            bad_writer.write(struct.pack(">i", 1 << 20))  # over the server's max_frame_bytes
            await bad_writer.drain()
            assert await asyncio.wait_for(bad_reader.read(), 5) == b""  # server closed it

            garbled_reader, garbled_writer = await asyncio.open_connection("127.0.0.1", port)
            garbled_writer.writelines(encode_frame([struct.pack(">hhi", 1, 0, 9) + b"\x00\x01"]))
            await garbled_writer.drain()
            assert await asyncio.wait_for(garbled_reader.read(), 5) == b""

            # the first connection is untouched and still pipelines requests
            results = await asyncio.gather(*[
                good.request(AppendEntriesRequest(leader_id=1, follower_id=2, leader_epoch=3, topic="t",
                                                  partition=p, prev_log_offset=10, records=b"x" * p))
                for p in range(10)])
            assert [r.log_end_offset for r in results] == [11 + p for p in range(10)]
            assert (await good.request(ApiVersionsRequest())).api_keys
            await good.close()
            await good.close()  # idempotent
            for w in (bad_writer, garbled_writer):
                w.close()
        finally:
            server.close()
            await server.wait_closed()

    with caplog.at_level(logging.WARNING, logger="biplane.wire"):
        asyncio.run(asyncio.wait_for(run(), 20))
    closes = [r for r in caplog.records if getattr(r, "event", None) == "wire.protocol_error"]
    reasons = sorted(r.reason for r in closes)
    assert len(closes) == 2, reasons
    assert any("exceeds max_frame_bytes=65536" in r for r in reasons)
    assert any("FETCH v0 request" in r for r in reasons)
    assert all(r.levelno == logging.WARNING for r in closes)


def test_handler_failure_closes_connection_and_fails_pending_requests(caplog):
    """acks=0 produce gets no response; a handler that raises closes that connection, and the
    client's pending request fails with NETWORK_EXCEPTION instead of hanging."""

    async def run():
        seen = []

        async def handler(header, request):
            seen.append(ApiKey(header.api_key))
            if header.api_key == ApiKey.PRODUCE:
                return None
            raise RuntimeError("handler bug")

        server = await start_server(handler, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = await WireClient.connect("127.0.0.1", port)
        try:
            await client.send(ProduceRequest(acks=0, topics=(ProduceTopic(topic="t", partitions=(
                ProducePartition(partition=0, records=build_batch([b"x"], timestamp_ms=0)),)),)))
            with pytest.raises(ConnectionClosedError) as info:
                await asyncio.wait_for(client.request(MetadataRequest()), 5)
            assert info.value.code == ErrorCode.NETWORK_EXCEPTION
            assert client.closed
            with pytest.raises(ConnectionClosedError):
                await client.request(MetadataRequest())
            assert seen == [ApiKey.PRODUCE, ApiKey.METADATA]
        finally:
            await client.close()
            server.close()
            await server.wait_closed()

    with caplog.at_level(logging.ERROR, logger="biplane.wire"):
        asyncio.run(asyncio.wait_for(run(), 20))
    assert any(getattr(r, "event", None) == "wire.handler_error" for r in caplog.records)


def test_request_nowait_writes_at_once_and_resolves_in_order():
    """Claim: request_nowait, called without awaiting, sends each request; the futures resolve
    with their own answers, in order; on a closed client it raises the connection's error at once."""

    async def run():
        server = await start_server(echo_handler, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            client = await WireClient.connect("127.0.0.1", port)
            futures = [client.request_nowait(AppendEntriesRequest(
                leader_id=1, follower_id=2, leader_epoch=1, topic="t", partition=0, prev_log_offset=i,
                prev_log_epoch=1, high_watermark=0, flush_after_append=False, records=b"",
                log_end_offset=i, truncate_epoch=-1, truncate_end_offset=-1)) for i in range(5)]
            answers = await asyncio.wait_for(asyncio.gather(*futures), 5)
            await client.close()
            with pytest.raises(ConnectionClosedError):
                client.request_nowait(MetadataRequest(topics=None))
            return [a.log_end_offset for a in answers]
        finally:
            server.close()
            await server.wait_closed()

    assert asyncio.run(run()) == [1, 2, 3, 4, 5]
