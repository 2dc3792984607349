"""The pure incremental fetch session core (dataplane/broker/fetch_sessions.py)."""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dataplane.broker.fetch_sessions import FollowerSession, IncrementalFetch, LeaderSessions, SessionError


def build(follower: FollowerSession, wanted: dict) -> IncrementalFetch:
    """The follower's next fetch once its wanted positions are `wanted` (told as changes)."""
    for key in [k for k in follower.wanted if k not in wanted]:
        follower.drop(key)
    for key, position in wanted.items():
        if follower.wanted.get(key) != position:
            follower.want(key, position)   # told only what changed, as the fetcher does
    return follower.build()


def round_trip(follower: FollowerSession, leader: LeaderSessions, wanted: dict,
               owner: int = 7) -> tuple[IncrementalFetch, dict]:
    fetch = build(follower, wanted)
    try:
        session_id, epoch, positions = leader.receive(fetch, owner)
    except SessionError:
        follower.reset()
        return fetch, {}
    follower.answered(session_id, epoch)
    return fetch, positions


def test_first_fetch_full_then_idle_fetches_carry_nothing() -> None:
    follower: FollowerSession = FollowerSession()
    leader: LeaderSessions = LeaderSessions()
    wanted = {p: 10 for p in range(100)}
    first, positions = round_trip(follower, leader, wanted)
    assert first.full and len(first.changed) == 100 and positions == wanted
    second, positions = round_trip(follower, leader, wanted)
    assert not second.full and second.changed == {} and second.removed == frozenset()
    assert positions == wanted   # omitted partitions keep their position on the leader


def test_only_changed_added_removed_travel() -> None:
    follower: FollowerSession = FollowerSession()
    leader: LeaderSessions = LeaderSessions()
    round_trip(follower, leader, {1: 0, 2: 0, 3: 0})
    fetch, positions = round_trip(follower, leader, {1: 5, 2: 0, 4: 0})
    assert fetch.changed == {1: 5, 4: 0} and fetch.removed == frozenset({3})
    assert positions == {1: 5, 2: 0, 4: 0}


def test_answer_carries_only_records_or_changed_summary() -> None:
    leader: LeaderSessions = LeaderSessions()
    follower: FollowerSession = FollowerSession()
    round_trip(follower, leader, {1: 0, 2: 0})
    sid = follower.session_id
    assert sorted(leader.answer(sid, {1: (False, ("hw", 0)), 2: (False, ("hw", 0))})) == [1, 2]
    assert leader.answer(sid, {1: (False, ("hw", 0)), 2: (False, ("hw", 0))}) == []
    assert leader.answer(sid, {1: (True, ("hw", 0)), 2: (False, ("hw", 3))}) == [1, 2]
    assert leader.answer(sid, {1: (False, ("hw", 0)), 2: (False, ("error", 6))}) == [2]


def test_wrong_epoch_drops_session_and_next_fetch_is_full() -> None:
    leader: LeaderSessions = LeaderSessions()
    follower: FollowerSession = FollowerSession()
    round_trip(follower, leader, {1: 0})
    fetch = build(follower, {1: 0})
    leader.receive(fetch, 7)            # its answer is lost: the leader moved to the next epoch
    fetch, _ = round_trip(follower, leader, {1: 1})   # resent at the old epoch
    assert not fetch.full and follower.session_id == 0
    fetch, positions = round_trip(follower, leader, {1: 1})
    assert fetch.full and positions == {1: 1}


def test_leader_restart_forgets_sessions() -> None:
    follower: FollowerSession = FollowerSession()
    round_trip(follower, LeaderSessions(), {1: 0})
    restarted: LeaderSessions = LeaderSessions()
    with pytest.raises(SessionError, match="unknown_session"):
        restarted.receive(build(follower, {1: 0}), 7)


def test_eviction_bounds_sessions_and_evicted_follower_falls_back_to_full() -> None:
    leader: LeaderSessions = LeaderSessions(max_sessions=2)
    followers: list[FollowerSession] = [FollowerSession() for _ in range(3)]
    for owner, f in enumerate(followers):
        round_trip(f, leader, {1: 0}, owner)
    assert len(leader) == 2 and leader.evicted == 1
    fetch, _ = round_trip(followers[0], leader, {1: 0}, 0)
    assert not fetch.full and followers[0].session_id == 0   # refused: evicted
    fetch, positions = round_trip(followers[0], leader, {1: 0}, 0)
    assert fetch.full and positions == {1: 0}


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.dictionaries(st.integers(0, 6), st.integers(0, 4), max_size=6),
                          st.sampled_from(["ok", "lose", "restart"]),
                          st.none() | st.dictionaries(st.integers(0, 6), st.integers(0, 4), max_size=6)),
                min_size=1, max_size=30))
