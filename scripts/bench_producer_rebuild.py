"""Producer-state rebuild: how long it takes and how long it stalls the broker's event loop.

    PYTHONPATH=$PWD python scripts/bench_producer_rebuild.py [--producers 2000] [--batches 200000] \
        [--partitions 1] [--no-snapshots]

Builds one partition log on disk with `--batches` one-record batches from `--producers`
idempotent producers (segments of `--segment-mb`), then measures:
- full_rebuild_s: ProducerStateTable.rebuild over the whole log (the old path, at open
  and after every truncation);
- open_s_per_partition: a PartitionDriver opened on the log (snapshots at each roll
  where the code has them, as the driver writes them);
- truncation: `--partitions` copies of the log, each cut `--cut-batches` from its end
  the way the core cuts it after a divergence (all at once, as after a leader change),
  then the next step of each run on an event loop whose longest stall a watchdog
  measures (callback every 5 ms) until every producer table is complete again:
  truncate_loop_stall_ms (the truncations themselves), rebuild_loop_stall_max_ms and
  truncation_rebuild_s. `--no-snapshots` deletes the snapshots first (full scans).
Figures only: nothing here is asserted.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import shutil
import tempfile
import time

from common.batch import build_batch
from dataplane.broker.partition import PartitionDriver, now_ms
from dataplane.log.interface import LogConfig
from dataplane.log.log import PartitionLog
from dataplane.replica.producer_state import ProducerStateTable


class NoHooks:
    def send_fetch(self, *a: object) -> None: ...
    def send_append_entries(self, *a: object) -> None: ...
    def propose_isr(self, *a: object) -> None: ...
    def report_election(self, *a: object) -> None: ...
    def refresh_metadata(self, *a: object) -> None: ...


def build_log(directory: str, *, producers: int, batches: int, segment_bytes: int) -> int:
    """The log, and (where the code has them) a producer snapshot at each segment roll, as
    PartitionDriver writes them."""
    log = PartitionLog(directory, config=LogConfig(segment_bytes=segment_bytes, segment_ms=None,
                                                   retention_ms=None))
    snapshots = getattr(log, "producer_snapshots", None)
    table = ProducerStateTable()
    active = log.segment_base_offsets[-1]
    sequences = [0] * producers
    chunk: list[bytes] = []
    offset = 0
    ts = int(time.time() * 1000)
    for i in range(batches):
        pid = i % producers
        b = bytearray(build_batch([b"x" * 60], timestamp_ms=ts, producer_id=1000 + pid, producer_epoch=0,
                                  base_sequence=sequences[pid], base_offset=offset, leader_epoch=0))
        sequences[pid] += 1
        offset += 1
        chunk.append(bytes(b))
        if len(chunk) == 1000:
            active = _append(log, b"".join(chunk), table, snapshots, active)
            chunk = []
    if chunk:
        _append(log, b"".join(chunk), table, snapshots, active)
    size = log.size_bytes
    log.close()
    return size


def _append(log: PartitionLog, records: bytes, table: ProducerStateTable, snapshots, active: int) -> int:
    from common.batch import iter_batches
    log.append_as_follower(records)
    if snapshots is None:
        return active
    for _, h in iter_batches(records, validate=False):
        table.record(h, base_offset=h.base_offset)
    if log.segment_base_offsets[-1] != active:
        snapshots.write(log.log_end_offset, table.snapshot_entries(), generation=snapshots.generation)
    return log.segment_base_offsets[-1]


async def measure_truncation(drivers: list[PartitionDriver], cut_batches: int, interval_ms: float,
                             drop_snapshots: bool) -> dict:
    """Cut every driver's log at once (as after a leader change), then measure the rebuilds."""
    stall_max_ms = 0.0
    stop = False

    async def watchdog() -> None:
        nonlocal stall_max_ms
        while not stop:
            before = time.perf_counter()
            await asyncio.sleep(interval_ms / 1000)
            stall_max_ms = max(stall_max_ms, (time.perf_counter() - before) * 1000 - interval_ms)

    gc_pause_max_ms = 0.0
    gc_started = 0.0

    def on_gc(phase: str, info: dict) -> None:  # a collection holds the GIL: every thread waits
        nonlocal gc_started, gc_pause_max_ms
        if phase == "start":
            gc_started = time.perf_counter()
        else:
            gc_pause_max_ms = max(gc_pause_max_ms, (time.perf_counter() - gc_started) * 1000)

    task = asyncio.get_running_loop().create_task(watchdog())
    await asyncio.sleep(0.05)
    stall_max_ms = 0.0
    for driver in drivers:
        snapshots = getattr(driver.log, "producer_snapshots", None)
        if drop_snapshots and snapshots is not None:
            snapshots.delete_above(-1)
        # The core's own cut (Replica._cut_to): truncate the log, mark producer state stale.
        end = driver.log.log_end_offset
        driver.replica._cut_to(end - cut_batches)  # noqa: SLF001 - a measurement, not an API
        driver._perform(_ready_of(driver))  # noqa: SLF001 - performs the Truncate (fsyncs, on the loop)
    await asyncio.sleep(0.05)
    truncate_stall_ms = stall_max_ms
    stall_max_ms = 0.0
    gc.callbacks.append(on_gc)
    started = time.perf_counter()
    for driver in drivers:
        driver.tick(now_ms())  # the next step rebuilds (old path) or starts the rebuild (new)
    tables = [d.replica.producer_state for d in drivers]
    while any(getattr(t, "loading", False) for t in tables):
        await asyncio.sleep(0.001)
    rebuild_s = time.perf_counter() - started
    gc.callbacks.remove(on_gc)
    await asyncio.sleep(0.05)
    stop = True
    await task
    last = getattr(tables[0], "last_load", None)
    return {"truncate_loop_stall_ms": round(truncate_stall_ms, 1),
            "truncation_rebuild_s": round(rebuild_s, 3), "rebuild_loop_stall_max_ms": round(stall_max_ms, 1),
            "rebuild_gc_pause_max_ms": round(gc_pause_max_ms, 1),
            "rebuild_scanned_bytes": last.scanned_bytes if last else None,
            "rebuild_snapshot_offset": last.snapshot_offset if last else None,
            "producers_after": len(tables[0])}


