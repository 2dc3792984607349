"""The producer's lanes (dataplane/client/lanes.py): which produce connection of a broker
carries a partition's batches."""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from dataplane.client.lanes import Lanes, fate_key
from dataplane.client.records import TopicPartition

Q0, Q1 = TopicPartition("q", 0), TopicPartition("q", 1)
I0 = TopicPartition("i", 0)


@dataclass
class Batch:
    tp: TopicPartition


def test_partitions_that_share_their_fate_share_a_lane_and_others_get_their_own():
    lanes = Lanes(8)
    key = {Q0: fate_key(Q0, (2, 1, 3), (1, 2, 3)), Q1: fate_key(Q1, (1, 2, 3), (3, 2, 1)),
           I0: fate_key(I0, (1, 2, 3), (1, 2, 3))}
    out = lanes.split(2, [Batch(Q0), Batch(I0), Batch(Q1)], key.__getitem__, lambda tp: False)
    assert sorted([b.tp for b in batches] for batches in out.values()) == [[I0], [Q0, Q1]]


def test_a_partition_whose_isr_differs_does_not_share_a_lane():
    """Q1's leadership just moved here from a cut broker, which left its ISR; Q0 still waits
    for that broker to leave its own ISR: Q1 must not queue behind it."""
    lanes = Lanes(8)
    key = {Q0: fate_key(Q0, (1, 2, 3), (1, 2, 3)), Q1: fate_key(Q1, (1, 2, 3), (2, 3))}
    out = lanes.split(2, [Batch(Q0), Batch(Q1)], key.__getitem__, lambda tp: False)
    assert len(out) == 2


def test_a_partition_stays_on_its_lane_while_it_has_batches_in_flight():
    """Its batches reach the leader in numbering order: a lane change waits for an idle moment."""
    lanes = Lanes(8)
    assert lanes.lane(2, Q0, "a", others_in_flight=False) == 0
    assert lanes.lane(2, Q1, "b", others_in_flight=False) == 1
    # Q0's group changed (its replicas moved) while batches are in flight: it stays on lane 0.
    assert lanes.lane(2, Q0, "b", others_in_flight=True) == 0
    assert lanes.lane(2, Q0, "b", others_in_flight=False) == 1
    # Another leader: in-flight batches to the old one do not pin it.
    assert lanes.lane(3, Q0, "b", others_in_flight=True) == 0


def test_groups_share_lanes_past_the_bound_and_unused_groups_are_forgotten():
    lanes = Lanes(2)
    assert [lanes.lane(1, TopicPartition(t, 0), t, others_in_flight=False) for t in "abcd"] == [0, 1, 0, 1]
    # Eight groups were seen for broker 1, but only a..d are in use (one partition each):
    # new groups take the lane fewest of the groups in use share, and the dict stays bounded.
    for i, t in enumerate("efghijkl"):
        lanes.lane(1, TopicPartition("a", 0), t, others_in_flight=False)   # a moves group each time
    assert len(lanes._groups[1]) <= 4 * 2 + 1


def test_a_new_group_is_placed_by_the_groups_in_use_not_by_the_groups_seen_before():
    """I0 sits in one group on lane 0 while J0 goes through eight ISRs (eight groups, each
    left behind by the next): J0 must never share I0's lane while lanes are free. Before,
    the groups J0 had left still counted, filled lanes 1-7, and its eighth went to lane 0:
    in a one-way cut of broker 3 (the gray scenario, seed 23) broker 2's quorum partitions
    waited 1.9 s behind its isr ones, which waited for broker 3 to leave their ISR."""
    lanes = Lanes(8)
    i0, j0 = TopicPartition("i", 0), TopicPartition("j", 0)
    assert lanes.lane(2, i0, "i", others_in_flight=False) == 0
    assert all(lanes.lane(2, j0, f"j{n}", others_in_flight=False) != 0 for n in range(8))
    assert set(lanes._groups[2]) == {"i", "j7"}, "groups no partition is in are forgotten"


def test_a_group_sharing_its_lane_moves_to_a_free_one_once_its_partition_has_none_in_flight():
    """C's group was given lane 0 with A's when both lanes were taken; once B's partition
    leaves for another broker, lane 1 is free and C's next batch goes there, but not while C
    has batches in flight on lane 0 (they must reach the leader first). Before, C stayed
    behind A for as long as both were in use: in the gray scenario (seed 23) a quorum
    partition of broker 1 waited 2 s behind its isr ones in each cut of another broker."""
    lanes = Lanes(2)
    a, b, c = TopicPartition("a", 0), TopicPartition("b", 0), TopicPartition("c", 0)
    assert [lanes.lane(1, tp, tp.topic, others_in_flight=False) for tp in (a, b, c)] == [0, 1, 0]
    assert lanes.lane(3, b, "b", others_in_flight=False) == 0    # B's leader is now broker 3
    assert lanes.lane(1, c, "c", others_in_flight=True) == 0     # in flight: stays
    assert lanes.lane(1, c, "c", others_in_flight=False) == 1    # idle: moves to the free lane
    assert lanes.lane(1, a, "a", others_in_flight=False) == 0


def test_a_partition_with_nothing_in_flight_holds_no_lane():
    """B stopped writing (or its leader moved) with its last batch answered: its group must not
    keep lane 1 taken, so that C, sharing lane 0 with A, moves there."""
    lanes = Lanes(2)
    a, b, c = TopicPartition("a", 0), TopicPartition("b", 0), TopicPartition("c", 0)
    assert [lanes.lane(1, tp, tp.topic, others_in_flight=False) for tp in (a, b, c)] == [0, 1, 0]
    lanes.release(b)
    lanes.release(b)   # twice: nothing more
    assert lanes.lane(1, c, "c", others_in_flight=False) == 1
    assert set(lanes._groups[1]) == {"a", "c"}


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2"])
def test_the_bound_is_checked(bad):
    with pytest.raises(ValueError, match="produce_lanes_per_broker_max"):
        Lanes(bad)
