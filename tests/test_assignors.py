"""The assignors: range and round-robin against kafka-python's implementations of Kafka's rules
(same answer for any group), and property tests for all three: every subscribed partition
assigned exactly once, only to members subscribed to its topic, balanced, and — for
cooperative-sticky — sticky, with a moving partition held back until its owner gave it
up, and the group settling (in two rebalances when subscriptions are equal)."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.coordinator.assignors.range import RangePartitionAssignor
from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor

from common.consumer_protocol import Subscription
from common.topic_partition import TopicPartition
from dataplane.client.assignors import (
    ASSIGNORS,
    Assignments,
    GroupMember,
    RebalanceProtocol,
    assignors_for,
    cooperative_sticky_assign,
    range_assign,
    rebalance_protocol,
    roundrobin_assign,
    sticky_target,
)

TOPICS = ("a", "b", "c")
partition_counts = st.fixed_dictionaries({t: st.integers(0, 9) for t in TOPICS})


@st.composite
def groups(draw: st.DrawFn, same_topics: bool = False) -> list[GroupMember]:
    count = draw(st.integers(1, 6))
    ids = draw(st.lists(st.text("mnpq", min_size=1, max_size=3), min_size=count, max_size=count, unique=True))
    shared = draw(st.sets(st.sampled_from(TOPICS), min_size=1))
    members = []
    for member_id in ids:
        topics = shared if same_topics else draw(st.sets(st.sampled_from(TOPICS), min_size=1))
        members.append(GroupMember(member_id=member_id, group_instance_id=None,
                                   subscription=Subscription(topics=tuple(sorted(topics)))))
    return members


def subscribed(members: list[GroupMember], counts: Mapping[str, int]) -> set[TopicPartition]:
    return {TopicPartition(t, p) for m in members for t in m.subscription.topics for p in range(counts[t])}


def check_exactly_once(members: list[GroupMember], counts: Mapping[str, int], out: Assignments) -> None:
    assert set(out) == {m.member_id for m in members}
    every = [tp for tps in out.values() for tp in tps]
    assert len(every) == len(set(every)), "a partition went to two members"
    assert set(every) == subscribed(members, counts), "a subscribed partition went to nobody"
    topics_of = {m.member_id: set(m.subscription.topics) for m in members}
    for member_id, tps in out.items():
        assert all(tp.topic in topics_of[member_id] for tp in tps), f"{member_id} got an unsubscribed topic"


def check_sticky_balance(members: list[GroupMember], out: Assignments) -> None:
    """No partition could move to another member subscribed to it and narrow a gap of 2 or more."""
    load = {member_id: len(tps) for member_id, tps in out.items()}
    topics_of = {m.member_id: set(m.subscription.topics) for m in members}
    for source, tps in out.items():
        for tp in tps:
            for target in out:
                if tp.topic in topics_of[target]:
                    assert load[source] - load[target] <= 1, (source, target, tp, out)


def kafka_python(assignor: type, members: list[GroupMember], counts: Mapping[str, int]) -> Assignments:
    cluster = SimpleNamespace(partitions_for_topic=lambda t: set(range(counts[t])) if t in counts else None)
    theirs = assignor.assign(cluster, [SimpleNamespace(member_id=m.member_id, group_instance_id=None,
                                                       metadata=SimpleNamespace(topics=list(m.subscription.topics)))
                                       for m in members])
    return {member_id: [TopicPartition(t, p) for t, ps in a.assignment for p in ps]
            for member_id, a in theirs.items()}


@settings(max_examples=300, deadline=None)
@given(members=groups(), counts=partition_counts)
def test_range_matches_kafka_python(members: list[GroupMember], counts: dict[str, int]) -> None:
    ours = range_assign(members, counts)
    check_exactly_once(members, counts, ours)
    assert {k: sorted(v) for k, v in ours.items()} == {k: sorted(v) for k, v in
                                                       kafka_python(RangePartitionAssignor, members, counts).items()}


@settings(max_examples=300, deadline=None)
@given(members=groups(same_topics=True), counts=partition_counts)
def test_roundrobin_matches_kafka_python(members: list[GroupMember], counts: dict[str, int]) -> None:
    """Equal subscriptions only: kafka-python's round-robin fails (KeyError) when it has to skip
    a member that is not subscribed to a topic; Kafka's own example covers that case below."""
    ours = roundrobin_assign(members, counts)
    check_exactly_once(members, counts, ours)
    assert {k: sorted(v) for k, v in ours.items()} == \
        {k: sorted(v) for k, v in kafka_python(RoundRobinPartitionAssignor, members, counts).items()}


