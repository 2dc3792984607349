"""Consumer groups with unmodified Kafka clients against Biplane's coordinator.

librdkafka (confluent-kafka, kcat), kafka-python and aiokafka join groups, share a
topic's partitions, commit and resume from their commits; a member killed with kill -9
loses its partitions to the others once its session times out; a static member restarts
into its old place without a rebalance; cooperative-sticky moves only what it must;
Biplane's own listener serves the same coordinator; the coordinator's broker killed with
kill -9 while offsets are committed loses no acknowledged commit.
"""
from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from cluster_harness import Cluster, make_batch, produce_request
from dataplane.groups.placement import OFFSETS_TOPIC, partition_for

pytestmark = pytest.mark.slow

confluent_kafka = pytest.importorskip("confluent_kafka")
import confluent_kafka.admin  # noqa: E402  (DescribeGroups through the AdminClient)

OFFSETS_PARTITIONS = 4
SESSION_MS = 3000
BROKER_ARGS = ["--group-offsets-partitions", str(OFFSETS_PARTITIONS), "--group-initial-rebalance-delay-ms", "300",
               "--group-min-session-timeout-ms", "1000"]
MEMBER = Path(__file__).with_name("kafka_group_member.py")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("groups"), brokers=3, broker_args=BROKER_ARGS) as c:
        yield c


def produce(bootstrap: str, topic: str, values: list[str], partitions: int) -> None:
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for i, value in enumerate(values):
        producer.produce(topic, value=value.encode(), partition=i % partitions)
    assert producer.flush(30) == 0


def consumer(bootstrap: str, group: str, **extra: object) -> "confluent_kafka.Consumer":
    return confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                                     "auto.offset.reset": "earliest", "enable.auto.commit": False,
                                     "session.timeout.ms": SESSION_MS, "heartbeat.interval.ms": 500, **extra})


def describe(bootstrap: str, group: str) -> "confluent_kafka.ConsumerGroupDescription":
    """The group as DescribeGroups has it; asked again while its coordinator moves or loads
    (librdkafka's admin client leaves retriable errors to its caller)."""
    admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + 30
    while True:
        try:
            return admin.describe_consumer_groups([group])[group].result(timeout=20)
        except confluent_kafka.KafkaException as exc:
            if not exc.args[0].retriable() or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


class Member:
    """A kafka_group_member.py process; its output read on a thread."""

    def __init__(self, bootstrap: str, group: str, topic: str) -> None:
        self.proc = subprocess.Popen([sys.executable, str(MEMBER), bootstrap, group, topic, str(SESSION_MS)],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                     env={**os.environ})
        self.records: list[tuple[int, int, str]] = []
        self.assigned: list[int] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            kind, _, rest = line.strip().partition(" ")
            if kind == "record":
                p, o, v = rest.split(" ", 2)
                self.records.append((int(p), int(o), v))
            elif kind == "assigned":
                self.assigned = [int(p) for p in rest.split(",") if p]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


