"""Record batches: encoding (the builder and the producer's writer), validation, patching and
hostile input."""
from __future__ import annotations

import random
import struct
import zlib

import pytest
from crc32c import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.batch import (
    HEADER_SIZE,
    MAGIC,
    NO_HEADERS,
    BatchBuilder,
    BatchFullError,
    BatchHeader,
    BatchWriter,
    Compression,
    Record,
    RecordHeaderError,
    build_batch,
    encode_headers,
    iter_batches,
    read_header,
    read_records,
    scan_valid_prefix,
    set_base_offset,
    set_leader_epoch,
    validate_batch,
    varint,
    zigzag_varint,
)
from common.errors import CorruptBatchError, InvalidRequestError

FUZZ = settings(max_examples=300, deadline=2000, suppress_health_check=[HealthCheck.too_slow])

header_names = st.text(max_size=8)
opt_bytes = st.one_of(st.none(), st.binary(max_size=64))
record_st = st.tuples(
    opt_bytes,  # value
    opt_bytes,  # key
    st.lists(st.tuples(header_names, opt_bytes), max_size=3),
    st.integers(min_value=0, max_value=1 << 45),  # timestamp
)


def make_batch(records, **fields) -> bytes:
    builder = BatchBuilder(**fields)
    for value, key, headers, ts in records:
        builder.append(value, key=key, headers=headers, timestamp_ms=ts)
    return builder.build()


def expected_records(records, base_offset=0):
    return [Record(offset=base_offset + i, timestamp_ms=ts, key=key, value=value, headers=tuple(headers))
            for i, (value, key, headers, ts) in enumerate(records)]


@st.composite
def batches(draw):
    records = draw(st.lists(record_st, min_size=1, max_size=8))
    compression = draw(st.sampled_from(list(Compression)))
    base_offset = draw(st.integers(min_value=0, max_value=1 << 40))
    return records, compression, base_offset, make_batch(records, compression=compression, base_offset=base_offset)


# --------------------------------------------------------------- round trips


@pytest.mark.parametrize("compression", list(Compression))
def test_round_trip_every_codec(compression):
    """Values, keys, nulls and headers come back exactly, at contiguous offsets."""
    records = [
        (b"v0", b"k0", [("trace", b"abc"), ("empty", b""), ("null", None)], 1_700_000_000_000),
        (None, None, [], 1_700_000_000_005),
        (b"", b"", [], 1_699_999_999_999),  # timestamps need not be monotonic
        (b"x" * 5000, None, [("\u00e9t\u00e9", b"\x00\xff")], 1_700_000_000_001),
    ]
    raw = make_batch(records, compression=compression, base_offset=42, leader_epoch=3,
                     producer_id=9, producer_epoch=2, base_sequence=17)
    header = validate_batch(raw)
    assert header.base_offset == 42 and header.leader_epoch == 3
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (9, 2, 17)
    assert header.record_count == 4 and header.last_offset == 45 and header.next_offset == 46
    assert header.first_timestamp == 1_700_000_000_000 and header.max_timestamp == 1_700_000_000_005
    assert header.compression is compression and not header.is_control
    assert header.size_bytes == len(raw) and header.magic == MAGIC
    assert read_records(raw) == expected_records(records, base_offset=42)


def test_gzip_shrinks_compressible_records():
    values = [b"a" * 1000] * 50
    plain = build_batch(values, timestamp_ms=1)
    packed = build_batch(values, timestamp_ms=1, compression=Compression.GZIP)
    assert len(packed) < len(plain) // 10
    assert [r.value for r in read_records(packed)] == values


def test_many_records_and_build_batch_keys():
    values = [str(i).encode() for i in range(20_000)]
    keys = [None if i % 3 else b"k%d" % i for i in range(20_000)]
    raw = build_batch(values, keys=keys, timestamp_ms=5, base_offset=1000)
    got = read_records(raw)
    assert [r.value for r in got] == values and [r.key for r in got] == keys
    assert got[-1].offset == 1000 + 19_999


def test_control_and_transactional_flags():
    raw = make_batch([(b"x", None, [], 1)], is_control=True, is_transactional=True)
    header = validate_batch(raw)
    assert header.is_control and header.is_transactional


@given(batches())
@settings(max_examples=200, deadline=2000)
def test_build_read_identity(case):
    """Property: whatever is appended is what read_records returns."""
    records, compression, base_offset, raw = case
    assert read_records(raw) == expected_records(records, base_offset)
    assert validate_batch(raw).compression is compression


