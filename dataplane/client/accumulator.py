"""The producer's batching and sequencing rules, without sockets or clocks.

Records are encoded into the open batch of their partition's queue as they are appended
(common.batch.BatchWriter), so a batch is bytes from the start; `drain(now_ms, ...)`
says which batches to send to which broker; `complete(...)` takes each
partition's answer and says what happened (acknowledged, queued for retry, or
failed). Time is an argument everywhere.

Ordering rules (idempotent or not):
- a batch gets its base sequence when it is first drained, and its header is
  sealed then and never rewritten (until a new producer epoch), so a retry resends
  exactly the same bytes and sequence;
- at most `in_flight_per_partition_max` batches of one partition are in flight;
- after a retriable failure the partition enters retry mode: the failed batch
  goes back to the head of the queue in sequence order, and until every batch
  that was in flight at that point has been acknowledged the partition sends one
  batch at a time, so a retry never overtakes an earlier batch;
- a batch that finally fails in idempotent mode leaves a gap in the sequence the
  broker would reject for ever: `epoch_bump_needed` turns true and the driver
  asks for a new producer epoch, then calls `reset_sequences`.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Callable

from common.batch import HEADER_SIZE, BatchWriter, Compression
from common.errors import ErrorCode
from dataplane.client.futures import BatchOutcome
from dataplane.client.records import TopicPartition

RECORD_OVERHEAD_BYTES = 24  # varints, attributes and deltas of one record, an upper bound for sizing


def record_size_bytes(value: bytes | None, key: bytes | None, headers: bytes) -> int:
    """An upper bound on the bytes a record takes in a batch (before it is encoded)."""
    return RECORD_OVERHEAD_BYTES + (len(value) if value is not None else 0) + (len(key) if key is not None else 0) \
        + len(headers)


@dataclass(eq=False)
class ProducerBatch:
    """One partition's batch: its records already encoded in `writer`, one outcome for all."""

    tp: TopicPartition
    created_ms: int
    writer: BatchWriter = field(default_factory=BatchWriter)
    outcome: BatchOutcome | None = None
    buffer_bytes: int = 0      # what it holds of the buffer memory, returned when it completes
    base_sequence: int = -1
    payload: bytes | bytearray | None = None
    attempts: int = 0
    retry_at_ms: int = 0
    in_flight: bool = False

    def __post_init__(self) -> None:
        if self.outcome is None:
            self.outcome = BatchOutcome(self.tp)

    @property
    def record_count(self) -> int:
        return self.writer.record_count

    @property
    def size_bytes(self) -> int:
        return self.writer.size_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    """What `complete` decided. kind: "acked", "retry" or "failed"."""

    kind: str
    batch: ProducerBatch
    base_offset: int = -1
    error_code: ErrorCode = ErrorCode.NONE


class PartitionState:
    __slots__ = ("queue", "next_sequence", "in_flight", "retrying")

    def __init__(self) -> None:
        self.queue: collections.deque[ProducerBatch] = collections.deque()
        self.next_sequence = 0
        self.in_flight: list[ProducerBatch] = []   # in sequence (drain) order
        self.retrying = False

    def __repr__(self) -> str:
        return (f"PartitionState(queued={len(self.queue)}, in_flight={len(self.in_flight)}, "
                f"next_sequence={self.next_sequence}, retrying={self.retrying})")


