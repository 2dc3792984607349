"""ReplicaManager.usage_report: what a broker reports each second about its replicas costs
what changed. Claims: a replica whose log and HW did not move since the last report (ticked
or not), with no traffic and zero rates, keeps its figures (the same ReplicaUsage object) without its log being read, and a
report between full ones does not walk the replicas at all; one that took traffic is read
again, and shows zero rates once idle again; the totals and log bytes add up over every
replica either way; every USAGE_FULL_EVERY_S every log is read again, at most
USAGE_REREADS_PER_REPORT in one report (10,000 in one report held the loop about 100 ms)."""
from __future__ import annotations

import asyncio
import os

from common.batch import build_batch
from dataplane.broker import replicas as replicas_module
from dataplane.broker.config import BrokerConfig
from dataplane.broker.replicas import ReplicaManager
from dataplane.log.log import PartitionLog
from metadata_builders import add_topic, cluster
from test_disk_full import FakeControl


def test_an_idle_replica_keeps_its_figures_unread_and_a_busy_one_is_read_again(tmp_path, monkeypatch):
    config = BrokerConfig(broker_id=1, data_dir=str(tmp_path / "data"), controller_urls=("http://c:1",))
    os.makedirs(config.data_dir, exist_ok=True)
    image = cluster(1)
    add_topic(image, "t", [[1], [1]], min_insync_replicas=1)
    reads: list[str] = []
    real_size = PartitionLog.size_bytes

    def size_bytes(log):
        reads.append(os.path.basename(log.directory))
        return real_size.fget(log)
    monkeypatch.setattr(PartitionLog, "size_bytes", property(size_bytes))

    async def scenario():
        manager = ReplicaManager(config=config, control=FakeControl(), clean_start=True, send_fetch=lambda *a: None,
                                 send_append_entries=lambda *a: None, refresh_metadata=lambda: None)
        await manager.on_metadata(image)
        await manager.settled()
        for _ in range(200):
            if all(manager.get("t", p).replica.epoch_durable for p in (0, 1)):
                break
            for p in (0, 1):
                manager.get("t", p).tick(manager.get("t", p).replica.now_ms + 10)
            await asyncio.sleep(0.01)
        first = manager.usage_report()
        walks: list[str] = []

        class Watched(dict):
            """The drivers, counting walks over all of them."""
            def __iter__(self):
                walks.append("iter")
                return super().__iter__()

            def items(self):
                walks.append("items")
                return super().items()

            def values(self):
                walks.append("values")
                return super().values()
        manager.drivers = Watched(manager.drivers)
        idle = manager.usage_report()
        reads.clear()
        # Ticks that move nothing (an idle replica's timers: thousands a second at 10,000
        # partitions) leave it unread.
        quiet = manager.get("t", 1)
        for k in range(1, 4):
            quiet.tick(quiet.replica.now_ms + 1_000 * k)
        release = await asyncio.wait_for(manager.get("t", 0).submit_produce(
            bytearray(build_batch([b"x" * 100], timestamp_ms=1)), acks=1, timeout_ms=5000), 5)
        await asyncio.sleep(0.01)
        busy = manager.usage_report()
        read_busy = list(reads)
        calm = manager.usage_report()
        still = manager.usage_report()
        walked = list(walks)
        manager.drivers = dict(manager.drivers)
        recount = (sum(d.produce_bytes for d in manager.drivers.values()),
                   sum(d.fetch_bytes for d in manager.drivers.values()),
                   sum(d.log.size_bytes for d in manager.drivers.values()))
        added_up = (calm.totals.produce_bytes, calm.totals.fetch_bytes, calm.log_bytes)
        monkeypatch.setattr(replicas_module, "USAGE_FULL_EVERY_S", 0.0)
        reads.clear()
        manager.usage_report()
        read_full = list(reads)
        # A full pass over more replicas than a report rereads is spread over reports.
        monkeypatch.setattr(replicas_module, "USAGE_REREADS_PER_REPORT", 1, raising=False)
        monkeypatch.setattr(replicas_module, "USAGE_FULL_EVERY_S", 3600.0)
        manager._usage_full_at = -3600.0
        sliced = []
        for _ in range(3):
            reads.clear()
            manager.usage_report()
            sliced.append(sorted(reads))
        await manager.close()
        return release, first, idle, busy, calm, still, read_busy, read_full, walked, recount, added_up, sliced

    (release, first, idle, busy, calm, still, read_busy, read_full, walked, recount, added_up,
     sliced) = asyncio.run(scenario())
    # The rows' list is built once and copied where rows changed: a report with nothing new
    # hands over the very same list (the heartbeat's diff is then free), and a report that
    # changed a row never alters a list handed over before (the heartbeat's base).
    assert idle.replicas is first.replicas and still.replicas is calm.replicas
    assert busy.replicas is not idle.replicas
    assert [r.produce_bytes_per_s for r in idle.replicas] == [0.0, 0.0], "a list handed over was altered"
    assert [len(r) for r in sliced] == [1, 1, 0] and sorted(sliced[0] + sliced[1]) == ["t-0", "t-1"], (
        f"a full pass read {sliced} in three reports; one replica each, every one once")
    assert added_up == recount, "the sums kept by the rows read differ from a recount over every replica"
    assert walked == [], f"a report between full ones walked every replica: {walked}"
    assert release.error.name == "NONE"
    by = lambda report: {(r.topic, r.partition): r for r in report.replicas}  # noqa: E731
    assert by(idle)[("t", 1)] is by(first)[("t", 1)]
    assert read_busy == ["t-0"], f"logs read for one busy replica: {read_busy}"
    assert by(busy)[("t", 1)] is by(first)[("t", 1)]
    assert by(busy)[("t", 0)].produce_bytes_per_s > 0 and by(calm)[("t", 0)].produce_bytes_per_s == 0
    assert busy.totals.produce_bytes > first.totals.produce_bytes
    assert busy.log_bytes == sum(r.size_bytes for r in busy.replicas) > first.log_bytes
    assert sorted(read_full) == ["t-0", "t-1"]
