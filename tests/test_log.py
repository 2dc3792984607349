"""Partition log (dataplane/log): appends, reads, truncation, segments, retention,
epoch cache, recovery, locking, full disk, and the in-memory twin."""
from __future__ import annotations

import asyncio
import errno
import os
import subprocess
import sys
import textwrap

import pytest

from common.batch import (HEADER_SIZE, BatchBuilder, Compression, build_batch, iter_batches, read_records,
                          validate_batch)
from common import durable
from common.errors import CorruptBatchError, StorageError
from dataplane.log import (FlushCoalescer, Log, LogConfig, LogTruncatedError, MemoryLog,
                           OffsetMismatchError, OffsetOutOfRangeError, PartitionLog, StaleEpochError)
from dataplane.log.log import ACTIVE_CHECKPOINT, CLEAN_SHUTDOWN, RECOVERY_POINT

SMALL = LogConfig(segment_bytes=2048, index_interval_bytes=256, segment_ms=None, retention_ms=None)


def batch(n: int = 3, *, ts: int = 1_000, tag: str = "v", size: int = 40) -> bytes:
    return build_batch([f"{tag}-{i}".encode().ljust(size, b".") for i in range(n)], timestamp_ms=ts)


def values(records: bytes) -> list[tuple[int, bytes]]:
    out = []
    for pos, _ in iter_batches(records):
        out += [(r.offset, r.value) for r in read_records(records, pos)]
    return out


def read_all(log: Log, start: int | None = None) -> list[tuple[int, bytes]]:
    offset = log.log_start_offset if start is None else start
    out = []
    while offset < log.log_end_offset:
        result = log.read(offset, max_bytes=1 << 20)
        assert result.records, offset
        out += values(result.records)
        offset = result.next_offset
    return out


def crash(log: PartitionLog) -> None:
    """Drop the log as a killed process would: no flush, no marker; fds closed, lock gone."""
    for segment in log._segments:
        segment.close()
    log._dir_lock.release()
    log._closed = True


@pytest.fixture
def tmp_log(tmp_path):
    opened = []

    def open_log(config: LogConfig = SMALL, name: str = "p0") -> PartitionLog:
        log = PartitionLog(str(tmp_path / name), config=config)
        opened.append(log)
        return log

    yield open_log
    for log in opened:
        log.close()


# ---------------------------------------------------------------- append / read


def test_leader_append_assigns_offsets_and_epoch_and_reads_back(tmp_log):
    log = tmp_log()
    first = log.append_as_leader(batch(3, tag="a"), leader_epoch=4)
    second = log.append_as_leader(batch(2, tag="b"), leader_epoch=4)
    assert (first.base_offset, first.last_offset) == (0, 2)
    assert (second.base_offset, second.last_offset, second.log_end_offset) == (3, 4, 5)
    result = log.read(0, max_bytes=1 << 20)
    headers = [h for _, h in iter_batches(result.records)]
    assert [(h.base_offset, h.leader_epoch) for h in headers] == [(0, 4), (3, 4)]
    assert values(result.records)[3] == (3, b"b-0".ljust(40, b"."))
    assert (result.first_offset, result.next_offset, result.log_end_offset) == (0, 5, 5)


def test_leader_append_of_concatenated_batches(tmp_log):
    log = tmp_log()
    info = log.append_as_leader(batch(2, tag="a") + batch(4, tag="b") + batch(1, tag="c"), leader_epoch=0)
    assert (info.base_offset, info.last_offset, info.batch_count) == (0, 6, 3)
    assert [o for o, _ in read_all(log)] == list(range(7))


def test_leader_append_patches_bytearray_in_place_and_copies_bytes(tmp_log):
    log = tmp_log()
    log.append_as_leader(batch(5), leader_epoch=1)
    original = batch(2)
    log.append_as_leader(original, leader_epoch=1)
    assert original == batch(2)  # bytes are not touched
    mutable = bytearray(batch(2))
    log.append_as_leader(mutable, leader_epoch=1)
    header = next(iter_batches(mutable))[1]
    assert (header.base_offset, header.leader_epoch) == (7, 1)
    assert log.read(7, max_bytes=1 << 20).records == bytes(mutable)


def test_corrupt_batch_is_rejected_and_log_unchanged(tmp_log):
    log = tmp_log()
    log.append_as_leader(batch(), leader_epoch=0)
    bad = bytearray(batch())
    bad[-1] ^= 0xFF
    with pytest.raises(CorruptBatchError, match="CRC"):
        log.append_as_leader(bad, leader_epoch=0)
    with pytest.raises(CorruptBatchError):
        log.append_as_follower(bytes(bad))
    assert log.log_end_offset == 3
    assert len(read_all(log)) == 3


@pytest.mark.parametrize("kind", ["disk", "memory"])
def test_crc_checked_appends_skip_only_the_crc(tmp_log, kind):
    """A caller that has checked the CRCs itself says so and the log does not compute
    them again; headers are still checked, and without the flag a bad CRC is refused."""
    log = tmp_log() if kind == "disk" else MemoryLog(config=SMALL)
    bad_crc = bytearray(batch())
    bad_crc[-1] ^= 0xFF
    with pytest.raises(CorruptBatchError, match="CRC"):
        log.append_as_leader(bytes(bad_crc), leader_epoch=0)
    assert log.append_as_leader(bytes(bad_crc), leader_epoch=0, crc_checked=True).last_offset == 2
    with pytest.raises(CorruptBatchError, match="truncated"):
        log.append_as_leader(batch()[:-5], leader_epoch=0, crc_checked=True)
    follower = tmp_log(name="f") if kind == "disk" else MemoryLog(config=SMALL)
    with pytest.raises(CorruptBatchError, match="CRC"):
        follower.append_as_follower(log.read(0, max_bytes=1 << 20).records)
    assert follower.append_as_follower(log.read(0, max_bytes=1 << 20).records, crc_checked=True).last_offset == 2


@pytest.mark.parametrize("kind", ["disk", "memory"])
def test_a_batch_larger_than_a_segment_is_refused_to_a_leader_and_stored_for_a_follower(tmp_log, kind):
    """A leader's append of a batch larger than a segment is refused (admission answers it
    RECORD_LIST_TOO_LARGE first); a follower stores such a batch, which its leader took under a
    larger segment size, in a segment of its own."""
    config = LogConfig(segment_bytes=1024, segment_ms=None, retention_ms=None)
    big = batch(40, size=60)
    assert len(big) > 1024
    leader = tmp_log(LogConfig(segment_ms=None, retention_ms=None)) if kind == "disk" else MemoryLog()
    leader.append_as_leader(batch(), leader_epoch=0)
    leader.append_as_leader(big, leader_epoch=0)
    small = tmp_log(config, name="f") if kind == "disk" else MemoryLog(config=config)
    assert small.batch_bytes_max == 1024
    with pytest.raises(CorruptBatchError, match="max_batch_bytes=1024"):
        small.append_as_leader(big, leader_epoch=0)
    assert small.append_as_follower(leader.read(0, max_bytes=1 << 20).records).last_offset == 42
    assert read_all(small) == read_all(leader)


