"""Prometheus text exposition of a broker's state: per-partition offsets and roles, request
counts, and the event loop's stalls."""
from __future__ import annotations

from typing import Any, Mapping, Protocol

from common.eventloop import LoopStalls
from common.topic_partition import TopicPartition
from dataplane.broker.budget import ProduceBudget
from dataplane.broker.partition import PartitionDriver
from dataplane.broker.server import Counters


class BrokerMetricsSource(Protocol):
    """What render_metrics reads of a broker (Broker satisfies it once started)."""

    @property
    def metadata_offset(self) -> int: ...
    @property
    def fenced(self) -> bool: ...
    @property
    def partition_drivers(self) -> Mapping[TopicPartition, PartitionDriver]: ...
    @property
    def produce_budget(self) -> ProduceBudget: ...
    @property
    def request_counters(self) -> Counters: ...
    @property
    def loop_stalls(self) -> LoopStalls: ...


def _labels(**kv: Any) -> str:
    inner = ",".join(f'{k}="{str(v).replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"'
                     for k, v in kv.items())
    return "{" + inner + "}"


def render_metrics(broker: BrokerMetricsSource) -> str:
    lines: list[str] = []

    def family(name: str, kind: str, help_text: str, samples: list[tuple[dict[str, Any], float]]) -> None:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            lines.append(f"{name}{_labels(**labels) if labels else ''} {value}")

    def histogram(name: str, help_text: str, bounds: tuple[float, ...], cumulative: list[int],
                  count: int, total: float) -> None:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} histogram")
        for bound, n in zip(bounds, cumulative):
            lines.append(f"{name}_bucket{_labels(le=bound)} {n}")
        lines.append(f'{name}_bucket{_labels(le="+Inf")} {count}')
        lines.append(f"{name}_sum {total}")
        lines.append(f"{name}_count {count}")

    drivers = sorted(broker.partition_drivers.items())

    def part(tp: TopicPartition) -> dict[str, Any]:
        return {"topic": tp[0], "partition": tp[1]}
    family("biplane_broker_metadata_offset", "gauge", "metadata offset applied by this broker",
           [({}, broker.metadata_offset)])
    family("biplane_broker_fenced", "gauge", "1 while the controller has this broker fenced",
           [({}, int(broker.fenced))])
    stalls = broker.loop_stalls
    family("biplane_broker_event_loop_stall_max_seconds", "gauge",
           "longest time the event loop was kept from running a due callback, since start",
           [({}, stalls.stall_max_ms / 1000)])
    family("biplane_broker_event_loop_stalls_total", "counter",
           f"event-loop lags of at least {stalls.stall_ms_min / 1000:g} s",
           [({}, stalls.stalls_total)])
    histogram("biplane_broker_event_loop_lag_seconds", "how late the watchdog's periodic callback ran",
              tuple(b / 1000 for b in stalls.buckets_ms), list(stalls.bucket_counts), stalls.lag_count,
              stalls.lag_sum_ms / 1000)
    budget = broker.produce_budget
    family("biplane_broker_unreplicated_bytes", "gauge", "produce bytes this broker's leaders hold unreplicated",
           [({}, budget.total_bytes)])
    family("biplane_broker_unreplicated_bytes_peak", "gauge", "highest biplane_broker_unreplicated_bytes seen",
           [({}, budget.peak_total_bytes)])
    family("biplane_broker_unreplicated_bytes_max", "gauge", "bound on biplane_broker_unreplicated_bytes",
           [({}, budget.unreplicated_bytes_max)])
    family("biplane_partition_log_end_offset", "gauge", "next offset the local log will assign",
           [(part(tp), d.log.log_end_offset) for tp, d in drivers])
    family("biplane_partition_flushed_offset", "gauge", "end of the durable prefix of the local log",
           [(part(tp), d.log.flushed_offset) for tp, d in drivers])
    family("biplane_partition_high_watermark", "gauge", "high watermark as this replica knows it",
           [(part(tp), d.replica.high_watermark) for tp, d in drivers])
    family("biplane_partition_leader_epoch", "gauge", "leader epoch this replica acts in",
           [(part(tp), d.replica.leader_epoch) for tp, d in drivers])
    family("biplane_partition_is_leader", "gauge", "1 if this replica leads its partition",
           [(part(tp), int(d.is_leader)) for tp, d in drivers])
    family("biplane_partition_size_bytes", "gauge", "bytes in the local log's segments",
           [(part(tp), d.log.size_bytes) for tp, d in drivers])
    family("biplane_partition_produced_records_total", "counter", "records acknowledged by this leader",
           [(part(tp), d.produce_records) for tp, d in drivers])
    family("biplane_partition_produced_bytes_total", "counter", "batch bytes acknowledged by this leader",
           [(part(tp), d.produce_bytes) for tp, d in drivers])
    family("biplane_broker_requests_total", "counter", "data-plane requests by type",
           [({"request": k}, v) for k, v in sorted(broker.request_counters.requests.items())])
    family("biplane_broker_errors_total", "counter", "error answers by code",
           [({"code": k}, v) for k, v in sorted(broker.request_counters.errors.items())])
    family("biplane_partition_producer_snapshots_written_total", "counter",
           "producer-state snapshots this replica wrote (segment rolls)",
           [(part(tp), d.producer_snapshots_written) for tp, d in drivers])
    family("biplane_partition_producer_state_rebuilds_total", "counter",
           "producer-state rebuilds after a truncation (each in a worker thread)",
           [(part(tp), d.producer_state.rebuilds) for tp, d in drivers])
    return "\n".join(lines) + "\n"
