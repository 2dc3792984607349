#!/usr/bin/env python3
"""Throughput of the batch format and the wire frames, in pure Python.

Prints batches/s, records/s and MB/s for building batches of 1 KiB records
(16 KiB and 256 KiB batches, plain and gzip), for validate_batch over a
segment-sized buffer with iter_batches, for read_records, and for frame
encode/decode of FETCH responses carrying those batches. Last, the message bodies
without records (a follower's fetch answers and requests over 200 partitions, as
while thousands of replicas open): each struct's compiled decoder against the general
one it replaces, alternated for 5 rounds, medians and their ratio.

    .venv/bin/python scripts/bench_codec.py [--seconds 1.0]
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common.batch import BatchBuilder, Compression, iter_batches, read_records  # noqa: E402
from common.errors import ErrorCode  # noqa: E402
from common.wire import codec  # noqa: E402
from common.wire import (  # noqa: E402
    ApiKey,
    FetchPartition,
    FetchPartitionResponse,
    FetchRequest,
    FetchTopic,
    FetchResponse,
    FetchTopicResponse,
    FrameDecoder,
    decode_response,
    encode_response,
)

RECORD_BYTES = 1024
MB = 1e6


def measure(fn, seconds: float) -> tuple[int, float]:
    """Run fn repeatedly for about `seconds`; return (calls, elapsed seconds)."""
    calls = 0
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        fn()
        calls += 1
        now = time.perf_counter()
        if now >= deadline:
            return calls, now - start


def fill(batch_bytes: int, compression: Compression, values: list[bytes]) -> BatchBuilder:
    builder = BatchBuilder(max_batch_bytes=batch_bytes, compression=compression)
    ts = 1_700_000_000_000
    i = 0
    while builder.has_room_for(values[i % len(values)], timestamp_ms=ts):
        builder.append(values[i % len(values)], timestamp_ms=ts)
        i += 1
    return builder


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="time per measurement")
    args = parser.parse_args()
    seconds = args.seconds
    # Distinct records, each half random and half repeated: gzip halves them.
    value = [os.urandom(RECORD_BYTES // 2) + b"x" * (RECORD_BYTES // 2) for _ in range(512)]

    print(f"record size {RECORD_BYTES} B, {seconds:.1f} s per figure, Python {sys.version.split()[0]}")
    print(f"{'what':44} {'batches/s':>10} {'records/s':>11} {'MB/s':>8}")

    def row(label: str, batches: float, records: float, nbytes: float) -> None:
        print(f"{label:44} {batches:10.0f} {records:11.0f} {nbytes / MB:8.1f}")

    for batch_bytes in (16 * 1024, 256 * 1024):
        for compression in Compression:
            label = f"{batch_bytes // 1024} KiB {compression.name.lower()}"
            sample = fill(batch_bytes, compression, value)
            count = sample.record_count
            calls, elapsed = measure(lambda: fill(batch_bytes, compression, value).build(), seconds)
            row(f"build {label} ({count} rec)", calls / elapsed, calls * count / elapsed,
                calls * count * RECORD_BYTES / elapsed)

            batch = sample.build()
            segment = batch * max(1, (4 * 1024 * 1024) // len(batch))  # ~4 MiB of batches
            n_batches = len(segment) // len(batch)
            calls, elapsed = measure(lambda: sum(1 for _ in iter_batches(segment)), seconds)
            row(f"validate+iter_batches {label}", calls * n_batches / elapsed,
                calls * n_batches * count / elapsed, calls * len(segment) / elapsed)

            calls, elapsed = measure(lambda: sum(1 for _ in iter_batches(segment, validate=False)), seconds)
            row(f"iter_batches (no CRC) {label}", calls * n_batches / elapsed,
                calls * n_batches * count / elapsed, calls * len(segment) / elapsed)

            calls, elapsed = measure(lambda: read_records(batch), seconds)
            row(f"read_records {label}", calls / elapsed, calls * count / elapsed, calls * len(batch) / elapsed)

    print()
    print(f"{'frames (FETCH response, 16 partitions)':44} {'frames/s':>10} {'':>11} {'MB/s':>8}")
    for batch_bytes in (16 * 1024, 256 * 1024):
        batch = fill(batch_bytes, Compression.NONE, value).build()
        response = FetchResponse(topics=(FetchTopicResponse(topic="bench", partitions=tuple(
            FetchPartitionResponse(partition=p, high_watermark=100, records=batch) for p in range(16))),))
        frame = b"".join(encode_response(response, correlation_id=1))
        calls, elapsed = measure(lambda: b"".join(encode_response(response, correlation_id=1)), seconds)
        row(f"encode {batch_bytes // 1024} KiB batches", calls / elapsed, 0, calls * len(frame) / elapsed)

        chunks = [frame[i:i + 65536] for i in range(0, len(frame), 65536)]

        def decode_stream() -> None:
            decoder = FrameDecoder()
            for chunk in chunks:
                for payload in decoder.feed(chunk):
                    decode_response(payload, ApiKey.FETCH)

        calls, elapsed = measure(decode_stream, seconds)
        row(f"decode {batch_bytes // 1024} KiB batches (64 KiB reads)", calls / elapsed, 0,
            calls * len(frame) / elapsed)
    structs(seconds)
    return 0


def structs(seconds: float) -> None:
    answers = tuple(FetchPartitionResponse(
        partition=p, error_code=ErrorCode.NONE if p % 3 else ErrorCode.LEADER_NOT_AVAILABLE, high_watermark=5,
        log_start_offset=0, log_end_offset=5, records=b"r" * 80 if p % 2 else b"") for p in range(50))
    messages = {
        "fetch answer, 200 partitions": FetchResponse(session_id=7, topics=tuple(
            FetchTopicResponse(topic=f"t{t}", partitions=answers) for t in range(4))),
        "fetch request, 200 partitions": FetchRequest(replica_id=2, topics=tuple(FetchTopic(topic=f"t{t}", partitions=tuple(
            FetchPartition(partition=p, fetch_offset=5, flushed_offset=5) for p in range(50))) for t in range(4))),
    }
    print()
    print(f"{'struct decode, us per message (median of 5)':44} {'compiled':>10} {'general':>11} {'ratio':>8}")
    for label, message in messages.items():
        body = codec.encode(message)
        figures: dict[str, list[float]] = {"compiled": [], "general": []}
        for _ in range(5):
            for way in ("compiled", "general"):
                with codec.general_decoding(type(message)) if way == "general" else contextlib.nullcontext():
                    calls, elapsed = measure(lambda: codec.decode(type(message), body), seconds / 5)
                figures[way].append(elapsed / calls * 1e6)
        fast, slow = statistics.median(figures["compiled"]), statistics.median(figures["general"])
        print(f"{label:44} {fast:10.0f} {slow:11.0f} {slow / fast:7.1f}x")


if __name__ == "__main__":
    raise SystemExit(main())
