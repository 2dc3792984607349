"""Kafka's record-batch codecs other than gzip: snappy, lz4 and zstd, through cramjam.

The one module that imports cramjam (one adapter per foreign library). Formats, as
Kafka's clients write them:
- snappy: Java's xerial framing (an 8-byte magic, two int32 versions, then blocks of
  int32 length + raw snappy) or a bare raw snappy block (librdkafka may write either);
  both are read, the framed one is written (what the Java client expects);
- lz4: the standard LZ4 frame format (Kafka's message format v2; not the old broken
  KAFKA-3160 header checksum);
- zstd: a standard zstd frame.
Only clients compress and decompress: brokers keep batches as they came and read the
header alone (common/batch.py).
"""
from __future__ import annotations

import struct

import cramjam

SNAPPY, LZ4, ZSTD = 2, 3, 4

XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = XERIAL_MAGIC + struct.pack(">ii", 1, 1)
_XERIAL_BLOCK_BYTES = 32 * 1024   # the Java client's block size
_INT32 = struct.Struct(">i")
LZ4_LEVEL = 1


class CodecError(ValueError):
    """The compressed bytes do not decompress, or inflate past the caller's limit."""


def compress(codec: int, data: bytes | bytearray | memoryview) -> bytes:
    if codec == SNAPPY:
        out = bytearray(_XERIAL_HEADER)
        view = memoryview(data)
        for start in range(0, len(view), _XERIAL_BLOCK_BYTES):
            block = bytes(cramjam.snappy.compress_raw(bytes(view[start:start + _XERIAL_BLOCK_BYTES])))
            out += _INT32.pack(len(block)) + block
        return bytes(out)
    if codec == LZ4:
        # The fast mode, as librdkafka uses: cramjam's default level took 4x as long for a
        # 1 MB batch here, to save a tenth of the bytes.
        return bytes(cramjam.lz4.compress(bytes(data), level=LZ4_LEVEL))
    if codec == ZSTD:
        return bytes(cramjam.zstd.compress(bytes(data)))
    raise ValueError(f"codec {codec} is not snappy ({SNAPPY}), lz4 ({LZ4}) or zstd ({ZSTD})")


def compressed_bytes_max(codec: int, n: int) -> int:
    """An upper bound on the compressed size of n bytes (each library's documented bound plus
    framing), so that a size checked before compressing holds after."""
    if codec == SNAPPY:
        blocks = max(1, -(-n // _XERIAL_BLOCK_BYTES))
        return len(_XERIAL_HEADER) + n + n // 6 + blocks * (32 + _INT32.size)
    if codec == LZ4:
        return n + n // 255 + 16 + 64   # LZ4_compressBound plus the frame's header, end mark and checksums
    if codec == ZSTD:
        return n + (n >> 8) + ((128 * 1024 - n) >> 11 if n < 128 * 1024 else 0) + 64
    raise ValueError(f"codec {codec} is not snappy ({SNAPPY}), lz4 ({LZ4}) or zstd ({ZSTD})")


def decompress(codec: int, data: bytes, limit: int) -> bytes:
    """The records region decompressed; CodecError when it does not decompress or when it
    inflates past `limit` bytes."""
    try:
        if codec == SNAPPY:
            out = _snappy(data, limit)
        elif codec == LZ4:
            out = bytes(cramjam.lz4.decompress(data))
        elif codec == ZSTD:
            out = bytes(cramjam.zstd.decompress(data))
        else:
            raise ValueError(f"codec {codec} is not snappy ({SNAPPY}), lz4 ({LZ4}) or zstd ({ZSTD})")
    except cramjam.DecompressionError as exc:
        raise CodecError(f"does not decompress: {exc}") from None
    if len(out) > limit:
        raise CodecError(f"inflates past {limit} bytes")
    return out


def _snappy(data: bytes, limit: int) -> bytes:
    if not data.startswith(XERIAL_MAGIC):
        return _snappy_block(data, limit)
    pos = len(_XERIAL_HEADER)
    if len(data) < pos:
        raise CodecError("xerial snappy header is truncated")
    out = bytearray()
    while pos < len(data):
        if len(data) - pos < _INT32.size:
            raise CodecError(f"xerial snappy block length at byte {pos} is truncated")
        (size,) = _INT32.unpack_from(data, pos)
        pos += _INT32.size
        if size < 0 or pos + size > len(data):
            raise CodecError(f"xerial snappy block at byte {pos} claims {size} bytes, {len(data) - pos} remain")
        out += _snappy_block(data[pos:pos + size], limit - len(out))
        pos += size
    return bytes(out)


def _snappy_block(block: bytes, limit: int) -> bytes:
    # A raw block starts with its uncompressed length (a varint): refuse a bomb before inflating.
    length, shift = 0, 0
    for i, byte in enumerate(block[:5]):
        length |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            break
    else:
        raise CodecError("raw snappy block has no valid length preamble")
    if length > limit:
        raise CodecError(f"a snappy block inflates to {length} bytes, past the limit {limit}")
    return bytes(cramjam.snappy.decompress_raw(block))
