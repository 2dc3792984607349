"""The capacity report end to end on Spark (local[2], one session for the module), every figure
checked against the generated history's known truth.

History: seed 3, 6 brokers (broker 6 joins at snapshot 20), 30 partitions, 40 snapshots every
30 minutes (19.5 h); the first 6 snapshots are schema 1 (no byte counters, no log_bytes), broker
2 restarts before snapshot 30, producers write in bursts that 1-second samples mostly miss,
and broker 1's filesystem also fills with 200 GiB a day of other files. Forecasts fit the last
0.35 days, which lie after the join, where Biplane's bytes grow at a constant known rate.
"""
from __future__ import annotations

import json
import shutil
import sqlite3

import pandas as pd
import pytest

from controller.report.capacity import (
    COUNTER_DROPPED, FROM_COUNTERS, FROM_COUNTERS_SINCE_RESTART, FROM_SAMPLES, NO_EARLIER, NO_NEW_REPORT, Progress,
    ReportOptions, run_capacity_report, to_pandas, with_derived_columns,
)
from controller.report.datasource import BROKER_SERIES_SCHEMA
from controller.report.history import (
    HistorySpec, expected_growth_bytes_per_day, expected_other_growth_bytes_per_day, expected_throughput_bytes_per_s,
    generate_history,
)
from controller.report.render import LINE_FORECAST, LINE_ROOM, disk_forecast_figure, urgency_figure
from controller.report.units import human_bytes

pytestmark = pytest.mark.slow

SPEC = HistorySpec(brokers=6, partitions=30, snapshots=40, interval_ms=30 * 60_000, seed=3, legacy_snapshots=6)
EXACT = 1e-6  # relative error allowed where the truth is exact (integer byte counts, float sums)
THROTTLE_BYTES_PER_S = 20 * 2**20


@pytest.fixture(scope="module")
def spark():
    from controller.report.session import start_session

    session = start_session("local[2]", app_name="biplane-report-tests")
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    directory = tmp_path_factory.mktemp("history")
    paths = generate_history(SPEC, directory)
    truncated = directory / "snapshot-20250101T000000Z-000000000001.sqlite"
    truncated.write_bytes(paths[5].read_bytes()[:4096])
    foreign = directory / "snapshot-20250101T000000Z-000000000002.sqlite"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE orders (id INTEGER)")
    (directory / "README.txt").write_text("not a snapshot")
    return directory, paths


@pytest.fixture(scope="module")
def report(spark, history, tmp_path_factory):
    directory, _ = history
    out = tmp_path_factory.mktemp("report")
    options = ReportOptions(fit_days=0.35, add_brokers=2, replication_factor_change=("orders", 2), lose_broker=1,
                            throttle_bytes_per_s=THROTTLE_BYTES_PER_S)
    return run_capacity_report(spark, [str(directory)], out, options, Progress(5))


def latest_usage(paths) -> dict[int, tuple[int, int, int, int]]:
    """broker -> (filesystem total, used, free, log bytes) as the newest file holds them."""
    with sqlite3.connect(paths[-1]) as conn:
        return {row[0]: row[1:] for row in conn.execute(
            "SELECT broker_id, disk_total_bytes, disk_used_bytes, disk_free_bytes, log_bytes FROM broker_usage")}


def test_forecast_fits_biplane_bytes_not_the_filesystem(report, history):
    """Each broker's growth is exactly the rate its Biplane bytes were generated with, though
    broker 1's filesystem grows 200 GiB a day faster; days until full = free space / growth."""
    _, paths = history
    expected = expected_growth_bytes_per_day(SPEC)
    assert expected_other_growth_bytes_per_day(SPEC)[1] > expected[1]  # fitting disk use would be far off
    usage = latest_usage(paths)
    forecast = report.tables["forecast"].set_index("broker_id")
    assert sorted(forecast.index) == sorted(expected)
    for broker_id, rate in expected.items():
        row = forecast.loc[broker_id]
        total, used, free, log_bytes = usage[broker_id]
        assert row["status"] == "ok", row
        assert row["growth_bytes_per_day"] == pytest.approx(rate, rel=EXACT), f"seed={SPEC.seed} broker={broker_id}"
        assert row["r2"] > 0.999999
        assert (row["biplane_bytes"], row["filesystem_free_bytes"], row["filesystem_total_bytes"],
                row["filesystem_used_bytes"]) == (log_bytes, free, total, used)
        assert (row["other_bytes"], row["biplane_capacity_bytes"]) == (used - log_bytes, log_bytes + free)
        assert row["days_until_full"] == pytest.approx(free / rate, rel=EXACT)


