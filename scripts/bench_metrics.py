#!/usr/bin/env python3
"""A broker's /metrics scrape at many partitions: the per-partition families written as text
directly (`common.metrics.RowFamily`) against the same families built with prometheus_client's
metric families (`GaugeMetricFamily`/`CounterMetricFamily`, what the broker used before),
alternated in one run. The broker's own collector, on stand-in partition drivers (RF 3: a third
of them led, with two followers' lag each); the two texts are checked byte for byte first.

Prints, per side, the median over rounds of the CPU seconds one scrape costs (the snapshot on the
loop and the text in the renderer thread, where it holds the GIL against the loop), the text's
size, and the ratio. At a scrape interval of S seconds, a scrape costing C CPU seconds takes
C / S of a core from an idle broker.

    scripts/bench_metrics.py [--partitions 10000] [--rounds 5]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
import types

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from common.eventloop import LoopStalls  # noqa: E402
from common.metrics import Exposition, labelled_counter, labelled_gauge  # noqa: E402
from common.topic_partition import TopicPartition  # noqa: E402
from dataplane.broker import metrics as broker_metrics  # noqa: E402


class _Driver:
    """What the collector reads of a partition driver."""

    def __init__(self, tp: TopicPartition, leader: bool) -> None:
        end = 1000 + tp[1]
        self.closed, self.is_leader = False, leader
        self.log = types.SimpleNamespace(log_start_offset=0, log_end_offset=end, flushed_offset=end,
                                         size_bytes=4096 * end)
        state = types.SimpleNamespace(replicas=(1, 2, 3), isr=(1, 2, 3)) if leader else None
        progress = {r: types.SimpleNamespace(fetch_offset=end) for r in (2, 3)} if leader else {}
        self.replica = types.SimpleNamespace(high_watermark=end, leader_epoch=3, state=state, progress=progress,
                                             log_end_offset=end, config=types.SimpleNamespace(
                                                 commit_policy="isr", min_insync_replicas=2, quorum_required_acks=None))
        self.produce_records, self.produce_bytes, self.producer_snapshots_written = 0, 0, 0
        self.producer_state = types.SimpleNamespace(rebuilds=0)


def _broker(partitions: int) -> types.SimpleNamespace:
    drivers = {TopicPartition(f"topic-{i // 100}", i % 100): _Driver(TopicPartition(f"topic-{i // 100}", i % 100),
                                                                      leader=i % 3 == 0)
               for i in range(partitions)}
    return types.SimpleNamespace(
        broker_id=1, metadata_offset=5, metadata_lag=(0, 0.0), fenced=False, replicas_opening=0, replicas_parked=0,
        produce_budget=types.SimpleNamespace(total_bytes=0, peak_total_bytes=0, unreplicated_bytes_max=1),
        request_counters=types.SimpleNamespace(requests={}, errors={}), partition_drivers=drivers,
        metadata_image=types.SimpleNamespace(partitions=lambda: []), offline_replicas=0, loop_stalls=LoopStalls())


def _library_label_set(names, values):
    return list(names), list(values)


def _library_family(name, help_text, kind, rows):
    """The same family as prometheus_client's metric family (the broker's way before)."""
    names = rows[0][0][0] if rows else []
    make = labelled_counter if kind == "counter" else labelled_gauge
    return make(name, help_text, names, [(values, value) for (_, values), value in rows])


SIDES = {"rows": (broker_metrics.RowFamily, broker_metrics.label_set),
         "library": (_library_family, _library_label_set)}


def scrape(broker: types.SimpleNamespace, side: str) -> tuple[float, bytes]:
    """(CPU seconds of one scrape, its text) with the partition families built the `side` way."""
    broker_metrics.RowFamily, broker_metrics.label_set = SIDES[side]
    exposition = Exposition()
    exposition.add(broker_metrics.BrokerCollector(broker))

    async def timed() -> tuple[float, bytes]:
        await exposition.render()   # the renderer thread started, as in a running broker
        started = time.process_time()   # every thread's CPU: the loop's snapshot and the renderer's text
        body = await exposition.render()
        return time.process_time() - started, body
    try:
        return asyncio.run(timed())
    finally:
        exposition.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--partitions", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    broker = _broker(args.partitions)
    texts = {side: scrape(broker, side)[1] for side in SIDES}
    # The process collector's figures (CPU, memory) differ between two scrapes: compare the rest.
    rest = {side: b"\n".join(line for line in text.split(b"\n") if not line.startswith(b"process_"))
            for side, text in texts.items()}
    if rest["rows"] != rest["library"]:
        sys.exit("the two scrapes differ: the row families do not write what prometheus_client writes")
    took: dict[str, list[float]] = {side: [] for side in SIDES}
    for _ in range(args.rounds):
        for side in SIDES:   # alternated, so both see the same machine
            took[side].append(scrape(broker, side)[0])
    rows, library = statistics.median(took["rows"]), statistics.median(took["library"])
    print(f"/metrics of a broker with {args.partitions} partitions ({len(texts['rows']) / 1e6:.1f} MB of text, "
          f"identical both ways), median of {args.rounds} alternated rounds:")
    print(f"  row families:        {rows * 1000:7.0f} ms CPU per scrape "
          f"({rows / 15 * 100:.1f}% of a core at a 15 s scrape interval)")
    print(f"  prometheus_client:   {library * 1000:7.0f} ms CPU per scrape "
          f"({library / 15 * 100:.1f}% of a core at a 15 s scrape interval)")
    print(f"  ratio: {library / rows:.1f}x less CPU per scrape")


if __name__ == "__main__":
    main()
