"""What the controller's admin API answers: its JSON as frozen pydantic models.

One definition for both ends: the controller builds them from its metadata image
(controller/views.py) and serves their schemas in its OpenAPI document; the admin client
(dataplane/client/admin.py) parses its answers into them. Pure pydantic, so the SDK
imports this without the controller package.

Reading ignores fields it does not know, so an older client keeps reading a newer
controller's answers. The schemas still say `additionalProperties: false`: an answer of
this version carries no other field.
"""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


def _closed(schema: dict[str, Any]) -> None:
    # First, where pydantic puts it for extra="forbid", so the OpenAPI document reads as before.
    fields = dict(schema)
    schema.clear()
    schema["additionalProperties"] = False
    schema.update(fields)


class _Answer(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore", json_schema_extra=_closed)


class ErrorDetail(_Answer):
    code: str
    message: str
    retriable: bool = False
    field: str | None = None


class ErrorBody(_Answer):
    error: ErrorDetail


class LeaderRef(_Answer):
    node_id: int
    api_url: str


class Redirect(_Answer):
    """A follower's 307 for a write: the error, and the leader the Location header points at."""

    error: ErrorDetail
    leader: LeaderRef


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
    metadata_lag: int | None = None        # records committed here that the broker had not reported applied
    replicas_opening: int | None = None    # replicas it hosts that are still opening (not yet serving)
    disk_used_bytes: int | None = None
    disk_total_bytes: int | None = None
    leaders: int = 0
    replicas: int = 0
    maintenance: bool = False          # `biplane broker maintenance`: not elected leader while others can be
    decommissioning: bool = False      # `biplane broker decommission`: its replicas are moving off
    decommissioned: bool = False       # every replica moved off; fenced for good


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


class HealthProblem(_Answer):
    """One thing an operator must look at. `check` names the rule (leaderless, under_min_isr,
    under_replicated, fenced_broker, controller_no_leader, controller_quorum_lost,
    controller_disconnected)."""

    check: str
    severity: str                  # critical | degraded
    message: str
    topic: str | None = None
    partition: int | None = None
    broker_id: int | None = None
    node_id: int | None = None


class ClusterHealth(_Answer):
    status: str                    # healthy | degraded | critical
    healthy: bool
    node_id: int                   # the controller that judged it
    controller_leader: int | None
    metadata_offset: int
    leaderless_partitions: int
    under_min_isr_partitions: int
    under_replicated_partitions: int
    fenced_brokers: int
    controllers_disconnected: int
    problems: list[HealthProblem]
    problems_omitted: int = 0      # beyond the listed ones (the counts include them)


class PartitionOffsets(_Answer):
    """A partition's offsets and size as its leader last reported them in a heartbeat (brokers
    report usage about once a second); None where no report of the current leader has them."""

    topic: str
    partition: int
    leader: int | None
    log_start_offset: int | None = None
    high_watermark: int | None = None
    log_end_offset: int | None = None
    size_bytes: int | None = None          # the leader's copy
    replicas_size_bytes: int | None = None  # every replica that reported it, summed
    reported_at_ms: int | None = None      # the leader's clock when it measured them
    age_ms: int | None = None              # how long before this answer


class TopicOffsets(_Answer):
    topic: str
    metadata_offset: int
    at_ms: int                             # the controller's clock when it answered
    partitions: list[PartitionOffsets]


class GroupPartitionLag(_Answer):
    """One partition a group committed an offset for, against the partition leader's high
    watermark as the leader last reported it; None where no report of the current leader has it."""

    topic: str
    partition: int
    committed_offset: int
    leader: int | None = None
    high_watermark: int | None = None
    lag_records: int | None = None          # high_watermark - committed_offset, never negative
    high_watermark_age_ms: int | None = None


class GroupLag(_Answer):
    """A group as its coordinator last reported it (brokers report about once a second)."""

    group: str
    coordinator: int                        # the broker whose report this is
    state: str                              # Empty, PreparingRebalance, CompletingRebalance, Stable
    members: int
    reported_at_ms: int                     # the coordinator's clock when it reported
    age_ms: int                             # how long before this answer
    partitions: list[GroupPartitionLag]


class GroupList(_Answer):
    metadata_offset: int
    at_ms: int                              # the controller's clock when it answered
    groups: list[GroupLag]
    # Left out of the coordinators' reports by their bound (common/usage.py): the
    # coordinators' own /metrics still show them.
    groups_omitted: int = 0
    offsets_omitted: int = 0


class BrokerOperations(_Answer):
    """A broker's maintenance and decommission state, and what is left of each."""

    broker_id: int
    metadata_offset: int                   # the controller image this reflects
    broker_metadata_offset: int | None     # the last metadata offset the broker said it applied
    fenced: bool
    maintenance: bool
    decommissioning: bool
    decommissioned: bool
    leaders: int                           # partitions it leads
    leaders_movable: int                   # of those, ones another in-sync replica can take
    replicas: int                          # partitions listing it as a replica
    replicas_moving: int                   # of those, ones being moved off it now
    stuck: list[str] = []                  # what cannot move, and why
    message: str                           # the state in one sentence


class ReplicaCatchUp(_Answer):
    """A replica a reassignment is adding: how far it is, as its broker last reported."""

    broker_id: int
    in_isr: bool
    log_end_offset: int | None = None
    size_bytes: int | None = None
    offsets_behind: int | None = None      # the leader's log end offset minus its own
    bytes_behind: int | None = None        # the leader's size minus its own (0 at least)


class PartitionMove(_Answer):
    topic: str
    partition: int
    replicas: list[int]
    target_replicas: list[int]
    adding: list[int]
    removing: list[int]
    leader: int | None
    leader_log_end_offset: int | None = None
    leader_size_bytes: int | None = None
    moving: list[ReplicaCatchUp]


class ReassignmentProgress(_Answer):
    metadata_offset: int
    at_ms: int
    throttle_bytes_per_s: int | None       # the cluster's reassignment throttle (None: unthrottled)
    partitions: list[PartitionMove]


class ClusterConfigView(_Answer):
    metadata_offset: int | None
    config: dict[str, Any]                 # every key; None: not set (brokers use their own flags)
    descriptions: dict[str, str]
