#!/usr/bin/env python3
"""Broker figures on loopback: 1 controller + 3 broker processes, RF 3, 1 KiB records.

Prints, for acks=1 and acks=all under commit_policy `isr` and `quorum` (pull and
push replication):
records/s, MB/s and p50/p99 produce latency of a simple wire-level producer
(one pre-built batch of `--records-per-batch` 1 KiB records, resent; `--connections`
connections with `--inflight` requests pipelined on each). Then, per mode and
policy, the acks=all peak: the best of the `--peak` configurations (batch size x
connections x in flight), each run for `--seconds`, and the summary line
"acks=all fsync peak: N rec/s (target 150k) = X.XXx" naming the configuration that
gave it. Then the open-loop "half of peak" row per mode and policy: a producer
sending on a fixed schedule at 50% of that peak rate, in batches of the peak run's
size unless `--half-records-per-batch` says otherwise, latency measured from each batch's scheduled send time so
that queueing counts, p50/p99/p999 against the target p99 <= 20 ms. Last, the
partition failover time from kill -9 of a leader to the first acknowledged
acks=all produce on the new leader (median of `--failovers` runs per policy).
Durability is the topic default, fsync.

    .venv/bin/python scripts/bench_broker.py [--seconds 5] [--connections 1] [--inflight 8] [--failovers 3]
        [--modes pull,push] [--records-per-batch 32] [--peak 256x2x8,1000x2x4,1000x2x8] [--half-records-per-batch 0]
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
from common import eventloop  # noqa: E402
from common.errors import ErrorCode  # noqa: E402
from common.wire import WireClient  # noqa: E402
from common.wire import messages as wire  # noqa: E402

RECORD_BYTES = 1024
BENCH_RETENTION_BYTES = 2 * 1024 ** 3
BENCH_SEGMENT_BYTES = 256 * 1024 ** 2
RECORDS_PER_BATCH = 32
TARGET_RECORDS_PER_S = 150_000
TARGET_HALF_PEAK_P99_MS = 20.0
OPEN_LOOP_OUTSTANDING_MAX = 2000  # batches sent and not yet answered; beyond it the producer is overrun


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


async def open_loop(cluster: Cluster, topic: str, records_per_s: float, seconds: float, connections: int,
                    records_per_batch: int) -> dict:
    """acks=all batches sent on a fixed schedule at records_per_s; each latency runs from the
    batch's scheduled send time (a late send counts as waiting, as it would for a real producer)."""
    leader = cluster.wait_leader(topic, 0)
    batch = make_batch([os.urandom(RECORD_BYTES) for _ in range(records_per_batch)])
    clients = [await WireClient.connect(*cluster.address(leader), inflight_requests_max=1024)
               for _ in range(connections)]
    for c in clients:
        await produce(c, topic, 0, batch, acks=-1)
    interval = records_per_batch / records_per_s
    count = max(1, int(seconds / interval))
    latencies: list[float] = []
    errors: dict[str, int] = {}
    outstanding: set[asyncio.Task] = set()
    overrun = 0

    async def one(client: WireClient, scheduled: float) -> None:
        r = await produce(client, topic, 0, batch, acks=-1)
        latencies.append(time.perf_counter() - scheduled)
        if r.error_code is not ErrorCode.NONE:
            errors[r.error_code.name] = errors.get(r.error_code.name, 0) + 1

    start = time.perf_counter() + 0.01
    for i in range(count):
        scheduled = start + i * interval
        delay = scheduled - time.perf_counter()
        if delay > 0.001:
            await asyncio.sleep(delay)
        if len(outstanding) >= OPEN_LOOP_OUTSTANDING_MAX:
            overrun += 1
            continue
        task = asyncio.get_running_loop().create_task(one(clients[i % connections], scheduled))
        outstanding.add(task)
        task.add_done_callback(outstanding.discard)
    if outstanding:
        await asyncio.wait(outstanding, timeout=30)
    elapsed = time.perf_counter() - start
    for c in clients:
        await c.close()
    latencies.sort()
    n = len(latencies)

    def pct(q: float) -> float:
        return 1000 * latencies[min(n - 1, int(n * q))] if n else float("nan")
    return {"records_per_s": n * records_per_batch / elapsed, "n": n, "p50_ms": pct(0.5), "p99_ms": pct(0.99),
            "p999_ms": pct(0.999), "errors": errors, "overrun": overrun}


