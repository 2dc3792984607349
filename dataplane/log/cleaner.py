"""Log compaction's decisions, apart from the files they change.

What a cleaning pass does (PartitionLog.clean and MemoryLog.clean perform it):
1. `plan_clean` picks the cleanable segments: closed ones (never the active one), wholly
   below the bound the caller passes (its HW), whose newest record is older than
   min_compaction_lag_ms; it starts only when the dirty share of their bytes (what was
   appended since the last pass, from `first_dirty_offset` on) reaches
   min_cleanable_dirty_ratio.
2. An `OffsetMap` of key -> latest offset is built from every planned segment (at most
   `offset_map_keys_max` keys: a pass covers fewer segments rather than grow it). Kafka
   maps the dirty segments only; mapping them all costs a second read of the clean ones
   but makes "superseded" exact, which the pinned keys below rely on.
3. `clean_batches` rewrites each planned segment, oldest first, keeping per batch the
   records no later record of the same key supersedes. Offsets never change: a batch
   that loses records is re-encoded as one batch per run of consecutive kept records,
   each at its own first offset, so every batch keeps contiguous offsets (what every
   reader checks) and the log gets gaps between batches.

Kept even when superseded, and why:
- records without a key (written before the topic was compacted: produce refuses them
  since);
- control and transactional batches, whole (their markers are not per key);
- the last batch of each producer id in the pass, whole: rebuilding producer state after
  a restart reads it, so its sequence numbers keep deduplicating retries;
- the last record of each segment: it keeps the segment's end offset, so segments stay
  contiguous.
A key with such a stale record is "pinned": its tombstone is kept past
delete_retention_ms, or the stale value would become the latest again.

Tombstones (a keyed record with a null value) are dropped only from segments that a
pass cleaned more than delete_retention_ms ago (`cleaned_at_ms`), so a consumer slower
than that still sees the delete.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Sequence

from common.batch import (BatchHeader, BatchWriter, Record, encode_headers, read_header, read_records)
from common.metadata.config import DAY_MS

SEQUENCE_MASK = 0x7FFFFFFF  # producer sequences are non-negative int32s that wrap


@dataclasses.dataclass(frozen=True, kw_only=True)
class CompactionConfig:
    """A compacted topic's settings (common/metadata/config.py) and the pass's memory limit."""

    delete_retention_ms: int = DAY_MS
    min_cleanable_dirty_ratio: float = 0.5
    min_compaction_lag_ms: int = 0
    # Keys the offset map of one pass may hold (each costs a dict entry and its key bytes).
    offset_map_keys_max: int = 1_000_000

    def __post_init__(self) -> None:
        if self.delete_retention_ms < 0 or self.min_compaction_lag_ms < 0:
            raise ValueError(f"delete_retention_ms={self.delete_retention_ms} and min_compaction_lag_ms="
                             f"{self.min_compaction_lag_ms} must be >= 0")
        if not 0.0 <= self.min_cleanable_dirty_ratio <= 1.0:
            raise ValueError(f"min_cleanable_dirty_ratio={self.min_cleanable_dirty_ratio} must be in 0..1")
        if self.offset_map_keys_max < 1:
            raise ValueError(f"offset_map_keys_max={self.offset_map_keys_max} must be >= 1")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SegmentSummary:
    base_offset: int
    next_offset: int
    size_bytes: int
    max_timestamp: int | None
    cleaned_at_ms: int | None  # when a pass first cleaned it; None: never


@dataclasses.dataclass(frozen=True, kw_only=True)
class CleanPlan:
    """Rewrite `segments` (from the log start up to end_offset); [dirty_offset, end_offset)
    was appended since the last pass."""

    segments: tuple[SegmentSummary, ...]
    dirty_offset: int
    end_offset: int
    dirty_ratio: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class CleanResult:
    segments_cleaned: int      # rewritten (a segment nothing could leave is not)
    records_removed: int
    bytes_before: int
    bytes_after: int
    end_offset: int            # the next pass's first dirty offset


def plan_clean(segments: Sequence[SegmentSummary], *, first_dirty_offset: int, bound_offset: int,
               now_ms: int, config: CompactionConfig) -> CleanPlan | None:
    """Which segments a pass cleans, or None when none is due. `segments` are the log's in
    offset order, the last one being the active segment (never cleaned)."""
    cleanable: list[SegmentSummary] = []
    for segment in segments[:-1]:
        if segment.next_offset > bound_offset:
            break
        if (segment.max_timestamp is not None
                and now_ms - segment.max_timestamp < config.min_compaction_lag_ms):
            break  # later segments hold newer records (mostly); Kafka stops here too
        cleanable.append(segment)
    if not cleanable:
        return None
    dirty_offset = max(first_dirty_offset, cleanable[0].base_offset)
    dirty_bytes = sum(s.size_bytes for s in cleanable if s.next_offset > dirty_offset)
    total_bytes = sum(s.size_bytes for s in cleanable)
    if dirty_bytes == 0 or total_bytes == 0:
        return None
    ratio = dirty_bytes / total_bytes
    if ratio < config.min_cleanable_dirty_ratio:
        return None
    return CleanPlan(segments=tuple(cleanable), dirty_offset=dirty_offset,
                     end_offset=cleanable[-1].next_offset, dirty_ratio=ratio)


class OffsetMap:
    """key -> offset of its latest record in the pass, bounded by keys_max."""

    def __init__(self, *, keys_max: int) -> None:
        self.keys_max = keys_max
        self.latest: dict[bytes, int] = {}

    def full(self) -> bool:
        return len(self.latest) >= self.keys_max

    def add(self, records: Iterable[Record]) -> None:
        for record in records:
            if record.key is not None:
                self.latest[record.key] = record.offset

    def superseded(self, record: Record) -> bool:
        if record.key is None:
            return False
        latest = self.latest.get(record.key)
        return latest is not None and latest > record.offset


def keeps_whole(header: BatchHeader) -> bool:
    """Batches the cleaner never splits (see the module doc)."""
    return header.is_control or header.is_transactional


@dataclasses.dataclass(kw_only=True)
class SegmentVerdict:
    """What cleaning one segment keeps: each batch's bytes as they were or re-encoded."""

    batches: list[bytes | memoryview]
    records_removed: int

    @property
    def changed(self) -> bool:
        return self.records_removed > 0


