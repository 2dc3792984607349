"""Push transport (dataplane/broker/pusher.py) over loopback: two real cores on MemoryLogs, the
leader's append-entries carried by a Pusher to a wire server that answers with
answer_append_entries, replies stepped back into the leader's core."""
from __future__ import annotations

import asyncio

from common.batch import build_batch
from common.errors import ErrorCode
from common.wire import AppendEntriesResponse
from common.wire.connection import start_server
from dataplane.broker.codec import (
    append_entries_from_wire, append_entries_to_wire, append_reply_from_wire, append_reply_to_wire,
)
from dataplane.broker.pusher import Pusher, answer_append_entries
from dataplane.log.memory import MemoryLog
from dataplane.replica.actions import Send
from dataplane.replica.core import Replica
from dataplane.replica.events import (
    AppendEntries, AppendEntriesReply, FlushDone, NewMetadata, ProduceRequest, Tick, WriteDone,
)
from sim.disk import apply_persist
from test_replica_core import config, state

TP = ("t", 0)


class Driver:
    """A core on a MemoryLog, performing persist at once and flushing on request."""

    def __init__(self, replica_id: int, on_send) -> None:
        self.log = MemoryLog()
        self.replica = Replica(replica_id=replica_id, log=self.log, partition=TP, fetch_backoff_ms=5,
                               push_capable=True)
        self.on_send = on_send
        self.released: dict[int, object] = {}

    def step(self, event) -> list:
        ready = self.replica.step(event)
        written, flushes = apply_persist(self.log, ready)
        out = []
        for s in ready.send:
            if isinstance(s, Send):
                self.on_send(s.to_broker, s.message)
        out += [s.message for s in ready.answers if isinstance(s.message, AppendEntriesReply)]
        for r in ready.release:
            self.released[r.request_id] = r
        if written:
            out += self.step(WriteDone(last_offset=written[-1]))
        if flushes:
            out += self.step(FlushDone(flushed_offset=self.log.flush()))
        return out


def test_wire_conversions_keep_every_field():
    """Claim: core events survive the trip to wire messages and back unchanged."""
    ev = AppendEntries(leader_id=1, leader_epoch=3, prev_offset=10, prev_epoch=2, records=b"", high_watermark=7,
                       log_end_offset=12, flush_after_append=True, diverging_epoch=2, diverging_end_offset=9,
                       partition=TP)
    assert append_entries_from_wire(append_entries_to_wire(TP, 2, ev)) == ev
    reply = AppendEntriesReply(replica_id=2, leader_epoch=3, error=ErrorCode.OFFSET_OUT_OF_RANGE, log_end_offset=5,
                               flushed_offset=4, match_offset=5, last_epoch=1, partition=TP)
    assert append_reply_from_wire(append_reply_to_wire(TP, reply)) == reply


