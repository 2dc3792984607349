"""Cluster health: what an operator must act on, judged from a metadata image and the
controller quorum's state.

Pure: an image and what the answering controller sees of its quorum go in, an answer
(`common.api_models.ClusterHealth`) comes out; no clock, no sockets.

Two grades, so a script can tell "look at it" from "it is losing availability now":
- critical: a partition has no leader (nobody can produce to it or read from it); an
  `isr` partition's ISR is below `min_insync_replicas`, or a `quorum` partition has
  fewer in-sync replicas than `quorum_required_acks` (acks=all cannot complete); the
  controller quorum has no leader.
- degraded: a replica is out of the ISR (under-replicated; a replica being added by a
  reassignment is catching up, not missing); a broker is fenced (not one that a
  decommission finished with); a controller is not connected to the leader.
"""
from __future__ import annotations

from dataclasses import dataclass

from common.api_models import ClusterHealth, HealthProblem
from common.metadata import MetadataImage
from common.metadata.image import PartitionInfo

PROBLEMS_MAX = 1000   # the answer lists at most this many; the counts cover all of them

CRITICAL = "critical"
DEGRADED = "degraded"


@dataclass(frozen=True, kw_only=True)
class QuorumView:
    """The controller quorum as the answering controller sees it."""

    node_id: int
    leader_id: int | None
    # (node id, connected to the answering node); a leader's view says which followers it reaches.
    controllers: tuple[tuple[int, bool], ...]


def in_sync_needed(image: MetadataImage, p: PartitionInfo) -> int:
    """How many in-sync replicas acks=all needs: min_insync_replicas (isr) or q (quorum)."""
    config = image.topics[p.topic].config
    if config.commit_policy == "quorum":
        return min(config.quorum_acks, len(p.target_replicas))
    return config.min_insync_replicas


def out_of_sync(p: PartitionInfo) -> tuple[int, ...]:
    """Replicas missing from the ISR; one being added by a reassignment is still catching up."""
    return tuple(b for b in p.replicas if b not in p.isr and b not in p.adding)


def cluster_health(image: MetadataImage, quorum: QuorumView) -> ClusterHealth:
    problems: list[HealthProblem] = []
    counts = {"leaderless": 0, "under_min_isr": 0, "under_replicated": 0, "fenced": 0,
              "controllers_disconnected": 0}

    if quorum.leader_id is None:
        problems.append(HealthProblem(check="controller_no_leader", severity=CRITICAL, node_id=quorum.node_id,
                                      message=f"the controller quorum has no leader (as controller "
                                              f"{quorum.node_id} sees it): no metadata change can be made"))
    else:
        reached = sum(1 for _, connected in quorum.controllers if connected)   # itself included
        majority = len(quorum.controllers) // 2 + 1
        if reached < majority:
            # The leader has not stepped down yet (it will, after its election timeout), but it
            # cannot commit: as critical as having no leader, and said now, not seconds later.
            problems.append(HealthProblem(
                check="controller_quorum_lost", severity=CRITICAL, node_id=quorum.node_id,
                message=f"controller {quorum.node_id} reaches {reached} of {len(quorum.controllers)} controllers; "
                        f"a majority ({majority}) is needed: no metadata change can be made until "
                        f"{majority - reached} more answer"))
        for node_id, connected in quorum.controllers:
            if not connected:
                counts["controllers_disconnected"] += 1
                problems.append(HealthProblem(
                    check="controller_disconnected", severity=DEGRADED, node_id=node_id,
                    message=f"controller {node_id} is not connected to controller {quorum.node_id}"
                            + (" (the leader)" if quorum.node_id == quorum.leader_id else "")))

    for broker_id in sorted(image.brokers):
        info = image.brokers[broker_id]
        if not info.fenced or info.decommissioned:
            continue
        counts["fenced"] += 1
        why = f" ({info.fence_reason})" if info.fence_reason else ""
        problems.append(HealthProblem(check="fenced_broker", severity=DEGRADED, broker_id=broker_id,
                                      message=f"broker {broker_id} at {info.host}:{info.port} is fenced{why}"))

    for p in image.partitions():
        name = f"{p.topic}-{p.partition}"
        if p.leader is None:
            counts["leaderless"] += 1
            why = "an election is in progress" if p.fenced_for_election else \
                f"no eligible replica among isr {list(p.isr)} is live"
            problems.append(HealthProblem(check="leaderless", severity=CRITICAL, topic=p.topic,
                                          partition=p.partition,
                                          message=f"{name} has no leader ({why})"))
        needed = in_sync_needed(image, p)
        if len(p.isr) < needed:
            counts["under_min_isr"] += 1
            policy = image.topics[p.topic].config.commit_policy
            setting = "quorum_required_acks" if policy == "quorum" else "min_insync_replicas"
            problems.append(HealthProblem(
                check="under_min_isr", severity=CRITICAL, topic=p.topic, partition=p.partition,
                message=f"{name} has {len(p.isr)} in-sync replicas {list(p.isr)}, fewer than its "
                        f"{setting} {needed}: acks=all produce is refused"))
        missing = out_of_sync(p)
        if missing:
            counts["under_replicated"] += 1
            problems.append(HealthProblem(
                check="under_replicated", severity=DEGRADED, topic=p.topic, partition=p.partition,
                message=f"{name}: replicas {list(missing)} are out of the ISR {list(p.isr)} "
                        f"(replicas {list(p.replicas)})"))

    critical = any(x.severity == CRITICAL for x in problems)
    status = CRITICAL if critical else DEGRADED if problems else "healthy"
    # Critical first, so a truncated list still shows what matters most.
    problems.sort(key=lambda x: x.severity != CRITICAL)
    return ClusterHealth(
        status=status, healthy=not problems, node_id=quorum.node_id, controller_leader=quorum.leader_id,
        metadata_offset=image.offset,
        leaderless_partitions=counts["leaderless"], under_min_isr_partitions=counts["under_min_isr"],
        under_replicated_partitions=counts["under_replicated"], fenced_brokers=counts["fenced"],
        controllers_disconnected=counts["controllers_disconnected"],
        problems=problems[:PROBLEMS_MAX], problems_omitted=max(0, len(problems) - PROBLEMS_MAX))
