"""Log compaction (dataplane/log/cleaner.py, PartitionLog.clean, MemoryLog.clean): the latest
record of every key survives, offsets never change, nothing at or above the bound is
touched, a crash at any step of a swap loses nothing, and the topic settings decide when."""
from __future__ import annotations

import random

import pytest
from hypothesis import given, settings, strategies as st

from common.batch import BatchBuilder, Compression, build_batch, iter_batches, read_records
from dataplane.log import Log, LogConfig, MemoryLog, PartitionLog
from dataplane.log.cleaner import (CompactionConfig, IoThrottle, OffsetMap, SegmentSummary, encode_runs,
                                   plan_clean)
from dataplane.log.log import CLEANED_SUFFIX, SWAP_SUFFIX

SMALL = LogConfig(segment_bytes=1024, index_interval_bytes=128, segment_ms=None, retention_ms=None)
EAGER = CompactionConfig(min_cleanable_dirty_ratio=0.0, delete_retention_ms=0)
BOUND_MAX = 2**62


def keyed(pairs: list[tuple[bytes | None, bytes | None]], *, ts: int = 1_000, **fields) -> bytes:
    builder = BatchBuilder(**fields)
    for key, value in pairs:
        builder.append(value, key=key, timestamp_ms=ts)
    return builder.build()


def records_of(log: Log, start: int | None = None, end: int | None = None):
    offset = log.log_start_offset if start is None else start
    end = log.log_end_offset if end is None else end
    out = []
    while offset < end:
        result = log.read(offset, max_bytes=1 << 20)
        assert result.records, offset
        for pos, _ in iter_batches(result.records):
            out += read_records(result.records, pos)
        offset = result.next_offset
    return out


def latest_by_key(records) -> dict[bytes, tuple[int, bytes | None]]:
    latest = {}
    for r in records:
        if r.key is not None:
            latest[r.key] = (r.offset, r.value)
    return latest


def crash(log: PartitionLog) -> None:
    """Drop the log as a killed process would: no flush, no marker; fds closed, lock gone."""
    for segment in log._segments:
        segment.close()
    log._dir_lock.release()
    log._closed = True


def fill(log: Log, writes: list[tuple[bytes | None, bytes | None]], *, per_batch: int = 3, ts: int = 1_000) -> None:
    for i in range(0, len(writes), per_batch):
        log.append_as_leader(keyed(writes[i:i + per_batch], ts=ts), leader_epoch=0)
    log.flush()


@pytest.fixture(params=["disk", "memory"])
def make_log(request, tmp_path):
    opened = []

    def make(config: LogConfig = SMALL, name: str = "p0") -> Log:
        log: Log = (PartitionLog(str(tmp_path / name), config=config) if request.param == "disk"
                    else MemoryLog(config=config))
        opened.append(log)
        return log
    yield make
    for log in opened:
        log.close()


# ---------------------------------------------------------------- pure decisions


def summary(base: int, end: int, size: int = 100, ts: int | None = 1_000, cleaned: int | None = None):
    return SegmentSummary(base_offset=base, next_offset=end, size_bytes=size, max_timestamp=ts,
                          cleaned_at_ms=cleaned)


def test_plan_never_takes_the_active_segment_nor_one_reaching_the_bound():
    segments = [summary(0, 10), summary(10, 20), summary(20, 30)]
    plan = plan_clean(segments, first_dirty_offset=0, bound_offset=100, now_ms=2_000, config=EAGER)
    assert plan is not None and [s.base_offset for s in plan.segments] == [0, 10]
    plan = plan_clean(segments, first_dirty_offset=0, bound_offset=19, now_ms=2_000, config=EAGER)
    assert plan is not None and [s.base_offset for s in plan.segments] == [0]
    assert plan_clean(segments, first_dirty_offset=0, bound_offset=9, now_ms=2_000, config=EAGER) is None
    assert plan_clean(segments[-1:], first_dirty_offset=0, bound_offset=100, now_ms=2_000, config=EAGER) is None


