"""The broker's producer table in a real PartitionDriver (no processes): loaded from a
snapshot at open, rebuilt off the event loop after a truncation, snapshotted at segment
roll and at close; and the event-loop watchdog's accounting."""
from __future__ import annotations

import asyncio
import logging
import threading
import time

from common.batch import build_batch, iter_batches
from common.errors import ErrorCode
from common.eventloop import LoopStalls, LoopWatchdog
from dataplane.broker.partition import PartitionDriver, now_ms
from dataplane.log import LogConfig, PartitionLog
from dataplane.replica.events import FetchResponse, NewMetadata
from dataplane.replica.producer_state import ProducerStateTable
from dataplane.replica.state import PartitionState, ReplicationConfig

CONFIG = LogConfig(segment_bytes=64 * 1024, segment_ms=None, retention_ms=None)
PRODUCERS = 500
BATCHES = 6000


class Hooks:
    def __init__(self) -> None:
        self.fetches: list = []

    def send_fetch(self, leader_id, tp, request) -> None:
        self.fetches.append(request)

    def send_append_entries(self, *args) -> None: ...
    def propose_isr(self, *args) -> None: ...
    def report_election(self, *args) -> None: ...
    def refresh_metadata(self, *args) -> None: ...
    def partition_offline(self, *args) -> None: ...


