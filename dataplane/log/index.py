"""Sparse indexes of one segment, kept in memory and saved next to it.

`.index`: (offset relative to the segment base, file position) of a batch's base
offset, one entry every `index_interval_bytes` of log. `.timeindex`: (largest
timestamp so far, relative offset of the batch that had it), added with the
offset entries whenever the largest timestamp grew. Both are big-endian,
fixed-size entries; a lookup binary-searches them and the segment then scans
batch headers from the position found.
"""
from __future__ import annotations

import bisect
import struct
from array import array

_OFFSET_ENTRY = struct.Struct(">II")
_TIME_ENTRY = struct.Struct(">qI")


class OffsetIndex:
    entry_size = _OFFSET_ENTRY.size

    def __init__(self) -> None:
        self.relative_offsets = array("I")
        self.positions = array("I")

    def __len__(self) -> int:
        return len(self.positions)

    def append(self, relative_offset: int, position: int) -> None:
        assert not self.positions or position > self.positions[-1], (position, self.positions[-1])
        assert not self.relative_offsets or relative_offset > self.relative_offsets[-1]
        self.relative_offsets.append(relative_offset)
        self.positions.append(position)

    def lookup(self, relative_offset: int) -> tuple[int, int]:
        """(relative offset, position) of the last entry at or below relative_offset, or (0, 0)."""
        i = bisect.bisect_right(self.relative_offsets, relative_offset) - 1
        if i < 0:
            return 0, 0
        return self.relative_offsets[i], self.positions[i]

    def count_below(self, position: int) -> int:
        """How many entries are at file positions below `position` (they come first)."""
        return bisect.bisect_left(self.positions, position)

    def truncate_to_position(self, position: int) -> None:
        """Drop entries at or after a file position (the log was cut there)."""
        keep = bisect.bisect_left(self.positions, position)
        del self.relative_offsets[keep:], self.positions[keep:]

    def encode(self, start: int = 0, stop: int | None = None) -> bytes:
        """Entries [start, stop) as their file holds them."""
        rels, positions = self.relative_offsets[start:stop], self.positions[start:stop]
        out = bytearray(len(positions) * self.entry_size)
        for i, (rel, pos) in enumerate(zip(rels, positions)):
            _OFFSET_ENTRY.pack_into(out, i * self.entry_size, rel, pos)
        return bytes(out)

    @classmethod
    def decode(cls, data: bytes, *, log_size: int) -> OffsetIndex | None:
        """The index in `data`, or None when it is not sane for a log of log_size bytes."""
        if len(data) % cls.entry_size:
            return None
        index = cls()
        for rel, pos in _OFFSET_ENTRY.iter_unpack(data):
            if pos >= log_size or (index.positions and (pos <= index.positions[-1]
                                                        or rel <= index.relative_offsets[-1])):
                return None
            index.relative_offsets.append(rel)
            index.positions.append(pos)
        return index


class TimeIndex:
    entry_size = _TIME_ENTRY.size

    def __init__(self) -> None:
        self.timestamps = array("q")
        self.relative_offsets = array("I")

    def __len__(self) -> int:
        return len(self.timestamps)

    @property
    def max_timestamp(self) -> int | None:
        return self.timestamps[-1] if self.timestamps else None

    def maybe_append(self, timestamp: int, relative_offset: int) -> None:
        if self.timestamps and timestamp <= self.timestamps[-1]:
            return
        if self.relative_offsets and relative_offset < self.relative_offsets[-1]:
            return
        if self.relative_offsets and relative_offset == self.relative_offsets[-1]:
            self.timestamps[-1] = timestamp
            return
        self.timestamps.append(timestamp)
        self.relative_offsets.append(relative_offset)

    def lookup_before(self, timestamp: int) -> int | None:
        """Relative offset of the last entry whose timestamp is below `timestamp`, or None.

        Every batch before that offset has a smaller timestamp too, so a search for
        the first batch at or after `timestamp` can start scanning there.
        """
        i = bisect.bisect_left(self.timestamps, timestamp) - 1
        return self.relative_offsets[i] if i >= 0 else None

    def count_below(self, relative_offset: int) -> int:
        """How many entries are for batches below `relative_offset` (they come first)."""
        return bisect.bisect_left(self.relative_offsets, relative_offset)

    def truncate_to_relative_offset(self, relative_offset: int) -> None:
        keep = bisect.bisect_left(self.relative_offsets, relative_offset)
        del self.timestamps[keep:], self.relative_offsets[keep:]

    def encode(self, start: int = 0, stop: int | None = None) -> bytes:
        """Entries [start, stop) as their file holds them."""
        stamps, rels = self.timestamps[start:stop], self.relative_offsets[start:stop]
        out = bytearray(len(stamps) * self.entry_size)
        for i, (ts, rel) in enumerate(zip(stamps, rels)):
            _TIME_ENTRY.pack_into(out, i * self.entry_size, ts, rel)
        return bytes(out)

    @classmethod
    def decode(cls, data: bytes, *, next_relative_offset: int) -> TimeIndex | None:
        if len(data) % cls.entry_size:
            return None
        index = cls()
        for ts, rel in _TIME_ENTRY.iter_unpack(data):
            if rel >= next_relative_offset or (index.timestamps and (ts <= index.timestamps[-1]
                                                                     or rel <= index.relative_offsets[-1])):
                return None
            index.timestamps.append(ts)
            index.relative_offsets.append(rel)
        return index
