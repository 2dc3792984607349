"""What the admin API returns: pydantic models (also the OpenAPI schemas) built from the image."""
from __future__ import annotations

import bisect
from typing import Any, Mapping

from pydantic import BaseModel, ConfigDict

from common.metadata import MetadataImage
from common.usage import BrokerUsage


class _View(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ErrorDetail(_View):
    code: str
    message: str
    retriable: bool = False
    field: str | None = None


class ErrorBody(_View):
    error: ErrorDetail


class Health(_View):
    status: str
    node_id: int
    role: str
    metadata_offset: int


class ControllerInfo(_View):
    node_id: int
    raft_address: str
    api_url: str
    priority: int
    is_leader: bool
    connected: bool


class Cluster(_View):
    node_id: int
    leader_id: int | None
    leader_api_url: str | None
    term: int | None
    metadata_offset: int
    controllers: list[ControllerInfo]


class BrokerView(_View):
    broker_id: int
    host: str
    port: int
    rack: str | None
    priority: int
    fenced: bool
    incarnation_id: str
    clean_shutdown: bool
    registered_offset: int
    metadata_offset: int | None = None     # last applied offset the broker reported
    disk_used_bytes: int | None = None
    disk_total_bytes: int | None = None
    leaders: int = 0
    replicas: int = 0


class BrokerList(_View):
    metadata_offset: int
    brokers: list[BrokerView]


class PartitionView(_View):
    topic: str
    partition: int
    replicas: list[int]
    isr: list[int]
    leader: int | None
    leader_epoch: int
    partition_epoch: int
    adding: list[int] = []
    removing: list[int] = []
    fenced_for_election: bool = False


class TopicSummary(_View):
    name: str
    topic_id: str
    partitions: int
    replication_factor: int
    commit_policy: str
    replication_mode: str


class TopicList(_View):
    metadata_offset: int
    topics: list[TopicSummary]


class TopicDetail(_View):
    name: str
    topic_id: str
    metadata_offset: int | None
    config: dict[str, Any]
    partitions: list[PartitionView]


class PartitionList(_View):
    topic: str
    metadata_offset: int | None
    partitions: list[PartitionView]


class ReassignmentList(_View):
    metadata_offset: int
    reassignments: list[PartitionView]


class ElectionResult(_View):
    metadata_offset: int | None
    elected: list[PartitionView]


class Done(_View):
    result: str
    metadata_offset: int | None


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


class LatencyStats:
    """Request counts and a latency histogram per path, for /metrics."""

    BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0)

    def __init__(self) -> None:
        self.paths: dict[str, list] = {}   # path -> [count, sum, bucket counts]

    def observe(self, path: str, seconds: float) -> None:
        key = path   # a route's pattern, so the label set stays bounded
        if key not in self.paths and len(self.paths) >= 64:
            key = "other"
        entry = self.paths.setdefault(key, [0, 0.0, [0] * len(self.BUCKETS_S)])
        entry[0] += 1
        entry[1] += seconds
        i = bisect.bisect_left(self.BUCKETS_S, seconds)
        if i < len(self.BUCKETS_S):
            entry[2][i] += 1


def prometheus_text(service: Any) -> str:
    image = service.committed
    lines = []

    def metric(name: str, kind: str, help_text: str, samples: list[tuple[str, Any]]) -> None:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            lines.append(f"{name}{labels} {value}")

    metric("biplane_controller_is_leader", "gauge", "1 when this controller is the trusted leader",
           [("", int(service.is_leader))])
    metric("biplane_controller_metadata_offset", "gauge", "offset of the committed metadata image",
           [("", image.offset)])
    brokers = list(image.brokers.values())
    metric("biplane_controller_brokers", "gauge", "registered brokers by state",
           [('{state="fenced"}', sum(b.fenced for b in brokers)),
            ('{state="unfenced"}', sum(not b.fenced for b in brokers))])
    metric("biplane_controller_topics", "gauge", "topics", [("", len(image.topics))])
    parts = list(image.partitions())
    metric("biplane_controller_partitions", "gauge", "partitions", [("", len(parts))])
    metric("biplane_controller_offline_partitions", "gauge", "partitions without a leader",
           [("", sum(p.leader is None for p in parts))])
    for key, help_text in (("records_committed", "metadata records committed (observed on this node)"),
                           ("batches_committed", "Raft commands committed by this node as leader"),
                           ("batches_failed", "Raft commands that failed or diverged"),
                           ("leader_elections_won", "times this node became the trusted leader")):
        metric(f"biplane_controller_{key}_total", "counter", help_text, [("", service.stats[key])])
    stats = getattr(service, "api_stats", None)
    if stats is not None:
        lines.append("# HELP biplane_api_request_seconds admin API request latency")
        lines.append("# TYPE biplane_api_request_seconds histogram")
        for path, (count, total, buckets) in sorted(stats.paths.items()):
            cumulative = 0
            for bound, n in zip(LatencyStats.BUCKETS_S, buckets):
                cumulative += n
                lines.append(f'biplane_api_request_seconds_bucket{{path="{path}",le="{bound}"}} {cumulative}')
            lines.append(f'biplane_api_request_seconds_bucket{{path="{path}",le="+Inf"}} {count}')
            lines.append(f'biplane_api_request_seconds_sum{{path="{path}"}} {total:.6f}')
            lines.append(f'biplane_api_request_seconds_count{{path="{path}"}} {count}')
    return "\n".join(lines) + "\n"
