"""The capacity report's HTML page: plots as embedded PNGs, then every table.

Runs on the driver over results that are already small (one row per broker
per snapshot at most); plots use matplotlib's Agg backend, no display needed.
"""
from __future__ import annotations

import base64
import html
import io
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

GB = 1e9
MB = 1e6
ROWS_SHOWN_MAX = 200  # longer tables are in their CSV; the page shows the head
PLOT_POINTS_MAX = 1500  # per line; longer histories are thinned for the plots only (CSVs keep all)


def _png(fig) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _time_plot(series: pd.DataFrame, columns: list[str], scale: float, ylabel: str, title: str) -> str:
    values = sum(series[c].astype("Float64").to_numpy(dtype="float64", na_value=np.nan) for c in columns) / scale
    wide = pd.DataFrame({"t": series["snapshot_time_ms"].to_numpy(dtype="int64"),
                         "b": series["broker_id"].to_numpy(dtype="int64"), "v": values}
                        ).pivot_table(index="t", columns="b", values="v", aggfunc="mean")
    step = max(1, -(-len(wide) // PLOT_POINTS_MAX))
    if step > 1:
        wide = wide.iloc[::step]
        title = f"{title} (every {step}th snapshot)"
    fig, ax = plt.subplots(figsize=(10, 4))
    times = pd.to_datetime(wide.index, unit="ms", utc=True)
    for broker_id in wide.columns:
        ax.plot(times, wide[broker_id], label=f"broker {broker_id}", linewidth=1.2)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=max(1, min(6, len(wide.columns) // 8 + 1)), loc="upper left")
    fig.autofmt_xdate()
    return _png(fig)


def _bars(frame: pd.DataFrame, columns: list[str], labels: list[str], scale: float, ylabel: str, title: str) -> str:
    fig, ax = plt.subplots(figsize=(10, 3.5))
    width = 0.8 / len(columns)
    xs = range(len(frame))
    for i, (column, label) in enumerate(zip(columns, labels)):
        ax.bar([x + i * width for x in xs], frame[column].fillna(0) / scale, width=width, label=label)
    ax.set_xticks([x + width * (len(columns) - 1) / 2 for x in xs])
    ax.set_xticklabels([str(b) for b in frame["broker_id"]], fontsize=7)
    ax.set_xlabel("broker")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    return _png(fig)


def _img(data: str, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _table(name: str, frame: pd.DataFrame) -> str:
    shown = frame.head(ROWS_SHOWN_MAX)
    note = (f"<p>First {ROWS_SHOWN_MAX} of {len(frame)} rows; all are in <code>{name}.csv</code>.</p>"
            if len(frame) > ROWS_SHOWN_MAX else f"<p>Also in <code>{name}.csv</code>.</p>")
    return note + shown.to_html(index=False, na_rep="", float_format=lambda v: f"{v:,.3f}", border=0)


def _dl(items: dict) -> str:
    rows = "".join(f"<dt>{html.escape(str(k))}</dt><dd>{html.escape(str(v))}</dd>" for k, v in items.items())
    return f"<dl>{rows}</dl>"


def render_html(out_dir: Path, tables: dict[str, pd.DataFrame], summary: dict) -> Path:
    series = tables["broker_timeseries"]
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>Biplane capacity report</title>",
        "<style>body{font-family:sans-serif;margin:2em;max-width:1100px}table{border-collapse:collapse;"
        "font-size:12px}td,th{padding:2px 6px;border-bottom:1px solid #ddd;text-align:right}"
        "dt{font-weight:bold;float:left;clear:left;width:22em}dd{margin-left:23em}.note{background:#fff3cd;"
        "padding:.5em 1em;border-left:4px solid #e0a800}</style></head><body>",
        "<h1>Biplane capacity report</h1>",
        _dl({k: v for k, v in summary.items() if not isinstance(v, dict) and k != "forecast_note"}),
    ]
    if "forecast_note" in summary:
        parts.append(f"<p class='note'>{html.escape(summary['forecast_note'])}</p>")
    warnings = tables.get("warnings")
    if warnings is not None and len(warnings):
        parts += ["<h2>Skipped files</h2>", _table("warnings", warnings)]

    parts += ["<h2>Disk and throughput per broker over time</h2>",
              _img(_time_plot(series, ["disk_used_bytes"], GB, "GB used", "Disk used per broker"), "disk used"),
              _img(_time_plot(series, ["produce_bytes_per_s", "replication_in_bytes_per_s"], MB, "MB/s in",
                              "Bytes written per broker (client produce + replication)"), "bytes in"),
              _img(_time_plot(series, ["fetch_bytes_per_s"], MB, "MB/s out", "Bytes fetched from each broker"),
                   "bytes out"),
              "<p>Per snapshot and broker in <code>broker_timeseries.csv</code>.</p>"]

    forecast = tables["forecast"]
    parts += ["<h2>Growth and days until full</h2>",
              f"<p>Fit: ordinary least squares of disk used (bytes) on time (days), per broker, over its last "
              f"{summary.get('fit_days')} days of snapshots (Spark's <code>regr_slope</code>, "
              f"<code>regr_intercept</code>, <code>regr_r2</code>). Days until full = (disk total − last disk used) "
              f"/ slope. A broker needs at least 3 snapshots spanning an hour for a forecast.</p>"]
    if len(forecast) and forecast["days_until_full"].notna().any():
        parts.append(_img(_bars(forecast, ["days_until_full"], ["days until full"], 1, "days",
                                "Days until each broker's disk is full"), "days until full"))
    parts.append(_table("forecast", forecast))

    skew = tables["broker_skew"]
    parts += ["<h2>Leader and replica skew</h2>",
              "<p>max / mean across brokers and racks (1.0 is even).</p>",
              _table("skew_summary", tables["skew_summary"]),
              _img(_bars(skew, ["leaders", "replicas"], ["leaders", "replicas"], 1, "count",
                         "Leaders and replicas per broker"), "leaders and replicas"),
              _table("broker_skew", skew), "<h3>Per rack</h3>", _table("rack_skew", tables["rack_skew"])]

    balance = summary.get("balance", {})
    placement = tables["balanced_placement"]
    parts += ["<h2>Balanced placement</h2>",
              "<p>Deterministic greedy (see SCHEMA.md, “Move plan”): replicas on dead brokers move first; then "
              "the broker with the most replica bytes gives the replica whose size is closest to half the gap to "
              "the lightest broker that may take it, keeping each partition's rack spread.</p>",
              _dl(balance),
              _img(_bars(placement, ["replica_bytes_before", "replica_bytes_after"], ["now", "balanced"], GB, "GB",
                         "Replica bytes per broker, now and balanced"), "balanced placement"),
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
        parts += [f"<h3>Lose broker {lost['broker_id']}</h3>", _dl(lost),
                  _table("whatif_lose_broker", tables["whatif_lose_broker"]),
                  _table("whatif_lose_broker_moves", tables["whatif_lose_broker_moves"])]
    parts.append("</body></html>")
    path = out_dir / "report.html"
    path.write_text("\n".join(parts), encoding="utf-8")
    return path
