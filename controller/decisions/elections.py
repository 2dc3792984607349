"""Leader elections.

`isr` topics: the new leader comes from ISR ∩ unfenced, highest priority first,
ties by replica order; one record. Outside the ISR (unclean) only when the
topic allows it, and then the ISR restarts as just the new leader.

`quorum` topics (KIP-250 with the two corrections in docs/design.md#elections):
1. `fence_for_election` appends a change with no leader at leader epoch e+1;
   replicas that learn it stop accepting epoch <= e, flush, and report the
   (last batch epoch, end offset) of their flushed log.
2. `QuorumElectionTracker` collects those reports (in memory, on the
   controller leader). With reports from n − q + 1 unfenced replicas, at least
   one of them holds every acknowledged record, and `elect_quorum` picks the
   greatest (last_epoch, end_offset) as a pair, then priority, then replica
   order. A longer log from an older epoch loses to a shorter one from a newer
   epoch: the longer one holds records the newer leader overwrote.
   The new leader's ISR is the set of unfenced replicas that reported: they are
   known to be alive; the leader re-grows it as others catch up.
   The leader takes epoch e+2 (any leader change bumps the epoch).
   A replica whose log took records under durability=write (its topic is, or
   was, under write), restarted after a crash and not caught up since, reports
   `unclean`: a committed record it counted may be gone from it,
   so it is not one of the n − q + 1. Unclean reports count only once every
   replica has reported: then no replica can hold more than the winner, and
   waiting would only leave the partition leaderless for good (nobody can catch
   up without a leader).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from common.epochs import EpochCheck, check_epoch
from common.metadata.image import MetadataImage, PartitionInfo
from common.metadata.records import PartitionChange, Record
from common.requests import ElectionReport
from controller.decisions.plan import (
    change,
    choice_key,
    choose_leader,
    fence_for_election,
    is_quorum,
    without_broker,
)

# A quorum election waiting this long gets a WARNING naming what it lacks (then again as often).
STALLED_ELECTION_MS = 5_000

__all__ = [
    "elect_isr_leader", "fence_for_election", "QuorumElectionTracker", "elect_quorum",
    "quorum_reports_needed", "quorum_reports_enough", "best_report", "best_report_oracle", "elect_leaders",
    "move_fenced_leaders",
]


def elect_isr_leader(image: MetadataImage, p: PartitionInfo, *,
                     reason: str = "election") -> PartitionChange | None:
    """The record electing a leader for an `isr` partition, or None when nobody is eligible."""
    leader = choose_leader(image, p, p.isr)
    if leader is not None:
        return None if leader == p.leader else change(p, leader=leader, reason=reason)
    if not image.topics[p.topic].config.unclean_leader_election:
        return None
    leader = choose_leader(image, p, p.replicas)
    if leader is None:
        return None
    return change(p, leader=leader, isr=(leader,), reason=f"unclean {reason}")


def quorum_reports_needed(image: MetadataImage, p: PartitionInfo) -> int:
    """n − q + 1: any q replicas holding a record intersect any n − q + 1 reporters."""
    q = image.topics[p.topic].config.quorum_acks
    return len(p.replicas) - min(q, len(p.replicas)) + 1


def quorum_reports_enough(image: MetadataImage, p: PartitionInfo, reports: Iterable[ElectionReport]) -> bool:
    """n − q + 1 clean reports (one of them holds every committed record), or a report from
    every replica (none holds more than the best of them). `reports`: one per replica."""
    reports = list(reports)
    clean = sum(1 for r in reports if not r.unclean)
    return clean >= quorum_reports_needed(image, p) or len(reports) >= len(p.replicas)


@dataclass(frozen=True, slots=True)
class _Round:
    fenced_epoch: int
    reports: Mapping[int, ElectionReport]


class QuorumElectionTracker:
    """Election reports per partition for its current fenced epoch (controller leader memory).

    Bounded: one round per partition, at most one report per replica in it.
    """

    def __init__(self) -> None:
        self._rounds: dict[tuple[str, int], _Round] = {}
        # Rounds started because the followers could not reach their leader: (fenced epoch,
        # that leader, until when), whose report the round refuses for a while
        # (controller/decisions/reachability.py).
        self._excluded: dict[tuple[str, int], tuple[int, int, int | None]] = {}
        # Rounds seen waiting: (fenced epoch, since when, when last said) for `stalled`.
        self._waiting: dict[tuple[str, int], tuple[int, int, int | None]] = {}

    def exclude(self, topic: str, partition: int, fenced_epoch: int, broker_id: int,
                until_ms: int | None = None) -> None:
        """Refuse broker_id's report in the round at fenced_epoch until `until_ms` (None: for
        the whole round), so that the others elect. Only for a while: the others' reports
        may not be enough without it (durability=write after a crash needs every replica's
        report when some are unclean), and a round that cannot finish leaves the partition
        without a leader; refusing the old leader is for liveness, never needed for safety."""
        self._excluded[(topic, partition)] = (fenced_epoch, broker_id, until_ms)

    def add(self, image: MetadataImage, report: ElectionReport, now_ms: int | None = None) -> str | None:
        """Record `report`; returns None when kept, else why it was ignored. `now_ms` ends
        exclusions whose time is up (None: exclusions hold)."""
        p = image.get_partition(report.topic, report.partition)
        if p is None:
            return f"unknown partition {report.topic}-{report.partition}"
        if not p.fenced_for_election:
            return f"{report.topic}-{report.partition} is not waiting for an election"
        if check_epoch(theirs=report.fenced_epoch, ours=p.leader_epoch) is not EpochCheck.CURRENT:
            return (f"report for fenced epoch {report.fenced_epoch}, election is at "
                    f"{p.leader_epoch}")
        if report.broker_id not in p.replicas:
            return f"broker {report.broker_id} is not a replica of {report.topic}-{report.partition}"
        key = (report.topic, report.partition)
        excluded = self._excluded.get(key)
        if excluded is not None and excluded[:2] == (report.fenced_epoch, report.broker_id) \
                and (excluded[2] is None or now_ms is None or now_ms < excluded[2]):
            return (f"broker {report.broker_id} led {report.topic}-{report.partition} until its followers "
                    f"reported it unreachable; the others elect")
        current = self._rounds.get(key)
        if current is None or current.fenced_epoch != report.fenced_epoch:
            current = _Round(report.fenced_epoch, {})
        if report.broker_id in current.reports:
            return f"duplicate report from broker {report.broker_id}"
        self._rounds[key] = _Round(current.fenced_epoch,
                                   {**current.reports, report.broker_id: report})
        return None

    def reports(self, p: PartitionInfo) -> list[ElectionReport]:
        """Reports for p's current fenced epoch, in replica order."""
        current = self._rounds.get(p.tp)
        if current is None or current.fenced_epoch != p.leader_epoch:
            return []
        return [current.reports[b] for b in p.replicas if b in current.reports]

    def forget_stale(self, image: MetadataImage) -> None:
        """Drop rounds for partitions gone or no longer at that fenced epoch, and exclusions
        whose round is over (an exclusion decided in this pass is for the epoch ahead)."""
        for key, (epoch, _, _) in list(self._excluded.items()):
            p = image.get_partition(*key)
            if p is None or p.leader_epoch > epoch or (p.leader_epoch == epoch and not p.fenced_for_election):
                del self._excluded[key]
        for key in list(self._rounds):
            p = image.get_partition(*key)
            if p is None or not p.fenced_for_election \
                    or p.leader_epoch != self._rounds[key].fenced_epoch:
                del self._rounds[key]

    def stalled(self, image: MetadataImage, now_ms: int, *, after_ms: int = STALLED_ELECTION_MS) -> list[str]:
        """Operators' word on quorum elections waiting longer than `after_ms`, each at most once
        per `after_ms`: what is in and what is missing (a partition without a leader cannot
        take writes; the missing replicas are what to look at)."""
        out: list[str] = []
        waiting: dict[tuple[str, int], tuple[int, int, int | None]] = {}
        for p in image.leaderless_partitions():
            if not p.fenced_for_election:
                continue
            epoch, since, said = self._waiting.get(p.tp, (p.leader_epoch, now_ms, None))
            if epoch != p.leader_epoch:
                epoch, since, said = p.leader_epoch, now_ms, None
            if now_ms - since >= after_ms and (said is None or now_ms - said >= after_ms):
                said = now_ms
                out.append(self._describe(image, p, now_ms - since, now_ms))
            waiting[p.tp] = (epoch, since, said)
        self._waiting = waiting
        return out

    def _describe(self, image: MetadataImage, p: PartitionInfo, waited_ms: int, now_ms: int) -> str:
        got = {r.broker_id: r for r in self.reports(p)}
        excluded = self._excluded.get(p.tp)
        parts = []
        for b in p.replicas:
            r = got.get(b)
            if r is not None:
                what = (f"{'unclean' if r.unclean else 'clean'} report (epoch {r.last_epoch}, "
                        f"offset {r.end_offset})")
                if not image.is_unfenced(b):
                    what += ", but fenced"
            elif not image.is_unfenced(b):
                what = "fenced, no report"
            elif excluded is not None and excluded[:2] == (p.leader_epoch, b) \
                    and (excluded[2] is None or now_ms < excluded[2]):
                what = "old leader, report refused for now"
            else:
                what = "no report"
            parts.append(f"broker {b}: {what}")
        return (f"quorum election for {p.topic}-{p.partition} at fenced epoch {p.leader_epoch} has waited "
                f"{waited_ms / 1000:.1f} s for reports ({quorum_reports_needed(image, p)} clean ones or "
                f"one from every replica): {'; '.join(parts)}")

    def __len__(self) -> int:
        return len(self._rounds)


