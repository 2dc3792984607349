"""Produce requests and answers and Fetch responses, read and written by hand.

kio (messages.py) reads a records field into new `bytes` and writes one through
copies; on these two paths the records are nearly the whole frame. Produce v3–8 and
Fetch v4–11 are Kafka's non-flexible layouts (big-endian ints, int16-length strings,
int32-length arrays and bytes), so they are read and written here directly: a
produce's batches stay views into the request's own frame (the log patches offsets
into them in place, as with Biplane's own protocol), and a fetch answer's records are
the log's buffer, handed to the socket as a frame part of its own. A produce answer
holds no records, but there is one per request: building it as kio entities and
encoding those cost more CPU than reading the request and stepping it into the core.
tests/test_kafka_hotpath.py checks all three against kio's encoding, byte for byte.
"""
from __future__ import annotations

import dataclasses
import struct

from common.wire import messages as wire
from common.wire.frames import BytesLike

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
# A produce answer's partition up to log_append_time: index, error code, base offset, -1.
_PRODUCE_PARTITION = struct.Struct(">ihqq")


class BodyError(ValueError):
    """The body does not parse: truncated, a negative length, a string that is not UTF-8."""


@dataclasses.dataclass(frozen=True, slots=True)
class ProducePartitionData:
    index: int
    records: memoryview | None  # a writable view into the request's frame


