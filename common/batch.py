"""Record batches in Kafka's record-batch v2 layout (big-endian).

A batch is a 61-byte header followed by its records. Brokers treat a batch as
opaque bytes once `validate_batch` has accepted it: they read the header,
check the CRC32C and patch the two fields that lie outside the CRC
(`base_offset`, `leader_epoch`) in place. Only clients decode records.

Header layout (byte offsets):

     0 base_offset        int64
     8 batch_length       int32   bytes after this field (= size - 12)
    12 leader_epoch       int32   Kafka's partitionLeaderEpoch
    16 magic              int8    always 2
    17 crc                uint32  CRC32C of bytes 21..end
    21 attributes         int16   bits 0-2 codec, bit 4 transactional, bit 5 control
    23 last_offset_delta  int32
    27 first_timestamp    int64
    35 max_timestamp      int64
    43 producer_id        int64
    51 producer_epoch     int16
    53 base_sequence      int32
    57 record_count       int32

Every batch Biplane writes has contiguous offsets: record i has offset delta
i, so `last_offset_delta == record_count - 1` and a batch is never empty.
Readers enforce that, which lets a log trust the header alone for offsets.

Writing: `BatchWriter` encodes records straight into one bytearray behind a
reserved header and stamps the header with one CRC32C when sealed; the
producer uses it as is, and `BatchBuilder` / `build_batch` wrap it with
argument checks and a size limit for brokers, tools and tests.

Buffers: every reader accepts bytes, bytearray or memoryview and never copies
the records region on the hot path (header reads, CRC checks, patching).
Readers do not keep a view of the caller's buffer after they return.
"""
from __future__ import annotations

import enum
import struct
import zlib
from dataclasses import dataclass
from typing import Iterator, Sequence, TypedDict, Union, Unpack

from crc32c import crc32c

from common import codecs
from common.errors import BatchFullError, CorruptBatchError, InvalidRequestError

Buffer = Union[bytes, bytearray, memoryview]

HEADER_SIZE = 61
MAGIC = 2
# batch_length counts the bytes after the length field itself.
LENGTH_FIELD_END = 12
MIN_BATCH_LENGTH = HEADER_SIZE - LENGTH_FIELD_END  # 49
CRC_START = 21

# Readers accept batches up to this size unless told otherwise; producers
# build smaller ones (BatchBuilder's default).
BATCH_BYTES_MAX = 16 * 1024 * 1024
BUILDER_BATCH_BYTES_MAX = 1024 * 1024
# A compressed records region may not inflate past this (decompression bomb guard).
DECOMPRESSED_BYTES_MAX = 64 * 1024 * 1024
# zlib's default level; BatchBuilder(gzip_level=1) trades ratio for build speed.
GZIP_LEVEL = 6

# Timestamps are milliseconds; -1 is "no timestamp". The bound keeps every
# delta inside an int64 varlong.
NO_TIMESTAMP = -1
TIMESTAMP_MS_MAX = 1 << 62

_INT16_MAX = (1 << 15) - 1
_INT32_MAX = (1 << 31) - 1
INT64_MAX = (1 << 63) - 1

ATTR_CODEC_MASK = 0x07
ATTR_TRANSACTIONAL = 0x10
ATTR_CONTROL = 0x20

# Smallest encoded record: length, attributes, timestamp delta, offset delta,
# key length, value length, header count — one byte each.
MIN_RECORD_BYTES = 7


class Compression(enum.IntEnum):
    NONE = 0
    GZIP = 1      # zlib, the standard library's
    SNAPPY = 2    # the others through cramjam (common/codecs.py)
    LZ4 = 3
    ZSTD = 4


_KNOWN_CODECS = frozenset(int(c) for c in Compression)

