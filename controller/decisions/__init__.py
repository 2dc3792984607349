"""Controller decisions: pure functions from (image, liveness, time) to records.

Nothing here reads a clock, touches the network or disk, or draws a random
number. In-memory controller-leader state (broker sessions, quorum election
reports, the rebalance timer) is passed in explicitly. Every record a decision
returns applies cleanly, in order, to the image it was decided on; partition
changes carry the partition epoch they expect, so a decision made on a stale
image is rejected when applied rather than misapplied.
"""
from __future__ import annotations

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
from controller.decisions.isr import alter_isr
from controller.decisions.placement import place_replicas
from controller.decisions.plan import Plan
from controller.decisions.producer_ids import allocate_producer_ids
from controller.decisions.reassignment import (
    cancel_reassignment,
    progress_reassignments,
    start_reassignment,
)
from controller.decisions.rebalance import RebalanceTimer, elect_preferred
from controller.decisions.sessions import (
    BrokerSessions,
    check_heartbeat,
    fence_broker,
    fence_expired,
    fence_shutting_down,
    register_broker,
    unfence_ready,
)
from controller.decisions.topics import alter_config, create_topic, delete_topic

__all__ = [
    "periodic", "ControllerState", "BrokerSessions", "QuorumElectionTracker", "RebalanceTimer",
    "alter_config", "alter_isr", "allocate_producer_ids", "cancel_reassignment",
    "check_heartbeat", "create_topic", "delete_topic", "elect_isr_leader", "elect_leaders",
    "elect_preferred", "elect_quorum", "fence_broker", "fence_expired", "fence_shutting_down", "fence_for_election",
    "move_fenced_leaders", "place_replicas", "progress_reassignments", "register_broker", "start_reassignment",
    "unfence_ready",
]


def periodic(image: MetadataImage, sessions: BrokerSessions, tracker: QuorumElectionTracker,
             now_ms: int, *, rebalance_timer: RebalanceTimer | None = None) -> list[Record]:
    """What the controller leader should append now, in this fixed order:
    fence expired brokers and brokers in a controlled shutdown (moving their
    leaderships, shrinking ISRs); unfence
    brokers that heartbeat and caught up; move any leadership a fenced broker
    still holds (only after a stale proposal); elect leaders for leaderless
    partitions (quorum: fence step, then from the tracker's reports); progress
    reassignments; and, when `rebalance_timer` says it is due, preferred-leader
    rebalance. Each step sees the records of the steps before it.

    Idempotent: called again on the image with these records applied, it
    returns nothing new for the same facts (a fence is not emitted twice).
    """
    plan = Plan(image)
    plan.extend(fence_expired(plan.image, sessions, now_ms))
    plan.extend(fence_shutting_down(plan.image, sessions, now_ms))
    plan.extend(unfence_ready(plan.image, sessions, now_ms))
    plan.extend(move_fenced_leaders(plan.image))
    plan.extend(elect_leaders(plan.image, tracker))
    plan.extend(progress_reassignments(plan.image))
    if rebalance_timer is not None and rebalance_timer.due(now_ms):
        plan.extend(elect_preferred(plan.image))
    tracker.forget_stale(image)
    return plan.records


class ControllerState:
    """The controller leader's in-memory (unreplicated) state, bundled: broker sessions,
    quorum election reports and the rebalance timer. A new leader starts a fresh one."""

    def __init__(self, *, session_timeout_ms: int = 1500,
                 rebalance_interval_ms: int = 300_000) -> None:
        self.sessions = BrokerSessions(session_timeout_ms=session_timeout_ms)
        self.tracker = QuorumElectionTracker()
        self.rebalance_timer = RebalanceTimer(rebalance_interval_ms=rebalance_interval_ms)

    def periodic(self, image: MetadataImage, now_ms: int) -> list[Record]:
        return periodic(image, self.sessions, self.tracker, now_ms,
                        rebalance_timer=self.rebalance_timer)
