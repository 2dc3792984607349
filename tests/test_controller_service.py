"""The controller service's command path over an in-memory Raft stand-in (no pysyncobj, no sockets)."""
from __future__ import annotations

import asyncio
import dataclasses
import gc
import json

import pytest

from common.metadata import NoOp
from common.errors import CommitFailedError, NotControllerError, TopicExistsError
from common.requests import CreateTopicRequest, RegisterBrokerRequest
from controller import decisions as d
from controller.core import Step
from controller.decisions import LeaderSettings
from controller.replicated import MetadataStateMachine
from controller.service import ControllerNode, ControllerService


@dataclasses.dataclass
class Status:
    self_address: str
    is_leader: bool
    leader_address: str | None
    term: int
    commit_index: int = 0
    last_applied: int = 0
    connected_peers: tuple = ()
    last_log_index: int = 0
    match_index: tuple = ()


class FakeRaft:
    """Applies each proposed command on the next loop turn, like a committed Raft log would.

    `hold = True` keeps proposals in flight until `release()`; `fail_next` makes the next
    proposal fail as pysyncobj reports a lost leadership."""

    peers: tuple[str, ...] = ("127.0.0.1:9",)

    def __init__(self, *, loop, on_applied, on_reset, on_role_change) -> None:
        self.loop, self.on_applied, self.on_reset = loop, on_applied, on_reset
        self.state = MetadataStateMachine()
        # One peer by default (resign hands over to it); `peers=()` in make_service: a lone node.
        self.settings = dataclasses.make_dataclass("S", ["self_address", "peer_addresses"])(
            "127.0.0.1:1", FakeRaft.peers)
        self.leader, self.term = True, 1
        self.proposals: list[str] = []
        self.hold = False
        self.fail_next = False
        self.held: list = []
        self.handed_over = 0   # hand_over() calls; `leader_after_hand_over` False: the peer takes over
        self.leader_after_hand_over = False

    def start(self) -> None:
        pass

    def hand_over(self) -> None:
        self.handed_over += 1
        self.leader = self.leader_after_hand_over

    def stop(self) -> None:
        pass

    def status(self) -> Status:
        return Status("127.0.0.1:1", self.leader, "127.0.0.1:1" if self.leader else None, self.term)

    def propose(self, command: str) -> asyncio.Future:
        self.proposals.append(command)
        fut = self.loop.create_future()
        if self.fail_next:
            self.fail_next = False
            self.loop.call_soon(fut.set_exception, RuntimeError("leader changed"))
        elif self.hold:
            self.held.append((command, fut))
        else:
            self.loop.call_soon(self._commit, command, fut)
        return fut

    def _commit(self, command: str, fut: asyncio.Future) -> None:
        outcome = self.state.apply_command(command)
        self.on_applied(outcome)
        fut.set_result(outcome)

    def release(self) -> None:
        held, self.held = self.held, []
        for command, fut in held:
            self._commit(command, fut)


def make_service(*, leader_settings: LeaderSettings = LeaderSettings(session_timeout_ms=60_000),
                 periodic_interval_ms: int = 10, clock_ms=lambda: 1_000, **kw) -> ControllerService:
    """A one-node service over FakeRaft; `service.fake()` is its Raft once started."""
    rafts = []

    def factory(**callbacks):
        rafts.append(FakeRaft(**callbacks))
        return rafts[-1]
    service = ControllerService(node_id=1, nodes=[ControllerNode(node_id=1, raft_address="127.0.0.1:1",
                                                                 api_url="http://127.0.0.1:2")],
                                raft_factory=factory, leader_settings=leader_settings,
                                periodic_interval_ms=periodic_interval_ms, clock_ms=clock_ms, **kw)
    service.fake = lambda: rafts[0]
    return service


async def started(**kw) -> ControllerService:
    service = make_service(**kw)
    await service.start()
    for _ in range(100):
        if service.is_leader:
            break
        await asyncio.sleep(0.01)
    assert service.is_leader
    return service


async def leading_with_broker_1(service: ControllerService, now_ms: int) -> None:
    """Start `service`, wait until it leads, then register broker 1 and take one heartbeat."""
    from common.requests import HeartbeatRequest
    from controller import core as c
    await service.start()
    service._tick()
    for _ in range(100):
        if service.is_leader:
            break
        await asyncio.sleep(0.01)
    await service.execute(c.RegisterBroker(request=register(1), now_ms=now_ms))
    await service.execute(c.Heartbeat(request=HeartbeatRequest(broker_id=1, incarnation_id="i1",
                                                               metadata_offset=10**6), now_ms=now_ms))


