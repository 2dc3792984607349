"""Encoding a producer batch straight into one bytearray (Kafka's record-batch v2 layout,
the format common/batch.py reads and documents).

The producer appends each record's bytes as it is sent, so a batch is never a list of
record objects waiting to be encoded: `BatchWriter.append` writes the record at the end
of the buffer, `seal` stamps the 61-byte header it reserved in front (one CRC32C over the
whole batch) and returns the bytes to send. Sealing again (a new producer epoch) rewrites
the header only; with gzip the records region is compressed at each seal.
"""
from __future__ import annotations

import struct
import zlib
from typing import Sequence

from crc32c import crc32c

HEADER_SIZE = 61
CRC_START = 21
MAGIC = 2
GZIP_CODEC = 1
GZIP_LEVEL = 6
MIN_BATCH_LENGTH = HEADER_SIZE - 12

_HEAD = struct.Struct(">qiibI")      # base_offset, batch_length, leader_epoch, magic, crc
_TAIL = struct.Struct(">hiqqqhii")   # attributes .. record_count
_NO_HEADERS = b"\x00"
_NULL = b"\x01"                      # zigzag(-1): a null key or value


def zigzag_varint(n: int) -> bytes:
    """Kafka's signed varint (zigzag, 7 bits a byte, little end first) of a 64-bit integer."""
    z = ((n << 1) ^ (n >> 63)) & 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


# Lengths, deltas and indexes of ordinary records take a table lookup instead of the loop.
VARINT_TABLE_LIMIT = 1 << 14
_VARINT = tuple(zigzag_varint(n) for n in range(-1, VARINT_TABLE_LIMIT))


def varint(n: int) -> bytes:
    if -1 <= n < VARINT_TABLE_LIMIT:
        return _VARINT[n + 1]
    return zigzag_varint(n)


def encode_headers(headers: Sequence[tuple[str, bytes | str | None]]) -> bytes:
    """A record's header section: count, then (name, value) pairs. Names are str, values
    bytes, str (UTF-8) or None."""
    parts = [varint(len(headers))]
    for item in headers:
        try:
            name, value = item
        except (TypeError, ValueError):
            raise TypeError(f"header {item!r} must be a (str, bytes | str | None) pair") from None
        if not isinstance(name, str):
            raise TypeError(f"header name must be str, not {type(name).__name__} ({name!r})")
        raw_name = name.encode()
        parts.append(varint(len(raw_name)))
        parts.append(raw_name)
        if value is None:
            parts.append(_NULL)
            continue
        if isinstance(value, str):
            value = value.encode()
        elif not isinstance(value, (bytes, bytearray, memoryview)):
            raise TypeError(f"header {name!r} value must be bytes, str or None, not {type(value).__name__}")
        value = bytes(value)
        parts.append(varint(len(value)))
        parts.append(value)
    return b"".join(parts)


class BatchWriter:
    """One batch's records in a growing bytearray, header space reserved in front.

    `append` returns the bytes the record took. Records keep offset delta = their index and a
    timestamp delta from the first record, as readers require. Not thread-safe.
    """

    __slots__ = ("buffer", "record_count", "first_timestamp_ms", "max_timestamp_ms")

    def __init__(self) -> None:
        self.buffer = bytearray(HEADER_SIZE)
        self.record_count = 0
        self.first_timestamp_ms = -1
        self.max_timestamp_ms = -1

    @property
    def size_bytes(self) -> int:
        return len(self.buffer)

    def append(self, value: bytes | bytearray | memoryview | None, key: bytes | bytearray | memoryview | None,
               headers: bytes, timestamp_ms: int, batch_bytes_max: int | None = None) -> int:
        """Append one record (`headers` as encode_headers made them, b"\\x00" for none) and return
        the bytes it took; or, when the batch already holds records and this one would take it
        past `batch_bytes_max`, append nothing and return 0."""
        table = _VARINT
        index = self.record_count
        if index == 0:
            head = b"\x00\x00\x00"   # attributes, timestamp delta 0, offset delta 0
        else:
            delta = timestamp_ms - self.first_timestamp_ms
            head = (b"\x00" + (table[delta + 1] if -1 <= delta < VARINT_TABLE_LIMIT else zigzag_varint(delta))
                    + (table[index + 1] if index < VARINT_TABLE_LIMIT else zigzag_varint(index)))
        if key is None:
            head += _NULL
        else:
            n = len(key)
            head += (table[n + 1] if n < VARINT_TABLE_LIMIT else zigzag_varint(n))
            head += key
        if value is None:
            head += _NULL
            body = len(head) + len(headers)
        else:
            n = len(value)
            head += (table[n + 1] if n < VARINT_TABLE_LIMIT else zigzag_varint(n))
            body = len(head) + n + len(headers)
        length = table[body + 1] if body < VARINT_TABLE_LIMIT else zigzag_varint(body)
        buf = self.buffer
        if batch_bytes_max is not None and index and len(buf) + len(length) + body > batch_bytes_max:
            return 0
        buf += length
        buf += head
        if value is not None:
            buf += value
        buf += headers
        if index == 0:
            self.first_timestamp_ms = self.max_timestamp_ms = timestamp_ms
        elif timestamp_ms > self.max_timestamp_ms:
            self.max_timestamp_ms = timestamp_ms
        self.record_count = index + 1
        return len(length) + body

    def seal(self, *, producer_id: int, producer_epoch: int, base_sequence: int,
             gzip: bool = False, gzip_level: int = GZIP_LEVEL) -> bytes | bytearray:
        """The whole batch, header stamped (base offset 0, leader epoch -1: the leader sets them).
        Without compression this is the writer's own buffer: do not append after sealing."""
        if self.record_count == 0:
            raise ValueError("cannot seal an empty batch; append at least one record")
        attributes = 0
        out = self.buffer
        if gzip:
            attributes = GZIP_CODEC
            out = bytearray(HEADER_SIZE)
            out += zlib.compress(memoryview(self.buffer)[HEADER_SIZE:], gzip_level, wbits=31)
        _TAIL.pack_into(out, CRC_START, attributes, self.record_count - 1, self.first_timestamp_ms,
                        self.max_timestamp_ms, producer_id, producer_epoch, base_sequence, self.record_count)
        crc = crc32c(memoryview(out)[CRC_START:])
        _HEAD.pack_into(out, 0, 0, len(out) - 12, -1, MAGIC, crc)
        return out
