"""TailCache: the newest appended batches, kept as the buffers they arrived in.

Followers fetch (and a push leader sends) what was appended a moment ago; serving
that from the append's own buffer saves a pread and a copy per read. The cache
holds whole batches with contiguous offsets ending at the log's end, at most
`size_bytes_max` bytes of them (oldest dropped first), each as a slice of a
read-only view: nobody can change a batch after it is cached. PartitionLog
keeps it consistent (appends add, truncation and retention cut, reopening
starts empty); what it does not hold is read from the segments as before.
Not thread-safe: PartitionLog serialises calls.
"""
from __future__ import annotations

import bisect
import collections
from collections.abc import Sequence
from typing import TYPE_CHECKING

from common.batch import HEADER_SIZE, Buffer

if TYPE_CHECKING:
    from .segment import BatchSpan


class TailCache:
    def __init__(self, *, size_bytes_max: int) -> None:
        self.size_bytes_max = size_bytes_max
        # One entry per batch, in offset order: (base_offset, next_offset, view, position, size).
        self._entries: collections.deque[tuple[int, int, memoryview, int, int]] = collections.deque()
        self._bases: collections.deque[int] = collections.deque()
        self.size_bytes = 0

    @property
    def start_offset(self) -> int | None:
        """Base offset of the oldest cached batch, or None when empty."""
        return self._bases[0] if self._bases else None

    @property
    def end_offset(self) -> int | None:
        return self._entries[-1][1] if self._entries else None

    def add(self, buf: Buffer, spans: Sequence[BatchSpan]) -> None:
        """Cache batches `spans` (BatchSpan, contiguous offsets) that sit in `buf` and were
        just appended at the log's end. `buf` must never change afterwards; the view
        kept is read-only, so a caller's later read cannot change it either."""
        if not self.size_bytes_max or not spans:
            return
        if self._entries and self._entries[-1][1] != spans[0].base_offset:
            self.clear()  # not adjacent to what we hold: start over rather than leave a gap
        view = buf.toreadonly() if isinstance(buf, memoryview) else memoryview(buf).toreadonly()
        for span in spans:
            if span.size_bytes > self.size_bytes_max:
                self.clear()
                continue
            self._entries.append((span.base_offset, span.next_offset, view, span.position, span.size_bytes))
            self._bases.append(span.base_offset)
            self.size_bytes += span.size_bytes
        while self.size_bytes > self.size_bytes_max:
            self._pop_oldest()

    def _pop_oldest(self) -> None:
        self._bases.popleft()
        self.size_bytes -= self._entries.popleft()[4]

    def read(self, start_offset: int, *, max_bytes: int, max_offset: int | None,
             end_offset_max: int | None) -> tuple[memoryview | bytes, int, int] | None:
        """Whole batches from the one containing start_offset, by the same rules as a
        segment read (the first batch always, further ones while the total stays within
        max(max_bytes, HEADER_SIZE); only batches ending below max_offset; none at or past
        end_offset_max, where the segment ends). (records, first offset, next offset), or
        None when start_offset is not cached. Like a segment read, the records are empty
        (and both offsets start_offset) when max_offset excludes the first batch."""
        if not self._bases or start_offset < self._bases[0] or start_offset >= self._entries[-1][1]:
            return None
        i = bisect.bisect_right(self._bases, start_offset) - 1
        limit = max(max_bytes, HEADER_SIZE)
        first_offset = self._entries[i][0]
        parts: list[tuple[memoryview, int, int]] = []
        total = 0
        next_offset = first_offset
        for j in range(i, len(self._entries)):
            base, nxt, view, position, size = self._entries[j]
            if max_offset is not None and nxt - 1 >= max_offset:
                break
            if end_offset_max is not None and nxt > end_offset_max:
                break
            if parts and total + size > limit:
                break
            if parts and parts[-1][0] is view and parts[-1][2] == position:
                parts[-1] = (view, parts[-1][1], position + size)  # contiguous in one buffer
            else:
                parts.append((view, position, position + size))
            total += size
            next_offset = nxt
            if size > limit:
                break
        if not parts:
            return b"", start_offset, start_offset
        if len(parts) == 1:
            view, lo, hi = parts[0]
            return view[lo:hi], first_offset, next_offset
        return b"".join(view[lo:hi] for view, lo, hi in parts), first_offset, next_offset

    def truncate_to(self, end_offset: int) -> None:
        """Forget batches that end past end_offset (the log was cut there)."""
        while self._entries and self._entries[-1][1] > end_offset:
            self._bases.pop()
            self.size_bytes -= self._entries.pop()[4]

    def drop_before(self, start_offset: int) -> None:
        """Forget batches that start below start_offset (retention moved the log start)."""
        while self._bases and self._bases[0] < start_offset:
            self._pop_oldest()

    def clear(self) -> None:
        self._entries.clear()
        self._bases.clear()
        self.size_bytes = 0

