"""Leaders their followers cannot reach: what the data plane sees and the controller cannot.

The controller hears every broker's heartbeats, not replication: a leader cut from its
followers but not from the controller keeps its session, and without more it keeps every
leadership it has while none of them can commit. So each broker's heartbeat names the
replication links it has not used for a bound (`UnreachablePeer`: for this partition at this
leader epoch, no word from that broker, its leader or, for a leader, its follower), and
`move_unreachable_leaders` moves a leadership when the links its leader has left cannot
commit:

- a link leader-follower is broken when either end reports it (a one-way cut breaks
  replication both ways: a fetch answer or an append reply that never arrives);
- `quorum` topics: the leader plus the followers still linked to it are fewer than the
  quorum → the partition is fenced for a quorum election (leader epoch e+1: the old leader
  stops at once when it learns it), and the tracker refuses the old leader's election report
  for that round, so the winner is the best (last epoch, end offset) of the others — safe as
  any quorum election, since they must still number n − q + 1;
- `isr` topics: the leader plus the in-sync followers still linked to it are fewer than
  `min_insync_replicas` (acks=all cannot complete, and shrinking the ISR would only leave
  the leader alone) → the leadership moves to an in-sync follower that reported the leader
  unreachable, and the old leader leaves the ISR with it, as a fenced leader does. Any ISR
  member holds every committed record: a clean election, Kafka's. The move is made when the
  replicas other than the old leader that still heartbeat number at least
  `min_insync_replicas`, even if the new leader starts alone in the ISR: the others rejoin it
  as they catch up, while the cut leader could never have them back. For that candidate to
  still be in sync, the controller refuses the leader's ISR shrink that would leave it below
  `min_insync_replicas` by taking out followers that report it unreachable
  (`refuse_lonely_shrink`): the leader's lag clock may run out before the reports arrive
  (it starts at its own epoch start, often just before the cut), and a leader alone in
  its ISR has no in-sync follower to hand over to. The lag clocks of two followers run out
  apart, so a cut of both often shrinks the ISR one follower at a time: the first shrink
  keeps `min_insync_replicas` and is accepted; the second is the one refused (found by the
  seeded simulation's gray runs, tests/sim).

The leader must count as cut off (`cut_off`): a majority of the partition's replicas says
so (each follower that reports it, and the leader itself when it reports most of its
followers), or the leader alone reports more than half of its followers while they all
heartbeat (Raft's check-quorum: under push replication a cut of the followers' packets to
the leader leaves the followers hearing it, so only the leader can tell). And the move must
help: the others can commit without the old leader. Otherwise the controller's own view
(the leader heartbeats) wins, ties included: one follower's word is that follower's trouble,
which the leader's ISR shrink or the quorum already handles. For `isr` the leadership goes
to an in-sync follower that reported the leader, or, when the leader's own report decided,
to one it reported. Only reports from unfenced
brokers, in their latest heartbeat and no older than `fresh_ms`, count. Flapping is damped: at most one such
decision per partition per `interval_ms`.
Pure: reports and time come in, records go out.
"""
from __future__ import annotations

from dataclasses import dataclass

from common.errors import IneligibleReplicaError
from common.metadata.image import MetadataImage, PartitionInfo
from common.metadata.records import Record
from common.requests import AlterIsrRequest
from controller.decisions.plan import change, choose_leader, fence_for_election, is_quorum

UNREACHABLE_DECISION_INTERVAL_MS = 3000


@dataclass(frozen=True, slots=True)
class Link:
    """`reporter` has not heard from `peer` about `topic`-`partition` at `leader_epoch`."""

    topic: str
    partition: int
    leader_epoch: int
    peer: int


@dataclass(frozen=True, slots=True)
class _Latest:
    links: frozenset[Link]
    at_ms: int     # the heartbeat that carried them