_HEADER = struct.Struct(">qiibIhiqqqhii")
_HEAD = struct.Struct(">qiibI")  # base_offset .. crc: bytes 0-20
_TAIL = struct.Struct(">hiqqqhii")  # attributes .. record_count: bytes 21-60
_BASE_OFFSET = struct.Struct(">q")
_INT32 = struct.Struct(">i")
_UINT32 = struct.Struct(">I")
_LENGTH_AND_EPOCH_MAGIC = struct.Struct(">iib")  # batch_length, leader_epoch, magic at 8
assert _HEADER.size == HEADER_SIZE
assert _HEAD.size + _TAIL.size == HEADER_SIZE


@dataclass(frozen=True, slots=True)
class BatchHeader:
    base_offset: int
    batch_length: int
    leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    first_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def size_bytes(self) -> int:
        return self.batch_length + LENGTH_FIELD_END

    @property
    def compression(self) -> Compression:
        return Compression(self.attributes & ATTR_CODEC_MASK)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & ATTR_CONTROL)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & ATTR_TRANSACTIONAL)

    @property
    def has_producer_id(self) -> bool:
        return self.producer_id >= 0


@dataclass(frozen=True, slots=True)
class Record:
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()


def _corrupt(pos: int, message: str) -> CorruptBatchError:
    return CorruptBatchError(f"record batch at byte {pos}: {message}")


# ---------------------------------------------------------------- header reads


def read_header(buf: Buffer, pos: int = 0, *, max_batch_bytes: int = BATCH_BYTES_MAX) -> BatchHeader:
    """Parse and sanity-check the header at `pos`; the CRC is not checked.

    Only the 61 header bytes need to be present, so a log can index a batch
    from its header alone.
    """
    available = len(buf) - pos
    if pos < 0 or available < HEADER_SIZE:
        raise _corrupt(pos, f"truncated header: need {HEADER_SIZE} bytes, have {max(available, 0)}")
    fields = _HEADER.unpack_from(buf, pos)
    (base_offset, batch_length, _epoch, magic, _crc, attributes,
     last_offset_delta, _first, _max, _pid, _pepoch, _seq, record_count) = fields
    if magic != MAGIC:
        raise _corrupt(pos, f"magic {magic} is not {MAGIC}; this is not a v2 record batch")
    max_length = max_batch_bytes - LENGTH_FIELD_END
    if not MIN_BATCH_LENGTH <= batch_length <= max_length:
        raise _corrupt(pos, f"batch_length {batch_length} out of range [{MIN_BATCH_LENGTH}, {max_length}]"
                            f" (max_batch_bytes={max_batch_bytes})")
    if base_offset < 0:
        raise _corrupt(pos, f"base_offset {base_offset} is negative")
    if record_count < 1:
        raise _corrupt(pos, f"record_count {record_count} must be at least 1")
    if last_offset_delta != record_count - 1:
        raise _corrupt(pos, f"record_count {record_count} and last_offset_delta {last_offset_delta} "
                            "are inconsistent (offsets must be contiguous)")
    if base_offset > INT64_MAX - last_offset_delta:
        raise _corrupt(pos, f"base_offset {base_offset} + last_offset_delta {last_offset_delta} overflows int64")
    codec = attributes & ATTR_CODEC_MASK
    if codec not in _KNOWN_CODECS:
        raise _corrupt(pos, f"compression codec {codec} is not supported "
                            "(known: none=0, gzip=1, snappy=2, lz4=3, zstd=4)")
    if codec == 0 and record_count * MIN_RECORD_BYTES > batch_length - MIN_BATCH_LENGTH:
        raise _corrupt(pos, f"record_count {record_count} cannot fit in "
                            f"{batch_length - MIN_BATCH_LENGTH} bytes of records")
    return BatchHeader(*fields)