def test_plan_waits_for_the_dirty_ratio():
    """Dirty share of the cleanable bytes: 1 of 3 segments of equal size is 0.33."""
    segments = [summary(0, 10), summary(10, 20), summary(20, 30), summary(30, 31)]
    for ratio, due in ((0.3, True), (0.34, False)):
        config = CompactionConfig(min_cleanable_dirty_ratio=ratio)
        plan = plan_clean(segments, first_dirty_offset=20, bound_offset=100, now_ms=2_000, config=config)
        assert (plan is not None) is due, ratio
    assert plan_clean(segments, first_dirty_offset=30, bound_offset=100, now_ms=2_000, config=EAGER) is None


def test_plan_honours_the_compaction_lag_by_record_timestamps():
    segments = [summary(0, 10, ts=1_000), summary(10, 20, ts=5_000), summary(20, 21)]
    config = CompactionConfig(min_cleanable_dirty_ratio=0.0, min_compaction_lag_ms=2_000)
    plan = plan_clean(segments, first_dirty_offset=0, bound_offset=100, now_ms=4_000, config=config)
    assert plan is not None and [s.base_offset for s in plan.segments] == [0]
    assert plan_clean(segments, first_dirty_offset=0, bound_offset=100, now_ms=2_999, config=config) is None
    plan = plan_clean(segments, first_dirty_offset=0, bound_offset=100, now_ms=7_000, config=config)
    assert plan is not None and len(plan.segments) == 2


def test_a_batch_losing_records_becomes_one_batch_per_run_keeping_offsets_and_sequences():
    data = keyed([(b"a", b"1"), (b"b", b"2"), (b"c", b"3"), (b"d", b"4")], base_offset=10, producer_id=7,
                 producer_epoch=2, base_sequence=100, leader_epoch=3, compression=Compression.GZIP)
    header = next(iter_batches(data))[1]
    records = read_records(data)
    out = encode_runs(header, [records[0], records[2], records[3]])
    headers = [next(iter_batches(b))[1] for b in out]
    assert [(h.base_offset, h.record_count, h.base_sequence) for h in headers] == [(10, 1, 100), (12, 2, 102)]
    assert all((h.producer_id, h.producer_epoch, h.leader_epoch, h.compression) == (7, 2, 3, Compression.GZIP)
               for h in headers)
    assert [(r.offset, r.key, r.value) for b in out for r in read_records(b)] == \
        [(10, b"a", b"1"), (12, b"c", b"3"), (13, b"d", b"4")]


def test_offset_map_names_superseded_records_only():
    offset_map = OffsetMap(keys_max=10)
    records = read_records(keyed([(b"a", b"1"), (None, b"x"), (b"a", b"2")]))
    offset_map.add(records)
    assert [offset_map.superseded(r) for r in records] == [True, False, False]


def test_throttle_sleeps_as_long_as_the_pass_is_ahead_of_its_budget():
    now = [0.0]
    slept = []

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s
    throttle = IoThrottle(1000, clock=lambda: now[0], sleep=sleep)
    throttle(500)
    throttle(1500)
    assert slept == [0.5, 1.5] and now[0] == 2.0
    now[0] += 10.0  # idle: not banked
    throttle(1000)
    assert slept[-1] == pytest.approx(1.0)


# ---------------------------------------------------------------- the logs


