"""Which replication links this broker has not used for a bound: what its heartbeats report.

The controller hears heartbeats, not replication (controller/decisions/reachability.py).
Every word from a peer broker on a replication path counts as contact with it: a fetch
answer from a leader (pull), an append-entries from a leader (push: a partition's, or, while
they are quiet, the broker pair's heartbeat every push_heartbeat_ms, pusher.py), a
follower's fetch request (pull) and its append reply (push). A link — (partition, leader epoch, peer) — is reported once nothing came from the
peer for `bound_ms` since the later of the last contact and the moment this broker started
expecting it (it became leader or follower at that epoch), so a leader change or a start is
not reported as a cut. A broker whose own event loop stalled forgets the silence it did not
hear through (`forget_silence`): a stall of its own is not its peers' silence. Pure: time is
an argument.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from common.metadata.image import MetadataImage
from common.topic_partition import TopicPartition


@dataclass(frozen=True, slots=True)
class Expected:
    """This broker expects to hear from `peer` about `tp` at `leader_epoch`, within bound_ms."""

    tp: TopicPartition
    leader_epoch: int
    peer: int
    bound_ms: int


def topic_links(image: MetadataImage, topic: str, me: int, bound_ms: int) -> tuple[Expected, ...]:
    """The replication links broker `me` should hear on for one topic, from the metadata it
    applied: as a follower, from its leader; as a leader, from each unfenced follower."""
    config = image.topics[topic].config
    # isr: reported before the leader would shrink the ISR to itself.
    link_bound = bound_ms if config.commit_policy == "quorum" else min(bound_ms, config.replica_lag_time_max_ms // 2)
    out: list[Expected] = []
    for p in image.topic_partitions(topic):
        leader = p.leader
        if leader is None or me not in p.replicas or not image.is_unfenced(leader):
            continue
        tp = TopicPartition(p.topic, p.partition)
        if leader != me:
            out.append(Expected(tp, p.leader_epoch, leader, link_bound))
        else:
            out += [Expected(tp, p.leader_epoch, f, link_bound) for f in p.replicas
                    if f != me and image.is_unfenced(f)]
    return tuple(out)


def expected_links(image: MetadataImage, me: int, bound_ms: int) -> list[Expected]:
    """Every topic's links (`topic_links`), in topic order."""
    return [e for topic in sorted(image.topics) for e in topic_links(image, topic, me, bound_ms)]


@dataclass(frozen=True, slots=True)
class _Group:
    """One group of expected links (a topic's, as the broker passes them), as last told."""

    links: Sequence[Expected]
    since: dict[tuple[TopicPartition, int, int], int]   # when each link became expected
    least: dict[int, int]                               # per peer: the tightest bound of its links


class PeerContact:
    """Pass the same `expected` object while the metadata is unchanged, and, as groups (a
    mapping of one sequence per topic), the same sequence for a group that did not change:
    only changed groups are worked out again, and a check costs one comparison per peer heard
    within its tightest bound (walking every link was a large share of an idle broker's work
    with thousands of partitions, and working them all out again on each metadata change a
    fifth of it while thousands of replicas opened). A plain sequence is one group."""

    def __init__(self) -> None:
        self._heard_ms: dict[int, int] = {}
        self._expected: object = None
        self._groups: dict[str, _Group] = {}
        self._least: dict[int, int] = {}   # per peer: the tightest bound of all its links

    def heard(self, peer: int, now_ms: int) -> None:
        self._heard_ms[peer] = now_ms

    def unreachable(self, expected: Sequence[Expected] | Mapping[str, Sequence[Expected]],
                    now_ms: int) -> list[Expected]:
        """The expected links silent for their bound, in `expected`'s order. Links not
        expected any more are forgotten."""
        if expected is not self._expected:
            self._expect(expected, now_ms)
        silent = set()
        for peer, least_bound in self._least.items():
            heard = self._heard_ms.get(peer)
            if heard is None or now_ms - heard > least_bound:
                silent.add(peer)   # else each of its links' last word is at least this recent
        if not silent:
            return []
        out = []
        for group in self._groups.values():
            for e in group.links:
                if e.peer not in silent:
                    continue
                heard = self._heard_ms.get(e.peer)
                start = group.since[(e.tp, e.leader_epoch, e.peer)]
                if now_ms - max(start, heard if heard is not None else start) > e.bound_ms:
                    out.append(e)
        return out

    def _expect(self, expected: Sequence[Expected] | Mapping[str, Sequence[Expected]], now_ms: int) -> None:
        named: Mapping[str, Sequence[Expected]] = expected if isinstance(expected, Mapping) else {"": expected}
        groups: dict[str, _Group] = {}
        for name, links in named.items():
            old = self._groups.get(name)
            if old is not None and old.links is links:
                groups[name] = old
                continue
            before = old.since if old is not None else {}
            since: dict[tuple[TopicPartition, int, int], int] = {}
            least: dict[int, int] = {}
            for e in links:
                key = (e.tp, e.leader_epoch, e.peer)
                since[key] = before.get(key, now_ms)
                least[e.peer] = min(least.get(e.peer, e.bound_ms), e.bound_ms)
            groups[name] = _Group(links, since, least)
        total: dict[int, int] = {}
        for group in groups.values():
            for peer, bound in group.least.items():
                total[peer] = min(total.get(peer, bound), bound)
        self._groups, self._least, self._expected = groups, total, expected

    def forget_silence(self) -> None:
        """Start every link's bound afresh: this broker itself was not running (its event loop
        stalled), so what it did not hear meanwhile says nothing about its peers."""
        self._groups = {}
        self._least = {}
        self._expected = None
        self._heard_ms.clear()
