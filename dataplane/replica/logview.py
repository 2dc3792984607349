"""The read-only part of the partition log the core may look at.

`dataplane.log.interface.Log` and its in-memory twin satisfy it. The core
never writes through it: writes leave as Append/Truncate/Flush actions, and
the driver applies Append and Truncate before the next `step`, so what the
view shows is the log as the core asked for it.
"""
from __future__ import annotations

from typing import Protocol


class ReadResultView(Protocol):
    @property
    def records(self) -> bytes | memoryview: ...  # whole batches; never changes


class LogView(Protocol):
    @property
    def log_start_offset(self) -> int: ...
    @property
    def log_end_offset(self) -> int: ...
    @property
    def flushed_offset(self) -> int: ...
    @property
    def batch_bytes_max(self) -> int:
        """The largest batch an append takes (the segment size): admission refuses larger ones."""
    def epoch_before(self, offset: int) -> int:
        """Leader epoch of the batch holding offset - 1 (-1 for an empty prefix)."""
    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]: ...
    def read(self, start_offset: int, *, max_bytes: int, max_offset: int | None = None) -> ReadResultView: ...
    def offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int] | None: ...
