"""The capacity report: Spark reads the snapshot history, pure planning answers the questions.

Stages (each announced on stderr):
1. list the inputs on the driver (names only; foreign names become warnings);
2. read per-broker series from every file on the executors, in one pass that also
   names the files it could not read;
3. fit growth per broker in Spark (least squares over the last `fit_days`);
4. read the latest snapshot's placement (on an executor) and plan: skew,
   balanced placement, what-ifs;
5. write CSVs, plots and the HTML page.
"""
from __future__ import annotations

import dataclasses
import glob
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.window import Window

from controller.report import planning
from controller.report.datasource import FORMAT_NAME
from controller.snapshot_schema import FILE_NAME_RE, TEMP_PREFIX
from controller.snapshots import iso_utc

DAY_MS = 86_400_000
MIB = 1 << 20
THROTTLE_BYTES_PER_S_MIN = 1024  # the smallest reassignment throttle a cluster takes


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReportOptions:
    fit_days: float = 7.0  # least squares over each broker's last fit_days of history
    forecast_snapshots_min: int = 3
    forecast_span_ms_min: int = 3_600_000
    add_brokers: int = 1
    replication_factor_change: tuple[str, int] | None = None  # default: largest topic, RF + 1
    lose_broker: int | None = None  # default: the broker with the most replica bytes
    balance_tolerance_ratio: float = 0.05
    moves_max: int = 100_000
    splits: int | None = None  # default: 2 x Spark's default parallelism
    throttle_bytes_per_s: int = 50 * MIB  # replication throttle the move plans are timed at
    horizon_days: float = 30.0  # the urgency chart: share of today's free space used within this
    plot_brokers: int = 6  # disk plots with forecast lines for this many of the most urgent brokers

    def __post_init__(self) -> None:
        if self.throttle_bytes_per_s < THROTTLE_BYTES_PER_S_MIN:
            raise ValueError(f"--throttle-mb-s must be at least {THROTTLE_BYTES_PER_S_MIN / MIB:g} "
                             f"({THROTTLE_BYTES_PER_S_MIN} bytes/s, the least a reassignment throttle may be), "
                             f"got {self.throttle_bytes_per_s / MIB:g}")
        if not self.horizon_days > 0:
            raise ValueError(f"--horizon-days must be > 0, got {self.horizon_days}")
        if self.plot_brokers < 0:
            raise ValueError(f"--plot-brokers must be >= 0, got {self.plot_brokers}")
        if not self.fit_days > 0:
            raise ValueError(f"--fit-days must be > 0, got {self.fit_days}")
        if self.add_brokers < 0:
            raise ValueError(f"--add-brokers must be >= 0, got {self.add_brokers}")
        if self.splits is not None and self.splits < 1:
            raise ValueError(f"--splits must be >= 1, got {self.splits}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReportResult:
    out_dir: Path
    html_path: Path
    tables: dict[str, pd.DataFrame]
    summary: dict[str, object]
    warnings: list[tuple[str, str]]
    plans: dict[str, dict[str, object]]  # reassign plans written to out_dir, by file name


class Progress:
    def __init__(self, stages: int, stream=sys.stderr) -> None:
        self.stages = stages
        self.stream = stream
        self.index = 0
        self.started = time.monotonic()

    def __call__(self, message: str) -> None:
        self.index += 1
        print(f"[capacity {self.index}/{self.stages} +{time.monotonic() - self.started:.1f}s] {message}",
              file=self.stream, flush=True)

    def note(self, message: str) -> None:
        print(f"[capacity] {message}", file=self.stream, flush=True)


def discover_inputs(inputs: list[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """Snapshot file paths (sorted by name, i.e. by time) and warnings for foreign names.

    Each input is a directory, a glob or a file. Temp files of a writer are skipped silently.
    """
    found: set[str] = set()
    warnings = []
    for entry in inputs:
        if os.path.isdir(entry):
            candidates = [os.path.join(entry, name) for name in os.listdir(entry)]
        else:
            candidates = glob.glob(entry) if glob.has_magic(entry) else [entry]
            if not candidates:
                warnings.append((entry, "no such file or nothing matches"))
        for path in candidates:
            name = os.path.basename(path)
            if name.startswith(TEMP_PREFIX) or os.path.isdir(path):
                continue
            if FILE_NAME_RE.match(name):
                found.add(os.path.abspath(path))
            else:
                warnings.append((path, "not a snapshot file name (snapshot-<yyyymmddThhmmssZ>-<offset>.sqlite)"))
    return sorted(found, key=os.path.basename), warnings


def read_table(spark: SparkSession, table: str, paths: list[str], splits: int) -> DataFrame:
    return (spark.read.format(FORMAT_NAME).option("table", table).option("paths", json.dumps(paths))
            .option("splits", str(splits)).load())


def to_pandas(frame: DataFrame) -> pd.DataFrame:
    """Collect a (small, already aggregated) result with 64-bit integers kept exact: plain
    `toPandas()` turns an integer column with a null into float64, which rounds byte counts
    past 2**53 and prints broker ids as 1.0."""
    return frame.toArrow().to_pandas(types_mapper=_exact_int64)


def _exact_int64(arrow_type: pa.DataType) -> pd.api.extensions.ExtensionDtype | None:
    return pd.Int64Dtype() if arrow_type == pa.int64() else None


def _rows(frame: pd.DataFrame) -> Iterable[Any]:
    """A frame's rows as namedtuples. Any: their fields are typed by the data, not statically."""
    return frame.itertuples(index=False)


# Where a broker's bytes/s in one snapshot come from (broker_timeseries.throughput_source).
FROM_COUNTERS = "counters"  # byte counters differenced with the broker's previous snapshot
FROM_COUNTERS_SINCE_RESTART = "counters since restart"  # it restarted in between: counted from zero
FROM_SAMPLES = "1-second samples (snapshot without byte counters)"  # schema 1 files
NO_EARLIER = "none: no earlier snapshot with counters"
COUNTER_DROPPED = "none: counters went down without a restart"
NO_NEW_REPORT = "none: no usage report since the previous snapshot"  # a broker that stopped reporting
RATES = (  # (reported column, counter column, sampled column)
    ("produce_bytes_per_s", "produce_bytes_total", "sampled_produce_bytes_per_s"),
    ("replication_in_bytes_per_s", "replicated_bytes_total", "sampled_replication_in_bytes_per_s"),
    ("fetch_bytes_per_s", "fetch_bytes_total", "sampled_fetch_bytes_per_s"),
)
BIPLANE_FROM_LOG_BYTES = "log_bytes"
BIPLANE_FROM_REPLICAS = "replica sizes (snapshot without log_bytes)"


def with_derived_columns(series: DataFrame) -> DataFrame:
    """Biplane's own bytes, the filesystem's other bytes, and bytes per second from counters.

    Biplane's bytes are the broker's `log_bytes`, or in older files the sum of its replicas'
    sizes (the same logs, counted per replica). Rates: per broker in snapshot order, each
    counter minus its previous value over the time between the two usage reports. If the
    counters restarted in between (a new `counters_since_ms`), the rate is the counter over the
    time since the restart. A file without counters keeps the brokers' 1-second samples, which
    miss whatever a burst wrote between samples; `throughput_source` says which applies.
    """
    order = Window.partitionBy("broker_id").orderBy("snapshot_time_ms", "metadata_offset", "file")

    def prev(name: str):
        return F.lag(name).over(order)

    at, since = F.col("usage_at_ms"), F.col("counters_since_ms")
    has = F.col("produce_bytes_total").isNotNull() & since.isNotNull() & at.isNotNull()
    prev_has = prev("produce_bytes_total").isNotNull() & prev("counters_since_ms").isNotNull()
    grew = F.lit(True)
    for _, counter, _ in RATES:
        grew = grew & (F.col(counter) >= prev(counter))
    same_run = has & prev_has & (since == prev("counters_since_ms")) & (at > prev("usage_at_ms"))
    restarted = (has & (at > since) & prev("snapshot_time_ms").isNotNull()
                 & (since >= F.coalesce(prev("usage_at_ms"), prev("snapshot_time_ms"))))
    frame = series
    for rate, _, sampled in RATES:
        frame = frame.withColumnRenamed(rate, sampled)
    for rate, counter, sampled in RATES:
        frame = frame.withColumn(rate, (
            F.when(~has, F.col(sampled))
            .when(same_run & grew, (F.col(counter) - prev(counter)) * 1000.0 / (at - prev("usage_at_ms")))
            .when(restarted, F.col(counter) * 1000.0 / (at - since))
            .otherwise(F.lit(None).cast("double"))))
    frame = frame.withColumn("throughput_source", (
        F.when(~has, F.lit(FROM_SAMPLES))
        .when(same_run & grew, F.lit(FROM_COUNTERS))
        .when(restarted, F.lit(FROM_COUNTERS_SINCE_RESTART))
        .when(same_run, F.lit(COUNTER_DROPPED))
        .when(has & (at == prev("usage_at_ms")), F.lit(NO_NEW_REPORT))
        .otherwise(F.lit(NO_EARLIER))))
    return (frame
            .withColumn("biplane_bytes", F.coalesce(F.col("log_bytes"), F.col("replica_bytes")))
            .withColumn("biplane_bytes_source", F.when(F.col("log_bytes").isNotNull(), F.lit(BIPLANE_FROM_LOG_BYTES))
                        .otherwise(F.lit(BIPLANE_FROM_REPLICAS)))
            .withColumn("other_bytes", F.col("disk_used_bytes") - F.col("biplane_bytes")))


FORECAST_COLUMNS = [
    "broker_id", "rack", "days_until_full", "full_at", "growth_bytes_per_day", "biplane_bytes",
    "filesystem_free_bytes", "biplane_capacity_bytes", "filesystem_total_bytes", "filesystem_used_bytes",
    "other_bytes", "points", "span_hours", "fit_from", "fit_to", "last_ms", "r2", "status",
]


def forecast(series: DataFrame, latest_ms: int, options: ReportOptions) -> pd.DataFrame:
    """Per broker: least squares of Biplane's own bytes on time (days) over its last fit_days,
    computed in Spark (regr_slope, regr_r2), then days until full, most urgent first.

    Full means Biplane's logs have taken the filesystem's free space: days = free bytes at
    the last snapshot / growth per day; the room Biplane has (`biplane_capacity_bytes`) is its
    bytes plus that free space, with the filesystem's total and its other files beside it. Each
    broker's window ends at its own last report; x is the time of its usage reports."""
    measured = series.where(F.col("biplane_bytes").isNotNull())
    per_broker = measured.groupBy("broker_id").agg(F.max("snapshot_time_ms").alias("last_ms"))
    fitted = (
        measured.join(per_broker, "broker_id")
        .where(F.col("snapshot_time_ms") >= F.greatest(F.col("last_ms") - int(options.fit_days * DAY_MS),
                                                       F.lit(0)))
        .withColumn("x_days", (F.coalesce(F.col("usage_at_ms"), F.col("snapshot_time_ms")) - F.lit(latest_ms))
                    / F.lit(float(DAY_MS)))
        .withColumn("y", F.col("biplane_bytes").cast("double"))
        .groupBy("broker_id")
        .agg(
            F.count("*").alias("points"),
            F.min("snapshot_time_ms").alias("first_ms"),
            F.max("snapshot_time_ms").alias("last_ms"),
            F.regr_slope("y", "x_days").alias("growth_bytes_per_day"),
            F.regr_r2("y", "x_days").alias("r2"),
            *(F.max_by(name, "snapshot_time_ms").alias(name) for name in (
                "biplane_bytes", "disk_used_bytes", "disk_total_bytes", "disk_free_bytes", "other_bytes", "rack")),
        )
        .orderBy("broker_id")
    )
    rows = []
    for r in _rows(to_pandas(fitted)):
        span_ms = int(r.last_ms - r.first_ms)
        enough = r.points >= options.forecast_snapshots_min and span_ms >= options.forecast_span_ms_min
        slope = None if not enough or _nan(r.growth_bytes_per_day) else float(r.growth_bytes_per_day)
        free = _int(r.disk_free_bytes)
        days = planning.days_until_full(capacity_bytes=free, used_bytes=0 if free is not None else None,
                                        slope_bytes_per_day=slope)
        if not enough:
            status = (f"history too short: {r.points} snapshots over {span_ms / 3_600_000:.2f} h; a forecast needs "
                      f"{options.forecast_snapshots_min} over {options.forecast_span_ms_min / 3_600_000:.2f} h")
        elif slope is None or slope <= 0:
            status = "not growing"
        else:
            status = "ok"
        biplane = _int(r.biplane_bytes)
        rows.append({
            "broker_id": int(r.broker_id), "rack": r.rack, "points": int(r.points),
            "span_hours": round(span_ms / 3_600_000, 3),
            "fit_from": iso_utc(int(r.first_ms)), "fit_to": iso_utc(int(r.last_ms)), "last_ms": int(r.last_ms),
            "growth_bytes_per_day": slope,
            "r2": None if not enough or _nan(r.r2) else float(r.r2),
            "biplane_bytes": biplane, "filesystem_free_bytes": free,
            "biplane_capacity_bytes": None if biplane is None or free is None else biplane + free,
            "filesystem_total_bytes": _int(r.disk_total_bytes), "filesystem_used_bytes": _int(r.disk_used_bytes),
            "other_bytes": _int(r.other_bytes),
            "days_until_full": days,
            "full_at": iso_utc(int(r.last_ms + days * DAY_MS)) if days is not None and days < 36_500 else None,
            "status": status,
        })
    return urgency_first(pd.DataFrame(rows, columns=FORECAST_COLUMNS), "days_until_full")


def urgency_first(frame: pd.DataFrame, days_column: str) -> pd.DataFrame:
    """Rows of the brokers nearest to full first; those not filling (no days) last, by broker id."""
    key = frame[days_column].astype("Float64").fillna(float("inf"))
    return (frame.assign(_key=key).sort_values(["_key", "broker_id"], kind="stable")
            .drop(columns="_key").reset_index(drop=True))


def _nan(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _int(value) -> int | None:
    return None if _nan(value) or pd.isna(value) else int(value)


def partition_growth(placement: pd.DataFrame, latest_file: str, baseline_file: str | None
                     ) -> dict[tuple[str, int], float]:
    """Bytes per second each partition grew between the baseline snapshot and the latest, from
    its size (its largest replica) in both; partitions missing from either are left out.
    Shrinking (retention) counts as no growth."""
    if baseline_file is None:
        return {}
    sizes: dict[str, dict[tuple[str, int], tuple[int, int]]] = {latest_file: {}, baseline_file: {}}
    for r in _rows(placement):
        if r.file in sizes:
            key = (str(r.topic), int(r.partition))
            size, at = sizes[r.file].get(key, (0, int(r.snapshot_time_ms)))
            sizes[r.file][key] = (max(size, int(r.size_bytes)), at)
    growth = {}
    for key, (size, at) in sizes[latest_file].items():
        if key in sizes[baseline_file]:
            size_before, at_before = sizes[baseline_file][key]
            if at > at_before:
                growth[key] = max(0.0, (size - size_before) * 1000 / (at - at_before))
    return growth


def placement_from_latest(placement: pd.DataFrame, latest_series: pd.DataFrame,
                          growth: dict[tuple[str, int], float] | None = None
                          ) -> tuple[list[planning.BrokerSlot], list[planning.PartitionPlacement]]:
    """Planning inputs from the latest snapshot: brokers from its series rows, partitions from
    its `placement` rows (one per replica, in replica order). A partition grows at `growth`'s
    rate when given there, else at its 1-second produce sample."""
    brokers = [
        planning.BrokerSlot(broker_id=int(r.broker_id), rack=None if pd.isna(r.rack) else r.rack,
                            live=r.state == "unfenced", capacity_bytes=_int(r.disk_total_bytes),
                            used_bytes=_int(r.disk_used_bytes))
        for r in _rows(latest_series.sort_values("broker_id"))
    ]
    grouped: dict[tuple[str, int], list] = {}
    for r in _rows(placement):
        grouped.setdefault((r.topic, int(r.partition)), []).append(r)
    partitions = []
    for (topic, partition), rows in sorted(grouped.items()):
        rows.sort(key=lambda r: r.position)
        first = rows[0]
        min_isr = 1 if first.min_insync_replicas is None or pd.isna(first.min_insync_replicas) \
            else int(json.loads(first.min_insync_replicas))
        partitions.append(planning.PartitionPlacement(
            topic=topic, partition=partition, replicas=tuple(int(r.broker_id) for r in rows),
            leader=_int(first.leader), size_bytes=max(int(r.size_bytes) for r in rows),
            isr=tuple(int(r.broker_id) for r in rows if r.in_isr), min_insync_replicas=min_isr,
            growth_bytes_per_s=(growth or {}).get((topic, partition),
                                                  max(float(r.produce_bytes_per_s) for r in rows))))
    return brokers, partitions


def loads_frame(brokers: list[planning.BrokerSlot], partitions) -> pd.DataFrame:
    loads = planning.broker_loads(brokers, partitions)
    frame = pd.DataFrame([dataclasses.asdict(l) for l in loads])
    for metric in ("replicas", "leaders", "replica_bytes"):
        mean = frame[metric].mean() if len(frame) else 0
        frame[f"{metric}_over_mean"] = (frame[metric] / mean).round(3) if mean else None
    return frame


def outlook_frame(brokers: list[planning.BrokerSlot], before, after, *, lost: int | None = None,
                  new_ids: Iterable[int] = ()) -> pd.DataFrame:
    """Per broker, most urgent first: its state in the scenario, replica bytes before and after
    a plan, projected disk use, and days until full if each replica keeps growing at its
    partition's current produce rate."""
    load_before = {l.broker_id: l.replica_bytes for l in planning.broker_loads(brokers, before)}
    load_after = {l.broker_id: l.replica_bytes for l in planning.broker_loads(brokers, after)}
    growth = planning.growth_by_broker(after)
    added = set(new_ids)
    rows = []
    for b in brokers:
        used = b.used_bytes if b.used_bytes is not None else load_before.get(b.broker_id, 0)
        used_after = max(0, used - load_before.get(b.broker_id, 0) + load_after.get(b.broker_id, 0))
        gone = b.broker_id == lost
        days = None if gone else planning.days_until_full(
            capacity_bytes=b.capacity_bytes, used_bytes=used_after, slope_bytes_per_day=growth.get(b.broker_id, 0.0))
        state = ("lost" if gone else "new" if b.broker_id in added else "live" if b.live else "fenced")
        rows.append({"broker_id": b.broker_id, "rack": b.rack, "state": state,
                     "days_until_full_after": None if days is None else round(days, 2),
                     "replica_bytes_before": load_before.get(b.broker_id, 0),
                     "replica_bytes_after": load_after.get(b.broker_id, 0),
                     "disk_used_after_bytes": used_after, "disk_total_bytes": b.capacity_bytes,
                     "over_capacity": b.capacity_bytes is not None and used_after > b.capacity_bytes,
                     "growth_bytes_per_day_after": growth.get(b.broker_id, 0.0)})
    frame = pd.DataFrame(rows, columns=["broker_id", "rack", "state", "days_until_full_after", "replica_bytes_before",
                                        "replica_bytes_after", "disk_used_after_bytes", "disk_total_bytes",
                                        "over_capacity", "growth_bytes_per_day_after"])
    return urgency_first(frame, "days_until_full_after")


def executable_plan(before, plan: planning.Plan, options: ReportOptions, plan_file: str,
                    lost: Iterable[int] = ()) -> tuple[dict[str, object], dict[str, object]]:
    """The plan in `biplane reassign --plan` format, and its summary: what it changes, the bytes
    its new replicas copy and how long that takes at the throttle."""
    document = planning.reassignment_plan(before, plan, throttle_bytes_per_s=options.throttle_bytes_per_s)
    estimate = planning.transfer_estimate(before, plan, throttle_bytes_per_s=options.throttle_bytes_per_s,
                                          lost=lost)
    changed = document["partitions"]
    assert isinstance(changed, list)
    return document, {
        "plan_file": plan_file, "partitions_changed": len(changed), "bytes_to_move": estimate.bytes_to_move,
        "throttle_bytes_per_s": estimate.throttle_bytes_per_s,
        "estimated_seconds": round(estimate.seconds, 1), "busiest_broker": estimate.busiest_broker,
        "busiest_broker_bytes": estimate.busiest_broker_bytes,
    }


def moves_frame(plan: planning.Plan) -> pd.DataFrame:
    return pd.DataFrame([dataclasses.asdict(m) for m in plan.moves],
                        columns=["topic", "partition", "source_broker", "target_broker", "size_bytes", "reason"])


BALANCE_PLAN_FILE = "reassign_balance.json"


def lose_broker_plan_file(broker_id: int) -> str:
    return f"reassign_lose_broker_{broker_id}.json"


def plan_reports(brokers, partitions, options: ReportOptions
                 ) -> tuple[dict[str, pd.DataFrame], dict[str, object], dict[str, dict[str, object]]]:
    """Skew, balanced placement and the three what-ifs on the latest placement; and the plans
    that can be executed (balance, and evacuating the lost broker) by file name."""
    tables: dict[str, pd.DataFrame] = {}
    summary: dict[str, object] = {}
    plans: dict[str, dict[str, object]] = {}
    tables["broker_skew"] = loads_frame(brokers, partitions)
    skew_rows = [dataclasses.asdict(s) for s in planning.skews(planning.broker_loads(brokers, partitions))]
    tables["skew_summary"] = pd.DataFrame(skew_rows)
    rack_frame = tables["broker_skew"].assign(rack=tables["broker_skew"]["rack"].fillna("(none)"))
    tables["rack_skew"] = rack_frame.groupby("rack", as_index=False)[["replicas", "leaders", "replica_bytes"]].sum()

    plan = planning.balanced_plan(brokers, partitions, tolerance_ratio=options.balance_tolerance_ratio,
                                  moves_max=options.moves_max)
    tables["move_plan"] = moves_frame(plan)
    tables["balanced_placement"] = outlook_frame(brokers, partitions, plan.partitions)
    leaders = planning.balanced_leaders(plan.partitions)
    tables["leader_plan"] = pd.DataFrame(
        [{"topic": p.topic, "partition": p.partition, "leader_before": p.leader, "leader_after": leaders[(p.topic, p.partition)]}
         for p in plan.partitions if (p.topic, p.partition) in leaders and leaders[(p.topic, p.partition)] != p.leader],
        columns=["topic", "partition", "leader_before", "leader_after"])
    plans[BALANCE_PLAN_FILE], executable = executable_plan(partitions, plan, options, BALANCE_PLAN_FILE)
    summary["balance"] = {**executable, "moves": len(plan.moves), "leadership_changes": len(tables["leader_plan"]),
                          "stopped_because": plan.stopped_because, "tolerance_ratio": options.balance_tolerance_ratio}

    grown = planning.add_brokers(brokers, options.add_brokers)
    add_plan = planning.balanced_plan(grown, partitions, tolerance_ratio=options.balance_tolerance_ratio,
                                      moves_max=options.moves_max)
    new_ids = [b.broker_id for b in grown[len(brokers):]]
    tables["whatif_add_brokers"] = outlook_frame(grown, partitions, add_plan.partitions, new_ids=new_ids)
    tables["whatif_add_brokers_moves"] = moves_frame(add_plan)
    estimate = planning.transfer_estimate(partitions, add_plan, throttle_bytes_per_s=options.throttle_bytes_per_s)
    summary["add_brokers"] = {"count": options.add_brokers, "new_broker_ids": new_ids,
                              "moves": len(add_plan.moves), "bytes_to_move": estimate.bytes_to_move,
                              "throttle_bytes_per_s": options.throttle_bytes_per_s,
                              "estimated_seconds": round(estimate.seconds, 1),
                              "stopped_because": add_plan.stopped_because}

    topic_bytes: dict[str, int] = {}
    topic_rf: dict[str, int] = {}
    for p in partitions:
        topic_bytes[p.topic] = topic_bytes.get(p.topic, 0) + p.size_bytes
        topic_rf[p.topic] = max(topic_rf.get(p.topic, 0), len(p.replicas))
    live = sum(1 for b in brokers if b.live)
    if options.replication_factor_change is not None:
        topic, rf = options.replication_factor_change
    elif topic_bytes and live >= 2:
        topic = max(sorted(topic_bytes), key=lambda t: topic_bytes[t])
        rf = topic_rf[topic] + 1 if topic_rf[topic] < live else topic_rf[topic] - 1
    else:  # nothing to change, or a single live broker: no other replication factor fits
        topic, rf = None, None
    if topic is not None and rf is not None:
        rf_plan = planning.change_replication_factor(brokers, partitions, topic, rf)
        tables["whatif_replication_factor"] = outlook_frame(brokers, partitions, rf_plan.partitions)
        before = sum(l.replica_bytes for l in planning.broker_loads(brokers, partitions))
        after = sum(l.replica_bytes for l in planning.broker_loads(brokers, rf_plan.partitions))
        summary["replication_factor"] = {"topic": topic, "from": topic_rf.get(topic), "to": rf,
                                         "bytes_added": max(0, after - before), "bytes_freed": max(0, before - after),
                                         "replicas_added": len(rf_plan.moves)}

    loads = planning.broker_loads(brokers, partitions)
    lost = options.lose_broker
    if lost is None and loads:
        lost = max(loads, key=lambda l: (l.replica_bytes, -l.broker_id)).broker_id
    if lost is not None:
        lose_plan = planning.lose_broker(brokers, partitions, lost)
        frame = outlook_frame(brokers, partitions, lose_plan.partitions, lost=lost)
        tables["whatif_lose_broker"] = frame
        plan_file = lose_broker_plan_file(lost)
        plans[plan_file], executable = executable_plan(partitions, lose_plan, options, plan_file, lost=[lost])
        tables["whatif_lose_broker_moves"] = moves_frame(lose_plan)
        led = [p for p in partitions if p.leader == lost]
        under_min_isr = [p for p in partitions if lost in p.replicas
                         and len([b for b in p.isr if b != lost]) < p.min_insync_replicas]
        stranded = [p for p in lose_plan.partitions if lost in p.replicas]
        summary["lose_broker"] = {
            "broker_id": lost, **executable, "replicas_moved": len(lose_plan.moves),
            "leaderships_lost": len(led), "partitions_under_min_isr_until_rereplicated": len(under_min_isr),
            "replicas_without_a_home": len(stranded),
            "brokers_over_capacity": [int(b) for b in frame.loc[frame["over_capacity"], "broker_id"]],
        }
    return tables, summary, plans


def run_capacity_report(spark: SparkSession, inputs: list[str], out_dir: Path, options: ReportOptions,
                        progress: Progress | None = None,
                        render: Callable[..., Path] | None = None) -> ReportResult:
    progress = progress or Progress(5)
    splits = options.splits or 2 * spark.sparkContext.defaultParallelism
    paths, warnings = discover_inputs(inputs)
    progress(f"listed inputs: {len(paths)} snapshot files, {len(warnings)} other entries skipped")
    for path, reason in warnings:
        progress.note(f"warning: skipping {path}: {reason}")
    if not paths:
        raise ValueError(f"no snapshot files in {', '.join(inputs)}; expected names like "
                         "snapshot-20260101T000000Z-000000000042.sqlite")

    progress(f"reading per-broker series from {len(paths)} files on the executors "
             f"in {min(splits, len(paths))} splits")
    series_all = with_derived_columns(read_table(spark, "broker_series", paths, splits)).cache()
    collected = to_pandas(series_all.orderBy("snapshot_time_ms", "broker_id"))
    errors = collected[collected["error"].notna()]
    for r in _rows(errors):
        warnings.append((r.file, f"unreadable snapshot: {r.error}"))
        progress.note(f"warning: skipping {r.file}: {r.error}")
    series_pd = collected[collected["error"].isna()].drop(columns=["error"]).reset_index(drop=True)
    files = (series_pd.groupby("file", as_index=False)
             .agg(snapshot_time_ms=("snapshot_time_ms", "first"), metadata_offset=("metadata_offset", "first"),
                  brokers=("broker_id", "count")))
    files = pd.concat([files.assign(ok=True, error=None),
                       errors[["file", "error"]].assign(ok=False)], ignore_index=True)
    good = files[files["ok"]].sort_values(["snapshot_time_ms", "metadata_offset", "file"])
    if good.empty:
        series_all.unpersist()
        raise ValueError(f"none of the {len(paths)} snapshot files could be read; see the warnings above")
    good_paths = list(good["file"])
    latest = good.iloc[-1]
    latest_ms = int(latest["snapshot_time_ms"])
    span_ms = latest_ms - int(good["snapshot_time_ms"].min())
    series = series_all.where(F.col("error").isNull())

    progress(f"fitting growth per broker (least squares over the last {options.fit_days:g} days)")
    forecast_pd = forecast(series, latest_ms, options)
    series_all.unpersist()
    summary: dict[str, object] = {
        "snapshots": len(good_paths), "skipped": len(warnings), "first": iso_utc(int(good["snapshot_time_ms"].min())),
        "latest": iso_utc(latest_ms), "latest_file": os.path.basename(latest["file"]),
        "span_hours": round(span_ms / 3_600_000, 2), "fit_days": options.fit_days,
        "horizon_days": options.horizon_days, "plot_brokers": options.plot_brokers,
    }
    sampled = int((series_pd["throughput_source"] == FROM_SAMPLES).sum())
    if sampled:
        throughput_note = (
            f"{sampled} of {len(series_pd)} broker rows come from snapshots without byte counters (schema 1, "
            f"brokers before counters): their bytes per second are the brokers' 1-second samples, which miss "
            f"traffic between samples; the rest are byte counters differenced between snapshots.")
        summary["throughput_note"] = throughput_note
        progress.note(throughput_note)
    without_log_bytes = int((series_pd["biplane_bytes_source"] == BIPLANE_FROM_REPLICAS).sum())
    if without_log_bytes:
        summary["biplane_bytes_note"] = (
            f"{without_log_bytes} of {len(series_pd)} broker rows come from snapshots without log_bytes: their "
            f"Biplane bytes are the sum of the broker's replica sizes.")
    if len(good_paths) < options.forecast_snapshots_min or span_ms < options.forecast_span_ms_min:
        forecast_note = (
            f"History too short for a forecast: {len(good_paths)} snapshots spanning "
            f"{span_ms / 60_000:.0f} minutes; a forecast needs at least {options.forecast_snapshots_min} snapshots "
            f"over {options.forecast_span_ms_min / 60_000:.0f} minutes.")
        summary["forecast_note"] = forecast_note
        progress.note(forecast_note)

    progress(f"planning on the latest snapshot {summary['latest_file']}")
    # Partition growth for the what-ifs: sizes now against the first snapshot of the fit window.
    window = good[good["snapshot_time_ms"] >= latest_ms - int(options.fit_days * DAY_MS)]
    baseline_file = None if window.iloc[0]["file"] == latest["file"] else str(window.iloc[0]["file"])
    both = to_pandas(read_table(spark, "placement", [latest["file"], *([baseline_file] if baseline_file else [])], 1))
    growth = partition_growth(both, latest["file"], baseline_file)
    placement = both[both["file"] == latest["file"]]
    latest_series = series_pd[series_pd["file"] == latest["file"]]
    brokers, partitions = placement_from_latest(placement, latest_series, growth)
    sampled_partitions = len(partitions) - sum(1 for p in partitions if (p.topic, p.partition) in growth)
    summary["partition_growth"] = (
        f"what-ifs grow each partition at its size's growth between {os.path.basename(baseline_file)} and the "
        f"latest snapshot" if baseline_file else "what-ifs grow each partition at its 1-second produce sample "
        "(one snapshot in the fit window)") + (
        f"; {sampled_partitions} partition(s) not in both use their 1-second produce sample"
        if baseline_file and sampled_partitions else "")
    plan_tables, plan_summary, plans = plan_reports(brokers, partitions, options)
    summary.update(plan_summary)

    series_pd = series_pd.drop(columns=["file"])
    series_pd.insert(0, "snapshot_time", [iso_utc(int(t)) for t in series_pd["snapshot_time_ms"]])
    tables = {
        "files": files.assign(snapshot_time=pd.Series([None if pd.isna(t) else iso_utc(int(t))
                                                       for t in files["snapshot_time_ms"]],
                                                      index=files.index, dtype=object)),
        "warnings": pd.DataFrame(warnings, columns=["file", "reason"]),
        "broker_timeseries": series_pd,
        "forecast": forecast_pd,
        **plan_tables,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    progress(f"writing {len(tables)} CSV tables, plots and report.html to {out_dir}")
    for name, frame in tables.items():
        frame.to_csv(out_dir / f"{name}.csv", index=False, float_format="%.6f")
    for name, document in plans.items():
        (out_dir / name).write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    if render is None:
        from controller.report.render import render_html
        render = render_html
    html_path = render(out_dir, tables, summary)
    return ReportResult(out_dir=out_dir, html_path=html_path, tables=tables, summary=summary, warnings=warnings,
                        plans=plans)
