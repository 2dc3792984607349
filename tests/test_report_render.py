"""The capacity report's presentation without Spark: human units, urgency order, and the data
the plots draw (bar widths, line points), checked on hand-made frames."""
from __future__ import annotations

import sqlite3

import pandas as pd
import pytest

from controller.report.capacity import urgency_first
from controller.report.datasource import check_file, read_file_rows
from controller.report.history import HistorySpec, generate_history
from controller.report.render import (
    LINE_BIPLANE, LINE_FILESYSTEM, LINE_FORECAST, LINE_ROOM, disk_forecast_figure, human_frame, skew_shown,
    urgency_figure,
)
from controller.report.units import human_bytes, human_days, human_duration, human_rate, human_value

GIB = 1 << 30
TIB = 1 << 40
DAY_MS = 86_400_000


def test_human_units():
    """Binary units from KiB up with three significant figures; rates per second; days; durations."""
    assert [human_bytes(v) for v in (0, 1023, 1024, 1536, 50 * 2**20, 123.4 * GIB, 4 * TIB, 2.5 * 2**50)] == [
        "0 B", "1023 B", "1.00 KiB", "1.50 KiB", "50.0 MiB", "123 GiB", "4.00 TiB", "2.50 PiB"]
    assert human_rate(50 * 2**20) == "50.0 MiB/s" and human_rate(None) == ""
    assert (human_days(9.84), human_days(250.2), human_days(None)) == ("9.8 days", "250 days", "")
    assert [human_duration(s) for s in (45, 720, 3.5 * 3600, 2.1 * 86_400)] == ["45 s", "12 min", "3.5 h", "2.1 days"]


def test_human_value_goes_by_the_column_name():
    """Units are in the column names, so the page converts by name and leaves counts and ratios."""
    assert human_value("filesystem_total_bytes", 4 * TIB) == "4.00 TiB"
    assert human_value("replica_bytes_after", 3 * GIB) == "3.00 GiB"
    assert human_value("produce_bytes_per_s", 1.5 * 2**20) == "1.50 MiB/s"
    assert human_value("growth_bytes_per_day_after", 20 * GIB) == "20.0 GiB/day"
    assert human_value("days_until_full", 12.34) == "12.3 days"
    assert human_value("estimated_seconds", 7200) == "2.0 h"
    assert human_value("bytes_to_move", 5 * 2**30) == "5.00 GiB"
    assert human_value("replica_bytes_over_mean", 1.25) == 1.25
    assert human_value("replicas", 7) == 7 and human_value("over_capacity", True) is True
    shown = human_frame(pd.DataFrame({"broker_id": [1], "biplane_bytes": [1536], "last_ms": [5]}))
    assert list(shown.columns) == ["broker_id", "biplane_bytes"]  # millisecond stamps stay in the CSV
    assert shown.iloc[0].tolist() == [1, "1.50 KiB"]


def test_skew_summary_shows_byte_rows_in_units_and_counts_as_counts():
    frame = pd.DataFrame({"key": ["broker", "broker"], "metric": ["leaders", "replica_bytes"],
                          "mean": [2.5, 1.5 * TIB], "max": [4.0, 2.0 * TIB], "min": [1.0, 0.5 * TIB],
                          "max_over_mean": [1.6, 1.333]})
    shown = skew_shown(frame)
    assert shown[["mean", "max", "min"]].values.tolist() == [[2.5, 4.0, 1.0], ["1.50 TiB", "2.00 TiB", "512 GiB"]]


def forecast_frame() -> pd.DataFrame:
    """Three brokers in id order: 1 full in 40 days, 2 not growing, 3 full in 10 days."""
    last_ms = 1_767_225_600_000
    return pd.DataFrame({
        "broker_id": [1, 2, 3], "rack": ["a", "b", None], "days_until_full": [40.0, None, 10.0],
        "full_at": ["2026-02-10T00:00:00+00:00", None, "2026-01-11T00:00:00+00:00"],
        "status": ["ok", "not growing", "ok"], "last_ms": [last_ms] * 3,
    })


def test_urgency_first_puts_the_nearest_to_full_on_top():
    assert list(urgency_first(forecast_frame(), "days_until_full")["broker_id"]) == [3, 1, 2]


