"""asyncio drivers around frames and messages: a per-connection server loop and a client.

Requests on one connection are handled one at a time and answered in order
(Kafka's rule), so a client may pipeline up to its in-flight bound and match
responses by correlation id. A peer that breaks the protocol loses only its
own connection: the reason is logged once at WARNING on "biplane.wire".
"""
from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Any, Awaitable, Callable

from common.errors import BiplaneError, ConnectionClosedError, ProtocolError
from common.wire.frames import DEFAULT_MAX_FRAME_BYTES, RequestHeader, read_frame, read_response_header
from common.wire.messages import ApiKey, api_key_of, decode_request, decode_response, encode_request, encode_response
from common.wire.stream import FrameStream

log = logging.getLogger("biplane.wire")

# handler(header, request) -> response, or None to send nothing (acks=0 produce).
Handler = Callable[[RequestHeader, Any], Awaitable[Any]]


def _peer(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer)


async def serve_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, handler: Handler, *,
                           max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
    """Serve one connection until the peer closes it or breaks the protocol.

    A malformed frame or body closes this connection only. A handler that
    raises is a bug on our side: it is logged with its traceback and the
    connection is closed, because its response can no longer be sent in order.
    """
    peer = _peer(writer)
    try:
        while True:
            payload = await read_frame(reader, max_frame_bytes)
            if payload is None:
                return
            header, request = decode_request(payload)
            response = await handler(header, request)
            if response is not None:
                writer.writelines(encode_response(response, correlation_id=header.correlation_id))
                await writer.drain()
    except ProtocolError as exc:
        log.warning("closing connection from %s: %s", peer, exc,
                    extra={"event": "wire.protocol_error", "peer": peer, "reason": str(exc),
                           "error_code": exc.code.name})
    except (ConnectionError, asyncio.IncompleteReadError):
        pass  # the peer left; nothing to report
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("request handler failed; closing connection from %s", peer,
                      extra={"event": "wire.handler_error", "peer": peer})
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except (ConnectionError, OSError):
            pass


async def start_server(handler: Handler, host: str, port: int, *,
                       max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> asyncio.Server:
    """A listening server running serve_connection per connection (port 0: pick a free one)."""

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await serve_connection(reader, writer, handler, max_frame_bytes=max_frame_bytes)

    return await asyncio.start_server(on_connect, host, port)


class WireClient:
    """One connection to a broker, pipelining up to `inflight_requests_max` requests.

    `await client.request(req)` returns the decoded response or raises
    ConnectionClosedError / ProtocolError. `await client.send(req)` is for
    requests that get no response (acks=0 produce). Responses are read by a
    FrameStream and matched to their requests as they arrive, with no reader task.
    """

    def __init__(self, *, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES, inflight_requests_max: int = 32) -> None:
        if inflight_requests_max < 1:
            raise ValueError(f"inflight_requests_max {inflight_requests_max} must be at least 1")
        self._max_frame_bytes = max_frame_bytes
        self._slots = asyncio.Semaphore(inflight_requests_max)
        self._pending: dict[int, tuple[ApiKey, asyncio.Future[Any]]] = {}
        self._correlation_ids = itertools.count(1)
        self._closed: BiplaneError | None = None
        self._stream = FrameStream(max_frame_bytes=max_frame_bytes, on_frame=self._on_frame,
                                   on_close=self._on_close)
        self.peer = "?"

    @classmethod
    async def connect(cls, host: str, port: int, *, timeout_s: float = 10.0, **limits: Any) -> "WireClient":
        """Connect within timeout_s (TimeoutError past it): a peer whose packets are dropped
        (a network cut) would otherwise hold the caller for the kernel's SYN retries, minutes."""
        client = cls(**limits)
        await asyncio.wait_for(asyncio.get_running_loop().create_connection(lambda: client._stream, host, port),
                               timeout_s)
        client.peer = client._stream.peer
        return client

    @property
    def closed(self) -> bool:
        return self._closed is not None

    async def __aenter__(self) -> "WireClient":
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()

    def _next_correlation_id(self) -> int:
        return next(self._correlation_ids) & 0x7FFFFFFF

    async def request(self, request: Any) -> Any:
        async with self._slots:
            future = self.request_nowait(request)
            try:
                await self._stream.drain()
            except ConnectionError:
                pass  # the stream is closing: on_close fails the future with the reason
            return await future

    def request_nowait(self, request: Any) -> asyncio.Future[Any]:
        """request() without a coroutine: the frame is written before this returns, and the
        future resolves with the response or fails as request() would. Raises the connection's
        error at once if it is closed. It takes no in-flight slot and does not wait for the
        transport to drain: for callers that bound what they have in flight themselves (the
        push leader's core: push_inflight_max per follower and partition)."""
        if self._closed is not None:
            raise self._closed
        correlation_id = self._next_correlation_id()
        parts = encode_request(request, correlation_id=correlation_id)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        # The entry stays until its response arrives, even if the caller is cancelled,
        # so a late response is recognised and dropped.
        self._pending[correlation_id] = (api_key_of(request), future)
        try:
            self._stream.write(parts)
        except ConnectionError:
            pass  # the stream is closing: on_close fails the future with the reason
        return future

    async def send(self, request: Any) -> None:
        if self._closed is not None:
            raise self._closed
        try:
            self._stream.write(encode_request(request, correlation_id=self._next_correlation_id()))
            await self._stream.drain()
        except ConnectionError as exc:
            raise self._closed or ConnectionClosedError(f"connection to {self.peer} lost: {exc}") from None

    def _on_frame(self, payload: bytearray) -> None:
        correlation_id, _ = read_response_header(payload)
        entry = self._pending.pop(correlation_id, None)
        if entry is None:
            raise ProtocolError(f"response for unknown correlation id {correlation_id}")
        api_key, future = entry
        _, response = decode_response(payload, api_key)
        if not future.done():
            future.set_result(response)

    def _on_close(self, reason: BaseException | None) -> None:
        if isinstance(reason, ProtocolError):
            log.warning("closing connection to %s: %s", self.peer, reason,
                        extra={"event": "wire.protocol_error", "peer": self.peer, "reason": str(reason)})
            self._fail_all(reason)
        elif isinstance(reason, BiplaneError):
            self._fail_all(reason)
        elif reason is not None:
            if not isinstance(reason, OSError):
                log.error("response handling failed; closing connection to %s", self.peer, exc_info=reason)
            self._fail_all(ConnectionClosedError(f"connection to {self.peer} lost: {reason}"))
        else:
            self._fail_all(ConnectionClosedError(f"connection to {self.peer} closed"))

    def _fail_all(self, reason: BiplaneError) -> None:
        if self._closed is None:
            self._closed = reason
        for _, future in self._pending.values():
            if not future.done():
                future.set_exception(reason)

    async def close(self) -> None:
        """Close the connection; pending requests fail with ConnectionClosedError. Idempotent."""
        self._fail_all(ConnectionClosedError(f"connection to {self.peer} closed by us"))
        self._stream.close()
        await self._stream.wait_closed()
