"""Maintenance mode and decommission as pure controller decisions
(controller/decisions/maintenance.py, decommission.py), on images built by hand."""
from __future__ import annotations

import random

import pytest

from common.errors import InvalidFieldError, InvalidReplicationFactorError, UnknownBrokerError
from common.metadata import AlterBrokerState, FenceBroker, PartitionChange, RecordRejected, RegisterBroker
from common.requests import ElectionReport, ReassignmentRequest
from controller.decisions import (
    BrokerSessions,
    MaintenanceDrain,
    QuorumElectionTracker,
    decommission_moves,
    decommission_progress,
    drain_leaders,
    elect_preferred,
    leader_imbalance,
    maintenance_progress,
    periodic,
    place_replicas,
    progress_reassignments,
    recommission,
    set_maintenance,
    start_decommission,
    start_reassignment,
    unfence_ready,
)
from controller.decisions.elections import best_report, best_report_oracle
from controller.decisions.plan import Plan
from metadata_builders import add_topic, apply, cluster


def leaders(image) -> dict[tuple[str, int], int | None]:
    return {(p.topic, p.partition): p.leader for p in image.partitions()}


# ---- maintenance


def test_maintenance_moves_every_leadership_to_another_in_sync_replica_and_keeps_the_isr():
    image = cluster(3)
    add_topic(image, "t", [[2, 1, 3], [2, 3, 1], [1, 2, 3]])
    isr_before = {p.tp: p.isr for p in image.partitions()}
    records = set_maintenance(image, 2, True)
    assert isinstance(records[0], AlterBrokerState) and records[0].maintenance is True
    apply(image, records)
    assert leaders(image) == {("t", 0): 1, ("t", 1): 3, ("t", 2): 1}
    assert {p.tp: p.isr for p in image.partitions()} == isr_before
    assert maintenance_progress(image, 2).leaders == ()
    # Idempotent: asked again, and every later drain, nothing more.
    assert set_maintenance(image, 2, True) == [] and drain_leaders(image) == []


def test_a_broker_in_maintenance_is_passed_over_by_preferred_and_imbalance_elections():
    image = cluster(3)
    add_topic(image, "t", [[2, 1, 3]])
    apply(image, set_maintenance(image, 2, True))
    assert image.partition("t", 0).leader == 1
    assert elect_preferred(image) == []
    assert 2 not in leader_imbalance(image)
    # Off again: the preferred election hands the leadership back.
    apply(image, set_maintenance(image, 2, False))
    apply(image, elect_preferred(image))
    assert image.partition("t", 0).leader == 2


def test_a_broker_in_maintenance_keeps_a_leadership_nobody_else_can_take():
    image = cluster(3)
    add_topic(image, "solo", [[2]])
    add_topic(image, "t", [[2, 3]])
    p = image.partition("t", 0)
    apply(image, [PartitionChange(topic="t", partition=0, isr=(2,), expected_partition_epoch=p.partition_epoch)])
    apply(image, set_maintenance(image, 2, True))
    assert image.partition("solo", 0).leader == 2 and image.partition("t", 0).leader == 2
    progress = maintenance_progress(image, 2)
    assert progress.leaders == (("solo", 0), ("t", 0)) and progress.movable == ()
    assert "no other in-sync" in progress.stuck[1]
    # Once broker 3 is back in the ISR, the drain moves t-0 to it.
    p = image.partition("t", 0)
    apply(image, [PartitionChange(topic="t", partition=0, isr=(2, 3), expected_partition_epoch=p.partition_epoch)])
    apply(image, drain_leaders(image))
    assert image.partition("t", 0).leader == 3