def validate_batch(buf: Buffer, pos: int = 0, *, max_batch_bytes: int = BATCH_BYTES_MAX) -> BatchHeader:
    """Check the header, that the whole batch is present, and its CRC32C."""
    header = read_header(buf, pos, max_batch_bytes=max_batch_bytes)
    end = pos + header.batch_length + LENGTH_FIELD_END
    if end > len(buf):
        raise _corrupt(pos, f"truncated batch: need {end - pos} bytes, have {len(buf) - pos}")
    actual = crc32c(memoryview(buf)[pos + CRC_START:end])
    if actual != header.crc:
        raise _corrupt(pos, f"CRC32C mismatch: header says {header.crc:#010x}, records give {actual:#010x}")
    return header


def iter_batches(buf: Buffer, *, validate: bool = True,
                 max_batch_bytes: int = BATCH_BYTES_MAX) -> Iterator[tuple[int, BatchHeader]]:
    """Yield (position, header) for each batch in a concatenation of batches.

    With `validate=False` the CRC is skipped (for bytes this process already
    validated) but headers and sizes are still checked. Raises
    CorruptBatchError naming the byte position of the first bad batch.
    """
    pos = 0
    total = len(buf)
    check = validate_batch if validate else read_header
    while pos < total:
        header = check(buf, pos, max_batch_bytes=max_batch_bytes)
        end = pos + header.batch_length + LENGTH_FIELD_END
        if end > total:
            raise _corrupt(pos, f"truncated batch: need {end - pos} bytes, have {total - pos}")
        yield pos, header
        pos = end


def scan_valid_prefix(buf: Buffer, *, max_batch_bytes: int = BATCH_BYTES_MAX) -> tuple[int, list[BatchHeader]]:
    """Return (bytes of whole valid batches at the front, their headers); never raises
    CorruptBatchError. Log recovery truncates everything after the returned length."""
    pos = 0
    total = len(buf)
    headers: list[BatchHeader] = []
    while pos < total:
        try:
            header = validate_batch(buf, pos, max_batch_bytes=max_batch_bytes)
        except CorruptBatchError:
            break
        headers.append(header)
        pos += header.batch_length + LENGTH_FIELD_END
    return pos, headers


# ------------------------------------------------------------ in-place patches


def _check_patchable(buf: bytearray | memoryview, pos: int) -> None:
    if isinstance(buf, memoryview) and buf.readonly:
        raise TypeError("cannot patch a read-only memoryview; pass a bytearray or writable view")
    if not isinstance(buf, (bytearray, memoryview)):
        raise TypeError(f"cannot patch {type(buf).__name__} in place; pass a bytearray or writable memoryview")
    if pos < 0 or len(buf) - pos < HEADER_SIZE:
        raise _corrupt(pos, f"truncated header: need {HEADER_SIZE} bytes, have {max(len(buf) - pos, 0)}")
    magic = buf[pos + 16]
    if magic != MAGIC:
        raise _corrupt(pos, f"magic {magic} is not {MAGIC}; refusing to patch something that is not a batch")


def set_base_offset(buf: bytearray | memoryview, base_offset: int, pos: int = 0) -> None:
    """Stamp the batch's base offset; the CRC stays valid (the field is outside it)."""
    _check_patchable(buf, pos)
    last_offset_delta = max(_INT32.unpack_from(buf, pos + 23)[0], 0)
    if not 0 <= base_offset <= INT64_MAX - last_offset_delta:
        raise InvalidRequestError(f"base_offset {base_offset} out of range for this batch")
    _BASE_OFFSET.pack_into(buf, pos, base_offset)


def set_leader_epoch(buf: bytearray | memoryview, leader_epoch: int, pos: int = 0) -> None:
    """Stamp the leader epoch the batch was appended in; the CRC stays valid."""
    _check_patchable(buf, pos)
    if not -1 <= leader_epoch <= _INT32_MAX:
        raise InvalidRequestError(f"leader_epoch {leader_epoch} out of range [-1, {_INT32_MAX}]")
    _INT32.pack_into(buf, pos + 12, leader_epoch)


# ------------------------------------------------------------------- varints


