"""The broker's connection loop: requests pipelined, answers in arrival order.

common.wire.serve_connection handles one request at a time; a producer with
several acks=all batches in flight on one connection would then wait a whole
replication round per batch. Here each request is started as soon as it is
read (`start(header, request)` must do its order-sensitive work — stepping
produce requests into the cores — before it returns), up to
`inflight_requests_max` per connection, and a writer sends the answers in the
order the requests came (Kafka's rule; acks=0 produce gets none). A peer that
breaks the protocol loses its own connection only.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable

from common.errors import ProtocolError
from common.wire import RequestHeader, decode_request, encode_response, read_frame

log = logging.getLogger("biplane.wire")

Start = Callable[[RequestHeader, Any], Awaitable[Any]]


async def serve_pipelined(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, start: Start, *,
                          max_frame_bytes: int, inflight_requests_max: int = 64) -> None:
    peer = writer.get_extra_info("peername")
    answers: asyncio.Queue = asyncio.Queue(maxsize=inflight_requests_max)
    write_task = asyncio.get_running_loop().create_task(_write_answers(answers, writer))
    try:
        while not write_task.done():
            payload = await read_frame(reader, max_frame_bytes)
            if payload is None:
                break  # the peer closed: nobody reads answers any more; requests already
                # started (produce steps) stay done, the answers still pending are dropped
            header, request = decode_request(payload)
            answer = asyncio.ensure_future(start(header, request))
            await answers.put((header.correlation_id, answer))
    except ProtocolError as exc:
        log.warning("closing connection from %s: %s", peer, exc,
                    extra={"event": "wire.protocol_error", "peer": str(peer), "reason": str(exc)})
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("request handling failed; closing connection from %s", peer)
    finally:
        write_task.cancel()
        try:
            await write_task
        except (asyncio.CancelledError, Exception):
            pass
        while not answers.empty():
            item = answers.get_nowait()
            if item is not None:
                item[1].cancel()
        writer.close()
        try:
            await writer.wait_closed()
        except (ConnectionError, OSError):
            pass


async def _write_answers(answers: asyncio.Queue, writer: asyncio.StreamWriter) -> None:
    """Send answers in request order. Answers that are ready together (one HW move releases
    several acks=all produce requests) go out in one write: one syscall and one wake-up of
    the peer instead of one each."""
    parts: list = []
    item = await answers.get()
    while item is not None:
        correlation_id, answer = item
        if parts and not answer.done():
            writer.writelines(parts)  # what is ready goes now; do not hold it for a slow one
            parts = []
            await writer.drain()
        try:
            response = await answer
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("request handler failed; closing the connection")
            writer.close()
            raise
        if response is not None:
            parts += encode_response(response, correlation_id=correlation_id)
        if answers.empty():
            if parts:
                writer.writelines(parts)
                parts = []
                await writer.drain()
            item = await answers.get()
        else:
            item = answers.get_nowait()


async def start_pipelined_server(start: Start, host: str, port: int, *, max_frame_bytes: int,
                                 inflight_requests_max: int = 64) -> asyncio.Server:
    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await serve_pipelined(reader, writer, start, max_frame_bytes=max_frame_bytes,
                                  inflight_requests_max=inflight_requests_max)
        except asyncio.CancelledError:
            pass  # the process is stopping; the connection is closed already
    return await asyncio.start_server(on_connect, host, port)
