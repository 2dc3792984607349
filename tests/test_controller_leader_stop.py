"""A controller leader stopped by SIGTERM (`biplane stop|restart controller N`) hands its
leadership to a caught-up peer before it exits, and fences nobody: it used to close its API
first, hear no more heartbeats, and fence every broker 1.5 s later (an operator found all
three brokers fenced and every partition's leader epoch moved after one restart).

Real processes: three controllers and three brokers on loopback. The test stops the leader
with SIGTERM, then checks the mechanism: the stopping leader logged the handover before it
exited, the next leader was elected by that handover (no election timeout: within 1 s of the
signal), and no broker was fenced by anyone."""
from __future__ import annotations

import time

from cluster_harness import Cluster
from controller_harness import http, leader_of, wait_caught_up, wait_until

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def test_a_stopped_controller_leader_hands_over_and_fences_no_broker(tmp_path):
    with Cluster(tmp_path, brokers=3, controllers=3, controller_args=["--log-level", "INFO"]) as cluster:
        cluster.create_topic("t", partitions=3, replication_factor=3)
        old = leader_of(cluster.controllers)
        assert old is not None
        wait_caught_up(cluster.controllers, old)
        others = [c for c in cluster.controllers if c is not old]
        signalled = time.time()
        old.stop()        # SIGTERM, and waits for the exit
        exited = time.time()
        handed = [t for t, _ in old.log_lines("handing leadership to a caught-up peer") if t >= signalled - 0.1]
        assert handed, old.log_tail(40)
        new = wait_until(lambda: leader_of(others), 20, "the next controller leader")
        led = [t for t, _ in new.log_lines("leads in term") if t >= signalled - 0.1]
        assert led and led[0] - signalled < 1.0, (led, signalled, new.log_tail(40))
        assert exited - signalled < 5.0, exited - signalled
        time.sleep(3.0)   # two sessions: a fence for missed heartbeats would be in by now
        fences = [r for r in cluster.metadata_records() if r.get("type") == "fence_broker"
                  and r["at_ms"] / 1000 >= signalled - 0.1]
        assert fences == [], (fences, old.log_tail(40))
        brokers = http("GET", new.spec.api_url + "/v1/brokers").body["brokers"]
        assert not [b["broker_id"] for b in brokers if b["fenced"]], brokers