def test_compaction_keeps_latest_per_key_offsets_and_the_bound(make_log):
    log = make_log()
    writes = [(f"k{i % 5}".encode(), f"v{i}".ljust(30, ".").encode()) for i in range(60)]
    fill(log, writes)
    before = records_of(log)
    end = log.log_end_offset
    bound = log.segment_base_offsets[-2]  # the last closed segment is not wholly below it
    result = log.clean(5_000, below_offset=bound, config=EAGER)
    assert result is not None and result.records_removed > 0
    after = records_of(log)
    assert log.log_end_offset == end and log.log_start_offset == 0
    assert [r for r in before if r.offset >= bound] == [r for r in after if r.offset >= bound]
    by_offset = {r.offset: r for r in before}
    assert all(by_offset[r.offset] == r for r in after)  # nothing renumbered or changed
    assert latest_by_key(after) == latest_by_key(before)
    assert len(after) < len(before)
    assert log.read(1, max_bytes=1 << 20).first_offset >= 1
    assert log.clean(5_000, below_offset=bound, config=EAGER) is None  # nothing new is dirty


def test_keyless_records_are_kept_and_tombstones_outlive_delete_retention(make_log):
    log = make_log()
    config = CompactionConfig(min_cleanable_dirty_ratio=0.0, delete_retention_ms=1_000)
    writes = [(b"gone", b"v".ljust(40, b".")), (None, b"keyless".ljust(40, b".")), (b"gone", None)]
    writes += [(f"k{i}".encode(), b"x".ljust(40, b".")) for i in range(40)]
    fill(log, writes, per_batch=1)
    bound = log.log_end_offset
    assert log.clean(10_000, below_offset=bound, config=config) is not None
    kept = records_of(log)
    assert (1, None) in [(r.offset, r.key) for r in kept]
    assert [r.offset for r in kept if r.key == b"gone"] == [2]  # the tombstone, not the value
    fill(log, [(f"k{i}".encode(), b"y".ljust(40, b".")) for i in range(40)], per_batch=1)
    log.roll()
    log.clean(10_500, below_offset=log.log_end_offset, config=config)
    assert [r.offset for r in records_of(log) if r.key == b"gone"] == [2]  # 500 ms after cleaning
    fill(log, [(f"k{i}".encode(), b"z".ljust(40, b".")) for i in range(40)], per_batch=1)
    log.roll()
    log.clean(11_001, below_offset=log.log_end_offset, config=config)
    assert [r.offset for r in records_of(log) if r.key == b"gone"] == []
    assert (1, None) in [(r.offset, r.key) for r in records_of(log)]


def test_the_last_batch_of_each_producer_stays_whole(make_log):
    log = make_log()
    for seq in range(0, 30, 3):
        log.append_as_leader(keyed([(b"a", b"1" * 40), (b"b", b"2" * 40), (b"a", b"3" * 40)], producer_id=9,
                                   producer_epoch=0, base_sequence=seq), leader_epoch=0)
    fill(log, [(b"a", b"4" * 40)] * 30)
    log.clean(5_000, below_offset=log.log_end_offset, config=EAGER)
    batches = [h for r in _reads(log) for _, h in iter_batches(r)]
    mine = [h for h in batches if h.producer_id == 9]
    assert mine[-1].base_sequence == 27 and mine[-1].record_count == 3


def _reads(log: Log):
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        result = log.read(offset, max_bytes=1 << 20)
        yield bytes(result.records)
        offset = result.next_offset


@settings(max_examples=40, deadline=None)
@given(ops=st.lists(st.tuples(st.integers(0, 7), st.booleans(), st.integers(1, 4)), min_size=5, max_size=80),
       seed=st.integers(0, 2**32 - 1), memory=st.booleans())