def test_leader_positions_always_equal_follower_wanted(steps: list) -> None:
    """Whatever is lost or restarted, and whatever changes while a fetch is out, an accepted
    fetch gives the leader exactly the follower's positions as they were when it was built."""
    leader: LeaderSessions = LeaderSessions()
    follower: FollowerSession = FollowerSession()
    for wanted, fate, meanwhile in steps:
        if fate == "restart":
            leader = LeaderSessions(first_id=1)
        fetch = build(follower, wanted)
        if meanwhile is not None:   # told while the fetch is out: it rides on the next one
            for key in [k for k in follower.wanted if k not in meanwhile]:
                follower.drop(key)
            for key, position in meanwhile.items():
                follower.want(key, position)
        try:
            session_id, epoch, positions = leader.receive(fetch, 7)
        except SessionError:
            follower.reset()
            continue
        assert positions == wanted
        if fate == "lose":
            follower.reset()   # the driver resets on a lost connection
        else:
            follower.answered(session_id, epoch)


def test_stale_session_id_never_lands_on_another_followers_session() -> None:
    """After a restart that reused ids, follower 7's old session id names follower 8's session."""
    a: FollowerSession = FollowerSession()
    round_trip(a, LeaderSessions(), {1: 0})
    restarted: LeaderSessions = LeaderSessions()
    b: FollowerSession = FollowerSession()
    b_fetch = build(b, {1: 99})
    b.answered(*restarted.receive(b_fetch, 8)[:2])
    assert b.session_id == a.session_id
    with pytest.raises(SessionError, match="unknown_session"):
        restarted.receive(build(a, {1: 5}), 7)
    assert restarted.receive(build(b, {1: 99}), 8)[2] == {1: 99}


def test_full_fetch_after_a_reset_closes_the_old_session() -> None:
    leader: LeaderSessions = LeaderSessions()
    follower: FollowerSession = FollowerSession()
    round_trip(follower, leader, {1: 0})
    old = follower.session_id
    follower.reset()   # e.g. a lost connection
    fetch, _ = round_trip(follower, leader, {1: 0})
    assert fetch.full and fetch.session_id == old
    assert len(leader) == 1 and follower.session_id != old


def test_a_full_fetch_naming_no_session_still_replaces_its_followers_sessions() -> None:
    """A restarted follower, or one whose full fetch was abandoned before its answer, names no
    session (or one already gone): its old sessions go anyway, another follower's stay."""
    leader: LeaderSessions = LeaderSessions()
    other: FollowerSession = FollowerSession()
    other.answered(*leader.receive(build(other, {1: 0}), 8)[:2])
    for _ in range(3):   # three starts of follower 7, none remembering the last
        fresh: FollowerSession = FollowerSession()
        fresh.answered(*leader.receive(build(fresh, {1: 0}), 7)[:2])
    abandoned = build(fresh, {1: 0})   # sent, then given up: its session is never named again
    leader.receive(dataclasses.replace(abandoned, full=True), 7)
    fresh.reset()
    fresh.answered(*leader.receive(build(fresh, {1: 0}), 7)[:2])
    assert len(leader) == 2
    assert leader.receive(build(other, {1: 0}), 8)[2] == {1: 0}
    assert leader.receive(build(fresh, {1: 0}), 7)[2] == {1: 0}


def test_carries_asks_without_recording() -> None:
    leader: LeaderSessions = LeaderSessions()
    follower: FollowerSession = FollowerSession()
    round_trip(follower, leader, {1: 0})
    sid = follower.session_id
    assert leader.carries(sid, 1, False, "s") and leader.carries(sid, 1, False, "s")
    assert leader.answer(sid, {1: (False, "s")}) == [1]
    assert not leader.carries(sid, 1, False, "s")
    assert leader.carries(sid, 1, True, "s") and leader.carries(sid, 1, False, "t")


def test_notes_on_a_partition_go_when_its_position_changes_or_it_leaves() -> None:
    leader: LeaderSessions = LeaderSessions()
    follower: FollowerSession = FollowerSession()
    round_trip(follower, leader, {1: 0, 2: 0, 3: 0})
    notes = leader.notes(follower.session_id)
    notes.update({1: "a", 2: "b", 3: "c"})
    round_trip(follower, leader, {1: 0, 2: 5})
    assert leader.notes(follower.session_id) == {1: "a"}


class _NoWalk(dict):
    """A map that may be looked up but not walked."""

    def _walked(self, *args: object) -> None:
        raise AssertionError("an incremental fetch walked every partition of the session")

    __iter__ = items = keys = values = copy = _walked   # type: ignore[assignment]


def test_an_incremental_fetch_costs_what_changed_not_the_sessions_size() -> None:
    """A leader's session holds thousands of parked partitions per follower: building the next
    fetch looks only at those wanted or dropped since the last, never walks them all."""
    leader: LeaderSessions = LeaderSessions()
    follower: FollowerSession = FollowerSession()
    round_trip(follower, leader, {p: 0 for p in range(5000)})
    follower.wanted = _NoWalk(follower.wanted)
    follower._sent = _NoWalk(follower._sent)
    follower.want(7, 5)
    follower.want(8, 0)   # told, but where it was
    follower.drop(9)
    fetch = follower.build()
    assert fetch.changed == {7: 5} and fetch.removed == frozenset({9})
    follower.answered(*leader.receive(fetch, 7)[:2])
    assert follower.build().changed == {}
