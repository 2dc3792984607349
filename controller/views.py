"""What the admin API returns, built from the image (the models are common/api_models.py,
shared with the admin client)."""
from __future__ import annotations

from typing import Any, Mapping

from common.api_models import BrokerList, BrokerView, PartitionView, TopicDetail, TopicList, TopicSummary
from common.metadata import MetadataImage
from common.usage import BrokerUsage


def partition_view(p: Any) -> PartitionView:
    return PartitionView(topic=p.topic, partition=p.partition, replicas=list(p.replicas), isr=list(p.isr),
                         leader=p.leader, leader_epoch=p.leader_epoch, partition_epoch=p.partition_epoch,
                         adding=list(p.adding), removing=list(p.removing),
                         fenced_for_election=p.fenced_for_election)


def topic_detail(image: MetadataImage, name: str, *, metadata_offset: int | None) -> TopicDetail:
    t = image.topics[name]
    return TopicDetail(name=t.name, topic_id=t.topic_id, metadata_offset=metadata_offset,
                       config=t.config.model_dump(mode="json"),
                       partitions=[partition_view(p) for p in image.topic_partitions(name)])


def topic_list(image: MetadataImage) -> TopicList:
    return TopicList(metadata_offset=image.offset, topics=[
        TopicSummary(name=t.name, topic_id=t.topic_id, partitions=t.config.partitions,
                     replication_factor=t.config.replication_factor,
                     commit_policy=t.config.commit_policy, replication_mode=t.config.replication_mode)
        for t in (image.topics[n] for n in sorted(image.topics))])


def broker_list(image: MetadataImage, broker_offsets: Mapping[int, int],
                usage: Mapping[int, BrokerUsage]) -> BrokerList:
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
                              disk_used_bytes=u.disk_used_bytes if u else None,
                              disk_total_bytes=u.disk_total_bytes if u else None,
                              leaders=leaders.get(b, 0), replicas=replicas.get(b, 0)))
    return BrokerList(metadata_offset=image.offset, brokers=out)