def zigzag_varint(n: int) -> bytes:
    """Kafka's signed varint of a 64-bit integer: zigzag, 7 bits a byte, low bits first."""
    z = ((n << 1) ^ (n >> 63)) & 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


# Precomputed encodings of -1 .. VARINT_TABLE_LIMIT-1: lengths, deltas and indexes of
# ordinary records take a table lookup instead of the loop above.
VARINT_TABLE_LIMIT = 1 << 14
_VARINT = tuple(zigzag_varint(n) for n in range(-1, VARINT_TABLE_LIMIT))


def varint(n: int) -> bytes:
    if -1 <= n < VARINT_TABLE_LIMIT:
        return _VARINT[n + 1]
    return zigzag_varint(n)


_VARINT_BYTES_MAX = 10
_NULL = _VARINT[0]            # length -1: a null key, value or header value
NO_HEADERS = _VARINT[1]       # a record's header section with no headers (count 0)


# ------------------------------------------------------------------- building


class RecordHeaderError(InvalidRequestError, TypeError):
    """A record header is not a (str, bytes | str | None) pair. It is also a TypeError: a
    producer's caller passed an argument of the wrong type, and send() promises TypeError."""


def encode_headers(headers: Sequence[tuple[str, bytes | str | None]]) -> bytes:
    """A record's header section: the count, then each (name, value). Names are str, values
    bytes-like, str (stored as UTF-8) or None. Raises RecordHeaderError naming the bad item."""
    parts = [varint(len(headers))]
    for item in headers:
        # A pair only: a two-letter string would unpack into a name and a value.
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise RecordHeaderError(f"header {item!r} must be a (str, bytes | str | None) pair")
        name, value = item
        if not isinstance(name, str):
            raise RecordHeaderError(f"header name must be str, not {type(name).__name__} ({name!r})")
        raw_name = name.encode()
        parts.append(varint(len(raw_name)))
        parts.append(raw_name)
        if value is None:
            parts.append(_NULL)
            continue
        if isinstance(value, str):
            value = value.encode()
        elif not isinstance(value, (bytes, bytearray, memoryview)):
            raise RecordHeaderError(f"header {name!r} value must be bytes, str or None, not {type(value).__name__}")
        value = bytes(value)
        parts.append(varint(len(value)))
        parts.append(value)
    return b"".join(parts)


