"""Replicas that lost a write: out of leadership and the ISR, as Kafka does for a log directory
that went offline.

A broker whose log write fails (a full disk) takes that partition offline and opens it again
from disk once there is room (dataplane/broker/offline.py). The reopened log may lack batches
the core had taken before the write failed: a push leader sends a batch to its followers as it
writes it, so a quorum of them may hold, and have acknowledged, a batch its own log lost. So the
replica must neither lead again nor count as in sync until it has caught up as a follower, and
its broker says so in every heartbeat (`OfflineReplica`) while the metadata still shows it
leading or in the ISR at the epoch of the failure (`OfflineReplica.stands`). Here the controller:

- takes it out of the ISR and out of leadership, as for a fenced broker (`without_broker`): an
  `isr` topic's best other in-sync replica leads, a `quorum` topic is fenced for its election
  (the best (last epoch, end offset) of the replicas' reports wins);
- but when it is the `isr` topic's only in-sync replica and leads, no other replica may lead
  (none holds every committed record), so once it is back online it gets a new leader epoch
  instead: a reopened core refuses to lead an epoch its log already holds (replica/core.py).

Before, nothing told the controller: the leadership moved only when the followers reported the
leader silent (peer_unreachable_ms, then the reachability rules), seconds of acks=all refused.
"""
from __future__ import annotations

from typing import Iterable

from common.metadata.image import MetadataImage, PartitionInfo
from common.metadata.records import NO_LEADER, Record
from common.requests import OfflineReplica
from controller.decisions.plan import Plan, change, is_quorum, without_broker


def move_offline_replicas(image: MetadataImage, broker_id: int, offline: Iterable[OfflineReplica]) -> list[Record]:
    """Records taking `broker_id`'s offline replicas out of leadership and the ISR; nothing for a
    report the metadata has moved past (another epoch, or the replica already out), nor for one
    nothing can be done about yet (the last in-sync replica, not leading or not back online)."""
    acting = [r for r in offline if _acts(image, broker_id, r)]
    if not acting:
        return []   # most heartbeats that carry reports: no copy of the image for them
    plan = Plan(image)
    for report in acting:
        p = plan.image.partition(report.topic, report.partition)
        if not _acts(plan.image, broker_id, report):
            continue   # a change earlier in this plan did it (a report named twice)
        reason = f"replica offline on broker {broker_id} (a log write failed)"
        if _lone(plan.image, p, broker_id):
            plan.add(change(p, leader=NO_LEADER, reason=reason + "; leads again at a new epoch"))
            plan.add(change(plan.image.partition(report.topic, report.partition), leader=broker_id,
                            reason=reason + "; the only in-sync replica, back online"))
            continue
        record = without_broker(plan.image, p, broker_id, leave_isr=True, reason=reason)
        if record is not None:
            plan.add(record)
    return plan.records


def _lone(image: MetadataImage, p: PartitionInfo, broker_id: int) -> bool:
    """The isr topic's only in-sync replica leads: no other may lead."""
    return p.isr == (broker_id,) and p.leader == broker_id and not is_quorum(image, p)


def _acts(image: MetadataImage, broker_id: int, report: OfflineReplica) -> bool:
    p = image.get_partition(report.topic, report.partition)
    if p is None or broker_id not in p.replicas or not report.stands(p, broker_id):
        return False
    if _lone(image, p, broker_id):
        return report.online
    # without_broker changes nothing for the last ISR member that does not lead.
    return p.leader == broker_id or len(p.isr) > 1
