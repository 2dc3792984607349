"""A stop that cannot vouch for every log is not a clean one.

Claim: a broker restarted after kill -9 whose replica of a quorum + durability=write topic has
not caught up since (its leader is down, so it cannot) stops on SIGTERM without the
clean-shutdown marker, says why in its log, and registers at its next start with
clean_shutdown=false: that replica may still lack records it counted before the crash, and
the next incarnation must not report its log as clean in an election.
"""
from __future__ import annotations

import time

import pytest

from cluster_harness import Cluster
from controller_harness import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def test_a_broker_with_a_replica_not_caught_up_since_a_crash_stops_without_the_clean_marker(tmp_path):
    with Cluster(tmp_path, brokers=2) as cluster:
        cluster.create_topic("q", partitions=1, replication_factor=2,
                             config={"commit_policy": "quorum", "quorum_required_acks": 2, "durability": "write"})
        leader = cluster.wait_leader("q", 0)
        follower = 3 - leader
        cluster.brokers[follower].kill()
        cluster.brokers[leader].stop()
        restarted_at = time.time()
        assert cluster.restart(follower)["clean_shutdown"] is False   # after kill -9
        wait_until(lambda: any(at >= restarted_at for at, _ in cluster.brokers[follower].log_lines("opened q-0")),
                   30, "the follower's replica of q opened")
        # Its leader is down: the follower's replica of q cannot catch up before it stops.
        cluster.brokers[follower].stop()
        said = cluster.brokers[follower].log_lines("stopping without the clean-shutdown marker")
        assert said and "q-0 not caught up since the last crash" in said[-1][1]
        assert not (cluster.brokers[follower].data_dir / "clean_shutdown").exists()
        before = cluster.broker_info(follower)["incarnation_id"]
        cluster.brokers[follower].start()
        info = wait_until(lambda: (i := cluster.broker_info(follower)) and i["incarnation_id"] != before
                          and not i["fenced"] and i, 30, "the follower registered again")
        assert info["clean_shutdown"] is False
