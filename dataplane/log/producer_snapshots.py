"""Producer-state snapshots of one partition log (Kafka's `<offset>.snapshot` files).

A snapshot is the idempotent-producer table as it stood at an offset: every batch
below `offset` and none at or past it. Loading the newest snapshot at or below a
point and reading only the log between the two gives the table a scan of the whole
log would give, without the scan.

Files, in the log directory: `<offset:020d>.producer-snapshot`, each
    magic "BPS1" | crc32c of the rest (uint32) | offset (uint64) | JSON payload
all big-endian; the payload is the table's `snapshot_entries()` (plain values, never
pickled). Written atomically (temporary file, fsync, rename, directory fsync).

Rules (the log calls `delete_above`; the driver writes and loads):
- a truncation to T deletes every snapshot above T before it returns, so a snapshot
  never describes batches a truncation removed (the log may grow back past it with
  other batches); opening the log does the same at its end offset, for snapshots
  written before a crash cut the unflushed tail;
- a write races truncations: it is installed only if no truncation happened since
  its table was captured (`generation`), else dropped;
- a corrupt file (bad magic, CRC, offset or JSON) is logged once, renamed to
  `.corrupt` (kept for inspection) and skipped: the caller falls back to an older
  snapshot or to the whole log;
- at most `kept_max` snapshots are kept (the oldest go first).
Threads: every method may be called from any thread.
"""
from __future__ import annotations

import itertools
import json
import logging
import os
import struct
import threading
from typing import Any

from crc32c import crc32c

from common import durable
from common.durable import fsync_dir
from . import files, space

log = logging.getLogger("biplane.log.producer_snapshots")

SUFFIX = ".producer-snapshot"
CORRUPT_SUFFIX = ".corrupt"
MAGIC = b"BPS1"
_HEADER = struct.Struct(">4sIQ")  # magic, crc32c of every byte after the crc, offset
KEPT_MAX = 4

# (producer_id, epoch, last_timestamp_ms, ((base_seq, last_seq, base_offset, last_offset), ...))
SnapshotEntries = list[Any]


class CorruptSnapshotError(ValueError):
    """A snapshot file failed its checks; `reason` says which."""


def snapshot_name(offset: int) -> str:
    return f"{offset:020d}{SUFFIX}"


def encode(offset: int, entries: SnapshotEntries) -> bytes:
    payload = struct.pack(">Q", offset) + json.dumps(entries, separators=(",", ":")).encode()
    return MAGIC + struct.pack(">I", crc32c(payload)) + payload


def decode(data: bytes, *, offset: int) -> SnapshotEntries:
    """The entries of a snapshot file's bytes; CorruptSnapshotError if any check fails."""
    if len(data) < _HEADER.size:
        raise CorruptSnapshotError(f"{len(data)} bytes is shorter than the {_HEADER.size}-byte header")
    magic, crc, stored_offset = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise CorruptSnapshotError(f"magic {magic!r}, expected {MAGIC!r}")
    actual = crc32c(memoryview(data)[8:])
    if actual != crc:
        raise CorruptSnapshotError(f"crc32c {actual:#010x}, header says {crc:#010x}")
    if stored_offset != offset:
        raise CorruptSnapshotError(f"holds offset {stored_offset}, its name says {offset}")
    try:
        entries = json.loads(bytes(memoryview(data)[_HEADER.size:]))
    except ValueError as exc:
        raise CorruptSnapshotError(f"payload is not JSON: {exc}") from exc
    if not isinstance(entries, list):
        raise CorruptSnapshotError(f"payload is a {type(entries).__name__}, expected a list")
    return entries


_write_ids = itertools.count()


