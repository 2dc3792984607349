"""Idempotent producers, per partition: who wrote which sequences at which offsets.

Pure and deterministic: it only looks at batch headers (never decodes records)
and at the time it is handed. Every replica keeps one, fed by every batch its
log gains (leader writes, follower appends, and a scan of the log on open), so
a new leader knows what its predecessor accepted.

Rules for a batch of an idempotent producer (producer_id >= 0) on the leader
(Kafka's, which the SDK in dataplane/client follows):
- an older producer epoch than the one known: INVALID_PRODUCER_EPOCH (fenced);
- a newer epoch must start at sequence 0 (a new epoch restarts sequences);
- the same (base, last) sequence as one of the last `batches_per_producer`
  batches: a duplicate; the caller answers it with that batch's offsets;
- a batch older than all of those: DUPLICATE_SEQUENCE (already written long ago);
- otherwise it must follow the last sequence exactly, else OUT_OF_ORDER_SEQUENCE.
An unknown producer must start at sequence 0, else UNKNOWN_PRODUCER_ID: its state may
have expired, and guessing would let a retried batch in twice. (Kafka's leaders since
KIP-360 accept any sequence there; the error keeps the stricter rule while telling the
producer, as Kafka's own code does, that this leader has no state for it: the producer
then takes a new epoch, dataplane/client/producer_core.py.)
"""
from __future__ import annotations

import collections
import dataclasses

from typing import TYPE_CHECKING

from common.errors import ErrorCode

if TYPE_CHECKING:
    from common.batch import BatchHeader
    from dataplane.replica.logview import LogView

SEQUENCE_MASK = 0x7FFFFFFF  # sequences are non-negative int32s that wrap
BATCHES_PER_PRODUCER = 5    # what the SDK may keep in flight per partition


def last_sequence(base_sequence: int, record_count: int) -> int:
    return (base_sequence + record_count - 1) & SEQUENCE_MASK


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class BatchEntry:
    base_sequence: int
    last_sequence: int
    base_offset: int
    last_offset: int


@dataclasses.dataclass(slots=True)
class ProducerEntry:
    epoch: int
    last_timestamp_ms: int
    batches: collections.deque[BatchEntry]  # oldest first, at most batches_per_producer
    # The replica's wall clock when it last wrote or learned of a batch of this producer (-1:
    # never). Idle time runs from the later of this and last_timestamp_ms, which the client
    # sets: by the timestamp alone, a producer sending records stamped a week ago (a replay, a
    # mirror) was forgotten at once, and its next batch refused UNKNOWN_PRODUCER_ID. Not in
    # snapshots or comparisons: a table is what the log's batches say, whenever it was read.
    seen_ms: int = dataclasses.field(default=-1, compare=False)

    @property
    def idle_since_ms(self) -> int:
        return max(self.last_timestamp_ms, self.seen_ms)

    @property
    def last_sequence(self) -> int:
        return self.batches[-1].last_sequence if self.batches else -1


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class SequenceCheck:
    """`error` NONE and `duplicate` set: answer with the original offsets, write nothing."""

    error: ErrorCode = ErrorCode.NONE
    duplicate: BatchEntry | None = None
    reason: str = ""


ACCEPT = SequenceCheck()


