"""Kafka topic config names and values mapped onto Biplane's (dataplane/kafka/configs.py):
describe every config with its source, translate changes, refuse what Biplane cannot honour."""
from __future__ import annotations

import pytest

from common.errors import ErrorCode, InvalidConfigError, InvalidFieldError
from common.metadata.config import TopicConfig, apply_config_changes, make_topic_config
from dataplane.kafka import configs
from dataplane.kafka.configs import LONG_MAX


def entries(config: TopicConfig) -> dict[str, configs.ConfigEntry]:
    return {e.name: e for e in configs.describe(config)}


def test_describe_names_every_config_once_with_kafka_values_and_defaults():
    described = entries(TopicConfig(replication_factor=3))
    assert sorted(described) == configs.known_names()
    assert described["retention.ms"].value == str(7 * 24 * 3600 * 1000)
    assert described["unclean.leader.election.enable"].value == "false"
    assert described["cleanup.policy"].value == "delete"
    assert described["compression.type"].value == "producer"
    assert described["flush.messages"].value == "1"          # durability=fsync by default
    assert described["biplane.commit.policy"].value == "isr"
    assert described["biplane.quorum.required.acks"].value == "2"   # resolved majority of 3
    assert all(e.source == "DEFAULT" and not e.sensitive for e in described.values())
    assert described["flush.ms"].read_only and not described["retention.ms"].read_only
    assert described["retention.ms"].config_type == configs.LONG
    assert described["unclean.leader.election.enable"].config_type == configs.BOOLEAN


def test_a_changed_value_is_described_as_set_on_the_topic():
    config = make_topic_config({"replication_factor": 3, "retention_ms": 60_000, "durability": "write",
                                "commit_policy": "quorum"})
    described = entries(config)
    assert described["retention.ms"].value == "60000" and described["retention.ms"].source == "TOPIC"
    assert described["flush.messages"].value == str(LONG_MAX) and described["flush.messages"].source == "TOPIC"
    # Replicas fsync flush_debounce_ms after a write under either durability, not never.
    assert described["flush.ms"].value == "100" and described["flush.ms"].source == "DEFAULT"   # write's own
    assert described["biplane.flush.debounce.ms"].value == "100"
    assert entries(make_topic_config({}))["flush.ms"].value == "5"   # fsync's
    assert entries(make_topic_config({"flush_debounce_ms": 40}))["flush.ms"].value == "40"
    assert described["biplane.commit.policy"].source == "TOPIC"
    assert described["segment.bytes"].source == "DEFAULT"


def test_describe_of_named_configs_keeps_their_order_and_refuses_an_unknown_one():
    assert [e.name for e in configs.describe(TopicConfig(), ["segment.ms", "retention.ms"])] == \
        ["segment.ms", "retention.ms"]
    with pytest.raises(InvalidConfigError, match="unknown topic config 'colour'"):
        configs.describe(TopicConfig(), ["colour"])


def test_kafka_strings_become_biplane_values():
    assert configs.to_biplane({"retention.ms": "1000", "unclean.leader.election.enable": "TRUE",
                               "biplane.commit.policy": "quorum", "biplane.quorum.required.acks": "2",
                               "flush.messages": str(LONG_MAX), "cleanup.policy": "delete",
                               "compression.type": "producer"}) == \
        {"retention_ms": 1000, "unclean_leader_election": True, "commit_policy": "quorum",
         "quorum_required_acks": 2, "durability": "write", "cleanup_policy": "delete"}
    assert configs.to_biplane({"flush.messages": "1"}) == {"durability": "fsync"}
    assert configs.to_biplane({"retention.ms": None}) == {"retention_ms": None}


@pytest.mark.parametrize("name, value, words", [
    ("colour", "red", ["unknown topic config 'colour'", "retention.ms"]),
    ("retention.ms", "soon", ["invalid value 'soon'", "'retention.ms'", "whole number"]),
    ("unclean.leader.election.enable", "yes", ["invalid value 'yes'", "true or false"]),
    ("min.cleanable.dirty.ratio", "half", ["invalid value 'half'", "'min.cleanable.dirty.ratio'", "0.5"]),
    ("compression.type", "zstd", ["only compression.type=producer", "never recompress"]),
    ("message.timestamp.type", "LogAppendTime", ["only message.timestamp.type=CreateTime"]),
    ("flush.messages", "1000", ["invalid value '1000'", "biplane.durability"]),
    ("flush.ms", "1000", ["read-only", "biplane.flush.debounce.ms"]),
    ("biplane.partitions", "3", ["unknown topic config 'biplane.partitions'"]),
    ("segment.index.bytes", "4096", ["unknown topic config"]),
])
def test_what_biplane_cannot_honour_is_refused_naming_key_and_value(name, value, words):
    with pytest.raises(InvalidConfigError) as exc:
        configs.to_biplane({name: value})
    assert exc.value.code == ErrorCode.INVALID_CONFIG
    assert exc.value.field == name and exc.value.value == value
    for word in words:
        assert word in str(exc.value), str(exc.value)