def write_log(directory: str, *, producers: int = PRODUCERS, batches: int = BATCHES) -> None:
    """A log of `batches` one-record batches of `producers` idempotent producers (epoch 0)."""
    log = PartitionLog(directory, config=CONFIG)
    ts = int(time.time() * 1000)
    chunk = []
    for i in range(batches):
        pid = i % producers
        chunk.append(build_batch([b"x" * 30], timestamp_ms=ts, producer_id=100 + pid, producer_epoch=0,
                                 base_sequence=i // producers, base_offset=i, leader_epoch=0))
        if len(chunk) == 500:
            log.append_as_follower(b"".join(chunk))
            chunk = []
    if chunk:
        log.append_as_follower(b"".join(chunk))
    log.close()


def open_driver(directory: str, hooks: Hooks) -> PartitionDriver:
    return PartitionDriver(broker_id=1, tp=("t", 0), directory=directory, log_config=CONFIG, hooks=hooks,
                           unclean_start=False)


def follow(driver: PartitionDriver) -> None:
    """Make the replica a follower of broker 2 in epoch 1 (it sends its first fetch)."""
    driver.step(NewMetadata(partition=PartitionState(replicas=(1, 2), isr=(1, 2), leader=2, leader_epoch=1,
                                                     partition_epoch=1),
                            config=ReplicationConfig(), fenced_replicas=frozenset()))


def diverge(driver: PartitionDriver, end_offset: int) -> None:
    """The leader's answer: our last epoch ends at `end_offset` there; the core truncates to it."""
    epoch = driver.replica.last_epoch
    driver.step(FetchResponse(leader_id=2, leader_epoch=1, fetch_offset=driver.log.log_end_offset,
                              last_fetched_epoch=epoch, diverging_epoch=epoch, diverging_end_offset=end_offset))


def append_as_follower(driver: PartitionDriver, producer_ids: list[int], *, value: bytes = b"y") -> None:
    """A fetch answer from leader 2 (epoch 1) with one batch, sequence 0, per producer id."""
    end = driver.log.log_end_offset
    ts = int(time.time() * 1000)
    records = b"".join(build_batch([value], timestamp_ms=ts, producer_id=pid, producer_epoch=0, base_sequence=0,
                                   base_offset=end + i, leader_epoch=1) for i, pid in enumerate(producer_ids))
    driver.step(FetchResponse(leader_id=2, leader_epoch=1, fetch_offset=end, last_fetched_epoch=driver.replica.last_epoch,
                              records=records, high_watermark=0, log_end_offset=end + len(producer_ids)))
    assert driver.log.log_end_offset == end + len(producer_ids)


def oracle(directory_log: PartitionLog) -> list:
    t = ProducerStateTable()
    t.rebuild(directory_log)
    return t.snapshot_entries()


def test_rebuild_after_truncation_runs_in_a_worker_thread_from_the_snapshot(tmp_path):
    """Claim: after a truncation, the step that starts the rebuild returns with the table still
    loading (the scan is not on the event loop); the rebuild runs in another thread, starts
    from the newest snapshot at or below the point (not the log start), and ends with the
    table a full scan gives. Produce requests wait (parked) meanwhile instead of failing.
    The loop's longest stall is printed as a figure, not asserted."""
    directory = str(tmp_path / "t-0")
    write_log(directory)

    async def scenario() -> None:
        hooks = Hooks()
        loop = asyncio.get_running_loop()
        driver = await loop.run_in_executor(None, open_driver, directory, hooks)
        assert driver.producer_state.last_load is not None
        follow(driver)
        table = driver.producer_state
        snapshot_at = driver.log.log_end_offset
        assert await driver._write_snapshot()  # noqa: SLF001 - as at a segment roll
        # The log grows past the snapshot (new producers), then the leader cuts part of that.
        append_as_follower(driver, list(range(7000, 7020)))
        watchdog = LoopWatchdog(interval_ms=2, stall_warn_ms=10_000)
        watchdog.start()
        diverge(driver, snapshot_at + 5)
        assert driver.log.log_end_offset == snapshot_at + 5
        assert driver.log.producer_snapshots.offsets()[-1] == snapshot_at
        driver.tick(now_ms())  # the next step starts the rebuild
        assert table.loading, "the rebuild finished inside the step: it ran on the event loop"
        probe = build_batch([b"p"], timestamp_ms=0, producer_id=7001, producer_epoch=0, base_sequence=1)
        assert table.check(next(iter_batches(probe))[1]).error is ErrorCode.LEADER_NOT_AVAILABLE
        while table.loading:
            await asyncio.sleep(0.001)
        watchdog.stop()
        info = table.last_load
        assert info is not None and info.thread_name != threading.current_thread().name
        assert (info.snapshot_offset, info.scan_start_offset) == (snapshot_at, snapshot_at)
        assert info.scanned_bytes < driver.log.size_bytes // 10  # only the tail, not the log
        assert set(range(7000, 7005)) <= set(table.producers) and 7005 not in table.producers
        assert table.snapshot_entries() == oracle(driver.log)
        print(f"rebuild from snapshot {info.snapshot_offset}: {info.scanned_bytes} bytes read in "
              f"{info.elapsed_s * 1000:.1f} ms; loop stall max {watchdog.stalls.stall_max_ms:.1f} ms")
        await driver.close()

    asyncio.run(scenario())


def test_without_a_snapshot_the_whole_log_is_scanned_in_a_thread_and_appends_meanwhile_count(tmp_path):
    """Claim: with no snapshot the rebuild scans the whole log, still off the loop; batches the
    log gains while it runs (follower appends) end up in the table too."""
    directory = str(tmp_path / "t-0")
    write_log(directory, batches=3000)

    async def scenario() -> None:
        hooks = Hooks()
        driver = await asyncio.get_running_loop().run_in_executor(None, open_driver, directory, hooks)
        for offset in driver.log.producer_snapshots.offsets():
            driver.log.producer_snapshots.delete_above(offset - 1)
        follow(driver)
        end = driver.log.log_end_offset
        diverge(driver, end - 10)
        driver.tick(now_ms())
        table = driver.producer_state
        assert table.loading
        # A follower append while loading: a new producer the table must know afterwards.
        append_as_follower(driver, [9999])
        while table.loading:
            await asyncio.sleep(0.001)
        assert table.last_load is not None and table.last_load.snapshot_offset == -1
        assert table.last_load.thread_name != threading.current_thread().name
        assert 9999 in table.producers
        assert table.snapshot_entries() == oracle(driver.log)
        await driver.close()

    asyncio.run(scenario())


def test_segment_roll_and_clean_close_write_snapshots_and_reopen_reads_no_log(tmp_path):
    """Claim: a roll during appends writes a snapshot at the log end; a clean close writes one
    at the end, so reopening reads zero bytes of log and has the same table."""
    directory = str(tmp_path / "t-0")
    write_log(directory, batches=100)

    async def scenario() -> None:
        hooks = Hooks()
        loop = asyncio.get_running_loop()
        driver = await loop.run_in_executor(None, open_driver, directory, hooks)
        follow(driver)
        base = driver.log.active_segment_base_offset
        ts = int(time.time() * 1000)
        while driver.log.active_segment_base_offset == base:
            end = driver.log.log_end_offset
            records = b"".join(build_batch([b"z" * 200], timestamp_ms=ts, producer_id=5000 + i, producer_epoch=0,
                                           base_sequence=0, base_offset=end + i, leader_epoch=1) for i in range(20))
            driver.step(FetchResponse(leader_id=2, leader_epoch=1, fetch_offset=end,
                                      last_fetched_epoch=driver.replica.last_epoch, records=records,
                                      high_watermark=0, log_end_offset=end + 20))
        assert driver._snapshot_write is not None  # noqa: SLF001
        await driver._snapshot_write  # noqa: SLF001
        assert driver.producer_snapshots_written == 1
        entries = driver.producer_state.snapshot_entries()
        end = driver.log.log_end_offset
        await driver.close()
        again = await loop.run_in_executor(None, open_driver, directory, hooks)
        info = again.producer_state.last_load
        assert info is not None and (info.snapshot_offset, info.scanned_bytes) == (end, 0)
        assert again.producer_state.snapshot_entries() == entries
        await again.close()

    asyncio.run(scenario())


def test_snapshots_between_rolls_bound_what_a_start_after_a_crash_scans(tmp_path, monkeypatch):
    """Claim (the long fault run's slow restarts): without a segment roll, a snapshot is written
    once the log moved SNAPSHOT_EVERY_OFFSETS past the last one, at most every
    SNAPSHOT_INTERVAL_S; a start after a crash then scans only the log past it."""
    from dataplane.broker import partition as partition_module
    monkeypatch.setattr(partition_module, "SNAPSHOT_EVERY_OFFSETS", 50)
    directory = str(tmp_path / "t-0")
    write_log(directory, batches=10)

    async def scenario() -> None:
        hooks = Hooks()
        loop = asyncio.get_running_loop()
        driver = await loop.run_in_executor(None, open_driver, directory, hooks)
        follow(driver)
        append_as_follower(driver, list(range(8000, 8060)))
        assert driver._snapshot_write is not None  # noqa: SLF001
        assert await driver._snapshot_write  # noqa: SLF001
        assert driver.log.producer_snapshots.offsets()[-1] == 70
        append_as_follower(driver, list(range(9000, 9060)))  # due again, but too soon
        assert driver.log.producer_snapshots.offsets()[-1] == 70 and driver.producer_snapshots_written == 1
        entries = driver.producer_state.snapshot_entries()
        # A crash: no close, so no snapshot at the end.
        await driver.coalescer.close()
        for segment in driver.log._segments:  # noqa: SLF001
            segment.close()
        driver.log._dir_lock.release()  # noqa: SLF001
        again = await loop.run_in_executor(None, open_driver, directory, hooks)
        info = again.producer_state.last_load
        assert info is not None and info.snapshot_offset == 70 and info.scan_start_offset == 70
        assert again.producer_state.snapshot_entries() == entries
        await again.close()

    asyncio.run(scenario())


def test_a_close_right_after_a_truncation_writes_no_stale_snapshot(tmp_path):
    """Claim: closing between a truncation and the step that starts its rebuild writes no
    snapshot of the uncut table (it would hold producers whose batches were cut, and the
    next open would trust it): the reopened table is what the log says."""
    directory = str(tmp_path / "t-0")
    write_log(directory, batches=200)

    async def scenario() -> None:
        hooks = Hooks()
        loop = asyncio.get_running_loop()
        driver = await loop.run_in_executor(None, open_driver, directory, hooks)
        follow(driver)
        start = driver.log.log_end_offset
        append_as_follower(driver, list(range(7000, 7020)))
        diverge(driver, start + 10)  # cuts producers 7010..7019; no step after it
        assert driver.log.log_end_offset == start + 10 and not driver.producer_state.loading
        await driver.close()
        again = await loop.run_in_executor(None, open_driver, directory, hooks)
        assert 7015 not in again.producer_state.producers and 7005 in again.producer_state.producers
        assert again.producer_state.snapshot_entries() == oracle(again.log)
        await again.close()

    asyncio.run(scenario())


def test_a_captured_table_serializes_as_snapshot_entries_and_ignores_later_changes(tmp_path):
    """Claim: capture() (taken on the loop) gives, through plain_entries (in a thread), exactly
    snapshot_entries() at capture time, however the table changes afterwards."""
    from dataplane.broker.producer_state import BrokerProducerState, plain_entries
    t = BrokerProducerState()
    for pid in range(30):
        for seq in range(7):
            t.record(next(iter_batches(build_batch([b"a"], timestamp_ms=seq, producer_id=pid, producer_epoch=0,
                                                   base_sequence=seq)))[1], base_offset=pid * 10 + seq)
    expected = t.snapshot_entries()
    captured = t.capture()
    t.record(next(iter_batches(build_batch([b"a"], timestamp_ms=99, producer_id=3, producer_epoch=1,
                                           base_sequence=0)))[1], base_offset=1000)
    assert plain_entries(captured) == expected != t.snapshot_entries()


def test_loop_stalls_accounting_and_the_watchdog_logs_a_stall(caplog):
    """Claim: LoopStalls keeps the max, counts lags over its threshold and fills cumulative
    buckets; the watchdog sees a callback that blocks the loop and logs a structured warning."""
    s = LoopStalls(stall_ms_min=100, buckets_ms=(10, 100, 1000))
    for lag in (1, 50, 150, 2000, -3):
        s.observe(lag)
    assert (s.stall_max_ms, s.stalls_total, s.lag_count) == (2000, 2, 5)
    assert s.bucket_counts == [2, 3, 4]

    async def scenario() -> LoopWatchdog:
        w = LoopWatchdog(name="test", interval_ms=5, stall_warn_ms=50)
        w.start()
        await asyncio.sleep(0.02)
        time.sleep(0.12)  # a callback that blocks the loop
        await asyncio.sleep(0.02)
        w.stop()
        return w

    with caplog.at_level(logging.WARNING, logger="biplane.eventloop"):
        w = asyncio.run(scenario())
    assert w.stalls.stall_max_ms >= 50  # it blocked 120 ms; the tick due in it ran late
    assert [r for r in caplog.records if getattr(r, "event", "") == "loop.stall"]
