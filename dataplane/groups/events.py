"""What the coordinator core takes (`Received`, `Tick`, `Written`) and returns (`Step`).

A request's answer may be deferred: a join waits for the rebalance, a sync for the
leader's assignment, and every answer that depends on stored state waits until the
records it wrote are committed (the driver steps `Written` back in). Time enters as
`now_ms` on every input; it never goes back.
"""
from __future__ import annotations

import dataclasses
from typing import TypeVar, dataclass_transform

from pydantic import BaseModel, ConfigDict, Field

_T = TypeVar("_T")

DAY_MS = 24 * 3600 * 1000


@dataclass_transform(frozen_default=True, kw_only_default=True)
def _frozen(cls: type[_T]) -> type[_T]:
    return dataclasses.dataclass(frozen=True, kw_only=True, slots=True)(cls)


class GroupConfig(BaseModel):
    """The coordinator's limits, Kafka's names in ms (group.initial.rebalance.delay.ms,
    group.min/max.session.timeout.ms, offsets.retention.minutes, offset.metadata.max.bytes)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    initial_rebalance_delay_ms: int = Field(default=3000, ge=0, le=300_000)
    session_timeout_ms_min: int = Field(default=6000, ge=1, le=3_600_000)
    session_timeout_ms_max: int = Field(default=1_800_000, ge=1, le=3_600_000)
    offsets_retention_ms: int = Field(default=7 * DAY_MS, ge=1)
    offsets_retention_check_interval_ms: int = Field(default=600_000, ge=1)
    offset_metadata_bytes_max: int = Field(default=4096, ge=0)
    group_members_max: int = Field(default=1000, ge=1)


@_frozen
class Received:
    """A group request (one of common/wire/messages.py's group requests) to answer.
    `fresh_member_id`: the id a member joining without one gets (the driver makes it
    unique); `member_id_required`: KIP-394's first-join round trip (JoinGroup v4 and up);
    `missing_partitions`: partitions an OffsetCommit names that the metadata does not have
    (the driver reads them from its image; the core refuses them)."""

    request_id: int
    request: object
    now_ms: int
    client_host: str = ""
    fresh_member_id: str = ""
    member_id_required: bool = True
    missing_partitions: frozenset[tuple[str, int]] = frozenset()


@_frozen
class Tick:
    now_ms: int


@_frozen
class TopicsDeleted:
    """These topics were deleted (or deleted and created again: a new topic of the same name)."""

    topics: frozenset[str]
    now_ms: int


@_frozen
class Written:
    """The records of `write_id` are committed (`ok`), or will never be (leadership lost,
    a write refused)."""

    write_id: int
    ok: bool
    now_ms: int


@_frozen
class GroupRecord:
    """One record of the offsets topic: value None is a tombstone."""

    key: bytes
    value: bytes | None


@_frozen
class Write:
    """Records to append, in order, with acks=all; step `Written(write_id)` when done."""

    write_id: int
    records: tuple[GroupRecord, ...]


@_frozen
class Answer:
    request_id: int
    response: object


@dataclasses.dataclass(kw_only=True, slots=True)
class Step:
    answers: list[Answer] = dataclasses.field(default_factory=list)
    writes: list[Write] = dataclasses.field(default_factory=list)
