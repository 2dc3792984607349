#!/usr/bin/env python3
"""Latency of a synchronous acks=all producer: Biplane against NATS JetStream R3, alternating.

Starts, on loopback, a Biplane cluster (one controller, three brokers, as the other bench
scripts do, through tests/cluster_harness.py) and three nats-server processes forming one
JetStream cluster with file storage (JetStream acknowledges a publish once a majority of
the stream's replicas stored it, without fsync). Records are 1 KiB, replication factor 3.

Per round, for each Biplane topic mode (replication pull/push x commit policy isr/quorum
with durability fsync, and the `write` durability rows), one after another:
- `sync`: Biplane's blocking producer, a `send_and_wait` loop (dataplane/client/sync.py);
- `async`: Biplane's asyncio producer with one record in flight (`send`, then await it);
- `nats`: nats-py's JetStream `publish`, one in flight (it waits for the stream's ack);
each for `--seconds`, giving p50/p99/p999 and records/s, and the ratio Biplane/NATS of the
round's p50 (Biplane's sync row over the NATS row measured next to it). Then the load rows,
so no throughput is traded for latency: `full` (as fast as the producer goes, at most
`--outstanding` records unacknowledged, the producer's default batching) and `20k`
(open loop: one record every 1/20,000 s on a fixed schedule, latency counted from each
record's scheduled time, so a late send counts as waiting). The table at the end gives
medians over the rounds.

    .venv/bin/python scripts/bench_latency.py [--rounds 3] [--seconds 2] [--modes pull-isr-fsync,...]
        [--load-modes pull-isr-fsync] [--outstanding 1024] [--rate 20000]

nats-server comes from Debian (scripts/system-deps.sh installs it when missing, as root).
Every server binds 127.0.0.1 on free ports, keeps its data under one temporary directory
and is stopped by pid when the run ends, fails or is interrupted. It asserts nothing about
speed; it exits non-zero, naming the side, when a server fails or a send fails.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Awaitable, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "scripts")]
# The Biplane servers run this checkout's code, not whichever one the venv was installed from.
os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])

import nats  # noqa: E402
from nats.js.api import StorageType, StreamConfig  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from bench_kafka_peer import BenchError, JavaProcess as ServerProcess, tail  # noqa: E402
from cluster_harness import Cluster  # noqa: E402
from common import eventloop  # noqa: E402
from controller_harness import free_port  # noqa: E402
from dataplane.client import producer as async_producer  # noqa: E402
from dataplane.client import sync  # noqa: E402

RECORD_BYTES = 1024
STREAM = "BENCH"
SUBJECT = "bench.latency"
NATS_NODES = 3
START_TIMEOUT_S = 60
RETENTION_BYTES = 1024 ** 3
# Beyond it the producer is overrun: counted, not sent. One second at 20k records/s: a client
# that cannot keep the rate (nats-py's publish path tops out below it on two busy cores)
# queues at most that, well inside the 10 s after which a JetStream publish times out.
OPEN_LOOP_OUTSTANDING_MAX = 20_000

# mode name -> (replication_mode, commit_policy, durability)
MODES: dict[str, tuple[str, str, str]] = {
    f"{r}-{p}-{d}": (r, p, d) for d in ("fsync", "write") for r in ("pull", "push") for p in ("isr", "quorum")}
DEFAULT_MODES = "pull-isr-fsync,pull-quorum-fsync,push-isr-fsync,push-quorum-fsync,pull-isr-write,push-quorum-write"


@dataclasses.dataclass(frozen=True)
class Row:
    n: int
    seconds: float
    latencies_ms: list[float]
    overrun: int = 0

    @property
    def records_per_s(self) -> float:
        return self.n / self.seconds if self.seconds else 0.0

    def pct(self, q: float) -> float:
        lat = self.latencies_ms
        return lat[min(len(lat) - 1, int(len(lat) * q))] if lat else float("nan")


def row(latencies_s: list[float], elapsed_s: float, overrun: int = 0) -> Row:
    return Row(len(latencies_s), elapsed_s, sorted(1000 * x for x in latencies_s), overrun)


# ---------------------------------------------------------------- NATS JetStream


def nats_server_binary() -> str:
    found = shutil.which("nats-server") or next(
        (p for p in ("/usr/sbin/nats-server", "/usr/bin/nats-server") if os.access(p, os.X_OK)), None)
    if found:
        return found
    print("nats-server missing: installing it from Debian (scripts/system-deps.sh)", file=sys.stderr)
    if subprocess.run(["bash", str(ROOT / "scripts" / "system-deps.sh")]).returncode != 0:
        raise BenchError("nats-server is missing and scripts/system-deps.sh could not install it "
                         "(as root: apt-get install -y nats-server)")
    return nats_server_binary()


class NatsCluster:
    """Three nats-server processes routed into one JetStream cluster, file storage under `root`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.binary = nats_server_binary()
        self.client_ports = [free_port() for _ in range(NATS_NODES)]
        self.route_ports = [free_port() for _ in range(NATS_NODES)]
        self.processes: list[ServerProcess] = []

    @property
    def urls(self) -> list[str]:
        return [f"nats://127.0.0.1:{p}" for p in self.client_ports]

    def _config(self, i: int) -> Path:
        routes = ", ".join(f"nats-route://127.0.0.1:{p}" for j, p in enumerate(self.route_ports) if j != i)
        store = self.root / f"nats-{i}"
        store.mkdir(parents=True, exist_ok=True)
        path = self.root / f"nats-{i}.conf"
        path.write_text(f"""server_name: n{i}
listen: 127.0.0.1:{self.client_ports[i]}
jetstream {{ store_dir: "{store}", max_memory_store: 268435456, max_file_store: 4294967296 }}
cluster {{ name: bench, listen: 127.0.0.1:{self.route_ports[i]}, routes: [{routes}] }}
""")
        return path

    def start(self) -> None:
        for i in range(NATS_NODES):
            self.processes.append(ServerProcess(f"nats-{i}", [self.binary, "-c", str(self._config(i))],
                                                self.root / f"nats-{i}.log"))

    def check_alive(self) -> None:
        for p in self.processes:
            if not p.alive():
                raise BenchError(f"{p.name} exited (code {p.proc.returncode}); its log:\n{tail(p.log_path)}")

    def stop(self) -> None:
        for p in self.processes:
            p.stop()