def test_leader_append_patches_a_writable_memoryview_in_place(tmp_log):
    log = tmp_log()
    frame = bytearray(b"head" + batch(2))
    view = memoryview(frame)[4:]
    log.append_as_leader(view, leader_epoch=4)
    header = next(iter_batches(frame[4:]))[1]
    assert (header.base_offset, header.leader_epoch) == (0, 4)


def test_follower_append_keeps_offsets_accepts_a_gap_and_rejects_overlap(tmp_log):
    """A gap is what a compacted leader serves (its removed offsets stay removed); an
    overlap is refused with both offsets."""
    leader, follower = tmp_log(name="leader"), tmp_log(name="follower")
    for epoch in (1, 1, 2):
        leader.append_as_leader(batch(3), leader_epoch=epoch)
    data = leader.read(0, max_bytes=1 << 20).records
    info = follower.append_as_follower(data)
    assert (info.base_offset, info.last_offset) == (0, 8)
    assert follower.read(0, max_bytes=1 << 20).records == data
    assert follower.epoch_entries() == leader.epoch_entries()

    overlap = leader.read(6, max_bytes=1 << 20).records
    with pytest.raises(OffsetMismatchError, match="expected base offset 9 or above, got 6") as exc:
        follower.append_as_follower(overlap)
    assert (exc.value.expected_offset, exc.value.actual_offset) == (9, 6)
    assert follower.log_end_offset == 9
    leader.append_as_leader(batch(2), leader_epoch=2)
    leader.append_as_leader(batch(2), leader_epoch=2)
    second = leader.read(11, max_bytes=1 << 20).records
    gap = follower.append_as_follower(second)
    assert (gap.base_offset, gap.log_end_offset) == (11, 13)
    assert follower.read(9, max_bytes=1 << 20).first_offset == 11  # the next batch after the gap
    assert [o for o, _ in read_all(follower)] == [o for o, _ in read_all(leader) if not 9 <= o < 11]
    reopened_at = follower.log_end_offset
    follower.close()
    follower = PartitionLog(follower.directory, config=SMALL)
    assert follower.log_end_offset == reopened_at
    follower.close()


def test_follower_rejects_batches_within_one_request_that_go_back(tmp_log):
    leader, follower = tmp_log(name="leader"), tmp_log(name="follower")
    for _ in range(3):
        leader.append_as_leader(batch(2), leader_epoch=0)
    first = leader.read(0, max_bytes=1).records
    third = leader.read(4, max_bytes=1).records
    with pytest.raises(OffsetMismatchError, match="expected base offset 6 or above, got 0"):
        follower.append_as_follower(bytes(first) + bytes(third) + bytes(first))
    assert follower.log_end_offset == 0


def test_stale_epochs_are_rejected(tmp_log):
    log = tmp_log()
    log.append_as_leader(batch(), leader_epoch=5)
    with pytest.raises(StaleEpochError, match="leader epoch 4 is older than the log's latest epoch 5"):
        log.append_as_leader(batch(), leader_epoch=4)
    other = tmp_log(name="old")
    other.append_as_leader(batch(), leader_epoch=3)
    with pytest.raises(StaleEpochError):
        log.append_as_follower(_rebased(other.read(0, max_bytes=1 << 20).records, 3))
    assert log.log_end_offset == 3


