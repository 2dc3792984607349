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


def expected_links(image: MetadataImage, me: int, bound_ms: int) -> list[Expected]:
    """The replication links broker `me` should hear on, from the metadata it applied: as a
    follower, from its leader; as a leader, from each unfenced follower."""
    out = []
    for p in image.partitions():
        leader = p.leader
        if leader is None or me not in p.replicas or not image.is_unfenced(leader):
            continue
        config = image.topics[p.topic].config
        # isr: reported before the leader would shrink the ISR to itself.
        link_bound = bound_ms if config.commit_policy == "quorum" else min(bound_ms, config.replica_lag_time_max_ms // 2)
        tp = TopicPartition(p.topic, p.partition)
        if leader != me:
            out.append(Expected(tp, p.leader_epoch, leader, link_bound))
        else:
            out += [Expected(tp, p.leader_epoch, f, link_bound) for f in p.replicas
                    if f != me and image.is_unfenced(f)]
    return out


class PeerContact:
    """Pass the same `expected` list object while the metadata is unchanged: the links are
    then grouped once, and a check costs one comparison per peer heard within its tightest
    bound (walking every link each time was a large share of an idle broker's work with
    thousands of partitions)."""

    def __init__(self) -> None:
        self._heard_ms: dict[int, int] = {}
        self._expected_since: dict[tuple[TopicPartition, int, int], int] = {}
        self._expected: list[Expected] | None = None
        self._by_peer: dict[int, tuple[int, list[tuple[int, Expected]]]] = {}   # peer -> (least bound, links)

    def heard(self, peer: int, now_ms: int) -> None:
        self._heard_ms[peer] = now_ms

    def unreachable(self, expected: list[Expected], now_ms: int) -> list[Expected]:
        """The expected links silent for their bound, in `expected`'s order. Links not
        expected any more are forgotten."""
        if expected is not self._expected:
            self._expect(expected, now_ms)
        out: list[tuple[int, Expected]] = []
        for peer, (least_bound, links) in self._by_peer.items():
            heard = self._heard_ms.get(peer)
            if heard is not None and now_ms - heard <= least_bound:
                continue   # each link's last word is at least this recent
            for i, e in links:
                start = self._expected_since[(e.tp, e.leader_epoch, e.peer)]
                if now_ms - max(start, heard if heard is not None else start) > e.bound_ms:
                    out.append((i, e))
        out.sort(key=lambda pair: pair[0])
        return [e for _, e in out]

    def _expect(self, expected: list[Expected], now_ms: int) -> None:
        since: dict[tuple[TopicPartition, int, int], int] = {}
        by_peer: dict[int, tuple[int, list[tuple[int, Expected]]]] = {}
        for i, e in enumerate(expected):
            key = (e.tp, e.leader_epoch, e.peer)
            since[key] = self._expected_since.get(key, now_ms)
            least, links = by_peer.get(e.peer, (e.bound_ms, []))
            links.append((i, e))
            by_peer[e.peer] = (min(least, e.bound_ms), links)
        self._expected_since, self._by_peer, self._expected = since, by_peer, expected

    def forget_silence(self) -> None:
        """Start every link's bound afresh: this broker itself was not running (its event loop
        stalled), so what it did not hear meanwhile says nothing about its peers."""
        self._expected_since = {}
        self._expected = None
        self._heard_ms.clear()
