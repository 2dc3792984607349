"""The capacity report's HTML page: plots as embedded PNGs, then every table, in human units.

Runs on the driver over results that are already small (one row per broker
per snapshot at most); plots use matplotlib's Agg backend, no display needed.
Each plot is built by a function returning its Figure, so tests read the
plotted data (bar widths, line points) rather than pixels. Brokers nearest to
full come first everywhere: the top rows and the longest bars are the urgent ones.
"""
from __future__ import annotations

import base64
import html
import io
import math
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from controller.report.units import byte_unit, human_days, human_duration, human_value  # noqa: E402

DAY_MS = 86_400_000
ROWS_SHOWN_MAX = 200  # longer tables are in their CSV; the page shows the head
PLOT_POINTS_MAX = 1500  # per line; longer histories are thinned for the plots only (CSVs keep all)
URGENCY_ROWS_MAX = 40  # brokers in the urgency chart; the forecast table has them all

# Line labels of a disk plot (tests find the lines by them).
LINE_BIPLANE = "Biplane's bytes (its logs)"
LINE_FORECAST = "forecast at the fitted growth"
LINE_ROOM = "room for Biplane (its bytes + free space)"
LINE_FILESYSTEM = "filesystem size"


def _png(fig: Figure) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _times(ms: list[float]) -> np.ndarray:
    """Unix milliseconds as datetime64 (UTC), the x values of the time plots."""
    return np.array([round(m) for m in ms], dtype="datetime64[ms]")


def _number(value: object) -> float | None:
    if value is None or value is pd.NA:
        return None
    number = float(value)  # type: ignore[arg-type]
    return None if math.isnan(number) else number


def urgency_figure(forecast: pd.DataFrame, horizon_days: float) -> Figure:
    """One bar per broker, most urgent at the top and longest: the share of today's free space
    its growth takes within `horizon_days` (100 % = full within the horizon), i.e.
    100 x horizon / days until full; labelled with the days and the date it fills."""
    rows = forecast.head(URGENCY_ROWS_MAX)
    shares, labels, notes, colors = [], [], [], []
    for r in rows.itertuples(index=False):
        days = _number(r.days_until_full)
        share = 0.0 if days is None else (100.0 * horizon_days / days if days > 0 else math.inf)
        shares.append(share)
        labels.append(f"broker {r.broker_id}" + (f" ({r.rack})" if isinstance(r.rack, str) else ""))
        notes.append(f"full in {human_days(days)} ({str(r.full_at)[:10]})" if days is not None
                     else str(r.status))
        colors.append("#c0392b" if share >= 100 else "#e67e22" if share >= 50 else "#5b8db8")
    finite = [s for s in shares if math.isfinite(s)]
    cap = max([*finite, 100.0]) * 1.05
    widths = [min(s, cap) for s in shares]
    fig, ax = plt.subplots(figsize=(10, 0.35 * max(3, len(rows)) + 1))
    ax.barh(range(len(rows)), widths, color=colors)
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.invert_yaxis()  # first row (most urgent) at the top
    ax.axvline(100, color="#c0392b", linestyle="--", linewidth=1)
    for y, (width, note) in enumerate(zip(widths, notes)):
        ax.text(width + cap * 0.01, y, note, va="center", fontsize=8)
    ax.set_xlim(0, cap * 1.45)
    ax.set_xlabel(f"% of today's free space used within {horizon_days:g} days (100 % = full)")
    ax.set_title("Which brokers fill first (most urgent at the top)")
    ax.grid(alpha=0.3, axis="x")
    return fig


