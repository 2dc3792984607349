"""Random operation sequences on PartitionLog and MemoryLog against a plain list model.

Claim: after any sequence of appends (new or same epoch), flushes, truncations,
rolls, retention, clean restarts and killed-process restarts, both logs hold
exactly the model's records at the model's offsets, agree on segment layout,
and their epoch caches answer like the epochs derived from the model's records.
Hypothesis prints the failing sequence; `derandomize=True` makes runs reproducible.
"""
from __future__ import annotations

import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.batch import build_batch, iter_batches, read_records
from dataplane.log import LogConfig, MemoryLog, PartitionLog

CONFIG = LogConfig(segment_bytes=1024, index_interval_bytes=128, segment_ms=None,
                   retention_ms=None, retention_bytes=2500)

ops = st.lists(st.one_of(
    st.tuples(st.just("append"), st.integers(1, 3), st.integers(1, 4), st.booleans()),
    st.tuples(st.just("truncate"), st.floats(0, 1)),
    st.tuples(st.just("flush")),
    st.tuples(st.just("roll")),
    st.tuples(st.just("retention")),
    st.tuples(st.just("restart")),
    st.tuples(st.just("kill")),
), max_size=30)


def read_all(log) -> list[tuple[int, bytes, int]]:
    out, offset = [], log.log_start_offset
    while offset < log.log_end_offset:
        result = log.read(offset, max_bytes=700)
        assert result.records and result.first_offset == offset
        for pos, header in iter_batches(result.records):
            out += [(r.offset, r.value, header.leader_epoch) for r in read_records(result.records, pos)]
        offset = result.next_offset
    return out


def epochs_of(model: list[tuple[int, bytes, int]]) -> list[tuple[int, int]]:
    entries: list[tuple[int, int]] = []
    for offset, _, epoch in model:
        if not entries or epoch > entries[-1][0]:
            entries.append((epoch, offset))
    return entries


def kill(log: PartitionLog) -> None:
    for segment in log._segments:
        segment.close()
    log._dir_lock.release()
    log._closed = True


@pytest.mark.slow
@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(ops)
def test_logs_match_a_list_model(sequence):
    with tempfile.TemporaryDirectory() as directory:
        disk = PartitionLog(directory, config=CONFIG)
        memory = MemoryLog(config=CONFIG)
        model: list[tuple[int, bytes, int]] = []
        epoch, counter = 0, 0
        try:
            for op in sequence:
                kind = op[0]
                if kind == "append":
                    _, batches, records, bump = op
                    epoch += bump
                    data, vals = b"", []
                    for _ in range(batches):
                        chunk = [f"r{counter + i}".encode() * 8 for i in range(records)]
                        data += build_batch(chunk, timestamp_ms=counter)
                        vals += chunk
                        counter += records
                    first = disk.log_end_offset
                    info = disk.append_as_leader(data, leader_epoch=epoch)
                    assert memory.append_as_leader(data, leader_epoch=epoch) == info
                    assert info.base_offset == first
                    model += [(first + i, v, epoch) for i, v in enumerate(vals)]
                elif kind == "truncate":
                    target = round(op[1] * disk.log_end_offset)
                    end = disk.truncate_to(target)
                    assert memory.truncate_to(target) == end
                    assert end <= max(target, disk.log_start_offset)
                    model = [r for r in model if r[0] < end]
                elif kind == "flush":
                    assert disk.flush() == memory.flush() == disk.log_end_offset
                elif kind == "roll":
                    disk.roll()
                    memory.roll()
                elif kind == "retention":
                    deleted = disk.apply_retention(now_ms=0)
                    assert memory.apply_retention(now_ms=0) == deleted
                    model = [r for r in model if r[0] >= disk.log_start_offset]
                elif kind in ("restart", "kill"):
                    if kind == "restart":
                        disk.close()
                    else:
                        kill(disk)
                    disk = PartitionLog(directory, config=CONFIG)
                    assert disk.flushed_offset == disk.log_end_offset
                    memory.flush()  # a killed process loses nothing the OS already has

                assert disk.segment_base_offsets == memory.segment_base_offsets
                assert disk.log_end_offset == memory.log_end_offset
                assert disk.log_start_offset <= disk.flushed_offset <= disk.log_end_offset
                assert read_all(disk) == model == read_all(memory)
                derived = epochs_of(model)
                cached = [(e.epoch, e.start_offset) for e in disk.epoch_entries()]
                assert cached == [(e.epoch, e.start_offset) for e in memory.epoch_entries()]
                # An emptied log keeps the epoch covering its start, as Kafka's cache does.
                assert cached == derived or (not model and len(cached) <= 1)
                for e, _ in derived:
                    assert disk.end_offset_for_epoch(e) == memory.end_offset_for_epoch(e)
        finally:
            disk.close()