async def nats_stream(cluster: NatsCluster) -> Any:
    """A connected client and its JetStream context, once the R3 stream exists (the
    JetStream meta leader is elected a moment after the servers start)."""
    nc = await nats.connect(servers=cluster.urls, connect_timeout=5)
    js = nc.jetstream(timeout=10)
    deadline = time.monotonic() + START_TIMEOUT_S
    last: Exception | None = None
    while time.monotonic() < deadline:
        cluster.check_alive()
        try:
            await js.add_stream(StreamConfig(name=STREAM, subjects=[SUBJECT], num_replicas=3,
                                             storage=StorageType.FILE, max_bytes=RETENTION_BYTES))
            await js.publish(SUBJECT, b"warm-up")
            return nc, js
        except Exception as exc:   # no meta leader yet, or the stream's own leader not yet elected
            last = exc
            await asyncio.sleep(0.5)
    raise BenchError(f"NATS JetStream: no R3 stream within {START_TIMEOUT_S} s (last error: {last!r})")


# ---------------------------------------------------------------- the rows


async def one_in_flight(send: Callable[[], Awaitable[Any]], seconds: float) -> Row:
    for _ in range(20):   # warm-up: connections, metadata, the producer id
        await send()
    latencies = []
    start = time.perf_counter()
    deadline = start + seconds
    now = start
    while now < deadline:
        await send()
        t = time.perf_counter()
        latencies.append(t - now)
        now = t
    return row(latencies, now - start)


