"""`scripts/chaos`: one seeded fault run against a real cluster, its summary, and its verdict.

    scripts/chaos --duration 150 --seed 7      # the short run CI takes (~3 minutes)
    scripts/chaos --duration 3600 --seed 42    # the long run
    scripts/chaos --check RESULTS/history.json # re-check a saved history
    scripts/chaos --cleanup                    # remove what a killed run left behind

Exit codes: 0 no violation; 1 violations or liveness failures found; 2 the harness could not run (capability,
start-up, or bound exceeded); the reason is printed, never a traceback.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

from tests.chaos.checker import VIOLATION_KINDS, Report, check
from tests.chaos.history import History
from tests.chaos.loopwatch import STALL_S
from tests.chaos.schedule import EXTRA_WEIGHTS, FAULT_WEIGHTS, GRAY_WEIGHTS, SCENARIOS

REPO_ROOT = Path(__file__).resolve().parents[2]
RESULTS_ROOT = Path("/tmp/biplane-chaos")


def capability_problems() -> list[str]:
    problems = []
    if os.geteuid() != 0:
        problems.append("not root: namespaces, nftables, tc and tmpfs mounts need root; run it as root "
                        "(CI does)")
    for tool, package in (("ip", "iproute2"), ("tc", "iproute2"), ("nft", "nftables"), ("mount", "mount"),
                          ("umount", "mount")):
        if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists():
            problems.append(f"{tool} is missing: run scripts/system-deps.sh as root (apt-get install {package})")
    from tests.chaos.cluster import faketime_library
    if faketime_library() is None:
        problems.append("libfaketime is missing: run scripts/system-deps.sh as root (apt-get install libfaketime)")
    if not problems:
        probe = f"bpcprobe{os.getpid() % 10000}"
        done = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
        if done.returncode != 0:
            problems.append(f"cannot create a network namespace ({done.stderr.strip()}); the harness needs "
                            "CAP_SYS_ADMIN and CAP_NET_ADMIN (a privileged container or a VM)")
        else:
            subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return problems


def point_to_results(out: Path) -> None:
    """--cleanup looks for manifests under RESULTS_ROOT: a run with results elsewhere leaves a
    pointer there, so what it leaves behind if killed (mounts, namespaces) is found too."""
    RESULTS_ROOT.mkdir(parents=True, exist_ok=True)
    (RESULTS_ROOT / f"elsewhere-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}").symlink_to(out.resolve())


def cleanup_leftovers() -> list[str]:
    """Kill, unmount and delete what runs that died left (by their manifests). Returns actions."""
    from tests.chaos.cluster import faketime_leftovers, process_exited, remove_faketime_leftovers
    from tests.chaos.net import run as net_run
    actions = []
    for link in RESULTS_ROOT.glob("elsewhere-*"):
        if link.is_symlink() and not link.exists():
            link.unlink()   # a run elsewhere whose results were removed: nothing left to clean
    for manifest_path in sorted(RESULTS_ROOT.glob("*/manifest.json")):
        try:
            m = json.loads(manifest_path.read_text())
        except (OSError, ValueError):
            continue
        if m.get("pid") and Path(f"/proc/{m['pid']}").exists() and m["pid"] != os.getpid():
            continue   # that run is still going
        killed: list[int] = []
        for name, pid in (m.get("pids") or {}).items():
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"common.cli" in cmdline:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                actions.append(f"killed {name} (pid {pid})")
        # A SIGKILL takes effect a moment later: the files of those killed go once they exited.
        deadline = time.monotonic() + 5
        while not all(process_exited(pid) for pid in killed) and time.monotonic() < deadline:
            time.sleep(0.05)
        for name, pid in (m.get("pids") or {}).items():
            if process_exited(pid) and faketime_leftovers(pid):
                remove_faketime_leftovers(pid)
                actions.append(f"removed libfaketime's files of {name} (pid {pid})")
        for mount in m.get("mounts") or []:
            if net_run(["umount", "-l", mount], check=False).returncode == 0:
                actions.append(f"unmounted {mount}")
        for ns in m.get("namespaces") or []:
            if net_run(["ip", "netns", "del", ns], check=False).returncode == 0:
                actions.append(f"deleted namespace {ns}")
        m.update({"namespaces": [], "mounts": [], "pids": {}})
        manifest_path.write_text(json.dumps(m, indent=1))
    return actions


def summary(history: History, report: Report, problems: list[str]) -> dict[str, Any]:
    return {"seed": history.seed, "ok": report.ok and not problems, "violations": report.counts,
            "liveness_failures": report.liveness,
            "figures": report.figures, "problems": problems, "notes": history.notes[:30],
            "process_exits": history.exits[:30], "producer_restarts": history.producer_restarts[:30],
            "examples": {k: v for k, v in report.violations.items() if v}}


def table(s: dict[str, Any]) -> str:
    f = s["figures"]
    rows: list[tuple[str, str]] = [("seed", str(s["seed"])), ("faults", str(f["faults"]))]
    rows += [(f"  {k}", str(v)) for k, v in f["faults_by_kind"].items()]
    rows += [("faults removing a quorum", str(f["faults_removing_quorum"])),
             ("records sent", str(f["sends"])), ("acknowledged (acks=all)", str(f["acked"])),
             ("failed", str(f["failed"])), ("no outcome", str(f["no_outcome"]))]
    rows += [(f"  {k}", str(v)) for k, v in f["failures_by_error"].items()]
    rows += [("seen by tailing consumers", str(f["seen_by_consumers"])),
             ("processes that exited on their own", str(f["process_exits"])),
             ("SDK producers that stopped (not replaced)", str(f["producer_restarts"]))]
    if "fences" in f:
        rows += [("broker fences during the workload", str(f["fences"]))]
        rows += [(f"  {k}", str(v)) for k, v in f["fences_by_reason"].items()]
        rows += [("  session expired, no fault explains", str(f["unexplained_fences"]))]
        rows += [(f"    on {b}", str(n)) for b, n in f["unexplained_fences_by_broker"].items()]
    rows += [(f"violations: {k}", str(s["violations"][k])) for k in VIOLATION_KINDS]
    rows += [(f"  {kind} in {topic}", str(n)) for kind, per in f.get("violations_by_topic", {}).items()
             for topic, n in per.items()]
    rows += [(f"liveness: {k.replace('_', ' ')}", str(len(v))) for k, v in s["liveness_failures"].items()]
    rows += [("longest acks=all gap outside quorum-removing faults (s)", str(f["longest_ack_gap_s"])),
             ("  ... and outside any two of a kind out of service (s)", str(f.get("longest_ack_gap_s_in_service"))),
             ("  times two of a kind were out of service (count, s)",
              f"{f.get('quorum_out_windows')}, {f.get('quorum_out_s')}"),
             (f"harness's own event loop stalls over {STALL_S} s (count, longest s)",
              "not recorded" if f.get("harness_stalls") is None
              else f"{f['harness_stalls']}, {f['harness_stall_longest_s']}"),
             ("time to ack again after last heal, worst (s)", str(f["reack_after_last_heal_s"])),
             ("partitions never acknowledging after last heal", str(len(f["partitions_never_reacked"])))]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k.ljust(width)}  {v}" for k, v in rows]
    gaps = f["longest_ack_gap_s_by_partition"]
    reacks = f["reack_after_last_heal_s_by_partition"]
    lines.append("")
    in_service = f.get("longest_ack_gap_s_in_service_by_partition", {})
    lines.append(f"{'partition'.ljust(24)} {'longest gap s':>14} {'in service s':>13} {'re-ack s':>10}")
    for tp in sorted(gaps):
        lines.append(f"{tp.ljust(24)} {gaps[tp]:>14} {str(in_service.get(tp, '-')):>13} {str(reacks.get(tp)):>10}")
    gray = f.get("gray") or {}
    if gray:
        targets = gray["targets_s"]
        lines.append("")
        lines.append("gray faults: longest acks=all gap inside the fault (s), by the partitions' leader as it began")
        lines.append(f"{'kind'.ljust(16)} {'faults':>6}  " + "  ".join(f"{g:>14}" for g in targets))
        lines.append(f"{'target'.ljust(16)} {'':>6}  " + "  ".join(f"{'<= ' + str(v):>14}" for v in targets.values()))
        for kind, row in sorted(gray["by_kind"].items()):
            cells = [str(row["longest_gap_s"].get(g, "-")) + ("!" if g in row["over_target"] else "")
                     for g in targets]
            lines.append(f"{kind.ljust(16)} {row['faults']:>6}  " + "  ".join(f"{c:>14}" for c in cells))
        lines.append("(! over target; cut_*: the cut broker led them, others_*: it did not)")
    lines.append("")
    verdict = ("OK" if s["ok"] else "VIOLATIONS" if any(s["violations"].values())
               else "LIVENESS FAILURES" if any(s["liveness_failures"].values()) else "PROBLEMS")
    lines.append(f"verdict: {verdict}")
    return "\n".join(lines)


def report_and_exit_code(history: History, report: Report, problems: list[str], out: Path | None,
                         *, liveness_advisory: bool = False) -> int:
    s = summary(history, report, problems)
    text = json.dumps(s, indent=1, sort_keys=True)
    if out is not None:
        (out / "summary.json").write_text(text + "\n")
    print(text)
    print()
    print(table(s))
    crashed = bool(report.liveness.get("processes_exited"))
    if not report.safe or crashed or (not report.ok and not liveness_advisory):
        return 1
    if not report.ok:
        print("liveness failures above are reported, not counted (--liveness-advisory): "
              "no safety violation and no process died unasked")
    return 2 if problems else 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="scripts/chaos", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, help="the schedule's seed (default: a random one, printed)")
    p.add_argument("--duration", type=float, default=150.0, help="seconds of faults (default 150: a ~3 minute run)")
    p.add_argument("--out", type=Path, help="results directory (default /tmp/biplane-chaos/seed-N-TIME)")
    p.add_argument("--partitions", type=int, default=2, help="partitions per topic (8 topics, one per mode)")
    p.add_argument("--interval-ms", type=int, default=100, help="each producer sends one record per partition this often")
    p.add_argument("--kinds", help=f"comma-separated fault kinds (default all: {','.join(FAULT_WEIGHTS)}; "
                                   f"also {','.join([*GRAY_WEIGHTS, *EXTRA_WEIGHTS])})")
    p.add_argument("--scenario", choices=sorted(SCENARIOS),
                   help="a named set of fault kinds: gray = a broker cut from its peers (both ways, one "
                        "way each way) or two brokers cut from each other, while all reach the controllers, "
                        "or the controller leader cut from the other controllers")
    p.add_argument("--settle", type=float, default=10.0, help="seconds of producing after the last heal")
    p.add_argument("--keep-data", action="store_true", help="copy the brokers' data out of their tmpfs before unmount")
    p.add_argument("--check", type=Path, metavar="HISTORY", help="only check a saved history.json")
    p.add_argument("--liveness-advisory", action="store_true",
                   help="exit 0 when the only failures are liveness ones (partitions slow to acknowledge or "
                        "read back); violations and processes that died unasked still exit 1")
    p.add_argument("--cleanup", action="store_true", help="remove what killed runs left (processes, mounts, namespaces)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.check:
        try:
            history = History.load(str(args.check))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"scripts/chaos: cannot read {args.check}: {exc}", file=sys.stderr)
            return 2
        return report_and_exit_code(history, check(history), [], None, liveness_advisory=args.liveness_advisory)
    problems = capability_problems()
    if problems:
        for problem in problems:
            print(f"scripts/chaos: {problem}", file=sys.stderr)
        return 2
    if args.cleanup:
        for action in cleanup_leftovers() or ["nothing left behind"]:
            print(action)
        return 0
    kinds = tuple(k.strip() for k in args.kinds.split(",")) if args.kinds else None
    if kinds and args.scenario:
        print("scripts/chaos: give --kinds or --scenario, not both", file=sys.stderr)
        return 2
    if args.scenario:
        kinds = SCENARIOS[args.scenario]
    if kinds:
        known = {**FAULT_WEIGHTS, **GRAY_WEIGHTS, **EXTRA_WEIGHTS}
        unknown = [k for k in kinds if k not in known]
        if unknown:
            print(f"scripts/chaos: unknown fault kinds {unknown}; known: {', '.join(known)}", file=sys.stderr)
            return 2
    if not 10 <= args.duration <= 24 * 3600:
        print(f"scripts/chaos: --duration {args.duration} must be between 10 and 86400 seconds", file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else random.randrange(1, 1 << 31)
    out = args.out or RESULTS_ROOT / f"seed-{seed}-{time.strftime('%Y%m%d-%H%M%S')}"
    if args.out is not None:
        point_to_results(out)
    cleaned = cleanup_leftovers()
    for action in cleaned:
        print(f"scripts/chaos: left by an earlier run: {action}", file=sys.stderr)

    from tests.chaos.runner import Interrupted, RunOptions, execute

    def on_signal(signum: int, frame: FrameType | None) -> None:
        raise Interrupted(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    options = RunOptions(seed=seed, duration_s=args.duration, work_dir=out.resolve(), repo_root=REPO_ROOT,
                         partitions=args.partitions, interval_s=args.interval_ms / 1000, settle_s=args.settle,
                         kinds=kinds, keep_data=args.keep_data)
    print(f"scripts/chaos: seed={seed}, results in {out}", flush=True)
    deadline_s = args.duration + 420.0
    try:
        result, report, run_problems = execute(options, deadline_s)
    except Interrupted as exc:
        print(f"scripts/chaos: interrupted ({exc}); cleaned up. seed={seed}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - the user gets the reason, the log keeps the trace
        import traceback
        (out / "error.txt").write_text(traceback.format_exc())
        print(f"scripts/chaos: the run failed: {type(exc).__name__}: {exc} (seed={seed}; trace in "
              f"{out / 'error.txt'}; process logs in {out / 'logs'})", file=sys.stderr)
        return 2
    if result is None or report is None:
        for problem in run_problems:
            print(f"scripts/chaos: {problem} (seed={seed})", file=sys.stderr)
        return 2
    code = report_and_exit_code(result, report, run_problems, out, liveness_advisory=args.liveness_advisory)
    print(f"seed={seed}; history in {out / 'history.json'}; process logs in {out / 'logs'}")
    return code


if __name__ == "__main__":
    sys.exit(main())
