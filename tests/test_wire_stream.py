"""FrameStream (common/wire/stream.py): frames read straight into their own buffers.

Driven without sockets through the BufferedProtocol calls (get_buffer /
buffer_updated), the way the event loop drives it, and then over loopback
with the pipelined broker listener and WireClient."""
from __future__ import annotations

import asyncio
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.errors import ErrorCode, FrameTooLargeError, ProtocolError
from common.wire import WireClient
from common.wire import messages as wire
from common.wire.stream import OWN_BUFFER_BYTES_MIN, RECEIVE_BUFFER_BYTES, FrameStream
from dataplane.broker.listener import start_pipelined_server


class FakeTransport:
    def __init__(self) -> None:
        self.aborted = False
        self.paused = False

    def get_extra_info(self, name, default=None):
        return ("127.0.0.1", 1) if name == "peername" else default

    def is_closing(self) -> bool:
        return self.aborted

    def abort(self) -> None:
        self.aborted = True

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False


def make_stream(max_frame_bytes: int = 1 << 22):
    frames: list[bytes] = []
    closed: list[BaseException | None] = []
    stream = FrameStream(max_frame_bytes=max_frame_bytes, on_frame=lambda f: frames.append(bytes(f)),
                         on_close=closed.append)
    stream.transport = FakeTransport()  # connection_made needs a running loop; not needed here
    return stream, frames, closed


def feed(stream: FrameStream, data: bytes, chunk: int) -> None:
    """Deliver data as the event loop would: into whatever buffer get_buffer offers."""
    pos = 0
    while pos < len(data):
        buffer = stream.get_buffer(-1)
        n = min(len(buffer), chunk, len(data) - pos)
        assert n > 0
        buffer[:n] = data[pos:pos + n]
        stream.buffer_updated(n)
        pos += n


def framed(payloads: list[bytes]) -> bytes:
    return b"".join(struct.pack(">i", len(p)) + p for p in payloads)


sizes = st.one_of(st.integers(1, 100), st.integers(OWN_BUFFER_BYTES_MIN - 10, OWN_BUFFER_BYTES_MIN + 10),
                  st.integers(RECEIVE_BUFFER_BYTES - 10, RECEIVE_BUFFER_BYTES + 10))


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.lists(sizes, min_size=1, max_size=8), st.integers(1, 300_000))
def test_frames_arrive_whole_and_in_order_under_any_chunking(frame_sizes, chunk):
    """Small frames, frames just around the own-buffer threshold and around the receive
    buffer's size, cut into reads of any size, come out byte-exact and in order."""
    payloads = [bytes([i % 251]) * n for i, n in enumerate(frame_sizes)]
    stream, frames, closed = make_stream()
    feed(stream, framed(payloads), chunk)
    assert frames == payloads
    assert closed == []


def test_frames_are_bytearrays_the_receiver_owns():
    got = []
    stream = FrameStream(max_frame_bytes=1 << 22, on_frame=got.append, on_close=lambda r: None)
    stream.transport = FakeTransport()
    feed(stream, framed([b"small", b"x" * (OWN_BUFFER_BYTES_MIN + 1), b"tail"]), 1 << 20)
    assert [type(f) for f in got] == [bytearray] * 3
    feed(stream, framed([b"other"]), 1 << 20)  # the shared buffer is reused...
    assert got[0] == b"small" and got[2] == b"tail"  # ...without touching frames handed out


@pytest.mark.parametrize("size,error", [(0, ProtocolError), (-5, ProtocolError), (2048, FrameTooLargeError)])
def test_a_bad_frame_size_closes_the_connection_with_the_reason(size, error):
    stream, frames, closed = make_stream(max_frame_bytes=1024)
    feed(stream, framed([b"ok"]) + struct.pack(">i", size) + b"zz", 1 << 20)
    assert frames == [b"ok"]
    assert len(closed) == 1 and type(closed[0]) is error
    assert stream.transport.aborted


def test_end_of_stream_inside_a_frame_is_a_protocol_error():
    stream, frames, closed = make_stream()
    feed(stream, framed([b"whole"]) + struct.pack(">i", 100) + b"part", 1 << 20)
    assert stream.eof_received() is False
    stream.connection_lost(None)
    assert frames == [b"whole"]
    assert isinstance(closed[0], ProtocolError) and "inside a frame" in str(closed[0])


def test_a_receiver_error_closes_the_connection_once():
    closed = []

    def refuse(frame):
        raise ProtocolError("bad body")
    stream = FrameStream(max_frame_bytes=1024, on_frame=refuse, on_close=closed.append)
    stream.transport = FakeTransport()
    feed(stream, framed([b"a", b"b"]), 1 << 20)
    stream.connection_lost(None)
    assert [str(r) for r in closed] == ["bad body"]


def test_paused_stream_holds_received_frames_until_resumed():
    frames = []
    stream = FrameStream(max_frame_bytes=1024, on_frame=lambda f: (frames.append(bytes(f)), stream.pause_reading()),
                         on_close=lambda r: None)
    stream.transport = FakeTransport()
    feed(stream, framed([b"1", b"2", b"3"]), 1 << 20)
    assert frames == [b"1"] and stream.transport.paused
    stream.resume_reading()
    assert frames == [b"1", b"2"]
    stream.resume_reading()
    stream.resume_reading()
    assert frames == [b"1", b"2", b"3"]