def poll_into(c: "confluent_kafka.Consumer", into: list[tuple[int, int, str]], seconds: float) -> None:
    """Poll for `seconds`, committing each record after taking it."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        m = c.poll(0.1)
        if m is None or m.error() is not None:
            continue
        into.append((m.partition(), m.offset(), m.value().decode()))
        c.commit(message=m, asynchronous=False)


def test_confluent_group_shares_partitions_and_survives_a_member_kill(cluster: Cluster) -> None:
    """Three members (one a process of its own) split a 6-partition topic and read every
    record once; the process is killed with kill -9, its partitions move to the other two
    once its session times out, and they resume at its commits: nothing skipped."""
    bootstrap, topic, group = cluster.kafka_bootstrap, "grp-ck", "ck-group"
    cluster.create_topic(topic, partitions=6)
    a, b = consumer(bootstrap, group), consumer(bootstrap, group)
    member = Member(bootstrap, group, topic)
    got_a: list[tuple[int, int, str]] = []
    got_b: list[tuple[int, int, str]] = []
    try:
        a.subscribe([topic])
        b.subscribe([topic])
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            poll_into(a, got_a, 0.2)
            poll_into(b, got_b, 0.2)
            if len(a.assignment()) + len(b.assignment()) + len(member.assigned) == 6 and member.assigned \
                    and a.assignment() and b.assignment():
                break
        else:
            raise AssertionError(f"the group never split 6 partitions three ways: {a.assignment()}, "
                                 f"{b.assignment()}, {member.assigned}")
        members = describe(bootstrap, group).members
        assert len(members) == 3
        # Kafka's form of a member's host ("/" and its address); it was empty.
        assert {m.host for m in members} == {"/127.0.0.1"}, [m.host for m in members]
        first = [f"first-{i}" for i in range(300)]
        produce(bootstrap, topic, first, 6)
        deadline = time.monotonic() + 40
        while len(got_a) + len(got_b) + len(member.records) < 300 and time.monotonic() < deadline:
            poll_into(a, got_a, 0.2)
            poll_into(b, got_b, 0.2)
        seen = [v for _, _, v in got_a + got_b + member.records]
        assert sorted(seen) == sorted(first), "each record read exactly once across the three members"

        moved = set(member.assigned)
        member.kill()
        killed_at = time.monotonic()
        while {tp.partition for tp in a.assignment() + b.assignment()} != set(range(6)):
            assert time.monotonic() - killed_at < 30, "the killed member's partitions never moved"
            poll_into(a, got_a, 0.2)
            poll_into(b, got_b, 0.2)
        move_s = time.monotonic() - killed_at
        # The coordinator noticed the session timing out (no leave was sent), so the move
        # took at least about that long.
        assert move_s > SESSION_MS / 1000 * 0.5, move_s
        committed = {tp.partition: tp.offset for tp in a.committed(
            [confluent_kafka.TopicPartition(topic, p) for p in moved], timeout=20)}
        last_read = {}
        for p, o, _ in member.records:
            last_read[p] = max(last_read.get(p, -1), o)
        for p in moved:
            # The member commits after printing: its commit is its last record, or the one before.
            assert committed[p] in (last_read[p], last_read[p] + 1), (p, committed[p], last_read[p])

        before_a, before_b = len(got_a), len(got_b)
        second = [f"second-{i}" for i in range(300)]
        produce(bootstrap, topic, second, 6)
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            poll_into(a, got_a, 0.2)
            poll_into(b, got_b, 0.2)
            if len({v for _, _, v in got_a + got_b} & set(second)) == 300:
                break
        after = got_a[before_a:] + got_b[before_b:]
        assert set(second) <= {v for _, _, v in after}, "every new record read"
        # The moved partitions resumed at the killed member's commits: no record skipped. (No
        # record was produced before the three-way split, so a and b read these partitions
        # only after the kill.)
        for p in moved:
            resumed = min(o for q, o, _ in got_a + got_b if q == p)
            assert resumed == committed[p], (p, resumed, committed[p])
        everything = [v for _, _, v in got_a + got_b + member.records]
        assert set(everything) == set(first) | set(second)
        assert len(everything) - len(set(everything)) <= len(moved), "at most one redelivery per moved partition"
    finally:
        member.kill()
        a.close()
        b.close()


def test_confluent_commit_and_resume(cluster: Cluster) -> None:
    """A member commits half the topic and leaves; the next member of the group starts
    at the commit, and a consumer of another group starts from the beginning."""
    bootstrap, topic = cluster.kafka_bootstrap, "grp-resume"
    cluster.create_topic(topic, partitions=2)
    produce(bootstrap, topic, [f"v{i}" for i in range(40)], 2)
    c = consumer(bootstrap, "resume")
    c.subscribe([topic])
    got: list[tuple[int, int, str]] = []
    deadline = time.monotonic() + 30
    while len(got) < 20 and time.monotonic() < deadline:
        m = c.poll(0.2)
        if m is not None and m.error() is None:
            got.append((m.partition(), m.offset(), m.value().decode()))
            c.commit(message=m, asynchronous=False)
    c.close()
    assert len(got) == 20
    d = consumer(bootstrap, "resume")
    d.subscribe([topic])
    rest: list[tuple[int, int, str]] = []
    deadline = time.monotonic() + 30
    while len(rest) < 20 and time.monotonic() < deadline:
        m = d.poll(0.2)
        if m is not None and m.error() is None:
            rest.append((m.partition(), m.offset(), m.value().decode()))
    assert d.poll(1.0) is None
    d.close()
    assert sorted(v for *_, v in got + rest) == sorted(f"v{i}" for i in range(40))


def test_deleting_a_topic_drops_its_committed_offsets(cluster: Cluster) -> None:
    """Kafka's rule: a deleted topic's offsets go from every group, so the group reads a topic
    created again under that name from its reset policy. Before, the old commit (4) stayed and
    the group skipped the new topic's first records."""
    from confluent_kafka.admin import AdminClient, NewTopic
    bootstrap, topic = cluster.kafka_bootstrap, "grp-deleted"
    cluster.create_topic(topic, partitions=1)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    c = consumer(bootstrap, "deleted")
    tp = confluent_kafka.TopicPartition(topic, 0, 4)
    c.commit(offsets=[tp], asynchronous=False)
    assert c.committed([confluent_kafka.TopicPartition(topic, 0)], timeout=10)[0].offset == 4
    admin.delete_topics([topic])[topic].result(30)
    deadline = time.monotonic() + 30
    while c.committed([confluent_kafka.TopicPartition(topic, 0)], timeout=10)[0].offset == 4:
        assert time.monotonic() < deadline, "the deleted topic's offset is still committed"
        time.sleep(0.2)
    c.close()
    admin.create_topics([NewTopic(topic, 1, 3)])[topic].result(30)
    cluster.wait_leader(topic, 0)
    produce(bootstrap, topic, [f"n{i}" for i in range(10)], 1)
    d = consumer(bootstrap, "deleted")
    d.subscribe([topic])
    got: list[str] = []
    deadline = time.monotonic() + 30
    while len(got) < 10 and time.monotonic() < deadline:
        m = d.poll(0.2)
        if m is not None and m.error() is None:
            got.append(m.value().decode())
    d.close()
    assert got == [f"n{i}" for i in range(10)]


