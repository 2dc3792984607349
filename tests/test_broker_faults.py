"""Real processes on loopback (1 controller, 3 brokers) under kill -9 and SIGSTOP.

Claims:
- kill -9 of the partition leader, repeated (each time restarted), while an
  acks=all producer and an acks=1 "noise" producer write (the noise leaves the
  killed leader with a tail its followers lack, so restarts truncate), loses no
  record acknowledged with acks=all: every acknowledged value is read back at
  exactly the offset it was acknowledged at, and the first occurrences of the
  acknowledged values are in the order they were acknowledged. (Without
  idempotence a retried batch may be stored twice; we do not claim
  exactly-once, only that no acknowledged record is missing or moved and no
  value we never sent appears.)
- SIGSTOP of a follower: a `quorum` topic (q = 2 of 3) keeps acknowledging
  acks=all; an `isr` topic shrinks its ISR by the leader's lag rule (the
  controller's session timeout is set far above the lag time, so fencing
  cannot be what removes it) and then acknowledges again; after SIGCONT the
  follower catches up and rejoins the ISR.
"""
from __future__ import annotations

import asyncio
import time

import pytest

from common.errors import ErrorCode
from common.wire import WireClient
from cluster_harness import Cluster, fetch_values, make_batch, produce
from controller_harness import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

KILLS = 3


class Producer:
    """One batch in flight, retried (same values) on the current leader until acknowledged."""

    def __init__(self, cluster: Cluster, topic: str) -> None:
        self.cluster = cluster
        self.topic = topic
        self.acked: list[tuple[int, bytes]] = []   # (offset, value) in acknowledgement order
        self.sent: set[bytes] = set()
        self.errors: dict[str, int] = {}
        self._client: WireClient | None = None
        self._leader: int | None = None

    async def _connect(self) -> WireClient:
        if self._client is not None and not self._client.closed:
            return self._client
        loop = asyncio.get_running_loop()
        self._leader = await loop.run_in_executor(None, lambda: self.cluster.wait_leader(self.topic, 0, 30))
        self._client = await asyncio.wait_for(WireClient.connect(*self.cluster.address(self._leader)), 5)
        return self._client

    async def _drop(self) -> None:
        if self._client is not None:
            await self._client.close()
        self._client = None

    async def noise(self, stop: asyncio.Event) -> None:
        """acks=1 batches as fast as they go, on their own connection: at a kill the leader
        then holds a tail its followers lack, which a restart must truncate. Their values
        count as sent; nothing is claimed about them (acks=1 may lose data)."""
        seq, client = 0, None
        while not stop.is_set():
            values = [b"n%08d" % (seq + i) for i in range(20)]
            seq += 20
            self.sent.update(values)
            try:
                if client is None or client.closed:
                    leader = await asyncio.get_running_loop().run_in_executor(
                        None, lambda: self.cluster.wait_leader(self.topic, 0, 30))
                    client = await asyncio.wait_for(WireClient.connect(*self.cluster.address(leader)), 5)
                r = await asyncio.wait_for(produce(client, self.topic, 0, make_batch(values), acks=1), 8)
                if r.error_code is not ErrorCode.NONE:
                    await client.close()
                    client = None
                    await asyncio.sleep(0.05)
            except Exception:  # noqa: BLE001 - noise: any failure, reconnect
                client = None
                await asyncio.sleep(0.05)
        if client is not None:
            await client.close()

    async def run(self, stop: asyncio.Event, records_per_batch: int = 5) -> None:
        seq = 0
        while not stop.is_set():
            values = [b"v%08d" % (seq + i) for i in range(records_per_batch)]
            seq += records_per_batch
            self.sent.update(values)
            while True:  # until this batch is acknowledged
                try:
                    client = await self._connect()
                    r = await asyncio.wait_for(produce(client, self.topic, 0, make_batch(values), acks=-1,
                                                       timeout_ms=5000), 8)
                except (OSError, asyncio.TimeoutError, Exception) as exc:  # noqa: B014 - any failure: retry
                    self.errors[type(exc).__name__] = self.errors.get(type(exc).__name__, 0) + 1
                    await self._drop()
                    await asyncio.sleep(0.05)
                    continue
                if r.error_code is ErrorCode.NONE:
                    self.acked += [(r.base_offset + i, v) for i, v in enumerate(values)]
                    break
                self.errors[r.error_code.name] = self.errors.get(r.error_code.name, 0) + 1
                await self._drop()
                await asyncio.sleep(0.05)
        await self._drop()


def check_acknowledged(acked: list[tuple[int, bytes]], log: list[tuple[int, bytes]], sent: set[bytes]) -> None:
    at = dict(log)
    missing = [(o, v) for o, v in acked if at.get(o) != v]
    assert not missing, f"{len(missing)} acknowledged records missing or moved, first {missing[:5]}"
    strangers = [(o, v) for o, v in log if v not in sent]
    assert not strangers, f"values never sent: {strangers[:5]}"
    first: dict[bytes, int] = {}
    for o, v in log:
        first.setdefault(v, o)
    order = [first[v] for _, v in acked]
    assert order == sorted(order), "acknowledged records are out of order in the log"


async def read_all(cluster: Cluster, topic: str, until_offset: int) -> list[tuple[int, bytes]]:
    loop = asyncio.get_running_loop()
    for _ in range(100):
        leader = await loop.run_in_executor(None, lambda: cluster.wait_leader(topic, 0, 30))
        async with await WireClient.connect(*cluster.address(leader)) as c:
            values, hw = await fetch_values(c, topic, 0)
        if hw >= until_offset:
            return values
        await asyncio.sleep(0.1)
    raise AssertionError(f"HW never reached {until_offset}")


