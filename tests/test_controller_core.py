"""The controller core (`controller/core.py`): pure, deterministic, and the one way handlers change state.

- Fed the same images and events, two cores return the same records, and no step
  modifies the image it is given.
- A refused event changes nothing.
- Every broker RPC and admin write handler steps the core exactly once with its own
  event type, and answers with the typed model the broker's client parses.
- `rpc.py` and `api.py` do not import the decisions, and the controller package has no
  import cycle.
"""
from __future__ import annotations

import ast
import asyncio
import json
from pathlib import Path
from typing import Callable

import pytest
from aiohttp.test_utils import TestClient, TestServer

from common.metadata import NO_LEADER, MetadataImage, PartitionChange, dump_record
from common.errors import StaleBrokerError
from common.requests import (
    AddPartitionsRequest,
    AllocateProducerIdsRequest,
    AlterConfigRequest,
    AlterIsrAnswer,
    AlterIsrRequest,
    CreateTopicRequest,
    ElectionReport,
    ElectionReportAnswer,
    HeartbeatAnswer,
    HeartbeatRequest,
    MetadataAnswer,
    ProducerIdsAnswer,
    ReassignmentRequest,
    RegisterBrokerAnswer,
    RegisterBrokerRequest,
    UnreachablePeer,
)
from controller import core
from controller.api import make_app
from controller.core import ControllerCore, Step
from controller.decisions import LeaderSettings
from test_controller_service import make_service

REPO = Path(__file__).resolve().parent.parent
TOKEN = "core-test-token"


# ---- purity -------------------------------------------------------------------

def register(b: int, incarnation: str | None = None, *, clean: bool = True) -> RegisterBrokerRequest:
    return RegisterBrokerRequest(broker_id=b, incarnation_id=incarnation or f"i{b}", host="h", port=9000 + b,
                                 clean_shutdown=clean)


def beat(image: MetadataImage, b: int, now_ms: int, *, shutdown: bool = False) -> core.Heartbeat:
    return core.Heartbeat(request=HeartbeatRequest(broker_id=b, incarnation_id=image.brokers[b].incarnation_id,
                                                   metadata_offset=image.offset, want_shutdown=shutdown),
                          now_ms=now_ms)


def isr_to(image: MetadataImage, topic: str, partition: int, isr: tuple[int, ...]) -> core.AlterIsr:
    p = image.partition(topic, partition)
    assert p.leader is not None
    return core.AlterIsr(request=AlterIsrRequest(broker_id=p.leader, topic=topic, partition=partition,
                                                 leader_epoch=p.leader_epoch, partition_epoch=p.partition_epoch,
                                                 new_isr=isr))


def report(image: MetadataImage, topic: str, b: int, end_offset: int) -> core.ReportElection:
    p = image.partition(topic, 0)
    return core.ReportElection(report=ElectionReport(broker_id=b, topic=topic, partition=0,
                                                     fenced_epoch=p.leader_epoch, last_epoch=0,
                                                     end_offset=end_offset))