def test_the_offsets_topic_cannot_be_deleted_or_grown_by_a_client(cluster: Cluster) -> None:
    """An AdminClient deleted __consumer_offsets (every group's commits gone) and added
    partitions to it (groups moved to partitions without their records). Both are refused
    with Kafka's INVALID_TOPIC_EXCEPTION, and a group's commit is still there afterwards."""
    bootstrap, topic = cluster.kafka_bootstrap, "grp-guard"
    cluster.create_topic(topic, partitions=1)
    admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": bootstrap})
    tp = confluent_kafka.TopicPartition(topic, 0, 7)
    request = confluent_kafka.ConsumerGroupTopicPartitions("guard", [tp])
    deadline = time.monotonic() + 30
    while True:   # the first group call of a cluster creates the offsets topic: loading, retriable
        done = admin.alter_consumer_group_offsets([request])["guard"].result(20).topic_partitions
        if done[0].error is None or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert done[0].error is None, done[0].error
    with pytest.raises(confluent_kafka.KafkaException) as deleted:
        admin.delete_topics([OFFSETS_TOPIC], operation_timeout=10)[OFFSETS_TOPIC].result(20)
    assert deleted.value.args[0].code() == confluent_kafka.KafkaError.TOPIC_EXCEPTION, deleted.value
    grow = confluent_kafka.admin.NewPartitions(OFFSETS_TOPIC, 64)
    with pytest.raises(confluent_kafka.KafkaException) as grown:
        admin.create_partitions([grow], operation_timeout=10)[OFFSETS_TOPIC].result(20)
    assert grown.value.args[0].code() == confluent_kafka.KafkaError.TOPIC_EXCEPTION, grown.value
    assert "internal" in grown.value.args[0].str()   # CreatePartitions answers carry the message
    made = admin.create_topics([confluent_kafka.admin.NewTopic(OFFSETS_TOPIC, 1, 1)], operation_timeout=10)
    with pytest.raises(confluent_kafka.KafkaException) as created:
        made[OFFSETS_TOPIC].result(20)
    assert created.value.args[0].code() == confluent_kafka.KafkaError.TOPIC_EXCEPTION, created.value
    policy = confluent_kafka.admin.ConfigResource(confluent_kafka.admin.ResourceType.TOPIC, OFFSETS_TOPIC,
                                                  set_config={"cleanup.policy": "delete"})
    with pytest.raises(confluent_kafka.KafkaException) as altered:
        admin.alter_configs([policy])[policy].result(20)
    assert altered.value.args[0].code() == confluent_kafka.KafkaError.INVALID_CONFIG, altered.value
    read = admin.list_consumer_group_offsets([confluent_kafka.ConsumerGroupTopicPartitions(
        "guard", [confluent_kafka.TopicPartition(topic, 0)])])
    committed = read["guard"].result(20).topic_partitions
    assert [(p.topic, p.partition, p.offset) for p in committed] == [(topic, 0, 7)]
    # ListGroups v4: each group's state, and the filter by state (librdkafka showed UNKNOWN).
    empty = confluent_kafka.ConsumerGroupState.EMPTY
    listed = admin.list_consumer_groups(states={empty}).result(20).valid
    assert [(g.group_id, g.state) for g in listed if g.group_id == "guard"] == [("guard", empty)]
    stable = admin.list_consumer_groups(states={confluent_kafka.ConsumerGroupState.STABLE}).result(20).valid
    assert "guard" not in {g.group_id for g in stable}