def test_estimated_size_is_an_upper_bound():
    """Seed 7: for random record sizes, the built batch never exceeds estimated_size_bytes."""
    for compression in Compression:
        builder = BatchBuilder(compression=compression)
        rng = random.Random(7)
        for i in range(40):
            builder.append(rng.randbytes(rng.randrange(0, 300)), key=b"k", timestamp_ms=i)
        assert len(builder.build()) <= builder.estimated_size_bytes


@pytest.mark.parametrize("compression", list(Compression))
def test_builder_enforces_max_batch_bytes(compression):
    """Seed 1: a batch never exceeds max_batch_bytes, even with incompressible data under gzip,
    and has_room_for agrees with append."""
    rng = random.Random(1)
    builder = BatchBuilder(max_batch_bytes=4096, compression=compression)
    appended = 0
    with pytest.raises(BatchFullError):
        while True:
            value = rng.randbytes(300)
            fits = builder.has_room_for(value, timestamp_ms=0)
            builder.append(value, timestamp_ms=0)
            assert fits
            appended += 1
    assert not builder.has_room_for(rng.randbytes(300), timestamp_ms=0)
    raw = builder.build()
    assert len(raw) <= 4096 and validate_batch(raw).record_count == appended


@pytest.mark.parametrize("kwargs, word", [
    ({"base_offset": -1}, "base_offset"),
    ({"leader_epoch": 1 << 31}, "leader_epoch"),
    ({"producer_epoch": 1 << 15}, "producer_epoch"),
    ({"compression": 5}, "compression"),
    ({"max_batch_bytes": 10}, "max_batch_bytes"),
    ({"gzip_level": 0}, "gzip_level"),
])
def test_builder_rejects_bad_header_fields(kwargs, word):
    with pytest.raises(InvalidRequestError, match=word):
        BatchBuilder(**kwargs)


def test_builder_rejects_bad_records():
    builder = BatchBuilder()
    with pytest.raises(InvalidRequestError, match="value"):
        builder.append("text", timestamp_ms=0)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError, match="timestamp_ms"):
        builder.append(b"x", timestamp_ms=-5)
    with pytest.raises(InvalidRequestError, match="header"):
        builder.append(b"x", headers=[(b"name", b"v")], timestamp_ms=0)  # type: ignore[list-item]
    with pytest.raises(InvalidRequestError, match="empty"):
        builder.build()


def test_append_snapshots_mutable_values():
    value = bytearray(b"before")
    builder = BatchBuilder()
    builder.append(value, timestamp_ms=0)
    value[:] = b"after!"
    assert read_records(builder.build())[0].value == b"before"


# ------------------------------------------------------------- the writer


def reference_varint(n: int) -> bytes:
    """Zigzag varint written out the plain way, independently of common.batch's table."""
    z = 2 * n if n >= 0 else -2 * n - 1
    out = b""
    while True:
        low, z = z & 0x7F, z >> 7
        if not z:
            return out + bytes([low])
        out += bytes([low | 0x80])


def reference_batch(items, *, producer_id: int, producer_epoch: int, base_sequence: int) -> bytes:
    """The uncompressed v2 layout field by field (what BatchBuilder built before it wrote through
    BatchWriter): the oracle for the encoder's bytes."""
    def blob(data):
        return reference_varint(-1) if data is None else reference_varint(len(data)) + bytes(data)

    first = items[0][3]
    records = b""
    for i, (value, key, headers, ts) in enumerate(items):
        body = (b"\x00" + reference_varint(ts - first) + reference_varint(i) + blob(key) + blob(value)
                + reference_varint(len(headers))
                + b"".join(blob(name.encode()) + blob(v.encode() if isinstance(v, str) else v) for name, v in headers))
        records += reference_varint(len(body)) + body
    tail = struct.pack(">hiqqqhii", 0, len(items) - 1, first, max(ts for *_, ts in items), producer_id,
                       producer_epoch, base_sequence, len(items))
    head = struct.pack(">qiibI", 0, HEADER_SIZE - 12 + len(records), -1, MAGIC, crc32c(tail + records))
    return head + tail + records


# Lengths past 16,383 leave the varint table for the loop; such values need no random bytes.
writer_blobs = st.one_of(st.none(), st.binary(max_size=300),
                         st.integers(min_value=16_380, max_value=16_400).map(lambda n: b"z" * n))