def test_urgency_chart_gives_the_most_urgent_the_longest_bar_at_the_top():
    """At a 30-day horizon broker 3 (10 days) uses 300 % of its free space, broker 1 (40 days)
    75 %, broker 2 (not growing) nothing; rows run top to bottom in urgency order."""
    fig = urgency_figure(urgency_first(forecast_frame(), "days_until_full"), 30)
    ax = fig.axes[0]
    assert ax.yaxis_inverted()  # row 0 drawn at the top
    bars = sorted(ax.patches, key=lambda bar: bar.get_y())  # top (y=0) first
    assert [round(bar.get_width(), 6) for bar in bars] == [300.0, 75.0, 0.0]
    assert [label.get_text() for label in ax.get_yticklabels()] == ["broker 3", "broker 1 (a)", "broker 2 (b)"]
    texts = [t.get_text() for t in ax.texts]
    assert texts == ["full in 10.0 days (2026-01-11)", "full in 40.0 days (2026-02-10)", "not growing"]


def test_disk_plot_draws_capacity_and_forecast_lines_from_the_figures():
    """Broker 7 holds 1 TiB of Biplane bytes growing 100 GiB a day with 2 TiB free on a 4 TiB
    filesystem: the room line sits at 3 TiB, the filesystem line at 4 TiB, and the forecast runs
    from the last point (1 TiB) to the room on the day it fills (20.48 days later)."""
    last_ms = 1_767_225_600_000
    history = pd.DataFrame({"snapshot_time_ms": [last_ms - DAY_MS, last_ms],
                            "biplane_bytes": [TIB - 100 * GIB, TIB]})
    days = 2 * TIB / (100 * GIB)
    row = pd.DataFrame([{"broker_id": 7, "filesystem_total_bytes": 4 * TIB, "biplane_capacity_bytes": 3 * TIB,
                         "biplane_bytes": TIB, "growth_bytes_per_day": 100 * GIB, "days_until_full": days,
                         "last_ms": last_ms, "status": "ok"}]).iloc[0]
    ax = disk_forecast_figure(history, row, horizon_days=30).axes[0]
    assert ax.get_ylabel() == "TiB"
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert set(lines) == {LINE_BIPLANE, LINE_FORECAST, LINE_ROOM, LINE_FILESYSTEM}
    assert list(lines[LINE_BIPLANE].get_ydata()) == pytest.approx([1 - 100 / 1024, 1.0])
    assert set(lines[LINE_ROOM].get_ydata()) == {3.0} and set(lines[LINE_FILESYSTEM].get_ydata()) == {4.0}
    start, end = (pd.Timestamp(x, tz="UTC") for x in lines[LINE_FORECAST].get_xdata())
    assert start == pd.Timestamp(last_ms, unit="ms", tz="UTC")
    assert (end - start) / pd.Timedelta(days=1) == pytest.approx(days, rel=1e-9)
    assert list(lines[LINE_FORECAST].get_ydata()) == pytest.approx([1.0, 3.0])
    assert days == pytest.approx(20.48)


def test_disk_plot_of_a_slow_broker_stops_the_forecast_at_the_horizon():
    last_ms = 1_767_225_600_000
    history = pd.DataFrame({"snapshot_time_ms": [last_ms], "biplane_bytes": [TIB]})
    row = pd.DataFrame([{"broker_id": 1, "filesystem_total_bytes": 4 * TIB, "biplane_capacity_bytes": 3 * TIB,
                         "biplane_bytes": TIB, "growth_bytes_per_day": 1 * GIB, "days_until_full": 2048.0,
                         "last_ms": last_ms, "status": "ok"}]).iloc[0]
    lines = {line.get_label(): line for line in disk_forecast_figure(history, row, horizon_days=30).axes[0].get_lines()}
    assert list(lines[LINE_FORECAST].get_ydata()) == pytest.approx([1.0, 1 + 30 / 1024])


def test_schema_1_files_read_with_nulls_for_what_they_lack(tmp_path):
    """Files written before byte counters and log_bytes (schema 1) are accepted, their new
    columns read as NULL; a schema 1 file that lacks a column schema 1 had is still refused,
    and so is an unknown schema version."""
    spec = HistorySpec(brokers=4, partitions=8, snapshots=3, legacy_snapshots=2)
    old, _, new = generate_history(spec, tmp_path / "h")
    assert check_file(str(old))[1:3] == (True, None) and check_file(str(old))[5] == 1
    assert check_file(str(new))[5] == 2
    old_rows = read_file_rows(str(old), "broker_usage")
    assert {row[-5:] for row in old_rows} == {(None,) * 5}
    new_rows = read_file_rows(str(new), "broker_usage")
    assert all(row[-5] is not None and row[-3] is not None for row in new_rows)
    with sqlite3.connect(old) as conn:
        conn.execute("ALTER TABLE broker_usage DROP COLUMN disk_free_bytes")
    assert "lacks columns disk_free_bytes" in check_file(str(old))[2]
    with sqlite3.connect(new) as conn:
        conn.execute("UPDATE cluster SET schema_version = 3")
    assert "schema version 3, this reader knows 1, 2" in check_file(str(new))[2]
