"""Metadata records: the entries of the controller's replicated log.

Each record is a frozen pydantic model with a `type` discriminator and is
stored as a plain JSON dict (`dump_record` / `parse_record`), never pickled.
Records carry everything needed to apply them deterministically: time only
as `at_ms`, and partition changes carry the partition epoch they were
computed against, so a change decided on an older view is rejected, not
misapplied.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, Union, cast

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator

from common.metadata.config import PARTITIONS_MAX, TopicConfig

NO_LEADER = -1  # PartitionChange.leader: the partition has no leader afterwards
NO_CHANGE = -2  # PartitionChange.leader: the leader stays as it is

BrokerId = Annotated[int, Field(ge=0)]
Epoch = Annotated[int, Field(ge=0)]
Replicas = tuple[BrokerId, ...]


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class RegisterBroker(_Record):
    """A broker (re)joins. It is fenced until it heartbeats caught up with metadata."""

    type: Literal["register_broker"] = "register_broker"
    broker_id: BrokerId
    incarnation_id: str = Field(min_length=1, max_length=64)
    host: str = Field(min_length=1, max_length=255)
    port: int = Field(ge=1, le=65535)
    rack: str | None = Field(default=None, max_length=255)
    priority: int = Field(default=0, ge=0, le=1000)
    clean_shutdown: bool = True
    at_ms: int = Field(ge=0)
    kafka_port: int | None = Field(default=None, ge=1, le=65535)  # its Kafka API listener, if any


class FenceBroker(_Record):
    """Fence a broker. With `incarnation_id` set, only that incarnation (a fence decided
    before the broker re-registered is rejected)."""

    type: Literal["fence_broker"] = "fence_broker"
    broker_id: BrokerId
    at_ms: int = Field(ge=0)
    reason: str = ""
    incarnation_id: str | None = None


class UnfenceBroker(_Record):
    """Unfence a broker. With `fenced_offset` set, only if it is still fenced by the record
    at that offset (an unfence decided before a newer fence is rejected)."""

    type: Literal["unfence_broker"] = "unfence_broker"
    broker_id: BrokerId
    at_ms: int = Field(ge=0)
    reason: str = ""
    fenced_offset: int | None = None


class UnregisterBroker(_Record):
    type: Literal["unregister_broker"] = "unregister_broker"
    broker_id: BrokerId
    at_ms: int = Field(ge=0)
    reason: str = ""


class AlterBrokerState(_Record):
    """An operator's mark on a broker, kept across its re-registrations. Unset fields stay.

    `maintenance`: the broker is not elected leader while another eligible replica exists
    (its leaderships are drained to them); it stays in every ISR.
    `decommissioning`: its replicas are being moved to other brokers; no new replica is
    placed on it. `decommissioned`: every replica has left it and it is fenced for good
    (only once it hosts none); a recommission clears both."""

    type: Literal["alter_broker_state"] = "alter_broker_state"
    broker_id: BrokerId
    maintenance: bool | None = None
    decommissioning: bool | None = None
    decommissioned: bool | None = None
    reason: str = ""


class CreateTopic(_Record):
    """Creates the topic; its partitions follow as PartitionRecords in the same batch."""

    type: Literal["create_topic"] = "create_topic"
    name: str = Field(min_length=1, max_length=249)
    topic_id: str = Field(min_length=1, max_length=64)
    config: TopicConfig
    at_ms: int = Field(default=0, ge=0)


class AddPartitions(_Record):
    """Grows a topic to `partitions` partitions (never fewer); the new ones follow as
    PartitionRecords in the same batch, numbered on from the topic's last."""

    type: Literal["add_partitions"] = "add_partitions"
    topic: str
    topic_id: str = Field(min_length=1, max_length=64)
    partitions: int = Field(ge=2, le=PARTITIONS_MAX)


class PartitionRecord(_Record):
    """The full state of a new partition."""

    type: Literal["partition"] = "partition"
    topic: str
    partition: int = Field(ge=0)
    replicas: Replicas = Field(min_length=1)
    isr: Replicas = Field(min_length=1)
    leader: BrokerId | None
    leader_epoch: Epoch = 0
    partition_epoch: Epoch = 0


