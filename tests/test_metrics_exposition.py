"""The metrics plumbing without processes: where a scrape runs, what the pure rules count.

Claims: a scrape takes each source's snapshot on the event loop and builds and writes the
families on another thread (so a big broker's text never holds the loop); two processes'
registries never share a figure; the event-loop lag histogram is exposed cumulative with
+Inf equal to the count; the partition-health rule counts under-replication and under-min-ISR
per commit policy; an ISR change counts as a shrink, an expansion or both; a method a client
invents is counted as "other", so the admin API's label set stays bounded; a family with a
sample per partition, written as text directly, reads byte for byte as prometheus_client writes it.
"""
from __future__ import annotations

import asyncio
import dataclasses
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily

from common import metrics as metrics_module
from common.eventloop import LoopStalls
from common.metrics import (
    Exposition, LoopStallsSource, PartitionHealth, RowFamily, isr_floor, label_set, labelled_counter, labelled_gauge,
)
from controller.metrics import ControllerMetrics
from dataplane.broker.metrics import BrokerMetrics
from metrics_scrape import Scrape


class ThreadRecorder:
    def __init__(self) -> None:
        self.snapshot_thread: int | None = None
        self.families_thread: int | None = None

    def snapshot(self):
        self.snapshot_thread = threading.get_ident()
        value = 7

        def families():
            self.families_thread = threading.get_ident()
            yield GaugeMetricFamily("demo_value", "a value copied on the loop", value=value)
        return families


def render(exposition: Exposition) -> tuple[Scrape, int]:
    async def go() -> tuple[bytes, int]:
        return await exposition.render(), threading.get_ident()
    try:
        body, loop_thread = asyncio.run(go())
    finally:
        exposition.close()
    return Scrape(body.decode()), loop_thread


def test_a_scrape_snapshots_on_the_loop_and_renders_on_another_thread():
    exposition = Exposition()
    source = ThreadRecorder()
    exposition.add(source)
    scraped, loop_thread = render(exposition)
    assert scraped.value("demo_value") == 7
    assert source.snapshot_thread == loop_thread
    assert source.families_thread is not None and source.families_thread != loop_thread
    assert scraped.value("process_open_fds") > 0   # the process collector is in every registry


def test_two_processes_registries_share_nothing():
    a, b = BrokerMetrics(), BrokerMetrics()
    a.observe_produce(-1, 0.002)
    a.isr_shrinks.inc()
    scraped_a, _ = render(a.exposition)
    scraped_b, _ = render(b.exposition)
    assert scraped_a.value("biplane_broker_produce_latency_seconds_count", acks="all") == 1
    assert scraped_b.value("biplane_broker_produce_latency_seconds_count", acks="all") == 0
    assert (scraped_a.value("biplane_broker_isr_shrinks_total"), scraped_b.value("biplane_broker_isr_shrinks_total")) \
        == (1, 0)


def test_loop_lag_histogram_is_cumulative_and_inf_is_the_count():
    stalls = LoopStalls(stall_ms_min=100)
    for lag_ms in (1, 7, 30, 120, 9000):
        stalls.observe(lag_ms)
    exposition = Exposition()
    exposition.add(LoopStallsSource(stalls, prefix="biplane_test"))
    scraped, _ = render(exposition)
    buckets = {s.labels["le"]: s.value for s in scraped.samples("biplane_test_event_loop_lag_seconds_bucket")}
    assert buckets["0.005"] == 1 and buckets["0.05"] == 3 and buckets["5"] == 4 and buckets["+Inf"] == 5
    assert scraped.value("biplane_test_event_loop_lag_seconds_count") == 5
    assert scraped.value("biplane_test_event_loop_stalls_total") == 2
    assert scraped.value("biplane_test_event_loop_stall_max_seconds") == 9.0


@dataclasses.dataclass(frozen=True)
class Policy:
    commit_policy: str
    min_insync_replicas: int = 1
    quorum_required_acks: int | None = None


def test_health_counts_by_commit_policy():
    assert isr_floor(Policy("isr", min_insync_replicas=2), 3) == 2
    assert isr_floor(Policy("quorum", quorum_required_acks=3), 5) == 3
    assert isr_floor(Policy("quorum"), 5) == 3   # unset: a majority
    h = PartitionHealth()
    h.add(replicas=3, isr=3, has_leader=True, policy=Policy("isr", min_insync_replicas=2))
    h.add(replicas=3, isr=2, has_leader=True, policy=Policy("isr", min_insync_replicas=2))
    h.add(replicas=3, isr=1, has_leader=True, policy=Policy("isr", min_insync_replicas=2))
    h.add(replicas=3, isr=2, has_leader=True, policy=Policy("quorum", quorum_required_acks=2))
    h.add(replicas=3, isr=1, has_leader=False, policy=Policy("quorum", quorum_required_acks=2))
    assert (h.partitions, h.under_replicated, h.under_min_isr, h.leaderless) == (5, 4, 2, 1)


def test_an_isr_change_counts_as_shrink_expand_or_both():
    m = BrokerMetrics()
    m.isr_changed((1, 2, 3), (1, 2))      # shrink
    m.isr_changed((1, 2), (1, 2, 3))      # expand
    m.isr_changed((1, 2), (1, 3))         # 2 left, 3 joined
    m.isr_changed((1, 2, 3), (3, 2, 1))   # reordered: no change of members
    scraped, _ = render(m.exposition)
    assert scraped.value("biplane_broker_isr_shrinks_total") == 2
    assert scraped.value("biplane_broker_isr_expands_total") == 2


