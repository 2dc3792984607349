"""Controller decisions: pure functions from (image, liveness, time) to records.

Nothing here reads a clock, touches the network or disk, or draws a random
number. In-memory controller-leader state (broker sessions, quorum election
reports, the rebalance timer) is passed in explicitly. Every record a decision
returns applies cleanly, in order, to the image it was decided on; partition
changes carry the partition epoch they expect, so a decision made on a stale
image is rejected when applied rather than misapplied.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from common.metadata.image import MetadataImage
from common.metadata.records import Record
from controller.decisions.elections import (
    QuorumElectionTracker,
    elect_isr_leader,
    elect_leaders,
    elect_quorum,
    fence_for_election,
    move_fenced_leaders,
)
from controller.decisions.cluster_config import alter_cluster_config
from controller.decisions.decommission import (
    DecommissionProgress,
    decommission_moves,
    decommission_progress,
    recommission,
    start_decommission,
)
from controller.decisions.isr import alter_isr
from controller.decisions.limits import PartitionLimits, check_partitions
from controller.decisions.maintenance import (
    MaintenanceDrain,
    MaintenanceProgress,
    drain_leaders,
    maintenance_progress,
    set_maintenance,
)
from controller.decisions.offline import move_offline_replicas
from controller.decisions.placement import place_replicas
from controller.decisions.plan import Plan
from controller.decisions.producer_ids import allocate_producer_ids
from controller.decisions.reassignment import (
    cancel_many,
    cancel_reassignment,
    progress_reassignments,
    start_plan,
    start_reassignment,
)
from controller.decisions.reachability import (
    UNREACHABLE_DECISION_INTERVAL_MS,
    Link,
    ReachabilityReports,
    move_unreachable_leaders,
    refuse_lonely_shrink,
)
from controller.decisions.rebalance import (
    LEADER_IMBALANCE_CHECK_INTERVAL_MS,
    LEADER_IMBALANCE_PER_BROKER_PERCENTAGE,
    QUORUM_PREFERRED_RETRY_MS,
    REBALANCE_INTERVAL_MS,
    BrokerImbalance,
    IntervalTimer,
    LeaderImbalanceCheck,
    elect_imbalanced,
    elect_preferred,
    ideal_leader,
    leader_imbalance,
)
from controller.decisions.sessions import (
    SESSION_TIMEOUT_MS,
    BrokerSessions,
    Hearing,
    check_heartbeat,
    fence_broker,
    fence_expired,
    fence_shutting_down,
    register_broker,
    unfence_ready,
)
from controller.decisions.topics import add_partitions, alter_config, create_topic, delete_topic

__all__ = [
    "periodic", "ControllerState", "LeaderSettings", "BrokerSessions", "Hearing", "QuorumElectionTracker",
    "IntervalTimer", "LeaderImbalanceCheck", "BrokerImbalance", "PartitionLimits", "check_partitions",
    "MaintenanceDrain", "MaintenanceProgress",
    "DecommissionProgress", "decommission_moves", "decommission_progress", "drain_leaders", "maintenance_progress",
    "recommission", "set_maintenance", "start_decommission", "alter_cluster_config", "cancel_many", "start_plan",
    "Link", "ReachabilityReports", "move_unreachable_leaders", "refuse_lonely_shrink",
    "add_partitions", "alter_config", "alter_isr", "allocate_producer_ids", "cancel_reassignment",
    "check_heartbeat", "create_topic", "delete_topic", "elect_imbalanced", "elect_isr_leader", "elect_leaders",
    "elect_preferred", "elect_quorum", "fence_broker", "fence_expired", "fence_shutting_down", "fence_for_election",
    "ideal_leader", "leader_imbalance",
    "move_fenced_leaders", "move_offline_replicas", "place_replicas", "progress_reassignments", "register_broker", "start_reassignment",
    "unfence_ready",
]


def periodic(image: MetadataImage, sessions: BrokerSessions, tracker: QuorumElectionTracker,
             now_ms: int, *, rebalance_timer: IntervalTimer | None = None,
             imbalance_check: LeaderImbalanceCheck | None = None,
             maintenance_drain: MaintenanceDrain | None = None,
             reachability: ReachabilityReports | None = None) -> list[Record]:
    """What the controller leader should append now, in this fixed order:
    fence expired brokers and brokers in a controlled shutdown (moving their
    leaderships, shrinking ISRs); unfence
    brokers that heartbeat and caught up; move any leadership a fenced broker
    still holds (only after a stale proposal); move leaderships whose followers report
    their leader unreachable (`reachability`); elect leaders for leaderless
    partitions (quorum: fence step, then from the tracker's reports); drain
    leaderships off brokers in maintenance (with `maintenance_drain`); start the
    next moves off brokers being decommissioned, and fence those with nothing left;
    progress reassignments; when `rebalance_timer` says it is due, preferred-leader
    rebalance; and the leader-imbalance check when it is due or an ideal leader has
    rejoined an ISR (`LeaderImbalanceCheck`).
    Each step sees the records of the steps before it.

    Idempotent: called again on the image with these records applied, it
    returns nothing new for the same facts (a fence is not emitted twice).
    """
    plan = Plan(image)
    plan.extend(fence_expired(plan.image, sessions, now_ms))
    plan.extend(fence_shutting_down(plan.image, sessions, now_ms))
    plan.extend(unfence_ready(plan.image, sessions, now_ms))
    plan.extend(move_fenced_leaders(plan.image))
    if reachability is not None:
        moved, exclusions = move_unreachable_leaders(plan.image, reachability, now_ms)
        plan.extend(moved)
        for e in exclusions:
            tracker.exclude(e.topic, e.partition, e.fenced_epoch, e.leader, until_ms=e.until_ms)
    plan.extend(elect_leaders(plan.image, tracker))
    if maintenance_drain is not None:
        plan.extend(maintenance_drain.run(plan.image, now_ms))
    plan.extend(decommission_moves(plan.image, now_ms))
    plan.extend(progress_reassignments(plan.image))
    if rebalance_timer is not None and rebalance_timer.due(now_ms):
        plan.extend(elect_preferred(plan.image))
    if imbalance_check is not None:
        plan.extend(imbalance_check.run(plan.image, now_ms, reachability))
    tracker.forget_stale(image)
    return plan.records


@dataclass(frozen=True, kw_only=True)
class LeaderSettings:
    """How the controller leader runs its periodic decisions and the partition limits its
    topic decisions keep (`biplane controller` flags).

    `leader_imbalance_check_interval_ms` = 0 turns the imbalance check off (Kafka's
    auto.leader.rebalance.enable=false leaves only the full rebalance here).
    """

    session_timeout_ms: int = SESSION_TIMEOUT_MS
    rebalance_interval_ms: int = REBALANCE_INTERVAL_MS
    leader_imbalance_check_interval_ms: int = LEADER_IMBALANCE_CHECK_INTERVAL_MS
    leader_imbalance_per_broker_percentage: int = LEADER_IMBALANCE_PER_BROKER_PERCENTAGE
    quorum_preferred_retry_ms: int = QUORUM_PREFERRED_RETRY_MS
    partition_limits: PartitionLimits = PartitionLimits()
    # At most one leadership move per partition per interval on followers' reports.
    unreachable_decision_interval_ms: int = UNREACHABLE_DECISION_INTERVAL_MS
    # Brokers not yet heard from by a new controller leader: extra session time (BrokerSessions).
    new_leader_grace_ms: int = 0

    def __post_init__(self) -> None:
        for name in ("session_timeout_ms", "rebalance_interval_ms"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0 ms, got {getattr(self, name)}")
        if self.leader_imbalance_check_interval_ms < 0:
            raise ValueError("leader_imbalance_check_interval_ms must be >= 0 ms (0 turns the check off), "
                             f"got {self.leader_imbalance_check_interval_ms}")
        if not 0 <= self.leader_imbalance_per_broker_percentage <= 100:
            raise ValueError("leader_imbalance_per_broker_percentage must be in 0..100, "
                             f"got {self.leader_imbalance_per_broker_percentage}")
        if self.new_leader_grace_ms < 0:
            raise ValueError(f"new_leader_grace_ms must be >= 0 ms, got {self.new_leader_grace_ms}")
        if self.quorum_preferred_retry_ms < 0:
            raise ValueError(f"quorum_preferred_retry_ms must be >= 0 ms, got {self.quorum_preferred_retry_ms}")


class ControllerState:
    """The controller leader's in-memory (unreplicated) state, bundled: broker sessions,
    quorum election reports, the rebalance timer, the leader-imbalance check and the
    maintenance drain's quorum retries.
    A new leader starts a fresh one."""

    def __init__(self, settings: LeaderSettings = LeaderSettings(), *,
                 heard_before_start: Mapping[int, tuple[str, int]] | None = None) -> None:
        self.settings = settings
        self.sessions = BrokerSessions(session_timeout_ms=settings.session_timeout_ms,
                                       new_leader_grace_ms=settings.new_leader_grace_ms,
                                       heard_before_start=heard_before_start)
        self.tracker = QuorumElectionTracker()
        # A report counts while the broker's session would: its heartbeats carry it anew.
        self.reachability = ReachabilityReports(fresh_ms=settings.session_timeout_ms,
                                                interval_ms=settings.unreachable_decision_interval_ms)
        self.rebalance_timer: IntervalTimer | None = IntervalTimer(interval_ms=settings.rebalance_interval_ms)
        self.maintenance_drain = MaintenanceDrain()
        self.imbalance_check: LeaderImbalanceCheck | None = None
        if settings.leader_imbalance_check_interval_ms > 0:
            self.imbalance_check = LeaderImbalanceCheck(
                check_interval_ms=settings.leader_imbalance_check_interval_ms,
                per_broker_percentage=settings.leader_imbalance_per_broker_percentage,
                quorum_retry_ms=settings.quorum_preferred_retry_ms)

    def periodic(self, image: MetadataImage, now_ms: int) -> list[Record]:
        return periodic(image, self.sessions, self.tracker, now_ms,
                        rebalance_timer=self.rebalance_timer, imbalance_check=self.imbalance_check,
                        maintenance_drain=self.maintenance_drain, reachability=self.reachability)