def test_urgency_first_in_table_chart_and_plots(report, history):
    """The forecast table runs from the broker nearest to full down; the chart's top bar is the
    most urgent and the longest; the disk plots are of the most urgent brokers, each with a room
    line at its Biplane bytes + free space and a forecast reaching it on the day it fills."""
    _, paths = history
    usage = latest_usage(paths)
    growth = expected_growth_bytes_per_day(SPEC)
    truth_days = {b: usage[b][2] / rate for b, rate in growth.items()}
    forecast = report.tables["forecast"]
    assert list(forecast["broker_id"]) == sorted(truth_days, key=truth_days.get)
    bars = sorted(urgency_figure(forecast, 30).axes[0].patches, key=lambda bar: bar.get_y())
    widths = [bar.get_width() for bar in bars]
    assert widths == sorted(widths, reverse=True) and widths[0] > widths[-1]
    most_urgent = forecast.iloc[0]
    assert most_urgent["days_until_full"] < 30  # so its forecast line ends at the room line
    series = report.tables["broker_timeseries"]
    fig = disk_forecast_figure(series[series["broker_id"] == most_urgent["broker_id"]], most_urgent, 30)
    lines = {line.get_label(): line for line in fig.axes[0].get_lines()}
    tib = 2**40
    total, _, free, log_bytes = usage[int(most_urgent["broker_id"])]
    assert fig.axes[0].get_ylabel() == "TiB"
    assert list(lines[LINE_ROOM].get_ydata()) == pytest.approx([(log_bytes + free) / tib] * 2)
    end_x, end_y = lines[LINE_FORECAST].get_xdata()[-1], lines[LINE_FORECAST].get_ydata()[-1]
    assert end_y == pytest.approx((log_bytes + free) / tib)
    days = (pd.Timestamp(end_x, tz="UTC") - pd.Timestamp(SPEC.snapshot_ms(SPEC.snapshots - 1), unit="ms", tz="UTC")
            ) / pd.Timedelta(days=1)
    assert days == pytest.approx(truth_days[int(most_urgent["broker_id"])], rel=EXACT)
    html = report.html_path.read_text()
    assert html.count("alt=\"disk of broker") == 6
    assert html.index("Days until full, most urgent first") < html.index("Leader and replica skew")


def test_human_units_on_the_page(report, history):
    """The page shows the filesystems as 4.00 TiB and 8.00 TiB, and each broker's Biplane bytes in
    binary units; the CSVs keep the exact byte counts."""
    _, paths = history
    html = report.html_path.read_text()
    assert "<td>4.00 TiB</td>" in html and "<td>8.00 TiB</td>" in html
    for _, _, _, log_bytes in latest_usage(paths).values():
        assert f"<td>{human_bytes(log_bytes)}</td>" in html
    assert str(latest_usage(paths)[1][3]) in (report.out_dir / "forecast.csv").read_text()
    assert "days</td>" in html and "/day</td>" in html


