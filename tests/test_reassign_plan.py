"""Reassignment plans, their cancel and progress, the replication throttle, and the dynamic
cluster config: pure decisions, the image's record, the broker's throttle arithmetic."""
from __future__ import annotations

import random

import pytest

from common.errors import ErrorCode, InvalidConfigError, InvalidFieldError
from common.metadata import AlterClusterConfig, MetadataImage, RecordRejected
from common.requests import CancelReassignmentsRequest, ClusterConfigRequest, ReassignmentPlanRequest
from common.topic_partition import TopicPartition
from common.usage import BrokerUsage, ReplicaUsage
from controller.admin_cli import CliError, parse_bytes, read_plan
from controller.decisions import alter_cluster_config, cancel_many, start_plan
from controller.views import reassignment_progress
from dataplane.broker.throttle import ReplicationThrottle
from metadata_builders import add_topic, apply, cluster


def plan(*moves: tuple[str, int, list[int]], throttle: int | None = None) -> ReassignmentPlanRequest:
    return ReassignmentPlanRequest.model_validate({
        "partitions": [{"topic": t, "partition": p, "replicas": r} for t, p, r in moves],
        "throttle_bytes_per_s": throttle})


def test_a_plan_starts_every_move_and_sets_the_throttle_in_the_same_batch():
    image = cluster(4)
    add_topic(image, "t", [[1, 2], [2, 3], [3, 1]])
    records = start_plan(image, plan(("t", 0, [3, 4]), ("t", 1, [2, 4]), throttle=65536))
    assert isinstance(records[0], AlterClusterConfig)
    apply(image, records)
    assert image.cluster_config.reassignment_throttle_bytes_per_s == 65536
    assert image.partition("t", 0).target_replicas == (3, 4) and image.partition("t", 0).adding == (3, 4)
    assert image.partition("t", 1).adding == (4,) and image.partition("t", 1).removing == (3,)
    assert not image.partition("t", 2).reassigning


def test_a_plan_is_all_or_none_and_names_the_entry_at_fault():
    image = cluster(3)
    add_topic(image, "t", [[1, 2], [2, 3]])
    with pytest.raises(InvalidFieldError) as err:
        start_plan(image, plan(("t", 0, [3, 1]), ("t", 1, [2, 9])))
    assert "partitions[1] (t-1)" in str(err.value) and "broker 9" in str(err.value)
    assert "nothing in the plan was started" in str(err.value) and err.value.field == "partitions.1"
    assert not image.partition("t", 0).reassigning
    with pytest.raises(InvalidFieldError, match="in the plan twice"):
        start_plan(image, plan(("t", 0, [3, 1]), ("t", 0, [2, 1])))
    with pytest.raises(InvalidFieldError) as unknown:
        start_plan(image, plan(("nope", 0, [1])))
    assert unknown.value.code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def test_cancel_returns_every_named_move_to_its_original_replica_set():
    image = cluster(4)
    add_topic(image, "t", [[1, 2], [2, 3], [3, 1]])
    apply(image, start_plan(image, plan(("t", 0, [3, 4]), ("t", 1, [4, 1]))))
    apply(image, cancel_many(image, CancelReassignmentsRequest.model_validate(
        {"partitions": [{"topic": "t", "partition": 0}]})))
    assert set(image.partition("t", 0).replicas) == {1, 2} and not image.partition("t", 0).reassigning
    assert image.partition("t", 1).reassigning
    apply(image, cancel_many(image, CancelReassignmentsRequest()))
    assert set(image.partition("t", 1).replicas) == {2, 3} and not any(p.reassigning for p in image.partitions())
    assert cancel_many(image, CancelReassignmentsRequest()) == []


def test_progress_compares_each_added_replica_with_the_leader():
    image = cluster(3)
    add_topic(image, "t", [[1, 2]])
    apply(image, start_plan(image, plan(("t", 0, [1, 3]), throttle=4096)))

    def usage(b: int, leo: int, size: int) -> BrokerUsage:
        return BrokerUsage(broker_id=b, at_ms=0, disk_total_bytes=1, disk_used_bytes=0, disk_free_bytes=1,
                           replicas=[ReplicaUsage(topic="t", partition=0, size_bytes=size, log_start_offset=0,
                                                  log_end_offset=leo, high_watermark=leo)])
    out = reassignment_progress(image, {1: usage(1, 100, 10_000), 3: usage(3, 40, 4_000)}, now_ms=5)
    assert out.throttle_bytes_per_s == 4096
    (move,) = out.partitions
    assert move.target_replicas == [1, 3] and move.removing == [2] and move.leader_log_end_offset == 100
    (new,) = move.moving
    assert (new.broker_id, new.in_isr, new.offsets_behind, new.bytes_behind) == (3, False, 60, 6_000)
    assert reassignment_progress(image, {}, now_ms=5).partitions[0].moving[0].log_end_offset is None


