"""Unit tests of every controller decision (pure functions over image, sessions, time)."""
from __future__ import annotations

import random
from collections import Counter

import pytest

from common.errors import (
    ErrorCode,
    IneligibleReplicaError,
    InvalidConfigError,
    InvalidFieldError,
    InvalidReplicationFactorError,
    InvalidTopicError,
    NotLeaderError,
    StaleBrokerError,
    StaleEpochError,
    TopicExistsError,
    UnknownBrokerError,
    UnknownTopicOrPartitionError,
)
from common.metadata import (
    AlterTopicConfig,
    ConfigChange,
    CreateTopic,
    DeleteTopic,
    FenceBroker,
    MetadataImage,
    PartitionChange,
    PartitionRecord,
    ProducerIdBlock,
    RecordRejected,
    RegisterBroker,
    UnfenceBroker,
)
from common.requests import (
    AllocateProducerIdsRequest,
    AlterConfigRequest,
    AlterIsrRequest,
    CreateTopicRequest,
    ElectionReport,
    HeartbeatRequest,
    ReassignmentRequest,
    RegisterBrokerRequest,
)
from controller.decisions import (
    BrokerSessions,
    ControllerState,
    Hearing,
    QuorumElectionTracker,
    IntervalTimer,
    LeaderImbalanceCheck,
    LeaderSettings,
    Link,
    allocate_producer_ids,
    alter_config,
    alter_isr,
    cancel_reassignment,
    check_heartbeat,
    create_topic,
    delete_topic,
    elect_imbalanced,
    elect_isr_leader,
    elect_leaders,
    elect_preferred,
    elect_quorum,
    fence_expired,
    fence_for_election,
    fence_shutting_down,
    ideal_leader,
    leader_imbalance,
    move_fenced_leaders,
    periodic,
    place_replicas,
    progress_reassignments,
    register_broker,
    start_reassignment,
    unfence_ready,
)
from controller.core import AlterIsr, ControllerCore, Tick
from controller.decisions.elections import best_report, best_report_oracle
from metadata_builders import add_broker, add_topic, apply, cluster


def heartbeat_all(image: MetadataImage, sessions: BrokerSessions, now_ms: int,
                  skip: tuple[int, ...] = ()) -> None:
    for b, info in image.brokers.items():
        if b not in skip:
            sessions.heartbeat(b, info.incarnation_id, now_ms, image.offset)


def isr_change(image, tp, isr):
    p = image.partition(*tp)
    apply(image, [PartitionChange(topic=tp[0], partition=tp[1], isr=tuple(isr),
                                  expected_partition_epoch=p.partition_epoch)])


# ---- topics and placement -----------------------------------------------------

def test_create_topic_emits_topic_then_each_partition():
    image = cluster(3)
    records = create_topic(image, CreateTopicRequest(name="orders", partitions=4,
                                                     replication_factor=2,
                                                     config={"retention.ms": "1000"}), 42)
    assert isinstance(records[0], CreateTopic) and records[0].at_ms == 42
    assert records[0].config.retention_ms == 1000 and records[0].config.partitions == 4
    parts = records[1:]
    assert [type(r) for r in parts] == [PartitionRecord] * 4
    for r in parts:
        assert len(r.replicas) == 2 and r.leader == r.replicas[0] and r.isr == r.replicas
    apply(image, records)
    assert image.topics["orders"].partition_count == 4


def test_create_topic_is_deterministic():
    image = cluster(5)
    req = CreateTopicRequest(name="t", partitions=8, replication_factor=3)
    assert create_topic(image, req, 7) == create_topic(image.copy(), req, 7)


def test_existing_topic_is_refused():
    image = cluster(1)
    add_topic(image, "t", [[1]])
    with pytest.raises(TopicExistsError) as exc:
        create_topic(image, CreateTopicRequest(name="t"), 0)
    assert exc.value.code == ErrorCode.TOPIC_ALREADY_EXISTS


def test_a_name_that_differs_only_in_dots_and_underscores_is_refused_as_kafka_does():
    image = cluster(1)
    add_topic(image, "t.dot_x", [[1]])
    for name in ("t_dot_x", "t.dot.x", "t_dot.x"):
        with pytest.raises(InvalidFieldError) as exc:
            create_topic(image, CreateTopicRequest(name=name), 0)
        assert exc.value.code == ErrorCode.INVALID_TOPIC and "collides with existing topic t.dot_x" in str(exc.value)
    assert create_topic(image, CreateTopicRequest(name="t.dot-x"), 0)


def test_rf_above_unfenced_brokers_names_both_numbers():
    image = cluster(3)
    apply(image, [FenceBroker(broker_id=3, at_ms=0)])
    with pytest.raises(InvalidReplicationFactorError) as exc:
        create_topic(image, CreateTopicRequest(name="t", replication_factor=3), 0)
    assert "replication_factor 3" in str(exc.value) and "2 available" in str(exc.value)
    assert exc.value.code == ErrorCode.INVALID_REPLICATION_FACTOR


def test_bad_topic_name_and_bad_config_are_refused():
    image = cluster(3)
    with pytest.raises(InvalidTopicError):
        create_topic(image, CreateTopicRequest(name="no spaces"), 0)
    with pytest.raises(InvalidConfigError) as exc:
        create_topic(image, CreateTopicRequest(name="q", replication_factor=3,
                                               config={"commit_policy": "quorum",
                                                       "quorum_required_acks": 1}), 0)
    assert exc.value.field == "quorum_required_acks"


def test_replica_assignment_must_agree_and_name_registered_brokers():
    image = cluster(3)
    with pytest.raises(InvalidReplicationFactorError):
        create_topic(image, CreateTopicRequest(name="t", replica_assignment=[[1, 2], [3]]), 0)
    with pytest.raises(UnknownBrokerError) as exc:
        create_topic(image, CreateTopicRequest(name="t", replica_assignment=[[1, 9]]), 0)
    assert exc.value.field == "replica_assignment" and exc.value.value == 9
    records = create_topic(image, CreateTopicRequest(name="t", replica_assignment=[[3, 1]]), 0)
    assert records[1].replicas == (3, 1) and records[0].config.replication_factor == 2


def test_placement_is_rack_aware():
    """Three racks, RF 3: every partition has one replica on each rack."""
    image = cluster(6, racks=["a", "a", "b", "b", "c", "c"])
    racks = {b: i.rack for b, i in image.brokers.items()}
    for replicas in place_replicas(image, topic="t", partitions=12, replication_factor=3):
        assert sorted(racks[b] for b in replicas) == ["a", "b", "c"]


def test_placement_uses_both_racks_when_rf_exceeds_racks():
    image = cluster(4, racks=["a", "a", "b", "b"])
    racks = {b: i.rack for b, i in image.brokers.items()}
    for replicas in place_replicas(image, topic="t", partitions=6, replication_factor=3):
        assert {racks[b] for b in replicas} == {"a", "b"}


