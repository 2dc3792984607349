#!/usr/bin/env python3
"""confluent-kafka's producer against the brokers' Kafka port versus Biplane's own SDK
against their own port, alternating on one cluster.

Starts a 3-broker cluster on loopback (tests/cluster_harness.py), one topic (RF 3,
acks=all), and sends the same 1 KiB records with each client in turn for several
rounds: records/s per round, the median of each, and kafka/native. Both clients batch
up to 1 MiB with a 5 ms linger and 5 requests in flight per partition.

    .venv/bin/python scripts/bench_kafka.py [--records 50000] [--rounds 3] [--partitions 3]
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import confluent_kafka  # noqa: E402

from cluster_harness import Cluster  # noqa: E402
from dataplane.client import Producer  # noqa: E402


def kafka_round(bootstrap: str, topic: str, value: bytes, records: int) -> float:
    producer = confluent_kafka.Producer({
        "bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "batch.size": 1 << 20,
        "max.in.flight.requests.per.connection": 5, "queue.buffering.max.kbytes": 1 << 20})
    failed = 0

    def report(err, msg) -> None:
        nonlocal failed
        failed += err is not None

    producer.produce(topic, value)
    producer.flush(30)  # metadata and connections first
    begin = time.perf_counter()
    for _ in range(records):
        while True:
            try:
                producer.produce(topic, value, on_delivery=report)
                break
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)
    if producer.flush(120) != 0 or failed:
        raise SystemExit(f"confluent-kafka: {failed} records failed")
    return records / (time.perf_counter() - begin)


async def native_round(bootstrap: str, topic: str, value: bytes, records: int) -> float:
    async with Producer(bootstrap=bootstrap, acks="all", batch_size_bytes=1 << 20, linger_ms=5,
                        in_flight_per_partition_max=5) as producer:
        await producer.send_and_wait(topic, value)
        begin = time.perf_counter()
        last = None
        for i in range(records):
            last = await producer.send(topic, value)
            if i & 255 == 0:
                await asyncio.sleep(0)
        await producer.flush()
        elapsed = time.perf_counter() - begin
        assert last is not None
        last.result()
    return records / elapsed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=int, default=50_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--partitions", type=int, default=3)
    p.add_argument("--record-bytes", type=int, default=1024)
    args = p.parse_args()
    value = b"x" * args.record_bytes
    with tempfile.TemporaryDirectory() as tmp:
        with Cluster(Path(tmp), brokers=3, broker_args=["--log-level", "WARNING"]) as cluster:
            cluster.create_topic("bench", partitions=args.partitions, replication_factor=3)
            native_bootstrap = ",".join(f"127.0.0.1:{b.port}" for b in cluster.brokers.values())
            kafka, native = [], []
            for r in range(args.rounds):
                kafka.append(kafka_round(cluster.kafka_bootstrap, "bench", value, args.records))
                native.append(asyncio.run(native_round(native_bootstrap, "bench", value, args.records)))
                print(f"round {r + 1}: kafka port {kafka[-1]:,.0f} records/s, native {native[-1]:,.0f} records/s",
                      flush=True)
    k, n = statistics.median(kafka), statistics.median(native)
    print(f"median: kafka port {k:,.0f} records/s, native {n:,.0f} records/s, kafka/native {k / n:.2f} "
          f"({args.rounds} rounds of {args.records:,} x {args.record_bytes} B, RF 3, acks=all, "
          f"{args.partitions} partitions)")


if __name__ == "__main__":
    main()
