"""Kafka's consumer protocol: what a member of a group of protocol_type "consumer" puts in
JoinGroup's protocol metadata (a ConsumerProtocolSubscription) and what the leader hands
each member through SyncGroup (a ConsumerProtocolAssignment).

The coordinator keeps both as opaque bytes; only the members read them. Writing them byte
for byte as Kafka's schemas lay them out (ConsumerProtocolSubscription.json and
ConsumerProtocolAssignment.json, versions 0-3, none flexible) is what lets a Biplane
consumer and a librdkafka or Java consumer share one group: whichever is elected leader
reads everyone's subscription and writes everyone's assignment.

Layout (big-endian, Kafka's primitive types), after an int16 version:

    Subscription: topics [string], user_data nullable bytes,
                  v1+ owned_partitions [(topic string, partitions [int32])],
                  v2+ generation_id int32, v3+ rack_id nullable string
    Assignment:   assigned_partitions [(topic string, partitions [int32])],
                  user_data nullable bytes

Kafka's rule for versions: a newer version only appends fields, so a reader parses a
version above the newest it knows as that newest one and ignores the bytes after it.
An empty assignment (b"") is what a coordinator hands a member it gave nothing; it
decodes as no partitions. Decoding trusts no length: every count is bounded by the bytes
left, and a malformed value raises ConsumerProtocolError naming the field.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

from common.errors import ProtocolError
from common.topic_partition import TopicPartition

PROTOCOL_TYPE = "consumer"
SUBSCRIPTION_VERSION_MAX = 3
ASSIGNMENT_VERSION_MAX = 3
NO_GENERATION = -1

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")


class ConsumerProtocolError(ProtocolError):
    """A subscription or assignment is not in Kafka's consumer-protocol layout."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Subscription:
    """One member's wish: the topics it reads, and (for cooperative rebalancing) the
    partitions it owns now and the generation it got them in."""

    topics: tuple[str, ...]
    user_data: bytes | None = None
    owned_partitions: tuple[TopicPartition, ...] = ()
    generation_id: int = NO_GENERATION
    rack_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Assignment:
    partitions: tuple[TopicPartition, ...] = ()
    user_data: bytes | None = None


# ------------------------------------------------------------------ encoding


def _string(value: str, out: list[bytes]) -> None:
    raw = value.encode("utf-8")
    if len(raw) > 0x7FFF:
        raise ValueError(f"string of {len(raw)} bytes is longer than the 32767 a consumer-protocol string holds")
    out += (_INT16.pack(len(raw)), raw)


def _nullable_string(value: str | None, out: list[bytes]) -> None:
    if value is None:
        out.append(_INT16.pack(-1))
    else:
        _string(value, out)


def _nullable_bytes(value: bytes | None, out: list[bytes]) -> None:
    if value is None:
        out.append(_INT32.pack(-1))
    else:
        out += (_INT32.pack(len(value)), bytes(value))


def _topic_partitions(partitions: tuple[TopicPartition, ...], out: list[bytes]) -> None:
    """Kafka's [TopicPartition]: one entry per topic (in first-seen order) with its partitions."""
    by_topic: dict[str, list[int]] = {}
    for topic, partition in partitions:
        by_topic.setdefault(topic, []).append(partition)
    out.append(_INT32.pack(len(by_topic)))
    for topic, numbers in by_topic.items():
        _string(topic, out)
        out.append(_INT32.pack(len(numbers)))
        out += (_INT32.pack(n) for n in numbers)


def _check_version(version: int, newest: int, what: str) -> None:
    if not isinstance(version, int) or not 0 <= version <= newest:
        raise ValueError(f"{what} version {version!r} is not one Kafka defines (0 to {newest})")


def encode_subscription(subscription: Subscription, version: int = SUBSCRIPTION_VERSION_MAX) -> bytes:
    """The subscription as Kafka writes it at `version`; fields newer than it are left out."""
    _check_version(version, SUBSCRIPTION_VERSION_MAX, "subscription")
    out = [_INT16.pack(version), _INT32.pack(len(subscription.topics))]
    for topic in subscription.topics:
        _string(topic, out)
    _nullable_bytes(subscription.user_data, out)
    if version >= 1:
        _topic_partitions(subscription.owned_partitions, out)
    if version >= 2:
        out.append(_INT32.pack(subscription.generation_id))
    if version >= 3:
        _nullable_string(subscription.rack_id, out)
    return b"".join(out)


