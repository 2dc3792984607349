"""The log's view of durable files: common/durable.py's writes, with I/O errors
raised as StorageError (what the log's contract promises its callers)."""
from __future__ import annotations

import errno
import os

from common import durable
from common.errors import StorageError


def write_atomically(path: str, data: bytes) -> None:
    """`common.durable.write_atomically`, with an I/O error raised as the log's StorageError."""
    try:
        durable.write_atomically(path, data)
    except OSError as exc:
        raise storage_error(f"cannot write {path}", exc) from exc


def replace_unsynced(path: str, data: bytes) -> None:
    """Replace `path` with `data` (a temp file renamed over it), with no fsync: after a crash
    the file may be the old one, the new one, or unreadable. Only for files the log can rebuild
    and makes durable itself before anything depends on them (the epoch checkpoint)."""
    tmp = durable.temp_path(path)
    try:
        durable.write_synced(tmp, data, sync=False)
        os.replace(tmp, path)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise storage_error(f"cannot write {path}", exc) from exc


def storage_error(what: str, exc: OSError) -> StorageError:
    if exc.errno == errno.ENOSPC or exc.errno == errno.EDQUOT:
        return StorageError(f"disk full: {what}: {exc.strerror or exc}; free space, then retry")
    return StorageError(f"{what}: {exc}")
