"""Incremental fetch sessions as the broker drives them: the leader's FETCH handler
(dataplane/broker/server.py) and the follower's fetcher (dataplane/broker/fetcher.py).

Claims: an idle session's fetch names no partition and is answered with none; a quiet
partition is not stepped again while nothing changes there, however long, and its follower
stays in the ISR on the session's word (where it holds the partition, when the follower was
last seen fetching), told to the core when its caught-up clock runs out; every partition is waited on,
so records on an omitted partition end the long-poll with that partition alone; an unknown session
id or a wrong epoch is refused with Kafka's session errors, and a restarted handler knows
no session. The fetcher sends only what changed, parks what the answer omitted (delivers
nothing for it), and after a session error sends a full fetch naming the old session."""
from __future__ import annotations

import asyncio
import dataclasses
import types

import pytest

from common.batch import build_batch
from common.errors import ErrorCode
from common.topic_partition import TopicPartition
from common.wire import messages as wire
from dataplane.broker import fetcher as fetcher_module
from dataplane.broker.fetcher import Fetcher
from dataplane.broker import server
from dataplane.broker.server import RequestHandler
from dataplane.replica.events import FetchRequest
from test_broker_parts import _leader_driver, _until_serving


def _handler(drivers: dict) -> RequestHandler:
    info = types.SimpleNamespace(leader=1, leader_epoch=1)
    image = types.SimpleNamespace(get_partition=lambda topic, partition: info)
    replicas = types.SimpleNamespace(get=lambda topic, partition: drivers.get(topic), opening=())
    return RequestHandler(broker_id=1, image=lambda: image, replicas=replicas, producer_ids=None,
                          refresh_metadata=lambda: None, fetch_wait_ms_max=5000)


def _position(topic: str, offset: int) -> wire.FetchTopic:
    return wire.FetchTopic(topic=topic, partitions=(wire.FetchPartition(
        partition=0, current_leader_epoch=1, fetch_offset=offset, last_fetched_epoch=1,
        partition_max_bytes=1 << 20, flushed_offset=offset),))


def _session_fetch(handler: RequestHandler, session_id: int, epoch: int, topics=(), wait_ms: int = 5000):
    return asyncio.ensure_future(handler.fetch(wire.FetchRequest(
        replica_id=2, max_wait_ms=wait_ms, min_bytes=1, max_bytes=1 << 20, session_id=session_id,
        session_epoch=epoch, topics=tuple(topics))))


def _carried(response: wire.FetchResponse) -> dict[str, wire.FetchPartitionResponse]:
    return {t.topic: p for t in response.topics for p in t.partitions}


async def _records_end(poll, driver, drivers: dict) -> wire.FetchResponse:
    """Records produced to `driver` end the session long-poll `poll`; every driver is closed after."""
    driver.submit_produce(bytearray(build_batch([b"v"], timestamp_ms=1)), acks=1, timeout_ms=10_000)
    woken = await asyncio.wait_for(poll, 2)
    for d in drivers.values():
        await d.close()
    return woken


def test_idle_session_fetch_carries_nothing_waits_and_wakes_on_an_omitted_partition(tmp_path):
    async def scenario():
        drivers = {name: _leader_driver(tmp_path, name, (1, 2), None) for name in ("a", "b")}
        for d in drivers.values():
            await _until_serving(d)
        handler = _handler(drivers)
        ends = {name: d.log.log_end_offset for name, d in drivers.items()}
        full = await asyncio.wait_for(_session_fetch(handler, 0, 0, [_position(n, e) for n, e in ends.items()],
                                                     wait_ms=0), 5)
        assert full.error_code is ErrorCode.NONE and full.session_id != 0
        assert set(_carried(full)) == {"a", "b"}, "a full fetch's answer carries every partition"
        sid = full.session_id
        fetches = {n: d.replica.fetch_count(2) for n, d in drivers.items()}
        idle = await asyncio.wait_for(_session_fetch(handler, sid, 1, wait_ms=0), 5)
        assert idle.error_code is ErrorCode.NONE and idle.session_id == sid and _carried(idle) == {}
        assert {n: d.replica.fetch_count(2) for n, d in drivers.items()} == fetches, \
            "a quiet partition was stepped again though nothing changed and its refresh was not due"
        await asyncio.sleep(0.3)
        idle = await asyncio.wait_for(_session_fetch(handler, sid, 2, wait_ms=0), 5)
        assert _carried(idle) == {}
        assert {n: d.replica.fetch_count(2) for n, d in drivers.items()} == fetches, \
            "a quiet partition was stepped again though nothing changed"
        poll = _session_fetch(handler, sid, 3)
        await asyncio.sleep(0.2)
        assert not poll.done(), "an idle session fetch long-polls"
        return await _records_end(poll, drivers["b"], drivers), ends

    woken, ends = asyncio.run(scenario())
    carried = _carried(woken)
    assert set(carried) == {"b"} and carried["b"].records, "records on an omitted partition end the long-poll"


def test_unknown_session_wrong_epoch_and_a_restarted_handler_are_session_errors(tmp_path):
    async def scenario():
        drivers = {"a": _leader_driver(tmp_path, "a", (1, 2), None)}
        await _until_serving(drivers["a"])
        handler = _handler(drivers)
        end = drivers["a"].log.log_end_offset
        full = await _session_fetch(handler, 0, 0, [_position("a", end)], wait_ms=0)
        sid = full.session_id
        unknown = await _session_fetch(handler, sid + 1, 1, wait_ms=0)
        wrong = await _session_fetch(handler, sid, 5, wait_ms=0)
        after_wrong = await _session_fetch(handler, sid, 1, wait_ms=0)   # a wrong epoch dropped the session
        restarted = _handler(drivers)
        again = await _session_fetch(handler, 0, 0, [_position("a", end)], wait_ms=0)
        on_restarted = await _session_fetch(restarted, again.session_id, 1, wait_ms=0)
        await drivers["a"].close()
        return unknown, wrong, after_wrong, on_restarted

    unknown, wrong, after_wrong, on_restarted = asyncio.run(scenario())
    assert unknown.error_code is ErrorCode.FETCH_SESSION_ID_NOT_FOUND
    assert wrong.error_code is ErrorCode.INVALID_FETCH_SESSION_EPOCH
    assert after_wrong.error_code is ErrorCode.FETCH_SESSION_ID_NOT_FOUND
    assert on_restarted.error_code is ErrorCode.FETCH_SESSION_ID_NOT_FOUND


class _IsrHooks:
    def __init__(self) -> None:
        self.proposals: list[tuple[int, ...]] = []
    def send_fetch(self, *a): pass
    def send_append_entries(self, *a): pass
    def propose_isr(self, tp, proposal): self.proposals.append(tuple(proposal.new_isr))
    def report_election(self, *a): pass
    def refresh_metadata(self, *a): pass
    def partition_offline(self, *a): pass


LAG_MS = 300


def _quiet_leader(tmp_path, hooks, follower_fetching):
    from dataplane.broker.partition import PartitionDriver
    from dataplane.log.interface import LogConfig
    from dataplane.replica.events import NewMetadata
    from dataplane.replica.state import PartitionState, ReplicationConfig
    driver = PartitionDriver(broker_id=1, tp=("a", 0), directory=str(tmp_path / "a-0"), log_config=LogConfig(),
                             hooks=hooks, unclean_start=False, follower_fetching=follower_fetching)
    driver.step(NewMetadata(partition=PartitionState(replicas=(1, 2), isr=(1, 2), leader=1, leader_epoch=1,
                                                     partition_epoch=1),
                            config=ReplicationConfig(replica_lag_time_max_ms=LAG_MS)))
    return driver


async def _run_timer(driver, seconds: float) -> None:
    """What ReplicaManager's timers do for one replica: a Tick whenever its core asks for one."""
    from dataplane.broker.partition import now_ms
    end = asyncio.get_running_loop().time() + seconds
    while asyncio.get_running_loop().time() < end:
        due = driver.replica.next_tick_ms()
        if due is not None and due <= now_ms():
            driver.tick(now_ms())
        await asyncio.sleep(0.005)


@pytest.mark.parametrize("sessions_told", [True, False])
def test_a_quiet_follower_stays_in_the_isr_on_its_session_word_and_leaves_when_unseen(tmp_path, sessions_told):
    """Claim: a quiet partition's follower, seen fetching in its session (a long-poll waits),
    stays in the ISR over several lag times with no fetch stepped through the core: the Tick
    that would drop it carries the session's word (Tick.fetching). Once no fetch of the session
    has been seen for a lag time, the leader proposes the ISR without it. Without the session's
    word (sessions_told=False, the driver as it was before it asked) the follower is dropped
    while its long-poll waits: the test fails for that reason."""
    async def scenario():
        hooks = _IsrHooks()
        drivers: dict = {}
        handler = _handler(drivers)
        driver = drivers["a"] = _quiet_leader(tmp_path, hooks, handler.follower_fetching if sessions_told else None)
        await _until_serving(driver)
        full = await asyncio.wait_for(
            _session_fetch(handler, 0, 0, [_position("a", driver.log.log_end_offset)], wait_ms=0), 5)
        fetches = driver.replica.fetch_count(2)
        poll = _session_fetch(handler, full.session_id, 1, wait_ms=5000)
        await _run_timer(driver, 4 * LAG_MS / 1000)
        waited = (list(hooks.proposals), driver.replica.fetch_count(2) - fetches, poll.done())
        poll.cancel()
        await _run_timer(driver, 3 * LAG_MS / 1000)
        await driver.close()
        return waited, hooks.proposals

    (during, stepped, poll_done), proposals = asyncio.run(scenario())
    assert not poll_done, "an idle session fetch long-polls"
    assert stepped == 0, f"{stepped} fetches stepped for a quiet partition while its session waited"
    if sessions_told:
        assert during == [], f"the follower left the ISR while its session was fetching: {during}"
        assert proposals == [(1,)], f"unseen for a lag time, the follower must leave the ISR: {proposals}"
    else:
        assert during == [(1,)], during


def test_a_session_is_seen_fetching_now_while_it_waits_and_at_its_answer_after():
    """LeaderSessions.seen: the follower's kept position, and when it was last seen fetching
    (now while a fetch of its session waits; the answer's time after). A partition removed
    from the session, and a session replaced by a full fetch or dropped for a wrong epoch, keep
    their word as of their last sighting, never later; a follower never seen fetching gives nothing."""
    from dataplane.broker.fetch_sessions import IncrementalFetch, LeaderSessions, SessionError
    sessions: LeaderSessions[str, int, int] = LeaderSessions()
    sid, _, _ = sessions.receive(IncrementalFetch(0, 0, {"a": 5, "b": 7}, frozenset(), True), owner=2)
    assert sessions.seen(2, "a", 100) is None, "seen only once a fetch began"
    sessions.began(sid, 100)
    assert sessions.seen(2, "a", 150) == (5, 150)
    assert sessions.seen(3, "a", 150) is None and sessions.seen(2, "c", 150) is None
    sessions.ended(sid, 160)
    assert sessions.seen(2, "b", 900) == (7, 160)
    sessions.receive(IncrementalFetch(sid, 1, {"a": 6}, frozenset({"b"}), False), owner=2)
    assert sessions.seen(2, "a", 900) == (6, 160)
    assert sessions.seen(2, "b", 900) == (7, 160), "removed: its word as of the last sighting before"
    sessions.began(sid, 300)
    assert sessions.seen(2, "b", 900) == (7, 160), "a removed partition is not seen again by later fetches"
    sessions.ended(sid, 310)
    with pytest.raises(SessionError):
        sessions.receive(IncrementalFetch(sid, 9, {}, frozenset(), False), owner=2)
    assert sessions.seen(2, "a", 900) == (6, 310), "a dropped session's word, as of its last sighting"
    assert sessions.seen(2, "b", 900) == (7, 160)
    new, _, _ = sessions.receive(IncrementalFetch(0, 0, {"a": 6}, frozenset(), True), owner=2)
    sessions.began(new, 950)
    sessions.ended(new, 960)
    sessions.receive(IncrementalFetch(0, 0, {"a": 6}, frozenset(), True), owner=2)
    assert sessions.seen(2, "a", 990) == (6, 960), "a full fetch not yet seen fetching: the replaced session's word"
    assert sessions.seen(2, "a", 990, earlier=False) is None, "to join the ISR only a session holding it now speaks"
    assert sessions.seen(2, "b", 990) is None, "the replaced session never held it"
    assert sessions.seen(3, "a", 990) is None, "a follower never seen fetching"


