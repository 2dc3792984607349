"""FrameStream: one connection's frames, read straight into their own buffers.

asyncio's StreamReader costs three copies and several allocations per received
byte: each recv fills a fresh bytes object, which is appended to a growing
buffer, from which readexactly copies the frame out again. Freshly allocated
large buffers are new pages to the kernel, so those copies also pay a page
fault per 4 KiB; on loopback at hundreds of MB/s that was most of a broker's
system time. Here the kernel writes into a reused receive buffer, and a frame
larger than what is buffered gets its own bytearray that the kernel fills
directly. Each complete frame payload is handed, as a bytearray the receiver
owns, to `on_frame` in arrival order.

Writing: `write(parts)` queues a frame's parts on the transport; `await drain()`
waits while the transport's buffer is above its high-water mark.
A frame size that is not positive or exceeds max_frame_bytes, and a connection
that ends inside a frame, are ProtocolErrors; `on_close(exc)` is called once with
the reason (None for a clean close by either side).
"""
from __future__ import annotations

import asyncio
import socket
import struct
import sys
from typing import Callable, cast

from common.errors import ProtocolError
from common.wire.frames import SIZE_BYTES, BytesLike, check_frame_size

_SIZE = struct.Struct(">i")
RECEIVE_BUFFER_BYTES = 256 * 1024
# A frame at least this large is read into its own buffer instead of the shared one.
OWN_BUFFER_BYTES_MIN = 32 * 1024
# The longest wait between TCP retransmissions on every connection (Linux 6.15+,
# TCP_RTO_MAX_MS in linux/tcp.h; 1 s is the least it takes). The kernel's own cap is 120 s:
# a cut of a few seconds backs the timer off to 1.6-3.2 s, and the connection resumes that
# long after the cut heals: answered 1.3, 2.7 and 5.4 s after cuts of 2, 4 and 8 s healed,
# 0.7-0.8 s with the cap (scripts/measure_retransmit.py).
# The connect itself is not covered (the option is set once connected).
TCP_RTO_MAX_MS: int | None = getattr(socket, "TCP_RTO_MAX_MS", 44 if sys.platform.startswith("linux") else None)
RETRANSMIT_INTERVAL_MAX_MS = 1000


def cap_retransmit_interval(sock: socket.socket | None) -> bool:
    """Cap `sock`'s retransmission timeout where the kernel allows it; False where it does not
    (an older kernel, a socket not TCP): its default then holds."""
    if sock is None or TCP_RTO_MAX_MS is None:
        return False
    try:
        sock.setsockopt(socket.IPPROTO_TCP, TCP_RTO_MAX_MS, RETRANSMIT_INTERVAL_MAX_MS)
    except OSError:
        return False
    return True


class FrameStream(asyncio.BufferedProtocol):
    def __init__(self, *, max_frame_bytes: int, on_frame: Callable[[bytearray], None],
                 on_close: Callable[[BaseException | None], None]) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._on_frame = on_frame
        self._on_close = on_close
        self._buffer = bytearray(RECEIVE_BUFFER_BYTES)
        self._start = 0  # unread bytes are _buffer[_start:_end]
        self._end = 0
        self._frame: bytearray | None = None  # a large frame being filled in place
        self._filled = 0
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self._paused = False
        self._reading_paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._closed: asyncio.Future[None] | None = None
        self._close_reason: BaseException | None = None
        self._done = False

    # ------------------------------------------------------------------ protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream connection's transport is a Transport (asyncio's or uvloop's); the
        # Protocol method is declared with the base class.
        self.transport = cast(asyncio.Transport, transport)
        self._closed = asyncio.get_running_loop().create_future()
        cap_retransmit_interval(transport.get_extra_info("socket"))
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else str(peer)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._frame is not None:
            return memoryview(self._frame)[self._filled:]
        if self._end == len(self._buffer):
            # Move the unread start of a frame to the front (less than one small frame).
            rest = self._end - self._start
            self._buffer[:rest] = self._buffer[self._start:self._end]
            self._start, self._end = 0, rest
        return memoryview(self._buffer)[self._end:]

    def buffer_updated(self, nbytes: int) -> None:
        if self._done:
            return
        try:
            if self._frame is not None:
                self._filled += nbytes
                if self._filled == len(self._frame):
                    frame, self._frame = self._frame, None
                    self._on_frame(frame)
                return
            self._end += nbytes
            self._parse()
        except Exception as exc:  # ProtocolError from us or the receiver, or a receiver's bug
            self.abort(exc)

    def _parse(self) -> None:
        buf = self._buffer
        while not self._done and self._frame is None and not self._reading_paused:
            available = self._end - self._start
            if available < SIZE_BYTES:
                break
            size = _SIZE.unpack_from(buf, self._start)[0]
            check_frame_size(size, self.max_frame_bytes)
            body = self._start + SIZE_BYTES
            have = self._end - body
            if have >= size:
                self._start = body + size
                self._on_frame(buf[body:body + size])
            elif size >= OWN_BUFFER_BYTES_MIN or size > len(buf) - SIZE_BYTES:
                frame = bytearray(size)
                frame[:have] = memoryview(buf)[body:self._end]
                self._frame, self._filled = frame, have
                self._start = self._end = 0
            else:
                break
        if self._start == self._end:
            self._start = self._end = 0

    def eof_received(self) -> bool:
        if self._frame is not None or self._start != self._end:
            partial = self._filled if self._frame is not None else self._end - self._start
            self._close_reason = ProtocolError(f"connection closed inside a frame ({partial} bytes of it received)")
        return False  # close the transport

    def connection_lost(self, exc: BaseException | None) -> None:
        if exc is not None and self._close_reason is None:
            self._close_reason = exc
        self._finish()
        for waiter in self._drain_waiters:
            if not waiter.done():
                waiter.set_exception(ConnectionResetError(f"connection to {self.peer} lost"))
        self._drain_waiters.clear()
        if self._closed is not None and not self._closed.done():
            self._closed.set_result(None)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        for waiter in self._drain_waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._drain_waiters.clear()

    # ------------------------------------------------------------------ use

    def _finish(self) -> None:
        if not self._done:
            self._done = True
            self._on_close(self._close_reason)

    def write(self, parts: list[BytesLike]) -> None:
        """Queue one or more frames' parts (from encode_request / encode_response)."""
        if self.transport is None or self.transport.is_closing():
            raise ConnectionResetError(f"connection to {self.peer} is closed")
        self.transport.writelines(parts)

    async def drain(self) -> None:
        if self.transport is None or self.transport.is_closing():
            raise ConnectionResetError(f"connection to {self.peer} is closed")
        if not self._paused:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._drain_waiters.append(waiter)
        await waiter

    def pause_reading(self) -> None:
        """Hand over no more frames (those already received wait here) until resume_reading."""
        self._reading_paused = True
        if self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        self._reading_paused = False
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()
        try:
            self._parse()  # frames that arrived before the pause
        except Exception as exc:
            self.abort(exc)

    def abort(self, reason: BaseException | None = None) -> None:
        """Close now, dropping unsent data; on_close gets `reason`."""
        if self._close_reason is None:
            self._close_reason = reason
        self._finish()
        if self.transport is not None:
            self.transport.abort()

    def close(self) -> None:
        """Close after the queued data is sent; on_close gets None (or an earlier reason)."""
        self._finish()
        if self.transport is not None:
            self.transport.close()

    async def wait_closed(self) -> None:
        if self._closed is not None:
            await asyncio.shield(self._closed)