@settings(max_examples=300, deadline=None)
@given(members=groups(), counts=partition_counts)
def test_roundrobin_unequal_subscriptions_assign_exactly_once(members: list[GroupMember],
                                                              counts: dict[str, int]) -> None:
    check_exactly_once(members, counts, roundrobin_assign(members, counts))


def test_roundrobin_skips_members_not_subscribed() -> None:
    """The example of Kafka's RoundRobinAssignor documentation: C0 reads t0; C1 t0, t1; C2 all
    three; t0 has 1 partition, t1 2, t2 3."""
    def member(member_id: str, *topics: str) -> GroupMember:
        return GroupMember(member_id=member_id, group_instance_id=None, subscription=Subscription(topics=topics))
    out = roundrobin_assign([member("C0", "t0"), member("C1", "t0", "t1"), member("C2", "t0", "t1", "t2")],
                            {"t0": 1, "t1": 2, "t2": 3})
    tp = TopicPartition
    assert out == {"C0": [tp("t0", 0)], "C1": [tp("t1", 0)],
                   "C2": [tp("t1", 1), tp("t2", 0), tp("t2", 1), tp("t2", 2)]}


@settings(max_examples=200, deadline=None)
@given(members=groups(same_topics=True), counts=partition_counts)
def test_roundrobin_balances_equal_subscriptions(members: list[GroupMember], counts: dict[str, int]) -> None:
    sizes = [len(v) for v in roundrobin_assign(members, counts).values()]
    assert max(sizes) - min(sizes) <= 1


def test_static_members_order_by_instance_id() -> None:
    """Kafka's order: static members by instance id first, so a restarted static member (new
    member id, same instance id) gets the same range back."""
    sub = Subscription(topics=("a",))
    members = [GroupMember(member_id="z-new", group_instance_id="host-1", subscription=sub),
               GroupMember(member_id="a", group_instance_id="host-2", subscription=sub),
               GroupMember(member_id="b", group_instance_id=None, subscription=sub)]
    out = range_assign(members, {"a": 3})
    assert out == {"z-new": [TopicPartition("a", 0)], "a": [TopicPartition("a", 1)], "b": [TopicPartition("a", 2)]}


def with_owned(members: list[GroupMember], owned: Assignments, generation: int) -> list[GroupMember]:
    return [GroupMember(member_id=m.member_id, group_instance_id=m.group_instance_id,
                        subscription=Subscription(topics=m.subscription.topics,
                                                  owned_partitions=tuple(owned.get(m.member_id, ())),
                                                  generation_id=generation))
            for m in members]


@settings(max_examples=300, deadline=None)
@given(members=groups(), counts=partition_counts, data=st.data())
def test_sticky_target_is_complete_balanced_and_sticky(members: list[GroupMember], counts: dict[str, int],
                                                        data: st.DataObject) -> None:
    """From any previous ownership (random, possibly stale or overlapping): every partition
    once, balanced; and a member keeps what it owned up to what balance lets it keep."""
    universe = sorted(subscribed(members, counts))
    owned: Assignments = {m.member_id: data.draw(st.lists(st.sampled_from(universe), unique=True))
                          if universe else [] for m in members}
    generations = {m.member_id: data.draw(st.integers(0, 3)) for m in members}
    previous = [GroupMember(member_id=m.member_id, group_instance_id=None,
                            subscription=Subscription(topics=m.subscription.topics,
                                                      owned_partitions=tuple(owned[m.member_id]),
                                                      generation_id=generations[m.member_id]))
                for m in members]
    out = sticky_target(previous, counts)
    check_exactly_once(members, counts, out)
    check_sticky_balance(members, out)
    # Assigning again from the result changes nothing: a balanced group is left alone.
    again = sticky_target(with_owned(members, out, 1), counts)
    assert again == out


@settings(max_examples=300, deadline=None)
@given(members=groups(same_topics=True), counts=partition_counts, data=st.data())
def test_sticky_keeps_owned_up_to_the_fair_share(members: list[GroupMember], counts: dict[str, int],
                                                 data: st.DataObject) -> None:
    """Equal subscriptions, a valid previous assignment among some of the members (the others
    are new): each member keeps at least min(what it had, the floor of the fair share)."""
    old_members = members[:data.draw(st.integers(1, len(members)))]
    before = sticky_target(old_members, counts)
    out = sticky_target(with_owned(members, before, 1), counts)
    check_exactly_once(members, counts, out)
    fair_floor = len(subscribed(members, counts)) // len(members)
    for member_id, tps in before.items():
        kept = set(tps) & set(out[member_id])
        assert len(kept) >= min(len(tps), fair_floor), (member_id, tps, out[member_id])