class PolledConsumer:
    """A kafka-python consumer polled from a thread of its own, as an application runs one:
    each poll's records are committed before the next poll.

    Two consumers polled in turn from one thread can rebalance forever, against Kafka as
    against Biplane. kafka-python (3.0) keeps a JoinGroup/SyncGroup round that outlives a
    poll's timeout running, but the next poll that finds it finished sends a new JoinGroup
    instead of taking the round's assignment. From the group's leader, a JoinGroup to a
    Stable group starts a rebalance (Kafka's rule: it is how a leader asks to reassign), the
    other consumer's heartbeat learns of it and it rejoins in its own poll, and that
    completes the round: the leader's answers arrive while the other consumer is polled,
    so the leader drops them again."""

    def __init__(self, kafka: Any, topic: str, config: dict[str, Any]) -> None:
        owner = self

        class Counting(kafka.ConsumerRebalanceListener):  # type: ignore[misc]
            def on_partitions_revoked(self, revoked: object) -> None:
                pass

            def on_partitions_assigned(self, assigned: object) -> None:
                owner.rebalances += 1

        self.rebalances = 0   # assignments received: one per rebalance this member completed
        self.consumer = kafka.KafkaConsumer(**config)
        self.consumer.subscribe([topic], listener=Counting())
        self.values: list[str] = []
        self.assigned: frozenset[int] = frozenset()
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                batches = self.consumer.poll(timeout_ms=100)
                self.values.extend(r.value.decode() for records in batches.values() for r in records)
                if batches:
                    self.consumer.commit()
                self.assigned = frozenset(tp.partition for tp in self.consumer.assignment())
        except BaseException as exc:
            self.error = exc

    def close(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self.consumer.close()
        if self.error is not None:
            raise self.error


def test_kafka_python_group(cluster: Cluster) -> None:
    """Two kafka-python consumers in one group, each polled by a thread of its own, settle,
    read a 4-partition topic once between them and commit; a third consumer of the group
    afterwards finds nothing left to read."""
    kafka = pytest.importorskip("kafka")
    bootstrap, topic = cluster.kafka_bootstrap, "grp-kp"
    cluster.create_topic(topic, partitions=4)
    common = dict(bootstrap_servers=bootstrap.split(","), group_id="kp-group", auto_offset_reset="earliest",
                  enable_auto_commit=False, session_timeout_ms=6000, heartbeat_interval_ms=500)
    x, y = PolledConsumer(kafka, topic, common), PolledConsumer(kafka, topic, common)
    try:
        # The group settles first, so that the records are read once by their partition's owner.
        deadline = time.monotonic() + 60
        while not (x.assigned and y.assigned and len(x.assigned) + len(y.assigned) == 4):
            if time.monotonic() > deadline or x.error or y.error:
                group = describe(bootstrap, "kp-group")
                raise AssertionError(
                    f"the kafka-python group never split the topic: x {sorted(x.assigned)} after "
                    f"{x.rebalances} rebalances, y {sorted(y.assigned)} after {y.rebalances}; the coordinator "
                    f"has it {group.state} with "
                    f"{[(m.member_id, m.assignment.topic_partitions) for m in group.members]}") from x.error or y.error
            time.sleep(0.1)
        produce(bootstrap, topic, [f"kp{i}" for i in range(200)], 4)
        deadline = time.monotonic() + 40
        while len(x.values) + len(y.values) < 200 and time.monotonic() < deadline and not (x.error or y.error):
            time.sleep(0.1)
    finally:
        try:
            x.close()
        finally:
            y.close()
    assert sorted(x.values + y.values) == sorted(f"kp{i}" for i in range(200))
    assert x.values and y.values, "both members had partitions"
    z = kafka.KafkaConsumer(topic, **common)
    try:
        left = sum(len(rs) for _ in range(10) for rs in z.poll(timeout_ms=300).values())
        assert left == 0 and len(z.assignment()) == 4
    finally:
        z.close()


def test_aiokafka_group(cluster: Cluster) -> None:
    """Two aiokafka consumers in one group read every record once and commit."""
    aiokafka = pytest.importorskip("aiokafka")
    bootstrap, topic = cluster.kafka_bootstrap, "grp-aio"
    cluster.create_topic(topic, partitions=4)

    async def run() -> list[str]:
        consumers = [aiokafka.AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id="aio-group",
                                               auto_offset_reset="earliest", enable_auto_commit=False,
                                               session_timeout_ms=6000, heartbeat_interval_ms=500)
                     for _ in range(2)]
        got: list[str] = []
        for c in consumers:
            await c.start()
        try:
            deadline = time.monotonic() + 40
            while not all(c.assignment() for c in consumers) or \
                    sum(len(c.assignment()) for c in consumers) != 4:   # the group settles first
                assert time.monotonic() < deadline, "the aiokafka group never split the topic"
                await asyncio.sleep(0.1)
            await asyncio.to_thread(produce, bootstrap, topic, [f"aio{i}" for i in range(120)], 4)
            deadline = time.monotonic() + 40
            while len(got) < 120 and time.monotonic() < deadline:
                for c in consumers:
                    batches = await c.getmany(timeout_ms=200)
                    for records in batches.values():
                        got.extend(r.value.decode() for r in records)
                    if batches:
                        await c.commit()
            assert all(c.assignment() for c in consumers), "both members had partitions"
        finally:
            for c in consumers:
                await c.stop()
        return got
    got = asyncio.run(run())
    assert sorted(got) == sorted(f"aio{i}" for i in range(120))


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is not installed (scripts/system-deps.sh)")
def test_kcat_group(cluster: Cluster) -> None:
    """`kcat -G` consumes as a group member and commits as it leaves: a second run of the
    group starts at the commits and reads nothing again."""
    bootstrap, topic = cluster.kafka_bootstrap, "grp-kcat"
    cluster.create_topic(topic, partitions=2)
    produce(bootstrap, topic, [f"kc{i}" for i in range(20)], 2)

    def run_kcat() -> list[str]:
        # No -o: an explicit start offset would override the group's commits.
        out = subprocess.run(["kcat", "-b", bootstrap, "-G", "kcat-group", "-e", "-X", "auto.offset.reset=earliest",
                              "-X", "session.timeout.ms=6000", "-q", topic],
                             capture_output=True, text=True, timeout=60)
        return [line for line in out.stdout.splitlines() if line]
    assert sorted(run_kcat()) == sorted(f"kc{i}" for i in range(20))
    assert run_kcat() == []


