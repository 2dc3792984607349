"""The Kafka API listener: Kafka clients' connections, on a port of their own.

Biplane's own frames cannot be told apart from Kafka's on one socket, so the Kafka
API has its own port (`--kafka-port`). Connections are the broker's pipelined ones
(dataplane/broker/listener.py: requests started as they arrive, answers in arrival
order, acks=0 produce unanswered); only decoding and encoding are Kafka's
(protocol.py). A frame that cannot be answered — too short, an API not served, a
request that does not parse — closes its own connection with a WARNING naming the
peer and why; every other connection goes on.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

from common.errors import ProtocolError
from common.wire.frames import BytesLike
from dataplane.broker.listener import PipelinedConnection
from dataplane.kafka import protocol
from dataplane.kafka.handlers import KafkaRequests

log = logging.getLogger("biplane.kafka")


class KafkaConnection(PipelinedConnection):
    def __init__(self, requests: KafkaRequests, *, max_frame_bytes: int, inflight_requests_max: int = 64) -> None:
        super().__init__(_never, max_frame_bytes=max_frame_bytes, inflight_requests_max=inflight_requests_max)
        self.requests = requests

    def _on_frame(self, payload: bytearray) -> None:
        try:
            request = protocol.decode_request(payload)
        except protocol.FrameError as exc:
            raise ProtocolError(f"Kafka request refused: {exc}") from exc
        self._queue(request, self.requests.start(request))

    def _encode(self, key: Any, response: Any) -> list[BytesLike]:
        request: protocol.Request = key
        version = request.version if request.served or request.api_key != protocol.API_VERSIONS else 0
        return [protocol.encode_response(request.api_key, version, request.correlation_id, response)]


async def _never(header: Any, request: Any) -> Any:
    raise AssertionError("Kafka connections decode their own frames")


async def start_kafka_server(requests: KafkaRequests, host: str, port: int, *,
                             max_frame_bytes: int) -> asyncio.Server:
    def connection() -> Any:
        return KafkaConnection(requests, max_frame_bytes=max_frame_bytes).stream
    return await asyncio.get_running_loop().create_server(connection, host, port)