# Each entry builds its event from the image as it stands, as a handler does from a request.
SCRIPT: list[Callable[[MetadataImage], core.Event]] = [
    lambda im: core.RegisterBroker(request=register(1), now_ms=1_000),
    lambda im: core.RegisterBroker(request=register(2), now_ms=1_000),
    lambda im: core.RegisterBroker(request=register(3), now_ms=1_000),
    lambda im: beat(im, 1, 1_050), lambda im: beat(im, 2, 1_050), lambda im: beat(im, 3, 1_050),
    lambda im: core.Tick(now_ms=1_100),                                       # unfences all three
    lambda im: core.CreateTopic(request=CreateTopicRequest(name="a", replica_assignment=((1, 2, 3), (2, 3, 1))),
                                now_ms=1_200),
    lambda im: core.CreateTopic(request=CreateTopicRequest(name="q", replica_assignment=((1, 2, 3),),
                                                           config={"commit_policy": "quorum"}), now_ms=1_200),
    lambda im: isr_to(im, "a", 0, (1, 2)),
    lambda im: core.AllocateProducerIds(request=AllocateProducerIdsRequest(broker_id=2, count=10)),
    lambda im: core.AlterConfig(name="a", request=AlterConfigRequest(set={"retention_ms": 60_000})),
    lambda im: core.AddPartitions(name="a", request=AddPartitionsRequest(partitions=3)),
    lambda im: beat(im, 1, 1_300, shutdown=True),                             # controlled shutdown: fenced now
    lambda im: report(im, "q", 2, 5), lambda im: report(im, "q", 2, 5),      # the second is a duplicate
    lambda im: report(im, "q", 3, 7),                                         # enough reports: elected
    lambda im: beat(im, 2, 1_400), lambda im: beat(im, 3, 1_400),
    lambda im: core.Tick(now_ms=1_450),
    lambda im: core.RegisterBroker(request=register(1, "i1-again", clean=False), now_ms=1_500),
    lambda im: beat(im, 1, 1_550), lambda im: beat(im, 2, 1_550),
    lambda im: beat(im, 1, 3_100), lambda im: beat(im, 2, 3_100),
    lambda im: core.Tick(now_ms=3_200),                                       # broker 3 missed its session
    lambda im: core.StartReassignment(request=ReassignmentRequest(topic="a", partition=1, target_replicas=(2, 1))),
    lambda im: beat(im, 1, 3_300), lambda im: beat(im, 2, 3_300),
    lambda im: core.Tick(now_ms=3_400),
    lambda im: core.ElectPreferred(partitions=None),
    lambda im: core.DeleteTopic(name="q"),
    lambda im: beat(im, 1, 400_000), lambda im: beat(im, 2, 400_000),
    lambda im: core.Tick(now_ms=400_000),                                     # the rebalance timer is due
]


def drive(script: list[Callable[[MetadataImage], core.Event]]) -> list[tuple[str, list[dict], str | None, bool]]:
    """Step a fresh core through the script, applying its records as the service would."""
    c = ControllerCore(LeaderSettings(leader_imbalance_check_interval_ms=1_000))
    image = MetadataImage()
    trace = []
    for build in script:
        event = build(image)
        before = image.to_dict()
        step = c.step(image, event)
        assert image.to_dict() == before, f"{type(event).__name__} modified the image it was given"
        for r in step.records:
            image.apply(r, image.offset + 1)
        trace.append((type(event).__name__, [dump_record(r) for r in step.records], step.refused,
                      step.wait_for_commit))
    return trace


def test_same_images_and_events_give_the_same_records_and_the_image_is_never_modified():
    first, second = drive(SCRIPT), drive(SCRIPT)
    assert first == second
    # The script reaches every rule it names, so the comparison above is not over empty steps.
    by_kind = {kind: [] for kind, *_ in first}
    for kind, records, refused, _ in first:
        by_kind[kind].append((records, refused))
    fences = [r for kind, recs, _, _ in first for r in recs if r["type"] == "fence_broker"]
    assert [f["reason"] for f in fences] == ["controlled shutdown", "session expired"]
    assert any(r["type"] == "unfence_broker" for _, recs, _, _ in first for r in recs)
    assert [refused for recs, refused in by_kind["ReportElection"]][1] == "duplicate report from broker 2"
    assert any(r.get("reason", "").startswith("quorum election") for recs, _ in by_kind["ReportElection"]
               for r in recs)
    assert any(r["type"] == "producer_id_block" for recs, _ in by_kind["AllocateProducerIds"] for r in recs)


def test_a_heartbeat_that_changes_nothing_answers_at_once_and_one_asking_shutdown_waits():
    c = ControllerCore()
    image = MetadataImage()
    for b in (1, 2):
        for r in c.step(image, core.RegisterBroker(request=register(b), now_ms=0)).records:
            image.apply(r, image.offset + 1)
    quiet = c.step(image, beat(image, 1, 10))
    assert quiet == Step(wait_for_commit=False)
    shutdown = c.step(image, beat(image, 1, 20, shutdown=True))
    # Registered brokers start fenced: nothing to fence, still nothing to wait for.
    assert shutdown == Step(wait_for_commit=False)