def test_biplane_wire_group_calls_reach_the_same_coordinator(cluster: Cluster) -> None:
    """Biplane's own listener serves the group messages: FindCoordinator names the
    leader of the group's offsets partition (Biplane's port), other brokers answer
    NOT_COORDINATOR, and join/sync/commit/fetch/describe/list/leave/delete follow the
    coordinator's rules; a Kafka client then reads the offset committed over Biplane's wire."""
    from common.wire import WireClient
    from common.errors import ErrorCode
    from common.wire import messages as wire

    group, topic = "wire-group", "grp-wire"
    cluster.create_topic(topic, partitions=1)

    async def run() -> None:
        any_broker = await WireClient.connect(*cluster.address(1))
        try:
            found = await any_broker.request(wire.FindCoordinatorRequest(key=group))
            while found.error_code is ErrorCode.COORDINATOR_NOT_AVAILABLE:
                await asyncio.sleep(0.2)
                found = await any_broker.request(wire.FindCoordinatorRequest(key=group))
        finally:
            await any_broker.close()
        assert found.error_code is ErrorCode.NONE
        expected = cluster.partition(OFFSETS_TOPIC, partition_for(group, OFFSETS_PARTITIONS))["leader"]
        assert found.node_id == expected and found.port == cluster.brokers[expected].port
        other = next(b for b in cluster.brokers if b != found.node_id)
        elsewhere = await WireClient.connect(*cluster.address(other))
        coordinator = await WireClient.connect(found.host, found.port)
        try:
            refused = await elsewhere.request(wire.HeartbeatRequest(group_id=group, generation_id=1, member_id="x"))
            assert refused.error_code is ErrorCode.NOT_COORDINATOR
            join = wire.JoinGroupRequest(group_id=group, session_timeout_ms=6000, protocol_type="consumer",
                                         protocols=(wire.JoinGroupProtocol(name="range", metadata=b"sub"),),
                                         client_id="wire-test")
            first = await coordinator.request(join)
            while first.error_code is ErrorCode.COORDINATOR_LOAD_IN_PROGRESS:   # it has just become leader
                await asyncio.sleep(0.1)
                first = await coordinator.request(join)
            assert first.error_code is ErrorCode.MEMBER_ID_REQUIRED and first.member_id
            joined = await coordinator.request(dataclasses.replace(join, member_id=first.member_id))
            assert joined.error_code is ErrorCode.NONE and joined.leader == first.member_id
            assert [m.metadata for m in joined.members] == [b"sub"]
            synced = await coordinator.request(wire.SyncGroupRequest(
                group_id=group, generation_id=joined.generation_id, member_id=joined.member_id,
                assignments=(wire.SyncGroupAssignment(member_id=joined.member_id, assignment=b"all"),)))
            assert synced.error_code is ErrorCode.NONE and synced.assignment == b"all"
            committed = await coordinator.request(wire.OffsetCommitRequest(
                group_id=group, generation_id=joined.generation_id, member_id=joined.member_id,
                topics=(wire.OffsetCommitTopic(topic=topic, partitions=(
                    wire.OffsetCommitPartition(partition=0, committed_offset=7, committed_metadata="m"),)),)))
            assert committed.topics[0].partitions[0].error_code is ErrorCode.NONE
            stale = await coordinator.request(wire.OffsetCommitRequest(
                group_id=group, generation_id=joined.generation_id - 1, member_id=joined.member_id,
                topics=(wire.OffsetCommitTopic(topic=topic, partitions=(
                    wire.OffsetCommitPartition(partition=0, committed_offset=3),)),)))
            assert stale.topics[0].partitions[0].error_code is ErrorCode.ILLEGAL_GENERATION
            fetched = await coordinator.request(wire.OffsetFetchRequest(group_id=group))
            assert [(t.topic, p.committed_offset, p.metadata) for t in fetched.topics for p in t.partitions] == \
                [(topic, 7, "m")]
            described = (await coordinator.request(wire.DescribeGroupsRequest(groups=(group,)))).groups[0]
            assert (described.group_state, described.protocol_data, len(described.members)) == \
                ("Stable", "range", 1)
            assert described.members[0].client_id == "wire-test"
            listed = await coordinator.request(wire.ListGroupsRequest())
            assert group in {g.group_id for g in listed.groups}
            busy = await coordinator.request(wire.DeleteGroupsRequest(groups=(group,)))
            assert busy.results[0].error_code is ErrorCode.NON_EMPTY_GROUP
            left = await coordinator.request(wire.LeaveGroupRequest(group_id=group, members=(
                wire.LeaveGroupMember(member_id=joined.member_id),)))
            assert left.members[0].error_code is ErrorCode.NONE
            # Only the coordinator writes the offsets topic: a client's records are refused.
            p = partition_for(group, OFFSETS_PARTITIONS)
            forged = await coordinator.request(produce_request(OFFSETS_TOPIC, p, make_batch([b"x"])))
            assert forged.topics[0].partitions[0].error_code is ErrorCode.INVALID_TOPIC
        finally:
            await elsewhere.close()
            await coordinator.close()

    asyncio.run(run())
    # The same offsets, through the Kafka listener.
    c = confluent_kafka.Consumer({"bootstrap.servers": cluster.kafka_bootstrap, "group.id": group})
    try:
        assert c.committed([confluent_kafka.TopicPartition(topic, 0)], timeout=20)[0].offset == 7
    finally:
        c.close()


