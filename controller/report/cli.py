"""`biplane report`: capacity reports over snapshot files, and synthetic histories for them.

    biplane report capacity SNAPSHOT_DIR_OR_GLOB... --out report/ [--master spark://...]
    biplane report generate-history --out snapshots/ --brokers 6 --partitions 60 --snapshots 96
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


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

    gen = sub.add_parser("generate-history", help="write a synthetic, seeded history of snapshot files")
    gen.add_argument("--out", required=True, type=Path, help="directory to write the snapshot files into")
    gen.add_argument("--brokers", type=int, default=6, help="brokers at the end; the last joins half-way")
    gen.add_argument("--partitions", type=int, default=60)
    gen.add_argument("--snapshots", type=int, default=96)
    gen.add_argument("--interval", type=float, default=900.0, help="seconds between snapshots (default 900)")
    gen.add_argument("--seed", type=int, default=1)
    gen.add_argument("--jobs", type=int, default=1, help="processes writing files (default 1)")
    return parser


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

    spec = HistorySpec(brokers=args.brokers, partitions=args.partitions, snapshots=args.snapshots,
                       interval_ms=int(args.interval * 1000), seed=args.seed)
    started = time.monotonic()

    def progress(done: int, total: int) -> None:
        print(f"[generate-history +{time.monotonic() - started:.1f}s] {done}/{total} snapshots", file=sys.stderr,
              flush=True)

    paths = generate_history(spec, args.out, jobs=args.jobs, progress=progress)
    growth = expected_growth_bytes_per_day(spec)
    print(f"wrote {spec.snapshots} snapshots to {args.out} ({len(paths)} snapshot files there now); "
          f"broker {spec.joiner} joins at snapshot {spec.join_index}")
    for broker_id, rate in sorted(growth.items()):
        print(f"  broker {broker_id}: grows {rate / 1e9:.2f} GB/day at the end of the history")
    return 0


def _capacity(args: argparse.Namespace) -> int:
    from controller.report.capacity import Progress, ReportOptions, discover_inputs, run_capacity_report
    from controller.report.session import start_session

    if not discover_inputs(args.inputs)[0]:  # fail before paying for a Spark start
        raise ValueError(f"no snapshot files in {', '.join(args.inputs)}; expected names like "
                         "snapshot-20260101T000000Z-000000000042.sqlite")
    options = ReportOptions(fit_days=args.fit_days, add_brokers=args.add_brokers,
                            replication_factor_change=args.replication_factor, lose_broker=args.lose_broker,
                            balance_tolerance_ratio=args.balance_tolerance, splits=args.splits)
    progress = Progress(6)
    progress(f"starting Spark ({args.master})")
    spark = start_session(args.master)
    try:
        result = run_capacity_report(spark, args.inputs, args.out, options, progress)
    finally:
        spark.stop()
    print(f"report: {result.html_path}")
    if "forecast_note" in result.summary:
        print(result.summary["forecast_note"])
    if result.warnings:
        print(f"skipped {len(result.warnings)} file(s); see {args.out / 'warnings.csv'}")
    return 0
