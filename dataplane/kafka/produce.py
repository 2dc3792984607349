"""Produce (v3–8; v0–2 advertised, for old librdkafka, and refused).

The request is read and its answer written by hand (hotpath.py), so its batches
reach the broker's own produce path (`RequestHandler.start_produce`: the same
admission checks in dataplane/replica/admission.py, cores and error codes as
Biplane's protocol) as views into the request's frame. The cores have them before the handler returns, so one
connection's produce requests are appended in the order they came (as Kafka promises
with max.in.flight > 1 and idempotence).
"""
from __future__ import annotations

from typing import Any, Awaitable

from common.errors import ErrorCode
from common.wire import messages as wire
from dataplane.kafka import hotpath, messages
from dataplane.kafka.registry import Answer, Close, Context, Encoded, Request, register

PRODUCE = 0


def _answer(request: Request, topics: list[dict[str, Any]]) -> Answer:
    return messages.build(messages.response_schema(PRODUCE, request.version),
                          {"responses": topics, "throttle_time": 0})


def _refused(request: Request, code: ErrorCode, why: str) -> Awaitable[Answer]:
    body = request.body

    async def refused() -> Answer:
        if body.acks == 0:
            return None
        return _answer(request, [
            {"name": t.name, "partition_responses": [
                {"index": p.index, "error_code": int(code), "base_offset": -1, "log_append_time": -1,
                 "log_start_offset": -1, "error_message": why} for p in t.partition_data]}
            for t in body.topic_data])
    return refused()


@register(PRODUCE, "Produce", (3, 8), advertised_from=0, read_body=hotpath.read_produce)
def produce(request: Request, context: Context) -> Awaitable[Answer]:
    body = request.body
    if not request.served:
        async def refused() -> Answer:
            # These versions have no error message: the code says it.
            if body.acks == 0:
                return None
            return Encoded(hotpath.old_produce_refusal(request.version, body, int(ErrorCode.UNSUPPORTED_VERSION)))
        return refused()
    if body.transactional_id is not None:
        return _refused(request, ErrorCode.INVALID_REQUEST,
                        f"transactional id {body.transactional_id!r}: transactions are not supported; "
                        "produce without a transactional.id (idempotence is supported)")
    internal = wire.ProduceRequest(acks=body.acks, timeout_ms=body.timeout_ms, topics=tuple(
        wire.ProduceTopic(topic=t.name, partitions=tuple(
            wire.ProducePartition(partition=p.index, records=p.records) for p in t.partition_data))
        for t in body.topic_data))
    pending = context.requests.start_produce(internal, answer_acks_0=True)

    async def answer() -> Answer:
        done = await pending
        assert done is not None, "answer_acks_0 gives every produce an answer"
        if body.acks == 0:
            refused = [f"{t.topic}-{p.partition}: {p.error_code.name}" for t in done.topics for p in t.partitions
                       if p.error_code is not ErrorCode.NONE]
            # Kafka closes an acks=0 producer's connection when a partition refuses: it gets
            # no answer, so that is how it learns to refresh its metadata and reconnect.
            return Close("acks=0 produce refused: " + ", ".join(refused)) if refused else None
        return Encoded(hotpath.produce_response(request.version, done))
    return answer()