def test_a_session_keeps_the_last_sightings_of_a_bounded_number_of_removed_partitions(monkeypatch):
    """The words of partitions removed from a session are kept, the oldest forgotten first
    past LEFT_MAX (a session lives as long as its follower: topics come and go meanwhile)."""
    from dataplane.broker import fetch_sessions
    from dataplane.broker.fetch_sessions import IncrementalFetch, LeaderSessions
    monkeypatch.setattr(fetch_sessions, "LEFT_MAX", 2)
    sessions: LeaderSessions[str, int, int] = LeaderSessions()
    sid, _, _ = sessions.receive(IncrementalFetch(0, 0, {"a": 1, "b": 2, "c": 3}, frozenset(), True), owner=2)
    sessions.began(sid, 100)
    sessions.ended(sid, 110)
    for epoch, key in enumerate(("a", "b", "c"), start=1):
        sessions.receive(IncrementalFetch(sid, epoch, {}, frozenset({key}), False), owner=2)
    assert [sessions.seen(2, k, 500) for k in "abc"] == [None, (2, 110), (3, 110)]
    assert sessions.seen(2, "b", 500, earlier=False) is None


def test_a_session_is_live_while_its_follower_fetches_in_it_and_holds_only_what_it_carries():
    """LeaderSessions.holding / live, what parked leaders are watched by: live while a fetch
    waits or one was answered within the slack; not once replaced, dropped or silent longer."""
    from dataplane.broker.fetch_sessions import IncrementalFetch, LeaderSessions
    sessions: LeaderSessions[str, int, int] = LeaderSessions()
    sid, _, _ = sessions.receive(IncrementalFetch(0, 0, {"a": 5}, frozenset(), True), owner=2)
    assert sessions.holding(2, "a", 100, 50) is None and not sessions.live(sid, 100, 50), "never seen fetching"
    sessions.began(sid, 100)
    assert sessions.holding(2, "a", 10_000, 50) == sid and sessions.live(sid, 10_000, 50), "a fetch waits"
    assert sessions.holding(2, "b", 10_000, 50) is None and sessions.holding(3, "a", 10_000, 50) is None
    sessions.ended(sid, 200)
    assert sessions.live(sid, 250, 50) and not sessions.live(sid, 251, 50), "answered: live for the slack"
    new, _, _ = sessions.receive(IncrementalFetch(0, 0, {"a": 5}, frozenset(), True), owner=2)
    sessions.began(new, 300)
    assert not sessions.live(sid, 300, 50) and sessions.live(new, 300, 50), "replaced by a full fetch"
    sessions.receive(IncrementalFetch(new, 1, {}, frozenset({"a"}), False), owner=2)
    assert sessions.holding(2, "a", 300, 50) is None and sessions.live(new, 300, 50), "removed, still live"


def test_parked_replicas_are_grouped_by_their_sessions_and_unparked_together_when_one_is_not_live():
    """ParkedClocks (pure): a group whose sessions are all live costs one look; a group with
    one not live gives back every member, once; a replica parked again or left is in no other group."""
    from dataplane.broker.parked import ParkedClocks, live_slack_ms
    parked: ParkedClocks[str] = ParkedClocks()
    for key in ("a", "b", "c"):
        parked.park(key, sessions=(11, 12), lag_ms=10_000)
    parked.park("d", sessions=(11, 13), lag_ms=10_000)
    parked.park("e", sessions=(11, 12), lag_ms=400)
    looked: list = []

    def live(sessions, slack_ms):
        looked.append((sessions, slack_ms))
        return 13 not in sessions

    assert parked.stale(live) == ["d"] and "d" not in parked and len(parked) == 4
    assert sorted(looked) == [((11, 12), 100), ((11, 12), 1000), ((11, 13), 1000)], "one look per group"
    assert live_slack_ms(400) == 100 and live_slack_ms(60_000) == 1000
    assert parked.leave("a") and not parked.leave("a")
    parked.park("b", sessions=(11, 13), lag_ms=10_000)
    assert sorted(parked.stale(live)) == ["b"] and sorted(parked.stale(lambda s, _: False)) == ["c", "e"]
    assert len(parked) == 0 and parked.stale(live) == []


def test_a_change_on_one_partition_of_a_quiet_session_costs_that_partition_alone(tmp_path, monkeypatch):
    """A long-poll over a session of quiet partitions wakes on a change and looks at the
    partition that changed, not the whole session: with thousands of idle partitions per
    follower broker, walking every one on each wake (and waiting on each one's future) was
    most of an idle leader's work. The omitted partitions' kept answers were sent before."""
    names = [f"q{i}" for i in range(12)]

    async def scenario():
        drivers = {name: _leader_driver(tmp_path, name, (1, 2), None) for name in names}
        for d in drivers.values():
            await _until_serving(d)
        handler = _handler(drivers)
        full = await asyncio.wait_for(_session_fetch(
            handler, 0, 0, [_position(n, d.log.log_end_offset) for n, d in drivers.items()], wait_ms=0), 5)
        sid = full.session_id
        looked: list[str] = []
        real_step, real_since = handler._fetch_partition, handler._fetched_since

        def step(replica_id, tp, p, max_bytes, **kw):
            looked.append(tp.topic)
            return real_step(replica_id, tp, p, max_bytes, **kw)

        def since(replica_id, tp, fetches, p):
            looked.append(tp.topic)
            return real_since(replica_id, tp, fetches, p)
        monkeypatch.setattr(handler, "_fetch_partition", step)
        monkeypatch.setattr(handler, "_fetched_since", since)
        poll = _session_fetch(handler, sid, 1)
        await asyncio.sleep(0.2)
        assert not poll.done() and looked == [], f"an idle session's fetch looked at {looked}"
        return await _records_end(poll, drivers["q7"], drivers), looked

    woken, looked = asyncio.run(scenario())
    assert set(_carried(woken)) == {"q7"}
    assert set(looked) == {"q7"}, f"the wake looked at {sorted(set(looked))}"


def test_a_session_started_over_leaves_no_callback_behind_on_an_idle_partition(tmp_path):
    """Each full fetch starts the session's watch over; the old watch's callbacks leave the
    drivers' futures, which on an idle partition stay pending for good (one callback, and one
    old watch kept alive, per full fetch piled up while replicas opened)."""
    async def scenario():
        driver = _leader_driver(tmp_path, "a", (1, 2), None)
        await _until_serving(driver)
        handler = _handler({"a": driver})
        end = driver.log.log_end_offset
        for _ in range(20):
            await asyncio.wait_for(_session_fetch(handler, 0, 0, [_position("a", end)], wait_ms=0), 5)
        callbacks = len(driver.changed()._callbacks)
        await driver.close()
        return callbacks, len(handler._watches)

    callbacks, watches = asyncio.run(scenario())
    assert callbacks == 1 and watches == 1, (callbacks, watches)


async def _run_session(fetcher: Fetcher, client, until) -> None:
    """Runs the fetcher's session with leader 2 over `client` until `until()` (at most 1 s),
    then closes the fetcher."""
    async def connect(which):
        return client
    fetcher.sessions[2]._client = connect
    for _ in range(100):
        await asyncio.sleep(0.01)
        if until():
            break
    await fetcher.close()


class _ScriptedLeader:
    """A leader's connection that answers the fetches it is sent with `answers` in turn, then
    holds the next long-poll (nothing more to say); `seen` keeps `record(request)` of each."""

    def __init__(self, answers: list[wire.FetchResponse], seen: list, record=lambda req: req) -> None:
        self.answers, self.seen, self.record, self.closed = answers, seen, record, False

    async def request(self, req):
        self.seen.append(self.record(req))
        if len(self.seen) > len(self.answers):
            await asyncio.Event().wait()
        return self.answers[len(self.seen) - 1]

    async def close(self):
        self.closed = True


def _request(tp, offset: int) -> FetchRequest:
    return FetchRequest(replica_id=1, fetch_offset=offset, current_leader_epoch=1, partition=tp)


async def _long_poll_out(clients: dict, sent: list, deliver, *, offset: int = 0, **limits):
    """A fetcher to leader 2 over the fake connections `clients` ("main", "express"), which
    append what they are sent to `sent`: partition ("a", 0) asked from `offset`, until the
    session's second fetch (a long-poll) is out; `deliver(fetcher, tp, event)` hears what the
    cores would. Returns (fetcher, its session there)."""
    fetcher: Fetcher = Fetcher(broker_id=1, address_of=lambda b: ("127.0.0.1", 1),
                               deliver=lambda tp, ev: deliver(fetcher, tp, ev), **limits)
    fetcher.submit(2, ("a", 0), _request(("a", 0), offset))
    session = fetcher.sessions[2]

    async def client(which):
        return clients[which]
    session._client = client
    for _ in range(100):
        await asyncio.sleep(0.01)
        if len(sent) >= 2 and session._main_busy:
            break
    return fetcher, session


def test_fetcher_sends_only_changes_parks_omitted_and_goes_full_after_a_session_error():
    from dataplane.replica.events import FetchHeld
    sent: list[wire.FetchRequest] = []
    delivered: list[tuple[str, int]] = []
    held: list[str] = []
    counted: list[tuple[bool, int]] = []

    def answer(*topics: str, session_id: int = 7) -> wire.FetchResponse:
        return wire.FetchResponse(session_id=session_id, topics=tuple(wire.FetchTopicResponse(
            topic=t, partitions=(wire.FetchPartitionResponse(
                partition=0, high_watermark=10, current_leader=wire.LeaderIdAndEpoch(leader_id=2, leader_epoch=1)),))
            for t in topics))

    script = [answer("a", "b"),                                           # 1: full, both answered
              wire.FetchResponse(error_code=ErrorCode.FETCH_SESSION_ID_NOT_FOUND),   # 2: the leader restarted
              answer("b", session_id=9),                                  # 3: full again, news on b only
              answer(session_id=9)]                                       # 4: nothing new

    async def scenario():
        fetcher: Fetcher

        def deliver(tp, ev):
            if isinstance(ev, FetchHeld):
                held.append(tp[0])   # a core told its request is parked does not ask again
                return
            delivered.append((tp[0], ev.fetch_offset))
            # The core asks again: from the same position, or (b in round 3) from a new one.
            fetcher.submit(2, tp, _request(tp, 11 if len(sent) == 3 else 10))

        fetcher = Fetcher(broker_id=1, address_of=lambda b: ("127.0.0.1", 1), deliver=deliver,
                          on_session_fetch=lambda leader, full, n: counted.append((full, n)))
        fetcher.submit(2, ("a", 0), _request(("a", 0), 10))
        fetcher.submit(2, ("b", 0), _request(("b", 0), 10))
        await _run_session(fetcher, _ScriptedLeader(script, sent), until=lambda: len(sent) > len(script))

    asyncio.run(scenario())
    shape = [(r.session_id, r.session_epoch, sorted((t.topic, p.fetch_offset) for t in r.topics for p in t.partitions))
             for r in sent]
    assert shape == [
        (0, 0, [("a", 10), ("b", 10)]),   # full: opens a session
        (7, 1, []),                       # idle: nothing changed since
        (7, 0, [("a", 10), ("b", 10)]),   # refused: full again, naming the old session to close it
        (9, 1, [("b", 11)]),              # only the partition whose position changed
        (9, 2, []),
    ], shape
    assert counted == [(True, 2), (False, 0), (True, 2), (False, 1), (False, 0)]
    # What an answer omitted (a in round 3, both in 4) or a refusal did not answer is not
    # delivered: it stays parked in the session.
    assert delivered == [("a", 10), ("b", 10), ("b", 10)]
    # b's request from 11, brought by round 4 and omitted by its answer, is parked: its core is
    # told so. (a's was brought by round 2, which was refused, so its core keeps its timer.)
    assert held == ["b"]


