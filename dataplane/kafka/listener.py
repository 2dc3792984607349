"""The Kafka API listener: Kafka clients' connections, on a port of their own.

Biplane's own frames cannot be told apart from Kafka's on one socket, so the Kafka
API has its own port (`--kafka-port`). Connections are the broker's pipelined ones
(dataplane/broker/listener.py: requests started as they arrive, answers in arrival
order, acks=0 produce unanswered, frames above --max-frame-bytes refused); only
decoding and encoding are Kafka's (protocol.py). A frame that cannot be answered —
too short, an API or version not served, a request that does not parse — closes its
own connection with a WARNING naming the peer and why; every other connection goes on.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

from common.errors import ProtocolError
from common.wire.frames import BytesLike
from dataplane.broker.listener import PipelinedConnection
from dataplane.kafka import handlers, protocol
from dataplane.kafka.registry import Close, Context, Request

log = logging.getLogger("biplane.kafka")


class KafkaConnection(PipelinedConnection):
    def __init__(self, context: Context, *, max_frame_bytes: int, inflight_requests_max: int = 64) -> None:
        super().__init__(_never, max_frame_bytes=max_frame_bytes, inflight_requests_max=inflight_requests_max)
        self.context = context
        self._client_host: str | None = None

    def _on_frame(self, payload: bytearray) -> None:
        try:
            if self._client_host is None:
                self._client_host = "/" + self.stream.peer.rsplit(":", 1)[0]
            request = protocol.decode_request(payload, self._client_host)
        except protocol.FrameError as exc:
            raise ProtocolError(f"Kafka request refused: {exc}") from exc
        self._queue(request, handlers.start(request, self.context))

    def _encode(self, key: Any, response: Any) -> list[BytesLike]:
        request: Request = key
        if isinstance(response, Close):
            log.info("closing Kafka connection from %s (client %r): %s", self.stream.peer, request.client_id,
                     response.reason)
            # After the answers already queued are written: close() sends what is buffered.
            asyncio.get_running_loop().call_soon(self.stream.close)
            return []
        # A refused ApiVersions is answered at v0, which every client can read.
        version = 0 if request.api_key == protocol.API_VERSIONS and not request.served else request.version
        return protocol.encode_response(request.api_key, version, request.correlation_id, response)


async def _never(header: Any, request: Any) -> Any:
    raise AssertionError("Kafka connections decode their own frames")


async def start_kafka_server(context: Context, host: str, port: int, *, max_frame_bytes: int) -> asyncio.Server:
    def connection() -> Any:
        return KafkaConnection(context, max_frame_bytes=max_frame_bytes).stream
    return await asyncio.get_running_loop().create_server(connection, host, port)
