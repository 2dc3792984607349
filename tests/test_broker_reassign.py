"""Reassignment through real brokers (1 controller, 3 brokers).

Claims: moving a partition from broker 1 to brokers 2 and 3 copies every
acknowledged record to the new replicas (a consumer reads the same values,
at the same offsets, from the new leader), and broker 1 deletes its replica
directory once it is no longer assigned there. Afterwards a produce or fetch
sent to the follower or to broker 1 is refused with NOT_LEADER_OR_FOLLOWER
naming the real leader and its epoch.
"""
from __future__ import annotations

import asyncio

import pytest

from common.errors import ErrorCode
from common.wire import WireClient
from common.wire import messages as wire
from cluster_harness import Cluster, fetch_values, make_batch, produce
from controller_harness import http, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def test_reassignment_moves_the_data_and_removes_the_old_replica(tmp_path):
    with Cluster(tmp_path, brokers=3) as cluster:
        r = http("POST", cluster.api_url + "/v1/topics", {"name": "moving", "replica_assignment": [[1]]})
        assert r.status == 201, r.body
        assert cluster.wait_leader("moving", 0) == 1

        async def write() -> list[tuple[int, bytes]]:
            async with await WireClient.connect(*cluster.address(1)) as c:
                for i in range(20):
                    ack = await produce(c, "moving", 0, make_batch([b"m%02d-%d" % (i, j) for j in range(10)]),
                                        acks=-1)
                    assert ack.error_code is ErrorCode.NONE
                values, _ = await fetch_values(c, "moving", 0)
                return values
        before = asyncio.run(write())
        assert len(before) == 200

        r = http("POST", cluster.api_url + "/v1/reassignments",
                 {"topic": "moving", "partition": 0, "target_replicas": [2, 3]})
        assert r.status == 202, r.body
        wait_until(lambda: sorted(cluster.partition("moving", 0)["replicas"]) == [2, 3]
                   and not cluster.partition("moving", 0)["adding"], 60, "reassignment to [2, 3] done",
                   interval_s=0.2)
        leader = cluster.wait_leader("moving", 0)
        assert leader in (2, 3)

        async def read() -> list[tuple[int, bytes]]:
            async with await WireClient.connect(*cluster.address(leader)) as c:
                for _ in range(200):
                    values, _ = await fetch_values(c, "moving", 0)
                    if len(values) >= len(before):
                        return values
                    await asyncio.sleep(0.05)
                return values
        assert asyncio.run(read())[:len(before)] == before
        old_dir = cluster.brokers[1].data_dir / "moving-0"
        wait_until(lambda: not old_dir.exists(), 30, "broker 1 removed its replica of moving-0")

        follower = 5 - leader

        async def misdirected() -> None:
            for broker in (follower, 1):
                async with await WireClient.connect(*cluster.address(broker)) as c:
                    p = await produce(c, "moving", 0, make_batch([b"lost?"]), acks=1)
                    f = (await c.request(wire.FetchRequest(topics=(wire.FetchTopic(
                        topic="moving", partitions=(wire.FetchPartition(partition=0),)),)))).topics[0].partitions[0]
                    for answer in (p, f):
                        assert answer.error_code is ErrorCode.NOT_LEADER_OR_FOLLOWER, (broker, answer)
                        assert answer.current_leader.leader_id == leader, (broker, answer)
                        assert answer.current_leader.leader_epoch == cluster.partition("moving", 0)["leader_epoch"]
        asyncio.run(misdirected())
