"""ReplicaManager.run_retention: the broker's retention pass. Claims: every
retention_check_interval_ms it deletes a replica's oldest segments past retention_bytes
(only below its HW, never the active one) and moves its log start; a replica with only its
active segment costs the pass no thread hop (at 10,000 idle partitions each pass sent ten
thousand calls to a worker thread, one after another)."""
from __future__ import annotations

import asyncio
import os

from common.batch import build_batch
from dataplane.broker.config import BrokerConfig
from dataplane.broker.replicas import ReplicaManager
from dataplane.log.log import PartitionLog
from metadata_builders import add_topic, cluster
from test_disk_full import FakeControl


def test_retention_deletes_old_segments_below_the_hw_and_skips_single_segment_logs(tmp_path, monkeypatch):
    config = BrokerConfig(broker_id=1, data_dir=str(tmp_path / "data"), controller_urls=("http://c:1",),
                          retention_check_interval_ms=100)
    os.makedirs(config.data_dir, exist_ok=True)
    image = cluster(1)
    add_topic(image, "big", [[1]], min_insync_replicas=1, segment_bytes=1024, retention_bytes=2048)
    add_topic(image, "idle", [[1], [1], [1]], min_insync_replicas=1, retention_bytes=2048)
    passes: list[str] = []
    real = PartitionLog.apply_retention

    def apply_retention(log, *args, **kwargs):
        passes.append(os.path.basename(log.directory))
        return real(log, *args, **kwargs)
    monkeypatch.setattr(PartitionLog, "apply_retention", apply_retention)

    async def scenario():
        manager = ReplicaManager(config=config, control=FakeControl(), clean_start=True, send_fetch=lambda *a: None,
                                 send_append_entries=lambda *a: None, refresh_metadata=lambda: None)
        await manager.on_metadata(image)
        await manager.settled()
        big = manager.get("big", 0)
        for _ in range(200):
            if big.replica.epoch_durable:
                break
            big.tick(big.replica.now_ms + 10)
            await asyncio.sleep(0.01)
        for i in range(12):
            release = await asyncio.wait_for(big.submit_produce(
                bytearray(build_batch([b"%d" % i + b"x" * 500], timestamp_ms=1)), acks=1, timeout_ms=5000), 5)
            assert release.error.name == "NONE", release
        await big.flushed_to(big.log.log_end_offset)
        for _ in range(200):
            if big.replica.high_watermark == big.log.log_end_offset:
                break
            big.tick(big.replica.now_ms + 10)
            await asyncio.sleep(0.01)
        before = (big.log.segment_count, big.log.log_start_offset)
        task = asyncio.create_task(manager.run_retention())
        for _ in range(100):
            await asyncio.sleep(0.05)
            if big.log.log_start_offset > before[1]:
                break
        await asyncio.sleep(0.3)   # a few more passes
        task.cancel()
        after = (big.log.segment_count, big.log.log_start_offset, big.log.size_bytes, big.replica.high_watermark)
        await manager.close()
        return before, after

    before, after = asyncio.run(scenario())
    segments, start, size, hw = after
    assert before[0] > 3 and start > before[1], f"no segment deleted: {before} -> {after}"
    assert start <= hw and segments >= 1
    assert size - 1024 < 2048, f"the log still holds {size} bytes over retention_bytes"
    assert passes and set(passes) == {"big-0"}, f"single-segment logs went to a thread: {sorted(set(passes))}"