@pytest.mark.parametrize("policy,mode", [("quorum", "pull"), ("isr", "pull"), ("quorum", "push")])
def test_kill_leader_repeatedly_loses_no_acknowledged_record(tmp_path, policy, mode):
    config = {"commit_policy": policy, "min_insync_replicas": 2, "replica_lag_time_max_ms": 3000,
              "replication_mode": mode}
    with Cluster(tmp_path, brokers=3) as cluster:
        cluster.create_topic("t", partitions=1, replication_factor=3, config=config)

        async def scenario():
            producer = Producer(cluster, "t")
            stop = asyncio.Event()
            task = asyncio.create_task(producer.run(stop))
            noise = asyncio.create_task(producer.noise(stop))
            loop = asyncio.get_running_loop()
            killed = []
            for _ in range(KILLS):
                await asyncio.sleep(1.5)
                before = len(producer.acked)
                leader = await loop.run_in_executor(None, lambda: cluster.wait_leader("t", 0, 30))
                cluster.brokers[leader].kill()
                killed.append(leader)
                await asyncio.sleep(0.5)
                cluster.brokers[leader].start()
                # Progress after each kill: the new leader acknowledges.
                for _ in range(300):
                    if len(producer.acked) > before:
                        break
                    await asyncio.sleep(0.05)
            await asyncio.sleep(1.0)
            stop.set()
            await asyncio.wait_for(asyncio.gather(task, noise), 60)
            assert producer.acked, f"nothing acknowledged; errors {producer.errors}"
            log = await read_all(cluster, "t", producer.acked[-1][0] + 1)
            check_acknowledged(producer.acked, log, producer.sent)
            truncations = sum(b.log_path.read_text(errors="replace").count("truncates its log")
                              for b in cluster.brokers.values())
            print(f"policy={policy} mode={mode} killed={killed} acked={len(producer.acked)} stored={len(log)} "
                  f"truncations={truncations} errors={producer.errors}")
        try:
            asyncio.run(asyncio.wait_for(scenario(), 150))
        except BaseException:
            for b in cluster.brokers.values():
                print(f"--- broker {b.broker_id}\n{b.log_tail(15)}")
            raise


def test_paused_follower_quorum_keeps_acking_isr_shrinks_and_recovers(tmp_path):
    lag_ms = 1500
    with Cluster(tmp_path, brokers=3, controller_args=["--session-timeout-ms", "60000"]) as cluster:
        for name, policy in (("q", "quorum"), ("i", "isr")):
            cluster.create_topic(name, partitions=1, replication_factor=3, config={
                "commit_policy": policy, "min_insync_replicas": 2, "replica_lag_time_max_ms": lag_ms})
        leaders = {name: cluster.wait_leader(name, 0) for name in ("q", "i")}
        follower = next(b for b in (3, 2, 1) if b not in leaders.values())
        paused_at = None

        async def acked_all(name: str, count: int) -> int:
            async with await WireClient.connect(*cluster.address(leaders[name])) as c:
                ok = 0
                for i in range(count):
                    r = await produce(c, name, 0, make_batch([b"%s-%d" % (name.encode(), i)]), acks=-1,
                                      timeout_ms=20_000)
                    ok += r.error_code is ErrorCode.NONE
                return ok

        try:
            assert asyncio.run(acked_all("q", 5)) == 5 and asyncio.run(acked_all("i", 5)) == 5
            cluster.brokers[follower].pause()
            paused_at = time.monotonic()
            assert asyncio.run(asyncio.wait_for(acked_all("q", 20), 30)) == 20
            assert asyncio.run(asyncio.wait_for(acked_all("i", 3), 60)) == 3
            isr = cluster.partition("i", 0)["isr"]
            shrunk_after_s = time.monotonic() - paused_at
            assert follower not in isr, isr
            assert cluster.broker_info(follower)["fenced"] is False  # the leader's lag rule, not fencing
            print(f"isr topic acknowledged again with ISR {isr} {shrunk_after_s:.2f} s after SIGSTOP "
                  f"(lag time {lag_ms} ms)")
        finally:
            cluster.brokers[follower].resume()
        asyncio.run(acked_all("i", 2))

        def rejoined() -> bool:
            return follower in cluster.partition("i", 0)["isr"]
        wait_until(rejoined, 30, f"broker {follower} back in the ISR of i-0", interval_s=0.2)


def test_killed_follower_does_not_stall_acks_all_on_isr_topic(tmp_path):
    """kill -9 of a follower: the controller fences it and drops it from the ISR; its last
    progress at the leader still looks caught up, so the leader may propose it back and be
    refused. Claim: acks=all produce keeps being acknowledged all the same (regression: a
    refused expansion counted in the HW's required set stalled every acks=all produce)."""
    with Cluster(tmp_path, brokers=3) as cluster:
        cluster.create_topic("k", partitions=1, replication_factor=3, config={"commit_policy": "isr"})
        leader = cluster.wait_leader("k", 0)
        victim = next(b for b in (3, 2, 1) if b != leader)

        async def produce_for(seconds: float) -> int:
            ok = 0
            async with await WireClient.connect(*cluster.address(leader)) as c:
                end = time.monotonic() + seconds
                while time.monotonic() < end:
                    r = await asyncio.wait_for(produce(c, "k", 0, make_batch([b"k"]), acks=-1, timeout_ms=20_000),
                                               30)
                    assert r.error_code is ErrorCode.NONE, r
                    ok += 1
            return ok

        assert asyncio.run(produce_for(0.5)) > 0
        cluster.brokers[victim].kill()
        wait_until(lambda: victim not in cluster.partition("k", 0)["isr"], 20, f"{victim} out of the ISR")
        assert asyncio.run(produce_for(3.0)) > 0
