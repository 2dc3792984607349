"""`biplane report`: capacity reports over snapshot files, and synthetic histories for them.

    biplane report capacity SNAPSHOT_DIR_OR_GLOB... --out report/ [--master spark://...]
    biplane report generate-history --out snapshots/ --brokers 6 --partitions 60 --snapshots 96
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # capacity imports Spark, which only the reports extra installs
    from controller.report.capacity import ReportOptions


def _topic_rf(text: str) -> tuple[str, int]:
    topic, sep, rf = text.rpartition("=")
    if not sep or not topic or not rf.isdigit():
        raise argparse.ArgumentTypeError(f"expected TOPIC=REPLICATION_FACTOR, e.g. orders=4; got {text!r}")
    return topic, int(rf)


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="Capacity reports over controller snapshots (Spark).")
    sub = parser.add_subparsers(dest="command", required=True)

    cap = sub.add_parser("capacity", help="write an HTML capacity report and its tables as CSV")
    cap.add_argument("inputs", nargs="+", help="snapshot directories, globs or files")
    cap.add_argument("--out", required=True, type=Path, help="directory for report.html and the CSVs")
    cap.add_argument("--master", default="local[*]", help="Spark master (default: local[*])")
    cap.add_argument("--splits", type=int, default=None,
                     help="how many groups of files to read in parallel (default: 2 x Spark's parallelism)")
    cap.add_argument("--fit-days", type=float, default=7.0, help="least-squares window per broker (default 7)")
    cap.add_argument("--add-brokers", type=int, default=1, help="what-if: add this many brokers (default 1)")
    cap.add_argument("--replication-factor", type=_topic_rf, default=None, metavar="TOPIC=RF",
                     help="what-if: change this topic's replication factor (default: largest topic, RF+1)")
    cap.add_argument("--lose-broker", type=int, default=None,
                     help="what-if: lose this broker (default: the one with the most replica bytes)")
    cap.add_argument("--balance-tolerance", type=float, default=0.05,
                     help="stop balancing when brokers are within this fraction of the mean (default 0.05)")
    cap.add_argument("--throttle-mb-s", type=float, default=50.0, metavar="MIB_PER_S",
                     help="replication throttle per receiving broker, in MiB/s (1 MiB = 1,048,576 bytes), "
                          "written into the move plans (reassign_*.json, for `biplane reassign --plan`) and used "
                          "for their time estimates (default 50; at least 1024 bytes/s)")
    cap.add_argument("--horizon-days", type=float, default=30.0,
                     help="the urgency chart shows the share of today's free space each broker uses within this "
                          "many days (default 30)")
    cap.add_argument("--plot-brokers", type=int, default=6,
                     help="draw disk plots with capacity and forecast lines for this many of the most urgent "
                          "brokers (default 6)")

    gen = sub.add_parser("generate-history", help="write a synthetic, seeded history of snapshot files")
    gen.add_argument("--out", required=True, type=Path, help="directory to write the snapshot files into")
    gen.add_argument("--brokers", type=int, default=6, help="brokers at the end; the last joins half-way")
    gen.add_argument("--partitions", type=int, default=60)
    gen.add_argument("--snapshots", type=int, default=96)
    gen.add_argument("--interval", type=float, default=900.0, help="seconds between snapshots (default 900)")
    gen.add_argument("--seed", type=int, default=1)
    gen.add_argument("--jobs", type=int, default=1, help="processes writing files (default 1)")
    gen.add_argument("--legacy-snapshots", type=int, default=0,
                     help="write the first N snapshots in schema 1 (no byte counters, no log_bytes), as a "
                          "cluster upgraded mid-history (default 0)")
    return parser


URGENT_SHOWN = 5  # brokers nearest to full that the command prints

# What `pip install biplane` leaves out: the reports' packages come with the `reports` extra.
REPORT_PACKAGES = ("pyspark", "pyarrow", "pandas", "matplotlib")


def main(argv: list[str], prog: str) -> int:
    args = _parser(prog).parse_args(argv)
    try:
        if args.command == "generate-history":
            return _generate(args)
        return _capacity(args)
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in REPORT_PACKAGES:
            raise
        print(f"{prog}: the capacity reports need {exc.name}, which a plain `pip install biplane` leaves out; "
              "install the reports extra: pip install 'biplane[reports]' (in a checkout: "
              "pip install -e '.[reports]'; scripts/test and scripts/up install it)", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2


def _generate(args: argparse.Namespace) -> int:
    from controller.report.history import HistorySpec, expected_growth_bytes_per_day, generate_history
    from controller.report.units import human_per_day

    spec = HistorySpec(brokers=args.brokers, partitions=args.partitions, snapshots=args.snapshots,
                       interval_ms=int(args.interval * 1000), seed=args.seed, legacy_snapshots=args.legacy_snapshots)
    started = time.monotonic()

    def progress(done: int, total: int) -> None:
        print(f"[generate-history +{time.monotonic() - started:.1f}s] {done}/{total} snapshots", file=sys.stderr,
              flush=True)

    paths = generate_history(spec, args.out, jobs=args.jobs, progress=progress)
    growth = expected_growth_bytes_per_day(spec)
    print(f"wrote {spec.snapshots} snapshots to {args.out} ({len(paths)} snapshot files there now); "
          f"broker {spec.joiner} joins at snapshot {spec.join_index}")
    for broker_id, rate in sorted(growth.items()):
        print(f"  broker {broker_id}: Biplane's bytes grow {human_per_day(rate)} at the end of the history")
    return 0


def options_from_args(args: argparse.Namespace) -> ReportOptions:
    """The report's options from `capacity`'s flags; ValueError naming the flag when one is out of range."""
    from controller.report.capacity import MIB, ReportOptions

    return ReportOptions(fit_days=args.fit_days, add_brokers=args.add_brokers,
                         replication_factor_change=args.replication_factor, lose_broker=args.lose_broker,
                         balance_tolerance_ratio=args.balance_tolerance, splits=args.splits,
                         throttle_bytes_per_s=round(args.throttle_mb_s * MIB), horizon_days=args.horizon_days,
                         plot_brokers=args.plot_brokers)


def _capacity(args: argparse.Namespace) -> int:
    from controller.report.capacity import Progress, discover_inputs, run_capacity_report
    from controller.report.units import human_days, human_per_day
    from controller.report.session import start_session

    options = options_from_args(args)  # fail on a bad flag or no input before paying for a Spark start
    if not discover_inputs(args.inputs)[0]:
        raise ValueError(f"no snapshot files in {', '.join(args.inputs)}; expected names like "
                         "snapshot-20260101T000000Z-000000000042.sqlite")
    progress = Progress(6)
    progress(f"starting Spark ({args.master})")
    spark = start_session(args.master)
    try:
        result = run_capacity_report(spark, args.inputs, args.out, options, progress)
    finally:
        spark.stop()
    print(f"report: {result.html_path}")
    urgent = result.tables["forecast"].dropna(subset=["days_until_full"]).head(URGENT_SHOWN)
    if len(urgent):
        print("nearest to full:")
        for r in urgent.to_dict("records"):
            print(f"  broker {r['broker_id']}: full in {human_days(r['days_until_full'])} ({r['full_at']}), "
                  f"growing {human_per_day(r['growth_bytes_per_day'])}")
    for name, plan in result.plans.items():
        moves = plan.get("partitions") if isinstance(plan, dict) else None
        if isinstance(moves, list) and moves:
            print(f"move plan: {args.out / name} ({len(moves)} partition(s); biplane reassign --plan FILE)")
        else:
            print(f"move plan: {args.out / name} moves nothing: no partition needs to move")
    for note in ("forecast_note", "throughput_note", "biplane_bytes_note"):
        if note in result.summary:
            print(result.summary[note])
    if result.warnings:
        print(f"skipped {len(result.warnings)} file(s); see {args.out / 'warnings.csv'}")
    return 0