def test_a_parked_partition_whose_replica_stopped_following_leaves_the_session(monkeypatch):
    """A request the leader omitted outlives its core: once the broker says the replica no
    longer follows that leader (closed, failed, elsewhere), the next fetch that checks (at
    most every FOLLOWS_CHECK_S, here every one) forgets it, so the leader stops counting it
    as caught up."""
    from dataplane.broker import fetcher as fetcher_module
    monkeypatch.setattr(fetcher_module, "FOLLOWS_CHECK_S", 0.0)
    sent: list[wire.FetchRequest] = []
    following = {"a", "b"}

    class FakeClient:
        closed = False

        async def request(self, req):
            sent.append(req)
            if len(sent) > 2:
                await asyncio.Event().wait()
            following.discard("a")   # its replica closed while the fetch was out
            return wire.FetchResponse(session_id=7)   # nothing new: both stay parked

        async def close(self):
            self.closed = True

    async def scenario():
        fetcher = Fetcher(broker_id=1, address_of=lambda b: ("127.0.0.1", 1), deliver=lambda tp, ev: None,
                          follows=lambda tp, leader: tp[0] in following and leader == 2)
        for t in ("a", "b"):
            fetcher.submit(2, (t, 0), FetchRequest(replica_id=1, fetch_offset=10, current_leader_epoch=1,
                                                   partition=(t, 0)))
        await _run_session(fetcher, FakeClient(), until=lambda: len(sent) > 2)

    asyncio.run(scenario())
    assert [(r.session_epoch, [t.topic for t in r.topics], [t.topic for t in r.forgotten_topics]) for r in sent] == [
        (0, ["a", "b"], []), (1, [], ["a"]), (2, [], [])]


def test_a_refused_partition_whose_replica_went_is_forgotten_by_the_follow_check(monkeypatch):
    """A partition the leader refused leaves the session and is kept aside to ask again express
    (`_refused`); if its replica goes meanwhile (a deleted topic), nothing asks again, and the
    follow check forgets it with the rest of what was kept of it, as it does a parked request."""
    monkeypatch.setattr(fetcher_module, "FOLLOWS_CHECK_S", 0.0)
    sent: list[wire.FetchRequest] = []
    following = {"a", "b"}
    refused: list[bool] = []   # b kept aside as refused when the next fetch went
    sessions: list = []

    class FakeClient:
        closed = False

        async def request(self, req):
            sent.append(req)
            if len(sent) == 2:
                refused.append(("b", 0) in sessions[0]._refused)
            if len(sent) == 1:   # the full fetch: b refused, a parked
                return wire.FetchResponse(session_id=7, topics=(wire.FetchTopicResponse(topic="b", partitions=(
                    wire.FetchPartitionResponse(partition=0, error_code=ErrorCode.NOT_LEADER_OR_FOLLOWER),)),))
            following.discard("b")   # its replica closed; its core asks no more
            if len(sent) > 3:
                await asyncio.Event().wait()
            return wire.FetchResponse(session_id=7)

        async def close(self):
            self.closed = True

    async def scenario():
        fetcher = Fetcher(broker_id=1, address_of=lambda b: ("127.0.0.1", 1), deliver=lambda tp, ev: None,
                          follows=lambda tp, leader: tp[0] in following and leader == 2)
        for t in ("a", "b"):
            fetcher.submit(2, (t, 0), _request((t, 0), 10))
        sessions.append(fetcher.sessions[2])
        await _run_session(fetcher, FakeClient(), until=lambda: len(sent) > 3)
        return sessions[0]

    session = asyncio.run(scenario())
    assert refused == [True], "b was not kept aside as refused: the test's premise"
    assert ("b", 0) not in session._refused, "a refused partition whose replica went is still kept"
    assert ("b", 0) not in session._last_sent and ("b", 0) not in session.pending


class _QuietLeader:
    """A leader's connection that answers each fetch with `answer(n)` (n: how many were sent,
    this one included; None: nothing new) and holds every fetch after the `hold_after`-th."""

    def __init__(self, sent: list, hold_after: int, answer=lambda n: None) -> None:
        self.sent, self.hold_after, self.answer, self.closed = sent, hold_after, answer, False

    async def request(self, req):
        self.sent.append(req)
        if len(self.sent) > self.hold_after:
            await asyncio.Event().wait()
        return self.answer(len(self.sent)) or wire.FetchResponse(session_id=7)

    async def close(self):
        self.closed = True


def test_the_follow_check_walks_the_session_only_after_some_replica_changed(monkeypatch):
    """The look over the session's parked requests (is each replica still following this
    leader?) runs only when some replica's role, epoch or liveness changed since the last one,
    and looks at those replicas alone (`follows_changed`): an idle broker with thousands of
    parked requests walked them all every second, and all of them after any change (a topic
    created elsewhere held the loop 10-17 ms at 10,000 partitions). The first look, with no
    change known yet, takes in what the first fetch carries; then a change (here: replica a
    closes) is looked at at the next round, and a is forgotten; b, unchanged, is not asked."""
    from dataplane.broker import fetcher as fetcher_module
    monkeypatch.setattr(fetcher_module, "FOLLOWS_CHECK_S", 0.0)
    sent: list[wire.FetchRequest] = []
    asked: list[tuple[int, str]] = []   # (round, partition) of each follows question
    following = {"a", "b"}
    version = [0]

    def answer(n):
        if n == 3:
            following.discard("a")   # its replica closed: the broker notes the change
            version[0] += 1
        return None   # nothing new: both stay parked

    def follows(tp, leader):
        asked.append((len(sent) + 1, tp[0]))
        return tp[0] in following and leader == 2

    async def scenario():
        def follows_changed(since):
            return version[0], (None if since is None else {("a", 0)} if since < version[0] else set())
        fetcher = Fetcher(broker_id=1, address_of=lambda b: ("127.0.0.1", 1), deliver=lambda tp, ev: None,
                          follows=follows, follows_changed=follows_changed)
        for t in ("a", "b"):
            fetcher.submit(2, (t, 0), FetchRequest(replica_id=1, fetch_offset=10, current_leader_epoch=1,
                                                   partition=(t, 0)))
        await _run_session(fetcher, _QuietLeader(sent, 4, answer), until=lambda: len(sent) > 4)

    asyncio.run(scenario())
    assert sorted(asked) == [(1, "a"), (1, "b"), (4, "a")], (
        f"asked at rounds {sorted(asked)}: all at the first look, then only the changed one, after its change")
    assert [[t.topic for t in r.forgotten_topics] for r in sent] == [[], [], [], ["a"], []]


def test_a_newcomer_whose_replica_went_as_it_joined_is_forgotten_by_the_follow_check(monkeypatch):
    """The follow check runs once the round's newcomers joined the session: run before, it took
    in the changes that covered a newcomer whose replica went meanwhile while that one was not
    in the session yet, and the newcomer then stayed parked there for good (found by a review)."""
    monkeypatch.setattr(fetcher_module, "FOLLOWS_CHECK_S", 0.0)
    sent: list[wire.FetchRequest] = []
    following = {"a"}   # b's replica went between its ask and the round that carries it
    version = [0]

    async def scenario():
        def follows_changed(since):
            return version[0], (None if since is None else set())
        fetcher = Fetcher(broker_id=1, address_of=lambda b: ("127.0.0.1", 1), deliver=lambda tp, ev: None,
                          follows=lambda tp, leader: tp[0] in following and leader == 2,
                          follows_changed=follows_changed)
        for t in ("a", "b"):
            fetcher.submit(2, (t, 0), _request((t, 0), 10))
        session = fetcher.sessions[2]
        await _run_session(fetcher, _QuietLeader(sent, 2), until=lambda: len(sent) > 2)
        return session

    session = asyncio.run(scenario())
    assert [sorted(t.topic for t in r.topics) for r in sent[:1]] == [["a"]], sent[:1]
    assert ("b", 0) not in session._in_session, "a newcomer whose replica went stayed parked in the session"


def test_a_partition_answered_stays_in_the_session_until_its_core_asks_again():
    """Under acks=all a caught-up follower's core asks again only once the records it was
    answered are flushed, and after an answer carrying only a new HW, a tick later. The next
    long-poll waits for the first and keeps the second parked: neither leaves the session,
    so no express fetch restarts the long-poll and no full fetch follows (one full fetch of
    every partition per record produced, before)."""
    sent: list[tuple[int, int, int, list, list]] = []
    answers = [wire.FetchResponse(session_id=7, topics=(
        wire.FetchTopicResponse(topic="a", partitions=(wire.FetchPartitionResponse(
            partition=0, high_watermark=10, records=build_batch([b"v"], timestamp_ms=1)),)),
        wire.FetchTopicResponse(topic="b", partitions=(wire.FetchPartitionResponse(
            partition=0, high_watermark=11),))))]

    def shape(req):
        return (req.session_id, req.session_epoch, req.max_wait_ms,
                sorted((t.topic, p.fetch_offset) for t in req.topics for p in t.partitions),
                [t.topic for t in req.forgotten_topics])

    async def scenario():
        fetcher: Fetcher
        loop = asyncio.get_running_loop()

        def deliver(tp, ev):
            # a's records are flushed 30 ms later, then its core asks from 11; b's asks again
            # from 10 on a later tick.
            offset, after_s = (11, 0.03) if ev.records else (10, 0.06)
            loop.call_later(after_s, fetcher.submit, 2, tp, _request(tp, offset))

        fetcher = Fetcher(broker_id=1, address_of=lambda b: ("127.0.0.1", 1), deliver=deliver)
        fetcher.submit(2, ("a", 0), _request(("a", 0), 10))
        fetcher.submit(2, ("b", 0), _request(("b", 0), 10))
        await _run_session(fetcher, _ScriptedLeader(answers, sent, shape), until=lambda: len(sent) > 2)

    asyncio.run(scenario())
    assert sent == [(0, 0, 500, [("a", 10), ("b", 10)], []),   # full: opens the session
                    (7, 1, 500, [("a", 11)], [])], sent         # a at its new position; b parked


def test_a_repeat_sent_before_records_came_is_not_taken_for_the_next_request():
    """A core's repeat of the request the long-poll carries (fetch_retry_ms, or asked again
    before the answer) waits in pending; once the answer brings records from that position,
    the repeat is answered already: the next long-poll waits for the request from past the
    records rather than send the old position, which the leader would answer with the same
    records at once."""
    sent: list = []
    records = wire.FetchResponse(session_id=7, topics=(wire.FetchTopicResponse(topic="a", partitions=(
        wire.FetchPartitionResponse(partition=0, high_watermark=10, records=build_batch([b"v"], timestamp_ms=1)),)),))

    async def scenario():
        fetcher: Fetcher
        loop = asyncio.get_running_loop()

        def record(req):
            if not sent:   # while the first long-poll is out, the core repeats its request
                fetcher.submit(2, ("a", 0), _request(("a", 0), 10))
            return (req.session_epoch, sorted((t.topic, p.fetch_offset) for t in req.topics for p in t.partitions))

        def deliver(tp, ev):
            loop.call_later(0.03, fetcher.submit, 2, tp, _request(tp, 11))   # once flushed

        fetcher = Fetcher(broker_id=1, address_of=lambda b: ("127.0.0.1", 1), deliver=deliver)
        fetcher.submit(2, ("a", 0), _request(("a", 0), 10))
        await _run_session(fetcher, _ScriptedLeader([records], sent, record), until=lambda: len(sent) > 2)

    asyncio.run(scenario())
    assert sent == [(0, [("a", 10)]), (1, [("a", 11)])], sent


@pytest.mark.parametrize("after_s", [None, 0.03])
def test_a_core_asking_again_from_where_records_it_could_not_apply_started_is_heard(after_s):
    """A follower whose disk is full leaves fetched records unapplied and its core asks again
    from the same position (at once, or DISK_FULL_REFETCH_MS later). That request came after
    the answer, so it is the core's next one, not a repeat answered already: the partition
    stays in the session and the leader is asked again. Before, it was dropped as a repeat,
    the partition left the session, and the core, its request gone, waited out
    fetch_retry_ms (10 s): every acks=all produce waited for that follower meanwhile."""
    sent: list = []
    delivered: list = []
    records = wire.FetchResponse(session_id=7, topics=(wire.FetchTopicResponse(topic="a", partitions=(
        wire.FetchPartitionResponse(partition=0, high_watermark=10, records=build_batch([b"v"], timestamp_ms=1)),)),))

    def shape(req):
        return (req.session_epoch, sorted((t.topic, p.fetch_offset) for t in req.topics for p in t.partitions),
                [t.topic for t in req.forgotten_topics])

    async def scenario():
        fetcher: Fetcher
        loop = asyncio.get_running_loop()

        def deliver(tp, ev):
            delivered.append(ev.fetch_offset)
            if after_s is None:
                fetcher.submit(2, tp, _request(tp, 10))
            else:
                loop.call_later(after_s, fetcher.submit, 2, tp, _request(tp, 10))

        fetcher = Fetcher(broker_id=1, address_of=lambda b: ("127.0.0.1", 1), deliver=deliver)
        fetcher.submit(2, ("a", 0), _request(("a", 0), 10))
        await _run_session(fetcher, _ScriptedLeader([records, records], sent, shape), until=lambda: len(sent) > 2)

    asyncio.run(scenario())
    # Still in the session at 10 (nothing to tell the leader), and answered again.
    assert sent == [(0, [("a", 10)], []), (1, [], []), (2, [], [])], sent
    assert delivered == [10, 10]


