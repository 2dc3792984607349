"""A real 3-node controller quorum on loopback: failover by kill -9, full restart, the CLI against it."""
from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest

from common.control_client import ControlClient
from common.requests import AllocateProducerIdsRequest
from controller_harness import (
    SECRET,
    TOKEN,
    Controller,
    http,
    leader_of,
    make_specs,
    register_and_unfence,
    run_cli,
    wait_leader,
    wait_until,
)

pytestmark = pytest.mark.slow


class BrokerHeartbeats:
    """Keeps brokers registered and heartbeating at whichever controller leads."""

    def __init__(self, controllers: list[Controller], broker_ids: list[int]) -> None:
        self.controllers = controllers
        self.broker_ids = broker_ids
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        registered_at: dict[int, str] = {}
        while not self._stop.is_set():
            leader = leader_of(self.controllers)
            if leader is not None:
                url = leader.spec.api_url + "/rpc/v1/"
                try:
                    offset = http("GET", leader.spec.api_url + "/v1/health", token=None, timeout_s=1).body[
                        "metadata_offset"]
                    for b in self.broker_ids:
                        if registered_at.get(b) != leader.spec.api_url:
                            http("POST", url + "register", {"broker_id": b, "incarnation_id": f"inc-{b}",
                                                            "host": "127.0.0.1", "port": 9200 + b},
                                 token=None, secret=SECRET, timeout_s=2)
                            registered_at[b] = leader.spec.api_url
                        http("POST", url + "heartbeat", {"broker_id": b, "incarnation_id": f"inc-{b}",
                                                         "metadata_offset": offset},
                             token=None, secret=SECRET, timeout_s=2)
                except OSError:
                    pass
            self._stop.wait(0.15)

    def __enter__(self) -> "BrokerHeartbeats":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def topic_names(c: Controller) -> set[str]:
    r = http("GET", c.spec.api_url + "/v1/topics", timeout_s=3)
    assert r.status == 200, r.body
    return {t["name"] for t in r.body["topics"]}


def create(c: Controller, name: str, **extra) -> dict:
    r = http("POST", c.spec.api_url + "/v1/topics", {"name": name, **extra})
    assert r.status == 201, (r.status, r.body, c.log_tail())
    return r.body


def views(controllers: list[Controller]) -> dict[int, dict | str]:
    """Each live controller's Raft view (GET /v1/cluster): leader, term, offset."""
    out: dict[int, dict | str] = {}
    for c in controllers:
        try:
            body = http("GET", c.spec.api_url + "/v1/cluster", timeout_s=2).body
            out[c.spec.node_id] = {k: body.get(k) for k in ("leader_id", "term", "metadata_offset")}
        except OSError as exc:
            out[c.spec.node_id] = f"unreachable: {exc}"
    return out


def settled_on(controllers: list[Controller], node_id: int) -> Controller | None:
    """The controller `node_id` when it leads and every other one knows it (a follower that has not
    heard the leader yet answers 503, not a redirect)."""
    seen = views(controllers)
    agreed = all(isinstance(v, dict) and v["leader_id"] == node_id for v in seen.values())
    return next((c for c in controllers if c.spec.node_id == node_id), None) if agreed else None


def why(controllers: list[Controller]) -> str:
    """What every controller saw, for a failure's message."""
    return "\n".join([repr(views(controllers))] + [f"--- controller {c.spec.node_id}\n{c.log_tail(40)}"
                                                    for c in controllers])


def all_unfenced(c: Controller, ids: list[int]) -> bool:
    brokers = {b["broker_id"]: b for b in http("GET", c.spec.api_url + "/v1/brokers").body["brokers"]}
    return all(b in brokers and not brokers[b]["fenced"] for b in ids)


