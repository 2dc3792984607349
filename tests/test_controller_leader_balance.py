"""A broker that returns gets its preferred leaderships back within seconds.

Setup: 1 controller with the leader-imbalance check every 1 s (the full
rebalance stays at its 5-minute default), 3 brokers, an isr topic whose 4
partitions prefer broker 1 (and 2 that prefer others). Claim: after broker 1
stops (its leaderships move) and starts again, once it is back in the ISRs the
controller hands all 4 back to it within a few seconds, by the imbalance check
(the records that move them say "leader imbalance"), and the others stay put.
"""
from __future__ import annotations

import time

import pytest

from cluster_harness import Cluster, wait_until
from controller_harness import http

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

ASSIGNMENT = [[1, 2, 3]] * 4 + [[2, 3, 1], [3, 1, 2]]
HANDBACK_S_MAX = 5.0


def test_a_returning_broker_gets_its_preferred_leaderships_back_within_seconds(tmp_path):
    with Cluster(tmp_path, brokers=3, controller_args=["--leader-imbalance-check-interval-ms", "1000"]) as cluster:
        r = http("POST", cluster.api_url + "/v1/topics", {"name": "lb", "replica_assignment": ASSIGNMENT})
        assert r.status == 201, r.body

        def partitions() -> list[dict]:
            return http("GET", cluster.api_url + "/v1/topics/lb/partitions").body["partitions"]
        for p in range(len(ASSIGNMENT)):
            cluster.wait_leader("lb", p)
        assert [p["leader"] for p in partitions()] == [1, 1, 1, 1, 2, 3]

        cluster.brokers[1].stop()
        assert [p["leader"] for p in partitions()][:4].count(1) == 0
        offset = int(http("GET", cluster.api_url + "/v1/health", token=None).body["metadata_offset"])
        cluster.brokers[1].start()
        cluster.wait_unfenced([1])
        back = wait_until(lambda: all(1 in p["isr"] for p in partitions()) and time.time(), 30,
                          "broker 1 back in every ISR", interval_s=0.05)
        handed = wait_until(lambda: [p["leader"] for p in partitions()] == [1, 1, 1, 1, 2, 3] and time.time(),
                            30, "broker 1 leading its 4 preferred partitions again", interval_s=0.05)
        print(f"\nback in every ISR -> leaderships handed back: {(handed - back) * 1000:.0f} ms")
        assert handed - back < HANDBACK_S_MAX

        moves = [rec for rec in cluster.metadata_records(offset)
                 if rec["type"] == "partition_change" and rec.get("leader") == 1]
        assert sorted(rec["partition"] for rec in moves) == [0, 1, 2, 3], moves
        assert all("leader imbalance" in rec["reason"] for rec in moves), moves