def test_confluent_cooperative_sticky_moves_only_what_it_must(cluster: Cluster) -> None:
    """librdkafka's cooperative-sticky assignor over the classic protocol (incremental
    rebalances are the clients' own: a member revokes part of its partitions, then rejoins
    with what it still owns): when a second member joins, the first gives up half of its
    partitions and keeps the other half without a revocation."""
    bootstrap, topic = cluster.kafka_bootstrap, "grp-coop"
    cluster.create_topic(topic, partitions=6)
    revoked: dict[str, list[int]] = {"a": [], "b": []}

    def member(name: str) -> "confluent_kafka.Consumer":
        c = consumer(bootstrap, "coop-group", **{"partition.assignment.strategy": "cooperative-sticky"})
        c.subscribe([topic], on_revoke=lambda _, ps: revoked[name].extend(p.partition for p in ps))
        return c
    a = member("a")
    b: "confluent_kafka.Consumer | None" = None
    try:
        deadline = time.monotonic() + 30
        while len(a.assignment()) != 6:
            assert time.monotonic() < deadline, "the first member never got all 6 partitions"
            a.poll(0.1)
        b = member("b")
        while not (a.assignment() and b.assignment() and len(a.assignment()) + len(b.assignment()) == 6):
            assert time.monotonic() < deadline + 30, "the two members never split the topic"
            a.poll(0.1)
            b.poll(0.1)
        kept = {tp.partition for tp in a.assignment()}
        assert len(kept) == 3 and sorted(revoked["a"]) == sorted(set(range(6)) - kept), (kept, revoked)
        assert {tp.partition for tp in b.assignment()} == set(range(6)) - kept
    finally:
        a.close()
        if b is not None:
            b.close()


