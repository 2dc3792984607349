"""Keep freed memory for reuse instead of handing it back to the kernel (glibc only), and keep
the start-up heap out of the garbage collector's scans (freeze_startup_objects).

A broker allocates and frees buffers of up to megabytes many times a second
(frames, batches). By default glibc serves large blocks with mmap and returns
them, and trims the top of its heap, as soon as they are freed, so the next
buffer is fresh memory: the kernel faults in and zeroes every 4 KiB page of it
again. Raising the two thresholds lets freed buffers be recycled from the heap.
The memory kept is bounded by `trim_bytes` beyond what is in use.
"""
from __future__ import annotations

import ctypes
import gc
import platform

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def keep_freed_memory(*, mmap_threshold_bytes: int = 32 * 1024 * 1024,
                      trim_bytes: int = 128 * 1024 * 1024) -> bool:
    """Apply the thresholds; False (and no change) where the C library is not glibc."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, mmap_threshold_bytes)
                    and libc.mallopt(_M_TRIM_THRESHOLD, trim_bytes))
    except (OSError, AttributeError):
        return False


def freeze_startup_objects() -> int:
    """Move every object alive now (modules, configuration, the open logs' state) out of the
    garbage collector's reach; returns how many. A server calls it once started: its full
    collections then scan only what serving allocates, not the start-up heap each time, so
    the pauses they put into a request's latency shrink. Start-up objects that later become
    garbage are still freed by reference counting; only cycles among them are kept."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


class LongLivedFreezer:
    """Keep long-lived state that arrives after start-up out of the collector's full passes.

    A broker opening thousands of replicas grows its heap by hundreds of objects each, nearly
    all of them kept. CPython runs a full collection each time the objects kept since the last
    one reach a quarter of those it kept then: at 10,000 replicas a broker ran 33 full passes
    while they opened, the last ones 0.5-0.9 s each with the GIL held (13 s of its 41 s of CPU,
    and the event loop stalled as long). Every `every` replicas opened (`grown`), the unfrozen
    objects are collected and what is alive is frozen (`gc.freeze`: moved where no
    collection looks), so each full pass scans only what came since. Frozen objects that
    become garbage are still freed by reference counts, but not cycles: so every `every`
    replicas closed (`shrunk`) everything is unfrozen, collected once in full, and frozen
    again."""

    def __init__(self, *, every: int = 500) -> None:
        self.every = every
        self._grown = 0
        self._shrunk = 0
        self.freezes = 0
        self.full_passes = 0

    def grown(self) -> None:
        self._grown += 1
        if self._grown >= self.every:
            self._grown = 0
            gc.collect()   # garbage cycles are not frozen with the rest (a full pass: it scans
            gc.freeze()    # only what is not frozen, what came since the last freeze)
            self.freezes += 1

    def shrunk(self) -> None:
        self._shrunk += 1
        if self._shrunk >= self.every:
            self._shrunk = self._grown = 0
            gc.unfreeze()
            gc.collect()
            gc.freeze()
            self.full_passes += 1