@pytest.mark.parametrize("kind", ["disk", "memory"])
def test_follower_started_over_at_the_leaders_log_start_continues_there(tmp_log, kind):
    """A follower whose log ends below the leader's log start is emptied and started at that
    offset: it then takes the leader's batches from there as follower, its flushed offset and
    epochs follow, and (on disk) a reopen keeps the new start."""
    leader = tmp_log(LogConfig(segment_bytes=1024, segment_ms=None, retention_ms=None, retention_bytes=1024),
                     name="leader")
    follower = tmp_log(name="follower") if kind == "disk" else MemoryLog(config=SMALL)
    for i in range(20):
        leader.append_as_leader(batch(3, tag=f"b{i}"), leader_epoch=i // 10)
    follower.append_as_follower(leader.read(0, max_bytes=1).records)      # 0..2, epoch 0
    follower.flush()
    assert leader.apply_retention(now_ms=0) and leader.log_start_offset > follower.log_end_offset
    start = leader.log_start_offset
    follower.truncate_fully_and_start_at(start)
    assert (follower.log_start_offset, follower.log_end_offset, follower.flushed_offset) == (start, start, start)
    assert follower.epoch_entries() == [] and follower.read(start, max_bytes=100).records == b""
    with pytest.raises(OffsetOutOfRangeError):
        follower.read(0, max_bytes=100)
    offset = start
    while offset < leader.log_end_offset:
        result = leader.read(offset, max_bytes=1 << 20)
        follower.append_as_follower(result.records)
        offset = result.next_offset
    assert read_all(follower) == read_all(leader)
    assert follower.epoch_entries() == leader.epoch_entries()
    if kind == "disk":
        follower.close()
        follower = tmp_log(name="follower")
        assert (follower.log_start_offset, follower.log_end_offset) == (start, leader.log_end_offset)
        assert read_all(follower) == read_all(leader)


def _rebased(records: bytes, base_offset: int) -> bytearray:
    from common.batch import set_base_offset
    buf = bytearray(records)
    set_base_offset(buf, base_offset)
    return buf


def test_read_limits_max_bytes_max_offset_and_containing_batch(tmp_log):
    log = tmp_log(LogConfig(segment_bytes=1 << 20, index_interval_bytes=100))
    sizes = []
    for i in range(10):
        sizes.append(log.append_as_leader(batch(4, tag=str(i)), leader_epoch=0).size_bytes)
    one = log.read(0, max_bytes=1)  # smaller than a batch: still one whole batch
    assert (one.first_offset, one.next_offset, len(one.records)) == (0, 4, sizes[0])
    two = log.read(0, max_bytes=sizes[0] + sizes[1] + sizes[2] - 1)
    assert (two.first_offset, two.next_offset) == (0, 8)
    middle = log.read(13, max_bytes=1 << 20)  # offset 13 is inside batch 12..15
    assert middle.first_offset == 12 and values(middle.records)[0][0] == 12
    capped = log.read(4, max_bytes=1 << 20, max_offset=14)  # batch 12..15 is not below 14
    assert (capped.first_offset, capped.next_offset) == (4, 12)
    assert log.read(12, max_bytes=1 << 20, max_offset=14).records == b""
    at_end = log.read(40, max_bytes=1 << 20)
    assert (at_end.records, at_end.next_offset) == (b"", 40)
    with pytest.raises(OffsetOutOfRangeError, match="offset 41 is out of range"):
        log.read(41, max_bytes=100)


def test_read_below_log_start_is_out_of_range(tmp_log):
    log = tmp_log()
    log.truncate_fully_and_start_at(100)
    log.append_as_leader(batch(), leader_epoch=0)
    with pytest.raises(OffsetOutOfRangeError) as err:
        log.read(99, max_bytes=100)
    assert (err.value.log_start_offset, err.value.log_end_offset) == (100, 103)
    assert log.read(100, max_bytes=100).first_offset == 100


# ---------------------------------------------------------------- segments and indexes


def test_roll_by_size_keeps_segments_under_limit_and_reads_across_edges(tmp_log):
    log = tmp_log()
    for i in range(40):
        log.append_as_leader(batch(3, tag=f"s{i}"), leader_epoch=0)
    bases = log.segment_base_offsets
    assert len(bases) >= 4
    for segment in log._segments:
        assert segment.size_bytes <= SMALL.segment_bytes
    expected = read_all(log)
    assert [o for o, _ in expected] == list(range(120))
    # Every offset, including each segment's first and last, finds its own batch.
    for offset in range(120):
        result = log.read(offset, max_bytes=1)
        assert result.first_offset == offset - offset % 3
        assert result.first_offset in range(offset - 2, offset + 1)


def test_index_lookup_after_reopen_and_after_index_loss(tmp_log, tmp_path):
    log = tmp_log()
    for i in range(40):
        log.append_as_leader(batch(3, tag=f"s{i}"), leader_epoch=0)
    before = read_all(log)
    assert any(len(s.index) for s in log._segments)
    log.close()
    log = tmp_log()
    assert read_all(log) == before
    for offset in (0, 59, 60, 119):
        assert log.read(offset, max_bytes=1).first_offset == offset - offset % 3
    log.close()
    for name in os.listdir(tmp_path / "p0"):
        if name.endswith(".index"):
            (tmp_path / "p0" / name).write_bytes(b"\x00\x01garbage")
    log = tmp_log()
    assert read_all(log) == before
    assert log.read(61, max_bytes=1).first_offset == 60


def test_roll_by_age_uses_batch_timestamps_or_now(tmp_log):
    log = tmp_log(LogConfig(segment_bytes=1 << 20, segment_ms=1000, retention_ms=None))
    log.append_as_leader(batch(ts=10_000), leader_epoch=0)
    log.append_as_leader(batch(ts=10_999), leader_epoch=0)
    assert log.segment_base_offsets == [0]
    log.append_as_leader(batch(ts=11_000), leader_epoch=0)
    assert log.segment_base_offsets == [0, 6]
    log.append_as_leader(batch(ts=11_100), leader_epoch=0, now_ms=12_000)
    assert log.segment_base_offsets == [0, 6, 9]
    log.roll(now_ms=12_099)  # the active segment's first batch (11_100) is not 1 s old yet
    assert log.segment_base_offsets == [0, 6, 9]
    log.roll(now_ms=12_100)
    assert log.segment_base_offsets == [0, 6, 9, 12]
    log.roll(now_ms=12_600)  # empty active segment: nothing to roll
    assert log.segment_base_offsets == [0, 6, 9, 12]


def test_offset_for_timestamp_uses_time_index(tmp_log):
    log = tmp_log()
    for i in range(40):
        log.append_as_leader(batch(3, ts=1_000 + 10 * i), leader_epoch=0)
    assert log.offset_for_timestamp(0) == (0, 1_000)
    assert log.offset_for_timestamp(1_000 + 10 * 25) == (75, 1_250)
    assert log.offset_for_timestamp(1_000 + 10 * 25 - 5) == (75, 1_250)
    assert log.offset_for_timestamp(10_000) is None
    log.close()
    log = tmp_log()
    assert log.offset_for_timestamp(1_000 + 10 * 39) == (117, 1_390)


def test_offset_for_timestamp_names_the_record_inside_its_batch(tmp_log):
    """Claim: a time lookup answers the first record stamped at or after the time, not the
    base of its batch (which would return records from before that time), in compressed
    batches too, on disk and in memory alike."""
    builder = BatchBuilder(compression=Compression.ZSTD)
    for i in range(10):
        builder.append(b"v%d" % i, timestamp_ms=2_000 + 100 * i)
    for log in (tmp_log(), MemoryLog(config=SMALL)):
        log.append_as_leader(batch(2, ts=1_000), leader_epoch=0)  # offsets 0, 1
        log.append_as_leader(builder.build(), leader_epoch=0)  # offsets 2..11
        assert log.offset_for_timestamp(2_450) == (7, 2_500)
        assert log.offset_for_timestamp(2_000) == (2, 2_000)
        assert log.offset_for_timestamp(1_500) == (2, 2_000)
        assert log.offset_for_timestamp(2_901) is None


def test_offset_for_timestamp_skips_the_epoch_start_control_batch(tmp_log):
    """Claim: a time lookup never names a control record. A leader's epoch-start batch is
    stamped with the broker's clock at its election; records produced with older times
    (a replay, a backfill) come after it, and a lookup of any of their times named the
    control record's offset (and the broker's clock), so a consumer seeking by time started
    at the log's beginning. Found by a user's offsets_for_times with confluent-kafka."""
    control = BatchBuilder(is_control=True)
    control.append(b"", key=b"\x00\x00\x00\x00", timestamp_ms=9_000)
    for log in (tmp_log(), MemoryLog(config=SMALL)):
        log.append_as_leader(control.build(), leader_epoch=0)       # offset 0, stamped 9,000
        log.append_as_leader(batch(3, ts=1_000), leader_epoch=0)     # offsets 1..3
        log.append_as_leader(batch(3, ts=2_000), leader_epoch=0)     # offsets 4..6
        assert log.offset_for_timestamp(0) == (1, 1_000)
        assert log.offset_for_timestamp(1_500) == (4, 2_000)
        assert log.offset_for_timestamp(2_001) is None   # only the control record is that late
        log.close()


# ---------------------------------------------------------------- truncation


def test_truncate_at_and_inside_batches(tmp_log):
    log = tmp_log(LogConfig(segment_bytes=1 << 20, index_interval_bytes=64))
    for i in range(5):
        log.append_as_leader(batch(3, tag=f"t{i}"), leader_epoch=0)
    assert log.truncate_to(9) == 9  # a batch boundary
    assert [o for o, _ in read_all(log)] == list(range(9))
    assert log.truncate_to(7) == 6  # inside batch 6..8: the whole batch goes
    assert log.log_end_offset == 6
    assert log.truncate_to(100) == 6  # past the end: nothing to do
    info = log.append_as_leader(batch(2, tag="new"), leader_epoch=1)
    assert info.base_offset == 6
    assert read_all(log)[-1] == (7, b"new-1".ljust(40, b"."))


def test_truncate_across_segment_edges_and_reopen(tmp_log):
    log = tmp_log()
    for i in range(40):
        log.append_as_leader(batch(3, tag=f"s{i}"), leader_epoch=0 if i < 20 else 1)
    bases = log.segment_base_offsets
    edge = bases[2]
    log.truncate_to(edge)  # exactly at a segment's base: that segment goes whole
    assert log.log_end_offset == edge and log.segment_base_offsets == bases[:2]
    log.truncate_to(bases[1] - 3)  # last batch of an earlier segment
    assert log.segment_base_offsets == bases[:1]
    assert log.log_end_offset == bases[1] - 3
    assert log.end_offset_for_epoch(1) == (0, bases[1] - 3)
    log.append_as_leader(batch(3, tag="after"), leader_epoch=2)
    expected = read_all(log)
    log.close()
    log = tmp_log()
    assert read_all(log) == expected
    assert [(e.epoch, e.start_offset) for e in log.epoch_entries()] == [(0, 0), (2, bases[1] - 3)]


def test_truncate_to_log_start_and_fully(tmp_log):
    log = tmp_log()
    for _ in range(10):
        log.append_as_leader(batch(), leader_epoch=3)
    log.truncate_fully_and_start_at(500)
    assert (log.log_start_offset, log.log_end_offset, log.flushed_offset) == (500, 500, 500)
    assert log.epoch_entries() == []
    assert log.append_as_leader(batch(), leader_epoch=4).base_offset == 500
    log.close()
    log = tmp_log()
    assert (log.log_start_offset, log.log_end_offset) == (500, 503)
    assert log.end_offset_for_epoch(4) == (4, 503)


def test_interrupted_truncate_fully_completes_on_open(tmp_log, tmp_path):
    log = tmp_log()
    for _ in range(10):
        log.append_as_leader(batch(), leader_epoch=3)
    log.flush()
    crash(log)
    (tmp_path / "p0" / "truncate-fully").write_text("77\n")
    log = tmp_log()
    assert (log.log_start_offset, log.log_end_offset, log.epoch_entries()) == (77, 77, [])


# ---------------------------------------------------------------- retention


def test_retention_by_size_deletes_whole_old_segments_only(tmp_log):
    config = LogConfig(segment_bytes=2048, index_interval_bytes=256, segment_ms=None,
                       retention_ms=None, retention_bytes=5000)
    log = tmp_log(config)
    for i in range(40):
        log.append_as_leader(batch(3), leader_epoch=0 if i < 5 else 1)
    total = log.size_bytes
    bases = log.segment_base_offsets
    deleted = log.apply_retention(now_ms=0)
    assert deleted and all(d.reason == "retention_bytes" for d in deleted)
    assert [d.base_offset for d in deleted] == bases[:len(deleted)]
    assert total - sum(d.size_bytes for d in deleted) >= 5000 > log.size_bytes - log._segments[0].size_bytes
    assert log.log_start_offset == deleted[-1].next_offset == log.segment_base_offsets[0]
    with pytest.raises(OffsetOutOfRangeError):
        log.read(0, max_bytes=100)
    assert log.epoch_entries()[0].start_offset == log.log_start_offset
    assert log.apply_retention(now_ms=0) == []


@pytest.mark.parametrize("kind", ["disk", "memory"])
def test_retention_keeps_every_segment_that_reaches_past_the_high_watermark(tmp_log, kind):
    """Only segments wholly below `below_offset` (the HW) go, however old: a log start past
    uncommitted offsets would restart a follower where the leader may still cut."""
    from dataplane.log.memory import MemoryLog
    config = LogConfig(segment_bytes=1 << 20, segment_ms=1000, retention_ms=5000)
    log = tmp_log(config) if kind == "disk" else MemoryLog(config=config)
    for ts in (1_000, 2_000, 3_000, 4_000):
        log.append_as_leader(batch(ts=ts), leader_epoch=0)
    assert log.segment_base_offsets == [0, 3, 6, 9]
    deleted = log.apply_retention(now_ms=100_000, below_offset=5)
    assert [(d.base_offset, d.next_offset) for d in deleted] == [(0, 3)]
    assert log.log_start_offset == 3
    assert log.apply_retention(now_ms=100_000, below_offset=9) != []
    assert log.log_start_offset == 9


def test_retention_by_time_never_deletes_active_segment(tmp_log):
    config = LogConfig(segment_bytes=1 << 20, segment_ms=1000, retention_ms=5000)
    log = tmp_log(config)
    for ts in (1_000, 2_000, 3_000, 4_000):
        log.append_as_leader(batch(ts=ts), leader_epoch=0)
    assert log.segment_base_offsets == [0, 3, 6, 9]
    assert log.apply_retention(now_ms=6_000) == []  # exactly retention_ms old: kept
    deleted = log.apply_retention(now_ms=6_001)
    assert [(d.base_offset, d.next_offset, d.reason) for d in deleted] == [(0, 3, "retention_ms")]
    assert log.log_start_offset == 3
    log.apply_retention(now_ms=100_000)
    assert log.segment_base_offsets == [9]  # the active segment stays, however old
    assert log.log_start_offset == 9 and log.log_end_offset == 12
    log.close()
    log = tmp_log(config)
    assert (log.log_start_offset, log.log_end_offset) == (9, 12)


# ---------------------------------------------------------------- epoch cache


def test_end_offset_for_epoch_semantics(tmp_log):
    log = tmp_log()
    assert log.end_offset_for_epoch(0) == (-1, -1)
    log.truncate_fully_and_start_at(10)
    log.append_as_leader(batch(3), leader_epoch=2)   # 10..12
    log.append_as_leader(batch(3), leader_epoch=2)   # 13..15
    log.append_as_leader(batch(3), leader_epoch=5)   # 16..18
    log.append_as_leader(batch(3), leader_epoch=7)   # 19..21
    assert log.end_offset_for_epoch(2) == (2, 16)
    assert log.end_offset_for_epoch(3) == (2, 16)    # largest epoch <= 3 is 2
    assert log.end_offset_for_epoch(5) == (5, 19)
    assert log.end_offset_for_epoch(7) == (7, 22)    # latest: log end
    assert log.end_offset_for_epoch(9) == (7, 22)
    assert log.end_offset_for_epoch(1) == (1, 10)    # older than all: ends where the first starts
    assert [(e.epoch, e.start_offset) for e in log.epoch_entries()] == [(2, 10), (5, 16), (7, 19)]


def test_epoch_cache_survives_clean_and_unclean_restart(tmp_log, tmp_path):
    log = tmp_log()
    log.append_as_leader(batch(), leader_epoch=1)
    log.append_as_leader(batch(), leader_epoch=3)
    log.close()
    log = tmp_log()
    assert log.end_offset_for_epoch(1) == (1, 3)
    log.append_as_leader(batch(), leader_epoch=4)
    log.flush()
    log.append_as_leader(batch(), leader_epoch=6)
    crash(log)
    # Cut the unflushed epoch-6 batch as a lost write would.
    last = tmp_path / "p0" / f"{0:020d}.log"
    with open(last, "r+b") as f:
        f.truncate(os.path.getsize(last) - 10)
    log = tmp_log()
    assert log.log_end_offset == 9
    assert [(e.epoch, e.start_offset) for e in log.epoch_entries()] == [(1, 0), (3, 3), (4, 6)]
    assert log.end_offset_for_epoch(6) == (4, 9)


def test_epoch_cache_rebuilt_when_checkpoint_is_lost(tmp_log, tmp_path):
    log = tmp_log()
    for epoch in (1, 1, 2, 9):
        log.append_as_leader(batch(), leader_epoch=epoch)
    log.close()
    (tmp_path / "p0" / "leader-epoch-checkpoint").write_text("garbage")
    log = tmp_log()
    assert [(e.epoch, e.start_offset) for e in log.epoch_entries()] == [(1, 0), (2, 6), (9, 9)]


def test_a_new_epoch_costs_no_file_write_on_append_and_is_durable_before_a_flush_lets_recovery_trust_it(
        tmp_log, tmp_path, monkeypatch):
    """A batch that brings a new epoch touches no file but its segment (a replace of the epoch
    checkpoint, let alone an fsync, on the append path, for every partition a start or a
    failover moves, was a stall of the broker's event loop); the next flush writes and fsyncs
    the checkpoint before it writes the recovery point or the active checkpoint, which let a
    recovery skip re-reading the batches that carry it."""
    log = tmp_log(LogConfig(segment_bytes=2048, index_interval_bytes=256, segment_ms=None, retention_ms=None,
                            checkpoint_interval_offsets=1))
    log.append_as_leader(batch(), leader_epoch=1)
    log.flush()
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append("fsync " + os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src, dst, **kw):
        events.append("replace " + os.path.basename(dst))
        real_replace(src, dst, **kw)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(os, "open", opened := _RecordingOpen(os.open))
    log.append_as_leader(batch(), leader_epoch=2)
    assert events == [] and opened == [], (events, opened)
    log.flush()
    written = events.index("replace leader-epoch-checkpoint")
    synced = events.index("fsync leader-epoch-checkpoint")
    assert written < synced
    directory = events.index("fsync p0")
    trusting = [i for i, e in enumerate(events) if e in ("replace recovery-point", "replace active-segment-checkpoint")]
    assert trusting and synced < directory < min(trusting), events
    monkeypatch.undo()
    assert [(e.epoch, e.start_offset) for e in log.epoch_entries()] == [(1, 0), (2, 3)]


def test_a_flush_that_cannot_write_the_epoch_checkpoint_fails_and_a_recovery_names_the_epoch(
        tmp_log, tmp_path, monkeypatch):
    """The flush that cannot write the epoch checkpoint (ENOSPC) fails, as a failed append
    does (its partition goes offline and its leadership moves), and moves neither the recovery
    point nor the active checkpoint: a crash then re-reads the batches and takes their epoch
    from them. The next flush that can writes the file."""
    config = LogConfig(segment_bytes=1024, index_interval_bytes=256, segment_ms=None, retention_ms=None,
                       checkpoint_interval_offsets=1)
    log = tmp_log(config)
    log.append_as_leader(batch(), leader_epoch=1)
    log.flush()
    trusting: list[str] = []
    real = durable.write_atomically

    def write_atomically(path, data, **kw):
        if str(path).endswith("leader-epoch-checkpoint"):
            raise OSError(errno.ENOSPC, "No space left on device")
        trusting.append(os.path.basename(path))
        real(path, data, **kw)
    monkeypatch.setattr(durable, "write_atomically", write_atomically)
    for _ in range(8):  # past a segment: a flush would move the recovery point
        log.append_as_leader(batch(size=100), leader_epoch=2)
    assert log.segment_count > 1
    with pytest.raises(StorageError, match="disk full"):
        log.flush()
    assert trusting == [] and log.flushed_offset == 3, "nothing lets a recovery skip the batches of epoch 2"
    monkeypatch.undo()
    crash(log)
    log = tmp_log(config)
    assert log.log_end_offset == 27
    assert [(e.epoch, e.start_offset) for e in log.epoch_entries()] == [(1, 0), (2, 3)]
    log.append_as_leader(batch(), leader_epoch=3)
    log.flush()
    crash(log)
    log = tmp_log(config)
    assert [(e.epoch, e.start_offset) for e in log.epoch_entries()] == [(1, 0), (2, 3), (3, 27)]


class _RecordingOpen(list):
    """os.open that also lists the names of the files it opened."""

    def __init__(self, real) -> None:
        super().__init__()
        self.real = real

    def __call__(self, path, *args, **kw):
        self.append(os.path.basename(os.fspath(path)))
        return self.real(path, *args, **kw)


def test_an_epoch_checkpoint_lost_or_unreadable_after_a_crash_is_made_whole_from_the_batches(tmp_log, tmp_path):
    """A crash may leave the old checkpoint (the rename was lost) or an unreadable one (the
    rename kept, the bytes not) while the batches of the new epoch reached the disk."""
    for leftover in ("old", "empty"):
        name = f"p-{leftover}"
        log = tmp_log(name=name)
        log.append_as_leader(batch(), leader_epoch=1)
        log.flush()
        old = (tmp_path / name / "leader-epoch-checkpoint").read_bytes()
        log.append_as_leader(batch(), leader_epoch=2)
        log.append_as_leader(batch(), leader_epoch=4)
        crash(log)
        (tmp_path / name / "leader-epoch-checkpoint").write_bytes(old if leftover == "old" else b"")
        log = tmp_log(name=name)
        assert log.log_end_offset == 9
        assert [(e.epoch, e.start_offset) for e in log.epoch_entries()] == [(1, 0), (2, 3), (4, 6)], leftover


# ---------------------------------------------------------------- recovery


def test_torn_tail_is_cut_on_open_and_appends_continue(tmp_log, tmp_path):
    log = tmp_log(LogConfig(segment_bytes=1 << 20, index_interval_bytes=128))
    for i in range(10):
        log.append_as_leader(batch(3, tag=f"r{i}"), leader_epoch=0)
    log.flush()
    good = read_all(log)
    crash(log)
    path = tmp_path / "p0" / f"{0:020d}.log"
    with open(path, "ab") as f:
        f.write(batch(3)[:HEADER_SIZE + 5])  # half a batch
    log = tmp_log(LogConfig(segment_bytes=1 << 20, index_interval_bytes=128))
    assert log.recovered_bytes_cut == HEADER_SIZE + 5
    assert read_all(log) == good
    assert log.flushed_offset == log.log_end_offset == 30
    assert log.append_as_leader(batch(), leader_epoch=0).base_offset == 30


def test_corrupt_batch_in_the_middle_cuts_it_and_everything_after(tmp_log, tmp_path):
    log = tmp_log()
    for i in range(40):
        log.append_as_leader(batch(3, tag=f"c{i}"), leader_epoch=0)
    bases = log.segment_base_offsets
    full = read_all(log)
    crash(log)
    (tmp_path / "p0" / RECOVERY_POINT).write_text("0\n")  # nothing known flushed: check it all
    victim = tmp_path / "p0" / f"{bases[1]:020d}.log"
    data = bytearray(victim.read_bytes())
    first_size = next(iter_batches(bytes(data)))[1].size_bytes
    data[first_size + 70] ^= 0x55  # inside the second batch's records: CRC mismatch
    victim.write_bytes(bytes(data))
    log = tmp_log()
    assert log.log_end_offset == bases[1] + 3
    assert read_all(log) == full[:bases[1] + 3]
    assert log.segment_base_offsets == bases[:2]
    assert not (tmp_path / "p0" / f"{bases[2]:020d}.log").exists()


def test_unclean_open_validates_from_the_recovery_point_on(tmp_log, tmp_path):
    """Segments wholly below the last flushed checkpoint are trusted (not re-read by CRC);
    the segment holding the checkpoint and everything after it are validated."""
    log = tmp_log()
    for i in range(35):
        log.append_as_leader(batch(3, tag=f"c{i}"), leader_epoch=0)
    log.flush()  # flushed offset is in the last segment: the checkpoint moves there
    bases = log.segment_base_offsets
    assert int((tmp_path / "p0" / RECOVERY_POINT).read_text()) >= bases[-1]
    log.append_as_leader(batch(3), leader_epoch=0)
    assert log.segment_base_offsets == bases  # still in the checkpoint's segment
    crash(log)
    first = tmp_path / "p0" / f"{bases[0]:020d}.log"
    data = bytearray(first.read_bytes())
    data[100] ^= 0x55  # bad CRC in an old segment: below the checkpoint, not checked
    first.write_bytes(bytes(data))
    last = tmp_path / "p0" / f"{bases[-1]:020d}.log"
    with open(last, "ab") as f:
        f.write(b"torn")
    log = tmp_log()
    assert log.recovered_bytes_cut == 4
    assert log.log_end_offset == 108 and log.segment_base_offsets == bases
    with pytest.raises(CorruptBatchError):  # trusted, so the old damage was not cut
        validate_batch(log.read(0, max_bytes=1).records)


CHECKPOINTED = LogConfig(segment_bytes=1 << 20, index_interval_bytes=256, segment_ms=None, retention_ms=None,
                         checkpoint_interval_bytes=1 << 20, checkpoint_interval_offsets=30)


def test_unclean_open_validates_only_past_the_active_segments_checkpoint(tmp_log, tmp_path):
    """Claim (the long fault run's slow restarts): a flush that moved the active segment on by
    checkpoint_interval_offsets saves its indexes and names its fsynced prefix; after a crash
    that prefix is trusted (its damage is not found, as below the recovery point) and only the
    bytes after it are validated, while reads, lookups by offset and time, and appends work."""
    log = tmp_log(CHECKPOINTED)
    for i in range(40):
        log.append_as_leader(batch(3, ts=1_000 + i, tag=f"k{i}"), leader_epoch=0)
    log.flush()
    base, position, next_offset, epoch = (int(x) for x in (tmp_path / "p0" / ACTIVE_CHECKPOINT).read_text().split())
    assert (base, next_offset, epoch) == (0, 120, 0) and position > 0
    log.append_as_leader(batch(3, ts=5_000, tag="late"), leader_epoch=1)  # written, not flushed
    full = read_all(log)
    crash(log)
    segment = tmp_path / "p0" / f"{0:020d}.log"
    data = bytearray(segment.read_bytes())
    data[100] ^= 0x55  # inside the trusted prefix
    segment.write_bytes(bytes(data))
    with open(segment, "ab") as f:
        f.write(b"torn")
    log = tmp_log(CHECKPOINTED)
    assert log.recovered_bytes_trusted == position
    assert log.recovered_bytes_cut == 4
    assert log.log_end_offset == 123
    with pytest.raises(CorruptBatchError):  # trusted, so the damage was not cut
        validate_batch(log.read(0, max_bytes=1).records)
    assert read_all(log, 3) == full[3:]
    assert log.read(61, max_bytes=1).first_offset == 60
    assert log.offset_for_timestamp(1_030) == (90, 1_030) and log.offset_for_timestamp(4_000) == (120, 5_000)
    assert log.end_offset_for_epoch(0) == (0, 120) and log.end_offset_for_epoch(1) == (1, 123)
    assert log.append_as_leader(batch(), leader_epoch=1).base_offset == 123


def _index_files_hold_the_checkpoints_prefix(log: PartitionLog, directory) -> tuple[int, int]:
    """Both index files of the active segment hold exactly its entries below the checkpoint
    (as a whole rewrite would write them); returns (position, next offset) of the checkpoint."""
    base, position, next_offset, _ = (int(x) for x in (directory / ACTIVE_CHECKPOINT).read_text().split())
    segment = log._segments[log._segment_index(base)]
    offsets = segment.index.count_below(position)
    times = segment.time_index.count_below(next_offset - base)
    assert (directory / f"{base:020d}.index").read_bytes() == segment.index.encode(0, offsets)
    assert (directory / f"{base:020d}.timeindex").read_bytes() == segment.time_index.encode(0, times)
    return position, next_offset


def test_checkpoints_append_to_the_index_files_what_they_lack(tmp_log, tmp_path):
    """Claim (the Kafka write benchmark's profile: each checkpoint rewrote both index files,
    5 ms of held GIL per MiB half-way through a segment): a checkpoint writes only the
    entries since the last one, in place, and the files stay what a whole rewrite writes;
    after a crash the newest checkpoint is trusted."""
    log = tmp_log(CHECKPOINTED)
    index_file = tmp_path / "p0" / f"{0:020d}.index"
    inodes = set()
    for round_ in range(6):
        for i in range(40):
            log.append_as_leader(batch(3, ts=1_000 + 40 * round_ + i, tag=f"r{round_}-{i}"), leader_epoch=0)
        log.flush()
        _index_files_hold_the_checkpoints_prefix(log, tmp_path / "p0")
        inodes.add(index_file.stat().st_ino)
    assert len(inodes) == 1, "the first checkpoint replaces the file; the next ones write into it"
    position, next_offset = _index_files_hold_the_checkpoints_prefix(log, tmp_path / "p0")
    assert next_offset == 720
    full = read_all(log)
    crash(log)
    log = tmp_log(CHECKPOINTED)
    assert log.recovered_bytes_trusted == position
    assert read_all(log) == full
    assert log.offset_for_timestamp(1_100) == (300, 1_100)


def test_checkpoints_after_truncations_and_reopens_keep_the_index_files_whole(tmp_log, tmp_path):
    """Claim: a truncation or a reopen makes the next checkpoint rewrite the index files (what
    they held no longer fits), so checkpoints written after any mix of appends, truncations,
    crashes and reopens leave files that equal a whole rewrite, and a crash resumes from them."""
    import random
    log = tmp_log(CHECKPOINTED)
    for i in range(40):
        log.append_as_leader(batch(3, tag=f"a{i}"), leader_epoch=0)
    log.flush()
    log.truncate_to(60)
    for i in range(60):  # past the old checkpoint's entries, with other batch sizes, before a flush
        log.append_as_leader(batch(1, tag=f"b{i}", size=90), leader_epoch=1)
    log.flush()
    _index_files_hold_the_checkpoints_prefix(log, tmp_path / "p0")

    rng = random.Random(18)
    epoch, truncations = 1, 0
    for step in range(80):
        choice = rng.random()
        if choice < 0.6:
            for i in range(rng.randint(1, 30)):
                log.append_as_leader(batch(rng.randint(1, 4), ts=1_000 + step, tag=f"s{step}-{i}"), leader_epoch=epoch)
        elif choice < 0.8 and log.log_end_offset > 10:
            truncations += 1
            epoch += 1
            log.truncate_to(rng.randint(log.log_end_offset // 2, log.log_end_offset - 1))
        elif choice < 0.9:
            full = read_all(log)
            crash(log)
            log = tmp_log(CHECKPOINTED)
            assert read_all(log) == full
        if rng.random() < 0.4:
            continue  # a truncation's log grows back past its old checkpoint before the next flush
        log.flush()
        if (tmp_path / "p0" / ACTIVE_CHECKPOINT).exists():
            _index_files_hold_the_checkpoints_prefix(log, tmp_path / "p0")
    assert truncations > 5
    log.flush()
    full = read_all(log)
    crash(log)
    log = tmp_log(CHECKPOINTED)
    assert log.recovered_bytes_trusted > 0 and read_all(log) == full


def test_a_checkpoint_at_the_segments_end_keeps_the_segment_when_only_a_torn_tail_follows(tmp_log, tmp_path):
    """Regression (the crash test): with the checkpoint at the very end of the active segment,
    recovery validates no batch after it; cutting a torn tail must not take the segment for
    an empty one and delete it with every offset the checkpoint holds."""
    config = LogConfig(segment_bytes=2048, index_interval_bytes=256, segment_ms=None, retention_ms=None,
                       checkpoint_interval_offsets=3)
    log = tmp_log(config)
    for i in range(40):
        log.append_as_leader(batch(3, tag=f"e{i}"), leader_epoch=0)
    log.flush()
    bases = log.segment_base_offsets
    assert len(bases) > 1
    full = read_all(log)
    crash(log)
    with open(tmp_path / "p0" / f"{bases[-1]:020d}.log", "ab") as f:
        f.write(b"torn tail")
    log = tmp_log(config)
    assert log.recovered_bytes_trusted > 0 and log.recovered_bytes_cut == 9
    assert log.log_end_offset == 120 and read_all(log) == full
    assert log.segment_base_offsets == bases


def test_a_truncation_drops_the_checkpoint_and_a_bad_one_falls_back_to_a_full_recovery(tmp_log, tmp_path):
    """Claim: a checkpoint never outlives a truncation that cut below it (the log grows back
    with other batches), and index files that do not fit it make the open validate all."""
    log = tmp_log(CHECKPOINTED)
    for i in range(40):
        log.append_as_leader(batch(3, tag=f"a{i}"), leader_epoch=0)
    log.flush()
    assert (tmp_path / "p0" / ACTIVE_CHECKPOINT).exists()
    assert log.truncate_to(30) == 30
    assert not (tmp_path / "p0" / ACTIVE_CHECKPOINT).exists()
    for i in range(50):
        log.append_as_leader(batch(1, tag=f"b{i}", size=10), leader_epoch=1)
    full = read_all(log)
    crash(log)
    log = tmp_log(CHECKPOINTED)
    assert log.recovered_bytes_trusted == 0 and read_all(log) == full
    for i in range(40):
        log.append_as_leader(batch(3, tag=f"c{i}"), leader_epoch=1)
    log.flush()
    full = read_all(log)
    crash(log)
    (tmp_path / "p0" / f"{0:020d}.index").write_bytes(b"\xff" * 16)  # not sane
    log = tmp_log(CHECKPOINTED)
    assert log.recovered_bytes_trusted == 0 and read_all(log) == full


def test_clean_shutdown_marker_is_removed_while_open(tmp_log, tmp_path):
    log = tmp_log()
    log.append_as_leader(batch(), leader_epoch=0)
    log.close()
    assert (tmp_path / "p0" / CLEAN_SHUTDOWN).exists()
    log = tmp_log()
    assert not (tmp_path / "p0" / CLEAN_SHUTDOWN).exists()


def test_unflushed_writes_are_not_flushed_until_flush(tmp_log):
    log = tmp_log()
    log.append_as_leader(batch(), leader_epoch=0)
    assert (log.log_end_offset, log.flushed_offset) == (3, 0)
    assert log.flush() == 3
    log.append_as_leader(batch(), leader_epoch=0)
    assert (log.log_end_offset, log.flushed_offset) == (6, 3)
    log.truncate_to(3)
    assert log.flushed_offset == 3


def test_flush_from_another_thread_while_appending(tmp_log):
    """flush() runs its fsyncs outside the append lock: a flushing thread and an
    appending thread interleave, flushed_offset only grows and never passes the end."""
    import threading

    log = tmp_log()
    stop = threading.Event()
    seen: list[tuple[int, int]] = []

    def flusher():
        while not stop.is_set():
            flushed = log.flush()
            seen.append((flushed, log.log_end_offset))

    thread = threading.Thread(target=flusher)
    thread.start()
    try:
        for i in range(150):
            log.append_as_leader(batch(3, tag=f"t{i}"), leader_epoch=i // 50)
    finally:
        stop.set()
        thread.join()
    assert seen
    assert all(flushed <= end for flushed, end in seen)
    assert [f for f, _ in seen] == sorted(f for f, _ in seen)
    assert log.flush() == log.log_end_offset == 450
    assert [o for o, _ in read_all(log)] == list(range(450))


# ---------------------------------------------------------------- lock


def test_second_open_fails_clearly_while_another_process_holds_it(tmp_path):
    directory = tmp_path / "locked"
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys, time
            from dataplane.log import PartitionLog
            log = PartitionLog({str(directory)!r})
            print("open", flush=True)
            sys.stdin.read()
        """)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        assert holder.stdout.readline().strip() == "open"
        with pytest.raises(StorageError) as err:
            PartitionLog(str(directory))
        assert str(directory) in str(err.value)
        assert f"process {holder.pid}" in str(err.value)
    finally:
        holder.kill()
        holder.wait()
    PartitionLog(str(directory)).close()  # the kernel released the dead holder's lock


def test_second_open_in_same_process_fails(tmp_log):
    tmp_log()
    with pytest.raises(StorageError, match="already open"):
        tmp_log()


# ---------------------------------------------------------------- full disk


def _failing_pwrite(real, *, fail_after_calls: int = 0, partial: bool = True):
    calls = {"n": 0}

    def pwrite(fd, data, position):
        calls["n"] += 1
        if calls["n"] > fail_after_calls:
            if partial and len(data) > 1:
                real(fd, bytes(memoryview(data)[:len(data) // 2]), position)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data, position)
    return pwrite


def test_disk_full_append_fails_cleanly_and_log_stays_consistent(tmp_log, monkeypatch):
    log = tmp_log(LogConfig(segment_bytes=1 << 20))
    for i in range(5):
        log.append_as_leader(batch(3, tag=f"d{i}"), leader_epoch=0)
    before = read_all(log)
    size_before = log.size_bytes
    monkeypatch.setattr(os, "pwrite", _failing_pwrite(os.pwrite))
    with pytest.raises(StorageError, match="disk full") as err:
        log.append_as_leader(batch(3), leader_epoch=0)
    assert "log_end_offset is still 15" in str(err.value)
    assert log.log_end_offset == 15 and log.size_bytes == size_before
    assert os.path.getsize(log._segments[-1].log_path) == size_before
    monkeypatch.undo()
    assert read_all(log) == before
    assert log.append_as_leader(batch(3, tag="ok"), leader_epoch=0).base_offset == 15
    log.close()
    log = tmp_log(LogConfig(segment_bytes=1 << 20))
    assert [o for o, _ in read_all(log)] == list(range(18))


def test_disk_full_during_an_append_that_rolls_undoes_both_segments(tmp_log, monkeypatch):
    log = tmp_log()
    for i in range(4):
        log.append_as_leader(batch(3, tag=f"d{i}"), leader_epoch=0)
    before, bases = read_all(log), log.segment_base_offsets
    many = b"".join(batch(3, tag=f"m{i}") for i in range(12))  # spans a roll
    # The first pwrite (into the old segment) succeeds, the one after the roll fails.
    monkeypatch.setattr(os, "pwrite", _failing_pwrite(os.pwrite, fail_after_calls=1))
    with pytest.raises(StorageError, match="disk full"):
        log.append_as_leader(many, leader_epoch=1)
    monkeypatch.undo()
    assert read_all(log) == before and log.segment_base_offsets == bases
    assert log.epoch_entries()[-1].epoch == 0
    assert log.append_as_leader(many, leader_epoch=1).base_offset == 12


def test_disk_full_while_recording_a_new_epoch_appends_nothing(tmp_log, monkeypatch):
    log = tmp_log()
    log.append_as_leader(batch(), leader_epoch=0)
    monkeypatch.setattr(os, "pwrite", _failing_pwrite(os.pwrite, partial=False))
    with pytest.raises(StorageError, match="disk full"):
        log.append_as_leader(batch(), leader_epoch=1)
    monkeypatch.undo()
    assert log.log_end_offset == 3 and log.latest_epoch == 0


# ---------------------------------------------------------------- MemoryLog


def test_memory_log_crash_drops_unflushed_batches_and_epochs():
    log = MemoryLog()
    assert isinstance(log, Log)
    log.append_as_leader(batch(), leader_epoch=1)
    log.flush()
    log.append_as_leader(batch(), leader_epoch=2)
    assert (log.log_end_offset, log.flushed_offset) == (6, 3)
    log.crash()
    assert (log.log_end_offset, log.flushed_offset) == (3, 3)
    assert [(e.epoch, e.start_offset) for e in log.epoch_entries()] == [(1, 0)]
    assert log.append_as_leader(batch(), leader_epoch=3).base_offset == 3


def test_memory_log_matches_disk_log_on_one_script(tmp_log):
    config = LogConfig(segment_bytes=2048, index_interval_bytes=256, segment_ms=5000,
                       retention_ms=None, retention_bytes=4000)
    disk, memory = tmp_log(config), MemoryLog(config=config)
    assert isinstance(disk, Log)
    for log in (disk, memory):
        for i in range(30):
            log.append_as_leader(batch(3, ts=1000 * i, tag=f"x{i}"), leader_epoch=i // 10)
        log.truncate_to(50)
        log.roll()
        log.append_as_leader(batch(2), leader_epoch=7)
        log.apply_retention(now_ms=10**6)
    assert disk.segment_base_offsets == memory.segment_base_offsets
    assert read_all(disk) == read_all(memory)
    assert disk.epoch_entries() == memory.epoch_entries()
    for offset in range(disk.log_start_offset, disk.log_end_offset):
        a, b = disk.read(offset, max_bytes=300), memory.read(offset, max_bytes=300)
        assert (a.records, a.first_offset, a.next_offset) == (b.records, b.first_offset, b.next_offset)


# ---------------------------------------------------------------- FlushCoalescer


def test_coalescer_shares_one_flush_between_many_waiters(tmp_log):
    log = tmp_log()

    async def scenario():
        flusher = FlushCoalescer(log, debounce_ms=5)
        waits = []
        for _ in range(20):
            info = log.append_as_leader(batch(), leader_epoch=0)
            waits.append(asyncio.ensure_future(flusher.flush_to(info.last_offset + 1)))
        results = await asyncio.gather(*waits)
        await flusher.close()
        return results, flusher.flush_count

    results, flush_count = asyncio.run(scenario())
    assert flush_count == 1
    assert set(results) == {60} and log.flushed_offset == 60


def test_coalescer_propagates_a_flush_error_to_every_waiter():
    class FailingLog(MemoryLog):
        def flush(self) -> int:
            raise StorageError("disk full: flush failed")

    log = FailingLog()
    log.append_as_leader(batch(), leader_epoch=0)

    async def scenario():
        flusher = FlushCoalescer(log, debounce_ms=1)
        waits = [asyncio.ensure_future(flusher.flush_to(o)) for o in (1, 2, 3)]
        outcomes = await asyncio.gather(*waits, return_exceptions=True)
        with pytest.raises(Exception, match="past log_end_offset 3"):
            await flusher.flush_to(4)
        await flusher.close()
        return outcomes

    outcomes = asyncio.run(scenario())
    assert [type(o) for o in outcomes] == [StorageError] * 3


def test_coalescer_fails_waiters_whose_offsets_were_truncated():
    log = MemoryLog()
    log.append_as_leader(batch(), leader_epoch=0)

    async def scenario():
        flusher = FlushCoalescer(log, debounce_ms=20)
        waiter = asyncio.ensure_future(flusher.flush_to(3))
        await asyncio.sleep(0)
        log.truncate_to(0)
        return await asyncio.gather(waiter, return_exceptions=True)

    [outcome] = asyncio.run(scenario())
    assert isinstance(outcome, LogTruncatedError)


def test_flush_cost_counts_the_bytes_since_the_last_flush_and_is_unknown_across_files(tmp_log):
    """Claim: flush_cost_bytes is the bytes appended to the active segment since the last
    flush began; None while a flush would have to fsync more (a new segment and the directory,
    a new epoch's checkpoint, or a checkpoint due)."""
    config = LogConfig(segment_bytes=1 << 20, index_interval_bytes=256, segment_ms=None, retention_ms=None,
                       checkpoint_interval_bytes=1 << 20, checkpoint_interval_offsets=1 << 20)
    log = tmp_log(config)
    log.append_as_leader(batch(), leader_epoch=0)
    log.flush()          # the first flush also fsyncs the new directory and writes a checkpoint
    assert log.flush_cost_bytes == 0
    one = batch(2)
    log.append_as_leader(one, leader_epoch=0)
    log.append_as_leader(one, leader_epoch=0)
    assert log.flush_cost_bytes == 2 * len(one)
    log.flush()
    assert log.flush_cost_bytes == 0
    log.append_as_leader(one, leader_epoch=0)
    log.roll()
    assert log.flush_cost_bytes is None      # two files and the directory
    log.flush()
    log.append_as_leader(one, leader_epoch=0)
    assert log.flush_cost_bytes == len(one)  # a new segment's first checkpoint waits for its interval too
    log.append_as_leader(one, leader_epoch=1)
    assert log.flush_cost_bytes is None      # a new epoch: the epoch checkpoint and the directory


def test_a_log_under_a_locked_parent_locks_in_process_and_holds_no_file_for_it(tmp_path):
    """A broker holds its data directory's lock; each partition log under it then locks
    itself in the process (a second open in the process fails as before) with no descriptor
    held: a broker with 10,000 replicas spent 10,000 descriptors on locks and ran out at this
    machine's limit of 20,000. A failed open leaves the directory free, as with the file lock."""
    directory = str(tmp_path / "t-0")

    def open_fds() -> set[str]:
        return {os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
                if os.path.exists(f"/proc/self/fd/{fd}")}
    log = PartitionLog(directory, parent_locked=True)
    held = open_fds()
    assert not any(path.endswith("/.lock") and path.startswith(directory) for path in held), held
    with pytest.raises(StorageError, match="already open in this process"):
        PartitionLog(directory, parent_locked=True)
    log.close()
    again = PartitionLog(directory, parent_locked=True)
    again.close()
    failing = str(tmp_path / "t-1")

    def fail(self):
        raise OSError(errno.EIO, "Input/output error")
    real_open = PartitionLog._open
    PartitionLog._open = fail   # type: ignore[method-assign]
    try:
        with pytest.raises(OSError):
            PartitionLog(failing, parent_locked=True)
    finally:
        PartitionLog._open = real_open   # type: ignore[method-assign]
    PartitionLog(failing, parent_locked=True).close()   # the failed open left the lock free