def test_quorum_partitions_drain_through_an_election_the_maintenance_broker_loses_at_equal_logs():
    image = cluster(3)
    add_topic(image, "q", [[2, 1, 3]], commit_policy="quorum")
    drain = MaintenanceDrain(quorum_retry_ms=1_000)
    apply(image, [AlterBrokerState(broker_id=2, maintenance=True)])
    records = drain.run(image, now_ms=0)
    assert len(records) == 1 and records[0].fenced_for_election
    apply(image, records)
    p = image.partition("q", 0)
    reports = [ElectionReport(topic="q", partition=0, broker_id=b, fenced_epoch=p.leader_epoch, last_epoch=1,
                              end_offset=10) for b in (2, 1, 3)]
    assert best_report(image, p, reports).broker_id == 1
    # With a strictly longer flushed log it wins (no acknowledged record may be lost) ...
    longer = [r.model_copy(update={"end_offset": 11}) if r.broker_id == 2 else r for r in reports]
    assert best_report(image, p, longer).broker_id == 2
    apply(image, [PartitionChange(topic="q", partition=0, leader=2, isr=(2, 1, 3),
                                  expected_partition_epoch=p.partition_epoch)])
    # ... and is not fenced again until the retry interval has passed.
    assert drain.run(image, now_ms=500) == []
    assert len(drain.run(image, now_ms=1_000)) == 1


def test_best_report_matches_its_oracle_with_brokers_in_maintenance():
    rng = random.Random(16)
    for _ in range(300):
        image = cluster(4, priorities={b: rng.choice([0, 1]) for b in range(1, 5)})
        replicas = rng.sample([1, 2, 3, 4], 3)
        add_topic(image, "q", [replicas], commit_policy="quorum")
        for b in rng.sample([1, 2, 3, 4], rng.randint(0, 3)):
            apply(image, [AlterBrokerState(broker_id=b, maintenance=True)])
        p = image.partition("q", 0)
        reports = [ElectionReport(topic="q", partition=0, broker_id=b, fenced_epoch=1, last_epoch=rng.randint(0, 1),
                                  end_offset=rng.randint(0, 2)) for b in replicas]
        assert best_report(image, p, reports) == best_report_oracle(image, p, reports), f"seed=16 {reports}"


def test_maintenance_of_an_unknown_broker_is_refused():
    with pytest.raises(UnknownBrokerError, match="broker 9 is not registered"):
        set_maintenance(cluster(1), 9, True)


def test_marks_survive_a_re_registration():
    image = cluster(3)
    apply(image, set_maintenance(image, 2, True))
    apply(image, [RegisterBroker(broker_id=2, incarnation_id="i1", host="h", port=1, at_ms=1)])
    assert image.brokers[2].maintenance and image.brokers[2].fenced


# ---- decommission


def finish_reassignments(image) -> None:
    """What the partition leaders do: bring every added replica into the ISR; then the shrink."""
    for p in list(image.partitions()):
        if p.adding:
            apply(image, [PartitionChange(topic=p.topic, partition=p.partition, isr=p.isr + p.adding,
                                          expected_partition_epoch=p.partition_epoch)])
    apply(image, progress_reassignments(image))


def test_decommission_replaces_the_broker_with_the_least_loaded_one_then_fences_it():
    image = cluster(5)
    add_topic(image, "t", [[1, 2, 3], [3, 1, 2], [1, 4, 2]])
    add_topic(image, "u", [[4, 5]])
    # Load besides broker 3: 1 -> 3 replicas, 2 -> 3, 4 -> 2, 5 -> 1.
    records = start_decommission(image, 3, now_ms=0)
    apply(image, records)
    assert image.brokers[3].decommissioning and not image.brokers[3].fenced
    t0, t1 = image.partition("t", 0), image.partition("t", 1)
    # t-0 gets broker 5 (fewest), in broker 3's place; t-1 then gets broker 4 (5 now has 2, 4 has 2: lower id).
    assert t0.target_replicas == (1, 2, 5) and t0.adding == (5,) and t0.removing == (3,)
    assert t1.target_replicas == (4, 1, 2) and t1.removing == (3,)
    assert 3 not in place_replicas(image, topic="new", partitions=3, replication_factor=3)[0]
    with pytest.raises(InvalidFieldError, match="being decommissioned"):
        start_reassignment(image, ReassignmentRequest(topic="u", partition=0, target_replicas=(3, 5)))
    assert decommission_progress(image, 3).moving == (("t", 0), ("t", 1))

    assert decommission_moves(image, now_ms=1) == []   # moves running: nothing new, no fence
    finish_reassignments(image)
    assert all(3 not in p.replicas for p in image.partitions())
    # Only now, with no replica left on it, is it fenced and marked.
    records = decommission_moves(image, now_ms=2)
    assert [type(r).__name__ for r in records] == ["FenceBroker", "AlterBrokerState"]
    apply(image, records)
    assert image.brokers[3].fenced and image.brokers[3].decommissioned
    assert decommission_moves(image, now_ms=3) == [] and start_decommission(image, 3, now_ms=3) == []
    # A decommissioned broker is never unfenced again, even when its process heartbeats.
    sessions = BrokerSessions(session_timeout_ms=1_000)
    sessions.heartbeat(3, image.brokers[3].incarnation_id, 4, image.offset)
    assert unfence_ready(image, sessions, 4) == []


