"""common/heap.py: glibc's thresholds are raised where glibc runs, and nothing happens elsewhere;
the broker's long-lived state is kept out of the collector's full passes."""
from __future__ import annotations

import gc
import platform
import weakref

import pytest

from common import heap
from common.heap import LongLivedFreezer


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_thresholds_are_accepted_by_glibc():
    assert heap.keep_freed_memory() is True


def test_other_c_libraries_are_left_alone(monkeypatch):
    monkeypatch.setattr(platform, "libc_ver", lambda: ("musl", "1.2"))
    assert heap.keep_freed_memory() is False


class _Node:
    """An object in a reference cycle: only the cyclic collector frees it."""

    def __init__(self) -> None:
        self.me = self


def test_every_so_many_replicas_opened_what_is_alive_is_frozen_and_after_as_many_removed_cycles_are_freed():
    """Claim: the `every`-th replica opened freezes what is alive (no collection looks at it any
    more: a cycle dropped after it stays until ...), and the `every`-th replica removed unfreezes,
    collects in full (... that cycle is freed) and freezes again."""
    gc.unfreeze()
    try:
        keeper = LongLivedFreezer(every=3)
        node = _Node()
        alive = weakref.ref(node)
        keeper.grown()
        keeper.grown()
        assert gc.get_freeze_count() == 0 and keeper.freezes == 0
        keeper.grown()
        assert keeper.freezes == 1 and gc.get_freeze_count() > 0
        assert not any(o is node for o in gc.get_objects()), "frozen: no generation holds it"
        del node
        gc.collect()
        assert alive() is not None, "a frozen cycle is not collected"
        keeper.shrunk()
        keeper.shrunk()
        assert alive() is not None and keeper.full_passes == 0
        keeper.shrunk()
        assert keeper.full_passes == 1 and alive() is None, "the full pass after removals frees it"
        assert gc.get_freeze_count() > 0, "and freezes what is alive again"
    finally:
        gc.unfreeze()
