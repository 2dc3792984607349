"""Consumer lag in a real cluster: a group's lag per partition is the same in its
coordinator's /metrics, the controller's /metrics and GET /v1/groups (AdminClient.groups),
and falls when the group commits more.

N records are produced to one partition after `base`, its high watermark before them (a
new leader's epoch-start marker takes an offset too); a consumer of the group commits
base + K by hand (auto-commit off, so the offset is the test's, not the consumer's
position), so the lag is N - K. Exactly one
broker, the group's coordinator, exposes the group; the controller names that broker as
the coordinator and takes the high watermark from the partition leader's report.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any, Callable, Iterator

import pytest

from cluster_harness import Cluster
from controller_harness import TOKEN, wait_until
from dataplane.client import AdminClient, Consumer, Producer
from metrics_scrape import Scrape, scrape

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

BROKER_ARGS = ["--group-offsets-partitions", "4", "--group-initial-rebalance-delay-ms", "300",
               "--group-min-session-timeout-ms", "1000"]
TOPIC, GROUP = "lagged", "lag-watchers"
N, K, K2 = 50, 20, 45


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("group-lag"), brokers=3, broker_args=BROKER_ARGS) as c:
        yield c


def bootstrap(c: Cluster) -> str:
    return ",".join(f"127.0.0.1:{b.port}" for b in c.brokers.values())


def broker_lags(c: Cluster) -> dict[int, float]:
    """Each broker that exposes the group's lag of partition 0: its figure."""
    out = {}
    for broker_id, b in c.brokers.items():
        s = scrape(b.metrics_port)
        if s.samples("biplane_group_lag_records", group=GROUP, topic=TOPIC, partition="0"):
            out[broker_id] = s.value("biplane_group_lag_records", group=GROUP, topic=TOPIC, partition="0")
    return out


def controller_scrape(c: Cluster) -> Scrape:
    return scrape(c.controllers[0].spec.metrics_port)


async def wait_for(consumer: Consumer, check: Callable[[], Any], what: str, timeout_s: float = 40) -> Any:
    """Run the (blocking) check in a thread until it holds, polling the consumer meanwhile so
    the group keeps it as a member."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = await asyncio.to_thread(check)
        if last:
            return last
        await consumer.poll(timeout_ms=200)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what} (last: {last!r})")


def test_lag_is_the_same_in_broker_metrics_controller_metrics_and_the_admin_api(cluster: Cluster) -> None:
    cluster.create_topic(TOPIC, partitions=1, replication_factor=3)
    leader = cluster.wait_leader(TOPIC, 0)

    def settled_high_watermark() -> tuple[int] | None:
        s = scrape(cluster.brokers[leader].metrics_port)
        labels = {"topic": TOPIC, "partition": "0"}
        if not s.samples("biplane_partition_high_watermark", **labels):
            return None
        hw = s.value("biplane_partition_high_watermark", **labels)
        return (int(hw),) if hw == s.value("biplane_partition_log_end_offset", **labels) else None
    [base] = wait_until(settled_high_watermark, 30, "the new partition's high watermark at its log end")

    async def run() -> None:
        async with Producer(bootstrap=bootstrap(cluster), linger_ms=2) as producer:
            await asyncio.gather(*[await producer.send(TOPIC, f"r{i}".encode(), partition=0) for i in range(N)])
        async with Consumer(bootstrap=bootstrap(cluster), group_id=GROUP, auto_offset_reset="earliest",
                            enable_auto_commit=False, session_timeout_ms=10_000, heartbeat_interval_ms=500,
                            fetch_max_wait_ms=100) as consumer, AdminClient(cluster.api_url, TOKEN) as admin:
            await consumer.subscribe(TOPIC)
            await wait_for(consumer, lambda: consumer.assignment(), "the partition assigned")
            await consumer.commit({(TOPIC, 0): base + K})

            for k in (K, K2):
                committed = base + k
                if k == K2:
                    await consumer.commit({(TOPIC, 0): committed})
                want = N - k
                # The coordinator: the one broker exposing the group, with lag N - committed.
                seen: dict[int, float] = {}

                def one_broker_shows_it() -> bool:
                    seen.clear()
                    seen.update(broker_lags(cluster))
                    return list(seen.values()) == [want]
                await wait_for(consumer, one_broker_shows_it, f"one broker exposing lag {want} (seen: {seen})")
                [coordinator] = seen
                s = await asyncio.to_thread(scrape, cluster.brokers[coordinator].metrics_port)
                assert s.value("biplane_group_committed_offset", group=GROUP, topic=TOPIC, partition="0") == committed
                assert s.value("biplane_group_members", group=GROUP) == 1
                assert s.value("biplane_group_state", group=GROUP, state="Stable") == 1

                await wait_for(consumer, lambda: controller_scrape(cluster).samples(
                    "biplane_group_lag_records", group=GROUP, topic=TOPIC, partition="0") and controller_scrape(
                    cluster).value("biplane_group_lag_records", group=GROUP, topic=TOPIC, partition="0") == want,
                    f"the controller's lag at {want}")

                async def api_shows() -> Any:
                    answer = await admin.groups()
                    found = [g for g in answer.groups if g.group == GROUP]
                    if not found or not found[0].partitions or found[0].partitions[0].lag_records != want:
                        return None
                    return found[0]

                deadline = time.monotonic() + 40
                while (g := await api_shows()) is None:
                    assert time.monotonic() < deadline, f"GET /v1/groups never showed lag {want}"
                    await consumer.poll(timeout_ms=200)
                assert (g.coordinator, g.state, g.members) == (coordinator, "Stable", 1)
                [p] = g.partitions
                assert (p.topic, p.partition, p.committed_offset, p.leader, p.high_watermark) == \
                    (TOPIC, 0, committed, leader, base + N)
                assert p.high_watermark_age_ms is not None and g.age_ms >= 0

    asyncio.run(asyncio.wait_for(run(), 180))
