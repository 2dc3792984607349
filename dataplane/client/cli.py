"""`biplane produce`, `biplane consume` and `biplane bench`: data tools over the SDK.

    echo hello | biplane produce events
    printf 'user-1:hi\\n' | biplane produce events --key-separator :
    biplane consume events --from-beginning --max-records 10 --format json
    biplane bench --records 20000 --record-size 1024 --acks all

Each takes --bootstrap HOST:PORT[,...] (env BIPLANE_BOOTSTRAP); without it they use the
cluster `biplane up` wrote to ./.biplane/cluster.json (or $BIPLANE_CLUSTER).
"""
from __future__ import annotations

import argparse
import asyncio
import functools
import json
import math
import os
import sys
import time
from typing import Any

from common import eventloop
from common.errors import BiplaneError
from dataplane.client.consumer import Consumer
from dataplane.client.producer import Producer
from dataplane.client.records import TopicPartition


def _bootstrap_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bootstrap", default=os.environ.get("BIPLANE_BOOTSTRAP"),
                   help="broker addresses HOST:PORT[,...] (env BIPLANE_BOOTSTRAP; default: the `biplane up` cluster)")


def _fail(prog: str, exc: BaseException) -> int:
    print(f"{prog}: {exc}", file=sys.stderr)
    return 1


# ------------------------------------------------------------------ produce

def produce_main(argv: list[str], prog: str) -> int:
    p = argparse.ArgumentParser(prog=prog, description="Send lines from stdin to TOPIC, one record per line.")
    p.add_argument("topic")
    _bootstrap_arg(p)
    p.add_argument("--key-separator", help="split each line at the first SEP into key and value")
    p.add_argument("--acks", default="all", choices=("0", "1", "all"), help="default all")
    p.add_argument("--partition", type=int, help="send every record to this partition")
    p.add_argument("--compression", default="none", choices=("none", "gzip", "snappy", "lz4", "zstd"))
    p.add_argument("--linger-ms", type=int, default=5)
    args = p.parse_args(argv)
    try:
        return eventloop.run(_produce(args, prog))
    except (BiplaneError, ValueError, TypeError) as exc:
        return _fail(prog, exc)
    except KeyboardInterrupt:
        return 130


async def _produce(args: argparse.Namespace, prog: str) -> int:
    sent = failed = 0
    async with Producer(bootstrap=args.bootstrap, acks=args.acks, compression=args.compression,
                        linger_ms=args.linger_ms) as producer:
        futures = []
        loop = asyncio.get_running_loop()
        sep = args.key_separator.encode() if args.key_separator is not None else None
        lines: asyncio.Queue = asyncio.Queue(maxsize=10_000)
        _start_stdin_reader(loop, lines)
        while (line := await lines.get()) is not None:
            line = line.rstrip(b"\r\n")
            key = None
            if sep is not None and sep in line:
                key, line = line.split(sep, 1)
            futures.append(await producer.send(args.topic, line, key=key, partition=args.partition))
            if len(futures) >= 1000:
                s, f = await _settle(futures, prog)
                sent, failed, futures = sent + s, failed + f, []
        s, f = await _settle(futures, prog)
        sent, failed = sent + s, failed + f
    print(f"{prog}: sent {sent} record(s) to {args.topic}" + (f", {failed} failed" if failed else ""), file=sys.stderr)
    return 1 if failed else 0


def _start_stdin_reader(loop: asyncio.AbstractEventLoop, queue: asyncio.Queue) -> None:
    """Feed stdin's lines into `queue` from a thread (None at the end). The queue is bounded, so a
    fast stdin waits for the producer instead of filling memory."""
    import threading

    def read() -> None:
        for line in iter(sys.stdin.buffer.readline, b""):
            asyncio.run_coroutine_threadsafe(queue.put(line), loop).result()
        asyncio.run_coroutine_threadsafe(queue.put(None), loop).result()
    threading.Thread(target=read, name="stdin-reader", daemon=True).start()


