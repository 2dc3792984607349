"""`biplane topic describe` on a real cluster: the log start offset, high watermark, log end
offset and size it shows per partition are the leader's own (checked against a ListOffsets
answered by the leader and the bytes produced), fresh (reported within a few seconds), and
follow new records."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from cluster_harness import Cluster, make_batch, produce
from common.wire import WireClient
from common.wire import messages as wire
from controller_harness import TOKEN, wait_until

pytestmark = pytest.mark.slow

RECORD_BYTES = 1000


def describe(c: Cluster, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "common.cli", "topic", "describe", "events", "--controller",
                           c.api_url, "--token", TOKEN, *extra], capture_output=True, text=True, timeout=60)


async def produce_and_list(address: tuple[str, int], partition: int, batches: int) -> int:
    """Produce `batches` batches of 10 records (acks=all); the leader's end offset after them."""
    client = await WireClient.connect(*address)
    try:
        for _ in range(batches):
            r = await produce(client, "events", partition, make_batch([b"x" * RECORD_BYTES] * 10))
            assert r.error_code == 0, r
        answer = await client.request(wire.ListOffsetsRequest(topics=(wire.ListOffsetsTopic(
            topic="events", partitions=(wire.ListOffsetsPartition(partition=partition, timestamp=-1),)),)))
        p = answer.topics[0].partitions[0]
        assert p.error_code == 0, p
        return p.offset
    finally:
        await client.close()


def test_describe_shows_each_leaders_offsets_and_size(tmp_path):
    with Cluster(tmp_path, brokers=3) as c:
        c.create_topic("events", partitions=2, replication_factor=3)
        leader = c.wait_leader("events", 0)
        end = asyncio.run(produce_and_list(c.address(leader), 0, 5))
        assert end == 51   # the leader's epoch-start control record, then 50 records

        def reported() -> dict | None:
            r = describe(c, "--json")
            assert r.returncode == 0, r.stderr
            doc = json.loads(r.stdout)
            p0 = doc["offsets"]["partitions"][0]
            # Every replica holds the same batches once the ISR has them; each broker says so
            # in its own heartbeat, which may come a second after the leader's.
            caught_up = (p0["replicas_size_bytes"] or 0) >= 3 * 50 * RECORD_BYTES
            return doc if p0["high_watermark"] == end and p0["log_end_offset"] == end and caught_up else None
        doc = wait_until(reported, 30, "describe to show the produced records on every replica", interval_s=0.3)
        p0, p1 = doc["offsets"]["partitions"]
        assert p0["leader"] == leader and p0["log_start_offset"] == 0
        assert 50 * RECORD_BYTES < p0["size_bytes"] < 60 * RECORD_BYTES
        assert p0["age_ms"] is not None and p0["age_ms"] < 10_000
        assert p1["high_watermark"] == p1["log_end_offset"] == 1 and p1["size_bytes"] < RECORD_BYTES

        text = describe(c)
        assert text.returncode == 0, text.stderr
        line = next(x for x in text.stdout.splitlines() if x.startswith("events  0 "))
        cols = line.split()
        assert cols[9:12] == ["0", "51", "51"], line
        assert cols[13] == "KiB" and 48 < float(cols[12]) < 60, line
        assert cols[-1] == "ago" and "REPORTED" in text.stdout
        assert "about once a second" in text.stdout

        end = asyncio.run(produce_and_list(c.address(leader), 0, 1))
        assert end == 61
        wait_until(lambda: json.loads(describe(c, "--json").stdout)["offsets"]["partitions"][0]["high_watermark"]
                   == 61, 30, "describe to follow new records", interval_s=0.3)


def test_the_admin_client_reads_the_same_figures_typed(tmp_path):
    """The SDK's operations methods parse the controller's answers into their models."""
    from dataplane.client.admin import SyncAdminClient
    with Cluster(tmp_path, brokers=2) as c:
        c.create_topic("events", partitions=1, replication_factor=2)
        leader = c.wait_leader("events", 0)
        end = asyncio.run(produce_and_list(c.address(leader), 0, 2))
        with SyncAdminClient(c.api_url, TOKEN) as admin:
            offsets = wait_until(lambda: (o := admin.topic_offsets("events")).partitions[0].high_watermark == end
                                 and o, 30, "the leader's report", interval_s=0.3)
            assert offsets.partitions[0].leader == leader and offsets.partitions[0].size_bytes > 20 * RECORD_BYTES
            assert admin.cluster_health().status == "healthy"
            config = admin.alter_cluster_config(set={"log_cleaner_io_bytes_per_s": 1 << 20})
            assert config.config["log_cleaner_io_bytes_per_s"] == 1 << 20
            assert admin.cluster_config().config["log_cleaner_io_bytes_per_s"] == 1 << 20
            other = 1 if leader == 2 else 2
            state = admin.set_maintenance(leader, True)
            assert state.maintenance and state.broker_id == leader
            wait_until(lambda: admin.broker_operations(leader).leaders == 0, 30, "the drain")
            assert c.partition("events", 0)["leader"] == other
            assert not admin.set_maintenance(leader, False).maintenance
            assert admin.reassignment_progress().partitions == []
