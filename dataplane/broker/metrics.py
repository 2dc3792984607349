"""Prometheus text exposition of a broker's state: per-partition offsets and roles, request counts."""
from __future__ import annotations

from typing import Any


def _labels(**kv: Any) -> str:
    inner = ",".join(f'{k}="{str(v).replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"'
                     for k, v in kv.items())
    return "{" + inner + "}"


def render_metrics(broker: Any) -> str:
    lines: list[str] = []

    def family(name: str, kind: str, help_text: str, samples: list[tuple[dict, float]]) -> None:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            lines.append(f"{name}{_labels(**labels) if labels else ''} {value}")

    drivers = sorted(broker.replicas.drivers.items())
    part = lambda tp: {"topic": tp[0], "partition": tp[1]}  # noqa: E731
    family("biplane_broker_metadata_offset", "gauge", "metadata offset applied by this broker",
           [({}, broker.learner.offset)])
    family("biplane_broker_fenced", "gauge", "1 while the controller has this broker fenced",
           [({}, int(broker.lifecycle.fenced))])
    budget = broker.replicas.budget
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
           [({"request": k}, v) for k, v in sorted(broker.handler.counters.requests.items())])
    family("biplane_broker_errors_total", "counter", "error answers by code",
           [({"code": k}, v) for k, v in sorted(broker.handler.counters.errors.items())])
    return "\n".join(lines) + "\n"
