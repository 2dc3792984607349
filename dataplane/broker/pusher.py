"""Push replication transport: the leader's append-entries out, the follower's answers back.

The core decides what to send and how much is in flight (push.py: at most
`push_inflight_max` per follower, recovery one chunk at a time); this module only
carries it (translations: codec.py). One pipelined connection per follower broker carries every partition
pushed there, so requests of one partition arrive in the order the core sent
them (a connection answers in order). Each answer is stepped back into the
partition's core as an AppendEntriesReply.

The broker pair has a heartbeat of its own: an append-entries for no partition (PAIR_TP:
topic "", partition -1) to each follower broker this leader pushed to lately, whenever
nothing else went to it for `push_heartbeat_ms` (checked twice per interval, so a pair
is never silent past 1.5 intervals). Its answer is contact both ways for the
link check (contact.py), which partitions quiet for long (push.py) no longer give. A broker
that does not know it answers it as an unknown partition, which is contact all the same.

A connected follower's request is written inside the step that made it (no task
per request); while a connection is being made, requests queue and are written
in order once it is up. A lost connection drops what was in flight: the core's
window times out and its recovery loop resends from what the follower
verified. Nothing here retries.

Follower side: `answer_append_entries` turns a wire request into the core's
event, steps it, and returns the core's reply as the wire response. When the
leader asked for a flush (acks=all waits on this range) the answer waits for
that flush, so the reply carries the new flushed offset (Redpanda's rule); other
appends are flushed on the follower's debounce and reported on the next answer.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Awaitable, Callable

from common.errors import BiplaneError, ErrorCode
from common.tasks import TaskOwner
from common.topic_partition import TopicPartition
from common.wire import WireClient
from common.wire import messages as wire
from dataplane.broker.codec import (
    append_entries_from_wire, append_entries_to_wire, append_refusal, append_reply_from_wire, append_reply_to_wire,
)
from dataplane.broker.throttle import ReplicationThrottle
from dataplane.replica.events import AppendEntries, AppendEntriesReply

log = logging.getLogger("biplane.broker.pusher")

PAIR_TP = TopicPartition("", -1)   # the broker pair's heartbeat: no partition's
# A follower broker nothing was submitted to for this long gets no pair heartbeat any more
# (its partitions moved away); a quiet partition still submits every quarter lag time.
PEER_FORGET_S = 600.0

AddressOf = Callable[[int], "tuple[str, int] | None"]
Deliver = Callable[[TopicPartition, AppendEntriesReply], None]


class Pusher:
    """Leader side. `submit` never blocks: the core already bounded what is in flight."""

    def __init__(self, *, broker_id: int, address_of: AddressOf, deliver: Deliver,
                 reconnect_backoff_ms: int = 100, connect_timeout_ms: int = 2000, inflight_requests_max: int = 256,
                 max_frame_bytes: int = 64 * 1024 * 1024,
                 on_round_trip: Callable[[float], None] | None = None,
                 heard: Callable[[int], None] | None = None, request_timeout_ms: int = 2000) -> None:
        self.broker_id = broker_id
        self.on_round_trip = on_round_trip  # seconds from writing an append-entries to its answer
        self.heard = heard   # told the follower's id on every answer (dataplane/broker/contact.py)
        # A connect to a follower whose packets are dropped (a network cut) waits for the
        # kernel's SYN retries, minutes apart at the end; everything for that follower queues
        # behind it, so after the cut heals its partitions stayed out of the ISR until the
        # retry happened to land. Bounded, a failed connect backs off and the next submit
        # connects afresh.
        self.connect_timeout_ms = connect_timeout_ms
        # A connection with an append-entries unanswered this long is closed and opened
        # afresh (BrokerConfig.replica_request_timeout_ms): after a cut heals, the old one
        # delivers only when TCP's backed-off retransmission timer fires, and the core's
        # resends queue behind it.
        self.request_timeout_ms = request_timeout_ms
        self._unanswered: dict[int, dict[asyncio.Future, float]] = {}  # per follower: answer -> sent (loop time)
        self.address_of = address_of
        self.deliver = deliver
        self.reconnect_backoff_ms = reconnect_backoff_ms
        self.inflight_requests_max = inflight_requests_max
        self.max_frame_bytes = max_frame_bytes
        self._clients: dict[int, WireClient] = {}
        self._connecting: dict[int, asyncio.Future] = {}
        self._down_until: dict[int, float] = {}
        self._waiting: dict[int, list] = {}  # per follower: (tp, request) queued while it connects
        self._submitted: dict[int, float] = {}  # per follower: loop time of the last submit for a partition
        self._written: dict[int, float] = {}    # per follower: loop time of the last request sent or queued
        self._tasks = TaskOwner()    # connects, and writes after a connect
        self._closing = TaskOwner()  # closes of dropped clients: they finish, never cancelled
        self._closed = False
        # Paces the followers a reassignment is adding (throttle.py); the broker configures it.
        self.throttle = ReplicationThrottle()

    def submit(self, follower_id: int, tp: TopicPartition, ev: AppendEntries) -> None:
        if self._closed or follower_id == self.broker_id:
            return
        loop = asyncio.get_running_loop()
        self._submitted[follower_id] = loop.time()
        if loop.time() < self._down_until.get(follower_id, 0.0):
            return  # reconnecting later; the core's window times out and it recovers
        if len(ev.records) and self.throttle.applies((follower_id, tp)):
            if self.throttle.wait_s(loop.time()) > 0:
                return  # over the reassignment throttle: the core's window times out and it resends
            self.throttle.record(loop.time(), len(ev.records))
        self._send(follower_id, tp, append_entries_to_wire(tp, follower_id, ev))

    def send_pair_heartbeats(self, interval_ms: int) -> None:
        """One pair heartbeat to each follower broker nothing was written to for interval_ms."""
        if self._closed:
            return
        now = asyncio.get_running_loop().time()
        for follower_id, submitted in list(self._submitted.items()):
            if now - submitted > PEER_FORGET_S:
                del self._submitted[follower_id]
            elif now - self._written.get(follower_id, -1e9) >= interval_ms / 1000 and \
                    now >= self._down_until.get(follower_id, 0.0):
                self._send(follower_id, PAIR_TP, wire.AppendEntriesRequest(
                    leader_id=self.broker_id, follower_id=follower_id, leader_epoch=-1, topic=PAIR_TP.topic,
                    partition=PAIR_TP.partition))

    async def run_pair_heartbeats(self, interval_ms: int) -> None:
        while not self._closed:
            self.send_pair_heartbeats(interval_ms)
            # Twice per interval: checked once per interval, a pair whose traffic stopped just
            # after a check went nearly two intervals without a word.
            await asyncio.sleep(interval_ms / 2000)

    def _send(self, follower_id: int, tp: TopicPartition, request: wire.AppendEntriesRequest) -> None:
        loop = asyncio.get_running_loop()
        self._written[follower_id] = loop.time()   # written now, or queued behind a connect
        client = self._clients.get(follower_id)
        if client is not None and self._stalled(follower_id, loop.time()):
            self._failed(follower_id, tp, BiplaneError(
                f"append-entries to broker {follower_id} unanswered for over {self.request_timeout_ms} ms; "
                "reconnecting", code=ErrorCode.REQUEST_TIMED_OUT))
            return  # the core's window times out and it resends, on a new connection
        if client is not None and not client.closed and follower_id not in self._waiting:
            self._write(client, follower_id, tp, request)  # inside the step that made it
            return
        # Not connected: one task connects and then writes everything that queued meanwhile,
        # in order, so a follower gets each partition's requests in the order sent.
        waiting = self._waiting.get(follower_id)
        if waiting is None:
            waiting = self._waiting[follower_id] = []
            self._tasks.spawn(self._connect_then_write(follower_id))
        waiting.append((tp, request))

    def _write(self, client: WireClient, follower_id: int, tp: TopicPartition,
               request: wire.AppendEntriesRequest) -> bool:
        try:
            answer = client.request_nowait(request)
        except (BiplaneError, OSError) as exc:
            self._failed(follower_id, tp, exc)
            return False
        sent = time.perf_counter()
        self._unanswered.setdefault(follower_id, {})[answer] = asyncio.get_running_loop().time()
        answer.add_done_callback(lambda f: self._answered(follower_id, tp, f, sent, client))
        return True

    def _stalled(self, follower_id: int, now: float) -> bool:
        # Requests go in sent order and leave as answered: the first one left is the oldest
        # (a dict keeps insertion order), so this costs no scan on the hot path.
        unanswered = self._unanswered.get(follower_id)
        if not unanswered:
            return False
        return now - next(iter(unanswered.values())) > self.request_timeout_ms / 1000

    async def _connect_then_write(self, follower_id: int) -> None:
        try:
            client = await self._client(follower_id)
        except (BiplaneError, OSError) as exc:
            waiting = self._waiting.pop(follower_id, [])
            if waiting:
                self._failed(follower_id, waiting[0][0], exc)
            return
        for tp, request in self._waiting.pop(follower_id, []):
            if not self._write(client, follower_id, tp, request):
                return  # the rest is lost with the connection: the core's windows time out

    def _answered(self, follower_id: int, tp: TopicPartition, answer: asyncio.Future, sent: float,
                  client: WireClient) -> None:
        self._unanswered.get(follower_id, {}).pop(answer, None)
        if answer.cancelled():
            return
        exc = answer.exception()
        if exc is not None:
            # A connection already dropped fails what it carried: that says nothing of the next one.
            if self._clients.get(follower_id) in (client, None):
                self._failed(follower_id, tp, exc)
            return
        if self.on_round_trip is not None and tp != PAIR_TP:   # the push latency is the partitions'
            self.on_round_trip(time.perf_counter() - sent)
        if self.heard is not None:
            self.heard(follower_id)
        if tp != PAIR_TP:
            self.deliver(tp, append_reply_from_wire(answer.result()))

    def _failed(self, follower_id: int, tp: TopicPartition, exc: BaseException) -> None:
        if self._closed:
            return
        log.debug("append-entries to broker %d for %s-%d failed: %s", follower_id, *tp, exc)
        self._down_until[follower_id] = asyncio.get_running_loop().time() + self.reconnect_backoff_ms / 1000
        client = self._clients.pop(follower_id, None)
        self._unanswered.pop(follower_id, None)   # the closing connection fails them
        if client is not None:
            self._closing.spawn(client.close())

    async def _client(self, follower_id: int) -> WireClient:
        client = self._clients.get(follower_id)
        if client is not None and not client.closed:
            return client
        pending = self._connecting.get(follower_id)
        if pending is None:
            pending = self._tasks.spawn(self._connect(follower_id))
            self._connecting[follower_id] = pending
            pending.add_done_callback(lambda _: self._connecting.pop(follower_id, None))
        return await asyncio.shield(pending)

    async def _connect(self, follower_id: int) -> WireClient:
        address = self.address_of(follower_id)
        if address is None:
            raise BiplaneError(f"no address known for broker {follower_id}", code=ErrorCode.NETWORK_EXCEPTION)
        try:
            client = await WireClient.connect(*address, timeout_s=self.connect_timeout_ms / 1000,
                                              max_frame_bytes=self.max_frame_bytes,
                                              inflight_requests_max=self.inflight_requests_max)
        except asyncio.TimeoutError:
            raise BiplaneError(f"connect to broker {follower_id} at {address[0]}:{address[1]} took over "
                               f"{self.connect_timeout_ms} ms", code=ErrorCode.NETWORK_EXCEPTION) from None
        self._clients[follower_id] = client
        return client

    async def close(self) -> None:
        self._closed = True
        self._waiting.clear()
        # Connects in flight too: a connect finishing after close would keep its client.
        await self._tasks.cancel_and_wait()
        await self._closing.wait()
        for client in list(self._clients.values()):
            await client.close()
        self._clients.clear()


async def answer_append_entries(req: wire.AppendEntriesRequest,
                                step: Callable[[AppendEntries], list],
                                flushed: Callable[[int], Awaitable[int]] | None = None) -> wire.AppendEntriesResponse:
    """Follower side. `step` steps the event into the partition's core and returns what it
    answered (AppendEntriesReply among them); `flushed(offset)`, when given, waits until the
    log is flushed up to offset and returns the log's flushed offset (used only when the
    leader asked for flush_after_append, i.e. acks=all requests wait on this range)."""
    tp = TopicPartition(req.topic, req.partition)
    replies = [r for r in step(append_entries_from_wire(req)) if isinstance(r, AppendEntriesReply)]
    if not replies:
        # The core ignored it (a late copy computed from another state of our log): an error
        # the leader's core ignores too; its window times out and recovery takes over.
        return append_refusal(req, ErrorCode.INVALID_REQUEST, replica_id=req.follower_id,
                              leader_epoch=req.leader_epoch)
    reply = replies[-1]
    if (req.flush_after_append and flushed is not None and reply.error is ErrorCode.NONE
            and reply.flushed_offset < reply.log_end_offset):
        now_flushed = await flushed(reply.log_end_offset)
        reply = AppendEntriesReply(
            replica_id=reply.replica_id, leader_epoch=reply.leader_epoch, error=reply.error,
            log_end_offset=reply.log_end_offset, flushed_offset=min(now_flushed, reply.log_end_offset),
            match_offset=reply.match_offset, last_epoch=reply.last_epoch, partition=reply.partition)
    return append_reply_to_wire(tp, reply)
