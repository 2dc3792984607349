"""Run the partition simulation over many seeds and print failures and throughput.

    .venv/bin/python scripts/sim_sweep.py --seeds 0:1000 [--policy isr] [--durability write]
                                          [--mutant serve_before_epoch_durable] [--gray]
                                          [--trace-out trace.jsonl]

A failure prints `seed=... policy=... durability=...: what broke`; replay it with
tests/sim/cluster.py's run_simulation. With --mutant, a known-bad core
(tests/sim/mutants.py) is used instead, to find seeds that catch it.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests"))

from sim import mutants  # noqa: E402
from sim.cluster import run_simulation  # noqa: E402


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0:200", help="first:last (exclusive), default 0:200")
    parser.add_argument("--policy", choices=("isr", "quorum"), action="append")
    parser.add_argument("--durability", choices=("fsync", "write"), action="append")
    parser.add_argument("--mutant", choices=sorted(mutants.MUTANTS))
    parser.add_argument("--gray", action="store_true",
                        help="gray runs: directed cuts between brokers and link reports (tests/sim/README.md)")
    parser.add_argument("--trace-out", metavar="PATH",
                        help="write the protocol trace of the first run as JSON lines (tests/sim/README.md)")
    args = parser.parse_args(argv)
    first, _, last = args.seeds.partition(":")
    seeds = range(int(first), int(last))
    configs = [(p, d) for p in (args.policy or ["isr", "quorum"]) for d in (args.durability or ["fsync", "write"])]
    context = mutants.MUTANTS[args.mutant]() if args.mutant else contextlib.nullcontext()
    failures = runs = steps = 0
    started = time.perf_counter()
    with context:
        for seed in seeds:
            for policy, durability in configs:
                want_trace = bool(args.trace_out) and runs == 0
                result = run_simulation(seed=seed, policy=policy, durability=durability, trace=want_trace,
                                        gray=args.gray)
                if want_trace:
                    with open(args.trace_out, "w", encoding="utf-8") as out:
                        for entry in result.trace:
                            out.write(json.dumps(entry, sort_keys=True) + "\n")
                runs += 1
                steps += result.steps
                problem = result.violation or result.liveness_error
                if problem:
                    failures += 1
                    print(f"seed={seed} policy={policy} durability={durability}: {problem}", flush=True)
    elapsed = time.perf_counter() - started
    print(f"{runs} runs, {failures} failed, {steps} steps in {elapsed:.1f} s: "
          f"{runs / elapsed:.1f} runs/s, {steps / elapsed:.0f} steps/s")
    return 1 if failures and not args.mutant else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
