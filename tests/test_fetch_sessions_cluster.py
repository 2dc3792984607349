"""Incremental fetch sessions between real broker processes (1 controller, 3 brokers, pull
replication, a 200 ms long-poll).

Claims: with sessions, acks=all produce completes and every replica's HW reaches the end;
once idle, a follower's session fetches go on (the long-poll) but carry no partition (its
biplane_broker_fetch_session_partitions_sent_total stands still while its incremental
requests grow), no full fetch is sent, and the ISR stays whole past replica_lag_time_max_ms
(omitted partitions are still judged caught up; their leaders parked on the sessions); a steady acks=all load of one record per
request sends no full fetch and a few incremental ones per produce; the partitions of a topic created
meanwhile join the sessions without a full fetch; after the leader broker of a partition is
killed (-9) and restarted, and leads again, the follower opens a new session with it by a
full fetch, replication of new records goes on, and no acknowledged record is lost."""
from __future__ import annotations

import asyncio
import time

import pytest

from cluster_harness import Cluster, make_batch, produce
from common.errors import ErrorCode
from common.wire import WireClient
from controller_harness import TOKEN, http, wait_until
from metrics_scrape import scrape
from test_broker_faults import read_all

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

TOPIC = "fs"
PARTITIONS = 3
STEADY_PRODUCES = 40


def session_counts(cluster: Cluster, follower: int, leader: int) -> tuple[float, float, float]:
    """(full requests, incremental requests, partitions sent) of `follower`'s session with `leader`."""
    s = scrape(cluster.brokers[follower].metrics_port)
    labels = {"leader": str(leader)}
    return (s.value("biplane_broker_fetch_session_requests_total", kind="full", **labels),
            s.value("biplane_broker_fetch_session_requests_total", kind="incremental", **labels),
            s.value("biplane_broker_fetch_session_partitions_sent_total", **labels))


def produce_to(cluster: Cluster, partition: int, values: list[bytes]) -> int:
    """acks=all to the partition's leader; the offset after the batch."""
    async def run() -> int:
        leader = cluster.wait_leader(TOPIC, partition)
        async with await WireClient.connect(*cluster.address(leader)) as c:
            r = await produce(c, TOPIC, partition, make_batch(values), acks=-1, timeout_ms=10_000)
        assert r.error_code is ErrorCode.NONE, r
        return r.base_offset + len(values)
    return asyncio.run(run())


def produce_each(cluster: Cluster, partition: int, values: list[bytes]) -> int:
    """acks=all, one record per request, one after another on one connection; the offset after."""
    async def run() -> int:
        leader = cluster.wait_leader(TOPIC, partition)
        async with await WireClient.connect(*cluster.address(leader)) as c:
            for value in values:
                r = await produce(c, TOPIC, partition, make_batch([value]), acks=-1, timeout_ms=10_000)
                assert r.error_code is ErrorCode.NONE, r
        return r.base_offset + 1
    return asyncio.run(run())


def session_errors(cluster: Cluster) -> float:
    """Session fetches refused by a leader, on every broker."""
    total = 0.0
    for b in cluster.brokers.values():
        s = scrape(b.metrics_port)
        total += sum(s.value("biplane_broker_fetch_session_errors_total", reason=r)
                     for r in ("unknown_session", "wrong_epoch"))
    return total


def wait_replicated(cluster: Cluster, ends: dict[int, int]) -> None:
    """Every broker's replica of each partition has a HW at its end (followers learn it by fetching)."""
    def check() -> bool:
        for b in cluster.brokers.values():
            s = scrape(b.metrics_port)
            for p, end in ends.items():
                if s.value("biplane_partition_high_watermark", topic=TOPIC, partition=str(p)) < end:
                    return False
        return True
    wait_until(check, 20, f"every replica's HW at {ends}", interval_s=0.1)


