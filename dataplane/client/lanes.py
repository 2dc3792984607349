"""Which of a broker's produce connections ("lanes") carries a partition's batches.

A broker answers a produce request once every partition in it is done, and the requests of
one connection in order (Kafka's semantics, which the brokers keep). So a partition that
cannot complete — an `isr` partition waiting for a cut follower to leave its ISR, a partition
short of its quorum — holds up every partition that shares its request, and every later
request on the same connection. The producer therefore puts in one request, on one
connection, only partitions that share their fate: the same topic (one commit policy and
durability config), the same replicas and the same ISR (the same followers to wait for). A
broker leading partitions of several such groups is sent one request per group, each on its
own lane, so a group that cannot complete stalls only itself. (A partition whose leadership
just moved away from a cut broker has a smaller ISR than the new leader's other partitions
of that topic, which still wait for the cut broker to leave theirs: they must not share.)

A partition keeps its lane while it has batches in flight: its batches then reach the leader
in the order they were numbered (one connection delivers in order), and a retried batch is
never overtaken. Lanes are bounded per broker (`lanes_max`): a new group takes the lane
fewest groups in use share, and a group sharing its lane moves to one no group uses as soon
as a lane is free (at a batch of a partition with none in flight). A group is in use while
some partition has batches in flight in it (`release` when none is left); one no partition
uses any more is forgotten at once.
(Counting the groups seen before, every ISR a partition went through, and keeping a lane
shared once more groups had been in use, put two groups on one lane while lanes were free:
in one-way cuts a broker's `quorum` partitions waited 1.9-2 s behind its `isr` ones.)
Pure: no sockets, no clock.
"""
from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Protocol, TypeVar

from dataplane.client.records import TopicPartition

FateKey = tuple[str, tuple[int, ...], tuple[int, ...]]


class _HasPartition(Protocol):
    @property
    def tp(self) -> TopicPartition: ...


B = TypeVar("B", bound=_HasPartition)


def fate_key(tp: TopicPartition, replicas: tuple[int, ...], isr: tuple[int, ...]) -> FateKey:
    """Partitions with the same key stall together under any cut: same topic, replicas, ISR."""
    return (tp.topic, tuple(sorted(replicas)), tuple(sorted(isr)))


class Lanes:
    def __init__(self, lanes_max: int) -> None:
        if type(lanes_max) is not int or lanes_max < 1:
            raise ValueError(f"produce_lanes_per_broker_max={lanes_max!r} must be a positive integer "
                             "(connections per broker for produce requests; 1: one, as Kafka's producer)")
        self.lanes_max = lanes_max
        # broker -> group key -> [lane, partitions pinned to it (batches in flight, or the batch
        # drained last)]: the groups in use only, and how many of them each lane carries.
        self._groups: dict[int, dict[Hashable, list[int]]] = {}
        self._load: dict[int, list[int]] = {}
        self._pinned: dict[TopicPartition, tuple[int, int, Hashable]] = {}  # tp -> (broker, lane, key) last sent

    def lane(self, broker: int, tp: TopicPartition, key: Hashable, *, others_in_flight: bool) -> int:
        """The lane for a batch of tp to `broker`. others_in_flight: tp has other batches
        awaiting an answer (then it stays on the lane they went on, if to the same broker)."""
        pinned = self._pinned.get(tp)
        if pinned is not None and pinned[0] == broker and others_in_flight:
            return pinned[1]
        if pinned is not None and (pinned[0] != broker or pinned[2] != key):
            self._leave(pinned[0], pinned[2])
            pinned = None
        groups = self._groups.setdefault(broker, {})
        load = self._load.setdefault(broker, [0] * self.lanes_max)
        entry = groups.get(key)
        if entry is None:
            entry = groups[key] = [min(range(self.lanes_max), key=load.__getitem__), 0]
            load[entry[0]] += 1
        elif load[entry[0]] > 1 and 0 in load:
            # It shares its lane (given when more groups were in use) while one carries none.
            load[entry[0]] -= 1
            entry[0] = load.index(0)
            load[entry[0]] += 1
        if pinned is None:
            entry[1] += 1
        self._pinned[tp] = (broker, entry[0], key)
        return entry[0]

    def release(self, tp: TopicPartition) -> None:
        """tp has nothing in flight: its group no longer holds a lane for it (a partition the
        producer stopped writing, or wrote last to a broker no longer its leader, would)."""
        pinned = self._pinned.pop(tp, None)
        if pinned is not None:
            self._leave(pinned[0], pinned[2])

    def _leave(self, broker: int, key: Hashable) -> None:
        """A partition's batches no longer go in group `key` of `broker`: the group is forgotten
        once none does."""
        groups = self._groups[broker]
        entry = groups[key]
        entry[1] -= 1
        if entry[1] == 0:
            del groups[key]
            self._load[broker][entry[0]] -= 1

    def split(self, broker: int, batches: list[B], key_of: Callable[[TopicPartition], Hashable],
              others_in_flight: Callable[[TopicPartition], bool]) -> dict[int, list[B]]:
        """Group one broker's drained batches into one list per lane."""
        out: dict[int, list[B]] = {}
        for batch in batches:
            tp = batch.tp
            lane = self.lane(broker, tp, key_of(tp), others_in_flight=others_in_flight(tp))
            out.setdefault(lane, []).append(batch)
        return out