class PartitionChange(_Record):
    """A change to one partition. Unset fields stay as they are.

    Applying bumps `partition_epoch`; when the leader changes (to a broker or
    to none) it also bumps `leader_epoch`. `fenced_for_election` is step one of
    a quorum election: leader none, leader epoch + 1, until a leader is chosen.
    `expected_partition_epoch`, when set, must equal the current partition
    epoch, else the change is rejected (it was decided on a stale view).
    """

    type: Literal["partition_change"] = "partition_change"
    topic: str
    partition: int = Field(ge=0)
    expected_partition_epoch: Epoch | None = None
    leader: int = Field(default=NO_CHANGE, ge=NO_CHANGE)
    isr: Replicas | None = None
    replicas: Replicas | None = None
    adding: Replicas | None = None
    removing: Replicas | None = None
    fenced_for_election: bool = False
    reason: str = ""

    @model_validator(mode="after")
    def _check(self) -> "PartitionChange":
        if self.fenced_for_election and self.leader not in (NO_CHANGE, NO_LEADER):
            raise ValueError("fenced_for_election leaves the partition without a leader; "
                             f"leader must be {NO_LEADER} or {NO_CHANGE}, not {self.leader}")
        return self


class DeleteTopic(_Record):
    type: Literal["delete_topic"] = "delete_topic"
    name: str
    topic_id: str


class ConfigChange(_Record):
    """Set (or with value None, reset to default) one key of a topic's config."""

    type: Literal["config_change"] = "config_change"
    topic: str
    key: str
    value: str | int | bool | None = None


class AlterTopicConfig(_Record):
    """Several config keys changed at once, checked as a whole (a None value resets).

    One ConfigChange per key would not do: the keys relate (commit_policy and
    quorum_required_acks), so a valid change can pass through an invalid middle.
    """

    type: Literal["alter_topic_config"] = "alter_topic_config"
    topic: str
    changes: dict[str, str | int | bool | None] = Field(min_length=1)


class AlterClusterConfig(_Record):
    """Set (or with value None, unset) dynamic cluster config keys, checked as a whole
    (common/metadata/cluster_config.py)."""

    type: Literal["alter_cluster_config"] = "alter_cluster_config"
    changes: dict[str, str | int | bool | None] = Field(min_length=1)


class ProducerIdBlock(_Record):
    """Producer ids [first_id, first_id + size) now belong to `broker_id`."""

    type: Literal["producer_id_block"] = "producer_id_block"
    broker_id: BrokerId
    first_id: int = Field(ge=0)
    size: int = Field(ge=1, le=1_000_000)


class NoOp(_Record):
    """Changes nothing but the offset; a new controller leader may append one
    (a leader-change marker) to learn that its view is committed."""

    type: Literal["noop"] = "noop"
    controller_id: int | None = None
    at_ms: int = Field(default=0, ge=0)
    reason: str = ""


Record = Annotated[
    Union[RegisterBroker, FenceBroker, UnfenceBroker, UnregisterBroker, AlterBrokerState, CreateTopic,
          AddPartitions, PartitionRecord, PartitionChange, DeleteTopic, ConfigChange, AlterTopicConfig,
          AlterClusterConfig, ProducerIdBlock, NoOp],
    Field(discriminator="type"),
]

RECORD_TYPES: tuple[type[BaseModel], ...] = (
    RegisterBroker, FenceBroker, UnfenceBroker, UnregisterBroker, AlterBrokerState, CreateTopic,
    AddPartitions, PartitionRecord, PartitionChange, DeleteTopic, ConfigChange, AlterTopicConfig,
    AlterClusterConfig, ProducerIdBlock, NoOp)

# cast: mypy with pydantic 2.14 takes an Annotated union for a special form, not a type.
_adapter: TypeAdapter[Any] = TypeAdapter(cast(Any, Record))


def parse_record(d: dict[str, Any]) -> Record:
    """Build a record from its JSON dict; raises pydantic.ValidationError when malformed."""
    return _adapter.validate_python(d)


def dump_record(record: Record) -> dict[str, Any]:
    """The record as a dict of plain JSON types (str, int, bool, None, list, dict)."""
    return record.model_dump(mode="json")
