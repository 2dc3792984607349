"""controller/views.topic_offsets and the CLI's units: a partition's offsets come from its
current leader's latest usage report, sizes of every replica that reported are summed, and a
partition whose leader has not reported shows nothing rather than a follower's figures."""
from __future__ import annotations

from common.usage import BrokerUsage, ReplicaUsage
from controller.admin_cli import human_age, human_bytes
from controller.views import topic_offsets
from metadata_builders import add_topic, cluster


def report(broker_id: int, at_ms: int, *replicas: tuple[str, int, int, int, int, int]) -> BrokerUsage:
    return BrokerUsage(broker_id=broker_id, at_ms=at_ms, disk_total_bytes=10**9, disk_used_bytes=0,
                       disk_free_bytes=10**9,
                       replicas=[ReplicaUsage(topic=t, partition=p, size_bytes=size, log_start_offset=start,
                                              log_end_offset=leo, high_watermark=hw)
                                 for t, p, size, start, hw, leo in replicas])


def test_offsets_come_from_the_leaders_report_and_say_how_old_it_is():
    image = cluster(3)
    add_topic(image, "t", [[1, 2], [2, 3], [3, 1]])   # leaders 1, 2, 3
    usage = {
        1: report(1, 9_000, ("t", 0, 4096, 0, 10, 12), ("t", 2, 100, 0, 3, 3), ("other", 0, 7, 0, 1, 1)),
        2: report(2, 9_500, ("t", 0, 4000, 0, 9, 11), ("t", 1, 2048, 5, 20, 20)),
    }
    out = topic_offsets(image, "t", usage, now_ms=10_000)
    assert out.topic == "t" and out.at_ms == 10_000 and out.metadata_offset == image.offset
    p0, p1, p2 = out.partitions
    assert (p0.leader, p0.log_start_offset, p0.high_watermark, p0.log_end_offset, p0.size_bytes) == (1, 0, 10, 12, 4096)
    assert p0.replicas_size_bytes == 4096 + 4000 and p0.age_ms == 1_000 and p0.reported_at_ms == 9_000
    assert (p1.leader, p1.log_start_offset, p1.high_watermark, p1.size_bytes, p1.age_ms) == (2, 5, 20, 2048, 500)
    # Partition 2's leader (3) has not reported: a follower's figures are not shown as the leader's.
    assert p2.leader == 3 and p2.high_watermark is None and p2.age_ms is None
    assert p2.replicas_size_bytes == 100


def test_sizes_and_ages_in_human_units():
    assert human_bytes(None) == "-" and human_bytes(0) == "0 B" and human_bytes(1023) == "1023 B"
    assert human_bytes(1536) == "1.5 KiB" and human_bytes(5 * 1024**3) == "5 GiB"
    assert human_bytes(1000 * 1024) == "1000 KiB" and human_bytes(3 * 1024**5) == "3072 TiB"
    assert human_age(250) == "250 ms ago" and human_age(1500) == "1.5 s ago" and human_age(None) == "-"
