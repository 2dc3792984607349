"""The partition log's contract, shared by the on-disk log and its in-memory twin.

Offsets: `log_start_offset` is the first offset still stored, `log_end_offset` the
next offset an append will get (written, "dirty"), `flushed_offset` the end of the
durable prefix: every offset below it survives a crash of the process or the
machine. All three are exclusive-end offsets, so log_start <= flushed <= end.

Durability when a call returns:
- `append_as_leader` / `append_as_follower`: the batches are written to the
  operating system and readable by `read`; they survive a crash of this process
  but NOT a crash of the machine until a `flush()` covering them returns.
- `flush()`: everything below the returned offset is on stable storage.
- `truncate_to`, `truncate_fully_and_start_at`, `apply_retention`, `clean`, and the
  changes of the leader-epoch cache they make: durable when the call returns (they are rare
  and a truncation undone by a crash could resurrect records of an old epoch).
- A new epoch an append brings: in the epoch cache at once, durable with the `flush()`
  that covers its first batch, like the batch itself (after a crash before it, recovery
  reads those batches again and finds the epoch there).

Validation: appends check every batch header; they check CRCs too unless the
caller says `crc_checked=True` because it has just checked them itself (the
replica core does, for every batch it hands over): each byte's CRC is computed
once per hop.

Buffers: `append_as_leader` patches offsets and the leader epoch into the batch
headers; a `bytearray` or writable `memoryview` argument is patched in place (the
caller may reuse the patched buffer, e.g. to send it to followers), anything else
is copied once.
The log may keep a reference to what an append stored (the tail cache serves
reads of the newest batches from it), so the caller must not change a
`bytearray` or writable `memoryview` argument after the call. `ReadResult.records`
is immutable: `bytes` or a read-only `memoryview` (of a cached append or of a
read's own buffer), valid as long as the caller keeps it.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, TypeGuard, runtime_checkable

# The log's errors are common/errors.py's; listed in __all__ so `dataplane.log` offers them.
from common.errors import (InvalidRequestError, OffsetMismatchError, OffsetOutOfRangeError,
                           StaleEpochError, StorageError)

if TYPE_CHECKING:
    from .cleaner import CleanResult, CompactionConfig

# Kafka's answer when no epoch is known (empty cache).
UNDEFINED_EPOCH = -1
UNDEFINED_OFFSET = -1


__all__ = [
    "AppendInfo", "DeletedSegment", "EpochEntry", "Log", "LogConfig", "OffsetMismatchError",
    "OffsetOutOfRangeError", "ReadResult", "StaleEpochError", "StorageError",
    "UNDEFINED_EPOCH", "UNDEFINED_OFFSET",
]


def patchable(buf: object) -> TypeGuard[bytearray | memoryview]:
    """Whether append_as_leader may patch `buf` in place (see Buffers above): a bytearray
    or a writable memoryview; anything else is copied once."""
    return isinstance(buf, bytearray) or (isinstance(buf, memoryview) and not buf.readonly)


@dataclasses.dataclass(frozen=True, kw_only=True)
class LogConfig:
    """Per-partition limits. Sizes in bytes, times in milliseconds; None means unlimited."""

    segment_bytes: int = 128 * 1024 * 1024
    segment_ms: int | None = 7 * 24 * 3600 * 1000
    index_interval_bytes: int = 4096
    retention_bytes: int | None = None
    retention_ms: int | None = 7 * 24 * 3600 * 1000
    # Flushed bytes further than this behind the end of the log are dropped from the
    # operating system's page cache (drop-behind); None keeps them. Reads of older data
    # then come from disk. A page cache that keeps growing makes every write land on
    # never-used memory, which costs a page fault per page where the host backs a
    # machine's memory lazily (a VM); recycled pages do not.
    page_cache_behind_bytes: int | None = 16 * 1024 * 1024
    # The newest appended batches kept in memory (as the buffers they came in) to serve
    # follower fetches and pushes without reading the file back; 0 or None: none. It is
    # per partition: a broker leading many busy partitions holds up to this much for each.
    # A follower further behind than this reads from the file (page cache) as before.
    tail_cache_bytes: int | None = 8 * 1024 * 1024
    # After a crash only the active segment's bytes past its last recovery checkpoint are
    # validated again (the rest was fsynced and its indexes saved). A flush writes a new
    # checkpoint once this many bytes or offsets were flushed since the last one: small
    # batches cost a scan per batch, so offsets count as well as bytes.
    checkpoint_interval_bytes: int = 1024 * 1024
    checkpoint_interval_offsets: int = 2048

    def __post_init__(self) -> None:
        # Positions in the offset index are 32-bit, so a segment must stay below 2 GiB.
        if not 1024 <= self.segment_bytes <= 2**31 - 1:
            raise InvalidRequestError(
                f"segment_bytes={self.segment_bytes} is out of range; use 1024 .. {2**31 - 1}")
        if self.index_interval_bytes < 1:
            raise InvalidRequestError(
                f"index_interval_bytes={self.index_interval_bytes} must be positive")
        for name in ("segment_ms", "retention_bytes", "retention_ms", "page_cache_behind_bytes",
                     "tail_cache_bytes"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise InvalidRequestError(f"{name}={value} must be >= 0 or None (unlimited)")


@dataclasses.dataclass(frozen=True, kw_only=True)
class AppendInfo:
    """What an append stored: offsets base_offset..last_offset inclusive."""

    base_offset: int
    last_offset: int
    batch_count: int
    size_bytes: int
    max_timestamp: int
    log_end_offset: int  # after the append, = last_offset + 1


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReadResult:
    """Whole batches of the log; `records` (bytes or a read-only memoryview) never changes.

    `first_offset` is the base offset of the first batch (it may be below the
    requested offset, which can fall inside a batch); `next_offset` is the offset
    after the last batch returned (= the requested offset when `records` is empty).
    """

    records: bytes | memoryview
    first_offset: int
    next_offset: int
    log_start_offset: int
    log_end_offset: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class EpochEntry:
    epoch: int
    start_offset: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class DeletedSegment:
    base_offset: int
    next_offset: int
    size_bytes: int
    reason: str  # "retention_bytes" or "retention_ms"


@runtime_checkable
class Log(Protocol):
    """One partition replica's log. Not reentrant across processes; usable from threads."""

    @property
    def log_start_offset(self) -> int: ...
    @property
    def log_end_offset(self) -> int: ...
    @property
    def flushed_offset(self) -> int: ...
    @property
    def batch_bytes_max(self) -> int: ...
    @property
    def latest_epoch(self) -> int: ...
    @property
    def flush_cost_bytes(self) -> int | None:
        """What the next flush() would make durable: the bytes of one file written since the
        last flush, or None when it must do more (fsync several segments or a directory,
        write a checkpoint). For a caller deciding whether a flush is short enough to run
        inline."""
    def epoch_entries(self) -> list[EpochEntry]: ...
    def epoch_before(self, offset: int) -> int:
        """Leader epoch of the batch holding offset - 1 (UNDEFINED_EPOCH for an empty prefix)."""

    def append_as_leader(self, batches: bytes | bytearray | memoryview, *, leader_epoch: int,
                         now_ms: int | None = None, crc_checked: bool = False) -> AppendInfo:
        """Validate (CRC, unless the caller checked it already: `crc_checked`), assign
        offsets from log_end_offset and stamp leader_epoch."""
    def append_as_follower(self, batches: bytes | bytearray | memoryview, *,
                           now_ms: int | None = None, crc_checked: bool = False) -> AppendInfo:
        """Validate and store batches with the leader's offsets; the first must start at
        log_end_offset and each next one where the previous ended (OffsetMismatchError)."""
    def read(self, start_offset: int, *, max_bytes: int, max_offset: int | None = None) -> ReadResult:
        """Whole batches from the one containing start_offset, at most max_bytes unless the
        first batch alone is larger, only batches whose last offset is below max_offset."""
    def offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record stamped at or after timestamp_ms, or None."""
    def flush(self) -> int:
        """Make everything written so far durable; returns the new flushed_offset."""
    def truncate_to(self, offset: int) -> int:
        """Remove every batch whose last offset is >= offset; returns the new log_end_offset
        (below offset when offset falls inside a batch)."""
    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Remove everything; the log becomes empty starting at offset (epoch cache cleared)."""
    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """(largest known epoch <= epoch, start offset of the next epoch or log_end_offset)."""
    def roll(self, *, now_ms: int | None = None) -> None:
        """Start a new segment unless the active one is empty."""
    def apply_retention(self, now_ms: int, *, below_offset: int | None = None) -> list[DeletedSegment]:
        """Delete whole old segments past retention_bytes / retention_ms (never the active one,
        and, given `below_offset`, only segments that end at or below it: the HW)."""
    def clean(self, now_ms: int, *, below_offset: int, config: CompactionConfig,
              throttle: Callable[[int], None] | None = None) -> CleanResult | None:
        """Compact closed segments wholly below `below_offset` (the HW) and flushed, keeping
        the latest record of each key (cleaner.py); offsets never change, so gaps appear
        between batches and a read from a removed offset starts at the next batch. None when
        no pass is due (min_cleanable_dirty_ratio, min_compaction_lag_ms)."""
    def close(self) -> None:
        """Flush and release the log; idempotent."""