@dataclasses.dataclass(frozen=True, slots=True)
class ProduceTopicData:
    name: str
    partition_data: tuple[ProducePartitionData, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class ProduceBody:
    """A Produce request v0–8 (one layout; v3 added the transactional id)."""

    transactional_id: str | None
    acks: int
    timeout_ms: int
    topic_data: tuple[ProduceTopicData, ...]


class _Reader:
    def __init__(self, frame: bytearray, offset: int) -> None:
        self.view = memoryview(frame)
        self.offset = offset

    def _take(self, size: int, what: str) -> int:
        start = self.offset
        if size < 0 or start + size > len(self.view):
            raise BodyError(f"{what}: needs {size} bytes at offset {start}, the request has {len(self.view)}")
        self.offset = start + size
        return start

    def i16(self, what: str) -> int:
        value: int = _I16.unpack_from(self.view, self._take(2, what))[0]
        return value

    def i32(self, what: str) -> int:
        value: int = _I32.unpack_from(self.view, self._take(4, what))[0]
        return value

    def nullable_string(self, what: str) -> str | None:
        size = self.i16(what)
        return None if size == -1 else self._text(size, what)

    def string(self, what: str) -> str:
        return self._text(self.i16(what), what)

    def _text(self, size: int, what: str) -> str:
        if size < 0:
            raise BodyError(f"{what}: string length {size}")
        start = self._take(size, what)
        try:
            return str(self.view[start:self.offset], "utf-8")
        except UnicodeDecodeError as exc:
            raise BodyError(f"{what}: not UTF-8 ({exc})") from exc

    def records(self, what: str) -> memoryview | None:
        size = self.i32(what)
        if size == -1:
            return None
        start = self._take(size, what)
        return self.view[start:self.offset]

    def array_length(self, what: str, item_bytes_min: int) -> int:
        count = self.i32(what)
        # A count is believed only as far as the bytes left could hold it: a forged
        # count of 2**31 must not allocate before it fails.
        if count < 0 or count * item_bytes_min > len(self.view) - self.offset:
            raise BodyError(f"{what}: {count} items cannot fit in the {len(self.view) - self.offset} bytes left")
        return count


def read_produce(frame: bytearray, offset: int, version: int) -> ProduceBody:
    """The Produce request body (v0–8) starting at `offset` of its frame, which it must end."""
    r = _Reader(frame, offset)
    transactional_id = r.nullable_string("transactional_id") if version >= 3 else None
    acks = r.i16("acks")
    timeout_ms = r.i32("timeout_ms")
    topics = []
    for _ in range(r.array_length("topic_data", 2 + 4)):
        name = r.string("topic_data.name")
        partitions = []
        for _ in range(r.array_length("partition_data", 4 + 4)):
            index = r.i32("partition_data.index")
            partitions.append(ProducePartitionData(index=index, records=r.records("partition_data.records")))
        topics.append(ProduceTopicData(name=name, partition_data=tuple(partitions)))
    if r.offset != len(frame):
        raise BodyError(f"{len(frame) - r.offset} bytes after the request")
    return ProduceBody(transactional_id=transactional_id, acks=acks, timeout_ms=timeout_ms, topic_data=tuple(topics))


def _string(value: str) -> bytes:
    data = value.encode()
    return _I16.pack(len(data)) + data


def old_produce_refusal(version: int, body: ProduceBody, error_code: int) -> list[BytesLike]:
    """A Produce response v0–2 refusing every partition (kio has no schema for these
    versions; they are advertised for old librdkafka's sake and never served)."""
    if not 0 <= version <= 2:
        raise ValueError(f"produce response version {version}: only 0..2 are written here")
    out = bytearray(_I32.pack(len(body.topic_data)))
    for t in body.topic_data:
        out += _string(t.name) + _I32.pack(len(t.partition_data))
        for p in t.partition_data:
            out += _I32.pack(p.index) + _I16.pack(error_code) + _I64.pack(-1)  # base_offset
            if version >= 2:
                out += _I64.pack(-1)  # log_append_time
    if version >= 1:
        out += _I32.pack(0)  # throttle_time_ms
    return [bytes(out)]


def _nullable_string(value: str | None) -> bytes:
    return _I16.pack(-1) if value is None else _string(value)


def produce_response(version: int, done: wire.ProduceResponse) -> list[BytesLike]:
    """A Produce response body (v3–8) answering `done`: no log append times (the records keep
    the producer's timestamps), no per-record errors, no throttling."""
    if not 3 <= version <= 8:
        raise ValueError(f"produce response version {version}: only 3..8 are written here")
    out = bytearray(_I32.pack(len(done.topics)))
    for t in done.topics:
        out += _string(t.topic) + _I32.pack(len(t.partitions))
        for p in t.partitions:
            out += _PRODUCE_PARTITION.pack(p.partition, int(p.error_code), p.base_offset, -1)
            if version >= 5:
                out += _I64.pack(p.log_start_offset)
            if version >= 8:
                out += _I32.pack(0)  # record_errors: none
                out += _nullable_string(p.error_message)
    out += _I32.pack(0)  # throttle_time_ms
    return [bytes(out)]


def fetch_response(version: int, done: wire.FetchResponse) -> list[BytesLike]:
    """A Fetch response body (v4–11) as frame parts; records are the log's own buffers.
    No transactions: nothing is aborted and the last stable offset is the HW."""
    if not 4 <= version <= 11:
        raise ValueError(f"fetch response version {version}: only 4..11 are written here")
    parts: list[BytesLike] = []
    head = bytearray(_I32.pack(0))  # throttle_time_ms
    if version >= 7:
        head += _I16.pack(0) + _I32.pack(0)  # error_code, session_id (no fetch sessions)
    head += _I32.pack(len(done.topics))
    for t in done.topics:
        head += _string(t.topic) + _I32.pack(len(t.partitions))
        for p in t.partitions:
            head += _I32.pack(p.partition) + _I16.pack(int(p.error_code)) + _I64.pack(p.high_watermark)
            head += _I64.pack(p.high_watermark)  # last_stable_offset
            if version >= 5:
                head += _I64.pack(p.log_start_offset)
            head += _I32.pack(0)  # aborted_transactions: none
            if version >= 11:
                head += _I32.pack(-1)  # preferred_read_replica: read from the leader
            records = p.records or b""
            head += _I32.pack(len(records))
            if records:
                parts.append(bytes(head))
                parts.append(records)
                head = bytearray()
    if head:
        parts.append(bytes(head))
    return parts
