"""What AdminClient returns: the admin API's JSON answers as frozen pydantic models.

The client keeps its own copy of these shapes instead of importing the controller's, so the
SDK installs and imports without the controller package; the HTTP JSON is the contract
between the two (tests/test_client_admin_models.py holds them to the same schema). Fields
the client does not know are ignored rather than refused, so an older client keeps reading
a newer controller's answers.
"""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class _Answer(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class Health(_Answer):
    status: str
    node_id: int
    role: str
    metadata_offset: int


class ControllerInfo(_Answer):
    node_id: int
    raft_address: str
    api_url: str
    priority: int
    is_leader: bool
    connected: bool


class Cluster(_Answer):
    node_id: int
    leader_id: int | None
    leader_api_url: str | None
    term: int | None
    metadata_offset: int
    controllers: list[ControllerInfo]


class BrokerView(_Answer):
    broker_id: int
    host: str
    port: int
    rack: str | None
    priority: int
    fenced: bool
    incarnation_id: str
    clean_shutdown: bool
    registered_offset: int
    metadata_offset: int | None = None     # the last applied offset the broker reported
    disk_used_bytes: int | None = None
    disk_total_bytes: int | None = None
    leaders: int = 0
    replicas: int = 0


class BrokerList(_Answer):
    metadata_offset: int
    brokers: list[BrokerView]


class PartitionView(_Answer):
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


class TopicSummary(_Answer):
    name: str
    topic_id: str
    partitions: int
    replication_factor: int
    commit_policy: str
    replication_mode: str


class TopicList(_Answer):
    metadata_offset: int
    topics: list[TopicSummary]


class TopicDetail(_Answer):
    name: str
    topic_id: str
    metadata_offset: int | None
    config: dict[str, Any]
    partitions: list[PartitionView]


class PartitionList(_Answer):
    topic: str
    metadata_offset: int | None
    partitions: list[PartitionView]


class ReassignmentList(_Answer):
    metadata_offset: int
    reassignments: list[PartitionView]


class ElectionResult(_Answer):
    metadata_offset: int | None
    elected: list[PartitionView]


class Done(_Answer):
    result: str
    metadata_offset: int | None


class SnapshotInfo(_Answer):
    name: str
    time: str
    time_ms: int
    metadata_offset: int
    size_bytes: int


class SnapshotList(_Answer):
    snapshots: list[SnapshotInfo]


__all__ = ["BrokerList", "BrokerView", "Cluster", "ControllerInfo", "Done", "ElectionResult", "Health",
           "PartitionList", "PartitionView", "ReassignmentList", "SnapshotInfo", "SnapshotList", "TopicDetail",
           "TopicList", "TopicSummary"]
