"""One segment: `<base_offset:020d>.log` plus its `.index` and `.timeindex`.

A segment only ever holds whole, validated batches with increasing offsets at or
above its base offset: contiguous until compaction removes records, which leaves
gaps between batches (never inside one) but keeps the segment's last offset. Reads and index rebuilds look at batch headers
only; records are never decoded. Not thread-safe: PartitionLog serialises calls.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterator
import os
import struct

from common.batch import (BATCH_BYTES_MAX, HEADER_SIZE, Buffer, first_record_at_or_after, read_header,
                          scan_valid_prefix)
from common.errors import CorruptBatchError

from common.durable import write_all, write_atomically
from .index import OffsetIndex, TimeIndex

# Header fields read without building a BatchHeader (the bytes were validated on the way in).
_BASE_AND_LENGTH = struct.Struct(">qi")        # base_offset, batch_length at byte 0
_EPOCH = struct.Struct(">i")                   # leader_epoch at byte 12
_DELTA_AND_TIMES = struct.Struct(">iqq")       # last_offset_delta, first/max timestamp at byte 23
_LENGTH_FIELD_END = 12
_WALK_CHUNK_BYTES = 64 * 1024
_RECOVERY_CHUNK_BYTES = 8 * 1024 * 1024
# Pages are dropped from the page cache in steps of at least this much (one call each).
_DROP_STEP_BYTES = 1024 * 1024


def segment_name(base_offset: int) -> str:
    return f"{base_offset:020d}"


@dataclasses.dataclass(frozen=True, slots=True)
class BatchSpan:
    """Where a batch sits (in a buffer or a file) and what it covers."""

    position: int
    size_bytes: int
    base_offset: int
    next_offset: int
    max_timestamp: int
    leader_epoch: int


@dataclasses.dataclass(frozen=True, slots=True)
class CheckpointIndexes:
    """What a recovery checkpoint writes of both index files: their entries from `offsets_from`
    and `times_from` on (the files hold the ones before already; 0: the whole file)."""
    offsets_from: int
    offsets: bytes
    times_from: int
    times: bytes


class Segment:
    def __init__(self, directory: str, base_offset: int, *, index_interval_bytes: int) -> None:
        self.directory = directory
        self.base_offset = base_offset
        self.index_interval_bytes = index_interval_bytes
        stem = os.path.join(directory, segment_name(base_offset))
        self.log_path = stem + ".log"
        self.index_path = stem + ".index"
        self.time_index_path = stem + ".timeindex"
        self.fd = os.open(self.log_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self.size_bytes = 0
        self.next_offset = base_offset
        self.index = OffsetIndex()
        self.time_index = TimeIndex()
        self.max_timestamp: int | None = None
        self._offset_of_max_timestamp = base_offset
        self.rolling_timestamp: int | None = None  # max timestamp of the first batch
        self._bytes_since_index = 0
        self.sealed = False  # indexes saved; no more appends
        self._uncached_to = 0  # bytes below this were dropped from the page cache once
        # (offset entries, time entries) both index files hold exactly, as the last checkpoint
        # wrote them; None when they may hold anything else. A checkpoint then appends only the
        # entries that follow: rewriting both files cost O(segment) each time, 5 ms of held GIL
        # per MiB written half-way through a 128 MiB segment.
        self._checkpointed: tuple[int, int] | None = None

    # ------------------------------------------------------------------ loading

    def load(self) -> int:
        """Take the indexes from their files and find the end by scanning after the last
        entry. When an index file is missing or not sane, or the scan does not end at
        the end of the file, validate the segment by CRC instead (`recover`): a broken
        index hints at damage to the log file too. Returns the bytes cut (usually 0)."""
        file_size = os.fstat(self.fd).st_size
        index_bytes = _read_file(self.index_path)
        time_bytes = _read_file(self.time_index_path)
        index = OffsetIndex.decode(index_bytes, log_size=file_size) if index_bytes is not None else None
        times = TimeIndex.decode(time_bytes, next_relative_offset=2**32) if time_bytes is not None else None
        if index is None or times is None:
            return self.recover()[0]
        self._reset()
        self.index, self.time_index = index, times
        if len(times):
            self.max_timestamp = times.timestamps[-1]
            self._offset_of_max_timestamp = self.base_offset + times.relative_offsets[-1]
        rel, position = index.lookup(2**32 - 1)
        self.size_bytes, self.next_offset = position, self.base_offset + rel
        for span in self.walk(position, file_size):
            self._track(span, index_it=False)
        if self.size_bytes != file_size or (len(times) and self.base_offset + times.relative_offsets[-1]
                                            >= self.next_offset):
            return self.recover()[0]
        self._read_rolling_timestamp()
        return 0

    def rebuild_indexes(self) -> None:
        """Rebuild both indexes and the in-memory summary from the batch headers."""
        file_size = os.fstat(self.fd).st_size
        self._reset()
        for span in self.walk(0, file_size):
            self._track(span, index_it=True)
        assert self.size_bytes == file_size, (self.log_path, self.size_bytes, file_size)

    def recover(self) -> tuple[int, list[BatchSpan]]:
        """Validate every batch by CRC and offset continuity; cut the file at the first bad
        byte. Returns (bytes cut, spans of the batches kept) and rebuilds the indexes."""
        self._reset()
        return self._validate_from(0, self.base_offset)

    def resume_recovery(self, position: int, next_offset: int) -> tuple[int, list[BatchSpan]] | None:
        """`recover`, trusting [0, position): bytes fsynced at a checkpoint that also saved
        this segment's indexes for them (`save_indexes(up_to_position=...)`). The indexes
        are taken from their files, the headers after their last entry are walked up to
        `position`, and only what follows is validated. None when the checkpoint does not
        fit the files (missing or insane indexes, a walk that does not end at `position`
        with `next_offset`): the caller recovers the whole segment then. The spans returned
        are the validated ones only."""
        file_size = os.fstat(self.fd).st_size
        if not 0 < position <= file_size or next_offset <= self.base_offset:
            return None
        index_bytes = _read_file(self.index_path)
        time_bytes = _read_file(self.time_index_path)
        if index_bytes is None or time_bytes is None:
            return None
        index = OffsetIndex.decode(index_bytes, log_size=position)
        times = TimeIndex.decode(time_bytes, next_relative_offset=next_offset - self.base_offset)
        if index is None or times is None:
            return None
        self._reset()
        self.index, self.time_index = index, times
        if len(times):
            self.max_timestamp = times.timestamps[-1]
            self._offset_of_max_timestamp = self.base_offset + times.relative_offsets[-1]
        rel, start = index.lookup(2**32 - 1)
        self.size_bytes, self.next_offset = start, self.base_offset + rel
        for span in self.walk(start, position):
            if span.base_offset < self.next_offset:
                return None
            self._track(span, index_it=True)
        if self.size_bytes != position or self.next_offset != next_offset:
            return None
        self._read_rolling_timestamp()
        return self._validate_from(position, next_offset)

    def _validate_from(self, position: int, expected: int) -> tuple[int, list[BatchSpan]]:
        file_size = os.fstat(self.fd).st_size
        kept: list[BatchSpan] = []
        while position < file_size:
            chunk = os.pread(self.fd, min(_RECOVERY_CHUNK_BYTES, file_size - position), position)
            valid_bytes, headers = scan_valid_prefix(chunk)
            if not headers:
                whole = _whole_batch_larger_than(chunk, self.fd, position, file_size)
                if whole is None:
                    break
                chunk = whole
                valid_bytes, headers = scan_valid_prefix(chunk)
                if not headers:
                    break
            broken = False
            for header in headers:
                # Offsets only grow; a gap is what compaction (or a follower copying a
                # compacted leader) leaves, an overlap is damage.
                if header.base_offset < expected:
                    broken = True
                    break
                span = BatchSpan(position=position, size_bytes=header.size_bytes,
                                 base_offset=header.base_offset, next_offset=header.next_offset,
                                 max_timestamp=header.max_timestamp, leader_epoch=header.leader_epoch)
                self.size_bytes = position  # _track indexes at the current end
                self._track(span, index_it=True)
                kept.append(span)
                position += header.size_bytes
                expected = header.next_offset
            if broken:
                break
        self.size_bytes = position
        cut = file_size - position
        if cut:
            os.ftruncate(self.fd, position)
        return cut, kept

    def _reset(self) -> None:
        self.size_bytes = 0
        self.next_offset = self.base_offset
        self.index = OffsetIndex()
        self.time_index = TimeIndex()
        self.max_timestamp = None
        self._offset_of_max_timestamp = self.base_offset
        self.rolling_timestamp = None
        self._bytes_since_index = 0
        self._checkpointed = None

    def _read_rolling_timestamp(self) -> None:
        if self.size_bytes >= HEADER_SIZE:
            head = os.pread(self.fd, HEADER_SIZE, 0)
            self.rolling_timestamp = _DELTA_AND_TIMES.unpack_from(head, 23)[2]

    # ------------------------------------------------------------------ writing

    def append(self, buf: Buffer, spans: list[BatchSpan]) -> None:
        """Write spans (contiguous in buf) at the end. On OSError the file is cut back
        to its old size (if that fails too, the OSError from ftruncate is raised) and
        nothing in memory changes."""
        assert not self.sealed, self.log_path
        first, last = spans[0], spans[-1]
        assert first.base_offset >= self.next_offset, (first.base_offset, self.next_offset)
        view = memoryview(buf)[first.position:last.position + last.size_bytes]
        try:
            write_all(self.fd, view, self.size_bytes)
        except OSError:
            os.ftruncate(self.fd, self.size_bytes)
            raise
        shift = self.size_bytes - first.position
        for span in spans:
            self.size_bytes = span.position + shift
            self._track(span, index_it=True)

    def _track(self, span: BatchSpan, *, index_it: bool) -> None:
        """Account for the batch that starts at self.size_bytes (index it if due)."""
        if self.rolling_timestamp is None:
            self.rolling_timestamp = span.max_timestamp
        if self.max_timestamp is None or span.max_timestamp > self.max_timestamp:
            self.max_timestamp = span.max_timestamp
            self._offset_of_max_timestamp = span.base_offset
        if self._bytes_since_index > self.index_interval_bytes and index_it:
            self.index.append(span.base_offset - self.base_offset, self.size_bytes)
            self.time_index.maybe_append(self.max_timestamp,
                                         self._offset_of_max_timestamp - self.base_offset)
            self._bytes_since_index = 0
        self._bytes_since_index += span.size_bytes
        self.size_bytes += span.size_bytes
        self.next_offset = span.next_offset

    def seal(self) -> None:
        """No more appends: add the final time entry and write both index files."""
        if self.max_timestamp is not None:
            self.time_index.maybe_append(self.max_timestamp,
                                         self._offset_of_max_timestamp - self.base_offset)
        self.save_indexes()
        self.sealed = True

    def unseal(self) -> None:
        self.sealed = False

    def save_indexes(self) -> None:
        self._checkpointed = None
        for path, data in ((self.index_path, self.index.encode()),
                           (self.time_index_path, self.time_index.encode())):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            try:
                write_all(fd, data, 0)
            finally:
                os.close(fd)

    def indexes_below(self, position: int, next_offset: int) -> CheckpointIndexes:
        """What a recovery checkpoint saves (`save_checkpoint_indexes`) so that both index files
        hold the entries for the batches below `position` (a batch start whose offset is
        `next_offset`): only what the files lack since the last checkpoint."""
        offsets_keep = self.index.count_below(position)
        times_keep = self.time_index.count_below(next_offset - self.base_offset)
        offsets_from, times_from = 0, 0
        if self._checkpointed is not None:
            offsets_from, times_from = self._checkpointed
            # The time index may raise its last entry's timestamp in place (TimeIndex.maybe_append).
            times_from = max(times_from - 1, 0)
            if offsets_from > offsets_keep or times_from > times_keep:
                offsets_from, times_from = 0, 0
        return CheckpointIndexes(offsets_from, self.index.encode(offsets_from, offsets_keep),
                                 times_from, self.time_index.encode(times_from, times_keep))

    def save_checkpoint_indexes(self, indexes: CheckpointIndexes) -> None:
        """Write what `indexes_below` gave, without fsync: whatever survives a crash is checked by
        `resume_recovery`, which falls back to `recover`. A whole file is replaced atomically;
        a tail is written in place after the entries the file holds."""
        self._checkpointed = None  # until both writes are done
        for path, start, data in ((self.index_path, indexes.offsets_from * OffsetIndex.entry_size, indexes.offsets),
                                  (self.time_index_path, indexes.times_from * TimeIndex.entry_size, indexes.times)):
            if not start:
                write_atomically(path, data, sync=False)
                continue
            fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
            try:
                write_all(fd, data, start)
            finally:
                os.close(fd)
        self._checkpointed = (indexes.offsets_from + len(indexes.offsets) // OffsetIndex.entry_size,
                              indexes.times_from + len(indexes.times) // TimeIndex.entry_size)

    def fsync(self) -> None:
        os.fsync(self.fd)
        if self.sealed:
            for path in (self.index_path, self.time_index_path):
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)

    def drop_cached(self, end: int) -> None:
        """Let the OS drop this file's pages below `end` from its page cache (flushed bytes
        only: dirty pages would just be written back). A hint: the bytes stay on disk."""
        if end - self._uncached_to < _DROP_STEP_BYTES:
            return
        os.posix_fadvise(self.fd, self._uncached_to, end - self._uncached_to, os.POSIX_FADV_DONTNEED)
        self._uncached_to = end

    def truncate_to(self, offset: int) -> None:
        """Remove every batch whose last offset is >= offset."""
        if offset >= self.next_offset:
            return
        position = self.position_of(offset)[0] if offset > self.base_offset else 0
        os.ftruncate(self.fd, position)
        self._uncached_to = min(self._uncached_to, position)
        self.rebuild_indexes()

    # ------------------------------------------------------------------ reading

    def walk(self, position: int, end: int | None = None, *,
             chunk_bytes: int = _WALK_CHUNK_BYTES) -> Iterator[BatchSpan]:
        """Yield a BatchSpan per batch header from `position` (a batch start) to `end`
        (default: the size when the walk starts), reading chunk_bytes at a time."""
        end = self.size_bytes if end is None else end
        chunk_bytes = max(chunk_bytes, HEADER_SIZE)
        while position < end:
            chunk = os.pread(self.fd, min(chunk_bytes, end - position), position)
            if len(chunk) < HEADER_SIZE:
                return
            p = 0
            while p + HEADER_SIZE <= len(chunk):
                base, length = _BASE_AND_LENGTH.unpack_from(chunk, p)
                delta, _first, max_ts = _DELTA_AND_TIMES.unpack_from(chunk, p + 23)
                epoch = _EPOCH.unpack_from(chunk, p + 12)[0]
                size = length + _LENGTH_FIELD_END
                if size < HEADER_SIZE:  # not a batch: only a damaged file gets here
                    return
                yield BatchSpan(position=position + p, size_bytes=size, base_offset=base,
                                next_offset=base + delta + 1, max_timestamp=max_ts, leader_epoch=epoch)
                p += size
            position += p

    def position_of(self, offset: int) -> tuple[int, int]:
        """(file position, base offset) of the batch containing offset."""
        assert self.base_offset <= offset < self.next_offset, (offset, self.base_offset, self.next_offset)
        rel, position = self.index.lookup(offset - self.base_offset)
        # The batch is at most about one index interval past the entry: read that much at a
        # time, not a whole walk chunk, to find one header among large batches.
        for span in self.walk(position, chunk_bytes=min(_WALK_CHUNK_BYTES, 2 * self.index_interval_bytes)):
            if span.next_offset > offset:
                return span.position, span.base_offset
        raise AssertionError(f"offset {offset} not found in {self.log_path}")

    def record_for_timestamp(self, timestamp_ms: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record stamped at or after timestamp_ms, or None."""
        rel = self.time_index.lookup_before(timestamp_ms)
        start = self.index.lookup(rel)[1] if rel is not None else 0
        for span in self.walk(start):
            if span.max_timestamp >= timestamp_ms:
                found = first_record_at_or_after(os.pread(self.fd, span.size_bytes, span.position), timestamp_ms)
                if found is not None:
                    return found
        return None

    def read(self, position: int, *, max_bytes: int, max_offset: int | None) -> tuple[bytes | memoryview, int]:
        """Whole batches from `position`: (bytes, next offset after them).

        At most max_bytes unless the first batch alone is larger (then exactly that batch);
        only batches whose last offset is below max_offset (exclusive) when given.
        """
        want = min(max(max_bytes, HEADER_SIZE), self.size_bytes - position)
        data = os.pread(self.fd, want, position)
        cut = 0
        next_offset = -1
        while cut + HEADER_SIZE <= len(data):
            base, length = _BASE_AND_LENGTH.unpack_from(data, cut)
            delta = _DELTA_AND_TIMES.unpack_from(data, cut + 23)[0]
            if max_offset is not None and base + delta >= max_offset:
                break
            size = length + _LENGTH_FIELD_END
            if cut + size > len(data):
                if cut == 0:  # the first batch alone is larger than max_bytes
                    data = os.pread(self.fd, size, position)
                    cut = size
                    next_offset = base + delta + 1
                break
            cut += size
            next_offset = base + delta + 1
        if cut == 0:
            return b"", -1
        return (data if cut == len(data) else memoryview(data)[:cut]), next_offset

    # ------------------------------------------------------------------ teardown

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def delete(self) -> None:
        self.close()
        for path in (self.log_path, self.index_path, self.time_index_path):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass


def _read_file(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def _whole_batch_larger_than(chunk: bytes, fd: int, position: int, file_size: int) -> bytes | None:
    """When a valid batch is larger than the recovery chunk, read it whole; else None."""
    try:
        header = read_header(chunk, max_batch_bytes=BATCH_BYTES_MAX)
    except CorruptBatchError:
        return None
    if header.size_bytes <= len(chunk) or position + header.size_bytes > file_size:
        return None
    return os.pread(fd, header.size_bytes, position)
