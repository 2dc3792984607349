"""Producer-state rebuild: how long it takes and how long it stalls the broker's event loop.

    PYTHONPATH=$PWD python scripts/bench_producer_rebuild.py [--producers 2000] [--batches 200000]

Builds one partition log on disk with `--batches` one-record batches from `--producers`
idempotent producers (segments of `--segment-mb`), then measures:
- full_rebuild_s: ProducerStateTable.rebuild over the whole log (the old path, at open
  and after every truncation);
- open_s: a PartitionDriver opened on the log (after a clean close, so with the
  producer snapshot written at close where the code writes one);
- truncation: the driver is made a follower, its log cut a few batches from the end
  the way the core cuts it after a divergence, and the next step run on an event loop
  whose longest stall a watchdog measures (callback every 5 ms), until the producer
  state is complete again: loop_stall_max_ms and truncation_rebuild_s.
Figures only: nothing here is asserted.
"""
from __future__ import annotations

import argparse
import asyncio
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


async def measure_truncation(driver: PartitionDriver, cut_batches: int, interval_ms: float) -> dict:
    stall_max_ms = 0.0
    stop = False

    async def watchdog() -> None:
        nonlocal stall_max_ms
        while not stop:
            before = time.perf_counter()
            await asyncio.sleep(interval_ms / 1000)
            stall_max_ms = max(stall_max_ms, (time.perf_counter() - before) * 1000 - interval_ms)

    task = asyncio.get_running_loop().create_task(watchdog())
    await asyncio.sleep(0.05)
    stall_max_ms = 0.0
    # The core's own cut (Replica._cut_to): truncate the log, mark producer state stale.
    end = driver.log.log_end_offset
    driver.replica._cut_to(end - cut_batches)  # noqa: SLF001 - a measurement, not an API
    driver._perform(_ready_of(driver))  # noqa: SLF001 - performs the Truncate (fsyncs, on the loop)
    await asyncio.sleep(0.05)
    truncate_stall_ms = stall_max_ms
    stall_max_ms = 0.0
    started = time.perf_counter()
    driver.tick(now_ms())  # the next step rebuilds (old path) or starts the rebuild (new)
    table = driver.replica.producer_state
    while getattr(table, "loading", False):
        await asyncio.sleep(0.001)
    rebuild_s = time.perf_counter() - started
    await asyncio.sleep(0.05)
    stop = True
    await task
    last = getattr(table, "last_load", None)
    return {"truncate_loop_stall_ms": round(truncate_stall_ms, 1),
            "truncation_rebuild_s": round(rebuild_s, 3), "rebuild_loop_stall_max_ms": round(stall_max_ms, 1),
            "rebuild_scanned_bytes": last.scanned_bytes if last else None,
            "rebuild_snapshot_offset": last.snapshot_offset if last else None,
            "producers_after": len(table)}


def _ready_of(driver: PartitionDriver):
    from dataplane.replica.actions import Ready
    r = driver.replica
    ready = Ready(persist=tuple(r._persist), send=(), release=(), notes=())  # noqa: SLF001
    r._persist = []  # noqa: SLF001
    return ready


async def main_async(args: argparse.Namespace, directory: str) -> dict:
    out: dict = {}
    loop = asyncio.get_running_loop()
    started = time.perf_counter()
    driver = await loop.run_in_executor(None, lambda: PartitionDriver(
        broker_id=1, tp=("bench", 0), directory=directory, log_config=LogConfig(
            segment_bytes=args.segment_mb * 1024 * 1024, segment_ms=None, retention_ms=None),
        hooks=NoHooks(), unclean_start=False))
    out["open_s"] = round(time.perf_counter() - started, 3)
    last = getattr(driver.replica.producer_state, "last_load", None)
    out["open_scanned_bytes"] = last.scanned_bytes if last else None
    out.update(await measure_truncation(driver, args.cut_batches, args.interval_ms))
    await driver.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--producers", type=int, default=2000)
    p.add_argument("--batches", type=int, default=200_000)
    p.add_argument("--segment-mb", type=int, default=4)
    p.add_argument("--cut-batches", type=int, default=10)
    p.add_argument("--interval-ms", type=float, default=5.0)
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
        out.update(asyncio.run(main_async(args, directory)))
        print(json.dumps(out))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
