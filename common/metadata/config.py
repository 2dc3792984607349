"""Topic configuration: the model, its defaults, and checked changes to it.

Defaults follow Kafka where Kafka has the setting. Keys are snake_case;
Kafka's dotted spelling (`min.insync.replicas`) is accepted and normalised.

`segment_bytes` may be as small as 1 KiB (Kafka's minimum is 14 bytes of header
plus a batch) so tests can roll segments without writing megabytes.
"""
from __future__ import annotations

import re
from typing import Any, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from common.batch import INT64_MAX  # Kafka's config values are Java longs: a larger one cannot be stored or sent
from common.errors import (
    InvalidConfigError,
    InvalidFieldError,
    InvalidPartitionsError,
    InvalidReplicationFactorError,
    InvalidTopicError,
)
from common.validation_text import plain_message

TOPIC_NAME_LENGTH_MAX = 249
PARTITIONS_MAX = 10_000
REPLICATION_FACTOR_MAX = 100
SEGMENT_BYTES_MIN = 1024
DAY_MS = 24 * 3600 * 1000

_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]+")   # fullmatch: "$" would let a trailing newline through
# The same rule for JSON Schema (the admin API's OpenAPI document); "." and ".." are refused apart.
TOPIC_NAME_PATTERN = f"^[A-Za-z0-9._-]{{1,{TOPIC_NAME_LENGTH_MAX}}}$"

# Keys not altered as config: changing them needs partitions or replicas to move,
# which is what add-partitions and reassignment are for.
IMMUTABLE_KEYS = frozenset({"partitions", "replication_factor"})

# How a partition replicates and commits, fixed when its topic is created. An ISR and a quorum
# differ in which replicas must hold a committed record, so switching a live partition could
# elect a replica that lacks acknowledged records (an isr topic's record committed on its ISR
# of one, then a quorum election among the others); a larger quorum likewise no longer meets
# every quorum that committed earlier records.
PROTOCOL_KEYS = ("replication_mode", "commit_policy", "quorum_required_acks")

# A topic's flush_debounce_ms when it sets none, by durability (TopicConfig.effective_flush_debounce_ms).
FLUSH_DEBOUNCE_MS_FSYNC = 5
FLUSH_DEBOUNCE_MS_WRITE = 100


class TopicConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    partitions: int = Field(default=1, ge=1, le=PARTITIONS_MAX)
    replication_factor: int = Field(default=1, ge=1, le=REPLICATION_FACTOR_MAX)
    replication_mode: Literal["pull", "push"] = "pull"
    commit_policy: Literal["isr", "quorum"] = "isr"
    # None means "a majority of replication_factor"; resolved on construction.
    quorum_required_acks: int | None = Field(default=None, ge=1, le=REPLICATION_FACTOR_MAX)
    min_insync_replicas: int = Field(default=1, ge=1, le=REPLICATION_FACTOR_MAX)
    durability: Literal["fsync", "write"] = "fsync"
    unclean_leader_election: bool = False
    retention_ms: int = Field(default=7 * DAY_MS, ge=-1, le=INT64_MAX)
    retention_bytes: int = Field(default=-1, ge=-1, le=INT64_MAX)
    segment_bytes: int = Field(default=128 * 1024 * 1024, ge=SEGMENT_BYTES_MIN, le=2**31 - 1)
    segment_ms: int = Field(default=7 * DAY_MS, ge=1, le=INT64_MAX)
    # How long a replica gathers writes before one fsync (lazy flush); None: by durability,
    # see effective_flush_debounce_ms.
    flush_debounce_ms: int | None = Field(default=None, ge=0, le=60_000)
    max_message_bytes: int = Field(default=1024 * 1024 + 12, ge=1, le=2**31 - 1)
    replica_lag_time_max_ms: int = Field(default=10_000, ge=1, le=INT64_MAX)
    # Kafka's cleanup.policy: which of retention (delete) and log compaction (compact) remove
    # records. A compacted topic keeps at least the latest record of every key.
    cleanup_policy: Literal["delete", "compact", "compact,delete"] = "delete"
    # How long a tombstone (a keyed record with a null value) outlives the first cleaning of
    # its segment, so a consumer that reads the topic more slowly than this still sees it.
    delete_retention_ms: int = Field(default=DAY_MS, ge=0, le=INT64_MAX)
    # Compaction of a partition starts once this share of its cleanable bytes is uncleaned.
    min_cleanable_dirty_ratio: float = Field(default=0.5, ge=0.0, le=1.0)
    # A record stays uncompacted at least this long after its timestamp.
    min_compaction_lag_ms: int = Field(default=0, ge=0, le=INT64_MAX)

    @field_validator("cleanup_policy", mode="before")
    @classmethod
    def _normalize_cleanup_policy(cls, value: Any) -> Any:
        # Kafka takes a list in any order ("delete,compact", "[compact, delete]").
        if not isinstance(value, str):
            return value
        words = {w.strip() for w in value.strip().strip("[]").split(",") if w.strip()}
        if words == {"compact", "delete"}:
            return "compact,delete"
        if len(words) == 1 and words <= {"compact", "delete"}:
            return words.pop()
        raise ValueError("cleanup_policy takes delete, compact or compact,delete (both, comma-separated)")

    @property
    def effective_flush_debounce_ms(self) -> int:
        """flush_debounce_ms, or its default for the topic's durability: under fsync the high
        watermark counts only flushed records, so acks=0/1 records are readable once flushed
        and the wait is kept short; under write a flush is news to nobody and only bounds what
        a power loss of every replica at once could take (Redpanda's lazy flush waits 100 ms)."""
        if self.flush_debounce_ms is not None:
            return self.flush_debounce_ms
        return FLUSH_DEBOUNCE_MS_FSYNC if self.durability == "fsync" else FLUSH_DEBOUNCE_MS_WRITE

    def in_force(self) -> dict[str, Any]:
        """Every setting with the value in force (defaults resolved), as the admin API and the
        snapshots' tables show a topic's config."""
        return {**self.model_dump(mode="json"), "flush_debounce_ms": self.effective_flush_debounce_ms}

    @property
    def compacted(self) -> bool:
        return "compact" in self.cleanup_policy

    @property
    def retention_deletes(self) -> bool:
        return "delete" in self.cleanup_policy

    @model_validator(mode="after")
    def _check_relations(self) -> "TopicConfig":
        rf = self.replication_factor
        q = self.quorum_required_acks
        if q is None:
            q = rf // 2 + 1
            object.__setattr__(self, "quorum_required_acks", q)
        if self.commit_policy == "quorum" and not 1 < q <= rf:
            raise ValueError(
                f"quorum_required_acks={q} must satisfy 1 < quorum_required_acks <= "
                f"replication_factor ({rf}) for commit_policy=quorum"
                + ("; a quorum topic needs replication_factor >= 2" if rf < 2 else ""))
        if self.commit_policy == "isr" and q > rf:
            raise ValueError(f"quorum_required_acks={q} exceeds replication_factor ({rf})")
        if self.min_insync_replicas > rf:
            raise ValueError(f"min_insync_replicas={self.min_insync_replicas} exceeds "
                             f"replication_factor ({rf})")
        return self

    @property
    def quorum_acks(self) -> int:
        """The resolved q (never None after construction)."""
        assert self.quorum_required_acks is not None
        return self.quorum_required_acks


VALID_KEYS: tuple[str, ...] = tuple(TopicConfig.model_fields)

_RELATION_FIELDS = ("quorum_required_acks", "min_insync_replicas", "commit_policy",
                    "replication_factor")


def normalize_key(key: str) -> str:
    return key.strip().replace(".", "_").replace("-", "_")


# Kafka's topic of the consumer groups' committed offsets (dataplane/groups/placement.py): a
# group's records sit on the partition its id hashes to, modulo the partition count.
OFFSETS_TOPIC = "__consumer_offsets"


def is_internal(topic: str) -> bool:
    return topic == OFFSETS_TOPIC


def refuse_internal(topic: str, why: str) -> None:
    """InvalidTopicError, saying `why`, when `topic` is internal: a change clients may make to
    their own topics (create, delete, add partitions) but not to the offsets topic."""
    if is_internal(topic):
        raise InvalidTopicError(
            f"topic '{topic}' is internal (every consumer group's committed offsets, managed by the "
            f"brokers): {why}", field="name", value=topic)


def refuse_creating_internal(topic: str) -> None:
    """A client's create of an internal topic (the admin API, Kafka's CreateTopics, `biplane up
    --topic`); the brokers' own create goes through the controller's RPC, not these edges."""
    refuse_internal(topic, "the brokers create it, compacted, when a group first needs it")