def cooperative_round(members: list[GroupMember], owned: Assignments, generation: int,
                      counts: Mapping[str, int]) -> Assignments:
    """One cooperative rebalance from `owned` (each partition owned by at most one member, that
    member subscribed to it); checks KIP-429's promises for it."""
    out = cooperative_sticky_assign(with_owned(members, owned, generation), counts)
    owner = {tp: m for m, tps in owned.items() for tp in tps}
    target = sticky_target(with_owned(members, owned, generation), counts)
    for member_id, tps in out.items():
        for tp in tps:
            assert owner.get(tp, member_id) == member_id, f"{tp} given to {member_id} while {owner[tp]} owns it"
    for member_id, tps in owned.items():
        if member_id in out:
            assert set(tps) & set(target[member_id]) <= set(out[member_id]), "an owner lost a partition it keeps"
    every = [tp for tps in out.values() for tp in tps]
    assert len(every) == len(set(every))
    return out


@settings(max_examples=300, deadline=None)
@given(members=groups(), counts=partition_counts, data=st.data())
def test_cooperative_holds_back_moves_and_settles(members: list[GroupMember], counts: dict[str, int],
                                                  data: st.DataObject) -> None:
    """KIP-429 from a valid ownership, members joining and leaving between rounds: no member is
    given a partition another still owns, owners keep what stays with them, and after members
    revoke what they lost and rejoin, the group settles — everything assigned once, balanced —
    within three rebalances (a partition held back in one can make the next move another when
    subscriptions differ)."""
    survivors = members[:data.draw(st.integers(1, len(members)))]
    owned = sticky_target(survivors, counts)   # a valid ownership of an earlier generation
    for generation in range(1, 5):
        nxt = cooperative_round(members, owned, generation, counts)
        if nxt == owned and generation > 1:
            break
        owned = nxt
    else:
        raise AssertionError(f"still moving after three rebalances: {owned}")
    check_exactly_once(members, counts, owned)
    check_sticky_balance(members, owned)


@settings(max_examples=300, deadline=None)
@given(members=groups(same_topics=True), counts=partition_counts, data=st.data())
def test_cooperative_with_equal_subscriptions_settles_in_two_rebalances(members: list[GroupMember],
                                                                        counts: dict[str, int],
                                                                        data: st.DataObject) -> None:
    """The usual case, every member reading the same topics: the first rebalance revokes what
    moves, the second hands it over, and nothing that moved then moves again."""
    survivors = members[:data.draw(st.integers(1, len(members)))]
    before = sticky_target(survivors, counts)
    first = cooperative_round(members, before, 1, counts)
    second = cooperative_round(members, first, 2, counts)
    check_exactly_once(members, counts, second)
    check_sticky_balance(members, second)
    for member_id, tps in first.items():
        assert set(tps) <= set(second[member_id]), "the second round moved a partition again"


def test_stale_and_tied_claims() -> None:
    """Two members claiming one partition: the newer generation keeps it; on a tie, neither
    keeps its claim (both are suspect) and it is assigned like an unowned one."""
    def member(member_id: str, owned: list[int], generation: int) -> GroupMember:
        return GroupMember(member_id=member_id, group_instance_id=None,
                           subscription=Subscription(topics=("a",), generation_id=generation,
                                                     owned_partitions=tuple(TopicPartition("a", p) for p in owned)))
    newer = cooperative_sticky_assign([member("x", [0, 1], 4), member("y", [1], 3)], {"a": 2})
    # y's claim on 1 is stale; x keeps one partition, the other moves to y: held back one round.
    assert len(newer["x"]) == 1 and newer["y"] == []
    tied = sticky_target([member("x", [0], 3), member("y", [0], 3)], {"a": 2})
    assert sorted(tied["x"] + tied["y"]) == [TopicPartition("a", 0), TopicPartition("a", 1)]


def test_configuration() -> None:
    assert [a.name for a in assignors_for("range, cooperative-sticky")] == ["range", "cooperative-sticky"]
    assert rebalance_protocol(assignors_for(["range", "cooperative-sticky"])) is RebalanceProtocol.EAGER
    assert rebalance_protocol(assignors_for(["cooperative-sticky"])) is RebalanceProtocol.COOPERATIVE
    for bad, message in (([], "empty"), (["sticky"], "unknown assignor"), (["range", "range"], "twice")):
        with pytest.raises(ValueError, match=message):
            assignors_for(bad)
    assert set(ASSIGNORS) == {"range", "roundrobin", "cooperative-sticky"}
