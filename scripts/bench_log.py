"""Partition-log throughput against the same disk's raw sequential write + fsync.

    .venv/bin/python scripts/bench_log.py [--mib 48] [--reps 3] [--dir /path]

For 1 KiB records in 16 KiB and 256 KiB batches it prints, as medians of --reps
runs in a temporary directory:
  - append MB/s and batches/s through PartitionLog.append_as_leader (CRC check,
    offset patching, index upkeep) with flush() every ~1 MiB of batches;
  - the same with FlushCoalescer: producers await flush_to() and share fsyncs;
  - raw MB/s: os.write of same-size chunks with fsync at the same cadence;
  - read MB/s: sequential PartitionLog.read(max_bytes=1 MiB) of what was written;
  - the ratios append/raw and read/append (targets: >= 0.7 and >= 1.5).
Batches are built before timing starts: producing them is the client's cost.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common.batch import build_batch  # noqa: E402
from dataplane.log import FlushCoalescer, LogConfig, PartitionLog  # noqa: E402

RECORD_BYTES = 1024
FLUSH_EVERY_BYTES = 1 << 20
READ_MAX_BYTES = 1 << 20


def make_batches(batch_bytes: int, total_bytes: int) -> list[bytes]:
    per_batch = batch_bytes // RECORD_BYTES
    distinct = [build_batch([bytes([i % 251]) * RECORD_BYTES] * per_batch, timestamp_ms=1_000 + i)
                for i in range(8)]
    count = max(total_bytes // len(distinct[0]), 1)
    return [distinct[i % len(distinct)] for i in range(count)]


def bench_append(directory: str, batches: list[bytes], flush_every: int) -> tuple[float, float]:
    log = PartitionLog(directory, config=LogConfig())
    try:
        start = time.perf_counter()
        for i, data in enumerate(batches, 1):
            log.append_as_leader(data, leader_epoch=0)
            if i % flush_every == 0:
                log.flush()
        log.flush()
        elapsed = time.perf_counter() - start
    finally:
        log.close()
    return elapsed, sum(map(len, batches))


def bench_coalesced(directory: str, batches: list[bytes], producers: int) -> tuple[float, float, int]:
    """`producers` tasks each append one batch then await flush_to for it (acks=all style)."""
    log = PartitionLog(directory, config=LogConfig())

    async def run() -> int:
        flusher = FlushCoalescer(log, debounce_ms=0)
        queue = iter(batches)

        async def producer() -> None:
            for data in queue:
                info = log.append_as_leader(data, leader_epoch=0)
                await flusher.flush_to(info.last_offset + 1)

        await asyncio.gather(*(producer() for _ in range(producers)))
        await flusher.close()
        return flusher.flush_count

    try:
        start = time.perf_counter()
        flushes = asyncio.run(run())
        elapsed = time.perf_counter() - start
    finally:
        log.close()
    return elapsed, sum(map(len, batches)), flushes


def bench_raw(directory: str, batches: list[bytes], flush_every: int) -> tuple[float, float]:
    path = os.path.join(directory, "raw.bin")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        start = time.perf_counter()
        for i, data in enumerate(batches, 1):
            os.write(fd, data)
            if i % flush_every == 0:
                os.fsync(fd)
        os.fsync(fd)
        elapsed = time.perf_counter() - start
    finally:
        os.close(fd)
    return elapsed, sum(map(len, batches))


def bench_read(directory: str) -> tuple[float, float]:
    log = PartitionLog(directory, config=LogConfig())
    try:
        offset, total = log.log_start_offset, 0
        start = time.perf_counter()
        while offset < log.log_end_offset:
            result = log.read(offset, max_bytes=READ_MAX_BYTES)
            total += len(result.records)
            offset = result.next_offset
        elapsed = time.perf_counter() - start
    finally:
        log.close()
    return elapsed, total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=48, help="MiB written per run (default 48)")
    parser.add_argument("--reps", type=int, default=3, help="repetitions; medians are printed")
    parser.add_argument("--dir", default=None, help="parent of the temporary directory")
    args = parser.parse_args(argv)
    root = tempfile.mkdtemp(prefix="bench-log-", dir=args.dir)
    mb = 1e6
    print(f"bench_log: {args.mib} MiB per run, median of {args.reps}, fsync every "
          f"{FLUSH_EVERY_BYTES >> 10} KiB, records {RECORD_BYTES} B, in {root}")
    try:
        for batch_bytes in (16 * 1024, 256 * 1024):
            batches = make_batches(batch_bytes, args.mib << 20)
            flush_every = max(FLUSH_EVERY_BYTES // len(batches[0]), 1)
            appends, raws, reads, coalesced, flush_counts = [], [], [], [], []
            for rep in range(args.reps):
                for kind in ("raw", "log", "coalesced"):
                    directory = os.path.join(root, f"{batch_bytes}-{rep}-{kind}")
                    os.makedirs(directory)
                    if kind == "raw":
                        seconds, size = bench_raw(directory, batches, flush_every)
                        raws.append(size / seconds / mb)
                    elif kind == "log":
                        seconds, size = bench_append(directory, batches, flush_every)
                        appends.append((size / seconds / mb, len(batches) / seconds))
                        seconds, size = bench_read(directory)
                        reads.append(size / seconds / mb)
                    else:
                        seconds, size, flushes = bench_coalesced(directory, batches, producers=16)
                        coalesced.append((size / seconds / mb, len(batches) / seconds))
                        flush_counts.append(flushes)
                    shutil.rmtree(directory)
            append_mbs = statistics.median(a for a, _ in appends)
            append_bps = statistics.median(b for _, b in appends)
            coalesced_mbs = statistics.median(c for c, _ in coalesced)
            coalesced_bps = statistics.median(b for _, b in coalesced)
            raw_mbs = statistics.median(raws)
            read_mbs = statistics.median(reads)
            label = f"{batch_bytes >> 10} KiB batches ({len(batches[0])} B, {len(batches)} per run)"
            print(f"\n{label}")
            print(f"  append, flush every {flush_every:>3} batches : {append_mbs:8.1f} MB/s  "
                  f"{append_bps:8.0f} batches/s")
            print(f"  append, 16 producers + coalescer : {coalesced_mbs:8.1f} MB/s  "
                  f"{coalesced_bps:8.0f} batches/s  ({statistics.median(flush_counts):.0f} fsyncs/run)")
            print(f"  raw write + fsync, same cadence  : {raw_mbs:8.1f} MB/s")
            print(f"  read, max_bytes 1 MiB            : {read_mbs:8.1f} MB/s")
            print(f"  ratio append/raw                 : {append_mbs / raw_mbs:8.2f}   (target >= 0.70)")
            print(f"  ratio coalesced/raw              : {coalesced_mbs / raw_mbs:8.2f}")
            print(f"  ratio read/append                : {read_mbs / append_mbs:8.2f}   (target >= 1.50)")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
