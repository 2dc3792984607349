"""fsync of files and directories by path, for every module that makes a write durable.

A rename or a removal is durable only once its directory is fsynced; a file written
through another handle (SQLite, pysyncobj) is durable only once that path is fsynced.
"""
from __future__ import annotations

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