class ProducerSnapshots:
    """The snapshot files of one log directory."""

    def __init__(self, directory: str, *, kept_max: int = KEPT_MAX) -> None:
        if kept_max < 1:
            raise ValueError(f"kept_max must be >= 1, got {kept_max}")
        self.directory = directory
        self.kept_max = kept_max
        self._lock = threading.Lock()
        self._generation = 0  # bumped by every delete_above (a truncation)
        self._offsets = sorted(int(n[:-len(SUFFIX)]) for n in os.listdir(directory)
                               if n.endswith(SUFFIX) and n[:-len(SUFFIX)].isdigit())
        self.corrupt_found = 0

    def _path(self, offset: int) -> str:
        return os.path.join(self.directory, snapshot_name(offset))

    @property
    def generation(self) -> int:
        """Capture before taking the table: write() drops the snapshot if a truncation came between."""
        return self._generation

    def offsets(self) -> list[int]:
        with self._lock:
            return list(self._offsets)

    def write(self, offset: int, entries: SnapshotEntries, *, generation: int) -> bool:
        """Store the table as of `offset` durably; False if a truncation since `generation`
        made it stale (nothing is installed then). Raises StorageError on an I/O error
        (nothing is installed then either)."""
        data = encode(offset, entries)
        path = self._path(offset)
        # Two writes of one offset may overlap (a periodic one and a clean close's): each has
        # its own temporary file (".tmp" last, so opening the log removes leftovers).
        tmp = f"{path}.{next(_write_ids)}.tmp"
        try:
            # common/durable.py's atomic write, split: the rename waits for the lock
            # and the generation check, and one directory fsync covers it and the pruning.
            durable.write_synced(tmp, data)
            with self._lock:
                if generation != self._generation:
                    os.unlink(tmp)
                    return False
                os.replace(tmp, path)
                if offset not in self._offsets:
                    self._offsets.append(offset)
                    self._offsets.sort()
                doomed = self._offsets[:-self.kept_max]
                del self._offsets[:-self.kept_max]
                for old in doomed:
                    _unlink(self._path(old))
            fsync_dir(self.directory)
        except OSError as exc:
            _unlink(tmp)
            if space.is_disk_full(exc):
                space.note_full_at(self.directory, f"producer snapshot {path}")
            raise files.storage_error(f"cannot write producer snapshot {path}", exc) from exc
        return True

    def load(self, at_or_below: int) -> tuple[int, SnapshotEntries] | None:
        """(offset, entries) of the newest valid snapshot at or below `at_or_below`, or None.
        A corrupt one is logged, set aside and the next older one tried."""
        while True:
            with self._lock:
                candidates = [o for o in self._offsets if o <= at_or_below]
            if not candidates:
                return None
            offset = candidates[-1]
            try:
                with open(self._path(offset), "rb") as f:
                    data = f.read()
                return offset, decode(data, offset=offset)
            except FileNotFoundError:
                with self._lock:  # deleted meanwhile (a truncation or the kept_max bound)
                    if offset in self._offsets:
                        self._offsets.remove(offset)
            except (CorruptSnapshotError, OSError) as exc:
                self._set_aside(offset, str(exc))

    def _set_aside(self, offset: int, reason: str) -> None:
        path = self._path(offset)
        with self._lock:
            if offset not in self._offsets:
                return
            self._offsets.remove(offset)
            self.corrupt_found += 1
            try:
                os.replace(path, path + CORRUPT_SUFFIX)
            except OSError:
                _unlink(path)
        log.warning("producer snapshot %s is unusable (%s); set aside as %s, producer state is rebuilt "
                    "from an older snapshot or the log", path, reason, path + CORRUPT_SUFFIX,
                    extra={"event": "log.producer_snapshot_corrupt", "path": path, "offset": offset})

    def delete_above(self, offset: int) -> list[int]:
        """Delete every snapshot above `offset` (a truncation to `offset`); returns their offsets.
        Durable on return; a write that captured its table before this call is dropped."""
        with self._lock:
            self._generation += 1
            doomed = [o for o in self._offsets if o > offset]
            if not doomed:
                return []
            self._offsets = [o for o in self._offsets if o <= offset]
            try:
                for o in doomed:
                    _unlink(self._path(o))
                fsync_dir(self.directory)
            except OSError as exc:
                raise files.storage_error(f"cannot delete producer snapshots above {offset} in "
                                          f"{self.directory}", exc) from exc
        return doomed


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


__all__ = ["CorruptSnapshotError", "ProducerSnapshots", "decode", "encode", "snapshot_name"]
