"""Partition assignors: how a group's leader shares the subscribed partitions among the members.

Pure functions of (members with their subscriptions, partition count per topic); no I/O.
The names are Kafka's and librdkafka's, and so are the rules, so that whichever member of a
mixed group is elected leader hands out the same kind of assignment:

- "range" (eager): per topic, the members subscribed to it in order each take a contiguous
  run of partitions; the first (partitions % members) take one more.
- "roundrobin" (eager): every subscribed partition, in (topic, partition) order, goes to the
  next member in order that is subscribed to its topic.
- "cooperative-sticky" (cooperative, KIP-429): a member keeps what it owns where the
  balance allows; then unowned partitions go to the least-loaded eligible member, and
  partitions move off a member only while it holds two or more than another member that
  could take them. A partition that must move to another member is left out of the answer
  altogether: its owner revokes it, rejoins, and the next rebalance assigns it to its new
  member. So no partition is ever owned by two members at once, and no member stops
  reading a partition that stays with it.

Member order is Kafka's: by group_instance_id when both members have one, else by
member_id. A partition claimed in owned_partitions by two members goes to the one with the
newer generation (a claim from an older generation is stale), and to neither on a tie.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from common.consumer_protocol import NO_GENERATION, Subscription
from common.topic_partition import TopicPartition


class RebalanceProtocol(enum.Enum):
    EAGER = "eager"              # every member revokes everything before it rejoins
    COOPERATIVE = "cooperative"  # members revoke only partitions that move


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupMember:
    member_id: str
    group_instance_id: str | None
    subscription: Subscription


Assignments = dict[str, list[TopicPartition]]   # member id -> its partitions, in order


def _order_key(member: GroupMember) -> tuple[int, str, str]:
    # Kafka's MemberInfo order: static members by instance id, ahead of dynamic ones.
    if member.group_instance_id is not None:
        return (0, member.group_instance_id, member.member_id)
    return (1, member.member_id, "")


def _ordered(members: Sequence[GroupMember]) -> list[GroupMember]:
    ids = [m.member_id for m in members]
    if len(set(ids)) != len(ids):
        raise ValueError(f"member ids must be unique in one assignment: {sorted(ids)}")
    return sorted(members, key=_order_key)


def _partitions_of(topic: str, partition_counts: Mapping[str, int]) -> list[TopicPartition]:
    return [TopicPartition(topic, p) for p in range(partition_counts.get(topic, 0))]


def range_assign(members: Sequence[GroupMember], partition_counts: Mapping[str, int]) -> Assignments:
    ordered = _ordered(members)
    out: Assignments = {m.member_id: [] for m in ordered}
    topics = sorted({t for m in ordered for t in m.subscription.topics})
    for topic in topics:
        takers = [m.member_id for m in ordered if topic in m.subscription.topics]
        partitions = _partitions_of(topic, partition_counts)
        share, extra = divmod(len(partitions), len(takers))
        start = 0
        for i, member_id in enumerate(takers):
            count = share + (1 if i < extra else 0)
            out[member_id] += partitions[start:start + count]
            start += count
    return out


def roundrobin_assign(members: Sequence[GroupMember], partition_counts: Mapping[str, int]) -> Assignments:
    ordered = _ordered(members)
    out: Assignments = {m.member_id: [] for m in ordered}
    if not ordered:
        return out
    topics = sorted({t for m in ordered for t in m.subscription.topics})
    turn = 0
    for topic in topics:
        for tp in _partitions_of(topic, partition_counts):
            # Next member in the circle that reads this topic (at least one does).
            while topic not in ordered[turn % len(ordered)].subscription.topics:
                turn += 1
            out[ordered[turn % len(ordered)].member_id].append(tp)
            turn += 1
    return out


def _previous_owners(ordered: list[GroupMember],
                     eligible: Mapping[TopicPartition, list[str]]) -> dict[TopicPartition, str]:
    """Who owned each partition before, by the members' own claims; stale or tied claims dropped."""
    best: dict[TopicPartition, tuple[int, str | None]] = {}
    for m in ordered:
        for tp in m.subscription.owned_partitions:
            if m.member_id not in eligible.get(tp, ()):
                continue   # gone from the topic, or no longer subscribed to it
            generation = m.subscription.generation_id
            held = best.get(tp)
            if held is None or generation > held[0]:
                best[tp] = (generation, m.member_id)
            elif generation == held[0] and held[1] != m.member_id:
                best[tp] = (generation, None)   # two claims of one generation: trust neither
    return {tp: owner for tp, (_, owner) in best.items() if owner is not None}