def disk_forecast_figure(history: pd.DataFrame, row: object, horizon_days: float) -> Figure:
    """One broker's Biplane bytes over time, with the room it has (its bytes plus the
    filesystem's free space, as of the last snapshot), the filesystem's size, and the forecast
    from the last point at the fitted growth: up to the room if it fills within the horizon,
    else to the horizon."""
    total = _number(getattr(row, "filesystem_total_bytes"))
    room = _number(getattr(row, "biplane_capacity_bytes"))
    last_bytes = _number(getattr(row, "biplane_bytes"))
    growth = _number(getattr(row, "growth_bytes_per_day"))
    days = _number(getattr(row, "days_until_full"))
    last_ms = float(getattr(row, "last_ms"))
    scale, unit = byte_unit(max(v for v in (total, room, last_bytes, 1.0) if v is not None))
    points = history.sort_values("snapshot_time_ms")
    step = max(1, -(-len(points) // PLOT_POINTS_MAX))
    points = points.iloc[::step]
    times = _times([float(t) for t in points["snapshot_time_ms"]])
    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.plot(times, [float(v) / scale for v in points["biplane_bytes"]], label=LINE_BIPLANE, linewidth=1.4)
    end_ms = last_ms + horizon_days * DAY_MS
    if growth is not None and growth > 0 and last_bytes is not None:
        if days is not None and days <= horizon_days and room is not None:
            forecast_end_ms, forecast_end = last_ms + days * DAY_MS, room
        else:
            forecast_end_ms, forecast_end = end_ms, last_bytes + growth * horizon_days
        end_ms = max(end_ms, forecast_end_ms)
        ax.plot(_times([last_ms, forecast_end_ms]), [last_bytes / scale, forecast_end / scale],
                label=LINE_FORECAST, linestyle="--", color="#c0392b", linewidth=1.4)
    span = _times([float(points["snapshot_time_ms"].min()) if len(points) else last_ms, end_ms])
    if room is not None:
        ax.plot(span, [room / scale, room / scale], label=LINE_ROOM, color="#333333", linewidth=1.2)
    if total is not None:
        ax.plot(span, [total / scale, total / scale], label=LINE_FILESYSTEM, color="#999999", linestyle=":",
                linewidth=1.2)
    ax.set_ylim(bottom=0)
    ax.set_ylabel(unit)
    ax.set_title(f"Broker {getattr(row, 'broker_id')}: "
                 + (f"full in {human_days(days)}" if days is not None else str(getattr(row, "status"))),
                 fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")  # the lines rise to the upper right; the capacity lines are on top
    fig.autofmt_xdate()
    return fig


def _time_plot(series: pd.DataFrame, columns: list[str], rate: bool, title: str) -> str:
    values = sum(series[c].astype("Float64").to_numpy(dtype="float64", na_value=np.nan) for c in columns)
    wide = pd.DataFrame({"t": series["snapshot_time_ms"].to_numpy(dtype="int64"),
                         "b": series["broker_id"].to_numpy(dtype="int64"), "v": values}
                        ).pivot_table(index="t", columns="b", values="v", aggfunc="mean")
    step = max(1, -(-len(wide) // PLOT_POINTS_MAX))
    if step > 1:
        wide = wide.iloc[::step]
        title = f"{title} (every {step}th snapshot)"
    top = float(np.nanmax(wide.to_numpy())) if wide.size and not np.isnan(wide.to_numpy()).all() else 1.0
    scale, unit = byte_unit(top)
    fig, ax = plt.subplots(figsize=(10, 4))
    times = pd.to_datetime(wide.index, unit="ms", utc=True)
    for broker_id in wide.columns:
        ax.plot(times, wide[broker_id] / scale, label=f"broker {broker_id}", linewidth=1.2)
    ax.set_ylabel(f"{unit}/s" if rate else unit)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=max(1, min(6, len(wide.columns) // 8 + 1)), loc="upper left")
    fig.autofmt_xdate()
    return _png(fig)


def _bars(frame: pd.DataFrame, columns: list[str], labels: list[str], in_bytes: bool, title: str) -> str:
    fig, ax = plt.subplots(figsize=(10, 3.5))
    width = 0.8 / len(columns)
    xs = range(len(frame))
    top = max((float(frame[c].max()) for c in columns if len(frame)), default=1.0)
    scale, unit = byte_unit(top) if in_bytes else (1.0, "count")
    for i, (column, label) in enumerate(zip(columns, labels)):
        ax.bar([x + i * width for x in xs], frame[column].fillna(0) / scale, width=width, label=label)
    ax.set_xticks([x + width * (len(columns) - 1) / 2 for x in xs])
    ax.set_xticklabels([str(b) for b in frame["broker_id"]], fontsize=7)
    ax.set_xlabel("broker")
    ax.set_ylabel(unit)
    ax.set_title(title)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    return _png(fig)


def _img(data: str, alt: str, css: str = "") -> str:
    return f'<img alt="{html.escape(alt)}" class="{css}" src="data:image/png;base64,{data}">'


def human_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """The frame as the page shows it: byte counts, rates, days and durations in human units
    (by column name), and without the millisecond timestamps (their ISO twins stay)."""
    shown = frame[[c for c in frame.columns if not c.endswith("_ms")]]
    return pd.DataFrame({c: [human_value(c, None if v is pd.NA else v) for v in shown[c].astype(object)]
                         for c in shown.columns}, columns=list(shown.columns))


def skew_shown(frame: pd.DataFrame) -> pd.DataFrame:
    """skew_summary with the mean, max and min of the replica_bytes rows in human units (its
    other rows are counts)."""
    shown = frame.copy()
    for column in ("mean", "max", "min"):
        if column in shown.columns:
            shown[column] = pd.Series([human_value("replica_bytes", v) if metric == "replica_bytes" else v
                                       for metric, v in zip(shown["metric"], shown[column])],
                                      index=shown.index, dtype=object)
    return shown


def _table(name: str, frame: pd.DataFrame) -> str:
    shown = human_frame(frame.head(ROWS_SHOWN_MAX))
    note = (f"<p>First {ROWS_SHOWN_MAX} of {len(frame)} rows; all are in <code>{name}.csv</code> "
            f"(exact numbers).</p>" if len(frame) > ROWS_SHOWN_MAX
            else f"<p>Also in <code>{name}.csv</code> (exact numbers).</p>")
    return note + shown.to_html(index=False, na_rep="", float_format=lambda v: f"{v:,.3f}", border=0)


def _dl(items: dict) -> str:
    rows = "".join(f"<dt>{html.escape(str(k))}</dt><dd>{html.escape(str(human_value(str(k), v)))}</dd>"
                   for k, v in items.items())
    return f"<dl>{rows}</dl>"


def _plan_paragraph(plan: dict, out_dir: Path) -> str:
    if not plan.get("partitions_changed"):
        return "<p>No partition needs to move.</p>"
    return (f"<p>Plan file <code>{html.escape(str(plan['plan_file']))}</code>: "
            f"<code>biplane reassign --plan {html.escape(str(out_dir / str(plan['plan_file'])))}</code> executes it. "
            f"It changes {plan['partitions_changed']} partition(s) and copies "
            f"{human_value('bytes_to_move', plan['bytes_to_move'])}: about "
            f"<b>{human_duration(plan['estimated_seconds'])}</b> at "
            f"{human_value('throttle_bytes_per_s', plan['throttle_bytes_per_s'])} per receiving broker "
            f"(broker {plan['busiest_broker']} receives the most, "
            f"{human_value('busiest_broker_bytes', plan['busiest_broker_bytes'])}).</p>")


def render_html(out_dir: Path, tables: dict[str, pd.DataFrame], summary: dict) -> Path:
    series = tables["broker_timeseries"]
    forecast = tables["forecast"]
    horizon = float(summary.get("horizon_days", 30.0))
    notes = ("forecast_note", "throughput_note", "biplane_bytes_note")
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>Biplane capacity report</title>",
        "<style>body{font-family:sans-serif;margin:2em;max-width:1100px}table{border-collapse:collapse;"
        "font-size:12px}td,th{padding:2px 6px;border-bottom:1px solid #ddd;text-align:right}"
        "dt{font-weight:bold;float:left;clear:left;width:22em}dd{margin-left:23em}.note{background:#fff3cd;"
        "padding:.5em 1em;border-left:4px solid #e0a800}img.half{width:49%}</style></head><body>",
        "<h1>Biplane capacity report</h1>",
        _dl({k: v for k, v in summary.items() if not isinstance(v, dict) and k not in notes}),
    ]
    parts += [f"<p class='note'>{html.escape(str(summary[k]))}</p>" for k in notes if k in summary]
    warnings = tables.get("warnings")
    if warnings is not None and len(warnings):
        parts += ["<h2>Skipped files</h2>", _table("warnings", warnings)]

    parts += ["<h2>Days until full, most urgent first</h2>",
              f"<p>Biplane's own bytes (its partition logs, not the whole filesystem) fitted by ordinary least "
              f"squares on time, per broker, over its last {summary.get('fit_days')} days of snapshots (Spark's "
              f"<code>regr_slope</code>). Full means its logs have taken the filesystem's free space: days until "
              f"full = free space at the last snapshot / growth per day. The filesystem's size and its other "
              f"files are shown beside it.</p>"]
    if len(forecast):
        parts.append(_img(_png(urgency_figure(forecast, horizon)), "days until full"))
    parts.append(_table("forecast", forecast))
    plotted = forecast.head(int(summary.get("plot_brokers", 6)))
    if len(plotted):
        parts.append(f"<h3>Disk of the {len(plotted)} most urgent brokers</h3>")
        for row in plotted.itertuples(index=False):
            history = series[series["broker_id"] == row.broker_id]
            parts.append(_img(_png(disk_forecast_figure(history, row, horizon)), f"disk of broker {row.broker_id}",
                              "half"))

    parts += ["<h2>Biplane's bytes and throughput per broker over time</h2>",
              _img(_time_plot(series, ["biplane_bytes"], False, "Biplane's bytes per broker"), "Biplane bytes"),
              _img(_time_plot(series, ["produce_bytes_per_s", "replication_in_bytes_per_s"], True,
                              "Bytes written per broker (client produce + replication), from byte counters"),
                   "bytes in"),
              _img(_time_plot(series, ["fetch_bytes_per_s"], True, "Bytes fetched from each broker"), "bytes out"),
              "<p>Bytes per second are each broker's byte counters differenced between consecutive snapshots "
              "(column <code>throughput_source</code> says where each row's figure comes from). Per snapshot and "
              "broker in <code>broker_timeseries.csv</code>.</p>"]

    skew = tables["broker_skew"]
    parts += ["<h2>Leader and replica skew</h2>",
              "<p>max / mean across brokers and racks (1.0 is even).</p>",
              _table("skew_summary", skew_shown(tables["skew_summary"])),
              _img(_bars(skew, ["leaders", "replicas"], ["leaders", "replicas"], False,
                         "Leaders and replicas per broker"), "leaders and replicas"),
              _table("broker_skew", skew), "<h3>Per rack</h3>", _table("rack_skew", tables["rack_skew"])]

    balance = summary.get("balance", {})
    placement = tables["balanced_placement"]
    parts += ["<h2>Balanced placement</h2>",
              "<p>Deterministic greedy (see SCHEMA.md, “Move plan”): replicas on dead brokers move first; then "
              "the broker with the most replica bytes gives the replica whose size is closest to half the gap to "
              "the lightest broker that may take it, keeping each partition's rack spread.</p>",
              _plan_paragraph(balance, out_dir), _dl(balance),
              _img(_bars(placement, ["replica_bytes_before", "replica_bytes_after"], ["now", "balanced"], True,
                         "Replica bytes per broker, now and balanced (most urgent first)"), "balanced placement"),
              _table("move_plan", tables["move_plan"]), "<h3>Leadership changes</h3>",
              _table("leader_plan", tables["leader_plan"]), "<h3>Per broker</h3>", _table("balanced_placement", placement)]

    parts += ["<h2>What if</h2>", f"<h3>Add {summary.get('add_brokers', {}).get('count')} broker(s)</h3>",
              _dl(summary.get("add_brokers", {})), _table("whatif_add_brokers", tables["whatif_add_brokers"]),
              _table("whatif_add_brokers_moves", tables["whatif_add_brokers_moves"])]
    if "whatif_replication_factor" in tables:
        rf = summary["replication_factor"]
        parts += [f"<h3>Change the replication factor of {html.escape(str(rf['topic']))} from {rf['from']} to "
                  f"{rf['to']}</h3>", _dl(rf), _table("whatif_replication_factor", tables["whatif_replication_factor"])]
    if "whatif_lose_broker" in tables:
        lost = summary["lose_broker"]
        parts += [f"<h3>Lose broker {lost['broker_id']}</h3>", _plan_paragraph(lost, out_dir), _dl(lost),
                  _table("whatif_lose_broker", tables["whatif_lose_broker"]),
                  _table("whatif_lose_broker_moves", tables["whatif_lose_broker_moves"])]
    parts.append("</body></html>")
    path = out_dir / "report.html"
    path.write_text("\n".join(parts), encoding="utf-8")
    return path
