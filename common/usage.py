"""Usage statistics that brokers report in heartbeats and controllers keep for snapshots.

Usage is not metadata: it is not in the replicated log. The controller leader keeps
the latest report per broker in memory and writes it into snapshot files.
"""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ReplicaUsage(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    topic: str
    partition: int = Field(ge=0)
    size_bytes: int = Field(ge=0)
    log_start_offset: int = Field(ge=0)
    log_end_offset: int = Field(ge=0)
    high_watermark: int = Field(ge=0)
    produce_bytes_per_s: float = Field(default=0.0, ge=0)
    produce_records_per_s: float = Field(default=0.0, ge=0)
    fetch_bytes_per_s: float = Field(default=0.0, ge=0)


class BrokerUsage(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    broker_id: int = Field(ge=0)
    at_ms: int = Field(ge=0)
    disk_total_bytes: int = Field(ge=0)
    disk_used_bytes: int = Field(ge=0)
    disk_free_bytes: int = Field(ge=0)
    replicas: list[ReplicaUsage] = Field(default_factory=list)
    # Biplane's own bytes: the partition logs in the data directory. The disk_* fields are the
    # whole filesystem's, which other programs share. None from brokers that predate it.
    log_bytes: int | None = Field(default=None, ge=0)
    # Byte counters since `counters_since_ms` (the broker process's start, wall clock): they only
    # grow within one process, so a reader differences two reports to get a rate over any
    # interval, and a changed `counters_since_ms` says the counters restarted from zero.
    # None from brokers that predate them (readers fall back to the per-second rates above).
    counters_since_ms: int | None = Field(default=None, ge=0)
    produce_bytes_total: int | None = Field(default=None, ge=0)  # client writes to replicas it led
    replicated_bytes_total: int | None = Field(default=None, ge=0)  # written to replicas it followed
    fetch_bytes_total: int | None = Field(default=None, ge=0)  # served to followers and consumers
