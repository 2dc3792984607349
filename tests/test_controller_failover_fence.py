"""A broker that dies shortly before the controller leader is fenced by the next leader as soon
as it leads, not a session timeout plus the grace kept for brokers that still heartbeat a
leader cut off from its peers (controller/decisions/sessions.py): the followers heard its
heartbeats until it died, so the new leader times it from the last one.

Real processes: three controllers and three brokers on loopback. A broker is killed (kill -9),
then 1 s later (before its session of 1.5 s runs out at the old leader) the controller leader
too. The test reads when the new leader started (its log) and when it fenced the broker (the
FenceBroker record's time). Before the brokers heartbeated the followers, that broker was
fenced session timeout plus grace (4.7 s) after the new leader's start."""
from __future__ import annotations

import time

from cluster_harness import Cluster
from controller_harness import http, leader_of, wait_caught_up, wait_until

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

SESSION_TIMEOUT_S = 1.5
GRACE_S = 3.2   # pysyncobj's leaderFallbackTimeout at the default election timeouts
BEFORE_LEADER_S = 1.0


def _fence_after(cluster: Cluster, broker_id: int, after_s: float) -> dict | None:
    for record in cluster.metadata_records():
        if (record.get("type") == "fence_broker" and record.get("broker_id") == broker_id
                and record["at_ms"] / 1000 > after_s):
            return record
    return None


def test_a_broker_that_died_just_before_the_controller_leader_is_fenced_as_the_next_leader_starts(tmp_path):
    with Cluster(tmp_path, brokers=3, controllers=3, controller_args=["--log-level", "INFO"]) as cluster:
        old = leader_of(cluster.controllers)
        assert old is not None
        # The premise: every controller is up and has the brokers' registrations, so the
        # followers hear the broker until it dies (a slow start must not stand in for the rule).
        wait_caught_up(cluster.controllers, old)
        before = time.time()
        cluster.brokers[2].kill()
        killed_at = time.time()
        time.sleep(BEFORE_LEADER_S)
        old.kill()
        new = wait_until(lambda: leader_of(cluster.controllers), 20, "the next controller leader")
        fence = wait_until(lambda: _fence_after(cluster, 2, before), 20, "broker 2 fenced")
        led = [t for t, _ in new.log_lines("leads in term") if t > before]
        # Every leadership after the kill, with whom each leader had heard while following.
        story = (killed_at, fence, [(c.spec.node_id, line) for c in cluster.controllers
                                    for t, line in c.log_lines("leads in term") if t > before])
        assert len(led) == 1, (story, new.log_tail())
        started_s, fenced_s = led[0], fence["at_ms"] / 1000
        assert fence["reason"] == "session expired", story
        # Not by the old leader: it was killed before the session ran out.
        assert fenced_s >= started_s, (started_s, story)
        # Never before a session timeout after the broker's last heartbeat (one interval, 150 ms,
        # at most before the kill); at the new leader's first look once that has passed.
        assert fenced_s - killed_at >= SESSION_TIMEOUT_S - 0.2, (started_s, story)
        assert fenced_s - max(started_s, killed_at + SESSION_TIMEOUT_S) < GRACE_S / 4, \
            (started_s, story, new.log_tail(60))
        brokers = http("GET", new.spec.api_url + "/v1/brokers").body["brokers"]
        assert {b["broker_id"] for b in brokers if b["fenced"]} == {2}, brokers   # the live ones never