def broker_cpu_seconds(cluster: Cluster) -> float:
    """User + system CPU seconds used so far by the running broker processes (Linux /proc)."""
    total = 0.0
    for broker in cluster.brokers.values():
        pid = broker.pid
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, TypeError):
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def parse_peak_configs(text: str) -> list[tuple[int, int, int]]:
    """'256x2x8,1000x2x4' -> [(records per batch, connections, in flight per connection), ...]."""
    configs = []
    for item in text.split(","):
        try:
            rpb, conns, inflight = (int(x) for x in item.lower().split("x"))
        except ValueError:
            raise SystemExit(f"--peak {text!r}: {item!r} is not RECORDSxCONNECTIONSxINFLIGHT, e.g. 256x2x8")
        if min(rpb, conns, inflight) < 1:
            raise SystemExit(f"--peak {text!r}: {item!r} needs positive numbers")
        configs.append((rpb, conns, inflight))
    return configs


def describe(rpb: int, conns: int, inflight: int) -> str:
    size = RECORD_BYTES * rpb
    size_text = f"{size // (1024 * 1024)} MiB" if size % (1024 * 1024) == 0 else f"{size // 1024} KiB"
    return f"{rpb} x 1 KiB records ({size_text}) per batch, {conns} conn x {inflight} in flight"


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
    ap.add_argument("--peak", default="256x2x8,1000x2x4,1000x2x8",
                    help="acks=all peak configurations to try, RECORDSxCONNECTIONSxINFLIGHT, comma-separated "
                         "('' skips the peak and half-of-peak rows)")
    ap.add_argument("--half-records-per-batch", type=int, default=0,
                    help="records per batch of the open-loop half-of-peak producer (64 = 64 KiB batches; "
                         "0, the default: the batch size of that mode's peak run)")
    ap.add_argument("--skip-matrix", action="store_true", help="only the peak, half-of-peak and failover rows")
    args = ap.parse_args()
    peak_configs = parse_peak_configs(args.peak) if args.peak else []
    run = eventloop.run
    with tempfile.TemporaryDirectory(prefix="bench-broker-") as tmp:
        # Rows write tens of GB in all: retention keeps each broker's disk use to about
        # BENCH_RETENTION_BYTES per topic (a full disk would show as KAFKA_STORAGE_ERROR).
        with Cluster(Path(tmp), brokers=3, broker_args=["--log-level", "WARNING",
                                                        "--retention-check-interval-ms", "1000"]) as cluster:
            print(f"3 brokers, RF 3, durability fsync, {RECORD_BYTES} B records; client and brokers on "
                  f"{eventloop.loop_name()}; {args.seconds:.0f} s per row, load avg {os.getloadavg()[0]:.2f}")
            topics = {}
            for mode in args.modes.split(","):
                for policy in ("isr", "quorum"):
                    topic = topics[(mode, policy)] = f"bench-{mode}-{policy}"
                    cluster.create_topic(topic, partitions=1, replication_factor=3, config={
                        "commit_policy": policy, "min_insync_replicas": 2, "replication_mode": mode,
                        "retention_bytes": BENCH_RETENTION_BYTES, "segment_bytes": BENCH_SEGMENT_BYTES})
            if not args.skip_matrix:
                print(f"\n{describe(args.records_per_batch, args.connections, args.inflight)}")
                print(f"{'mode':<6}{'policy':<8}{'acks':>5}{'records/s':>12}{'MB/s':>9}{'p50 ms':>9}{'p99 ms':>9}"
                      f"  errors")
                for (mode, policy), topic in topics.items():
                    for acks in (1, -1):
                        r = run(throughput(cluster, topic, acks, args.seconds, args.connections,
                                           args.inflight, args.records_per_batch))
                        print(f"{mode:<6}{policy:<8}{'all' if acks == -1 else acks:>5}{r['records_per_s']:>12,.0f}"
                              f"{r['mb_per_s']:>9.1f}{r['p50_ms']:>9.2f}{r['p99_ms']:>9.2f}  {r['errors'] or ''}",
                              flush=True)
            peaks: dict[tuple[str, str], tuple] = {}
            if peak_configs:
                print(f"\nacks=all peak per mode: best of {', '.join(f'{r}x{c}x{i}' for r, c, i in peak_configs)} "
                      f"(records per batch x connections x in flight)")
                print(f"{'mode':<6}{'policy':<8}{'records/s':>12}{'MB/s':>9}{'p50 ms':>9}{'p99 ms':>9}"
                      f"{'CPU ms/MB':>10}  configuration  (CPU: the three brokers' user+system time per MB produced)")
                for (mode, policy), topic in topics.items():
                    best = None
                    for config in peak_configs:
                        cpu_before = broker_cpu_seconds(cluster)
                        r = run(throughput(cluster, topic, -1, args.seconds, config[1], config[2], config[0]))
                        mb = r["mb_per_s"] * args.seconds
                        r["cpu_ms_per_mb"] = 1000 * (broker_cpu_seconds(cluster) - cpu_before) / mb if mb else float("nan")
                        if r["errors"]:
                            print(f"  ({mode} {policy} {describe(*config)}: errors {r['errors']})")
                        if best is None or r["records_per_s"] > best[0]["records_per_s"]:
                            best = (r, config)
                    r, config = best
                    peaks[(mode, policy)] = (r["records_per_s"], config, r["cpu_ms_per_mb"],
                                             r["mb_per_s"] / r["records_per_s"] if r["records_per_s"] else 0.0)
                    print(f"{mode:<6}{policy:<8}{r['records_per_s']:>12,.0f}{r['mb_per_s']:>9.1f}{r['p50_ms']:>9.2f}"
                          f"{r['p99_ms']:>9.2f}{r['cpu_ms_per_mb']:>10.2f}  {describe(*config)}", flush=True)
                cores = os.cpu_count() or 1
                for (mode, policy), (rate, config, cpu_ms_per_mb, mb_per_record) in list(peaks.items()):
                    ceiling = cores * 1000 / cpu_ms_per_mb / mb_per_record if cpu_ms_per_mb > 0 else float("nan")
                    print(f"  {mode} {policy}: brokers' CPU alone would carry ~{ceiling:,.0f} rec/s on {cores} cores "
                          f"({cpu_ms_per_mb:.2f} ms per MB)")
                    peaks[(mode, policy)] = (rate, config)
                (mode, policy), (rate, config) = max(peaks.items(), key=lambda kv: kv[1][0])
                low_key, (low, low_config) = min(peaks.items(), key=lambda kv: kv[1][0])
                print(f"acks=all fsync peak: {rate:,.0f} rec/s (target {TARGET_RECORDS_PER_S // 1000}k) = "
                      f"{rate / TARGET_RECORDS_PER_S:.2f}x  [{mode} {policy}, {describe(*config)}]")
                print(f"acks=all fsync peak, lowest of the {len(peaks)} modes: {low:,.0f} rec/s = "
                      f"{low / TARGET_RECORDS_PER_S:.2f}x  [{' '.join(low_key)}, {describe(*low_config)}]")
                half_text = (f"{args.half_records_per_batch} x 1 KiB records per batch" if args.half_records_per_batch
                             else "the batch size of each peak run")
                print(f"\nopen loop at half of each peak, acks=all, {half_text}, 2 connections; "
                      f"latency from the scheduled send (target p99 <= {TARGET_HALF_PEAK_P99_MS:.0f} ms)")
                print(f"{'mode':<6}{'policy':<8}{'batch':>7}{'offered/s':>11}{'done/s':>10}{'n':>7}{'p50 ms':>9}"
                      f"{'p99 ms':>9}{'p999 ms':>9}  p99 vs target")
                for (mode, policy), topic in topics.items():
                    offered, peak_config = peaks[(mode, policy)]
                    offered /= 2
                    half = args.half_records_per_batch or peak_config[0]
                    r = run(open_loop(cluster, topic, offered, args.seconds, 2, half))
                    verdict = f"{r['p99_ms'] / TARGET_HALF_PEAK_P99_MS:.2f}x of {TARGET_HALF_PEAK_P99_MS:.0f} ms"
                    extra = "".join([f"  errors {r['errors']}" if r["errors"] else "",
                                     f"  overrun {r['overrun']}" if r["overrun"] else ""])
                    print(f"{mode:<6}{policy:<8}{half:>7}{offered:>11,.0f}{r['records_per_s']:>10,.0f}{r['n']:>7}"
                          f"{r['p50_ms']:>9.2f}{r['p99_ms']:>9.2f}{r['p999_ms']:>9.2f}  {verdict}{extra}", flush=True)
            for policy in ("isr", "quorum") if args.failovers > 0 else ():
                topic = f"failover-{policy}"
                cluster.create_topic(topic, partitions=1, replication_factor=3,
                                     config={"commit_policy": policy, "min_insync_replicas": 2})
                times = [run(failover_once(cluster, topic)) for _ in range(args.failovers)]
                print(f"failover {policy:<7} kill -9 -> first acks=all on new leader: median "
                      f"{statistics.median(times):.2f} s  (runs: {', '.join(f'{t:.2f}' for t in times)}; "
                      f"session timeout 1.5 s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
