"""The producer's own batch encoder (dataplane/client/encoder.py) against common/batch.py's
reader and builder, and the batch-resolved record futures (dataplane/client/futures.py)."""
from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.batch import BatchBuilder, Compression, read_header, read_records, validate_batch
from dataplane.client.encoder import HEADER_SIZE, BatchWriter, encode_headers, varint, zigzag_varint
from dataplane.client.futures import BatchOutcome, RecordFuture
from dataplane.client.records import RecordMetadata, TopicPartition

# Lengths past 16,383 leave the varint table for the loop; such values need no random bytes.
blobs = st.one_of(st.none(), st.binary(max_size=300),
                  st.integers(min_value=16_380, max_value=16_400).map(lambda n: b"z" * n))
header_lists = st.lists(st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=20))), max_size=3)
timestamps = st.integers(min_value=-1, max_value=(1 << 62) - 1)
records = st.lists(st.tuples(blobs, blobs, header_lists, timestamps), min_size=1, max_size=40)


def write(items, **seal) -> bytes:
    writer = BatchWriter()
    for value, key, headers, ts in items:
        assert writer.append(value, key, encode_headers(headers) if headers else b"\x00", ts) > 0
    return bytes(writer.seal(**seal))


@settings(max_examples=60, deadline=None)
@given(items=records, gzip=st.booleans(), producer_id=st.integers(-1, 1 << 40),
       producer_epoch=st.integers(-1, 32767), base_sequence=st.integers(-1, (1 << 31) - 1))
def test_written_batches_decode_to_the_same_records(items, gzip, producer_id, producer_epoch, base_sequence):
    """Whatever records go in (null or empty keys and values, values past the varint table,
    headers, timestamps in any order), common/batch.py validates the batch and reads them back."""
    blob = write(items, producer_id=producer_id, producer_epoch=producer_epoch,
                 base_sequence=base_sequence, gzip=gzip)
    header = validate_batch(blob)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (producer_id, producer_epoch,
                                                                                 base_sequence)
    assert header.record_count == len(items)
    assert header.compression == (Compression.GZIP if gzip else Compression.NONE)
    assert header.max_timestamp == max(ts for *_, ts in items)
    got = read_records(blob)
    assert [(r.value, r.key, list(r.headers), r.timestamp_ms, r.offset) for r in got] == [
        (value, key, list(headers), ts, i) for i, (value, key, headers, ts) in enumerate(items)]


@settings(max_examples=40, deadline=None)
@given(items=records, producer_id=st.integers(-1, 1 << 40), base_sequence=st.integers(-1, 1000))
def test_uncompressed_bytes_equal_the_shared_builders(items, producer_id, base_sequence):
    """Without compression the writer's batch is byte for byte what common.batch.BatchBuilder builds."""
    blob = write(items, producer_id=producer_id, producer_epoch=0 if producer_id >= 0 else -1,
                 base_sequence=base_sequence)
    builder = BatchBuilder(producer_id=producer_id, producer_epoch=0 if producer_id >= 0 else -1,
                           base_sequence=base_sequence, max_batch_bytes=1 << 24)
    for value, key, headers, ts in items:
        builder.append(value, key=key, headers=headers, timestamp_ms=ts)
    assert blob == builder.build()


@given(n=st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1))
def test_varint_table_and_loop_agree(n):
    assert varint(n) == zigzag_varint(n)
    assert len(zigzag_varint(n)) <= 10


def test_a_record_past_the_limit_is_refused_without_changing_the_batch():
    writer = BatchWriter()
    assert writer.append(b"x" * 500, None, b"\x00", 5, 200) > 0   # the first record always goes in
    before = bytes(writer.buffer)
    assert writer.append(b"y", None, b"\x00", 6, len(before) + 3) == 0
    assert bytes(writer.buffer) == before and writer.record_count == 1
    assert writer.append(b"y", None, b"\x00", 6, len(before) + 64) > 0
    assert [r.value for r in read_records(bytes(writer.seal(producer_id=-1, producer_epoch=-1,
                                                            base_sequence=-1)))] == [b"x" * 500, b"y"]


def test_resealing_rewrites_only_the_header():
    """A new producer epoch re-stamps a queued batch; its records stay as they were."""
    writer = BatchWriter()
    for i in range(3):
        writer.append(b"v%d" % i, b"k", b"\x00", 100 + i)
    first = bytes(writer.seal(producer_id=7, producer_epoch=0, base_sequence=30))
    second = bytes(writer.seal(producer_id=7, producer_epoch=1, base_sequence=0))
    assert first[HEADER_SIZE:] == second[HEADER_SIZE:]
    h = read_header(second)
    assert (h.producer_epoch, h.base_sequence) == (1, 0)
    validate_batch(second)


