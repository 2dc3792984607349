"""The broker's idempotent-producer table: loaded from a snapshot plus the log past it,
and rebuilt after a truncation in a worker thread, never by a scan on the event loop.

The rules (check, record, expire) are ProducerStateTable's, unchanged. What differs is
where the table comes from:
- `load(log)` (at open, in the thread that opens the partition): the newest producer
  snapshot at or below the log end (dataplane/log/producer_snapshots.py), then only
  the batches past it; with no usable snapshot, the whole log.
- `rebuild(log)`: the core calls it on the event loop after its log was truncated.
  It marks the table `loading` and runs the same load in a worker thread (the log is
  thread-safe: dataplane/log/log.py). Batches the log gains meanwhile are read by a
  follow-up pass when the thread is done; the table is swapped in on the loop once it
  covers the whole log, and `on_loaded` is called. While loading, the table refuses
  idempotent batches with LEADER_NOT_AVAILABLE (retriable, written nothing); the core
  holds produce requests while the table loads (dataplane/replica/admission.py,
  `_may_take_more`) and takes them once `on_loaded` steps it, so that answer is a
  safety net. A newer truncation supersedes a running rebuild.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import threading
import time
from typing import Callable, Protocol, cast

from common.batch import BatchHeader, iter_batches
from common.errors import ErrorCode, OffsetOutOfRangeError, StorageError
from dataplane.log.interface import ReadResult
from dataplane.log.producer_snapshots import ProducerSnapshots
from dataplane.replica.producer_state import BatchEntry, ProducerStateTable, SequenceCheck
from dataplane.replica.logview import LogView

_logger = logging.getLogger("biplane.broker.producer_state")

SCAN_CHUNK_BYTES = 1024 * 1024  # one read of the log per chunk (the log's lock is held per read)
FOLLOW_UP_PASSES_MAX = 100       # follow-up passes for batches appended during a rebuild
RETRY_DELAY_S = 1.0              # a rebuild that failed (I/O error) is tried again after this
# Rebuilds of all partitions share this many threads. A rebuild is Python work that holds
# the GIL between switches: with one thread the loop alternates with it; with several
# (many partitions cut at once after a leader change) the loop waits behind all of them.
REBUILD_THREADS = 1
_rebuild_executor: concurrent.futures.ThreadPoolExecutor | None = None
_rebuild_executor_lock = threading.Lock()


def rebuild_executor() -> concurrent.futures.ThreadPoolExecutor:
    global _rebuild_executor
    with _rebuild_executor_lock:
        if _rebuild_executor is None:
            _rebuild_executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=REBUILD_THREADS, thread_name_prefix="producer-state")
        return _rebuild_executor


class SnapshotLog(Protocol):
    """What loading needs of a log (PartitionLog satisfies it)."""

    @property
    def log_start_offset(self) -> int: ...
    @property
    def log_end_offset(self) -> int: ...
    @property
    def producer_snapshots(self) -> ProducerSnapshots: ...
    def read(self, start_offset: int, *, max_bytes: int, max_offset: int | None = None) -> ReadResult: ...


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class LoadInfo:
    """How a table was built: from the snapshot at `snapshot_offset` (-1: none) plus
    the log's batches in [scan_start_offset, up_to_offset)."""

    snapshot_offset: int
    scan_start_offset: int
    up_to_offset: int
    scanned_bytes: int
    elapsed_s: float
    thread_name: str


def scan_into(table: ProducerStateTable, log: SnapshotLog, start_offset: int, up_to: int,
              *, chunk_bytes: int = SCAN_CHUNK_BYTES) -> int:
    """Record every batch in [start_offset, up_to) into `table` (headers only); the bytes read.
    Below the log start (retention deleted it) there is nothing to read: it starts there."""
    offset = max(start_offset, log.log_start_offset)
    scanned = 0
    while offset < up_to:
        try:
            records = log.read(offset, max_bytes=chunk_bytes, max_offset=up_to).records
        except OffsetOutOfRangeError as exc:
            if exc.log_start_offset > offset:  # retention moved the start meanwhile
                offset = exc.log_start_offset
                continue
            raise
        scanned += len(records)
        nxt = offset
        for _, h in iter_batches(records, validate=False):
            if h.base_offset >= up_to:
                break
            table.record(h, base_offset=h.base_offset)
            nxt = h.next_offset
        if nxt <= offset:
            break  # nothing readable there (a gap the log reports as empty)
        offset = nxt
    return scanned