def test_pipelined_listener_reads_no_more_than_its_inflight_bound():
    """With inflight_requests_max=2 and answers held back, the third pipelined request is
    not started until an answer has gone out; all are answered in order."""
    async def main():
        loop = asyncio.get_running_loop()
        started: list[asyncio.Future] = []

        def start(header, request):
            future = loop.create_future()
            started.append((request.topics[0], future))
            return future
        server = await start_pipelined_server(start, "127.0.0.1", 0, max_frame_bytes=1 << 20,
                                              inflight_requests_max=2)
        port = server.sockets[0].getsockname()[1]
        try:
            async with await WireClient.connect("127.0.0.1", port) as client:
                calls = [asyncio.ensure_future(client.request(wire.MetadataRequest(topics=(f"t{i}",))))
                         for i in range(5)]
                await asyncio.sleep(0.2)
                assert [name for name, _ in started] == ["t0", "t1"]
                for i in range(5):
                    while len(started) <= i:
                        await asyncio.sleep(0.01)
                    name, future = started[i]
                    future.set_result(wire.MetadataResponse(brokers=(), controller_id=-1, metadata_offset=i, topics=(
                        wire.MetadataTopic(topic=name, error_code=ErrorCode.NONE),)))
                answers = await asyncio.wait_for(asyncio.gather(*calls), 5)
                assert [a.metadata_offset for a in answers] == [0, 1, 2, 3, 4]
        finally:
            server.close()
            await server.wait_closed()
    asyncio.run(main())


def test_large_records_cross_loopback_intact():
    """A 3 MiB records blob goes client -> listener in a produce and back in a fetch
    answer, byte-exact (the own-buffer path on both sides)."""
    blob = bytes(range(256)) * (3 * 4096)

    async def main():
        stored = []

        async def start(header, request):
            if isinstance(request, wire.ProduceRequest):
                stored.append(bytes(request.topics[0].partitions[0].records))
                return wire.ProduceResponse(topics=(wire.ProduceTopicResponse(topic="t", partitions=(
                    wire.ProducePartitionResponse(partition=0),)),))
            return wire.FetchResponse(topics=(wire.FetchTopicResponse(topic="t", partitions=(
                wire.FetchPartitionResponse(partition=0, records=stored[-1]),)),))
        server = await start_pipelined_server(start, "127.0.0.1", 0, max_frame_bytes=8 << 20)
        port = server.sockets[0].getsockname()[1]
        try:
            async with await WireClient.connect("127.0.0.1", port, max_frame_bytes=8 << 20) as client:
                await asyncio.wait_for(client.request(wire.ProduceRequest(acks=1, timeout_ms=1000, topics=(
                    wire.ProduceTopic(topic="t", partitions=(wire.ProducePartition(partition=0, records=blob),)),))), 10)
                answer = await asyncio.wait_for(client.request(wire.FetchRequest(topics=(wire.FetchTopic(
                    topic="t", partitions=(wire.FetchPartition(partition=0, fetch_offset=0),)),))), 10)
                return stored[0], bytes(answer.topics[0].partitions[0].records)
        finally:
            server.close()
            await server.wait_closed()
    assert asyncio.run(main()) == (blob, blob)


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_both_ends_of_a_connection_retransmit_at_least_every_second(loop_kind, monkeypatch):
    """Every connection's retransmission timeout is capped at 1 s (TCP_RTO_MAX_MS, Linux 6.15+),
    on the client's side and the listener's, on either event loop: the kernel's own cap of
    120 s let a cut of a few seconds delay the connection 1.3-5.5 s past its heal."""
    import socket

    from common.wire import stream

    probe = socket.socket()
    try:
        if not stream.cap_retransmit_interval(probe):
            pytest.skip("this kernel has no TCP_RTO_MAX_MS (Linux 6.15+)")
    finally:
        probe.close()
    if loop_kind == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        new_loop = uvloop.new_event_loop
    else:
        new_loop = asyncio.new_event_loop
    capped: list[tuple[int, int]] = []   # (local port, its retransmission cap) per socket capped
    real = stream.cap_retransmit_interval

    def recording(sock):
        assert real(sock)
        assert stream.TCP_RTO_MAX_MS is not None
        capped.append((sock.getsockname()[1], sock.getsockopt(socket.IPPROTO_TCP, stream.TCP_RTO_MAX_MS)))
        return True
    monkeypatch.setattr(stream, "cap_retransmit_interval", recording)

    async def main():
        async def start(header, request):
            return wire.MetadataResponse(brokers=(), controller_id=-1, metadata_offset=0, topics=())
        server = await start_pipelined_server(start, "127.0.0.1", 0, max_frame_bytes=1 << 20)
        port = server.sockets[0].getsockname()[1]
        try:
            async with await WireClient.connect("127.0.0.1", port) as client:
                await asyncio.wait_for(client.request(wire.MetadataRequest(topics=())), 5)
                return port
        finally:
            server.close()
            await server.wait_closed()
    loop = new_loop()
    try:
        port = loop.run_until_complete(main())
    finally:
        loop.close()
    assert [cap for _, cap in capped] == [1000, 1000], capped
    assert sorted(local == port for local, _ in capped) == [False, True], capped   # one end each
