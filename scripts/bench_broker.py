#!/usr/bin/env python3
"""Broker figures on loopback: 1 controller + 3 broker processes, RF 3, 1 KiB records.

Prints, for acks=1 and acks=all under commit_policy `isr` and `quorum` (pull and
push replication):
records/s, MB/s and p50/p99 produce latency of a simple wire-level producer
(one pre-built 32 KiB batch of 32 records, resent; `--connections` connections
with `--inflight` requests pipelined on each); then the
partition failover time from kill -9 of a leader to the first acknowledged
acks=all produce on the new leader (median of `--failovers` runs per policy).

    .venv/bin/python scripts/bench_broker.py [--seconds 5] [--connections 1] [--inflight 8] [--failovers 3]
        [--modes pull,push] [--records-per-batch 32]
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

from cluster_harness import Cluster, make_batch, produce  # noqa: E402
from common.errors import ErrorCode  # noqa: E402
from common.wire import WireClient  # noqa: E402
from common.wire import messages as wire  # noqa: E402

RECORD_BYTES = 1024
RECORDS_PER_BATCH = 32


async def throughput(cluster: Cluster, topic: str, acks: int, seconds: float, connections: int,
                     inflight: int, records_per_batch: int = RECORDS_PER_BATCH) -> dict:
    leader = cluster.wait_leader(topic, 0)
    batch = make_batch([os.urandom(RECORD_BYTES) for _ in range(records_per_batch)])
    clients = [await WireClient.connect(*cluster.address(leader)) for _ in range(connections)]
    latencies: list[float] = []
    errors: dict[str, int] = {}
    done = 0
    deadline = time.perf_counter() + seconds

    async def worker(client: WireClient) -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            r = await produce(client, topic, 0, batch, acks=acks)
            latencies.append(time.perf_counter() - t0)
            if r.error_code is ErrorCode.NONE:
                done += 1
            else:
                errors[r.error_code.name] = errors.get(r.error_code.name, 0) + 1

    # Warm up, then measure.
    for c in clients:
        await produce(c, topic, 0, batch, acks=acks)
    start = time.perf_counter()
    await asyncio.gather(*(worker(c) for c in clients for _ in range(inflight)))
    elapsed = time.perf_counter() - start
    for c in clients:
        await c.close()
    latencies.sort()
    records = done * records_per_batch
    return {"records_per_s": records / elapsed, "mb_per_s": done * len(batch) / elapsed / 1e6,
            "p50_ms": 1000 * latencies[len(latencies) // 2],
            "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))], "errors": errors}


async def leader_from(cluster: Cluster, broker_ids: list[int], topic: str) -> tuple[int, int] | None:
    for b in broker_ids:
        try:
            async with await asyncio.wait_for(WireClient.connect(*cluster.address(b)), 0.5) as c:
                meta = await asyncio.wait_for(c.request(wire.MetadataRequest(topics=(topic,))), 0.5)
        except (OSError, asyncio.TimeoutError, Exception):
            continue
        p = meta.topics[0].partitions[0]
        if p.leader_id >= 0:
            return p.leader_id, p.leader_epoch
    return None


async def failover_once(cluster: Cluster, topic: str) -> float:
    old = cluster.wait_leader(topic, 0)
    others = [b for b in cluster.brokers if b != old]
    old_epoch = (await leader_from(cluster, others, topic))[1]
    batch = make_batch([b"x" * RECORD_BYTES])
    cluster.brokers[old].kill()
    t0 = time.perf_counter()
    seen: dict[str, int] = {}
    while time.perf_counter() - t0 < 30:
        found = await leader_from(cluster, others, topic)
        if found is None or found[0] == old or found[1] <= old_epoch:
            seen["no new leader"] = seen.get("no new leader", 0) + 1
            await asyncio.sleep(0.01)
            continue
        try:
            async with await WireClient.connect(*cluster.address(found[0])) as c:
                r = await produce(c, topic, 0, batch, acks=-1, timeout_ms=5000)
        except Exception as exc:
            seen[type(exc).__name__] = seen.get(type(exc).__name__, 0) + 1
            await asyncio.sleep(0.01)
            continue
        if r.error_code is ErrorCode.NONE:
            elapsed = time.perf_counter() - t0
            break
        seen[r.error_code.name] = seen.get(r.error_code.name, 0) + 1
        await asyncio.sleep(0.01)
    else:
        raise RuntimeError(f"no acknowledged produce on a new leader of {topic} within 30 s: {seen}, "
                           f"partition {cluster.partition(topic, 0)}")
    cluster.brokers[old].start()
    # Let it rejoin the ISR before the next run.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(cluster.partition(topic, 0)["isr"]) < 3:
        await asyncio.sleep(0.1)
    return elapsed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--connections", type=int, default=1)
    ap.add_argument("--inflight", type=int, default=8, help="requests in flight per connection")
    ap.add_argument("--failovers", type=int, default=3, help="kill -9 runs per policy (0 skips them)")
    ap.add_argument("--records-per-batch", type=int, default=RECORDS_PER_BATCH,
                    help="1 KiB records per produced batch (256 = 256 KiB batches; at most ~1000 under "
                         "the default max_message_bytes)")
    ap.add_argument("--modes", default="pull,push", help="replication modes to measure (pull, push)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-broker-") as tmp:
        with Cluster(Path(tmp), brokers=3, broker_args=["--log-level", "WARNING"]) as cluster:
            print(f"3 brokers, RF 3, {RECORD_BYTES} B records, {args.records_per_batch} per batch "
                  f"({RECORD_BYTES * args.records_per_batch // 1024} KiB), {args.connections} connection(s) x "
                  f"{args.inflight} in flight, "
                  f"{args.seconds:.0f} s per row, load avg {os.getloadavg()[0]:.2f}")
            print(f"{'mode':<6}{'policy':<8}{'acks':>5}{'records/s':>12}{'MB/s':>9}{'p50 ms':>9}{'p99 ms':>9}  errors")
            for mode in args.modes.split(","):
                for policy in ("isr", "quorum"):
                    topic = f"bench-{mode}-{policy}"
                    cluster.create_topic(topic, partitions=1, replication_factor=3, config={
                        "commit_policy": policy, "min_insync_replicas": 2, "replication_mode": mode})
                    for acks in (1, -1):
                        r = asyncio.run(throughput(cluster, topic, acks, args.seconds, args.connections,
                                                   args.inflight, args.records_per_batch))
                        print(f"{mode:<6}{policy:<8}{'all' if acks == -1 else acks:>5}{r['records_per_s']:>12,.0f}"
                              f"{r['mb_per_s']:>9.1f}{r['p50_ms']:>9.2f}{r['p99_ms']:>9.2f}  {r['errors'] or ''}")
            for policy in ("isr", "quorum") if args.failovers > 0 else ():
                topic = f"failover-{policy}"
                cluster.create_topic(topic, partitions=1, replication_factor=3,
                                     config={"commit_policy": policy, "min_insync_replicas": 2})
                times = [asyncio.run(failover_once(cluster, topic)) for _ in range(args.failovers)]
                print(f"failover {policy:<7} kill -9 -> first acks=all on new leader: median "
                      f"{statistics.median(times):.2f} s  (runs: {', '.join(f'{t:.2f}' for t in times)}; "
                      f"session timeout 1.5 s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
