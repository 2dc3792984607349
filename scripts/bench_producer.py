#!/usr/bin/env python3
"""The SDK producer against a wire-level producer on the same running cluster.

Throughput: the same records (1 KiB by default) to the same topic (3 partitions), with the
same batch size and in-flight bound, sent (a) by the SDK (`Producer.send` per record) and
(b) by a wire-level producer that resends one pre-built batch per request, 5 in flight
per partition. Prints records/s of each, their ratio, and the client's CPU per record.
Latency: one record at a time, waiting for its acknowledgement, through the SDK
(`send_and_wait`) and through the wire (one 1-record batch per request): the difference
is what the SDK adds to a synchronous send.

Runs against a `biplane up` cluster (found like the CLI finds it, or `--bootstrap`):

    .venv/bin/python scripts/bench_producer.py [--records 100000] [--rounds 3] [--acks all]
        [--batch-size-bytes 1048576] [--sync-sends 300]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from common.batch import build_batch  # noqa: E402
from common.errors import ErrorCode  # noqa: E402
from common.wire import MetadataRequest, ProducePartition, ProduceRequest, ProduceTopic, WireClient  # noqa: E402
from dataplane.client import Producer  # noqa: E402
from dataplane.client.discovery import default_bootstrap  # noqa: E402
from dataplane.client.network import parse_bootstrap  # noqa: E402
from dataplane.client.producer import parse_acks  # noqa: E402

RECORD_OVERHEAD_BYTES = 10  # a 1 KiB keyless record's varints and attributes in a batch


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def leaders(bootstrap: list[tuple[str, int]], topic: str, timeout_s: float = 15) -> dict[int, tuple[str, int]]:
    """Partition -> leader address, once every partition of a (maybe just created) topic has one."""
    deadline = time.monotonic() + timeout_s
    while True:
        client = await WireClient.connect(*bootstrap[0])
        try:
            meta = await client.request(MetadataRequest(topics=(topic,)))
        finally:
            await client.close()
        brokers = {b.node_id: (b.host, b.port) for b in meta.brokers}
        parts = meta.topics[0].partitions if meta.topics else ()
        if parts and all(p.leader_id in brokers for p in parts):
            return {p.partition: brokers[p.leader_id] for p in parts}
        if time.monotonic() > deadline:
            raise SystemExit(f"topic {topic!r} has no leader for every partition after {timeout_s} s")
        await asyncio.sleep(0.2)


async def wire_throughput(bootstrap, topic: str, value: bytes, records: int, batch_size_bytes: int,
                          acks: int, in_flight: int) -> dict:
    per_batch = max(1, (batch_size_bytes - 61) // (len(value) + RECORD_OVERHEAD_BYTES))
    batch = build_batch([value] * per_batch, timestamp_ms=int(time.time() * 1000), max_batch_bytes=1 << 26)
    where = await leaders(bootstrap, topic)
    clients = {addr: await WireClient.connect(*addr) for addr in set(where.values())}
    requests = records // per_batch
    sent = 0
    acknowledged = 0
    errors: dict[str, int] = {}

    async def worker(partition: int) -> None:
        nonlocal sent, acknowledged
        client = clients[where[partition]]
        request = ProduceRequest(acks=acks, timeout_ms=30_000, topics=(ProduceTopic(topic=topic, partitions=(
            ProducePartition(partition=partition, records=batch),)),))
        while sent < requests:
            sent += 1
            answer = (await client.request(request)).topics[0].partitions[0]
            if answer.error_code == ErrorCode.NONE:
                acknowledged += 1
            else:
                errors[answer.error_code.name] = errors.get(answer.error_code.name, 0) + 1

    cpu = time.process_time()
    begin = time.perf_counter()
    await asyncio.gather(*(worker(p) for p in where for _ in range(in_flight)))
    elapsed = time.perf_counter() - begin
    cpu = time.process_time() - cpu
    for client in clients.values():
        await client.close()
    return {"records_per_s": acknowledged * per_batch / elapsed, "cpu_us_per_record": cpu / (sent * per_batch) * 1e6,
            "records_per_batch": per_batch, "errors": errors}


async def sdk_throughput(bootstrap: str, topic: str, value: bytes, records: int, batch_size_bytes: int,
                         acks: str) -> dict:
    async with Producer(bootstrap=bootstrap, acks=acks, batch_size_bytes=batch_size_bytes) as producer:
        await producer.send_and_wait(topic, value)   # metadata and connections first
        cpu = time.process_time()
        begin = time.perf_counter()
        last = None
        for i in range(records):
            last = await producer.send(topic, value)
            if i & 255 == 0:
                await asyncio.sleep(0)
        await producer.flush()
        elapsed = time.perf_counter() - begin
        cpu = time.process_time() - cpu
        last.result()
    return {"records_per_s": records / elapsed, "cpu_us_per_record": cpu / records * 1e6}


async def sync_latency(bootstrap: str, topic: str, value: bytes, sends: int, acks: str,
                       idempotent: bool | None = None) -> dict:
    """p50/p99 of one record sent and awaited at a time, alternating an SDK send_and_wait and a
    wire request (a fresh 1-record batch each, as a synchronous sender builds one) so that both
    see the same load."""
    where = await leaders(parse_bootstrap(bootstrap), topic)
    client = await WireClient.connect(*where[0])
    sdk, wire = [], []
    try:
        async with Producer(bootstrap=bootstrap, acks=acks, enable_idempotence=idempotent) as producer:
            await producer.send_and_wait(topic, value, partition=0)
            async def by_sdk() -> float:
                t0 = time.perf_counter()
                await producer.send_and_wait(topic, value, partition=0)
                return (time.perf_counter() - t0) * 1000

            async def by_wire() -> float:
                t0 = time.perf_counter()
                batch = build_batch([value], timestamp_ms=int(time.time() * 1000))
                request = ProduceRequest(acks=int(parse_acks(acks)), timeout_ms=30_000, topics=(ProduceTopic(
                    topic=topic, partitions=(ProducePartition(partition=0, records=batch),)),))
                await client.request(request)
                return (time.perf_counter() - t0) * 1000

            for i in range(sends):
                # Which goes first alternates: the second of a pair may find the followers in step.
                if i % 2:
                    wire.append(await by_wire())
                    sdk.append(await by_sdk())
                else:
                    sdk.append(await by_sdk())
                    wire.append(await by_wire())
    finally:
        await client.close()
    return {"sdk_p50_ms": pct(sdk, 0.5), "sdk_p99_ms": pct(sdk, 0.99), "wire_p50_ms": pct(wire, 0.5),
            "wire_p99_ms": pct(wire, 0.99),
            "added_p50_ms": statistics.median(a - b for a, b in zip(sdk, wire))}


async def main_async(args: argparse.Namespace) -> int:
    from dataplane.client.admin import AdminClient
    async with AdminClient() as admin:
        await admin.create_topic(args.topic, partitions=3, replication_factor=3, exist_ok=True)
    bootstrap = args.bootstrap or default_bootstrap()
    addrs = parse_bootstrap(bootstrap)
    value = os.urandom(args.record_size // 2).hex().encode().ljust(args.record_size, b"x")[:args.record_size]
    wires, sdks = [], []
    for round_ in range(args.rounds):
        w = await wire_throughput(addrs, args.topic, value, args.records, args.batch_size_bytes,
                                  int(parse_acks(args.acks)), 5)
        s = await sdk_throughput(bootstrap, args.topic, value, args.records, args.batch_size_bytes, args.acks)
        wires.append(w)
        sdks.append(s)
        print(f"round {round_ + 1}: wire {w['records_per_s']:,.0f} rec/s ({w['records_per_batch']} records/batch, "
              f"{w['cpu_us_per_record']:.2f} us CPU/rec{', errors ' + str(w['errors']) if w['errors'] else ''}); "
              f"sdk {s['records_per_s']:,.0f} rec/s ({s['cpu_us_per_record']:.2f} us CPU/rec); "
              f"load {os.getloadavg()[0]:.2f}", flush=True)
    if args.rounds:
        wire_rate = statistics.median(w["records_per_s"] for w in wires)
        sdk_rate = statistics.median(s["records_per_s"] for s in sdks)
        print(f"median of {args.rounds}: wire {wire_rate:,.0f} rec/s, sdk {sdk_rate:,.0f} rec/s, "
              f"wire/sdk {wire_rate / sdk_rate:.2f}x; sdk client CPU "
              f"{statistics.median(s['cpu_us_per_record'] for s in sdks):.2f} us/record "
              f"({args.record_size} B records, {args.batch_size_bytes} B batches, acks={args.acks})")
    if args.sync_sends:
        lat = await sync_latency(bootstrap, args.topic, value, args.sync_sends, args.acks,
                                 False if args.no_idempotence else None)
        print(f"one record at a time ({args.sync_sends} sends, acks={args.acks}): sdk send_and_wait "
              f"p50 {lat['sdk_p50_ms']:.2f} ms p99 {lat['sdk_p99_ms']:.2f} ms; wire p50 {lat['wire_p50_ms']:.2f} ms "
              f"p99 {lat['wire_p99_ms']:.2f} ms; median difference {lat['added_p50_ms']:.2f} ms")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bootstrap", help="HOST:PORT,... (default: the `biplane up` cluster)")
    p.add_argument("--topic", default="bench-producer")
    p.add_argument("--records", type=int, default=100_000)
    p.add_argument("--record-size", type=int, default=1024)
    p.add_argument("--batch-size-bytes", type=int, default=1_048_576)
    p.add_argument("--acks", default="all", choices=("0", "1", "all"))
    p.add_argument("--rounds", type=int, default=3, help="throughput rounds (0 skips the throughput part)")
    p.add_argument("--no-idempotence", action="store_true", help="SDK producer without idempotence (the wire "
                   "producer never uses it)")
    p.add_argument("--sync-sends", type=int, default=300, help="0 skips the latency part")
    args = p.parse_args()
    if args.no_idempotence and args.rounds:
        p.error("--no-idempotence applies to the latency part only; add --rounds 0")
    if args.acks == "0":
        p.error("--acks 0 gets no answers to time; use 1 or all")
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
