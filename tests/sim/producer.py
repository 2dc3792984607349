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
from dataplane.client.producer_core import Acknowledge, Fail, Outcome, ProducerCore

QUEUED_MAX = 8   # never-sent batches a producer holds (the SDK's buffer memory, in miniature)


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
                 in_flight_max: int, retry_backoff_ms: int) -> None:
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
        self.acked: dict[int, int] = {}            # batch index -> base offset
        self.failed: dict[int, Fail[SimBatch]] = {}
        self.counts = {"timeouts": 0, "resends": 0, "renumbered": 0}   # what the run exercised
        self.stamps: dict[int, set[tuple[int, int, int]]] = {}          # batch index -> stamps used

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
        return batch

    def sends(self, now_ms: int, next_request_id) -> list[Send]:
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
            out.append(Send(request_id=rid, batch=batch,
                            records=batch.records(stamp.producer_id, stamp.producer_epoch, stamp.base_sequence)))
        return out

    def answered(self, request_id: int, error: ErrorCode, base_offset: int, now_ms: int) -> list[Outcome[SimBatch]]:
        batch = self.requests.pop(request_id, None)
        if batch is None:
            return []   # a late answer: the request already timed out on the client
        return self._note(self.core.answered(batch, error=error, base_offset=base_offset, now_ms=now_ms))

    def timed_out(self, request_id: int, now_ms: int) -> list[Outcome[SimBatch]]:
        batch = self.requests.pop(request_id, None)
        if batch is None:
            return []
        self.counts["timeouts"] += 1
        return self._note(self.core.no_answer(batch, now_ms=now_ms, reason="request timeout"))

    def expire(self, now_ms: int) -> list[Outcome[SimBatch]]:
        out: list[Outcome[SimBatch]] = []
        while self.queue and now_ms >= self.queue[0].created_ms + self.core.delivery_timeout_ms:
            batch = self.queue.pop(0)
            out.append(Fail(batch=batch, error=ErrorCode.REQUEST_TIMED_OUT, outcome_unknown=False,
                            reason="never sent"))
        return self._note(out + self.core.expire(now_ms))

    def _note(self, outcomes: list[Outcome[SimBatch]]) -> list[Outcome[SimBatch]]:
        for outcome in outcomes:
            if isinstance(outcome, Acknowledge):
                self.acked[outcome.batch.index] = outcome.base_offset
            else:
                self.failed[outcome.batch.index] = outcome
        return outcomes
