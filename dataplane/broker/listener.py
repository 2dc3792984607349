"""The broker's connection loop: requests pipelined, answers in arrival order.

common.wire.serve_connection handles one request at a time; a producer with
several acks=all batches in flight on one connection would then wait a whole
replication round per batch. Here each request is started as soon as its frame
is read (`start(header, request)` must do its order-sensitive work — stepping
produce requests into the cores — before it returns), up to
`inflight_requests_max` per connection (then the connection stops reading until
answers go out), and a writer sends the answers in the order the requests came
(Kafka's rule; acks=0 produce gets none). Frames are read by a FrameStream
(common/wire/stream.py), straight into their own buffers. A peer that breaks the
protocol loses its own connection only.
"""
from __future__ import annotations

import asyncio
import collections
import logging
from typing import Any, Awaitable, Callable

from common.errors import ProtocolError
from common.wire import RequestHeader, decode_request, encode_response
from common.wire.frames import BytesLike
from common.wire.stream import FrameStream

log = logging.getLogger("biplane.wire")

Start = Callable[[RequestHeader, Any], Awaitable[Any]]


class PipelinedConnection:
    """One client connection: frames in, started requests queued, answers out in order."""

    def __init__(self, start: Start, *, max_frame_bytes: int, inflight_requests_max: int = 64) -> None:
        self._start = start
        self.inflight_requests_max = inflight_requests_max
        self.stream = FrameStream(max_frame_bytes=max_frame_bytes, on_frame=self._on_frame, on_close=self._on_close)
        self._answers: collections.deque[tuple[Any, asyncio.Future[Any]]] = collections.deque()
        self._arrived = asyncio.Event()  # set when an answer is queued for the writer
        self._writer: asyncio.Task[None] | None = None
        self._reading_paused = False

    def _on_frame(self, payload: bytearray) -> None:
        header, request = decode_request(payload)
        self._queue(header.correlation_id, self._start(header, request))

    def _encode(self, key: Any, response: Any) -> list[BytesLike]:
        """The frame parts answering the request queued under `key` (its correlation id)."""
        return encode_response(response, correlation_id=key)

    def _queue(self, key: Any, answer_of: Awaitable[Any]) -> None:
        """A started request's answer, to be sent after those queued before it."""
        answer = asyncio.ensure_future(answer_of)
        self._answers.append((key, answer))
        if self._writer is None:
            self._arrived = asyncio.Event()
            self._writer = asyncio.get_running_loop().create_task(self._write_answers())
        self._arrived.set()
        if len(self._answers) >= self.inflight_requests_max and not self._reading_paused:
            self._reading_paused = True
            self.stream.pause_reading()

    def _on_close(self, reason: BaseException | None) -> None:
        if isinstance(reason, ProtocolError):
            log.warning("closing connection from %s: %s", self.stream.peer, reason,
                        extra={"event": "wire.protocol_error", "peer": self.stream.peer, "reason": str(reason)})
        elif reason is not None and not isinstance(reason, OSError):
            log.error("request handling failed; closing connection from %s", self.stream.peer, exc_info=reason)
        # Nobody reads answers any more; requests already started (produce steps) stay
        # done, the answers still pending are dropped.
        if self._writer is not None:
            self._writer.cancel()
        while self._answers:
            self._answers.popleft()[1].cancel()

    async def _write_answers(self) -> None:
        """Send answers in request order. Answers that are ready together (one HW move
        releases several acks=all produce requests) go out in one write: one syscall and
        one wake-up of the peer instead of one each."""
        parts: list[BytesLike] = []
        try:
            while True:
                if not self._answers:
                    if parts:
                        self.stream.write(parts)
                        parts = []
                        await self.stream.drain()
                    if not self._answers:
                        self._arrived.clear()
                        await self._arrived.wait()
                        continue
                key, answer = self._answers[0]
                if parts and not answer.done():
                    self.stream.write(parts)  # what is ready goes now; do not hold it for a slow one
                    parts = []
                    await self.stream.drain()
                response = await answer
                self._answers.popleft()
                if self._reading_paused and len(self._answers) < self.inflight_requests_max:
                    self._reading_paused = False
                    self.stream.resume_reading()
                if response is not None:
                    parts += self._encode(key, response)
        except asyncio.CancelledError:
            raise
        except ConnectionError:
            pass  # the peer left; _on_close cleans up
        except Exception as exc:
            log.exception("request handler failed; closing the connection from %s", self.stream.peer)
            self.stream.abort(exc)


async def start_pipelined_server(start: Start, host: str, port: int, *, max_frame_bytes: int,
                                 inflight_requests_max: int = 64) -> asyncio.Server:
    def connection() -> FrameStream:
        return PipelinedConnection(start, max_frame_bytes=max_frame_bytes,
                                   inflight_requests_max=inflight_requests_max).stream
    return await asyncio.get_running_loop().create_server(connection, host, port)
