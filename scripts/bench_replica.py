"""How fast the replica core steps: one leader and two followers on MemoryLogs, no network.

    .venv/bin/python scripts/bench_replica.py [--batches 3000] [--records 16] [--acks -1]

Prints batches/s and records/s through produce -> follower fetch -> flush -> HW,
and core steps/s, so the broker can tell whether the core or I/O is its limit.
"""
from __future__ import annotations

import argparse
import sys
import time

from common.batch import build_batch
from dataplane.log.interface import LogConfig
from dataplane.log.memory import MemoryLog
from dataplane.replica.actions import Append, Flush, Send
from dataplane.replica.core import Replica
from dataplane.replica.events import FlushDone, NewMetadata, ProduceRequest, Tick, WriteDone
from dataplane.replica.state import PartitionState, ReplicationConfig


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=3000)
    parser.add_argument("--records", type=int, default=16, help="records per batch (1 KiB each)")
    parser.add_argument("--acks", type=int, default=-1, choices=(0, 1, -1))
    parser.add_argument("--policy", default="isr", choices=("isr", "quorum"))
    args = parser.parse_args(argv)
    # Small segments: the in-memory twin sums a segment's sizes on every append.
    logs = {i: MemoryLog(config=LogConfig(segment_bytes=1 << 20)) for i in (1, 2, 3)}
    replicas = {i: Replica(replica_id=i, log=logs[i]) for i in (1, 2, 3)}
    state = PartitionState(replicas=(1, 2, 3), isr=(1, 2, 3), leader=1, leader_epoch=1, partition_epoch=1)
    config = ReplicationConfig(commit_policy=args.policy, quorum_required_acks=2)
    inbox: list[tuple[int, object]] = []
    steps = 0
    released = 0

    def step(i: int, event: object) -> None:
        nonlocal steps, released
        steps += 1
        ready = replicas[i].step(event)
        last = None
        flush = False
        for a in ready.persist:
            if isinstance(a, Append):
                info = (logs[i].append_as_leader(a.records, leader_epoch=a.leader_epoch) if a.as_leader
                        else logs[i].append_as_follower(a.records))
                last = info.last_offset
            elif isinstance(a, Flush):
                flush = True
        for a in ready.send + ready.answers:  # answers: the fetch answers, to their askers
            if isinstance(a, Send):
                inbox.append((a.to_broker, a.message))
        released += len(ready.release)
        if last is not None:
            step(i, WriteDone(last_offset=last))
        if flush:  # group commit: one flush covers everything written so far
            step(i, FlushDone(flushed_offset=logs[i].flush()))

    for i in (1, 2, 3):
        step(i, NewMetadata(partition=state, config=config))
    payload = [b"x" * 1024] * args.records
    batches = [build_batch(payload, timestamp_ms=0) for _ in range(64)]
    now = 0
    started = time.perf_counter()
    for n in range(args.batches):
        step(1, ProduceRequest(request_id=n, records=batches[n % 64], acks=args.acks, timeout_ms=10_000))
        while inbox:
            to, msg = inbox.pop(0)
            step(to, msg)
        if n % 8 == 0:
            now += 1
            for i in (1, 2, 3):
                step(i, Tick(now_ms=now))
    for _ in range(50):
        now += 10
        for i in (1, 2, 3):
            step(i, Tick(now_ms=now))
        while inbox:
            to, msg = inbox.pop(0)
            step(to, msg)
    elapsed = time.perf_counter() - started
    hw = replicas[1].high_watermark
    print(f"acks={args.acks} policy={args.policy}: {args.batches} batches x {args.records} records "
          f"in {elapsed:.2f} s -> {args.batches / elapsed:,.0f} batches/s, "
          f"{args.batches * args.records / elapsed:,.0f} records/s, {steps / elapsed:,.0f} core steps/s; "
          f"released {released}, HW {hw} of {logs[1].log_end_offset}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
