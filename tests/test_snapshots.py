"""Controller snapshot files: schema, atomic writes, retention, periodic and HTTP triggers."""
from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from common.metadata.config import TopicConfig
from common.metadata.image import MetadataImage
from common.metadata.records import (CreateTopic, NoOp, PartitionChange, PartitionRecord, RegisterBroker,
                                     UnfenceBroker)
from common.usage import BrokerUsage, ReplicaUsage
from controller import snapshots as snapshots_module
from controller.snapshot_schema import TABLES, TEMP_PREFIX
from controller.snapshot_service import Snapshotter, add_snapshot_routes, next_snapshot_due_ms
from controller.snapshots import SnapshotStore, parse_snapshot_file_name, snapshot_file_name

T0_MS = 1_700_000_000_000
BIG_BYTES = 5 * 2**40  # 5 TiB: does not fit 32 bits


def fake_image(offset: int = 42) -> MetadataImage:
    """A real image: brokers 1, 2 (racks r1, r2, unfenced) and 3 (no rack, fenced); topic `orders`
    with 2 partitions, RF 3: p0 led by 1 with ISR {1, 2}; p1 leaderless, ISR {2, 1}, adding 1."""
    records = [RegisterBroker(broker_id=i, incarnation_id=f"inc{i}", host=f"b{i}.local", port=9000 + i,
                              rack=rack, priority=10 * i, at_ms=1) for i, rack in ((1, "r1"), (2, "r2"), (3, None))]
    records += [UnfenceBroker(broker_id=1, at_ms=2), UnfenceBroker(broker_id=2, at_ms=2)]
    records += [CreateTopic(name="orders", topic_id="t-orders", config=TopicConfig(partitions=2, replication_factor=3)),
                PartitionRecord(topic="orders", partition=0, replicas=[1, 2, 3], isr=[1, 2], leader=1,
                                leader_epoch=3, partition_epoch=7),
                PartitionRecord(topic="orders", partition=1, replicas=[2, 3, 1], isr=[2, 1], leader=None,
                                leader_epoch=3, partition_epoch=6),
                PartitionChange(topic="orders", partition=1, adding=[1])]
    image = MetadataImage()
    assert image.apply_all(records, 0) == []
    while image.offset < offset:
        image.apply(NoOp(), image.offset + 1)
    return image


def fake_usage(at_ms: int = T0_MS) -> dict[int, BrokerUsage]:
    replica = lambda p, size: ReplicaUsage(topic="orders", partition=p, size_bytes=size, log_start_offset=5,  # noqa: E731
                                           log_end_offset=900, high_watermark=880, produce_bytes_per_s=1.5,
                                           produce_records_per_s=2.5, fetch_bytes_per_s=3.5)
    return {
        1: BrokerUsage(broker_id=1, at_ms=at_ms, disk_total_bytes=BIG_BYTES * 2, disk_used_bytes=BIG_BYTES,
                       disk_free_bytes=BIG_BYTES, replicas=[replica(0, BIG_BYTES), replica(1, 10)]),
        2: BrokerUsage(broker_id=2, at_ms=at_ms, disk_total_bytes=1000, disk_used_bytes=100, disk_free_bytes=900,
                       replicas=[replica(0, 50), replica(1, 50)]),
    }