async def _settle(futures: list, prog: str) -> tuple[int, int]:
    results = await asyncio.gather(*futures, return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    for e in errors[:3]:
        print(f"{prog}: {e}", file=sys.stderr)
    return len(results) - len(errors), len(errors)


# ------------------------------------------------------------------ consume

def _text(data: bytes | None) -> str | None:
    return None if data is None else data.decode("utf-8", errors="backslashreplace")


def format_record(record: Any, fmt: str, print_key: bool) -> str:
    if fmt == "json":
        doc = {"topic": record.topic, "partition": record.partition, "offset": record.offset,
               "timestamp_ms": record.timestamp_ms, "key": _text(record.key), "value": _text(record.value),
               "headers": {k: _text(v) for k, v in record.headers}}
        return json.dumps(doc, ensure_ascii=False)
    value = _text(record.value) or ""
    return f"{_text(record.key)}\t{value}" if print_key else value


def consume_main(argv: list[str], prog: str) -> int:
    p = argparse.ArgumentParser(prog=prog, description="Print TOPIC's records (committed ones: up to the high watermark).")
    p.add_argument("topic")
    _bootstrap_arg(p)
    start = p.add_mutually_exclusive_group()
    start.add_argument("--from-beginning", action="store_true", help="start at the earliest offset (default: the end)")
    start.add_argument("--offset", type=int, help="start at this offset (in every partition read)")
    p.add_argument("--partition", type=int, action="append", help="read only this partition (repeatable)")
    p.add_argument("--max-records", type=int, help="stop after this many records")
    p.add_argument("--idle-timeout-ms", type=int, help="stop when nothing arrives for this long")
    p.add_argument("--format", default="text", choices=("text", "json"), help="text: the value per line; json: one object per line")
    p.add_argument("--print-key", action="store_true", help="text format: print KEY<TAB>VALUE")
    args = p.parse_args(argv)
    if args.max_records is not None and args.max_records < 1:
        p.error(f"--max-records {args.max_records} must be at least 1")
    if args.offset is not None and args.offset < 0:
        p.error(f"--offset {args.offset} must be >= 0")
    try:
        return eventloop.run(_consume(args))
    except (BiplaneError, ValueError) as exc:
        return _fail(prog, exc)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


async def _consume(args: argparse.Namespace) -> int:
    count = 0
    async with Consumer(bootstrap=args.bootstrap, from_beginning=args.from_beginning) as consumer:
        if args.partition:
            await consumer.assign([TopicPartition(args.topic, p) for p in args.partition])
        else:
            await consumer.assign_topic(args.topic)
        if args.offset is not None:
            for tp in consumer.assignment():
                await consumer.seek(tp, args.offset)
        idle_since = time.monotonic()
        while args.max_records is None or count < args.max_records:
            want = None if args.max_records is None else args.max_records - count
            records = await consumer.poll(500, max_records=want)
            for record in records:
                sys.stdout.write(format_record(record, args.format, args.print_key) + "\n")
            sys.stdout.flush()
            count += len(records)
            if records:
                idle_since = time.monotonic()
            elif args.idle_timeout_ms is not None and (time.monotonic() - idle_since) * 1000 >= args.idle_timeout_ms:
                break
    return 0


# ------------------------------------------------------------------ bench

def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    # Nearest rank: the smallest value with at least q of the values at or below it.
    index = min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values) - 1e-9) - 1))
    return sorted_values[index]


