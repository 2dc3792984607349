#!/usr/bin/env python3
"""Lazy flush: catch-up time of a follower far behind, lazy flush versus a flush per chunk.

Two real replica cores in one process on real PartitionLogs (fsync on flush) in a
temporary directory: the leader's log is filled with `--mib` MiB of 1 KiB records,
then an empty follower catches up through the core's fetch path in chunks of
`--chunk-kib` KiB.
- lazy: the follower appends each chunk and fetches the next at once; its flushes
  run on the debounce in the background (FlushCoalescer), as the core asks;
- per chunk: the follower waits for an fsync of each chunk before the next fetch
  (what recovery would cost if it asked for a flush per chunk).
Both end when the follower's log is complete AND flushed. Prints times and the ratio.

The two run alternately for `--rounds` rounds after one untimed warm-up round,
and the medians are compared: in a virtual machine, writes into memory the
page cache has never used cost a fault in the host, so whichever run came first
in a fresh process paid for the other's memory (seen as 2.2 s vs 4.1 s for the
same lazy run).

    .venv/bin/python scripts/bench_lazy_flush.py [--mib 1024] [--chunk-kib 1024] [--rounds 3]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from common.batch import build_batch  # noqa: E402
from dataplane.log.flusher import FlushCoalescer  # noqa: E402
from dataplane.log.log import PartitionLog  # noqa: E402
from dataplane.replica.actions import Append, Flush, Send, Truncate  # noqa: E402
from dataplane.replica.core import Replica  # noqa: E402
from dataplane.replica.events import FetchResponse, FlushDone, NewMetadata, Tick, WriteDone  # noqa: E402
from dataplane.replica.state import PartitionState, ReplicationConfig  # noqa: E402

RECORD = os.urandom(1024)


class Side:
    def __init__(self, replica_id: int, directory: str, *, chunk_bytes: int) -> None:
        self.log = PartitionLog(directory)
        self.coalescer = FlushCoalescer(self.log, debounce_ms=2)
        self.replica = Replica(replica_id=replica_id, log=self.log, fetch_max_bytes=chunk_bytes, fetch_backoff_ms=0,
                               flush_debounce_ms=2)
        self.outbox: list = []
        self.flushes = 0
        self.tasks: set = set()

    def step(self, event) -> None:
        ready = self.replica.step(event)
        last = None
        for a in ready.persist:
            if isinstance(a, Append):
                if a.as_leader:
                    self.log.append_as_leader(bytearray(a.records), leader_epoch=a.leader_epoch)
                else:
                    self.log.append_as_follower(a.records)
                last = a.last_offset
            elif isinstance(a, Truncate):
                self.log.truncate_to(a.offset)
            elif isinstance(a, Flush):
                task = asyncio.ensure_future(self._flush(a.up_to))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)
        self.outbox += [s.message for s in ready.send + ready.answers if isinstance(s, Send)]
        if last is not None:
            self.step(WriteDone(last_offset=last))

    async def _flush(self, up_to: int) -> None:
        flushed = await self.coalescer.flush_to(up_to)
        self.flushes += 1
        self.step(FlushDone(flushed_offset=flushed))


async def catch_up(root: str, *, mib: int, chunk_bytes: int, lazy: bool) -> tuple[float, int]:
    leader = Side(1, os.path.join(root, "leader"), chunk_bytes=chunk_bytes)
    batch_records = 32
    batch = build_batch([RECORD] * batch_records, timestamp_ms=0)
    for _ in range(mib * 1024 // batch_records):
        leader.log.append_as_leader(bytearray(batch), leader_epoch=0)
    leader.log.flush()
    follower = Side(2, os.path.join(root, "follower"), chunk_bytes=chunk_bytes)
    st = PartitionState(replicas=(1, 2), isr=(1,), leader=1, leader_epoch=1, partition_epoch=1)
    cfg = ReplicationConfig(durability="fsync")
    leader.step(NewMetadata(partition=st, config=cfg))
    while not leader.replica.epoch_durable:
        await asyncio.sleep(0.001)
    leader.outbox.clear()
    start = time.perf_counter()
    follower.step(NewMetadata(partition=st, config=cfg))
    explicit_flushes = 0
    while True:
        requests, follower.outbox = follower.outbox, []
        for req in requests:
            leader.step(req)
        answers, leader.outbox = [m for m in leader.outbox if isinstance(m, FetchResponse)], []
        for answer in answers:
            follower.step(answer)
            if not lazy and answer.records:
                await follower.coalescer.flush_to(follower.log.log_end_offset)
                explicit_flushes += 1
                follower.step(FlushDone(flushed_offset=follower.log.flushed_offset))
        if follower.log.log_end_offset >= leader.log.log_end_offset:
            break
        # Time passes for the follower as in a broker (its ticks start debounced flushes in
        # the background); the event loop runs those flushes between chunks.
        follower.step(Tick(now_ms=int(time.monotonic() * 1000)))
        await asyncio.sleep(0)
    follower.step(Tick(now_ms=int(time.monotonic() * 1000) + 10))  # the debounce is due: final flush
    await follower.coalescer.flush_to(follower.log.log_end_offset)
    elapsed = time.perf_counter() - start
    fsyncs = follower.coalescer.flush_count
    for side in (leader, follower):
        for t in list(side.tasks):
            t.cancel()
        side.log.close()
    return elapsed, fsyncs


def run_once(*, mib: int, chunk_bytes: int, lazy: bool) -> tuple[float, int]:
    with tempfile.TemporaryDirectory(prefix="bench-lazy-") as root:
        return asyncio.run(catch_up(root, mib=mib, chunk_bytes=chunk_bytes, lazy=lazy))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--chunk-kib", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds, each one lazy and one per-chunk run")
    args = ap.parse_args()
    chunk_bytes = args.chunk_kib * 1024
    print(f"follower {args.mib} MiB behind, chunks of {args.chunk_kib} KiB, 1 KiB records, durability=fsync, "
          f"{args.rounds} rounds after a warm-up, load avg {os.getloadavg()[0]:.2f}")
    run_once(mib=args.mib, chunk_bytes=chunk_bytes, lazy=True)  # warm-up: the page cache reaches its size
    results: dict[bool, list[tuple[float, int]]] = {True: [], False: []}
    for n in range(args.rounds):
        for lazy in ((True, False) if n % 2 else (False, True)):
            results[lazy].append(run_once(mib=args.mib, chunk_bytes=chunk_bytes, lazy=lazy))
    for lazy, name in ((True, "lazy flush     "), (False, "flush per chunk")):
        times = [t for t, _ in results[lazy]]
        runs = statistics.median(n for _, n in results[lazy])
        print(f"  {name}: median {statistics.median(times):6.2f} s  {args.mib / statistics.median(times):7.1f} MiB/s  "
              f"fsync runs {runs:.0f}  (runs: {', '.join(f'{t:.2f}' for t in times)})")
    ratio = statistics.median(t for t, _ in results[False]) / statistics.median(t for t, _ in results[True])
    print(f"  ratio of medians (per chunk / lazy): {ratio:.2f}x  (target >= 2x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
