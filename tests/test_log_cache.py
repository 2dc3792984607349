"""What the partition log keeps in memory for speed: drop-behind of flushed pages from
the OS page cache. Each claim is about results (what reads return, which file ranges
are handed to the OS), never about timing."""
from __future__ import annotations

import os

import pytest

from common.batch import build_batch, iter_batches
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


# ---------------------------------------------------------------- tail cache

def small_batch(tag: str, n: int = 3) -> bytes:
    return build_batch([f"{tag}-{i}".encode() * 6 for i in range(n)], timestamp_ms=1_000)


def test_newest_batches_are_read_from_the_cache_without_touching_the_file(tmp_path, monkeypatch):
    log = PartitionLog(str(tmp_path / "p"), config=LogConfig(tail_cache_bytes=1 << 20))
    try:
        appended = bytearray(small_batch("a"))
        log.append_as_leader(appended, leader_epoch=3)
        monkeypatch.setattr(Segment, "read", lambda *a, **k: pytest.fail("read the file"))
        result = log.read(1, max_bytes=1 << 20)
        assert (result.first_offset, result.next_offset) == (0, 3)
        assert result.records == appended  # the patched batch, offsets and epoch stamped
        assert isinstance(result.records, memoryview) and result.records.readonly
        assert result.records.obj is appended  # served from the append's own buffer
    finally:
        log.close()


def test_reads_below_the_cache_come_from_the_file(tmp_path, monkeypatch):
    batch_size = len(small_batch("a0"))
    log = PartitionLog(str(tmp_path / "p"), config=LogConfig(tail_cache_bytes=2 * batch_size))
    try:
        for i in range(5):
            log.append_as_leader(small_batch(f"a{i}"), leader_epoch=1)
        assert log._tail.start_offset == 9  # only the last two batches fit
        calls = []
        original = Segment.read
        monkeypatch.setattr(Segment, "read", lambda self, *a, **k: calls.append(a) or original(self, *a, **k))
        log.read(6, max_bytes=1)
        assert len(calls) == 1
        log.read(9, max_bytes=1)
        assert len(calls) == 1
    finally:
        log.close()


def test_a_batch_larger_than_the_cache_is_not_cached(tmp_path):
    log = PartitionLog(str(tmp_path / "p"), config=LogConfig(tail_cache_bytes=100))
    try:
        log.append_as_leader(small_batch("a"), leader_epoch=1)
        assert log._tail.start_offset is None and log._tail.size_bytes == 0
        assert bytes(log.read(0, max_bytes=1).records) == bytes(log.read(0, max_bytes=1 << 20).records)
    finally:
        log.close()


def test_truncation_and_reopen_never_serve_cut_batches(tmp_path):
    path = str(tmp_path / "p")
    log = PartitionLog(path, config=LogConfig(tail_cache_bytes=1 << 20))
    for i in range(4):
        log.append_as_leader(small_batch(f"a{i}"), leader_epoch=1)
    log.truncate_to(6)
    assert log._tail.end_offset == 6
    log.append_as_leader(small_batch("b"), leader_epoch=2)
    result = log.read(6, max_bytes=1 << 20)
    assert bytes(result.records) == bytes(log.read(6, max_bytes=1 << 20).records)
    assert b"b-0" in bytes(result.records) and b"a2-0" not in bytes(result.records)
    log.truncate_fully_and_start_at(100)
    assert log._tail.start_offset is None
    log.append_as_leader(small_batch("c"), leader_epoch=3)
    assert log.read(100, max_bytes=1 << 20).first_offset == 100
    log.close()
    log = PartitionLog(path, config=LogConfig(tail_cache_bytes=1 << 20))
    try:
        assert log._tail.start_offset is None  # a reopened log starts with nothing cached
        assert b"c-0" in bytes(log.read(100, max_bytes=1 << 20).records)
    finally:
        log.close()


from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

cache_ops = st.lists(st.one_of(
    st.tuples(st.just("append"), st.integers(1, 3), st.integers(1, 5), st.booleans()),
    st.tuples(st.just("truncate"), st.floats(0, 1)),
    st.tuples(st.just("flush")),
    st.tuples(st.just("roll")),
    st.tuples(st.just("retention")),
    st.tuples(st.just("restart")),
    st.tuples(st.just("read"), st.floats(0, 1), st.integers(0, 900), st.one_of(st.none(), st.floats(0, 1))),
), max_size=40)