def test_property_latest_value_per_key_survives_any_writes_and_passes(tmp_path_factory, ops, seed, memory):
    """Random keyed writes (tombstones included), passes at random bounds in between: the
    latest record of every key below the bound is the one written, offsets only grow and
    stay where they were, and nothing at or above the bound changes."""
    rng = random.Random(seed)
    log: Log = MemoryLog(config=SMALL) if memory else PartitionLog(str(tmp_path_factory.mktemp("p")), config=SMALL)
    written: dict[int, tuple[bytes, bytes | None]] = {}
    try:
        for n, (key, tombstone, count) in enumerate(ops):
            pairs = [(f"k{(key + j) % 8}".encode(), None if tombstone and j == 0 else f"v{n}-{j}".encode() * 5)
                     for j in range(count)]
            info = log.append_as_leader(keyed(pairs, ts=n), leader_epoch=0)
            for j, pair in enumerate(pairs):
                written[info.base_offset + j] = pair  # type: ignore[assignment]
            if rng.random() < 0.3:
                log.flush()
                bound = rng.randint(log.log_start_offset, log.log_end_offset)
                before_bound = {r.offset: r for r in records_of(log) if r.offset >= bound}
                log.clean(10**6, below_offset=bound, config=CompactionConfig(
                    min_cleanable_dirty_ratio=rng.choice([0.0, 0.5]), delete_retention_ms=10**9))
                assert {r.offset: r for r in records_of(log) if r.offset >= bound} == before_bound
        log.flush()
        log.clean(10**6, below_offset=log.log_end_offset, config=EAGER)
        after = records_of(log)
        offsets = [r.offset for r in after]
        assert offsets == sorted(set(offsets))
        assert all((r.key, r.value) == written[r.offset] for r in after)
        expected = {}
        for offset in sorted(written):
            expected[written[offset][0]] = (offset, written[offset][1])
        assert latest_by_key(after) == expected
    finally:
        log.close()


# ---------------------------------------------------------------- crashes


@pytest.mark.parametrize("step", ["cleaned-written", "swap-renamed", "indexes-removed", "replaced",
                                  "swapped-all"])
def test_a_crash_at_each_step_of_a_swap_loses_nothing_and_the_log_opens(tmp_path, step):
    """Kill points inside PartitionLog.clean: after the .cleaned file is fsynced, after its
    rename to .swap, after the old indexes went, after the rename over the segment, and
    before the cleaner checkpoint. Reopened, the log holds every latest value, its offsets
    and end are as before, no .cleaned or .swap file is left, and a pass finishes the work."""
    directory = str(tmp_path / "p0")
    log = PartitionLog(directory, config=SMALL)
    fill(log, [(f"k{i % 4}".encode(), f"v{i}".ljust(40, ".").encode()) for i in range(80)])
    before = records_of(log)
    end = log.log_end_offset

    class Killed(Exception):
        pass

    def kill(at: str) -> None:
        if at == step:
            raise Killed(at)
    log.cleaner_kill_point = kill
    with pytest.raises(Exception) as exc:
        log.clean(5_000, below_offset=end, config=EAGER)
    assert "Killed" in repr(exc.value) or isinstance(exc.value, Killed)
    crash(log)
    reopened = PartitionLog(directory, config=SMALL)
    try:
        assert not [n for n in __import__("os").listdir(directory) if n.endswith((CLEANED_SUFFIX, SWAP_SUFFIX))]
        after = records_of(reopened)
        assert reopened.log_end_offset == end
        assert latest_by_key(after) == latest_by_key(before)
        by_offset = {r.offset: r for r in before}
        assert all(by_offset[r.offset] == r for r in after)
        reopened.clean(5_000, below_offset=end, config=EAGER)
        assert latest_by_key(records_of(reopened)) == latest_by_key(before)
        for offset in range(end):
            reopened.read(offset, max_bytes=1)  # every offset, removed or not, reads
    finally:
        reopened.close()


def test_indexes_of_a_cleaned_segment_serve_reads_time_lookups_and_reopen(tmp_path):
    directory = str(tmp_path / "p0")
    log = PartitionLog(directory, config=SMALL)
    for ts in range(1, 41):
        log.append_as_leader(keyed([(b"same", f"v{ts}".ljust(40, ".").encode())], ts=ts * 10), leader_epoch=0)
    log.flush()
    end = log.log_end_offset
    log.clean(5_000, below_offset=end, config=EAGER)
    kept = [r.offset for r in records_of(log)]
    assert len(kept) < 40
    for offset in range(end):
        first = log.read(offset, max_bytes=1).first_offset
        assert first == min(o for o in kept if o >= offset) or first <= offset
    found = log.offset_for_timestamp(55)
    assert found is not None and found[0] in kept and found[1] >= 55
    log.close()
    reopened = PartitionLog(directory, config=SMALL)
    assert [r.offset for r in records_of(reopened)] == kept
    reopened.close()


