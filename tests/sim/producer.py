"""Idempotent producers in the simulation, built on the SDK's real producer core
(dataplane/client/producer_core.py): the core numbers batches, decides retries, epochs and
outcomes; this module only does what the SDK's asyncio driver does around it (queue batches,
send requests, time them out, feed answers back) with the simulation's clock and network.

Each batch holds 1-3 records made once, so its record bytes (the checkers' identity of a
batch) are the same under any numbers it is given. A client request times out after
`request_timeout_ms`, often shorter than the leader's own produce timeout and than
replication under faults: the request may still be appended after the client gave up.
"""
from __future__ import annotations

import dataclasses
import random

from common.batch import HEADER_SIZE, build_batch
from common.errors import ErrorCode
from dataplane.client.attempts import Attempt, Attempts
from dataplane.client.producer_core import Acknowledge, Fail, Outcome, ProducerCore

QUEUED_MAX = 8   # never-sent batches a producer holds (the SDK's buffer memory, in miniature)
PRODUCE_TICK_MAX_MS = 40   # the longest gap between two produce ticks of the simulation (cluster.py)


@dataclasses.dataclass(eq=False)
class SimBatch:
    producer: str
    index: int                 # send order within its producer
    values: list[bytes]
    created_ms: int
    ident: bytes = b""         # the records section: identical under any stamp

    def records(self, producer_id: int, producer_epoch: int, base_sequence: int) -> bytes:
        return build_batch(self.values, timestamp_ms=self.created_ms, producer_id=producer_id,
                           producer_epoch=producer_epoch, base_sequence=base_sequence)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Send:
    request_id: int
    batch: SimBatch
    records: bytes


