"""Prometheus metrics of real brokers and a controller, scraped and parsed with prometheus_client.

Claims: every family docs/metrics.md names is exposed, with its type, by a broker or the
controller; each figure moves for the reason it names — a produce request adds one to the
produce histogram and its records to the partition's counters and offsets; an error answer
counts under its request and code; a follower's fetch of records is a pull round trip and a
push leader's append-entries a push one; an fsync is timed; killing a follower makes its
leader's partitions under-replicated, counts an ISR shrink and shows the follower's lag,
and its return an ISR expansion; admin API requests count per route and status; every
metric the Grafana dashboard (docs/grafana-dashboard.json) queries is exposed.
"""
from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path

import pytest

from common.errors import ErrorCode
from common.wire import WireClient
from cluster_harness import Cluster, fetch_values, make_batch, produce
from controller_harness import TOKEN, http, wait_until
from metrics_scrape import Scrape, scrape

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parent.parent
DASHBOARD = REPO / "docs" / "grafana-dashboard.json"

BROKER_FAMILIES = {
    "biplane_broker_id": "gauge",
    "biplane_broker_metadata_offset": "gauge",
    "biplane_broker_metadata_lag_records": "gauge",
    "biplane_broker_metadata_lag_seconds": "gauge",
    "biplane_broker_fenced": "gauge",
    "biplane_broker_replicas_opening": "gauge",
    "biplane_broker_replicas_parked": "gauge",
    "biplane_broker_partitions": "gauge",
    "biplane_broker_leader_partitions": "gauge",
    "biplane_broker_under_replicated_partitions": "gauge",
    "biplane_broker_under_min_isr_partitions": "gauge",
    "biplane_broker_offline_partitions": "gauge",
    "biplane_broker_offline_replicas": "gauge",
    "biplane_broker_isr_shrinks": "counter",
    "biplane_broker_isr_expands": "counter",
    "biplane_broker_requests": "counter",
    "biplane_broker_errors": "counter",
    "biplane_broker_produce_latency_seconds": "histogram",
    "biplane_broker_fetch_latency_seconds": "histogram",
    "biplane_broker_replication_latency_seconds": "histogram",
    "biplane_broker_fsync_latency_seconds": "histogram",
    "biplane_broker_fetch_session_requests": "counter",
    "biplane_broker_fetch_session_partitions_sent": "counter",
    "biplane_broker_fetch_session_errors": "counter",
    "biplane_broker_event_loop_lag_seconds": "histogram",
    "biplane_broker_event_loop_stalls": "counter",
    "biplane_broker_event_loop_stall_max_seconds": "gauge",
    "biplane_broker_unreplicated_bytes": "gauge",
    "biplane_partition_log_start_offset": "gauge",
    "biplane_partition_log_end_offset": "gauge",
    "biplane_partition_flushed_offset": "gauge",
    "biplane_partition_high_watermark": "gauge",
    "biplane_partition_size_bytes": "gauge",
    "biplane_partition_is_leader": "gauge",
    "biplane_partition_follower_lag_records": "gauge",
    "biplane_partition_produced_records": "counter",
    # Present with no samples until the broker coordinates a group (tests/test_group_lag_cluster.py).
    "biplane_group_committed_offset": "gauge",
    "biplane_group_lag_records": "gauge",
    "biplane_group_members": "gauge",
    "biplane_group_state": "gauge",
}
CONTROLLER_FAMILIES = {
    "biplane_controller_node_id": "gauge",
    "biplane_controller_is_leader": "gauge",
    "biplane_controller_raft_term": "gauge",
    "biplane_controller_raft_leader": "gauge",
    "biplane_controller_raft_commit_index": "gauge",
    "biplane_controller_raft_last_log_index": "gauge",
    "biplane_controller_raft_follower_lag_entries": "gauge",
    "biplane_controller_metadata_offset": "gauge",
    "biplane_controller_brokers": "gauge",
    "biplane_controller_broker_metadata_lag_records": "gauge",
    "biplane_controller_broker_replicas_opening": "gauge",
    "biplane_controller_under_replicated_partitions": "gauge",
    "biplane_controller_under_min_isr_partitions": "gauge",
    "biplane_controller_offline_partitions": "gauge",
    "biplane_controller_event_loop_lag_seconds": "histogram",
    "biplane_api_requests": "counter",
    "biplane_api_request_seconds": "histogram",
    "biplane_group_lag_records": "gauge",
}
PROCESS_FAMILIES = {"process_cpu_seconds": "counter", "process_resident_memory_bytes": "gauge",
                    "process_open_fds": "gauge", "process_start_time_seconds": "gauge"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with Cluster(tmp_path_factory.mktemp("metrics"), brokers=3) as c:
        c.create_topic("m", partitions=1, replication_factor=3, config={"min_insync_replicas": 2})
        c.create_topic("pushed", partitions=1, replication_factor=3, config={"replication_mode": "push"})
        yield c


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def broker_scrape(cluster: Cluster, broker_id: int) -> Scrape:
    return scrape(cluster.brokers[broker_id].metrics_port)


def controller_scrape(cluster: Cluster) -> Scrape:
    return scrape(cluster.controllers[0].spec.metrics_port)


def followers(cluster: Cluster, topic: str, leader: int) -> list[int]:
    return [b for b in cluster.partition(topic, 0)["replicas"] if b != leader]


def test_broker_and_controller_expose_every_family_with_its_type(cluster):
    leader = cluster.wait_leader("m", 0)
    b = broker_scrape(cluster, leader)
    for family, kind in {**BROKER_FAMILIES, **PROCESS_FAMILIES}.items():
        assert family in b.families, family
        assert b.type_of(family) == kind, (family, b.type_of(family))
    assert b.value("biplane_broker_id") == leader
    assert b.value("biplane_partition_is_leader", topic="m", partition="0") == 1
    c = controller_scrape(cluster)
    for family, kind in {**CONTROLLER_FAMILIES, **PROCESS_FAMILIES}.items():
        assert family in c.families, family
        assert c.type_of(family) == kind, (family, c.type_of(family))
    assert c.value("biplane_controller_is_leader") == 1
    assert c.value("biplane_controller_raft_term") >= 1
    assert c.value("biplane_controller_raft_commit_index") >= 1
    assert c.value("biplane_controller_brokers", state="unfenced") == 3
    assert b.value("biplane_broker_replicas_opening") == 0   # every replica open: its heartbeats say so
    # The controller hears it on the broker's next heartbeat (every second), not at once.
    wait_until(lambda: controller_scrape(cluster).value("biplane_controller_broker_replicas_opening",
                                                        broker=str(leader)) == 0,
               10, "the controller's count of the leader's opening replicas back at 0")
    for s in (b, c):
        assert s.value("process_resident_memory_bytes") > 0 and s.value("process_open_fds") > 0
        assert time.time() - 3600 < s.value("process_start_time_seconds") <= time.time()


def test_each_produce_request_is_one_histogram_observation_and_its_records_count(cluster):
    """7 acks=all requests of 5 records: the leader's produce histogram (acks="all") counts 7
    more, its records counter and log end 35 more, its HW reaches the log end; the fsyncs
    they needed are timed; the followers' fetches that brought the records are pull round
    trips; a consumer's fetch is timed under fetcher="consumer"."""
    leader = cluster.wait_leader("m", 0)
    follower_ids = followers(cluster, "m", leader)
    before = broker_scrape(cluster, leader)
    pulls_before = {f: broker_scrape(cluster, f).value("biplane_broker_replication_latency_seconds_count",
                                                       mode="pull") for f in follower_ids}

    async def scenario() -> None:
        async with await WireClient.connect(*cluster.address(leader)) as c:
            for i in range(7):
                r = await produce(c, "m", 0, make_batch([b"v%d-%d" % (i, j) for j in range(5)]), acks=-1)
                assert r.error_code is ErrorCode.NONE, r
            values, _ = await fetch_values(c, "m", 0)
            assert len(values) >= 35
    run(scenario())
    after = broker_scrape(cluster, leader)

    def delta(name: str, **labels: str) -> float:
        return after.value(name, **labels) - before.value(name, **labels)
    assert delta("biplane_broker_produce_latency_seconds_count", acks="all") == 7
    assert delta("biplane_broker_produce_latency_seconds_count", acks="1") == 0
    assert delta("biplane_broker_requests_total", request="ProduceRequest") == 7
    assert delta("biplane_partition_produced_records_total", topic="m", partition="0") == 35
    assert delta("biplane_partition_log_end_offset", topic="m", partition="0") == 35
    assert (after.value("biplane_partition_high_watermark", topic="m", partition="0")
            == after.value("biplane_partition_log_end_offset", topic="m", partition="0"))
    assert delta("biplane_broker_fsync_latency_seconds_count") >= 1
    assert delta("biplane_broker_fetch_latency_seconds_count", fetcher="consumer") >= 1
    assert delta("biplane_broker_produce_latency_seconds_sum", acks="all") > 0
    for f in follower_ids:
        pulls = broker_scrape(cluster, f).value("biplane_broker_replication_latency_seconds_count", mode="pull")
        assert pulls > pulls_before[f], f"follower {f} timed no fetch that brought records"


def test_an_error_answer_counts_under_its_request_and_code(cluster):
    leader = cluster.wait_leader("m", 0)
    labels = {"request": "ProduceRequest", "code": "UNKNOWN_TOPIC_OR_PARTITION"}
    before = broker_scrape(cluster, leader).value("biplane_broker_errors_total", **labels)

    async def scenario() -> None:
        async with await WireClient.connect(*cluster.address(leader)) as c:
            r = await produce(c, "m", 9, make_batch([b"nowhere"]), acks=1)
            assert r.error_code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    run(scenario())
    after = broker_scrape(cluster, leader)
    assert after.value("biplane_broker_errors_total", **labels) - before == 1


def test_a_push_leader_times_its_append_entries_round_trips(cluster):
    leader = cluster.wait_leader("pushed", 0)
    before = broker_scrape(cluster, leader).value("biplane_broker_replication_latency_seconds_count", mode="push")

    async def scenario() -> None:
        async with await WireClient.connect(*cluster.address(leader)) as c:
            for i in range(3):
                r = await produce(c, "pushed", 0, make_batch([b"p%d" % i]), acks=-1)
                assert r.error_code is ErrorCode.NONE, r
    run(scenario())
    # Every append-entries answer counts: at least one per follower for these records.
    after = broker_scrape(cluster, leader).value("biplane_broker_replication_latency_seconds_count", mode="push")
    assert after - before >= 2


def test_admin_api_requests_count_per_route_and_status(cluster):
    leader = cluster.controllers[0]
    before = controller_scrape(cluster)
    for _ in range(3):
        assert http("GET", leader.spec.api_url + "/v1/topics").status == 200
    assert http("GET", leader.spec.api_url + "/v1/topics/no-such-topic").status == 404
    after = controller_scrape(cluster)
    ok = {"method": "GET", "path": "/v1/topics", "status": "200"}
    missing = {"method": "GET", "path": "/v1/topics/{name}", "status": "404"}
    assert after.value("biplane_api_requests_total", **ok) - before.value("biplane_api_requests_total", **ok) == 3
    assert (after.value("biplane_api_requests_total", **missing)
            - before.value("biplane_api_requests_total", **missing)) == 1
    count = "biplane_api_request_seconds_count"
    assert after.value(count, method="GET", path="/v1/topics") - before.value(count, method="GET",
                                                                                 path="/v1/topics") == 3
    # The admin API's own GET /metrics (with the token) serves the same registry.
    via_api = scrape(int(leader.spec.api_port), token=TOKEN)
    assert via_api.value("biplane_controller_node_id") == 1 and via_api.has("biplane_api_requests_total")


def test_every_metric_the_dashboard_queries_is_exposed(cluster):
    leader = cluster.wait_leader("m", 0)
    exposed = broker_scrape(cluster, leader).names() | controller_scrape(cluster).names()
    queried = dashboard_metric_names()
    assert len(queried) >= 20, queried
    missing = sorted(queried - exposed)
    assert not missing, f"docs/grafana-dashboard.json queries metrics nobody exposes: {missing}"


def dashboard_metric_names() -> set[str]:
    doc = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in doc["panels"] for t in panel.get("targets", [])]
    exprs += [v["query"]["query"] if isinstance(v.get("query"), dict) else v.get("query", "")
              for v in doc.get("templating", {}).get("list", []) if v.get("type") == "query"]
    assert exprs, "the dashboard has no queries"
    return {name for expr in exprs for name in re.findall(r"\b((?:biplane|process)_[a-z_]+)\b", expr)}


