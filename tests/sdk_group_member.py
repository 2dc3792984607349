"""A Biplane SDK group member in a process of its own, for tests that stop it (SIGTERM: a
clean close, which commits and leaves) or kill it with kill -9.
Usage: sdk_group_member.py BOOTSTRAP GROUP TOPIC SESSION_TIMEOUT_MS

Prints `assigned p,p,...` / `revoked p,p,...` from the rebalance callbacks and
`record PARTITION OFFSET VALUE` for each record it processed; auto-commits every 200 ms,
so at most the records of the last 200 ms are uncommitted when it is killed. Prints
`closed` once a SIGTERM's close has committed and left the group.
"""
from __future__ import annotations

import asyncio
import signal
import sys

from dataplane.client import Consumer, TopicPartition


def _show(kind: str, partitions: set[TopicPartition]) -> None:
    print(f"{kind} " + ",".join(str(tp.partition) for tp in sorted(partitions)), flush=True)


async def main() -> None:
    bootstrap, group, topic, session_ms = sys.argv[1:5]
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    consumer = Consumer(bootstrap=bootstrap, group_id=group, auto_offset_reset="earliest",
                        session_timeout_ms=int(session_ms), heartbeat_interval_ms=max(100, int(session_ms) // 5),
                        auto_commit_interval_ms=200, fetch_max_wait_ms=100)
    async with consumer:
        await consumer.subscribe([topic], on_assign=lambda tps: _show("assigned", tps),
                                 on_revoke=lambda tps: _show("revoked", tps))
        while not stop.is_set():
            for r in await consumer.poll(timeout_ms=100):
                print(f"record {r.partition} {r.offset} {r.value.decode() if r.value else ''}", flush=True)
    print("closed", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