def sticky_target(members: Sequence[GroupMember], partition_counts: Mapping[str, int]) -> Assignments:
    """The balanced assignment that moves as few owned partitions as it can (before KIP-429's
    holding back of partitions that change hands: see cooperative_sticky_assign)."""
    ordered = _ordered(members)
    rank = {m.member_id: i for i, m in enumerate(ordered)}
    eligible: dict[TopicPartition, list[str]] = {}
    for m in ordered:
        for topic in m.subscription.topics:
            for tp in _partitions_of(topic, partition_counts):
                eligible.setdefault(tp, []).append(m.member_id)
    owners = _previous_owners(ordered, eligible)
    held: dict[str, set[TopicPartition]] = {m.member_id: set() for m in ordered}
    for tp, owner in owners.items():
        held[owner].add(tp)
    load: Callable[[str], tuple[int, int]] = lambda member_id: (len(held[member_id]), rank[member_id])
    # Unowned partitions to the least-loaded member that may take each, those with the fewest
    # candidates first (Kafka's order too): a partition only one member can take goes there
    # before others fill that member up, so fewer moves are needed afterwards.
    for tp in sorted(eligible, key=lambda tp: (len(eligible[tp]), tp)):
        if tp not in owners:
            held[min(eligible[tp], key=load)].add(tp)
    # Then move one partition at a time from a member that holds two or more than another
    # eligible member, most loaded first. Each move lowers the sum of squared loads, so this
    # ends; the bound only guards against a bug.
    moves_max = len(eligible) * max(1, len(ordered))
    for _ in range(moves_max + 1):
        move = _one_move(ordered, held, eligible, load)
        if move is None:
            break
        tp, source, target = move
        held[source].remove(tp)
        held[target].add(tp)
    else:
        raise AssertionError(f"sticky assignment did not settle in {moves_max} moves")
    return {member_id: sorted(tps) for member_id, tps in held.items()}


def _one_move(ordered: list[GroupMember], held: dict[str, set[TopicPartition]],
              eligible: Mapping[TopicPartition, list[str]],
              load: Callable[[str], tuple[int, int]]) -> tuple[TopicPartition, str, str] | None:
    for source in sorted(held, key=load, reverse=True):
        # Prefer moving a partition whose best new home is the least loaded.
        best: tuple[tuple[int, int], TopicPartition, str] | None = None
        for tp in sorted(held[source]):
            target = min(eligible[tp], key=load)
            if len(held[source]) - len(held[target]) > 1 and (best is None or load(target) < best[0]):
                best = (load(target), tp, target)
        if best is not None:
            return best[1], source, best[2]
    return None


def cooperative_sticky_assign(members: Sequence[GroupMember], partition_counts: Mapping[str, int]) -> Assignments:
    """KIP-429: the sticky target, less every partition whose previous owner is another
    member. The owner sees it missing and revokes it; the next rebalance hands it over."""
    ordered = _ordered(members)
    eligible: dict[TopicPartition, list[str]] = {}
    for m in ordered:
        for topic in m.subscription.topics:
            for tp in _partitions_of(topic, partition_counts):
                eligible.setdefault(tp, []).append(m.member_id)
    owners = _previous_owners(ordered, eligible)
    target = sticky_target(members, partition_counts)
    return {member_id: [tp for tp in tps if owners.get(tp, member_id) == member_id]
            for member_id, tps in target.items()}


@dataclass(frozen=True, slots=True, kw_only=True)
class Assignor:
    name: str
    protocol: RebalanceProtocol
    assign: Callable[[Sequence[GroupMember], Mapping[str, int]], Assignments]


ASSIGNORS: dict[str, Assignor] = {
    "range": Assignor(name="range", protocol=RebalanceProtocol.EAGER, assign=range_assign),
    "roundrobin": Assignor(name="roundrobin", protocol=RebalanceProtocol.EAGER, assign=roundrobin_assign),
    "cooperative-sticky": Assignor(name="cooperative-sticky", protocol=RebalanceProtocol.COOPERATIVE,
                                   assign=cooperative_sticky_assign),
}


def assignors_for(names: Sequence[str] | str) -> list[Assignor]:
    """The configured assignors, by Kafka's names, in the order of preference given."""
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    if not names:
        raise ValueError(f"partition_assignment_strategy is empty: name one or more of {sorted(ASSIGNORS)}")
    unknown = [n for n in names if n not in ASSIGNORS]
    if unknown:
        raise ValueError(f"partition_assignment_strategy names unknown assignor(s) {unknown}: "
                         f"use one or more of {sorted(ASSIGNORS)}")
    if len(set(names)) != len(names):
        raise ValueError(f"partition_assignment_strategy names an assignor twice: {list(names)}")
    return [ASSIGNORS[n] for n in names]


def rebalance_protocol(assignors: Sequence[Assignor]) -> RebalanceProtocol:
    """Kafka's rule: cooperative only if every configured assignor is, so a group can move from
    eager to cooperative in two rolling restarts without two members owning one partition."""
    if all(a.protocol is RebalanceProtocol.COOPERATIVE for a in assignors):
        return RebalanceProtocol.COOPERATIVE
    return RebalanceProtocol.EAGER


__all__ = ["RebalanceProtocol", "GroupMember", "Assignments", "Assignor", "ASSIGNORS", "assignors_for",
           "rebalance_protocol", "range_assign", "roundrobin_assign", "sticky_target",
           "cooperative_sticky_assign", "NO_GENERATION"]
