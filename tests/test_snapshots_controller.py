"""Snapshot files from a real single-node `biplane controller` process: on its interval and on
POST /v1/snapshots, with the image and the usage brokers reported in heartbeats."""
from __future__ import annotations

import sqlite3

import pytest

from controller.report.datasource import check_file
from controller.snapshot_schema import TABLES
from controller_harness import TOKEN, Controller, http, make_specs, run_cli, wait_leader, wait_until

pytestmark = pytest.mark.slow
BIG_BYTES = 3 * 2**40


def usage(broker_id: int, at_ms: int) -> dict:
    return {"broker_id": broker_id, "at_ms": at_ms, "disk_total_bytes": 2 * BIG_BYTES,
            "disk_used_bytes": BIG_BYTES, "disk_free_bytes": BIG_BYTES,
            "replicas": [{"topic": "orders", "partition": 0, "size_bytes": BIG_BYTES - broker_id,
                          "log_start_offset": 0, "log_end_offset": 100, "high_watermark": 90,
                          "produce_bytes_per_s": 10.0, "fetch_bytes_per_s": 5.0}]}


@pytest.fixture(scope="module")
def controller(tmp_path_factory):
    spec = make_specs(1)[0]
    data = tmp_path_factory.mktemp("snapctl")
    c = Controller(spec, [spec], data, ["--session-timeout-ms", "600000", "--snapshot-interval-ms", "700",
                                        "--snapshot-dir", str(data / "snaps")])
    try:
        c.start()
        wait_leader([c], timeout_s=20)
        url = spec.api_url
        for broker_id in (1, 2):
            r = http("POST", url + "/rpc/v1/register", {"broker_id": broker_id, "incarnation_id": f"inc-{broker_id}",
                                                         "host": "127.0.0.1", "port": 9090 + broker_id})
            assert r.status == 200, r.body

            def unfenced(broker_id=broker_id):
                offset = http("GET", url + "/v1/health", token=None).body["metadata_offset"]
                hb = http("POST", url + "/rpc/v1/heartbeat", {
                    "broker_id": broker_id, "incarnation_id": f"inc-{broker_id}", "metadata_offset": offset,
                    "usage": usage(broker_id, 1_000 + offset)})
                assert hb.status == 200, hb.body
                return not hb.body["fenced"]
            wait_until(unfenced, 10, f"broker {broker_id} unfenced")
        r = http("POST", url + "/v1/topics", {"name": "orders", "partitions": 2, "replication_factor": 2})
        assert r.status == 201, r.body
        yield c, data / "snaps"
    finally:
        c.kill()


def test_post_snapshot_writes_a_file_with_image_and_usage(controller):
    """POST /v1/snapshots answers 201 with the file's info; the file holds the committed image
    (2 unfenced brokers, topic orders with 2 partitions of 2 replicas) and the reported usage."""
    c, snaps = controller
    r = http("POST", c.spec.api_url + "/v1/snapshots")
    assert r.status == 201, r.body
    path = snaps / r.body["name"]
    assert path.exists() and r.body["size_bytes"] == path.stat().st_size
    with sqlite3.connect(path) as conn:
        assert {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")} == set(TABLES)
        assert conn.execute("SELECT controller_id, broker_count, fenced_broker_count, topic_count, partition_count, "
                            "replica_count, metadata_offset FROM cluster").fetchone() == (
            c.spec.node_id, 2, 0, 1, 2, 4, r.body["metadata_offset"])
        assert conn.execute("SELECT broker_id, state, disk_capacity_bytes FROM brokers ORDER BY 1").fetchall() == [
            (1, "unfenced", 2 * BIG_BYTES), (2, "unfenced", 2 * BIG_BYTES)]
        assert conn.execute("SELECT count(*), sum(is_leader) FROM replicas").fetchone() == (4, 2)
        assert conn.execute("SELECT value FROM topic_configs WHERE topic='orders' AND name='replication_factor'"
                            ).fetchone() == ("2",)
        assert conn.execute("SELECT broker_id, size_bytes FROM replica_usage ORDER BY 1").fetchall() == [
            (1, BIG_BYTES - 1), (2, BIG_BYTES - 2)]
    assert check_file(str(path))[1] is True  # and the report's reader accepts it


def test_periodic_snapshots_appear_and_are_listed(controller):
    """With --snapshot-interval-ms 700 new files keep appearing; GET /v1/snapshots and
    `biplane snapshot list` show them."""
    c, snaps = controller
    first = {p.name for p in snaps.glob("snapshot-*.sqlite")}
    wait_until(lambda: len({p.name for p in snaps.glob("snapshot-*.sqlite")} - first) >= 2, 15,
               "two more periodic snapshot files")
    listed = http("GET", c.spec.api_url + "/v1/snapshots")
    assert listed.status == 200
    names = [s["name"] for s in listed.body["snapshots"]]
    assert names == sorted(names) and set(names) <= {p.name for p in snaps.glob("snapshot-*.sqlite")}
    assert len(names) >= 3
    cli = run_cli("snapshot", "list", "--controller", c.spec.api_url, "--token", TOKEN)
    assert cli.returncode == 0, cli.stderr
    assert names[0] in cli.stdout
