"""Durable writes for every module that keeps a file: fsync by path, and the one
atomic file replace.

A rename or a removal is durable only once its directory is fsynced; a file written
through another handle (SQLite, pysyncobj) is durable only once that path is fsynced.
A file replaced with `write_atomically` is, after a crash, the old file or the new
one, whole: the data goes to a temporary file, is fsynced, renamed over the path,
and the directory is fsynced.
"""
from __future__ import annotations

import errno
import os


def fsync_path(path: str | os.PathLike[str]) -> None:
    """fsync a file (or, opened read-only, a directory) by path."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync a directory, so renames, creations and removals in it survive a crash."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes | bytearray | memoryview, position: int) -> None:
    """pwrite until every byte is written (a short write is retried, not ignored)."""
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, position)
        if written <= 0:
            raise OSError(errno.EIO, "pwrite wrote nothing")
        view = view[written:]
        position += written


def temp_path(path: str | os.PathLike[str]) -> str:
    """Where `write_atomically` stages a new version of `path`."""
    return os.fspath(path) + ".tmp"


def write_synced(path: str | os.PathLike[str], data: bytes, *, mode: int = 0o644, sync: bool = True) -> None:
    """Create or truncate `path` with permissions `mode`, write `data` and fsync it (unless
    not `sync`)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    try:
        # A file left from an earlier try keeps its old permissions: drop what `mode` denies.
        current = os.fstat(fd).st_mode & 0o777
        if current & ~mode:
            os.fchmod(fd, current & mode)
        write_all(fd, data, 0)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def replace_durably(temp: str | os.PathLike[str], path: str | os.PathLike[str]) -> None:
    """Rename a written and fsynced `temp` over `path`, then fsync the directory."""
    os.replace(temp, path)
    fsync_dir(os.path.dirname(os.fspath(path)) or ".")


def write_atomically(path: str | os.PathLike[str], data: bytes, *, mode: int = 0o644, sync: bool = True) -> None:
    """Replace `path` with `data` so that a crash leaves the old or the new file, whole.

    `mode` applies from the first byte (a file holding a secret is never readable by
    others, not even briefly). On an OSError the temporary file is removed and the
    error raised; `path` is untouched. Not `sync`: nothing is fsynced, and after a crash the
    file may be the old one, the new one, or unreadable: only for a file its owner makes
    durable later and can rebuild (the log's epoch checkpoint).
    """
    tmp = temp_path(path)
    try:
        write_synced(tmp, data, mode=mode, sync=sync)
        if sync:
            replace_durably(tmp, path)
        else:
            os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
