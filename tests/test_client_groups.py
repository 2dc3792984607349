"""The SDK's group consumer against a real cluster: Biplane consumers share a topic's
partitions exactly once; a member that leaves hands its partitions over at once, at its
commits, and one killed with kill -9 loses them after its session, the others resuming at
its commits with nothing skipped; a Biplane consumer and a librdkafka consumer (the Kafka
API listener) share one group; `biplane group` run as a user would."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from cluster_harness import Cluster
from controller_harness import BIPLANE, REPO
from dataplane.client import Consumer, Producer, TopicPartition

pytestmark = pytest.mark.slow

SESSION_MS = 3000
BROKER_ARGS = ["--group-offsets-partitions", "4", "--group-initial-rebalance-delay-ms", "300",
               "--group-min-session-timeout-ms", "1000"]
MEMBER = Path(__file__).with_name("sdk_group_member.py")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("sdk-groups"), brokers=3, broker_args=BROKER_ARGS) as c:
        yield c


def bootstrap(c: Cluster) -> str:
    return ",".join(f"127.0.0.1:{b.port}" for b in c.brokers.values())


def group_consumer(c: Cluster, group: str, **extra: Any) -> Consumer:
    options: dict[str, Any] = dict(bootstrap=bootstrap(c), group_id=group, auto_offset_reset="earliest",
                                   session_timeout_ms=SESSION_MS, heartbeat_interval_ms=500, fetch_max_wait_ms=100)
    return Consumer(**{**options, **extra})


async def produce(c: Cluster, topic: str, values: list[str], partitions: int) -> None:
    async with Producer(bootstrap=bootstrap(c), linger_ms=2) as producer:
        futures = [await producer.send(topic, v.encode(), partition=i % partitions) for i, v in enumerate(values)]
        await asyncio.gather(*futures)


async def log_offsets(c: Cluster, topic: str, partitions: int) -> dict[int, list[int]]:
    """Every record's offset in each partition, read from the beginning without a group."""
    out: dict[int, list[int]] = {p: [] for p in range(partitions)}
    async with Consumer(bootstrap=bootstrap(c), from_beginning=True) as reader:
        await reader.assign([(topic, p) for p in range(partitions)])
        ends = await reader.end_offsets([TopicPartition(topic, p) for p in range(partitions)])
        deadline = time.monotonic() + 30
        while any(reader.position((topic, p)) is None or reader.position((topic, p)) < ends[TopicPartition(topic, p)]
                  for p in range(partitions)):
            assert time.monotonic() < deadline, "could not read the topic back"
            for r in await reader.poll(timeout_ms=200):
                out[r.partition].append(r.offset)
    return out


async def drain(consumers: dict[str, Consumer], into: dict[str, list[tuple[int, int, str]]], want: int,
                timeout_s: float = 40) -> None:
    """Poll every consumer in turn until `want` records were read in all."""
    deadline = time.monotonic() + timeout_s
    while sum(len(v) for v in into.values()) < want:
        assert time.monotonic() < deadline, f"read {sum(len(v) for v in into.values())} of {want} records"
        for name, consumer in consumers.items():
            for r in await consumer.poll(timeout_ms=50):
                into[name].append((r.partition, r.offset, r.value.decode() if r.value else ""))


async def wait_split(consumers: dict[str, Consumer], partitions: int, timeout_s: float = 40) -> None:
    """Poll until the group's partitions are split among all the consumers, each having some."""
    deadline = time.monotonic() + timeout_s
    while True:
        for consumer in consumers.values():
            assert not await consumer.poll(timeout_ms=50), "records before any were produced"
        owned = [tp.partition for consumer in consumers.values() for tp in consumer.assignment()]
        if sorted(owned) == list(range(partitions)) and all(c.assignment() for c in consumers.values()):
            return
        assert time.monotonic() < deadline, f"the group never split its {partitions} partitions: " \
                                            f"{ {n: sorted(map(str, c.assignment())) for n, c in consumers.items()} }"


