"""ListOffsets (v1–5: -1 latest, -2 earliest, or by timestamp) and OffsetForLeaderEpoch
(v2–3), both answered by the partition's core through the broker's request handler."""
from __future__ import annotations

from common.errors import ErrorCode
from common.wire import messages as wire
from dataplane.kafka import messages
from dataplane.kafka.registry import Answer, Context, Request, register

LIST_OFFSETS, OFFSET_FOR_LEADER_EPOCH = 2, 23
MAX_TIMESTAMP = -3   # KIP-734's spec, ListOffsets v7 and later


@register(LIST_OFFSETS, "ListOffsets", (1, 5))
async def list_offsets(request: Request, context: Context) -> Answer:
    body = request.body
    internal = wire.ListOffsetsRequest(topics=tuple(
        wire.ListOffsetsTopic(topic=t.name, partitions=tuple(
            wire.ListOffsetsPartition(partition=p.partition_index, timestamp=p.timestamp,
                                      current_leader_epoch=messages.field(p, "current_leader_epoch", -1))
            for p in t.partitions)) for t in body.topics))
    done = context.requests.list_offsets(internal)
    # The max-timestamp spec (-3) needs ListOffsets v7, not served here; some clients send it at a
    # lower version anyway. UNSUPPORTED_VERSION says why, where the core's INVALID_REQUEST would not.
    max_spec = {(t.name, p.partition_index) for t in body.topics for p in t.partitions
                if p.timestamp == MAX_TIMESTAMP}

    def code(topic: str, p: wire.ListOffsetsPartitionResponse) -> int:
        return int(ErrorCode.UNSUPPORTED_VERSION if (topic, p.partition) in max_spec else p.error_code)

    return messages.build(messages.response_schema(LIST_OFFSETS, request.version), {"throttle_time": 0, "topics": [
        {"name": t.topic, "partitions": [
            {"partition_index": p.partition, "error_code": code(t.topic, p), "timestamp": p.timestamp,
             "offset": p.offset, "leader_epoch": p.leader_epoch} for p in t.partitions]}
        for t in done.topics]})


@register(OFFSET_FOR_LEADER_EPOCH, "OffsetForLeaderEpoch", (2, 3))
async def offset_for_leader_epoch(request: Request, context: Context) -> Answer:
    topics = []
    for t in request.body.topics:
        partitions = []
        for p in t.partitions:
            error, epoch, end = context.requests.end_offset_for_epoch(
                t.topic, p.partition, p.leader_epoch, p.current_leader_epoch)
            partitions.append({"error_code": int(error), "partition": p.partition, "leader_epoch": epoch,
                               "end_offset": end})
        topics.append({"topic": t.topic, "partitions": partitions})
    return messages.build(messages.response_schema(OFFSET_FOR_LEADER_EPOCH, request.version),
                          {"throttle_time": 0, "topics": topics})
