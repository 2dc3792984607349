"""`biplane cluster health` on a real cluster (tests/cluster_harness.py): a broker killed with
kill -9 makes the partitions it alone held leaderless and the others under-replicated, and the
command says so with the critical exit code; once the broker is back and its replicas rejoined
the ISRs, it says healthy and exits 0."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cluster_harness import Cluster
from controller_harness import TOKEN, wait_until
from controller.admin_cli import EXIT_CRITICAL

pytestmark = pytest.mark.slow


def health(c: Cluster, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "common.cli", "cluster", "health", "--controller", c.api_url,
                           "--token", TOKEN, *extra], capture_output=True, text=True, timeout=60)


def test_health_turns_critical_when_a_broker_dies_and_healthy_after_it_returns(tmp_path):
    with Cluster(tmp_path, brokers=3) as c:
        c.create_topic("wide", partitions=2, replication_factor=3, config={"min_insync_replicas": 2})
        r = subprocess.run([sys.executable, "-m", "common.cli", "topic", "create", "solo", "--replica-assignment",
                            "3", "--controller", c.api_url, "--token", TOKEN], capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 0, r.stderr
        c.wait_leader("solo", 0)

        ok = health(c)
        assert ok.returncode == 0, ok.stdout + ok.stderr
        assert ok.stdout.startswith("cluster HEALTHY")

        c.brokers[3].kill()
        # Until the session times out the controller still counts broker 3 in; then it fences
        # it, solo-0 loses its only replica's leadership and the wide partitions shrink.
        def critical() -> subprocess.CompletedProcess | None:
            out = health(c)
            return out if out.returncode == EXIT_CRITICAL and "solo-0 has no leader" in out.stdout \
                and "wide-1" in out.stdout else None
        down = wait_until(critical, 30, "health to report solo-0 leaderless", interval_s=0.3)
        assert "Traceback" not in down.stderr
        assert "broker 3 at 127.0.0.1" in down.stdout and "is fenced" in down.stdout
        assert "leaderless partitions:        1" in down.stdout
        assert "under-replicated partitions:  2" in down.stdout

        doc = json.loads(health(c, "--json").stdout)
        assert doc["status"] == "critical" and doc["fenced_brokers"] == 1
        assert {(p["check"], p.get("topic"), p.get("partition"), p.get("broker_id")) for p in doc["problems"]} == {
            ("leaderless", "solo", 0, None), ("fenced_broker", None, None, 3),
            ("under_replicated", "wide", 0, None), ("under_replicated", "wide", 1, None)}

        c.brokers[3].start()
        back = wait_until(lambda: (out := health(c)).returncode == 0 and out, 60,
                          "health to be healthy again after the restart", interval_s=0.5)
        assert back.stdout.startswith("cluster HEALTHY")
        for p in (0, 1):
            assert sorted(c.partition("wide", p)["isr"]) == [1, 2, 3]


def test_health_reports_a_controller_cut_off_from_the_leader_and_asks_the_leader_through_a_follower(tmp_path):
    """With three controllers, one killed is reported by the leader (degraded, exit 3); asked at
    a follower's address the command is redirected to the leader and reports the same."""
    from controller_harness import SECRET, wait_leader
    with Cluster(tmp_path, brokers=1, controllers=3, broker_args=["--cluster-secret", SECRET]) as c:
        leader = wait_leader(c.controllers)
        followers = [x for x in c.controllers if x is not leader]

        def at(url: str) -> subprocess.CompletedProcess:
            return subprocess.run([sys.executable, "-m", "common.cli", "cluster", "health", "--json", "--controller",
                                   url, "--token", TOKEN], capture_output=True, text=True, timeout=60)
        ok = wait_until(lambda: (r := at(followers[0].spec.api_url)).returncode == 0 and r, 30,
                        "health to be healthy with every controller connected", interval_s=0.5)
        assert json.loads(ok.stdout)["node_id"] == leader.spec.node_id   # judged by the leader

        followers[1].kill()
        cut = wait_until(lambda: (r := at(followers[0].spec.api_url)).returncode == 3 and r, 30,
                         "health to report the killed controller", interval_s=0.5)
        doc = json.loads(cut.stdout)
        assert doc["status"] == "degraded" and doc["controllers_disconnected"] == 1
        assert [(p["check"], p["node_id"]) for p in doc["problems"]] == [
            ("controller_disconnected", followers[1].spec.node_id)]

        followers[1].start()
        wait_until(lambda: at(leader.spec.api_url).returncode == 0, 60, "health after the controller returned",
                   interval_s=0.5)
