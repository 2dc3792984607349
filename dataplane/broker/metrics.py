"""A broker's Prometheus metrics (docs/metrics.md lists every family).

`BrokerMetrics` owns the broker's registry and the few instruments its hot paths update:
produce and fetch latency (request to answer), replication round trips, fsync durations
and ISR shrink/expand counts. Everything else is read when Prometheus scrapes, by
`BrokerCollector`: per-partition offsets and sizes, ISR health, leader and partition
counts, follower lag, request and error counts (plain dict increments in server.py), the
event loop's stalls. Another part of the broker adds its own families by registering a
collector on `BrokerMetrics.registry` (consumer-group lag, once groups exist, belongs in
a collector of the group coordinator: biplane_group_lag_records{group,topic,partition}).
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Protocol

from prometheus_client import Counter, Histogram
from prometheus_client.metrics_core import Metric

from common.errors import ErrorCode
from common.eventloop import LoopStalls
from common.metadata.image import MetadataImage
from common.metrics import (
    FETCH_BUCKETS_S, LATENCY_BUCKETS_S, LoopStallsCollector, PartitionHealth, gauge, labelled_counter, labelled_gauge,
    new_registry,
)
from common.topic_partition import TopicPartition
from dataplane.broker.budget import ProduceBudget
from dataplane.broker.partition import PartitionDriver


class Counters:
    """Requests by type and error answers by (request, code): a dict increment on the hot
    path, exposed when scraped (biplane_broker_requests_total, biplane_broker_errors_total)."""

    def __init__(self) -> None:
        self.requests: dict[str, int] = {}
        self.errors: dict[tuple[str, str], int] = {}

    def request(self, api: str) -> None:
        self.requests[api] = self.requests.get(api, 0) + 1

    def error(self, request: str, code: ErrorCode) -> None:
        key = (request, code.name)
        self.errors[key] = self.errors.get(key, 0) + 1


class BrokerMetrics:
    """The broker's registry and the instruments updated as requests are served. Label
    children are resolved once here: an update on the hot path is one locked add."""

    def __init__(self) -> None:
        self.registry = new_registry()
        r = self.registry
        produce = Histogram("biplane_broker_produce_latency_seconds",
                            "produce requests, from arrival to the answer (acks decides when that is)",
                            ["acks"], buckets=LATENCY_BUCKETS_S, registry=r)
        self._produce = {0: produce.labels("0"), 1: produce.labels("1"), -1: produce.labels("all")}
        self._produce_other = produce.labels("other")  # an invalid acks value, refused per partition
        fetch = Histogram("biplane_broker_fetch_latency_seconds",
                          "fetch requests, from arrival to the answer, long-poll wait included",
                          ["fetcher"], buckets=FETCH_BUCKETS_S, registry=r)
        self._fetch_consumer, self._fetch_follower = fetch.labels("consumer"), fetch.labels("follower")
        replication = Histogram("biplane_broker_replication_latency_seconds",
                                "this broker's replication round trips: a follower's fetch that brought "
                                "records (pull), a leader's append-entries to its answer (push)",
                                ["mode"], buckets=LATENCY_BUCKETS_S, registry=r)
        self.observe_pull = replication.labels("pull").observe
        self.observe_push = replication.labels("push").observe
        self.observe_fsync = Histogram("biplane_broker_fsync_latency_seconds",
                                       "one fsync run of a partition log (group commit: many writes share one)",
                                       buckets=LATENCY_BUCKETS_S, registry=r).observe
        self.isr_shrinks = Counter("biplane_broker_isr_shrinks",
                                   "ISR shrinks of partitions this broker leads, as applied from metadata "
                                   "(proposed by this leader, or made by the controller fencing a follower)",
                                   registry=r)
        self.isr_expands = Counter("biplane_broker_isr_expands",
                                   "ISR expansions of partitions this broker leads, as applied from metadata",
                                   registry=r)

    def observe_produce(self, acks: int, seconds: float) -> None:
        self._produce.get(acks, self._produce_other).observe(seconds)

    def observe_fetch(self, follower: bool, seconds: float) -> None:
        (self._fetch_follower if follower else self._fetch_consumer).observe(seconds)

    def isr_changed(self, old_isr: tuple[int, ...], new_isr: tuple[int, ...]) -> None:
        """Count one metadata change of a led partition's ISR (both, if members left and joined)."""
        old, new = set(old_isr), set(new_isr)
        if old - new:
            self.isr_shrinks.inc()
        if new - old:
            self.isr_expands.inc()


class BrokerMetricsSource(Protocol):
    """What BrokerCollector reads of a broker (Broker satisfies it once started)."""

    @property
    def broker_id(self) -> int: ...
    @property
    def metadata_offset(self) -> int: ...
    @property
    def metadata_image(self) -> MetadataImage: ...
    @property
    def fenced(self) -> bool: ...
    @property
    def partition_drivers(self) -> Mapping[TopicPartition, PartitionDriver]: ...
    @property
    def offline_replicas(self) -> int: ...
    @property
    def produce_budget(self) -> ProduceBudget: ...
    @property
    def request_counters(self) -> Counters: ...
    @property
    def loop_stalls(self) -> LoopStalls: ...


