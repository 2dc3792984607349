"""Controlled shutdown: SIGTERM moves a broker's leaderships away before it exits.

Setup: 1 controller, 3 brokers, one RF 3 topic per commit policy, a few records
acknowledged with acks=all. Claim: the broker asks the controller to fence it
(its heartbeat's `want_shutdown`), the controller fences it at once in that
request (a FenceBroker "controlled shutdown" within 1 s of SIGTERM, not a
"session expired" one later), and the broker logs "leaderships moved" within 1 s
of SIGTERM, before it exits; when the process has exited, the controller
already shows it fenced, out of every ISR and leading nothing (a crash would
leave it leader until its 1.5 s session expired); a new leader serves every
acknowledged record (once its HW has passed them); the broker comes back clean
(unfenced, back in the ISR) when started again. No process logs an error
(tests/conftest.py checks every log).

A second test measures the same with 100 partitions led by the broker.
"""
from __future__ import annotations

import asyncio

import pytest

from common.errors import ErrorCode
from common.wire import WireClient
from cluster_harness import Cluster, fetch_values, make_batch, produce, wait_until
from controller_harness import http

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

MOVED = "controlled shutdown: leaderships moved off broker"
SHUTDOWN_S_MAX = 1.0


def assert_controlled_shutdown(cluster: Cluster, broker_id: int, *, after_offset: int) -> float:
    """The broker just stopped on SIGTERM: check the mechanism, return SIGTERM -> moved (s)."""
    broker = cluster.brokers[broker_id]
    assert not broker.alive() and broker.sigterm_at_s is not None and broker.exited_at_s is not None
    sigterm_s = broker.sigterm_at_s
    # The broker saw its fence applied, and said so before it exited.
    moved = [t for t, _ in broker.log_lines(MOVED) if t >= sigterm_s - 0.001]
    assert len(moved) == 1, broker.log_tail()
    assert not [line for t, line in broker.log_lines("without it") if t >= sigterm_s - 0.001], broker.log_tail()
    took_s = moved[0] - sigterm_s
    fences = [r for r in cluster.metadata_records(after_offset)
              if r["type"] == "fence_broker" and r["broker_id"] == broker_id]
    print(f"\nbroker {broker_id}: SIGTERM -> fenced by the controller "
          f"{[r['at_ms'] - round(sigterm_s * 1000) for r in fences]} ms, "
          f"-> leaderships moved (applied) {took_s * 1000:.0f} ms, "
          f"-> exited {(broker.exited_at_s - sigterm_s) * 1000:.0f} ms")
    assert took_s < SHUTDOWN_S_MAX, f"SIGTERM to leaderships moved took {took_s:.3f} s"
    assert moved[0] <= broker.exited_at_s + 0.001
    # The controller fenced it for the shutdown, at once, not when its session ran out.
    assert [r["reason"] for r in fences] == ["controlled shutdown"], fences
    assert fences[0]["at_ms"] / 1000 - sigterm_s < SHUTDOWN_S_MAX, (fences[0], sigterm_s)
    return took_s


def metadata_offset(cluster: Cluster) -> int:
    return int(http("GET", cluster.api_url + "/v1/health", token=None).body["metadata_offset"])


def test_sigterm_moves_leaderships_before_the_broker_exits(tmp_path):
    with Cluster(tmp_path, brokers=3) as cluster:
        for policy in ("isr", "quorum"):
            topic = f"cs-{policy}"
            cluster.create_topic(topic, partitions=1, replication_factor=3,
                                 config={"commit_policy": policy, "min_insync_replicas": 2})
            leader = cluster.wait_leader(topic, 0)
            values = [b"%s-%d" % (policy.encode(), i) for i in range(10)]

            async def write() -> list[ErrorCode]:
                async with await WireClient.connect(*cluster.address(leader)) as c:
                    return [(await produce(c, topic, 0, make_batch([v]), acks=-1)).error_code for v in values]
            assert asyncio.run(write()) == [ErrorCode.NONE] * len(values)

            before = metadata_offset(cluster)
            cluster.brokers[leader].stop()  # SIGTERM, and wait for the process to exit
            assert_controlled_shutdown(cluster, leader, after_offset=before)
            info = cluster.broker_info(leader)
            p = cluster.partition(topic, 0)
            assert info is not None and info["fenced"], info
            assert p["leader"] != leader and leader not in p["isr"], p

            new_leader = cluster.wait_leader(topic, 0, not_broker=leader)

            async def read() -> list[bytes]:
                async with await WireClient.connect(*cluster.address(new_leader)) as c:
                    got, _ = await fetch_values(c, topic, 0)
                    return [v for _, v in got]
            # A new leader's HW passes the last records once its epoch-start batch commits
            # (a follower's HW trails the leader's by a fetch), so read until all show.
            seen: list[list[bytes]] = []
            wait_until(lambda: seen.append(asyncio.run(read())) or len(seen[-1]) >= len(values), 30,
                       f"every acknowledged record of {topic} on broker {new_leader}", interval_s=0.1)
            assert seen[-1] == values

            cluster.brokers[leader].start()
            cluster.wait_unfenced([leader])
            wait_until(lambda: leader in cluster.partition(topic, 0)["isr"], 30,
                       f"broker {leader} back in the ISR of {topic}-0", interval_s=0.1)


PARTITIONS = 100


def test_sigterm_moves_100_leaderships_within_a_second(tmp_path):
    """Broker 1 leads 100 RF 3 partitions (isr), each with a record acknowledged by all three.
    SIGTERM: within 1 s the controller has fenced it and moved all 100 leaderships, and
    the broker has applied that.

    The figure for the issue: `pytest -s` prints "SIGTERM -> leaderships moved: N ms"."""
    with Cluster(tmp_path, brokers=3) as cluster:
        r = http("POST", cluster.api_url + "/v1/topics",
                 {"name": "many", "replica_assignment": [[1, 2, 3]] * PARTITIONS,
                  "config": {"min_insync_replicas": 2}})
        assert r.status == 201, r.body

        def settled() -> bool:
            parts = http("GET", cluster.api_url + "/v1/topics/many/partitions").body["partitions"]
            return all(p["leader"] == 1 and sorted(p["isr"]) == [1, 2, 3] for p in parts)
        wait_until(settled, 60, f"broker 1 leading {PARTITIONS} partitions with full ISRs", interval_s=0.2)

        async def write_one_each() -> list[ErrorCode]:
            # acks=all on every partition: every replica has opened it and follows the leader.
            async with await WireClient.connect(*cluster.address(1)) as c:
                codes = []
                for partition in range(PARTITIONS):
                    for _ in range(50):
                        r = await produce(c, "many", partition, make_batch([b"v%d" % partition]), acks=-1)
                        if r.error_code is ErrorCode.NONE:
                            break
                        await asyncio.sleep(0.1)   # still opening the partition
                    codes.append(r.error_code)
                return codes
        assert asyncio.run(write_one_each()) == [ErrorCode.NONE] * PARTITIONS

        before = metadata_offset(cluster)
        cluster.brokers[1].stop()
        took_s = assert_controlled_shutdown(cluster, 1, after_offset=before)
        print(f"\nSIGTERM -> leaderships moved: {took_s * 1000:.0f} ms for {PARTITIONS} partitions "
              f"(process exited {1000 * (cluster.brokers[1].exited_at_s - cluster.brokers[1].sigterm_at_s):.0f} "
              "ms after SIGTERM)")
        parts = http("GET", cluster.api_url + "/v1/topics/many/partitions").body["partitions"]
        assert [p["partition"] for p in parts if p["leader"] in (1, None) or 1 in p["isr"]] == []