def sync_loop(producer: sync.Producer, topic: str, value: bytes, seconds: float) -> Row:
    for _ in range(20):
        producer.send_and_wait(topic, value, partition=0)
    latencies = []
    start = time.perf_counter()
    deadline = start + seconds
    now = start
    while now < deadline:
        producer.send_and_wait(topic, value, partition=0)
        t = time.perf_counter()
        latencies.append(t - now)
        now = t
    return row(latencies, now - start)


class Pacer:
    """Sends records through `start_one(done)` either as fast as `outstanding` allows (rate 0)
    or one every 1/rate s on a fixed schedule; `done(scheduled)` is called at each ack."""

    def __init__(self, seconds: float, rate: float, outstanding: int) -> None:
        self.seconds, self.rate, self.outstanding_max = seconds, rate, outstanding
        self.latencies: list[float] = []
        self.errors: list[BaseException] = []
        self.outstanding = 0
        self.room = asyncio.Event()

    def done(self, sent_at: float, error: BaseException | None = None) -> None:
        if error is not None:
            self.errors.append(error)
        else:
            self.latencies.append(time.perf_counter() - sent_at)
        self.outstanding -= 1
        self.room.set()

    async def run(self, start_one: Callable[[float], Awaitable[None]]) -> Row:
        start = time.perf_counter() + 0.01
        deadline = start + self.seconds
        overrun = 0
        i = 0
        while True:
            if self.rate:
                scheduled = start + i / self.rate
                if scheduled >= deadline:
                    break
                delay = scheduled - time.perf_counter()
                if delay > 0.001:
                    await asyncio.sleep(delay)
                if self.outstanding >= OPEN_LOOP_OUTSTANDING_MAX:
                    overrun += 1
                    i += 1
                    continue
            else:
                scheduled = time.perf_counter()
                if scheduled >= deadline:
                    break
                while self.outstanding >= self.outstanding_max:
                    self.room.clear()
                    await self.room.wait()
                scheduled = time.perf_counter()
            self.outstanding += 1
            await start_one(scheduled)
            i += 1
        wait_until = time.perf_counter() + 30
        while self.outstanding and time.perf_counter() < wait_until:
            self.room.clear()
            try:
                await asyncio.wait_for(self.room.wait(), 1)
            except TimeoutError:
                pass
        if self.errors:
            raise BenchError(f"{len(self.errors)} sends failed, the first: {self.errors[0]!r}")
        if self.outstanding:
            raise BenchError(f"{self.outstanding} records unacknowledged 30 s after the row ended")
        return row(self.latencies, time.perf_counter() - start, overrun)


async def biplane_load(producer: async_producer.Producer, topic: str, value: bytes, seconds: float,
                       rate: float, outstanding: int) -> Row:
    pacer = Pacer(seconds, rate, outstanding)

    async def start_one(scheduled: float) -> None:
        future = await producer.send(topic, value, partition=0)
        future.add_done_callback(lambda f: pacer.done(scheduled, f.exception()))
    return await pacer.run(start_one)


async def nats_load(js: Any, value: bytes, seconds: float, rate: float, outstanding: int) -> Row:
    pacer = Pacer(seconds, rate, outstanding)
    loop = asyncio.get_running_loop()

    def finished(scheduled: float, task: asyncio.Task) -> None:
        pacer.done(scheduled, task.exception())

    async def start_one(scheduled: float) -> None:
        task = loop.create_task(js.publish(SUBJECT, value))
        task.add_done_callback(lambda t: finished(scheduled, t))
    return await pacer.run(start_one)


# ---------------------------------------------------------------- the run


def line(label: str, r: Row, ratio: str = "") -> str:
    extra = f"  overrun {r.overrun}" if r.overrun else ""
    return (f"  {label:<34}{r.n:>8}{r.records_per_s:>11,.0f}{r.pct(0.5):>9.3f}{r.pct(0.99):>9.3f}"
            f"{r.pct(0.999):>9.3f}{ratio:>9}{extra}")


HEADER = f"  {'row':<34}{'n':>8}{'records/s':>11}{'p50 ms':>9}{'p99 ms':>9}{'p999 ms':>9}{'B/N p50':>9}"


