"""Gray failures: a leader cut from its followers while it still reaches the controller, and
the controller leader cut from the other controllers while it still reaches the brokers.

The cluster runs in a network namespace of the test's own; each broker's sockets carry a
cgroup of their own, so nftables can drop packets between two brokers while the SDK producer
(in the test process) still reaches every broker (tests/netcut.py). An idempotent acks=all
SDK producer writes to every partition of a `quorum` and an `isr` topic at a fixed rate; the
test cuts the leader of one partition from both of its followers, both ways, and measures, per
partition, the longest time without an acknowledgement while the cut lasts.
"""
from __future__ import annotations

import asyncio
import time

import pytest

import netcut
from cluster_harness import Cluster
from controller_harness import leader_of
from dataplane.client import Producer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

SEND_INTERVAL_S = 0.05
# Long enough that a healthy partition held up behind an isr partition's ISR shrink shows
# a gap twice the bound asserted, and the cut leader's partitions could not come back by
# that shrink alone before the heal (figures against the targets: docs/chaos.md).
LAG_MS = 4000
CUT_S = 8.0
PARTITIONS = 3


def _cut_cluster(tmp_path, *, controllers: int):
    """A cluster in a namespace of the test's own, every process in a cgroup nftables can cut
    by name (c1.., b1..)."""
    reason = netcut.available()
    if reason:
        pytest.skip(reason)
    with netcut.private_netns():
        names = [f"c{i}" for i in range(1, controllers + 1)] if controllers > 1 else []
        cuts = netcut.Cuts(names + ["b1", "b2", "b3"])
        cluster = Cluster(tmp_path, brokers=3, controllers=controllers)
        if controllers > 1:
            for c in cluster.controllers:
                c.launch_prefix = cuts.launch_prefix(f"c{c.spec.node_id}")
        for broker_id, broker in cluster.brokers.items():
            broker.launch_prefix = cuts.launch_prefix(f"b{broker_id}")
        try:
            with cluster:
                yield cluster, cuts
        finally:
            cuts.close()


@pytest.fixture
def cut_cluster(tmp_path):
    yield from _cut_cluster(tmp_path, controllers=1)


@pytest.fixture
def controller_cut_cluster(tmp_path):
    yield from _cut_cluster(tmp_path, controllers=3)


class AckLog:
    """Per partition: the monotonic times of every acknowledgement."""

    def __init__(self) -> None:
        self.acks: dict[tuple[str, int], list[float]] = {}
        self.failures: dict[tuple[str, int], list[str]] = {}

    def done(self, key: tuple[str, int], future: asyncio.Future) -> None:
        if future.cancelled():
            return
        if future.exception() is None:
            self.acks.setdefault(key, []).append(time.monotonic())
        else:
            self.failures.setdefault(key, []).append(type(future.exception()).__name__)

    def longest_gap(self, key: tuple[str, int], start: float, end: float) -> float:
        return self.gap_at(key, start, end)[1]

    def gap_at(self, key: tuple[str, int], start: float, end: float) -> tuple[float, float]:
        """(when the longest time without an acknowledgement began, after `start`; how long it was)."""
        times = [start] + [t for t in self.acks.get(key, []) if start < t < end] + [end]
        return max(((a - start, b - a) for a, b in zip(times, times[1:])), key=lambda g: g[1])

    def first_after(self, key: tuple[str, int], start: float) -> float | None:
        return next((t - start for t in self.acks.get(key, []) if t > start), None)


async def produce_through(cluster: Cluster, acks: AckLog, keys: list[tuple[str, int]],
                          phases: list[tuple[float, object]]) -> dict[str, float]:
    """Send one record per partition every SEND_INTERVAL_S; run each phase's action after its
    delay. Returns the monotonic time each phase began, by its action's name."""
    bootstrap = ",".join(f"127.0.0.1:{b.port}" for b in cluster.brokers.values())
    began: dict[str, float] = {}
    async with Producer(bootstrap=bootstrap, acks="all", linger_ms=5, request_timeout_ms=3000,
                        delivery_timeout_ms=10_000, max_block_ms=5000) as producer:
        async def phase_runner() -> None:
            for delay_s, action in phases:
                await asyncio.sleep(delay_s)
                began[action.__name__] = time.monotonic()
                await asyncio.to_thread(action)

        runner = asyncio.create_task(phase_runner())
        seq = 0
        while not runner.done():
            for key in keys:
                future = await producer.send(key[0], b"%s-%d-%d" % (key[0].encode(), key[1], seq), partition=key[1])
                future.add_done_callback(lambda f, key=key: acks.done(key, f))
            seq += 1
            await asyncio.sleep(SEND_INTERVAL_S)
        await runner
        await producer.flush()
    return began