def test_quorum_failover_full_restart_and_cli(tmp_path):
    """Claims: writes committed before the leader is killed (-9) are all served by the new leader,
    which accepts writes; a restarted node catches up and leadership returns to the
    highest-priority controller; after kill -9 of all three and a restart
    the metadata is intact; a follower redirects writes (307) and broker RPC (421) to the leader;
    the CLI works against the quorum, following redirects."""
    specs = make_specs(3, priorities=[3, 2, 1])
    controllers = [Controller(s, specs, tmp_path / f"c{s.node_id}", ["--session-timeout-ms", "600000"])
                   for s in specs]
    try:
        for c in controllers:
            c.start()
        # Let priority settle first (node 1 leads, and the others know it), so no handover lands
        # mid-test.
        leader = wait_until(lambda: settled_on(controllers, 1), 30, "the priority-3 controller leading")
        with BrokerHeartbeats(controllers, [1, 2, 3]):
            wait_until(lambda: all_unfenced(leader, [1, 2, 3]), 15, "brokers unfenced")
            committed = [create(leader, f"before-{i}", partitions=2, replication_factor=3)["name"]
                         for i in range(10)]

            follower = next(c for c in controllers if c is not leader)
            redirect = http("POST", follower.spec.api_url + "/v1/topics", {"name": "via-follower"})
            assert redirect.status == 307 and redirect.headers["Location"] == leader.spec.api_url + "/v1/topics", \
                (redirect, why(controllers))
            rpc = http("POST", follower.spec.api_url + "/rpc/v1/allocate-producer-ids",
                       {"broker_id": 1, "count": 10}, token=None, secret=SECRET)
            assert rpc.status == 421 and rpc.body["leader"]["node_id"] == leader.spec.node_id, (rpc, why(controllers))

            leader.kill()
            survivors = [c for c in controllers if c is not leader]
            new_leader = wait_leader(survivors, 30)
            # 409 too: a try that failed as "outcome unknown" may have committed after all.
            wait_until(lambda: http("POST", new_leader.spec.api_url + "/v1/topics",
                                    {"name": "after-failover"}).status in (201, 409), 20, "a write on the new leader")
            assert set(committed) | {"after-failover"} <= topic_names(new_leader)

            # A broker's client given the dead leader and a follower first finds the new leader.
            async def allocate():
                urls = [leader.spec.api_url] + [c.spec.api_url for c in survivors if c is not new_leader] + [
                    new_leader.spec.api_url]
                async with ControlClient(urls, secret=SECRET) as cc:
                    return await cc.allocate_producer_ids(AllocateProducerIdsRequest(broker_id=1, count=5))
            assert asyncio.run(allocate()).size == 5

            leader.start()   # the old leader comes back as a follower and catches up
            wait_until(lambda: "after-failover" in topic_names(leader), 30, "restarted node caught up")

            # Leadership goes back to the highest-priority node (node 1) once all are caught up.
            current = wait_until(lambda: (lambda l: l if l and l.spec.node_id == 1 else None)(
                leader_of(controllers)), 30, "leadership back at the priority-3 controller")

            # The CLI, pointed at the followers: it follows their redirect to the leader.
            others = [c.spec.api_url for c in controllers if c is not current]
            env = {"BIPLANE_CONTROLLER": ",".join(others), "BIPLANE_ADMIN_TOKEN": TOKEN}
            out = run_cli("topic", "create", "cli-topic", "--partitions", "2", "--replication-factor", "2",
                          "--config", "retention_ms=60000", env_extra=env)
            assert out.returncode == 0, out.stderr
            assert "created topic cli-topic" in out.stdout
            listed = run_cli("topic", "list", "--json", env_extra=env)
            assert listed.returncode == 0, listed.stderr
            assert "cli-topic" in {t["name"] for t in json.loads(listed.stdout)["topics"]}
            described = run_cli("topic", "describe", "cli-topic", env_extra=env)
            assert described.returncode == 0 and "retention_ms = 60000" in described.stdout
            status = run_cli("cluster", "status", env_extra=env)
            assert status.returncode == 0 and f"leader: controller {current.spec.node_id}" in status.stdout
            brokers = run_cli("cluster", "brokers", env_extra=env)
            assert brokers.returncode == 0 and "active" in brokers.stdout
            missing = run_cli("topic", "describe", "no-such-topic", env_extra=env)
            assert missing.returncode == 1 and "unknown topic 'no-such-topic'" in missing.stderr
            bad = run_cli("topic", "create", "bad/name", env_extra=env)
            assert bad.returncode == 1 and "field: name" in bad.stderr
            no_token = run_cli("topic", "list", env_extra={**env, "BIPLANE_ADMIN_TOKEN": "nope"})
            assert no_token.returncode == 1 and "UNAUTHORIZED" in no_token.stderr
            altered = run_cli("topic", "alter", "cli-topic", "--set", "retention_ms=90000", env_extra=env)
            assert altered.returncode == 0, altered.stderr
            # Reads are served by any controller from its committed image.
            for c in controllers:
                wait_until(lambda c=c: http("GET", c.spec.api_url + "/v1/topics/cli-topic").body.get(
                    "config", {}).get("retention_ms") == 90000, 10, f"controller {c.spec.node_id} read")
            altered_back = run_cli("topic", "alter", "cli-topic", "--set", "retention_ms=60000", env_extra=env)
            assert altered_back.returncode == 0, altered_back.stderr
            elect = run_cli("elect", "cli-topic:0", env_extra=env)
            assert elect.returncode == 0, elect.stderr
            moved = run_cli("reassign", "cli-topic", "1", "1,2,3", env_extra=env)
            assert moved.returncode == 0, moved.stderr
            taken = run_cli("snapshot", "take", "--json", env_extra=env)
            assert taken.returncode == 0, taken.stderr
            snapshots = run_cli("snapshot", "list", "--json", env_extra=env)
            assert snapshots.returncode == 0 and json.loads(snapshots.stdout)["snapshots"], snapshots.stderr

            expected = topic_names(current)
            offset = http("GET", current.spec.api_url + "/v1/health", token=None).body["metadata_offset"]

        for c in controllers:   # kill -9 the whole quorum, then bring it back
            c.kill()
        for c in controllers:
            c.start()
        restarted = wait_leader(controllers, 30)
        wait_until(lambda: http("GET", restarted.spec.api_url + "/v1/health", token=None).body[
            "metadata_offset"] >= offset, 20, "restored metadata offset")
        assert topic_names(restarted) == expected
        described = http("GET", restarted.spec.api_url + "/v1/topics/cli-topic").body
        assert described["config"]["retention_ms"] == 60000
        for c in controllers:
            wait_until(lambda c=c: topic_names(c) == expected, 20, f"controller {c.spec.node_id} restored")
    finally:
        for c in controllers:
            c.kill()


def test_sigterm_stops_a_controller_cleanly_and_restart_restores_it(tmp_path):
    """Claim: SIGTERM ends the process with status 0, and a restart on the same data dir
    serves the same topics at the same metadata offset."""
    spec = make_specs(1)[0]
    c = Controller(spec, [spec], tmp_path / "solo", ["--session-timeout-ms", "600000"])
    try:
        c.start()
        wait_leader([c], 20)
        register_and_unfence(spec.api_url, 1)
        for i in range(5):
            create(c, f"kept-{i}", partitions=3)
        names = topic_names(c)
        offset = http("GET", spec.api_url + "/v1/health", token=None).body["metadata_offset"]
        c.stop()
        assert c.proc.returncode == 0, c.log_tail()
        c.start()
        wait_leader([c], 20)
        assert topic_names(c) == names
        assert http("GET", spec.api_url + "/v1/health", token=None).body["metadata_offset"] == offset
    finally:
        c.kill()
