"""Maintenance mode and decommission on a real cluster (tests/cluster_harness.py), through the CLI.

Maintenance: when `biplane broker maintenance on 2` returns, broker 2 itself no longer
answers as leader of any partition (it applied the moves: checked with a ListOffsets sent
to it), while it is still in every ISR; acks=all produce goes on to the new leaders.
Decommission: the metadata log shows every replica left broker 3 before the record that
fenced it; every acknowledged record is readable from the partitions' new replicas; the
command is idempotent, a second decommission that would break a replication factor is
refused, and a recommission brings the broker back unfenced.
"""
from __future__ import annotations

import asyncio
import time
import subprocess
import sys

import pytest

from cluster_harness import Cluster, _list_offsets_code, fetch_values, make_batch, produce
from common.metadata import FenceBroker, MetadataImage, parse_record
from common.wire import WireClient
from controller_harness import SECRET, TOKEN, http, wait_until

pytestmark = pytest.mark.slow


def cli(c: Cluster, *argv: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "common.cli", *argv, "--controller", c.api_url, "--token", TOKEN],
                          capture_output=True, text=True, timeout=timeout_s)


def create(c: Cluster, name: str, assignment: list[list[int]]) -> None:
    r = http("POST", c.api_url + "/v1/topics", {"name": name, "replica_assignment": assignment})
    assert r.status == 201, r.body
    for p in range(len(assignment)):
        c.wait_leader(name, p)


async def produce_some(c: Cluster, topic: str, partition: int, values: list[bytes]) -> None:
    leader = c.partition(topic, partition)["leader"]
    client = await WireClient.connect(*c.address(leader))
    try:
        r = await produce(client, topic, partition, make_batch(values))
        assert r.error_code == 0, r
    finally:
        await client.close()


def test_maintenance_drains_leadership_before_it_reports_done(tmp_path):
    with Cluster(tmp_path, brokers=3) as c:
        create(c, "t", [[2, 1, 3], [2, 3, 1], [1, 2, 3]])
        led = [p for p in range(3) if c.partition("t", p)["leader"] == 2]
        assert led == [0, 1]

        on = cli(c, "broker", "maintenance", "on", "2")
        assert on.returncode == 0, on.stdout + on.stderr
        assert "broker 2 is in maintenance: leaderships drained" in on.stdout
        # No waiting here: the command returned only after broker 2 applied the moves.
        for p in led:
            assert asyncio.run(_list_offsets_code(c.address(2), "t", p)) != 0, f"broker 2 still leads t-{p}"
        for p in range(3):
            state = c.partition("t", p)
            assert state["leader"] != 2 and 2 in state["isr"], state
        for p in range(3):
            asyncio.run(produce_some(c, "t", p, [b"during maintenance"]))

        brokers = cli(c, "cluster", "brokers").stdout
        assert "active,maintenance" in next(line for line in brokers.splitlines() if line.startswith("2 ")), brokers
        state = cli(c, "broker", "operations", "2", "--json")
        assert '"maintenance": true' in state.stdout and '"leaders": 0' in state.stdout
        # The periodic preferred-leader pass must not hand leadership back while it lasts.
        elect = cli(c, "elect")
        assert elect.returncode == 0 and "already led by its preferred replica" in elect.stdout, elect.stdout

        off = cli(c, "broker", "maintenance", "off", "2")
        assert off.returncode == 0 and "is in service" in off.stdout, off.stdout + off.stderr
        assert cli(c, "elect").returncode == 0
        wait_until(lambda: all(c.partition("t", p)["leader"] == 2 for p in led), 30,
                   "broker 2 to lead its preferred partitions again")


