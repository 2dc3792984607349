"""Metadata records: JSON round trips and validation of malformed records."""
from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from common.metadata import (
    NO_CHANGE,
    NO_LEADER,
    AddPartitions,
    AlterTopicConfig,
    ConfigChange,
    CreateTopic,
    DeleteTopic,
    FenceBroker,
    NoOp,
    PartitionChange,
    PartitionRecord,
    ProducerIdBlock,
    RegisterBroker,
    TopicConfig,
    UnfenceBroker,
    UnregisterBroker,
    dump_record,
    parse_record,
)

ids = st.integers(min_value=0, max_value=10_000)
replica_lists = st.lists(ids, min_size=1, max_size=5, unique=True).map(tuple)
names = st.from_regex(r"[A-Za-z0-9._-]{3,20}", fullmatch=True)

records = st.one_of(
    st.builds(RegisterBroker, broker_id=ids, incarnation_id=st.uuids().map(str),
              host=st.just("h"), port=st.integers(1, 65535),
              rack=st.none() | st.text(max_size=5), priority=st.integers(0, 1000),
              clean_shutdown=st.booleans(), at_ms=st.integers(0, 2**50)),
    st.builds(FenceBroker, broker_id=ids, at_ms=st.integers(0, 2**50), reason=st.text(max_size=10)),
    st.builds(UnfenceBroker, broker_id=ids, at_ms=st.integers(0, 2**50)),
    st.builds(UnregisterBroker, broker_id=ids, at_ms=st.integers(0, 2**50)),
    st.builds(CreateTopic, name=names, topic_id=st.uuids().map(str),
              config=st.builds(TopicConfig, partitions=st.integers(1, 100),
                               replication_factor=st.integers(1, 5))),
    st.builds(AddPartitions, topic=names, topic_id=st.uuids().map(str), partitions=st.integers(2, 10_000)),
    st.builds(PartitionRecord, topic=names, partition=st.integers(0, 100), replicas=replica_lists,
              isr=replica_lists, leader=st.none() | ids, leader_epoch=st.integers(0, 2**40),
              partition_epoch=st.integers(0, 2**40)),
    st.builds(PartitionChange, topic=names, partition=st.integers(0, 100),
              expected_partition_epoch=st.none() | st.integers(0, 99),
              leader=st.integers(NO_CHANGE, 50), isr=st.none() | replica_lists,
              replicas=st.none() | replica_lists, adding=st.none() | replica_lists,
              removing=st.none() | replica_lists),
    st.builds(DeleteTopic, name=names, topic_id=st.uuids().map(str)),
    st.builds(ConfigChange, topic=names, key=names,
              value=st.none() | st.booleans() | st.integers() | st.text(max_size=8)),
    st.builds(AlterTopicConfig, topic=names,
              changes=st.dictionaries(names, st.none() | st.integers() | st.text(max_size=4),
                                      min_size=1, max_size=3)),
    st.builds(ProducerIdBlock, broker_id=ids, first_id=st.integers(0, 2**50),
              size=st.integers(1, 1000)),
    st.builds(NoOp, controller_id=st.none() | ids, reason=st.text(max_size=8)),
)


@given(records)
def test_every_record_round_trips_through_plain_json(record):
    """dump_record gives plain JSON types; parse_record(json) rebuilds an equal record."""
    d = dump_record(record)
    text = json.dumps(d)  # raises if anything is not plain JSON
    again = parse_record(json.loads(text))
    assert again == record
    assert type(again) is type(record)


def test_config_change_keeps_bool_and_int_apart():
    """A bool value stays a bool after a round trip (it is not read back as 1)."""
    again = parse_record(json.loads(json.dumps(dump_record(
        ConfigChange(topic="t", key="unclean_leader_election", value=True)))))
    assert again.value is True


def test_unknown_type_is_refused():
    with pytest.raises(ValidationError, match="does not match any of the expected tags"):
        parse_record({"type": "pickle", "payload": "x"})


def test_extra_field_is_refused_and_named():
    d = dump_record(FenceBroker(broker_id=1, at_ms=0))
    d["surprise"] = 1
    with pytest.raises(ValidationError, match="surprise"):
        parse_record(d)


def test_records_are_frozen():
    r = FenceBroker(broker_id=1, at_ms=0)
    with pytest.raises(ValidationError):
        r.broker_id = 2  # type: ignore[misc]


def test_negative_broker_id_is_refused_and_named():
    with pytest.raises(ValidationError, match="broker_id"):
        FenceBroker(broker_id=-1, at_ms=0)


def test_fence_for_election_cannot_name_a_leader():
    with pytest.raises(ValidationError, match="fenced_for_election"):
        PartitionChange(topic="t", partition=0, leader=3, fenced_for_election=True)
    ok = PartitionChange(topic="t", partition=0, leader=NO_LEADER, fenced_for_election=True)
    assert ok.fenced_for_election


def test_partition_record_needs_replicas():
    with pytest.raises(ValidationError, match="replicas"):
        PartitionRecord(topic="t", partition=0, replicas=(), isr=(1,), leader=1)