class ProducerStateTable:
    """Producer id -> ProducerEntry, bounded by `producers_max` (least recently written
    goes first) and expiring producers idle longer than `producer_idle_ms_max`."""

    def __init__(self, *, producers_max: int = 10_000, producer_idle_ms_max: int = 7 * 24 * 3600 * 1000,
                 batches_per_producer: int = BATCHES_PER_PRODUCER) -> None:
        for name, value in (("producers_max", producers_max), ("producer_idle_ms_max", producer_idle_ms_max),
                            ("batches_per_producer", batches_per_producer)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        self.producers_max = producers_max
        self.producer_idle_ms_max = producer_idle_ms_max
        self.batches_per_producer = batches_per_producer
        # Insertion order = order of last write: the front is the least recently written.
        self.producers: collections.OrderedDict[int, ProducerEntry] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self.producers)

    def clear(self) -> None:
        self.producers.clear()

    def check(self, header: BatchHeader) -> SequenceCheck:
        """The leader's verdict on one batch header (a BatchHeader-like object)."""
        if header.producer_id < 0 or header.is_control:
            return ACCEPT
        entry = self.producers.get(header.producer_id)
        base = header.base_sequence
        last = last_sequence(base, header.record_count)
        if entry is None:
            if base != 0:
                return SequenceCheck(error=ErrorCode.UNKNOWN_PRODUCER_ID,
                                     reason=f"producer {header.producer_id} is unknown here; its first "
                                            f"batch must have sequence 0, got {base}")
            return ACCEPT
        if header.producer_epoch < entry.epoch:
            return SequenceCheck(error=ErrorCode.INVALID_PRODUCER_EPOCH,
                                 reason=f"producer {header.producer_id} epoch {header.producer_epoch} is "
                                        f"fenced by epoch {entry.epoch}")
        if header.producer_epoch > entry.epoch:
            if base != 0:
                return SequenceCheck(error=ErrorCode.OUT_OF_ORDER_SEQUENCE,
                                     reason=f"producer {header.producer_id} epoch {header.producer_epoch} "
                                            f"must start at sequence 0, got {base}")
            return ACCEPT
        for b in entry.batches:
            if b.base_sequence == base and b.last_sequence == last:
                return SequenceCheck(duplicate=b)
        expected = (entry.last_sequence + 1) & SEQUENCE_MASK
        if base == expected:
            return ACCEPT
        oldest = entry.batches[0].base_sequence if entry.batches else expected
        if _before(last, oldest):
            return SequenceCheck(error=ErrorCode.DUPLICATE_SEQUENCE,
                                 reason=f"producer {header.producer_id} sequences {base}..{last} were "
                                        f"written before the last {len(entry.batches)} batches kept")
        return SequenceCheck(error=ErrorCode.OUT_OF_ORDER_SEQUENCE,
                             reason=f"producer {header.producer_id} sent sequence {base}, expected {expected}")

    def record(self, header: BatchHeader, *, base_offset: int, seen_ms: int | None = None) -> None:
        """A batch is in the log at base_offset (leader write, follower append, or scan).
        `seen_ms`: the replica's wall clock as it wrote it (None in a scan: see `seen_at`)."""
        if header.producer_id < 0 or header.is_control:
            return
        pid = header.producer_id
        entry = self.producers.pop(pid, None)
        if entry is None or header.producer_epoch != entry.epoch:
            entry = ProducerEntry(epoch=header.producer_epoch, last_timestamp_ms=header.max_timestamp,
                                  batches=collections.deque(maxlen=self.batches_per_producer))
        entry.last_timestamp_ms = max(entry.last_timestamp_ms, header.max_timestamp)
        if seen_ms is not None:
            entry.seen_ms = max(entry.seen_ms, seen_ms)
        entry.batches.append(BatchEntry(base_sequence=header.base_sequence,
                                        last_sequence=last_sequence(header.base_sequence, header.record_count),
                                        base_offset=base_offset,
                                        last_offset=base_offset + header.record_count - 1))
        self.producers[pid] = entry
        while len(self.producers) > self.producers_max:
            self.producers.popitem(last=False)

    def seen_at(self, now_ms: int) -> None:
        """Every producer known was seen no earlier than `now_ms`: after a scan of the log, which
        knows only the batches' timestamps, not when they were written."""
        for entry in self.producers.values():
            entry.seen_ms = max(entry.seen_ms, now_ms)

    def next_expiry_ms(self) -> int | None:
        """When `expire` would next forget a producer (the least recently written), if any."""
        if not self.producers:
            return None
        entry = next(iter(self.producers.values()))
        return entry.idle_since_ms + self.producer_idle_ms_max + 1

    def expire(self, now_ms: int) -> int:
        """Forget producers idle longer than producer_idle_ms_max; returns how many.
        Walks from the least recently written and stops at the first one still active,
        so a call costs what it removes (timestamps out of write order expire late)."""
        gone = 0
        while self.producers:
            pid, entry = next(iter(self.producers.items()))
            if now_ms - entry.idle_since_ms <= self.producer_idle_ms_max:
                break
            del self.producers[pid]
            gone += 1
        return gone

    def rebuild(self, log: LogView, *, chunk_bytes: int = 4 * 1024 * 1024) -> None:
        """From the log's batch headers (start to end), in chunks; no record is decoded."""
        from common.batch import iter_batches  # local: keeps this module's import light for tests

        self.clear()
        offset = log.log_start_offset
        end = log.log_end_offset
        while offset < end:
            records = log.read(offset, max_bytes=chunk_bytes).records
            nxt = offset
            for _, h in iter_batches(records, validate=False):
                self.record(h, base_offset=h.base_offset)
                nxt = h.next_offset
            if nxt <= offset:
                break  # nothing readable there (a gap the log reports as empty)
            offset = nxt

    # ------------------------------------------------------------ snapshots
    # Serialization only (the rules above are untouched): the table as plain values, in
    # its least-recently-written-first order, so a snapshot plus the log past it rebuilds
    # exactly the table a scan of the whole log would (dataplane/log/producer_snapshots.py
    # stores it).

    def snapshot_entries(self) -> list[tuple[int, int, int, tuple[tuple[int, int, int, int], ...]]]:
        """[(producer_id, epoch, last_timestamp_ms, ((base_seq, last_seq, base_offset, last_offset), ...))]."""
        return [(pid, e.epoch, e.last_timestamp_ms,
                 tuple((b.base_sequence, b.last_sequence, b.base_offset, b.last_offset) for b in e.batches))
                for pid, e in self.producers.items()]

    def load_entries(self, entries: list[tuple[int, int, int, tuple[tuple[int, int, int, int], ...]]]) -> None:
        """Replace the table with `entries` (as snapshot_entries gives them); ValueError on a
        malformed entry, leaving the table empty. The table's own bounds apply."""
        self.clear()
        try:
            for pid, epoch, last_timestamp_ms, batches in entries:
                for value in (pid, epoch, last_timestamp_ms):
                    if type(value) is not int:
                        raise ValueError(f"producer entry field {value!r} is not an int")
                entry = ProducerEntry(epoch=epoch, last_timestamp_ms=last_timestamp_ms,
                                      batches=collections.deque(maxlen=self.batches_per_producer))
                for base_sequence, last_seq, base_offset, last_offset in batches:
                    entry.batches.append(BatchEntry(base_sequence=int(base_sequence), last_sequence=int(last_seq),
                                                    base_offset=int(base_offset), last_offset=int(last_offset)))
                self.producers[int(pid)] = entry
                while len(self.producers) > self.producers_max:
                    self.producers.popitem(last=False)
        except (TypeError, ValueError) as exc:
            self.clear()
            raise ValueError(f"malformed producer snapshot entry: {exc}") from exc


def _before(a: int, b: int) -> bool:
    """a comes strictly before b in wrapping sequence space (within half the range)."""
    return a != b and ((b - a) & SEQUENCE_MASK) < (SEQUENCE_MASK + 1) // 2
