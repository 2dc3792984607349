"""An exclusive, non-blocking lock on a log directory, held while the log is open.

`DirectoryLock` is a flock(2), across processes; it holds a file descriptor while held.
`InProcessLock` holds none: for a log inside a directory whose DirectoryLock this process
already holds (a broker locks its whole data directory), it keeps the same log from being
opened twice in this process. A broker with 10,000 replicas would otherwise spend 10,000
descriptors on locks (docs/operations.md, "Open files").
"""
from __future__ import annotations

import fcntl
import os
import threading

from common.errors import StorageError

LOCK_FILE = ".lock"


class DirectoryLock:
    """flock(2) on `<directory>/.lock`; the holder writes its pid there for error messages.

    The kernel drops the lock when the holder dies, so a crashed process never
    leaves a stale lock behind.
    """

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, LOCK_FILE)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(self._fd)
            os.close(self._fd)
            self._fd = -1
            who = f"process {holder}" if holder else "another process"
            raise StorageError(
                f"log directory {directory} is already open by {who} (lock {self.path}); "
                f"stop that process or use another directory") from None
        try:
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, f"{os.getpid()}\n".encode(), 0)
        except OSError:
            # A full disk fails the pid's write: raised from here, this object is never
            # handed out, so nobody could release the lock it holds, and every later open
            # of the directory in this process would fail as "already open".
            self.release()
            raise

    def release(self) -> None:
        if self._fd >= 0:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = -1


_held_in_process: set[str] = set()
_held_lock = threading.Lock()   # logs open in worker threads


class InProcessLock:
    """The directory is open in this process at most once (its parent's DirectoryLock keeps
    other processes out)."""

    def __init__(self, directory: str) -> None:
        self.path = os.path.realpath(directory)
        with _held_lock:
            if self.path in _held_in_process:
                raise StorageError(f"log directory {directory} is already open in this process; "
                                   f"close it before opening it again")
            _held_in_process.add(self.path)
        self._held = True

    def release(self) -> None:
        if self._held:
            with _held_lock:
                _held_in_process.discard(self.path)
            self._held = False


def _read_pid(fd: int) -> int | None:
    try:
        return int(os.pread(fd, 32, 0).decode().strip())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
