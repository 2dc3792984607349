"""A synthetic but realistic history of snapshot files, deterministic by seed, whose truth is known.

The story: brokers 1..B-1 start with three topics: `clicks` (hot, and skewed:
its replicas sit only on the lower half of the brokers), `orders` (spread
round-robin) and `audit` (small, RF 2). Halfway through, broker B joins and
topic `metrics` is created with each partition led by B. Every replica grows
at its partition's constant produce rate, so the truth is known in closed form:

- Biplane's own bytes (`log_bytes`, the sum of a broker's replica sizes; each
  follower lags its leader by exactly FOLLOWER_LAG_BYTES) grow at
  `expected_growth_bytes_per_day`;
- the filesystem also holds other files: `other_bytes` of each broker, which
  jitter by up to `disk_noise_bytes`, and on broker 1 grow by
  `other_growth_bytes_per_day` (a report that fits the whole filesystem's use
  gets broker 1's growth wrong by that much);
- producers write in bursts (BURST_DUTY of the time), so the brokers' 1-second
  rate samples are mostly 0 while their byte counters grow at exactly
  `expected_throughput_bytes_per_s`; usage reports are measured a few hundred
  ms before the snapshot (`usage_delay_ms`), so only differencing the counters
  over their own timestamps gives the exact rate;
- broker `restart_broker` restarts a third of an interval before snapshot
  `restart_index`: its counters start again from zero;
- the first `legacy_snapshots` files are written in schema 1 (brokers from
  before byte counters and `log_bytes`), as a cluster upgraded mid-history;
  the upgrade restarts every broker a third of an interval before the first
  schema-2 snapshot.

Files go through `write_snapshot_file`, the function the controller's store
uses, one level below the image adapter: building 10,000 images of 3,000
partitions through records would only retest the image code (tested on its
own), and the adapter that maps an image to rows is tested separately.
Each snapshot draws its noise from its own seeded generator, so snapshots
can be written in any order or in parallel with identical results.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import random
import sqlite3
from collections.abc import Callable
from multiprocessing import get_context
from pathlib import Path

from controller.snapshot_schema import COLUMNS_ADDED
from controller.snapshots import SnapshotRows, write_snapshot_file

DAY_S = 86_400
GIB = 1 << 30
TIB = 1 << 40
RECORD_BYTES = 1_000  # average record size, to derive offsets from bytes
FOLLOWER_LAG_BYTES = 10_000  # every follower is exactly this far behind its leader
BURST_DUTY = 0.2  # producers write at rate / BURST_DUTY for this share of the time, else not at all
START_MS_DEFAULT = 1_767_225_600_000  # 2026-01-01T00:00:00Z


@dataclasses.dataclass(frozen=True, kw_only=True)
class HistorySpec:
    brokers: int = 6
    partitions: int = 60
    snapshots: int = 96
    interval_ms: int = 15 * 60_000
    seed: int = 1
    start_ms: int = START_MS_DEFAULT
    disk_noise_bytes: int = GIB // 2
    other_growth_bytes_per_day: int = 200 * GIB  # non-Biplane files on broker 1's filesystem
    restart_broker: int = 2
    restart_index: int | None = None  # default: three quarters through the history
    legacy_snapshots: int = 0  # written in schema 1, before the upgrade
    usage_delay_ms: int = 250  # broker b measured its usage b x this before the snapshot

    def __post_init__(self) -> None:
        if not 0 <= self.legacy_snapshots <= self.snapshots:
            raise ValueError(f"--legacy-snapshots must be between 0 and --snapshots ({self.snapshots}), "
                             f"got {self.legacy_snapshots}")
        if self.brokers < 4:
            raise ValueError(f"--brokers must be at least 4 (three to start, one to join), got {self.brokers}")
        if self.partitions < 4:
            raise ValueError(f"--partitions must be at least 4 (one per topic), got {self.partitions}")
        if self.snapshots < 1:
            raise ValueError(f"--snapshots must be at least 1, got {self.snapshots}")
        if self.interval_ms < 1000:
            raise ValueError(f"--interval must be at least 1 s (file names have one-second resolution), "
                             f"got {self.interval_ms} ms")

    @property
    def joiner(self) -> int:
        return self.brokers

    @property
    def join_index(self) -> int:
        return self.snapshots // 2

    @property
    def restart_at(self) -> int:
        return self.snapshots * 3 // 4 if self.restart_index is None else self.restart_index

    def snapshot_ms(self, index: int) -> int:
        return self.start_ms + index * self.interval_ms

    def usage_at_ms(self, index: int, broker_id: int) -> int:
        return self.snapshot_ms(index) - broker_id * self.usage_delay_ms

    def counters_since_ms(self, index: int, broker_id: int) -> int:
        """When broker `broker_id`'s byte counters last started from zero, as of snapshot `index`:
        its process start (the history's start, the upgrade, or its restart)."""
        since = self.start_ms - self.interval_ms
        for event in (self.legacy_snapshots, self.restart_at if broker_id == self.restart_broker else -1):
            if 0 < event <= index:
                since = max(since, self.snapshot_ms(event) - self.interval_ms // 3)
        return since


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Partition:
    topic: str
    partition: int
    replicas: tuple[int, ...]
    rate_bytes_per_s: float
    initial_bytes: int
    created_index: int  # first snapshot that has it


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Broker:
    broker_id: int
    rack: str
    capacity_bytes: int
    base_bytes: int  # disk used by things other than Biplane's logs, at the start
    joined_index: int


def _layout(spec: HistorySpec) -> tuple[list[_Broker], list[_Partition]]:
    rng = random.Random(spec.seed)
    brokers = [
        _Broker(broker_id=b, rack=f"rack-{(b - 1) % 3}", capacity_bytes=(4 if b % 2 else 8) * TIB,
                base_bytes=rng.randrange(10 * GIB, 30 * GIB),
                joined_index=spec.join_index if b == spec.joiner else 0)
        for b in range(1, spec.brokers + 1)
    ]
    first = list(range(1, spec.brokers))  # brokers present from the start
    # Sizes and rates are set for ~12 partitions per starting broker (the defaults); bigger
    # clusters scale them down so brokers start a third full and fill over weeks, not hours.
    scale = min(1.0, 12 * len(first) / spec.partitions)
    hot = first[: max(3, len(first) // 2)]
    n_clicks = max(1, spec.partitions * 2 // 5)
    n_orders = max(1, spec.partitions * 3 // 10)
    n_metrics = max(1, spec.partitions // 10)
    n_audit = spec.partitions - n_clicks - n_orders - n_metrics
    if n_audit < 1:
        n_clicks -= 1 - n_audit
        n_audit = 1
    parts = []

    def ring(members: list[int], start: int, count: int) -> tuple[int, ...]:
        return tuple(members[(start + k) % len(members)] for k in range(count))

    for p in range(n_clicks):
        parts.append(_Partition(topic="clicks", partition=p, replicas=ring(hot, p, 3),
                                rate_bytes_per_s=scale * 200_000 / (1 + p % 4),
                                initial_bytes=int(scale * rng.randrange(20 * GIB, 60 * GIB)),
                                created_index=0))
    for p in range(n_orders):
        parts.append(_Partition(topic="orders", partition=p, replicas=ring(first, p, 3),
                                rate_bytes_per_s=scale * rng.uniform(30_000, 70_000),
                                initial_bytes=int(scale * rng.randrange(5 * GIB, 15 * GIB)), created_index=0))
    for p in range(n_audit):
        parts.append(_Partition(topic="audit", partition=p, replicas=ring(first, p, 2),
                                rate_bytes_per_s=scale * rng.uniform(5_000, 15_000),
                                initial_bytes=int(scale * rng.randrange(1 * GIB, 3 * GIB)), created_index=0))
    for p in range(n_metrics):
        parts.append(_Partition(topic="metrics", partition=p, replicas=(spec.joiner, first[p % len(first)]),
                                rate_bytes_per_s=scale * rng.uniform(60_000, 100_000), initial_bytes=0,
                                created_index=spec.join_index))
    return brokers, parts


def expected_growth_bytes_per_day(spec: HistorySpec, *, at_index: int | None = None) -> dict[int, float]:
    """Each broker's true growth of Biplane's bytes per day at snapshot `at_index` (default: the last)."""
    return {b: (t["produce"] + t["replicated"]) * DAY_S
            for b, t in expected_throughput_bytes_per_s(spec, at_index=at_index).items()}


def expected_throughput_bytes_per_s(spec: HistorySpec, *, at_index: int | None = None
                                    ) -> dict[int, dict[str, float]]:
    """Per broker, the true bytes per second at snapshot `at_index` (default: the last) of
    `produce` (client writes to the partitions it leads), `replicated` (writes to the
    partitions it follows) and `fetch` (every partition it leads is read by its followers and
    one consumer group)."""
    index = spec.snapshots - 1 if at_index is None else at_index
    brokers, parts = _layout(spec)
    rates = {b.broker_id: {"produce": 0.0, "replicated": 0.0, "fetch": 0.0}
             for b in brokers if b.joined_index <= index}
    for p in parts:
        if p.created_index <= index:
            rates[p.replicas[0]]["produce"] += p.rate_bytes_per_s
            rates[p.replicas[0]]["fetch"] += p.rate_bytes_per_s * len(p.replicas)
            for b in p.replicas[1:]:
                rates[b]["replicated"] += p.rate_bytes_per_s
    return rates


def expected_other_growth_bytes_per_day(spec: HistorySpec) -> dict[int, float]:
    """How fast the files other than Biplane's grow on each broker's filesystem."""
    return {b.broker_id: float(spec.other_growth_bytes_per_day if b.broker_id == 1 else 0) for b in _layout(spec)[0]}


@functools.lru_cache(maxsize=4)
def _static_rows(spec: HistorySpec, joined: bool) -> tuple[tuple, tuple, tuple, tuple, tuple]:
    """Rows that only change when the broker joins: topics, configs, partitions, replicas, and
    the partitions present, before (joined=False) or after the join."""
    _, parts = _layout(spec)
    present = tuple(p for p in parts if p.created_index == 0 or joined)
    topics: dict[str, list[_Partition]] = {}
    for p in present:
        topics.setdefault(p.topic, []).append(p)
    topic_rows, config_rows = [], []
    for name in sorted(topics):
        rf = len(topics[name][0].replicas)
        topic_rows.append((name, len(topics[name]), rf))
        config = {"partitions": len(topics[name]), "replication_factor": rf, "replication_mode": "pull",
                  "commit_policy": "isr", "min_insync_replicas": min(2, rf)}
        config_rows += [(name, key, value if isinstance(value, str) else json.dumps(value))
                        for key, value in sorted(config.items())]
    partition_rows = tuple((p.topic, p.partition, p.replicas[0], 1, 1, len(p.replicas), len(p.replicas), 0)
                           for p in present)
    replica_rows = tuple((p.topic, p.partition, b, position, int(position == 0), 1, 0, 0)
                         for p in present for position, b in enumerate(p.replicas))
    return tuple(topic_rows), tuple(config_rows), partition_rows, replica_rows, present


def _bytes_since(p: _Partition, spec: HistorySpec, since_ms: int, at_ms: int) -> int:
    """Bytes produced to `p` from `since_ms` to `at_ms` (it is written to from its creation on)."""
    begin = max(since_ms, spec.snapshot_ms(p.created_index))
    return int(p.rate_bytes_per_s * max(0, at_ms - begin) / 1000)


def _rows(spec: HistorySpec, brokers: list[_Broker], index: int) -> SnapshotRows:
    rng = random.Random(spec.seed * 1_000_003 + index)
    now_ms = spec.snapshot_ms(index)
    live = [b for b in brokers if b.joined_index <= index]
    topic_rows, config_rows, partition_rows, replica_rows, present = _static_rows(spec, index >= spec.join_index)
    usage_rows = []
    log_bytes = {b.broker_id: 0 for b in live}
    totals = {b.broker_id: {"produce": 0, "replicated": 0, "fetch": 0} for b in live}
    interval_s = spec.interval_ms / 1000
    for p in present:
        leader = p.replicas[0]
        size = p.initial_bytes + int(p.rate_bytes_per_s * (index - p.created_index) * interval_s)
        # A 1-second sample sees a burst (rate / BURST_DUTY) or nothing.
        rate = p.rate_bytes_per_s / BURST_DUTY if rng.random() < BURST_DUTY else 0.0
        for b in p.replicas:
            at_ms = spec.usage_at_ms(index, b)
            written = _bytes_since(p, spec, spec.counters_since_ms(index, b), at_ms)
            if b == leader:
                totals[b]["produce"] += written
                totals[b]["fetch"] += written * len(p.replicas)
                end = size // RECORD_BYTES
                usage_rows.append((p.topic, p.partition, b, at_ms, size, 0, end, end, rate, rate / RECORD_BYTES,
                                   rate * len(p.replicas)))
                log_bytes[b] += size
            else:
                totals[b]["replicated"] += written
                follower_size = max(0, size - FOLLOWER_LAG_BYTES)
                end = follower_size // RECORD_BYTES
                usage_rows.append((p.topic, p.partition, b, at_ms, follower_size, 0, end, max(0, end - 5), rate,
                                   rate / RECORD_BYTES, 0.0))
                log_bytes[b] += follower_size
    broker_rows, broker_usage_rows = [], []
    other_growth = expected_other_growth_bytes_per_day(spec)
    for b in live:
        other = (b.base_bytes + int(other_growth[b.broker_id] * index * interval_s / DAY_S)
                 + rng.randrange(-spec.disk_noise_bytes, spec.disk_noise_bytes + 1))
        disk_used = min(b.capacity_bytes, log_bytes[b.broker_id] + other)
        broker_rows.append((b.broker_id, f"broker-{b.broker_id}.biplane.internal", 9092, b.rack, 100 - b.broker_id,
                            "unfenced", b.capacity_bytes))
        t = totals[b.broker_id]
        broker_usage_rows.append((b.broker_id, spec.usage_at_ms(index, b.broker_id), b.capacity_bytes, disk_used,
                                  b.capacity_bytes - disk_used, log_bytes[b.broker_id],
                                  spec.counters_since_ms(index, b.broker_id), t["produce"], t["replicated"],
                                  t["fetch"]))
    # Records so far: registrations, topic and partition creations, and some ISR churn per interval.
    offset = len(live) * 2 + len(topic_rows) + len(present) + index * 3
    return SnapshotRows(
        snapshot_time_ms=now_ms, metadata_offset=offset, controller_id=1,
        brokers=tuple(broker_rows), topics=topic_rows, topic_configs=config_rows,
        partitions=partition_rows, replicas=replica_rows, replica_usage=tuple(usage_rows),
        broker_usage=tuple(broker_usage_rows),
    )


def write_as_schema_1(path: Path) -> None:
    """Rewrite a snapshot file as schema 1 wrote it: without the columns schema 2 added."""
    with sqlite3.connect(path) as conn:
        for table, column in COLUMNS_ADDED:
            conn.execute(f"ALTER TABLE [{table}] DROP COLUMN [{column}]")
        conn.execute("UPDATE cluster SET schema_version = 1")
    conn.close()


def _write_range(args: tuple[HistorySpec, str, int, int]) -> int:
    spec, out, start, stop = args
    brokers, _ = _layout(spec)
    for index in range(start, stop):
        path = write_snapshot_file(Path(out), _rows(spec, brokers, index))
        if index < spec.legacy_snapshots:
            write_as_schema_1(path)
    return stop - start


def generate_history(spec: HistorySpec, out: Path, *, jobs: int = 1,
                     progress: Callable[[int, int], None] | None = None) -> list[Path]:
    """Write `spec.snapshots` files into `out` (created if needed); returns their paths, oldest first."""
    out.mkdir(parents=True, exist_ok=True)
    chunk = 50
    ranges = [(spec, str(out), s, min(s + chunk, spec.snapshots)) for s in range(0, spec.snapshots, chunk)]
    done = 0
    if jobs <= 1:
        for r in ranges:
            done += _write_range(r)
            if progress:
                progress(done, spec.snapshots)
    else:
        with get_context("fork").Pool(jobs) as pool:
            for count in pool.imap(_write_range, ranges):
                done += count
                if progress:
                    progress(done, spec.snapshots)
    return sorted(p for p in out.iterdir() if p.name.startswith("snapshot-"))
