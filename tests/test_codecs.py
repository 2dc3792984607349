"""Record batches compressed by Kafka clients, decoded by Biplane (common/codecs.py through
common/batch.py), and Biplane's own compressed batches read back.

The fixtures (tests/fixtures/kafka_batches/*.bin, written by make.py there) are batches
librdkafka (gzip, snappy, zstd) and kafka-python (lz4) produced to a Biplane broker, saved
as the broker stored them: the leader's control batch at its epoch start, then the
client's batches."""
from __future__ import annotations

from pathlib import Path

import cramjam
import pytest
from crc32c import crc32c

from common import codecs
from common.batch import (
    HEADER_SIZE,
    BatchBuilder,
    Compression,
    CorruptBatchError,
    iter_batches,
    read_records,
)

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "kafka_batches"
TIMESTAMP_MS = 1_700_000_000_000
# What make.py produced, in order.
RECORDS = [(f"key-{i}".encode() if i % 4 else None, f"value {i} ".encode() * (20 + i)) for i in range(10)]


@pytest.mark.parametrize("codec", [Compression.GZIP, Compression.SNAPPY, Compression.LZ4, Compression.ZSTD])
def test_a_kafka_clients_compressed_batches_decode_to_what_it_sent(codec):
    raw = (FIXTURES / f"{codec.name.lower()}.bin").read_bytes()
    data = [(h, read_records(raw, pos)) for pos, h in iter_batches(raw) if not h.is_control]
    assert data and all(h.compression is codec for h, _ in data), [h.compression for h, _ in data]
    records = [r for _, batch in data for r in batch]
    assert [(r.key, r.value) for r in records] == RECORDS
    assert all(r.timestamp_ms == TIMESTAMP_MS for r in records)
    assert [r.headers for r in records if r.key is None] == [(("h", b"x"),)] * 3
    assert [r.offset for r in records] == list(range(records[0].offset, records[0].offset + 10))


def test_librdkafkas_snappy_is_a_raw_block_and_the_java_framing_reads_too():
    raw = (FIXTURES / "snappy.bin").read_bytes()
    pos, header = next((p, h) for p, h in iter_batches(raw) if not h.is_control)
    assert not raw[pos + HEADER_SIZE:].startswith(codecs.XERIAL_MAGIC)
    plain = b"records region " * 5000
    framed = codecs.compress(codecs.SNAPPY, plain)
    assert framed.startswith(codecs.XERIAL_MAGIC) and len(framed) < len(plain)
    assert codecs.decompress(codecs.SNAPPY, framed, len(plain)) == plain
    assert codecs.decompress(codecs.SNAPPY, bytes(cramjam.snappy.compress_raw(plain)), len(plain)) == plain


@pytest.mark.parametrize("codec", [Compression.SNAPPY, Compression.LZ4, Compression.ZSTD])
def test_biplanes_batches_round_trip_and_shrink(codec):
    values = [b"a compressible value " * 40] * 50
    plain, packed = BatchBuilder(), BatchBuilder(compression=codec)
    for i, v in enumerate(values):
        plain.append(v, key=b"k%d" % i, timestamp_ms=i)
        packed.append(v, key=b"k%d" % i, timestamp_ms=i)
    small = packed.build()
    assert len(small) < len(plain.build()) // 10
    assert [r.value for r in read_records(small)] == values


@pytest.mark.parametrize("codec", [codecs.SNAPPY, codecs.LZ4, codecs.ZSTD])
def test_a_region_inflating_past_the_limit_is_refused(codec):
    packed = codecs.compress(codec, b"\0" * 100_000)
    with pytest.raises(codecs.CodecError, match="past"):
        codecs.decompress(codec, packed, 10_000)


def test_a_batch_that_does_not_decompress_names_codec_and_position():
    builder = BatchBuilder(compression=Compression.ZSTD)
    builder.append(b"x" * 100, timestamp_ms=0)
    raw = bytearray(builder.build())
    raw[HEADER_SIZE:HEADER_SIZE + 4] = b"\0\0\0\0"   # not a zstd frame any more; re-stamp the CRC
    raw[17:21] = crc32c(bytes(raw[21:])).to_bytes(4, "big")
    with pytest.raises(CorruptBatchError, match="zstd records region does not decompress"):
        read_records(bytes(raw))


def test_a_snappy_frame_with_a_block_past_its_end_is_refused():
    framed = bytearray(codecs.compress(codecs.SNAPPY, b"abc" * 100))
    framed[16:20] = (10_000).to_bytes(4, "big")
    with pytest.raises(codecs.CodecError, match="claims 10000 bytes"):
        codecs.decompress(codecs.SNAPPY, bytes(framed), 1 << 20)