class ReachabilityReports:
    """Each broker's latest report (controller leader memory; bounded by brokers × links)."""

    def __init__(self, *, fresh_ms: int, interval_ms: int = UNREACHABLE_DECISION_INTERVAL_MS) -> None:
        if fresh_ms <= 0 or interval_ms < 0:
            raise ValueError(f"fresh_ms must be > 0 and interval_ms >= 0, got {fresh_ms} and {interval_ms}")
        self.fresh_ms = fresh_ms
        self.interval_ms = interval_ms
        self._latest: dict[int, _Latest] = {}
        self._decided_ms: dict[tuple[str, int], int] = {}

    def note(self, broker_id: int, links: list[Link], now_ms: int) -> None:
        """A heartbeat's whole report: it replaces the broker's last one (empty: all is well)."""
        self._latest[broker_id] = _Latest(frozenset(links), now_ms)

    def named(self) -> set[tuple[str, int]]:
        """The partitions some broker's latest report names: the only ones `broken` can find
        a link of (a pass looks at these, not at every partition)."""
        return {(link.topic, link.partition) for latest in self._latest.values() for link in latest.links}

    def alive(self, image: MetadataImage, broker_id: int, now_ms: int) -> bool:
        """Unfenced and heard from (any heartbeat) within fresh_ms."""
        latest = self._latest.get(broker_id)
        return latest is not None and now_ms - latest.at_ms <= self.fresh_ms and image.is_unfenced(broker_id)

    def broken(self, image: MetadataImage, p: PartitionInfo, now_ms: int) -> set[int]:
        """The followers of p's leader whose link with it either end reports broken now."""
        leader = p.leader
        assert leader is not None
        out = set()
        for follower in p.replicas:
            if follower == leader:
                continue
            if self._says(image, follower, Link(p.topic, p.partition, p.leader_epoch, leader), now_ms) \
                    or self._says(image, leader, Link(p.topic, p.partition, p.leader_epoch, follower), now_ms):
                out.add(follower)
        return out

    def _says(self, image: MetadataImage, reporter: int, link: Link, now_ms: int) -> bool:
        latest = self._latest.get(reporter)
        return self.alive(image, reporter, now_ms) and latest is not None and link in latest.links

    def votes(self, image: MetadataImage, p: PartitionInfo, now_ms: int) -> int:
        """Replicas that say p's leader is cut off: each follower reporting it, and the
        leader itself when it reports more than half of its followers."""
        followers = [f for f in p.replicas if f != p.leader]
        return len(self.reported_by(image, p, now_ms)) + (1 if 2 * len(self.reported_by_leader(image, p, now_ms))
                                                          > len(followers) else 0)

    def cut_off(self, image: MetadataImage, p: PartitionInfo, now_ms: int) -> bool:
        """Whether p's leader counts as cut off from its followers: a majority of the replicas
        says so, or the leader itself hears nothing from more than half of its followers while
        they heartbeat (Raft's check-quorum: a leader that hears no majority steps down). The
        second covers a cut of the followers' packets to the leader only, under push
        replication: the followers hear the leader's append-entries and report nothing."""
        if 2 * self.votes(image, p, now_ms) > len(p.replicas):
            return True
        followers = [f for f in p.replicas if f != p.leader]
        silent = self.reported_by_leader(image, p, now_ms)
        return 2 * len(silent) > len(followers) and all(self.alive(image, f, now_ms) for f in silent)

    def reported_by(self, image: MetadataImage, p: PartitionInfo, now_ms: int) -> set[int]:
        """The followers that themselves report p's leader unreachable."""
        leader = p.leader
        assert leader is not None
        return {f for f in p.replicas if f != leader
                and self._says(image, f, Link(p.topic, p.partition, p.leader_epoch, leader), now_ms)}

    def reported_by_leader(self, image: MetadataImage, p: PartitionInfo, now_ms: int) -> set[int]:
        """The followers p's leader reports it has not heard from."""
        leader = p.leader
        assert leader is not None
        return {f for f in p.replicas if f != leader
                and self._says(image, leader, Link(p.topic, p.partition, p.leader_epoch, f), now_ms)}

    def candidates(self, image: MetadataImage, p: PartitionInfo, now_ms: int) -> set[int]:
        """In-sync followers to move an isr leadership to: those reporting the leader, else
        (check-quorum) those the leader reports, if alive."""
        reporters = self.reported_by(image, p, now_ms) & set(p.isr)
        if reporters:
            return reporters
        return {f for f in self.reported_by_leader(image, p, now_ms) & set(p.isr) if self.alive(image, f, now_ms)}

    def others_alive(self, image: MetadataImage, p: PartitionInfo, now_ms: int) -> list[int]:
        """p's replicas other than its leader that are alive: those a move could rely on."""
        return [b for b in p.replicas if b != p.leader and self.alive(image, b, now_ms)]

    def may_decide(self, p: PartitionInfo, now_ms: int) -> bool:
        last = self._decided_ms.get(p.tp)
        return last is None or now_ms - last >= self.interval_ms

    def decided(self, p: PartitionInfo, now_ms: int) -> None:
        self._decided_ms[p.tp] = now_ms

    def forget_broker(self, broker_id: int) -> None:
        self._latest.pop(broker_id, None)


