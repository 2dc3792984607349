"""The producer's batching, without sockets or clocks; its protocol is the producer core.

Records are encoded into the open batch of their partition's queue as they are appended
(common.batch.BatchWriter), so a batch is bytes from the start. This module owns what is
not yet sent: the queues, linger, batch size and buffer memory. Everything after a batch's
first send (its numbers, retries, in-flight limits, epochs, delivery timeout of what was
sent) is dataplane/client/producer_core.py, which `drain`, `complete`, `no_answer` and
`expire` consult. Time is an argument everywhere.

- a batch is sealed (its header stamped) when it is first drained; it is sealed again only
  when the core gives it new numbers, which it does only for a batch never appended;
- a partition's queued batches leave in order, after any batch the core must send again.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Callable

from common.batch import HEADER_SIZE, BatchWriter, Buffer, Compression
from common.errors import ErrorCode
from dataplane.client.futures import BatchOutcome
from dataplane.client.producer_core import Acknowledge, Fail, Outcome, ProducerCore, Stamp, id_error_kind
from dataplane.client.records import TopicPartition

RECORD_OVERHEAD_BYTES = 24  # varints, attributes and deltas of one record, an upper bound for sizing


def record_size_bytes(value: Buffer | None, key: Buffer | None, headers: bytes) -> int:
    """An upper bound on the bytes a record takes in a batch (before it is encoded)."""
    return RECORD_OVERHEAD_BYTES + (len(value) if value is not None else 0) + (len(key) if key is not None else 0) \
        + len(headers)


@dataclass(eq=False)
class ProducerBatch:
    """One partition's batch: its records already encoded in `writer`, one outcome for all."""

    tp: TopicPartition
    created_ms: int
    writer: BatchWriter = field(default_factory=BatchWriter)
    outcome: BatchOutcome = field(init=False)
    buffer_bytes: int = 0      # what it holds of the buffer memory, returned when it completes
    stamp: Stamp | None = None
    payload: bytes | bytearray | None = None
    attempts: int = 0

    def __post_init__(self) -> None:
        self.outcome = BatchOutcome(self.tp)

    @property
    def base_sequence(self) -> int:
        return -1 if self.stamp is None else self.stamp.base_sequence

    @property
    def record_count(self) -> int:
        return self.writer.record_count

    @property
    def size_bytes(self) -> int:
        return self.writer.size_bytes


class PartitionState:
    __slots__ = ("queue",)

    def __init__(self) -> None:
        self.queue: collections.deque[ProducerBatch] = collections.deque()   # never sent, oldest first

    def __repr__(self) -> str:
        return f"PartitionState(queued={len(self.queue)})"