class BatchWriter:
    """One batch encoded as it grows: records are written at the end of one bytearray, behind
    61 bytes reserved for the header, and `seal` stamps that header (one CRC32C over the
    batch). Sealing again rewrites the header only, so a producer can re-stamp a queued batch
    with a new producer epoch; with gzip the records region is compressed at each seal.

    Records get offset delta = their index and a timestamp delta from the first record, as
    readers require. The arguments are not checked here (BatchBuilder and the producer check
    them once, before this hot path). Not thread-safe.
    """

    __slots__ = ("buffer", "record_count", "first_timestamp_ms", "max_timestamp_ms")

    def __init__(self) -> None:
        self.buffer = bytearray(HEADER_SIZE)
        self.record_count = 0
        self.first_timestamp_ms = NO_TIMESTAMP
        self.max_timestamp_ms = NO_TIMESTAMP

    @property
    def size_bytes(self) -> int:
        """The batch's size if sealed now without compression."""
        return len(self.buffer)

    def append(self, value: Buffer | None, key: Buffer | None, headers: bytes, timestamp_ms: int,
               batch_bytes_max: int | None = None) -> int:
        """Append one record (`headers` as encode_headers made them, NO_HEADERS for none) and
        return the bytes it took; or, when it would take the batch past `batch_bytes_max`, append
        nothing and return 0. Without a limit the record always goes in (the producer puts a
        record larger than its batch size alone into a batch of its own)."""
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
        if batch_bytes_max is not None and len(buf) + len(length) + body > batch_bytes_max:
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

    def record_size_bytes(self, value: Buffer | None, key: Buffer | None, headers: bytes,
                          timestamp_ms: int) -> int:
        """The bytes `append` would take for this record now; nothing is written."""
        index = self.record_count
        body = 1 + len(varint(timestamp_ms - self.first_timestamp_ms if index else 0)) + len(varint(index))
        body += 1 if key is None else len(varint(len(key))) + len(key)
        body += 1 if value is None else len(varint(len(value))) + len(value)
        body += len(headers)
        return len(varint(body)) + body

    def seal(self, *, producer_id: int = -1, producer_epoch: int = -1, base_sequence: int = -1,
             base_offset: int = 0, leader_epoch: int = -1, compression: Compression = Compression.NONE,
             gzip_level: int = GZIP_LEVEL, is_control: bool = False, is_transactional: bool = False) -> bytearray:
        """The whole batch with its header stamped. Without compression this is the writer's own
        buffer: copy it before appending again. A producer leaves base_offset 0 and
        leader_epoch -1; the leader's log stamps both."""
        if self.record_count == 0:
            raise ValueError("cannot seal an empty batch; append at least one record")
        attributes = int(compression) | (ATTR_CONTROL if is_control else 0) \
            | (ATTR_TRANSACTIONAL if is_transactional else 0)
        out = self.buffer
        if compression == Compression.GZIP:
            out = bytearray(HEADER_SIZE)
            out += zlib.compress(memoryview(self.buffer)[HEADER_SIZE:], gzip_level, wbits=31)
        elif compression != Compression.NONE:
            out = bytearray(HEADER_SIZE)
            out += codecs.compress(int(compression), memoryview(self.buffer)[HEADER_SIZE:])
        _TAIL.pack_into(out, CRC_START, attributes, self.record_count - 1, self.first_timestamp_ms,
                        self.max_timestamp_ms, producer_id, producer_epoch, base_sequence, self.record_count)
        crc = crc32c(memoryview(out)[CRC_START:])
        _HEAD.pack_into(out, 0, base_offset, len(out) - LENGTH_FIELD_END, leader_epoch, MAGIC, crc)
        return out


def _check_int(name: str, value: object, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequestError(f"{name} must be an int, got {type(value).__name__}")
    if not low <= value <= high:
        raise InvalidRequestError(f"{name} {value} out of range [{low}, {high}]")
    return value


def _gzip_bound(n: int) -> int:
    # zlib's deflateBound plus the gzip header and trailer: an upper bound on
    # the compressed size, so a size check made before compressing holds after.
    return n + (n >> 12) + (n >> 14) + (n >> 25) + 13 + 18


def _compressed_bound(compression: Compression, n: int) -> int:
    if compression is Compression.NONE:
        return n
    if compression is Compression.GZIP:
        return _gzip_bound(n)
    return codecs.compressed_bytes_max(int(compression), n)


def _records_bytes_max(compression: Compression, max_batch_bytes: int) -> int:
    """The most uncompressed record bytes whose compressed bound still fits in max_batch_bytes
    (-1: none fit). Every bound only grows, so a bisection finds it."""
    fits, too_big = -1, max_batch_bytes
    while too_big - fits > 1:
        mid = (fits + too_big) // 2
        if HEADER_SIZE + _compressed_bound(compression, mid) <= max_batch_bytes:
            fits = mid
        else:
            too_big = mid
    return fits


def _as_bytes(name: str, data: object) -> Buffer | None:
    if data is None or type(data) is bytes:
        return data
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)  # a memoryview's len() may count items, not bytes
    raise InvalidRequestError(f"{name} must be bytes or None, got {type(data).__name__}")


class _SealFields(TypedDict):
    """BatchWriter.seal's arguments, checked once by BatchBuilder."""

    base_offset: int
    leader_epoch: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    compression: Compression
    gzip_level: int
    is_control: bool
    is_transactional: bool


