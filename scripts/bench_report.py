"""Benchmark: the capacity report over N snapshot files of a 30-broker, 3,000-partition cluster.

    .venv/bin/python scripts/bench_report.py --sizes 1000 --masters 'local[*]' 'local[1]' 'local[2]'

Histories are generated once (seeded) and cached under --cache-dir, so reruns
only measure the report. For each size and master it prints the session start
time, the report's wall time and its stages, and the per-file cost; then the
speed-up from local[1] to local[2] when both ran.
"""
from __future__ import annotations

import argparse
import io
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from controller.report.capacity import Progress, ReportOptions, run_capacity_report  # noqa: E402
from controller.report.history import HistorySpec, generate_history  # noqa: E402
from controller.report.session import start_session  # noqa: E402

BROKERS = 30
PARTITIONS = 3000
HISTORY_VERSION = 3  # bump when the generator changes, so cached histories are rebuilt


def cached_history(cache_dir: Path, snapshots: int, jobs: int) -> tuple[Path, float | None]:
    """The history directory for `snapshots` files, and its generation time if generated now."""
    spec = HistorySpec(brokers=BROKERS, partitions=PARTITIONS, snapshots=snapshots, interval_ms=60_000, seed=1)
    directory = cache_dir / f"history-v{HISTORY_VERSION}-{BROKERS}b-{PARTITIONS}p-{snapshots}"
    done = cache_dir / f"history-v{HISTORY_VERSION}-{BROKERS}b-{PARTITIONS}p-{snapshots}.done"
    if done.exists():
        return directory, None
    shutil.rmtree(directory, ignore_errors=True)
    started = time.monotonic()

    def progress(count: int, total: int) -> None:
        if count % 500 == 0 or count == total:
            print(f"  generated {count}/{total} in {time.monotonic() - started:.0f}s", file=sys.stderr, flush=True)

    generate_history(spec, directory, jobs=jobs, progress=progress)
    elapsed = time.monotonic() - started
    done.write_text(json.dumps({"seconds": elapsed}))
    return directory, elapsed


class StageClock(Progress):
    def __init__(self) -> None:
        super().__init__(6, stream=io.StringIO())
        self.marks: list[tuple[str, float]] = []

    def __call__(self, message: str) -> None:
        self.marks.append((message.split(" ")[0] + " " + message.split(" ")[1], time.monotonic()))
        super().__call__(message)


def run(master: str, directory: Path, splits: int | None, *, warmup: list[str] | None = None) -> dict:
    started = time.monotonic()
    spark = start_session(master, app_name="biplane-bench")
    session_s = time.monotonic() - started
    out = Path(tempfile.mkdtemp(prefix="biplane-bench-report-"))
    clock = StageClock()
    try:
        if warmup:
            # The first report in a JVM also pays for JIT and Python worker start-up; run a small
            # one first so masters are compared on equal terms.
            run_capacity_report(spark, warmup, out / "warmup", ReportOptions(splits=splits), StageClock())
        t0 = time.monotonic()
        result = run_capacity_report(spark, [str(directory)], out, ReportOptions(splits=splits), clock)
        report_s = time.monotonic() - t0
        parallelism = spark.sparkContext.defaultParallelism
    finally:
        spark.stop()
        shutil.rmtree(out, ignore_errors=True)
    stages = {}
    for (name, t), (_, t_next) in zip(clock.marks, clock.marks[1:] + [("end", t0 + report_s)]):
        stages[name] = round(t_next - t, 2)
    return {"master": master, "parallelism": parallelism, "files": result.summary["snapshots"],
            "session_s": round(session_s, 2), "report_s": round(report_s, 2),
            "per_file_ms": round(1000 * report_s / result.summary["snapshots"], 2), "stages_s": stages}


def load_average() -> float:
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000])
    parser.add_argument("--masters", nargs="+", default=["local[*]", "local[1]", "local[2]"])
    parser.add_argument("--cache-dir", type=Path, default=Path("/tmp/biplane-bench"))
    parser.add_argument("--jobs", type=int, default=2, help="processes generating a history")
    parser.add_argument("--splits", type=int, default=None, help="default: 2 x parallelism")
    args = parser.parse_args()
    args.cache_dir.mkdir(parents=True, exist_ok=True)
    results = []
    for size in args.sizes:
        directory, generated_s = cached_history(args.cache_dir, size, args.jobs)
        if generated_s is not None:
            print(f"history of {size} files generated in {generated_s:.1f}s "
                  f"({1000 * generated_s / size:.1f} ms/file with {args.jobs} processes)")
        disk = sum(p.stat().st_size for p in directory.iterdir())
        print(f"{size} files, {disk / 1e9:.2f} GB in {directory}")
        warmup = [str(p) for p in sorted(directory.iterdir())[:20]]
        for master in args.masters:
            figures = run(master, directory, args.splits, warmup=warmup)
            figures["size"] = size
            figures["load_average_1m"] = load_average()  # the machine is shared: context for the figures
            results.append(figures)
            print(json.dumps(figures), flush=True)
        by_master = {r["master"]: r for r in results if r["size"] == size}
        if "local[1]" in by_master and "local[2]" in by_master:
            one, two = by_master["local[1]"]["report_s"], by_master["local[2]"]["report_s"]
            print(f"{size} files: local[1] {one:.1f}s, local[2] {two:.1f}s, speed-up {one / two:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
