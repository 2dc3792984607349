"""Process-level replication tests (1 controller + 3 brokers on loopback): a stopped follower
catches up and rejoins, and overload makes producers wait without losing acknowledged data.
Kill -9 of a push-mode leader is covered by tests/test_broker_faults.py (quorum-push)."""
from __future__ import annotations

import asyncio
import os
import time
import urllib.request

import pytest

from cluster_harness import Cluster, make_batch, produce
from common.errors import ErrorCode
from common.wire import WireClient
from controller_harness import wait_until
from test_broker_faults import read_all

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


@pytest.mark.parametrize("mode", ["pull", "push"])
def test_stopped_follower_catches_up_and_rejoins_the_isr(tmp_path, mode):
    """SIGSTOP a follower while acks=all traffic goes on: it leaves the ISR (acks=all keeps
    completing on the other two); after SIGCONT it catches up (recovery in push mode) and is
    back in the ISR with the same log as the leader."""
    with Cluster(tmp_path, brokers=3) as cluster:
        cluster.create_topic("s", partitions=1, replication_factor=3,
                             config={"commit_policy": "isr", "min_insync_replicas": 2,
                                     "replica_lag_time_max_ms": 1500, "replication_mode": mode})
        leader = cluster.wait_leader("s", 0)
        follower = next(b for b in cluster.brokers if b != leader)

        async def produce_for(seconds: float) -> list[tuple[int, bytes]]:
            acked = []
            async with await WireClient.connect(*cluster.address(leader)) as client:
                stop = time.monotonic() + seconds
                seq = 0
                while time.monotonic() < stop:
                    values = [b"%s-%06d" % (mode.encode(), seq + i) for i in range(20)]
                    seq += 20
                    r = await produce(client, "s", 0, make_batch(values), acks=-1, timeout_ms=10_000)
                    if r.error_code is ErrorCode.NONE:
                        acked += [(r.base_offset + i, v) for i, v in enumerate(values)]
            return acked

        cluster.brokers[follower].pause()
        try:
            acked = asyncio.run(produce_for(4.0))
            wait_until(lambda: follower not in cluster.partition("s", 0)["isr"], 20, "follower shrunk out of ISR")
        finally:
            cluster.brokers[follower].resume()
        assert acked, "acks=all must go on with the other two replicas"
        acked += asyncio.run(produce_for(1.0))
        wait_until(lambda: follower in cluster.partition("s", 0)["isr"], 30, "follower back in the ISR")
        log = asyncio.run(read_all(cluster, "s", acked[-1][0] + 1))
        at = dict(log)
        assert all(at.get(o) == v for o, v in acked), "an acknowledged record is missing"


@pytest.mark.parametrize("mode", ["pull", "push"])
def test_a_follower_out_of_the_isr_of_an_idle_partition_rejoins_with_no_new_record(tmp_path, mode):
    """Regression (replicas out of the ISR for minutes after 5,000 partitions opened): SIGSTOP a
    caught-up follower of a partition until the leader drops it from the ISR, SIGCONT it, and
    produce nothing: it is back in the ISR within seconds, the log end unchanged. In a fetch
    session its quiet long-poll is not stepped again, and only a fetch stepped since the ISR
    change could bring it back, so it stayed out until the next record came."""
    with Cluster(tmp_path, brokers=3) as cluster:
        cluster.create_topic("q", partitions=1, replication_factor=3,
                             config={"replica_lag_time_max_ms": 300, "replication_mode": mode})
        leader = cluster.wait_leader("q", 0)
        follower = next(b for b in sorted(cluster.brokers) if b != leader)

        async def one_record() -> int:
            async with await WireClient.connect(*cluster.address(leader)) as client:
                r = await produce(client, "q", 0, make_batch([b"only"]), acks=-1, timeout_ms=10_000)
            assert r.error_code is ErrorCode.NONE, r
            return r.base_offset + 1
        end = asyncio.run(one_record())
        wait_until(lambda: len(cluster.partition("q", 0)["isr"]) == 3, 20, "the ISR whole")
        # Stopped past its lag time but not its broker session (1.5 s here): a fenced broker
        # comes back by another path (its sessions start over with full fetches).
        cluster.brokers[follower].pause()
        try:
            wait_until(lambda: follower not in cluster.partition("q", 0)["isr"], 20, "the follower out of the ISR")
        finally:
            cluster.brokers[follower].resume()
        wait_until(lambda: follower in cluster.partition("q", 0)["isr"], 15,
                   "the follower back in the ISR with no new record")
        assert asyncio.run(read_all(cluster, "q", end)) == [(end - 1, b"only")], "nothing was produced since"
        assert not cluster.brokers[follower].log_lines(f"broker {follower} fenced"), \
            "the follower's broker was fenced meanwhile: it came back by another path"