@dataclass(frozen=True, slots=True)
class Exclusion:
    """A quorum election started because `leader` was unreachable: its report is refused
    until `until_ms`, one decision interval (QuorumElectionTracker.exclude says why not longer)."""

    topic: str
    partition: int
    fenced_epoch: int
    leader: int
    until_ms: int


def move_unreachable_leaders(image: MetadataImage, reports: ReachabilityReports,
                             now_ms: int) -> tuple[list[Record], list[Exclusion]]:
    """The records moving every leadership its followers' links cannot commit with, and the
    old leaders to keep out of the quorum elections this starts."""
    records: list[Record] = []
    exclusions: list[Exclusion] = []
    for tp in sorted(reports.named()):
        p = image.get_partition(*tp)
        if p is None or p.leader is None or not image.is_unfenced(p.leader) or not reports.may_decide(p, now_ms):
            continue
        leader = p.leader
        broken = reports.broken(image, p, now_ms)
        # A majority of the replicas must say the leader is cut off: one follower's word, or
        # the leader's about one follower, is that follower's trouble, not the leader's.
        if not broken or not reports.cut_off(image, p, now_ms):
            continue
        config = image.topics[p.topic].config
        others = reports.others_alive(image, p, now_ms)
        if is_quorum(image, p):
            q = min(config.quorum_acks, len(p.replicas))
            linked = 1 + sum(1 for f in p.replicas if f != leader and f not in broken)
            # Only when the leader cannot commit, the others can elect without its report
            # (n - q + 1 of them) and a new leader among them can commit without it (q).
            if linked >= q or len(others) < max(q, len(p.replicas) - q + 1):
                continue
            records.append(fence_for_election(
                image, p, reason=f"leader {leader} unreachable: no link to followers {sorted(broken)}"))
            exclusions.append(Exclusion(p.topic, p.partition, p.leader_epoch + 1, leader,
                                        until_ms=now_ms + reports.interval_ms))
        else:
            linked = 1 + sum(1 for f in p.isr if f != leader and f not in broken)
            # Only when the leader cannot meet min_insync_replicas and the others can, once
            # they have caught up with the new leader.
            if linked >= config.min_insync_replicas or len(others) < config.min_insync_replicas:
                continue
            new = choose_leader(image, p, (f for f in p.isr if f in reports.candidates(image, p, now_ms)))
            if new is None:
                continue
            records.append(change(p, leader=new, isr=tuple(b for b in p.isr if b != leader),
                                  reason=f"leader {leader} unreachable from in-sync followers {sorted(broken)}"))
        reports.decided(p, now_ms)
    return records, exclusions


def refuse_lonely_shrink(image: MetadataImage, request: AlterIsrRequest, reports: ReachabilityReports,
                         now_ms: int) -> None:
    """Raise IneligibleReplicaError for an isr leader's ISR shrink below min_insync_replicas
    that removes followers reporting that leader unreachable, while a majority says so: the
    leadership moves to one of them instead (`move_unreachable_leaders`). Refusing a shrink
    never endangers a committed record (a larger ISR commits less); the leader could not
    acknowledge acks=all below min_insync_replicas anyway."""
    p = image.get_partition(request.topic, request.partition)
    if p is None or p.leader != request.broker_id or is_quorum(image, p):
        return
    config = image.topics[p.topic].config
    removed = set(p.isr) - set(request.new_isr)
    others = reports.others_alive(image, p, now_ms)
    # Only while a move is possible (`move_unreachable_leaders`): the replicas without the
    # leader can meet min_insync_replicas.
    if not removed or len(request.new_isr) >= config.min_insync_replicas \
            or len(others) < config.min_insync_replicas:
        return
    reporters = removed & reports.candidates(image, p, now_ms)
    if not reporters or not reports.cut_off(image, p, now_ms):
        return
    raise IneligibleReplicaError(
        f"ISR change for {p.topic}-{p.partition}: followers {sorted(reporters)} report leader {p.leader} "
        f"unreachable; the controller moves the leadership to an in-sync one rather than leave the leader "
        f"alone below min_insync_replicas={config.min_insync_replicas}", broker_id=min(reporters))