def test_three_sdk_consumers_read_a_topic_exactly_once(cluster: Cluster) -> None:
    """Three members of one group split a 6-partition topic two partitions each (range) and
    read each record exactly once between them; callbacks saw exactly what they own."""
    topic, group = "sdk-three", "sdk-three-g"
    cluster.create_topic(topic, partitions=6)

    async def run() -> None:
        assigned: dict[str, set[TopicPartition]] = {n: set() for n in "abc"}

        def on_assign(name: str) -> Any:
            return lambda tps: assigned[name].update(tps)

        def on_revoke(name: str) -> Any:
            return lambda tps: assigned[name].difference_update(tps)
        consumers = {n: group_consumer(cluster, group, partition_assignment_strategy="range") for n in "abc"}
        try:
            for name, consumer in consumers.items():
                await consumer.subscribe(topic, on_assign=on_assign(name), on_revoke=on_revoke(name))
            await wait_split(consumers, 6)
            assert all(len(c.assignment()) == 2 for c in consumers.values())
            assert all(assigned[n] == consumers[n].assignment() for n in consumers)
            values = [f"v{i}" for i in range(600)]
            await produce(cluster, topic, values, 6)
            got: dict[str, list[tuple[int, int, str]]] = {n: [] for n in consumers}
            await drain(consumers, got, 600)
            seen = [v for records in got.values() for _, _, v in records]
            assert sorted(seen) == sorted(values), "each record exactly once across the group"
            for name, records in got.items():
                assert {p for p, _, _ in records} <= {tp.partition for tp in consumers[name].assignment()}
        finally:
            for consumer in consumers.values():
                await consumer.close()
        # Closing committed what each had read: the group's offsets are the partitions' ends.
        async with group_consumer(cluster, group) as probe:
            committed = await probe.committed([TopicPartition(topic, p) for p in range(6)])
            ends = await probe.end_offsets([TopicPartition(topic, p) for p in range(6)])
        assert committed == ends
    asyncio.run(run())