@pytest.mark.slow
@settings(max_examples=80, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(cache_ops)
def test_cached_reads_equal_reads_of_the_file(tmp_path_factory, sequence):
    """Claim: whatever the appends (leader and follower), truncations, rolls, retention
    and restarts, every read answers exactly what a log without a tail cache answers
    (records, first and next offset), including the max_bytes and max_offset limits
    and the one-segment-per-read rule. Hypothesis prints the failing sequence."""
    base = tmp_path_factory.mktemp("cache")
    plain_cfg = LogConfig(segment_bytes=1024, index_interval_bytes=128, segment_ms=None, retention_ms=None,
                          retention_bytes=2500, tail_cache_bytes=0)
    cached_cfg = LogConfig(segment_bytes=1024, index_interval_bytes=128, segment_ms=None, retention_ms=None,
                           retention_bytes=2500, tail_cache_bytes=700)
    plain = PartitionLog(str(base / "plain"), config=plain_cfg)
    cached = PartitionLog(str(base / "cached"), config=cached_cfg)
    follower = PartitionLog(str(base / "follower"), config=cached_cfg)
    epoch, counter = 0, 0

    def check_read(offset, max_bytes, max_offset):
        a = plain.read(offset, max_bytes=max_bytes, max_offset=max_offset)
        for log in (cached, follower):
            b = log.read(offset, max_bytes=max_bytes, max_offset=max_offset)
            assert (bytes(b.records), b.first_offset, b.next_offset) == (bytes(a.records), a.first_offset,
                                                                         a.next_offset), (offset, max_bytes)
    try:
        for op in sequence:
            kind = op[0]
            if kind == "append":
                _, batches, records, bump = op
                epoch += bump
                data = b""
                for _ in range(batches):
                    data += build_batch([f"r{counter + i}".encode() * 5 for i in range(records)],
                                        timestamp_ms=counter)
                    counter += records
                start = cached.log_end_offset
                plain.append_as_leader(data, leader_epoch=epoch)
                cached.append_as_leader(bytearray(data), leader_epoch=epoch)
                # The follower stores what the leader's reads give, batch run by batch run.
                offset = start
                while offset < cached.log_end_offset:
                    got = cached.read(offset, max_bytes=1)
                    follower.append_as_follower(got.records)
                    offset = got.next_offset
            elif kind == "truncate":
                target = round(op[1] * plain.log_end_offset)
                assert plain.truncate_to(target) == cached.truncate_to(target) == follower.truncate_to(target)
            elif kind == "flush":
                for log in (plain, cached, follower):
                    log.flush()
            elif kind == "roll":
                for log in (plain, cached, follower):
                    log.roll()
            elif kind == "retention":
                for log in (plain, cached, follower):
                    log.apply_retention(now_ms=0)
            elif kind == "restart":
                plain.close()
                cached.close()
                plain = PartitionLog(str(base / "plain"), config=plain_cfg)
                cached = PartitionLog(str(base / "cached"), config=cached_cfg)
            elif kind == "read":
                _, where, max_bytes, upto = op
                start, end = plain.log_start_offset, plain.log_end_offset
                offset = start + round(where * (end - start))
                check_read(offset, max_bytes, None if upto is None else start + round(upto * (end - start)))
            assert plain.segment_base_offsets == cached.segment_base_offsets == follower.segment_base_offsets
            for offset in range(plain.log_start_offset, plain.log_end_offset + 1):
                check_read(offset, 1 << 20, None)
                check_read(offset, 300, None)
                sizes = [h.size_bytes for _, h in iter_batches(plain.read(offset, max_bytes=1 << 20).records)]
                if len(sizes) > 1:  # exactly two batches' worth: the limit is inclusive
                    check_read(offset, sizes[0] + sizes[1], None)
                    check_read(offset, sizes[0] + sizes[1] - 1, None)
    finally:
        for log in (plain, cached, follower):
            log.close()


def test_finding_a_batch_reads_headers_not_whole_chunks(tmp_path, monkeypatch):
    """Locating the batch that holds an offset reads about two index intervals at a time,
    not 64 KiB, when batches are large (the read itself then fetches the batch)."""
    config = LogConfig(index_interval_bytes=4096, tail_cache_bytes=0)
    log = PartitionLog(str(tmp_path / "p"), config=config)
    try:
        for i in range(6):
            log.append_as_leader(big_batch(f"a{i}", n=1), leader_epoch=1)
        sizes = []
        original = os.pread
        monkeypatch.setattr(os, "pread", lambda fd, n, pos: sizes.append(n) or original(fd, n, pos))
        result = log.read(3, max_bytes=1)
        assert result.first_offset == 3 and b"a3-0" in bytes(result.records)
        assert sizes[:-1] and max(sizes[:-1]) <= 2 * 4096  # the header walk
        assert sizes[-1] >= 64 * 1024  # the batch itself
    finally:
        log.close()