def test_compaction_configs_map_onto_biplane_keys_and_describe_back():
    changes = configs.to_biplane({"cleanup.policy": "delete,compact", "delete.retention.ms": "1000",
                                  "min.cleanable.dirty.ratio": "0.1", "min.compaction.lag.ms": "5"})
    config = make_topic_config(changes)
    assert (config.cleanup_policy, config.delete_retention_ms, config.min_cleanable_dirty_ratio,
            config.min_compaction_lag_ms) == ("compact,delete", 1000, 0.1, 5)
    described = entries(config)
    assert described["cleanup.policy"].value == "compact,delete"
    assert described["cleanup.policy"].source == "TOPIC" and described["cleanup.policy"].config_type == configs.LIST
    assert described["min.cleanable.dirty.ratio"].value == "0.1"
    assert described["min.cleanable.dirty.ratio"].config_type == configs.DOUBLE
    assert described["delete.retention.ms"].value == "1000"
    assert entries(TopicConfig())["delete.retention.ms"].source == "DEFAULT"


@pytest.mark.parametrize("name, value, words", [
    ("cleanup.policy", "archive", ["'cleanup.policy'", "delete, compact or compact,delete"]),
    ("min.cleanable.dirty.ratio", "1.5", ["'min.cleanable.dirty.ratio'", "must be at most 1"]),
    ("delete.retention.ms", "-1", ["'delete.retention.ms'", "must be at least 0"]),
    ("min.compaction.lag.ms", "-5", ["'min.compaction.lag.ms'", "must be at least 0"]),
])
def test_compaction_values_out_of_bounds_are_refused_by_the_controllers_rules(name, value, words):
    with pytest.raises(InvalidFieldError) as exc:
        make_topic_config(configs.to_biplane({name: value}))
    message = str(configs.in_kafka_terms(exc.value))
    for word in words:
        assert word in message, message


def test_two_kafka_names_for_one_biplane_key_must_agree():
    with pytest.raises(InvalidConfigError, match="disagree about biplane.durability"):
        configs.to_biplane({"flush.messages": "1", "biplane.durability": "write"})
    assert configs.to_biplane({"flush.messages": "1", "biplane.durability": "fsync"}) == {"durability": "fsync"}


def test_create_config_leaves_out_nulls():
    assert configs.create_config({"retention.ms": "5", "segment.ms": None}) == {"retention_ms": 5}


def test_alter_configs_replaces_every_setting_incremental_only_the_named():
    whole = configs.alter_request({"retention.ms": "5"}, replace_all=True)
    assert whole.set == {"retention_ms": 5}
    assert "segment_bytes" in whole.reset and "durability" in whole.reset and "retention_ms" not in whole.reset
    # How the topic replicates and commits is fixed at creation: a whole replace leaves it be.
    assert not {"commit_policy", "replication_mode", "quorum_required_acks"} & set(whole.reset)
    some = configs.alter_request(configs.incremental_entries([("retention.ms", 0, "5"), ("segment.ms", 1, None)]),
                                 replace_all=False)
    assert some.set == {"retention_ms": 5} and some.reset == ["segment_ms"]
    # What the controller's decision does with it: the same rules as every other path.
    config = apply_config_changes(make_topic_config({"segment_ms": 9}), {**some.set, **{k: None for k in some.reset}})
    assert config.retention_ms == 5 and config.segment_ms == TopicConfig().segment_ms


@pytest.mark.parametrize("op", [2, 3, 7])
def test_append_subtract_and_unknown_operations_are_refused(op):
    with pytest.raises(InvalidConfigError, match=f"operation {op} on topic config 'retention.ms' is refused"):
        configs.incremental_entries([("retention.ms", op, "5")])


def test_a_config_altered_twice_in_one_request_is_refused():
    with pytest.raises(InvalidConfigError, match="altered twice"):
        configs.incremental_entries([("retention.ms", 0, "5"), ("retention.ms", 1, None)])


def test_an_error_of_the_controllers_rules_names_the_kafka_config():
    with pytest.raises(InvalidFieldError) as exc:
        apply_config_changes(TopicConfig(replication_factor=3), {"min_insync_replicas": 4})
    kafka = configs.in_kafka_terms(exc.value)
    assert kafka.code == ErrorCode.INVALID_CONFIG and kafka.field == "min.insync.replicas"
    assert "min.insync.replicas" in str(kafka) and "exceeds" in str(kafka)
    assert configs.kafka_name("commit_policy") == "biplane.commit.policy"


def test_the_controllers_config_messages_are_told_in_kafka_names():
    message = ("invalid value 9 for topic config 'min_insync_replicas': min_insync_replicas=9 exceeds "
               "replication_factor (3)")
    assert configs.kafka_words(message) == ("invalid value 9 for topic config 'min.insync.replicas': "
                                            "min.insync.replicas=9 exceeds replication_factor (3)")
