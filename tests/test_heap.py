"""common/heap.py: glibc's thresholds are raised where glibc runs, and nothing happens elsewhere."""
from __future__ import annotations

import platform

import pytest

from common import heap


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_thresholds_are_accepted_by_glibc():
    assert heap.keep_freed_memory() is True


def test_other_c_libraries_are_left_alone(monkeypatch):
    monkeypatch.setattr(platform, "libc_ver", lambda: ("musl", "1.2"))
    assert heap.keep_freed_memory() is False
