"""Producer-state snapshots (dataplane/log/producer_snapshots.py) and loading a table from
a snapshot plus the log past it (dataplane/broker/producer_state.py)."""
from __future__ import annotations

import logging
import os
import random

import pytest

from common.batch import build_batch, iter_batches
from dataplane.broker.producer_state import load_table
from dataplane.log import LogConfig, PartitionLog
from dataplane.log.producer_snapshots import ProducerSnapshots, decode, encode, snapshot_name
from dataplane.replica.producer_state import ProducerStateTable

SMALL = LogConfig(segment_bytes=4096, index_interval_bytes=256, segment_ms=None, retention_ms=None)


def producer_batch(pid: int, seq: int, offset: int, *, count: int = 1, epoch: int = 0) -> bytes:
    return build_batch([b"v" * 20] * count, timestamp_ms=1_000 + offset, producer_id=pid, producer_epoch=epoch,
                       base_sequence=seq, base_offset=offset, leader_epoch=0)


def fill(log: PartitionLog, writes: list[tuple[int, int]], table: ProducerStateTable | None = None) -> None:
    """Append one batch per (producer id, sequence); record it in `table` too if given."""
    for pid, seq in writes:
        records = producer_batch(pid, seq, log.log_end_offset)
        log.append_as_follower(records)
        if table is not None:
            for _, h in iter_batches(records):
                table.record(h, base_offset=h.base_offset)


def snapshot_now(log: PartitionLog, table: ProducerStateTable) -> int:
    snapshots = log.producer_snapshots
    assert snapshots.write(log.log_end_offset, table.snapshot_entries(), generation=snapshots.generation)
    return log.log_end_offset


def full_rebuild(log: PartitionLog) -> list:
    t = ProducerStateTable()
    t.rebuild(log)
    return t.snapshot_entries()


def test_encode_decode_round_trip_and_every_check(tmp_path):
    """Claim: a snapshot decodes to what was encoded; bad magic, a flipped byte (CRC), a wrong
    offset and a short file each raise CorruptSnapshotError."""
    entries = [[7, 1, 1234, [[0, 2, 10, 12], [3, 3, 13, 13]]], [9, 0, 99, [[0, 0, 5, 5]]]]
    data = encode(13, entries)
    assert decode(data, offset=13) == entries
    flipped = bytearray(data)
    flipped[-3] ^= 0x01
    for bad, offset, what in ((b"XXXX" + data[4:], 13, "magic"), (bytes(flipped), 13, "crc32c"),
                              (data, 14, "offset"), (data[:10], 13, "shorter")):
        with pytest.raises(ValueError, match=what):
            decode(bad, offset=offset)


def test_write_then_load_newest_at_or_below_and_kept_max(tmp_path):
    """Claim: load(x) gives the newest snapshot at or below x (never one above it); only the
    newest kept_max files stay."""
    s = ProducerSnapshots(str(tmp_path), kept_max=3)
    for offset in (10, 20, 30, 40):
        assert s.write(offset, [[offset, 0, 0, []]], generation=s.generation)
    assert s.offsets() == [20, 30, 40]
    assert not os.path.exists(tmp_path / snapshot_name(10))
    assert s.load(35) == (30, [[30, 0, 0, []]])
    assert s.load(40)[0] == 40
    assert s.load(19) is None
    # A fresh instance (a reopened log) finds the same files.
    assert ProducerSnapshots(str(tmp_path)).offsets() == [20, 30, 40]


def test_a_corrupt_snapshot_is_logged_once_set_aside_and_the_older_one_used(tmp_path, caplog):
    """Claim: a snapshot whose bytes changed is detected by its CRC, logged once, renamed to
    .corrupt (not lost) and skipped in favour of the next older one."""
    s = ProducerSnapshots(str(tmp_path))
    s.write(10, [[1, 0, 0, []]], generation=s.generation)
    s.write(20, [[2, 0, 0, []]], generation=s.generation)
    path = tmp_path / snapshot_name(20)
    data = bytearray(path.read_bytes())
    data[-2] ^= 0xFF
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="biplane.log.producer_snapshots"):
        assert s.load(25) == (10, [[1, 0, 0, []]])
        assert s.load(25) == (10, [[1, 0, 0, []]])
    warnings = [r for r in caplog.records if getattr(r, "event", "") == "log.producer_snapshot_corrupt"]
    assert len(warnings) == 1
    assert os.path.exists(str(path) + ".corrupt") and not path.exists()
    assert s.offsets() == [10] and s.corrupt_found == 1


def test_a_write_that_raced_a_truncation_is_dropped(tmp_path):
    """Claim: a table captured before a truncation is not installed after it (it may describe
    batches the truncation removed)."""
    s = ProducerSnapshots(str(tmp_path))
    generation = s.generation
    s.delete_above(5)
    assert s.write(10, [], generation=generation) is False
    assert s.offsets() == [] and not os.path.exists(tmp_path / snapshot_name(10))
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]


