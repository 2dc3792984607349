"""A synthetic but realistic history of snapshot files, deterministic by seed.

The story: brokers 1..B-1 start with three topics: `clicks` (hot, and skewed:
its replicas sit only on the lower half of the brokers), `orders` (spread
round-robin) and `audit` (small, RF 2). Halfway through, broker B joins and
topic `metrics` is created with each partition led by B. Every replica grows
at its partition's constant produce rate, so each broker fills at a known
rate (`expected_growth_bytes_per_day`), around which the reported disk use
jitters by up to `disk_noise_bytes`.

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
from collections.abc import Callable
from multiprocessing import get_context
from pathlib import Path

from controller.snapshots import SnapshotRows, write_snapshot_file

DAY_S = 86_400
GIB = 1 << 30
TIB = 1 << 40
RECORD_BYTES = 1_000  # average record size, to derive offsets from bytes
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

    def __post_init__(self) -> None:
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
    base_bytes: int  # disk used by things other than replicas
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
    """Each broker's true disk growth per day at snapshot `at_index` (default: the last)."""
    index = spec.snapshots - 1 if at_index is None else at_index
    brokers, parts = _layout(spec)
    growth = {b.broker_id: 0.0 for b in brokers if b.joined_index <= index}
    for p in parts:
        if p.created_index <= index:
            for b in p.replicas:
                growth[b] += p.rate_bytes_per_s * DAY_S
    return growth


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


def _rows(spec: HistorySpec, brokers: list[_Broker], index: int) -> SnapshotRows:
    rng = random.Random(spec.seed * 1_000_003 + index)
    now_ms = spec.start_ms + index * spec.interval_ms
    live = [b for b in brokers if b.joined_index <= index]
    topic_rows, config_rows, partition_rows, replica_rows, present = _static_rows(spec, index >= spec.join_index)
    usage_rows = []
    used = {b.broker_id: b.base_bytes for b in live}
    interval_s = spec.interval_ms / 1000
    for p in present:
        leader = p.replicas[0]
        size = p.initial_bytes + int(p.rate_bytes_per_s * (index - p.created_index) * interval_s)
        rate = p.rate_bytes_per_s * rng.uniform(0.9, 1.1)
        for b in p.replicas:
            if b == leader:
                end = size // RECORD_BYTES
                usage_rows.append((p.topic, p.partition, b, now_ms, size, 0, end, end, rate, rate / RECORD_BYTES,
                                   rate * (1 + len(p.replicas))))
                used[b] += size
            else:
                lag = rng.randrange(0, 20_000)
                end = (size - lag) // RECORD_BYTES
                usage_rows.append((p.topic, p.partition, b, now_ms, size - lag, 0, end, max(0, end - 5), rate,
                                   rate / RECORD_BYTES, 0.0))
                used[b] += size - lag
    broker_rows, broker_usage_rows = [], []
    for b in live:
        disk_used = min(b.capacity_bytes, used[b.broker_id] + rng.randrange(-spec.disk_noise_bytes,
                                                                             spec.disk_noise_bytes + 1))
        broker_rows.append((b.broker_id, f"broker-{b.broker_id}.biplane.internal", 9092, b.rack, 100 - b.broker_id,
                            "unfenced", b.capacity_bytes))
        broker_usage_rows.append((b.broker_id, now_ms, b.capacity_bytes, disk_used, b.capacity_bytes - disk_used))
    # Records so far: registrations, topic and partition creations, and some ISR churn per interval.
    offset = len(live) * 2 + len(topic_rows) + len(present) + index * 3
    return SnapshotRows(
        snapshot_time_ms=now_ms, metadata_offset=offset, controller_id=1,
        brokers=tuple(broker_rows), topics=topic_rows, topic_configs=config_rows,
        partitions=partition_rows, replicas=replica_rows, replica_usage=tuple(usage_rows),
        broker_usage=tuple(broker_usage_rows),
    )


def _write_range(args: tuple[HistorySpec, str, int, int]) -> int:
    spec, out, start, stop = args
    brokers, _ = _layout(spec)
    for index in range(start, stop):
        write_snapshot_file(Path(out), _rows(spec, brokers, index))
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