def encode_assignment(assignment: Assignment, version: int = 0) -> bytes:
    """Every version lays the assignment out the same way; only the number differs."""
    _check_version(version, ASSIGNMENT_VERSION_MAX, "assignment")
    out = [_INT16.pack(version)]
    _topic_partitions(assignment.partitions, out)
    _nullable_bytes(assignment.user_data, out)
    return b"".join(out)


# ------------------------------------------------------------------ decoding


class _Reader:
    def __init__(self, data: bytes, what: str) -> None:
        self.data = memoryview(bytes(data))
        self.pos = 0
        self.what = what

    def fail(self, field: str, problem: str) -> ConsumerProtocolError:
        return ConsumerProtocolError(f"{self.what}: field {field} at byte {self.pos}: {problem} "
                                     f"({len(self.data)} bytes in all); is the member a Kafka consumer?")

    def _fixed(self, packer: struct.Struct, field: str) -> int:
        if self.pos + packer.size > len(self.data):
            raise self.fail(field, f"needs {packer.size} bytes, {len(self.data) - self.pos} left")
        value: int = packer.unpack_from(self.data, self.pos)[0]
        self.pos += packer.size
        return value

    def int16(self, field: str) -> int:
        return self._fixed(_INT16, field)

    def int32(self, field: str) -> int:
        return self._fixed(_INT32, field)

    def _take(self, n: int, field: str) -> bytes:
        if n > len(self.data) - self.pos:
            raise self.fail(field, f"length {n} is more than the {len(self.data) - self.pos} bytes left")
        raw = bytes(self.data[self.pos:self.pos + n])
        self.pos += n
        return raw

    def string(self, field: str) -> str:
        n = self.int16(field)
        if n < 0:
            raise self.fail(field, f"length {n}: a null where a string is required")
        try:
            return self._take(n, field).decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(field, "not UTF-8") from None

    def nullable_string(self, field: str) -> str | None:
        if self.pos + 2 <= len(self.data) and _INT16.unpack_from(self.data, self.pos)[0] == -1:
            self.pos += 2
            return None
        return self.string(field)

    def nullable_bytes(self, field: str) -> bytes | None:
        n = self.int32(field)
        if n == -1:
            return None
        if n < 0:
            raise self.fail(field, f"length {n} is negative")
        return self._take(n, field)

    def count(self, field: str, item_size_min: int) -> int:
        n = self.int32(field)
        if n < 0:
            raise self.fail(field, f"count {n} is negative (a null array where one is required)")
        if n * item_size_min > len(self.data) - self.pos:
            raise self.fail(field, f"count {n} cannot fit in the {len(self.data) - self.pos} bytes left")
        return n

    def topic_partitions(self, field: str) -> tuple[TopicPartition, ...]:
        out: list[TopicPartition] = []
        for _ in range(self.count(field, 6)):
            topic = self.string(f"{field}.topic")
            for _ in range(self.count(f"{field}.partitions", 4)):
                out.append(TopicPartition(topic, self.int32(f"{field}.partitions")))
        return tuple(out)

    def version(self) -> int:
        version = self.int16("version")
        if version < 0:
            raise self.fail("version", f"{version} is negative")
        return version


def decode_subscription(data: bytes) -> tuple[Subscription, int]:
    """(the subscription, the version it was written at). A version above 3 is read as 3."""
    reader = _Reader(data, "consumer-protocol subscription")
    version = reader.version()
    topics = tuple(reader.string("topics") for _ in range(reader.count("topics", 2)))
    user_data = reader.nullable_bytes("user_data")
    owned: tuple[TopicPartition, ...] = ()
    generation_id = NO_GENERATION
    rack_id = None
    if version >= 1:
        owned = reader.topic_partitions("owned_partitions")
    if version >= 2:
        generation_id = reader.int32("generation_id")
    if version >= 3:
        rack_id = reader.nullable_string("rack_id")
    return Subscription(topics=topics, user_data=user_data, owned_partitions=owned, generation_id=generation_id,
                        rack_id=rack_id), version


def decode_assignment(data: bytes) -> Assignment:
    if not data:
        return Assignment()
    reader = _Reader(data, "consumer-protocol assignment")
    reader.version()
    partitions = reader.topic_partitions("assigned_partitions")
    return Assignment(partitions=partitions, user_data=reader.nullable_bytes("user_data"))


__all__ = ["PROTOCOL_TYPE", "SUBSCRIPTION_VERSION_MAX", "ASSIGNMENT_VERSION_MAX", "NO_GENERATION",
           "ConsumerProtocolError", "Subscription", "Assignment", "encode_subscription", "encode_assignment",
           "decode_subscription", "decode_assignment"]
