"""The capacity report end to end on Spark (local[2], one session for the module).

History: seed 3, 6 brokers (broker 6 joins at snapshot 20), 30 partitions, 40 snapshots every
30 minutes (19.5 h). Forecasts fit the last 0.35 days, which lie after the join, where every
broker grows at a constant known rate.
"""
from __future__ import annotations

import shutil
import sqlite3

import pytest

from controller.report.capacity import Progress, ReportOptions, run_capacity_report
from controller.report.history import HistorySpec, expected_growth_bytes_per_day, generate_history

pytestmark = pytest.mark.slow

SPEC = HistorySpec(brokers=6, partitions=30, snapshots=40, interval_ms=30 * 60_000, seed=3)
FORECAST_TOLERANCE = 0.05  # relative error of the fitted slope against the generated rate


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
    options = ReportOptions(fit_days=0.35, add_brokers=2, replication_factor_change=("orders", 2), lose_broker=1)
    return run_capacity_report(spark, [str(directory)], out, options, Progress(5))


def test_forecast_matches_generated_growth(report):
    """Each broker's fitted slope is within 5% of the rate the history was generated with, and
    days until full follow from it."""
    expected = expected_growth_bytes_per_day(SPEC)
    forecast = report.tables["forecast"].set_index("broker_id")
    assert sorted(forecast.index) == sorted(expected)
    for broker_id, rate in expected.items():
        row = forecast.loc[broker_id]
        assert row["status"] == "ok", row
        assert row["slope_bytes_per_day"] == pytest.approx(rate, rel=FORECAST_TOLERANCE), \
            f"seed={SPEC.seed} broker={broker_id}"
        assert row["r2"] > 0.9
        assert row["days_until_full"] == pytest.approx(
            (row["disk_total_bytes"] - row["disk_used_bytes"]) / row["slope_bytes_per_day"])


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


def test_plans_and_outputs(report):
    """Skew shows the hot brokers; the balanced plan's moves add up; what-ifs answer; the HTML has
    its plots and every table has a CSV."""
    skew = report.tables["broker_skew"].set_index("broker_id")
    assert skew["replica_bytes"].idxmin() == 6  # the broker that joined last
    moves = report.tables["move_plan"]
    assert report.summary["balance"]["moved_bytes"] == int(moves["size_bytes"].sum()) > 0
    placement = report.tables["balanced_placement"]
    spread = lambda column: placement[column].max() - placement[column].min()  # noqa: E731
    assert spread("replica_bytes_after") < spread("replica_bytes_before") / 2
    assert report.summary["add_brokers"]["new_broker_ids"] == [7, 8]
    added = report.tables["whatif_add_brokers"].set_index("broker_id")
    assert added.loc[7, "replica_bytes_after"] > 0 and added.loc[8, "replica_bytes_after"] > 0
    assert report.summary["replication_factor"]["to"] == 2 and report.summary["replication_factor"]["bytes_freed"] > 0
    lost = report.summary["lose_broker"]
    assert lost["broker_id"] == 1 and lost["bytes_to_rereplicate"] > 0 and lost["replicas_without_a_home"] == 0
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
