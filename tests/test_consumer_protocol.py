"""Kafka's consumer protocol codec against two independent implementations: kafka-python's
schema-driven classes (generated from Kafka's own JSON schemas, every version) and
aiokafka's hand-written version-0 structs. Same bytes both ways, for any value."""
from __future__ import annotations

import pytest
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment, ConsumerProtocolMemberMetadata
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.consumer.metadata import ConsumerProtocolAssignment, ConsumerProtocolSubscription

from common.consumer_protocol import (
    Assignment,
    ConsumerProtocolError,
    Subscription,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
)
from common.topic_partition import TopicPartition

topic_names = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=12)
# Grouped by topic, one entry per topic, as both encoders write them. A topic entry with no
# partitions says nothing (ours never writes one), so each has at least one.
grouped = st.dictionaries(topic_names, st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=5), max_size=4)
user_data = st.none() | st.binary(max_size=20)


def flat(groups: dict[str, list[int]]) -> tuple[TopicPartition, ...]:
    return tuple(TopicPartition(t, p) for t, ps in groups.items() for p in ps)


@settings(max_examples=200, deadline=None)
@given(topics=st.lists(topic_names, max_size=5), data=user_data, owned=grouped,
       generation=st.integers(-1, 2**31 - 1), rack=st.none() | topic_names, version=st.integers(0, 3))
def test_subscription_bytes_match_kafka_schema(topics: list[str], data: bytes | None, owned: dict[str, list[int]],
                                               generation: int, rack: str | None, version: int) -> None:
    """Every version: our bytes are kafka-python's bytes, and each side decodes the other's."""
    ours = Subscription(topics=tuple(topics), user_data=data, owned_partitions=flat(owned), generation_id=generation,
                        rack_id=rack)
    theirs = ConsumerProtocolSubscription(
        topics=topics, user_data=data, generation_id=generation, rack_id=rack,
        owned_partitions=[ConsumerProtocolSubscription.TopicPartition(topic=t, partitions=ps)
                          for t, ps in owned.items()])
    encoded = encode_subscription(ours, version)
    assert encoded == theirs.encode(version=version)
    decoded, got_version = decode_subscription(encoded)
    assert got_version == version
    # Fields newer than the version are not on the wire: they come back as defaults.
    assert decoded == Subscription(topics=tuple(topics), user_data=data,
                                   owned_partitions=flat(owned) if version >= 1 else (),
                                   generation_id=generation if version >= 2 else -1,
                                   rack_id=rack if version >= 3 else None)
    back = ConsumerProtocolSubscription.decode(encoded)
    assert list(back.topics) == topics and back.user_data == data


@settings(max_examples=200, deadline=None)
@given(assigned=grouped, data=user_data, version=st.integers(0, 3))
def test_assignment_bytes_match_kafka_schema(assigned: dict[str, list[int]], data: bytes | None,
                                             version: int) -> None:
    ours = Assignment(partitions=flat(assigned), user_data=data)
    theirs = ConsumerProtocolAssignment(
        user_data=data, assigned_partitions=[ConsumerProtocolAssignment.TopicPartition(topic=t, partitions=ps)
                                             for t, ps in assigned.items()])
    encoded = encode_assignment(ours, version)
    assert encoded == theirs.encode(version=version)
    assert decode_assignment(encoded) == ours
    assert ConsumerProtocolAssignment.decode(encoded).partitions() == list(flat(assigned))


def test_version_zero_matches_aiokafka_structs() -> None:
    """aiokafka writes version 0 by hand (not from Kafka's schema): a second, separate oracle."""
    metadata = ConsumerProtocolMemberMetadata(0, ["orders", "payments"], b"\x01\x02")
    assert encode_subscription(Subscription(topics=("orders", "payments"), user_data=b"\x01\x02"), 0) == \
        metadata.encode()
    raw = ConsumerProtocolMemberAssignment(0, [("orders", [0, 3]), ("payments", [1])], b"").encode()
    assert decode_assignment(raw) == Assignment(
        partitions=(TopicPartition("orders", 0), TopicPartition("orders", 3), TopicPartition("payments", 1)),
        user_data=b"")


def test_newer_version_is_read_as_the_newest_known() -> None:
    """Kafka's rule: later versions only append fields; a v4 subscription parses as v3."""
    v3 = encode_subscription(Subscription(topics=("t",), generation_id=7, rack_id="r"), 3)
    v4 = b"\x00\x04" + v3[2:] + b"\x00\x00\x00\x09future"
    sub, version = decode_subscription(v4)
    assert version == 4 and sub.topics == ("t",) and sub.generation_id == 7 and sub.rack_id == "r"


def test_empty_assignment_is_no_partitions() -> None:
    assert decode_assignment(b"") == Assignment()


@pytest.mark.parametrize("raw, field", [
    (b"\x00", "version"),
    (b"\xff\xff", "version"),
    (b"\x00\x00\x7f\xff\xff\xff", "topics"),                            # a count the bytes cannot hold
    (b"\x00\x00\x00\x00\x00\x01\x00\x05ab", "topics"),                  # a string cut short
    (b"\x00\x00\x00\x00\x00\x00\xff\xff\xff\xfe", "user_data"),        # a negative length other than -1
    (b"\x00\x01\x00\x00\x00\x00\xff\xff\xff\xff\x00\x00\x00\x01\x00\x01t\x00\x00\x00\x05", "owned_partitions"),
])
def test_malformed_subscription_names_the_field(raw: bytes, field: str) -> None:
    with pytest.raises(ConsumerProtocolError, match=f"field {field}"):
        decode_subscription(raw)


@given(st.binary(max_size=64))
def test_any_bytes_decode_or_fail_cleanly(raw: bytes) -> None:
    """Garbage from a peer is a ConsumerProtocolError, never another exception."""
    for decode in (decode_subscription, decode_assignment):
        try:
            decode(raw)
        except ConsumerProtocolError:
            pass


def test_bad_version_to_encode_is_refused() -> None:
    with pytest.raises(ValueError, match="0 to 3"):
        encode_subscription(Subscription(topics=()), 4)
