"""The Kafka listener's pure parts: the registry, request decoding and ApiVersions,
and that every error code Biplane can send is one Kafka clients know."""
from __future__ import annotations

import struct

import pytest
from kio.schema.errors import ErrorCode as KafkaErrorCode

from common.errors import ErrorCode
from common.wire import messages as wire
from dataplane.kafka import handlers, messages, offsets, protocol  # noqa: F401  (handlers register the APIs)
from dataplane.kafka.metadata import api_versions_body
from dataplane.kafka.registry import APIS, Request, register

# Kafka's classic group APIs and the versions served (dataplane/kafka/groups.py).
GROUP_VERSIONS = {8: (2, 7), 9: (1, 5), 10: (0, 2), 11: (0, 5), 12: (0, 3), 13: (0, 3), 14: (0, 3), 15: (0, 4),
                  16: (0, 4), 42: (0, 1)}
TRANSACTION_KEYS = {24, 25, 26, 28, 47, 61, 65, 66, 68, 69}


def test_every_biplane_error_code_is_a_kafka_code_of_the_same_meaning() -> None:
    for code in ErrorCode:
        kafka = KafkaErrorCode(int(code))  # ValueError: a number Kafka clients do not know
        assert kafka.name.upper().startswith(code.name.split("_")[0]), (code, kafka)


def test_api_versions_advertises_what_is_registered_groups_and_no_transactions() -> None:
    body = api_versions_body(3)
    advertised = {k.api_key: (k.min_version, k.max_version) for k in body.api_keys}
    assert advertised == {0: (0, 8), 1: (4, 11), 2: (1, 5), 3: (0, 8), 18: (0, 3), 22: (0, 1), 23: (2, 3)} | {
        k: (a.advertised_from, a.versions[1]) for k, a in APIS.items() if k not in (0, 1, 2, 3, 18, 22, 23)}
    assert {k: advertised[k] for k in GROUP_VERSIONS} == GROUP_VERSIONS
    assert not advertised.keys() & TRANSACTION_KEYS


def test_register_refuses_a_second_handler_and_bad_ranges() -> None:
    async def other(request, context):  # pragma: no cover - never called
        return None
    with pytest.raises(ValueError, match="registered twice"):
        register(3, "Metadata", (0, 8))(other)
    with pytest.raises(ValueError, match="advertised_from=5"):
        register(1000, "X", (3, 4), advertised_from=5)
    with pytest.raises(ValueError, match="lowest, highest"):
        register(1000, "X", (4, 3))
    assert 1000 not in APIS


def header(api_key: int, version: int, *, flexible: bool) -> bytearray:
    return bytearray(struct.pack(">hhih", api_key, version, 7, 3) + b"cli" + (b"\0" if flexible else b""))


def test_decode_reads_v2_headers_and_refusals_by_version() -> None:
    request = protocol.decode_request(header(18, 3, flexible=True) + b"\x02a\x021\0")
    assert (request.client_id, request.served, request.body.client_software_name) == ("cli", True, "a")
    unknown_version = protocol.decode_request(header(18, 77, flexible=True))
    assert not unknown_version.served and unknown_version.correlation_id == 7
    old_produce = protocol.decode_request(header(0, 2, flexible=False) + struct.pack(">hii", 1, 100, 0))
    assert not old_produce.served and old_produce.body.acks == 1
    with pytest.raises(protocol.FrameError, match="API key 24 .* not served"):   # AddPartitionsToTxn
        protocol.decode_request(header(24, 0, flexible=False))
    with pytest.raises(protocol.FrameError, match="version 12 is not served; versions 4..11"):
        protocol.decode_request(header(1, 12, flexible=True))
    with pytest.raises(protocol.FrameError, match="does not parse"):
        protocol.decode_request(header(3, 8, flexible=False) + b"\0")
    with pytest.raises(protocol.FrameError, match="2 bytes after the request"):
        protocol.decode_request(header(18, 0, flexible=False) + b"\0\0")


class FakeOffsets:
    """The broker's list_offsets as the core answers it (ReplicaCore.list_offset): earliest 0 and
    latest the HW with timestamp -1; a timestamp the first record stamped at or after it with its
    own timestamp, or -1/-1 when none is below the HW; partition 1 is led elsewhere."""

    HIGH_WATERMARK = 10
    RECORD_TIMES = {2: 100, 3: 150, 7: 300}   # offset -> the record's timestamp

    def list_offsets(self, request: wire.ListOffsetsRequest) -> wire.ListOffsetsResponse:
        def one(p: wire.ListOffsetsPartition) -> wire.ListOffsetsPartitionResponse:
            if p.partition == 1:
                return wire.ListOffsetsPartitionResponse(partition=1, error_code=ErrorCode.NOT_LEADER_OR_FOLLOWER)
            if p.timestamp < 0:
                offset = 0 if p.timestamp == wire.EARLIEST_TIMESTAMP else self.HIGH_WATERMARK
                return wire.ListOffsetsPartitionResponse(partition=p.partition, offset=offset, leader_epoch=3)
            found = next(((o, ts) for o, ts in self.RECORD_TIMES.items() if ts >= p.timestamp), None)
            if found is None:
                return wire.ListOffsetsPartitionResponse(partition=p.partition)
            return wire.ListOffsetsPartitionResponse(partition=p.partition, offset=found[0], timestamp=found[1],
                                                     leader_epoch=3)
        return wire.ListOffsetsResponse(topics=tuple(
            wire.ListOffsetsTopic(topic=t.topic, partitions=tuple(one(p) for p in t.partitions))
            for t in request.topics))


def test_list_offsets_answers_the_cores_offsets_and_record_timestamps() -> None:
    """Claim: each partition's answer is the core's, where it was asked, at every served version:
    a found record's offset and its own timestamp (not the time asked for), -1/-1 for none (Kafka's
    answer, which Java's offsetsForTimes turns into null), timestamp -1 for earliest and latest."""
    import asyncio
    from types import SimpleNamespace

    asked = [(0, 250), (0, -2), (1, 150), (0, 999), (0, -1), (0, 120)]
    for version in range(1, 6):
        body = messages.build(messages.request_schema(offsets.LIST_OFFSETS, version), {
            "replica_id": -1, "isolation_level": 0, "topics": [{"name": "t", "partitions": [
                {"partition_index": p, "current_leader_epoch": -1, "timestamp": ts} for p, ts in asked]}]})
        request = Request(offsets.LIST_OFFSETS, version, 1, "test", body, served=True)
        context = SimpleNamespace(requests=FakeOffsets())
        answer = asyncio.run(offsets.list_offsets(request, context))  # type: ignore[arg-type]
        got = [(p.partition_index, int(p.error_code), p.offset, p.timestamp) for p in answer.topics[0].partitions]
        assert got == [(0, 0, 7, 300), (0, 0, 0, -1), (1, int(ErrorCode.NOT_LEADER_OR_FOLLOWER), -1, -1),
                       (0, 0, -1, -1), (0, 0, FakeOffsets.HIGH_WATERMARK, -1), (0, 0, 3, 150)], version
        epochs = [getattr(p, "leader_epoch", None) for p in answer.topics[0].partitions]
        assert epochs[3] in (-1, None) and epochs[0] in (3, None)  # v4 adds leader_epoch
