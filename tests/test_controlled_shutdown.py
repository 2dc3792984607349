"""Controlled shutdown: SIGTERM moves a broker's leaderships away before it exits.

Setup: 1 controller, 3 brokers, one RF 3 topic per commit policy, a few records
acknowledged with acks=all. Claim: when the leader's process has exited after
SIGTERM, the controller already shows it fenced, out of every ISR and leading
nothing (a crash would leave it leader until its 1.5 s session expired); a new
leader serves every acknowledged record (once its HW has passed them); the broker comes back clean (unfenced,
back in the ISR) when started again.
"""
from __future__ import annotations

import asyncio

import pytest

from common.errors import ErrorCode
from common.wire import WireClient
from cluster_harness import Cluster, fetch_values, make_batch, produce, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def test_sigterm_moves_leaderships_before_the_broker_exits(tmp_path):
    with Cluster(tmp_path, brokers=3) as cluster:
        for policy in ("isr", "quorum"):
            topic = f"cs-{policy}"
            cluster.create_topic(topic, partitions=1, replication_factor=3,
                                 config={"commit_policy": policy, "min_insync_replicas": 2})
            leader = cluster.wait_leader(topic, 0)
            values = [b"%s-%d" % (policy.encode(), i) for i in range(10)]

            async def write() -> list[ErrorCode]:
                async with await WireClient.connect(*cluster.address(leader)) as c:
                    return [(await produce(c, topic, 0, make_batch([v]), acks=-1)).error_code for v in values]
            assert asyncio.run(write()) == [ErrorCode.NONE] * len(values)

            cluster.brokers[leader].stop()  # SIGTERM, and wait for the process to exit
            assert not cluster.brokers[leader].alive()
            info = cluster.broker_info(leader)
            p = cluster.partition(topic, 0)
            assert info is not None and info["fenced"], info
            assert p["leader"] != leader and leader not in p["isr"], p

            new_leader = cluster.wait_leader(topic, 0, not_broker=leader)

            async def read() -> list[bytes]:
                async with await WireClient.connect(*cluster.address(new_leader)) as c:
                    got, _ = await fetch_values(c, topic, 0)
                    return [v for _, v in got]
            # A new leader's HW passes the last records once its epoch-start batch commits
            # (a follower's HW trails the leader's by a fetch), so read until all show.
            seen: list[list[bytes]] = []
            wait_until(lambda: seen.append(asyncio.run(read())) or len(seen[-1]) >= len(values), 30,
                       f"every acknowledged record of {topic} on broker {new_leader}", interval_s=0.1)
            assert seen[-1] == values

            cluster.brokers[leader].start()
            cluster.wait_unfenced([leader])
            wait_until(lambda: leader in cluster.partition(topic, 0)["isr"], 30,
                       f"broker {leader} back in the ISR of {topic}-0", interval_s=0.1)
