"""Writer process for test_log_crash.py: appends deterministic batches to a log and
prints `flushed <offset>` each time flush() returns, until it is killed.

    python tests/log_crash_writer.py <directory> <seed>

Batch i holds 1 + i % 4 records whose values are `expected_values(i)`; its leader
epoch is `epoch_of(i)`. Both are pure functions, so the checker can recompute them.
"""
from __future__ import annotations

import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common.batch import build_batch  # noqa: E402
from dataplane.log import LogConfig, PartitionLog  # noqa: E402

# Small checkpoint intervals: most kills land after a recovery checkpoint of the active segment.
CONFIG = LogConfig(segment_bytes=64 * 1024, index_interval_bytes=1024, segment_ms=None, retention_ms=None,
                   checkpoint_interval_bytes=4096, checkpoint_interval_offsets=16)


def records_in(i: int) -> int:
    return 1 + i % 4


def expected_values(i: int) -> list[bytes]:
    return [(f"batch-{i}-record-{j}-".encode() * (1 + (i * 7 + j) % 40)) for j in range(records_in(i))]


def epoch_of(i: int) -> int:
    return i // 100


def batch_starting_at(offset: int) -> int:
    """The batch index whose first offset is `offset` (a batch boundary)."""
    i = start = 0
    while start < offset:
        start += records_in(i)
        i += 1
    if start != offset:
        raise AssertionError(f"offset {offset} is not a batch boundary")
    return i


def main() -> None:
    directory, seed = sys.argv[1], int(sys.argv[2])
    rng = random.Random(seed)
    log = PartitionLog(directory, config=CONFIG)
    i = batch_starting_at(log.log_end_offset)
    print(f"ready {log.log_end_offset}", flush=True)
    while True:
        for _ in range(rng.randint(1, 8)):
            log.append_as_leader(build_batch(expected_values(i), timestamp_ms=1_000 + i),
                                 leader_epoch=epoch_of(i))
            i += 1
        print(f"flushed {log.flush()}", flush=True)


if __name__ == "__main__":
    main()