def test_truncation_deletes_snapshots_above_the_point_and_open_those_above_the_end(tmp_path):
    """Claim: truncate_to(T) removes every snapshot above T and keeps the rest; reopening removes
    a snapshot above the log end (written before a crash cut the tail); truncate_fully removes
    them all, even one at the new start offset."""
    log = PartitionLog(str(tmp_path / "p"), config=SMALL)
    table = ProducerStateTable()
    fill(log, [(1, i) for i in range(10)], table)
    at10 = snapshot_now(log, table)
    fill(log, [(1, i) for i in range(10, 20)], table)
    at20 = snapshot_now(log, table)
    log.truncate_to(15)
    assert log.producer_snapshots.offsets() == [at10]
    # A snapshot past the end (as after a crash that cut an unflushed tail).
    log.producer_snapshots.write(40, [], generation=log.producer_snapshots.generation)
    log.close()
    log = PartitionLog(str(tmp_path / "p"), config=SMALL)
    assert log.producer_snapshots.offsets() == [at10]
    assert at20 == 20
    log.truncate_fully_and_start_at(10)
    assert log.producer_snapshots.offsets() == []
    log.close()


def test_load_reads_the_log_tail_past_the_snapshot(tmp_path):
    """Claim: producers that wrote only after the snapshot are in the loaded table, and the
    scan starts at the snapshot (it fails if the tail past the snapshot is not read, or if
    the whole log is read anyway)."""
    log = PartitionLog(str(tmp_path / "p"), config=SMALL)
    table = ProducerStateTable()
    fill(log, [(1, i) for i in range(30)], table)
    at = snapshot_now(log, table)
    fill(log, [(2, 0), (2, 1), (1, 30)])
    loaded = ProducerStateTable()
    info = load_table(loaded, log, log.log_end_offset)
    assert (info.snapshot_offset, info.scan_start_offset) == (at, at)
    assert 2 in loaded.producers and loaded.producers[1].last_sequence == 30
    assert loaded.snapshot_entries() == full_rebuild(log)
    log.close()


def test_a_stale_snapshot_above_the_truncation_point_is_not_used(tmp_path):
    """Claim: after a truncation below a snapshot, the table is what the log says: the snapshot
    above the point is neither loaded (load takes at-or-below only) nor kept (deleted)."""
    log = PartitionLog(str(tmp_path / "p"), config=SMALL)
    table = ProducerStateTable()
    fill(log, [(1, i) for i in range(10)], table)
    low = snapshot_now(log, table)
    fill(log, [(1, 10), (3, 0), (3, 1)], table)
    high = snapshot_now(log, table)
    assert 3 in dict((e[0], e) for e in table.snapshot_entries())
    # Bypass the deletion: the loader alone must not pick a snapshot above its point.
    loaded = ProducerStateTable()
    info = load_table(loaded, log, low + 1)
    assert info.snapshot_offset == low and 3 not in loaded.producers
    # The real path: truncate, then load at the new end; then the log grows back past `high`.
    log.truncate_to(low + 1)
    assert high not in log.producer_snapshots.offsets()
    fill(log, [(4, 0)] * 1 + [(4, 1), (4, 2)])
    loaded = ProducerStateTable()
    info = load_table(loaded, log, log.log_end_offset)
    assert info.snapshot_offset == low
    assert 3 not in loaded.producers and loaded.producers[1].last_sequence == 10
    assert loaded.snapshot_entries() == full_rebuild(log)
    log.close()


def test_a_corrupt_snapshot_falls_back_to_the_whole_log(tmp_path):
    """Claim: with its only snapshot corrupt, loading rebuilds from the whole log, same table."""
    log = PartitionLog(str(tmp_path / "p"), config=SMALL)
    table = ProducerStateTable()
    fill(log, [(1, i) for i in range(12)], table)
    at = snapshot_now(log, table)
    path = os.path.join(log.directory, snapshot_name(at))
    with open(path, "r+b") as f:
        f.seek(20)
        f.write(b"\x00\x00\x00")
    loaded = ProducerStateTable()
    info = load_table(loaded, log, log.log_end_offset)
    assert (info.snapshot_offset, info.scan_start_offset) == (-1, log.log_start_offset)
    assert loaded.snapshot_entries() == table.snapshot_entries() == full_rebuild(log)
    log.close()


@pytest.mark.parametrize("seed", range(8))
def test_snapshot_plus_tail_equals_a_full_rebuild(tmp_path, seed):
    """Claim (oracle): for random writes of many producers (new epochs too), snapshots at random
    points and a truncation at a random point, the loaded table equals a scan of the whole log,
    least-recently-written order included."""
    rng = random.Random(seed)
    log = PartitionLog(str(tmp_path / "p"), config=SMALL)
    table = ProducerStateTable(producers_max=20)
    seqs: dict[int, tuple[int, int]] = {}
    for _ in range(300):
        pid = rng.randrange(40)
        epoch, seq = seqs.get(pid, (0, 0))
        if rng.random() < 0.05:
            epoch, seq = epoch + 1, 0
        count = rng.randint(1, 3)
        records = producer_batch(pid, seq, log.log_end_offset, count=count, epoch=epoch)
        log.append_as_follower(records)
        for _, h in iter_batches(records):
            table.record(h, base_offset=h.base_offset)
        seqs[pid] = (epoch, seq + count)
        if rng.random() < 0.05:
            snapshot_now(log, table)
    point = rng.randrange(log.log_start_offset + 1, log.log_end_offset)
    log.truncate_to(point)
    loaded = ProducerStateTable(producers_max=20)
    info = load_table(loaded, log, log.log_end_offset)
    oracle = ProducerStateTable(producers_max=20)
    oracle.rebuild(log)
    assert loaded.snapshot_entries() == oracle.snapshot_entries(), f"seed={seed} snapshot={info.snapshot_offset}"
    log.close()