def test_confluent_static_member_restart_keeps_its_partitions_without_a_rebalance(cluster: Cluster) -> None:
    """Static membership (group.instance.id): a member closed without leaving and started
    again under the same instance id before its session times out takes its old place
    under a new member id; the other member is not asked to give anything up."""
    bootstrap, topic, group = cluster.kafka_bootstrap, "grp-static", "static-group"
    cluster.create_topic(topic, partitions=4)
    revoked: list[list[int]] = []

    def static(instance: str, **callbacks: object) -> "confluent_kafka.Consumer":
        c = consumer(bootstrap, group, **{"group.instance.id": instance, "session.timeout.ms": 20_000})
        c.subscribe([topic], **callbacks)
        return c
    a = static("a", on_revoke=lambda c, ps: revoked.append([p.partition for p in ps]))
    b = static("b")
    try:
        deadline = time.monotonic() + 40
        while not (a.assignment() and b.assignment() and len(a.assignment()) + len(b.assignment()) == 4):
            assert time.monotonic() < deadline, "the static group never formed"
            a.poll(0.1)
            b.poll(0.1)
        held_a, held_b = sorted(tp.partition for tp in a.assignment()), sorted(tp.partition for tp in b.assignment())
        before = {m.group_instance_id: m.member_id for m in describe(bootstrap, group).members}
        revoked.clear()
        b.close()   # a static member does not leave on close
        b = static("b")
        started = time.monotonic()
        while not b.assignment():
            assert time.monotonic() - started < 15, "the restarted static member got nothing back"
            a.poll(0.1)
            b.poll(0.1)
        after = {m.group_instance_id: m.member_id for m in describe(bootstrap, group).members}
        assert sorted(tp.partition for tp in b.assignment()) == held_b
        assert sorted(tp.partition for tp in a.assignment()) == held_a and revoked == []
        assert after["a"] == before["a"] and after["b"] != before["b"], (before, after)
    finally:
        a.close()
        b.close()


