"""Crash safety of the partition log with a real writer process killed by SIGKILL.

Claim (seed 20260421, 30 rounds): after the writer is killed at a random moment,
possibly with a torn write left at the end of the last segment, reopening the log
never fails; every batch below the last offset the writer reported as flushed is
there; every batch that can be read passes its CRC and holds exactly what the
writer generated for it; and the next writer appends at log_end_offset.
(A SIGKILL keeps what the kernel already has, so this checks recovery and the
flushed-offset claims, not fsync against power loss.)
"""
from __future__ import annotations

import os
import random
import select
import signal
import subprocess
import sys
import time

import pytest

from common.batch import iter_batches, read_records
from dataplane.log import PartitionLog

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from log_crash_writer import CONFIG, batch_starting_at, epoch_of, expected_values  # noqa: E402

SEED = 20260421
ROUNDS = 30
WRITER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "log_crash_writer.py")


def run_writer_and_kill(directory: str, seed: int, kill_after_s: float) -> tuple[int, list[int]]:
    """Start a writer, kill it kill_after_s after it is ready; (start offset, flushed offsets)."""
    proc = subprocess.Popen([sys.executable, WRITER, directory, str(seed)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        assert ready, "writer did not start within 30 s"
        first = proc.stdout.readline().decode()
        assert first.startswith("ready "), (first, proc.stderr.read().decode()[-2000:])
        time.sleep(kill_after_s)
    finally:
        proc.send_signal(signal.SIGKILL)
        out = proc.stdout.read().decode()
        proc.stderr.read()
        proc.wait()
    lines = out.split("\n")[:-1]  # the last piece may be a line cut by the kill
    return int(first.split()[1]), [int(line.split()[1]) for line in lines if line.startswith("flushed ")]


def check_log(directory: str, flushed: int, *, torn: bool) -> int:
    log = PartitionLog(directory, config=CONFIG)
    try:
        assert log.log_end_offset >= flushed, (log.log_end_offset, flushed)
        assert log.flushed_offset == log.log_end_offset
        if torn:
            assert log.recovered_bytes_cut > 0
        offset = log.log_start_offset
        i = 0
        while offset < log.log_end_offset:
            result = log.read(offset, max_bytes=256 * 1024)
            assert result.first_offset == offset
            for pos, header in iter_batches(result.records, validate=True):
                assert header.base_offset == offset
                assert header.leader_epoch == epoch_of(i)
                records = read_records(result.records, pos)
                assert [r.value for r in records] == expected_values(i)
                assert [r.offset for r in records] == list(range(offset, header.next_offset))
                offset = header.next_offset
                i += 1
        assert batch_starting_at(log.log_end_offset) == i
        return log.log_end_offset
    finally:
        log.close()


def tear_tail(directory: str, rng: random.Random) -> None:
    """Leave garbage after the last segment's data, as a torn write does."""
    last = max(n for n in os.listdir(directory) if n.endswith(".log"))
    with open(os.path.join(directory, last), "ab") as f:
        f.write(rng.randbytes(rng.randint(1, 300)))


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_killed_writer_never_loses_flushed_batches(tmp_path):
    rng = random.Random(SEED)
    directory = str(tmp_path / "log")
    end = 0
    deadline = time.monotonic() + 60
    rounds = 0
    try:
        for round_number in range(ROUNDS):
            if time.monotonic() > deadline:
                break
            start, flushed = run_writer_and_kill(directory, rng.randrange(1 << 30), rng.uniform(0, 0.4))
            assert start == end, f"writer resumed at {start}, log ended at {end}"
            last_flushed = max(flushed, default=start)
            torn = rng.random() < 0.3
            if torn:
                tear_tail(directory, rng)
            end = check_log(directory, last_flushed, torn=torn)
            rounds += 1
    except AssertionError:
        print(f"seed={SEED} round={rounds}")
        raise
    print(f"seed={SEED} rounds={rounds} log_end_offset={end}")
    assert rounds >= 10 and end > 0
