"""controller/health.py: each rule of the cluster-health judgement, on images built by hand."""
from __future__ import annotations

from common.metadata import FenceBroker, PartitionChange
from controller.health import CRITICAL, DEGRADED, QuorumView, cluster_health
from metadata_builders import add_topic, apply, cluster

QUORUM_OK = QuorumView(node_id=1, leader_id=1, controllers=((1, True), (2, True), (3, True)))


def checks(health) -> list[tuple[str, str, str | None, int | None, int | None]]:
    return [(p.check, p.severity, p.topic, p.partition, p.broker_id) for p in health.problems]


def test_a_cluster_with_every_replica_in_sync_is_healthy():
    image = cluster(3)
    add_topic(image, "t", [[1, 2, 3], [2, 3, 1]], min_insync_replicas=2)
    h = cluster_health(image, QUORUM_OK)
    assert h.status == "healthy" and h.healthy and h.problems == []
    assert h.metadata_offset == image.offset


def test_a_fenced_broker_leaves_partitions_under_replicated_and_is_reported():
    image = cluster(3)
    add_topic(image, "t", [[1, 2, 3]], min_insync_replicas=2)
    p = image.partition("t", 0)
    apply(image, [FenceBroker(broker_id=3, at_ms=5, reason="session expired"),
                  PartitionChange(topic="t", partition=0, isr=(1, 2), expected_partition_epoch=p.partition_epoch)])
    h = cluster_health(image, QUORUM_OK)
    assert h.status == DEGRADED and not h.healthy
    assert checks(h) == [("fenced_broker", DEGRADED, None, None, 3), ("under_replicated", DEGRADED, "t", 0, None)]
    assert "session expired" in h.problems[0].message
    assert h.under_replicated_partitions == 1 and h.fenced_brokers == 1 and h.under_min_isr_partitions == 0


def test_an_isr_below_min_insync_replicas_and_a_leaderless_partition_are_critical():
    image = cluster(3)
    add_topic(image, "t", [[1, 2, 3], [1, 2, 3]], min_insync_replicas=2)
    for part, change in ((0, {"isr": (1,)}), (1, {"isr": (2,), "leader": -1})):
        p = image.partition("t", part)
        apply(image, [PartitionChange(topic="t", partition=part, expected_partition_epoch=p.partition_epoch,
                                      **change)])
    h = cluster_health(image, QUORUM_OK)
    assert h.status == CRITICAL
    assert ("under_min_isr", CRITICAL, "t", 0, None) in checks(h)
    assert ("leaderless", CRITICAL, "t", 1, None) in checks(h)
    assert ("under_min_isr", CRITICAL, "t", 1, None) in checks(h)
    assert h.leaderless_partitions == 1 and h.under_min_isr_partitions == 2 and h.under_replicated_partitions == 2
    # Critical problems come first.
    severities = [p.severity for p in h.problems]
    assert severities == sorted(severities, key=lambda s: s != CRITICAL)


def test_a_quorum_topic_is_under_min_isr_below_its_quorum():
    image = cluster(3)
    add_topic(image, "q", [[1, 2, 3]], commit_policy="quorum")
    p = image.partition("q", 0)
    apply(image, [PartitionChange(topic="q", partition=0, isr=(1, 2), expected_partition_epoch=p.partition_epoch)])
    assert ("under_min_isr", CRITICAL, "q", 0, None) not in checks(cluster_health(image, QUORUM_OK))
    p = image.partition("q", 0)
    apply(image, [PartitionChange(topic="q", partition=0, isr=(1,), expected_partition_epoch=p.partition_epoch)])
    h = cluster_health(image, QUORUM_OK)
    assert ("under_min_isr", CRITICAL, "q", 0, None) in checks(h)
    assert "quorum_required_acks 2" in next(x.message for x in h.problems if x.check == "under_min_isr")


def test_a_replica_being_added_by_a_reassignment_is_catching_up_not_missing():
    image = cluster(4)
    add_topic(image, "t", [[1, 2, 3]])
    p = image.partition("t", 0)
    apply(image, [PartitionChange(topic="t", partition=0, replicas=(1, 2, 4, 3), adding=(4,), removing=(3,),
                                  expected_partition_epoch=p.partition_epoch)])
    assert cluster_health(image, QUORUM_OK).healthy


def test_controller_quorum_problems():
    image = cluster(1)
    no_leader = cluster_health(image, QuorumView(node_id=2, leader_id=None, controllers=((1, False), (2, True))))
    assert no_leader.status == CRITICAL and checks(no_leader)[0][0] == "controller_no_leader"
    cut = cluster_health(image, QuorumView(node_id=1, leader_id=1, controllers=((1, True), (2, False), (3, True))))
    assert cut.status == DEGRADED and cut.controllers_disconnected == 1
    assert cut.problems[0].node_id == 2 and "(the leader)" in cut.problems[0].message
    # Two of three gone: the leader has not stepped down yet, but it cannot commit (it said
    # DEGRADED for the seconds until its election timeout, while topic creates failed).
    lost = cluster_health(image, QuorumView(node_id=1, leader_id=1, controllers=((1, True), (2, False), (3, False))))
    assert lost.status == CRITICAL and checks(lost)[0][0] == "controller_quorum_lost"
    assert "reaches 1 of 3 controllers; a majority (2) is needed" in lost.problems[0].message
    five = QuorumView(node_id=1, leader_id=1, controllers=((1, True), (2, True), (3, True), (4, False), (5, False)))
    assert cluster_health(image, five).status == DEGRADED


def test_the_exit_codes_are_in_the_help(capsys):
    import pytest
    from controller.admin_cli import EXIT_CRITICAL, EXIT_DEGRADED, cluster_main
    with pytest.raises(SystemExit):
        cluster_main(["--help"], "biplane cluster")
    text = capsys.readouterr().out
    assert f"  {EXIT_DEGRADED}  degraded:" in text and f"  {EXIT_CRITICAL}  critical:" in text
    assert "  0  healthy" in text and "  1  the check itself failed" in text
