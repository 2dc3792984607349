"""Dynamic cluster configuration: settings the controller keeps in metadata and brokers apply
live, without a restart, as soon as they learn the record.

A key that is not set (None) leaves each broker with its own command-line value. Only
settings a broker can change while it runs belong here; the rest stay flags.

| key | applied by | effect |
|---|---|---|
| reassignment_throttle_bytes_per_s | each broker's fetcher and pusher | bytes/s a broker copies, summed over the replicas being added by a reassignment (pull: those it fetches; push: those it leads) |
| log_cleaner_io_bytes_per_s | each broker's log cleaner | bytes/s the cleaner reads and writes together |
| auto_create_topics | each broker's Kafka listener | create a topic a Kafka client asks metadata for |
| default_partitions | each broker's Kafka listener | partitions of a topic a Kafka client leaves to the broker |
| default_replication_factor | each broker's Kafka listener | its replication factor |
"""
from __future__ import annotations

from typing import Any, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from common.errors import InvalidConfigError
from common.validation_text import plain_message

THROTTLE_BYTES_PER_S_MIN = 1024


class ClusterConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    reassignment_throttle_bytes_per_s: int | None = Field(default=None, ge=THROTTLE_BYTES_PER_S_MIN,
                                                          le=2**40)
    log_cleaner_io_bytes_per_s: int | None = Field(default=None, ge=1024, le=2**40)
    auto_create_topics: bool | None = None
    default_partitions: int | None = Field(default=None, ge=1, le=10_000)
    default_replication_factor: int | None = Field(default=None, ge=1, le=100)


CLUSTER_CONFIG_KEYS: tuple[str, ...] = tuple(ClusterConfig.model_fields)

CLUSTER_CONFIG_MEANINGS: dict[str, str] = {
    "reassignment_throttle_bytes_per_s": "bytes/s each broker copies for the replicas a reassignment is "
                                         f"adding (>= {THROTTLE_BYTES_PER_S_MIN}; unset: unthrottled)",
    "log_cleaner_io_bytes_per_s": "bytes/s each broker's log cleaner reads and writes (>= 1024; unset: the "
                                  "broker's --log-cleaner-io-bytes-per-second)",
    "auto_create_topics": "true: a Kafka client asking metadata for a missing topic creates it (unset: the "
                          "broker's --auto-create-topics)",
    "default_partitions": "partitions of a topic a Kafka client leaves to the broker (unset: the broker's "
                          "--default-partitions)",
    "default_replication_factor": "its replication factor (unset: the broker's --default-replication-factor)",
}


def apply_cluster_config_changes(config: ClusterConfig, changes: Mapping[str, Any]) -> ClusterConfig:
    """`config` with `changes` applied (a None value unsets the key); InvalidConfigError naming
    the key, the value and what is allowed when a change does not fit."""
    for key in changes:
        if key not in CLUSTER_CONFIG_KEYS:
            raise InvalidConfigError(f"unknown cluster config key {key!r}; the keys are "
                                     f"{', '.join(CLUSTER_CONFIG_KEYS)}", field=key, value=key)
    merged = {**config.model_dump(), **dict(changes)}
    try:
        return ClusterConfig.model_validate(merged)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = str(first["loc"][0]) if first.get("loc") else "config"
        raise InvalidConfigError(f"cluster config {key}={changes.get(key)!r}: {plain_message(first)} "
                                 f"({CLUSTER_CONFIG_MEANINGS.get(key, '')})", field=key,
                                 value=changes.get(key)) from None