def test_leader_pushes_to_a_follower_over_loopback_and_acks_all_completes():
    """Claim: with the Pusher carrying append-entries to a real wire server, the follower's log
    equals the leader's and acks=all produce requests are released without error."""
    async def main():
        pusher_box: list = []
        leader = Driver(1, lambda to, msg: pusher_box[0].submit(to, TP, msg))
        follower = Driver(2, lambda to, msg: None)

        async def handler(header, request):
            async def flushed(offset):
                return follower.log.flush()
            return await answer_append_entries(request, follower.step, flushed)

        server = await start_server(handler, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        pusher = Pusher(broker_id=1, address_of=lambda b: ("127.0.0.1", port),
                        deliver=lambda tp, reply: leader.step(reply))
        pusher_box.append(pusher)
        try:
            st = state(isr=(1, 2), replicas=(1, 2))
            follower.step(NewMetadata(partition=st, config=config(replication_mode="push")))
            leader.step(NewMetadata(partition=st, config=config(replication_mode="push")))
            for rid in range(1, 21):
                leader.step(ProduceRequest(request_id=rid, records=build_batch([b"r%d" % rid], timestamp_ms=0),
                                           acks=-1, timeout_ms=5000))
            for t in range(1, 200):
                await asyncio.sleep(0.01)
                leader.step(Tick(now_ms=t * 10))
                if len(leader.released) == 20:
                    break
            assert {r.error for r in leader.released.values()} == {ErrorCode.NONE}
            assert follower.log.read(0, max_bytes=1 << 20).records == leader.log.read(0, max_bytes=1 << 20).records
        finally:
            await pusher.close()
            server.close()
            await server.wait_closed()

    asyncio.run(main())


async def echo_end(header, request):
    """A follower's answer naming prev offset + 1 as its log end, so the leader can tell
    which request each answer is for."""
    return AppendEntriesResponse(follower_id=2, leader_epoch=1, topic="t", partition=0,
                                 log_end_offset=request.prev_log_offset + 1)


def ae(i: int) -> AppendEntries:
    """An empty append-entries after offset i."""
    return AppendEntries(leader_id=1, leader_epoch=1, prev_offset=i, prev_epoch=1, records=b"",
                         high_watermark=0, log_end_offset=i, flush_after_append=False, partition=TP)


def test_append_entries_reach_the_follower_in_submission_order_across_the_connect():
    """Claim: requests submitted while the Pusher connects, and ones submitted while those still
    wait to be written, arrive in submission order; later ones are written at once (no task) and
    every answer is delivered."""
    async def main():
        arrived: list[int] = []

        async def handler(header, request):
            arrived.append(request.prev_log_offset)
            return await echo_end(header, request)

        server = await start_server(handler, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        delivered: list[int] = []
        pusher = Pusher(broker_id=1, address_of=lambda b: ("127.0.0.1", port),
                        deliver=lambda tp, reply: delivered.append(reply.log_end_offset))
        try:
            n = 0
            for _ in range(60):  # submit a few on every loop round: before, during and after the connect
                for _ in range(3):
                    pusher.submit(2, TP, ae(n))
                    n += 1
                await asyncio.sleep(0)
            tasks_after = len(pusher._tasks)
            for _ in range(500):
                if len(delivered) == n:
                    break
                await asyncio.sleep(0.01)
        finally:
            await pusher.close()
            server.close()
            await server.wait_closed()
        return arrived, delivered, n, tasks_after

    arrived, delivered, n, tasks_after = asyncio.run(main())
    assert arrived == list(range(n))
    assert delivered == [i + 1 for i in range(n)]
    assert tasks_after == 0  # connected: nothing waits in a task


def test_follower_without_address_is_backed_off_not_stuck():
    """Claim: when no address is known for a follower, its queued append-entries are dropped
    and the follower is backed off like any failed connect, so a later submit connects again.
    Regression: the error raised named an ErrorCode that does not exist (BROKER_NOT_AVAILABLE),
    so an AttributeError escaped the connect task and the queue was never cleared: nothing was
    pushed to that follower again (found by the type check)."""
    async def main():
        pusher = Pusher(broker_id=1, address_of=lambda b: None, deliver=lambda tp, reply: None,
                        reconnect_backoff_ms=0)
        ev = AppendEntries(leader_id=1, leader_epoch=1, prev_offset=0, prev_epoch=-1, records=b"",
                           high_watermark=0, partition=TP)
        try:
            pusher.submit(2, TP, ev)
            for _ in range(20):
                await asyncio.sleep(0)
            return dict(pusher._waiting), set(pusher._tasks)
        finally:
            await pusher.close()

    waiting, tasks = asyncio.run(main())
    assert waiting == {}
    assert tasks == set()


def test_a_connect_that_never_completes_is_given_up_and_the_next_submit_connects_afresh():
    """Claim: a connect to a follower that never answers (a network cut drops its SYNs) is given
    up after connect_timeout_ms (WireClient.connect's bound), so what queued behind it is dropped
    (the core's window times out and resends) and the next submit after the backoff connects
    again and is delivered.
    Regression: the connect had no bound; after a cut healed, a push leader wrote nothing to
    that follower until the kernel's next SYN retry, and its partitions stayed out of the ISR
    (the fault harness's seed 7: push/isr partitions unacknowledged 17 s after the last heal)."""
    calls: list[int] = []

    async def main():
        loop = asyncio.get_running_loop()
        real_create_connection = loop.create_connection

        async def create_connection(*args, **kwargs):
            calls.append(1)
            if len(calls) == 1:
                await asyncio.Event().wait()  # the cut: no answer, ever
            return await real_create_connection(*args, **kwargs)

        loop.create_connection = create_connection  # type: ignore[method-assign]
        server = await start_server(echo_end, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        delivered: list[int] = []
        pusher = Pusher(broker_id=1, address_of=lambda b: ("127.0.0.1", port), reconnect_backoff_ms=0,
                        connect_timeout_ms=100, deliver=lambda tp, reply: delivered.append(reply.log_end_offset))
        try:
            pusher.submit(2, TP, ae(0))  # queues behind the connect that hangs
            await asyncio.sleep(0.3)
            stuck = dict(pusher._waiting)
            pusher.submit(2, TP, ae(1))  # the core's resend after its window timed out
            for _ in range(200):
                if delivered:
                    break
                await asyncio.sleep(0.01)
        finally:
            await pusher.close()
            server.close()
            await server.wait_closed()
        return stuck, delivered

    stuck, delivered = asyncio.run(main())
    assert stuck == {}  # given up: nothing waits behind the dead connect
    assert delivered == [2] and len(calls) == 2


def test_a_connection_whose_answers_stopped_is_reopened_and_the_resend_is_delivered():
    """Claim: once an append-entries has gone unanswered for request_timeout_ms, the next submit
    drops that connection (it is closed, counted as a failure, backed off) and the following
    submit goes out on a new connection, where it is answered.
    Regression: a connection whose follower's packets a cut had dropped was kept; after the heal
    the core's resends queued behind what TCP would resend only when its backed-off
    retransmission timer fired, and push partitions stayed out of the ISR for seconds after the
    cut (the fault harness's gray scenario: a healthy quorum partition then stalled 2.8 s in
    the next cut, its only other in-sync follower being the one cut)."""
    connections: list[int] = []

    async def main():
        async def handler(header, request):
            if len(connections) == 1:
                await asyncio.Event().wait()   # the first connection: answers never come back
            return await echo_end(header, request)

        server = await start_server(handler, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        loop = asyncio.get_running_loop()
        real_create_connection = loop.create_connection

        async def create_connection(*args, **kwargs):
            connections.append(1)
            return await real_create_connection(*args, **kwargs)

        loop.create_connection = create_connection  # type: ignore[method-assign]
        delivered: list[int] = []
        pusher = Pusher(broker_id=1, address_of=lambda b: ("127.0.0.1", port), reconnect_backoff_ms=0,
                        request_timeout_ms=100, deliver=lambda tp, reply: delivered.append(reply.log_end_offset))
        try:
            pusher.submit(2, TP, ae(0))            # unanswered on the first connection
            await asyncio.sleep(0.05)
            pusher.submit(2, TP, ae(1))            # not yet over the bound: same connection
            same = len(connections)
            await asyncio.sleep(0.15)
            pusher.submit(2, TP, ae(2))            # over the bound: the connection is dropped
            dropped = 2 not in pusher._clients
            for _ in range(100):
                pusher.submit(2, TP, ae(3))        # the core's resends, until one is answered
                if delivered:
                    break
                await asyncio.sleep(0.01)
        finally:
            await pusher.close()
            server.close()
            await server.wait_closed()
        return same, dropped, delivered

    same, dropped, delivered = asyncio.run(main())
    assert same == 1 and dropped
    assert delivered and set(delivered) == {4} and len(connections) == 2


def test_a_follower_broker_nothing_goes_to_gets_the_pairs_heartbeat_and_its_answer_is_contact():
    """Claim: once partitions to a follower broker are quiet (nothing written to it for the
    interval), the leader sends that broker one pair heartbeat per interval, for no partition;
    each answer counts as contact and is delivered to no core. While append-entries flow, no
    pair heartbeat is sent."""
    from dataplane.broker.pusher import PAIR_TP

    async def main():
        arrived: list[tuple[str, int, float]] = []

        async def handler(header, request):
            arrived.append((request.topic, request.partition, asyncio.get_running_loop().time()))
            if (request.topic, request.partition) == PAIR_TP:
                return AppendEntriesResponse(follower_id=2, leader_epoch=-1, topic="", partition=-1)
            return await echo_end(header, request)

        server = await start_server(handler, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        delivered: list = []
        heard: list[float] = []
        loop = asyncio.get_running_loop()
        pusher = Pusher(broker_id=1, address_of=lambda b: ("127.0.0.1", port),
                        deliver=lambda tp, reply: delivered.append(tp), heard=lambda b: heard.append(loop.time()))
        beats = loop.create_task(pusher.run_pair_heartbeats(50))
        try:
            busy_until = loop.time() + 0.3
            n = 0
            while loop.time() < busy_until:   # append-entries every 10 ms: no pair heartbeat
                pusher.submit(2, TP, ae(n))
                n += 1
                await asyncio.sleep(0.01)
            quiet_from = loop.time()
            await asyncio.sleep(0.5)          # nothing submitted: one pair heartbeat per 50 ms
        finally:
            beats.cancel()
            await pusher.close()
            server.close()
            await server.wait_closed()
        return arrived, delivered, heard, n, quiet_from

    arrived, delivered, heard, n, quiet_from = asyncio.run(main())
    pairs = [t for topic, partition, t in arrived if (topic, partition) == PAIR_TP]
    assert not [t for t in pairs if t < quiet_from - 0.02], "a pair heartbeat went while append-entries flowed"
    assert 6 <= len(pairs) <= 12, pairs
    assert delivered == [TP] * n                          # only the partition's answers reach a core
    assert len([t for t in heard if t > quiet_from]) >= 6  # each pair answer is contact
