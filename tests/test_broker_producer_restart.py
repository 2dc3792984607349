"""One real broker process: idempotent-producer state survives a clean restart through the
producer snapshot written at shutdown.

Claims: after a clean restart, a retried batch with an old sequence is answered as a
duplicate with its original offset (an unknown producer would get OUT_OF_ORDER_SEQUENCE),
an older one is DUPLICATE_SEQUENCE, the next sequence is appended and a gap refused; and
the broker loaded that state from the snapshot at its log end, reading no log for it.
"""
from __future__ import annotations

import asyncio
import re
import time

import pytest

from common.batch import build_batch
from common.errors import ErrorCode
from common.wire import WireClient
from common.wire import messages as wire
from cluster_harness import Cluster, fetch_values, produce
from metrics_scrape import scrape

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

TOPIC = "prodsnap"


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def batch(pid: int, epoch: int, seq: int) -> bytes:
    return build_batch([f"seq-{seq}".encode()], timestamp_ms=int(time.time() * 1000), producer_id=pid,
                       producer_epoch=epoch, base_sequence=seq)


def test_idempotence_state_survives_a_clean_restart_via_the_snapshot(tmp_path):
    with Cluster(tmp_path, brokers=1) as cluster:
        cluster.create_topic(TOPIC, partitions=1, replication_factor=1)
        cluster.wait_leader(TOPIC, 0)

        async def before() -> tuple[int, int, list[int], int]:
            async with await WireClient.connect(*cluster.address(1)) as c:
                init = await c.request(wire.InitProducerIdRequest())
                assert init.error_code is ErrorCode.NONE
                offsets = []
                for seq in range(6):
                    r = await produce(c, TOPIC, 0, batch(init.producer_id, init.producer_epoch, seq), acks=-1)
                    assert r.error_code is ErrorCode.NONE, r
                    offsets.append(r.base_offset)
                _, hw = await fetch_values(c, TOPIC, 0)
                return init.producer_id, init.producer_epoch, offsets, hw

        pid, epoch, offsets, end = run(before())
        info = cluster.restart(1)
        assert info["clean_shutdown"] is True
        cluster.wait_leader(TOPIC, 0)

        # The mechanism: the table came from the snapshot at the end of the log, no log read.
        lines = [l for l in cluster.brokers[1].log_path.read_text(errors="replace").splitlines()
                 if f"{TOPIC}-0 producer state:" in l]
        assert len(lines) == 1, lines  # the restart's: a new, empty log's first start says nothing
        loaded = re.search(r"(\d+) producers from snapshot at (-?\d+) and (\d+) bytes of log", lines[-1])
        assert loaded is not None, lines[-1]
        assert (int(loaded[1]), int(loaded[2]), int(loaded[3])) == (1, end, 0), lines[-1]

        async def after() -> None:
            async with await WireClient.connect(*cluster.address(1)) as c:
                for seq in (5, 1):  # retries of batches written before the restart
                    r = await produce(c, TOPIC, 0, batch(pid, epoch, seq), acks=-1)
                    assert (r.error_code, r.base_offset) == (ErrorCode.NONE, offsets[seq]), (seq, r)
                old = await produce(c, TOPIC, 0, batch(pid, epoch, 0), acks=-1)
                assert old.error_code is ErrorCode.DUPLICATE_SEQUENCE, old
                gap = await produce(c, TOPIC, 0, batch(pid, epoch, 8), acks=-1)
                assert gap.error_code is ErrorCode.OUT_OF_ORDER_SEQUENCE, gap
                nxt = await produce(c, TOPIC, 0, batch(pid, epoch, 6), acks=-1)
                assert nxt.error_code is ErrorCode.NONE and nxt.base_offset >= end, nxt
                values, _ = await fetch_values(c, TOPIC, 0)
                assert [v for _, v in values].count(b"seq-5") == 1 and [v for _, v in values].count(b"seq-1") == 1
        run(after())

        # The event loop's stalls are exported (values are figures, not asserted).
        scraped = scrape(cluster.brokers[1].metrics_port)
        for name, labels in (("biplane_broker_event_loop_stall_max_seconds", {}),
                             ("biplane_broker_event_loop_stalls_total", {}),
                             ("biplane_broker_event_loop_lag_seconds_bucket", {"le": "+Inf"}),
                             ("biplane_partition_producer_state_rebuilds_total", {"topic": TOPIC, "partition": "0"})):
            assert scraped.samples(name, **labels), (name, labels)
