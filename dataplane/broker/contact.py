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
    def __init__(self) -> None:
        self._heard_ms: dict[int, int] = {}
        self._expected_since: dict[tuple[TopicPartition, int, int], int] = {}

    def heard(self, peer: int, now_ms: int) -> None:
        self._heard_ms[peer] = now_ms

    def unreachable(self, expected: list[Expected], now_ms: int) -> list[Expected]:
        """The expected links silent for their bound. Links not expected any more are forgotten."""
        since: dict[tuple[TopicPartition, int, int], int] = {}
        out = []
        for e in expected:
            key = (e.tp, e.leader_epoch, e.peer)
            start = since[key] = self._expected_since.get(key, now_ms)
            last = max(start, self._heard_ms.get(e.peer, start))
            if now_ms - last > e.bound_ms:
                out.append(e)
        self._expected_since = since
        return out

    def forget_silence(self) -> None:
        """Start every link's bound afresh: this broker itself was not running (its event loop
        stalled), so what it did not hear meanwhile says nothing about its peers."""
        self._expected_since = {}
        self._heard_ms.clear()