def test_partitions_the_cut_leader_does_not_lead_keep_acknowledging(cut_cluster):
    cluster, cuts = cut_cluster
    cluster.create_topic("gq", partitions=PARTITIONS, config={"commit_policy": "quorum"})
    cluster.create_topic("gi", partitions=PARTITIONS, config={
        "commit_policy": "isr", "min_insync_replicas": 2, "replica_lag_time_max_ms": LAG_MS})
    keys = [(t, p) for t in ("gq", "gi") for p in range(PARTITIONS)]
    leaders = {key: cluster.partition(*key)["leader"] for key in keys}
    cut = leaders[("gq", 0)]
    others = [f"b{b}" for b in cluster.brokers if b != cut]

    def cut_leader() -> None:
        for other in others:
            cuts.cut_both(f"b{cut}", other)

    during: dict[tuple[str, int], dict] = {}

    def heal() -> None:
        for key in keys:
            if leaders[key] == cut:
                during[key] = cluster.partition(*key)
        cuts.heal()

    def stop() -> None:
        pass

    acks = AckLog()
    began = asyncio.run(produce_through(cluster, acks, keys, [(3.0, cut_leader), (CUT_S, heal), (4.0, stop)]))
    start, end = began["cut_leader"], began["heal"]
    report = {key: (leaders[key], tuple(round(x, 2) for x in acks.gap_at(key, start, end)), len(acks.acks.get(key, [])),
                    acks.failures.get(key, [])[:3])
              for key in keys}
    print(f"cut broker {cut} for {end - start:.1f} s; per partition (leader, (longest gap in the cut: began after, lasted), acks, failures):")
    for key, row in report.items():
        print(" ", key, row)
    healthy = [k for k in keys if leaders[k] != cut]
    assert {k[0] for k in healthy} == {"gq", "gi"}, leaders
    for key in healthy:
        # A quorum partition needs one follower of two: it never waits for the cut one. An
        # isr partition waits for the cut follower to leave its ISR (Kafka's semantics).
        bound_s = LAG_MS / 2000 if key[0] == "gq" else LAG_MS / 1000 + 2.0
        assert acks.longest_gap(key, start, end) <= bound_s, (key, report[key])
    for key, info in during.items():
        # The followers reported the cut leader; the controller moved the leadership while the
        # cut lasted, and the partition acknowledged again before the heal.
        assert info["leader"] not in (None, cut) and info["leader_epoch"] > 0, (key, info)
        assert cut not in info["isr"], (key, info)
        assert acks.longest_gap(key, start, end) < CUT_S - 1.0, (key, report[key])


def test_the_controller_leader_cut_from_its_peers_is_replaced_and_producers_go_on(controller_cut_cluster):
    """The controller leader loses its Raft peers but not the brokers: the two others elect a
    leader of their own while the cut lasts, the brokers follow it (no broker is fenced for a
    session it kept), and every partition keeps acknowledging acks=all. No process logs an
    ERROR (conftest's log check)."""
    cluster, cuts = controller_cut_cluster
    cluster.create_topic("cq", partitions=PARTITIONS, config={"commit_policy": "quorum"})
    cluster.create_topic("ci", partitions=PARTITIONS, config={
        "commit_policy": "isr", "min_insync_replicas": 2, "replica_lag_time_max_ms": LAG_MS})
    keys = [(t, p) for t in ("cq", "ci") for p in range(PARTITIONS)]
    old = leader_of(cluster.controllers)
    assert old is not None
    peers = [c for c in cluster.controllers if c is not old]
    seen: dict[str, object] = {}

    def cut_controller_leader() -> None:
        for c in peers:
            cuts.cut_both(f"c{old.spec.node_id}", f"c{c.spec.node_id}")

    def heal() -> None:
        seen["new"] = leader_of(peers)
        cuts.heal()

    def stop() -> None:
        pass

    acks = AckLog()
    began = asyncio.run(produce_through(cluster, acks, keys, [(3.0, cut_controller_leader), (CUT_S, heal),
                                                              (3.0, stop)]))
    start, end = began["cut_controller_leader"], began["heal"]
    report = {key: (tuple(round(x, 2) for x in acks.gap_at(key, start, end)), len(acks.acks.get(key, [])),
                    acks.failures.get(key, [])[:3]) for key in keys}
    print(f"cut controller {old.spec.node_id} from {[c.spec.node_id for c in peers]} for {end - start:.1f} s; "
          f"new leader {getattr(seen['new'], 'spec', None) and seen['new'].spec.node_id}; per partition "
          "((longest gap in the cut: began after, lasted), acks, failures):")
    for key, row in report.items():
        print(" ", key, row)
    # The two others elected one of themselves while the cut lasted, and no broker was fenced:
    # the brokers moved their heartbeats to the new leader within their sessions.
    assert seen["new"] is not None, "no controller among the cut leader's peers led while the cut lasted"
    fences = [r for r in cluster.metadata_records() if r["type"] == "fence_broker"]
    assert not fences, fences
    for key in keys:
        # Data replication does not pass through the controller: a controller election costs
        # no partition more than a session timeout.
        assert acks.longest_gap(key, start, end) <= 1.5, (key, report[key])
        assert not acks.failures.get(key), (key, report[key])

