"""What every process's Prometheus metrics share: the registry, the /metrics listener, the
event loop's stalls, and the partition-health rule brokers and controllers both count by.

Each process owns one `CollectorRegistry` (never prometheus_client's global one, so two
brokers in one test process never mix their figures). What is only read when Prometheus
scrapes (offsets, sizes, ISR sizes, Raft state) is a custom collector that reads the
process's state then; the hot path pays for nothing but the counters and histograms it
updates itself.

    registry = new_registry()                     # with the process collector (CPU, RSS, fds, start)
    registry.register(MyCollector(...))
    server = await MetricsServer.start(registry, host="127.0.0.1", port=0)
    server.port; await server.close()
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Protocol

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from common.eventloop import LoopStalls

# Upper bounds (seconds) of the latency histograms: produce, replication, fsync, admin API.
# From 0.5 ms (an acks=1 produce on loopback) to 10 s (a request's default timeout).
LATENCY_BUCKETS_S: tuple[float, ...] = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                        1.0, 2.5, 5.0, 10.0)
# Fetches long-poll up to fetch_wait_ms_max (at most 30 s).
FETCH_BUCKETS_S: tuple[float, ...] = LATENCY_BUCKETS_S + (30.0,)


def new_registry() -> CollectorRegistry:
    """A registry of this process's own, with prometheus_client's process collector
    (process_cpu_seconds_total, process_resident_memory_bytes, process_open_fds,
    process_start_time_seconds, ...)."""
    # auto_describe off: a custom collector runs only when scraped, never at register (when
    # the state it reads may not exist yet).
    registry = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=registry)
    return registry


def render(registry: CollectorRegistry) -> bytes:
    """The text exposition of everything registered (collectors run now, on the caller's thread)."""
    return generate_latest(registry)


class MetricsServer:
    """GET /metrics on its own port, unauthenticated (Prometheus's usual way: keep the port
    on a network only the monitoring system reaches). Rendered on the event loop, where the
    collectors may read the loop's state without locks."""

    def __init__(self, runner: web.AppRunner, port: int) -> None:
        self._runner = runner
        self.port = port

    @classmethod
    async def start(cls, registry: CollectorRegistry, *, host: str, port: int) -> "MetricsServer":
        app = web.Application()

        async def metrics(request: web.Request) -> web.Response:
            return metrics_response(registry)

        app.router.add_get("/metrics", metrics)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, host, port, reuse_address=True)
        try:
            await site.start()
        except OSError:
            await runner.cleanup()
            raise
        sockets = site._server.sockets if site._server is not None else ()  # type: ignore[attr-defined]
        return cls(runner, sockets[0].getsockname()[1] if sockets else port)

    async def close(self) -> None:
        await self._runner.cleanup()


def metrics_response(registry: CollectorRegistry) -> web.Response:
    response = web.Response(body=render(registry))
    response.headers["Content-Type"] = CONTENT_TYPE_LATEST
    return response


# ---------------------------------------------------------------- event loop

class LoopStallsCollector:
    """A LoopWatchdog's figures (common/eventloop.py) under `prefix`: the lag histogram
    `<prefix>_event_loop_lag_seconds`, `<prefix>_event_loop_stalls_total` and
    `<prefix>_event_loop_stall_max_seconds`."""

    def __init__(self, stalls: LoopStalls, *, prefix: str) -> None:
        self.stalls = stalls
        self.prefix = prefix

    def collect(self) -> Iterator[Metric]:
        s = self.stalls
        p = self.prefix
        buckets = [(f"{bound / 1000:g}", float(n)) for bound, n in zip(s.buckets_ms, s.bucket_counts)]
        buckets.append(("+Inf", float(s.lag_count)))
        yield HistogramMetricFamily(f"{p}_event_loop_lag_seconds",
                                    "how late the event-loop watchdog's periodic callback ran",
                                    buckets=buckets, sum_value=s.lag_sum_ms / 1000)
        yield CounterMetricFamily(f"{p}_event_loop_stalls", f"event-loop lags of at least "
                                  f"{s.stall_ms_min / 1000:g} s", value=s.stalls_total)
        yield GaugeMetricFamily(f"{p}_event_loop_stall_max_seconds",
                                "longest time the event loop was kept from running a due callback, since start",
                                value=s.stall_max_ms / 1000)


# ---------------------------------------------------------------- partition health

class HealthPolicy(Protocol):
    """A topic's settings the health rule reads (TopicConfig and ReplicationConfig both have them)."""

    @property
    def commit_policy(self) -> str: ...
    @property
    def min_insync_replicas(self) -> int: ...
    @property
    def quorum_required_acks(self) -> int | None: ...


def isr_floor(policy: HealthPolicy, replicas: int) -> int:
    """The fewest in-sync replicas with which acks=all still completes: min_insync_replicas
    for `isr` topics, q for `quorum` topics (a majority when unset)."""
    if policy.commit_policy == "quorum":
        q = policy.quorum_required_acks
        return q if q is not None else replicas // 2 + 1
    return policy.min_insync_replicas


class PartitionHealth:
    """Counts of partitions that are under-replicated (ISR smaller than the replicas),
    under min ISR (ISR below isr_floor: acks=all produce fails or waits) and leaderless."""

    __slots__ = ("partitions", "under_replicated", "under_min_isr", "leaderless")

    def __init__(self) -> None:
        self.partitions = 0
        self.under_replicated = 0
        self.under_min_isr = 0
        self.leaderless = 0

    def add(self, *, replicas: int, isr: int, has_leader: bool, policy: HealthPolicy) -> None:
        self.partitions += 1
        self.under_replicated += isr < replicas
        self.under_min_isr += isr < isr_floor(policy, replicas)
        self.leaderless += not has_leader


def gauge(name: str, help_text: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, help_text, value=value)


def labelled_gauge(name: str, help_text: str, labels: list[str],
                   samples: Iterable[tuple[list[str], float]]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, help_text, labels=labels)
    for values, value in samples:
        family.add_metric(values, value)
    return family


def labelled_counter(name: str, help_text: str, labels: list[str],
                     samples: Iterable[tuple[list[str], float]]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, help_text, labels=labels)
    for values, value in samples:
        family.add_metric(values, value)
    return family