def _ready_of(driver: PartitionDriver):
    from dataplane.replica.actions import Ready
    r = driver.replica
    ready = Ready(persist=tuple(r._persist), send=(), release=(), notes=())  # noqa: SLF001
    r._persist = []  # noqa: SLF001
    return ready


async def main_async(args: argparse.Namespace, directories: list[str]) -> dict:
    out: dict = {}
    loop = asyncio.get_running_loop()
    config = LogConfig(segment_bytes=args.segment_mb * 1024 * 1024, segment_ms=None, retention_ms=None)
    started = time.perf_counter()
    drivers = []
    for i, directory in enumerate(directories):
        drivers.append(await loop.run_in_executor(None, lambda d=directory, i=i: PartitionDriver(
            broker_id=1, tp=("bench", i), directory=d, log_config=config, hooks=NoHooks(), unclean_start=False)))
    out["open_s_per_partition"] = round((time.perf_counter() - started) / len(directories), 3)
    last = getattr(drivers[0].replica.producer_state, "last_load", None)
    out["open_scanned_bytes"] = last.scanned_bytes if last else None
    out.update(await measure_truncation(drivers, args.cut_batches, args.interval_ms, args.no_snapshots))
    for driver in drivers:
        await driver.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--producers", type=int, default=2000)
    p.add_argument("--batches", type=int, default=200_000)
    p.add_argument("--segment-mb", type=int, default=4)
    p.add_argument("--cut-batches", type=int, default=10)
    p.add_argument("--interval-ms", type=float, default=5.0)
    p.add_argument("--partitions", type=int, default=1, help="copies of the log, all cut at once")
    p.add_argument("--no-snapshots", action="store_true", help="delete snapshots before the cut: full scans")
    args = p.parse_args()
    root = tempfile.mkdtemp(prefix="bench-rebuild-")
    try:
        directory = os.path.join(root, "bench-0")
        size = build_log(directory, producers=args.producers, batches=args.batches,
                         segment_bytes=args.segment_mb * 1024 * 1024)
        log = PartitionLog(directory)
        table = ProducerStateTable()
        started = time.perf_counter()
        table.rebuild(log)
        full_s = time.perf_counter() - started
        log.close()
        out = {"log_bytes": size, "batches": args.batches, "producers": args.producers,
               "full_rebuild_s": round(full_s, 3)}
        directories = [directory]
        for i in range(1, args.partitions):
            directories.append(os.path.join(root, f"bench-{i}"))
            shutil.copytree(directory, directories[-1])
        out["partitions"] = args.partitions
        out.update(asyncio.run(main_async(args, directories)))
        print(json.dumps(out))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