def register(broker_id: int) -> RegisterBrokerRequest:
    return RegisterBrokerRequest(broker_id=broker_id, incarnation_id=f"i{broker_id}", host="h", port=1000 + broker_id)


def topic(name: str) -> CreateTopicRequest:
    return CreateTopicRequest(name=name, replica_assignment=((1,),))


def test_nothing_is_decided_before_the_leaders_marker_commits():
    async def run():
        service = make_service()
        with pytest.raises(NotControllerError):
            service.require_leader()
        await service.start()
        raft = service.fake()
        raft.hold = True
        service._tick()   # proposes the marker, which stays in flight
        assert not service.is_leader and '"marker"' in raft.proposals[-1]
        raft.release()
        await asyncio.sleep(0)
        assert service.is_leader and service.pending.offset == service.committed.offset
        await service.stop()
    asyncio.run(run())


def test_decisions_see_uncommitted_records_and_one_loop_turn_is_one_command():
    async def run():
        service = await started()
        raft = service.fake()
        await service.decide(lambda im: d.register_broker(im, register(1), 1))
        before = len(raft.proposals)
        first = service.stage(d.create_topic(service.pending, topic("a"), 1))
        second = service.stage(d.create_topic(service.pending, topic("b"), 1))
        with pytest.raises(TopicExistsError):   # the pending view already holds "a"
            d.create_topic(service.pending, topic("a"), 1)
        a, b = await first, await second
        assert len(raft.proposals) == before + 1
        assert a.offsets[-1] < b.offsets[0]
        assert set(service.committed.topics) == {"a", "b"}
        await service.stop()
    asyncio.run(run())


def test_commands_pipeline_up_to_the_in_flight_limit_then_group():
    async def run():
        service = await started(inflight_batches_max=2)
        raft = service.fake()
        await service.decide(lambda im: d.register_broker(im, register(1), 1))
        raft.hold = True
        futures = []
        for i in range(5):
            futures.append(service.stage(d.create_topic(service.pending, topic(f"t{i}"), 1)))
            await asyncio.sleep(0)   # one loop turn per request
        assert len(raft.held) == 2   # two in flight, the rest wait in one open batch
        raft.hold = False
        raft.release()
        results = await asyncio.gather(*futures)
        offsets = [o for r in results for o in r.offsets]
        assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
        assert service.committed.offset == service.pending.offset == offsets[-1]
        await service.stop()
    asyncio.run(run())


def test_a_failed_proposal_fails_its_callers_and_the_view_is_rebuilt_from_committed():
    async def run():
        service = await started()
        raft = service.fake()
        await service.decide(lambda im: d.register_broker(im, register(1), 1))
        raft.fail_next = True
        with pytest.raises(CommitFailedError):
            await service.decide(lambda im: d.create_topic(im, topic("lost"), 1))
        assert not service.is_leader
        for _ in range(100):
            if service.is_leader:
                break
            await asyncio.sleep(0.01)
        assert service.is_leader and "lost" not in service.pending.topics
        assert service.pending == service.committed
        await service.decide(lambda im: d.create_topic(im, topic("lost"), 1))
        assert "lost" in service.committed.topics
        await service.stop()
    asyncio.run(run())


def test_a_batch_that_commits_stale_drops_the_leader_view():
    async def run():
        service = await started()
        raft = service.fake()
        await service.decide(lambda im: d.register_broker(im, register(1), 1))
        # Someone else's record lands first: our next batch was computed at an older offset.
        raft.state.apply_command('{"expected_offset": %d, "records": [{"type": "noop"}]}' % raft.state.image.offset)
        with pytest.raises(CommitFailedError, match="diverged"):
            await service.decide(lambda im: d.create_topic(im, topic("x"), 1))
        assert not service.is_leader
        await service.stop()
    asyncio.run(run())


def test_losing_raft_leadership_fails_in_flight_requests_with_a_retriable_error():
    async def run():
        service = await started()
        raft = service.fake()
        await service.decide(lambda im: d.register_broker(im, register(1), 1))
        raft.hold = True
        waiting = asyncio.ensure_future(service.decide(
            lambda im: d.create_topic(im, topic("y"), 1)))
        await asyncio.sleep(0)
        raft.leader = False
        service._tick()
        with pytest.raises(CommitFailedError) as info:
            await waiting
        assert info.value.retriable
        with pytest.raises(NotControllerError):
            service.require_leader()
        await service.stop()
    asyncio.run(run())