def test_a_request_under_a_new_leader_epoch_sent_while_records_were_out_is_not_a_repeat():
    """The core learned a new leader epoch (the same leader re-elected) while the long-poll was
    out and asked again from the same offset under it; the records that came were the old
    epoch's, which the core refuses without asking again. Its new request is news, not a
    repeat answered already: the next long-poll carries it. Dropped, the core would have
    waited out fetch_retry_ms (10 s) for an answer to a request nobody sent."""
    sent: list = []
    records = wire.FetchResponse(session_id=7, topics=(wire.FetchTopicResponse(topic="a", partitions=(
        wire.FetchPartitionResponse(partition=0, high_watermark=10, records=build_batch([b"v"], timestamp_ms=1)),)),))

    def under(epoch: int) -> FetchRequest:
        return FetchRequest(replica_id=1, fetch_offset=10, current_leader_epoch=epoch, partition=("a", 0))

    async def scenario():
        fetcher: Fetcher

        def record(req):
            if not sent:   # while the first long-poll is out, the core learns epoch 2
                fetcher.submit(2, ("a", 0), under(2))
            return (req.session_epoch, sorted((t.topic, p.fetch_offset, p.current_leader_epoch)
                                              for t in req.topics for p in t.partitions))

        fetcher = Fetcher(broker_id=1, address_of=lambda b: ("127.0.0.1", 1), deliver=lambda tp, ev: None)
        fetcher.submit(2, ("a", 0), under(1))
        await _run_session(fetcher, _ScriptedLeader([records], sent, record), until=lambda: len(sent) > 1)

    asyncio.run(scenario())
    assert sent == [(0, [("a", 10, 1)]), (1, [("a", 10, 2)])], sent


def test_records_for_a_partition_gone_from_the_session_do_not_hold_the_next_long_poll(monkeypatch):
    """A partition that left the session while its answer was out (it follows another leader
    now) will not ask here again: the next long-poll does not wait for it."""
    waited: list = []
    original = fetcher_module.FetchSession._await_next_requests

    async def spy(self, answered):
        waited.append(sorted(answered))
        await original(self, answered)
    monkeypatch.setattr(fetcher_module.FetchSession, "_await_next_requests", spy)
    sent: list = []
    both = wire.FetchResponse(session_id=7, topics=tuple(wire.FetchTopicResponse(topic=t, partitions=(
        wire.FetchPartitionResponse(partition=0, high_watermark=10, records=build_batch([b"v"], timestamp_ms=1)),))
        for t in ("a", "b")))

    async def scenario():
        fetcher: Fetcher

        def deliver(tp, ev):
            if tp == ("a", 0):
                fetcher.submit(3, tp, _request(tp, 11))   # a follows broker 3 now
            else:
                fetcher.submit(2, tp, _request(tp, 11))

        fetcher = Fetcher(broker_id=1, address_of=lambda b: ("127.0.0.1", 1), deliver=deliver)
        fetcher.submit(2, ("a", 0), _request(("a", 0), 10))
        fetcher.submit(2, ("b", 0), _request(("b", 0), 10))
        await _run_session(fetcher, _ScriptedLeader([both], sent), until=lambda: len(sent) > 1)

    asyncio.run(scenario())
    assert waited == [[("b", 0)]]


def test_a_driver_tells_when_it_may_have_stopped_following_and_not_on_its_records(tmp_path):
    """The count the follow check waits on (`on_follow_change`) moves on a change of role or
    leader epoch, a failure and a close, and not on records or a new HW: a busy partition must
    not set the walk off, a replica gone from its leader must."""
    from dataplane.broker.partition import PartitionDriver
    from dataplane.log.interface import LogConfig
    from dataplane.replica.events import NewMetadata
    from dataplane.replica.state import PartitionState, ReplicationConfig
    changes: list[str] = []

    async def scenario():
        driver = PartitionDriver(broker_id=1, tp=("a", 0), directory=str(tmp_path / "a-0"), log_config=LogConfig(),
                                 hooks=_IsrHooks(), unclean_start=False,
                                 on_follow_change=lambda tp: changes.append("change"))
        driver.step(NewMetadata(partition=PartitionState(replicas=(1,), isr=(1,), leader=1, leader_epoch=1,
                                                         partition_epoch=1), config=ReplicationConfig()))
        await _until_serving(driver)
        led = len(changes)
        for i in range(3):
            await asyncio.wait_for(driver.submit_produce(bytearray(build_batch([b"v%d" % i], timestamp_ms=1)),
                                                         acks=1, timeout_ms=10_000), 5)
        produced = len(changes)
        driver.step(NewMetadata(partition=PartitionState(replicas=(1, 2), isr=(1, 2), leader=2, leader_epoch=2,
                                                         partition_epoch=2), config=ReplicationConfig()))
        followed = len(changes)
        driver._fail("disk gone")
        failed = len(changes)
        await driver.close()
        return led, produced, followed, failed, len(changes)

    led, produced, followed, failed, closed = asyncio.run(scenario())
    assert led >= 1 and produced == led, (led, produced)
    assert followed == produced + 1 and failed == followed + 1 and closed == failed + 1, \
        (produced, followed, failed, closed)


class _HoldingLeader:
    """A leader's connection that answers the first session fetch and each express fetch at
    once, and holds every later long-poll (it never ends one); `sent` keeps what it is sent."""

    def __init__(self, sent: list) -> None:
        self.sent, self.closed = sent, False

    async def request(self, req):
        self.sent.append(req)
        if req.session_epoch >= 0 and len(self.sent) > 1:
            await asyncio.Event().wait()
        return wire.FetchResponse(session_id=7)

    async def close(self):
        self.closed = True


async def _long_poll_held(monkeypatch, sent: list, looks: list):
    """A fetcher to a _HoldingLeader, partition ("a", 0) asked from 10, once its long-poll is
    out; each look of the express loop for something to send appends to `looks` after that."""
    leader = _HoldingLeader(sent)
    fetcher, session = await _long_poll_out({"main": leader, "express": leader}, sent, lambda f, tp, ev: None,
                                            offset=10)
    real_ready = session._express_ready

    def ready():
        looks.append(1)
        return real_ready()
    monkeypatch.setattr(session, "_express_ready", ready)
    return fetcher, session


def test_a_repeat_of_what_the_long_poll_carries_does_not_wake_the_express_loop(monkeypatch):
    """An idle follower's core asks again every fetch_retry_ms with the request its session
    already carries; waking the express loop for each (which looks at everything pending)
    cost thousands of looks a second at 10,000 partitions. A repeat only waits for the
    long-poll's end; news (a new position) still wakes it."""
    sent: list[wire.FetchRequest] = []
    looks: list[int] = []

    async def scenario():
        request = FetchRequest(replica_id=1, fetch_offset=10, current_leader_epoch=1, partition=("a", 0))
        fetcher, session = await _long_poll_held(monkeypatch, sent, looks)
        before = len(looks)
        for _ in range(20):
            fetcher.submit(2, ("a", 0), request)   # the core's re-ask: the same request
            await asyncio.sleep(0)
        repeats = len(looks) - before
        fetcher.submit(2, ("a", 0), FetchRequest(replica_id=1, fetch_offset=11, current_leader_epoch=1,
                                                 partition=("a", 0)))
        await asyncio.sleep(0.05)
        news = len(looks) - before - repeats
        await fetcher.close()
        return repeats, news

    repeats, news = asyncio.run(scenario())
    assert repeats == 0, f"{repeats} looks for 20 repeats of what the long-poll carries"
    assert news >= 1, "a new position wakes the express loop"


def test_newcomers_arriving_while_the_long_poll_waits_ask_once_to_end_it_and_wake_nothing_more(monkeypatch):
    """Partitions that start following this leader while its long-poll waits stay pending until
    it ends, and the fetcher asks the leader once to end it. Each newcomer waking the express
    loop after that would look at everything pending for nothing: a thousand partitions moving
    to this leader at once, a million looks."""
    sent: list[wire.FetchRequest] = []
    looks: list[int] = []

    async def scenario():
        fetcher, session = await _long_poll_held(monkeypatch, sent, looks)
        before = len(looks)
        for i in range(200):
            fetcher.submit(2, (f"n{i}", 0), _request((f"n{i}", 0), 0))
            await asyncio.sleep(0)
        await asyncio.sleep(0.05)
        woken = len(looks) - before
        pending = len(session.pending)
        await fetcher.close()
        return woken, pending

    woken, pending = asyncio.run(scenario())
    nudges = [r for r in sent if r.session_epoch < 0 and not r.topics]
    assert len(nudges) == 1, f"{len(nudges)} requests to end the one long-poll"
    assert not [r for r in sent if r.session_epoch < 0 and r.topics], "a newcomer was fetched express"
    assert pending == 200, f"{pending} of 200 newcomers wait for the long-poll to end"
    assert woken <= 3, f"200 newcomers woke the express loop {woken} times"


def test_a_request_to_end_the_long_poll_that_failed_is_sent_again_after_the_backoff(monkeypatch):
    """The request to end the long-poll for newcomers is sent once per long-poll; one that
    fails (its connection broke) is sent again after the reconnect backoff, or the newcomers
    waited out the whole long-poll (up to fetch_wait_ms_max). Found by a review."""
    sent: list[wire.FetchRequest] = []
    looks: list[int] = []

    async def scenario():
        fetcher, session = await _long_poll_held(monkeypatch, sent, looks)
        real_client = session._client
        failures = [OSError("connection reset")]

        class Breaking:
            closed = False

            async def request(self, req):
                sent.append(req)
                if failures:
                    raise failures.pop()
                return wire.FetchResponse()

            async def close(self):
                self.closed = True

        async def client(which):
            return Breaking() if which == "express" else await real_client(which)
        session._client = client
        fetcher.submit(2, ("b", 0), _request(("b", 0), 0))
        for _ in range(100):
            await asyncio.sleep(0.01)
            if len([r for r in sent if r.session_epoch < 0 and not r.topics]) >= 2:
                break
        await fetcher.close()

    asyncio.run(scenario())
    nudges = [r for r in sent if r.session_epoch < 0 and not r.topics]
    assert len(nudges) == 2, f"{len(nudges)} requests to end the long-poll, the first of which failed"


def test_a_partition_the_leader_refuses_asks_again_express_not_by_ending_the_long_poll():
    """A partition answered with an error (the leader's metadata or ours behind) leaves the
    session and its core asks again after the error backoff. That ask goes express while the
    leader refuses it: joining the session instead ended the long-poll once per backoff for as
    long as the refusals lasted (found by a review). Once served, it joins the session."""
    sent: list[tuple[str, wire.FetchRequest]] = []
    refusals = [3]
    end = asyncio.Event()   # the leader was asked to end the long-poll

    def answer(topic, code=ErrorCode.NONE):
        return wire.FetchTopicResponse(topic=topic, partitions=(wire.FetchPartitionResponse(
            partition=0, error_code=code, high_watermark=0,
            current_leader=wire.LeaderIdAndEpoch(leader_id=2, leader_epoch=1)),))

    class Leader:
        def __init__(self, name) -> None:
            self.name, self.closed = name, False

        async def request(self, req):
            sent.append((self.name, req))
            topics = [t.topic for t in req.topics]
            if "b" in topics:
                if refusals[0] > 0:
                    refusals[0] -= 1
                    return wire.FetchResponse(session_id=7, topics=(answer("b", ErrorCode.NOT_LEADER_OR_FOLLOWER),))
                return wire.FetchResponse(session_id=7, topics=(answer("b"),))
            if self.name == "main" and req.session_epoch > 0:
                await end.wait()   # the long-poll: nothing new until asked to end it
                end.clear()
            elif not topics:
                end.set()
            return wire.FetchResponse(session_id=7)

        async def close(self):
            self.closed = True

    async def scenario():
        clients = {"main": Leader("main"), "express": Leader("express")}
        fetcher: Fetcher = Fetcher(broker_id=1, address_of=lambda b: ("127.0.0.1", 1), fetch_error_backoff_ms=10,
                                   deliver=lambda tp, ev: fetcher.submit(2, tp, _request(tp, 0)) if tp == ("b", 0)
                                   else None)
        for topic in ("a", "b"):   # the full fetch carries both; the leader refuses "b"
            fetcher.submit(2, (topic, 0), _request((topic, 0), 0))

        async def client(which):
            return clients[which]
        fetcher.sessions[2]._client = client
        for _ in range(100):
            await asyncio.sleep(0.01)
            if refusals[0] == 0 and any(n == "express" and not r.topics for n, r in sent):
                break
        await asyncio.sleep(0.05)
        await fetcher.close()

    asyncio.run(scenario())
    kinds = [(n, r.session_epoch >= 0, tuple(t.topic for t in r.topics)) for n, r in sent]
    nudges = [k for k in kinds if k == ("express", False, ())]
    asked_express = [k for k in kinds if k == ("express", False, ("b",))]
    assert len(nudges) <= 1, f"the refused partition ended the long-poll {len(nudges)} times: {kinds}"
    assert len(asked_express) >= 2, f"the refused partition did not ask again express: {kinds}"