def load_table(table: ProducerStateTable, log: SnapshotLog, up_to: int) -> LoadInfo:
    """Make `table` what a scan of the log below `up_to` gives: the newest usable snapshot
    at or below `up_to`, then the batches past it. A corrupt snapshot is set aside (and
    logged) by ProducerSnapshots.load, which then offers an older one or none."""
    started = time.perf_counter()
    snapshot = log.producer_snapshots.load(up_to)
    snapshot_offset = -1
    table.clear()
    if snapshot is not None:
        try:
            table.load_entries(snapshot[1])
            snapshot_offset = snapshot[0]
        except ValueError as exc:
            _logger.warning("producer snapshot at %d of %s is unusable (%s); rebuilding from the log",
                        snapshot[0], getattr(log, "directory", "?"), exc,
                        extra={"event": "broker.producer_snapshot_unusable"})
            table.clear()
    start = snapshot_offset if snapshot_offset >= 0 else log.log_start_offset
    scanned = scan_into(table, log, start, up_to)
    return LoadInfo(snapshot_offset=snapshot_offset, scan_start_offset=start, up_to_offset=up_to,
                    scanned_bytes=scanned, elapsed_s=time.perf_counter() - started,
                    thread_name=threading.current_thread().name)


# A table captured on the loop: immutable values only (BatchEntry is frozen), so a worker
# thread can serialize it while the loop goes on changing the table.
CapturedTable = list[tuple[int, int, int, tuple[BatchEntry, ...]]]


def plain_entries(captured: CapturedTable) -> list[tuple[int, int, int, tuple[tuple[int, int, int, int], ...]]]:
    """The captured table as snapshot_entries() gives it (plain values, for the snapshot file)."""
    return [(pid, epoch, ts, tuple((b.base_sequence, b.last_sequence, b.base_offset, b.last_offset) for b in batches))
            for pid, epoch, ts, batches in captured]


