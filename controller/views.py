"""What the admin API returns, built from the image (the models are common/api_models.py,
shared with the admin client)."""
from __future__ import annotations

from typing import Any, Mapping

from common.api_models import (
    BrokerList,
    BrokerOperations,
    GroupLag,
    GroupList,
    GroupPartitionLag,
    ClusterConfigView,
    PartitionMove,
    ReassignmentProgress,
    ReplicaCatchUp,
    BrokerView,
    PartitionOffsets,
    PartitionView,
    TopicDetail,
    TopicList,
    TopicOffsets,
    TopicSummary,
)
from common.metadata import MetadataImage
from common.metadata.cluster_config import CLUSTER_CONFIG_MEANINGS
from common.usage import BrokerUsage, ReplicaUsage, lag_records
from controller.decisions import decommission_progress, maintenance_progress


def partition_view(p: Any) -> PartitionView:
    return PartitionView(topic=p.topic, partition=p.partition, replicas=list(p.replicas), isr=list(p.isr),
                         leader=p.leader, leader_epoch=p.leader_epoch, partition_epoch=p.partition_epoch,
                         adding=list(p.adding), removing=list(p.removing),
                         fenced_for_election=p.fenced_for_election)


def topic_detail(image: MetadataImage, name: str, *, metadata_offset: int | None) -> TopicDetail:
    t = image.topics[name]
    return TopicDetail(name=t.name, topic_id=t.topic_id, metadata_offset=metadata_offset,
                       config=t.config.in_force(),
                       partitions=[partition_view(p) for p in image.topic_partitions(name)])


def topic_offsets(image: MetadataImage, name: str, usage: Mapping[int, BrokerUsage], *,
                  now_ms: int) -> TopicOffsets:
    """Each partition's offsets and size from its current leader's latest usage report: the
    leader is the replica whose high watermark consumers read to."""
    reported: dict[tuple[int, int], tuple[BrokerUsage, ReplicaUsage]] = {}
    for broker_id, u in usage.items():
        for r in u.replicas:
            if r.topic == name:
                reported[(broker_id, r.partition)] = (u, r)
    out = []
    for p in image.topic_partitions(name):
        sizes = [reported[(b, p.partition)][1].size_bytes for b in p.replicas if (b, p.partition) in reported]
        found = reported.get((p.leader, p.partition)) if p.leader is not None else None
        if found is None:
            out.append(PartitionOffsets(topic=name, partition=p.partition, leader=p.leader,
                                        replicas_size_bytes=sum(sizes) if sizes else None))
            continue
        u, r = found
        out.append(PartitionOffsets(topic=name, partition=p.partition, leader=p.leader,
                                    log_start_offset=r.log_start_offset, high_watermark=r.high_watermark,
                                    log_end_offset=r.log_end_offset, size_bytes=r.size_bytes,
                                    replicas_size_bytes=sum(sizes), reported_at_ms=u.at_ms,
                                    age_ms=max(0, now_ms - u.at_ms)))
    return TopicOffsets(topic=name, metadata_offset=image.offset, at_ms=now_ms, partitions=out)


def group_list(image: MetadataImage, usage: Mapping[int, BrokerUsage], *, now_ms: int) -> GroupList:
    """Every group the coordinators reported, with each committed offset's lag against the
    partition leader's reported high watermark. A group reported by two brokers (its
    coordinator moved and the old one's last report is still kept) is taken from the newer
    report."""
    hw: dict[tuple[int, str, int], tuple[int, int]] = {}    # (broker, topic, partition) -> (hw, at_ms)
    chosen: dict[str, tuple[int, BrokerUsage, Any]] = {}
    groups_omitted = offsets_omitted = 0
    for broker_id, u in sorted(usage.items()):
        groups_omitted += u.groups_omitted
        offsets_omitted += u.group_offsets_omitted
        for r in u.replicas:
            hw[(broker_id, r.topic, r.partition)] = (r.high_watermark, u.at_ms)
        for g in u.groups:
            seen = chosen.get(g.group)
            if seen is None or u.at_ms > seen[1].at_ms:
                chosen[g.group] = (broker_id, u, g)
    out = []
    for name, (broker_id, u, g) in sorted(chosen.items()):
        partitions = []
        for o in g.offsets:
            info = image.get_partition(o.topic, o.partition)
            leader = info.leader if info is not None else None
            found = hw.get((leader, o.topic, o.partition)) if leader is not None else None
            if found is None:
                partitions.append(GroupPartitionLag(topic=o.topic, partition=o.partition,
                                                    committed_offset=o.committed_offset, leader=leader))
                continue
            high_watermark, at_ms = found
            partitions.append(GroupPartitionLag(
                topic=o.topic, partition=o.partition, committed_offset=o.committed_offset, leader=leader,
                high_watermark=high_watermark, lag_records=lag_records(high_watermark, o.committed_offset),
                high_watermark_age_ms=max(0, now_ms - at_ms)))
        out.append(GroupLag(group=name, coordinator=broker_id, state=g.state, members=g.members,
                            reported_at_ms=u.at_ms, age_ms=max(0, now_ms - u.at_ms), partitions=partitions))
    return GroupList(metadata_offset=image.offset, at_ms=now_ms, groups=out, groups_omitted=groups_omitted,
                     offsets_omitted=offsets_omitted)