def test_throughput_comes_from_byte_counters_differenced_between_snapshots(report):
    """Wherever a snapshot and its predecessor hold counters, each broker's bytes/s produced,
    replicated in and fetched equal the generated rates; across broker 2's restart and the
    upgrade the counters count from their restart; schema 1 snapshots keep the 1-second
    samples and say so. The samples are far off: bursts fall between them."""
    series = report.tables["broker_timeseries"]
    series = series.assign(index=(series["snapshot_time_ms"] - SPEC.start_ms) // SPEC.interval_ms)
    checked = 0
    for r in series.itertuples(index=False):
        if r.index < SPEC.legacy_snapshots:
            assert r.throughput_source == FROM_SAMPLES
            assert r.produce_bytes_per_s == r.sampled_produce_bytes_per_s
            continue
        restarted = r.index == SPEC.legacy_snapshots or (r.index == SPEC.restart_at and r.broker_id == SPEC.restart_broker)
        if r.broker_id == SPEC.joiner and r.index == SPEC.join_index:
            assert r.throughput_source == NO_EARLIER
            continue
        assert r.throughput_source == (FROM_COUNTERS_SINCE_RESTART if restarted else FROM_COUNTERS), r
        if r.index in (SPEC.join_index, SPEC.join_index + 1):
            continue  # the new topic started mid-interval: no single rate is the truth there
        truth = expected_throughput_bytes_per_s(SPEC, at_index=int(r.index))[r.broker_id]
        for column, key in (("produce_bytes_per_s", "produce"), ("replication_in_bytes_per_s", "replicated"),
                            ("fetch_bytes_per_s", "fetch")):
            assert getattr(r, column) == pytest.approx(truth[key], rel=EXACT, abs=1e-6), (r, key)
        checked += 1
    assert checked > 150
    latest = series[series["index"] == SPEC.snapshots - 1]
    truth = expected_throughput_bytes_per_s(SPEC)
    assert any(abs(r.sampled_produce_bytes_per_s - truth[r.broker_id]["produce"]) > 0.5 * truth[r.broker_id]["produce"]
               for r in latest.itertuples() if truth[r.broker_id]["produce"] > 0)
    assert report.summary["throughput_note"].startswith(f"{SPEC.legacy_snapshots * 5} of ")


def test_counter_differencing_by_hand(spark):
    """One broker over six snapshots 10 s apart (usage measured 1 s before each): no counters
    (a sample of 7 B/s is kept), the first counters (nothing to difference), +1000 B in 10 s,
    the same report again (it stopped reporting), a restart 4 s before the fifth report with
    800 B since, and a counter lower than before without a restart."""
    rows = []
    for i, (since, produce) in enumerate([(None, None), (-50_000, 5000), (-50_000, 6000), (-50_000, 6000),
                                          (35_000, 800), (35_000, 700)]):
        at = (i * 10_000 - 1_000) if i != 3 else 19_000  # snapshot 3 repeats snapshot 2's report
        counters = (None, None, None) if produce is None else (produce, 2 * produce, 3 * produce)
        rows.append((f"f{i}", i * 10_000, i, 1, None, "unfenced", 100, 50, 50, 1, 1, 10, 7.0, 8.0, 9.0,
                     at, None if produce is None else 12, since, *counters, None))
    frame = to_pandas(with_derived_columns(spark.createDataFrame(rows, BROKER_SERIES_SCHEMA))
                      .orderBy("snapshot_time_ms"))
    assert list(frame["throughput_source"]) == [FROM_SAMPLES, NO_EARLIER, FROM_COUNTERS, NO_NEW_REPORT,
                                                FROM_COUNTERS_SINCE_RESTART, COUNTER_DROPPED]
    produce = [None if v is None or v != v else float(v) for v in frame["produce_bytes_per_s"]]
    assert produce == [7.0, None, 100.0, None, 200.0, None]
    assert float(frame["replication_in_bytes_per_s"][2]) == 200.0 and float(frame["fetch_bytes_per_s"][4]) == 600.0
    assert list(frame["biplane_bytes"]) == [10, 12, 12, 12, 12, 12]  # log_bytes when reported, else replica bytes
    assert list(frame["other_bytes"]) == [40, 38, 38, 38, 38, 38]  # the filesystem's 50 used, less Biplane's


def test_biplane_bytes_fall_back_to_replica_sizes_in_old_snapshots(report):
    """Schema 1 rows take Biplane's bytes from the replicas' sizes, which equal log_bytes in the
    generated history; the summary says how many rows did."""
    series = report.tables["broker_timeseries"]
    old = series[series["log_bytes"].isna()]
    assert len(old) == SPEC.legacy_snapshots * 5
    assert (old["biplane_bytes"] == old["replica_bytes"]).all()
    new = series[series["log_bytes"].notna()]
    assert (new["biplane_bytes"] == new["log_bytes"]).all() and (new["log_bytes"] == new["replica_bytes"]).all()
    assert (series["other_bytes"] == series["disk_used_bytes"] - series["biplane_bytes"]).all()
    assert report.summary["biplane_bytes_note"].startswith(f"{SPEC.legacy_snapshots * 5} of ")


def placement_of(path) -> tuple[dict[tuple[str, int], list[int]], dict[tuple[str, int], int], dict]:
    """Replica lists, sizes (largest replica) and leaders straight from a snapshot file."""
    with sqlite3.connect(path) as conn:
        replicas: dict[tuple[str, int], list[int]] = {}
        for topic, partition, broker in conn.execute(
                "SELECT topic, partition, broker_id FROM replicas ORDER BY topic, partition, position"):
            replicas.setdefault((topic, partition), []).append(broker)
        sizes = {(t, p): s for t, p, s in conn.execute(
            "SELECT topic, partition, max(size_bytes) FROM replica_usage GROUP BY topic, partition")}
        leaders = {(t, p): leader for t, p, leader in conn.execute("SELECT topic, partition, leader FROM partitions")}
    return replicas, sizes, leaders


def test_lose_broker_plan_executes_and_is_timed(report, history):
    """Losing broker 1: its row says lost; the plan file, in `reassign --plan` form, leaves every
    partition its replication factor with broker 1 in none; it copies each of broker 1's
    partitions once, and takes as long as the broker receiving the most needs at the throttle."""
    _, paths = history
    replicas, sizes, _ = placement_of(paths[-1])
    lose = report.tables["whatif_lose_broker"]
    assert dict(zip(lose["broker_id"], lose["state"])) == {1: "lost", 2: "live", 3: "live", 4: "live", 5: "live",
                                                           6: "live"}
    plan = json.loads((report.out_dir / "reassign_lose_broker_1.json").read_text())
    assert set(plan) == {"version", "partitions", "throttle_bytes_per_s"}  # what reassign --plan reads
    assert (plan["version"], plan["throttle_bytes_per_s"]) == (1, THROTTLE_BYTES_PER_S)
    after = dict(replicas)
    for entry in plan["partitions"]:
        assert set(entry) == {"topic", "partition", "replicas", "bytes_to_move"}
        key = (entry["topic"], entry["partition"])
        after[key] = entry["replicas"]
        assert entry["bytes_to_move"] == sizes[key]  # one new replica each
    assert {key for key, brokers in replicas.items() if 1 in brokers} == {
        (e["topic"], e["partition"]) for e in plan["partitions"]}
    for key, brokers in after.items():
        assert 1 not in brokers and len(set(brokers)) == len(replicas[key]), key
    summary = report.summary["lose_broker"]
    assert summary["bytes_to_move"] == sum(sizes[key] for key, brokers in replicas.items() if 1 in brokers)
    received: dict[int, int] = {}  # the throttle is per receiving broker
    for key, brokers in after.items():
        for target in set(brokers) - set(replicas[key]):
            received[target] = received.get(target, 0) + sizes[key]
    busiest = max(received, key=lambda b: (received[b], -b))
    assert (summary["busiest_broker"], summary["busiest_broker_bytes"]) == (busiest, received[busiest])
    assert summary["estimated_seconds"] == pytest.approx(received[busiest] / THROTTLE_BYTES_PER_S, abs=0.05)
    assert "biplane reassign --plan" in report.html_path.read_text()


def test_what_ifs_grow_partitions_at_their_true_rates(report):
    """The what-ifs grow each replica at its partition's growth measured from its size in two
    snapshots (the bursty 1-second samples would be far off): whatever the plan moves, the
    brokers together still gain exactly the generated growth per day; a lost broker gains none."""
    total = sum(expected_growth_bytes_per_day(SPEC).values())
    for table in ("balanced_placement", "whatif_add_brokers", "whatif_lose_broker"):
        frame = report.tables[table]
        assert frame["growth_bytes_per_day_after"].sum() == pytest.approx(total, rel=EXACT), table
    lose = report.tables["whatif_lose_broker"].set_index("broker_id")
    assert lose.loc[1, "growth_bytes_per_day_after"] == 0
    assert "partition(s) not in both" not in report.summary["partition_growth"]


def test_balance_plan_file_reaches_the_balanced_placement(report, history):
    """Applying reassign_balance.json to the latest placement gives the replica bytes per broker
    the balanced table reports."""
    _, paths = history
    replicas, sizes, _ = placement_of(paths[-1])
    plan = json.loads((report.out_dir / "reassign_balance.json").read_text())
    for entry in plan["partitions"]:
        replicas[(entry["topic"], entry["partition"])] = entry["replicas"]
    load: dict[int, int] = {}
    for key, brokers in replicas.items():
        for b in brokers:
            load[b] = load.get(b, 0) + sizes[key]
    balanced = report.tables["balanced_placement"]
    assert dict(zip(balanced["broker_id"], balanced["replica_bytes_after"])) == load
    assert report.summary["balance"]["partitions_changed"] == len(plan["partitions"]) > 0


def test_skipped_files_are_named(report, history):
    """The truncated snapshot, the foreign SQLite file and the foreign name are each skipped with a
    warning naming them; all 40 real snapshots are read."""
    directory, _ = history
    reasons = dict(report.warnings)
    assert set(reasons) == {str(directory / "snapshot-20250101T000000Z-000000000001.sqlite"),
                            str(directory / "snapshot-20250101T000000Z-000000000002.sqlite"),
                            str(directory / "README.txt")}
    assert "malformed" in reasons[str(directory / "snapshot-20250101T000000Z-000000000001.sqlite")]
    assert "no such table" in reasons[str(directory / "snapshot-20250101T000000Z-000000000002.sqlite")]
    assert report.summary["snapshots"] == SPEC.snapshots
    assert (report.out_dir / "warnings.csv").read_text().count("\n") == 4


def test_series_keeps_64_bit_byte_counts(report, history):
    """Disk use read through Spark equals what SQLite holds, well past 2**31."""
    _, paths = history
    with sqlite3.connect(paths[-1]) as conn:
        truth = dict(conn.execute("SELECT broker_id, disk_used_bytes FROM broker_usage"))
    series = report.tables["broker_timeseries"]
    latest = series[series["snapshot_time_ms"] == series["snapshot_time_ms"].max()]
    assert dict(zip(latest["broker_id"], latest["disk_used_bytes"])) == truth
    assert max(truth.values()) > 2**36
    assert latest["fetch_bytes_total"].max() > 2**31  # counters too


def test_plans_and_outputs(report):
    """Skew shows the hot brokers; the balanced plan's moves add up; what-ifs answer; the HTML has
    its plots and every table has a CSV."""
    skew = report.tables["broker_skew"].set_index("broker_id")
    assert skew["replica_bytes"].idxmin() == 6  # the broker that joined last
    assert report.summary["balance"]["bytes_to_move"] > 0
    placement = report.tables["balanced_placement"]
    spread = lambda column: placement[column].max() - placement[column].min()  # noqa: E731
    assert spread("replica_bytes_after") < spread("replica_bytes_before") / 2
    assert report.summary["add_brokers"]["new_broker_ids"] == [7, 8]
    added = report.tables["whatif_add_brokers"].set_index("broker_id")
    assert added.loc[7, "replica_bytes_after"] > 0 and added.loc[8, "replica_bytes_after"] > 0
    assert report.summary["replication_factor"]["to"] == 2 and report.summary["replication_factor"]["bytes_freed"] > 0
    lost = report.summary["lose_broker"]
    assert lost["broker_id"] == 1 and lost["bytes_to_move"] > 0 and lost["replicas_without_a_home"] == 0
    lose = report.tables["whatif_lose_broker"].set_index("broker_id")
    assert lose.loc[1, "replica_bytes_after"] == 0
    html = report.html_path.read_text()
    assert html.count("data:image/png;base64,") >= 6
    for name in report.tables:
        assert (report.out_dir / f"{name}.csv").exists(), name
    assert "History too short" not in html


def test_short_history_says_so(spark, history, tmp_path):
    """Two snapshots half an hour apart: the report still runs and says plainly that no forecast is possible."""
    _, paths = history
    short = tmp_path / "short"
    short.mkdir()
    for path in paths[-2:]:
        shutil.copy(path, short / path.name)
    result = run_capacity_report(spark, [str(short / "*.sqlite")], tmp_path / "out", ReportOptions(), Progress(5))
    assert "History too short for a forecast: 2 snapshots spanning 30 minutes" in result.summary["forecast_note"]
    assert result.tables["forecast"]["status"].str.startswith("history too short").all()
    assert result.tables["forecast"]["days_until_full"].isna().all()
    assert "History too short for a forecast" in result.html_path.read_text()
