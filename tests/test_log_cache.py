"""What the partition log keeps in memory for speed: drop-behind of flushed pages from
the OS page cache. Each claim is about results (what reads return, which file ranges
are handed to the OS), never about timing."""
from __future__ import annotations

import pytest

from common.batch import build_batch
from common.errors import InvalidRequestError
from dataplane.log import LogConfig, PartitionLog
from dataplane.log.segment import Segment

from test_log import read_all


def big_batch(tag: str, n: int = 4, size: int = 64 * 1024) -> bytes:
    return build_batch([f"{tag}-{i}".encode().ljust(size, b".") for i in range(n)], timestamp_ms=1_000)


@pytest.fixture
def drops(monkeypatch):
    """Every (segment base offset, end) handed to the OS to drop, in call order."""
    calls: list[tuple[int, int]] = []
    original = Segment.drop_cached

    def record(self, end):
        calls.append((self.base_offset, end))
        original(self, end)
    monkeypatch.setattr(Segment, "drop_cached", record)
    return calls


def test_flush_drops_pages_behind_the_window_and_keeps_the_window(tmp_path, drops):
    """A flush lets the OS drop the active segment's pages more than
    page_cache_behind_bytes before its end; unflushed writes are never offered."""
    behind = 1024 * 1024
    log = PartitionLog(str(tmp_path / "p"), config=LogConfig(page_cache_behind_bytes=behind))
    try:
        for i in range(12):  # ~3 MiB
            log.append_as_leader(big_batch(f"a{i}"), leader_epoch=1)
        size = log._segments[-1].size_bytes
        assert drops == []  # appends alone drop nothing
        log.flush()
        assert drops == [(0, size - behind)]
        assert log._segments[-1]._uncached_to == size - behind
        log.append_as_leader(big_batch("b"), leader_epoch=1)  # 256 KiB more: below the 1 MiB step
        log.flush()
        assert log._segments[-1]._uncached_to == size - behind
        assert [v for _, v in read_all(log)][:1] == [b"a0-0".ljust(64 * 1024, b".")]
    finally:
        log.close()


def test_sealed_segments_are_dropped_whole_after_their_flush(tmp_path, drops):
    config = LogConfig(segment_bytes=1024 * 1024, page_cache_behind_bytes=4 * 1024 * 1024)
    log = PartitionLog(str(tmp_path / "p"), config=config)
    try:
        for i in range(8):  # 2 MiB: the first segment fills and rolls
            log.append_as_leader(big_batch(f"a{i}"), leader_epoch=1)
        first = log._segments[0]
        assert first.sealed and len(log._segments) >= 2
        log.flush()
        assert (first.base_offset, first.size_bytes) in drops
        assert log._segments[-1]._uncached_to == 0  # all of it within the window
    finally:
        log.close()


def test_reads_after_drop_behind_come_back_from_disk_unchanged(tmp_path):
    """With page_cache_behind_bytes=0 every flushed page may go: reads still return
    every record, before and after a reopen."""
    config = LogConfig(segment_bytes=1024 * 1024, page_cache_behind_bytes=0)
    log = PartitionLog(str(tmp_path / "p"), config=config)
    written = []
    for i in range(10):
        log.append_as_leader(big_batch(f"a{i}", n=2), leader_epoch=1)
        written += [f"a{i}-{j}".encode().ljust(64 * 1024, b".") for j in range(2)]
        log.flush()
    assert [v for _, v in read_all(log)] == written
    log.close()
    log = PartitionLog(str(tmp_path / "p"), config=config)
    try:
        assert [v for _, v in read_all(log)] == written
    finally:
        log.close()


def test_truncation_below_the_dropped_range_lets_it_be_dropped_again(tmp_path, drops):
    behind = 0
    log = PartitionLog(str(tmp_path / "p"), config=LogConfig(page_cache_behind_bytes=behind))
    try:
        for i in range(8):
            log.append_as_leader(big_batch(f"a{i}"), leader_epoch=1)
        log.flush()
        active = log._segments[-1]
        assert active._uncached_to == active.size_bytes
        log.truncate_to(8)  # two batches of 4 records stay
        assert active._uncached_to == active.size_bytes
        for i in range(8):
            log.append_as_leader(big_batch(f"b{i}"), leader_epoch=2)
        log.flush()
        assert drops[-1] == (0, active.size_bytes)
    finally:
        log.close()


def test_page_cache_behind_bytes_must_not_be_negative():
    with pytest.raises(InvalidRequestError, match="page_cache_behind_bytes=-1"):
        LogConfig(page_cache_behind_bytes=-1)
    assert LogConfig(page_cache_behind_bytes=None).page_cache_behind_bytes is None