async def bench(args: argparse.Namespace, cluster: Cluster, nats_cluster: NatsCluster) -> None:
    value = os.urandom(RECORD_BYTES)
    modes = [m for m in args.modes.split(",") if m]
    load_modes = [m for m in args.load_modes.split(",") if m]
    for m in modes + load_modes:
        if m not in MODES:
            raise SystemExit(f"unknown mode {m!r}: one of {', '.join(MODES)}")
    topics = {}
    for m in dict.fromkeys(modes + load_modes):
        replication, policy, durability = MODES[m]
        topics[m] = f"lat-{m}"
        cluster.create_topic(topics[m], partitions=1, replication_factor=3, config={
            "replication_mode": replication, "commit_policy": policy, "durability": durability,
            "min_insync_replicas": 2, "retention_bytes": RETENTION_BYTES})
    nc, js = await nats_stream(nats_cluster)
    bootstrap = cluster.address(1)
    blocking = sync.Producer(bootstrap=f"{bootstrap[0]}:{bootstrap[1]}", acks="all")
    aio = await async_producer.Producer(bootstrap=f"{bootstrap[0]}:{bootstrap[1]}", acks="all").start()
    results: dict[tuple[str, str], list[Row]] = {}
    ratios: dict[str, list[float]] = {}

    def keep(key: tuple[str, str], r: Row) -> Row:
        results.setdefault(key, []).append(r)
        return r

    async def nats_one() -> None:
        await js.publish(SUBJECT, value)

    async def aio_one(topic: str) -> None:
        await (await aio.send(topic, value, partition=0))

    try:
        for rnd in range(1, args.rounds + 1):
            print(f"\nround {rnd}/{args.rounds}, load avg {os.getloadavg()[0]:.2f}")
            print(HEADER)
            for m in modes:
                topic = topics[m]
                s = keep((m, "biplane sync"), await asyncio.to_thread(sync_loop, blocking, topic, value, args.seconds))
                a = keep((m, "biplane async"), await one_in_flight(lambda: aio_one(topic), args.seconds))
                n = keep((m, "nats"), await one_in_flight(nats_one, args.seconds))
                nats_cluster.check_alive()
                ratio = s.pct(0.5) / n.pct(0.5)
                ratios.setdefault(m, []).append(ratio)
                print(line(f"{m} biplane sync", s, f"{ratio:.2f}"))
                print(line(f"{m} biplane async", a, f"{a.pct(0.5) / n.pct(0.5):.2f}"))
                print(line(f"{m} nats (1 in flight)", n), flush=True)
            for m in load_modes:
                for kind, rate in (("full", 0.0), (f"{args.rate / 1000:g}k", args.rate)):
                    b = keep((m, f"biplane {kind}"), await biplane_load(aio, topics[m], value, args.seconds, rate,
                                                                       args.outstanding))
                    n = keep((m, f"nats {kind}"), await nats_load(js, value, args.seconds, rate, args.outstanding))
                    nats_cluster.check_alive()
                    print(line(f"{m} biplane {kind}", b, f"{b.pct(0.5) / n.pct(0.5):.2f}"))
                    print(line(f"{m} nats {kind}", n), flush=True)
    finally:
        await aio.close()
        await asyncio.to_thread(blocking.close)
        await nc.close()

    print(f"\nmedians over {args.rounds} round(s), {args.seconds:g} s per row; 'full' keeps at most "
          f"{args.outstanding} records unacknowledged; B/N: the median of the rounds' Biplane/NATS p50 ratios "
          f"(sync rows), else the ratio of the medians")
    print(f"  {'row':<34}{'records/s':>11}{'p50 ms':>9}{'p99 ms':>9}{'p999 ms':>9}{'B/N p50':>9}{'B/N rec/s':>10}")
    for (m, side), rows in results.items():
        med = {k: statistics.median(f(r) for r in rows) for k, f in (
            ("rate", lambda r: r.records_per_s), ("p50", lambda r: r.pct(0.5)), ("p99", lambda r: r.pct(0.99)),
            ("p999", lambda r: r.pct(0.999)))}
        ratio = rate_ratio = ""
        if side.startswith("biplane"):
            peer = results[(m, "nats" if side in ("biplane sync", "biplane async") else "nats" + side[7:])]
            peer_p50 = statistics.median(r.pct(0.5) for r in peer)
            peer_rate = statistics.median(r.records_per_s for r in peer)
            ratio = f"{statistics.median(ratios[m]):.2f}" if side == "biplane sync" else f"{med['p50'] / peer_p50:.2f}"
            rate_ratio = f"{med['rate'] / peer_rate:.2f}"
        print(f"  {m + ' ' + side:<34}{med['rate']:>11,.0f}{med['p50']:>9.3f}{med['p99']:>9.3f}{med['p999']:>9.3f}"
              f"{ratio:>9}{rate_ratio:>10}")