def test_an_express_fetch_sent_between_long_polls_names_the_one_answered_not_the_next(monkeypatch):
    """An express fetch names the last session fetch sent before it, so the leader orders the
    two by (session, that epoch, express after session: Replica._late_fetch). One built while
    no session fetch was out named the next epoch instead: the session fetch sent after it,
    carrying newer news, then looked older, and the leader dropped that news. In a
    10,000-partition benchmark run (with the express news sent after the request to end the
    long-poll, so while the main loop could be between long-polls) a follower's flushed offset
    was lost that way and its partition stayed out of the ISR for good."""
    monkeypatch.setattr(fetcher_module, "REJOIN_WAIT_S", 5.0)   # the main loop waits between long-polls
    sent: list[wire.FetchRequest] = []
    records = bytes(build_batch([b"v"], timestamp_ms=1))
    answered = wire.FetchResponse(session_id=7, topics=(wire.FetchTopicResponse(topic="a", partitions=(
        wire.FetchPartitionResponse(partition=0, high_watermark=11, records=records,
                                    current_leader=wire.LeaderIdAndEpoch(leader_id=2, leader_epoch=1)),)),))

    async def scenario():
        fetcher = Fetcher(broker_id=1, address_of=lambda b: ("127.0.0.1", 1), deliver=lambda tp, ev: None)
        fetcher.submit(2, ("a", 0), _request(("a", 0), 10))
        session = fetcher.sessions[2]
        leader = _ScriptedLeader([wire.FetchResponse(session_id=7), answered], sent)

        async def client(which):
            return leader
        session._client = client
        for _ in range(200):   # the session fetch of epoch 1 answered with records, the next not sent
            await asyncio.sleep(0.01)
            if len(sent) == 2 and not session._main_busy:
                break
        between = session._main_busy, len(sent)
        express = session._wire_request({("a", 0): _request(("a", 0), 10)}, 0)
        fetcher.submit(2, ("a", 0), _request(("a", 0), 11))   # its core asks again: the next long-poll goes
        for _ in range(200):
            await asyncio.sleep(0.01)
            if len(sent) == 3:
                break
        await fetcher.close()
        return between, express

    between, express = asyncio.run(scenario())
    assert between == (False, 2), f"not between long-polls (main loop busy, fetches sent): {between}"
    assert len(sent) == 3, f"the next session fetch was not sent: {len(sent)} fetches"
    after = sent[2]
    assert express.session_epoch_out == sent[1].session_epoch == 1, (express, sent[1])
    assert (express.session_id, express.session_epoch_out, 1) < (after.session_id, after.session_epoch, 0), (
        f"the express fetch orders after the session fetch sent after it: {express} then {after}")


def test_a_long_poll_carrying_a_partitions_newer_request_is_not_put_back_by_an_older_express_one():
    """An express request of a partition in the session joins the session when the long-poll
    out ends (that long-poll's answer is for the request it carried). If the next long-poll
    already carries a newer request of that partition, the older must not join after it: the
    session would hold the partition at the older position and send it, a step back the leader
    takes for its follower's word (a flushed offset lost, the follower left out of the ISR)."""
    sent: list[wire.FetchRequest] = []

    async def scenario():
        fetcher = Fetcher(broker_id=1, address_of=lambda b: ("127.0.0.1", 1), deliver=lambda tp, ev: None)
        older = FetchRequest(replica_id=1, fetch_offset=10, flushed_offset=9, current_leader_epoch=1,
                             partition=("a", 0))
        newer = dataclasses.replace(older, flushed_offset=10)
        fetcher.submit(2, ("a", 0), newer)
        session = fetcher.sessions[2]
        session._overtaken[("a", 0)] = older   # went express before its core asked the newer
        leader = _HoldingLeader(sent)

        async def client(which):
            return leader
        session._client = client
        for _ in range(100):
            await asyncio.sleep(0.01)
            if len(sent) >= 2:
                break
        held = session._in_session.get(("a", 0))
        await fetcher.close()
        return held, newer

    held, newer = asyncio.run(scenario())
    assert len(sent) == 2, f"{len(sent)} session fetches"
    assert [p.flushed_offset for t in sent[0].topics for p in t.partitions] == [10], sent[0]
    assert not sent[1].topics, f"the second long-poll sent the partition back at its older request: {sent[1]}"
    assert held is newer, f"the session holds {held}, not the newer request"


def test_an_express_request_that_failed_is_not_queued_again_behind_a_newer_one_sent_since():
    """A failed express fetch puts its requests back (after the reconnect backoff) unless its
    core asked anew meanwhile, or its newer request went out already: the long-poll carried it
    during the backoff. Queued again then, the older request went out after the newer."""
    older = FetchRequest(replica_id=1, fetch_offset=10, flushed_offset=9, current_leader_epoch=1, partition=("a", 0))
    newer = dataclasses.replace(older, flushed_offset=10)
    other = FetchRequest(replica_id=1, fetch_offset=5, current_leader_epoch=1, partition=("b", 0))

    async def scenario():
        fetcher = Fetcher(broker_id=1, address_of=lambda b: ("127.0.0.1", 1), deliver=lambda tp, ev: None)
        session = fetcher.sessions[2] = fetcher_module.FetchSession(fetcher, 2)
        session._last_sent[("a", 0)] = older
        session._last_sent[("b", 0)] = other

        # The long-poll carries a's newer request during the backoff (50 ms).
        asyncio.get_running_loop().call_later(0.01, session._last_sent.__setitem__, ("a", 0), newer)
        await session._broken("express", {("a", 0): older, ("b", 0): other}, OSError("reset"))
        pending = dict(session.pending)
        await fetcher.close()
        return pending

    pending = asyncio.run(scenario())
    assert ("a", 0) not in pending, f"the older request was queued again after the newer went out: {pending}"
    assert pending.get(("b", 0)) is other, f"a request nothing replaced was not queued again: {pending}"


def _record_looks(handler: RequestHandler, monkeypatch) -> list[str]:
    """The topics of the partitions `handler` looks at (steps) from now on, in order."""
    looks: list[str] = []
    real_step = handler._fetch_partition

    def step(replica_id, tp, p, max_bytes, **kw):
        looks.append(tp.topic)
        return real_step(replica_id, tp, p, max_bytes, **kw)
    monkeypatch.setattr(handler, "_fetch_partition", step)
    return looks


def test_partitions_with_no_replica_here_are_looked_at_on_a_timer_not_on_every_wake(tmp_path, monkeypatch):
    """A session partition with no replica to answer on the leader (still opening there, or
    not its own) was stepped on every wake of the session's long-poll: while thousands of
    replicas opened, each change anywhere looked at every one of them. Now they are looked
    at again every NOT_READY_POLL_S (here 10 s: not within this test), and a wake for a
    change looks at what changed."""
    monkeypatch.setattr(server, "NOT_READY_POLL_S", 10.0)
    names = [f"q{i}" for i in range(4)]
    missing = [f"u{i}" for i in range(6)]

    async def scenario():
        drivers = {name: _leader_driver(tmp_path, name, (1, 2), None) for name in names}
        for d in drivers.values():
            await _until_serving(d)
        handler = _handler(drivers)
        positions = [_position(n, d.log.log_end_offset) for n, d in drivers.items()] + [_position(n, 0) for n in missing]
        full = await asyncio.wait_for(_session_fetch(handler, 0, 0, positions, wait_ms=0), 5)
        assert all(_carried(full)[n].error_code is not ErrorCode.NONE for n in missing)
        sid = full.session_id
        looked = _record_looks(handler, monkeypatch)
        epoch = 1
        for round_ in range(3):
            poll = _session_fetch(handler, sid, epoch)
            epoch += 1
            await asyncio.sleep(0.05)
            drivers["q1"].submit_produce(bytearray(build_batch([b"v"], timestamp_ms=1)), acks=1, timeout_ms=10_000)
            woken = await asyncio.wait_for(poll, 2)
            assert set(_carried(woken)) == {"q1"}, _carried(woken)
        for d in drivers.values():
            await d.close()
        return looked

    looked = asyncio.run(scenario())
    assert not set(looked) & set(missing), f"partitions with no replica here looked at on wakes: {sorted(set(looked))}"
    assert set(looked) == {"q1"}, sorted(set(looked))


def test_a_waiting_long_poll_answers_a_partition_as_soon_as_its_replica_opens_here(tmp_path, monkeypatch):
    """A session partition whose replica was still opening on the leader is answered once
    (LEADER_NOT_AVAILABLE), then looked at again when the replica manager says it opened
    (RequestHandler.replica_opened), not at the next poll of unready partitions (here 10 s):
    polled every 50 ms instead, they were five in six of the partitions a leader looked at
    while 2,000 replicas opened."""
    monkeypatch.setattr(server, "NOT_READY_POLL_S", 10.0)

    async def scenario():
        drivers = {"q0": _leader_driver(tmp_path, "q0", (1, 2), None)}
        late = _leader_driver(tmp_path, "late", (1, 2), None)
        for d in (*drivers.values(), late):
            await _until_serving(d)
        handler = _handler(drivers)
        positions = [_position("q0", drivers["q0"].log.log_end_offset), _position("late", 0)]
        full = await asyncio.wait_for(_session_fetch(handler, 0, 0, positions, wait_ms=0), 5)
        assert _carried(full)["late"].error_code is not ErrorCode.NONE
        looks = _record_looks(handler, monkeypatch)
        poll = _session_fetch(handler, full.session_id, 1, wait_ms=5000)
        await asyncio.sleep(0.2)
        assert not poll.done() and "late" not in looks, "an unready partition looked at before it opened"
        drivers["late"] = late
        opened_at = asyncio.get_running_loop().time()
        handler.replica_opened(TopicPartition("late", 0))
        answer = await asyncio.wait_for(poll, 5)
        waited = asyncio.get_running_loop().time() - opened_at
        looked = list(looks)
        assert not handler._awaiting_open, "an opened partition is still awaited"

        # A partition that never opens here is forgotten once its session no longer names it:
        # removed by an incremental fetch, or its watch replaced by a full fetch.
        gone = await asyncio.wait_for(_session_fetch(handler, full.session_id, 2, [_position("gone", 0)],
                                                     wait_ms=0), 5)
        assert set(handler._awaiting_open) == {("gone", 0)}
        await asyncio.wait_for(handler.fetch(wire.FetchRequest(
            replica_id=2, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20, session_id=gone.session_id,
            session_epoch=3, forgotten_topics=(wire.ForgottenTopic(topic="gone", partitions=(0,)),))), 5)
        assert not handler._awaiting_open, handler._awaiting_open
        await asyncio.wait_for(_session_fetch(handler, full.session_id, 4, [_position("gone", 0)], wait_ms=0), 5)
        await asyncio.wait_for(_session_fetch(handler, 0, 0, [_position("q0", 1)], wait_ms=0), 5)
        assert not handler._awaiting_open, handler._awaiting_open
        for d in drivers.values():
            await d.close()
        return answer, waited, looked

    answer, waited, looks = asyncio.run(scenario())
    carried = _carried(answer)
    assert "late" in carried and carried["late"].error_code is ErrorCode.NONE, (
        f"the long-poll did not answer the opened partition: {carried}")
    assert waited < 1.0, f"answered {waited:.2f} s after the replica opened"
    assert looks == ["late"], looks