class NoService:
    node_id = 1
    is_leader = False
    stats: dict[str, int] = {}
    broker_offsets: dict[int, int] = {}
    broker_opening: dict[int, int] = {}
    usage: dict = {}

    def clock_ms(self) -> int:
        return 0

    @property
    def committed(self):
        from common.metadata import MetadataImage
        return MetadataImage()

    def raft_status(self):
        return None


def test_an_invented_http_method_is_counted_as_other():
    m = ControllerMetrics(NoService())
    m.observe_request("BREW", "unmatched", 405, 0.001)
    m.observe_request("GET", "/v1/topics", 200, 0.001)
    scraped, _ = render(m.exposition)
    assert scraped.value("biplane_api_requests_total", method="other", path="unmatched", status="405") == 1
    assert scraped.value("biplane_api_requests_total", method="GET", path="/v1/topics", status="200") == 1
    assert not scraped.samples("biplane_api_requests_total", method="BREW")
    assert scraped.value("biplane_controller_node_id") == 1 and not scraped.has("biplane_controller_raft_term")


def test_a_brokers_partition_rows_are_copied_in_slices_that_yield_to_the_loop(monkeypatch):
    """At 10,000 partitions copying every partition's row on the loop in one go held it
    50-150 ms at each scrape. The copy yields after ROWS_PER_SLICE rows (here 3): no loop turn
    copies more, and the scrape still has every partition, in order."""
    import types

    from common.eventloop import LoopStalls
    from dataplane.broker import metrics as broker_metrics
    from common.topic_partition import TopicPartition
    from dataplane.broker.metrics import BrokerCollector
    monkeypatch.setattr(broker_metrics, "ROWS_PER_SLICE", 3)
    turn = [0]
    looked: list[int] = []

    class Driver:
        def __init__(self, end: int) -> None:
            self.log = types.SimpleNamespace(log_start_offset=0, log_end_offset=end, flushed_offset=end,
                                             size_bytes=10 * end)
            self.replica = types.SimpleNamespace(high_watermark=end, leader_epoch=1, state=None, progress={})
            self.is_leader, self.produce_records, self.produce_bytes = False, 0, 0
            self.producer_snapshots_written, self.producer_state = 0, types.SimpleNamespace(rebuilds=0)

        @property
        def closed(self) -> bool:
            looked.append(turn[0])
            return False

    drivers = {TopicPartition(f"t{i % 3}", i): Driver(100 + i) for i in reversed(range(10))}
    source = types.SimpleNamespace(
        broker_id=1, metadata_offset=5, metadata_lag=(0, 0.0), fenced=False, replicas_opening=0, replicas_parked=0,
        produce_budget=types.SimpleNamespace(total_bytes=0, peak_total_bytes=0, unreplicated_bytes_max=1),
        request_counters=types.SimpleNamespace(requests={}, errors={}), partition_drivers=drivers,
        metadata_image=types.SimpleNamespace(partitions=lambda: []), offline_replicas=0, loop_stalls=LoopStalls())
    exposition = Exposition()
    exposition.add(BrokerCollector(source))

    async def go() -> bytes:
        loop = asyncio.get_running_loop()

        def count_turns():
            turn[0] += 1
            loop.call_soon(count_turns)
        loop.call_soon(count_turns)
        return await exposition.render()
    try:
        body = asyncio.run(go())
    finally:
        exposition.close()
    assert len(looked) == 10 and max(looked.count(t) for t in set(looked)) <= 3, looked
    ends = [line for line in body.decode().splitlines() if line.startswith("biplane_partition_log_end_offset{")]
    assert len(ends) == 10
    assert ends == sorted(ends, key=lambda line: (line.split('topic="')[1].split('"')[0],
                                                  int(line.split('partition="')[1].split('"')[0])))


_LABEL_TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
_VALUES = st.one_of(st.integers(min_value=-(2 ** 63), max_value=2 ** 63 - 1),
                    st.floats(allow_nan=False), st.just(float("nan")))


@settings(max_examples=200, deadline=None)
@given(kind=st.sampled_from(["gauge", "counter"]), name=st.sampled_from(["demo_rows", "demo_rows_total"]),
       help_text=_LABEL_TEXT,
       rows=st.lists(st.tuples(_LABEL_TEXT, _LABEL_TEXT, _VALUES), max_size=8))
def test_a_row_family_writes_what_prometheus_client_writes_for_the_same_family(kind, name, help_text, rows):
    """A family with a sample per partition is written as text directly (RowFamily): a broker
    with 10,000 partitions spent 1.4 s of CPU per scrape in prometheus_client building and
    checking a sample object per value. A scraper must not tell the difference: for any label
    values (quotes, backslashes, newlines, any text) and any value (large integers in Go's
    exponent form, floats, NaN) and a counter's name with or without `_total`, the family's
    text is byte for byte what generate_latest writes. (Row families are written after the
    others in a scrape: the order of families means nothing to a scraper.)"""
    make = labelled_counter if kind == "counter" else labelled_gauge

    class Library:
        def collect(self):
            yield make(name, help_text, ["topic", "partition"], [([t, p], v) for t, p, v in rows])

    expected = generate_latest(Library())
    family = RowFamily(name, help_text, kind, [(label_set(["topic", "partition"], [t, p]), v) for t, p, v in rows])
    scrape = metrics_module._Scrape(CollectorRegistry(auto_describe=False), [lambda: [family]])
    assert metrics_module._render(scrape) == expected


def test_a_row_family_refuses_a_name_or_kind_the_text_format_cannot_carry():
    for name in ("", "9lives", "with space", "dash-ed", "ünï"):
        with pytest.raises(ValueError, match="invalid metric name"):
            RowFamily(name, "help", "gauge", [])
    with pytest.raises(ValueError, match="gauge or a counter"):
        RowFamily("demo", "help", "histogram", [])

