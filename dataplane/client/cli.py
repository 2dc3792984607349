"""`biplane produce`, `biplane consume` and `biplane bench`: data tools over the SDK.

    echo hello | biplane produce events
    printf 'user-1:hi\\n' | biplane produce events --key-separator :
    biplane consume events --from-beginning --max-records 10 --format json
    biplane bench --records 20000 --record-size 1024 --acks all

Each takes --bootstrap HOST:PORT[,...] (env BIPLANE_BOOTSTRAP) or --data-dir DIR; without
them they use the cluster `biplane up` wrote to $BIPLANE_CLUSTER, else ./.biplane/cluster.json.
"""
from __future__ import annotations

import argparse
import asyncio
import functools
import json
import math
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from common import cli_exit, eventloop
from common.errors import BiplaneError, NoBrokersError, NoClusterError
from common.wire import ConnectionClosedError
from dataplane.client.consumer import Consumer
from dataplane.client.futures import RecordFuture
from dataplane.client.producer import Producer
from dataplane.client.records import TopicPartition

TIMEOUT_MS_DEFAULT = 30_000
IDLE_TIMEOUT_MS_DEFAULT = 3_000     # consume --max-records: how long to wait at the end for more
STALL_NOTICE_S = 5.0                # produce: say so when nothing was acknowledged for this long
STDIN_CHUNK_BYTES = 65_536
STDIN_QUEUE_CHUNKS_MAX = 64         # bounds what is read ahead of the producer: 4 MiB

ADDRESS_EPILOG = """\
Which brokers: --bootstrap, else --data-dir DIR (the cluster.json `biplane up` wrote there),
else $BIPLANE_BOOTSTRAP, else the cluster.json $BIPLANE_CLUSTER names (the file or its
directory), else ./.biplane/cluster.json."""


@dataclass(frozen=True, kw_only=True)
class Brokers:
    bootstrap: str
    hint: str   # what to do when none answers, for the error message


def _address_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bootstrap", metavar="HOST:PORT[,...]",
                   help="broker addresses (env BIPLANE_BOOTSTRAP; default: the `biplane up` cluster's)")
    p.add_argument("--data-dir", metavar="DIR",
                   help="the data directory of a `biplane up` cluster, whose cluster.json names the brokers "
                        "(env BIPLANE_CLUSTER; default ./.biplane)")


def resolve_brokers(args: argparse.Namespace) -> Brokers:
    """The bootstrap addresses by the order ADDRESS_EPILOG gives. Raises NoClusterError."""
    from dataplane.client.discovery import default_bootstrap, not_answering_hint
    given = args.bootstrap or (None if args.data_dir else os.environ.get("BIPLANE_BOOTSTRAP"))
    if given:
        return Brokers(bootstrap=given, hint="; is a broker running there? A `biplane up` cluster starts with "
                                             "`biplane up`, and --data-dir DIR finds it without an address")
    return Brokers(bootstrap=default_bootstrap(args.data_dir), hint=not_answering_hint(args.data_dir, "brokers"))


def _check_timeout(p: argparse.ArgumentParser, name: str, value: int | None, low: int = 1) -> None:
    if value is not None and value < low:
        p.error(f"{name} {value} must be at least {low}")


def _run(prog: str, main: Any, brokers_hint: str = "") -> int:
    """Run a command's coroutine; the SDK's errors become one line on stderr and exit 1."""
    try:
        return int(cli_exit.run_async(main))
    except (NoBrokersError, ConnectionClosedError) as exc:
        return _fail(prog, f"{exc}{brokers_hint}")
    except (BiplaneError, ValueError, TypeError) as exc:
        return _fail(prog, exc)


def _fail(prog: str, exc: BaseException | str) -> int:
    print(f"{prog}: {exc}", file=sys.stderr)
    return 1


