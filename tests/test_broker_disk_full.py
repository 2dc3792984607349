"""A real broker on a real small filesystem that fills up (ENOSPC), then gets space back.

Claims: the broker process stays up and keeps heartbeating (it stays unfenced); produce is
refused with KAFKA_STORAGE_ERROR (retriable) while reads go on; once space is freed,
produce succeeds again without a restart, and every record acknowledged before the disk
filled is still there. The broker log holds one structured disk-full WARNING and no
ERROR or traceback (tests/conftest.py checks the latter).

Needs root: the broker's data directory is a tmpfs of a few MiB mounted by the test.
"""
from __future__ import annotations

import asyncio
import errno
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest

from common.errors import ErrorCode
from common.wire import WireClient
from cluster_harness import Cluster, fetch_values, make_batch, produce
from controller_harness import http, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

TMPFS_SIZE = "8m"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """broker-1's data directory, a tmpfs of TMPFS_SIZE; unmounted at the end."""
    if os.geteuid() != 0:
        pytest.skip("needs root: mounts a small tmpfs as the broker's data directory to fill it")
    if shutil.which("mount") is None or shutil.which("umount") is None:
        pytest.skip("needs mount(8) and umount(8) to make a small filesystem")
    data = tmp_path / "broker-1" / "data"
    data.mkdir(parents=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE},mode=0755", "tmpfs", str(data)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield data
    finally:
        subprocess.run(["umount", str(data)], capture_output=True)
        if os.path.ismount(data):
            subprocess.run(["umount", "-l", str(data)], capture_output=True)


def fill(directory: Path) -> Path:
    """Take every free byte of the filesystem holding `directory`."""
    path = directory / "fill"
    st = os.statvfs(directory)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        try:
            os.posix_fallocate(fd, 0, st.f_bavail * st.f_frsize)
        except OSError:
            pass
        chunk = b"\0" * 4096
        try:
            for _ in range(10_000):
                os.write(fd, chunk)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
    finally:
        os.close(fd)
    assert os.statvfs(directory).f_bavail == 0
    return path


def test_full_disk_refuses_produce_keeps_the_broker_up_and_recovers_when_space_returns(tmp_path, small_disk):
    with Cluster(tmp_path, brokers=1) as cluster:
        broker = cluster.brokers[1]
        cluster.create_topic("t", partitions=1, replication_factor=1, config={"min_insync_replicas": 1})

        async def scenario() -> None:
            async with await WireClient.connect(*cluster.address(1)) as c:
                before = [b"before-%d" % i for i in range(20)]
                r = await produce(c, "t", 0, make_batch(before))
                assert r.error_code is ErrorCode.NONE, r.error_code

                filler = fill(small_disk)
                await asyncio.sleep(1.0)  # the broker looks at free space a few times a second
                refused = []
                for i in range(10):
                    r = await asyncio.wait_for(produce(c, "t", 0, make_batch([b"full-%d" % i]), timeout_ms=3000), 10)
                    refused.append(r.error_code)
                assert set(refused) == {ErrorCode.KAFKA_STORAGE_ERROR}, refused
                assert broker.alive(), "the broker exited on a full disk"
                values, hw = await fetch_values(c, "t", 0)  # reads go on
                assert [v for _, v in values] == before

                # Still unfenced: heartbeats went on (more than a session timeout has passed).
                await asyncio.sleep(2.0)
                info = cluster.broker_info(1)
                assert info is not None and not info["fenced"], info
                assert broker.alive()

                filler.unlink()
                deadline = time.monotonic() + 15
                while True:
                    r = await asyncio.wait_for(produce(c, "t", 0, make_batch([b"after"]), timeout_ms=3000), 10)
                    if r.error_code is ErrorCode.NONE:
                        break
                    assert r.error_code is ErrorCode.KAFKA_STORAGE_ERROR, r.error_code
                    assert time.monotonic() < deadline, "produce never worked again after space returned"
                    await asyncio.sleep(0.2)
                values, hw = await fetch_values(c, "t", 0)
                assert [v for _, v in values] == before + [b"after"]

        asyncio.run(scenario())
        assert broker.alive()
        log = broker.log_path.read_text(errors="replace")
        assert log.count(f"disk full on the filesystem mounted at {small_disk}:") == 1, "one warning for the condition"
        assert "disk space is back" in log
        assert "Traceback" not in log


@pytest.mark.expected_log_errors(r"t-0 is offline: .*disk full")
def test_a_leader_elected_onto_a_full_disk_goes_offline_and_the_controller_moves_the_leadership(tmp_path,
                                                                                                 small_disk):
    """Broker 1's disk is full when the leadership comes to it (broker 2, the leader, stops): its
    epoch-start batch cannot be written, so the partition goes offline there. The claim: its
    heartbeat says so and the controller moves the leadership to the in-sync broker 3 (the
    record names the offline replica), which takes produce while broker 1's disk is still
    full. Before, the followers kept hearing broker 1 (KAFKA_STORAGE_ERROR answers) and nothing
    moved the leadership until space came back. Once it does, broker 1 reopens the partition,
    follows, and rejoins the ISR; every acknowledged record is there."""
    with Cluster(tmp_path, brokers=3) as cluster:
        r = http("POST", cluster.api_url + "/v1/topics", {"name": "t", "replica_assignment": [[2, 1, 3]],
                                                          "config": {"min_insync_replicas": 1}})
        assert r.status == 201, r.body
        assert cluster.wait_leader("t", 0) == 2

        async def produce_to(broker_id: int, values: list[bytes]) -> ErrorCode:
            async with await WireClient.connect(*cluster.address(broker_id)) as c:
                r = await asyncio.wait_for(produce(c, "t", 0, make_batch(values), timeout_ms=3000), 10)
                return r.error_code

        before = [b"before-%d" % i for i in range(20)]
        assert asyncio.run(produce_to(2, before)) is ErrorCode.NONE
        wait_until(lambda: sorted(cluster.partition("t", 0)["isr"]) == [1, 2, 3], 20, "every replica in sync")
        filler = fill(small_disk)
        time.sleep(0.5)  # the broker looks at free space a few times a second
        cluster.brokers[2].stop()  # controlled shutdown: the leadership goes to 1, next in replica order

        def moved() -> dict | None:
            p = cluster.partition("t", 0)
            return p if p["leader"] == 3 else None
        p = wait_until(moved, 20, "the leadership moved off the offline replica to broker 3")
        assert 1 not in p["isr"], p
        reasons = [rec.get("reason", "") for rec in cluster.metadata_records()
                   if rec.get("type") == "partition_change" and rec.get("topic") == "t"]
        assert any("replica offline on broker 1" in why for why in reasons), reasons
        assert cluster.brokers[1].alive()
        after = [b"while-full-%d" % i for i in range(5)]
        deadline = time.monotonic() + 20
        while (code := asyncio.run(produce_to(3, after))) is not ErrorCode.NONE:
            assert time.monotonic() < deadline, f"broker 3 never took produce: {code}"
            time.sleep(0.2)

        filler.unlink()
        wait_until(lambda: 1 in cluster.partition("t", 0)["isr"], 30,
                   "broker 1 back in the ISR after space returned")

        async def read_back() -> list[bytes]:
            async with await WireClient.connect(*cluster.address(3)) as c:
                values, _ = await fetch_values(c, "t", 0)
                return [v for _, v in values]
        assert asyncio.run(read_back()) == before + after