def broker_figures(cluster: Cluster) -> None:
    """Each broker's event-loop lag and fsync figures since it started (its /metrics): what a
    flush run inline on the loop costs the loop shows here."""
    print("\nbrokers since start: event-loop lag samples over 5 ms (the watchdog's periodic check), "
          "the longest stall, fsync runs and their mean")
    for broker_id, broker in cluster.brokers.items():
        url = f"http://127.0.0.1:{broker.metrics_port}/metrics"
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:
                text = answer.read().decode()
        except OSError as exc:
            print(f"  broker {broker_id}: no metrics ({exc})")
            continue
        samples = {(s.name, s.labels.get("le")): s.value for family in text_string_to_metric_families(text)
                   for s in family.samples if not s.labels.keys() - {"le"}}
        lag_n = samples.get(("biplane_broker_event_loop_lag_seconds_count", None), 0.0)
        lag_fast = samples.get(("biplane_broker_event_loop_lag_seconds_bucket", "0.005"), 0.0)
        stall_max = samples.get(("biplane_broker_event_loop_stall_max_seconds", None), 0.0)
        fsyncs = samples.get(("biplane_broker_fsync_latency_seconds_count", None), 0.0)
        fsync_s = samples.get(("biplane_broker_fsync_latency_seconds_sum", None), 0.0)
        print(f"  broker {broker_id}: lag > 5 ms {lag_n - lag_fast:.0f} of {lag_n:.0f}; longest stall "
              f"{1000 * stall_max:.1f} ms; {fsyncs:.0f} fsyncs, mean {1000 * fsync_s / fsyncs if fsyncs else 0:.3f} ms")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=2.0, help="per row")
    ap.add_argument("--modes", default=DEFAULT_MODES, help=f"one-in-flight rows, of: {', '.join(MODES)} ('' skips them)")
    ap.add_argument("--load-modes", default="pull-isr-fsync", help="modes of the full-load and fixed-rate rows "
                                                                     "('' skips them)")
    ap.add_argument("--outstanding", type=int, default=1024, help="records unacknowledged at most at full load")
    ap.add_argument("--rate", type=float, default=20_000, help="records/s of the open-loop row")
    args = ap.parse_args()
    if args.rounds < 1 or args.seconds <= 0 or args.outstanding < 1 or args.rate <= 0:
        raise SystemExit("--rounds, --seconds, --outstanding and --rate must be positive")
    with tempfile.TemporaryDirectory(prefix="bench-latency-") as tmp:
        nats_cluster = NatsCluster(Path(tmp))
        try:
            nats_cluster.start()
            with Cluster(Path(tmp) / "biplane", brokers=3, broker_args=["--log-level", "WARNING"]) as cluster:
                print(f"Biplane: 1 controller + 3 brokers ({eventloop.loop_name()}); NATS JetStream: 3 "
                      f"nats-server ({nats_cluster.binary}), file storage; RF 3, {RECORD_BYTES} B records, "
                      f"{os.cpu_count()} cores")
                eventloop.run(bench(args, cluster, nats_cluster))
                broker_figures(cluster)
        except BenchError as exc:
            print(f"bench_latency: {exc}", file=sys.stderr)
            return 1
        finally:
            nats_cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
