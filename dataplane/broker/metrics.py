"""A broker's Prometheus metrics (docs/metrics.md lists every family).

`BrokerMetrics` owns the broker's registry and the few instruments its hot paths update:
produce and fetch latency (request to answer), replication round trips, fsync durations
and ISR shrink/expand counts. Everything else is read when Prometheus scrapes, by
`BrokerCollector`: per-partition offsets and sizes, ISR health, leader and partition
counts, follower lag, request and error counts (plain dict increments in server.py), the
event loop's stalls. Another part of the broker adds its own families with
`BrokerMetrics.exposition.add(source)` (state the loop owns: a common.metrics.LoopSource)
or a collector on `BrokerMetrics.registry` (state safe to read from any thread).
Consumer groups are `GroupCollector`'s: the groups this broker coordinates, their
committed offsets and lag (biplane_group_*).
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Protocol

from prometheus_client import Counter, Histogram
from prometheus_client.metrics_core import Metric

from common.errors import ErrorCode
from common.eventloop import LoopStalls, in_slices
from common.metadata.image import MetadataImage
from common.metrics import (
    FETCH_BUCKETS_S, LATENCY_BUCKETS_S, Exposition, Families, LoopStallsSource, PartitionHealth, RowFamily, gauge,
    label_set, labelled_counter, labelled_gauge,
)
from common.topic_partition import TopicPartition
from common.usage import lag_records
from dataplane.broker.budget import ProduceBudget
from dataplane.broker.partition import PartitionDriver
from dataplane.groups.driver import GroupCoordinator
from dataplane.groups.state import GroupState


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
        self.exposition = Exposition()
        self.registry = r = self.exposition.registry
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
        self._session_fetches = Counter("biplane_broker_fetch_session_requests",
                                        "this follower's session fetches sent (the long-poll to each leader): "
                                        "full ones carry every partition, incremental ones only those that "
                                        "changed", ["leader", "kind"], registry=r)
        self._session_partitions = Counter("biplane_broker_fetch_session_partitions_sent",
                                           "partitions carried by this follower's session fetches (an idle "
                                           "session's fetches carry none)", ["leader"], registry=r)
        self._session_children: dict[tuple[int, bool], tuple[Any, Any]] = {}
        session_errors = Counter("biplane_broker_fetch_session_errors",
                                 "session fetches a leader refused (its session gone or at another epoch): the "
                                 "next one is full", ["reason"], registry=r)
        self._session_errors = {reason: session_errors.labels(reason) for reason in ("unknown_session", "wrong_epoch")}

    def observe_produce(self, acks: int, seconds: float) -> None:
        self._produce.get(acks, self._produce_other).observe(seconds)

    def observe_fetch(self, follower: bool, seconds: float) -> None:
        (self._fetch_follower if follower else self._fetch_consumer).observe(seconds)

    def observe_session_fetch(self, leader_id: int, full: bool, partitions: int) -> None:
        children = self._session_children.get((leader_id, full))
        if children is None:
            leader = str(leader_id)
            children = self._session_children[(leader_id, full)] = (
                self._session_fetches.labels(leader, "full" if full else "incremental"),
                self._session_partitions.labels(leader))
        children[0].inc()
        children[1].inc(partitions)

    def observe_session_error(self, reason: str) -> None:
        self._session_errors[reason].inc()

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
    def metadata_lag(self) -> tuple[int, float]: ...
    @property
    def metadata_image(self) -> MetadataImage: ...
    @property
    def replicas_opening(self) -> int: ...
    @property
    def replicas_parked(self) -> int: ...
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


# A scrape copies this many partitions' rows on the loop between yields (BrokerCollector.snapshot).
ROWS_PER_SLICE = 500

# Per-partition families: (name, help, kind) in the order of a snapshot row's values.
_PARTITION_FAMILIES: tuple[tuple[str, str, str], ...] = (
    ("biplane_partition_log_start_offset", "first offset the local log holds", "gauge"),
    ("biplane_partition_log_end_offset", "next offset the local log will assign", "gauge"),
    ("biplane_partition_flushed_offset", "end of the durable prefix of the local log", "gauge"),
    ("biplane_partition_high_watermark", "high watermark as this replica knows it", "gauge"),
    ("biplane_partition_leader_epoch", "leader epoch this replica acts in", "gauge"),
    ("biplane_partition_is_leader", "1 if this replica leads its partition", "gauge"),
    ("biplane_partition_size_bytes", "bytes in the local log's segments", "gauge"),
    ("biplane_partition_produced_records", "records acknowledged by this leader", "counter"),
    ("biplane_partition_produced_bytes", "batch bytes acknowledged by this leader", "counter"),
    ("biplane_partition_producer_snapshots_written", "producer-state snapshots this replica wrote (segment rolls)",
     "counter"),
    ("biplane_partition_producer_state_rebuilds", "producer-state rebuilds after a truncation (each in a worker "
     "thread)", "counter"),
)


def _partition_row(d: PartitionDriver) -> tuple[int, ...]:
    log, r = d.log, d.replica
    return (log.log_start_offset, log.log_end_offset, log.flushed_offset, r.high_watermark, r.leader_epoch,
            int(d.is_leader), log.size_bytes, d.produce_records, d.produce_bytes, d.producer_snapshots_written,
            d.producer_state.rebuilds)


class BrokerCollector:
    """The broker's loop-owned state as metric families (common.metrics.LoopSource): the
    snapshot copies numbers on the event loop; the families are built in the renderer thread."""

    def __init__(self, source: BrokerMetricsSource) -> None:
        self.source = source
        self._loop = LoopStallsSource(source.loop_stalls, prefix="biplane_broker")

    async def snapshot(self) -> Families:
        """Copies the broker's figures on the loop; the partitions' rows in slices of
        ROWS_PER_SLICE, yielding to the loop between them (at 10,000 partitions one copy in
        one go held the loop 50-150 ms at every scrape)."""
        b = self.source
        scalars = [
            ("biplane_broker_id", "this broker's id (Prometheus's instance label names its address)", b.broker_id),
            ("biplane_broker_metadata_offset", "metadata offset applied by this broker", b.metadata_offset),
            ("biplane_broker_metadata_lag_records", "records the controller has committed that this broker has "
             "not yet acted on", b.metadata_lag[0]),
            ("biplane_broker_metadata_lag_seconds", "how long this broker has been more than the lag bound "
             "behind the controller's metadata (0 when within it)", b.metadata_lag[1]),
            ("biplane_broker_fenced", "1 while the controller has this broker fenced", int(b.fenced)),
            ("biplane_broker_replicas_opening", "replicas this broker hosts that are still opening "
             "(answering LEADER_NOT_AVAILABLE until open)", b.replicas_opening),
            ("biplane_broker_replicas_parked", "quiet leaders whose followers' caught-up clocks their fetch "
             "sessions keep (no timer each while idle)", b.replicas_parked),
        ]
        budget = b.produce_budget
        scalars += [
            ("biplane_broker_unreplicated_bytes", "produce bytes this broker's leaders hold unreplicated",
             budget.total_bytes),
            ("biplane_broker_unreplicated_bytes_peak", "highest biplane_broker_unreplicated_bytes seen",
             budget.peak_total_bytes),
            ("biplane_broker_unreplicated_bytes_max", "bound on biplane_broker_unreplicated_bytes",
             budget.unreplicated_bytes_max),
        ]
        counters = b.request_counters
        requests, errors = sorted(counters.requests.items()), sorted(counters.errors.items())
        drivers = list(b.partition_drivers.items())   # a copy: the walk below yields
        led = PartitionHealth()
        rows: list[tuple[TopicPartition, tuple[int, ...]]] = []
        lags: list[tuple[TopicPartition, int, int]] = []
        async for tp, d in in_slices(drivers, ROWS_PER_SLICE):
            if d.closed:
                continue
            rows.append((tp, _partition_row(d)))
            state = d.replica.state
            if d.is_leader and state is not None:
                led.add(replicas=len(state.replicas), isr=len(state.isr), has_leader=True, policy=d.replica.config)
                end = d.replica.log_end_offset
                lags += [(tp, replica_id, max(0, end - progress.fetch_offset))
                         for replica_id, progress in sorted(d.replica.progress.items())]
        scalars += [
            ("biplane_broker_partitions", "partition replicas this broker holds", len(rows)),
            ("biplane_broker_leader_partitions", "partitions this broker leads", led.partitions),
            ("biplane_broker_under_replicated_partitions",
             "partitions this broker leads whose ISR is smaller than their replicas", led.under_replicated),
            ("biplane_broker_under_min_isr_partitions",
             "partitions this broker leads whose ISR is below min_insync_replicas (isr topics) or "
             "quorum_required_acks (quorum topics): acks=all cannot complete", led.under_min_isr),
            ("biplane_broker_offline_partitions",
             "partitions without a leader in this broker's metadata (the whole cluster's)",
             sum(1 for p in b.metadata_image.partitions() if p.leader is None)),
            ("biplane_broker_offline_replicas",
             "replicas on this broker whose log is offline (a failed write, or not opened)", b.offline_replicas),
        ]
        loop_families = self._loop.snapshot()

        def families() -> Iterator[Metric | RowFamily]:
            rows.sort(key=lambda row: row[0])   # in the renderer's thread, off the loop
            lags.sort(key=lambda lag: lag[:2])
            partition_labels = [label_set(("topic", "partition"), (tp[0], str(tp[1]))) for tp, _ in rows]
            for name, help_text, value in scalars:
                yield gauge(name, help_text, value)
            yield from loop_families()
            yield labelled_counter("biplane_broker_requests",
                                   "requests by type (Kafka API ones as Kafka<Api>v<version>)", ["request"],
                                   (([k], v) for k, v in requests))
            yield labelled_counter("biplane_broker_errors", "error answers by request and error code (one per "
                                   "partition answered with an error)", ["request", "code"],
                                   (([req, code], v) for (req, code), v in errors))
            for column, (name, help_text, kind) in enumerate(_PARTITION_FAMILIES):
                yield RowFamily(name, help_text, kind,
                                [(labels, row[column]) for labels, (_, row) in zip(partition_labels, rows)])
            yield RowFamily("biplane_partition_follower_lag_records",
                            "on a leader: its log end minus each follower's log end at its last fetch or "
                            "append-entries answer", "gauge",
                            [(label_set(("topic", "partition", "replica"), (tp[0], str(tp[1]), str(replica_id))), lag)
                             for tp, replica_id, lag in lags])
        return families


class GroupMetricsSource(Protocol):
    """What GroupCollector reads of a broker (Broker satisfies it; `groups` is None until started)."""

    @property
    def groups(self) -> GroupCoordinator | None: ...
    @property
    def partition_drivers(self) -> Mapping[TopicPartition, PartitionDriver]: ...


_GROUP_STATES = tuple(s.value for s in GroupState if s is not GroupState.DEAD)


class GroupCollector:
    """The groups this broker coordinates (the offsets-topic partitions it leads, once loaded)
    as metric families. On the loop the snapshot copies each group and this broker's high
    watermark of each partition it holds a replica of; a partition it holds no replica of has
    a committed offset but no lag here (the controller's biplane_group_lag_records has it,
    from the partition leader's report)."""

    def __init__(self, source: GroupMetricsSource) -> None:
        self.source = source

    def snapshot(self) -> Families:
        coordinator = self.source.groups
        groups = coordinator.snapshot() if coordinator is not None else []
        watermarks = {tp: d.replica.high_watermark for tp, d in self.source.partition_drivers.items()
                      if not d.closed}

        def families() -> Iterator[Metric]:
            committed: list[tuple[list[str], int]] = []
            lags: list[tuple[list[str], int]] = []
            for g in groups:
                for topic, partition, offset in g.offsets:
                    labels = [g.group, topic, str(partition)]
                    committed.append((labels, offset))
                    hw = watermarks.get(TopicPartition(topic, partition))
                    if hw is not None and hw >= 0:
                        lags.append((labels, lag_records(hw, offset)))
            yield labelled_gauge("biplane_group_committed_offset",
                                 "on a group's coordinator: the group's committed offset of a partition",
                                 ["group", "topic", "partition"], committed)
            yield labelled_gauge("biplane_group_lag_records",
                                 "on a group's coordinator: the partition's high watermark as this broker's "
                                 "replica knows it minus the group's committed offset (never negative; absent "
                                 "where this broker holds no replica of the partition)",
                                 ["group", "topic", "partition"], lags)
            yield labelled_gauge("biplane_group_members", "on a group's coordinator: the group's members",
                                 ["group"], (([g.group], g.members) for g in groups))
            yield labelled_gauge("biplane_group_state",
                                 "on a group's coordinator: 1 for the group's current state, 0 for the others",
                                 ["group", "state"],
                                 (([g.group, state], int(g.state == state)) for g in groups
                                  for state in _GROUP_STATES))
        return families