class Accumulator:
    def __init__(self, *, batch_size_bytes: int = 16_384, linger_ms: int = 5,
                 buffer_memory_bytes: int = 32 * 1024 * 1024, in_flight_per_partition_max: int = 5,
                 retries_max: int = 2_147_483_647, retry_backoff_ms: int = 100,
                 delivery_timeout_ms: int = 120_000, idempotent: bool = True,
                 compression: Compression = Compression.NONE, producer_id: int = -1, producer_epoch: int = -1,
                 on_batch_closed: Callable[[TopicPartition], None] | None = None) -> None:
        for name, value, low in (("batch_size_bytes", batch_size_bytes, HEADER_SIZE + RECORD_OVERHEAD_BYTES),
                                 ("linger_ms", linger_ms, 0), ("buffer_memory_bytes", buffer_memory_bytes, 1),
                                 ("in_flight_per_partition_max", in_flight_per_partition_max, 1),
                                 ("retries_max", retries_max, 0), ("retry_backoff_ms", retry_backoff_ms, 0),
                                 ("delivery_timeout_ms", delivery_timeout_ms, 1)):
            if not isinstance(value, int) or value < low:
                raise ValueError(f"{name}={value!r} must be an integer >= {low}")
        self.batch_size_bytes = batch_size_bytes
        self.linger_ms = linger_ms
        self.buffer_memory_bytes = buffer_memory_bytes
        self.in_flight_per_partition_max = in_flight_per_partition_max
        self.retries_max = retries_max
        self.retry_backoff_ms = retry_backoff_ms
        self.delivery_timeout_ms = delivery_timeout_ms
        self.idempotent = idempotent
        self.compression = compression
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self.on_batch_closed = on_batch_closed
        self.partitions: dict[TopicPartition, PartitionState] = {}
        self.buffer_used_bytes = 0
        self.flushing = False
        self.epoch_bump_needed = False

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
            if batch.payload is None and not batch.attempts:   # still open for appends
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
        if batch.attempts > 0:
            return now_ms >= batch.retry_at_ms
        return (len(state.queue) > 1 or batch.size_bytes >= self.batch_size_bytes or self.flushing or closing
                or now_ms >= batch.created_ms + self.linger_ms)

    def drain(self, now_ms: int, leader_of: Callable[[TopicPartition], int | None], *,
              request_bytes_max: int = 1024 * 1024, closing: bool = False) -> dict[int, list[ProducerBatch]]:
        """Batches to send now, grouped by leader broker id, at most one batch per partition
        per call and at most `request_bytes_max` per broker (the first batch always goes)."""
        out: dict[int, list[ProducerBatch]] = {}
        sizes: dict[int, int] = {}
        if self.epoch_bump_needed:
            return out
        for tp, state in self.partitions.items():
            if not state.queue:
                continue
            limit = 1 if state.retrying else self.in_flight_per_partition_max
            if len(state.in_flight) >= limit:
                continue
            batch = state.queue[0]
            if not self._ready(state, batch, now_ms, closing):
                continue
            leader = leader_of(tp)
            if leader is None:
                continue
            size = batch.size_bytes
            if leader in sizes and sizes[leader] + size > request_bytes_max:
                continue
            state.queue.popleft()
            if batch.payload is None:
                self._seal(state, batch)
                if self.on_batch_closed and not state.queue:
                    self.on_batch_closed(tp)
            batch.in_flight = True
            batch.attempts += 1
            state.in_flight.append(batch)
            out.setdefault(leader, []).append(batch)
            sizes[leader] = sizes.get(leader, 0) + size
        return out

    def _seal(self, state: PartitionState, batch: ProducerBatch) -> None:
        if self.idempotent:
            batch.base_sequence = state.next_sequence
            state.next_sequence = (state.next_sequence + batch.record_count) & 0x7FFFFFFF
        batch.payload = batch.writer.seal(producer_id=self.producer_id if self.idempotent else -1,
                                          producer_epoch=self.producer_epoch if self.idempotent else -1,
                                          base_sequence=batch.base_sequence, compression=self.compression)

    def next_ready_ms(self, now_ms: int) -> int | None:
        """The earliest time a queued batch becomes ready by linger or backoff (None: nothing will
        by time alone). A partition at its in-flight limit waits for an answer, not for a time."""
        best: int | None = None
        for state in self.partitions.values():
            if not state.queue or self.epoch_bump_needed:
                continue
            if len(state.in_flight) >= (1 if state.retrying else self.in_flight_per_partition_max):
                continue
            batch = state.queue[0]
            at = batch.retry_at_ms if batch.attempts > 0 else batch.created_ms + self.linger_ms
            best = at if best is None else min(best, at)
        return best

    # ------------------------------------------------------------ answers

    def complete(self, batch: ProducerBatch, *, error_code: ErrorCode, base_offset: int, now_ms: int) -> Outcome:
        state = self.partitions[batch.tp]
        assert batch.in_flight, "a batch completes only while in flight"
        was_first_in_flight = state.in_flight[0] is batch
        state.in_flight.remove(batch)
        batch.in_flight = False
        if error_code in (ErrorCode.NONE, ErrorCode.DUPLICATE_SEQUENCE):
            self._release(batch)
            if state.retrying and not state.in_flight and not any(b.attempts for b in state.queue):
                state.retrying = False
            return Outcome(kind="acked", batch=batch, base_offset=base_offset if error_code == ErrorCode.NONE else -1,
                           error_code=error_code)
        retriable = error_code.retriable or (self.idempotent and error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE)
        expired = now_ms - batch.created_ms >= self.delivery_timeout_ms
        if (self.idempotent and error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE and was_first_in_flight
                and not any(b.attempts and 0 <= b.base_sequence < batch.base_sequence for b in state.queue)
                and not expired and batch.attempts <= self.retries_max):
            # Nothing earlier is outstanding, yet the leader expected another sequence: it lost
            # this producer's state (or never had it). Waiting will not help; a new producer
            # epoch restarts every partition at sequence 0 and the batch goes again.
            batch.retry_at_ms = now_ms + self.retry_backoff_ms
            self._requeue(state, batch)
            state.retrying = True
            self.epoch_bump_needed = True
            return Outcome(kind="retry", batch=batch, error_code=error_code)
        if retriable and batch.attempts <= self.retries_max and not expired:
            batch.retry_at_ms = now_ms + self.retry_backoff_ms
            self._requeue(state, batch)
            state.retrying = True
            return Outcome(kind="retry", batch=batch, error_code=error_code)
        self._release(batch)
        if self.idempotent and batch.base_sequence >= 0:
            self.epoch_bump_needed = True
        return Outcome(kind="failed", batch=batch, error_code=error_code if not expired or not retriable
                       else ErrorCode.REQUEST_TIMED_OUT)

    def _requeue(self, state: PartitionState, batch: ProducerBatch) -> None:
        # Sealed batches go back in sequence (drain) order, ahead of every unsealed one.
        index = 0
        for queued in state.queue:
            if queued.payload is None or (batch.base_sequence >= 0 and queued.base_sequence > batch.base_sequence):
                break
            if batch.base_sequence < 0 and queued.created_ms > batch.created_ms:
                break
            index += 1
        state.queue.insert(index, batch)

    def _release(self, batch: ProducerBatch) -> None:
        self.buffer_used_bytes -= batch.buffer_bytes
        batch.buffer_bytes = 0  # released once
        assert self.buffer_used_bytes >= 0, "buffer accounting went negative"

    def expire(self, now_ms: int) -> list[ProducerBatch]:
        """Remove and return queued (not in-flight) batches older than delivery_timeout_ms.
        A queue is in creation order (retries go back in sequence order, which is creation
        order), so only its front is looked at: this runs on every turn of the sender."""
        expired: list[ProducerBatch] = []
        cutoff = now_ms - self.delivery_timeout_ms
        for state in self.partitions.values():
            queue = state.queue
            while queue and queue[0].created_ms <= cutoff:
                batch = queue.popleft()
                expired.append(batch)
                self._release(batch)
                if self.idempotent and batch.base_sequence >= 0:
                    self.epoch_bump_needed = True
        return expired

    def in_flight_count(self) -> int:
        return sum(len(s.in_flight) for s in self.partitions.values())

    def reset_sequences(self, *, producer_id: int, producer_epoch: int) -> None:
        """After a new producer epoch (nothing in flight): every partition restarts at sequence 0
        and queued batches are rebuilt with the new epoch."""
        assert self.in_flight_count() == 0, "sequences reset only with nothing in flight"
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        for state in self.partitions.values():
            state.next_sequence = 0
            state.retrying = False
            for batch in state.queue:
                batch.payload = None
                batch.base_sequence = -1
        self.epoch_bump_needed = False

    def pending_batches(self) -> int:
        return sum(len(s.queue) + len(s.in_flight) for s in self.partitions.values())

    def fail_all_queued(self) -> list[ProducerBatch]:
        out = []
        for state in self.partitions.values():
            while state.queue:
                batch = state.queue.popleft()
                self._release(batch)
                out.append(batch)
        return out
