"""The broker's pipelined connection loop (dataplane/broker/listener.py): answers go out
in request order whatever order they finish in, and answers ready together share one
write."""
from __future__ import annotations

import asyncio

from common.errors import ErrorCode
from common.wire import WireClient
from common.wire import messages as wire
from common.wire.stream import FrameStream
from dataplane.broker.listener import start_pipelined_server


def answer_for(name: str) -> wire.MetadataResponse:
    return wire.MetadataResponse(brokers=(), controller_id=-1, metadata_offset=0,
                                 topics=(wire.MetadataTopic(topic=name, error_code=ErrorCode.NONE),))


async def run_server(resolve):
    """A server whose answers are futures; `resolve(futures)` decides when they finish.
    Returns the topic names of the responses in arrival order and the writes made."""
    loop = asyncio.get_running_loop()
    futures: list[tuple[str, asyncio.Future]] = []

    def start(header, request):
        future = loop.create_future()
        futures.append((request.topics[0], future))
        return future

    writes = []
    original = FrameStream.write

    def counting(self, parts):
        writes.append((self.transport.get_extra_info("sockname")[1], len(parts)))
        return original(self, parts)
    FrameStream.write = counting
    server = await start_pipelined_server(start, "127.0.0.1", 0, max_frame_bytes=1 << 20)
    try:
        port = server.sockets[0].getsockname()[1]
        async with await WireClient.connect("127.0.0.1", port) as client:
            requests = [asyncio.ensure_future(client.request(wire.MetadataRequest(topics=(f"t{i}",))))
                        for i in range(5)]
            while len(futures) < 5:
                await asyncio.sleep(0.01)
            await resolve(futures)
            responses = await asyncio.wait_for(asyncio.gather(*requests), 5)
    finally:
        FrameStream.write = original
        server.close()
        await server.wait_closed()
    server_writes = [n for sock_port, n in writes if sock_port == port]  # not the client's requests
    return [r.topics[0].topic for r in responses], server_writes


def test_answers_finishing_in_reverse_order_are_sent_in_request_order():
    async def reverse(futures):
        for name, future in reversed(futures):
            future.set_result(answer_for(name))
            await asyncio.sleep(0.01)

    names, _ = asyncio.run(run_server(reverse))
    assert names == [f"t{i}" for i in range(5)]


def test_answers_ready_together_share_one_write():
    async def all_at_once(futures):
        for name, future in futures:
            future.set_result(answer_for(name))

    names, writes = asyncio.run(run_server(all_at_once))
    assert names == [f"t{i}" for i in range(5)]
    assert len(writes) == 1  # five answers, one write


def test_a_slow_answer_does_not_hold_back_those_ready_before_it():
    async def first_two_then_rest(futures):
        for name, future in futures[:2]:
            future.set_result(answer_for(name))
        await asyncio.sleep(0.05)
        for name, future in futures[2:]:
            future.set_result(answer_for(name))

    names, writes = asyncio.run(run_server(first_two_then_rest))
    assert names == [f"t{i}" for i in range(5)]
    assert len(writes) == 2


def test_a_peer_breaking_the_protocol_loses_only_its_own_connection(caplog):
    """A frame over max_frame_bytes and a garbled request body each close their own
    connection (with a warning naming the reason); a well-behaved client is still served."""
    import struct

    from common.wire import encode_frame

    async def main():
        async def start(header, request):
            return answer_for(request.topics[0])
        server = await start_pipelined_server(start, "127.0.0.1", 0, max_frame_bytes=1 << 16)
        port = server.sockets[0].getsockname()[1]
        try:
            async with await WireClient.connect("127.0.0.1", port) as good:
                too_big_r, too_big_w = await asyncio.open_connection("127.0.0.1", port)
                too_big_w.write(struct.pack(">i", 1 << 20))
                garbled_r, garbled_w = await asyncio.open_connection("127.0.0.1", port)
                garbled_w.writelines(encode_frame([struct.pack(">hhi", 3, 0, 9) + b"\x00\x01"]))
                assert await asyncio.wait_for(too_big_r.read(), 5) == b""  # closed by the server
                assert await asyncio.wait_for(garbled_r.read(), 5) == b""
                answer = await asyncio.wait_for(good.request(wire.MetadataRequest(topics=("still",))), 5)
                for w in (too_big_w, garbled_w):
                    w.close()
                return answer.topics[0].topic
        finally:
            server.close()
            await server.wait_closed()

    with caplog.at_level("WARNING", logger="biplane.wire"):
        assert asyncio.run(main()) == "still"
    reasons = [r.getMessage() for r in caplog.records if r.name == "biplane.wire"]
    assert any("max_frame_bytes" in m for m in reasons), reasons
    assert len(reasons) == 2, reasons
