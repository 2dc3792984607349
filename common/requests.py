"""Request models shared by the admin API, the CLI, brokers and the controller's decisions,
and the control RPC's answers, shared by the controller (`controller/rpc.py`) and the
broker's client (`common/control_client.py`).

Every request model is frozen and forbids unknown fields, so a typo in a request is an
error that names the field rather than a silently ignored value. Answers ignore fields
they do not know, so a broker keeps reading a newer controller's answers.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, field_validator, model_validator

from common.api_models import PartitionView
from common.errors import InvalidFieldError
from common.metadata.config import TOPIC_NAME_PATTERN
from common.usage import BrokerUsage

if TYPE_CHECKING:
    from common.metadata.image import PartitionInfo

BrokerId = Annotated[int, Field(ge=0)]
ConfigValue = str | int | bool | float  # float: min_cleanable_dirty_ratio


class _Request(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def _distinct(values: tuple[int, ...], what: str) -> tuple[int, ...]:
    if len(set(values)) != len(values):
        raise ValueError(f"{what} {list(values)} has duplicate broker ids")
    return values


def _check_replica_lists(v: tuple[tuple[int, ...], ...] | None) -> tuple[tuple[int, ...], ...] | None:
    if v is None:
        return v
    if not v:
        raise ValueError("replica_assignment must list at least one partition")
    for i, replicas in enumerate(v):
        if not replicas:
            raise ValueError(f"replica_assignment[{i}] is empty")
        _distinct(replicas, f"replica_assignment[{i}]")
    return v


# ---- admin ------------------------------------------------------------------

class CreateTopicRequest(_Request):
    # The pattern is the schema's; validate_topic_name checks it with a message that says what to do.
    name: str = Field(min_length=1, max_length=249, json_schema_extra={"pattern": TOPIC_NAME_PATTERN})
    # Strict: JSON's true or "3" is a mistake to name, not a count to guess.
    partitions: StrictInt = Field(default=1, ge=1, le=10_000)
    replication_factor: StrictInt = Field(default=1, ge=1, le=100)
    config: dict[str, ConfigValue] = Field(default_factory=dict)
    # One replica list per partition; when given, partitions/replication_factor
    # must agree with it. Overrides placement.
    replica_assignment: tuple[tuple[BrokerId, ...], ...] | None = None

    @field_validator("replica_assignment")
    @classmethod
    def _check_assignment(cls, v: tuple[tuple[int, ...], ...] | None):
        return _check_replica_lists(v)


class AddPartitionsRequest(_Request):
    """Grow a topic to `partitions` partitions in all (Kafka's CreatePartitions `count`)."""

    partitions: StrictInt = Field(ge=1)  # its upper bound is the decision's, with a message saying what to do
    # One replica list per new partition; when absent, placement chooses.
    replica_assignment: tuple[tuple[BrokerId, ...], ...] | None = None

    @field_validator("replica_assignment")
    @classmethod
    def _check_assignment(cls, v: tuple[tuple[int, ...], ...] | None):
        return _check_replica_lists(v)


class AlterConfigRequest(_Request):
    set: dict[str, ConfigValue] = Field(default_factory=dict)
    reset: list[str] = Field(default_factory=list)


def _some_change(schema: dict[str, Any]) -> None:
    schema["anyOf"] = [{"required": ["set"], "properties": {"set": {"minProperties": 1}}},
                       {"required": ["reset"], "properties": {"reset": {"minItems": 1}}}]


class TopicConfigPatch(AlterConfigRequest):
    """The admin API's config change: it must name at least one key. (A Kafka client's
    AlterConfigs may name none, and then changes nothing, as in Kafka.)"""

    model_config = ConfigDict(json_schema_extra=_some_change)

    @model_validator(mode="after")
    def _names_a_key(self) -> "TopicConfigPatch":
        if not self.set and not self.reset:
            raise InvalidFieldError(
                "the change names no config key: give 'set' (keys to new values, e.g. "
                "{\"set\": {\"retention_ms\": 86400000}}) or 'reset' (keys back to their defaults, "
                "e.g. {\"reset\": [\"retention_ms\"]}), at least one key", field="set", value=self.set)
        return self


class DeleteTopicRequest(_Request):
    name: str = Field(min_length=1, max_length=249)


class TopicConfigChange(_Request):
    """An AlterConfigRequest for a named topic (a broker forwarding a Kafka client's call)."""

    name: str = Field(min_length=1, max_length=249)
    change: AlterConfigRequest


class TopicPartitionsChange(_Request):
    """An AddPartitionsRequest for a named topic (a broker forwarding a Kafka client's call)."""

    name: str = Field(min_length=1, max_length=249)
    change: AddPartitionsRequest


class ReassignmentRequest(_Request):
    topic: str = Field(min_length=1)
    partition: int = Field(ge=0)
    target_replicas: tuple[BrokerId, ...] = Field(min_length=1)

    @field_validator("target_replicas")
    @classmethod
    def _check_targets(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        return _distinct(v, "target_replicas")


class TopicPartitionRef(_Request):
    topic: str = Field(min_length=1)
    partition: int = Field(ge=0)


class PreferredElectionRequest(_Request):
    partitions: list[TopicPartitionRef] | None = None  # None: every partition


# ---- control (broker -> controller) -------------------------------------------

class RegisterBrokerRequest(_Request):
    broker_id: BrokerId
    incarnation_id: str = Field(min_length=1, max_length=64)
    host: str = Field(min_length=1, max_length=255)
    port: int = Field(ge=1, le=65535)
    rack: str | None = Field(default=None, max_length=255)
    priority: int = Field(default=0, ge=0, le=1000)
    clean_shutdown: bool = True
    kafka_port: int | None = Field(default=None, ge=1, le=65535)


class UnreachablePeer(_Request):
    """For `topic`-`partition` at `leader_epoch`, this broker has not heard from `peer` (its
    leader; or, as the leader, that follower) for the broker's peer_unreachable_ms."""

    topic: str = Field(min_length=1)
    partition: int = Field(ge=0)
    leader_epoch: int = Field(ge=0)
    peer: BrokerId


UNREACHABLE_PEERS_MAX = 100_000


class OfflineReplica(_Request):
    """This broker's replica of `topic`-`partition` lost a write to its disk (a full disk) while
    the metadata stood at `leader_epoch`: its log may lack batches its core had taken, so it
    must leave leadership and the ISR (Kafka's offline log directory). `online`: it has been
    opened again from disk since (dataplane/broker/offline.py) and could lead a new epoch."""

    topic: str = Field(min_length=1)
    partition: int = Field(ge=0)
    leader_epoch: int = Field(ge=0)
    online: bool = False

    def stands(self, p: PartitionInfo, broker_id: int) -> bool:
        """Whether `p` (as an image shows it) still holds the replica in leadership or the ISR at
        the epoch of this report: the controller acts on it only then."""
        return p.leader_epoch == self.leader_epoch and (p.leader == broker_id or broker_id in p.isr)

    def follow(self, p: PartitionInfo | None, broker_id: int) -> OfflineReplica | None:
        """What the broker reports next, given its newest image of the partition: nothing once
        the replica is out of leadership and the ISR, or leads the new epoch the controller gave
        it as the only in-sync replica back online; else this report, at the image's epoch. An
        epoch changed for another reason (a fence, an election, a report of another broker
        handled first) does not end it: the replica may still lack what it lost."""
        if p is None or (p.leader != broker_id and broker_id not in p.isr):
            return None
        if p.leader_epoch == self.leader_epoch:
            return self
        if self.online and p.leader == broker_id and p.isr == (broker_id,):
            return None
        return self.model_copy(update={"leader_epoch": p.leader_epoch})


OFFLINE_REPLICAS_MAX = 100_000


class HeartbeatRequest(_Request):
    broker_id: BrokerId
    incarnation_id: str = Field(min_length=1, max_length=64)
    metadata_offset: int = Field(ge=-1)
    usage: BrokerUsage | None = None
    # Controlled shutdown: move this broker's leaderships away and take it out of every
    # ISR now, rather than a session timeout after it stops; it stays fenced until it
    # registers again.
    want_shutdown: bool = False
    # Replication links this broker has not used for a bound, all of them in every heartbeat
    # (empty: every link works): what the controller cannot see from heartbeats
    # (controller/decisions/reachability.py).
    unreachable: tuple[UnreachablePeer, ...] = Field(default=(), max_length=UNREACHABLE_PEERS_MAX)
    # Replicas this broker hosts that are still opening (they answer LEADER_NOT_AVAILABLE until
    # open): after a restart with many partitions, what it cannot serve yet.
    replicas_opening: int = Field(default=0, ge=0)
    # Replicas whose log write failed, in every heartbeat until the metadata shows them out of
    # leadership and the ISR (controller/decisions/offline.py).
    offline: tuple[OfflineReplica, ...] = Field(default=(), max_length=OFFLINE_REPLICAS_MAX)
    # Sent to every controller but the leader (dataplane/broker/lifecycle.py, FollowerBeats): a
    # follower keeps it for when it leads; a leader it reaches anyway refreshes the session with
    # it and nothing else, since it may arrive after a newer heartbeat.
    liveness_only: bool = False


class AlterIsrRequest(_Request):
    broker_id: BrokerId
    topic: str = Field(min_length=1)
    partition: int = Field(ge=0)
    leader_epoch: int = Field(ge=0)
    partition_epoch: int = Field(ge=0)
    new_isr: tuple[BrokerId, ...] = Field(min_length=1)

    @field_validator("new_isr")
    @classmethod
    def _check_isr(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        return _distinct(v, "new_isr")


class ElectionReport(_Request):
    """A replica's answer to a quorum election: the (last batch epoch, end offset)
    of its FLUSHED log, after it stopped accepting epochs below `fenced_epoch`."""

    broker_id: BrokerId
    topic: str = Field(min_length=1)
    partition: int = Field(ge=0)
    fenced_epoch: int = Field(ge=0)
    last_epoch: int = Field(ge=-1)  # -1: empty log
    end_offset: int = Field(ge=0)
    # durability=write only: the replica restarted after a crash and has not caught up with a
    # leader since, so a committed record it counted may be gone from it. Such a report is
    # not one of the n - q + 1 an election needs; it counts only when every replica reported.
    unclean: bool = False


class AllocateProducerIdsRequest(_Request):
    broker_id: BrokerId
    count: int = Field(default=1000, ge=1, le=1_000_000)


# ---- control answers (controller -> broker) -------------------------------------
#
# The controller sends only the fields it set (`model_dump_json(exclude_unset=True)`),
# so a refused election report carries a `reason` and an accepted one does not, and a
# metadata answer carries either `records` or `image`.

class _Answer(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class RegisterBrokerAnswer(_Answer):
    broker_id: int
    metadata_offset: int           # the registration's offset (or the committed one for a retry)
    session_timeout_ms: int


class HeartbeatAnswer(_Answer):
    broker_id: int
    fenced: bool
    metadata_offset: int           # committed offset when answered: a controlled shutdown waits to apply it
    session_timeout_ms: int
    # The heartbeat's usage report built on one this controller does not have (it is newly
    # leader, or missed a report): send the next one complete (common/usage.py).
    usage_resend: bool = False


class AlterIsrAnswer(_Answer):
    partition: PartitionView       # the partition as the leader now sees it
    metadata_offset: int | None    # None: the ISR already was that, nothing was written


class ElectionReportAnswer(_Answer):
    accepted: bool
    elected: bool = False
    reason: str | None = None      # why a report was not kept
    metadata_offset: int | None = None


class ProducerIdsAnswer(_Answer):
    broker_id: int
    first_id: int
    size: int
    metadata_offset: int | None = None


class AdminAnswer(_Answer):
    """A forwarded admin write's answer: it committed at this metadata offset (None: it changed nothing)."""

    metadata_offset: int | None = None


class MetadataEntry(_Answer):
    offset: int
    record: dict[str, Any]         # a record as `common.metadata.dump_record` writes it


class MetadataAnswer(_Answer):
    """Committed records after the asked offset, or (too far behind) the whole image."""

    offset: int                    # the committed offset this answer reflects
    records: list[MetadataEntry] | None = None
    image: dict[str, Any] | None = None   # MetadataImage.to_dict()


class MaintenanceRequest(_Request):
    """Turn a broker's maintenance mode on or off."""

    enabled: StrictBool   # JSON true or false: "yes", "false" or 1 is a mistake to name, not to guess


class ClusterConfigRequest(_Request):
    """Set dynamic cluster config keys and unset others (common/metadata/cluster_config.py)."""

    set: dict[str, ConfigValue] = Field(default_factory=dict, max_length=64)
    reset: list[str] = Field(default_factory=list, max_length=64)


class PlannedMove(_Request):
    """One partition of a reassignment plan: its target replicas, preferred leader first."""

    topic: str = Field(min_length=1, max_length=249)
    partition: int = Field(ge=0)
    replicas: tuple[BrokerId, ...] = Field(min_length=1, max_length=100)

    @field_validator("replicas")
    @classmethod
    def _check_replicas(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        return _distinct(v, "replicas")


REASSIGNMENT_PLAN_PARTITIONS_MAX = 10_000


class ReassignmentPlanRequest(_Request):
    """Many partitions moved at once (Kafka's reassignment JSON: version 1, partitions with
    topic, partition and replicas), with an optional replication throttle for the catch-up."""

    version: int = Field(default=1, ge=1, le=1)
    partitions: list[PlannedMove] = Field(min_length=1, max_length=REASSIGNMENT_PLAN_PARTITIONS_MAX)
    throttle_bytes_per_s: int | None = Field(default=None, ge=1024, le=2**40)


class CancelReassignmentsRequest(_Request):
    """Partitions whose reassignment goes back to its original replicas; None: every one."""

    partitions: list[TopicPartitionRef] | None = Field(default=None, max_length=REASSIGNMENT_PLAN_PARTITIONS_MAX)