def test_a_fetch_error_is_counted_when_answered_not_at_each_look_of_a_long_poll(tmp_path, monkeypatch):
    """biplane_broker_errors_total counts the errors a fetch answer carries. A session's
    long-poll looks again at a partition still opening every NOT_READY_POLL_S (here 10 ms) and
    answers its error once: counting each look made a 10,000-partition opening report 75,000
    refusals per broker where followers heard far fewer."""
    monkeypatch.setattr(server, "NOT_READY_POLL_S", 0.01)
    missing = [f"u{i}" for i in range(3)]

    async def scenario():
        driver = _leader_driver(tmp_path, "q0", (1, 2), None)
        await _until_serving(driver)
        handler = _handler({"q0": driver})
        positions = [_position("q0", driver.log.log_end_offset)] + [_position(n, 0) for n in missing]
        full = await asyncio.wait_for(_session_fetch(handler, 0, 0, positions, wait_ms=0), 5)
        assert all(_carried(full)[n].error_code is not ErrorCode.NONE for n in missing)
        counted = dict(handler.counters.errors)
        looks = _record_looks(handler, monkeypatch)
        quiet = await asyncio.wait_for(_session_fetch(handler, full.session_id, 1, wait_ms=200), 5)
        await driver.close()
        return counted, dict(handler.counters.errors), quiet, looks

    counted, after, quiet, looks = asyncio.run(scenario())
    assert sum(counted.values()) == len(missing), counted
    assert looks.count("u0") >= 3, "the long-poll looked at the opening partition again and again"
    assert _carried(quiet) == {} and after == counted, "nothing answered, nothing counted"


def test_the_same_throttle_told_again_does_not_rewire_the_sessions(monkeypatch):
    """The reassignment throttle is told on every metadata image (thousands a minute while
    replicas open); each telling rewired every partition of every session. Only a change of
    the rate or of the partitions it paces rewires them now."""
    rewired: list[int] = []

    async def scenario():
        fetcher = Fetcher(broker_id=1, address_of=lambda b: ("127.0.0.1", 1), deliver=lambda tp, ev: None)
        fetcher.submit(2, ("a", 0), FetchRequest(replica_id=1, fetch_offset=10, current_leader_epoch=1,
                                                 partition=("a", 0)))
        session = fetcher.sessions[2]
        monkeypatch.setattr(session, "rewire", lambda: rewired.append(1))
        paced = frozenset({("a", 0)})
        fetcher.configure_throttle(1000, paced)
        fetcher.configure_throttle(1000, frozenset({("a", 0)}))
        fetcher.configure_throttle(1000, paced)
        told_once = len(rewired)
        fetcher.configure_throttle(2000, paced)
        fetcher.configure_throttle(2000, frozenset())
        await fetcher.close()
        return told_once, len(rewired)

    assert asyncio.run(scenario()) == (1, 3)


def _nudge(handler: RequestHandler, replica_id: int, epoch: int):
    """A follower's sessionless fetch naming no partition: end its session fetch of `epoch`."""
    return handler.fetch(wire.FetchRequest(replica_id=replica_id, max_wait_ms=0, min_bytes=1,
                                           max_bytes=1 << 20, session_epoch_out=epoch))


def test_a_followers_fetch_naming_no_partition_ends_its_long_poll_and_keeps_the_session(tmp_path):
    """A follower's fetcher asks the leader to end its session's waiting long-poll with a
    sessionless fetch naming no partition and that long-poll's epoch (for partitions that
    joined meanwhile): the long-poll answers at once and the session goes
    on, its next fetch incremental. Another follower's, a consumer's, or one naming another
    epoch does not end it; one naming a long-poll answered already does not end the next."""
    async def scenario():
        drivers = {"a": _leader_driver(tmp_path, "a", (1, 2), None)}
        await _until_serving(drivers["a"])
        handler = _handler(drivers)
        end = drivers["a"].log.log_end_offset
        sid = (await _session_fetch(handler, 0, 0, [_position("a", end)], wait_ms=0)).session_id

        poll = _session_fetch(handler, sid, 1)
        await asyncio.sleep(0.1)
        await _nudge(handler, 3, 1)    # another follower's
        await _nudge(handler, -1, 1)   # a consumer's
        await _nudge(handler, 2, 0)    # for the full fetch answered before
        await asyncio.sleep(0.1)
        others_ended = poll.done()
        await _nudge(handler, 2, 1)
        ended = await asyncio.wait_for(poll, 1)
        # Naming the long-poll just answered, it ends nothing: the next one waits as usual.
        await _nudge(handler, 2, 1)
        later = _session_fetch(handler, sid, 2)
        await asyncio.sleep(0.1)
        later_waits = not later.done()
        await _nudge(handler, 2, 2)
        after = await asyncio.wait_for(later, 1)
        await drivers["a"].close()
        return others_ended, ended, later_waits, after, sid

    others_ended, ended, later_waits, after, sid = asyncio.run(scenario())
    assert not others_ended, "another follower's, a consumer's or a stale empty fetch ended the long-poll"
    assert ended.error_code is ErrorCode.NONE and ended.session_id == sid and _carried(ended) == {}
    assert later_waits, "a request naming a long-poll answered already ended the next one"
    assert after.error_code is ErrorCode.NONE and after.session_id == sid, "the session did not go on"


@pytest.mark.parametrize("full", [False, True])
def test_a_request_to_end_a_long_poll_that_comes_before_it_ends_it_on_arrival(tmp_path, full):
    """The fetcher sends its request to end the long-poll on its express connection, the
    long-poll on its main one, and the leader may read the request first (both sent within a
    moment, or the long-poll still connecting). The long-poll it names is then answered as soon
    as it arrives. Ending nothing (as before) left the partitions that joined meanwhile out of
    the session until the long-poll ran out (found by reading the two loops)."""
    async def scenario():
        drivers = {"a": _leader_driver(tmp_path, "a", (1, 2), None)}
        await _until_serving(drivers["a"])
        handler = _handler(drivers)
        end = drivers["a"].log.log_end_offset
        sid = 0
        if not full:
            sid = (await _session_fetch(handler, 0, 0, [_position("a", end)], wait_ms=0)).session_id
        epoch = 0 if full else 1
        await _nudge(handler, 2, epoch)
        loop = asyncio.get_running_loop()
        started = loop.time()
        answered = await asyncio.wait_for(
            _session_fetch(handler, sid, epoch, [_position("a", end)] if full else [], wait_ms=2000), 5)
        took_s = loop.time() - started
        # Once: the session's next long-poll waits as usual.
        later = _session_fetch(handler, answered.session_id, epoch + 1)
        await asyncio.sleep(0.1)
        later_waits = not later.done()
        await _nudge(handler, 2, epoch + 1)
        await asyncio.wait_for(later, 1)
        await drivers["a"].close()
        return answered, took_s, later_waits

    answered, took_s, later_waits = asyncio.run(scenario())
    assert answered.error_code is ErrorCode.NONE
    assert took_s < 1, f"the long-poll waited {took_s:.1f} s though asked to end before it came"
    assert later_waits, "the request ended more than the long-poll it named"


def test_a_late_express_fetch_does_not_put_back_a_follower_whose_newer_fetch_waits_in_its_session(tmp_path):
    """A follower's express fetch and its next session fetch travel on two connections, and the
    leader may step the newer session fetch first. The express fetch names the session fetch
    out when it was sent, so the leader knows it for the older: it is answered but does not put
    the follower back, the acks=all request the newer fetch satisfied is released at once, and
    the session's long-poll, parked with nothing to answer, is not ended for it. Taken as it
    came (latest wins), it held the HW until that long-poll ran out: in two full test runs a
    new topic's first acks=all request timed out."""
    async def scenario():
        drivers = {"a": _leader_driver(tmp_path, "a", (1, 2, 3), None)}
        driver = drivers["a"]
        await _until_serving(driver)
        handler = _handler(drivers)
        start = driver.log.log_end_offset

        def fetch(replica_id, offset, *, session_id=0, epoch=-1, out=-1, wait_ms=0):
            return asyncio.ensure_future(handler.fetch(wire.FetchRequest(
                replica_id=replica_id, max_wait_ms=wait_ms, min_bytes=1, max_bytes=1 << 20,
                session_id=session_id, session_epoch=epoch, session_epoch_out=out,
                topics=(_position("a", offset),))))
        sid = (await fetch(2, start, epoch=0)).session_id
        released = driver.submit_produce(bytearray(build_batch([b"v"], timestamp_ms=1)), acks=-1,
                                         timeout_ms=10_000)
        end = driver.log.log_end_offset
        assert _carried(await fetch(2, start, session_id=sid, epoch=1))["a"].records
        # While that session fetch (epoch 1) was out, follower 2 sent an express fetch from
        # `start` (its flushed offset moved); then, the records in hand and flushed, its next
        # session fetch from `end`. The leader steps them the other way round.
        poll = fetch(2, end, session_id=sid, epoch=2, wait_ms=5000)
        await asyncio.sleep(0.05)
        parked = not poll.done()
        late = await fetch(2, start, session_id=sid, out=1)
        await fetch(3, end)   # the other follower has the records stored too
        try:
            release = await asyncio.wait_for(asyncio.shield(released), 2)
        except TimeoutError:
            release = None
        poll_waits = not poll.done()
        await _nudge(handler, 2, 2)
        await asyncio.wait_for(poll, 1)
        await driver.close()
        return parked, late, release, poll_waits

    parked, late, release, poll_waits = asyncio.run(scenario())
    assert parked, "the session fetch from the log end did not wait"
    assert late.error_code is ErrorCode.NONE and _carried(late)["a"].records, "the late fetch was not answered"
    assert release is not None and release.error is ErrorCode.NONE, \
        "the acks=all request waited: the late express fetch put its follower back"
    assert poll_waits, "the late express fetch ended the session's long-poll"


def test_an_express_fetch_refused_for_a_partition_that_left_the_session_reaches_its_core_as_an_error():
    """News of a partition in the session goes express; if the partition leaves the session
    before the answer comes (it follows another leader now) and the answer is "not served
    yet", its core hears the error after the backoff and asks where it follows now. Put back
    among this leader's pending requests, as an earlier form did, it was sent again to the
    leader it no longer follows."""
    sent: list[tuple[str, wire.FetchRequest]] = []
    heard: list[tuple[tuple[str, int], object]] = []

    async def scenario():
        release_express = asyncio.Event()

        class Leader:
            def __init__(self, name) -> None:
                self.name, self.closed = name, False

            async def request(self, req):
                sent.append((self.name, req))
                if self.name == "main":
                    if req.session_epoch > 0:
                        await asyncio.Event().wait()   # the long-poll: nothing new
                    return wire.FetchResponse(session_id=7)
                await release_express.wait()
                return wire.FetchResponse(topics=tuple(wire.FetchTopicResponse(topic=t.topic, partitions=(
                    wire.FetchPartitionResponse(partition=0, error_code=ErrorCode.LEADER_NOT_AVAILABLE),))
                    for t in req.topics))

            async def close(self):
                self.closed = True

        clients = {"main": Leader("main"), "express": Leader("express")}
        fetcher, session = await _long_poll_out(clients, sent, lambda f, tp, ev: heard.append((tp, ev)),
                                                offset=10, fetch_error_backoff_ms=20)
        fetcher.submit(2, ("a", 0), _request(("a", 0), 11))   # news: goes express
        for _ in range(100):
            await asyncio.sleep(0.01)
            if any(n == "express" and r.topics for n, r in sent):
                break
        session.forget(("a", 0))   # it follows another leader now
        release_express.set()
        await asyncio.sleep(0.2)
        pending = dict(session.pending)
        await fetcher.close()
        return pending

    pending = asyncio.run(scenario())
    assert ("a", 0) not in pending, f"put back among the old leader's requests: {pending}"
    errors = [ev.error for tp, ev in heard if getattr(ev, "error", None) is not None]
    assert errors == [ErrorCode.LEADER_NOT_AVAILABLE], f"the core heard {heard}"


