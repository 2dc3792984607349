"""ListOffsets (v1–5: -1 latest, -2 earliest, or by timestamp) and OffsetForLeaderEpoch
(v2–3), both answered by the partition's core through the broker's request handler.

ListOffsets speaks Kafka's contract where Biplane's own differs: a timestamp with no
committed record at or after it is offset -1 and timestamp -1 (Java's offsetsForTimes
then gives null), where the core answers the high watermark (where Biplane's consumer
seeks to); and earliest and latest carry timestamp -1, not the request's -2 or -1.
"""
from __future__ import annotations

from common.errors import ErrorCode
from common.wire import messages as wire
from dataplane.kafka import messages
from dataplane.kafka.registry import Answer, Context, Request, register

LIST_OFFSETS, OFFSET_FOR_LEADER_EPOCH = 2, 23
UNKNOWN_OFFSET = UNKNOWN_TIMESTAMP = UNKNOWN_EPOCH = -1   # Kafka's ListOffsetsResponse values for "none"


@register(LIST_OFFSETS, "ListOffsets", (1, 5))
async def list_offsets(request: Request, context: Context) -> Answer:
    body = request.body
    # Each timestamp search is asked beside a latest (-1) of the same partition, in the same call:
    # the core answers a search that finds nothing with the high watermark, and one found is
    # always below it, so the two agree exactly when nothing was found.
    internal = wire.ListOffsetsRequest(topics=tuple(
        wire.ListOffsetsTopic(topic=t.name, partitions=tuple(
            wire.ListOffsetsPartition(partition=p.partition_index, timestamp=timestamp,
                                      current_leader_epoch=messages.field(p, "current_leader_epoch", -1))
            for p in t.partitions
            for timestamp in ((p.timestamp, wire.LATEST_TIMESTAMP) if p.timestamp >= 0 else (p.timestamp,))))
        for t in body.topics))
    done = context.requests.list_offsets(internal)
    topics = []
    for asked, answered in zip(body.topics, done.topics, strict=True):
        found = iter(answered.partitions)
        partitions = []
        for p in asked.partitions:
            answer = next(found)
            timestamp, offset, epoch = UNKNOWN_TIMESTAMP, answer.offset, answer.leader_epoch
            if p.timestamp >= 0:
                latest = next(found)
                if answer.error_code is ErrorCode.NONE and latest.error_code is ErrorCode.NONE \
                        and answer.offset == latest.offset:
                    offset, epoch = UNKNOWN_OFFSET, UNKNOWN_EPOCH
                elif answer.error_code is ErrorCode.NONE:
                    # Kafka names the found record's own timestamp; the core finds a batch by its
                    # largest one, so the time asked for is the closest bound it has.
                    timestamp = p.timestamp
            partitions.append({"partition_index": p.partition_index, "error_code": int(answer.error_code),
                               "timestamp": timestamp, "offset": offset, "leader_epoch": epoch})
        assert next(found, None) is None, "the core answers each partition asked, once"
        topics.append({"name": answered.topic, "partitions": partitions})
    return messages.build(messages.response_schema(LIST_OFFSETS, request.version),
                          {"throttle_time": 0, "topics": topics})


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
