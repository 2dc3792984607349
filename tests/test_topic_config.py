"""Topic config: defaults, validation with errors naming key and value, checked changes."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from common.errors import ErrorCode, InvalidConfigError, InvalidRequestError, InvalidTopicError
from common.metadata import TopicConfig, apply_config_changes, make_topic_config, validate_topic_name
from common.metadata.config import VALID_KEYS


def test_defaults_follow_the_design():
    c = TopicConfig()
    assert (c.replication_mode, c.commit_policy, c.durability) == ("pull", "isr", "fsync")
    assert c.segment_bytes == 128 * 1024 * 1024
    assert c.replica_lag_time_max_ms == 10_000
    assert c.retention_ms == 7 * 24 * 3600 * 1000
    assert c.unclean_leader_election is False


@pytest.mark.parametrize("rf,q", [(2, 2), (3, 2), (4, 3), (5, 3)])
def test_quorum_acks_default_to_a_majority(rf, q):
    c = TopicConfig(replication_factor=rf, commit_policy="quorum")
    assert c.quorum_required_acks == q


@pytest.mark.parametrize("rf,q", [(3, 1), (3, 4), (1, None)])
def test_quorum_outside_one_to_rf_is_refused(rf, q):
    values = {"replication_factor": rf, "commit_policy": "quorum"}
    if q is not None:
        values["quorum_required_acks"] = q
    with pytest.raises(InvalidConfigError) as exc:
        make_topic_config(values)
    assert exc.value.field == "quorum_required_acks"
    assert "1 < quorum_required_acks" in str(exc.value)
    assert exc.value.code == ErrorCode.INVALID_CONFIG


def test_min_insync_above_rf_is_refused_naming_both():
    with pytest.raises(InvalidConfigError) as exc:
        make_topic_config({"replication_factor": 2, "min_insync_replicas": 3})
    assert exc.value.field == "min_insync_replicas"
    assert "min_insync_replicas=3" in str(exc.value) and "(2)" in str(exc.value)


@pytest.mark.parametrize("key,value,expect", [
    ("retention_ms", -2, "must be at least -1"),
    ("segment_bytes", 10, "must be at least 1024"),
    ("replication_mode", "carrier-pigeon", "'pull' or 'push'"),
    ("durability", "maybe", "'fsync' or 'write'"),
    ("flush_debounce_ms", "soon", "must be a whole number"),
    ("unclean_leader_election", "perhaps", "must be true or false"),
    ("cleanup_policy", "archive", "delete, compact or compact,delete"),
    ("min_cleanable_dirty_ratio", "2", "must be at most 1"),
    ("min_compaction_lag_ms", "-1", "must be at least 0"),
    ("delete_retention_ms", "never", "must be a whole number"),
])
def test_bad_value_names_key_value_and_allowed(key, value, expect):
    with pytest.raises(InvalidConfigError) as exc:
        apply_config_changes(TopicConfig(), {key: value})
    assert exc.value.field == key
    assert exc.value.value == value
    assert key in str(exc.value) and repr(value) in str(exc.value) and expect in str(exc.value)


def test_unknown_key_names_it_and_lists_valid_keys():
    with pytest.raises(InvalidConfigError) as exc:
        apply_config_changes(TopicConfig(), {"cleanup_polcy": "compact"})
    assert exc.value.field == "cleanup_polcy"
    assert "cleanup_polcy" in str(exc.value)
    for key in VALID_KEYS:
        assert key in str(exc.value)


def test_strings_from_a_cli_are_coerced_and_dotted_keys_accepted():
    c = apply_config_changes(TopicConfig(replication_factor=3),
                             {"min.insync.replicas": "2", "unclean_leader_election": "true",
                              "retention-ms": "-1"})
    assert (c.min_insync_replicas, c.unclean_leader_election, c.retention_ms) == (2, True, -1)


def test_none_resets_a_key_to_its_default():
    c = apply_config_changes(TopicConfig(), {"retention_ms": 5})
    assert apply_config_changes(c, {"retention_ms": None}).retention_ms == TopicConfig().retention_ms


def test_related_keys_change_together():
    """isr -> quorum with q=3 on rf=3 is valid as a whole."""
    c = apply_config_changes(TopicConfig(replication_factor=3),
                             {"commit_policy": "quorum", "quorum_required_acks": 3})
    assert (c.commit_policy, c.quorum_required_acks) == ("quorum", 3)


@pytest.mark.parametrize("key", ["partitions", "replication_factor"])
def test_partitions_and_rf_cannot_be_altered(key):
    with pytest.raises(InvalidRequestError) as exc:
        apply_config_changes(TopicConfig(), {key: 5})
    assert exc.value.field == key
    assert exc.value.code in (ErrorCode.INVALID_PARTITIONS, ErrorCode.INVALID_REPLICATION_FACTOR)


def test_partitions_out_of_range_has_its_own_code():
    with pytest.raises(InvalidRequestError) as exc:
        make_topic_config({"partitions": 0})
    assert exc.value.code == ErrorCode.INVALID_PARTITIONS and exc.value.field == "partitions"


@pytest.mark.parametrize("name", ["orders", "a.b_c-D9", "x" * 249])
def test_legal_topic_names(name):
    assert validate_topic_name(name) == name


@pytest.mark.parametrize("name,why", [
    ("", "length 0"), ("x" * 250, "length 250"), (".", "reserved"), ("..", "reserved"),
    ("a b", "illegal characters ' '"), ("a/b", "illegal characters '/'"),
])
def test_illegal_topic_names_are_refused_with_the_reason(name, why):
    with pytest.raises(InvalidTopicError) as exc:
        validate_topic_name(name)
    assert why in str(exc.value)
    assert exc.value.field == "name" and exc.value.value == name
    assert exc.value.code == ErrorCode.INVALID_TOPIC


@given(st.builds(TopicConfig, partitions=st.integers(1, 10_000),
                 replication_factor=st.integers(2, 7), commit_policy=st.sampled_from(["isr", "quorum"]),
                 retention_ms=st.integers(-1, 2**40), segment_bytes=st.integers(1024, 2**31 - 1)))
def test_config_round_trips_through_its_dump(config):
    assert TopicConfig.model_validate(config.model_dump(mode="json")) == config


def test_cleanup_policy_takes_kafkas_list_in_any_order_and_resets_to_delete():
    config = apply_config_changes(TopicConfig(), {"cleanup.policy": "delete, compact"})
    assert config.cleanup_policy == "compact,delete" and config.compacted and config.retention_deletes
    compact = apply_config_changes(config, {"cleanup_policy": "compact"})
    assert compact.compacted and not compact.retention_deletes
    assert apply_config_changes(compact, {"cleanup_policy": None}).cleanup_policy == "delete"


def test_the_flush_debounce_a_topic_does_not_set_follows_its_durability():
    """Claim: without flush_debounce_ms a topic waits 5 ms under fsync (its acks=0/1 records
    are readable once flushed) and 100 ms under write (a flush is news to nobody there); an
    alter of durability moves that default along, a value the topic sets stays, and what the
    replicas take (ReplicationConfig) and the admin API shows is the value in force."""
    from dataplane.replica.state import ReplicationConfig
    fsync, write = make_topic_config({}), make_topic_config({"durability": "write"})
    assert (fsync.flush_debounce_ms, write.flush_debounce_ms) == (None, None)
    assert (fsync.effective_flush_debounce_ms, write.effective_flush_debounce_ms) == (5, 100)
    assert apply_config_changes(fsync, {"durability": "write"}).effective_flush_debounce_ms == 100
    assert apply_config_changes(write, {"durability": "fsync"}).effective_flush_debounce_ms == 5
    pinned = apply_config_changes(write, {"flush_debounce_ms": 20})
    assert apply_config_changes(pinned, {"durability": "fsync"}).effective_flush_debounce_ms == 20
    assert apply_config_changes(pinned, {"flush_debounce_ms": None}).effective_flush_debounce_ms == 100
    assert ReplicationConfig.from_topic_config(write).flush_debounce_ms == 100
    assert write.in_force()["flush_debounce_ms"] == 100 and pinned.in_force()["flush_debounce_ms"] == 20
