"""The guardrails' pure parts: the write buckets, the nesting scan and the partition limits."""
from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from common.errors import InvalidPartitionsError
from common.requests import AddPartitionsRequest, CreateTopicRequest
from controller import decisions as d
from controller.decisions.limits import PartitionLimits
from controller.guardrails import ApiLimits, WriteBuckets, json_too_deep, retry_after_header
from metadata_builders import apply, cluster


# ---- write buckets

def test_a_bucket_lets_the_burst_in_then_refuses_until_the_rate_refills_it():
    b = WriteBuckets(rate_per_s=2, burst=3)
    for _ in range(3):
        assert b.admit("t", 10.0) is None
        b.charge("t", 1, 10.0)
    assert b.admit("t", 10.0) == pytest.approx(0.0, abs=1e-6)   # empty: refused, at once refilling
    assert b.admit("t", 10.0) is not None
    assert b.admit("t", 10.1) is None                            # 0.2 units back
    assert b.admit("other", 10.0) is None                        # per token


def test_a_large_write_takes_the_bucket_below_zero_and_the_wait_is_its_cost():
    b = WriteBuckets(rate_per_s=10, burst=100)
    assert b.admit("t", 0.0) is None
    b.charge("t", 1000, 0.0)                                     # a 1000-partition topic
    assert b.admit("t", 0.0) == pytest.approx(90.0)             # 900 below zero at 10 a second
    assert b.admit("t", 89.0) == pytest.approx(1.0)
    assert b.admit("t", 90.01) is None


def test_a_bucket_refills_only_up_to_the_burst():
    b = WriteBuckets(rate_per_s=100, burst=5)
    b.charge("t", 1, 0.0)
    b.charge("t", 5, 1000.0)                                     # long idle: full at 5, not 100 000
    assert b.admit("t", 1000.0) is not None


def test_buckets_are_bounded_in_number():
    b = WriteBuckets(rate_per_s=1, burst=1)
    for i in range(WriteBuckets.KEYS_MAX + 10):
        b.charge(f"k{i}", 1, float(i))
    assert len(b._buckets) == WriteBuckets.KEYS_MAX


@pytest.mark.parametrize("seconds, header", [(0.01, "1"), (1.0, "1"), (1.2, "2"), (30.5, "31")])
def test_retry_after_rounds_up_to_whole_seconds(seconds, header):
    assert retry_after_header(seconds) == header


@pytest.mark.parametrize("field, value", [("write_rate_per_s", 0), ("write_burst", 0.5),
                                          ("write_rate_per_s", float("inf")), ("write_burst", float("nan")),
                                          ("body_bytes_max", 1), ("json_depth_max", 0)])
def test_api_limits_refuse_values_that_would_block_everything(field, value):
    with pytest.raises(ValueError, match=field):
        ApiLimits(**{field: value})


# ---- nesting

def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


@pytest.mark.parametrize("raw, limit, deep", [
    (nested(32), 32, False), (nested(33), 32, True), (b'{"a": {"b": [1, {"c": []}]}}', 5, False),
    (b'{"a": {"b": [1, {"c": []}]}}', 4, True), (b'["[[[[[[", "{{{{{{{{"]', 1, False),
    (b'["\\"[[[[[[[["]', 1, False), (b'{"a": "\\\\", "b": [[[]]]}', 3, True), (b"[" * 100_000, 32, True),
    (b'"[[[[[[[[[[', 2, False),
])
def test_nesting_scan(raw, limit, deep):
    assert json_too_deep(raw, limit) is deep


@given(st.recursive(st.none() | st.integers() | st.text(alphabet='[]{}"\\ab'),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(alphabet='[]{}"\\'), inner,
                                                                                  max_size=3), max_leaves=20))
def test_nesting_scan_agrees_with_the_parsed_depth(doc):
    def depth(v) -> int:
        if isinstance(v, list):
            return 1 + max((depth(x) for x in v), default=0)
        if isinstance(v, dict):
            return 1 + max((depth(x) for x in v.values()), default=0)
        return 0
    raw = json.dumps(doc).encode()
    actual = depth(doc)
    assert not json_too_deep(raw, max(1, actual))
    if actual > 1:
        assert json_too_deep(raw, actual - 1)


# ---- partition limits (decisions)

def test_create_topic_over_the_per_topic_limit_is_refused_naming_the_flag():
    image = cluster(3)
    limits = PartitionLimits(max_partitions_per_topic=5)
    with pytest.raises(InvalidPartitionsError) as exc:
        d.create_topic(image, CreateTopicRequest(name="t", partitions=6), 0, limits)
    assert exc.value.field == "partitions" and exc.value.value == 6
    assert "limit of 5 partitions per topic" in str(exc.value) and "--max-partitions-per-topic" in str(exc.value)
    assert len(d.create_topic(image, CreateTopicRequest(name="t", partitions=5), 0, limits)) == 6


def test_replica_assignment_counts_towards_the_limits():
    image = cluster(3)
    limits = PartitionLimits(max_partitions_per_topic=2)
    with pytest.raises(InvalidPartitionsError, match="partitions 3"):
        d.create_topic(image, CreateTopicRequest(name="t", replica_assignment=[[1], [2], [3]]), 0, limits)


def test_cluster_limit_counts_replicas_per_registered_broker():
    image = cluster(2)
    limits = PartitionLimits(max_partitions_per_broker=5)          # 10 replicas in the cluster
    image = apply(image, d.create_topic(image, CreateTopicRequest(name="a", partitions=4, replication_factor=2),
                                        0, limits))
    with pytest.raises(InvalidPartitionsError) as exc:
        d.create_topic(image, CreateTopicRequest(name="b", partitions=2, replication_factor=2), 0, limits)
    message = str(exc.value)
    assert "12 partition replicas" in message and "limit of 10" in message and "at most 1 more" in message
    with pytest.raises(InvalidPartitionsError, match="--max-partitions-per-broker"):
        d.add_partitions(image, "a", AddPartitionsRequest(partitions=6), limits)
    assert d.add_partitions(image, "a", AddPartitionsRequest(partitions=5), limits)


def test_the_default_limits_apply_when_none_are_given():
    image = cluster(1)
    with pytest.raises(InvalidPartitionsError, match="limit of 1000 partitions per topic"):
        d.create_topic(image, CreateTopicRequest(name="t", partitions=1001), 0)


@pytest.mark.parametrize("kwargs", [{"max_partitions_per_topic": 0}, {"max_partitions_per_topic": 10_001},
                                    {"max_partitions_per_broker": 0}])
def test_limits_out_of_range_are_refused(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        PartitionLimits(**kwargs)


def test_a_topic_already_at_a_lowered_limit_is_told_none_can_be_added():
    image = cluster(1)
    apply(image, d.create_topic(image, CreateTopicRequest(name="t", partitions=4), 0))
    with pytest.raises(InvalidPartitionsError, match="it has 4 already, so none can be added"):
        d.add_partitions(image, "t", AddPartitionsRequest(partitions=5), PartitionLimits(max_partitions_per_topic=3))
