"""Partitions added to a live topic on a real cluster (tests/cluster_harness.py): every replica
opens them from metadata, the SDK producer spreads keys over them once its metadata ages, a
consumer assigned the topic again reads them, and the CLI grows a topic or says why not."""
from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from cluster_harness import Cluster
from controller_harness import TOKEN
from dataplane.client import Consumer, Producer
from dataplane.client.admin import AdminClient
from dataplane.client.partitioner import key_partition

pytestmark = pytest.mark.slow

METADATA_MAX_AGE_MS = 300


def test_partitions_added_to_a_live_topic_take_records_and_serve_them(tmp_path):
    with Cluster(tmp_path, brokers=3) as c:
        c.create_topic("grow", partitions=2, replication_factor=3)
        bootstrap = ",".join(f"127.0.0.1:{b.port}" for b in c.brokers.values())
        keys = [f"k{i}".encode() for i in range(40)]
        # Keys that move to a new partition when the count goes from 2 to 4.
        moved = [k for k in keys if key_partition(k, 4) >= 2]
        assert moved

        async def scenario() -> None:
            async with Producer(bootstrap=bootstrap, acks="all",
                                metadata_max_age_ms=METADATA_MAX_AGE_MS) as producer:
                before = [await producer.send_and_wait("grow", b"before", key=k) for k in keys]
                assert {m.partition for m in before} == {0, 1}

                async with AdminClient(c.api_url, TOKEN) as admin:
                    detail = await admin.add_partitions("grow", 4)
                assert [p.partition for p in detail.partitions] == [0, 1, 2, 3]
                assert all(len(p.replicas) == 3 for p in detail.partitions)
                for p in (2, 3):
                    await asyncio.to_thread(c.wait_leader, "grow", p)

                await asyncio.sleep(METADATA_MAX_AGE_MS / 1000 * 2)
                after = [await producer.send_and_wait("grow", b"after", key=k) for k in keys]
                assert [m.partition for m in after] == [key_partition(k, 4) for k in keys]
                explicit = await producer.send_and_wait("grow", b"to-three", key=b"explicit", partition=3)
                assert explicit.partition == 3

            async with Consumer("grow", bootstrap=bootstrap, from_beginning=True) as consumer:
                assert len(await consumer.assign_topic("grow")) == 4
                got: list = []
                loop = asyncio.get_running_loop()
                deadline = loop.time() + 30
                while len(got) < 2 * len(keys) + 1 and loop.time() < deadline:
                    got += await consumer.poll(500)
            new = sorted((r.partition, r.key, r.value) for r in got if r.partition >= 2)
            assert new == sorted([(key_partition(k, 4), k, b"after") for k in moved] + [(3, b"explicit", b"to-three")])
            assert len(got) == 2 * len(keys) + 1

        asyncio.run(asyncio.wait_for(scenario(), 120))
        for broker in c.brokers.values():
            assert broker.log_lines("opened grow-2") and broker.log_lines("opened grow-3"), broker.log_tail()

        def cli(*argv: str) -> subprocess.CompletedProcess:
            return subprocess.run([sys.executable, "-m", "common.cli", "topic", *argv, "--controller", c.api_url,
                                   "--token", TOKEN], capture_output=True, text=True, timeout=60)

        grown = cli("add-partitions", "grow", "--partitions", "5")
        assert grown.returncode == 0 and "now has 5 partitions" in grown.stdout, grown.stderr
        refused = cli("add-partitions", "grow", "--partitions", "3")
        assert refused.returncode == 1 and "Traceback" not in refused.stderr
        assert "already has 5 partitions" in refused.stderr and "ask for 6 or more" in refused.stderr
        c.wait_leader("grow", 4)
