"""Log compaction across real brokers (tests/cluster_harness.py): a topic created with
cleanup_policy=compact and small segments through the admin API takes overwrites of a few
keys; each replica's cleaner (a short interval) compacts its own log below its HW; stopped,
every replica's log holds exactly the latest value of each key, fewer records than were
written, and no broker logged an ERROR. A keyless record is refused INVALID_RECORD."""
from __future__ import annotations

import asyncio
import time

import pytest

from cluster_harness import Cluster
from common.batch import iter_batches, read_records
from common.errors import BiplaneError, ErrorCode
from dataplane.client import Producer
from dataplane.log import LogConfig, PartitionLog

pytestmark = pytest.mark.slow

KEYS = 5
ROUNDS = 40


def replica_records(directory: str) -> list:
    log = PartitionLog(directory, config=LogConfig(segment_bytes=1024))
    try:
        out = []
        offset = log.log_start_offset
        while offset < log.log_end_offset:
            result = log.read(offset, max_bytes=1 << 20)
            for pos, header in iter_batches(result.records):
                if not header.is_control:
                    out += read_records(result.records, pos)
            offset = result.next_offset
        return out
    finally:
        log.close()


def test_every_replica_compacts_to_the_latest_value_per_key(tmp_path):
    with Cluster(tmp_path, brokers=3, broker_args=["--log-cleaner-interval-ms", "300"]) as cluster:
        cluster.create_topic("compacted", replication_factor=3, config={
            "cleanup_policy": "compact", "segment_bytes": 1024, "min_cleanable_dirty_ratio": 0.01})
        bootstrap = f"127.0.0.1:{cluster.brokers[1].port}"
        latest: dict[bytes, bytes] = {}

        async def write() -> None:
            async with Producer(bootstrap=bootstrap, acks="all", linger_ms=0) as producer:
                for n in range(ROUNDS):
                    for k in range(KEYS):
                        key, value = f"key-{k}".encode(), f"round {n} of key {k} ".encode() * 3
                        await producer.send_and_wait("compacted", value, key=key)
                        latest[key] = value
                with pytest.raises(BiplaneError) as refused:
                    await producer.send_and_wait("compacted", b"no key")
                assert refused.value.code is ErrorCode.INVALID_RECORD, refused.value
                assert "has no key" in str(refused.value)
        asyncio.run(asyncio.wait_for(write(), 30))
        written = KEYS * ROUNDS
        time.sleep(2.0)  # several cleaner passes on every broker
        cluster.stop()
        for broker_id in (1, 2, 3):
            records = replica_records(str(tmp_path / f"broker-{broker_id}" / "data" / "compacted-0"))
            by_key: dict[bytes, bytes] = {}
            offsets = [r.offset for r in records]
            assert offsets == sorted(set(offsets)), broker_id
            for r in records:
                assert r.key is not None
                by_key[r.key] = r.value
            assert by_key == latest, broker_id
            assert len(records) < written / 2, (broker_id, len(records))
            log_text = cluster.brokers[broker_id].log_tail(10_000)
            assert " ERROR " not in log_text and "compaction failed" not in log_text, log_text
