"""Partition log: segments of record batches, sparse indexes, leader-epoch cache.

`PartitionLog` is the on-disk log, `MemoryLog` its in-memory twin, `Log` the
Protocol both satisfy (the contract is in interface.py), `FlushCoalescer` the
asyncio driver that shares fsyncs between waiters.
"""
from common.errors import LogTruncatedError

from .flusher import FlushCoalescer
from .interface import (UNDEFINED_EPOCH, UNDEFINED_OFFSET, AppendInfo, DeletedSegment, EpochEntry, Log,
                        LogConfig, OffsetMismatchError, OffsetOutOfRangeError, ReadResult,
                        StaleEpochError)
from .log import PartitionLog
from .memory import MemoryLog

__all__ = [
    "AppendInfo", "DeletedSegment", "EpochEntry", "FlushCoalescer", "Log", "LogConfig",
    "LogTruncatedError", "MemoryLog", "OffsetMismatchError", "OffsetOutOfRangeError",
    "PartitionLog", "ReadResult", "StaleEpochError", "UNDEFINED_EPOCH", "UNDEFINED_OFFSET",
]
