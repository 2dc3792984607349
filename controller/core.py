"""The controller leader's core: the one entry for every change the leader makes.

`ControllerCore.step(image, event) -> Step` takes what a broker, an admin or the
timer asked, decides with the pure functions of `controller/decisions/`, and
returns the records to append. It also owns the leader's unreplicated memory
(`ControllerState`: broker sessions, quorum election reports, the rebalance timer,
the leader-imbalance check) and changes it only inside `step`. It never awaits,
reads a clock, touches a socket or a file: time comes in on the event (`now_ms`),
the image comes in as an argument and is not modified. Fed the same images and
events, two cores return the same records (tests/test_controller_core.py).

What it leaves to others: `ControllerService` applies the records to its pending
image and commits them through Raft; the handlers in `rpc.py` and `api.py` parse
a request into an event, call `ControllerService.execute`, and build a typed
answer from the step and the commit. A bad request raises a `BiplaneError` from
`step` before anything is changed or staged.

One handler per event type, looked up in `_HANDLERS` by exact type, as in the
replica core (`dataplane/replica/core.py`).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Callable, Union

from common.metadata.image import MetadataImage
from common.metadata.records import Record
from common.requests import (
    AddPartitionsRequest,
    AllocateProducerIdsRequest,
    AlterConfigRequest,
    AlterIsrRequest,
    CancelReassignmentsRequest,
    ClusterConfigRequest,
    CreateTopicRequest,
    ElectionReport,
    HeartbeatRequest,
    ReassignmentPlanRequest,
    ReassignmentRequest,
    RegisterBrokerRequest,
)
from controller import decisions as d
from controller.decisions import ControllerState, LeaderSettings

# ---- events: broker RPC


@dataclass(frozen=True, kw_only=True)
class RegisterBroker:
    request: RegisterBrokerRequest
    now_ms: int


@dataclass(frozen=True, kw_only=True)
class Heartbeat:
    request: HeartbeatRequest
    now_ms: int


@dataclass(frozen=True, kw_only=True)
class AlterIsr:
    request: AlterIsrRequest
    now_ms: int | None = None   # None: no link reports are consulted (tests of the ISR rules alone)


@dataclass(frozen=True, kw_only=True)
class ReportElection:
    report: ElectionReport
    now_ms: int | None = None   # ends a refusal of the old leader's report (elections.py); None: it holds


@dataclass(frozen=True, kw_only=True)
class AllocateProducerIds:
    request: AllocateProducerIdsRequest


# ---- events: admin API


@dataclass(frozen=True, kw_only=True)
class CreateTopic:
    request: CreateTopicRequest
    now_ms: int


@dataclass(frozen=True, kw_only=True)
class DeleteTopic:
    name: str


@dataclass(frozen=True, kw_only=True)
class AddPartitions:
    name: str
    request: AddPartitionsRequest


@dataclass(frozen=True, kw_only=True)
class AlterConfig:
    name: str
    request: AlterConfigRequest


@dataclass(frozen=True, kw_only=True)
class StartReassignment:
    request: ReassignmentRequest


@dataclass(frozen=True, kw_only=True)
class StartPlan:
    request: ReassignmentPlanRequest


@dataclass(frozen=True, kw_only=True)
class CancelReassignments:
    request: CancelReassignmentsRequest


@dataclass(frozen=True, kw_only=True)
class AlterClusterConfig:
    request: ClusterConfigRequest


@dataclass(frozen=True, kw_only=True)
class ElectPreferred:
    partitions: tuple[tuple[str, int], ...] | None   # None: every partition


@dataclass(frozen=True, kw_only=True)
class SetMaintenance:
    broker_id: int
    enabled: bool


@dataclass(frozen=True, kw_only=True)
class Decommission:
    broker_id: int
    now_ms: int


@dataclass(frozen=True, kw_only=True)
class Recommission:
    broker_id: int


# ---- events: the leader's timer


@dataclass(frozen=True, kw_only=True)
class Tick:
    now_ms: int
    # How long the leader itself did not run before this tick (its timer's lag, measured by
    # the driver on a monotonic clock): given back to every broker session.
    paused_ms: int = 0


Event = Union[RegisterBroker, Heartbeat, AlterIsr, ReportElection, AllocateProducerIds, CreateTopic,
              DeleteTopic, AddPartitions, AlterConfig, StartReassignment, StartPlan, CancelReassignments,
              AlterClusterConfig, ElectPreferred, SetMaintenance, Decommission, Recommission, Tick]


@dataclass(frozen=True, kw_only=True)
class Step:
    """What one event decided.

    `records` are to be appended in order, each applying to the image the step saw
    with the ones before it. `wait_for_commit` says the answer must wait until they
    (and whatever was staged before them) commit; it is False only when the event
    changed nothing that the asker waits on. `refused` says why an election report
    was not kept (the broker is told, nothing else happens). `warnings` are for the log.
    """

    records: tuple[Record, ...] = ()
    wait_for_commit: bool = True
    refused: str | None = None
    warnings: tuple[str, ...] = ()   # for operators: the driver logs them

    def __post_init__(self) -> None:
        # Records staged without a waiter would commit, or fail, unseen by the asker.
        if self.records and not self.wait_for_commit:
            raise AssertionError(f"a step with {len(self.records)} records must wait for their commit")


class ControllerCore:
    """The leader's decisions and its in-memory state. A new leader starts a fresh one."""

    def __init__(self, settings: LeaderSettings = LeaderSettings(), *,
                 heard_before_start: Mapping[int, tuple[str, int]] | None = None) -> None:
        # heard_before_start: broker -> (incarnation, ms from which its silence counts), as
        # this node heard it before it led (sessions.Hearing.as_of).
        self.state = ControllerState(settings, heard_before_start=heard_before_start)

    @property
    def settings(self) -> LeaderSettings:
        return self.state.settings

    def step(self, image: MetadataImage, event: Event) -> Step:
        """Decide `event` on `image` (the leader's pending image; not modified)."""
        handler = _HANDLERS.get(type(event))
        if handler is None:
            raise TypeError(f"ControllerCore.step got {type(event).__name__}; expected one of "
                            f"{sorted(t.__name__ for t in _HANDLERS)}")
        return handler(self, image, event)

    # ---- broker RPC

    def _register(self, image: MetadataImage, ev: RegisterBroker) -> Step:
        records = d.register_broker(image, ev.request, ev.now_ms)
        # The registration starts the new incarnation's session, so it gets a whole
        # session timeout from now to send its first heartbeat.
        self.state.sessions.heartbeat(ev.request.broker_id, ev.request.incarnation_id, ev.now_ms, -1)
        self.state.reachability.forget_broker(ev.request.broker_id)
        return Step(records=tuple(records))

    def _heartbeat(self, image: MetadataImage, ev: Heartbeat) -> Step:
        body = ev.request
        d.check_heartbeat(image, body)
        self.state.sessions.heartbeat(body.broker_id, body.incarnation_id, ev.now_ms, body.metadata_offset,
                                      want_shutdown=body.want_shutdown)
        if body.liveness_only:
            return Step(wait_for_commit=False)
        self.state.reachability.note(body.broker_id, [d.Link(u.topic, u.partition, u.leader_epoch, u.peer)
                                                      for u in body.unreachable], ev.now_ms)
        if body.want_shutdown and not image.brokers[body.broker_id].fenced:
            # Controlled shutdown: fence now, not at the next periodic pass, since the
            # broker waits on this answer to stop.
            records = d.fence_shutting_down(image, self.state.sessions, ev.now_ms)
            return Step(records=tuple(records))
        if body.offline:
            records = d.move_offline_replicas(image, body.broker_id, body.offline)
            if records:
                return Step(records=tuple(records))
        # Nothing to write: answer at once rather than behind other commands (brokers
        # heartbeat every 150 ms; an admin write's commit must not delay them).
        return Step(wait_for_commit=False)

    def _alter_isr(self, image: MetadataImage, ev: AlterIsr) -> Step:
        records = d.alter_isr(image, ev.request)
        if records and ev.now_ms is not None:
            d.refuse_lonely_shrink(image, ev.request, self.state.reachability, ev.now_ms)
        if records and self.state.imbalance_check is not None:
            self.state.imbalance_check.isr_changed(
                image, image.partition(ev.request.topic, ev.request.partition), ev.request.new_isr)
        return Step(records=tuple(records))

    def _report_election(self, image: MetadataImage, ev: ReportElection) -> Step:
        why = self.state.tracker.add(image, ev.report, ev.now_ms)
        if why is not None:
            return Step(wait_for_commit=False, refused=why)
        return Step(records=tuple(d.elect_leaders(image, self.state.tracker)))

    def _allocate_producer_ids(self, image: MetadataImage, ev: AllocateProducerIds) -> Step:
        return Step(records=tuple(d.allocate_producer_ids(image, ev.request)))

    # ---- admin API

    def _create_topic(self, image: MetadataImage, ev: CreateTopic) -> Step:
        return Step(records=tuple(d.create_topic(image, ev.request, ev.now_ms, self.settings.partition_limits)))

    def _delete_topic(self, image: MetadataImage, ev: DeleteTopic) -> Step:
        return Step(records=tuple(d.delete_topic(image, ev.name)))

    def _add_partitions(self, image: MetadataImage, ev: AddPartitions) -> Step:
        return Step(records=tuple(d.add_partitions(image, ev.name, ev.request, self.settings.partition_limits)))

    def _alter_config(self, image: MetadataImage, ev: AlterConfig) -> Step:
        return Step(records=tuple(d.alter_config(image, ev.name, ev.request)))

    def _start_reassignment(self, image: MetadataImage, ev: StartReassignment) -> Step:
        return Step(records=tuple(d.start_reassignment(image, ev.request)))

    def _start_plan(self, image: MetadataImage, ev: StartPlan) -> Step:
        return Step(records=tuple(d.start_plan(image, ev.request)))

    def _cancel_reassignments(self, image: MetadataImage, ev: CancelReassignments) -> Step:
        return Step(records=tuple(d.cancel_many(image, ev.request)))

    def _alter_cluster_config(self, image: MetadataImage, ev: AlterClusterConfig) -> Step:
        return Step(records=tuple(d.alter_cluster_config(image, ev.request)))

    def _elect_preferred(self, image: MetadataImage, ev: ElectPreferred) -> Step:
        return Step(records=tuple(d.elect_preferred(image, ev.partitions)))

    def _set_maintenance(self, image: MetadataImage, ev: SetMaintenance) -> Step:
        return Step(records=tuple(d.set_maintenance(image, ev.broker_id, ev.enabled)))

    def _decommission(self, image: MetadataImage, ev: Decommission) -> Step:
        return Step(records=tuple(d.start_decommission(image, ev.broker_id, ev.now_ms)))

    def _recommission(self, image: MetadataImage, ev: Recommission) -> Step:
        return Step(records=tuple(d.recommission(image, ev.broker_id)))

    # ---- timer

    def _tick(self, image: MetadataImage, ev: Tick) -> Step:
        # Sessions expire, shut-down brokers fence, caught-up brokers unfence, elections, the
        # maintenance drain, decommission moves, reassignments, rebalance and the imbalance
        # handback: in `decisions.periodic`'s order.
        self.state.sessions.credit(ev.paused_ms, ev.now_ms)
        records = tuple(self.state.periodic(image, ev.now_ms))
        warnings = tuple(self.state.tracker.stalled(image, ev.now_ms))
        return Step(records=records, warnings=warnings)


_HANDLERS: dict[type, Callable[..., Step]] = {
    RegisterBroker: ControllerCore._register,
    Heartbeat: ControllerCore._heartbeat,
    AlterIsr: ControllerCore._alter_isr,
    ReportElection: ControllerCore._report_election,
    AllocateProducerIds: ControllerCore._allocate_producer_ids,
    CreateTopic: ControllerCore._create_topic,
    DeleteTopic: ControllerCore._delete_topic,
    AddPartitions: ControllerCore._add_partitions,
    AlterConfig: ControllerCore._alter_config,
    StartReassignment: ControllerCore._start_reassignment,
    StartPlan: ControllerCore._start_plan,
    CancelReassignments: ControllerCore._cancel_reassignments,
    AlterClusterConfig: ControllerCore._alter_cluster_config,
    ElectPreferred: ControllerCore._elect_preferred,
    SetMaintenance: ControllerCore._set_maintenance,
    Decommission: ControllerCore._decommission,
    Recommission: ControllerCore._recommission,
    Tick: ControllerCore._tick,
}