def test_a_periodic_pass_cut_short_by_a_lost_leadership_leaves_no_unretrieved_error(monkeypatch):
    """Claim: records the periodic pass staged and a lost leadership failed are noted, not left
    as a future whose exception nobody retrieved (asyncio logs those as ERROR)."""
    async def run():
        unhandled: list[str] = []
        asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: unhandled.append(ctx["message"]))
        service = await started()
        raft = service.fake()
        raft.hold = True
        assert service.core is not None
        monkeypatch.setattr(type(service.core), "step", lambda self, image, event: Step(records=(NoOp(reason="pass"),)))
        service._tick()           # stages the pass's records; the proposal is held
        await asyncio.sleep(0)
        raft.leader = False
        service._tick()           # leadership lost: the pass's future fails
        await asyncio.sleep(0)
        gc.collect()
        await service.stop()
        return unhandled
    assert asyncio.run(run()) == []


def test_metadata_fetch_waits_for_records_and_sends_the_image_when_too_far_behind():
    async def run():
        service = await started(metadata_window_records=2)
        await service.decide(lambda im: d.register_broker(im, register(1), 1))
        offset = service.committed.offset
        poll = asyncio.ensure_future(service.fetch_metadata(after_offset=offset, wait_ms=2000))
        await asyncio.sleep(0.01)
        assert not poll.done()
        await service.decide(lambda im: d.create_topic(im, topic("z"), 1))
        result = await poll
        assert [o for o, _ in result.records] == [offset + 1, offset + 2]
        assert result.records[0][1]["type"] == "create_topic"
        empty = await service.fetch_metadata(after_offset=service.committed.offset, wait_ms=10)
        assert empty.records == [] and empty.image is None
        behind = await service.fetch_metadata(after_offset=-1, wait_ms=0)
        assert behind.image is not None and behind.image["offset"] == service.committed.offset
        await service.stop()
    asyncio.run(run())


def test_a_marker_that_never_commits_is_proposed_again_after_the_commit_timeout():
    async def run():
        service = make_service(commit_timeout_ms=50)
        await service.start()
        raft = service.fake()
        raft.hold = True            # pysyncobj never calls back for this marker
        service._tick()
        markers = [p for p in raft.proposals if '"marker"' in p]
        await asyncio.sleep(0.1)
        service._tick()
        assert len([p for p in raft.proposals if '"marker"' in p]) > len(markers)
        raft.hold = False
        raft.held = []              # the old one is lost for good
        for _ in range(100):
            if service.is_leader:
                break
            await asyncio.sleep(0.01)
        assert service.is_leader
        await service.stop()
    asyncio.run(run())


def test_staged_records_are_cut_into_commands_of_at_most_batch_records_max():
    async def run():
        service = await started(batch_records_max=3, inflight_batches_max=1)
        raft = service.fake()
        await service.decide(lambda im: d.register_broker(im, register(1), 1))
        raft.hold = True
        futures = [service.stage(d.create_topic(service.pending, topic(f"c{i}"), 1))
                   for i in range(4)]   # 2 records each
        await asyncio.sleep(0)
        assert len(raft.held) == 1 and len(service._open) == 1   # c0+c1 in flight, c2+c3 waiting
        raft.hold = False
        raft.release()
        await asyncio.gather(*futures)
        sizes = [len(json.loads(p)["records"]) for p in raft.proposals if '"records"' in p][1:]
        assert sizes == [4, 4] and service.committed.offset == service.pending.offset
        await service.stop()
    asyncio.run(run())


