"""`biplane reassign --plan FILE` with a replication throttle, `--progress` and `--cancel`, and
`biplane cluster config`, on a real cluster (tests/cluster_harness.py), through the CLI.

The throttle is checked by its mechanism: every progress sample shows a new replica holding
no more than the throttle allows since the plan started (rate x time, plus the one-second
burst and one batch, which is sent whole); a sample shows it partly copied; in the end both
moves complete with every byte on the new replicas. A cancel during a move (throttled to
the minimum through `cluster config`, which brokers apply live) puts the original replica
set back. Dynamic config reaches brokers without a restart: Kafka auto-creation turned on
with `cluster config set` creates a topic with the configured partition count.
"""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import pytest

from cluster_harness import Cluster, make_batch, produce
from common.wire import WireClient
from controller_harness import TOKEN, http, wait_until

pytestmark = pytest.mark.slow

THROTTLE = 256 * 1024
BATCH_VALUES = 100
VALUE_BYTES = 1000
BATCH_BYTES_MAX = BATCH_VALUES * (VALUE_BYTES + 32) + 100


def cli(c: Cluster, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "common.cli", *argv, "--controller", c.api_url, "--token", TOKEN],
                          capture_output=True, text=True, timeout=120)


def create(c: Cluster, name: str, assignment: list[list[int]], **config: str) -> None:
    r = http("POST", c.api_url + "/v1/topics", {"name": name, "replica_assignment": assignment, "config": config})
    assert r.status == 201, r.body
    for p in range(len(assignment)):
        c.wait_leader(name, p)


async def fill(c: Cluster, topic: str, partition: int, batches: int) -> None:
    client = await WireClient.connect(*c.address(c.partition(topic, partition)["leader"]))
    try:
        for i in range(batches):
            r = await produce(client, topic, partition, make_batch([bytes([i % 256]) * VALUE_BYTES] * BATCH_VALUES))
            assert r.error_code == 0, r
    finally:
        await client.close()