def validate_topic_name(name: str) -> str:
    """Return `name` if it is a legal topic name, else raise InvalidTopicError."""
    if not isinstance(name, str):
        raise InvalidTopicError(f"topic name must be a string, got {name!r}",
                                field="name", value=name)
    if not 1 <= len(name) <= TOPIC_NAME_LENGTH_MAX:
        raise InvalidTopicError(
            f"topic name length {len(name)} is outside 1..{TOPIC_NAME_LENGTH_MAX}",
            field="name", value=name)
    if name in (".", ".."):
        raise InvalidTopicError(f"topic name {name!r} is reserved", field="name", value=name)
    if not _TOPIC_NAME.fullmatch(name):
        bad = sorted({c for c in name if not _TOPIC_NAME.fullmatch(c)})
        raise InvalidTopicError(
            f"topic name {name!r} has illegal characters {''.join(bad)!r}; "
            f"use letters, digits, '.', '_' and '-'", field="name", value=name)
    return name


def _error_class(key: str) -> type[InvalidFieldError]:
    if key == "partitions":
        return InvalidPartitionsError
    if key == "replication_factor":
        return InvalidReplicationFactorError
    return InvalidConfigError


def _raise_from(exc: ValidationError, values: Mapping[str, Any]) -> None:
    err = exc.errors()[0]
    loc = [str(part) for part in err.get("loc", ())]
    key = loc[0] if loc else _guess_relation_key(str(err.get("msg", "")))
    value = values.get(key)
    msg = plain_message(err)
    if loc:
        text = f"invalid value {value!r} for topic config '{key}': {msg}"
    else:
        text = f"invalid topic config: {msg}"
    raise _error_class(key)(text, field=key, value=value) from None


def _guess_relation_key(msg: str) -> str:
    for key in _RELATION_FIELDS:
        if msg.startswith(key) or f"{key}=" in msg:
            return key
    return "config"


def _check_keys(keys: Any) -> None:
    for key in keys:
        if key not in TopicConfig.model_fields:
            raise InvalidConfigError(
                f"unknown topic config key {key!r}; valid keys: {', '.join(VALID_KEYS)}",
                field=str(key), value=None)


def make_topic_config(values: Mapping[str, Any]) -> TopicConfig:
    """Build a config from user values (strings from a CLI are coerced), with clear errors."""
    normalized = {normalize_key(str(k)): v for k, v in values.items()}
    _check_keys(normalized)
    try:
        return TopicConfig.model_validate(normalized)
    except ValidationError as exc:
        _raise_from(exc, normalized)
        raise  # unreachable: _raise_from always raises


def refuse_protocol_change(topic: str, old: TopicConfig, new: TopicConfig) -> None:
    """An alter that would change how the topic's live partitions replicate or commit is refused."""
    for key in PROTOCOL_KEYS:
        before, after = getattr(old, key), getattr(new, key)
        if before != after:
            raise InvalidConfigError(
                f"topic config '{key}' of topic {topic!r} is fixed at creation ({before}; asked: {after}): "
                "changing how live partitions replicate or commit could lose acknowledged records. Create a "
                f"new topic with {key}={after} and move producers and consumers to it",
                field=key, value=after)


def apply_config_changes(config: TopicConfig, changes: Mapping[str, Any]) -> TopicConfig:
    """Return `config` with `changes` applied; a value of None resets the key to its default.

    Every key and value is checked; `partitions` and `replication_factor` cannot change here.
    """
    normalized = {normalize_key(str(k)): v for k, v in changes.items()}
    _check_keys(normalized)
    for key in normalized:
        if key in IMMUTABLE_KEYS:
            how = ("add partitions instead (`biplane topic add-partitions`, POST "
                   "/v1/topics/{name}/partitions)" if key == "partitions"
                   else "use reassignment to change replicas")
            raise _error_class(key)(f"topic config '{key}' cannot be altered; {how}",
                                    field=key, value=normalized[key])
    current = config.model_dump()
    for key, value in normalized.items():
        if value is None:
            field = TopicConfig.model_fields[key]
            current[key] = field.default
        else:
            current[key] = value
    try:
        return TopicConfig.model_validate(current)
    except ValidationError as exc:
        _raise_from(exc, current)
        raise
