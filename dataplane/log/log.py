"""The on-disk partition log: segments, indexes, epoch cache, recovery.

Layout of a log directory:
  <base:020d>.log / .index / .timeindex   segments (see segment.py)
  leader-epoch-checkpoint                 epoch -> start offset, replaced atomically
  recovery-point                          an offset below which everything was fsynced
  active-segment-checkpoint               "base position next_offset epoch": the active
                                          segment's fsynced prefix, its indexes saved
  clean-shutdown                          present only while the log is closed cleanly
  truncate-fully                          intent of an unfinished truncate_fully_and_start_at
  cleaner-checkpoint                      compaction's first dirty offset and when each segment
                                          was first cleaned (cleaner.py)
  <base:020d>.log.cleaned / .log.swap     a segment being rewritten by compaction: .cleaned is
                                          dropped on open, .swap replaces the segment
  <offset:020d>.producer-snapshot         producer-state snapshots (producer_snapshots.py)
  .lock                                   flock held by the process that has it open (under a
                                          broker's locked data directory the log locks in the
                                          process instead, with no file: lock.py)

The contract (durability, buffer ownership) is in interface.py. Threads: every
method may be called from any thread. Appends, reads and truncations are
serialised by one lock; `flush` runs its fsyncs outside that lock so appends
continue while it waits for the disk.
"""
from __future__ import annotations

import bisect
import os
import threading
from collections.abc import Callable, Iterator

from common.batch import (BATCH_BYTES_MAX, HEADER_SIZE, Buffer, BatchHeader, iter_batches, read_header,
                          set_base_offset, set_leader_epoch)
from common import durable
from common.durable import fsync_dir, write_all
from common.errors import (InvalidRequestError, OffsetMismatchError, OffsetOutOfRangeError,
                           StaleEpochError, StorageError)

from . import files, space
from .cleaner import (CleanPlan, CleanResult, CompactionConfig, OffsetMap, SegmentSummary, clean_batch,
                      drops_tombstones, map_batch, plan_clean)
from .epoch_cache import EpochCache
from .interface import AppendInfo, DeletedSegment, EpochEntry, LogConfig, ReadResult, patchable
from .lock import DirectoryLock, InProcessLock
from .producer_snapshots import ProducerSnapshots
from .segment import BatchSpan, CheckpointIndexes, Segment
from .tail import TailCache

EPOCH_CHECKPOINT = "leader-epoch-checkpoint"
RECOVERY_POINT = "recovery-point"
CLEAN_SHUTDOWN = "clean-shutdown"
TRUNCATE_FULLY = "truncate-fully"
ACTIVE_CHECKPOINT = "active-segment-checkpoint"
CLEANER_CHECKPOINT = "cleaner-checkpoint"
CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"
# A cleaning pass reads segments in chunks of this much.
_CLEANER_READ_BYTES = 1024 * 1024

# Relative offsets in the index are 32-bit.
_RELATIVE_OFFSET_MAX = 2**32 - 1