class Progress:
    def __init__(self, total: int, label: str, enabled: bool) -> None:
        self.total, self.label, self.enabled = total, label, enabled
        self.started = time.perf_counter()
        self.last = 0.0

    def show(self, done: int, force: bool = False) -> None:
        now = time.perf_counter()
        if not self.enabled or (not force and now - self.last < 0.2):
            return
        self.last = now
        width = 30
        filled = int(width * done / max(1, self.total))
        rate = done / max(1e-9, now - self.started)
        sys.stderr.write(f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] {done}/{self.total} "
                         f"{rate:,.0f} rec/s ")
        sys.stderr.flush()

    def end(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")


def bench_main(argv: list[str], prog: str) -> int:
    p = argparse.ArgumentParser(prog=prog, description="Load generator: produce (then consume) and print "
                                "records/s, MB/s and send-to-ack latency percentiles.")
    _bootstrap_arg(p)
    p.add_argument("--topic", default="bench", help="default bench; created if missing")
    p.add_argument("--records", type=int, default=50_000)
    p.add_argument("--record-size", type=int, default=1024, help="value bytes per record (default 1024)")
    p.add_argument("--acks", default="all", choices=("0", "1", "all"))
    p.add_argument("--partitions", type=int, default=3, help="when creating the topic (default 3)")
    p.add_argument("--replication-factor", type=int, default=3, help="when creating the topic (default 3)")
    p.add_argument("--batch-size-bytes", type=int, default=None, help="(producer default)")
    p.add_argument("--in-flight", type=int, default=None, help="batches in flight per partition (producer default)")
    p.add_argument("--linger-ms", type=int, default=None, help="(producer default)")
    p.add_argument("--buffer-memory-bytes", type=int, default=None, help="(producer default)")
    p.add_argument("--compression", default="none", choices=("none", "gzip", "snappy", "lz4", "zstd"))
    p.add_argument("--rate", type=float, help="send at most this many records/s (default: as fast as possible)")
    p.add_argument("--no-consume", action="store_true", help="skip the consumer phase")
    p.add_argument("--json", action="store_true", help="print the results as one JSON object")
    p.add_argument("--controller", help="admin API URL(s) for creating the topic (default: the `biplane up` cluster)")
    p.add_argument("--token", default=os.environ.get("BIPLANE_ADMIN_TOKEN"))
    args = p.parse_args(argv)
    if args.records < 1 or args.record_size < 0:
        p.error("--records must be >= 1 and --record-size >= 0")
    if args.rate is not None and args.rate <= 0:
        p.error(f"--rate {args.rate} must be positive")
    try:
        result = eventloop.run(_bench(args))
    except (BiplaneError, ValueError) as exc:
        return _fail(prog, exc)
    except KeyboardInterrupt:
        return 130
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        pr = result["produce"]
        print(f"produce  {pr['records']} records x {args.record_size} B, acks={args.acks}: "
              f"{pr['records_per_s']:,.0f} records/s, {pr['mb_per_s']:.2f} MB/s; latency ms "
              f"p50 {pr['latency_ms_p50']:.1f}  p99 {pr['latency_ms_p99']:.1f}  p999 {pr['latency_ms_p999']:.1f}  "
              f"max {pr['latency_ms_max']:.1f}; client CPU {pr['client_cpu_us_per_record']:.1f} us/record "
              f"(batch {pr['batch_size_bytes']} B, linger {pr['linger_ms']} ms, buffer {pr['buffer_memory_bytes']} B)"
              + (f"; {pr['failed']} failed" if pr["failed"] else ""))
        if "consume" in result:
            co = result["consume"]
            print(f"consume  {co['records']} records: {co['records_per_s']:,.0f} records/s, {co['mb_per_s']:.2f} MB/s")
    return 1 if result["produce"]["failed"] else 0


async def _ensure_topic(args: argparse.Namespace) -> None:
    from dataplane.client.admin import AdminClient
    async with AdminClient(args.controller, args.token) as admin:
        await admin.create_topic(args.topic, partitions=args.partitions, replication_factor=args.replication_factor,
                                 exist_ok=True)


async def _bench(args: argparse.Namespace) -> dict[str, Any]:
    await _ensure_topic(args)
    tty = sys.stderr.isatty()
    value = os.urandom(args.record_size // 2).hex().encode().ljust(args.record_size, b"x")[:args.record_size]
    latencies: list[float] = []
    options = {name: given for name, given in (("in_flight_per_partition_max", args.in_flight),
                                               ("batch_size_bytes", args.batch_size_bytes),
                                               ("linger_ms", args.linger_ms),
                                               ("buffer_memory_bytes", args.buffer_memory_bytes)) if given is not None}
    async with Producer(bootstrap=args.bootstrap, acks=args.acks, compression=args.compression,
                        **options) as producer:
        consumer = Consumer(bootstrap=args.bootstrap)
        await consumer.start()
        tps = await consumer.assign_topic(args.topic)
        starts = await consumer.end_offsets(tps)
        progress = Progress(args.records, "produce", tty)
        # Latency is sampled (every record up to 25,000, then evenly spread), like Kafka's
        # producer-perf-test: a callback on each of millions of records would cost more
        # client time than the producer itself.
        sample_every = max(1, args.records // 25_000)
        settings = {"batch_size_bytes": producer.batch_size_bytes, "linger_ms": producer.linger_ms,
                    "buffer_memory_bytes": producer.buffer_memory_bytes}
        sent_before = producer.records_sent
        begin = time.perf_counter()
        cpu_begin = time.process_time()

        def on_sampled(sent_at: float, future: asyncio.Future) -> None:
            if not future.cancelled() and future.exception() is None:
                latencies.append((time.perf_counter() - sent_at) * 1000)

        for i in range(args.records):
            if args.rate is not None:
                ahead = begin + i / args.rate - time.perf_counter()
                if ahead > 0.001:   # sleep in steps of at least 1 ms: a timer per record costs more than a send
                    await asyncio.sleep(ahead)
            future = await producer.send(args.topic, value)
            if i % sample_every == 0:
                future.add_done_callback(functools.partial(on_sampled, time.perf_counter()))
            if i % 256 == 0:
                progress.show(producer.records_sent - sent_before)
                await asyncio.sleep(0)
        await producer.flush()
        elapsed = time.perf_counter() - begin
        cpu = time.process_time() - cpu_begin
        ok = producer.records_sent - sent_before
        failed = args.records - ok
        progress.show(ok, force=True)
        progress.end()
    latencies.sort()
    result: dict[str, Any] = {"produce": {
        "records": ok, "failed": failed, "seconds": elapsed, "records_per_s": ok / elapsed,
        "mb_per_s": ok * args.record_size / elapsed / 1e6, "latency_ms_p50": percentile(latencies, 0.50),
        "latency_ms_p99": percentile(latencies, 0.99), "latency_ms_p999": percentile(latencies, 0.999),
        "latency_ms_max": latencies[-1] if latencies else float("nan"), "acks": args.acks,
        "client_cpu_us_per_record": cpu / args.records * 1e6, "latency_samples": len(latencies),
        "event_loop": eventloop.loop_name(), "batch_size_bytes": settings["batch_size_bytes"],
        "linger_ms": settings["linger_ms"], "buffer_memory_bytes": settings["buffer_memory_bytes"]}}
    if not args.no_consume:
        async with consumer:
            for tp, offset in starts.items():
                await consumer.seek(tp, offset)
            progress = Progress(ok, "consume", tty)
            got = 0
            begin = time.perf_counter()
            idle_since = begin
            while got < ok:
                records = await consumer.poll(500)
                got += len(records)
                progress.show(got)
                now = time.perf_counter()
                if records:
                    idle_since = now
                elif now - idle_since > 10:
                    break
            elapsed = time.perf_counter() - begin
            progress.show(got, force=True)
            progress.end()
        result["consume"] = {"records": got, "seconds": elapsed, "records_per_s": got / elapsed,
                             "mb_per_s": got * args.record_size / elapsed / 1e6}
    else:
        await consumer.close()
    return result
