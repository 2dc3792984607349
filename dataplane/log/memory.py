"""MemoryLog: the partition log's in-memory twin, for deterministic simulations.

Same interface and contract as PartitionLog (interface.py), with the disk
replaced by lists: written batches are "dirty" until `flush()`, and `crash()`
models a machine crash by dropping every batch at or above flushed_offset (and
the epochs that started there). Truncations and retention are durable at once,
as on disk. No files, threads, clocks or randomness; not thread-safe.
"""
from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Callable, Iterator

from common.batch import (BATCH_BYTES_MAX, BatchHeader, Buffer, first_record_at_or_after, iter_batches,
                          read_header, set_base_offset, set_leader_epoch)
from common.errors import (InvalidRequestError, OffsetMismatchError, OffsetOutOfRangeError,
                           StaleEpochError, StorageError)

from .cleaner import (CleanResult, CompactionConfig, OffsetMap, SegmentSummary, clean_batches, drops_tombstones,
                      map_batch, plan_clean)
from .epoch_cache import EpochCache
from .interface import AppendInfo, DeletedSegment, EpochEntry, LogConfig, ReadResult, patchable


@dataclasses.dataclass(frozen=True, slots=True)
class _Batch:
    base_offset: int
    next_offset: int
    leader_epoch: int
    max_timestamp: int
    data: bytes


@dataclasses.dataclass(slots=True)
class _Segment:
    batches: list[_Batch]
    base_offset: int

    @property
    def size_bytes(self) -> int:
        return sum(len(b.data) for b in self.batches)

    @property
    def next_offset(self) -> int:
        return self.batches[-1].next_offset if self.batches else self.base_offset

    @property
    def max_timestamp(self) -> int | None:
        return max((b.max_timestamp for b in self.batches), default=None)