class PartitionLog:
    """A partition replica's log in `directory` (created if missing).

    Opening takes an exclusive lock on the directory (StorageError if another
    process has it) and recovers: after a clean close the files are trusted;
    otherwise every segment from the recovery point on is validated by CRC and
    offset continuity, a torn or corrupt tail is cut off, the indexes of those
    segments are rebuilt, and everything left is fsynced, so that
    flushed_offset == log_end_offset once the constructor returns.
    """

    def __init__(self, directory: str, *, config: LogConfig | None = None, parent_locked: bool = False) -> None:
        """`parent_locked`: this process holds the DirectoryLock of a directory above this one
        (a broker's data directory), so the log's own lock needs no file (lock.py)."""
        self.directory = os.path.abspath(directory)
        self.config = config or LogConfig()
        os.makedirs(self.directory, exist_ok=True)
        # Shared by every log on this filesystem: told of each ENOSPC, asked before produce.
        self.space = space.for_directory(self.directory)
        self._lock = threading.Lock()        # all state below
        self._flush_lock = threading.Lock()  # one flush at a time; truncations wait for it
        self._dir_lock: DirectoryLock | InProcessLock = (InProcessLock(self.directory) if parent_locked
                                                         else DirectoryLock(self.directory))
        self._segments: list[Segment] = []
        self._bases: list[int] = []
        self._dirty: dict[int, Segment] = {}  # id -> segment with unflushed writes
        # Bytes appended since the last flush took its snapshot (flush_cost_bytes); a
        # truncation leaves it as it is, an over-estimate.
        self._unflushed_bytes = 0
        self._dir_dirty = False
        # The epoch checkpoint file is older than self._epochs: the next flush writes and syncs it.
        self._epochs_unwritten = False
        self._truncations = 0  # bumped by every truncation; a flush racing one must not count
        self._failed: str | None = None
        self._closed = False
        self._tail = TailCache(size_bytes_max=self.config.tail_cache_bytes or 0)
        self.recovered_bytes_cut = 0  # bytes of torn/corrupt tail removed on open
        self.recovered_bytes_trusted = 0  # bytes a recovery checkpoint spared from validation
        # (segment base, position, next offset) of the newest recovery checkpoint written.
        self._checkpoint: tuple[int, int, int] | None = None
        # Compaction's state (cleaner-checkpoint): below this offset the log was cleaned...
        self._first_dirty_offset = 0
        # ...and segment base -> when a pass first cleaned it (tombstones count from there).
        self._cleaned_at: dict[int, int] = {}
        # Tests stop a cleaning pass at a named step here, as a crash would.
        self.cleaner_kill_point: Callable[[str], None] | None = None
        try:
            self.producer_snapshots = ProducerSnapshots(self.directory)
            self._open()
            # Snapshots past the end describe batches a crash (or an interrupted
            # truncation) removed: the log may grow back past them with others.
            self.producer_snapshots.delete_above(self.log_end_offset)
        except BaseException:
            for segment in self._segments:
                segment.close()
            self._dir_lock.release()
            raise

    # ------------------------------------------------------------------ open

    def _path(self, name: str) -> str:
        return os.path.join(self.directory, name)

    def _open(self) -> None:
        for name in os.listdir(self.directory):
            if name.endswith(".tmp") or name.endswith(".log" + CLEANED_SUFFIX):
                os.unlink(self._path(name))
        self._finish_swaps()
        clean = os.path.exists(self._path(CLEAN_SHUTDOWN))
        truncate_fully = _read_int(self._path(TRUNCATE_FULLY))
        bases = sorted(int(n[:-4]) for n in os.listdir(self.directory)
                       if n.endswith(".log") and n[:-4].isdigit())
        for name in os.listdir(self.directory):
            stem, ext = os.path.splitext(name)
            if ext in (".index", ".timeindex") and stem.isdigit() and int(stem) not in bases:
                os.unlink(self._path(name))
        if truncate_fully is not None:
            self.producer_snapshots.delete_above(-1)  # they describe the log being emptied
            self._finish_truncate_fully(bases, truncate_fully)
            bases = [truncate_fully]
        new = not bases
        if new:
            bases = [0]
            clean = True  # a new log has nothing to recover
            self._dir_dirty = True
        recovery_point = _read_int(self._path(RECOVERY_POINT))
        first_to_recover = len(bases)
        if not clean:
            first_to_recover = 0
            if recovery_point is not None:
                first_to_recover = max(bisect.bisect_right(bases, recovery_point) - 1, 0)
        recovered: list[BatchSpan] = []
        checkpoint = None if clean else self._read_checkpoint()
        trusted_epoch: int | None = None  # the newest epoch a trusted prefix may hold
        for i, base in enumerate(bases):
            if self._segments and base != self._segments[-1].next_offset:
                # A gap or overlap between segments: keep the contiguous prefix.
                self._delete_files_of(bases[i:])
                break
            segment = Segment(self.directory, base, index_interval_bytes=self.config.index_interval_bytes)
            self._add_segment(segment)
            if i < first_to_recover:
                self.recovered_bytes_cut += segment.load()
                continue
            resumed = None
            if checkpoint is not None and checkpoint[0] == base:
                resumed = segment.resume_recovery(checkpoint[1], checkpoint[2])
            if resumed is not None and checkpoint is not None:
                self.recovered_bytes_trusted += checkpoint[1]
                trusted_epoch = checkpoint[3]
                cut, spans = resumed
            else:
                cut, spans = segment.recover()
            recovered += spans
            if cut:
                self.recovered_bytes_cut += cut
                if segment.size_bytes == 0 and len(self._segments) > 1:
                    self._remove_last_segment()
                self._delete_files_of(bases[i + 1:])
                break
        for segment in self._segments[:-1]:
            segment.sealed = True
            if not os.path.exists(segment.index_path):
                # A swap finished above removed them; load() rebuilt them in memory.
                segment.save_indexes()
                segment.fsync()
                self._dir_dirty = True
        self._load_epoch_cache(recovered, clean, trusted_epoch=trusted_epoch)
        if not clean:
            for segment in self._segments[first_to_recover:]:
                segment.fsync()
            self._dir_dirty = True
        # A new log's files need no sync yet: lost in a crash, they come back as the same empty
        # log. Its first flush syncs the directory (_dir_dirty), before anything in it counts
        # as durable; opening thousands of new replicas then costs no fsync here.
        if self._dir_dirty and not new:
            fsync_dir(self.directory)
            self._dir_dirty = False
        self._flushed_offset = self.log_end_offset
        self._recovery_point = self._flushed_offset
        self._load_cleaner_checkpoint()
        if not new:  # a missing recovery point means "from the first segment": the same for a new log
            files.write_atomically(self._path(RECOVERY_POINT), b"%d\n" % self._recovery_point)
        if not clean:
            # Everything is fsynced now: a crash soon after validates only what comes next.
            self._write_checkpoint(*self._checkpoint_of_active())
        if os.path.exists(self._path(CLEAN_SHUTDOWN)):
            # From now on a crash must be detected as one.
            os.unlink(self._path(CLEAN_SHUTDOWN))
            fsync_dir(self.directory)

    def _finish_swaps(self) -> None:
        """Complete a compaction swap a crash interrupted: a `.log.swap` was renamed from a
        fsynced `.cleaned` file under the log's lock while its segment was unchanged, so it
        replaces that segment; without the segment (truncated or deleted since) it goes."""
        for name in os.listdir(self.directory):
            if not name.endswith(".log" + SWAP_SUFFIX):
                continue
            log_name = name[:-len(SWAP_SUFFIX)]
            stem = log_name[:-4]
            if os.path.exists(self._path(log_name)):
                # Indexes of the old bytes must not describe the new ones: load() rebuilds them.
                for ext in (".index", ".timeindex"):
                    try:
                        os.unlink(self._path(stem + ext))
                    except FileNotFoundError:
                        pass
                os.replace(self._path(name), self._path(log_name))
            else:
                os.unlink(self._path(name))
            self._dir_dirty = True

    def _load_cleaner_checkpoint(self) -> None:
        data = _read_bytes(self._path(CLEANER_CHECKPOINT))
        first_dirty, cleaned_at = 0, {}
        try:
            lines = (data or b"").decode().split("\n")
            if lines and lines[0].startswith("dirty "):
                first_dirty = int(lines[0].split()[1])
                for line in lines[1:]:
                    if line.strip():
                        base, at = (int(x) for x in line.split())
                        cleaned_at[base] = at
        except (ValueError, UnicodeDecodeError):
            first_dirty, cleaned_at = 0, {}  # unreadable: the next pass cleans from the start
        bases = set(self._bases[:-1])
        self._first_dirty_offset = min(first_dirty, self.log_end_offset)
        self._cleaned_at = {b: at for b, at in cleaned_at.items() if b in bases}

    def _write_cleaner_checkpoint(self) -> None:
        bases = set(self._bases[:-1])
        self._cleaned_at = {b: at for b, at in self._cleaned_at.items() if b in bases}
        lines = [b"dirty %d" % self._first_dirty_offset]
        lines += [b"%d %d" % (b, at) for b, at in sorted(self._cleaned_at.items())]
        files.write_atomically(self._path(CLEANER_CHECKPOINT), b"\n".join(lines) + b"\n")

    # ------------------------------------------------------------------ recovery checkpoints

    def _read_checkpoint(self) -> tuple[int, int, int, int] | None:
        data = _read_bytes(self._path(ACTIVE_CHECKPOINT))
        try:
            base, position, next_offset, epoch = (int(x) for x in (data or b"").split())
        except ValueError:
            return None  # missing or not ours: recover the whole segment
        return base, position, next_offset, epoch

    def _checkpoint_of_active(self) -> tuple[int, int, int, int]:
        active = self._segments[-1]
        return active.base_offset, active.size_bytes, active.next_offset, self._epochs.latest_epoch

    def _write_checkpoint(self, base: int, position: int, next_offset: int, epoch: int,
                          indexes: CheckpointIndexes | None = None) -> None:
        """Save the indexes of the active segment's prefix [0, position) and then name it
        in ACTIVE_CHECKPOINT. The prefix must be fsynced already."""
        if position == 0:
            return
        segment = self._segments[self._segment_index(base)]
        if indexes is None:
            indexes = segment.indexes_below(position, next_offset)
        try:
            segment.save_checkpoint_indexes(indexes)
        except OSError as exc:
            raise files.storage_error(f"cannot write the indexes of {segment.log_path}", exc) from exc
        files.write_atomically(self._path(ACTIVE_CHECKPOINT), b"%d %d %d %d\n" % (base, position, next_offset, epoch))
        self._checkpoint = (base, position, next_offset)

    def _drop_checkpoint(self) -> None:
        """Before a truncation: the checkpoint may name bytes it removes. Durable with the
        directory fsync the truncation does."""
        self._checkpoint = None
        try:
            os.unlink(self._path(ACTIVE_CHECKPOINT))
        except FileNotFoundError:
            pass

    def _checkpoint_due(self, base: int, position: int, next_offset: int) -> bool:
        if position == 0:
            return False
        # A segment's first checkpoint also waits for an interval's worth: re-reading less than
        # that on recovery costs less than the fsyncs of the checkpoint (index files, the
        # checkpoint file, the directory) at the first flush of every new replica.
        _, last_position, last_offset = (self._checkpoint if self._checkpoint is not None
                                         and self._checkpoint[0] == base else (base, 0, base))
        return (position - last_position >= self.config.checkpoint_interval_bytes
                or next_offset - last_offset >= self.config.checkpoint_interval_offsets)

    def _delete_files_of(self, bases: list[int]) -> None:
        for base in sorted(bases, reverse=True):
            self.recovered_bytes_cut += _file_size(self._path(f"{base:020d}.log"))
            Segment(self.directory, base, index_interval_bytes=1).delete()
        self._dir_dirty = True

    def _add_segment(self, segment: Segment) -> None:
        self._segments.append(segment)
        self._bases.append(segment.base_offset)

    def _remove_last_segment(self) -> None:
        segment = self._segments.pop()
        self._bases.pop()
        self._dirty.pop(id(segment), None)
        segment.delete()

    def _delete_segments_from(self, index: int) -> None:
        # Highest first, so a crash half-way still leaves a contiguous log.
        while len(self._segments) > index:
            self._remove_last_segment()
        self._dir_dirty = True

    def _finish_truncate_fully(self, bases: list[int], offset: int) -> None:
        for base in sorted(bases, reverse=True):
            Segment(self.directory, base, index_interval_bytes=1).delete()
        Segment(self.directory, offset, index_interval_bytes=1).close()
        files.write_atomically(self._path(EPOCH_CHECKPOINT), EpochCache().encode())
        files.write_atomically(self._path(RECOVERY_POINT), b"%d\n" % offset)
        os.unlink(self._path(TRUNCATE_FULLY))
        fsync_dir(self.directory)

    def _load_epoch_cache(self, recovered: list[BatchSpan], clean: bool, *, trusted_epoch: int | None) -> None:
        path = self._path(EPOCH_CHECKPOINT)
        data = _read_bytes(path)
        cache = None
        if data is not None:
            try:
                cache = EpochCache.decode(data, path=path)
            except Exception:
                cache = None
        if cache is not None and trusted_epoch is not None and cache.latest_epoch < trusted_epoch:
            # A prefix recovery did not read may start an epoch the file does not name.
            cache = None
        changed = False
        if cache is None:
            # Missing or unreadable: rebuild it from every batch header.
            cache = EpochCache()
            for segment in self._segments:
                for span in segment.walk(0):
                    if span.leader_epoch > cache.latest_epoch:
                        cache.assign(span.leader_epoch, span.base_offset)
            changed = True
        else:
            changed |= cache.truncate_from_end(self.log_end_offset)
            changed |= cache.truncate_from_start(self.log_start_offset)
            for span in recovered:
                if span.leader_epoch > cache.latest_epoch:
                    changed |= cache.assign(span.leader_epoch, span.base_offset)
        self._epochs = cache
        # An empty cache rebuilt for a missing file is what the next open rebuilds as well.
        if changed and not (data is None and cache.latest_epoch < 0):
            files.write_atomically(path, cache.encode())

    # ------------------------------------------------------------------ offsets

    @property
    def log_start_offset(self) -> int:
        return self._segments[0].base_offset

    @property
    def log_end_offset(self) -> int:
        return self._segments[-1].next_offset

    @property
    def segment_count(self) -> int:
        """Segments on disk, the active one included (retention never deletes that one)."""
        return len(self._segments)

    @property
    def batch_bytes_max(self) -> int:
        """The largest batch an append takes: one batch never spans segments."""
        return min(self.config.segment_bytes, BATCH_BYTES_MAX)

    @property
    def flushed_offset(self) -> int:
        return self._flushed_offset

    @property
    def latest_epoch(self) -> int:
        return self._epochs.latest_epoch

    def epoch_entries(self) -> list[EpochEntry]:
        with self._lock:
            return self._epochs.entries()

    def epoch_before(self, offset: int) -> int:
        with self._lock:
            return self._epochs.epoch_before(offset)

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        with self._lock:
            return self._epochs.end_offset_for_epoch(epoch, self.log_end_offset)

    @property
    def flush_cost_bytes(self) -> int | None:
        with self._lock:
            if self._dir_dirty or self._epochs_unwritten or len(self._dirty) > 1:
                return None
            if not self._dirty:
                return 0
            active = self._segments[-1]
            segment = next(iter(self._dirty.values()))
            if segment is not active or self._checkpoint_due(active.base_offset, active.size_bytes,
                                                             active.next_offset):
                return None
            return self._unflushed_bytes

    @property
    def size_bytes(self) -> int:
        return sum(s.size_bytes for s in self._segments)

    @property
    def segment_base_offsets(self) -> list[int]:
        return list(self._bases)

    @property
    def active_segment_base_offset(self) -> int:
        """Base offset of the segment appends go to; it changes when the log rolls."""
        return self._bases[-1]

    # ------------------------------------------------------------------ append

    def append_as_leader(self, batches: bytes | bytearray | memoryview, *, leader_epoch: int,
                         now_ms: int | None = None, crc_checked: bool = False) -> AppendInfo:
        """Validate every batch (header, and CRC32C unless crc_checked), give them offsets
        from log_end_offset and stamp `leader_epoch`, patching the headers without
        re-encoding. A bytearray or writable memoryview is patched in place; anything else
        is copied once. Written, not yet durable: see flush()."""
        buf = batches if patchable(batches) else bytearray(batches)
        spans = self._validate(buf, crc=not crc_checked)
        with self._lock:
            self._check_writable()
            self._epochs.check_epoch(leader_epoch)
            offset = self.log_end_offset
            assigned = []
            for span in spans:
                set_base_offset(buf, offset, span.position)
                set_leader_epoch(buf, leader_epoch, span.position)
                count = span.next_offset - span.base_offset
                assigned.append(BatchSpan(position=span.position, size_bytes=span.size_bytes,
                                          base_offset=offset, next_offset=offset + count,
                                          max_timestamp=span.max_timestamp, leader_epoch=leader_epoch))
                offset += count
            return self._write(buf, assigned, now_ms)

    def append_as_follower(self, batches: bytes | bytearray | memoryview, *,
                           now_ms: int | None = None, crc_checked: bool = False) -> AppendInfo:
        """Validate (CRC too unless crc_checked) and store batches with the offsets and
        epochs the leader gave them. They must start at or after log_end_offset, each at or
        after the end of the one before (gaps are what compaction leaves; an overlap is an
        OffsetMismatchError naming the expected and actual base offset); epochs must not
        go backwards (StaleEpochError)."""
        # A follower stores what its leader stored: a batch larger than this replica's segment
        # size (the topic's was larger when the leader took it) goes into a segment of its own.
        spans = self._validate(batches, crc=not crc_checked, limit=BATCH_BYTES_MAX)
        with self._lock:
            self._check_writable()
            expected = self.log_end_offset
            latest_epoch = self._epochs.latest_epoch
            for i, span in enumerate(spans):
                # A gap is what compaction leaves in the leader's log (offsets stay, records go).
                if span.base_offset < expected:
                    raise OffsetMismatchError(
                        f"follower append: expected base offset {expected} or above, got {span.base_offset} "
                        f"(batch {i} of {len(spans)}); an overlap: truncate or fetch from log_end_offset",
                        expected_offset=expected, actual_offset=span.base_offset)
                if span.leader_epoch < latest_epoch:
                    raise StaleEpochError(
                        f"follower append: batch at offset {span.base_offset} has leader epoch "
                        f"{span.leader_epoch}, older than epoch {latest_epoch} before it; "
                        f"truncate to where the epochs diverge first",
                        field="leader_epoch", expected=latest_epoch, actual=span.leader_epoch)
                latest_epoch = max(latest_epoch, span.leader_epoch)
                expected = span.next_offset
            return self._write(batches, spans, now_ms)

    def _validate(self, buf: Buffer, *, crc: bool, limit: int | None = None) -> list[BatchSpan]:
        spans = []
        for position, header in iter_batches(buf, validate=crc, max_batch_bytes=limit or self.batch_bytes_max):
            spans.append(BatchSpan(position=position, size_bytes=header.size_bytes,
                                   base_offset=header.base_offset, next_offset=header.next_offset,
                                   max_timestamp=header.max_timestamp, leader_epoch=header.leader_epoch))
        if not spans:
            raise InvalidRequestError("append with no record batches; send at least one batch")
        return spans

    def _note_if_full(self, exc: BaseException, what: str) -> None:
        if space.is_disk_full(exc):
            self.space.note_full(what)

    def _check_writable(self) -> None:
        if self._closed:
            raise StorageError(f"log {self.directory} is closed")
        if self._failed:
            raise StorageError(f"log {self.directory} is offline after an I/O error ({self._failed}); "
                               f"reopen it to recover")

    def _write(self, buf: Buffer, spans: list[BatchSpan], now_ms: int | None) -> AppendInfo:
        """Write validated spans with final offsets; all or nothing."""
        old_end = self.log_end_offset
        old_count = len(self._segments)
        old_active = self._segments[-1]
        old_epochs, old_unwritten = self._epochs, self._epochs_unwritten
        self._record_epochs(spans)
        try:
            for roll_first, run in self._runs_by_segment(spans, now_ms):
                if roll_first:
                    # At the log end, not the batch: after a compaction gap the segment's
                    # first batch starts later, and segments stay contiguous.
                    self._roll_locked(self.log_end_offset)
                segment = self._segments[-1]
                size_before = segment.size_bytes
                segment.append(buf, run)
                self._dirty[id(segment)] = segment
                self._unflushed_bytes += segment.size_bytes - size_before
        except OSError as exc:
            self._note_if_full(exc, f"append to {self.directory}")
            # The file never held the new epochs: only a flush writes it, and none ran meanwhile.
            self._epochs, self._epochs_unwritten = old_epochs, old_unwritten
            self._undo_append(old_end, old_count, old_active, exc)
            raise files.storage_error(
                f"append of offsets {old_end}..{spans[-1].next_offset - 1} to {self.directory} "
                f"failed; nothing was appended, log_end_offset is still {old_end}", exc) from exc
        self._tail.add(buf, spans)
        return AppendInfo(base_offset=spans[0].base_offset, last_offset=spans[-1].next_offset - 1,
                          batch_count=len(spans), size_bytes=sum(s.size_bytes for s in spans),
                          max_timestamp=max(s.max_timestamp for s in spans),
                          log_end_offset=self.log_end_offset)

    def _record_epochs(self, spans: list[BatchSpan]) -> None:
        """Note new epochs in memory; the next flush writes the checkpoint file and syncs it
        before the recovery point or the active checkpoint lets a recovery trust the batches
        that carry them, and a recovery re-reads everything past those and assigns the epochs
        it finds. Writing the file here put a file replace on the append path for every new
        epoch (its fsync went to the flush earlier, as Kafka did in KAFKA-15046): on the event
        loop, for each of the thousands of partitions a broker start or a failover moves."""
        if not any(self._epochs.would_change(s.leader_epoch) for s in spans):
            return
        cache = EpochCache(self._epochs.entries())
        for span in spans:
            if cache.would_change(span.leader_epoch):
                cache.assign(span.leader_epoch, span.base_offset)
        self._epochs = cache
        self._epochs_unwritten = True
        self._dir_dirty = True

    def _undo_append(self, old_end: int, old_count: int, old_active: Segment, exc: OSError) -> None:
        try:
            self._delete_segments_from(old_count)
            old_active.unseal()
            if old_active.next_offset != old_end:
                old_active.truncate_to(old_end)
        except OSError as undo_exc:
            self._failed = f"append failed with {exc}, undoing it failed with {undo_exc}"

    def _runs_by_segment(self, spans: list[BatchSpan],
                         now_ms: int | None) -> list[tuple[bool, list[BatchSpan]]]:
        """Split spans into (roll first?, spans) runs, one per segment they go to."""
        active = self._segments[-1]
        size, base, rolling_ts = active.size_bytes, active.base_offset, active.rolling_timestamp
        runs: list[tuple[bool, list[BatchSpan]]] = []
        current: list[BatchSpan] = []
        roll_first = False
        end = active.next_offset
        for span in spans:
            if size and self._should_roll(size, base, rolling_ts, span, now_ms):
                if current:
                    runs.append((roll_first, current))
                current, roll_first = [], True
                size, base, rolling_ts = 0, end, None
            end = span.next_offset
            if rolling_ts is None:
                rolling_ts = span.max_timestamp
            current.append(span)
            size += span.size_bytes
        runs.append((roll_first, current))
        return runs

    def _should_roll(self, size: int, base: int, rolling_ts: int | None, span: BatchSpan,
                     now_ms: int | None) -> bool:
        if size + span.size_bytes > self.config.segment_bytes:
            return True
        if span.next_offset - 1 - base > _RELATIVE_OFFSET_MAX:
            return True
        segment_ms = self.config.segment_ms
        if segment_ms is not None and rolling_ts is not None:
            newest = span.max_timestamp if now_ms is None else max(now_ms, span.max_timestamp)
            if newest - rolling_ts >= segment_ms:
                return True
        return False

    def _roll_locked(self, base_offset: int) -> None:
        assert base_offset == self.log_end_offset, (base_offset, self.log_end_offset)
        active = self._segments[-1]
        if not active.size_bytes:
            return
        active.seal()
        self._add_segment(Segment(self.directory, base_offset,
                                  index_interval_bytes=self.config.index_interval_bytes))
        self._dir_dirty = True

    def roll(self, *, now_ms: int | None = None) -> None:
        """Start a new segment at log_end_offset unless the active one is empty, or (with
        now_ms) only if the active segment is older than segment_ms."""
        with self._lock:
            self._check_writable()
            active = self._segments[-1]
            if now_ms is not None:
                if (self.config.segment_ms is None or active.rolling_timestamp is None
                        or now_ms - active.rolling_timestamp < self.config.segment_ms):
                    return
            try:
                self._roll_locked(self.log_end_offset)
            except OSError as exc:
                self._note_if_full(exc, f"segment roll in {self.directory}")
                raise files.storage_error(f"cannot roll a new segment in {self.directory}", exc) from exc

    # ------------------------------------------------------------------ read

    def read(self, start_offset: int, *, max_bytes: int, max_offset: int | None = None) -> ReadResult:
        """Whole batches starting with the one that contains start_offset (see interface.py).

        Reads one segment per call: from the tail cache when it holds start_offset
        (no copy when the batches came in one append), else with a single pread of at
        most max_bytes (plus one more for a first batch larger than max_bytes); records
        are never decoded.
        """
        if max_bytes < 0:
            raise InvalidRequestError(f"max_bytes={max_bytes} must be >= 0")
        with self._lock:
            if self._closed:
                raise StorageError(f"log {self.directory} is closed")
            start, end = self.log_start_offset, self.log_end_offset
            if not start <= start_offset <= end:
                raise OffsetOutOfRangeError(
                    f"offset {start_offset} is out of range: the log holds {start}..{end - 1} "
                    f"(log_start_offset {start}, log_end_offset {end})",
                    offset=start_offset, log_start_offset=start, log_end_offset=end)
            empty = ReadResult(records=b"", first_offset=start_offset, next_offset=start_offset,
                               log_start_offset=start, log_end_offset=end)
            if start_offset == end or (max_offset is not None and start_offset >= max_offset):
                return empty
            i = bisect.bisect_right(self._bases, start_offset) - 1
            cached = self._tail.read(start_offset, max_bytes=max_bytes, max_offset=max_offset,
                                     end_offset_max=self._bases[i + 1] if i + 1 < len(self._bases) else None)
            if cached is not None:
                data, first_offset, next_offset = cached
                if not data:
                    return empty
                return ReadResult(records=data, first_offset=first_offset, next_offset=next_offset,
                                  log_start_offset=start, log_end_offset=end)
            segment = self._segments[i]
            try:
                position, first_offset = segment.position_of(start_offset)
                data, next_offset = segment.read(position, max_bytes=max_bytes, max_offset=max_offset)
            except OSError as exc:
                raise files.storage_error(f"read at offset {start_offset} from {segment.log_path}",
                                          exc) from exc
            if not data:
                return empty
            return ReadResult(records=data, first_offset=first_offset, next_offset=next_offset,
                              log_start_offset=start, log_end_offset=end)

    def offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int] | None:
        with self._lock:
            for segment in self._segments:
                if segment.max_timestamp is not None and segment.max_timestamp >= timestamp_ms:
                    try:
                        found = segment.record_for_timestamp(timestamp_ms)
                    except OSError as exc:
                        raise files.storage_error(f"timestamp lookup in {segment.log_path}", exc) from exc
                    if found is not None:
                        return found
            return None

    # ------------------------------------------------------------------ flush

    def flush(self) -> int:
        """fsync everything written before the call; returns flushed_offset, below which
        every offset is durable. Appends may run while it waits for the disk."""
        with self._flush_lock:
            with self._lock:
                self._check_writable()
                target = self.log_end_offset
                active = self._segments[-1]
                active_end = (active.base_offset, active.size_bytes, active.next_offset)
                segments = list(self._dirty.values())
                self._dirty.clear()
                unflushed, self._unflushed_bytes = self._unflushed_bytes, 0
                dir_dirty, self._dir_dirty = self._dir_dirty, False
                epochs_unwritten, self._epochs_unwritten = self._epochs_unwritten, False
                epochs = self._epochs.encode() if epochs_unwritten else None
                # The newest epoch of the bytes this flush covers: the checkpoint file written
                # below holds it (one a later append brings waits for the next flush).
                epoch = self._epochs.latest_epoch
                truncations = self._truncations
                drops = self._drop_behind_ends(segments)
            try:
                for segment in segments:
                    segment.fsync()
                if epochs is not None:
                    self._write_epochs(epochs)
                if dir_dirty:
                    fsync_dir(self.directory)
            except OSError as exc:
                with self._lock:
                    for segment in segments:
                        if segment.fd >= 0:
                            self._dirty[id(segment)] = segment
                    self._unflushed_bytes += unflushed
                    self._dir_dirty |= dir_dirty
                    self._epochs_unwritten |= epochs_unwritten
                self._note_if_full(exc, f"flush of {self.directory}")
                raise files.storage_error(f"flush of {self.directory} failed", exc) from exc
            for segment, end in drops:
                try:
                    segment.drop_cached(end)
                except OSError:
                    pass  # only a hint to the page cache; the data is durable either way
            with self._lock:
                if truncations == self._truncations and target > self._flushed_offset:
                    self._flushed_offset = target
                flushed = self._flushed_offset
                checkpoint_due = self._segment_index(flushed) != self._segment_index(self._recovery_point)
                # No truncation can run meanwhile (it waits for the flush lock): the active
                # segment's bytes below active_end are fsynced and stay as they are.
                active_due = (truncations == self._truncations and self._checkpoint_due(*active_end))
                indexes = (self._segments[self._segment_index(active_end[0])].indexes_below(*active_end[1:])
                           if active_due else None)
            try:
                if checkpoint_due:
                    self._write_recovery_point(flushed)
                if indexes is not None:
                    self._write_checkpoint(*active_end, epoch, indexes)
            except StorageError as exc:
                # The data is durable; only a checkpoint is older (each file is replaced
                # atomically), so the next open recovers a little more. Not a failure.
                self._note_if_full(exc, f"recovery checkpoint write in {self.directory}")
            return flushed

    def _drop_behind_ends(self, segments: list[Segment]) -> list[tuple[Segment, int]]:
        """(segment, file position) below which its pages may leave the page cache once
        this flush's fsync returned: whole older segments, and the active one up to
        page_cache_behind_bytes before its end (what followers and consumers read next)."""
        behind = self.config.page_cache_behind_bytes
        if behind is None:
            return []
        active = self._segments[-1]
        return [(s, s.size_bytes - behind if s is active else s.size_bytes) for s in segments]

    def _segment_index(self, offset: int) -> int:
        return bisect.bisect_right(self._bases, offset) - 1

    def _write_epochs(self, data: bytes) -> None:
        """Replace the epoch checkpoint with `data`, fsynced; its rename needs the directory's
        fsync too, which the caller does. Runs under the flush lock, as every other writer
        of the file does, so no two share its temporary file. An OSError fails the flush (a
        full disk takes the partition offline, as a failed append does, and the controller
        moves its leadership)."""
        path = self._path(EPOCH_CHECKPOINT)
        durable.write_atomically(path, data, sync=False)
        durable.fsync_path(path)

    def _write_recovery_point(self, offset: int) -> None:
        files.write_atomically(self._path(RECOVERY_POINT), b"%d\n" % offset)
        self._recovery_point = offset

    # ------------------------------------------------------------------ truncation

    def truncate_to(self, offset: int) -> int:
        """Remove every batch whose last offset is >= offset, across segments; fix the
        indexes and the epoch cache. Durable on return. Returns the new log_end_offset
        (below offset when offset falls inside a batch). At or below log_start_offset
        the log is emptied and starts at offset."""
        with self._flush_lock:
            with self._lock:
                self._check_writable()
                if offset >= self.log_end_offset:
                    return self.log_end_offset
                if offset <= self.log_start_offset:
                    self._truncate_fully_locked(offset)
                    return offset
                try:
                    self._drop_checkpoint()
                    i = self._segment_index(offset)
                    if self._segments[i].base_offset == offset:
                        i -= 1  # offset starts a segment: drop it whole, keep the one before
                    self._delete_segments_from(i + 1)
                    active = self._segments[-1]
                    active.unseal()
                    active.truncate_to(offset)
                    active.fsync()
                    fsync_dir(self.directory)
                    self._dir_dirty = False
                except OSError as exc:
                    self._failed = f"truncation to {offset} failed: {exc}"
                    raise files.storage_error(f"truncation of {self.directory} to {offset}", exc) from exc
                self._after_truncation()
                return self.log_end_offset

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Remove every segment and start an empty log at offset; clears the epoch cache.
        Durable on return; a crash half-way is completed on the next open."""
        if offset < 0:
            raise InvalidRequestError(f"offset {offset} must be >= 0")
        with self._flush_lock:
            with self._lock:
                self._check_writable()
                self._truncate_fully_locked(offset)

    def _truncate_fully_locked(self, offset: int) -> None:
        try:
            self._drop_checkpoint()
            files.write_atomically(self._path(TRUNCATE_FULLY), b"%d\n" % offset)
            self.producer_snapshots.delete_above(-1)
            self._delete_segments_from(0)
            self._finish_truncate_fully([], offset)
            self._add_segment(Segment(self.directory, offset,
                                      index_interval_bytes=self.config.index_interval_bytes))
        except OSError as exc:
            self._failed = f"truncate_fully_and_start_at({offset}) failed: {exc}"
            raise files.storage_error(f"truncate_fully_and_start_at({offset}) in {self.directory}",
                                      exc) from exc
        self._epochs.clear()
        self._dir_dirty = False
        self._recovery_point = offset
        self._after_truncation()

    def _after_truncation(self) -> None:
        self._truncations += 1
        end = self.log_end_offset
        self.producer_snapshots.delete_above(end)
        self._tail.truncate_to(end)
        self._tail.drop_before(self.log_start_offset)
        self._flushed_offset = max(min(self._flushed_offset, end), self.log_start_offset)
        if self._epochs.truncate_from_end(end):
            files.write_atomically(self._path(EPOCH_CHECKPOINT), self._epochs.encode())
        if self._recovery_point > end:
            self._write_recovery_point(end)
        active = self.active_segment_base_offset
        if self._first_dirty_offset > end or any(b >= active for b in self._cleaned_at):
            # What was cut is appended afresh: dirty, and never cleaned.
            self._first_dirty_offset = min(self._first_dirty_offset, end)
            self._cleaned_at = {b: at for b, at in self._cleaned_at.items() if b < active}
            self._write_cleaner_checkpoint()

    # ------------------------------------------------------------------ retention

    def apply_retention(self, now_ms: int, *, below_offset: int | None = None) -> list[DeletedSegment]:
        """Delete the oldest whole segments that are past retention_ms (by their largest
        batch timestamp) or that keep the log over retention_bytes; never the active
        segment, and with `below_offset` (the HW) only segments wholly below it, so no
        replica's log starts past what is committed. Moves log_start_offset to the first
        remaining segment. Durable on return."""
        retention_ms, retention_bytes = self.config.retention_ms, self.config.retention_bytes
        deleted: list[DeletedSegment] = []
        with self._flush_lock:
            with self._lock:
                self._check_writable()
                total = self.size_bytes
                while len(self._segments) > 1:
                    oldest = self._segments[0]
                    if below_offset is not None and oldest.next_offset > below_offset:
                        break
                    if (retention_ms is not None and oldest.max_timestamp is not None
                            and now_ms - oldest.max_timestamp > retention_ms):
                        reason = "retention_ms"
                    elif retention_bytes is not None and total - oldest.size_bytes >= retention_bytes:
                        reason = "retention_bytes"
                    else:
                        break
                    deleted.append(DeletedSegment(base_offset=oldest.base_offset,
                                                  next_offset=oldest.next_offset,
                                                  size_bytes=oldest.size_bytes, reason=reason))
                    total -= oldest.size_bytes
                    self._segments.pop(0)
                    self._bases.pop(0)
                    self._dirty.pop(id(oldest), None)
                    try:
                        oldest.delete()
                    except OSError as exc:
                        self._failed = f"deleting {oldest.log_path} failed: {exc}"
                        raise files.storage_error(f"retention in {self.directory}", exc) from exc
                if deleted:
                    start = self.log_start_offset
                    self._tail.drop_before(start)
                    self._flushed_offset = max(self._flushed_offset, start)
                    if self._epochs.truncate_from_start(start):
                        try:
                            files.write_atomically(self._path(EPOCH_CHECKPOINT), self._epochs.encode())
                        except StorageError as exc:
                            # The old file names epochs below the new start too: open() trims them.
                            self._note_if_full(exc, f"epoch checkpoint write in {self.directory}")
                    fsync_dir(self.directory)
        return deleted

    # ------------------------------------------------------------------ compaction

    def clean(self, now_ms: int, *, below_offset: int, config: CompactionConfig,
              throttle: Callable[[int], None] | None = None) -> CleanResult | None:
        """One compaction pass (cleaner.py decides what stays): rewrite the cleanable closed
        segments wholly below `below_offset` (the HW this replica knows) and flushed, oldest
        first, keeping the latest record of every key. None when no pass is due.

        Appends and reads go on meanwhile: segments are read through their own descriptors
        and each rewritten segment is written to `<base>.log.cleaned` and fsynced without
        the log's lock; under it, if the segment is still there unchanged, the file is
        renamed to `.log.swap` (from here a crash completes the swap on open), the old
        indexes removed, the swap renamed over the segment, and the indexes rebuilt. A
        segment truncated or deleted meanwhile is left alone. `throttle(n)` is told of every
        n bytes read or written and may sleep. Durable on return."""
        pace = throttle or _no_throttle
        with self._lock:
            self._check_writable()
            summaries = [SegmentSummary(base_offset=s.base_offset, next_offset=s.next_offset,
                                        size_bytes=s.size_bytes, max_timestamp=s.max_timestamp,
                                        cleaned_at_ms=self._cleaned_at.get(s.base_offset))
                         for s in self._segments]
            plan = plan_clean(summaries, first_dirty_offset=self._first_dirty_offset,
                              bound_offset=min(below_offset, self._flushed_offset), now_ms=now_ms, config=config)
            if plan is None:
                return None
            chosen = self._segments[:len(plan.segments)]
            truncations = self._truncations
            fds: list[int] = []
            try:
                for segment in chosen:
                    fds.append(os.open(segment.log_path, os.O_RDONLY | os.O_CLOEXEC))
            except OSError as exc:
                for fd in fds:
                    os.close(fd)
                raise files.storage_error(f"cleaner cannot open {self.directory}", exc) from exc
        try:
            return self._clean_segments(plan, chosen, fds, truncations, now_ms, config, pace)
        except OSError as exc:
            self._note_if_full(exc, f"compaction of {self.directory}")
            raise files.storage_error(f"compaction of {self.directory}", exc) from exc
        finally:
            for fd in fds:
                os.close(fd)

    def _clean_segments(self, plan: CleanPlan, chosen: list[Segment], fds: list[int], truncations: int,
                        now_ms: int, config: CompactionConfig, pace: Callable[[int], None]) -> CleanResult | None:
        offset_map = OffsetMap(keys_max=config.offset_map_keys_max)
        producer_last: dict[int, int] = {}
        count = len(chosen)
        for i, (segment, fd) in enumerate(zip(chosen, fds)):
            for header, data in _batches_of(fd, plan.segments[i].size_bytes, pace):
                map_batch(header, data, offset_map=offset_map, producer_last=producer_last)
            if offset_map.full():
                count = i + 1  # a bounded map: this pass stops here, the next goes on
                break
        end_offset = plan.segments[count - 1].next_offset
        pinned: set[bytes] = set()
        cleaned = removed = before = after = 0
        for i in range(count):
            segment, summary = chosen[i], plan.segments[i]
            drop = drops_tombstones(summary, now_ms=now_ms, config=config)
            temporary = segment.log_path + CLEANED_SUFFIX
            out = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            written = gone = 0
            try:
                for header, data in _batches_of(fds[i], summary.size_bytes, pace):
                    kept, n = clean_batch(header, data, segment_next_offset=summary.next_offset,
                                          offset_map=offset_map, producer_last=producer_last,
                                          drop_tombstones=drop, pinned=pinned)
                    gone += n
                    for part in kept:
                        write_all(out, part, written)
                        written += len(part)
                        pace(len(part))
                if gone:
                    os.fsync(out)
            finally:
                os.close(out)
            if not gone:
                os.unlink(temporary)
                continue
            self._kill_point("cleaned-written")
            if not self._swap(segment, summary.size_bytes, temporary, truncations):
                os.unlink(temporary)
                return None  # truncated, deleted or closed meanwhile: a later pass starts over
            cleaned += 1
            removed += gone
            before += summary.size_bytes
            after += written
        self._kill_point("swapped-all")
        with self._lock:
            if self._closed or truncations != self._truncations:
                return None
            self._first_dirty_offset = max(self._first_dirty_offset, end_offset)
            for summary in plan.segments[:count]:
                self._cleaned_at.setdefault(summary.base_offset, now_ms)
            self._write_cleaner_checkpoint()
        return CleanResult(segments_cleaned=cleaned, records_removed=removed, bytes_before=before,
                           bytes_after=after, end_offset=end_offset)

    def _swap(self, segment: Segment, size_bytes: int, temporary: str, truncations: int) -> bool:
        """Put the fsynced `temporary` in place of `segment` if it is still in the log as it
        was read (size_bytes, no truncation since); False, changing nothing, if not."""
        with self._flush_lock:
            with self._lock:
                if (self._closed or self._failed or truncations != self._truncations
                        or not any(s is segment for s in self._segments[:-1])
                        or segment.size_bytes != size_bytes):
                    return False
                swap = segment.log_path + SWAP_SUFFIX
                try:
                    os.rename(temporary, swap)
                    fsync_dir(self.directory)
                    self._kill_point("swap-renamed")
                    for path in (segment.index_path, segment.time_index_path):
                        try:
                            os.unlink(path)
                        except FileNotFoundError:
                            pass
                    self._kill_point("indexes-removed")
                    os.replace(swap, segment.log_path)
                    fsync_dir(self.directory)
                    self._kill_point("replaced")
                    fresh = Segment(self.directory, segment.base_offset,
                                    index_interval_bytes=self.config.index_interval_bytes)
                    fresh.rebuild_indexes()
                    fresh.seal()
                    fresh.fsync()
                    fsync_dir(self.directory)
                except OSError as exc:
                    # The files are as a crash would leave them: the next open completes the swap.
                    self._failed = f"compaction swap of {segment.log_path} failed: {exc}"
                    raise
                assert fresh.next_offset == segment.next_offset, (fresh.next_offset, segment.next_offset)
                assert fresh.base_offset == segment.base_offset, (fresh.base_offset, segment.base_offset)
                i = self._segment_index(segment.base_offset)
                self._segments[i] = fresh
                self._dirty.pop(id(segment), None)
                segment.close()
                # The cache may hold the old batches of this segment: serve them from the file.
                self._tail.drop_before(fresh.next_offset)
                return True

    def _kill_point(self, step: str) -> None:
        if self.cleaner_kill_point is not None:
            self.cleaner_kill_point(step)

    # ------------------------------------------------------------------ close

    def close(self) -> None:
        """Flush, save the indexes, write the clean-shutdown marker, release the lock.
        Idempotent. A log that failed an I/O is closed without the marker, so the next
        open recovers it."""
        with self._flush_lock:
            with self._lock:
                if self._closed:
                    return
            clean = self._failed is None
            try:
                if clean:
                    with self._lock:
                        self._segments[-1].seal()
                        segments = list(self._segments)
                        epochs = self._epochs.encode() if self._epochs_unwritten else None
                        self._epochs_unwritten = False
                    for segment in segments:
                        segment.fsync()
                    if epochs is not None:
                        try:
                            self._write_epochs(epochs)
                        except OSError as exc:
                            raise files.storage_error(f"epoch checkpoint write in {self.directory}", exc) from exc
                    fsync_dir(self.directory)
                    files.write_atomically(self._path(RECOVERY_POINT), b"%d\n" % self.log_end_offset)
                    files.write_atomically(self._path(CLEAN_SHUTDOWN), b"")
            except StorageError as exc:
                if not space.is_disk_full(exc):
                    raise
                # Everything is fsynced; without the marker the next open only recovers more.
                self.space.note_full(f"clean close of {self.directory}")
            finally:
                with self._lock:
                    self._closed = True
                    self._tail.clear()
                    for segment in self._segments:
                        segment.close()
                self._dir_lock.release()

    def __enter__(self) -> PartitionLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _no_throttle(moved_bytes: int) -> None:
    pass


def _batches_of(fd: int, size_bytes: int, pace: Callable[[int], None]) -> Iterator[tuple[BatchHeader, memoryview]]:
    """Every batch in the first size_bytes of a segment file, read a chunk at a time."""
    position = 0
    while position < size_bytes:
        chunk = os.pread(fd, min(_CLEANER_READ_BYTES, size_bytes - position), position)
        pace(len(chunk))
        view = memoryview(chunk)
        p = 0
        while p + HEADER_SIZE <= len(view):
            header = read_header(view, p)
            if p + header.size_bytes > len(view):
                break
            yield header, view[p:p + header.size_bytes]
            p += header.size_bytes
        if p == 0:
            # A batch larger than a chunk: read it whole.
            header = read_header(chunk)
            whole = os.pread(fd, header.size_bytes, position)
            pace(len(whole))
            yield header, memoryview(whole)
            p = header.size_bytes
        position += p


def _file_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except FileNotFoundError:
        return 0


def _read_bytes(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def _read_int(path: str) -> int | None:
    data = _read_bytes(path)
    try:
        return int(data.decode().strip()) if data is not None else None
    except (ValueError, UnicodeDecodeError):
        return None
