#!/usr/bin/env python3
"""Replication figures on loopback: 1 controller + 3 broker processes, RF 3, 1 KiB records.

In one run, each part printing figures and ratios:
1. matrix: records/s, p50/p99 for acks 1/all x pull/push x isr/quorum (wire-level producer, one
   pre-built 32 KiB batch resent, `--connections` x `--inflight` pipelined); push rows only when
   the broker carries append-entries (dataplane/broker/pusher.py wired in), else said so;
2. sync latency: one synchronous producer (1 record of 1 KiB per request, nothing pipelined),
   acks=all p50/p99 for every mode x policy x durability (fsync, write), against the 1 ms p50
   target;
3. KIP-250: broker 3 restarted with every replica fetch delayed by 50 ms (an injected delay:
   sitecustomize on its PYTHONPATH, this script only), sequential acks=all p50/p99/p999 for
   `isr` versus `quorum` q=2, against the same unslowed;
4. overload: 8 connections x 32 in flight of acks=1 for `--overload-seconds`, the brokers' RSS
   sampled each second (memory must stay flat; no broker may die; errors counted).

    .venv/bin/python scripts/bench_replication.py [--seconds 5] [--parts matrix,sync,kip250,overload]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "scripts")]

from bench_broker import throughput  # noqa: E402
from cluster_harness import Cluster, make_batch, produce  # noqa: E402
from common.errors import ErrorCode  # noqa: E402
from common.wire import WireClient  # noqa: E402

RECORD_BYTES = 1024
DELAY_MS = 50
TARGET_P50_MS = 1.0  # synchronous acks=all on loopback

SITECUSTOMIZE = f'''
import sys, asyncio
sys.path.insert(0, {str(ROOT)!r})
from dataplane.broker import fetcher as _f
_orig = _f.FetchSession._round
async def _slow_round(self, *a, **kw):
    await asyncio.sleep({DELAY_MS} / 1000)
    return await _orig(self, *a, **kw)
_f.FetchSession._round = _slow_round
'''


def push_wired() -> bool:
    text = (ROOT / "dataplane" / "broker" / "partition.py").read_text()
    return "send_append_entries" in text


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return 1000 * values[min(len(values) - 1, int(len(values) * q))]


async def sequential(cluster: Cluster, topic: str, seconds: float, count_max: int) -> list[float]:
    leader = cluster.wait_leader(topic, 0)
    client = await WireClient.connect(*cluster.address(leader))
    batch = make_batch([os.urandom(RECORD_BYTES)])
    latencies: list[float] = []
    errors = 0
    await produce(client, topic, 0, batch, acks=-1)
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline and len(latencies) < count_max:
        t0 = time.perf_counter()
        r = await produce(client, topic, 0, batch, acks=-1)
        latencies.append(time.perf_counter() - t0)
        errors += r.error_code is not ErrorCode.NONE
    await client.close()
    if errors:
        print(f"    ({errors} errors)")
    return latencies


def rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return -1
    return -1


async def overload(cluster: Cluster, topic: str, seconds: float) -> None:
    leader = cluster.wait_leader(topic, 0)
    batch = make_batch([os.urandom(RECORD_BYTES) for _ in range(32)])
    clients = [await WireClient.connect(*cluster.address(leader)) for _ in range(8)]
    done, errors = 0, {}
    stop = time.perf_counter() + seconds

    async def worker(client: WireClient) -> None:
        nonlocal done
        while time.perf_counter() < stop:
            try:
                r = await produce(client, topic, 0, batch, acks=1)
            except Exception as exc:  # a broker crash shows here
                errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
                return
            if r.error_code is ErrorCode.NONE:
                done += 1
            else:
                errors[r.error_code.name] = errors.get(r.error_code.name, 0) + 1

    async def sampler() -> list[list[int]]:
        samples = []
        while time.perf_counter() < stop:
            samples.append([rss_kib(b.proc.pid) // 1024 for b in cluster.brokers.values()])
            await asyncio.sleep(1)
        return samples

    tasks = [asyncio.ensure_future(worker(c)) for c in clients for _ in range(32)]
    samples = await sampler()
    await asyncio.gather(*tasks)
    for c in clients:
        await c.close()
    print(f"  acked {done * 32:,} records ({done * 32 / seconds:,.0f}/s); errors {errors or 'none'}")
    ids = list(cluster.brokers)
    for t, row in enumerate(samples):
        print(f"  t={t:>3}s  RSS MiB " + "  ".join(f"b{i}={v}" for i, v in zip(ids, row)))
    first, last = samples[1] if len(samples) > 1 else samples[0], samples[-1]
    alive = [b.proc.poll() is None for b in cluster.brokers.values()]
    print(f"  RSS growth from t=1s to end: " + ", ".join(f"b{i} {b - a:+d} MiB" for i, a, b in zip(ids, first, last))
          + f"; brokers alive: {all(alive)}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--connections", type=int, default=2)
    ap.add_argument("--inflight", type=int, default=8)
    ap.add_argument("--latency-seconds", type=float, default=25.0,
                    help="per side of part 3 (KIP-250): p999 needs thousands of samples to mean anything")
    ap.add_argument("--sync-seconds", type=float, default=5.0, help="per row of part 2 (8 rows)")
    ap.add_argument("--overload-seconds", type=float, default=20.0)
    ap.add_argument("--parts", default="matrix,sync,kip250,overload")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    modes = ["pull", "push"] if push_wired() else ["pull"]
    with tempfile.TemporaryDirectory(prefix="bench-repl-") as tmp:
        with Cluster(Path(tmp), brokers=3, broker_args=["--log-level", "WARNING"]) as cluster:
            print(f"3 brokers, RF 3, {RECORD_BYTES} B records, load avg {os.getloadavg()[0]:.2f} on "
                  f"{os.cpu_count()} cores")
            topics = {}
            for mode in modes:
                for policy in ("isr", "quorum"):
                    name = f"b-{mode}-{policy}"
                    cluster.create_topic(name, partitions=1, replication_factor=3,
                                         config={"commit_policy": policy, "min_insync_replicas": 2,
                                                 "replication_mode": mode})
                    topics[mode, policy] = name
            if "matrix" in parts:
                print(f"\n1. matrix ({args.connections} conn x {args.inflight} in flight, 32 KiB batches, "
                      f"{args.seconds:.0f} s/row)" + ("" if "push" in modes else
                                                       "  [push: append-entries not carried by this broker yet]"))
                print(f"{'mode':<6}{'policy':<8}{'acks':>5}{'records/s':>12}{'p50 ms':>9}{'p99 ms':>9}  errors")
                rows = {}
                for (mode, policy), topic in topics.items():
                    for acks in (1, -1):
                        r = asyncio.run(throughput(cluster, topic, acks, args.seconds, args.connections,
                                                   args.inflight))
                        rows[mode, policy, acks] = r["records_per_s"]
                        print(f"{mode:<6}{policy:<8}{'all' if acks == -1 else acks:>5}{r['records_per_s']:>12,.0f}"
                              f"{r['p50_ms']:>9.2f}{r['p99_ms']:>9.2f}  {r['errors'] or ''}")
                best = max(v for (m, p, a), v in rows.items() if a == -1)
                print(f"best acks=all: {best:,.0f} records/s = {best / 150_000:.2f}x the 150k/s target, "
                      f"{best / 47_000:.2f}x NATS JetStream's ~47k/s")
            if "sync" in parts:
                print(f"\n2. synchronous producer, 1 record per request, acks=all ({args.sync_seconds:.0f} s/row), "
                      f"load avg {os.getloadavg()[0]:.2f}")
                print(f"  {'mode':<6}{'policy':<8}{'durability':<11}{'n':>7}{'p50 ms':>9}{'p99 ms':>9}  p50 target {TARGET_P50_MS:g} ms")
                for mode in modes:
                    for policy in ("isr", "quorum"):
                        for durability in ("fsync", "write"):
                            topic = topics[mode, policy] if durability == "fsync" else f"s-{mode}-{policy}-write"
                            if durability == "write":
                                cluster.create_topic(topic, partitions=1, replication_factor=3, config={
                                    "commit_policy": policy, "min_insync_replicas": 2, "replication_mode": mode,
                                    "durability": durability})
                            lat = asyncio.run(sequential(cluster, topic, args.sync_seconds, 100_000))
                            p50 = pct(lat, .5)
                            print(f"  {mode:<6}{policy:<8}{durability:<11}{len(lat):>7}{p50:>9.2f}{pct(lat, .99):>9.2f}"
                                  f"  {'met' if p50 <= TARGET_P50_MS else f'{p50 / TARGET_P50_MS:.1f}x the target'}")
            if "kip250" in parts:
                print(f"\n3. KIP-250: broker 3's replica fetches delayed by {DELAY_MS} ms; sequential acks=all, "
                      f"{args.latency_seconds:.0f} s per side, load avg {os.getloadavg()[0]:.2f}")
                base = {p: asyncio.run(sequential(cluster, topics["pull", p], args.latency_seconds, 100_000))
                        for p in ("isr", "quorum")}
                hook = Path(tmp) / "slowhook"
                hook.mkdir()
                (hook / "sitecustomize.py").write_text(SITECUSTOMIZE)
                old = os.environ.get("PYTHONPATH")
                os.environ["PYTHONPATH"] = str(hook) + (os.pathsep + old if old else "")
                try:
                    cluster.restart(3)
                finally:
                    if old is None:
                        os.environ.pop("PYTHONPATH", None)
                    else:
                        os.environ["PYTHONPATH"] = old
                time.sleep(3)  # let broker 3 rejoin the ISR
                slow = {p: asyncio.run(sequential(cluster, topics["pull", p], args.latency_seconds, 100_000))
                        for p in ("isr", "quorum")}
                for p in ("isr", "quorum"):
                    b, s = base[p], slow[p]
                    print(f"  {p:<7} unslowed p50/p99/p999 {pct(b, .5):6.1f}/{pct(b, .99):6.1f}/{pct(b, .999):6.1f} ms"
                          f"  slowed {pct(s, .5):6.1f}/{pct(s, .99):6.1f}/{pct(s, .999):6.1f} ms"
                          f"  p99 ratio {pct(s, .99) / pct(b, .99):.2f}x  p999 ratio {pct(s, .999) / pct(b, .999):.2f}x"
                          f" (n={len(b)}/{len(s)}: p999 is the {max(1, len(b) // 1000)}th/{max(1, len(s) // 1000)}th"
                          f" worst sample)")
                print("  targets: quorum p999 ratio <= 1.2x; isr p999 ratio >= 5x")
                cluster.restart(3)  # without the delay
            if "overload" in parts:
                print(f"\n4. overload: 8 connections x 32 in flight, acks=1, pull/isr, {args.overload_seconds:.0f} s")
                asyncio.run(overload(cluster, topics["pull", "isr"], args.overload_seconds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