def _report_key(image: MetadataImage, p: PartitionInfo, r: ElectionReport) -> tuple[int, ...]:
    return (r.last_epoch, r.end_offset) + choice_key(image, p, r.broker_id)


def best_report(image: MetadataImage, p: PartitionInfo,
                reports: Iterable[ElectionReport]) -> ElectionReport | None:
    """The report with the greatest (last_epoch, end_offset), then a broker not in maintenance,
    then priority, then replica order."""
    reports = list(reports)
    if not reports:
        return None
    return max(reports, key=lambda r: _report_key(image, p, r))


def best_report_oracle(image: MetadataImage, p: PartitionInfo,
                       reports: list[ElectionReport]) -> ElectionReport | None:
    """Naive twin of `best_report` for tests: one pass, each rule spelled out."""
    best = None
    for r in reports:
        if best is None:
            best = r
            continue
        if r.last_epoch != best.last_epoch:
            better = r.last_epoch > best.last_epoch
        elif r.end_offset != best.end_offset:
            better = r.end_offset > best.end_offset
        elif image.in_maintenance(r.broker_id) != image.in_maintenance(best.broker_id):
            better = not image.in_maintenance(r.broker_id)
        elif image.priority(r.broker_id) != image.priority(best.broker_id):
            better = image.priority(r.broker_id) > image.priority(best.broker_id)
        else:
            better = p.replicas.index(r.broker_id) < p.replicas.index(best.broker_id)
        if better:
            best = r
    return best