class BrokerProducerState(ProducerStateTable):
    """ProducerStateTable whose rebuild after a truncation runs in a worker thread."""

    def __init__(self, *, name: str = "", producers_max: int = 10_000,
                 producer_idle_ms_max: int = 7 * 24 * 3600 * 1000) -> None:
        super().__init__(producers_max=producers_max, producer_idle_ms_max=producer_idle_ms_max)
        self.name = name
        self.loading = False
        # Set by the driver when it truncates the log, cleared when the core asks for the
        # rebuild (its next step): in between the table still holds cut batches.
        self.truncated = False
        self.on_loaded: Callable[[], None] | None = None
        self.last_load: LoadInfo | None = None
        self.rebuilds = 0
        self._generation = 0
        self._closed = False

    def _fresh(self) -> ProducerStateTable:
        return ProducerStateTable(producers_max=self.producers_max, producer_idle_ms_max=self.producer_idle_ms_max,
                                  batches_per_producer=self.batches_per_producer)

    @property
    def current(self) -> bool:
        """The table describes the log as it is (no truncation pending or being rebuilt):
        only then may it be snapshotted."""
        return not self.loading and not self.truncated

    def capture(self) -> CapturedTable:
        """The table now, cheaply (no per-batch conversion: that is plain_entries' job, off
        the loop); 10,000 producers take ~15 ms here against ~80 ms for snapshot_entries."""
        return [(pid, e.epoch, e.last_timestamp_ms, tuple(e.batches)) for pid, e in self.producers.items()]

    # ------------------------------------------------------------ loading

    def load(self, log: SnapshotLog) -> LoadInfo:
        """Load synchronously up to the log end (at open, off the loop)."""
        info = load_table(self, log, log.log_end_offset)
        self.last_load = info
        return info

    def rebuild(self, view: LogView, *, chunk_bytes: int = 0) -> None:
        """After a truncation (called by the core, on the loop): rebuild in a worker thread.
        Without a running loop (a tool, a test without asyncio) it loads inline."""
        # The core sees its log as a LogView; the broker hands it a PartitionLog, which has
        # the snapshots too.
        log = cast(SnapshotLog, view)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.load(log)
            self.truncated = False
            return
        self._generation += 1
        self.rebuilds += 1
        self.loading = True
        self.truncated = False
        self.clear()
        self._start(loop, log, self._generation, table=None, start_offset=-1, passes=0, first=None)

    def _start(self, loop: asyncio.AbstractEventLoop, log: SnapshotLog, generation: int, *,
               table: ProducerStateTable | None, start_offset: int, passes: int, first: LoadInfo | None) -> None:
        up_to = log.log_end_offset

        def work() -> tuple[ProducerStateTable, LoadInfo]:
            if table is None:
                fresh = self._fresh()
                return fresh, load_table(fresh, log, up_to)
            started = time.perf_counter()
            scanned = scan_into(table, log, start_offset, up_to)
            return table, LoadInfo(snapshot_offset=-1, scan_start_offset=start_offset, up_to_offset=up_to,
                                   scanned_bytes=scanned, elapsed_s=time.perf_counter() - started,
                                   thread_name=threading.current_thread().name)

        future = loop.run_in_executor(rebuild_executor(), work)
        future.add_done_callback(lambda f: self._finished(f, loop, log, generation, up_to, passes, first))

    def _finished(self, future: asyncio.Future[tuple[ProducerStateTable, LoadInfo]], loop: asyncio.AbstractEventLoop, log: SnapshotLog,
                  generation: int, up_to: int, passes: int, first: LoadInfo | None) -> None:
        if generation != self._generation or self._closed:
            return  # a newer truncation (or close) superseded this rebuild
        exc = future.exception() if not future.cancelled() else asyncio.CancelledError()
        if exc is not None:
            log_fn = _logger.warning if isinstance(exc, (StorageError, OffsetOutOfRangeError)) else _logger.error
            log_fn("%s: rebuilding producer state failed (%r); trying again in %.1f s", self.name, exc,
                   RETRY_DELAY_S, extra={"event": "broker.producer_state_rebuild_failed"})
            loop.call_later(RETRY_DELAY_S, self._retry, log, generation)
            return
        table, info = future.result()
        first = first or info
        end = log.log_end_offset
        if end < up_to:
            return  # cut below what was read: the truncation's own rebuild() supersedes this one
        if end > up_to and passes < FOLLOW_UP_PASSES_MAX:
            # The log grew while the thread read it: read what came since, off the loop too.
            self._start(loop, log, generation, table=table, start_offset=up_to, passes=passes + 1, first=first)
            return
        if end > up_to:
            scan_into(table, log, up_to, end)  # bounded: passes ran out; what is left is small
        self.producers = table.producers
        self.seen_at(time.time_ns() // 1_000_000)   # the cores' wall clock (partition.wall_ms)
        self.loading = False
        self.last_load = dataclasses.replace(first, up_to_offset=end)
        _logger.info("%s: producer state rebuilt after a truncation: %d producers, snapshot at %d, %d bytes "
                 "of log read in a worker thread", self.name, len(self.producers), first.snapshot_offset,
                 first.scanned_bytes, extra={"event": "broker.producer_state_rebuilt",
                                             "snapshot_offset": first.snapshot_offset,
                                             "scanned_bytes": first.scanned_bytes})
        if self.on_loaded is not None:
            self.on_loaded()

    def _retry(self, log: SnapshotLog, generation: int) -> None:
        if generation == self._generation and not self._closed and self.loading:
            self._start(asyncio.get_running_loop(), log, generation, table=None, start_offset=-1, passes=0,
                        first=None)

    def close(self) -> None:
        """Drop any rebuild under way (its result is discarded when its thread returns)."""
        self._closed = True
        self._generation += 1

    # ------------------------------------------------------------ rules while loading

    def check(self, header: BatchHeader) -> SequenceCheck:
        if self.loading and header.producer_id >= 0 and not header.is_control:
            return SequenceCheck(error=ErrorCode.LEADER_NOT_AVAILABLE,
                                 reason=f"{self.name}: producer state is being rebuilt after a truncation; retry")
        return super().check(header)

    def record(self, header: BatchHeader, *, base_offset: int, seen_ms: int | None = None) -> None:
        if self.loading:
            return  # in the log already (the driver appends it in this step): the rebuild reads it
        super().record(header, base_offset=base_offset, seen_ms=seen_ms)

    def next_expiry_ms(self) -> int | None:
        # While loading nothing expires; the load's end ticks the core (PartitionDriver._on_room).
        return None if self.loading else super().next_expiry_ms()

    def expire(self, now_ms: int) -> int:
        if self.loading:
            return 0
        return super().expire(now_ms)
