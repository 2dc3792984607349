"""A leader killed with kill -9 while a confluent-kafka idempotent producer (acks=all)
runs: every acknowledged record is in the log once, none twice, in produce order."""
from __future__ import annotations

import time

import pytest

from cluster_harness import Cluster

pytestmark = pytest.mark.slow

confluent_kafka = pytest.importorskip("confluent_kafka")


def read_all(bootstrap: str, topic: str) -> list[bytes]:
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": "unused",
                                         "enable.auto.commit": False})
    try:
        _, high = consumer.get_watermark_offsets(confluent_kafka.TopicPartition(topic, 0), timeout=20)
        consumer.assign([confluent_kafka.TopicPartition(topic, 0, 0)])
        values: list[bytes] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is None:
                continue
            assert m.error() is None, m.error()
            values.append(m.value())
            if m.offset() >= high - 1:
                return values
        raise AssertionError(f"read {len(values)} records, never reached the HW {high}")
    finally:
        consumer.close()


def test_idempotent_producer_across_a_leader_kill(tmp_path) -> None:
    with Cluster(tmp_path, brokers=3) as cluster:
        cluster.create_topic("k", partitions=1, replication_factor=3, config={"min_insync_replicas": 2})
        producer = confluent_kafka.Producer({
            "bootstrap.servers": cluster.kafka_bootstrap, "enable.idempotence": True, "acks": "all",
            "linger.ms": 2, "delivery.timeout.ms": 60_000, "retry.backoff.ms": 100})
        acked: list[bytes] = []
        failed: list[tuple[bytes, str]] = []

        def report(err, msg) -> None:
            if err is None:
                acked.append(msg.value())
            else:
                failed.append((msg.value(), str(err)))

        sent = 0
        killed_at_acked = None
        leader = cluster.wait_leader("k", 0)
        started = time.monotonic()
        while time.monotonic() - started < 8:
            elapsed = time.monotonic() - started
            if killed_at_acked is None and elapsed > 2:
                killed_at_acked = len(acked)
                cluster.brokers[leader].kill()
            if killed_at_acked is not None and elapsed > 3 and not cluster.brokers[leader].alive():
                cluster.brokers[leader].start()
            try:
                producer.produce("k", value=b"v-%06d" % sent, partition=0, on_delivery=report)
                sent += 1
            except BufferError:
                pass
            producer.poll(0.001)
        assert producer.flush(90) == 0
        assert killed_at_acked is not None and len(acked) > killed_at_acked + 100, (killed_at_acked, len(acked))
        log = read_all(cluster.kafka_bootstrap, "k")
        assert len(log) == len(set(log)), "a record is in the log twice"
        positions = {v: i for i, v in enumerate(log)}
        missing = [v for v in acked if v not in positions]
        assert not missing, f"{len(missing)} acknowledged records lost, first {missing[:3]}"
        in_log = [positions[v] for v in acked]
        assert in_log == sorted(in_log), "acknowledged records out of produce order"
        assert sorted(log) == log  # nothing but what this producer sent, in its order
        print(f"sent={sent} acked={len(acked)} failed={len(failed)} stored={len(log)} "
              f"acked_before_kill={killed_at_acked} failures={failed[:3]}")
