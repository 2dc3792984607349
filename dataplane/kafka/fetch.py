"""Fetch (v4–11), answered by the broker's own fetch path (long-poll with max_wait_ms
and min_bytes, the client's current_leader_epoch checked by the core); the answer
is written by hand (hotpath.py) so the records go out as the log's own buffers.

There are no transactions: read_committed reads what read_uncommitted reads, the
last stable offset is the HW, nothing is aborted. Consumers read from the leader
(preferred_read_replica -1), and there are no fetch sessions (session id 0).
"""
from __future__ import annotations

from common.wire import messages as wire
from dataplane.kafka import hotpath, messages
from dataplane.kafka.registry import Answer, Context, Encoded, Request, register

FETCH = 1
_MAX_BYTES_DEFAULT = 50 * 1024 * 1024  # v3+ carry max_bytes; Kafka's consumer default


@register(FETCH, "Fetch", (4, 11))
async def fetch(request: Request, context: Context) -> Answer:
    body = request.body
    internal = wire.FetchRequest(
        replica_id=wire.CONSUMER_REPLICA_ID,  # a Kafka client is never a replica here
        max_wait_ms=messages.field(body, "max_wait"), min_bytes=body.min_bytes,
        max_bytes=messages.field(body, "max_bytes", _MAX_BYTES_DEFAULT),
        isolation_level=messages.field(body, "isolation_level", 0),
        topics=tuple(wire.FetchTopic(topic=t.topic, partitions=tuple(
            wire.FetchPartition(partition=p.partition,
                                current_leader_epoch=messages.field(p, "current_leader_epoch", -1),
                                fetch_offset=p.fetch_offset,
                                partition_max_bytes=p.partition_max_bytes)
            for p in t.partitions)) for t in body.topics))
    done = await context.requests.fetch(internal)
    return Encoded(hotpath.fetch_response(request.version, done))
