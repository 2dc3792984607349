"""Brokers report Biplane's own log bytes and byte counters in their usage, and snapshot files
keep them: two real brokers, a partition replicated on both, a burst of produce.

Claims: after the burst, the leader's produce counter and the follower's replicated counter
have each grown by at least the bytes produced, and the leader's fetch counter by at least
what a consumer read; both brokers' log_bytes hold the partition; the counters never go
down within a process, and a restarted broker reports a new counters_since_ms and counts
from zero again. These are what the capacity report differences into bytes per second.
"""
from __future__ import annotations

import asyncio
import sqlite3

import pytest

from common.wire import WireClient
from cluster_harness import Cluster, fetch_values, make_batch, produce
from controller_harness import http, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

BATCHES = 20
VALUE_BYTES = 50 * 1024


def snapshot_usage(cluster: Cluster, snaps) -> dict[int, dict]:
    """Take a snapshot now and return its broker_usage rows by broker."""
    r = http("POST", cluster.api_url + "/v1/snapshots")
    assert r.status == 201, r.body
    with sqlite3.connect(snaps / r.body["name"]) as conn:
        conn.row_factory = sqlite3.Row
        return {row["broker_id"]: dict(row) for row in conn.execute("SELECT * FROM broker_usage")}


def test_usage_carries_log_bytes_and_byte_counters(tmp_path):
    snaps = tmp_path / "snaps"
    with Cluster(tmp_path, brokers=2, controller_args=["--snapshot-dir", str(snaps)]) as cluster:
        cluster.create_topic("bench", partitions=1, replication_factor=2)
        leader = cluster.wait_leader("bench", 0)
        follower = 3 - leader
        before = wait_until(lambda: (lambda u: u if len(u) == 2 and all(
            row["produce_bytes_total"] is not None for row in u.values()) else None)(snapshot_usage(cluster, snaps)),
            20, "usage with counters from both brokers")

        async def burst() -> int:
            sent = 0
            async with await WireClient.connect(*cluster.address(leader)) as client:
                for i in range(BATCHES):
                    batch = make_batch([bytes([i]) * VALUE_BYTES])
                    assert (await produce(client, "bench", 0, batch, acks=-1)).error_code == 0
                    sent += len(batch)
                values, _ = await fetch_values(client, "bench", 0)
                assert len(values) == BATCHES
            return sent
        sent = asyncio.run(asyncio.wait_for(burst(), 60))

        def grown() -> dict[int, dict] | None:
            usage = snapshot_usage(cluster, snaps)
            lead, follow = usage[leader], usage[follower]
            ok = (lead["produce_bytes_total"] - before[leader]["produce_bytes_total"] >= sent
                  and lead["fetch_bytes_total"] - before[leader]["fetch_bytes_total"] >= sent
                  and follow["replicated_bytes_total"] - before[follower]["replicated_bytes_total"] >= sent)
            return usage if ok else None
        after = wait_until(grown, 30, "counters that count the burst", interval_s=0.5)
        for broker_id in (leader, follower):
            row = after[broker_id]
            assert row["counters_since_ms"] == before[broker_id]["counters_since_ms"]
            assert sent <= row["log_bytes"] <= row["disk_used_bytes"]
            for counter in ("produce_bytes_total", "replicated_bytes_total", "fetch_bytes_total"):
                assert row[counter] >= before[broker_id][counter], (broker_id, counter)
        assert after[follower]["produce_bytes_total"] == before[follower]["produce_bytes_total"]  # it led nothing

        cluster.restart(follower)

        def restarted() -> dict | None:
            row = snapshot_usage(cluster, snaps).get(follower)
            return row if row and row["counters_since_ms"] > after[follower]["counters_since_ms"] \
                and row["log_bytes"] >= sent else None  # its log is still there, once the partition reopened
        row = wait_until(restarted, 30, f"broker {follower}'s usage after its restart", interval_s=0.5)
        assert row["replicated_bytes_total"] < after[follower]["replicated_bytes_total"]  # from zero again