class BatchFields(TypedDict, total=False):
    """BatchBuilder's keyword arguments, as build_batch passes them on."""

    base_offset: int
    leader_epoch: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    compression: Compression | int
    is_control: bool
    is_transactional: bool
    max_batch_bytes: int
    gzip_level: int


class BatchBuilder:
    """A BatchWriter with every argument checked, for brokers, tools and tests.

    `append` raises BatchFullError when the record would take the batch past
    `max_batch_bytes` (an upper bound that holds after compression too);
    `has_room_for` asks first. The base offset is normally 0 here and stamped
    by the leader's log with `set_base_offset`.
    """

    __slots__ = ("_writer", "_seal", "_compression", "_max_batch_bytes", "_limit_bytes")

    def __init__(self, *, base_offset: int = 0, leader_epoch: int = -1, producer_id: int = -1,
                 producer_epoch: int = -1, base_sequence: int = -1,
                 compression: Compression | int = Compression.NONE, is_control: bool = False,
                 is_transactional: bool = False, max_batch_bytes: int = BUILDER_BATCH_BYTES_MAX,
                 gzip_level: int = GZIP_LEVEL) -> None:
        checked_base_offset = _check_int("base_offset", base_offset, 0, INT64_MAX)
        checked_leader_epoch = _check_int("leader_epoch", leader_epoch, -1, _INT32_MAX)
        checked_producer_id = _check_int("producer_id", producer_id, -1, INT64_MAX)
        checked_producer_epoch = _check_int("producer_epoch", producer_epoch, -1, _INT16_MAX)
        checked_base_sequence = _check_int("base_sequence", base_sequence, -1, _INT32_MAX)
        if compression not in _KNOWN_CODECS:
            raise InvalidRequestError(f"compression {compression!r} is not supported "
                                      "(use Compression.NONE, GZIP, SNAPPY, LZ4 or ZSTD)")
        self._compression = Compression(compression)
        self._seal = _SealFields(
            base_offset=checked_base_offset, leader_epoch=checked_leader_epoch, producer_id=checked_producer_id,
            producer_epoch=checked_producer_epoch, base_sequence=checked_base_sequence,
            compression=self._compression, gzip_level=_check_int("gzip_level", gzip_level, 1, 9),
            is_control=bool(is_control), is_transactional=bool(is_transactional))
        self._max_batch_bytes = _check_int("max_batch_bytes", max_batch_bytes,
                                           HEADER_SIZE + MIN_RECORD_BYTES, _INT32_MAX)
        # The writer's own limit on its size (header + uncompressed records) that keeps the
        # batch under max_batch_bytes after compression.
        self._limit_bytes = max_batch_bytes
        if self._compression is not Compression.NONE:
            self._limit_bytes = HEADER_SIZE + _records_bytes_max(self._compression, max_batch_bytes)
        self._writer = BatchWriter()

    @property
    def record_count(self) -> int:
        return self._writer.record_count

    @property
    def estimated_size_bytes(self) -> int:
        """Upper bound on the size `build()` would return now."""
        records_bytes = self._writer.size_bytes - HEADER_SIZE
        return HEADER_SIZE + _compressed_bound(self._compression, records_bytes)

    def _checked(self, value: object, key: object, timestamp_ms: object) -> tuple[Buffer | None, Buffer | None, int]:
        if type(timestamp_ms) is not int:
            timestamp_ms = _check_int("timestamp_ms", timestamp_ms, NO_TIMESTAMP, TIMESTAMP_MS_MAX)
        if not NO_TIMESTAMP <= timestamp_ms < TIMESTAMP_MS_MAX:
            raise InvalidRequestError(f"timestamp_ms {timestamp_ms} out of range [-1, {TIMESTAMP_MS_MAX})")
        return _as_bytes("value", value), _as_bytes("key", key), timestamp_ms

    def has_room_for(self, value: Buffer | None, *, key: Buffer | None = None,
                     headers: Sequence[tuple[str, bytes | str | None]] = (), timestamp_ms: int = 0) -> bool:
        value, key, timestamp_ms = self._checked(value, key, timestamp_ms)
        header_bytes = encode_headers(headers) if headers else NO_HEADERS
        writer = self._writer
        return writer.size_bytes + writer.record_size_bytes(value, key, header_bytes, timestamp_ms) <= self._limit_bytes

    def append(self, value: Buffer | None, *, key: Buffer | None = None,
               headers: Sequence[tuple[str, bytes | str | None]] = (), timestamp_ms: int) -> None:
        value, key, timestamp_ms = self._checked(value, key, timestamp_ms)
        header_bytes = encode_headers(headers) if headers else NO_HEADERS
        writer = self._writer
        if not writer.append(value, key, header_bytes, timestamp_ms, self._limit_bytes):
            size = writer.record_size_bytes(value, key, header_bytes, timestamp_ms)
            raise BatchFullError(
                f"record of {size} bytes does not fit: batch holds {writer.record_count} records, "
                f"{self.estimated_size_bytes} bytes, max_batch_bytes={self._max_batch_bytes}; "
                "build this batch and start another (or raise max_batch_bytes)")

    def build(self) -> bytes:
        if self._writer.record_count == 0:
            raise InvalidRequestError("cannot build an empty record batch; append at least one record")
        return bytes(self._writer.seal(**self._seal))


