"""What every process's Prometheus metrics share: the exposition (registry, loop-owned
sources, the /metrics listener), the event loop's stalls, and the partition-health rule
brokers and controllers both count by.

Each process owns one `Exposition`: a `CollectorRegistry` of its own (never
prometheus_client's global one, so two brokers in one test process never mix their
figures) for the counters and histograms the hot paths update, plus sources of state that
only the event loop may read (offsets, sizes, ISR health, Raft state). The hot path pays
for nothing but its own counter and histogram updates. A scrape copies each source's
plain values on the loop (`LoopSource.snapshot`, a few microseconds per partition, in
slices that yield to the loop: 10,000 partitions copied at once held it 50-150 ms), then
builds the families and writes the text in a worker thread of its own: for a broker with
thousands of partitions that is hundreds of milliseconds of Python, which must not hold
the loop (it would stall produce requests and fetch sessions at every scrape). A family
with a sample per partition is a `RowFamily`, written as text directly: prometheus_client
builds a sample object per value and checks each one's names, 1.4 s of CPU per scrape of
10,000 partitions (10% of a core at a 15 s scrape interval, the GIL held against the loop;
scripts/bench_metrics.py).

    exposition = Exposition()                     # with the process collector (CPU, RSS, fds, start)
    Histogram("x_seconds", "...", registry=exposition.registry)
    exposition.add(source)                        # source.snapshot() -> a callable yielding families
    server = await MetricsServer.start(exposition, host="127.0.0.1", port=0)
    server.port; await server.close()
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from typing import Protocol

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from common.eventloop import LoopStalls

# Upper bounds (seconds) of the latency histograms: produce, replication, fsync, admin API.
# From 0.5 ms (an acks=1 produce on loopback) to 10 s (a request's default timeout).
LATENCY_BUCKETS_S: tuple[float, ...] = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                        1.0, 2.5, 5.0, 10.0)
# Fetches long-poll up to fetch_wait_ms_max (at most 30 s).
FETCH_BUCKETS_S: tuple[float, ...] = LATENCY_BUCKETS_S + (30.0,)


class RowFamily:
    """A gauge or counter family with a sample per row (a broker's partitions), written as the
    text generate_latest writes for the same family, in a fraction of the time: each row's
    label set is rendered once (`label_set`) for all the families that share it, and nothing
    is checked per sample. Metric names are checked once, here; label values are escaped."""

    __slots__ = ("name", "help_text", "kind", "rows")

    def __init__(self, name: str, help_text: str, kind: str, rows: Iterable[tuple[str, float]]) -> None:
        if kind not in ("gauge", "counter"):
            raise ValueError(f"a row family is a gauge or a counter, not {kind!r}")
        if not name or not all(c.isascii() and (c.isalnum() or c in "_:") for c in name) or name[0].isdigit():
            raise ValueError(f"invalid metric name {name!r}")
        if kind == "counter":   # as CounterMetricFamily names it: one `_total`, whether given or not
            name = f"{name.removesuffix('_total')}_total"
        self.name = name
        self.help_text = help_text
        self.kind = kind
        self.rows = rows   # (label_set(...), value)

    def text(self) -> str:
        help_text = self.help_text.replace("\\", r"\\").replace("\n", r"\n")
        name = self.name
        head = f"# HELP {name} {help_text}\n# TYPE {name} {self.kind}\n"
        return head + "".join([f"{name}{labels} {_number(value)}\n" for labels, value in self.rows])


def _number(value: float) -> str:
    """floatToGoString's text for `value`, with integers (offsets, sizes, counts: nearly every
    value here) written without a float's repr: a third of a row family's time went there."""
    if type(value) is int and -10 ** 15 < value < 10 ** 15:
        if value < 1_000_000:
            return f"{value}.0"
        digits = str(value)   # Go's exponent form, as floatToGoString writes it from here up
        return f"{(digits[0] + '.' + digits[1:]).rstrip('0.')}e+{len(digits) - 1:02d}"
    return floatToGoString(value)


def label_set(names: Sequence[str], values: Sequence[str]) -> str:
    """A sample's labels as the text format writes them, `{a="x",b="y"}`: by name, as
    generate_latest orders them, each value escaped as it escapes them."""
    return "{" + ",".join(f'{k}="{_escape_label_value(v)}"' for k, v in sorted(zip(names, values))) + "}"


def _escape_label_value(value: str) -> str:
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')
    return value


Families = Callable[[], Iterable[Metric | RowFamily]]


class LoopSource(Protocol):
    """State owned by the event loop. `snapshot()` runs on the loop and copies plain values;
    the callable it returns builds the metric families from them, on any thread. A source
    with thousands of partitions returns an awaitable instead, which copies them in slices
    and yields to the loop between them."""

    def snapshot(self) -> Families | Awaitable[Families]: ...


def new_registry() -> CollectorRegistry:
    """A registry of this process's own, with prometheus_client's process collector
    (process_cpu_seconds_total, process_resident_memory_bytes, process_open_fds,
    process_start_time_seconds, ...)."""
    # auto_describe off: a collector runs only when scraped, never at register.
    registry = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=registry)
    return registry


class _Scrape:
    """One scrape's view for generate_latest: the registry's collectors, then the snapshots'
    families; the row families among those are kept aside in `rows`, written after."""

    def __init__(self, registry: CollectorRegistry, taken: list[Families]) -> None:
        self.registry = registry
        self.taken = taken
        self.rows: list[RowFamily] = []

    def collect(self) -> Iterator[Metric]:
        yield from self.registry.collect()
        for families in self.taken:
            for family in families():
                if isinstance(family, RowFamily):
                    self.rows.append(family)
                else:
                    yield family


def _render(scrape: _Scrape) -> bytes:
    text = generate_latest(scrape)
    return text + "".join([family.text() for family in scrape.rows]).encode()


class Exposition:
    def __init__(self) -> None:
        self.registry = new_registry()
        self._sources: list[LoopSource] = []
        # One thread: scrapes render one at a time, and never in the executor the logs' fsyncs use.
        self._renderer = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="metrics")

    def add(self, source: LoopSource) -> None:
        self._sources.append(source)

    async def render(self) -> bytes:
        """The text exposition: snapshots on the loop (the caller's), the rest in the renderer thread."""
        taken = []
        for source in self._sources:
            got = source.snapshot()
            taken.append(await got if inspect.isawaitable(got) else got)
        return await asyncio.get_running_loop().run_in_executor(self._renderer, _render, _Scrape(self.registry, taken))

    def close(self) -> None:
        self._renderer.shutdown(wait=False, cancel_futures=True)


async def metrics_response(exposition: Exposition) -> web.Response:
    response = web.Response(body=await exposition.render())
    response.headers["Content-Type"] = CONTENT_TYPE_LATEST
    return response


class MetricsServer:
    """GET /metrics on its own port, unauthenticated (Prometheus's usual way: keep the port
    on a network only the monitoring system reaches)."""

    def __init__(self, runner: web.AppRunner, port: int) -> None:
        self._runner = runner
        self.port = port

    @classmethod
    async def start(cls, exposition: Exposition, *, host: str, port: int) -> "MetricsServer":
        app = web.Application()

        async def metrics(request: web.Request) -> web.Response:
            return await metrics_response(exposition)

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


# ---------------------------------------------------------------- event loop

class LoopStallsSource:
    """A LoopWatchdog's figures (common/eventloop.py) under `prefix`: the lag histogram
    `<prefix>_event_loop_lag_seconds`, `<prefix>_event_loop_stalls_total` and
    `<prefix>_event_loop_stall_max_seconds`."""

    def __init__(self, stalls: LoopStalls, *, prefix: str) -> None:
        self.stalls = stalls
        self.prefix = prefix

    def snapshot(self) -> Families:
        s, p = self.stalls, self.prefix
        buckets = [(f"{bound / 1000:g}", float(n)) for bound, n in zip(s.buckets_ms, s.bucket_counts)]
        buckets.append(("+Inf", float(s.lag_count)))
        lag_sum_s, stalls, stall_max_s, stall_min_s = s.lag_sum_ms / 1000, s.stalls_total, s.stall_max_ms / 1000, \
            s.stall_ms_min / 1000

        def families() -> Iterator[Metric]:
            yield HistogramMetricFamily(f"{p}_event_loop_lag_seconds",
                                        "how late the event-loop watchdog's periodic callback ran",
                                        buckets=buckets, sum_value=lag_sum_s)
            yield CounterMetricFamily(f"{p}_event_loop_stalls", f"event-loop lags of at least {stall_min_s:g} s",
                                      value=stalls)
            yield GaugeMetricFamily(f"{p}_event_loop_stall_max_seconds",
                                    "longest time the event loop was kept from running a due callback, since start",
                                    value=stall_max_s)
        return families


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
