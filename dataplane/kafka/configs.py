"""Kafka's topic config names and string values, mapped onto Biplane's topic config.

Pure: no I/O. The Kafka admin handlers (dataplane/kafka/admin.py) describe a topic's
`TopicConfig` with `describe`, and turn Kafka's config entries into the admin API's
requests (`create_config`, `alter_request`); the controller's decisions then check
the values with the same rules as every other path (common/metadata/config.py).

Three kinds of key:
- Kafka's own names that Biplane honours (retention.ms, min.insync.replicas, ...),
  each onto one Biplane key, values as Kafka writes them ("true", "604800000");
- Biplane's own settings as `biplane.*` keys (biplane.commit.policy, ...);
- Kafka's names with one value Biplane honours (compression.type=producer, message.timestamp.type=CreateTime): that value is
  accepted and changes nothing, any other is refused, never silently accepted.
A name not listed here is refused with INVALID_CONFIG naming it.

`source` is TOPIC when a value differs from Biplane's default and DEFAULT when it
equals it: the image keeps values, not which of them a user once set.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Literal, Mapping

from common.errors import InvalidConfigError, InvalidFieldError
from common.metadata.config import PROTOCOL_KEYS, TopicConfig, normalize_key
from common.requests import AlterConfigRequest

LONG_MAX = 2**63 - 1
BIPLANE_PREFIX = "biplane."

# Kafka's DescribeConfigs config_type numbers.
BOOLEAN, STRING, INT, LONG, DOUBLE, LIST = 1, 2, 3, 5, 6, 7

Source = Literal["DEFAULT", "TOPIC"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class ConfigEntry:
    name: str
    value: str
    source: Source
    read_only: bool
    config_type: int
    sensitive: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Key:
    """A Kafka config name backed by one Biplane key."""

    biplane: str
    config_type: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Fixed:
    """A Kafka config name of which Biplane honours one value only."""

    value: str
    why: str


KAFKA_KEYS: dict[str, _Key] = {
    "retention.ms": _Key(biplane="retention_ms", config_type=LONG),
    "retention.bytes": _Key(biplane="retention_bytes", config_type=LONG),
    "segment.bytes": _Key(biplane="segment_bytes", config_type=INT),
    "segment.ms": _Key(biplane="segment_ms", config_type=LONG),
    "min.insync.replicas": _Key(biplane="min_insync_replicas", config_type=INT),
    "max.message.bytes": _Key(biplane="max_message_bytes", config_type=INT),
    "unclean.leader.election.enable": _Key(biplane="unclean_leader_election", config_type=BOOLEAN),
    "cleanup.policy": _Key(biplane="cleanup_policy", config_type=LIST),
    "delete.retention.ms": _Key(biplane="delete_retention_ms", config_type=LONG),
    "min.cleanable.dirty.ratio": _Key(biplane="min_cleanable_dirty_ratio", config_type=DOUBLE),
    "min.compaction.lag.ms": _Key(biplane="min_compaction_lag_ms", config_type=LONG),
}

FIXED: dict[str, _Fixed] = {
    "compression.type": _Fixed(value="producer", why="brokers keep batches as the producer compressed them "
                                                     "and never recompress"),
    "message.timestamp.type": _Fixed(value="CreateTime", why="records keep the producer's timestamps"),
}

# Biplane's own settings; partitions and replication_factor are not configs in Kafka's API
# (CreatePartitions and reassignment change them).
BIPLANE_KEYS: tuple[str, ...] = ("replication_mode", "commit_policy", "quorum_required_acks", "durability",
                                 "flush_debounce_ms", "replica_lag_time_max_ms")

# Kafka's flush policy: with biplane.durability=fsync every batch is on disk before it is
# acknowledged (flush.messages=1); with write no count forces a flush (Long.MAX_VALUE, Kafka's
# default). flush.ms is biplane.flush.debounce.ms: replicas fsync that long after a write.
FLUSH_KEYS = ("flush.messages", "flush.ms")


def biplane_name(key: str) -> str:
    """`commit_policy` -> `biplane.commit.policy`."""
    return BIPLANE_PREFIX + key.replace("_", ".")


_BY_BIPLANE: dict[str, str] = {
    **{k.biplane: name for name, k in KAFKA_KEYS.items()},
    **{key: biplane_name(key) for key in BIPLANE_KEYS},
}


def kafka_name(biplane_key: str) -> str:
    """The Kafka-side name of a Biplane config key (for errors the controller names by its key)."""
    return _BY_BIPLANE.get(biplane_key, biplane_key)


def known_names() -> list[str]:
    return sorted([*KAFKA_KEYS, *FIXED, *FLUSH_KEYS, *(biplane_name(k) for k in BIPLANE_KEYS)])


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _config_type(key: str) -> int:
    annotation = TopicConfig.model_fields[key].annotation
    if annotation is bool:
        return BOOLEAN
    if annotation is int or annotation == (int | None):
        return LONG if key.endswith("_ms") else INT
    if annotation is float:
        return DOUBLE
    return STRING


def describe(config: TopicConfig, names: Iterable[str] | None = None) -> list[ConfigEntry]:
    """Every config of a topic with Kafka's names (or only `names`; an unknown one is refused)."""
    default = TopicConfig(replication_factor=config.replication_factor)
    entries: dict[str, ConfigEntry] = {}

    def source(key: str) -> Source:
        return "DEFAULT" if getattr(config, key) == getattr(default, key) else "TOPIC"

    for name, k in KAFKA_KEYS.items():
        entries[name] = ConfigEntry(name=name, value=_text(getattr(config, k.biplane)), source=source(k.biplane),
                                    read_only=False, config_type=k.config_type)
    for name, fixed in FIXED.items():
        entries[name] = ConfigEntry(name=name, value=fixed.value, source="DEFAULT", read_only=False,
                                    config_type=STRING)
    fsync = config.durability == "fsync"
    in_force = config.in_force()   # a default resolved by another setting shows as what applies
    entries["flush.messages"] = ConfigEntry(name="flush.messages", value=_text(1 if fsync else LONG_MAX),
                                            source=source("durability"), read_only=False, config_type=LONG)
    # Under either durability a replica fsyncs what it wrote flush_debounce_ms later (lazy flush).
    entries["flush.ms"] = ConfigEntry(name="flush.ms", value=_text(config.effective_flush_debounce_ms),
                                      source=source("flush_debounce_ms"), read_only=True, config_type=LONG)
    for key in BIPLANE_KEYS:
        name = biplane_name(key)
        entries[name] = ConfigEntry(name=name, value=_text(in_force[key]), source=source(key),
                                    read_only=False, config_type=_config_type(key))
    if names is None:
        return [entries[n] for n in sorted(entries)]
    wanted = list(names)
    for n in wanted:
        if n not in entries:
            raise _unknown(n, None)
    return [entries[n] for n in wanted]