class Member:
    """An sdk_group_member.py process; its output read on a thread."""

    def __init__(self, c: Cluster, group: str, topic: str) -> None:
        self.proc = subprocess.Popen([sys.executable, str(MEMBER), bootstrap(c), group, topic, str(SESSION_MS)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(REPO),
                                     env={**os.environ, "PYTHONPATH": str(REPO)})
        self.records: list[tuple[int, int, str]] = []
        self.owned: set[int] = set()
        self.closed = False
        self.stderr: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._errors = threading.Thread(target=self._read_errors, daemon=True)
        self._errors.start()

    def _read_errors(self) -> None:
        assert self.proc.stderr is not None
        self.stderr += self.proc.stderr

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            kind, _, rest = line.strip().partition(" ")
            if kind == "record":
                p, o, v = rest.split(" ", 2)
                self.records.append((int(p), int(o), v))
            elif kind == "assigned":
                self.owned |= {int(p) for p in rest.split(",") if p}
            elif kind == "revoked":
                self.owned -= {int(p) for p in rest.split(",") if p}
            elif kind == "closed":
                self.closed = True

    def stop(self) -> str:
        """SIGTERM (a clean close) and wait; returns stderr, which must hold no traceback."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(30)
        self._reader.join(5)
        self._errors.join(5)
        return "".join(self.stderr)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


def wait_for(check: Any, timeout_s: float, what: str) -> float:
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < timeout_s, what
        time.sleep(0.05)
    return time.monotonic() - start


def test_member_leaving_and_member_killed(cluster: Cluster) -> None:
    """Three member processes. One closes (SIGTERM): it commits and leaves, so its partitions
    move long before a session timeout and the next owners start right after its last
    record (no duplicate). One is killed with kill -9: its partitions move once its session
    expires and the survivor resumes each at the group's committed offset (the one seen at the
    kill, or one of the killed member's commits still being stored then). Every record in the
    log was read by someone: nothing skipped."""
    topic, group = "sdk-faults", "sdk-faults-g"
    cluster.create_topic(topic, partitions=6)
    members = {n: Member(cluster, group, topic) for n in "abc"}
    a, b, c = members["a"], members["b"], members["c"]
    try:
        wait_for(lambda: sorted(p for m in members.values() for p in m.owned) == list(range(6))
                 and all(m.owned for m in members.values()), 60, "the group never split three ways")
        total = [0]

        def phase(name: str, count: int) -> None:
            values = [f"{name}-{i}" for i in range(count)]
            asyncio.run(produce(cluster, topic, values, 6))
            total[0] += count
            wait_for(lambda: len({v for m in members.values() for _, _, v in m.records}) >= total[0], 60,
                     f"phase {name}: the group did not read every record")

        phase("first", 300)
        moved = set(b.owned)
        last_read = {p: max(o for q, o, _ in b.records if q == p) for p in moved}
        err = b.stop()
        assert b.closed and "Traceback" not in err and "ERROR" not in err, err
        took = wait_for(lambda: moved <= a.owned | c.owned, 30, "a leaving member's partitions never moved")
        assert took < SESSION_MS / 1000, f"the move took {took:.1f} s: the leave was not seen, the session expired"
        phase("second", 300)
        for p in moved:
            resumed = min(o for m in (a, c) for q, o, v in m.records if q == p and v.startswith("second"))
            # b committed its position on close: the next owner starts right after b's last record
            # (the first record of "second" in that partition, since b read all of "first").
            assert resumed > last_read[p], (p, resumed, last_read[p])
        firsts = [v for m in members.values() for _, _, v in m.records if v.startswith("first")]
        assert len(firsts) == len(set(firsts)) == 300, "a clean hand-over reads nothing twice"

        moved = set(c.owned)
        c_last = {p: max((o for q, o, _ in c.records if q == p), default=-1) for p in moved}
        a_before = len(a.records)
        c.kill()

        async def committed_now() -> dict[TopicPartition, int | None]:
            async with group_consumer(cluster, group) as probe:
                return await probe.committed([TopicPartition(topic, p) for p in moved])
        committed = {tp.partition: offset for tp, offset in asyncio.run(committed_now()).items()}
        took = wait_for(lambda: moved <= a.owned, 60, "a killed member's partitions never moved")
        assert took > SESSION_MS / 1000 * 0.3, f"moved after {took:.1f} s: before the session could expire?"
        phase("third", 300)
        after = a.records[a_before:]
        for p in moved:
            assert committed[p] is not None and committed[p] <= c_last[p] + 1, (p, committed[p], c_last[p])
            resumed = min(o for q, o, _ in after if q == p)
            # At a commit of the killed member: the one read just after the kill, or a later one
            # that was still being written then (an answer waits for its record to commit) — never
            # past the record after the last one it processed.
            assert committed[p] <= resumed <= c_last[p] + 1, \
                f"partition {p}: resumed at {resumed}; committed at the kill {committed[p]}, last read {c_last[p]}"
        # Nothing skipped: every record in the log was read by some member.
        logged = asyncio.run(log_offsets(cluster, topic, 6))
        read: dict[int, set[int]] = {p: set() for p in range(6)}
        for m in members.values():
            for p, o, _ in m.records:
                read[p].add(o)
        for p in range(6):
            missing = sorted(set(logged[p]) - read[p])
            assert not missing, f"partition {p}: offsets {missing[:10]} never read"
    finally:
        for m in members.values():
            m.kill()


@pytest.mark.parametrize("strategy", ["range", "cooperative-sticky"])
def test_biplane_and_librdkafka_consumers_share_a_group(cluster: Cluster, strategy: str) -> None:
    """A Biplane consumer (Biplane's listener) and a confluent-kafka consumer (the Kafka API
    listener) in one group: the coordinator sees both, each reads its half, nothing twice.
    With cooperative-sticky, whichever is the leader reads the other's owned partitions
    (subscription v1+) and hands them out incrementally."""
    confluent_kafka = pytest.importorskip("confluent_kafka")
    import confluent_kafka.admin  # DescribeGroups through the AdminClient
    topic, group = f"sdk-mixed-{strategy}", f"sdk-mixed-{strategy}-g"
    cluster.create_topic(topic, partitions=6)
    kafka = confluent_kafka.Consumer({"bootstrap.servers": cluster.kafka_bootstrap, "group.id": group,
                                      "auto.offset.reset": "earliest", "session.timeout.ms": SESSION_MS,
                                      "heartbeat.interval.ms": 500, "partition.assignment.strategy": strategy})
    kafka_records: list[tuple[int, int, str]] = []

    def kafka_poll(seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            m = kafka.poll(0.05)
            if m is not None and m.error() is None:
                kafka_records.append((m.partition(), m.offset(), m.value().decode()))

    async def run() -> None:
        ours = group_consumer(cluster, group, partition_assignment_strategy=strategy)
        mine: list[tuple[int, int, str]] = []
        try:
            kafka.subscribe([topic])
            await ours.subscribe(topic)
            deadline = time.monotonic() + 60
            while True:
                await asyncio.to_thread(kafka_poll, 0.2)
                mine += [(r.partition, r.offset, r.value.decode()) for r in await ours.poll(timeout_ms=100)]
                theirs = {tp.partition for tp in kafka.assignment()}
                own = {tp.partition for tp in ours.assignment()}
                if len(theirs) == 3 and len(own) == 3 and theirs | own == set(range(6)):
                    break
                assert time.monotonic() < deadline, f"no split: kafka {sorted(theirs)}, biplane {sorted(own)}"
            admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
            described = admin.describe_consumer_groups([group])[group].result(timeout=20)
            assert len(described.members) == 2
            assert described.partition_assignor == strategy
            values = [f"m{i}" for i in range(300)]
            await produce(cluster, topic, values, 6)
            deadline = time.monotonic() + 40
            while len(mine) + len(kafka_records) < 300:
                assert time.monotonic() < deadline, f"read {len(mine) + len(kafka_records)} of 300"
                await asyncio.to_thread(kafka_poll, 0.1)
                mine += [(r.partition, r.offset, r.value.decode()) for r in await ours.poll(timeout_ms=100)]
            assert sorted(v for _, _, v in mine + kafka_records) == sorted(values)
            assert {p for p, _, _ in mine} == own and {p for p, _, _ in kafka_records} == theirs
        finally:
            await ours.close()
            kafka.close()
    asyncio.run(run())


def test_heartbeats_go_on_while_the_user_processes_and_a_stuck_member_leaves(cluster: Cluster) -> None:
    """Processing (awaiting) for twice the session timeout between polls keeps the member in
    the group: its heartbeats come from a task of their own, so the other member never gets
    its partitions. Not polling for max_poll_interval_ms makes it leave: the other member
    takes everything, and its next poll rejoins."""
    topic, group = "sdk-busy", "sdk-busy-g"
    cluster.create_topic(topic, partitions=4)

    async def run() -> None:
        busy = group_consumer(cluster, group, partition_assignment_strategy="range", max_poll_interval_ms=8000)
        other = group_consumer(cluster, group, partition_assignment_strategy="range")
        consumers = {"busy": busy, "other": other}
        try:
            for consumer in consumers.values():
                await consumer.subscribe(topic)
            await wait_split(consumers, 4)
            generation = busy._group.core.generation_id if busy._group else -1
            held = busy.assignment()
            deadline = time.monotonic() + 2 * SESSION_MS / 1000
            while time.monotonic() < deadline:   # busy "processes"; only the other polls
                await other.poll(timeout_ms=100)
            await busy.poll(timeout_ms=0)
            assert busy.assignment() == held and busy._group and busy._group.core.generation_id == generation, \
                "the member lost its partitions while it processed: heartbeats were starved"
            start = time.monotonic()
            while len(other.assignment()) < 4:   # busy stops polling past max_poll_interval_ms
                assert time.monotonic() - start < 30, "the stuck member never left the group"
                await other.poll(timeout_ms=100)
            assert time.monotonic() - start > 4, "left before max_poll_interval_ms"
            await wait_split(consumers, 4)   # its next poll brings it back
        finally:
            for consumer in consumers.values():
                await consumer.close()
    asyncio.run(run())


def biplane(c: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([BIPLANE, "group", *args, "--bootstrap", bootstrap(c)], capture_output=True, text=True,
                          timeout=60, cwd=str(REPO), env={**os.environ, "PYTHONPATH": str(REPO)})
    assert "Traceback" not in done.stderr, done.stderr
    return done


def test_group_cli_as_a_user_runs_it(cluster: Cluster) -> None:
    """`biplane group list|describe|reset-offsets|delete` in a subprocess: describe shows the
    live member and its partitions (decoded), committed offsets, ends and lag; a reset is
    refused while the group has a member and done once it has none (a dry run commits
    nothing); delete removes the group, and every failure is one clear line with exit 1."""
    topic, group = "sdk-cli", "sdk-cli-g"
    cluster.create_topic(topic, partitions=3)

    async def consume_some() -> Consumer:
        await produce(cluster, topic, [f"c{i}" for i in range(60)], 3)
        consumer = group_consumer(cluster, group, enable_auto_commit=False, client_id="cli-test")
        await consumer.subscribe(topic)
        got = 0
        deadline = time.monotonic() + 40
        while got < 60:
            assert time.monotonic() < deadline, f"read {got} of 60"
            got += len(await consumer.poll(timeout_ms=100))
        # Commit 10 records short of the end in every partition: a lag of 10 each.
        await consumer.commit({tp: pos - 10 for tp in consumer.assignment()
                               if (pos := consumer.position(tp)) is not None})
        return consumer

    loop = asyncio.new_event_loop()
    consumer = loop.run_until_complete(consume_some())
    try:
        ends = loop.run_until_complete(consumer.end_offsets([TopicPartition(topic, p) for p in range(3)]))
        # Keep the member alive (heartbeats) while the CLI runs in another process.
        keep = loop.create_task(asyncio.sleep(3600))
        runner = threading.Thread(target=loop.run_until_complete, args=(keep,), daemon=True)
        runner.start()

        listed = biplane(cluster, "list")
        assert listed.returncode == 0, listed.stderr
        assert any(line.split()[:2] == [group, "Stable"] for line in listed.stdout.splitlines()), listed.stdout
        described = biplane(cluster, "describe", group)
        assert described.returncode == 0, described.stderr
        assert f"group {group}: Stable, protocol consumer/range, 1 member(s)" in described.stdout
        assert "cli-test" in described.stdout and f"{topic}:0,1,2" in described.stdout, described.stdout
        doc = json.loads(biplane(cluster, "describe", group, "--json").stdout)
        rows = {r["partition"]: r for r in doc["partitions"]}
        for p in range(3):
            end = ends[TopicPartition(topic, p)]
            assert rows[p]["end"] == end and rows[p]["committed"] == end - 10 and rows[p]["lag"] == 10, rows[p]
            assert rows[p]["member_id"] == doc["members"][0]["member_id"]

        refused = biplane(cluster, "reset-offsets", group, "--to-earliest", "--topic", topic)
        assert refused.returncode == 1 and "stop its consumers first" in refused.stderr, refused
        assert len(refused.stderr.strip().splitlines()) == 1
    finally:
        loop.call_soon_threadsafe(keep.cancel)
        runner.join(10)
        loop.run_until_complete(consumer.close())
        loop.close()

    dry = biplane(cluster, "reset-offsets", group, "--to-earliest", "--topic", f"{topic}:0", "--dry-run")
    assert dry.returncode == 0 and "dry run" in dry.stdout, dry
    committed = {r["partition"]: r["committed"] for r in json.loads(
        biplane(cluster, "describe", group, "--json").stdout)["partitions"]}
    assert committed[0] == ends[TopicPartition(topic, 0)] - 10, "a dry run committed"

    done = biplane(cluster, "reset-offsets", group, "--to-offset", "5", "--topic", f"{topic}:0,2")
    assert done.returncode == 0, done.stderr
    after = json.loads(biplane(cluster, "describe", group, "--json").stdout)
    assert after["state"] == "Empty" and after["members"] == []
    committed = {r["partition"]: r["committed"] for r in after["partitions"]}
    assert committed == {0: 5, 1: ends[TopicPartition(topic, 1)] - 10, 2: 5}
    latest = biplane(cluster, "reset-offsets", group, "--to-latest", "--all-topics", "--json")
    assert latest.returncode == 0 and all(r["new"] == ends[TopicPartition(topic, r["partition"])]
                                          for r in json.loads(latest.stdout)["offsets"])
    future = biplane(cluster, "reset-offsets", group, "--to-datetime", "2999-01-01T00:00:00Z", "--topic", topic,
                     "--json")
    assert future.returncode == 0 and all(r["new"] == ends[TopicPartition(topic, r["partition"])]
                                          for r in json.loads(future.stdout)["offsets"])
    past = biplane(cluster, "reset-offsets", group, "--to-datetime", "2000-01-01", "--topic", topic, "--json")
    assert past.returncode == 0 and all(r["new"] <= 1 for r in json.loads(past.stdout)["offsets"]), past.stdout

    for args, message in ((["reset-offsets", group, "--to-earliest", "--topic", "no-such-topic"], "does not exist"),
                          (["reset-offsets", group, "--to-earliest", "--topic", f"{topic}:7"], "[7] do not exist"),
                          (["describe", "no-such-group"], "does not exist")):
        failed = biplane(cluster, *args)
        assert failed.returncode == 1 and message in failed.stderr, (args, failed)
        assert len(failed.stderr.strip().splitlines()) == 1, failed.stderr
    deleted = biplane(cluster, "delete", group)
    assert deleted.returncode == 0 and f"group {group}: deleted" in deleted.stdout, deleted
    gone = biplane(cluster, "describe", group)
    assert gone.returncode == 1 and "does not exist" in gone.stderr
    again = biplane(cluster, "delete", group)
    assert again.returncode == 1 and "not deleted" in again.stderr, again
    usage = biplane(cluster, "reset-offsets", group, "--to-datetime", "yesterday", "--topic", topic)
    assert usage.returncode == 2 and "not an ISO 8601 time" in usage.stderr


def test_blocking_consumer_in_a_group(cluster: Cluster) -> None:
    """dataplane.client.sync.Consumer in a group: its loop thread heartbeats while the caller's
    thread sleeps past the session timeout; commit() and committed() agree; close() leaves."""
    from dataplane.client.sync import Consumer as BlockingConsumer
    topic, group = "sdk-sync", "sdk-sync-g"
    cluster.create_topic(topic, partitions=2)
    asyncio.run(produce(cluster, topic, [f"s{i}" for i in range(20)], 2))
    consumer = BlockingConsumer(bootstrap=bootstrap(cluster), group_id=group, auto_offset_reset="earliest",
                                session_timeout_ms=SESSION_MS, heartbeat_interval_ms=500, enable_auto_commit=False)
    try:
        consumer.subscribe([topic])
        got: list[str] = []
        deadline = time.monotonic() + 40
        while len(got) < 20:
            assert time.monotonic() < deadline, f"read {len(got)} of 20"
            got += [r.value.decode() for r in consumer.poll(timeout_ms=200) if r.value]
        assert sorted(got) == sorted(f"s{i}" for i in range(20))
        time.sleep(2 * SESSION_MS / 1000)   # the caller's processing; heartbeats go on
        assert not consumer.poll(timeout_ms=200) and len(consumer.assignment()) == 2
        consumer.commit()
        positions = {tp: consumer.position(tp) for tp in consumer.assignment()}
        assert consumer.committed() == positions
    finally:
        consumer.close()


@pytest.mark.parametrize("strategy", ["cooperative-sticky", "range"])
def test_a_member_joining_a_busy_group(cluster: Cluster, strategy: str) -> None:
    """A fourth member joins three that are reading while records keep coming. Each record
    is read exactly once (a revoked partition's position is committed before it moves, and its
    next owner starts there). Cooperative: members give up only the partitions that move
    (on_revoke never names one they keep) and keep reading the rest through the rebalance;
    eager: every member gives up everything first."""
    topic, group = f"sdk-join-{strategy}", f"sdk-join-{strategy}-g"
    cluster.create_topic(topic, partitions=6)

    async def run() -> None:
        revoked: dict[str, list[set[TopicPartition]]] = {n: [] for n in "abcd"}

        def on_revoke(name: str) -> Any:
            return lambda tps: revoked[name].append(set(tps))
        consumers = {n: group_consumer(cluster, group, partition_assignment_strategy=strategy,
                                       auto_commit_interval_ms=200) for n in "abc"}
        got: dict[str, list[tuple[int, int, str]]] = {n: [] for n in "abcd"}
        try:
            for name, consumer in consumers.items():
                await consumer.subscribe(topic, on_revoke=on_revoke(name))
            await wait_split(consumers, 6)
            before = {n: c.assignment() for n, c in consumers.items()}
            for n in "abc":
                revoked[n].clear()   # (the first members' rebalances while the group formed)
            values = [f"j{i}" for i in range(600)]
            producing = asyncio.create_task(produce(cluster, topic, values, 6))
            await drain(consumers, got, 100)
            consumers["d"] = group_consumer(cluster, group, partition_assignment_strategy=strategy,
                                            auto_commit_interval_ms=200)
            await consumers["d"].subscribe(topic, on_revoke=on_revoke("d"))
            await producing
            await drain(consumers, got, 600)
            deadline = time.monotonic() + 30
            while not (consumers["d"].assignment() and
                       sorted(tp.partition for c in consumers.values() for tp in c.assignment()) == list(range(6))):
                assert time.monotonic() < deadline, "the fourth member never got partitions"
                for name, consumer in consumers.items():
                    got[name] += [(r.partition, r.offset, r.value.decode()) for r in await consumer.poll(timeout_ms=50)]
            seen = [v for records in got.values() for _, _, v in records]
            assert sorted(seen) == sorted(values), f"{len(seen) - len(set(seen))} read twice, " \
                                                   f"{len(set(values) - set(seen))} never read"
            after = {n: c.assignment() for n, c in consumers.items()}
            for n in "abc":
                gave_up = set().union(*revoked[n]) if revoked[n] else set()
                if strategy == "cooperative-sticky":
                    assert not gave_up & after[n], f"{n} revoked {gave_up & after[n]}, which it kept"
                    assert gave_up == before[n] - after[n], (n, gave_up, before[n], after[n])
                else:
                    assert gave_up == before[n], f"eager: {n} gave up {gave_up}, not all of {before[n]}"
            assert any(revoked[n] for n in "abc"), "no partition moved to the new member"
        finally:
            for consumer in consumers.values():
                await consumer.close()
    asyncio.run(run())


def test_group_survives_its_coordinator_killed(cluster: Cluster) -> None:
    """The broker coordinating the group is killed with kill -9 while two members read and
    auto-commit: they find the new coordinator (NOT_COORDINATOR, loads, rejoins) and go on;
    every record is read, nothing skipped; the committed offsets reach the ends again."""
    from dataplane.groups.placement import OFFSETS_TOPIC, partition_for
    topic, group = "sdk-coordinator", "sdk-coordinator-g"
    cluster.create_topic(topic, partitions=4)
    offsets_partition = partition_for(group, 4)
    coordinator: int | None = None

    async def run() -> None:
        nonlocal coordinator
        consumers = {n: group_consumer(cluster, group, auto_commit_interval_ms=200) for n in "ab"}
        got: dict[str, list[tuple[int, int, str]]] = {n: [] for n in consumers}
        try:
            for consumer in consumers.values():
                await consumer.subscribe(topic)
            await wait_split(consumers, 4)
            await produce(cluster, topic, [f"k{i}" for i in range(200)], 4)
            await drain(consumers, got, 200)
            coordinator = cluster.wait_leader(OFFSETS_TOPIC, offsets_partition)
            cluster.brokers[coordinator].kill()
            await produce(cluster, topic, [f"l{i}" for i in range(200)], 4)
            deadline = time.monotonic() + 60
            while len({v for records in got.values() for _, _, v in records}) < 400:
                assert time.monotonic() < deadline, "the group did not read on after its coordinator died"
                for name, consumer in consumers.items():
                    got[name] += [(r.partition, r.offset, r.value.decode()) for r in await consumer.poll(timeout_ms=50)]
            assert cluster.wait_leader(OFFSETS_TOPIC, offsets_partition, not_broker=coordinator) != coordinator
            for consumer in consumers.values():
                await consumer.commit()
            tps = [TopicPartition(topic, p) for p in range(4)]
            ends = await consumers["a"].end_offsets(tps)
            assert await consumers["a"].committed(tps) == ends
        finally:
            for consumer in consumers.values():
                await consumer.close()
    try:
        asyncio.run(run())
    finally:
        if coordinator is not None:
            cluster.restart(coordinator, kill=True)


def test_a_static_member_restarted_within_its_session_keeps_its_partitions(cluster: Cluster) -> None:
    """A member with a group_instance_id closes without leaving the group; a new consumer with the
    same instance id, started within the session timeout, gets the same partitions back at its
    commits, and the other member sees no rebalance (its generation stays)."""
    topic, group = "sdk-static", "sdk-static-g"
    cluster.create_topic(topic, partitions=4)

    async def run() -> None:
        static = group_consumer(cluster, group, group_instance_id="host-1", session_timeout_ms=10_000,
                                partition_assignment_strategy="range")
        other = group_consumer(cluster, group, partition_assignment_strategy="range")
        consumers = {"static": static, "other": other}
        try:
            for consumer in consumers.values():
                await consumer.subscribe(topic)
            await wait_split(consumers, 4)
            held = static.assignment()
            await produce(cluster, topic, [f"s{i}" for i in range(100)], 4)
            got: dict[str, list[tuple[int, int, str]]] = {n: [] for n in consumers}
            await drain(consumers, got, 100)
            assert other._group is not None
            generation = other._group.core.generation_id
            await static.close()   # commits; a static member does not leave
            consumers["static"] = group_consumer(cluster, group, group_instance_id="host-1",
                                                 session_timeout_ms=10_000, partition_assignment_strategy="range")
            await consumers["static"].subscribe(topic)
            deadline = time.monotonic() + 20
            while consumers["static"].assignment() != held:
                assert time.monotonic() < deadline, "the restarted static member did not get its partitions back"
                for consumer in consumers.values():
                    assert not await consumer.poll(timeout_ms=50), "records read again after a clean restart"
            positions = {tp: consumers["static"].position(tp) for tp in held}
            ends = await other.end_offsets(sorted(held))
            assert positions == ends, "the restarted member did not start at its commits"
            for _ in range(10):
                await other.poll(timeout_ms=100)
            assert other._group.core.generation_id == generation and len(other.assignment()) == 2, \
                "the other member went through a rebalance"
        finally:
            for consumer in consumers.values():
                await consumer.close()
    asyncio.run(run())


def test_iterating_then_breaking_commits_exactly_what_was_handed_out(cluster: Cluster) -> None:
    """`async for` in a group hands out one record at a time: after a break, close() commits
    the offset after the last record the loop body saw in each partition, not the rest of a
    fetched batch, so the next member starts at the first record nobody processed."""
    topic, group = "sdk-iterate", "sdk-iterate-g"
    cluster.create_topic(topic, partitions=2)

    async def run() -> None:
        await produce(cluster, topic, [f"i{i}" for i in range(400)], 2)
        seen: dict[int, int] = {}
        async with group_consumer(cluster, group) as consumer:
            await consumer.subscribe(topic)
            count = 0
            async for record in consumer:
                seen[record.partition] = record.offset
                count += 1
                if count == 137:
                    break
        async with group_consumer(cluster, group) as probe:
            committed = await probe.committed([TopicPartition(topic, p) for p in range(2)])
        for p in range(2):
            # A partition the loop saw nothing of is committed at its start (0), if at all.
            expected = (seen[p] + 1,) if p in seen else (0, None)
            assert committed[TopicPartition(topic, p)] in expected, \
                f"partition {p}: committed {committed[TopicPartition(topic, p)]}, the loop saw up to {seen.get(p)}"
        assert seen, "the loop saw nothing"
    asyncio.run(run())