class Accumulator:
    def __init__(self, *, batch_size_bytes: int = 16_384, linger_ms: int = 5,
                 buffer_memory_bytes: int = 32 * 1024 * 1024, in_flight_per_partition_max: int = 5,
                 retries_max: int = 2_147_483_647, retry_backoff_ms: int = 100,
                 delivery_timeout_ms: int = 120_000, idempotent: bool = True,
                 compression: Compression = Compression.NONE, producer_id: int = -1, producer_epoch: int = -1,
                 on_batch_closed: Callable[[TopicPartition], None] | None = None) -> None:
        for name, value, low in (("batch_size_bytes", batch_size_bytes, HEADER_SIZE + RECORD_OVERHEAD_BYTES),
                                 ("linger_ms", linger_ms, 0), ("buffer_memory_bytes", buffer_memory_bytes, 1)):
            if not isinstance(value, int) or value < low:
                raise ValueError(f"{name}={value!r} must be an integer >= {low}")
        self.core: ProducerCore[ProducerBatch] = ProducerCore(
            idempotent=idempotent, in_flight_per_partition_max=in_flight_per_partition_max,
            retry_backoff_ms=retry_backoff_ms, delivery_timeout_ms=delivery_timeout_ms, retries_max=retries_max)
        if idempotent and producer_id >= 0:
            self.core.set_producer_id(producer_id=producer_id, producer_epoch=max(producer_epoch, 0))
        self.batch_size_bytes = batch_size_bytes
        self.linger_ms = linger_ms
        self.buffer_memory_bytes = buffer_memory_bytes
        self.in_flight_per_partition_max = self.core.in_flight_per_partition_max
        self.delivery_timeout_ms = delivery_timeout_ms
        self.idempotent = idempotent
        self.compression = compression
        self.on_batch_closed = on_batch_closed
        self.partitions: dict[TopicPartition, PartitionState] = {}
        self.buffer_used_bytes = 0
        self.flushing = False

    # ------------------------------------------------------------ appending

    def has_memory_for(self, size_bytes: int) -> bool:
        # A record larger than the whole buffer may go alone into an empty buffer; otherwise it
        # could never be sent at all.
        return self.buffer_used_bytes == 0 or self.buffer_used_bytes + size_bytes <= self.buffer_memory_bytes

    def append(self, tp: TopicPartition, value: bytes | None, key: bytes | None, headers: bytes,
               timestamp_ms: int, *, now_ms: int) -> tuple[ProducerBatch, int]:
        """Encode a record into tp's open batch, or a new one when it does not fit (the caller
        checked has_memory_for). Returns the batch and the record's index in it.
        `headers` is the encoded header section (common.batch.encode_headers; NO_HEADERS: none)."""
        state = self.partitions.get(tp)
        if state is None:
            state = self.partitions[tp] = PartitionState()
        queue = state.queue
        if queue:
            batch = queue[-1]
            writer = batch.writer
            added = writer.append(value, key, headers, timestamp_ms, self.batch_size_bytes)
            if added:
                batch.buffer_bytes += added
                self.buffer_used_bytes += added
                return batch, writer.record_count - 1
            if self.on_batch_closed:
                self.on_batch_closed(tp)
        batch = ProducerBatch(tp=tp, created_ms=now_ms)
        queue.append(batch)
        added = batch.writer.append(value, key, headers, timestamp_ms)
        batch.buffer_bytes += added
        self.buffer_used_bytes += added
        return batch, batch.writer.record_count - 1

    # ------------------------------------------------------------ draining

    def _ready(self, state: PartitionState, batch: ProducerBatch, now_ms: int, closing: bool) -> bool:
        # A batch lingers only while an earlier one of its partition awaits an answer: lingering
        # is for filling batches while the pipe is busy, and an idle partition's record gains
        # nothing by waiting (as Nagle's algorithm). Under load something is always in flight,
        # so batches fill as before.
        return (len(state.queue) > 1 or batch.size_bytes >= self.batch_size_bytes or self.flushing or closing
                or now_ms >= batch.created_ms + self.linger_ms or not self.core.outstanding(batch.tp))

    def _partitions_with_work(self) -> list[TopicPartition]:
        tps = [tp for tp, state in self.partitions.items() if state.queue]
        for tp in self.core.partitions:
            if isinstance(tp, TopicPartition) and self.core.outstanding(tp) \
                    and not (tp in self.partitions and self.partitions[tp].queue):
                tps.append(tp)
        return tps

    def drain(self, now_ms: int, leader_of: Callable[[TopicPartition], int | None], *,
              request_bytes_max: int = 1024 * 1024, closing: bool = False) -> dict[int, list[ProducerBatch]]:
        """Batches to send now, grouped by leader broker id, at most one batch per partition
        per call and at most `request_bytes_max` per broker (the first batch always goes).
        A batch the core must send again goes before the partition's queue."""
        out: dict[int, list[ProducerBatch]] = {}
        sizes: dict[int, int] = {}
        core = self.core
        for tp in self._partitions_with_work():
            retry = core.retry_due(tp, now_ms)
            state = self.partitions.get(tp)
            if retry is None:
                if state is None or not state.queue or not core.may_send_new(tp):
                    continue
                batch = state.queue[0]
                if not self._ready(state, batch, now_ms, closing):
                    continue
            else:
                batch = retry
            leader = leader_of(tp)
            if leader is None:
                continue
            size = batch.size_bytes
            if leader in sizes and sizes[leader] + size > request_bytes_max:
                continue
            if retry is None:
                assert state is not None
                state.queue.popleft()
                if self.on_batch_closed and not state.queue:
                    self.on_batch_closed(tp)
                stamp = core.send_new(tp, batch, record_count=batch.record_count, created_ms=batch.created_ms,
                                      now_ms=now_ms)
            else:
                stamp = core.resend(tp, batch, now_ms=now_ms)
            if stamp != batch.stamp or batch.payload is None:
                batch.stamp = stamp
                batch.payload = batch.writer.seal(producer_id=stamp.producer_id, producer_epoch=stamp.producer_epoch,
                                                  base_sequence=stamp.base_sequence, compression=self.compression)
            batch.attempts += 1
            out.setdefault(leader, []).append(batch)
            sizes[leader] = sizes.get(leader, 0) + size
        return out

    def next_ready_ms(self, now_ms: int) -> int | None:
        """The earliest time a batch becomes ready by linger, backoff or delivery timeout (None:
        nothing will by time alone). A partition at its in-flight limit waits for an answer."""
        best = self.core.next_due_ms()
        for tp, state in self.partitions.items():
            if not state.queue or not self.core.may_send_new(tp):
                continue
            at = state.queue[0].created_ms + self.linger_ms
            best = at if best is None else min(best, at)
        for state in self.partitions.values():
            if state.queue:
                at = state.queue[0].created_ms + self.delivery_timeout_ms
                best = at if best is None else min(best, at)
        return best

    # ------------------------------------------------------------ answers

    def complete(self, batch: ProducerBatch, *, error_code: ErrorCode, base_offset: int,
                 now_ms: int) -> list[Outcome[ProducerBatch]]:
        """The leader's answer for `batch`: the outcomes to give callers (none: it is retried)."""
        return self._released(self.core.answered(batch, error=error_code, base_offset=base_offset, now_ms=now_ms))

    def no_answer(self, batch: ProducerBatch, *, now_ms: int, reason: str,
                  sent: bool = True) -> list[Outcome[ProducerBatch]]:
        """The request carrying `batch` ended unanswered: it may have been appended (unless
        `sent` is False: no connection could be made)."""
        return self._released(self.core.no_answer(batch, now_ms=now_ms, reason=reason, sent=sent))

    def producer_id_failed(self, *, error: ErrorCode, now_ms: int, reason: str) -> list[Outcome[ProducerBatch]]:
        """InitProducerId failed (the core decides what that means and when to ask again). When
        the error is not retriable, the batches waiting for an identity fail with it: the core's
        and every queued one (none was sent, so none is in the log)."""
        outcomes = self.core.id_request_failed(error=error, now_ms=now_ms, reason=reason)
        if id_error_kind(error) != "retry":
            why = f"no producer id: InitProducerId answered {error.name}; not sent" + (f": {reason}" if reason else "")
            for state in self.partitions.values():
                outcomes += [Fail(batch=b, error=error, outcome_unknown=False, reason=why) for b in state.queue]
                state.queue.clear()
        return self._released(outcomes)

    def _released(self, outcomes: list[Outcome[ProducerBatch]]) -> list[Outcome[ProducerBatch]]:
        for outcome in outcomes:
            self._release(outcome.batch)
        return outcomes

    def _release(self, batch: ProducerBatch) -> None:
        self.buffer_used_bytes -= batch.buffer_bytes
        batch.buffer_bytes = 0  # released once
        assert self.buffer_used_bytes >= 0, "buffer accounting went negative"

    def expire(self, now_ms: int) -> list[Outcome[ProducerBatch]]:
        """Fail batches older than delivery_timeout_ms: queued ones (never sent, so not written)
        and, through the core, sent ones. A queue is in creation order, so only its front is
        looked at: this runs on every turn of the sender."""
        expired: list[Outcome[ProducerBatch]] = []
        cutoff = now_ms - self.delivery_timeout_ms
        for state in self.partitions.values():
            queue = state.queue
            while queue and queue[0].created_ms <= cutoff:
                batch = queue.popleft()
                expired.append(Fail(batch=batch, error=ErrorCode.REQUEST_TIMED_OUT, outcome_unknown=False,
                                    reason=f"not sent within delivery_timeout_ms={self.delivery_timeout_ms} "
                                           + ("(waiting for a producer id: no broker gave one)"
                                              if self.core.producer_id_wanted else "(no leader reachable?)")))
        expired += self.core.expire(now_ms)
        return self._released(expired)

    def in_flight_count(self) -> int:
        return self.core.in_flight_total()

    def pending_batches(self) -> int:
        return sum(len(s.queue) for s in self.partitions.values()) + self.core.outstanding()

    def fail_queued(self) -> list[ProducerBatch]:
        """Take every never-sent batch (the sender stopped; sent ones still get their answers)."""
        out: list[ProducerBatch] = []
        for state in self.partitions.values():
            out.extend(state.queue)
            state.queue.clear()
        for batch in out:
            self._release(batch)
        return out

    def fail_all(self) -> list[ProducerBatch]:
        """Take every batch whose caller was not told yet, queued or sent (the producer closes)."""
        out: list[ProducerBatch] = []
        for state in self.partitions.values():
            out.extend(state.queue)
            state.queue.clear()
        out += self.core.abandon()
        for batch in out:
            self._release(batch)
        return out


__all__ = ["Accumulator", "Acknowledge", "Fail", "ProducerBatch", "RECORD_OVERHEAD_BYTES", "record_size_bytes"]