class MemoryLog:
    def __init__(self, *, config: LogConfig | None = None, start_offset: int = 0) -> None:
        self.config = config or LogConfig()
        self._segments = [_Segment(batches=[], base_offset=start_offset)]
        self._epochs = EpochCache()
        self._flushed_offset = start_offset
        self._closed = False
        # Compaction's state, as PartitionLog keeps it in cleaner-checkpoint.
        self._first_dirty_offset = start_offset
        self._cleaned_at: dict[int, int] = {}

    # ------------------------------------------------------------------ offsets

    @property
    def log_start_offset(self) -> int:
        return self._segments[0].base_offset

    @property
    def log_end_offset(self) -> int:
        return self._segments[-1].next_offset

    @property
    def batch_bytes_max(self) -> int:
        """The largest batch an append takes: one batch never spans segments."""
        return min(self.config.segment_bytes, BATCH_BYTES_MAX)

    @property
    def flushed_offset(self) -> int:
        return self._flushed_offset

    @property
    def flush_cost_bytes(self) -> int | None:
        return 0   # a flush here moves a number

    @property
    def latest_epoch(self) -> int:
        return self._epochs.latest_epoch

    def epoch_entries(self) -> list[EpochEntry]:
        return self._epochs.entries()

    def epoch_before(self, offset: int) -> int:
        return self._epochs.epoch_before(offset)

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        return self._epochs.end_offset_for_epoch(epoch, self.log_end_offset)

    @property
    def segment_base_offsets(self) -> list[int]:
        return [s.base_offset for s in self._segments]

    def _batches(self) -> Iterator[_Batch]:
        for segment in self._segments:
            yield from segment.batches

    # ------------------------------------------------------------------ append

    def append_as_leader(self, batches: bytes | bytearray | memoryview, *, leader_epoch: int,
                         now_ms: int | None = None, crc_checked: bool = False) -> AppendInfo:
        self._check_open()
        buf = batches if patchable(batches) else bytearray(batches)
        found = self._validate(buf, crc=not crc_checked)
        self._epochs.check_epoch(leader_epoch)
        offset = self.log_end_offset
        new = []
        for position, header in found:
            set_base_offset(buf, offset, position)
            set_leader_epoch(buf, leader_epoch, position)
            end = position + header.size_bytes
            new.append(_Batch(base_offset=offset, next_offset=offset + header.record_count,
                              leader_epoch=leader_epoch, max_timestamp=header.max_timestamp,
                              data=bytes(buf[position:end])))
            offset += header.record_count
        return self._store(new, now_ms)

    def append_as_follower(self, batches: bytes | bytearray | memoryview, *,
                           now_ms: int | None = None, crc_checked: bool = False) -> AppendInfo:
        self._check_open()
        found = self._validate(batches, crc=not crc_checked, limit=BATCH_BYTES_MAX)   # as PartitionLog's
        expected = self.log_end_offset
        latest = self._epochs.latest_epoch
        new = []
        for i, (position, header) in enumerate(found):
            if header.base_offset < expected:  # a gap is what compaction leaves
                raise OffsetMismatchError(
                    f"follower append: expected base offset {expected} or above, got {header.base_offset} "
                    f"(batch {i} of {len(found)})",
                    expected_offset=expected, actual_offset=header.base_offset)
            if header.leader_epoch < latest:
                raise StaleEpochError(
                    f"follower append: batch at offset {header.base_offset} has leader epoch "
                    f"{header.leader_epoch}, older than epoch {latest} before it",
                    field="leader_epoch", expected=latest, actual=header.leader_epoch)
            latest = header.leader_epoch
            expected = header.next_offset
            new.append(_Batch(base_offset=header.base_offset, next_offset=header.next_offset,
                              leader_epoch=header.leader_epoch, max_timestamp=header.max_timestamp,
                              data=bytes(batches[position:position + header.size_bytes])))
        return self._store(new, now_ms)

    def _validate(self, buf: Buffer, *, crc: bool, limit: int | None = None) -> list[tuple[int, BatchHeader]]:
        found = list(iter_batches(buf, validate=crc, max_batch_bytes=limit or self.batch_bytes_max))
        if not found:
            raise InvalidRequestError("append with no record batches; send at least one batch")
        return found

    def _store(self, new: list[_Batch], now_ms: int | None) -> AppendInfo:
        for batch in new:
            if self._epochs.would_change(batch.leader_epoch):
                self._epochs.assign(batch.leader_epoch, batch.base_offset)
            active = self._segments[-1]
            if active.batches and self._should_roll(active, batch, now_ms):
                # At the log end: after a compaction gap the batch starts later.
                self._segments.append(_Segment(batches=[], base_offset=self.log_end_offset))
            self._segments[-1].batches.append(batch)
        return AppendInfo(base_offset=new[0].base_offset, last_offset=new[-1].next_offset - 1,
                          batch_count=len(new), size_bytes=sum(len(b.data) for b in new),
                          max_timestamp=max(b.max_timestamp for b in new),
                          log_end_offset=self.log_end_offset)

    def _should_roll(self, active: _Segment, batch: _Batch, now_ms: int | None) -> bool:
        if active.size_bytes + len(batch.data) > self.config.segment_bytes:
            return True
        if batch.next_offset - 1 - active.base_offset > 2**32 - 1:
            return True
        segment_ms = self.config.segment_ms
        if segment_ms is None:
            return False
        rolling_ts = active.batches[0].max_timestamp
        newest = batch.max_timestamp if now_ms is None else max(now_ms, batch.max_timestamp)
        return newest - rolling_ts >= segment_ms

    def roll(self, *, now_ms: int | None = None) -> None:
        self._check_open()
        active = self._segments[-1]
        if not active.batches:
            return
        if now_ms is not None and (self.config.segment_ms is None
                                   or now_ms - active.batches[0].max_timestamp < self.config.segment_ms):
            return
        self._segments.append(_Segment(batches=[], base_offset=self.log_end_offset))

    # ------------------------------------------------------------------ read

    def read(self, start_offset: int, *, max_bytes: int, max_offset: int | None = None) -> ReadResult:
        self._check_open()
        if max_bytes < 0:
            raise InvalidRequestError(f"max_bytes={max_bytes} must be >= 0")
        start, end = self.log_start_offset, self.log_end_offset
        if not start <= start_offset <= end:
            raise OffsetOutOfRangeError(
                f"offset {start_offset} is out of range: log_start_offset {start}, log_end_offset {end}",
                offset=start_offset, log_start_offset=start, log_end_offset=end)
        empty = ReadResult(records=b"", first_offset=start_offset, next_offset=start_offset,
                           log_start_offset=start, log_end_offset=end)
        if start_offset == end or (max_offset is not None and start_offset >= max_offset):
            return empty
        bases = [s.base_offset for s in self._segments]
        segment = self._segments[bisect.bisect_right(bases, start_offset) - 1]
        i = max(bisect.bisect_right([b.base_offset for b in segment.batches], start_offset) - 1, 0)
        if segment.batches and segment.batches[i].next_offset <= start_offset:
            i += 1  # start_offset is in a compaction gap: the next batch after it
        taken: list[_Batch] = []
        size = 0
        for batch in segment.batches[i:]:
            if max_offset is not None and batch.next_offset - 1 >= max_offset:
                break
            if taken and size + len(batch.data) > max_bytes:
                break
            taken.append(batch)
            size += len(batch.data)
            if size > max_bytes:
                break
        if not taken:
            return empty
        return ReadResult(records=b"".join(b.data for b in taken), first_offset=taken[0].base_offset,
                          next_offset=taken[-1].next_offset, log_start_offset=start, log_end_offset=end)

    def offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int] | None:
        for batch in self._batches():
            if batch.max_timestamp >= timestamp_ms:
                found = first_record_at_or_after(batch.data, timestamp_ms)
                if found is not None:
                    return found
        return None

    # ------------------------------------------------------------------ flush, crash

    def flush(self) -> int:
        self._check_open()
        self._flushed_offset = self.log_end_offset
        return self._flushed_offset

    def crash(self) -> None:
        """Lose what was not flushed, as a machine crash would; the log stays usable."""
        self._truncate(self._flushed_offset)

    # ------------------------------------------------------------------ truncation

    def truncate_to(self, offset: int) -> int:
        self._check_open()
        if offset >= self.log_end_offset:
            return self.log_end_offset
        if offset <= self.log_start_offset:
            self.truncate_fully_and_start_at(offset)
            return offset
        self._truncate(offset)
        return self.log_end_offset

    def _truncate(self, offset: int) -> None:
        while len(self._segments) > 1 and self._segments[-1].base_offset >= offset:
            self._segments.pop()
        active = self._segments[-1]
        while active.batches and active.batches[-1].next_offset > offset:
            active.batches.pop()
        end = self.log_end_offset
        self._flushed_offset = max(min(self._flushed_offset, end), self.log_start_offset)
        self._epochs.truncate_from_end(end)
        self._forget_cleaning_from(end)

    def _forget_cleaning_from(self, end: int) -> None:
        active = self._segments[-1].base_offset
        self._first_dirty_offset = min(self._first_dirty_offset, end)
        self._cleaned_at = {b: at for b, at in self._cleaned_at.items() if b < active}

    def truncate_fully_and_start_at(self, offset: int) -> None:
        self._check_open()
        if offset < 0:
            raise InvalidRequestError(f"offset {offset} must be >= 0")
        self._segments = [_Segment(batches=[], base_offset=offset)]
        self._epochs.clear()
        self._flushed_offset = offset
        self._forget_cleaning_from(offset)

    def apply_retention(self, now_ms: int, *, below_offset: int | None = None) -> list[DeletedSegment]:
        self._check_open()
        retention_ms, retention_bytes = self.config.retention_ms, self.config.retention_bytes
        deleted: list[DeletedSegment] = []
        total = sum(s.size_bytes for s in self._segments)
        while len(self._segments) > 1:
            oldest = self._segments[0]
            if below_offset is not None and oldest.next_offset > below_offset:
                break
            max_ts = oldest.max_timestamp
            if retention_ms is not None and max_ts is not None and now_ms - max_ts > retention_ms:
                reason = "retention_ms"
            elif retention_bytes is not None and total - oldest.size_bytes >= retention_bytes:
                reason = "retention_bytes"
            else:
                break
            deleted.append(DeletedSegment(base_offset=oldest.base_offset, next_offset=oldest.next_offset,
                                          size_bytes=oldest.size_bytes, reason=reason))
            total -= oldest.size_bytes
            self._segments.pop(0)
        if deleted:
            self._flushed_offset = max(self._flushed_offset, self.log_start_offset)
            self._epochs.truncate_from_start(self.log_start_offset)
        return deleted

    def clean(self, now_ms: int, *, below_offset: int, config: CompactionConfig,
              throttle: Callable[[int], None] | None = None) -> CleanResult | None:
        """PartitionLog.clean's pass with the same decisions (cleaner.py), applied at once:
        in memory a swap cannot be torn. `throttle` is told of the bytes as on disk."""
        self._check_open()
        pace = throttle or (lambda n: None)
        summaries = [SegmentSummary(base_offset=s.base_offset, next_offset=s.next_offset, size_bytes=s.size_bytes,
                                    max_timestamp=s.max_timestamp, cleaned_at_ms=self._cleaned_at.get(s.base_offset))
                     for s in self._segments]
        plan = plan_clean(summaries, first_dirty_offset=self._first_dirty_offset,
                          bound_offset=min(below_offset, self._flushed_offset), now_ms=now_ms, config=config)
        if plan is None:
            return None
        offset_map = OffsetMap(keys_max=config.offset_map_keys_max)
        producer_last: dict[int, int] = {}
        count = len(plan.segments)
        for i, segment in enumerate(self._segments[:count]):
            for batch in segment.batches:
                pace(len(batch.data))
                map_batch(read_header(batch.data), batch.data, offset_map=offset_map, producer_last=producer_last)
            if offset_map.full():
                count = i + 1
                break
        pinned: set[bytes] = set()
        cleaned = removed = before = after = 0
        for summary, segment in zip(plan.segments[:count], self._segments[:count]):
            verdict = clean_batches([(read_header(b.data), b.data) for b in segment.batches],
                                    segment_next_offset=summary.next_offset, offset_map=offset_map,
                                    producer_last=producer_last,
                                    drop_tombstones=drops_tombstones(summary, now_ms=now_ms, config=config),
                                    pinned=pinned)
            pace(summary.size_bytes)
            if not verdict.changed:
                continue
            kept = []
            for data in verdict.batches:
                header = read_header(data)
                kept.append(_Batch(base_offset=header.base_offset, next_offset=header.next_offset,
                                   leader_epoch=header.leader_epoch, max_timestamp=header.max_timestamp,
                                   data=bytes(data)))
            assert kept[-1].next_offset == segment.next_offset, (kept[-1].next_offset, segment.next_offset)
            segment.batches = kept
            cleaned += 1
            removed += verdict.records_removed
            before += summary.size_bytes
            after += segment.size_bytes
        end_offset = plan.segments[count - 1].next_offset
        self._first_dirty_offset = max(self._first_dirty_offset, end_offset)
        for summary in plan.segments[:count]:
            self._cleaned_at.setdefault(summary.base_offset, now_ms)
        return CleanResult(segments_cleaned=cleaned, records_removed=removed, bytes_before=before,
                           bytes_after=after, end_offset=end_offset)

    def _check_open(self) -> None:
        if self._closed:
            raise StorageError("memory log is closed")

    def close(self) -> None:
        if not self._closed:
            self.flush()
            self._closed = True
