"""InitProducerId (0–1): producer ids for idempotent producers, from the broker's own
producer id blocks. Transactions are not served, so a transactional id is refused."""
from __future__ import annotations

import logging

from common.errors import ErrorCode
from common.wire import messages as wire
from dataplane.kafka import messages
from dataplane.kafka.registry import Answer, Context, Request, register

INIT_PRODUCER_ID = 22

log = logging.getLogger("biplane.kafka")


@register(INIT_PRODUCER_ID, "InitProducerId", (0, 1))
async def init_producer_id(request: Request, context: Context) -> Answer:
    body = request.body
    schema = messages.response_schema(INIT_PRODUCER_ID, request.version)
    if body.transactional_id is not None:
        # The response has no message field: the reason goes to the broker's log.
        log.info("refused InitProducerId from client %r: transactional id %r given, and transactions are "
                 "not served; use an idempotent producer without transactional.id",
                 request.client_id, body.transactional_id)
        return messages.build(schema, {"throttle_time": 0, "producer_id": -1, "producer_epoch": -1,
                                       "error_code": int(ErrorCode.INVALID_REQUEST)})
    done = await context.requests.init_producer_id(wire.InitProducerIdRequest(
        producer_id=messages.field(body, "producer_id", -1),
        producer_epoch=messages.field(body, "producer_epoch", -1)))
    return messages.build(schema, {"throttle_time": 0, "error_code": int(done.error_code),
                                   "producer_id": done.producer_id, "producer_epoch": done.producer_epoch})