class BrokerCollector:
    """Families read from the broker's state when scraped (on the event loop: no locks)."""

    def __init__(self, source: BrokerMetricsSource) -> None:
        self.source = source
        self._loop = LoopStallsCollector(source.loop_stalls, prefix="biplane_broker")

    def collect(self) -> Iterator[Metric]:
        b = self.source
        yield gauge("biplane_broker_id", "this broker's id (Prometheus's instance label names its address)",
                    b.broker_id)
        yield gauge("biplane_broker_metadata_offset", "metadata offset applied by this broker", b.metadata_offset)
        yield gauge("biplane_broker_fenced", "1 while the controller has this broker fenced", int(b.fenced))
        yield from self._loop.collect()
        yield from self._budget(b.produce_budget)
        yield from self._requests(b.request_counters)
        drivers = sorted((tp, d) for tp, d in b.partition_drivers.items() if not d.closed)
        yield from self._health(drivers, b.metadata_image, b.offline_replicas)
        yield from self._partitions(drivers)

    @staticmethod
    def _budget(budget: ProduceBudget) -> Iterator[Metric]:
        yield gauge("biplane_broker_unreplicated_bytes", "produce bytes this broker's leaders hold unreplicated",
                    budget.total_bytes)
        yield gauge("biplane_broker_unreplicated_bytes_peak", "highest biplane_broker_unreplicated_bytes seen",
                    budget.peak_total_bytes)
        yield gauge("biplane_broker_unreplicated_bytes_max", "bound on biplane_broker_unreplicated_bytes",
                    budget.unreplicated_bytes_max)

    @staticmethod
    def _requests(counters: Counters) -> Iterator[Metric]:
        yield labelled_counter("biplane_broker_requests", "requests by type (Kafka API ones as Kafka<Api>v<version>)",
                               ["request"], (([k], v) for k, v in sorted(counters.requests.items())))
        yield labelled_counter("biplane_broker_errors", "error answers by request and error code (one per "
                               "partition answered with an error)", ["request", "code"],
                               (([req, code], v) for (req, code), v in sorted(counters.errors.items())))

    @staticmethod
    def _health(drivers: list[tuple[TopicPartition, PartitionDriver]], image: MetadataImage,
                offline_replicas: int) -> Iterator[Metric]:
        led = PartitionHealth()
        for _, d in drivers:
            state = d.replica.state
            if d.is_leader and state is not None:
                led.add(replicas=len(state.replicas), isr=len(state.isr), has_leader=True, policy=d.replica.config)
        known = sum(1 for p in image.partitions() if p.leader is None)
        yield gauge("biplane_broker_partitions", "partition replicas this broker holds", len(drivers))
        yield gauge("biplane_broker_leader_partitions", "partitions this broker leads", led.partitions)
        yield gauge("biplane_broker_under_replicated_partitions",
                    "partitions this broker leads whose ISR is smaller than their replicas", led.under_replicated)
        yield gauge("biplane_broker_under_min_isr_partitions",
                    "partitions this broker leads whose ISR is below min_insync_replicas (isr topics) or "
                    "quorum_required_acks (quorum topics): acks=all cannot complete", led.under_min_isr)
        yield gauge("biplane_broker_offline_partitions",
                    "partitions without a leader in this broker's metadata (the whole cluster's)", known)
        yield gauge("biplane_broker_offline_replicas",
                    "replicas on this broker whose log is offline (a failed write, or not opened)", offline_replicas)

    @staticmethod
    def _partitions(drivers: list[tuple[TopicPartition, PartitionDriver]]) -> Iterator[Metric]:
        labels = ["topic", "partition"]

        def per(name: str, help_text: str, value) -> Metric:
            return labelled_gauge(name, help_text, labels, (([tp[0], str(tp[1])], value(d)) for tp, d in drivers))

        def per_counter(name: str, help_text: str, value) -> Metric:
            return labelled_counter(name, help_text, labels, (([tp[0], str(tp[1])], value(d)) for tp, d in drivers))

        yield per("biplane_partition_log_start_offset", "first offset the local log holds",
                  lambda d: d.log.log_start_offset)
        yield per("biplane_partition_log_end_offset", "next offset the local log will assign",
                  lambda d: d.log.log_end_offset)
        yield per("biplane_partition_flushed_offset", "end of the durable prefix of the local log",
                  lambda d: d.log.flushed_offset)
        yield per("biplane_partition_high_watermark", "high watermark as this replica knows it",
                  lambda d: d.replica.high_watermark)
        yield per("biplane_partition_leader_epoch", "leader epoch this replica acts in",
                  lambda d: d.replica.leader_epoch)
        yield per("biplane_partition_is_leader", "1 if this replica leads its partition", lambda d: int(d.is_leader))
        yield per("biplane_partition_size_bytes", "bytes in the local log's segments", lambda d: d.log.size_bytes)
        yield per_counter("biplane_partition_produced_records", "records acknowledged by this leader",
                          lambda d: d.produce_records)
        yield per_counter("biplane_partition_produced_bytes", "batch bytes acknowledged by this leader",
                          lambda d: d.produce_bytes)
        yield per_counter("biplane_partition_producer_snapshots_written",
                          "producer-state snapshots this replica wrote (segment rolls)",
                          lambda d: d.producer_snapshots_written)
        yield per_counter("biplane_partition_producer_state_rebuilds",
                          "producer-state rebuilds after a truncation (each in a worker thread)",
                          lambda d: d.producer_state.rebuilds)
        lag = labelled_gauge("biplane_partition_follower_lag_records",
                             "on a leader: its log end minus each follower's log end at its last fetch or "
                             "append-entries answer", labels + ["replica"], ())
        for tp, d in drivers:
            if d.is_leader:
                end = d.replica.log_end_offset
                for replica_id, progress in sorted(d.replica.progress.items()):
                    lag.add_metric([tp[0], str(tp[1]), str(replica_id)], max(0, end - progress.fetch_offset))
        yield lag
