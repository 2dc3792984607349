"""controller/decisions/reachability.py: leaders their followers cannot reach.

RF 3 on brokers 1..3, broker 1 leading. Each test names the reports (who has not heard
from whom about which partition and epoch) and checks the decision's records."""
from __future__ import annotations

import pytest

from common.errors import IneligibleReplicaError
from common.requests import AlterIsrRequest, ElectionReport
from controller.decisions import (
    BrokerSessions,
    Link,
    QuorumElectionTracker,
    ReachabilityReports,
    elect_leaders,
    move_unreachable_leaders,
    periodic,
    refuse_lonely_shrink,
)
from controller.decisions.plan import change
from metadata_builders import add_topic, apply, cluster

FRESH_MS = 1500


def image_with(policy: str, **config):
    image = cluster(3)
    add_topic(image, "t", [[1, 2, 3]], commit_policy=policy, **config)
    return image


def link(peer: int, epoch: int = 0) -> Link:
    return Link("t", 0, epoch, peer)


def reports(*by: tuple[int, list[Link]], now_ms: int = 1000, interval_ms: int = 3000,
            silent_brokers: tuple[int, ...] = ()) -> ReachabilityReports:
    """Every broker heartbeats at now_ms (but silent_brokers), with the links given."""
    r = ReachabilityReports(fresh_ms=FRESH_MS, interval_ms=interval_ms)
    for broker in (1, 2, 3):
        if broker not in silent_brokers:
            r.note(broker, [], now_ms)
    for broker, links in by:
        r.note(broker, links, now_ms)
    return r


def test_quorum_leader_unreachable_from_both_followers_is_fenced_and_left_out_of_the_election():
    image = image_with("quorum")
    r = reports((2, [link(1)]), (3, [link(1)]))
    records, exclusions = move_unreachable_leaders(image, r, 1000)
    assert len(records) == 1 and records[0].fenced_for_election and records[0].leader == -1
    assert [(e.fenced_epoch, e.leader) for e in exclusions] == [(1, 1)]
    apply(image, records)
    p = image.partition("t", 0)
    tracker = QuorumElectionTracker()
    tracker.exclude("t", 0, 1, 1)
    # The old leader holds the longest log: were its report counted it would win again.
    assert "unreachable" in tracker.add(image, ElectionReport(broker_id=1, topic="t", partition=0, fenced_epoch=1,
                                                              last_epoch=0, end_offset=90))
    for b, end in ((2, 50), (3, 40)):
        assert tracker.add(image, ElectionReport(broker_id=b, topic="t", partition=0, fenced_epoch=1,
                                                 last_epoch=0, end_offset=end)) is None
    (elected,) = elect_leaders(image, tracker)
    assert elected.leader == 2 and elected.isr == (2, 3)


def test_the_leaders_own_report_counts_as_a_vote_and_as_broken_links():
    """A one-way cut: follower 2 hears nothing from the leader; follower 3's answers do not
    reach the leader (3 hears the leader and does not report). Votes: 2, and the leader,
    which reports both followers: a majority; links broken: both."""
    image = image_with("quorum")
    r = reports((1, [link(2), link(3)]), (2, [link(1)]))
    records, _ = move_unreachable_leaders(image, r, 1000)
    assert len(records) == 1 and records[0].fenced_for_election


def test_one_follower_alone_is_not_a_majority():
    image = image_with("quorum")
    assert move_unreachable_leaders(image, reports((2, [link(1)])), 1000)[0] == []


def test_a_leader_that_hears_none_of_its_heartbeating_followers_steps_down():
    """Raft's check-quorum. Push replication with the followers' packets to the leader cut:
    the followers hear the leader's append-entries and report nothing; the leader reports
    both. The seeded simulation's gray runs found such leaders kept their leadership."""
    image = image_with("quorum")
    records, _ = move_unreachable_leaders(image, reports((1, [link(2), link(3)])), 1000)
    assert len(records) == 1 and records[0].fenced_for_election
    # Not when a follower it reports stopped heartbeating: that follower's trouble.
    assert move_unreachable_leaders(image_with("quorum"), reports((1, [link(2), link(3)]), silent_brokers=(3,)),
                                    1000)[0] == []
    # isr: to an in-sync follower the leader reports, none reporting it.
    (c,), _ = move_unreachable_leaders(image_with("isr", min_insync_replicas=2), reports((1, [link(2), link(3)])),
                                       1000)
    assert c.leader in (2, 3) and 1 not in c.isr


