"""A broker that dies while the controllers elect a new leader is fenced a session timeout after
the new leader starts, not a session timeout plus the grace kept for brokers that still
heartbeat a leader cut off from its peers (controller/decisions/sessions.py).

Real processes: three controllers and three brokers on loopback. The controller leader is
killed (kill -9); half a second later, while the brokers knock on the followers looking for
the next leader, a broker is killed too. The test reads when the new leader started (its log)
and when it fenced the broker (the FenceBroker record's time)."""
from __future__ import annotations

import time

import pytest

from cluster_harness import Cluster
from controller_harness import http, leader_of, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

SESSION_TIMEOUT_S = 1.5
GRACE_S = 3.2   # pysyncobj's leaderFallbackTimeout at the default election timeouts


def _fence_of(cluster: Cluster, broker_id: int) -> dict | None:
    for record in cluster.metadata_records():
        if record.get("type") == "fence_broker" and record.get("broker_id") == broker_id:
            return record
    return None


def test_a_broker_killed_during_a_controller_election_is_fenced_without_the_new_leaders_grace(tmp_path):
    with Cluster(tmp_path, brokers=3, controllers=3, controller_args=["--log-level", "INFO"]) as cluster:
        old = leader_of(cluster.controllers)
        assert old is not None
        old.kill()
        time.sleep(0.5)
        cluster.brokers[2].kill()
        killed_at = time.time()
        new = wait_until(lambda: leader_of(cluster.controllers), 20, "the next controller leader")
        fence = wait_until(lambda: _fence_of(cluster, 2), 20, "broker 2 fenced")
        # Every line of the new leader's log, to see that it led once, after the kill.
        led = [t for t, _ in _log_lines(new, "leads in term") if t > killed_at - 1]
        assert len(led) == 1, new.log_tail()
        started_s, fenced_s = led[0], fence["at_ms"] / 1000
        # Without the knock rule the fence comes SESSION_TIMEOUT_S + GRACE_S after the start.
        assert SESSION_TIMEOUT_S - 0.1 <= fenced_s - started_s < SESSION_TIMEOUT_S + GRACE_S / 2, \
            (started_s, fenced_s, fence)
        assert fence["reason"] == "session expired", fence
        # The live brokers are never fenced by the new leader.
        brokers = http("GET", new.spec.api_url + "/v1/brokers").body["brokers"]
        assert {b["broker_id"] for b in brokers if b["fenced"]} == {2}, brokers


def _log_lines(controller, text: str) -> list[tuple[float, str]]:
    from cluster_harness import LOG_TIME, log_line_time_s
    lines = controller.log_path.read_text(errors="replace").splitlines()
    return [(log_line_time_s(line), line) for line in lines if text in line and LOG_TIME.match(line)]
