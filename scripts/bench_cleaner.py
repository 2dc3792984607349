#!/usr/bin/env python3
"""Log compaction's cost: how fast the cleaner compacts, and what it does to produce latency.

1. Cleaner throughput: a partition log on disk is filled with keyed 1 KiB records (few
   keys, so most records are superseded) in closed segments, then one compaction pass
   (`PartitionLog.clean`, what the broker's cleaner thread runs) compacts it. Printed:
   MB/s of log compacted (the segments' bytes before the pass, over its time), and the
   bytes left. Median over rounds.
2. Produce p99 while the cleaner runs: a 3-broker cluster; a topic "churn" takes keyed
   records at a steady rate (1 MiB segments, so segments close every few hundred ms)
   while a synchronous acks=all producer on topic "lat" times every record. Rounds
   alternate: "cleaning" (churn is compact: every broker's cleaner looks each second
   and compacts once half the closed bytes are dirty, at its default 32 MiB/s I/O
   limit) and "idle" (churn is delete: the same writes, nothing to clean). Printed per
   round and as medians, with the ratio cleaning/idle.

    .venv/bin/python scripts/bench_cleaner.py --rounds 3
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from common.batch import build_batch  # noqa: E402
from dataplane.log.cleaner import CompactionConfig  # noqa: E402
from dataplane.log.interface import LogConfig  # noqa: E402
from dataplane.log.log import PartitionLog  # noqa: E402

MIB = 1024 * 1024
RECORD = b"v" * 1000
EVERY_PASS = CompactionConfig(min_cleanable_dirty_ratio=0.0)


def fill(log: PartitionLog, megabytes: int, keys: int) -> None:
    now_ms = int(time.time() * 1000)
    per_batch = 64
    batches = megabytes * MIB // (per_batch * len(RECORD))
    for b in range(batches):
        ks = [b"key-%d" % ((b * per_batch + i) % keys) for i in range(per_batch)]
        log.append_as_leader(build_batch([RECORD] * per_batch, keys=ks, timestamp_ms=now_ms), leader_epoch=0)
    log.flush()


def cleaner_round(megabytes: int, keys: int) -> tuple[float, int, int]:
    """(seconds of one pass, bytes before, bytes after)."""
    with tempfile.TemporaryDirectory(prefix="bench-cleaner-") as d:
        log = PartitionLog(os.path.join(d, "p0"), config=LogConfig(segment_bytes=8 * MIB, retention_ms=None))
        try:
            fill(log, megabytes, keys)
            log.roll()   # every segment closed: all of it is cleanable
            before = log.size_bytes
            started = time.perf_counter()
            result = log.clean(int(time.time() * 1000), below_offset=log.log_end_offset, config=EVERY_PASS)
            took = time.perf_counter() - started
            assert result is not None, "no pass was due: the bench's log is not cleanable"
            return took, before, log.size_bytes
        finally:
            log.close()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measured_round(bootstrap: str, sends: int, churn_mb_s: float, keys: int) -> list[float]:
    """Time `sends` synchronous sends to "lat" while "churn" takes keyed records at a steady
    `churn_mb_s` (the same load in both modes; only the cleaning differs)."""
    from dataplane.client import Producer
    done = asyncio.Event()

    async def churn() -> None:
        async with Producer(bootstrap=bootstrap, acks=1, linger_ms=5) as producer:
            started, sent = time.perf_counter(), 0
            while not done.is_set():
                for _ in range(64):
                    await producer.send("churn", RECORD, key=b"key-%d" % (sent % keys))
                    sent += 1
                ahead = sent * len(RECORD) / (churn_mb_s * MIB) - (time.perf_counter() - started)
                await asyncio.sleep(max(0.0, ahead))
            await producer.flush()

    async def timed() -> list[float]:
        took = []
        async with Producer(bootstrap=bootstrap, acks="all", linger_ms=0) as producer:
            await producer.send_and_wait("lat", RECORD)   # connections and metadata before timing
            for _ in range(sends):
                started = time.perf_counter()
                await producer.send_and_wait("lat", RECORD)
                took.append((time.perf_counter() - started) * 1000)
        done.set()
        return took

    writer = asyncio.ensure_future(churn())
    try:
        return await timed()
    finally:
        done.set()
        await writer


def produce_rounds(rounds: int, churn_mb_s: float, sends: int) -> None:
    from cluster_harness import Cluster, http
    with tempfile.TemporaryDirectory(prefix="bench-cleaner-cluster-") as d, \
            Cluster(Path(d), brokers=3, broker_args=["--log-cleaner-interval-ms", "1000"]) as cluster:
        bootstrap = ",".join(f"127.0.0.1:{b.port}" for b in cluster.brokers.values())
        cluster.create_topic("lat", partitions=1, replication_factor=3)
        cluster.create_topic("churn", partitions=1, replication_factor=3,
                             config={"cleanup_policy": "compact", "segment_bytes": 1 * MIB})
        rows: dict[str, list[tuple[float, float]]] = {"cleaning": [], "idle": []}
        for r in range(rounds):
            for mode in ("cleaning", "idle"):
                policy = "compact" if mode == "cleaning" else "delete"
                answer = http("PATCH", cluster.api_url + "/v1/topics/churn/config",
                              {"set": {"cleanup_policy": policy}})
                assert answer.status == 200, answer.body
                took = asyncio.run(measured_round(bootstrap, sends, churn_mb_s, keys=100))
                p50, p99 = percentile(took, 0.5), percentile(took, 0.99)
                rows[mode].append((p50, p99))
                print(f"  round {r + 1} {mode:<8} p50 {p50:6.2f} ms  p99 {p99:6.2f} ms", flush=True)
        med = {m: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v)) for m, v in rows.items()}
        print(f"produce (sync, acks=all, 1 KiB) medians: cleaning p50 {med['cleaning'][0]:.2f} ms "
              f"p99 {med['cleaning'][1]:.2f} ms; idle p50 {med['idle'][0]:.2f} ms p99 {med['idle'][1]:.2f} ms; "
              f"p99 ratio cleaning/idle {med['cleaning'][1] / med['idle'][1]:.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each measurement (default 3)")
    parser.add_argument("--megabytes", type=int, default=128, help="log size for the cleaner pass (default 128)")
    parser.add_argument("--keys", type=int, default=1000, help="distinct keys in that log (default 1000)")
    parser.add_argument("--churn-mb-s", type=float, default=4.0,
                        help="MiB/s of keyed records written to the compacted topic while latency is timed "
                             "(default 4)")
    parser.add_argument("--sends", type=int, default=1500, help="timed synchronous sends per round (default 1500)")
    parser.add_argument("--skip-cluster", action="store_true", help="only the cleaner throughput part")
    args = parser.parse_args()
    print(f"cleaner pass over {args.megabytes} MiB of 1 KiB records, {args.keys} keys (load {os.getloadavg()[0]:.1f}):")
    speeds = []
    for r in range(args.rounds):
        took, before, after = cleaner_round(args.megabytes, args.keys)
        speeds.append(before / MIB / took)
        print(f"  round {r + 1}: {took:.2f} s, {before / MIB:.1f} MiB -> {after / MIB:.2f} MiB, "
              f"{before / MIB / took:.1f} MiB/s", flush=True)
    print(f"cleaner throughput median {statistics.median(speeds):.1f} MiB/s")
    if not args.skip_cluster:
        print(f"produce latency while the cleaner runs (load {os.getloadavg()[0]:.1f}):")
        produce_rounds(args.rounds, args.churn_mb_s, args.sends)
    return 0


if __name__ == "__main__":
    sys.exit(main())
