#!/usr/bin/env python3
"""Consumer-group figures with confluent-kafka against a local 3-broker cluster.

- Rebalance time of a 3-member group on a 12-partition topic when one member leaves
  cleanly (close: LeaveGroup) and when one is killed with kill -9 (its session has to
  time out): from the leave or kill until the two others hold all 12 partitions.
- Commit latency: synchronous OffsetCommit of one partition, p50/p99 (each commit is a
  quorum write to __consumer_offsets, RF 3).

    .venv/bin/python scripts/bench_groups.py [--rounds 3] [--session-timeout-ms 6000] [--commits 500]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import confluent_kafka  # noqa: E402

from cluster_harness import Cluster  # noqa: E402

PARTITIONS = 12
MEMBER = ROOT / "tests" / "kafka_group_member.py"


def consumer(bootstrap: str, group: str, session_ms: int) -> confluent_kafka.Consumer:
    return confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                                     "auto.offset.reset": "earliest", "enable.auto.commit": False,
                                     "session.timeout.ms": session_ms,
                                     "heartbeat.interval.ms": max(100, session_ms // 10)})


def held(consumers: list[confluent_kafka.Consumer]) -> set[int]:
    return {tp.partition for c in consumers for tp in c.assignment()}


def wait_all_held(consumers: list[confluent_kafka.Consumer], *, timeout_s: float = 60) -> float:
    """Poll until `consumers` hold every partition between them, each some; seconds waited."""
    begin = time.perf_counter()
    while time.perf_counter() - begin < timeout_s:
        for c in consumers:
            c.poll(0.01)
        if held(consumers) == set(range(PARTITIONS)) and all(c.assignment() for c in consumers):
            return time.perf_counter() - begin
    raise SystemExit(f"the group never settled: held {sorted(held(consumers))}")


def rebalance_round(bootstrap: str, group: str, session_ms: int, *, kill: bool) -> float:
    a, b = consumer(bootstrap, group, session_ms), consumer(bootstrap, group, session_ms)
    third: confluent_kafka.Consumer | None = None
    proc: subprocess.Popen | None = None
    a.subscribe(["bench-groups"])
    b.subscribe(["bench-groups"])
    if kill:
        proc = subprocess.Popen([sys.executable, str(MEMBER), bootstrap, group, "bench-groups", str(session_ms)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    else:
        third = consumer(bootstrap, group, session_ms)
        third.subscribe(["bench-groups"])
    # Settled with three members: a and b hold some but not all partitions.
    deadline = time.perf_counter() + 60
    while True:
        for c in (a, b) + ((third,) if third is not None else ()):
            c.poll(0.01)
        split = len(held([a, b])) + (len(third.assignment()) if third is not None else 0)
        if a.assignment() and b.assignment() and len(held([a, b])) < PARTITIONS and \
                (third is None or split == PARTITIONS):
            break
        if time.perf_counter() > deadline:
            raise SystemExit("the three-member group never formed")
    time.sleep(0.5)
    begin = time.perf_counter()
    if proc is not None:
        proc.kill()
        proc.wait()
    else:
        assert third is not None
        third.close()
    took = time.perf_counter() - begin + wait_all_held([a, b])
    a.close()
    b.close()
    return took


def commit_latencies(bootstrap: str, commits: int) -> list[float]:
    c = consumer(bootstrap, "bench-commits", 10_000)
    c.subscribe(["bench-groups"])
    wait_all_held([c])
    out = []
    for i in range(commits):
        begin = time.perf_counter()
        c.commit(offsets=[confluent_kafka.TopicPartition("bench-groups", 0, i + 1)], asynchronous=False)
        out.append((time.perf_counter() - begin) * 1000)
    c.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--session-timeout-ms", type=int, default=6000)
    parser.add_argument("--commits", type=int, default=500)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        with Cluster(Path(tmp), brokers=3, broker_args=[
                "--log-level", "WARNING", "--group-offsets-partitions", "4",
                "--group-initial-rebalance-delay-ms", "300", "--group-min-session-timeout-ms", "1000"]) as cluster:
            cluster.create_topic("bench-groups", partitions=PARTITIONS)
            bootstrap = cluster.kafka_bootstrap
            for kill in (False, True):
                times = [rebalance_round(bootstrap, f"bench-{'kill' if kill else 'leave'}-{r}",
                                         args.session_timeout_ms, kill=kill) for r in range(args.rounds)]
                what = f"killed (kill -9, session.timeout.ms={args.session_timeout_ms})" if kill else "left cleanly"
                print(f"rebalance, one of 3 members {what}: " + ", ".join(f"{t:.2f}" for t in times)
                      + f" s (median {statistics.median(times):.2f} s)")
            lat = sorted(commit_latencies(bootstrap, args.commits))
            p = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))]  # noqa: E731
            print(f"commit latency over {len(lat)} synchronous commits: p50 {p(0.5):.2f} ms, "
                  f"p99 {p(0.99):.2f} ms, max {lat[-1]:.2f} ms")


if __name__ == "__main__":
    main()