def test_sessions_replicate_idle_fetches_carry_nothing_and_a_restarted_leader_gets_a_full_fetch(tmp_path):
    with Cluster(tmp_path, brokers=3, broker_args=["--fetch-wait-ms-max", "200"]) as cluster:
        cluster.create_topic(TOPIC, partitions=PARTITIONS, replication_factor=3,
                             config={"commit_policy": "isr", "min_insync_replicas": 2,
                                     "replica_lag_time_max_ms": 1500})
        # Idle partitions beside: the followers' sessions with each leader hold parked ones.
        cluster.create_topic("idle", partitions=6, replication_factor=3)
        leader = cluster.wait_leader(TOPIC, 0)
        follower = next(b for b in cluster.brokers if b != leader)

        # (a) Replication and the HW with sessions.
        acked = {p: [b"%d-before-%d" % (p, i) for i in range(5)] for p in range(PARTITIONS)}
        ends = {p: produce_to(cluster, p, acked[p]) for p in range(PARTITIONS)}
        wait_replicated(cluster, ends)

        # (b) Idle: the long-poll goes on, carrying nothing; the ISR stays whole.
        time.sleep(1.0)   # flush reports and the last answers settle
        before = session_counts(cluster, follower, leader)
        time.sleep(2.5)   # > replica_lag_time_max_ms
        after = session_counts(cluster, follower, leader)
        assert after[1] - before[1] >= 5, f"the idle session kept long-polling: {before} -> {after}"
        assert after[2] == before[2], f"idle session fetches carried partitions: {before} -> {after}"
        assert after[0] == before[0], f"an idle session sent a full fetch: {before} -> {after}"
        for p in range(PARTITIONS):
            assert len(cluster.partition(TOPIC, p)["isr"]) == 3, f"{TOPIC}-{p} shrank while idle"
        # Past its lag time a quiet leader's follower clocks are kept by their sessions: the
        # leader sets them no timer (dataplane/broker/parked.py).
        parked = scrape(cluster.brokers[leader].metrics_port).value("biplane_broker_replicas_parked")
        assert parked >= 1, f"no quiet leader of broker {leader} is parked on its followers' sessions"

        # (c) A steady acks=all load on one partition: each produce completes on the followers'
        # flushed offsets, carried by incremental fetches. None is full: before, the follower's
        # long-poll left without the partition while its flush ran, the partition came back by
        # an express fetch that abandoned the long-poll, and the next fetch was full.
        followers = [b for b in cluster.brokers if b != leader]
        steady_before = {b: session_counts(cluster, b, leader) for b in followers}
        errors_before = session_errors(cluster)
        # Records of 80 KiB: a follower's flush of more than 64 KiB runs in a thread, not
        # inline a loop turn later (dataplane/log/flusher.py), as any flush on a busy disk.
        steady = [b"0-steady-%d-" % i + b"x" * 80 * 1024 for i in range(STEADY_PRODUCES)]
        ends[0] = produce_each(cluster, 0, steady)
        acked[0] += steady
        wait_replicated(cluster, ends)
        for b in followers:
            full, incremental, _ = (x - y for x, y in zip(session_counts(cluster, b, leader), steady_before[b]))
            assert full == 0, f"broker {b} sent {full} full session fetches during a steady load"
            assert incremental <= 4 * STEADY_PRODUCES, f"broker {b}: {incremental} session fetches for " \
                f"{STEADY_PRODUCES} produces"
        assert session_errors(cluster) == errors_before, "a session fetch was refused during the steady load"

        # (c2) A topic created while the sessions long-poll: its partitions join them by
        # incremental fetches. Before, each joiner's first fetches went express and, caught up,
        # abandoned the long-poll to rejoin it, and the next session fetch was full.
        pairs = [(f, lead) for f in cluster.brokers for lead in cluster.brokers if f != lead]
        joins_before = {pair: session_counts(cluster, *pair) for pair in pairs}
        cluster.create_topic("joiners", partitions=6, replication_factor=3)

        def joiners_replicated() -> bool:
            for b in cluster.brokers.values():
                s = scrape(b.metrics_port)
                if any(s.value("biplane_partition_high_watermark", topic="joiners", partition=str(p)) < 1
                       for p in range(6)):
                    return False
            return True
        wait_until(joiners_replicated, 20, "every replica of 'joiners' has its leader's epoch start", interval_s=0.1)
        for pair in pairs:
            full = session_counts(cluster, *pair)[0] - joins_before[pair][0]
            assert full == 0, f"broker {pair[0]} sent {full} full session fetches to broker {pair[1]} as partitions joined"

        # (d) The leader broker is killed and restarted, then leads again.
        cluster.restart(leader, kill=True)
        wait_until(lambda: leader in cluster.partition(TOPIC, 0)["isr"], 30, "restarted broker back in the ISR")
        r = http("POST", cluster.api_url + "/v1/elections/preferred",
                 {"partitions": [{"topic": TOPIC, "partition": 0}]}, token=TOKEN)
        assert r.status == 200, r.body
        wait_until(lambda: cluster.partition(TOPIC, 0)["leader"] == leader, 20, "leadership back")
        more = [b"0-after-%d" % i for i in range(5)]
        end = produce_to(cluster, 0, more)
        wait_replicated(cluster, {0: end})
        recovered = session_counts(cluster, follower, leader)
        # Its session with the killed process broke: the first fetch to the new one is full
        # (none reached the address while it was down: a refused connection sends nothing).
        assert recovered[0] > after[0], f"no full fetch to the restarted leader: {after} -> {recovered}"
        values = [v for _, v in asyncio.run(read_all(cluster, TOPIC, end)) if v.startswith(b"0-")]
        assert values == acked[0] + more, "an acknowledged record was lost"