writer_headers = st.lists(st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=20))), max_size=3)
writer_records = st.lists(st.tuples(writer_blobs, writer_blobs, writer_headers,
                                    st.integers(min_value=-1, max_value=(1 << 62) - 1)), min_size=1, max_size=40)


def write(items, **seal) -> bytes:
    writer = BatchWriter()
    for value, key, headers, ts in items:
        assert writer.append(value, key, encode_headers(headers) if headers else NO_HEADERS, ts) > 0
    return bytes(writer.seal(**seal))


@settings(max_examples=60, deadline=None)
@given(items=writer_records, compression=st.sampled_from(list(Compression)), producer_id=st.integers(-1, 1 << 40),
       producer_epoch=st.integers(-1, 32767), base_sequence=st.integers(-1, (1 << 31) - 1))
def test_written_batches_decode_to_the_same_records(items, compression, producer_id, producer_epoch,
                                                    base_sequence):
    """Whatever records go in (null or empty keys and values, values past the varint table,
    headers, timestamps in any order), the reader validates the batch and reads them back."""
    blob = write(items, producer_id=producer_id, producer_epoch=producer_epoch,
                 base_sequence=base_sequence, compression=compression)
    header = validate_batch(blob)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (producer_id, producer_epoch,
                                                                                 base_sequence)
    assert header.record_count == len(items) and header.compression is compression
    assert header.max_timestamp == max(ts for *_, ts in items)
    got = read_records(blob)
    assert [(r.value, r.key, list(r.headers), r.timestamp_ms, r.offset) for r in got] == [
        (value, key, list(headers), ts, i) for i, (value, key, headers, ts) in enumerate(items)]


@settings(max_examples=40, deadline=None)
@given(items=writer_records, producer_id=st.integers(-1, 1 << 40), base_sequence=st.integers(-1, 1000))
def test_uncompressed_bytes_equal_the_reference_layout(items, producer_id, base_sequence):
    """Without compression the writer (the producer's path) and BatchBuilder (the checked path)
    both give, byte for byte, the layout written out field by field."""
    producer_epoch = 0 if producer_id >= 0 else -1
    expected = reference_batch(items, producer_id=producer_id, producer_epoch=producer_epoch,
                               base_sequence=base_sequence)
    assert write(items, producer_id=producer_id, producer_epoch=producer_epoch,
                 base_sequence=base_sequence) == expected
    builder = BatchBuilder(producer_id=producer_id, producer_epoch=producer_epoch,
                           base_sequence=base_sequence, max_batch_bytes=1 << 24)
    for value, key, headers, ts in items:
        builder.append(value, key=key, headers=headers, timestamp_ms=ts)
    assert builder.build() == expected


@given(n=st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1))
def test_varint_table_and_loop_agree(n):
    assert varint(n) == zigzag_varint(n) == reference_varint(n)
    assert len(zigzag_varint(n)) <= 10


def test_a_record_past_the_limit_is_refused_without_changing_the_batch():
    writer = BatchWriter()
    assert writer.append(b"x" * 500, None, NO_HEADERS, 5, 200) == 0   # refused even as the first record
    assert writer.append(b"x" * 500, None, NO_HEADERS, 5) > 0         # without a limit it always goes in
    before = bytes(writer.buffer)
    size = writer.record_size_bytes(b"y", None, NO_HEADERS, 6)
    assert writer.append(b"y", None, NO_HEADERS, 6, len(before) + size - 1) == 0
    assert bytes(writer.buffer) == before and writer.record_count == 1
    assert writer.append(b"y", None, NO_HEADERS, 6, len(before) + size) == size
    assert [r.value for r in read_records(bytes(writer.seal()))] == [b"x" * 500, b"y"]


@settings(max_examples=60, deadline=None)
@given(items=writer_records)
def test_record_size_is_what_append_takes(items):
    """record_size_bytes (what BatchBuilder checks its limit with) matches append exactly."""
    writer = BatchWriter()
    for value, key, headers, ts in items:
        header_bytes = encode_headers(headers) if headers else NO_HEADERS
        predicted = writer.record_size_bytes(value, key, header_bytes, ts)
        before = writer.size_bytes
        assert writer.append(value, key, header_bytes, ts) == predicted == writer.size_bytes - before