def test_a_partition_joining_while_the_long_poll_waits_nudges_it_and_joins_incrementally():
    """A partition that starts following this leader while the session's long-poll waits is not
    fetched express: the fetcher asks the leader to end the long-poll now (a fetch naming no
    partition), once, instead of closing its connection, and the next session fetch carries
    the newcomer, incremental. Abandoning the long-poll made the next one full: while thousands
    of partitions opened, most session fetches carried every partition followed there; and an
    express fetch of each newcomer first was a round more, most of them refused while the
    leader was still opening the partition. News of a partition in the session (a new
    position) still goes express, naming the session fetch it was sent after."""
    sent: list[tuple[str, wire.FetchRequest]] = []

    class Leader:
        def __init__(self, name, end) -> None:
            self.name, self.end, self.closed = name, end, False

        async def request(self, req):
            sent.append((self.name, req))
            if req.session_epoch >= 0 and req.max_wait_ms:
                if len([r for n, r in sent if n == "main"]) > 1:
                    await self.end.wait()   # the long-poll waits until the leader is asked to end it
                    self.end.clear()
                return wire.FetchResponse(session_id=7)
            if not req.topics:
                self.end.set()
                return wire.FetchResponse()
            p = req.topics[0].partitions[0]
            return wire.FetchResponse(topics=(wire.FetchTopicResponse(topic=req.topics[0].topic, partitions=(
                wire.FetchPartitionResponse(partition=0, high_watermark=p.fetch_offset,
                                            current_leader=wire.LeaderIdAndEpoch(leader_id=2, leader_epoch=1)),)),))

        async def close(self):
            self.closed = True

    async def scenario():
        end = asyncio.Event()
        clients = {"main": Leader("main", end), "express": Leader("express", end)}
        fetcher, session = await _long_poll_out(
            clients, sent, lambda f, tp, ev: f.submit(2, tp, _request(tp, ev.fetch_offset)), offset=10)
        fetcher.submit(2, ("b", 0), _request(("b", 0), 5))   # a newcomer
        fetcher.submit(2, ("c", 0), _request(("c", 0), 5))   # another, while the first waits
        for _ in range(100):
            await asyncio.sleep(0.01)
            if any(n == "main" and any(t.topic == "b" for t in r.topics) for n, r in sent):
                break
        await asyncio.sleep(0.05)
        fetcher.submit(2, ("a", 0), _request(("a", 0), 11))   # news of a partition in the session
        for _ in range(100):
            await asyncio.sleep(0.01)
            if any(n == "express" and r.topics for n, r in sent):
                break
        await fetcher.close()
        return clients

    clients = asyncio.run(scenario())
    kinds = [(n, r.session_epoch, tuple(t.topic for t in r.topics)) for n, r in sent]
    nudges = [i for i, (n, r) in enumerate(sent) if n == "express" and not r.topics]
    assert len(nudges) == 1, f"not one fetch asked the leader to end the long-poll: {kinds}"
    # It names the long-poll out (the last main fetch sent before it) by its epoch: it may
    # reach the leader before that long-poll does.
    out = [r for n, r in sent[:nudges[0]] if n == "main"][-1]
    assert sent[nudges[0]][1].session_epoch_out == out.session_epoch == 1, (sent[nudges[0]][1], out)
    joined = [k for k in kinds if k[0] == "main" and {"b", "c"} & set(k[2])]
    assert len(joined) == 1 and set(joined[0][2]) == {"b", "c"} and joined[0][1] > 0, (
        f"the newcomers did not join together by an incremental session fetch: {kinds}")
    assert not clients["main"].closed, "the long-poll's connection was closed"
    # Only news of a partition in the session went express; it names the session fetch out when
    # it was sent, by which the leader tells which was sent first.
    express = [r for n, r in sent if n == "express" and r.topics]
    assert [tuple(t.topic for t in r.topics) for r in express] == [("a",)], kinds
    assert (express[0].session_id, express[0].session_epoch_out) == (7, joined[0][1]), (express[0], kinds)


def test_a_request_the_session_fetch_leaves_unanswered_is_told_held_to_its_core():
    """A session fetch that brings a partition's request to the leader and whose answer omits
    it leaves it parked there: the fetcher tells its core (FetchHeld, for that request's
    position), which then sets no timer to ask again. A partition the answer carries is told
    nothing of the kind."""
    from dataplane.replica.events import FetchHeld
    delivered: list[tuple[tuple[str, int], object]] = []

    class Leader:
        closed = False

        async def request(self, req):
            if req.session_epoch == 0:   # the full fetch: answers "b", omits "a"
                return wire.FetchResponse(session_id=7, topics=(wire.FetchTopicResponse(topic="b", partitions=(
                    wire.FetchPartitionResponse(partition=0, high_watermark=3, records=b"",
                                                current_leader=wire.LeaderIdAndEpoch(leader_id=2, leader_epoch=1)),)),))
            await asyncio.Event().wait()   # later long-polls: nothing changes
            return wire.FetchResponse(session_id=7)

        async def close(self):
            self.closed = True

    async def scenario():
        fetcher = Fetcher(broker_id=1, address_of=lambda b: ("127.0.0.1", 1),
                          deliver=lambda tp, ev: delivered.append((tp, ev)))
        for topic, offset in (("a", 10), ("b", 3)):
            fetcher.submit(2, (topic, 0), FetchRequest(replica_id=1, fetch_offset=offset, last_fetched_epoch=1,
                                                        current_leader_epoch=1, partition=(topic, 0)))
        session = fetcher.sessions[2]

        async def client(which):
            return Leader()
        session._client = client
        for _ in range(100):
            await asyncio.sleep(0.01)
            if len(delivered) >= 2:
                break
        await asyncio.sleep(0.05)
        await fetcher.close()

    asyncio.run(scenario())
    held = [(tp, ev) for tp, ev in delivered if isinstance(ev, FetchHeld)]
    assert held == [(("a", 0), FetchHeld(leader_id=2, fetch_offset=10, last_fetched_epoch=1))], delivered
    assert [tp for tp, ev in delivered if not isinstance(ev, FetchHeld)] == [("b", 0)]


def test_a_partition_that_moves_between_leaders_is_asked_at_one_only():
    """A partition follows one leader at a time: asking at a new leader drops what it asked at
    the old one, also on the way back (the fetcher remembers where each last asked, so that an
    idle follower asking its own leader again does not look at every other session)."""
    async def scenario():
        fetcher = Fetcher(broker_id=1, address_of=lambda b: None, deliver=lambda tp, ev: None)
        pending = []
        for leader in (2, 3, 2, 2):
            fetcher.submit(leader, ("a", 0), _request(("a", 0), 10))
            pending.append({b: ("a", 0) in s.pending for b, s in fetcher.sessions.items()})
        await fetcher.close()
        return pending

    assert asyncio.run(scenario()) == [{2: True}, {2: False, 3: True}, {2: True, 3: False}, {2: True, 3: False}]


def test_a_partition_its_leader_does_not_serve_yet_waits_in_the_session_and_is_not_asked_again():
    """A partition the leader refuses as not served yet (LEADER_NOT_AVAILABLE: still opening, or
    its epoch start not stored) waits in the session, where the leader holds it until it serves
    it: refused in a session answer, its core is told the request is held and nothing asks
    again, also for a newcomer that joined while the long-poll waited. Asked again after a
    backoff instead, the partitions of 10,000 being opened were refused 11,000-19,000 times per
    broker."""
    from dataplane.replica.events import FetchHeld
    sent: list[tuple[str, wire.FetchRequest]] = []
    delivered: list[tuple[tuple[str, int], object]] = []

    def refused(topic):
        return wire.FetchTopicResponse(topic=topic, partitions=(wire.FetchPartitionResponse(
            partition=0, error_code=ErrorCode.LEADER_NOT_AVAILABLE,
            current_leader=wire.LeaderIdAndEpoch(leader_id=2, leader_epoch=1)),))

    class Leader:
        def __init__(self, name, end) -> None:
            self.name, self.end, self.closed = name, end, False

        async def request(self, req):
            sent.append((self.name, req))
            if self.name == "main":
                if req.session_epoch == 0:   # the full fetch: "a" is not served yet
                    return wire.FetchResponse(session_id=7, topics=(refused("a"),))
                carried = tuple(refused(t.topic) for t in req.topics if t.topic == "b")
                if not carried:
                    await self.end.wait()   # the long-poll waits until asked to end
                    self.end.clear()
                return wire.FetchResponse(session_id=7, topics=carried)
            if not req.topics:
                self.end.set()
                return wire.FetchResponse()
            return wire.FetchResponse(topics=tuple(refused(t.topic) for t in req.topics))

        async def close(self):
            self.closed = True

    async def scenario():
        end = asyncio.Event()
        clients = {"main": Leader("main", end), "express": Leader("express", end)}
        fetcher, session = await _long_poll_out(clients, sent, lambda f, tp, ev: delivered.append((tp, ev)),
                                                fetch_error_backoff_ms=20)
        fetcher.submit(2, ("b", 0), _request(("b", 0), 0))   # a newcomer while the long-poll waits
        await asyncio.sleep(0.3)                              # ten error backoffs
        await fetcher.close()

    asyncio.run(scenario())
    kinds = [(n, r.session_epoch, tuple(t.topic for t in r.topics)) for n, r in sent]
    forgot = [(r.session_epoch, r.forgotten_topics) for n, r in sent if r.forgotten_topics]
    assert not forgot, f"a partition refused in the session left it: {forgot}"
    assert kinds[:2] == [("main", 0, ("a",)), ("main", 1, ())], kinds
    assert not [k for k in kinds if k[0] == "express" and k[2]], f"a partition was asked express: {kinds}"
    assert ("express", -1, ()) in kinds, f"the long-poll was not asked to end for the newcomer: {kinds}"
    joined = [k for k in kinds if k[0] == "main" and "b" in k[2]]
    assert len(joined) == 1 and joined[0][1] > 0, f"the refused newcomer did not join the session once: {kinds}"
    assert not any(k[0] == "main" and "a" in k[2] for k in kinds[1:]), f"'a' was sent again: {kinds}"
    told = {(tp[0], type(ev).__name__) for tp, ev in delivered}
    assert told == {("a", "FetchHeld"), ("b", "FetchHeld")}, f"the cores heard {delivered}"
    assert all(isinstance(ev, FetchHeld) for _, ev in delivered)


def test_an_error_other_than_not_served_yet_reaches_the_core_after_the_error_backoff():
    """Other partition errors are delivered to the core after `fetch_error_backoff_ms`, the
    core asking again once it hears."""
    tp = ("a", 0)
    other = wire.FetchPartitionResponse(partition=0, error_code=ErrorCode.NOT_LEADER_OR_FOLLOWER)

    async def scenario() -> tuple[float, object]:
        loop = asyncio.get_running_loop()
        heard: list[tuple[float, object]] = []
        fetcher = Fetcher(broker_id=1, address_of=lambda b: None, fetch_error_backoff_ms=50,
                          deliver=lambda tp_, ev: heard.append((loop.time(), ev)))
        session = fetcher_module.FetchSession(fetcher, 2)
        for task in session._tasks:
            task.cancel()
        start = loop.time()
        session._deliver({tp: _request(tp, 0)}, {tp: other})
        while not heard:
            await asyncio.sleep(0.001)
        return heard[0][0] - start, heard[0][1]

    after_s, event = asyncio.run(scenario())
    assert 0.045 <= after_s < 0.5 and event.error is ErrorCode.NOT_LEADER_OR_FOLLOWER


def test_a_session_holding_a_partition_whose_leader_has_not_stored_its_epoch_start_answers_once_it_has(tmp_path):
    """A leader refuses fetches until its epoch start is stored (LEADER_NOT_AVAILABLE); a
    follower's session then holds the partition, and the long-poll must wake when the leader
    serves it, not at its end: the log end does not move then, only the epoch start's flush
    completes (PartitionDriver.followed_state counts it)."""
    async def scenario():
        driver = _leader_driver(tmp_path, "a", (1, 2), None)
        handler = _handler({"a": driver})
        refused = await _session_fetch(handler, 0, 0, [_position("a", 0)], wait_ms=0)
        loop = asyncio.get_running_loop()
        started = loop.time()
        poll = _session_fetch(handler, refused.session_id, 1, wait_ms=3000)
        await _until_serving(driver)
        answer = await asyncio.wait_for(poll, 6)
        took_s = loop.time() - started
        await driver.close()
        return refused, answer, took_s

    refused, answer, took_s = asyncio.run(scenario())
    assert _carried(refused)["a"].error_code is ErrorCode.LEADER_NOT_AVAILABLE, "the leader served at once"
    assert _carried(answer)["a"].records, answer
    assert took_s < 2, f"the long-poll waited {took_s:.1f} s after the epoch start was stored"


