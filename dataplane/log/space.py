"""Free space of the filesystem under a data directory: refuse writes before they fail.

A broker's logs, producer snapshots and metadata image share one filesystem. When it
fills, a write that fails half-way leaves the partition's core ahead of its log, so the
partition has to go offline and be reopened (dataplane/broker/offline.py). `DiskSpace`
keeps that rare: it knows when the filesystem is full (a write failed with ENOSPC, or
statvfs shows less free than `reserve_bytes`), and while it is, `check_room` refuses new
produce with StorageError (KAFKA_STORAGE_ERROR, retriable) and `has_room` tells followers
to leave replicated data unapplied, as Redpanda refuses writes under low disk and keeps
serving reads. It looks at statvfs again at most every `probe_interval_s` and clears
itself once space is back.

One instance per filesystem (`for_directory`), shared by every partition on it, so the
condition is logged once: a WARNING (event `disk.full`) when it starts, naming what
failed and what to do, and another (event `disk.space_back`) when it ends (WARNING too: brokers log at WARNING by default).
Threads: every method may be called from any thread.
"""
from __future__ import annotations

import errno
import logging
import os
import threading
import time
from typing import Callable

from common.errors import StorageError

log = logging.getLogger("biplane.log.space")

RESERVE_BYTES_MAX = 1 << 20     # refuse produce with less than this free ...
RESERVE_FRACTION = 0.02         # ... or this fraction of the filesystem, whichever is smaller
PROBE_INTERVAL_S = 0.01         # statvfs at most this often (a syscall of a few µs)

_DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def is_disk_full(exc: BaseException | None) -> bool:
    """True for ENOSPC/EDQUOT, also when wrapped (a StorageError raised from the OSError)."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, OSError) and exc.errno in _DISK_FULL_ERRNOS:
            return True
        if isinstance(exc, StorageError) and str(exc).startswith("disk full"):
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


def offline_hint(reason: str) -> str:
    """What an operator reads after "partition X is offline: <reason>"."""
    if "disk full" in reason or "No space left" in reason:
        return ("its produce requests get KAFKA_STORAGE_ERROR; free space on its disk and the broker "
                "reopens it from disk by itself (no restart needed)")
    return ("its produce requests get KAFKA_STORAGE_ERROR; the broker tries to reopen it from disk "
            "periodically; if that keeps failing, check the disk and restart the broker")


class DiskSpace:
    def __init__(self, directory: str, *, reserve_bytes: int | None = None,
                 probe_interval_s: float = PROBE_INTERVAL_S,
                 statvfs: Callable[[str], os.statvfs_result] = os.statvfs,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.directory = directory
        self._statvfs = statvfs
        self._clock = clock
        self.probe_interval_s = probe_interval_s
        self._reserve_bytes = reserve_bytes
        self._lock = threading.Lock()
        self._full_reason: str | None = None
        self._free_bytes: int | None = None
        self._probed_at: float | None = None
        self._reserve = RESERVE_BYTES_MAX  # as of the last probe
        self.full_count = 0  # times the condition started (for tests and metrics)

    # ------------------------------------------------------------ state

    @property
    def full(self) -> bool:
        return self._full_reason is not None

    def _reserve_of(self, st: os.statvfs_result | None) -> int:
        if self._reserve_bytes is not None:
            return self._reserve_bytes
        if st is None:
            return RESERVE_BYTES_MAX
        return min(RESERVE_BYTES_MAX, int(st.f_blocks * st.f_frsize * RESERVE_FRACTION))

    def _probe(self, *, force: bool = False) -> int | None:
        """Free bytes (cached for probe_interval_s); None if statvfs fails. The reserve is
        worked out from the same statvfs: one syscall per look (each produce step looks)."""
        now = self._clock()
        if not force and self._probed_at is not None and now - self._probed_at < self.probe_interval_s:
            return self._free_bytes
        self._probed_at = now
        try:
            st: os.statvfs_result | None = self._statvfs(self.directory)
        except OSError:
            st = None
        self._free_bytes = None if st is None else st.f_bavail * st.f_frsize
        self._reserve = self._reserve_of(st)
        return self._free_bytes

    def _update(self) -> None:
        free = self._probe()
        if free is None:
            return
        reserve = self._reserve
        if self._full_reason is None and free < reserve:
            self._start(f"{free} bytes free, below the {reserve}-byte reserve")
        elif self._full_reason is not None and free >= reserve:
            reason, self._full_reason = self._full_reason, None
            log.warning("disk space is back on %s (%d bytes free; it was full: %s); writes resume",
                     self.directory, free, reason,
                     extra={"event": "disk.space_back", "path": self.directory, "free_bytes": free})

    def _start(self, reason: str) -> None:
        self._full_reason = reason
        self.full_count += 1
        log.warning("disk full on the filesystem mounted at %s: %s. Produce to partitions stored there is refused with "
                    "KAFKA_STORAGE_ERROR and followers stop applying data; reads go on. Free space "
                    "(delete files, lower retention, grow the volume): writes resume by themselves.",
                    self.directory, reason,
                    extra={"event": "disk.full", "path": self.directory, "reason": reason})

    def note_full(self, what: str) -> None:
        """A write failed with ENOSPC: the filesystem is full, whatever statvfs said last."""
        with self._lock:
            self._probe(force=True)
            if self._full_reason is None:
                self._start(f"{what} failed with ENOSPC")

    def has_room(self, nbytes: int = 0) -> bool:
        """False while the filesystem is full or would be after writing `nbytes`."""
        with self._lock:
            self._update()
            if self._full_reason is not None:
                return False
            free = self._free_bytes
            return free is None or free - nbytes >= 0

    def check_room(self, nbytes: int, what: str) -> None:
        """Raise StorageError (KAFKA_STORAGE_ERROR) unless `nbytes` fit; names `what` was refused."""
        if not self.has_room(nbytes):
            raise StorageError(f"disk full: {what} refused: {self.directory} is full ({self._full_reason}); "
                               f"free space there, then retry")


_by_device: dict[int, DiskSpace] = {}
_by_device_lock = threading.Lock()


def for_directory(directory: str) -> DiskSpace:
    """The DiskSpace of the filesystem holding `directory` (one per filesystem and process)."""
    device = os.stat(directory).st_dev
    with _by_device_lock:
        space = _by_device.get(device)
        if space is None:
            space = _by_device[device] = DiskSpace(_mount_point(directory))
        return space


def _mount_point(directory: str) -> str:
    """The mount point holding `directory` (what an operator frees space on)."""
    path = os.path.abspath(directory)
    while not os.path.ismount(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def note_full_at(directory: str, what: str) -> None:
    """note_full on the filesystem of `directory`, if it can still be stat'ed."""
    try:
        space = for_directory(directory)
    except OSError:
        return
    space.note_full(what)