def test_a_refused_event_changes_no_state():
    c = ControllerCore()
    image = MetadataImage()
    for r in c.step(image, core.RegisterBroker(request=register(1), now_ms=0)).records:
        image.apply(r, image.offset + 1)
    session = c.state.sessions.get(1)
    with pytest.raises(StaleBrokerError):
        c.step(image, core.Heartbeat(request=HeartbeatRequest(broker_id=1, incarnation_id="old",
                                                              metadata_offset=0, want_shutdown=True), now_ms=5))
    assert c.state.sessions.get(1) == session


def test_an_unknown_event_type_is_refused_loudly():
    with pytest.raises(TypeError, match="expected one of"):
        ControllerCore().step(MetadataImage(), "tick")  # type: ignore[arg-type]


def test_a_step_with_records_must_wait_for_their_commit():
    image = MetadataImage()
    (record,) = ControllerCore().step(image, core.RegisterBroker(request=register(1), now_ms=0)).records[:1]
    with pytest.raises(AssertionError):
        Step(records=(record,), wait_for_commit=False)


# ---- the periodic pass costs what it acts on -------------------------------------

def test_a_periodic_pass_reads_the_partitions_it_acts_on_not_every_partition(monkeypatch):
    """The leader runs the periodic pass every 75 ms: a walk over every partition per rule
    (fenced leaders, leaderless partitions, stalled elections, unreachable leaders,
    reassignments) cost a 10,000-partition controller half a core doing nothing. A steady
    pass walks none, and a leaderless partition, a reported cut and a finished reassignment
    are each still acted on, found by the image's index or the reports, not by a walk."""
    c = ControllerCore()
    image = MetadataImage()

    def run(event: core.Event) -> list[dict]:
        step = c.step(image, event)
        for r in step.records:
            image.apply(r, image.offset + 1)
        return [dump_record(r) for r in step.records]

    for b in (1, 2, 3):
        run(core.RegisterBroker(request=register(b), now_ms=1_000))
        run(beat(image, b, 1_050))
    run(core.Tick(now_ms=1_100))
    for name in ("a", "b"):
        run(core.CreateTopic(request=CreateTopicRequest(name=name, replica_assignment=((1, 2, 3),) * 20,
                                                        config={"min_insync_replicas": 2}), now_ms=1_200))
    walks = []
    real = MetadataImage.partitions
    monkeypatch.setattr(MetadataImage, "partitions", lambda self: walks.append(1) or real(self))

    def tick(now_ms: int) -> list[dict]:
        for b in (1, 2, 3):
            run(beat(image, b, now_ms - 10))
        return run(core.Tick(now_ms=now_ms))

    assert tick(1_300) == [] and tick(1_400) == []

    # Leaderless (a decision on a stale view can leave one): elected by the next pass.
    image.apply(PartitionChange(topic="b", partition=7, leader=NO_LEADER), image.offset + 1)
    assert [(r["topic"], r["partition"], r["leader"]) for r in tick(1_500)] == [("b", 7, 1)]

    # Both followers of a-3 report its leader unreachable: the pass moves the leadership.
    p = image.partition("a", 3)
    for b in (2, 3):
        run(core.Heartbeat(request=HeartbeatRequest(
            broker_id=b, incarnation_id=image.brokers[b].incarnation_id, metadata_offset=image.offset,
            unreachable=(UnreachablePeer(topic="a", partition=3, leader_epoch=p.leader_epoch, peer=1),)),
            now_ms=1_590))
    moved = run(core.Tick(now_ms=1_600))
    assert [(r["topic"], r["partition"]) for r in moved] == [("a", 3)] and moved[0]["leader"] in (2, 3)

    # A reassignment whose targets are all in sync: the pass finishes it.
    run(core.StartReassignment(request=ReassignmentRequest(topic="b", partition=2, target_replicas=(1, 2))))
    done = tick(1_700)
    assert [(r["topic"], r["partition"], r["replicas"]) for r in done] == [("b", 2, [1, 2])]
    assert walks == [], f"{len(walks)} walks over every partition in the periodic passes"


# ---- every handler goes through the core ---------------------------------------