# Last: it kills a broker, and leaderships move for a while after its restart.
def test_coordinator_kill_loses_no_acknowledged_commit(cluster: Cluster) -> None:
    """Offsets are committed one after another while the group's coordinator broker is
    killed with kill -9; afterwards the stored offset is the last acknowledged commit or a
    later one whose answer was lost, never an earlier one."""
    bootstrap, topic, group = cluster.kafka_bootstrap, "grp-kill", "kill-group"
    cluster.create_topic(topic, partitions=1)
    partition = partition_for(group, OFFSETS_PARTITIONS)
    c = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                                  "socket.timeout.ms": 5000})
    c.assign([confluent_kafka.TopicPartition(topic, 0, 0)])
    acked: list[int] = []
    attempted: list[int] = []
    coordinator = None
    try:
        offset = 0
        started = time.monotonic()
        while time.monotonic() - started < 12:
            offset += 1
            attempted.append(offset)
            if coordinator is None and offset == 50:
                coordinator = cluster.wait_leader(OFFSETS_TOPIC, partition)
                cluster.brokers[coordinator].kill()
            try:
                c.commit(offsets=[confluent_kafka.TopicPartition(topic, 0, offset)], asynchronous=False)
                acked.append(offset)
            except confluent_kafka.KafkaException:
                time.sleep(0.1)   # the coordinator moving: the client retries with the next one
        assert coordinator is not None
        # The group has a new coordinator: its offsets partition has another leader.
        assert cluster.wait_leader(OFFSETS_TOPIC, partition, not_broker=coordinator) != coordinator
        assert acked and acked[-1] > 50, f"commits went on after the kill: last acknowledged {acked[-1:]}"
        stored = c.committed([confluent_kafka.TopicPartition(topic, 0)], timeout=20)[0].offset
        later = [o for o in attempted if o > acked[-1]]
        assert stored == acked[-1] or stored in later, (stored, acked[-1], later)
    finally:
        c.close()
        if coordinator is not None:
            cluster.restart(coordinator, kill=True)