def test_decommission_moves_every_replica_off_before_fencing_and_can_be_undone(tmp_path):
    with Cluster(tmp_path, brokers=4) as c:
        create(c, "t", [[3, 1, 2], [1, 3, 4], [2, 4, 3], [1, 2, 4]])
        values = {p: [f"t{p}-{i}".encode() for i in range(20)] for p in range(4)}
        for p, vs in values.items():
            asyncio.run(produce_some(c, "t", p, vs))
        first_offset = http("GET", c.api_url + "/v1/cluster").body["metadata_offset"]

        out = cli(c, "broker", "decommission", "3")
        assert out.returncode == 0, out.stdout + out.stderr
        assert "broker 3 is decommissioned" in out.stdout
        assert "replica(s) moved off" in out.stderr, out.stderr      # progress while it waited
        assert "Traceback" not in out.stderr

        # Replay the metadata log: at the record that fenced broker 3, no partition listed it.
        r = http("GET", c.api_url + "/rpc/v1/metadata?after_offset=-1&max_wait_ms=0", token=None, secret=SECRET)
        assert "records" in r.body, r.body
        image = MetadataImage()
        fenced_at = None
        for entry in r.body["records"]:
            record = parse_record(entry["record"])
            if isinstance(record, FenceBroker) and record.broker_id == 3 and entry["offset"] > first_offset:
                assert record.reason == "decommissioned"
                assert all(3 not in p.replicas for p in image.partitions()), "fenced while still hosting"
                fenced_at = entry["offset"]
            image.apply(record, entry["offset"])
        assert fenced_at is not None
        assert image.brokers[3].decommissioned and image.brokers[3].fenced
        for p in range(4):
            state = c.partition("t", p)
            assert 3 not in state["replicas"] and len(state["replicas"]) == 3 and sorted(state["isr"]) == \
                sorted(state["replicas"]), state
        # Every acknowledged record is on the new replica sets: read each from its leader.
        for p in range(4):
            leader = c.wait_leader("t", p)

            async def read(p: int = p, leader: int = leader) -> list[bytes]:
                client = await WireClient.connect(*c.address(leader))
                try:
                    got, _ = await fetch_values(client, "t", p)
                    return [v for _, v in got]
                finally:
                    await client.close()
            assert asyncio.run(read()) == values[p]

        brokers = cli(c, "cluster", "brokers").stdout
        assert "fenced,decommissioned" in next(line for line in brokers.splitlines() if line.startswith("3 ")), brokers
        assert cli(c, "broker", "decommission", "3").returncode == 0          # idempotent
        health = cli(c, "cluster", "health")
        assert health.returncode == 0, health.stdout                         # decommissioned is not a fault
        refused = cli(c, "broker", "decommission", "1")
        assert refused.returncode == 1 and "cannot decommission broker 1" in refused.stderr, refused.stderr
        assert "replication factor 3" in refused.stderr and "Traceback" not in refused.stderr

        back = cli(c, "broker", "recommission", "3")
        assert back.returncode == 0, back.stderr
        wait_until(lambda: not c.broker_info(3)["fenced"], 30, "broker 3 unfenced after its recommission")


def test_recommission_during_a_decommission_sends_running_moves_back(tmp_path):
    """With the reassignment throttle at its minimum, a decommission's moves are still copying
    when `recommission` arrives: they go back to their original replica sets, the broker keeps
    its replicas and stays unfenced, and no move off it is started afterwards."""
    with Cluster(tmp_path, brokers=3) as c:
        create(c, "t", [[3, 1], [3, 2]])
        for p in (0, 1):
            asyncio.run(produce_some(c, "t", p, [b"y" * 1000] * 200))
        assert cli(c, "cluster", "config", "set", "reassignment_throttle_bytes_per_s", "1024").returncode == 0
        started = cli(c, "broker", "decommission", "3", "--no-wait", "--json")
        assert started.returncode == 0, started.stderr
        assert '"decommissioning": true' in started.stdout and '"replicas_moving": 2' in started.stdout
        moving = cli(c, "broker", "operations", "3")
        assert "being decommissioned: 2 replica(s) left on it, 2 moving now" in moving.stdout, moving.stdout

        back = cli(c, "broker", "recommission", "3")
        assert back.returncode == 0, back.stderr
        for p in (0, 1):
            state = c.partition("t", p)
            assert 3 in state["replicas"] and len(state["replicas"]) == 2 and not state["adding"], state
        time.sleep(1.0)   # a few controller passes: none starts a move off broker 3 again
        assert http("GET", c.api_url + "/v1/reassignments").body["reassignments"] == []
        info = c.broker_info(3)
        assert not info["fenced"] and not info["decommissioning"]