def build_batch(values: Sequence[bytes | None], *, keys: Sequence[bytes | None] | None = None,
                timestamp_ms: int, **header_fields: Unpack[BatchFields]) -> bytes:
    """One batch of `values` (and `keys`, same length) all stamped `timestamp_ms`."""
    if keys is not None and len(keys) != len(values):
        raise InvalidRequestError(f"keys has {len(keys)} items but values has {len(values)}")
    header_fields.setdefault("max_batch_bytes", BATCH_BYTES_MAX)
    builder = BatchBuilder(**header_fields)
    for i, value in enumerate(values):
        builder.append(value, key=None if keys is None else keys[i], timestamp_ms=timestamp_ms)
    return builder.build()


# ------------------------------------------------------------------- decoding


def _gunzip(data: bytes, limit: int, pos: int) -> bytes:
    inflater = zlib.decompressobj(wbits=31)
    try:
        out = inflater.decompress(data, limit + 1)
    except zlib.error as exc:
        raise _corrupt(pos, f"gzip records region does not decompress: {exc}") from None
    if len(out) > limit:
        raise _corrupt(pos, f"records inflate past max_decompressed_bytes={limit}")
    if not inflater.eof:
        raise _corrupt(pos, "gzip records region is truncated")
    if inflater.unused_data:
        raise _corrupt(pos, f"{len(inflater.unused_data)} bytes of trailing garbage after the gzip stream")
    return out


def read_records(buf: Buffer, pos: int = 0, *, max_batch_bytes: int = BATCH_BYTES_MAX,
                 max_decompressed_bytes: int = DECOMPRESSED_BYTES_MAX) -> list[Record]:
    """Validate the batch at `pos`, decompress it and decode every record."""
    header = validate_batch(buf, pos, max_batch_bytes=max_batch_bytes)
    end = pos + header.batch_length + LENGTH_FIELD_END
    data = bytes(memoryview(buf)[pos + HEADER_SIZE:end])
    codec = header.attributes & ATTR_CODEC_MASK
    if codec == Compression.GZIP:
        data = _gunzip(data, max_decompressed_bytes, pos)
    elif codec != Compression.NONE:
        try:
            data = codecs.decompress(codec, data, max_decompressed_bytes)
        except codecs.CodecError as exc:
            raise _corrupt(pos, f"{Compression(codec).name.lower()} records region {exc} "
                                f"(max_decompressed_bytes={max_decompressed_bytes})") from None
    return _decode_records(data, header, pos)