def test_a_partition_not_served_yet_does_not_end_a_long_poll_and_is_answered_once_served(tmp_path):
    """A partition that joins a session while its leader does not serve it yet (the replica
    still opening, or its epoch start not stored) is held by the long-poll, which answers it
    once it is served: answered at once with LEADER_NOT_AVAILABLE, each newcomer ended the
    long-poll for an error the follower can do nothing about but wait, a round more per
    partition while thousands opened."""
    async def scenario():
        drivers = {"q0": _leader_driver(tmp_path, "q0", (1, 2), None)}
        await _until_serving(drivers["q0"])
        handler = _handler(drivers)
        opening = {TopicPartition("b", 0)}
        handler.replicas.opening = opening
        sid = (await _session_fetch(handler, 0, 0, [_position("q0", drivers["q0"].log.log_end_offset)],
                                    wait_ms=0)).session_id
        # Still opening here: the long-poll waits.
        poll = _session_fetch(handler, sid, 1, [_position("b", 0)], wait_ms=5000)
        await asyncio.sleep(0.2)
        waited_for_open = not poll.done()
        drivers["b"] = _leader_driver(tmp_path, "b", (1, 2), None)
        opening.clear()
        handler.replica_opened(TopicPartition("b", 0))
        await _until_serving(drivers["b"])
        opened = await asyncio.wait_for(poll, 5)
        # Open, its epoch start not stored yet: the long-poll answers once it is.
        drivers["a"] = _leader_driver(tmp_path, "a", (1, 2), None)
        poll = _session_fetch(handler, sid, 2, [_position("a", 0), _position("b", drivers["b"].log.log_end_offset)],
                              wait_ms=5000)
        await _until_serving(drivers["a"])
        stored = await asyncio.wait_for(poll, 5)
        for d in drivers.values():
            await d.close()
        return waited_for_open, opened, stored

    waited_for_open, opened, stored = asyncio.run(scenario())
    assert waited_for_open, "a partition still opening ended the long-poll at once"
    for name, answer in (("b", opened), ("a", stored)):
        carried = _carried(answer)
        assert name in carried and carried[name].error_code is ErrorCode.NONE and carried[name].records, (
            f"{name} was not answered with its epoch start once served: {carried}")


def test_a_held_partition_whose_leader_replica_fails_is_answered_with_the_error_at_once(tmp_path, monkeypatch):
    """A session partition held because its leader has not stored its epoch start is looked at
    again only when its driver changes; a replica that fails meanwhile (the epoch start's write
    failed) is such a change, so the follower hears KAFKA_STORAGE_ERROR at once, not when
    the long-poll runs out. Found by a review."""
    async def scenario():
        drivers = {"q0": _leader_driver(tmp_path, "q0", (1, 2), None)}
        await _until_serving(drivers["q0"])
        handler = _handler(drivers)
        sid = (await _session_fetch(handler, 0, 0, [_position("q0", drivers["q0"].log.log_end_offset)],
                                    wait_ms=0)).session_id
        drivers["a"] = _leader_driver(tmp_path, "a", (1, 2), None)
        poll = _session_fetch(handler, sid, 1, [_position("a", 0)], wait_ms=5000)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        held = not poll.done() and not drivers["a"].replica.epoch_durable
        loop = asyncio.get_running_loop()
        failed_at = loop.time()
        drivers["a"]._fail("disk gone (test)")
        answer = await asyncio.wait_for(poll, 5)
        took_s = loop.time() - failed_at
        for d in drivers.values():
            await d.close()
        return held, answer, took_s

    monkeypatch.setattr("dataplane.broker.partition.log.error", lambda *a, **k: None)   # the expected offline line
    held, answer, took_s = asyncio.run(scenario())
    assert held, "the epoch start was stored before the long-poll looked: nothing was held to test"
    assert _carried(answer)["a"].error_code is ErrorCode.KAFKA_STORAGE_ERROR, _carried(answer)
    assert took_s < 1, f"answered {took_s:.2f} s after the replica failed"


def test_a_new_hw_alone_neither_wakes_nor_steps_a_waiting_session_and_rides_on_the_next_answer(tmp_path, monkeypatch):
    """A HW moved by another follower's fetch does not end a follower's long-poll (broker.md),
    so it must not wake it either: the wake stepped the partition again for nothing, a step and
    a session pass on the leader per follower for every acks=all request. The long-poll keeps
    watching: records produced after it still end it at once, carrying the new HW."""
    from dataplane.broker.fetch_sessions import NO_SESSION
    from dataplane.broker.server import SESSIONLESS_EPOCH

    async def scenario():
        driver = _leader_driver(tmp_path, "a", (1, 2, 3), None)
        await _until_serving(driver)
        handler = _handler({"a": driver})
        produce = lambda: driver.submit_produce(  # noqa: E731
            bytearray(build_batch([b"v"], timestamp_ms=1)), acks=1, timeout_ms=10_000)

        async def follower_3_at(offset):
            await asyncio.wait_for(handler.fetch(wire.FetchRequest(
                replica_id=3, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20, session_id=NO_SESSION,
                session_epoch=SESSIONLESS_EPOCH, topics=(_position("a", offset),))), 5)

        await follower_3_at(driver.log.log_end_offset)
        await asyncio.wait_for(produce(), 5)
        end = driver.log.log_end_offset
        full = await asyncio.wait_for(_session_fetch(handler, 0, 0, [_position("a", end)], wait_ms=0), 5)
        sid = full.session_id
        hw_before = driver.replica.high_watermark
        looked: list[str] = []
        real_step = handler._fetch_partition

        def step(replica_id, tp, p, max_bytes, **kw):
            if replica_id == 2:   # follower 2's session, not follower 3's own fetch
                looked.append(tp.topic)
            return real_step(replica_id, tp, p, max_bytes, **kw)
        monkeypatch.setattr(handler, "_fetch_partition", step)
        poll = _session_fetch(handler, sid, 1, [_position("a", end)])
        await asyncio.sleep(0.05)
        stepped_to_wait = list(looked)
        await follower_3_at(end)   # follower 3 catches up: the HW moves to `end`
        hw_after = driver.replica.high_watermark
        await asyncio.sleep(0.2)
        waiting = not poll.done()
        looked_after_hw = looked[len(stepped_to_wait):]
        woken = await _records_end(poll, driver, {"a": driver})
        return hw_before, hw_after, end, waiting, stepped_to_wait, looked_after_hw, woken

    hw_before, hw_after, end, waiting, stepped_to_wait, looked_after_hw, woken = asyncio.run(scenario())
    assert hw_before < end == hw_after, (hw_before, hw_after, end)
    assert stepped_to_wait == ["a"], "the long-poll steps its fetch once before it waits"
    assert waiting, "a new HW alone ended the long-poll"
    assert looked_after_hw == [], "a new HW alone woke the long-poll and stepped the partition again"
    carried = _carried(woken)["a"]
    assert carried.records and carried.high_watermark >= end, \
        "records after a new HW alone end the long-poll, and the answer carries that HW"


@pytest.mark.parametrize("parking", [True, False])
def test_a_quiet_leader_parked_on_its_followers_sessions_is_not_ticked_until_one_stops(tmp_path, monkeypatch,
                                                                                          parking):
    """Claim: once a quiet leader's refresh finds every ISR follower fetching in a live
    session, the broker parks it (ReplicaManager.park) and ticks it no more while the session
    waits, over many lag times: no per-partition work per lag time while idle. When the
    follower stops fetching, the parked replica is ticked again and the follower leaves the
    ISR a lag time after it was last seen, not sooner (the session's word) and not much later
    (the group's look). Without parking (parking=False, the broker before) the replica is
    ticked once per lag time: the count claim fails for that reason."""
    from dataplane.broker import replicas as replicas_module
    from dataplane.broker.config import BrokerConfig
    from dataplane.broker.partition import PartitionDriver, now_ms
    from dataplane.broker.replicas import ReplicaManager
    from dataplane.log.interface import LogConfig
    from dataplane.replica.events import NewMetadata
    from dataplane.replica.state import PartitionState, ReplicationConfig
    from test_disk_full import FakeControl
    monkeypatch.setattr(replicas_module, "PARK_CHECK_S", 0.02)
    lag_ms = 400

    async def scenario():
        config = BrokerConfig(broker_id=1, data_dir=str(tmp_path / "data"), controller_urls=("http://c:1",),
                              tick_interval_ms=5)
        manager = ReplicaManager(config=config, control=FakeControl(), clean_start=True,
                                 send_fetch=lambda *a: None, send_append_entries=lambda *a: None,
                                 refresh_metadata=lambda: None)
        hooks = _IsrHooks()
        proposed_at: list[int] = []
        propose = hooks.propose_isr
        hooks.propose_isr = lambda tp, p: (proposed_at.append(now_ms()), propose(tp, p))
        drivers: dict = {}
        handler = _handler(drivers)
        manager.follower_fetching = handler.follower_fetching
        manager.sessions_holding = handler.sessions_holding
        manager.sessions_live = handler.sessions_live
        handler.on_session_left = manager.unpark
        driver = PartitionDriver(broker_id=1, tp=("a", 0), directory=str(tmp_path / "a-0"), log_config=LogConfig(),
                                 hooks=hooks, unclean_start=False, follower_fetching=handler.follower_fetching,
                                 on_due=manager.schedule_tick, on_park=manager.park if parking else None)
        drivers["a"] = manager.drivers[("a", 0)] = driver
        ticks = [0]
        tick = driver.tick
        monkeypatch.setattr(driver, "tick", lambda now: (ticks.__setitem__(0, ticks[0] + 1), tick(now)))
        driver.step(NewMetadata(partition=PartitionState(replicas=(1, 2), isr=(1, 2), leader=1, leader_epoch=1,
                                                         partition_epoch=1),
                                config=ReplicationConfig(replica_lag_time_max_ms=lag_ms)))
        tasks = [asyncio.create_task(manager.run_ticks()), asyncio.create_task(manager.run_parked())]
        await _until_serving(driver)
        full = await asyncio.wait_for(
            _session_fetch(handler, 0, 0, [_position("a", driver.log.log_end_offset)], wait_ms=0), 5)
        poll = _session_fetch(handler, full.session_id, 1, wait_ms=30_000)
        await asyncio.sleep(2 * lag_ms / 1000)   # the first refresh parks it
        parked_then, ticks_then = ("a", 0) in manager.parked, ticks[0]
        await asyncio.sleep(8 * lag_ms / 1000)
        while_waiting = (ticks[0] - ticks_then, list(hooks.proposals))
        poll.cancel()
        await asyncio.sleep(0)
        last_seen = now_ms()
        await asyncio.sleep(3 * lag_ms / 1000)
        for task in tasks:
            task.cancel()
        await driver.close()
        return parked_then, while_waiting, hooks.proposals, [t - last_seen for t in proposed_at]

    parked_then, (ticked, during), proposals, after_ms = asyncio.run(scenario())
    assert during == [], f"the follower left the ISR while its session was fetching: {during}"
    if parking:
        assert parked_then, "a quiet leader whose follower's session waits is parked"
        assert ticked == 0, f"a parked leader was ticked {ticked} times in 8 lag times while its follower fetched"
    else:
        assert ticked >= 6, ticked
    assert proposals == [(1,)], f"unseen for a lag time, the follower must leave the ISR: {proposals}"
    assert lag_ms - 20 <= after_ms[0] <= lag_ms + 400, f"left {after_ms[0]} ms after last seen (lag {lag_ms} ms)"


def test_a_leader_asks_the_sessions_for_earlier_sightings_only_for_isr_members_and_parks_on_news_it_took(tmp_path):
    """PartitionDriver.tick asks the sessions after an ISR member with in_isr=True (a removed
    partition's or a dropped session's last sighting may keep its clock) and after a follower
    that may join with in_isr=False (only a session holding the partition now may let it in);
    and it parks the replica only when the refresh took every ISR member's news: a clock the
    core left alone keeps a timer of its own."""
    from dataplane.replica.events import StillFetching
    asked: list = []
    news_ms = [0]

    def follower_fetching(tp, replica_id, in_isr):
        asked.append((replica_id, in_isr))
        return StillFetching(replica_id=replica_id, fetch_offset=driver.log.log_end_offset, seen_ms=news_ms[0])

    offers: list = []
    driver = None

    async def scenario():
        nonlocal driver
        driver = _quiet_leader(tmp_path, _IsrHooks(), follower_fetching)
        driver.on_park = lambda tp, followers, lag_ms, other: offers.append(followers) or True
        await _until_serving(driver)
        core = driver.replica
        core.caught_up_due = lambda now: (2, 3)        # 2 in the ISR, 3 asked about joining
        core.isr_followers = lambda: (2,)
        now = core.now_ms + 10 * LAG_MS
        news_ms[0] = now
        core.refresh_caught_up = lambda now_ms, wall, fetching: (True, now_ms + LAG_MS)   # took nothing
        driver.tick(now)
        not_taken = list(offers)
        core.progress[2].last_caught_up_ms = now           # as if it took the news
        driver.tick(now + 1)
        await driver.close()
        return not_taken

    not_taken = asyncio.run(scenario())
    assert asked[:2] == [(2, True), (3, False)], asked
    assert not_taken == [], "parked although the refresh left the follower's clock alone"
    assert offers == [(2,)], offers