def progress(c: Cluster) -> dict:
    r = cli(c, "reassign", "--progress", "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_a_throttled_plan_copies_no_faster_than_the_throttle_and_completes(tmp_path):
    with Cluster(tmp_path, brokers=3) as c:
        create(c, "big", [[1], [1]])
        for p in (0, 1):
            asyncio.run(fill(c, "big", p, 15))   # about 1.5 MB each
        plan = tmp_path / "plan.json"
        plan.write_text(json.dumps({"version": 1, "partitions": [
            {"topic": "big", "partition": 0, "replicas": [1, 2], "bytes": 1_500_000},
            {"topic": "big", "partition": 1, "replicas": [1, 3]}]}))

        started = time.monotonic()
        out = cli(c, "reassign", "--plan", str(plan), "--throttle", "256KiB")
        assert out.returncode == 0, out.stdout + out.stderr
        assert "started 2 reassignment(s) at a throttle of 256 KiB/s per broker" in out.stdout

        partial = 0
        while True:
            doc = progress(c)
            elapsed = time.monotonic() - started
            assert doc["throttle_bytes_per_s"] == THROTTLE
            for move in doc["partitions"]:
                for r in move["moving"]:
                    if r["size_bytes"] is None:
                        continue
                    allowed = THROTTLE * (elapsed + 1.0) + 2 * BATCH_BYTES_MAX
                    assert r["size_bytes"] <= allowed, (r, elapsed)
                    if 0 < r["size_bytes"] and r["bytes_behind"]:
                        partial += 1
            if not doc["partitions"]:
                break
            assert elapsed < 120, doc
            time.sleep(0.5)
        assert partial > 0, "no sample showed a new replica partly copied"
        text = cli(c, "reassign", "--progress")
        assert "0 partition(s) moving" in text.stdout

        assert c.partition("big", 0)["replicas"] == [1, 2] and c.partition("big", 1)["replicas"] == [1, 3]

        def copied() -> bool:
            offsets = http("GET", c.api_url + "/v1/topics/big/offsets").body["partitions"]
            return all(o["size_bytes"] and o["replicas_size_bytes"] == 2 * o["size_bytes"] for o in offsets)
        wait_until(copied, 30, "both replicas of each partition to hold the same bytes", interval_s=0.5)


PUSH_THROTTLE = 128 * 1024
PUSH_CHUNK_BYTES_MAX = 1024 * 1024 + BATCH_BYTES_MAX   # the leader's recovery sends up to 1 MiB at once


def test_a_push_topic_is_throttled_by_its_leader(tmp_path):
    """Push replication: the leader paces the appends to the follower being added (a send over
    the throttle is not made; the push window's timeout resends it later)."""
    with Cluster(tmp_path, brokers=2) as c:
        create(c, "pushed", [[1]], replication_mode="push")
        asyncio.run(fill(c, "pushed", 0, 15))
        plan = tmp_path / "plan.json"
        plan.write_text(json.dumps({"partitions": [{"topic": "pushed", "partition": 0, "replicas": [1, 2]}],
                                    "throttle_bytes_per_s": PUSH_THROTTLE}))
        started = time.monotonic()
        assert cli(c, "reassign", "--plan", str(plan)).returncode == 0
        partial = 0
        while True:
            doc = progress(c)
            elapsed = time.monotonic() - started
            for move in doc["partitions"]:
                for r in move["moving"]:
                    if r["size_bytes"] is not None:
                        assert r["size_bytes"] <= PUSH_THROTTLE * (elapsed + 1.0) + PUSH_CHUNK_BYTES_MAX, (r, elapsed)
                        partial += bool(r["size_bytes"] and r["bytes_behind"])
            if not doc["partitions"]:
                break
            assert elapsed < 120, doc
            time.sleep(0.5)
        assert partial > 0, "no sample showed the new replica partly copied"
        assert c.partition("pushed", 0)["replicas"] == [1, 2]


def test_cancel_during_a_move_restores_the_original_replicas(tmp_path):
    with Cluster(tmp_path, brokers=2) as c:
        create(c, "slow", [[1]])
        asyncio.run(fill(c, "slow", 0, 3))
        # The slowest throttle there is, set as cluster config: brokers apply it live.
        limited = cli(c, "cluster", "config", "set", "reassignment_throttle_bytes_per_s", "1024")
        assert limited.returncode == 0 and "reassignment_throttle_bytes_per_s  1024" in limited.stdout, limited.stdout
        plan = tmp_path / "plan.json"
        plan.write_text(json.dumps({"partitions": [{"topic": "slow", "partition": 0, "replicas": [2]}]}))
        assert cli(c, "reassign", "--plan", str(plan)).returncode == 0

        def moving() -> dict | None:
            # How far behind needs the leader's usage report as well as the new replica's: each
            # broker reports on its own heartbeat, so one can be in before the other.
            doc = progress(c)
            ps = doc["partitions"]
            return doc if ps and ps[0]["moving"][0]["bytes_behind"] is not None else None
        doc = wait_until(moving, 30, "the new replica and its leader to report the copy", interval_s=0.5)
        new = doc["partitions"][0]["moving"][0]
        assert new["broker_id"] == 2 and not new["in_isr"] and new["bytes_behind"] > 0

        out = cli(c, "reassign", "--cancel", "--plan", str(plan))
        assert out.returncode == 0, out.stderr
        assert "cancelled 1 reassignment(s)" in out.stdout
        state = c.partition("slow", 0)
        assert state["replicas"] == [1] and state["adding"] == [] and state["removing"] == []
        assert progress(c)["partitions"] == []
        assert cli(c, "reassign", "--list", "--json").stdout.count('"topic"') == 0
        # Broker 2 lets go of its partial copy: only the leader's is reported then.
        def dropped() -> bool:
            o = http("GET", c.api_url + "/v1/topics/slow/offsets").body["partitions"][0]
            return o["size_bytes"] is not None and o["replicas_size_bytes"] == o["size_bytes"]
        wait_until(dropped, 30, "broker 2 to drop its partial copy", interval_s=0.5)


def test_cluster_config_is_validated_and_applied_by_brokers_without_restart(tmp_path):
    from kafka_socket import KafkaSocket
    with Cluster(tmp_path, brokers=1) as c:
        bad = cli(c, "cluster", "config", "set", "default_partitions", "0")
        assert bad.returncode == 1 and "default_partitions=0" in bad.stderr and "Traceback" not in bad.stderr
        unknown = cli(c, "cluster", "config", "set", "colour", "blue")
        assert unknown.returncode == 1 and "unknown cluster config key 'colour'" in unknown.stderr

        def metadata(name: str) -> int:
            sock = KafkaSocket(c.brokers[1].kafka_port)
            try:
                answer = sock.call(3, 8, {"topics": [{"name": name}], "allow_auto_topic_creation": True,
                                          "include_cluster_authorized_operations": False,
                                          "include_topic_authorized_operations": False})
            finally:
                sock.close()
            return int(answer.topics[0].error_code)
        assert metadata("made-later") == 3    # UNKNOWN_TOPIC_OR_PARTITION: the broker's flag is off

        on = cli(c, "cluster", "config", "set", "auto_create_topics", "true", "default_partitions", "3")
        assert on.returncode == 0, on.stderr
        got = json.loads(cli(c, "cluster", "config", "get", "--json").stdout)
        assert got["config"]["auto_create_topics"] is True and got["config"]["default_partitions"] == 3
        wait_until(lambda: metadata("made-later") != 3, 20, "the broker to apply auto_create_topics")
        topic = http("GET", c.api_url + "/v1/topics/made-later")
        assert topic.status == 200 and len(topic.body["partitions"]) == 3

        off = cli(c, "cluster", "config", "reset", "auto_create_topics")
        assert off.returncode == 0, off.stderr
        wait_until(lambda: metadata("not-made") == 3, 20, "the broker to apply the reset")
        assert http("GET", c.api_url + "/v1/topics/not-made").status == 404