def _unknown(name: str, value: str | None) -> InvalidConfigError:
    return InvalidConfigError(f"unknown topic config {name!r}; Biplane honours: {', '.join(known_names())}",
                              field=name, value=value)


def _parse(name: str, key: str, text: str) -> Any:
    """A Kafka string value as the Biplane key's type, or INVALID_CONFIG naming both."""
    kind = _config_type(key)
    if kind == BOOLEAN:
        lowered = text.strip().lower()
        if lowered not in ("true", "false"):
            raise InvalidConfigError(f"invalid value {text!r} for topic config {name!r}: use true or false",
                                     field=name, value=text)
        return lowered == "true"
    if kind in (INT, LONG):
        return _whole(name, text)
    if kind == DOUBLE:
        try:
            return float(text.strip())
        except ValueError:
            raise InvalidConfigError(f"invalid value {text!r} for topic config {name!r}: it takes a number "
                                     "such as 0.5", field=name, value=text) from None
    return text.strip()


def _whole(name: str, text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise InvalidConfigError(f"invalid value {text!r} for topic config {name!r}: it takes a whole number",
                                 field=name, value=text) from None


def _translate(name: str, text: str | None) -> dict[str, Any]:
    """Biplane's changes for one Kafka entry; None resets (Kafka's DELETE)."""
    if name in KAFKA_KEYS:
        key = KAFKA_KEYS[name].biplane
        return {key: None if text is None else _parse(name, key, text)}
    if name in FIXED:
        fixed = FIXED[name]
        if text is not None and text.strip() != fixed.value:
            raise InvalidConfigError(f"{name}={text!r} is refused: Biplane honours only {name}={fixed.value} "
                                     f"({fixed.why})", field=name, value=text)
        return {}
    if name == "flush.messages":
        if text is None:
            return {"durability": None}
        count = _whole(name, text)
        if count == 1:
            return {"durability": "fsync"}
        if count == LONG_MAX:
            return {"durability": "write"}
        raise InvalidConfigError(f"invalid value {text!r} for topic config 'flush.messages': Biplane fsyncs every "
                                 f"batch (1) or leaves flushing to the OS ({LONG_MAX}); or set "
                                 "biplane.durability to fsync or write", field=name, value=text)
    if name == "flush.ms":
        raise InvalidConfigError("topic config 'flush.ms' is read-only: it follows biplane.durability and "
                                 "biplane.flush.debounce.ms; set those instead", field=name, value=text)
    if name.startswith(BIPLANE_PREFIX):
        key = normalize_key(name[len(BIPLANE_PREFIX):])
        if key in BIPLANE_KEYS:
            return {key: None if text is None else _parse(name, key, text)}
    raise _unknown(name, text)


def to_biplane(entries: Mapping[str, str | None]) -> dict[str, Any]:
    """Kafka entries (name -> string value, None to reset) as Biplane's config changes."""
    changes: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for name, text in entries.items():
        for key, value in _translate(name, text).items():
            if key in changes and changes[key] != value:
                raise InvalidConfigError(f"topic configs {origin[key]!r} and {name!r} disagree about "
                                         f"{biplane_name(key)}; give one of them", field=name, value=text)
            changes[key] = value
            origin[key] = name
    return changes


def create_config(entries: Mapping[str, str | None]) -> dict[str, Any]:
    """The `config` of a CreateTopicRequest from CreateTopics' configs (a null value: the default)."""
    return {k: v for k, v in to_biplane(entries).items() if v is not None}


Operation = Literal["SET", "DELETE"]
_OPERATIONS: dict[int, Operation] = {0: "SET", 1: "DELETE"}


def alter_request(entries: Mapping[str, str | None], *, replace_all: bool) -> AlterConfigRequest:
    """The admin API's config change for Kafka's AlterConfigs (`replace_all`: every key not
    given goes back to its default, as Kafka's non-incremental call means) or for
    IncrementalAlterConfigs' SET and DELETE (use `incremental_entries` first)."""
    changes = to_biplane(entries)
    reset = [k for k, v in changes.items() if v is None]
    if replace_all:
        # The replication protocol is not reset: like the partition count, it is fixed at creation.
        settable = [k.biplane for k in KAFKA_KEYS.values()] + [k for k in BIPLANE_KEYS if k not in PROTOCOL_KEYS]
        reset += [k for k in settable if k not in changes]
    return AlterConfigRequest(set={k: v for k, v in changes.items() if v is not None}, reset=sorted(set(reset)))


def incremental_entries(ops: Iterable[tuple[str, int, str | None]]) -> dict[str, str | None]:
    """IncrementalAlterConfigs' (name, operation, value) as entries; APPEND and SUBTRACT (for
    list configs: Biplane's one, cleanup.policy, is SET whole) are refused."""
    entries: dict[str, str | None] = {}
    for name, op, value in ops:
        operation = _OPERATIONS.get(op)
        if operation is None:
            raise InvalidConfigError(f"operation {op} on topic config {name!r} is refused: only SET (0) and "
                                     "DELETE (1) apply; SET a list config such as cleanup.policy whole "
                                     "(compact,delete)", field=name, value=value)
        if name in entries:
            raise InvalidConfigError(f"topic config {name!r} is altered twice in one request; give it once",
                                     field=name, value=value)
        entries[name] = value if operation == "SET" else None
    return entries


def kafka_words(message: str) -> str:
    """A message of the controller's config rules with Biplane's quoted keys ('min_insync_replicas')
    spelt as the Kafka client named them ('min.insync.replicas')."""
    for key, name in _BY_BIPLANE.items():
        message = message.replace(f"'{key}'", f"'{name}'").replace(f"{key}=", f"{name}=")
    return message


def in_kafka_terms(exc: InvalidFieldError) -> InvalidConfigError:
    """A config error the controller's rules raised, naming Biplane's key, as Kafka's
    INVALID_CONFIG naming the config the Kafka client sent."""
    name = kafka_name(exc.field)
    message = str(exc) if name == exc.field else f"{exc} (topic config {name!r})"
    return InvalidConfigError(message, field=name, value=exc.value)