def test_every_rpc_and_admin_write_steps_the_core_once_and_answers_typed(monkeypatch):
    stepped: list[str] = []
    real_step = ControllerCore.step

    def spy(self: ControllerCore, image: MetadataImage, event: core.Event) -> Step:
        if not isinstance(event, core.Tick):
            stepped.append(type(event).__name__)
        return real_step(self, image, event)
    monkeypatch.setattr(ControllerCore, "step", spy)

    async def scenario() -> None:
        service = make_service()
        app = make_app(service, admin_token=TOKEN, cluster_secret=None)
        async with TestClient(TestServer(app)) as client:
            async def until(done: Callable[[], bool], what: str) -> None:
                # Generous: the 2-core test machine is shared, and a starved loop is not a failure.
                for _ in range(1000):
                    if done():
                        return
                    await asyncio.sleep(0.01)
                raise AssertionError(f"not within 10 s: {what}")
            await until(lambda: service.is_leader, "the in-process controller leads")
            auth = {"Authorization": f"Bearer {TOKEN}"}

            async def call(method: str, path: str, body: dict | None, expect: str, status: int = 200) -> dict:
                stepped.clear()
                r = await client.request(method, path, json=body, headers=auth)
                doc = json.loads(await r.text())
                assert r.status == status, doc
                assert stepped == [expect], (path, stepped)
                return doc

            for b in (1, 2, 3):
                RegisterBrokerAnswer.model_validate(await call(
                    "POST", "/rpc/v1/register", register(b).model_dump(), "RegisterBroker"))
            for b in (1, 2, 3):
                answer = HeartbeatAnswer.model_validate(await call(
                    "POST", "/rpc/v1/heartbeat", {"broker_id": b, "incarnation_id": f"i{b}",
                                                  "metadata_offset": service.committed.offset}, "Heartbeat"))
                assert answer.broker_id == b
            service._tick()   # unfences them (the timer's own path into the core)
            await until(lambda: not any(info.fenced for info in service.committed.brokers.values()),
                        "the three brokers are unfenced")

            await call("POST", "/v1/topics", {"name": "t", "replica_assignment": [[1, 2, 3], [2, 3, 1]]},
                       "CreateTopic", 201)
            await call("POST", "/v1/topics", {"name": "q", "replica_assignment": [[1, 2, 3]],
                                              "config": {"commit_policy": "quorum"}}, "CreateTopic", 201)
            await call("PATCH", "/v1/topics/t/config", {"set": {"retention_ms": 60_000}}, "AlterConfig")
            await call("POST", "/v1/topics/t/partitions", {"partitions": 3}, "AddPartitions")
            p = service.committed.partition("t", 0)
            isr = AlterIsrAnswer.model_validate(await call(
                "POST", "/rpc/v1/alter-isr", {"broker_id": p.leader, "topic": "t", "partition": 0,
                                              "leader_epoch": p.leader_epoch, "partition_epoch": p.partition_epoch,
                                              "new_isr": [1, 2]}, "AlterIsr"))
            assert isr.partition.isr == [1, 2] and isr.metadata_offset == service.committed.offset
            block = ProducerIdsAnswer.model_validate(await call(
                "POST", "/rpc/v1/allocate-producer-ids", {"broker_id": 2, "count": 10}, "AllocateProducerIds"))
            assert block.size == 10
            refused = ElectionReportAnswer.model_validate(await call(
                "POST", "/rpc/v1/election-report", {"broker_id": 1, "topic": "t", "partition": 0,
                                                    "fenced_epoch": 0, "last_epoch": 0, "end_offset": 0},
                "ReportElection"))
            assert refused.accepted is False and refused.reason and "not waiting" in refused.reason
            shut = HeartbeatAnswer.model_validate(await call(
                "POST", "/rpc/v1/heartbeat", {"broker_id": 1, "incarnation_id": "i1", "want_shutdown": True,
                                              "metadata_offset": service.committed.offset}, "Heartbeat"))
            assert shut.fenced and service.committed.partition("q", 0).fenced_for_election
            q = service.committed.partition("q", 0)
            for b in (2, 3):
                elected = ElectionReportAnswer.model_validate(await call(
                    "POST", "/rpc/v1/election-report", {"broker_id": b, "topic": "q", "partition": 0,
                                                        "fenced_epoch": q.leader_epoch, "last_epoch": 0,
                                                        "end_offset": 0}, "ReportElection"))
                assert elected.accepted
            assert elected.elected and service.committed.partition("q", 0).leader in (2, 3)
            await call("POST", "/v1/reassignments", {"topic": "t", "partition": 1, "target_replicas": [2, 3]},
                       "StartReassignment", 202)
            await call("POST", "/v1/elections/preferred", {}, "ElectPreferred")
            await call("DELETE", "/v1/topics/q", None, "DeleteTopic")
            # The same writes as a broker forwards them for a Kafka client (control RPC).
            await call("POST", "/rpc/v1/admin/create-topic?validate_only=1", {"name": "k", "partitions": 1},
                       "CreateTopic")
            assert "k" not in service.committed.topics and "k" not in (service.pending or service.committed).topics
            await call("POST", "/rpc/v1/admin/create-topic", {"name": "k", "partitions": 1}, "CreateTopic")
            await call("POST", "/rpc/v1/admin/alter-config", {"name": "k", "change": {"set": {"retention_ms": 5}}},
                       "AlterConfig")
            await call("POST", "/rpc/v1/admin/add-partitions", {"name": "k", "change": {"partitions": 2}},
                       "AddPartitions")
            await call("POST", "/rpc/v1/admin/delete-topic", {"name": "k"}, "DeleteTopic")

            # Reads never step the core.
            stepped.clear()
            after = service.committed.offset - 2
            r = await client.get(f"/rpc/v1/metadata?after_offset={after}&max_wait_ms=0")
            meta = MetadataAnswer.model_validate(json.loads(await r.text()))
            # The controller's own timer may commit a record meanwhile (the reassignment completing), so
            # the answer is every record after `after` up to its own offset, not a fixed count.
            assert meta.records is not None and meta.image is None
            assert [e.offset for e in meta.records] == list(range(after + 1, meta.offset + 1))
            for path in ("/v1/topics", "/v1/brokers", "/v1/topics/t/partitions"):
                assert (await client.get(path, headers=auth)).status == 200
            assert stepped == []
    asyncio.run(scenario())