def test_no_move_when_the_others_could_not_commit_without_the_leader():
    """quorum_required_acks = 3 of 3: a new leader would need the old one too (a paused
    follower the leader reports must not cost it its leadership)."""
    image = image_with("quorum", quorum_required_acks=3)
    assert move_unreachable_leaders(image, reports((1, [link(2), link(3)]), (2, [link(1)]), (3, [link(1)])),
                                    1000)[0] == []


def test_no_move_to_followers_that_stopped_heartbeating():
    image = image_with("quorum")
    r = reports((1, [link(2), link(3)]), (2, [link(1)]), silent_brokers=(3,))
    assert move_unreachable_leaders(image, r, 1000)[0] == []


def test_a_quorum_leader_that_still_reaches_a_quorum_stays():
    """One follower cut from the leader only: 1 + 1 linked replicas make q = 2."""
    image = image_with("quorum")
    assert move_unreachable_leaders(image, reports((3, [link(1)])), 1000) == ([], [])


def test_reports_for_another_epoch_stale_or_from_fenced_brokers_do_not_count():
    image = image_with("quorum")
    assert move_unreachable_leaders(image, reports((2, [link(1, epoch=5)]), (3, [link(1, epoch=5)])), 1000)[0] == []
    stale = reports((2, [link(1)]), (3, [link(1)]), now_ms=0)
    assert move_unreachable_leaders(image, stale, FRESH_MS + 1)[0] == []
    from common.metadata import FenceBroker
    apply(image, [FenceBroker(broker_id=3, reason="test", at_ms=0)])
    # Broker 3 fenced: its report does not count, and the others could not elect without 1.
    assert move_unreachable_leaders(image, reports((2, [link(1)]), (3, [link(1)])), 1000)[0] == []


def test_an_empty_report_withdraws_the_last_one():
    image = image_with("quorum")
    r = reports((2, [link(1)]), (3, [link(1)]))
    r.note(3, [], 1000)
    r.note(2, [], 1000)
    assert move_unreachable_leaders(image, r, 1000)[0] == []


def test_one_decision_per_interval():
    image = image_with("isr", min_insync_replicas=2)
    r = reports((2, [link(1)]), (3, [link(1)]))
    first, _ = move_unreachable_leaders(image, r, 1000)
    assert len(first) == 1
    # The same facts on the image before the move: nothing again within the interval.
    assert move_unreachable_leaders(image, r, 1000 + 2999)[0] == []
    for b, links in ((1, []), (2, [link(1)]), (3, [link(1)])):
        r.note(b, links, 4000)
    assert len(move_unreachable_leaders(image, r, 4000)[0]) == 1


def test_isr_leader_below_min_insync_moves_to_a_reporting_in_sync_follower_and_leaves_the_isr():
    image = image_with("isr", min_insync_replicas=2)
    records, exclusions = move_unreachable_leaders(image, reports((2, [link(1)]), (3, [link(1)])), 1000)
    assert exclusions == []
    (c,) = records
    assert c.leader == 2 and c.isr == (2, 3) and not c.fenced_for_election
    apply(image, records)
    p = image.partition("t", 0)
    assert (p.leader, p.leader_epoch, p.isr) == (2, 1, (2, 3))


def test_isr_leader_that_can_still_meet_min_insync_keeps_kafkas_shrink():
    """min_insync_replicas=1, or one follower still linked: the leader stays and shrinks
    the ISR itself after replica_lag_time_max_ms, as Kafka's does."""
    assert move_unreachable_leaders(image_with("isr", min_insync_replicas=1),
                                    reports((2, [link(1)]), (3, [link(1)])), 1000)[0] == []
    assert move_unreachable_leaders(image_with("isr", min_insync_replicas=2),
                                    reports((3, [link(1)])), 1000)[0] == []


def test_isr_move_goes_to_an_in_sync_follower():
    """The leader reports both followers and one follower reports it, but that one is out
    of the ISR: the leadership goes to the in-sync follower the leader reports, never to
    the out-of-sync one."""
    image = image_with("isr", min_insync_replicas=2)
    p = image.partition("t", 0)
    apply(image, [change(p, isr=(1, 3), reason="test")])
    (c,), _ = move_unreachable_leaders(image, reports((1, [link(2), link(3)]), (2, [link(1)])), 1000)
    assert c.leader == 3 and c.isr == (3,)


