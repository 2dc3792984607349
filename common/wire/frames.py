"""Length-prefixed frames and their headers.

Every message is one frame: an int32 size (bytes that follow, > 0) and then
the payload. A request payload starts with api_key int16, api_version int16,
correlation_id int32; a response payload starts with the correlation_id int32.
The rest is the message body (see codec.py and messages.py).

`FrameDecoder` is sans-I/O: feed it bytes as they arrive, get complete frame
payloads back. It rejects a bad size as soon as the 4 size bytes are in, so it
never holds more than one partial frame of at most `max_frame_bytes`.
"""
from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass
from typing import Iterable, Union

from common.errors import FrameTooLargeError, ProtocolError

BytesLike = Union[bytes, bytearray, memoryview]

DEFAULT_MAX_FRAME_BYTES = 64 * 1024 * 1024

_SIZE = struct.Struct(">i")
_REQUEST_HEADER = struct.Struct(">hhi")
_RESPONSE_HEADER = struct.Struct(">i")
SIZE_BYTES = _SIZE.size
REQUEST_HEADER_BYTES = _REQUEST_HEADER.size
RESPONSE_HEADER_BYTES = _RESPONSE_HEADER.size


@dataclass(frozen=True, kw_only=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int


def check_frame_size(size: int, max_frame_bytes: int) -> None:
    if size <= 0:
        raise ProtocolError(f"frame size {size} is not positive; the stream is out of sync")
    if size > max_frame_bytes:
        raise FrameTooLargeError(f"frame size {size} exceeds max_frame_bytes={max_frame_bytes}")


def encode_frame(parts: Iterable[BytesLike]) -> list[BytesLike]:
    """Prefix payload parts with their total size; returns parts for writelines()."""
    parts = list(parts)
    size = sum(p.nbytes if isinstance(p, memoryview) else len(p) for p in parts)
    if size <= 0 or size > 0x7FFFFFFF:
        raise ProtocolError(f"frame payload of {size} bytes cannot be framed")
    return [_SIZE.pack(size), *parts]


def request_header_bytes(api_key: int, api_version: int, correlation_id: int) -> bytes:
    return _REQUEST_HEADER.pack(api_key, api_version, correlation_id)


def response_header_bytes(correlation_id: int) -> bytes:
    return _RESPONSE_HEADER.pack(correlation_id)


def read_request_header(payload: BytesLike) -> tuple[RequestHeader, int]:
    """Parse a request payload's header; returns it and the body's start."""
    if len(payload) < REQUEST_HEADER_BYTES:
        raise ProtocolError(f"request frame of {len(payload)} bytes is shorter than its "
                            f"{REQUEST_HEADER_BYTES}-byte header")
    api_key, api_version, correlation_id = _REQUEST_HEADER.unpack_from(payload, 0)
    return RequestHeader(api_key=api_key, api_version=api_version,
                         correlation_id=correlation_id), REQUEST_HEADER_BYTES


def read_response_header(payload: BytesLike) -> tuple[int, int]:
    """Parse a response payload's correlation id; returns it and the body's start."""
    if len(payload) < RESPONSE_HEADER_BYTES:
        raise ProtocolError(f"response frame of {len(payload)} bytes is shorter than its "
                            f"{RESPONSE_HEADER_BYTES}-byte header")
    return _RESPONSE_HEADER.unpack_from(payload, 0)[0], RESPONSE_HEADER_BYTES


class FrameDecoder:
    """Turns a byte stream into frame payloads. After an error it stays failed."""

    def __init__(self, *, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        if max_frame_bytes < 1:
            raise ValueError(f"max_frame_bytes {max_frame_bytes} must be positive")
        self.max_frame_bytes = max_frame_bytes
        self._buffer = bytearray()
        self._failed: ProtocolError | None = None

    @property
    def buffered_bytes(self) -> int:
        return len(self._buffer)

    def feed(self, data: BytesLike) -> list[bytes]:
        """Add bytes; return every frame payload now complete, in order."""
        if self._failed is not None:
            raise self._failed
        buf = self._buffer
        buf += data
        frames: list[bytes] = []
        pos = 0
        available = len(buf)
        limit = self.max_frame_bytes
        try:
            # One copy per frame, through a view released before the buffer is trimmed.
            with memoryview(buf) as view:
                while available - pos >= SIZE_BYTES:
                    size = _SIZE.unpack_from(buf, pos)[0]
                    check_frame_size(size, limit)
                    end = pos + SIZE_BYTES + size
                    if end > available:
                        break
                    frames.append(bytes(view[pos + SIZE_BYTES:end]))
                    pos = end
        except ProtocolError as exc:
            self._failed = exc
            buf.clear()
            raise
        del buf[:pos]
        return frames


async def read_frame(reader: asyncio.StreamReader,
                     max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> bytes | None:
    """Read one frame payload; None when the peer closed cleanly between frames."""
    try:
        head = await reader.readexactly(SIZE_BYTES)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise ProtocolError(f"connection closed inside a frame size ({len(exc.partial)} of 4 bytes)") from None
    size = _SIZE.unpack(head)[0]
    check_frame_size(size, max_frame_bytes)
    try:
        return await reader.readexactly(size)
    except asyncio.IncompleteReadError as exc:
        raise ProtocolError(f"connection closed inside a frame ({len(exc.partial)} of {size} bytes)") from None


def write_frame(writer: asyncio.StreamWriter, parts: Iterable[BytesLike]) -> None:
    """Queue one frame made of payload parts; the caller awaits writer.drain()."""
    writer.writelines(encode_frame(parts))
