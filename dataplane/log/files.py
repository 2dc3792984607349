"""Small durable-file helpers: atomic replace, directory fsync, full writes."""
from __future__ import annotations

import errno
import os

from common.durable import fsync_dir
from common.errors import StorageError



def write_atomically(path: str, data: bytes) -> None:
    """Replace `path` with `data` so that a crash leaves the old or the new file, whole.

    Write a temporary file, fsync it, rename it over `path`, fsync the directory.
    """
    tmp = path + ".tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            write_all(fd, data, 0)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        fsync_dir(os.path.dirname(path) or ".")
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise storage_error(f"cannot write {path}", exc) from exc


def write_all(fd: int, data: bytes | bytearray | memoryview, position: int) -> None:
    """pwrite until every byte is written (a short write is retried, not ignored)."""
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, position)
        if written <= 0:
            raise OSError(errno.EIO, "pwrite wrote nothing")
        view = view[written:]
        position += written


def storage_error(what: str, exc: OSError) -> StorageError:
    if exc.errno == errno.ENOSPC or exc.errno == errno.EDQUOT:
        return StorageError(f"disk full: {what}: {exc.strerror or exc}; free space, then retry")
    return StorageError(f"{what}: {exc}")