def test_placement_balance_against_oracle():
    """Over random clusters (seeds 0..199): leader and replica counts per broker differ by
    at most one, the oracle's bound for an even spread, and every list is distinct."""
    for seed in range(200):
        rnd = random.Random(seed)
        n = rnd.randint(1, 8)
        image = cluster(n)
        rf = rnd.randint(1, n)
        partitions = rnd.randint(1, 50)
        a = place_replicas(image, topic=f"t{seed}", partitions=partitions, replication_factor=rf)
        leaders = Counter(r[0] for r in a)
        replicas = Counter(b for r in a for b in r)
        ids = range(1, n + 1)
        # Oracle: an even spread gives each broker floor or ceil of the average.
        assert {leaders[b] for b in ids} <= {partitions // n, -(-partitions // n)}, f"seed={seed}"
        total = partitions * rf
        assert {replicas[b] for b in ids} <= {total // n, -(-total // n)}, f"seed={seed}"
        assert all(len(set(r)) == rf for r in a), f"seed={seed}"


def test_placement_counts_existing_load():
    """A second topic fills the brokers the first one left lighter."""
    image = cluster(3)
    apply(image, create_topic(image, CreateTopicRequest(name="a", partitions=2,
                                                        replication_factor=1), 0))
    apply(image, create_topic(image, CreateTopicRequest(name="b", partitions=1,
                                                        replication_factor=1), 0))
    hosts = Counter(p.replicas[0] for p in image.partitions())
    assert sorted(hosts.values()) == [1, 1, 1]


def test_delete_topic_and_unknown():
    image = cluster(1)
    add_topic(image, "t", [[1]])
    assert delete_topic(image, "t") == [DeleteTopic(name="t", topic_id=image.topics["t"].topic_id)]
    with pytest.raises(UnknownTopicOrPartitionError):
        delete_topic(image, "nope")


def test_the_offsets_topic_is_neither_deleted_nor_grown():
    """Deleting __consumer_offsets lost every group's committed offsets, and adding partitions
    moved groups to partitions without their records (a user's AdminClient did both). Both
    are refused as Kafka refuses them, naming the topic; other topics are unaffected."""
    from common.errors import InvalidTopicError
    from common.metadata.config import OFFSETS_TOPIC
    from common.requests import AddPartitionsRequest
    from controller.decisions import add_partitions
    image = cluster(3)
    add_topic(image, OFFSETS_TOPIC, [[1, 2, 3]])
    with pytest.raises(InvalidTopicError, match="internal.*committed offsets"):
        delete_topic(image, OFFSETS_TOPIC)
    with pytest.raises(InvalidTopicError, match="internal"):
        add_partitions(image, OFFSETS_TOPIC, AddPartitionsRequest(partitions=2))
    add_topic(image, "t", [[1, 2, 3]])
    assert delete_topic(image, "t")
    assert add_partitions(image, "t", AddPartitionsRequest(partitions=2))


def test_the_offsets_topic_stays_compacted_and_its_other_settings_may_change():
    """Retention on the offsets topic deleted groups' last commits: a policy other than compact
    is refused there (and allowed elsewhere); other settings may change, as in Kafka."""
    from common.metadata.config import OFFSETS_TOPIC
    image = cluster(3)
    add_topic(image, OFFSETS_TOPIC, [[1, 2, 3]])
    apply(image, alter_config(image, OFFSETS_TOPIC, AlterConfigRequest(set={"cleanup_policy": "compact"})))
    with pytest.raises(InvalidConfigError, match="must stay cleanup_policy=compact"):
        alter_config(image, OFFSETS_TOPIC, AlterConfigRequest(set={"cleanup_policy": "delete",
                                                                    "retention_ms": 1000}))
    with pytest.raises(InvalidConfigError, match="compact,delete"):
        alter_config(image, OFFSETS_TOPIC, AlterConfigRequest(set={"cleanup_policy": "compact,delete"}))
    assert alter_config(image, OFFSETS_TOPIC, AlterConfigRequest(set={"segment_bytes": 1 << 20}))
    add_topic(image, "t", [[1, 2, 3]])
    assert alter_config(image, "t", AlterConfigRequest(set={"cleanup_policy": "delete"})) == []


def test_alter_config_single_multi_noop_and_errors():
    image = cluster(3)
    add_topic(image, "t", [[1, 2, 3]])
    assert alter_config(image, "t", AlterConfigRequest(set={"retention_ms": 5})) == \
        [ConfigChange(topic="t", key="retention_ms", value=5)]
    multi = alter_config(image, "t", AlterConfigRequest(
        set={"min_insync_replicas": 2, "durability": "write"}))
    assert isinstance(multi[0], AlterTopicConfig)
    apply(image, multi)
    assert image.topics["t"].config.min_insync_replicas == 2
    assert alter_config(image, "t", AlterConfigRequest(set={"min_insync_replicas": 2})) == []
    with pytest.raises(InvalidConfigError) as exc:
        alter_config(image, "t", AlterConfigRequest(set={"retention_ms": 1},
                                                    reset=["retention_ms"]))
    assert exc.value.field == "retention_ms"


@pytest.mark.parametrize("change", [{"commit_policy": "quorum"}, {"replication_mode": "push"},
                                    {"quorum_required_acks": 3}, {"retention_ms": 5, "commit_policy": "quorum"}])
def test_how_a_topic_replicates_and_commits_is_fixed_at_creation(change):
    """Claim: an alter of commit_policy, replication_mode or quorum_required_acks is refused,
    naming the key, both values and what to do; setting the value it has, or resetting a key
    already at its default, changes nothing and is no error."""
    image = cluster(3)
    add_topic(image, "t", [[1, 2, 3]])
    add_topic(image, "q", [[1, 2, 3]], commit_policy="quorum", quorum_required_acks=2)
    name = "q" if "quorum_required_acks" in change else "t"
    with pytest.raises(InvalidConfigError) as refused:
        alter_config(image, name, AlterConfigRequest(set=change))
    key = next(k for k in change if k != "retention_ms")
    assert refused.value.field == key and "fixed at creation" in str(refused.value)
    assert "Create a new topic" in str(refused.value)
    assert alter_config(image, "t", AlterConfigRequest(set={"commit_policy": "isr"})) == []
    assert alter_config(image, "t", AlterConfigRequest(reset=["replication_mode"])) == []
    assert alter_config(image, "q", AlterConfigRequest(set={"quorum_required_acks": 2, "retention_ms": 5})) == \
        [AlterTopicConfig(topic="q", changes={"quorum_required_acks": 2, "retention_ms": 5})]


# ---- sessions: fence, unfence, register ----------------------------------------

def test_expired_broker_is_fenced_loses_leadership_and_leaves_isr():
    image = cluster(3)
    add_topic(image, "t", [[1, 2, 3], [2, 1, 3]])
    sessions = BrokerSessions(session_timeout_ms=1500)
    heartbeat_all(image, sessions, 0)
    heartbeat_all(image, sessions, 1000, skip=(1,))
    assert fence_expired(image, sessions, 1500) == []
    records = fence_expired(image, sessions, 1501)
    assert records[0] == FenceBroker(broker_id=1, at_ms=1501, reason="session expired",
                                     incarnation_id="i0")
    apply(image, records)
    p0, p1 = image.partition("t", 0), image.partition("t", 1)
    assert (p0.leader, p0.isr, p0.leader_epoch) == (2, (2, 3), 1)
    assert (p1.leader, p1.isr, p1.leader_epoch) == (2, (2, 3), 0)
    assert fence_expired(image, sessions, 1600) == []  # idempotent: already fenced


def test_last_isr_member_stays_and_partition_goes_leaderless():
    image = cluster(2)
    add_topic(image, "t", [[1, 2]])
    isr_change(image, ("t", 0), [1])
    sessions = BrokerSessions(session_timeout_ms=100)
    heartbeat_all(image, sessions, 0, skip=(1,))
    apply(image, fence_expired(image, sessions, 50))  # 1 never heartbeated: grace from start
    assert image.partition("t", 0).leader == 1
    heartbeat_all(image, sessions, 101, skip=(1,))
    apply(image, fence_expired(image, sessions, 101))
    p = image.partition("t", 0)
    assert (p.leader, p.isr) == (None, (1,))
    assert elect_isr_leader(image, p) is None  # 2 is out of sync and unclean is off


def test_new_controller_leader_gives_a_full_session_before_fencing():
    image = cluster(2)
    sessions = BrokerSessions(session_timeout_ms=1500)
    assert fence_expired(image, sessions, 10_000) == []  # starts the clock at 10 s
    assert fence_expired(image, sessions, 11_500) == []
    assert len([r for r in fence_expired(image, sessions, 11_501)
                if isinstance(r, FenceBroker)]) == 2


def test_new_controller_leader_waits_for_brokers_still_heartbeating_its_cut_off_predecessor():
    """A controller leader cut from its peers but not from the brokers keeps answering their
    heartbeats until it falls back (leaderFallbackTimeout); the next leader gives brokers it has
    not heard from that long on top of a session (tests/test_gray_failure.py saw every broker
    fenced without it). A broker it has heard from keeps the plain session."""
    image = cluster(2)
    sessions = BrokerSessions(session_timeout_ms=1500, new_leader_grace_ms=3200)
    assert fence_expired(image, sessions, 10_000) == []
    sessions.heartbeat(1, image.brokers[1].incarnation_id, 10_100, image.offset)
    fenced = [r.broker_id for r in fence_expired(image, sessions, 11_601) if isinstance(r, FenceBroker)]
    assert fenced == [1]
    assert [r.broker_id for r in fence_expired(image, sessions, 14_700) if isinstance(r, FenceBroker)] == [1]
    assert sorted(r.broker_id for r in fence_expired(image, sessions, 14_701) if isinstance(r, FenceBroker)) == [1, 2]


def test_unfence_needs_current_incarnation_and_caught_up_metadata():
    image = cluster(1)
    add_broker(image, 2, fenced=True, incarnation="new")
    fenced_at = image.brokers[2].fenced_offset
    sessions = BrokerSessions()
    sessions.heartbeat(2, "old", 0, 10**6)
    assert unfence_ready(image, sessions, 0) == []
    sessions.heartbeat(2, "new", 0, fenced_at - 1)
    assert unfence_ready(image, sessions, 0) == []
    sessions.heartbeat(2, "new", 0, fenced_at)
    assert [type(r) for r in unfence_ready(image, sessions, 0)] == [UnfenceBroker]


def test_controlled_shutdown_fences_at_once_and_is_never_unfenced():
    """A broker heartbeating want_shutdown loses its leaderships and ISR places before
    its session ends, and stays fenced while it keeps heartbeating (even a late heartbeat
    without the flag does not undo it); its next incarnation is unfenced as usual."""
    image = cluster(3)
    add_topic(image, "t", [[1, 2, 3], [2, 1, 3]])
    sessions = BrokerSessions(session_timeout_ms=1500)
    heartbeat_all(image, sessions, 0)
    assert fence_shutting_down(image, sessions, 10) == []
    sessions.heartbeat(1, "i0", 10, image.offset, want_shutdown=True)
    records = fence_shutting_down(image, sessions, 10)
    assert records[0] == FenceBroker(broker_id=1, at_ms=10, reason="controlled shutdown", incarnation_id="i0")
    apply(image, records)
    p0, p1 = image.partition("t", 0), image.partition("t", 1)
    assert (p0.leader, p0.isr) == (2, (2, 3))
    assert (p1.leader, p1.isr) == (2, (2, 3))
    assert fence_shutting_down(image, sessions, 20) == []  # idempotent
    sessions.heartbeat(1, "i0", 30, image.offset)  # sent before the flag, arriving late
    assert unfence_ready(image, sessions, 30) == []
    assert not any(isinstance(r, UnfenceBroker) for r in periodic(image, sessions, QuorumElectionTracker(), 40))
    apply(image, register_broker(image, reg(1, "i1", True), now_ms=50))
    sessions.heartbeat(1, "i1", 60, image.offset)
    assert [type(r) for r in unfence_ready(image, sessions, 60)] == [UnfenceBroker]


def test_periodic_fences_a_broker_shutting_down():
    image = cluster(3)
    add_topic(image, "t", [[1, 2, 3]])
    sessions = BrokerSessions(session_timeout_ms=1500)
    heartbeat_all(image, sessions, 0)
    sessions.heartbeat(1, "i0", 5, image.offset, want_shutdown=True)
    apply(image, periodic(image, sessions, QuorumElectionTracker(), 6))
    assert image.brokers[1].fenced
    assert image.partition("t", 0).leader == 2


def test_heartbeat_from_stale_incarnation_is_refused():
    image = cluster(1)
    check_heartbeat(image, HeartbeatRequest(broker_id=1, incarnation_id="i0", metadata_offset=0))
    with pytest.raises(StaleBrokerError) as exc:
        check_heartbeat(image, HeartbeatRequest(broker_id=1, incarnation_id="x",
                                                metadata_offset=0))
    assert (exc.value.expected, exc.value.actual) == ("i0", "x")
    with pytest.raises(UnknownBrokerError):
        check_heartbeat(image, HeartbeatRequest(broker_id=5, incarnation_id="x",
                                                metadata_offset=0))


def reg(broker_id, incarnation, clean):
    return RegisterBrokerRequest(broker_id=broker_id, incarnation_id=incarnation,
                                 host="h", port=1, clean_shutdown=clean)


def test_unclean_restart_leaves_every_isr():
    """KIP-966: a broker back from an unclean shutdown leaves each ISR it was in (and its
    leaderships) until it catches up; as the last member it stays (ISR never empties)."""
    image = cluster(3)
    add_topic(image, "t", [[1, 2, 3], [2, 1, 3]])
    add_topic(image, "u", [[1, 3]])
    isr_change(image, ("u", 0), [1])
    records = register_broker(image, reg(1, "i1", clean=False), 5)
    assert isinstance(records[0], RegisterBroker) and not records[0].clean_shutdown
    apply(image, records)
    assert image.brokers[1].fenced
    p0, p1, p2 = image.partition("t", 0), image.partition("t", 1), image.partition("u", 0)
    assert 1 not in p0.isr and p0.leader == 2
    assert 1 not in p1.isr and p1.leader == 2
    assert p2.isr == (1,) and p2.leader is None


def test_clean_restart_keeps_isr_membership_but_not_leadership():
    image = cluster(3)
    add_topic(image, "t", [[1, 2, 3]])
    apply(image, register_broker(image, reg(1, "i1", clean=True), 5))
    p = image.partition("t", 0)
    assert p.isr == (1, 2, 3) and p.leader == 2


def test_register_retry_with_same_incarnation_changes_nothing():
    image = cluster(1)
    assert register_broker(image, reg(1, "i0", clean=True), 5) == []


# ---- isr elections ----------------------------------------------------------------

def test_isr_election_prefers_priority_then_replica_order():
    image = cluster(4, priorities={3: 10})
    add_topic(image, "t", [[1, 2, 3, 4]])
    p = image.partition("t", 0)
    apply(image, [PartitionChange(topic="t", partition=0, leader=-1)])
    p = image.partition("t", 0)
    assert elect_isr_leader(image, p).leader == 3
    isr_change(image, ("t", 0), [2, 4])
    assert elect_isr_leader(image, image.partition("t", 0)).leader == 2


def test_unclean_election_only_when_allowed():
    image = cluster(2)
    add_topic(image, "t", [[1, 2]])
    add_topic(image, "u", [[1, 2]], unclean_leader_election=True)
    for t in ("t", "u"):
        isr_change(image, (t, 0), [1])
    sessions = BrokerSessions(session_timeout_ms=10, started_at_ms=0)
    heartbeat_all(image, sessions, 100, skip=(1,))
    apply(image, fence_expired(image, sessions, 100))
    assert elect_isr_leader(image, image.partition("t", 0)) is None
    c = elect_isr_leader(image, image.partition("u", 0))
    assert (c.leader, c.isr) == (2, (2,))


# ---- quorum elections -------------------------------------------------------------

def quorum_image(n=3, **cfg):
    image = cluster(n)
    add_topic(image, "q", [list(range(1, n + 1))], commit_policy="quorum", **cfg)
    return image


def report(b, epoch, last_epoch, end_offset, topic="q", unclean=False):
    return ElectionReport(broker_id=b, topic=topic, partition=0, fenced_epoch=epoch,
                          last_epoch=last_epoch, end_offset=end_offset, unclean=unclean)


def test_quorum_leader_loss_fences_first():
    image = quorum_image()
    sessions = BrokerSessions(session_timeout_ms=10, started_at_ms=0)
    heartbeat_all(image, sessions, 100, skip=(1,))
    apply(image, fence_expired(image, sessions, 100))
    p = image.partition("q", 0)
    assert (p.leader, p.leader_epoch, p.fenced_for_election) == (None, 1, True)
    assert elect_leaders(image, QuorumElectionTracker()) == []  # no reports yet


def test_fence_for_election_record():
    image = quorum_image()
    c = fence_for_election(image, image.partition("q", 0))
    assert c.fenced_for_election and c.leader == -1 and c.expected_partition_epoch == 0


def test_stale_replica_with_longest_log_is_not_elected():
    """Replica 3 holds a longer log from an older epoch (2, offset 90); replica 2 a shorter
    one from the newer epoch (3, offset 50). The pair comparison elects 2; largest end
    offset alone (KIP-250's rule) would elect 3 and lose epoch-3 records."""
    image = quorum_image(n=3)
    apply(image, [fence_for_election(image, image.partition("q", 0))])
    p = image.partition("q", 0)
    tracker = QuorumElectionTracker()
    assert tracker.add(image, report(3, p.leader_epoch, 2, 90)) is None
    assert elect_quorum(image, p, tracker.reports(p)) is None  # 1 of n-q+1 = 2
    assert tracker.add(image, report(2, p.leader_epoch, 3, 50)) is None
    c = elect_quorum(image, p, tracker.reports(p))
    assert c.leader == 2 and c.isr == (2, 3)
    apply(image, [c])
    p = image.partition("q", 0)
    assert (p.leader, p.leader_epoch, p.fenced_for_election) == (2, 2, False)


def test_tracker_ignores_stale_duplicate_and_foreign_reports():
    image = quorum_image(n=3)
    add_broker(image, 9)
    apply(image, [fence_for_election(image, image.partition("q", 0))])
    p = image.partition("q", 0)
    tracker = QuorumElectionTracker()
    assert "fenced epoch 0" in tracker.add(image, report(2, 0, 5, 5))
    assert "not a replica" in tracker.add(image, report(9, 1, 5, 5))
    assert "unknown partition" in tracker.add(image, report(2, 1, 5, 5, topic="zz"))
    assert tracker.add(image, report(2, 1, 0, 5)) is None
    assert "duplicate" in tracker.add(image, report(2, 1, 9, 99))
    assert [r.end_offset for r in tracker.reports(p)] == [5]


def test_quorum_threshold_is_n_minus_q_plus_one():
    image = quorum_image(n=5, quorum_required_acks=4)  # needs 2 reports
    apply(image, [fence_for_election(image, image.partition("q", 0))])
    p = image.partition("q", 0)
    assert elect_quorum(image, p, [report(5, 1, 0, 0)]) is None
    assert elect_quorum(image, p, [report(5, 1, 0, 0), report(4, 1, 0, 0)]).leader == 4


def test_quorum_reports_from_fenced_replicas_do_not_count():
    image = quorum_image(n=3)
    apply(image, [fence_for_election(image, image.partition("q", 0)),
                  FenceBroker(broker_id=3, at_ms=0)])
    p = image.partition("q", 0)
    assert elect_quorum(image, p, [report(3, 1, 9, 9), report(2, 1, 0, 0)]) is None
    assert elect_quorum(image, p, [report(1, 1, 0, 0), report(2, 1, 0, 1)]).leader == 2


def test_quorum_unclean_reports_count_only_when_every_replica_reported():
    """durability=write: replicas 1 and 2 restarted after a crash and cannot catch up (no
    leader during the election). Their reports say so. With replica 3 alone clean, an
    election among {3, 1} could drop a record committed on {1, 2} and lost in 1's crash
    while 2 is down: no leader. Once all three reported, no replica holds more than the
    best of them, and waiting could never make one clean: the best is elected."""
    image = quorum_image(n=3)  # q = 2: n - q + 1 = 2 reports
    apply(image, [fence_for_election(image, image.partition("q", 0))])
    p = image.partition("q", 0)
    tracker = QuorumElectionTracker()
    assert tracker.add(image, report(3, 1, 0, 40)) is None
    assert tracker.add(image, report(1, 1, 0, 50, unclean=True)) is None
    assert elect_quorum(image, p, tracker.reports(p)) is None
    assert elect_leaders(image, tracker) == []
    assert tracker.add(image, report(2, 1, 0, 45, unclean=True)) is None
    c = elect_quorum(image, p, tracker.reports(p))
    assert (c.leader, c.isr) == (1, (1, 2, 3)) and "2 unclean" in c.reason
    assert elect_leaders(image, tracker) == [c]


def test_quorum_clean_reports_suffice_and_an_unclean_one_may_win():
    """n - q + 1 clean reports elect as before; an unclean report beside them is compared
    too (its flushed log is a real log: if it is the greatest, it holds what the clean
    holder of every committed record holds)."""
    image = quorum_image(n=5, quorum_required_acks=3)  # 3 clean reports needed
    apply(image, [fence_for_election(image, image.partition("q", 0))])
    p = image.partition("q", 0)
    clean = [report(b, 1, 0, 10) for b in (3, 4)]
    unclean = [report(b, 1, 0, 20, unclean=True) for b in (1, 2)]
    assert elect_quorum(image, p, clean + unclean) is None  # 2 clean + 2 unclean of 5
    c = elect_quorum(image, p, clean + unclean[:1] + [report(5, 1, 0, 10)])
    assert (c.leader, c.isr) == (1, (1, 3, 4, 5))
    assert elect_quorum(image, p, clean + unclean + [report(5, 1, 0, 10, unclean=True)]).leader == 1


def test_quorum_unclean_reports_from_fenced_replicas_do_not_complete_the_set():
    image = quorum_image(n=3)
    apply(image, [fence_for_election(image, image.partition("q", 0)),
                  FenceBroker(broker_id=2, at_ms=0)])
    p = image.partition("q", 0)
    reports = [report(1, 1, 0, 5, unclean=True), report(2, 1, 0, 9, unclean=True), report(3, 1, 0, 1)]
    assert elect_quorum(image, p, reports) is None


def test_quorum_ties_break_by_priority_then_replica_order():
    image = cluster(3, priorities={3: 5})
    add_topic(image, "q", [[1, 2, 3]], commit_policy="quorum")
    apply(image, [fence_for_election(image, image.partition("q", 0))])
    p = image.partition("q", 0)
    same = [report(b, 1, 4, 40) for b in (1, 2, 3)]
    assert elect_quorum(image, p, same).leader == 3
    assert elect_quorum(image, p, same[:2]).leader == 1


def test_election_choice_matches_oracle():
    """Seeds 0..499: best_report equals the naive one-pass oracle over random reports
    (epochs and offsets from small ranges so ties are common) and random priorities."""
    for seed in range(500):
        rnd = random.Random(seed)
        n = rnd.randint(2, 5)
        image = cluster(n, priorities={b: rnd.randint(0, 2) for b in range(1, n + 1)})
        replicas = rnd.sample(range(1, n + 1), n)
        add_topic(image, "q", [replicas], commit_policy="quorum")
        p = image.partition("q", 0)
        reporters = rnd.sample(replicas, rnd.randint(1, n))
        reports = [report(b, 1, rnd.randint(-1, 2), rnd.randint(0, 3)) for b in reporters]
        assert best_report(image, p, reports) == best_report_oracle(image, p, reports), \
            f"seed={seed}"


# ---- ISR changes ----------------------------------------------------------------

def isr_request(p, **over):
    fields = dict(broker_id=p.leader, topic=p.topic, partition=p.partition,
                  leader_epoch=p.leader_epoch, partition_epoch=p.partition_epoch,
                  new_isr=p.isr)
    fields.update(over)
    return AlterIsrRequest(**fields)


def test_alter_isr_accepts_a_current_leader():
    image = cluster(3)
    add_topic(image, "t", [[1, 2, 3]])
    p = image.partition("t", 0)
    records = alter_isr(image, isr_request(p, new_isr=(3, 1)))
    assert records == [PartitionChange(topic="t", partition=0, isr=(1, 3),
                                       expected_partition_epoch=0,
                                       reason="requested by leader 1")]
    apply(image, records)
    assert image.partition("t", 0).partition_epoch == 1
    assert alter_isr(image, isr_request(image.partition("t", 0))) == []


def test_alter_isr_refuses_stale_leader_epoch():
    image = cluster(3)
    add_topic(image, "t", [[1, 2, 3]])
    old = image.partition("t", 0)
    apply(image, [PartitionChange(topic="t", partition=0, leader=2),
                  PartitionChange(topic="t", partition=0, leader=1)])
    with pytest.raises(StaleEpochError) as exc:
        alter_isr(image, isr_request(old, new_isr=(1, 2)))
    assert exc.value.code == ErrorCode.FENCED_LEADER_EPOCH
    assert (exc.value.field, exc.value.expected, exc.value.actual) == ("leader_epoch", 2, 0)
    with pytest.raises(StaleEpochError) as exc:
        alter_isr(image, isr_request(old, leader_epoch=5, partition_epoch=2, new_isr=(1, 2)))
    assert exc.value.code == ErrorCode.UNKNOWN_LEADER_EPOCH


def test_alter_isr_refuses_stale_partition_epoch():
    image = cluster(3)
    add_topic(image, "t", [[1, 2, 3]])
    old = image.partition("t", 0)
    isr_change(image, ("t", 0), [1, 2])
    with pytest.raises(StaleEpochError) as exc:
        alter_isr(image, isr_request(old, new_isr=(1,)))
    assert exc.value.code == ErrorCode.INVALID_UPDATE_VERSION
    assert (exc.value.field, exc.value.expected, exc.value.actual) == ("partition_epoch", 1, 0)


def test_alter_isr_refuses_bad_requests():
    image = cluster(4)
    add_topic(image, "t", [[1, 2, 3]])
    p = image.partition("t", 0)
    with pytest.raises(NotLeaderError) as exc:
        alter_isr(image, isr_request(p, broker_id=2))
    assert (exc.value.expected, exc.value.actual) == (1, 2)
    with pytest.raises(InvalidFieldError, match="must contain the leader"):
        alter_isr(image, isr_request(p, new_isr=(2, 3)))
    with pytest.raises(InvalidFieldError, match=r"names \[4\]"):
        alter_isr(image, isr_request(p, new_isr=(1, 4)))
    with pytest.raises(UnknownTopicOrPartitionError):
        alter_isr(image, isr_request(p, partition=3))
    isr_change(image, ("t", 0), [1, 2])
    apply(image, [FenceBroker(broker_id=3, at_ms=0)])
    with pytest.raises(IneligibleReplicaError) as exc:
        alter_isr(image, isr_request(image.partition("t", 0), new_isr=(1, 2, 3)))
    assert exc.value.broker_id == 3


def test_alter_isr_works_for_quorum_topics():
    image = quorum_image()
    p = image.partition("q", 0)
    assert alter_isr(image, isr_request(p, new_isr=(1, 2)))[0].isr == (1, 2)


# ---- reassignment ----------------------------------------------------------------

def test_reassignment_grow_catch_up_shrink():
    image = cluster(5)
    add_topic(image, "t", [[1, 2, 3]])
    grow = start_reassignment(image, ReassignmentRequest(topic="t", partition=0,
                                                         target_replicas=(4, 5, 1)))
    apply(image, grow)
    p = image.partition("t", 0)
    assert (p.replicas, p.adding, p.removing) == ((4, 5, 1, 2, 3), (4, 5), (2, 3))
    assert p.target_replicas == (4, 5, 1)
    assert progress_reassignments(image) == []  # 4 and 5 not in sync yet
    isr_change(image, ("t", 0), [1, 2, 3, 4])
    assert progress_reassignments(image) == []
    isr_change(image, ("t", 0), [1, 2, 3, 4, 5])
    apply(image, progress_reassignments(image))
    p = image.partition("t", 0)
    assert (p.replicas, p.isr, p.adding, p.removing, p.leader) == \
        ((4, 5, 1), (1, 4, 5), (), (), 1)
    assert progress_reassignments(image) == []


def test_reassignment_reelects_when_the_leader_leaves():
    image = cluster(4)
    add_topic(image, "t", [[1, 2]])
    apply(image, start_reassignment(image, ReassignmentRequest(
        topic="t", partition=0, target_replicas=(3, 4))))
    isr_change(image, ("t", 0), [1, 2, 3, 4])
    apply(image, progress_reassignments(image))
    p = image.partition("t", 0)
    assert (p.replicas, p.leader, p.leader_epoch) == ((3, 4), 3, 1)


def test_quorum_reassignment_leader_leaving_fences_for_election():
    image = quorum_image(n=4)
    apply(image, start_reassignment(image, ReassignmentRequest(
        topic="q", partition=0, target_replicas=(2, 3, 4))))
    apply(image, progress_reassignments(image))
    p = image.partition("q", 0)
    assert (p.replicas, p.leader, p.fenced_for_election) == ((2, 3, 4), None, True)


def test_reassignment_validation():
    image = cluster(3)
    add_topic(image, "t", [[1, 2]])
    with pytest.raises(UnknownBrokerError) as exc:
        start_reassignment(image, ReassignmentRequest(topic="t", partition=0,
                                                      target_replicas=(1, 7)))
    assert exc.value.field == "target_replicas" and exc.value.value == 7
    assert start_reassignment(image, ReassignmentRequest(topic="t", partition=0,
                                                         target_replicas=(1, 2))) == []
    reorder = start_reassignment(image, ReassignmentRequest(topic="t", partition=0,
                                                            target_replicas=(2, 1)))
    assert reorder[0].replicas == (2, 1) and reorder[0].adding is None
    apply(image, start_reassignment(image, ReassignmentRequest(topic="t", partition=0,
                                                               target_replicas=(3,))))
    with pytest.raises(InvalidFieldError, match="cancel it first"):
        start_reassignment(image, ReassignmentRequest(topic="t", partition=0,
                                                      target_replicas=(2,)))


def test_cancel_reassignment_returns_to_the_original_replicas():
    image = cluster(3)
    add_topic(image, "t", [[1, 2]])
    apply(image, start_reassignment(image, ReassignmentRequest(topic="t", partition=0,
                                                               target_replicas=(3,))))
    apply(image, cancel_reassignment(image, "t", 0))
    p = image.partition("t", 0)
    assert (set(p.replicas), p.adding, p.removing) == ({1, 2}, (), ())


# ---- rebalance, producer ids, facade -----------------------------------------------

def test_stale_fence_and_unfence_are_rejected():
    """A fence decided for an old incarnation, or an unfence decided before a newer fence,
    does not apply; a leader left fenced by a stale proposal is moved on the next round."""
    image = cluster(2)
    add_topic(image, "t", [[1, 2]])
    old = image.copy()
    sessions = BrokerSessions(session_timeout_ms=10, started_at_ms=0)
    stale_fence = fence_expired(old, sessions, 100)
    apply(image, register_broker(image, reg(1, "i1", clean=True), 100))
    sessions.heartbeat(1, "i1", 100, image.brokers[1].fenced_offset)
    sessions.heartbeat(2, "i0", 100, image.offset)
    stale_unfence = unfence_ready(image, sessions, 100)
    apply(image, stale_unfence)
    with pytest.raises(RecordRejected, match="incarnation"):
        image.apply(stale_fence[0], image.offset + 1)
    apply(image, [FenceBroker(broker_id=1, at_ms=101)])
    with pytest.raises(RecordRejected, match="fenced again"):
        image.apply(stale_unfence[0], image.offset + 1)
    # A fenced leader left behind (fence applied, its partition change rejected):
    lone = cluster(2)
    add_topic(lone, "t", [[1, 2]])
    apply(lone, [FenceBroker(broker_id=1, at_ms=0)])
    assert lone.partition("t", 0).leader == 1
    (fix,) = move_fenced_leaders(lone)
    apply(lone, [fix])
    assert lone.partition("t", 0).leader == 2


def test_preferred_election_moves_leadership_back():
    image = cluster(3)
    add_topic(image, "t", [[1, 2, 3]])
    apply(image, [PartitionChange(topic="t", partition=0, leader=2)])
    records = elect_preferred(image)
    assert [r.leader for r in records] == [1]
    apply(image, records)
    assert elect_preferred(image) == []


def test_preferred_is_priority_aware_and_needs_isr():
    image = cluster(3, priorities={3: 9})
    add_topic(image, "t", [[1, 2, 3]])  # created with leader 3: the highest priority
    assert image.partition("t", 0).leader == 3
    assert elect_preferred(image) == []
    isr_change(image, ("t", 0), [2, 3])
    apply(image, [PartitionChange(topic="t", partition=0, leader=2)])
    assert [r.leader for r in elect_preferred(image)] == [3]


def test_preferred_election_for_quorum_goes_through_the_fence():
    image = quorum_image()
    apply(image, [PartitionChange(topic="q", partition=0, leader=2)])
    (c,) = elect_preferred(image, [("q", 0)])
    assert c.fenced_for_election
    with pytest.raises(UnknownTopicOrPartitionError):
        elect_preferred(image, [("nope", 0)])


def test_producer_id_blocks_do_not_overlap():
    image = cluster(2)
    a = allocate_producer_ids(image, AllocateProducerIdsRequest(broker_id=1))
    apply(image, a)
    b = allocate_producer_ids(image, AllocateProducerIdsRequest(broker_id=2, count=10))
    assert a == [ProducerIdBlock(broker_id=1, first_id=0, size=1000)]
    assert b == [ProducerIdBlock(broker_id=2, first_id=1000, size=10)]
    with pytest.raises(UnknownBrokerError):
        allocate_producer_ids(image, AllocateProducerIdsRequest(broker_id=3))


def test_periodic_is_idempotent_once_its_records_are_applied():
    image = cluster(3)
    add_topic(image, "t", [[1, 2, 3]])
    add_topic(image, "q", [[1, 2, 3]], commit_policy="quorum")
    state = ControllerState(LeaderSettings(session_timeout_ms=100, rebalance_interval_ms=1000))
    heartbeat_all(image, state.sessions, 0)
    heartbeat_all(image, state.sessions, 150, skip=(1,))
    first = state.periodic(image, 150)
    assert isinstance(first[0], FenceBroker)
    apply(image, first)
    assert state.periodic(image, 150) == []
    assert periodic(image, state.sessions, state.tracker, 150) == []


def test_rebalance_timer_fires_once_per_interval():
    timer = IntervalTimer(interval_ms=100)
    assert [timer.due(t) for t in (0, 50, 100, 150, 199, 200)] == \
        [False, False, True, False, False, True]


# ---- leader imbalance (Kafka's leader.imbalance.per.broker.percentage) -------------

def moved_to(image, records):
    return sorted((r.partition, r.leader) for r in records)


def test_imbalance_check_moves_back_only_above_the_per_broker_threshold():
    """Broker 1 ideally leads 10 partitions. Leading 9 (10% not led) is within a 10%
    threshold; leading 8 (20%) is above it, and both move back, to broker 1."""
    image = cluster(3)
    add_topic(image, "t", [[1, 2, 3]] * 10)
    apply(image, [PartitionChange(topic="t", partition=3, leader=2)])
    assert leader_imbalance(image)[1].not_led == 1
    assert elect_imbalanced(image, per_broker_percentage=10) == []
    assert moved_to(image, elect_imbalanced(image, per_broker_percentage=9)) == [(3, 1)]
    apply(image, [PartitionChange(topic="t", partition=7, leader=3)])
    records = elect_imbalanced(image, per_broker_percentage=10)
    assert moved_to(image, records) == [(3, 1), (7, 1)]
    assert all("leader imbalance" in r.reason for r in records)
    apply(image, records)
    assert elect_imbalanced(image, per_broker_percentage=0) == []


def test_imbalance_check_moves_only_what_the_broker_can_lead_now():
    """Not in the ISR, fenced, or a leaderless partition: nothing moves there."""
    image = cluster(3)
    add_topic(image, "t", [[1, 2, 3]] * 4)
    for partition in range(4):
        apply(image, [PartitionChange(topic="t", partition=partition, leader=2)])
    isr_change(image, ("t", 0), [2, 3])
    apply(image, [PartitionChange(topic="t", partition=1, leader=-1)])
    assert moved_to(image, elect_imbalanced(image, per_broker_percentage=10)) == [(2, 1), (3, 1)]
    apply(image, [FenceBroker(broker_id=1, at_ms=0)])
    assert elect_imbalanced(image, per_broker_percentage=0) == []


def test_imbalance_uses_the_priority_aware_ideal_leader():
    image = cluster(3, priorities={3: 9})
    add_topic(image, "t", [[1, 2, 3]] * 3)
    assert [ideal_leader(image, p) for p in image.partitions()] == [3, 3, 3]
    apply(image, [PartitionChange(topic="t", partition=0, leader=1)])
    assert moved_to(image, elect_imbalanced(image, per_broker_percentage=10)) == [(0, 3)]
    assert 1 not in leader_imbalance(image)   # ideal for nothing, never over the threshold


def test_imbalance_matches_a_naive_oracle_on_random_images():
    """elect_imbalanced against Kafka's rule spelled out with fractions, seeds 0..199."""
    from fractions import Fraction
    for seed in range(200):
        rnd = random.Random(seed)
        image = cluster(4, priorities={b: rnd.choice([0, 0, 3]) for b in range(1, 5)})
        rf = rnd.randint(1, 3)
        assignment = [rnd.sample([1, 2, 3, 4], rf) for _ in range(rnd.randint(1, 12))]
        add_topic(image, "t", assignment)
        for p in list(image.partitions()):
            isr = [b for b in p.replicas if rnd.random() < 0.7] or [p.replicas[0]]
            leader = rnd.choice(isr + [-1]) if rnd.random() < 0.9 else -1
            if (tuple(isr), leader) != (p.isr, p.leader if p.leader is not None else -1):
                apply(image, [PartitionChange(topic="t", partition=p.partition, isr=tuple(isr), leader=leader)])
        for b in range(1, 5):
            if rnd.random() < 0.15:
                apply(image, [FenceBroker(broker_id=b, at_ms=0)])
        threshold = rnd.choice([0, 10, 25, 50])
        want = []
        for b in range(1, 5):
            ideal = [p for p in image.partitions()
                     if max(p.replicas, key=lambda r: (image.priority(r), -p.replicas.index(r))) == b]
            not_led = [p for p in ideal if p.leader != b]
            if not ideal or Fraction(len(not_led), len(ideal)) <= Fraction(threshold, 100):
                continue
            if not image.is_unfenced(b):
                continue
            want += [(p.partition, b) for p in not_led if p.leader is not None and b in p.isr]
        got = elect_imbalanced(image, per_broker_percentage=threshold)
        assert moved_to(image, got) == sorted(want), f"seed={seed}"


def test_imbalance_check_runs_each_interval_and_fences_a_quorum_partition_once_per_retry_window():
    """A quorum move is an election the preferred replica may lose; the check does not fence
    the same partition again until `quorum_retry_ms` has passed."""
    image = cluster(3)
    add_topic(image, "q", [[1, 2, 3]], commit_policy="quorum")
    check = LeaderImbalanceCheck(check_interval_ms=1000, per_broker_percentage=10, quorum_retry_ms=5000)
    apply(image, [PartitionChange(topic="q", partition=0, leader=2)])
    assert check.run(image, 0) == []          # the first call starts the clock
    assert check.run(image, 999) == []
    (fence,) = check.run(image, 1000)
    assert fence.fenced_for_election
    apply(image, [fence])
    apply(image, [PartitionChange(topic="q", partition=0, leader=2)])   # broker 2 won the election
    assert check.run(image, 2000) == [] and check.run(image, 5000) == []
    (again,) = check.run(image, 6000)
    assert again.fenced_for_election


def test_leader_settings_are_checked():
    with pytest.raises(ValueError, match="leader_imbalance_per_broker_percentage"):
        LeaderSettings(leader_imbalance_per_broker_percentage=101)
    with pytest.raises(ValueError, match="leader_imbalance_check_interval_ms"):
        LeaderSettings(leader_imbalance_check_interval_ms=-1)
    assert ControllerState(LeaderSettings(leader_imbalance_check_interval_ms=0)).imbalance_check is None


def test_a_returning_broker_gets_its_leaderships_back_at_the_next_imbalance_check():
    """Through the periodic pass: broker 1 misses its session and is fenced (its 4
    leaderships move); it returns, is unfenced, rejoins the ISRs; the next imbalance check
    (1 s here; the full rebalance is 5 minutes away) hands all 4 back to it."""
    image = cluster(3)
    add_topic(image, "t", [[1, 2, 3]] * 4 + [[2, 3, 1]] * 4)
    state = ControllerState(LeaderSettings(session_timeout_ms=1000, leader_imbalance_check_interval_ms=1000))
    heartbeat_all(image, state.sessions, 0)
    apply(image, state.periodic(image, 0))
    heartbeat_all(image, state.sessions, 1500, skip=(1,))
    apply(image, state.periodic(image, 1500))
    assert image.brokers[1].fenced and [p.leader for p in image.partitions()][:4] == [2, 2, 2, 2]
    heartbeat_all(image, state.sessions, 1600)
    apply(image, state.periodic(image, 1600))
    assert not image.brokers[1].fenced
    for p in list(image.partitions()):
        if 1 not in p.isr:
            apply(image, alter_isr(image, AlterIsrRequest(
                broker_id=p.leader, topic=p.topic, partition=p.partition, leader_epoch=p.leader_epoch,
                partition_epoch=p.partition_epoch, new_isr=p.isr + (1,))))
    heartbeat_all(image, state.sessions, 2400)   # the last check ran at 1500
    assert state.periodic(image, 2400) == []
    heartbeat_all(image, state.sessions, 2500)
    records = state.periodic(image, 2500)
    assert sorted((r.partition, r.leader) for r in records) == [(0, 1), (1, 1), (2, 1), (3, 1)]
    apply(image, records)
    assert [p.leader for p in image.partitions()] == [1, 1, 1, 1, 2, 2, 2, 2]


def _rejoin(c: ControllerCore, image: MetadataImage, partition: int, isr: tuple[int, ...]) -> None:
    """Partition `partition` of t as its leader's ISR change through the core leaves it."""
    p = image.partition("t", partition)
    apply(image, c.step(image, AlterIsr(request=AlterIsrRequest(
        broker_id=p.leader, topic="t", partition=partition, leader_epoch=p.leader_epoch,
        partition_epoch=p.partition_epoch, new_isr=isr))).records)


def _tick(c: ControllerCore, image: MetadataImage, now_ms: int) -> list:
    heartbeat_all(image, c.state.sessions, now_ms)
    return list(c.step(image, Tick(now_ms=now_ms, paused_ms=0)).records)


def test_an_ideal_leader_back_in_its_isr_leads_again_at_the_next_pass_not_the_next_check():
    """Broker 1, out of t-0's ISR and not leading it, is brought back by its leader's ISR
    change: the next periodic pass hands t-0 back, seconds before the interval's check (a
    move left pending that long lands in whatever fault comes next). Early once per
    interval: out and back in again at once, it waits for the check."""
    image = cluster(3)
    add_topic(image, "t", [[1, 2, 3]] * 2)
    c = ControllerCore(LeaderSettings(leader_imbalance_check_interval_ms=5000))
    assert _tick(c, image, 0) == []                    # starts the check's clock
    apply(image, [PartitionChange(topic="t", partition=0, leader=2, isr=(2, 3))])
    assert _tick(c, image, 100) == []                  # broker 1 cannot lead it yet
    _rejoin(c, image, 0, (1, 2, 3))
    (moved,) = _tick(c, image, 200)
    assert (moved.partition, moved.leader) == (0, 1) and "leader imbalance" in moved.reason
    apply(image, [moved])
    apply(image, [PartitionChange(topic="t", partition=0, leader=2, isr=(2, 3))])
    _rejoin(c, image, 0, (1, 2, 3))
    assert _tick(c, image, 300) == [] and _tick(c, image, 4999) == []
    (again,) = _tick(c, image, 5000)
    assert (again.partition, again.leader) == (0, 1)


def test_no_leadership_moves_for_balance_while_a_link_of_its_leader_is_reported_broken():
    """A new leader gives each ISR follower a whole lag time: moved while broker 3 cannot
    hear t-0's leader, acks=all would wait on broker 3 longer than the old leader's shrink.
    Held back at the interval's check and at a rejoin's early look alike."""
    image = cluster(3)
    add_topic(image, "t", [[1, 2, 3]] * 2)
    c = ControllerCore(LeaderSettings(leader_imbalance_check_interval_ms=1000))
    assert _tick(c, image, 0) == []
    apply(image, [PartitionChange(topic="t", partition=0, leader=2)])
    epoch = image.partition("t", 0).leader_epoch
    c.state.reachability.note(3, [Link("t", 0, epoch, 2)], 900)
    assert _tick(c, image, 1000) == []
    apply(image, [PartitionChange(topic="t", partition=0, isr=(2, 3))])
    _rejoin(c, image, 0, (1, 2, 3))
    c.state.reachability.note(3, [Link("t", 0, epoch, 2)], 1050)
    assert _tick(c, image, 1100) == []
    c.state.reachability.note(3, [], 1900)
    (moved,) = _tick(c, image, 2000)
    assert (moved.partition, moved.leader) == (0, 1)


def test_a_broken_link_holds_no_move_when_nobody_would_wait_on_it():
    """Broker 3 cut from the leader holds back nothing when it is out of the ISR (no leader
    waits on it), nor for a quorum topic (its quorum commits without broker 3)."""
    image = cluster(3)
    add_topic(image, "t", [[1, 2, 3]] * 2)
    add_topic(image, "q", [[1, 2, 3]] * 2, commit_policy="quorum")
    c = ControllerCore(LeaderSettings(leader_imbalance_check_interval_ms=1000))
    assert _tick(c, image, 0) == []
    apply(image, [PartitionChange(topic="t", partition=0, leader=2, isr=(1, 2)),
                  PartitionChange(topic="q", partition=0, leader=2)])
    links = [Link(tp, 0, image.partition(tp, 0).leader_epoch, 2) for tp in ("t", "q")]
    c.state.reachability.note(3, links, 900)
    moved = _tick(c, image, 1000)
    assert sorted((r.topic, r.leader if not r.fenced_for_election else "election") for r in moved) == \
        [("q", "election"), ("t", 1)]


def test_a_quorum_election_waiting_long_is_told_with_what_it_lacks_once_per_interval():
    """A partition without a leader takes no writes: after STALLED_ELECTION_MS the controller
    says which replicas reported (clean or not), which are fenced, which is the old leader
    whose report is refused for now, and which said nothing; then again once per interval."""
    image = quorum_image(n=3)
    apply(image, [fence_for_election(image, image.partition("q", 0)), FenceBroker(broker_id=2, at_ms=0)])
    p = image.partition("q", 0)
    tracker = QuorumElectionTracker()
    tracker.exclude("q", 0, p.leader_epoch, 1, until_ms=60_000)
    assert tracker.add(image, report(3, p.leader_epoch, 0, 40, unclean=True)) is None
    assert tracker.stalled(image, 1_000, after_ms=5_000) == []
    assert tracker.stalled(image, 5_999, after_ms=5_000) == []
    [said] = tracker.stalled(image, 6_000, after_ms=5_000)
    assert "q-0 at fenced epoch 1 has waited 5.0 s" in said, said
    assert "broker 1: old leader, report refused for now" in said
    assert "broker 2: fenced, no report" in said
    assert "broker 3: unclean report (epoch 0, offset 40)" in said
    assert tracker.stalled(image, 10_999, after_ms=5_000) == []
    assert len(tracker.stalled(image, 11_000, after_ms=5_000)) == 1


def fenced_at(image, sessions, now_ms):
    return sorted(r.broker_id for r in fence_expired(image, sessions, now_ms) if isinstance(r, FenceBroker))


def test_a_broker_heard_while_following_is_timed_from_its_last_heartbeat_heard_not_given_the_grace():
    """A broker heard by this node while it followed (answered "not the leader"), with its
    current incarnation, is timed from that heartbeat: one that went quiet 1.4 s before the new
    leader's first look is fenced 0.1 s after it, not a session timeout plus the grace after.
    One heard only as another incarnation, or never, still gets the grace."""
    image = cluster(4)
    heard = {1: (image.brokers[1].incarnation_id, 8_600),    # quiet 1.4 s before the start
             2: (image.brokers[2].incarnation_id, 9_950),    # heard just before it
             3: ("an-old-process", 9_900)}
    sessions = BrokerSessions(session_timeout_ms=1500, new_leader_grace_ms=3200, heard_before_start=heard)
    assert fence_expired(image, sessions, 10_000) == []
    assert fenced_at(image, sessions, 10_100) == []
    assert fenced_at(image, sessions, 10_101) == [1]
    assert fenced_at(image, sessions, 11_450) == [1]
    assert fenced_at(image, sessions, 11_451) == [1, 2]
    assert fenced_at(image, sessions, 14_700) == [1, 2]
    assert fenced_at(image, sessions, 14_701) == [1, 2, 3, 4]


def test_a_new_leader_that_did_not_run_gives_back_the_time_to_what_it_heard_as_a_follower_too():
    image = cluster(2)
    heard = {1: (image.brokers[1].incarnation_id, 9_900)}
    sessions = BrokerSessions(session_timeout_ms=1500, new_leader_grace_ms=3200, heard_before_start=heard)
    assert fence_expired(image, sessions, 10_000) == []
    sessions.credit(2_000, 12_000)   # the leader was stopped from 10,000 to 12,000
    assert fenced_at(image, sessions, 12_000) == []
    assert fenced_at(image, sessions, 13_501) == [1]


def test_a_followers_hearing_counts_a_silence_only_while_it_heard_the_other_brokers():
    hearing = Hearing(gap_ms_max=750, forget_ms=4_700)
    assert hearing.as_of(1_000) == {}
    for t in range(1_000, 3_001, 150):
        hearing.heard(1, "a", t)
        if t <= 2_000:
            hearing.heard(2, "b", t)   # broker 2 goes quiet after 1,900
    assert hearing.as_of(3_100) == {1: ("a", 2_950), 2: ("b", 1_900)}
    # Then this node hears nobody for 2 s (stopped, or cut off): silences before count for nothing.
    assert hearing.as_of(5_000) == {1: ("a", 5_000), 2: ("b", 5_000)}
    hearing.heard(1, "a", 5_000)   # the first heartbeat after the gap starts a new listening
    assert hearing.listening_since == 5_000
    assert hearing.as_of(5_100) == {1: ("a", 5_000), 2: ("b", 5_000)}
    hearing.heard(2, "b2", 5_200)   # a new incarnation replaces the old one's entry
    assert hearing.as_of(5_300)[2] == ("b2", 5_200)
    with pytest.raises(ValueError, match="gap_ms_max"):
        Hearing(gap_ms_max=0, forget_ms=1)


def test_a_followers_hearing_keeps_at_most_max_brokers_and_makes_room_from_the_forgotten():
    """Brokers are kept before this node applied their registration (so any id counts), but no
    more than `max_brokers`: a new id past that is dropped, unless one kept is already forgotten."""
    hearing = Hearing(gap_ms_max=750, forget_ms=4_700, max_brokers=2)
    hearing.heard(1, "a", 0)
    hearing.heard(2, "b", 100)
    hearing.heard(3, "c", 200)          # full: dropped
    hearing.heard(2, "b", 300)          # one kept is still heard
    assert hearing.as_of(400) == {1: ("a", 0), 2: ("b", 300)}
    for t in range(400, 5_001, 300):
        hearing.heard(2, "b", t)        # broker 1 goes quiet past forget_ms
    hearing.heard(3, "c", 5_000)        # broker 1's place
    assert hearing.as_of(5_000) == {2: ("b", 4_900), 3: ("c", 5_000)}
    with pytest.raises(ValueError, match="max_brokers"):
        Hearing(gap_ms_max=1, forget_ms=1, max_brokers=0)


def test_a_broker_the_follower_stopped_hearing_long_ago_gets_the_grace_not_a_fence_at_the_start():
    """A broker heard once, then not for longer than a session and the grace while this node
    heard the others, yet still unfenced, heartbeats another controller only (an older version,
    or a list of controllers without this one): the new leader gives it the grace."""
    image = cluster(2)
    one, two = image.brokers[1].incarnation_id, image.brokers[2].incarnation_id
    hearing = Hearing(gap_ms_max=750, forget_ms=4_700)
    hearing.heard(1, one, 0)
    for t in range(0, 10_001, 300):
        hearing.heard(2, two, t)
        if t == 4_500:
            assert hearing.as_of(4_700) == {1: (one, 0), 2: (two, 4_500)}
    assert hearing.as_of(10_000) == {2: (two, 9_900)}
    sessions = BrokerSessions(session_timeout_ms=1500, new_leader_grace_ms=3200,
                              heard_before_start=hearing.as_of(10_000))
    assert fenced_at(image, sessions, 10_000) == []
    assert fenced_at(image, sessions, 11_401) == [2]
    assert fenced_at(image, sessions, 14_700) == [2]
    assert fenced_at(image, sessions, 14_701) == [1, 2]