def elect_quorum(image: MetadataImage, p: PartitionInfo,
                 reports: Iterable[ElectionReport]) -> PartitionChange | None:
    """Step two: the record electing a leader once enough reports are in, else None."""
    if not p.fenced_for_election:
        return None
    valid = [r for r in reports
             if r.fenced_epoch == p.leader_epoch and r.broker_id in p.replicas
             and image.is_unfenced(r.broker_id)]
    by_broker = {r.broker_id: r for r in valid}  # one per replica
    if not quorum_reports_enough(image, p, by_broker.values()):
        return None
    winner = best_report(image, p, by_broker.values())
    assert winner is not None
    isr = tuple(b for b in p.replicas if b in by_broker)
    assert winner.broker_id in isr
    unclean = sum(1 for r in by_broker.values() if r.unclean)
    return change(p, leader=winner.broker_id, isr=isr,
                  reason=f"quorum election: {len(by_broker)} reports"
                         f"{f' ({unclean} unclean)' if unclean else ''}, best "
                         f"(epoch {winner.last_epoch}, offset {winner.end_offset})")


def move_fenced_leaders(image: MetadataImage) -> list[Record]:
    """Repair: take leadership from any fenced leader. Decisions never leave one, but a
    fence decided on a stale view can apply while the partition change that went with
    it is rejected for its stale epoch; this puts things right on the next round."""
    records: list[Record] = []
    if not any(image.leader_count(b) for b, info in image.brokers.items() if info.fenced):
        return records   # the usual case, known without a walk over every partition
    for p in image.partitions():
        if p.leader is not None and not image.is_unfenced(p.leader):
            c = without_broker(image, p, p.leader, leave_isr=False, reason="leader is fenced")
            assert c is not None
            records.append(c)
    return records


def elect_leaders(image: MetadataImage, tracker: QuorumElectionTracker) -> list[Record]:
    """Records electing a leader for every leaderless partition that can have one now.

    Quorum partitions without a leader that are not yet fenced get step one;
    fenced ones get step two when their reports are in.
    """
    records: list[Record] = []
    for p in image.leaderless_partitions():
        if is_quorum(image, p):
            if not p.fenced_for_election:
                records.append(fence_for_election(image, p, reason="leaderless"))
            else:
                elected = elect_quorum(image, p, tracker.reports(p))
                if elected is not None:
                    records.append(elected)
        else:
            elected = elect_isr_leader(image, p)
            if elected is not None:
                records.append(elected)
    return records