def test_overload_makes_producers_wait_and_loses_nothing_acknowledged(tmp_path):
    """With one follower stopped on a quorum topic needing all 3 replicas, the HW cannot move:
    acks=1 producers fill the leader's unreplicated-bytes bound and then WAIT (their requests time
    out as REQUEST_TIMED_OUT, no other error), the leader's memory stays bounded and no broker
    dies; after SIGCONT every acknowledged acks=all record is in the log. The broker-wide bound
    (--unreplicated-bytes-max 4 MiB, below the core's 8 MiB per partition) is the one that holds:
    the leader's peak held bytes never pass it by more than one request."""
    bound = 4 * 1024 * 1024
    with Cluster(tmp_path, brokers=3, broker_args=["--unreplicated-bytes-max", str(bound)]) as cluster:
        cluster.create_topic("o", partitions=1, replication_factor=3,
                             config={"commit_policy": "quorum", "quorum_required_acks": 3})
        leader = cluster.wait_leader("o", 0)
        follower = next(b for b in cluster.brokers if b != leader)
        payload = [os.urandom(1024) for _ in range(32)]

        def metric(broker_id: int, name: str) -> float:
            url = f"http://127.0.0.1:{cluster.brokers[broker_id].metrics_port}/metrics"
            text = urllib.request.urlopen(url, timeout=5).read().decode()
            return float(next(line.split()[1] for line in text.splitlines() if line.startswith(name + " ")))

        async def scenario() -> tuple[dict, list, list[int], float]:
            errors: dict[str, int] = {}
            acked_all: list[tuple[int, bytes]] = []
            async with await WireClient.connect(*cluster.address(leader)) as c:
                for i in range(5):
                    values = [b"all-%d" % i]
                    r = await produce(c, "o", 0, make_batch(values), acks=-1)
                    assert r.error_code is ErrorCode.NONE
                    acked_all.append((r.base_offset, values[0]))
            cluster.brokers[follower].pause()
            rss: list[int] = []
            clients = [await WireClient.connect(*cluster.address(leader)) for _ in range(4)]

            async def flood(client):
                stop = time.monotonic() + 6
                while time.monotonic() < stop:
                    r = await produce(client, "o", 0, make_batch(payload), acks=1, timeout_ms=1000)
                    errors[r.error_code.name] = errors.get(r.error_code.name, 0) + 1

            async def sample():
                for _ in range(6):
                    status = open(f"/proc/{cluster.brokers[leader].proc.pid}/status").read()
                    rss.append(int(next(l for l in status.splitlines() if l.startswith("VmRSS")).split()[1]))
                    await asyncio.sleep(1)
            await asyncio.gather(sample(), *(flood(c) for c in clients for _ in range(8)))
            for c in clients:
                await c.close()
            return errors, acked_all, rss, metric(leader, "biplane_broker_unreplicated_bytes_peak")

        try:
            errors, acked_all, rss, peak = asyncio.run(scenario())
        finally:
            cluster.brokers[follower].resume()
        assert set(errors) <= {"NONE", "REQUEST_TIMED_OUT"}, errors
        assert errors.get("REQUEST_TIMED_OUT", 0) > 0, f"producers never had to wait: {errors}"
        # 32 in flight x 32 KiB plus an 8 MiB bound: far below what 6 s of unbounded acks=1 would hold.
        assert max(rss) - rss[0] < 128 * 1024, f"leader RSS grew {(max(rss) - rss[0]) // 1024} MiB: {rss}"
        request_bytes = len(make_batch(payload))
        assert bound <= peak <= bound + request_bytes, f"held bytes peaked at {peak}, bound {bound}"
        assert all(b.proc.poll() is None for b in cluster.brokers.values()), "a broker died"
        log = asyncio.run(read_all(cluster, "o", acked_all[-1][0] + 1))
        at = dict(log)
        assert all(at.get(o) == v for o, v in acked_all)