class SimProducer:
    def __init__(self, *, name: str, rng: random.Random, request_timeout_ms: int, delivery_timeout_ms: int,
                 in_flight_max: int, retry_backoff_ms: int, attempts: Attempts[SimBatch] | None = None) -> None:
        self.name = name
        self.rng = rng
        self.request_timeout_ms = request_timeout_ms
        self.core: ProducerCore[SimBatch] = ProducerCore(
            in_flight_per_partition_max=in_flight_max, retry_backoff_ms=retry_backoff_ms,
            delivery_timeout_ms=delivery_timeout_ms)
        self.queue: list[SimBatch] = []
        self.created = 0
        self.created_ms: list[int] = []            # batch index -> when it was made
        self.requests: dict[int, SimBatch] = {}   # request id -> batch, until answered or timed out
        # The SDK's rule for attempts held by a replaced leader (dataplane/client/attempts.py):
        # with it, an attempt may end early, given up, and its answer is then dropped.
        self.attempts = attempts
        self.attempt_of: dict[int, Attempt] = {}   # request id -> its attempt
        self.request_of: dict[int, int] = {}       # batch index -> its request out
        self.acked: dict[int, int] = {}            # batch index -> base offset
        self.failed: dict[int, Fail[SimBatch]] = {}
        self.counts = {"timeouts": 0, "resends": 0, "renumbered": 0, "given_up": 0}   # what the run exercised
        self.stamps: dict[int, set[tuple[int, int, int]]] = {}          # batch index -> stamps used
        self.sent: dict[int, SimBatch] = {}         # request id -> batch, kept after the request ended
        self.answers: dict[int, ErrorCode] = {}     # request id -> the leader's answer (late ones too)
        self.failed_ms: dict[int, int] = {}         # batch index -> when it failed
        # batch index -> when a leader answered success for it after the producer had stopped
        # waiting (the request had timed out, or the batch had already failed by its delivery timeout)
        self.late_successes: dict[int, int] = {}
        # Spans with a batch lacking an outcome and no request out: (start, end); end None while open.
        self.idle: list[list[int | None]] = []

    def make_batch(self, now_ms: int) -> SimBatch | None:
        if len(self.queue) >= QUEUED_MAX:
            return None
        index = self.created
        self.created += 1
        self.created_ms.append(now_ms)
        values = [f"{self.name}:{index}:{i}".encode() for i in range(self.rng.randint(1, 3))]
        batch = SimBatch(producer=self.name, index=index, values=values, created_ms=now_ms)
        batch.ident = bytes(batch.records(-1, -1, -1)[HEADER_SIZE:])
        self.queue.append(batch)
        self._watch_idle(now_ms)
        return batch

    def sends(self, now_ms: int, next_request_id, *, leader: int = -1, leader_epoch: int = -1) -> list[Send]:
        """What goes out now: the SDK drains one batch per partition a turn, and turns again
        while something went (bounded here by the in-flight limit)."""
        tp = 0
        core = self.core
        out: list[Send] = []
        for _ in range(core.in_flight_per_partition_max):
            retry = core.retry_due(tp, now_ms)
            if retry is not None:
                batch, stamp = retry, core.resend(tp, retry, now_ms=now_ms)
                self.counts["resends"] += 1
            elif self.queue and core.may_send_new(tp):
                batch = self.queue.pop(0)
                stamp = core.send_new(tp, batch, record_count=len(batch.values), created_ms=batch.created_ms,
                                      now_ms=now_ms)
            else:
                break
            used = self.stamps.setdefault(batch.index, set())
            used.add((stamp.producer_id, stamp.producer_epoch, stamp.base_sequence))
            self.counts["renumbered"] += len(used) > 1 and retry is not None
            rid = next_request_id()
            self.requests[rid] = batch
            self.sent[rid] = batch
            if self.attempts is not None:
                self.attempt_of[rid] = self.attempts.start(batch, broker=leader, leader_epoch=leader_epoch,
                                                           now_ms=now_ms)
                self.request_of[batch.index] = rid
            out.append(Send(request_id=rid, batch=batch,
                            records=batch.records(stamp.producer_id, stamp.producer_epoch, stamp.base_sequence)))
        self._watch_idle(now_ms)
        return out

    def answered(self, request_id: int, error: ErrorCode, base_offset: int, now_ms: int) -> list[Outcome[SimBatch]]:
        self.answers.setdefault(request_id, error)
        batch = self._end(request_id)
        if batch is None:
            # A late answer: the request already timed out on the client.
            late = self.sent.get(request_id)
            if late is not None and error is ErrorCode.NONE and late.index not in self.acked:
                self.late_successes.setdefault(late.index, now_ms)
            return []
        outcomes = self._note(self.core.answered(batch, error=error, base_offset=base_offset, now_ms=now_ms),
                              now_ms)
        if error is ErrorCode.NONE and batch.index in self.failed:
            # Answered in time for the request, but the batch had passed its delivery timeout.
            self.late_successes.setdefault(batch.index, now_ms)
        return outcomes

    def timed_out(self, request_id: int, now_ms: int) -> list[Outcome[SimBatch]]:
        batch = self._end(request_id)
        if batch is None:
            return []
        self.counts["timeouts"] += 1
        return self._note(self.core.no_answer(batch, now_ms=now_ms, reason="request timeout"), now_ms)

    def _end(self, request_id: int) -> SimBatch | None:
        """The request ended: its batch, or None if the producer no longer waits for it."""
        batch = self.requests.pop(request_id, None)
        if self.attempts is None:
            return batch
        # With give-ups, the SDK's own gate decides whether an answer is news.
        attempt = self.attempt_of.pop(request_id, None)
        if attempt is None:
            return None   # this request ended already (timed out)
        batch = self.sent[request_id]
        if not self.attempts.finish(batch, attempt):
            return None   # given up: the late news of a replaced leader
        self.request_of.pop(batch.index, None)
        return batch

    def reroute(self, now_ms: int, *, leader: int, leader_epoch: int) -> list[Outcome[SimBatch]]:
        """As the SDK's sender: when an attempt has waited long, look at the leader (the
        simulation's metadata is the controller's own) and give up attempts it replaced."""
        if self.attempts is None or not self.attempts.probe_due(now_ms):
            return []
        self.attempts.probed(now_ms)
        out: list[Outcome[SimBatch]] = []
        for batch in self.attempts.give_up_deposed(lambda _: (leader, leader_epoch)):
            rid = self.request_of.pop(batch.index)
            del self.requests[rid]   # no longer waited for; its end comes to _end all the same
            self.counts["given_up"] += 1
            out += self.core.no_answer(batch, now_ms=now_ms, reason="its leader was replaced")
        return self._note(out, now_ms)

    def expire(self, now_ms: int) -> list[Outcome[SimBatch]]:
        out: list[Outcome[SimBatch]] = []
        while self.queue and now_ms >= self.queue[0].created_ms + self.core.delivery_timeout_ms:
            batch = self.queue.pop(0)
            out.append(Fail(batch=batch, error=ErrorCode.REQUEST_TIMED_OUT, outcome_unknown=False,
                            reason="never sent"))
        return self._note(out + self.core.expire(now_ms), now_ms)

    def _note(self, outcomes: list[Outcome[SimBatch]], now_ms: int) -> list[Outcome[SimBatch]]:
        for outcome in outcomes:
            if isinstance(outcome, Acknowledge):
                self.acked[outcome.batch.index] = outcome.base_offset
            else:
                self.failed[outcome.batch.index] = outcome
                self.failed_ms[outcome.batch.index] = now_ms
        self._watch_idle(now_ms)
        return outcomes

    def _watch_idle(self, now_ms: int) -> None:
        """Note when the producer holds a batch without an outcome and has no request out."""
        idle = not self.requests and len(self.acked) + len(self.failed) < self.created
        if idle and not (self.idle and self.idle[-1][1] is None):
            self.idle.append([now_ms, None])
        elif not idle and self.idle and self.idle[-1][1] is None:
            self.idle[-1][1] = now_ms

    def progress_problem(self, *, settled_ms: int, now_ms: int) -> str | None:
        """Liveness once the cluster settled at settled_ms (tests/sim/README.md), or None.

        The producer is never idle with work: no span, after settled_ms, holding a batch without
        an outcome and no request out lasts longer than a retry backoff and the gap to the next
        produce tick (a partition waiting forever: an epoch bump under an outcome that never
        resolves, an in-flight slot never released, a backoff never due).

        Some batch made after settled_ms is acknowledged, unless the producer gave up on them
        legitimately: its timeouts are shorter than the healed cluster's acks=all latency under
        its load (the queue's wait counts in the delivery timeout, as in Kafka). That is shown,
        not assumed: every such batch that failed failed by its delivery timeout and no earlier,
        and every one of them that was sent was committed, the leader answering success after the
        producer had stopped waiting for it (or a request of it is still unanswered at the end:
        the replicas' own check holds no request past its deadline)."""
        idle, idle_at = self.longest_idle(since_ms=settled_ms, now_ms=now_ms)
        idle_max = self.core.retry_backoff_ms + PRODUCE_TICK_MAX_MS
        if idle > idle_max:
            return (f"idle for {idle} ms from {idle_at} ms (more than {idle_max} ms) with batches lacking "
                    f"an outcome and no request out")
        late = [b for b in range(self.created) if self.created_ms[b] >= settled_ms]
        if not late or any(b in self.acked for b in late):
            return None
        problem = "none of its batches made after the cluster settled was acknowledged"
        unanswered = {batch.index for rid, batch in self.sent.items() if rid not in self.answers}
        sent = {batch.index for batch in self.sent.values()}
        for b in late:
            fail = self.failed.get(b)
            if fail is None:
                continue
            due_ms = self.created_ms[b] + self.core.delivery_timeout_ms
            if fail.error is not ErrorCode.REQUEST_TIMED_OUT or self.failed_ms[b] < due_ms:
                return f"{problem}, and batch {b} failed at {self.failed_ms[b]} ms ({fail.error.name}): {fail.reason}"
            if b in sent and b not in self.late_successes and b not in unanswered:
                return f"{problem}, and batch {b} was sent but no leader answered it with success"
        if not any(b in self.late_successes for b in late):
            return f"{problem}, and no leader answered any of them with success"
        return None   # the cluster committed them all, later than this producer would wait

    def longest_idle(self, *, since_ms: int, now_ms: int) -> tuple[int, int]:
        """The longest idle span after since_ms (its length, its start), counting an open one to now_ms."""
        longest = (0, since_ms)
        for start, end in self.idle:
            assert start is not None
            end = now_ms if end is None else end
            if end > since_ms:
                longest = max(longest, (end - max(start, since_ms), max(start, since_ms)))
        return longest