def test_a_leader_that_was_stopped_does_not_fence_brokers_at_its_first_tick(caplog):
    """Claim: the service measures how late its timer ran (a SIGSTOP, a starved process) and
    hands that to the core, so its first tick after 2 s stopped fences nobody; a fence it does
    commit is logged once, in the line the fault harness reads (tests/chaos/fences.py)."""
    from common.requests import HeartbeatRequest
    from controller import core as c
    from tests.chaos.fences import parse_fences

    async def run():
        clock = {"wall_ms": 1_000, "mono_s": 100.0}
        service = make_service(leader_settings=LeaderSettings(session_timeout_ms=1_500),
                               periodic_interval_ms=3_600_000, clock_ms=lambda: clock["wall_ms"],
                               monotonic_s=lambda: clock["mono_s"])
        await leading_with_broker_1(service, clock["wall_ms"])
        service.periodic_interval_ms = 100
        service._tick()
        await asyncio.sleep(0.01)
        assert not service.committed.brokers[1].fenced

        def advance(s: float) -> None:
            clock["wall_ms"] += int(s * 1000)
            clock["mono_s"] += s
        advance(2.0)                 # stopped for 2 s: the heartbeats it missed wait in its socket
        service._tick()
        await asyncio.sleep(0.01)
        assert not service.committed.brokers[1].fenced
        while not service.committed.brokers[1].fenced and clock["wall_ms"] < 10_000:
            advance(0.1)             # ticks on time: nothing more credited
            service._tick()
            await asyncio.sleep(0.01)
        # the last heartbeat (1_000) plus the 1.9 s credited, plus the session timeout
        assert service.committed.brokers[1].fenced and clock["wall_ms"] == 4_500, clock
        await service.stop()

    with caplog.at_level("WARNING", logger="biplane.controller"):
        asyncio.run(run())
    fences = parse_fences([r.getMessage() for r in caplog.records], wall_t0_s=0.0)
    assert [(f.broker, f.reason, f.controller) for f in fences] == [("b1", "session expired", "c1")]
    assert fences[0].silent_ms is not None and fences[0].silent_ms > 1_500


def test_a_new_leader_times_each_broker_from_its_last_heartbeat_heard_as_a_follower():
    """Claim: a heartbeat a follower answers "not the leader" is kept (rpc.py), and when that
    node leads next, a broker's session runs from the last one it heard, not from its own start
    plus the grace for brokers still heartbeating a leader cut off from its peers. A broker cut
    off with the old leader, or killed during the election, was fenced session timeout plus
    grace (4.7 s) after the new leader's start; now a session timeout after it went quiet. One
    never heard (or heard only as another incarnation, or not for over a session and the grace)
    still gets the grace."""
    from aiohttp import web
    from aiohttp.test_utils import TestClient, TestServer
    from controller import core as c
    from controller.rpc import add_rpc_routes

    async def run():
        clock = {"ms": 1_000}
        service = make_service(leader_settings=LeaderSettings(session_timeout_ms=1_500, new_leader_grace_ms=3_200),
                               periodic_interval_ms=3_600_000, clock_ms=lambda: clock["ms"])
        await service.start()

        async def until_leading(leading: bool) -> None:
            for _ in range(100):
                service._tick()
                if service.is_leader == leading:
                    return
                await asyncio.sleep(0.01)
            raise AssertionError(f"is_leader never became {leading}")
        await until_leading(True)
        for b in (1, 2, 3, 4, 5):
            await service.execute(c.RegisterBroker(request=register(b), now_ms=clock["ms"]))
            await service.execute(c.Heartbeat(request=HeartbeatRequest(broker_id=b, incarnation_id=f"i{b}",
                                                                       metadata_offset=10**6), now_ms=clock["ms"]))
        service._tick()   # unfences them
        await asyncio.sleep(0.01)
        assert not any(info.fenced for info in service.committed.brokers.values())
        # Leadership lost (term 2 elsewhere): this node is a follower.
        service.fake().leader, service.fake().term = False, 2
        await until_leading(False)

        app = web.Application()
        add_rpc_routes(app, service, cluster_secret=None)
        async with TestClient(TestServer(app, host="127.0.0.1")) as client:
            async def knock(broker_id: int, incarnation: str) -> int:
                r = await client.post("/rpc/v1/heartbeat", json={
                    "broker_id": broker_id, "incarnation_id": incarnation, "metadata_offset": 0})
                return r.status
            clock["ms"] = 4_000
            assert await knock(5, "i5") == 421        # heard once, then never: it beats another controller
            clock["ms"] = 8_000
            assert await knock(4, "i4") == 421        # heard once, then quiet
            while clock["ms"] <= 9_900:
                assert await knock(1, "i1") == 421
                if clock["ms"] <= 9_000:
                    assert await knock(2, "i2") == 421   # then cut off, or killed
                clock["ms"] += 100
            assert await knock(3, "an-old-process") == 421
            # A broker whose registration this node has not applied yet is heard all the same.
            assert 6 not in service.committed.brokers
            assert await knock(6, "i6") == 421
            r = await client.post("/rpc/v1/heartbeat", data=b"{not json")
            assert r.status == 421                    # unreadable: answered like any other

        clock["ms"] = 10_000                          # this node leads (term 3)
        service.fake().leader, service.fake().term = True, 3
        await until_leading(True)
        assert service.core is not None and service.core.state.sessions.heard_before_start.get(6) == ("i6", 10_000)
        fenced_at: dict[int, int] = {}
        while clock["ms"] < 16_000:
            # Broker 1 goes on heartbeating the new leader; 2, 3 and 4 are gone.
            await service.execute(c.Heartbeat(request=HeartbeatRequest(broker_id=1, incarnation_id="i1",
                                                                       metadata_offset=10**6), now_ms=clock["ms"]))
            service._tick()
            await asyncio.sleep(0.005)
            for b, info in service.committed.brokers.items():
                if info.fenced and b not in fenced_at:
                    fenced_at[b] = clock["ms"]
            clock["ms"] += 100
        await service.stop()
        return fenced_at

    from common.requests import HeartbeatRequest
    fenced_at = asyncio.run(run())
    # The leader started at 10_000. Broker 2 was last heard at 9_000, broker 4 at 8_000 (quiet
    # for 2 s while this node heard the others: fenced at the first look).
    assert fenced_at.get(2) is not None and 10_500 < fenced_at[2] <= 10_700, fenced_at
    assert fenced_at.get(4) == 10_000, fenced_at
    assert fenced_at.get(3) is not None and 14_700 < fenced_at[3] <= 14_900, fenced_at
    # Broker 5, last heard 6 s before the start (over a session and the grace), gets the grace.
    assert fenced_at.get(5) is not None and 14_700 < fenced_at[5] <= 14_900, fenced_at
    assert 1 not in fenced_at, fenced_at