def test_isr_no_move_when_the_replicas_without_the_leader_could_not_meet_min_insync():
    image = image_with("isr", min_insync_replicas=3)
    assert move_unreachable_leaders(image, reports((2, [link(1)]), (3, [link(1)])), 1000)[0] == []
    # A majority says the leader is cut off (2, and the leader about both followers), but 3
    # stopped heartbeating: 2 alone could not meet min_insync_replicas=2.
    image = image_with("isr", min_insync_replicas=2)
    r = reports((1, [link(2), link(3)]), (2, [link(1)]), silent_brokers=(3,))
    assert move_unreachable_leaders(image, r, 1000)[0] == []


def test_isr_leader_left_with_one_in_sync_follower_moves_to_it_and_the_other_rejoins_later():
    """A cut of both followers shrank the ISR by one first (the lag clocks ran out apart):
    ISR (1, 2). The leader cannot meet min_insync_replicas=2 with 2 cut off, while 2 and 3,
    who reach each other, can once 3 catches up: the leadership moves to 2, alone in the ISR
    for now (the seeded simulation's gray runs found the leader kept it, seeds 11 and 28)."""
    image = image_with("isr", min_insync_replicas=2)
    p = image.partition("t", 0)
    apply(image, [change(p, isr=(1, 2), reason="test")])
    (c,), _ = move_unreachable_leaders(image, reports((2, [link(1, epoch=0)]), (3, [link(1, epoch=0)])), 1000)
    assert c.leader == 2 and c.isr == (2,)


def test_periodic_runs_the_decision_and_then_the_election_step():
    image = image_with("quorum")
    sessions = BrokerSessions(session_timeout_ms=FRESH_MS, started_at_ms=0)
    for b in (1, 2, 3):
        sessions.heartbeat(b, "i0", 1000, image.offset)
    tracker = QuorumElectionTracker()
    r = reports((2, [link(1)]), (3, [link(1)]))
    records = periodic(image, sessions, tracker, 1000, reachability=r)
    assert any(getattr(rec, "fenced_for_election", False) for rec in records)
    apply(image, records)
    assert "unreachable" in tracker.add(image, ElectionReport(broker_id=1, topic="t", partition=0, fenced_epoch=1,
                                                              last_epoch=0, end_offset=9))


def test_a_shrink_that_would_leave_the_leader_alone_is_refused_while_its_followers_report_it():
    image = image_with("isr", min_insync_replicas=2)
    p = image.partition("t", 0)

    def shrink(new_isr):
        return AlterIsrRequest(broker_id=1, topic="t", partition=0, leader_epoch=p.leader_epoch,
                               partition_epoch=p.partition_epoch, new_isr=new_isr)
    cut_off = reports((2, [link(1)]), (3, [link(1)]))
    with pytest.raises(IneligibleReplicaError, match="report leader 1 unreachable"):
        refuse_lonely_shrink(image, shrink((1,)), cut_off, 1000)
    # Kafka's shrink otherwise: one follower out (the ISR still meets min_insync_replicas),
    # one follower's word alone, or nobody reporting the leader.
    refuse_lonely_shrink(image, shrink((1, 2)), cut_off, 1000)
    refuse_lonely_shrink(image, shrink((1,)), reports((3, [link(1)])), 1000)
    refuse_lonely_shrink(image, shrink((1,)), reports(), 1000)
    # The second shrink of a cut that took the followers out one at a time is refused too:
    # the leadership can still move to 2, and 3 rejoin it.
    apply(image, [change(p, isr=(1, 2), reason="test")])
    p = image.partition("t", 0)
    with pytest.raises(IneligibleReplicaError, match="report leader 1 unreachable"):
        refuse_lonely_shrink(image, shrink((1,)), cut_off, 1000)
    # The replicas without the leader could not meet min_insync_replicas: no move could follow.
    refuse_lonely_shrink(image, shrink((1,)), reports((1, [link(2), link(3)]), (2, [link(1)]), silent_brokers=(3,)),
                         1000)
    # quorum topics: the ISR is for monitoring; nothing is refused.
    q = image_with("quorum")
    qp = q.partition("t", 0)
    refuse_lonely_shrink(q, AlterIsrRequest(broker_id=1, topic="t", partition=0, leader_epoch=qp.leader_epoch,
                                            partition_epoch=qp.partition_epoch, new_isr=(1,)), cut_off, 1000)
