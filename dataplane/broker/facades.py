"""Typed seams of the broker: what `metrics.render_metrics` reads of a running broker.

Typed as `MetricsSource` instead of `Any`, a metric that reads an attribute the broker
does not have is a type error in CI, not a failing /metrics endpoint in production.
Read-only properties, so plain attributes of the broker's parts satisfy them.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

from dataplane.broker.budget import ProduceBudget
from dataplane.broker.server import Counters
from dataplane.replica.core import Replica

TopicPartition = tuple[str, int]


class PartitionLogMetrics(Protocol):
    @property
    def log_end_offset(self) -> int: ...
    @property
    def flushed_offset(self) -> int: ...
    @property
    def size_bytes(self) -> int: ...


class PartitionMetrics(Protocol):
    """One partition's driver."""

    @property
    def log(self) -> PartitionLogMetrics: ...
    @property
    def replica(self) -> Replica: ...
    @property
    def is_leader(self) -> bool: ...
    @property
    def produce_records(self) -> int: ...
    @property
    def produce_bytes(self) -> int: ...


class ReplicasMetrics(Protocol):
    @property
    def drivers(self) -> Mapping[TopicPartition, PartitionMetrics]: ...
    @property
    def budget(self) -> ProduceBudget: ...


class LearnerMetrics(Protocol):
    @property
    def offset(self) -> int: ...


class LifecycleMetrics(Protocol):
    @property
    def fenced(self) -> bool: ...


class HandlerMetrics(Protocol):
    @property
    def counters(self) -> Counters: ...


class MetricsSource(Protocol):
    """A started broker, as the metrics endpoint reads it."""

    @property
    def replicas(self) -> ReplicasMetrics: ...
    @property
    def learner(self) -> LearnerMetrics: ...
    @property
    def lifecycle(self) -> LifecycleMetrics: ...
    @property
    def handler(self) -> HandlerMetrics: ...


if TYPE_CHECKING:
    # The broker's parts satisfy these (checked by mypy, never run). Broker itself holds
    # `replicas` and `lifecycle` as Optional (built by start()), so render_metrics needs a
    # started view of it before its parameter can be typed MetricsSource.
    from dataplane.broker.partition import PartitionDriver
    from dataplane.broker.replicas import ReplicaManager

    def _driver_conforms(driver: PartitionDriver) -> PartitionMetrics:
        return driver

    def _replicas_conform(replicas: ReplicaManager) -> ReplicasMetrics:
        return replicas