def test_a_stopping_leader_decides_nothing_more_and_hands_its_leadership_over():
    """`biplane restart controller` of the leader fenced every broker: the stopping leader closed
    its API, heard no more heartbeats, and its periodic pass fenced them 1.5 s later. It now
    resigns first: no decision after it (a broker silent past its session stays unfenced
    here), and Raft is asked to hand leadership to a peer, again while none has taken it."""
    async def run():
        clock = {"wall_ms": 1_000}
        service = make_service(leader_settings=LeaderSettings(session_timeout_ms=1_500),
                               periodic_interval_ms=3_600_000, clock_ms=lambda: clock["wall_ms"])
        await leading_with_broker_1(service, clock["wall_ms"])
        service._tick()
        await asyncio.sleep(0.01)
        assert not service.committed.brokers[1].fenced
        raft = service.fake()
        raft.leader_after_hand_over = True     # no peer caught up yet: it stays leader a while
        long_poll = asyncio.create_task(service.fetch_metadata(after_offset=service.committed.offset,
                                                               wait_ms=30_000))
        await asyncio.sleep(0.01)
        resigned = asyncio.create_task(service.resign(timeout_s=5.0))
        # A broker's metadata long-poll ends at once (empty): the API then closes without waiting it out.
        assert (await asyncio.wait_for(long_poll, 1.0)).records == []
        await asyncio.sleep(0.3)
        assert not service.is_leader and raft.handed_over >= 2, raft.handed_over   # asked again
        clock["wall_ms"] += 10_000              # far past broker 1's session
        service._tick()
        await asyncio.sleep(0.05)
        assert not service.committed.brokers[1].fenced and not service.is_leader
        raft.leader_after_hand_over = False     # a peer took over
        assert await asyncio.wait_for(resigned, 2.0) is True
        await service.stop()
    asyncio.run(run())


def test_a_lone_controller_resigns_at_once():
    """With no peer to hand over to, resigning is dropping the view: no 2 s wait on every stop
    and no warning that a peer did not take over (biplane up --controllers 1, biplane down)."""
    async def run():
        FakeRaft.peers = ()
        try:
            service = await started()
            loop = asyncio.get_running_loop()
            began = loop.time()
            assert await service.resign(timeout_s=2.0) is True
            assert loop.time() - began < 0.2 and not service.is_leader and service.fake().handed_over == 0
            await service.stop()
        finally:
            FakeRaft.peers = ("127.0.0.1:9",)
    asyncio.run(run())


def test_a_marker_that_commits_during_the_resignation_does_not_make_the_node_lead_again():
    """SIGTERM between an election and its marker's commit: the commit used to trust the node
    again, and with its ticks stopped nothing took that back until the exit."""
    async def run():
        service = make_service()
        await service.start()
        raft = service.fake()
        raft.hold = True
        service._tick()   # the marker is proposed and held
        raft.leader_after_hand_over = True
        resigned = asyncio.create_task(service.resign(timeout_s=0.3))
        await asyncio.sleep(0.05)
        raft.release()    # the marker commits while resigning
        await asyncio.sleep(0.05)
        assert not service.is_leader
        await resigned
        await service.stop()
    asyncio.run(run())