def clean_batch(header: BatchHeader, data: bytes | memoryview, *, segment_next_offset: int,
                offset_map: OffsetMap, producer_last: dict[int, int], drop_tombstones: bool,
                pinned: set[bytes]) -> tuple[list[bytes | memoryview], int]:
    """One batch of a segment ending at `segment_next_offset`, cleaned: (the batches that
    replace it, records removed). `producer_last`: producer id -> base offset of its last
    batch in the pass; `pinned` (updated) holds the keys of superseded records kept so far
    in the pass, which runs oldest batch first."""
    if header.is_control:
        return [data], 0
    records = read_records(data)
    if keeps_whole(header) or (header.producer_id >= 0
                               and producer_last.get(header.producer_id) == header.base_offset):
        pinned.update(r.key for r in records if r.key is not None and offset_map.superseded(r))
        return [data], 0
    kept: list[Record] = []
    for record in records:
        forced = record.offset == segment_next_offset - 1
        if offset_map.superseded(record):
            if not forced:
                continue
            assert record.key is not None
            pinned.add(record.key)
        elif (record.key is not None and record.value is None and drop_tombstones
              and record.key not in pinned and not forced):
            continue
        kept.append(record)
    if len(kept) == len(records):
        return [data], 0
    return list(encode_runs(header, kept)), len(records) - len(kept)


def clean_batches(batches: Sequence[tuple[BatchHeader, bytes | memoryview]], *, segment_next_offset: int,
                  offset_map: OffsetMap, producer_last: dict[int, int], drop_tombstones: bool,
                  pinned: set[bytes]) -> SegmentVerdict:
    """`clean_batch` over one segment's batches, in offset order."""
    out: list[bytes | memoryview] = []
    removed = 0
    for header, data in batches:
        kept, gone = clean_batch(header, data, segment_next_offset=segment_next_offset, offset_map=offset_map,
                                 producer_last=producer_last, drop_tombstones=drop_tombstones, pinned=pinned)
        out.extend(kept)
        removed += gone
    return SegmentVerdict(batches=out, records_removed=removed)


def map_batch(header: BatchHeader, data: bytes | memoryview, *, offset_map: OffsetMap,
              producer_last: dict[int, int]) -> None:
    """The offset-map pass's look at one batch."""
    if header.producer_id >= 0:
        producer_last[header.producer_id] = header.base_offset
    if not header.is_control:
        offset_map.add(read_records(data))


def encode_runs(header: BatchHeader, kept: Sequence[Record]) -> list[bytes]:
    """`kept` (records of the batch `header` heads, in order) as one batch per run of
    consecutive offsets, with the batch's producer fields, epoch and codec; each run's base
    sequence is the sequence its first record had."""
    runs: list[list[Record]] = []
    for record in kept:
        if runs and runs[-1][-1].offset + 1 == record.offset:
            runs[-1].append(record)
        else:
            runs.append([record])
    out = []
    for run in runs:
        writer = BatchWriter()
        for record in run:
            writer.append(record.value, record.key, encode_headers(record.headers), record.timestamp_ms)
        base_sequence = header.base_sequence
        if base_sequence >= 0:
            base_sequence = (base_sequence + run[0].offset - header.base_offset) & SEQUENCE_MASK
        batch = bytes(writer.seal(producer_id=header.producer_id, producer_epoch=header.producer_epoch,
                                  base_sequence=base_sequence, base_offset=run[0].offset,
                                  leader_epoch=header.leader_epoch, compression=header.compression))
        assert read_header(batch).base_offset == run[0].offset, (run[0].offset, header)
        out.append(batch)
    return out


def drops_tombstones(segment: SegmentSummary, *, now_ms: int, config: CompactionConfig) -> bool:
    return segment.cleaned_at_ms is not None and now_ms - segment.cleaned_at_ms > config.delete_retention_ms


class IoThrottle:
    """Holds a cleaner to `bytes_per_second` of reads and writes together: each call says how
    many bytes were moved and sleeps as long as the pass is ahead of its budget. Time and
    sleep are arguments, so tests move time by hand."""

    def __init__(self, bytes_per_second: int, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if bytes_per_second < 1:
            raise ValueError(f"bytes_per_second={bytes_per_second} must be >= 1")
        self.bytes_per_second = bytes_per_second
        self._clock, self._sleep = clock, sleep
        self._start = clock()
        self._bytes = 0
        self.slept_s = 0.0

    def __call__(self, moved_bytes: int) -> None:
        now = self._clock()
        if self._bytes / self.bytes_per_second - (now - self._start) < -1.0:
            # Idle time is not banked beyond a second: a burst after a pause stays throttled.
            self._start, self._bytes = now, 0
        self._bytes += moved_bytes
        ahead_s = self._bytes / self.bytes_per_second - (now - self._start)
        if ahead_s > 0:
            self._sleep(ahead_s)
            self.slept_s += ahead_s