def test_a_segment_truncated_while_it_was_cleaned_is_left_alone(tmp_path):
    log = PartitionLog(str(tmp_path / "p0"), config=SMALL)
    fill(log, [(b"k", f"v{i}".ljust(40, ".").encode()) for i in range(60)])
    end = log.log_end_offset

    def truncate(at: str) -> None:
        if at == "cleaned-written":
            log.cleaner_kill_point = None
            log.truncate_to(3)
    log.cleaner_kill_point = truncate
    assert log.clean(5_000, below_offset=end, config=EAGER) is None
    assert log.log_end_offset == 3 and [r.offset for r in records_of(log)] == [0, 1, 2]
    log.close()


def test_build_batch_helper_is_plain():
    # A keyless batch reads back keyless: the cleaner keeps such records.
    assert read_records(build_batch([b"x"], timestamp_ms=1))[0].key is None


# ---------------------------------------------------------------- admission and replication


def test_a_keyless_record_is_refused_at_produce_on_a_compacted_topic_only():
    """Claim (admission.py): with keys_required (cleanup_policy has compact) a batch holding
    any record without a key is refused INVALID_RECORD, saying which and why, and nothing is
    appended; keyed records pass; a delete-policy topic takes keyless ones."""
    from dataplane.replica.events import ProduceRequest
    from test_replica_core import cluster, config

    nodes = cluster(config(keys_required=True))
    leader = nodes[1]
    end = leader.log.log_end_offset
    mixed = keyed([(b"k", b"v"), (None, b"no key")])
    leader.step(ProduceRequest(request_id=1, records=mixed, acks=1, timeout_ms=1000))
    refused = leader.released()[1]
    assert refused.error.name == "INVALID_RECORD" and refused.error.value == 87
    assert "has no key" in refused.reason and "compacted" in refused.reason
    assert leader.log.log_end_offset == end
    leader.step(ProduceRequest(request_id=2, records=keyed([(b"k", b"v")]), acks=1, timeout_ms=1000))
    assert leader.log.log_end_offset == end + 1
    plain = cluster(config())[1]
    plain.step(ProduceRequest(request_id=3, records=mixed, acks=1, timeout_ms=1000))
    assert plain.log.log_end_offset > end


def test_a_follower_copies_a_compacted_leader_across_its_gaps():
    """A follower fetching from offsets the leader's compaction removed gets the next batch
    and appends it at its own offset (a gap), ending with the leader's records."""
    from test_replica_core import Node, config, pump, state
    from dataplane.replica.events import NewMetadata, ProduceRequest

    leader = Node(1, log=MemoryLog(config=SMALL))
    leader.step(NewMetadata(partition=state(isr=(1,), replicas=(1,)), config=config(keys_required=True)))
    for i in range(40):
        leader.step(ProduceRequest(request_id=i, records=keyed([(b"k%d" % (i % 3), b"v" * 60)]), acks=-1,
                                   timeout_ms=1000))
    leader.log.roll()
    assert leader.log.clean(10**6, below_offset=leader.replica.high_watermark, config=EAGER) is not None
    follower = Node(2, log=MemoryLog(config=SMALL))
    everyone = state(isr=(1, 2), replicas=(1, 2), epoch=1, pepoch=2)
    for node in (leader, follower):
        node.step(NewMetadata(partition=everyone, config=config(keys_required=True)))
    pump({1: leader, 2: follower}, rounds=200, now_ms=0)
    assert follower.log.log_end_offset == leader.log.log_end_offset
    assert [(r.offset, r.value) for r in records_of(follower.log)] == \
        [(r.offset, r.value) for r in records_of(leader.log)]