def _note(prog: str, text: str) -> None:
    print(f"{prog}: {text}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------ produce

def produce_main(argv: list[str], prog: str) -> int:
    p = argparse.ArgumentParser(prog=prog, description="Send lines from stdin to TOPIC, one record per line, "
                                "and wait for each to be acknowledged. Ctrl-C stops reading, sends what was "
                                "read, and exits 130.", epilog=ADDRESS_EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("topic", help="the topic to send to (it must exist: `biplane topic create`)")
    _address_args(p)
    p.add_argument("--key-separator", metavar="SEP", type=_separator, help="split each line at the first SEP into key and value "
                   "(a line without SEP has no key)")
    p.add_argument("--acks", default="all", choices=("0", "1", "all"),
                   help="0: no answer; 1: the leader wrote it; all: committed on the in-sync replicas (default all)")
    p.add_argument("--partition", type=_partition_number, help="send every record to this partition (default: by key, or "
                   "spread when there is none)")
    p.add_argument("--compression", default="none", choices=("none", "gzip", "snappy", "lz4", "zstd"),
                   help="compress batches with this codec (default none)")
    p.add_argument("--linger-ms", type=int, default=5, help="how long a batch waits for more records before "
                   "it is sent (default 5)")
    p.add_argument("--timeout-ms", type=int, default=TIMEOUT_MS_DEFAULT,
                   help="a record not acknowledged within this long fails, and so does a broker that does not "
                        f"answer (default {TIMEOUT_MS_DEFAULT})")
    args = p.parse_args(argv)
    _check_timeout(p, "--timeout-ms", args.timeout_ms)
    _check_timeout(p, "--linger-ms", args.linger_ms, 0)
    try:
        brokers = resolve_brokers(args)
    except NoClusterError as exc:
        return _fail(prog, f"{exc} (for brokers: --bootstrap HOST:PORT)")
    return _run(prog, _produce(args, prog, brokers.bootstrap), brokers.hint)


@dataclass(kw_only=True)
class Tally:
    sent: int = 0        # handed to the producer
    acknowledged: int = 0
    failed: int = 0


def _partition_number(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a partition number (0 or more)") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is not a partition number (0 or more)")
    return value


def _separator(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("must not be empty: give what stands between key and value, e.g. ':'")
    return text


async def _produce(args: argparse.Namespace, prog: str, bootstrap: str) -> int:
    tally = Tally()
    futures: list[RecordFuture] = []
    interrupted = failed_early = False

    def settled(future: RecordFuture) -> None:
        if future.cancelled() or future.exception() is not None:
            tally.failed += 1
        else:
            tally.acknowledged += 1

    # Each stage below is bounded by --timeout-ms: the first request for a producer id
    # (max_block_ms), a request, and a record's whole delivery.
    producer = Producer(bootstrap=bootstrap, acks=args.acks, compression=args.compression,
                        linger_ms=args.linger_ms, max_block_ms=args.timeout_ms,
                        request_timeout_ms=args.timeout_ms, delivery_timeout_ms=args.timeout_ms)
    watcher: asyncio.Task | None = None
    try:
        async with producer:
            watcher = asyncio.get_running_loop().create_task(_report_stalls(prog, tally, args.timeout_ms))
            sep = args.key_separator.encode() if args.key_separator is not None else None
            lines: asyncio.Queue[list[bytes] | None] = asyncio.Queue(maxsize=STDIN_QUEUE_CHUNKS_MAX)
            _start_stdin_reader(asyncio.get_running_loop(), lines)
            while (chunk := await lines.get()) is not None:
                for line in chunk:
                    key = None
                    if sep is not None and sep in line:
                        key, line = line.split(sep, 1)
                    future = await producer.send(args.topic, line, key=key, partition=args.partition)
                    future.add_done_callback(settled)
                    futures.append(future)
                    tally.sent += 1
                if len(futures) >= 1000:
                    await _settle(futures, prog)
                    futures = []
            await _settle(futures, prog)
    except asyncio.CancelledError:
        # Ctrl-C or SIGTERM: leaving `async with` above flushed what was read (bounded by
        # --timeout-ms); say what became of it before the exit code says "interrupted".
        interrupted = True
        raise
    except BaseException:
        failed_early = tally.sent == 0   # then the error alone says it
        raise
    finally:
        if watcher is not None:
            watcher.cancel()
        if not failed_early:
            unsettled = tally.sent - tally.acknowledged - tally.failed
            text = f"sent {tally.acknowledged} record(s) to {args.topic}"
            text += f", {tally.failed} failed" if tally.failed else ""
            text += f", {unsettled} not acknowledged" if unsettled else ""
            _note(prog, text + (" (interrupted)" if interrupted else ""))
    return 1 if tally.failed else 0


async def _report_stalls(prog: str, tally: Tally, timeout_ms: int) -> None:
    """Say so when records wait for acknowledgements with none coming, instead of a silence
    that looks like a hang (a leader being elected, a broker that stopped answering)."""
    last, stalled_s = tally.acknowledged + tally.failed, 0.0
    while True:
        await asyncio.sleep(STALL_NOTICE_S)
        done = tally.acknowledged + tally.failed
        waiting = tally.sent - done
        if done != last or waiting == 0:
            last, stalled_s = done, 0.0
            continue
        stalled_s += STALL_NOTICE_S
        _note(prog, f"{waiting} record(s) have waited {stalled_s:.0f} s for the cluster's acknowledgement "
                    f"(a leader election, or a broker not answering); each fails after --timeout-ms {timeout_ms}")


def _start_stdin_reader(loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[list[bytes] | None]) -> None:
    """Feed stdin's lines, a chunk's worth at a time, into `queue` from a thread (None at the end).
    The queue is bounded, so a fast stdin waits for the producer instead of filling memory.

    The thread reads the file descriptor with os.read, not sys.stdin.buffer: a daemon thread
    blocked in a buffered reader holds its lock, and the interpreter aborts at exit ("Fatal
    Python error: could not acquire lock") when Ctrl-C ends the process during that read."""
    fd = sys.stdin.fileno()

    def put(item: list[bytes] | None) -> bool:
        try:
            asyncio.run_coroutine_threadsafe(queue.put(item), loop).result()
            return True
        except (RuntimeError, asyncio.CancelledError, Exception):
            return False   # the loop is closing: the command is over

    def read() -> None:
        pending = b""
        while True:
            try:
                data = os.read(fd, STDIN_CHUNK_BYTES)
            except OSError:
                data = b""
            if not data:
                break
            *complete, pending = (pending + data).split(b"\n")
            if complete and not put([line.rstrip(b"\r") for line in complete]):
                return
        put([pending.rstrip(b"\r")] if pending else [])
        put(None)
    threading.Thread(target=read, name="stdin-reader", daemon=True).start()


async def _settle(futures: list[RecordFuture], prog: str) -> None:
    if not futures:
        return
    # One future of our own for all of them, not gather: Ctrl-C cancels this wait, never the
    # records' futures, which the producer's flush on the way out still settles. gather
    # cancelled them, so records the cluster then acknowledged were counted as failed.
    all_done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    remaining = len(futures)

    def one_done(_: RecordFuture) -> None:
        nonlocal remaining
        remaining -= 1
        if remaining == 0 and not all_done.done():
            all_done.set_result(None)
    for future in futures:
        future.add_done_callback(one_done)
    await all_done
    errors = [e for f in futures if not f.cancelled() and (e := f.exception()) is not None]
    for e in errors[:3]:
        _note(prog, str(e))


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


CONSUME_EPILOG = f"""\
When it stops: after --max-records records; or, with --max-records or --idle-timeout-ms, once
it has read to the end of every partition it reads and nothing new came for the idle timeout
(default {IDLE_TIMEOUT_MS_DEFAULT} ms with --max-records; 0 stops as soon as it is at the end);
without either it follows the topic until Ctrl-C (exit 130). Starting at or past a partition's
end is said on stderr.

Offsets: the first offset of a new partition, and the first after each change of leader, holds
the new leader's epoch-start control record (Kafka's LEADER_CHANGE control batch). Consumers
skip control records, so a new partition's first record is at offset 1, and offsets may have
such gaps later on.

{ADDRESS_EPILOG}"""


def consume_main(argv: list[str], prog: str) -> int:
    p = argparse.ArgumentParser(prog=prog, description="Print TOPIC's records (committed ones: up to the high "
                                "watermark), one per line.", epilog=CONSUME_EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("topic", help="the topic to read")
    _address_args(p)
    start = p.add_mutually_exclusive_group()
    start.add_argument("--from-beginning", action="store_true",
                       help="start at the earliest offset (default: the end, so only new records)")
    start.add_argument("--offset", type=int, help="start at this offset (in every partition read)")
    p.add_argument("--partition", type=int, action="append", help="read only this partition (repeatable; "
                   "default: all)")
    p.add_argument("--max-records", type=int, help="stop after this many records, or at the end (see below)")
    p.add_argument("--idle-timeout-ms", type=int,
                   help="stop once at the end and nothing new came for this long (default: follow forever; "
                        f"{IDLE_TIMEOUT_MS_DEFAULT} with --max-records)")
    p.add_argument("--timeout-ms", type=int, default=TIMEOUT_MS_DEFAULT,
                   help=f"fail when the brokers do not answer within this long (default {TIMEOUT_MS_DEFAULT})")
    p.add_argument("--format", default="text", choices=("text", "json"),
                   help="text: the value per line; json: one object per line with every field")
    p.add_argument("--print-key", action="store_true", help="text format: print KEY<TAB>VALUE")
    args = p.parse_args(argv)
    if args.max_records is not None and args.max_records < 1:
        p.error(f"--max-records {args.max_records} must be at least 1")
    if args.offset is not None and args.offset < 0:
        p.error(f"--offset {args.offset} must be >= 0")
    _check_timeout(p, "--idle-timeout-ms", args.idle_timeout_ms, 0)
    _check_timeout(p, "--timeout-ms", args.timeout_ms)
    if args.idle_timeout_ms is None and args.max_records is not None:
        args.idle_timeout_ms = IDLE_TIMEOUT_MS_DEFAULT
    try:
        brokers = resolve_brokers(args)
    except NoClusterError as exc:
        return _fail(prog, f"{exc} (for brokers: --bootstrap HOST:PORT)")
    return _run(prog, _consume(args, prog, brokers.bootstrap), brokers.hint)


def _describe_start(tps: list[TopicPartition], starts: dict[TopicPartition, int],
                    ends: dict[TopicPartition, int]) -> str | None:
    """The stderr note for partitions that start at or past their end (None when none does)."""
    at_end = [tp for tp in tps if starts[tp] >= ends[tp]]
    if not at_end:
        return None
    shown = [f"{tp.topic}/{tp.partition} has no records from offset {starts[tp]} (end offset {ends[tp]})"
             if starts[tp] == ends[tp] else
             f"{tp.topic}/{tp.partition}: offset {starts[tp]} is past its end offset {ends[tp]}; reading from the end"
             for tp in at_end[:4]]
    if len(at_end) > 4:
        shown.append(f"{len(at_end) - 4} more partition(s) of {tps[0].topic} are at their end")
    return "partition " + "; ".join(shown)


def _before(position: int | None, end: int) -> bool:
    """Whether a partition has records past `position` (None: a seek not yet resolved)."""
    return position is None or position < end


async def _consume(args: argparse.Namespace, prog: str, bootstrap: str) -> int:
    count = 0
    following = args.idle_timeout_ms is None
    async with Consumer(bootstrap=bootstrap, from_beginning=args.from_beginning,
                        request_timeout_ms=args.timeout_ms) as consumer:
        if args.partition:
            tps = [TopicPartition(args.topic, p) for p in sorted(set(args.partition))]
            await consumer.assign(tps)
        else:
            tps = sorted(await consumer.assign_topic(args.topic), key=lambda tp: tp.partition)
        ends = await consumer.end_offsets(tps)
        if args.offset is not None:
            starts = {tp: args.offset for tp in tps}
            beginnings = await consumer.beginning_offsets(tps)
            for tp in tps:
                # Below the log start (retention deleted it) the broker would answer out of range
                # and the consumer reset to the end, skipping everything: start at the beginning.
                starts[tp] = max(args.offset, beginnings[tp]) if args.offset <= ends[tp] else ends[tp]
                await consumer.seek(tp, starts[tp])
            offset = args.offset
            note = _describe_start(tps, {tp: offset if offset > ends[tp] else starts[tp] for tp in tps},
                                   ends)
        elif args.from_beginning:
            starts = await consumer.beginning_offsets(tps)
            for tp in tps:
                await consumer.seek(tp, starts[tp])
            note = _describe_start(tps, starts, ends)
        else:
            starts = dict(ends)
            for tp in tps:
                await consumer.seek(tp, starts[tp])
            note = None
            _note(prog, f"reading {args.topic} from its end: only records produced from now on "
                        "(--from-beginning for those already there)")
        if note is not None:
            _note(prog, note + ("; waiting for new ones" if following else
                                f"; waiting {args.idle_timeout_ms} ms for new ones" if args.idle_timeout_ms
                                else "; stopping (--idle-timeout-ms 0)"))
        idle_since = progress_at = time.monotonic()
        positions = {tp: consumer.position(tp) for tp in tps}
        while args.max_records is None or count < args.max_records:
            want = None if args.max_records is None else args.max_records - count
            records = await consumer.poll(500, max_records=want)
            now = time.monotonic()
            if records:
                sys.stdout.write("".join(format_record(r, args.format, args.print_key) + "\n" for r in records))
                sys.stdout.flush()
                count += len(records)
                idle_since = progress_at = now
                continue
            for tp in tps:
                hw = consumer.highwater(tp)
                if hw is not None:
                    ends[tp] = hw
            moved = {tp: consumer.position(tp) for tp in tps}
            if moved != positions:
                positions, progress_at = moved, now
            behind = [tp for tp in tps if _before(positions[tp], ends[tp])]
            if behind and (now - progress_at) * 1000 >= args.timeout_ms:
                # The consumer retries failed fetches quietly; a partition that has records to
                # give and gives none for this long has a leader that does not answer.
                tp = behind[0]
                raise ConnectionClosedError(
                    f"partition {tp.topic}/{tp.partition} has records up to offset {ends[tp]} but none came from "
                    f"offset {positions[tp]} within --timeout-ms {args.timeout_ms}: its leader does not answer")
            if not following and not behind and (now - idle_since) * 1000 >= args.idle_timeout_ms:
                if args.max_records is not None:
                    _note(prog, f"read {count} of --max-records {args.max_records}: at the end of {args.topic} "
                                f"and nothing new for {args.idle_timeout_ms} ms (--idle-timeout-ms)")
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
                                "records/s, MB/s and send-to-ack latency percentiles.", epilog=ADDRESS_EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    _address_args(p)
    p.add_argument("--topic", default="bench", help="default bench; created if missing")
    p.add_argument("--records", type=int, default=50_000, help="how many records to produce (default 50000)")
    p.add_argument("--record-size", type=int, default=1024, help="value bytes per record (default 1024)")
    p.add_argument("--acks", default="all", choices=("0", "1", "all"), help="the producer's acks (default all)")
    p.add_argument("--partitions", type=int, default=3, help="when creating the topic (default 3)")
    p.add_argument("--replication-factor", type=int, default=3, help="when creating the topic (default 3)")
    p.add_argument("--batch-size-bytes", type=int, default=None,
                   help="the largest batch (default: the producer's, 1048576)")
    p.add_argument("--in-flight", type=int, default=None,
                   help="batches in flight per partition (default: the producer's, 5)")
    p.add_argument("--linger-ms", type=int, default=None,
                   help="how long a batch waits for more records (default: the producer's, 5)")
    p.add_argument("--buffer-memory-bytes", type=int, default=None,
                   help="bytes queued and in flight before send() waits (default: the producer's, 33554432)")
    p.add_argument("--compression", default="none", choices=("none", "gzip", "snappy", "lz4", "zstd"),
                   help="compress batches with this codec (default none)")
    p.add_argument("--rate", type=float, help="send at most this many records/s (default: as fast as possible)")
    p.add_argument("--no-consume", action="store_true", help="skip the consumer phase")
    p.add_argument("--json", action="store_true", help="print the results as one JSON object")
    p.add_argument("--controller", help="admin API URL(s) for creating the topic (default: the `biplane up` cluster)")
    p.add_argument("--token", default=os.environ.get("BIPLANE_ADMIN_TOKEN"),
                   help="admin bearer token (env BIPLANE_ADMIN_TOKEN; default: the `biplane up` cluster's)")
    args = p.parse_args(argv)
    if args.records < 1 or args.record_size < 0:
        p.error("--records must be >= 1 and --record-size >= 0")
    if args.rate is not None and args.rate <= 0:
        p.error(f"--rate {args.rate} must be positive")
    try:
        brokers = resolve_brokers(args)
        if args.controller is None and (args.data_dir or not os.environ.get("BIPLANE_CONTROLLER")):
            from dataplane.client.discovery import default_admin
            urls, token = default_admin(args.data_dir)
            args.controller, args.token = ",".join(urls), args.token or token
    except NoClusterError as exc:
        return _fail(prog, f"{exc} (or --bootstrap HOST:PORT and --controller URL)")
    args.bootstrap = brokers.bootstrap
    try:
        result = cli_exit.run_async(_bench(args))
    except (NoBrokersError, ConnectionClosedError) as exc:
        return _fail(prog, f"{exc}{brokers.hint}")
    except (BiplaneError, ValueError) as exc:
        return _fail(prog, exc)
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
