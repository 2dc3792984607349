"""The log's view of durable files: common/durable.py's writes, with I/O errors
raised as StorageError (what the log's contract promises its callers)."""
from __future__ import annotations

import errno

from common import durable
from common.errors import StorageError


def write_atomically(path: str, data: bytes, *, sync: bool = True) -> None:
    """`common.durable.write_atomically`, with an I/O error raised as the log's StorageError."""
    try:
        durable.write_atomically(path, data, sync=sync)
    except OSError as exc:
        raise storage_error(f"cannot write {path}", exc) from exc


def storage_error(what: str, exc: OSError) -> StorageError:
    if exc.errno == errno.ENOSPC or exc.errno == errno.EDQUOT:
        return StorageError(f"disk full: {what}: {exc.strerror or exc}; free space, then retry")
    return StorageError(f"{what}: {exc}")