def table_types(path: Path) -> dict[str, dict[str, str]]:
    with sqlite3.connect(path) as conn:
        names = [row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        return {name: {row[1]: row[2] for row in conn.execute(f"PRAGMA table_info([{name}])")} for name in names}


def test_file_has_documented_schema_and_values(tmp_path):
    """A written file is valid SQLite holding exactly the documented tables and column types,
    with leader, ISR membership, epochs, usage and 64-bit byte counts intact."""
    store = SnapshotStore(tmp_path)
    info = store.write(fake_image(), fake_usage(), T0_MS, controller_id=7)
    assert info.name == "snapshot-20231114T221320Z-000000000042.sqlite"
    assert table_types(Path(info.path)) == {t: dict(cols) for t, (cols, _) in TABLES.items()}
    with sqlite3.connect(info.path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        cluster = conn.execute("SELECT snapshot_time_ms, metadata_offset, controller_id, broker_count, "
                               "fenced_broker_count, topic_count, partition_count, replica_count, "
                               "offline_partition_count FROM cluster").fetchall()
        assert cluster == [(T0_MS, 42, 7, 3, 1, 1, 2, 6, 1)]
        assert conn.execute("SELECT broker_id, rack, state, disk_capacity_bytes FROM brokers ORDER BY 1").fetchall() \
            == [(1, "r1", "unfenced", BIG_BYTES * 2), (2, "r2", "unfenced", 1000), (3, None, "fenced", None)]
        assert conn.execute("SELECT broker_id, position, is_leader, in_isr, is_adding FROM replicas "
                            "WHERE partition = 1 ORDER BY position").fetchall() \
            == [(2, 0, 0, 1, 0), (3, 1, 0, 0, 0), (1, 2, 0, 1, 1)]
        assert conn.execute("SELECT leader, leader_epoch, partition_epoch, isr_count, reassigning FROM partitions "
                            "ORDER BY partition").fetchall() == [(1, 3, 7, 2, 0), (None, 3, 7, 2, 1)]
        assert conn.execute("SELECT value FROM topic_configs WHERE name = 'replication_factor'").fetchone() == ("3",)
        assert conn.execute("SELECT size_bytes, typeof(size_bytes), high_watermark FROM replica_usage "
                            "WHERE broker_id = 1 AND partition = 0").fetchone() == (BIG_BYTES, "integer", 880)
        assert conn.execute("SELECT disk_used_bytes FROM broker_usage WHERE broker_id = 1").fetchone() == (BIG_BYTES,)
        # Broker 1 leads orders-0 (produce 1.5 B/s) and follows orders-1; it reported 2 replicas.
        assert conn.execute("SELECT * FROM broker_totals ORDER BY broker_id").fetchall() == [
            (1, 2, 1, BIG_BYTES + 10, 1.5, 1.5, 7.0), (2, 2, 0, 100, 0.0, 3.0, 7.0), (3, 2, 0, 0, 0.0, 0.0, 0.0)]


def test_names_round_trip_and_list_ignores_other_files(tmp_path):
    """Only final names are listed; foreign files are ignored and temp files are removed on open."""
    name = snapshot_file_name(T0_MS + 999, 12)
    assert parse_snapshot_file_name(name) == (T0_MS // 1000 * 1000, 12)
    assert parse_snapshot_file_name("snapshot-20231114T221320Z-42.sqlite") is None
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / f"{TEMP_PREFIX}abc-{name}").write_bytes(b"half a file")
    store = SnapshotStore(tmp_path)
    assert not (tmp_path / f"{TEMP_PREFIX}abc-{name}").exists()
    store.write(fake_image(12), {}, T0_MS + 999, controller_id=None)
    assert [info.name for info in store.list()] == [name]
    assert (tmp_path / "notes.txt").exists()


def test_retention_by_count_and_age_keeps_newest(tmp_path):
    """keep_count bounds how many files stay; keep_age_ms drops old ones; the newest always stays."""
    store = SnapshotStore(tmp_path, keep_count=3, keep_age_ms=10 * 60_000)
    for i in range(5):
        store.write(fake_image(10 + i), {}, T0_MS + i * 60_000, controller_id=1)
    assert [info.metadata_offset for info in store.list()] == [12, 13, 14]
    # Ten minutes later, offsets 12 and 13 are too old; 14 is exactly at the edge.
    old_names = [info.name for info in store.list()[:2]]
    assert store.prune(T0_MS + 14 * 60_000) == old_names
    assert [info.metadata_offset for info in store.list()] == [14]
    assert store.prune(T0_MS + 10**9) == []  # the newest stays however old
    assert [info.metadata_offset for info in store.list()] == [14]


def test_failure_before_rename_leaves_no_file(tmp_path, monkeypatch):
    """An error after the temp file is built but before the rename leaves neither a final nor a temp file."""
    store = SnapshotStore(tmp_path)

    def broken_replace(src, dst):
        raise OSError("disk went away")

    monkeypatch.setattr(snapshots_module.os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk went away"):
        store.write(fake_image(), fake_usage(), T0_MS, controller_id=1)
    assert list(tmp_path.iterdir()) == []
    assert store.list() == []


CRASH_WRITER = textwrap.dedent("""
    import sys
    from controller.snapshots import SnapshotRows, write_snapshot_file
    from pathlib import Path
    parts = 4000
    replicas = tuple(("t", p, b, b, int(b == 0), 1, 0, 0) for p in range(parts) for b in range(3))
    usage = tuple(("t", p, b, 0, 2**40, 0, 10, 10, 1.0, 1.0, 1.0) for p in range(parts) for b in range(3))
    i = 0
    while True:
        write_snapshot_file(Path(sys.argv[1]), SnapshotRows(snapshot_time_ms=1_700_000_000_000 + i * 1000,
            metadata_offset=i, controller_id=1, replicas=replicas, replica_usage=usage))
        i += 1
""")


@pytest.mark.slow
def test_sigkill_mid_write_never_exposes_partial_file(tmp_path):
    """Killing a writer with SIGKILL at arbitrary moments (5 kills) leaves only complete files
    under final names; a store opened afterwards removes the temp leftovers."""
    root = Path(__file__).resolve().parent.parent
    temp_seen = 0
    for kill_after_s in (0.15, 0.3, 0.45, 0.6, 0.75):
        proc = subprocess.Popen([sys.executable, "-c", CRASH_WRITER, str(tmp_path)], cwd=root)
        try:
            time.sleep(kill_after_s)
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        temp_seen += sum(1 for p in tmp_path.iterdir() if p.name.startswith(TEMP_PREFIX))
    listed = SnapshotStore.__new__(SnapshotStore)  # list without the startup cleanup first
    listed.directory = tmp_path
    for info in SnapshotStore.list(listed):
        with sqlite3.connect(info.path) as conn:
            assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",), info.name
            assert conn.execute("SELECT count(*) FROM replica_usage").fetchone() == (12000,), info.name
            assert conn.execute("SELECT metadata_offset FROM cluster").fetchone() == (info.metadata_offset,)
    store = SnapshotStore(tmp_path)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(TEMP_PREFIX)]
    print(f"temp files left by kills: {temp_seen}; complete files: {len(store.list())}")


class ManualClock:
    def __init__(self, now_ms: int) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


async def wait_for(condition, *, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


def test_next_due_counts_from_last_snapshot():
    assert next_snapshot_due_ms(None, 1000, 60_000) == 61_000
    assert next_snapshot_due_ms(30_000, 1000, 60_000) == 90_000


def test_periodic_writer_follows_the_clock(tmp_path):
    """With a manual clock: no file before the interval passes, one per interval after, none on a follower."""
    clock = ManualClock(T0_MS)
    leader = {"yes": True}
    offsets = iter(range(20, 100))
    snapshotter = Snapshotter(store=SnapshotStore(tmp_path), image_getter=lambda: fake_image(next(offsets)),
                              usage_getter=fake_usage, controller_id=1, is_leader=lambda: leader["yes"],
                              snapshot_interval_ms=60_000, clock_ms=clock, wake_ms_max=2)

    async def scenario() -> None:
        snapshotter.start()
        try:
            await asyncio.sleep(0.05)
            assert snapshotter.list() == []
            clock.now_ms += 60_000
            await wait_for(lambda: len(snapshotter.list()) == 1)
            clock.now_ms += 60_000
            await wait_for(lambda: len(snapshotter.list()) == 2)
            leader["yes"] = False
            clock.now_ms += 120_000
            await asyncio.sleep(0.05)
            assert len(snapshotter.list()) == 2
        finally:
            await snapshotter.stop()

    asyncio.run(scenario())
    assert [info.time_ms - T0_MS for info in snapshotter.list()] == [60_000, 120_000]


def test_http_routes_take_and_list(tmp_path):
    """POST /v1/snapshots writes a file and returns its info; GET lists it; a follower answers 503."""
    leader = {"yes": True}
    snapshotter = Snapshotter(store=SnapshotStore(tmp_path), image_getter=fake_image, usage_getter=fake_usage,
                              controller_id=1, is_leader=lambda: leader["yes"], clock_ms=lambda: T0_MS)

    async def scenario() -> None:
        app = web.Application()
        add_snapshot_routes(app, lambda: snapshotter)
        async with TestClient(TestServer(app, host="127.0.0.1")) as client:
            response = await client.post("/v1/snapshots")
            assert response.status == 201
            taken = await response.json()
            assert taken["name"] == "snapshot-20231114T221320Z-000000000042.sqlite"
            assert taken["metadata_offset"] == 42 and taken["size_bytes"] > 0
            listed = await (await client.get("/v1/snapshots")).json()
            assert listed == {"snapshots": [taken]}
            leader["yes"] = False
            response = await client.post("/v1/snapshots")
            assert response.status == 503
            assert (await response.json())["error"]["code"] == "NOT_CONTROLLER"

    asyncio.run(scenario())
    assert table_types(tmp_path / "snapshot-20231114T221320Z-000000000042.sqlite").keys() == TABLES.keys()