# ---- structure ----------------------------------------------------------------

def imports_of(path: Path) -> set[str]:
    """Modules a file imports, anywhere in it (a function-level import is still a dependency)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_handlers_reach_the_decisions_only_through_the_core():
    for name in ("rpc.py", "api.py"):
        deps = imports_of(REPO / "controller" / name)
        assert not any(m == "controller.decisions" or m.startswith("controller.decisions.") for m in deps), \
            (name, sorted(m for m in deps if "decisions" in m))


def test_the_controller_package_has_no_import_cycle():
    modules = {f"controller.{p.stem}": p for p in (REPO / "controller").glob("*.py") if p.stem != "__init__"}
    graph = {m: {d for d in imports_of(p) if d in modules and d != m} for m, p in modules.items()}

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        for nxt in graph[start]:
            if nxt == goal or (nxt not in seen and (seen.add(nxt) or reaches(nxt, goal, seen))):
                return True
        return False
    cycles = sorted(m for m in graph if reaches(m, m, set()))
    assert cycles == [], {m: sorted(graph[m]) for m in cycles}


def test_a_broker_told_an_answer_that_does_not_fit_learns_which_call_and_field():
    from common.control_client import _parse
    from common.errors import BiplaneError

    with pytest.raises(BiplaneError, match=r"answer to heartbeat is not a HeartbeatAnswer.*fenced"):
        _parse(HeartbeatAnswer, "heartbeat", {"broker_id": 1, "metadata_offset": 3, "session_timeout_ms": 1500})
    # A field it does not know (a newer controller) is ignored.
    assert _parse(HeartbeatAnswer, "heartbeat", {"broker_id": 1, "fenced": False, "metadata_offset": 3,
                                                 "session_timeout_ms": 1500, "later": 1}).fenced is False


def _registered_and_unfenced(c: ControllerCore) -> MetadataImage:
    image = MetadataImage()
    for b in (1, 2):
        for r in c.step(image, core.RegisterBroker(request=register(b), now_ms=1_000)).records:
            image.apply(r, image.offset + 1)
    for b in (1, 2):
        c.step(image, beat(image, b, 1_050))
    for r in c.step(image, core.Tick(now_ms=1_100)).records:
        image.apply(r, image.offset + 1)
    assert not any(image.brokers[b].fenced for b in (1, 2))
    return image


def _fenced(step: Step) -> list[int]:
    return sorted(r.broker_id for r in step.records if type(r).__name__ == "FenceBroker")


def test_time_the_leader_did_not_run_is_given_back_to_every_session() -> None:
    """Claim: a tick after the leader itself was stopped for 2 s (paused_ms) fences no broker
    whose session was fine when it stopped, so the heartbeats that waited unread meanwhile are
    read in time; a broker that stays silent after that is fenced a session timeout later, on
    the credited clock. The same tick without the credit fences both (the spurious fences the
    fault harness found after controller stalls)."""
    c = ControllerCore(LeaderSettings(session_timeout_ms=1_500))
    image = _registered_and_unfenced(c)
    # last heartbeats at 1_050; the leader stops at 1_100 and runs again at 3_100
    assert _fenced(c.step(image, core.Tick(now_ms=3_100, paused_ms=1_925))) == []
    c.step(image, beat(image, 1, 3_150))                  # broker 1's queued heartbeat, read now
    assert _fenced(c.step(image, core.Tick(now_ms=4_400))) == []   # 2 within its credited session
    assert _fenced(c.step(image, core.Tick(now_ms=4_600))) == [2]  # 1_050 + 1_925 + 1_500 < 4_600
    plain = ControllerCore(LeaderSettings(session_timeout_ms=1_500))
    image = _registered_and_unfenced(plain)
    assert _fenced(plain.step(image, core.Tick(now_ms=3_100))) == [1, 2]


def test_a_credit_never_moves_a_session_past_now() -> None:
    """Claim: a heartbeat read after the stall but before the tick that credits it is not pushed
    into the future: a broker that dies right after it is fenced one session timeout later."""
    c = ControllerCore(LeaderSettings(session_timeout_ms=1_500))
    image = _registered_and_unfenced(c)
    c.step(image, beat(image, 1, 3_090))
    c.step(image, beat(image, 2, 3_090))
    c.step(image, core.Tick(now_ms=3_100, paused_ms=1_925))
    assert _fenced(c.step(image, core.Tick(now_ms=4_601))) == [1, 2]


def test_a_liveness_only_heartbeat_at_the_leader_refreshes_the_session_and_nothing_else() -> None:
    """Claim: a broker's heartbeat meant for the followers (dataplane/broker/lifecycle.py,
    FollowerBeats) that reaches the leader keeps the session alive, but may be older than the
    last full one: it neither takes the applied metadata offset back (which gates unfencing) nor
    replaces the broker's reachability report."""
    c = ControllerCore(LeaderSettings(session_timeout_ms=1_500))
    image = _registered_and_unfenced(c)
    cut = UnreachablePeer(topic="t", partition=0, leader_epoch=1, peer=2)
    c.step(image, core.Heartbeat(request=HeartbeatRequest(
        broker_id=1, incarnation_id="i1", metadata_offset=image.offset, unreachable=(cut,)), now_ms=1_200))
    c.step(image, core.Heartbeat(request=HeartbeatRequest(
        broker_id=1, incarnation_id="i1", metadata_offset=0, liveness_only=True), now_ms=2_500))
    session = c.state.sessions.get(1)
    assert session is not None and session.last_heartbeat_ms == 2_500
    assert session.metadata_offset == image.offset
    assert c.state.reachability.named() == {("t", 0)}
    assert _fenced(c.step(image, core.Tick(now_ms=3_000))) == [2]   # 1 heard at 2_500: alive


def test_a_new_leader_gives_every_broker_a_whole_session_from_its_first_look() -> None:
    """Claim: a core that just took over (a new leader) fences no broker whose heartbeats went
    to the old leader until a whole session timeout after its first tick, however long ago
    their registration was (Kafka's controller gives every broker a fresh session on failover)."""
    c = ControllerCore(LeaderSettings(session_timeout_ms=1_500))
    image = _registered_and_unfenced(c)   # the old leader's view, committed
    new = ControllerCore(LeaderSettings(session_timeout_ms=1_500))
    assert _fenced(new.step(image, core.Tick(now_ms=60_000))) == []
    new.step(image, beat(image, 1, 61_000))
    assert _fenced(new.step(image, core.Tick(now_ms=61_500))) == []
    assert _fenced(new.step(image, core.Tick(now_ms=61_501))) == [2]
