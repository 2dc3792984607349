"""The add-partitions decision (controller/decisions/topics.py): a topic grows, never shrinks,
its new partitions placed like a new topic's (rack-aware, leaders even) and numbered on."""
from __future__ import annotations

import random
from collections import Counter

import pytest

from common.errors import (
    ErrorCode,
    InvalidPartitionsError,
    InvalidReplicationFactorError,
    UnknownBrokerError,
    UnknownTopicOrPartitionError,
)
from common.metadata import AddPartitions, FenceBroker, PartitionRecord
from common.metadata.config import PARTITIONS_MAX
from common.requests import AddPartitionsRequest, CreateTopicRequest
from controller.decisions import add_partitions, create_topic
from controller.decisions.limits import MAX_PARTITIONS_PER_TOPIC
from metadata_builders import add_topic, apply, cluster


def grow(image, topic: str, partitions: int, assignment=None):
    return add_partitions(image, topic, AddPartitionsRequest(partitions=partitions,
                                                             replica_assignment=assignment))


def test_new_partitions_follow_the_old_ones_with_the_topics_replication_factor():
    image = cluster(3)
    apply(image, create_topic(image, CreateTopicRequest(name="t", partitions=2, replication_factor=2), 0))
    records = grow(image, "t", 5)
    assert records[0] == AddPartitions(topic="t", topic_id=image.topics["t"].topic_id, partitions=5)
    parts = records[1:]
    assert [type(r) for r in parts] == [PartitionRecord] * 3
    assert [r.partition for r in parts] == [2, 3, 4]
    for r in parts:
        assert len(r.replicas) == 2 and r.leader == r.replicas[0] and r.isr == r.replicas
        assert r.leader_epoch == 0 and r.partition_epoch == 0
    apply(image, records)
    assert image.topics["t"].config.partitions == 5 and image.topics["t"].partition_count == 5
    assert grow(image, "t", 6)[1].partition == 5   # and it grows again from there


def test_the_decision_is_deterministic_and_leaves_the_image_alone():
    image = cluster(5)
    add_topic(image, "t", [[1, 2, 3]])
    before = image.to_dict()
    assert grow(image, "t", 9) == grow(image.copy(), "t", 9)
    assert image.to_dict() == before


def test_new_partitions_are_rack_aware():
    """Three racks, RF 3: every added partition has one replica on each rack."""
    image = cluster(6, racks=["a", "a", "b", "b", "c", "c"])
    apply(image, create_topic(image, CreateTopicRequest(name="t", partitions=2, replication_factor=3), 0))
    racks = {b: i.rack for b, i in image.brokers.items()}
    for r in grow(image, "t", 14)[1:]:
        assert sorted(racks[b] for b in r.replicas) == ["a", "b", "c"]


def test_leaders_and_replicas_stay_even_against_oracle():
    """Over random clusters (seeds 0..199), a topic created with p1 partitions then grown to
    p2: replicas per broker take the floor or ceiling of the average over the whole topic
    (the oracle's bound for an even spread). Preferred leaders differ by at most two: the
    old partitions' leaders stay, and the greedy replica sets of the new ones do not always
    include the brokers leading fewest (seed 38: 7 brokers, RF 4, 4 -> 7 partitions)."""
    for seed in range(200):
        rnd = random.Random(seed)
        n = rnd.randint(1, 8)
        image = cluster(n)
        rf = rnd.randint(1, n)
        p1 = rnd.randint(1, 20)
        p2 = p1 + rnd.randint(1, 30)
        apply(image, create_topic(image, CreateTopicRequest(name=f"t{seed}", partitions=p1,
                                                            replication_factor=rf), 0))
        apply(image, grow(image, f"t{seed}", p2))
        parts = image.topic_partitions(f"t{seed}")
        assert len(parts) == p2, f"seed={seed}"
        leaders = Counter(p.replicas[0] for p in parts)
        replicas = Counter(b for p in parts for b in p.replicas)
        ids = range(1, n + 1)
        assert max(leaders[b] for b in ids) - min(leaders[b] for b in ids) <= 2, f"seed={seed} {leaders}"
        total = p2 * rf
        assert {replicas[b] for b in ids} <= {total // n, -(-total // n)}, f"seed={seed}"
        assert all(len(set(p.replicas)) == rf for p in parts), f"seed={seed}"


def test_a_fenced_replica_in_an_assignment_is_left_out_of_isr_and_leadership():
    image = cluster(3)
    add_topic(image, "t", [[1, 2]])
    apply(image, [FenceBroker(broker_id=1, at_ms=0)])
    (_, new) = grow(image, "t", 2, [[1, 3]])
    assert new.replicas == (1, 3) and new.isr == (3,) and new.leader == 3
    apply(image, grow(image, "t", 2, [[1, 3]]))


@pytest.mark.parametrize("partitions", [1, 2])
def test_a_count_not_larger_than_today_is_refused_naming_both(partitions):
    image = cluster(3)
    add_topic(image, "t", [[1], [2]])
    with pytest.raises(InvalidPartitionsError) as exc:
        grow(image, "t", partitions)
    assert exc.value.code == ErrorCode.INVALID_PARTITIONS
    assert exc.value.field == "partitions" and exc.value.value == partitions
    message = str(exc.value)
    assert "already has 2 partitions" in message and f"partitions {partitions} must be larger" in message
    assert "ask for 3 or more" in message


def test_more_than_the_limit_is_refused_with_the_range_to_ask_for():
    image = cluster(1)
    add_topic(image, "t", [[1]])
    with pytest.raises(InvalidPartitionsError) as exc:
        grow(image, "t", MAX_PARTITIONS_PER_TOPIC + 1)
    assert f"limit of {MAX_PARTITIONS_PER_TOPIC} partitions per topic" in str(exc.value)
    assert f"2..{MAX_PARTITIONS_PER_TOPIC}" in str(exc.value) and "--max-partitions-per-topic" in str(exc.value)
    with pytest.raises(InvalidPartitionsError, match=f"at most {PARTITIONS_MAX}"):
        grow(image, "t", PARTITIONS_MAX + 1)


def test_unknown_topic_is_refused():
    with pytest.raises(UnknownTopicOrPartitionError):
        grow(cluster(1), "nope", 2)


def test_replication_factor_above_the_live_brokers_is_refused():
    image = cluster(3)
    add_topic(image, "t", [[1, 2, 3]])
    apply(image, [FenceBroker(broker_id=3, at_ms=0)])
    with pytest.raises(InvalidReplicationFactorError, match="2 available"):
        grow(image, "t", 2)


def test_an_assignment_must_list_each_new_partition_with_the_topics_replication_factor():
    image = cluster(3)
    add_topic(image, "t", [[1, 2]])
    with pytest.raises(InvalidPartitionsError, match="lists 1 partitions but going from 1 to 3 adds 2") as exc:
        grow(image, "t", 3, [[1, 2]])
    assert exc.value.field == "replica_assignment"
    with pytest.raises(InvalidReplicationFactorError, match=r"replica_assignment\[1\] lists 3 replicas") as rf:
        grow(image, "t", 3, [[1, 2], [1, 2, 3]])
    assert rf.value.field == "replica_assignment"
    with pytest.raises(UnknownBrokerError) as unknown:
        grow(image, "t", 2, [[1, 9]])
    assert unknown.value.value == 9
    records = grow(image, "t", 3, [[3, 1], [2, 3]])
    assert [r.replicas for r in records[1:]] == [(3, 1), (2, 3)]