def test_resealing_rewrites_only_the_header():
    """A new producer epoch re-stamps a queued batch; its records stay as they were."""
    writer = BatchWriter()
    for i in range(3):
        writer.append(b"v%d" % i, b"k", NO_HEADERS, 100 + i)
    first = bytes(writer.seal(producer_id=7, producer_epoch=0, base_sequence=30))
    second = bytes(writer.seal(producer_id=7, producer_epoch=1, base_sequence=0))
    assert first[HEADER_SIZE:] == second[HEADER_SIZE:]
    h = read_header(second)
    assert (h.producer_epoch, h.base_sequence) == (1, 0)
    validate_batch(second)


def test_bad_headers_are_type_errors_for_the_producer_and_invalid_requests_for_the_broker():
    for bad, word in (([(b"name", b"v")], "header name must be str"), ([("name", 5)], "must be bytes, str or None"),
                      (["oops"], "pair")):
        with pytest.raises(RecordHeaderError, match=word) as caught:
            encode_headers(bad)
        assert isinstance(caught.value, TypeError) and isinstance(caught.value, InvalidRequestError)
    with pytest.raises(ValueError, match="empty batch"):
        BatchWriter().seal()


@pytest.mark.parametrize("max_batch_bytes", [92, 93, 4096, 16_384, 1 << 20])
def test_gzip_limit_is_the_bound_of_the_uncompressed_records(max_batch_bytes):
    """Seed 3: a gzip builder takes a record exactly while the gzip bound of the records
    uncompressed (61 + deflate bound + gzip framing) stays within max_batch_bytes."""
    rng = random.Random(3)
    packed = BatchBuilder(max_batch_bytes=max_batch_bytes, compression=Compression.GZIP)
    plain = BatchBuilder(max_batch_bytes=1 << 24)
    for i in range(400):
        value = rng.randbytes(rng.randrange(0, 40 + max_batch_bytes // 8))
        plain.append(value, timestamp_ms=i)
        records_bytes = len(plain.build()) - HEADER_SIZE
        fits = HEADER_SIZE + records_bytes + (records_bytes >> 12) + (records_bytes >> 14) + (records_bytes >> 25) \
            + 31 <= max_batch_bytes
        assert packed.has_room_for(value, timestamp_ms=i) is fits, f"seed=3 record {i}"
        if not fits:
            with pytest.raises(BatchFullError):
                packed.append(value, timestamp_ms=i)
            break
        packed.append(value, timestamp_ms=i)
    else:
        pytest.fail("the batch never filled up")


# ----------------------------------------------------------- header checks


def good_batch(**fields) -> bytes:
    return make_batch([(b"value-%d" % i, None, [], 10 + i) for i in range(3)], **fields)


def patched(raw: bytes, fmt: str, offset: int, value: int, fix_crc: bool = True) -> bytearray:
    buf = bytearray(raw)
    struct.pack_into(fmt, buf, offset, value)
    if fix_crc:
        struct.pack_into(">I", buf, 17, crc32c(bytes(buf[21:])))
    return buf


@pytest.mark.parametrize("fmt, offset, value, message", [
    (">b", 16, 1, "magic 1 is not 2"),
    (">i", 8, 10, r"batch_length 10 out of range \[49,"),
    (">i", 8, 1 << 30, "batch_length .* out of range"),
    (">i", 57, 5, "record_count 5 and last_offset_delta 2"),
    (">i", 23, 7, "record_count 3 and last_offset_delta 7"),
    (">q", 0, -3, "base_offset -3"),
    (">h", 21, 5, "codec 5"),
])
def test_read_header_names_the_problem(fmt, offset, value, message):
    with pytest.raises(CorruptBatchError, match=message):
        read_header(patched(good_batch(), fmt, offset, value))


def test_truncated_header_says_how_much():
    with pytest.raises(CorruptBatchError, match="need 61 bytes, have 20"):
        read_header(good_batch()[:20])


def test_crc_mismatch_message_has_both_values():
    buf = bytearray(good_batch())
    buf[-1] ^= 0x01
    with pytest.raises(CorruptBatchError, match=r"CRC32C mismatch: header says 0x[0-9a-f]{8}, records give 0x"):
        validate_batch(buf)


@given(st.data())
@settings(max_examples=300, deadline=2000)
def test_any_single_byte_flip_in_crc_region_is_detected(data):
    """Property: changing any one byte from attributes to the end fails validation."""
    raw = bytearray(data.draw(batches())[3])
    index = data.draw(st.integers(min_value=21, max_value=len(raw) - 1))
    raw[index] ^= data.draw(st.integers(min_value=1, max_value=255))
    with pytest.raises(CorruptBatchError):
        validate_batch(raw)


@given(st.data())
@settings(max_examples=200, deadline=2000)
def test_any_truncation_raises(data):
    """Property: every strict prefix of a batch is rejected by every reader."""
    raw = data.draw(batches())[3]
    cut = data.draw(st.integers(min_value=0, max_value=len(raw) - 1))
    prefix = raw[:cut]
    for reader in (validate_batch, read_records):
        with pytest.raises(CorruptBatchError):
            reader(prefix)
    if prefix:  # an empty buffer is an empty sequence of batches
        with pytest.raises(CorruptBatchError):
            list(iter_batches(prefix, validate=False))
    assert scan_valid_prefix(prefix) == (0, [])


# -------------------------------------------------------------------- patching


@pytest.mark.parametrize("compression", list(Compression))
def test_patching_keeps_crc_and_records(compression):
    raw = good_batch(compression=compression, leader_epoch=1)
    before = read_records(raw)
    buf = bytearray(raw)
    set_base_offset(buf, 1_000_000)
    set_leader_epoch(buf, 12)
    header = validate_batch(buf)
    assert header.base_offset == 1_000_000 and header.leader_epoch == 12 and header.crc == read_header(raw).crc
    after = read_records(buf)
    assert [(r.offset - 1_000_000, r.value, r.timestamp_ms) for r in after] == \
           [(r.offset, r.value, r.timestamp_ms) for r in before]


def test_patching_at_position_inside_a_memoryview():
    a, b = good_batch(), good_batch(base_offset=3)
    buf = bytearray(a + b)
    view = memoryview(buf)
    set_base_offset(view, 77, pos=len(a))
    set_leader_epoch(view, 5, pos=len(a))
    view.release()
    headers = [h for _, h in iter_batches(buf)]
    assert [(h.base_offset, h.leader_epoch) for h in headers] == [(0, -1), (77, 5)]


def test_patching_rejects_readonly_and_non_batches():
    with pytest.raises(TypeError):
        set_base_offset(good_batch(), 1)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        set_leader_epoch(memoryview(good_batch()), 1)
    with pytest.raises(CorruptBatchError, match="magic"):
        set_base_offset(bytearray(100), 1)
    with pytest.raises(InvalidRequestError, match="leader_epoch"):
        set_leader_epoch(bytearray(good_batch()), -2)
    with pytest.raises(InvalidRequestError, match="base_offset"):
        set_base_offset(bytearray(good_batch()), -1)


# ------------------------------------------------------- iteration and recovery


def test_iter_batches_positions_and_bad_batch_position():
    parts = [good_batch(base_offset=i * 3) for i in range(4)]
    joined = b"".join(parts)
    positions = [sum(len(p) for p in parts[:i]) for i in range(4)]
    for buf in (joined, bytearray(joined), memoryview(joined)):
        got = list(iter_batches(buf))
        assert [pos for pos, _ in got] == positions
        assert [h.base_offset for _, h in got] == [0, 3, 6, 9]
    broken = bytearray(joined)
    broken[positions[2] + 40] ^= 0xFF
    with pytest.raises(CorruptBatchError, match=f"at byte {positions[2]}:"):
        list(iter_batches(broken))
    assert len(list(iter_batches(broken, validate=False))) == 4  # CRC skipped on request


def test_scan_valid_prefix_finds_torn_tail():
    parts = [good_batch(base_offset=i * 3) for i in range(3)]
    whole = b"".join(parts)
    for cut in range(len(parts[2])):
        torn = whole[:len(parts[0]) + len(parts[1]) + cut]
        length, headers = scan_valid_prefix(torn)
        assert length == len(parts[0]) + len(parts[1])
        assert [h.base_offset for h in headers] == [0, 3]
    assert scan_valid_prefix(whole)[0] == len(whole)
    garbage_tail = whole + b"\x00" * 100
    assert scan_valid_prefix(garbage_tail)[0] == len(whole)
    assert scan_valid_prefix(b"")[0] == 0


# ------------------------------------------------------------------------ fuzz


def all_readers(buf):
    read_header(buf)
    validate_batch(buf)
    read_records(buf)
    list(iter_batches(buf))
    list(iter_batches(buf, validate=False))


def assert_only_corrupt(buf):
    try:
        all_readers(buf)
    except CorruptBatchError:
        pass
    length, headers = scan_valid_prefix(buf)
    assert 0 <= length <= len(buf)


@given(st.binary(max_size=300))
@FUZZ
def test_random_bytes_only_raise_corrupt(buf):
    """Any byte string makes readers return or raise CorruptBatchError, nothing else."""
    assert_only_corrupt(buf)


@given(st.binary(min_size=HEADER_SIZE, max_size=300))
@FUZZ
def test_random_bodies_behind_a_plausible_header(body):
    """A valid-looking header with the right CRC over random records still only raises CorruptBatchError."""
    buf = bytearray(body)
    count = 1 + buf[60] % 4
    struct.pack_into(">qiibIhi", buf, 0, 0, len(buf) - 12, 0, MAGIC, 0, buf[21] & 1, count - 1)
    struct.pack_into(">i", buf, 57, count)
    struct.pack_into(">I", buf, 17, crc32c(bytes(buf[21:])))
    assert_only_corrupt(buf)


@given(st.data())
@FUZZ
def test_mutated_valid_batches_only_raise_corrupt(data):
    """Valid batches with random byte edits, re-CRC'd so decoding is reached, only raise CorruptBatchError."""
    raw = bytearray(data.draw(batches())[3])
    for _ in range(data.draw(st.integers(min_value=1, max_value=4))):
        index = data.draw(st.integers(min_value=0, max_value=len(raw) - 1))
        raw[index] = data.draw(st.integers(min_value=0, max_value=255))
    if data.draw(st.booleans()) and len(raw) >= HEADER_SIZE:
        struct.pack_into(">I", raw, 17, crc32c(bytes(raw[21:])))
    assert_only_corrupt(raw)


def gzip_batch_with_blob(blob: bytes, count: int = 1) -> bytearray:
    buf = bytearray(HEADER_SIZE) + blob
    struct.pack_into(">qiibIhiqqqhii", buf, 0, 0, len(buf) - 12, 0, MAGIC, 0, 1, count - 1, 0, 0, -1, -1, -1, count)
    struct.pack_into(">I", buf, 17, crc32c(bytes(buf[21:])))
    return buf


def test_decompression_bomb_is_capped():
    bomb = zlib.compress(b"\x00" * (8 << 20), 9, wbits=31)
    buf = gzip_batch_with_blob(bomb)
    assert len(buf) < 64 << 10
    with pytest.raises(CorruptBatchError, match="max_decompressed_bytes=1048576"):
        read_records(buf, max_decompressed_bytes=1 << 20)


def test_gzip_trailing_garbage_and_truncation():
    records = build_batch([b"abc"], timestamp_ms=0)[HEADER_SIZE:]
    stream = zlib.compress(records, 6, wbits=31)
    assert read_records(gzip_batch_with_blob(stream))[0].value == b"abc"
    with pytest.raises(CorruptBatchError, match="trailing garbage"):
        read_records(gzip_batch_with_blob(stream + b"junk"))
    with pytest.raises(CorruptBatchError, match="truncated"):
        read_records(gzip_batch_with_blob(stream[:-6]))


def raw_records_batch(records_region: bytes, count: int) -> bytearray:
    buf = bytearray(HEADER_SIZE) + records_region
    struct.pack_into(">qiibIhiqqqhii", buf, 0, 0, len(buf) - 12, 0, MAGIC, 0, 0, count - 1, 0, 0, -1, -1, -1, count)
    struct.pack_into(">I", buf, 17, crc32c(bytes(buf[21:])))
    return buf


def test_overlong_varint_negative_length_and_count_mismatch():
    one = build_batch([b"abc"], timestamp_ms=0)[HEADER_SIZE:]
    # length varint of 11 continuation bytes
    with pytest.raises(CorruptBatchError, match="longer than 10 bytes"):
        read_records(raw_records_batch(b"\x80" * 11 + b"\x01" + b"\x00" * 8, 1))
    # key length -2 (zigzag 3): attributes, ts delta, offset delta, key len
    body = b"\x00\x00\x00\x03" + b"\x00\x00\x00"
    with pytest.raises(CorruptBatchError, match="key length -2"):
        read_records(raw_records_batch(bytes([len(body) * 2]) + body, 1))
    # header says 2 records, region holds 1
    with pytest.raises(CorruptBatchError, match="record 1 of 2"):
        read_records(raw_records_batch(one + b"\x00" * 6, 2))
    with pytest.raises(CorruptBatchError, match="trailing garbage"):
        read_records(raw_records_batch(one + b"\x00" * 7, 1))
