"""Idle push replication between real broker processes (1 controller, 3 brokers, 30 push
partitions, replica_lag_time_max_ms 10 s).

Claims: once idle, a broker receives far fewer append-entries than one per partition it
follows every push_heartbeat_ms (quiet partitions are sent one every quarter lag time, the
pairs' heartbeats one per broker pair every push_heartbeat_ms); and nothing else changes
meanwhile: every partition keeps its leader, its leader epoch and a whole ISR, so the
brokers' link checks saw no silent link (quiet partitions alone leave a pair silent for
2.5 s, past the 1.5 s bound, and the controller would move leaders the followers named).
Then records produced to every partition are acknowledged and replicated as before."""
from __future__ import annotations

import asyncio
import time

import pytest

from cluster_harness import Cluster, make_batch, produce
from common.errors import ErrorCode
from common.wire import WireClient
from metrics_scrape import scrape

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

TOPIC = "quiet"
PARTITIONS = 30
IDLE_S = 6.0


def append_entries_received(cluster: Cluster, broker: int) -> float:
    return scrape(cluster.brokers[broker].metrics_port).value("biplane_broker_requests_total",
                                                              request="AppendEntriesRequest")


def produce_everywhere(cluster: Cluster, tag: bytes) -> None:
    async def run() -> None:
        for p in range(PARTITIONS):
            leader = cluster.wait_leader(TOPIC, p)
            async with await WireClient.connect(*cluster.address(leader)) as c:
                r = await produce(c, TOPIC, p, make_batch([tag + b"-%d" % p]), acks=-1, timeout_ms=10_000)
            assert r.error_code is ErrorCode.NONE, (p, r)
    asyncio.run(run())


def states(cluster: Cluster) -> dict[int, tuple]:
    return {p: (s["leader"], s["leader_epoch"], tuple(sorted(s["isr"])))
            for p in range(PARTITIONS) for s in [cluster.partition(TOPIC, p)]}


def test_idle_push_partitions_go_quiet_and_keep_their_leaders_and_isr(tmp_path):
    with Cluster(tmp_path, brokers=3) as cluster:
        cluster.create_topic(TOPIC, partitions=PARTITIONS, replication_factor=3,
                             config={"replication_mode": "push", "commit_policy": "quorum",
                                     "replica_lag_time_max_ms": 10_000})
        produce_everywhere(cluster, b"before")
        time.sleep(1.0)   # the last HW and flush reports travel
        before = states(cluster)
        assert all(len(isr) == 3 for _, _, isr in before.values()), before
        counts = {b: append_entries_received(cluster, b) for b in cluster.brokers}
        time.sleep(IDLE_S)
        rates = {b: (append_entries_received(cluster, b) - counts[b]) / IDLE_S for b in cluster.brokers}
        # Each broker follows 20 partitions: 200 a second at one per push_heartbeat_ms each;
        # quiet, about 8 a second, plus 10 a second from each of the other two brokers.
        assert all(rate < 60 for rate in rates.values()), f"append-entries received per second while idle: {rates}"
        assert states(cluster) == before, "a leadership moved or an ISR changed while the cluster was idle"
        produce_everywhere(cluster, b"after")