def test_a_decommissioned_broker_cannot_be_marked_while_it_hosts_a_replica():
    image = cluster(2)
    add_topic(image, "t", [[1, 2]])
    apply(image, [AlterBrokerState(broker_id=2, decommissioning=True), FenceBroker(broker_id=2, at_ms=0)])
    with pytest.raises(RecordRejected, match="still hosts t-0"):
        image.apply(AlterBrokerState(broker_id=2, decommissioned=True), image.offset + 1)


def test_decommission_is_refused_when_the_others_cannot_hold_the_replication_factor():
    image = cluster(3)
    add_topic(image, "t", [[1, 2, 3]])
    with pytest.raises(InvalidReplicationFactorError) as err:
        start_decommission(image, 3, now_ms=0)
    message = str(err.value)
    assert "t-0 with replication factor 3" in message and "start another broker" in message
    assert not image.brokers[3].decommissioning


def test_decommission_moves_a_bounded_number_of_partitions_at_a_time():
    image = cluster(4)
    add_topic(image, "t", [[4, 1]] * 5)
    apply(image, start_decommission(image, 4, now_ms=0, moves_max=2))
    assert len(decommission_progress(image, 4).moving) == 2
    assert decommission_moves(image, now_ms=1, moves_max=2) == []
    finish_reassignments(image)
    apply(image, decommission_moves(image, now_ms=2, moves_max=2))
    assert len(decommission_progress(image, 4).moving) == 2
    assert len(decommission_progress(image, 4).hosted) == 3


def test_recommission_cancels_running_moves_and_keeps_finished_ones():
    image = cluster(4)
    add_topic(image, "t", [[3, 1], [3, 2]])
    apply(image, start_decommission(image, 3, now_ms=0, moves_max=1))
    finish_reassignments(image)                    # t-0 moved off
    apply(image, decommission_moves(image, now_ms=1, moves_max=1))
    assert image.partition("t", 1).removing == (3,)
    apply(image, recommission(image, 3))
    assert 3 not in image.partition("t", 0).replicas
    # The original replica set (a cancel keeps the set, not the order: cancel_reassignment).
    assert set(image.partition("t", 1).replicas) == {3, 2} and not image.partition("t", 1).reassigning
    assert not image.brokers[3].decommissioning and recommission(image, 3) == []


def test_the_periodic_pass_drains_and_decommissions():
    image = cluster(4)
    add_topic(image, "t", [[2, 1], [4, 1]])
    apply(image, [AlterBrokerState(broker_id=2, maintenance=True), AlterBrokerState(broker_id=4, decommissioning=True)])
    sessions = BrokerSessions(session_timeout_ms=10**9)
    plan = Plan(image)
    plan.extend(periodic(image, sessions, QuorumElectionTracker(), 0, maintenance_drain=MaintenanceDrain()))
    assert plan.image.partition("t", 0).leader == 1
    assert plan.image.partition("t", 1).removing == (4,)