def test_killing_a_follower_shows_under_replication_an_isr_shrink_and_its_lag(cluster):
    """Runs last in this module (it kills and restarts a broker). kill -9 of a follower: its
    leader's under-replicated count goes to >= 1 and its ISR-shrink counter moves once the
    controller or the leader takes the follower out; records produced meanwhile show as
    that follower's lag; the controller sees it fenced and the partition under-replicated.
    Started again, it catches up: the ISR expands and nothing is under-replicated."""
    leader = cluster.wait_leader("m", 0)
    victim = followers(cluster, "m", leader)[0]
    wait_until(lambda: broker_scrape(cluster, leader).value("biplane_broker_under_replicated_partitions") == 0,
               30, "no under-replicated partition before the kill")
    before = broker_scrape(cluster, leader)
    cluster.brokers[victim].kill()

    async def produce_some() -> None:
        async with await WireClient.connect(*cluster.address(leader)) as c:
            r = await produce(c, "m", 0, make_batch([b"while-down-%d" % i for i in range(10)]), acks=1)
            assert r.error_code is ErrorCode.NONE, r
    run(produce_some())

    def shrunk() -> Scrape | None:
        s = broker_scrape(cluster, leader)
        return s if (s.value("biplane_broker_under_replicated_partitions") >= 1
                     and s.value("biplane_broker_isr_shrinks_total")
                     > before.value("biplane_broker_isr_shrinks_total")) else None
    during = wait_until(shrunk, 30, f"leader {leader} to count follower {victim} out of the ISR")
    assert during.value("biplane_partition_follower_lag_records", topic="m", partition="0",
                        replica=str(victim)) >= 10
    c = wait_until(lambda: (lambda s: s if s.value("biplane_controller_brokers", state="fenced") == 1 else None)(
        controller_scrape(cluster)), 30, f"the controller to fence broker {victim}")
    assert c.value("biplane_controller_under_replicated_partitions") >= 1

    cluster.brokers[victim].start()
    cluster.wait_unfenced([victim])

    def healed() -> bool:
        s = broker_scrape(cluster, leader)
        return (s.value("biplane_broker_under_replicated_partitions") == 0
                and s.value("biplane_broker_isr_expands_total") > before.value("biplane_broker_isr_expands_total"))
    wait_until(healed, 60, f"follower {victim} back in the ISR of every partition {leader} leads")
    assert broker_scrape(cluster, leader).value("biplane_partition_follower_lag_records", topic="m", partition="0",
                                                replica=str(victim)) == 0