def test_bad_headers_and_empty_batches_are_refused_clearly():
    with pytest.raises(TypeError, match="header name must be str"):
        encode_headers([(b"name", b"v")])
    with pytest.raises(TypeError, match="must be bytes, str or None"):
        encode_headers([("name", 5)])
    with pytest.raises(TypeError, match="pair"):
        encode_headers(["oops"])
    with pytest.raises(ValueError, match="empty batch"):
        BatchWriter().seal(producer_id=-1, producer_epoch=-1, base_sequence=-1)


# ------------------------------------------------------------------ record futures

TP = TopicPartition("t", 2)


def test_record_futures_resolve_with_their_offset_through_await_gather_and_callbacks():
    async def main():
        loop = asyncio.get_running_loop()
        outcome = BatchOutcome(TP, loop)
        futures = [RecordFuture(outcome, i) for i in range(3)]
        assert asyncio.isfuture(futures[0]) and not futures[0].done()
        seen = []
        futures[1].add_done_callback(lambda f: seen.append(f.result()))
        gathered = asyncio.gather(*futures)
        waiter = asyncio.ensure_future(futures[2])
        await asyncio.sleep(0)
        outcome.resolve(40)
        assert await gathered == [RecordMetadata("t", 2, 40), RecordMetadata("t", 2, 41), RecordMetadata("t", 2, 42)]
        assert await waiter == RecordMetadata("t", 2, 42)
        assert seen == [RecordMetadata("t", 2, 41)]
        late = []
        futures[0].add_done_callback(late.append)   # already done: still called, on the loop
        await asyncio.sleep(0)
        assert late == [futures[0]]
    asyncio.run(main())


def test_a_failed_batch_fails_every_record_future():
    async def main():
        outcome = BatchOutcome(TP, asyncio.get_running_loop())
        futures = [RecordFuture(outcome, i) for i in range(2)]
        outcome.fail(ValueError("boom"))
        assert all(isinstance(f.exception(), ValueError) for f in futures)
        with pytest.raises(ValueError, match="boom"):
            await futures[1]
        results = await asyncio.gather(*futures, return_exceptions=True)
        assert [type(r) for r in results] == [ValueError, ValueError]
        depths = []
        for f in futures * 3:
            try:
                f.result()
            except ValueError as exc:
                tb, depth = exc.__traceback__, 0
                while tb is not None:
                    tb, depth = tb.tb_next, depth + 1
                depths.append(depth)
        assert len(set(depths)) == 1   # raising it again and again does not grow its traceback
    asyncio.run(main())


def test_a_timed_out_wait_cancels_only_that_callers_future():
    """wait_for's timeout cancels the one record future it waited on; the others of the
    same batch still resolve (the record itself is still sent)."""
    async def main():
        loop = asyncio.get_running_loop()
        outcome = BatchOutcome(TP, loop)
        a, b = RecordFuture(outcome, 0), RecordFuture(outcome, 1)
        other = asyncio.ensure_future(b)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(a, 0.01)
        assert a.cancelled() and not b.done()
        outcome.resolve(0)
        assert await other == RecordMetadata("t", 2, 1)
        assert a.cancelled()
        with pytest.raises(asyncio.CancelledError):
            a.result()
    asyncio.run(main())


def test_a_pending_record_future_says_so():
    async def main():
        f = RecordFuture(BatchOutcome(TP, asyncio.get_running_loop()), 0)
        with pytest.raises(asyncio.InvalidStateError):
            f.result()
        assert "pending" in repr(f)
        cb = f.add_done_callback(print)
        assert cb is None and f.remove_done_callback(print) == 1
    asyncio.run(main())


def test_record_futures_work_with_asyncio_wait_and_as_completed():
    async def main():
        loop = asyncio.get_running_loop()
        first, second = BatchOutcome(TP, loop), BatchOutcome(TopicPartition("t", 3), loop)
        a, b = RecordFuture(first, 0), RecordFuture(second, 5)
        loop.call_soon(second.resolve, 10)
        done, pending = await asyncio.wait({a, b}, return_when=asyncio.FIRST_COMPLETED)
        assert done == {b} and pending == {a}
        first.fail(RuntimeError("gone"))
        outcomes = []
        for next_done in asyncio.as_completed([a, b]):
            try:
                outcomes.append(await next_done)
            except RuntimeError as exc:
                outcomes.append(str(exc))
        assert sorted(map(str, outcomes)) == sorted(["gone", str(RecordMetadata("t", 3, 15))])
    asyncio.run(main())