def broker_operations(image: MetadataImage, broker_id: int, broker_offset: int | None) -> BrokerOperations:
    info = image.brokers[broker_id]
    drain = maintenance_progress(image, broker_id)
    moves = decommission_progress(image, broker_id)
    if info.decommissioned:
        message = f"broker {broker_id} is decommissioned: it hosts no replica and stays fenced"
    elif info.decommissioning:
        message = (f"broker {broker_id} is being decommissioned: {len(moves.hosted)} replica(s) left on it, "
                   f"{len(moves.moving)} moving now")
    elif info.maintenance:
        message = (f"broker {broker_id} is in maintenance: it leads {len(drain.leaders)} partition(s), "
                   f"{len(drain.movable)} of them still to move")
    else:
        message = f"broker {broker_id} is in service"
    return BrokerOperations(
        broker_id=broker_id, metadata_offset=image.offset, broker_metadata_offset=broker_offset,
        fenced=info.fenced, maintenance=info.maintenance, decommissioning=info.decommissioning,
        decommissioned=info.decommissioned, leaders=len(drain.leaders), leaders_movable=len(drain.movable),
        replicas=len(moves.hosted), replicas_moving=len(moves.moving),
        stuck=list((drain.stuck if info.maintenance else ()) + (moves.stuck if info.decommissioning else ()))[:100],
        message=message)


def cluster_config_view(image: MetadataImage, *, metadata_offset: int | None) -> ClusterConfigView:
    return ClusterConfigView(metadata_offset=metadata_offset, config=image.cluster_config.model_dump(mode="json"),
                             descriptions=dict(CLUSTER_CONFIG_MEANINGS))


def reassignment_progress(image: MetadataImage, usage: Mapping[int, BrokerUsage], *,
                          now_ms: int) -> ReassignmentProgress:
    """Every running reassignment, with each added replica's catch-up against the leader, from
    the brokers' latest usage reports (about once a second)."""
    reported: dict[tuple[int, str, int], ReplicaUsage] = {}
    for broker_id, u in usage.items():
        for r in u.replicas:
            reported[(broker_id, r.topic, r.partition)] = r
    moves = []
    for p in image.partitions():
        if not p.reassigning:
            continue
        lead = reported.get((p.leader, p.topic, p.partition)) if p.leader is not None else None
        moving = []
        for b in p.adding:
            mine = reported.get((b, p.topic, p.partition))
            moving.append(ReplicaCatchUp(
                broker_id=b, in_isr=b in p.isr,
                log_end_offset=mine.log_end_offset if mine else None, size_bytes=mine.size_bytes if mine else None,
                offsets_behind=max(0, lead.log_end_offset - mine.log_end_offset) if mine and lead else None,
                bytes_behind=max(0, lead.size_bytes - mine.size_bytes) if mine and lead else None))
        moves.append(PartitionMove(topic=p.topic, partition=p.partition, replicas=list(p.replicas),
                                   target_replicas=list(p.target_replicas), adding=list(p.adding),
                                   removing=list(p.removing), leader=p.leader,
                                   leader_log_end_offset=lead.log_end_offset if lead else None,
                                   leader_size_bytes=lead.size_bytes if lead else None, moving=moving))
    return ReassignmentProgress(metadata_offset=image.offset, at_ms=now_ms,
                                throttle_bytes_per_s=image.cluster_config.reassignment_throttle_bytes_per_s,
                                partitions=moves)


def topic_list(image: MetadataImage) -> TopicList:
    return TopicList(metadata_offset=image.offset, topics=[
        TopicSummary(name=t.name, topic_id=t.topic_id, partitions=t.config.partitions,
                     replication_factor=t.config.replication_factor,
                     commit_policy=t.config.commit_policy, replication_mode=t.config.replication_mode)
        for t in (image.topics[n] for n in sorted(image.topics))])


def _lag(committed: int, reported: int | None) -> int | None:
    return None if reported is None else max(0, committed - reported)


def broker_list(image: MetadataImage, broker_offsets: Mapping[int, int],
                usage: Mapping[int, BrokerUsage], opening: Mapping[int, int] | None = None) -> BrokerList:
    leaders: dict[int, int] = {}
    replicas: dict[int, int] = {}
    for p in image.partitions():
        if p.leader is not None:
            leaders[p.leader] = leaders.get(p.leader, 0) + 1
        for b in p.replicas:
            replicas[b] = replicas.get(b, 0) + 1
    out = []
    for b in sorted(image.brokers):
        info = image.brokers[b]
        u = usage.get(b)
        out.append(BrokerView(broker_id=b, host=info.host, port=info.port, rack=info.rack,
                              priority=info.priority, fenced=info.fenced, incarnation_id=info.incarnation_id,
                              clean_shutdown=info.clean_shutdown, registered_offset=info.registered_offset,
                              metadata_offset=broker_offsets.get(b),
                              metadata_lag=_lag(image.offset, broker_offsets.get(b)),
                              replicas_opening=(opening or {}).get(b),
                              disk_used_bytes=u.disk_used_bytes if u else None,
                              disk_total_bytes=u.disk_total_bytes if u else None,
                              leaders=leaders.get(b, 0), replicas=replicas.get(b, 0),
                              maintenance=info.maintenance, decommissioning=info.decommissioning,
                              decommissioned=info.decommissioned))
    return BrokerList(metadata_offset=image.offset, brokers=out)