def test_cluster_config_changes_are_checked_and_stored_in_their_own_types():
    image = cluster(1)
    records = alter_cluster_config(image, ClusterConfigRequest(set={"default_partitions": "6",
                                                                    "auto_create_topics": True}))
    assert records == [AlterClusterConfig(changes={"default_partitions": 6, "auto_create_topics": True})]
    apply(image, records)
    assert image.cluster_config.default_partitions == 6
    assert alter_cluster_config(image, ClusterConfigRequest(set={"default_partitions": 6})) == []
    with pytest.raises(InvalidConfigError, match="unknown cluster config key 'colour'"):
        alter_cluster_config(image, ClusterConfigRequest(set={"colour": 1}))
    with pytest.raises(InvalidConfigError) as small:
        alter_cluster_config(image, ClusterConfigRequest(set={"reassignment_throttle_bytes_per_s": 10}))
    assert small.value.field == "reassignment_throttle_bytes_per_s" and "must be at least 1024" in str(small.value)
    with pytest.raises(InvalidConfigError, match="nothing to change"):
        alter_cluster_config(image, ClusterConfigRequest())
    apply(image, alter_cluster_config(image, ClusterConfigRequest(reset=["default_partitions"])))
    assert image.cluster_config.default_partitions is None
    # A bad record is rejected by the image itself, which stays as it was.
    with pytest.raises(RecordRejected):
        image.apply(AlterClusterConfig(changes={"default_partitions": 0}), image.offset + 1)
    again = MetadataImage.from_dict(image.to_dict())
    assert again == image and again.cluster_config.auto_create_topics is True


def test_the_throttle_keeps_bytes_within_rate_times_time_plus_a_burst():
    """Oracle: over any run of fetches the throttle allows, bytes <= rate * elapsed + burst + the
    last answer (an answer is taken whole)."""
    rng = random.Random(7)
    for _ in range(50):
        rate = rng.choice([1024, 10_000, 1_000_000])
        t = ReplicationThrottle(burst_s=1.0)
        tp = TopicPartition("t", 0)
        t.configure(rate, frozenset({tp}))
        now, total, biggest = 0.0, 0, 0
        for _ in range(200):
            now += rng.uniform(0, 0.2)
            wait = t.wait_s(now)
            if wait > 0:
                now += wait
                assert t.wait_s(now) == pytest.approx(0.0, abs=1e-9)
            n = rng.randint(0, t.partition_fetch_bytes(1 << 20))
            t.record(now, n)
            total += n
            biggest = max(biggest, n)
            assert total <= rate * (now + 1.0) + biggest, f"seed=7 rate={rate}"
    assert t.applies(tp) and not t.applies(TopicPartition("t", 1))
    t.configure(None, frozenset({tp}))
    assert not t.applies(tp) and t.wait_s(10**6) == 0.0


def test_plan_files_and_sizes_on_the_command_line(tmp_path):
    assert parse_bytes("10MiB", "--throttle") == 10 * 1024**2 and parse_bytes("512k", "x") == 512 * 1024
    assert parse_bytes("2048", "x") == 2048 and parse_bytes("1.5 MiB/s", "x") == 1572864
    with pytest.raises(CliError, match="is not a size"):
        parse_bytes("fast", "--throttle")
    f = tmp_path / "plan.json"
    f.write_text('{"version": 1, "partitions": [{"topic": "t", "partition": 0, "replicas": [1, 2], '
                 '"bytes": 123, "log_dirs": ["any"]}], "throttle_bytes_per_s": 4096}')
    assert read_plan(str(f)) == {"version": 1, "partitions": [{"topic": "t", "partition": 0, "replicas": [1, 2]}],
                                 "throttle_bytes_per_s": 4096}
    f.write_text('{"partitions": [{"topic": "t"}]}')
    with pytest.raises(CliError, match=r"partitions\[0\] must have topic, partition and replicas"):
        read_plan(str(f))
    f.write_text("{not json")
    with pytest.raises(CliError, match="is not JSON"):
        read_plan(str(f))
    with pytest.raises(CliError, match="cannot read the plan"):
        read_plan(str(tmp_path / "missing.json"))
    # A capacity report's plan when nothing needs to move is a plan, not a malformed file.
    f.write_text('{"version": 1, "partitions": []}')
    assert read_plan(str(f))["partitions"] == []
    f.write_text('{"version": 1}')
    with pytest.raises(CliError, match='must be an object with a "partitions" list'):
        read_plan(str(f))