def _decode_records(data: bytes, header: BatchHeader, batch_pos: int) -> list[Record]:
    size = len(data)
    base_offset = header.base_offset
    first_timestamp = header.first_timestamp
    count = header.record_count
    records: list[Record] = []
    p = 0

    def varint(p: int, limit: int, what: str) -> tuple[int, int]:
        result = 0
        shift = 0
        while True:
            if p >= limit:
                raise _corrupt(batch_pos, f"record {i} of {count}: {what} runs past the end of the record")
            b = data[p]
            p += 1
            result |= (b & 0x7F) << shift
            if b < 0x80:
                return (result >> 1) ^ -(result & 1), p
            shift += 7
            if shift >= 7 * _VARINT_BYTES_MAX:
                raise _corrupt(batch_pos, f"record {i} of {count}: {what} varint longer than "
                                          f"{_VARINT_BYTES_MAX} bytes")

    def blob(p: int, limit: int, what: str) -> tuple[bytes | None, int]:
        n, p = varint(p, limit, f"{what} length")
        if n == -1:
            return None, p
        if n < 0 or n > limit - p:
            raise _corrupt(batch_pos, f"record {i} of {count}: {what} length {n} invalid "
                                      f"({limit - p} bytes left in the record)")
        return data[p:p + n], p + n

    for i in range(count):
        length, p = varint(p, size, "length")
        if length < MIN_RECORD_BYTES - 1 or length > size - p:
            raise _corrupt(batch_pos, f"record {i} of {count}: length {length} invalid "
                                      f"({size - p} bytes left in the batch)")
        rec_end = p + length
        p += 1  # record attributes: unused in v2
        timestamp_delta, p = varint(p, rec_end, "timestamp delta")
        offset_delta, p = varint(p, rec_end, "offset delta")
        if offset_delta != i:
            raise _corrupt(batch_pos, f"record {i} of {count}: offset delta {offset_delta}, expected {i}")
        key, p = blob(p, rec_end, "key")
        value, p = blob(p, rec_end, "value")
        header_count, p = varint(p, rec_end, "header count")
        # Each header takes at least two bytes, which bounds the count by the record.
        if header_count < 0 or header_count * 2 > rec_end - p:
            raise _corrupt(batch_pos, f"record {i} of {count}: header count {header_count} invalid "
                                      f"({rec_end - p} bytes left in the record)")
        headers = []
        for _ in range(header_count):
            name, p = blob(p, rec_end, "header name")
            if name is None:
                raise _corrupt(batch_pos, f"record {i} of {count}: header name is null")
            try:
                text = name.decode("utf-8")
            except UnicodeDecodeError:
                raise _corrupt(batch_pos, f"record {i} of {count}: header name is not UTF-8") from None
            header_value, p = blob(p, rec_end, "header value")
            headers.append((text, header_value))
        if p != rec_end:
            raise _corrupt(batch_pos, f"record {i} of {count}: {rec_end - p} unread bytes at the end of the record")
        records.append(Record(base_offset + offset_delta, first_timestamp + timestamp_delta,
                              key, value, tuple(headers)))
    if p != size:
        raise _corrupt(batch_pos, f"{size - p} bytes of trailing garbage after {count} records")
    return records


def first_record_at_or_after(buf: Buffer, timestamp_ms: int, pos: int = 0) -> tuple[int, int] | None:
    """(offset, timestamp) of the batch's first record stamped at or after timestamp_ms, or None.

    A lookup by time names a record, not its batch, as Kafka's does: a batch holds records of
    many times (a producer's linger), and its base offset would hand a consumer records from
    before the time it asked for. A control batch (a leader's epoch-start batch, stamped
    with the broker's clock when it was elected) holds no record a consumer sees: None, or
    every lookup of a time before the election would land on it."""
    if read_header(buf, pos).is_control:
        return None
    for record in read_records(buf, pos):
        if record.timestamp_ms >= timestamp_ms:
            return record.offset, record.timestamp_ms
    return None
