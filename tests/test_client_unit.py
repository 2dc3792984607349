"""Client SDK without a real broker: partitioner, accumulator rules, and the producer and
consumer against tests/fake_broker.py (127.0.0.1, port 0) with injected faults."""
from __future__ import annotations

import asyncio
import random

import pytest

from common.errors import ErrorCode
from dataplane.client import (
    BufferFullTimeoutError,
    ClientClosedError,
    Consumer,
    DeliveryTimeoutError,
    OutcomeUnknownError,
    Producer,
    TopicPartition,
    UnknownTopicError,
)
from dataplane.client.accumulator import Accumulator, record_size_bytes
from common.batch import RecordHeaderError, read_records
from dataplane.client.partitioner import StickyPartitioner, key_partition, murmur2
from fake_broker import FakeBroker

TP = TopicPartition("t", 0)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


# ------------------------------------------------------------------ partitioner

def test_murmur2_matches_kafka_reference_values():
    """The hash equals Kafka's Java client's on its own published test vectors."""
    cases = {b"21": -973932308, b"foobar": -790332482, b"a-little-bit-long-string": -985981536,
             b"a-little-bit-longer-string": -1486304829,
             b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971, b"abc": 479470107}
    for data, expected in cases.items():
        assert murmur2(data) == expected, data


def test_key_partition_is_stable_and_in_range():
    """Same key, same partition, across partitioner instances; every partition index is valid."""
    a, b = StickyPartitioner(rng=random.Random(1)), StickyPartitioner(rng=random.Random(2))
    for i in range(500):
        key = f"user-{i}".encode()
        assert a.partition("t", key, 12) == b.partition("t", key, 12) == key_partition(key, 12)
        assert 0 <= key_partition(key, 12) < 12
    assert len({key_partition(f"k{i}".encode(), 6) for i in range(200)}) == 6


def test_sticky_partition_changes_only_when_batch_sent():
    """Keyless records stick to one partition until its batch leaves, then move to another."""
    p = StickyPartitioner(rng=random.Random(7))
    first = p.partition("t", None, 4)
    assert all(p.partition("t", None, 4) == first for _ in range(50))
    p.batch_sent("t", first, 4)
    second = p.partition("t", None, 4)
    assert second != first
    p.batch_sent("t", first, 4)  # an old partition's batch leaving changes nothing
    assert p.partition("t", None, 4) == second


def test_key_partition_rejects_zero_partitions():
    with pytest.raises(ValueError, match="partition_count"):
        key_partition(b"k", 0)


# ------------------------------------------------------------------ accumulator (pure)
# Batching only; the protocol after a batch's first send is tests/test_producer_core.py's.

VALUE = b"x" * 100


def accumulator(**options) -> Accumulator:
    """An accumulator whose producer core already holds producer id 5, epoch 0."""
    return Accumulator(producer_id=5, producer_epoch=0, **options)


def add(acc: Accumulator, tp: TopicPartition, *, now_ms: int, value: bytes = VALUE):
    """Append one 100-byte keyless record without headers; returns (batch, index)."""
    return acc.append(tp, value, None, b"\x00", 0, now_ms=now_ms)


def test_an_idle_partitions_batch_goes_without_lingering():
    """Nothing of the partition awaits an answer: waiting would only add latency."""
    acc = accumulator(batch_size_bytes=10_000, linger_ms=50)
    add(acc, TP, now_ms=1000)
    assert [b.record_count for b in acc.drain(1000, lambda tp: 1)[1]] == [1]


def test_linger_holds_a_partial_batch_until_its_deadline_while_an_earlier_one_is_in_flight():
    acc = accumulator(batch_size_bytes=10_000, linger_ms=50)
    add(acc, TP, now_ms=1000)
    assert acc.drain(1000, lambda tp: 1)   # the partition was idle: the first goes at once
    add(acc, TP, now_ms=1000)
    assert acc.drain(1049, lambda tp: 1) == {}
    assert acc.next_ready_ms(1000) == 1050
    drained = acc.drain(1050, lambda tp: 1)
    assert [b.record_count for b in drained[1]] == [1]


def test_full_batch_goes_without_waiting_and_batches_are_bounded_by_size():
    acc = accumulator(batch_size_bytes=1000, linger_ms=10_000)
    for _ in range(25):
        add(acc, TP, now_ms=0)
    state = acc.partitions[TP]
    assert all(b.size_bytes <= 1000 for b in state.queue)
    assert len(state.queue) >= 3
    drained = acc.drain(0, lambda tp: 1)
    assert len(drained[1]) == 1  # one batch per partition per request


def test_buffer_memory_is_bounded_and_released_on_completion():
    acc = accumulator(batch_size_bytes=500, linger_ms=0, buffer_memory_bytes=1000)
    size = record_size_bytes(VALUE, None, b"\x00")
    while acc.has_memory_for(size):
        add(acc, TP, now_ms=0)
    assert acc.buffer_used_bytes <= 1000 < acc.buffer_used_bytes + size
    queue = acc.partitions[TP].queue
    assert acc.buffer_used_bytes == sum(b.buffer_bytes for b in queue) == sum(b.size_bytes - 61 for b in queue)
    before = acc.buffer_used_bytes
    (batch,) = acc.drain(0, lambda tp: 1)[1]
    held = batch.buffer_bytes
    acc.complete(batch, error_code=ErrorCode.NONE, base_offset=0, now_ms=1)
    assert held > 0 and acc.buffer_used_bytes == before - held
    assert acc.has_memory_for(size)


def test_sequences_are_assigned_per_partition_at_first_drain():
    acc = accumulator(batch_size_bytes=300, linger_ms=0, in_flight_per_partition_max=5)
    other = TopicPartition("t", 1)
    for _ in range(4):
        add(acc, TP, now_ms=0)
    add(acc, other, now_ms=0)
    seqs = []
    for _ in range(4):
        for batches in acc.drain(0, lambda tp: 1).values():
            seqs += [(b.tp.partition, b.base_sequence, b.record_count) for b in batches]
    tp0 = [s for s in seqs if s[0] == 0]
    assert [s[1] for s in tp0] == [sum(c for _, _, c in tp0[:i]) for i in range(len(tp0))]
    assert [s[1] for s in seqs if s[0] == 1] == [0]


def test_a_retried_batch_goes_again_as_the_same_bytes_before_any_queued_batch():
    """Claim: after a retriable error the failed batch is resent first, with the very bytes
    (and so the same producer id, epoch and sequence) it was sent with."""
    acc = accumulator(batch_size_bytes=300, linger_ms=0, retry_backoff_ms=10)
    for _ in range(4):
        add(acc, TP, now_ms=0)
    (first,) = acc.drain(0, lambda tp: 1)[1]
    payload = bytes(first.payload)
    assert acc.complete(first, error_code=ErrorCode.NOT_LEADER_OR_FOLLOWER, base_offset=-1, now_ms=1) == []
    assert acc.drain(5, lambda tp: 1) == {}         # backoff: and no queued batch overtakes it
    (again,) = acc.drain(11, lambda tp: 1)[1]
    assert again is first and bytes(again.payload) == payload


def test_no_producer_id_means_no_drain_for_an_idempotent_producer():
    acc = Accumulator(linger_ms=0)
    add(acc, TP, now_ms=0)
    assert acc.drain(10, lambda tp: 1) == {}
    assert acc.core.producer_id_wanted


def test_no_leader_means_no_drain():
    acc = accumulator(linger_ms=0)
    add(acc, TP, now_ms=0)
    assert acc.drain(10, lambda tp: None) == {}


def test_a_queued_batch_past_its_delivery_timeout_fails_as_not_written():
    acc = accumulator(linger_ms=0, delivery_timeout_ms=1000)
    add(acc, TP, now_ms=0)
    (fail,) = acc.expire(1000)
    assert fail.outcome_unknown is False and fail.error is ErrorCode.REQUEST_TIMED_OUT
    assert acc.buffer_used_bytes == 0 and acc.pending_batches() == 0


def test_bad_limits_are_rejected_with_their_name():
    with pytest.raises(ValueError, match="linger_ms"):
        Accumulator(linger_ms=-1)
    with pytest.raises(ValueError, match="in_flight_per_partition_max=6 is above 5"):
        Accumulator(in_flight_per_partition_max=6)


# ------------------------------------------------------------------ producer against the fake broker

async def produce_all(broker: FakeBroker, values: list[bytes], **options) -> list:
    async with Producer(bootstrap=broker.bootstrap, **options) as producer:
        futures = [await producer.send("t", v, partition=0) for v in values]
        return await asyncio.gather(*futures, return_exceptions=True)


def test_a_written_record_whose_answer_never_comes_fails_unknown_and_is_written_once():
    """Issue 12 at the SDK's level: the leader writes "a0" but its answer never comes (the
    request times out). The record fails by delivery timeout with OutcomeUnknownError (it may
    be in the log); it is never sent again under new numbers, and the records after it go under
    a new epoch once its request has ended: the log holds each record once."""
    async def main():
        async with FakeBroker({"t": 1}) as broker:
            broker.inject("t", 0, ("delay", 2.0))
            async with Producer(bootstrap=broker.bootstrap, linger_ms=0, request_timeout_ms=100,
                                delivery_timeout_ms=300, retry_backoff_ms=10) as producer:
                first = await producer.send("t", b"a0")
                with pytest.raises(OutcomeUnknownError, match="may be in the log"):
                    await first
                await asyncio.sleep(1.0)   # the request itself ends (times out) after 1.1 s
                later = [await producer.send_and_wait("t", b"b%d" % i) for i in range(3)]
                assert producer.producer_epoch == 1
            assert broker.partitions[("t", 0)].values() == [b"a0", b"b0", b"b1", b"b2"]
            assert [m.offset for m in later] == [1, 2, 3]
            assert [s[2] for s in broker.sequences_seen] == [0, 0, 1, 2]   # a0 never sent again
    run(main())


def test_duplicate_sequence_fails_the_record_as_outcome_unknown():
    """A leader answers DUPLICATE_SEQUENCE for a batch older than its window of 5, at once and
    with no offset: the record was appended but may be uncommitted. The SDK used to resolve the
    record's future with offset -1 (reported written); it now fails it with
    OutcomeUnknownError, whose message says the record may be in the log."""
    async def main():
        async with FakeBroker({"t": 1}) as broker:
            broker.inject("t", 0, ("write_then", ErrorCode.DUPLICATE_SEQUENCE))
            async with Producer(bootstrap=broker.bootstrap, linger_ms=0, retry_backoff_ms=10) as producer:
                first = await producer.send("t", b"a0", partition=0)
                with pytest.raises(OutcomeUnknownError, match="may be in the log") as caught:
                    await first
                assert caught.value.code is ErrorCode.DUPLICATE_SEQUENCE
                later = await producer.send_and_wait("t", b"b0", partition=0)
            assert broker.partitions[("t", 0)].values() == [b"a0", b"b0"]
            assert later.offset == 1
            assert [s[2] for s in broker.sequences_seen] == [0, 0]   # a0 sent once; b0 under a new epoch
    run(main())


def test_producer_assigns_offsets_in_order():
    async def main():
        async with FakeBroker({"t": 2}) as broker:
            metas = await produce_all(broker, [b"%d" % i for i in range(100)], linger_ms=2, batch_size_bytes=600)
            assert [m.offset for m in metas] == list(range(100))
            assert broker.partitions[("t", 0)].values() == [b"%d" % i for i in range(100)]
    run(main())


def test_retries_after_lost_acks_do_not_duplicate_or_reorder():
    """A batch written but answered with a retriable error is resent with the same sequence; the
    broker's dedupe returns the original offset, and later batches stay behind it."""
    async def main():
        async with FakeBroker({"t": 1}) as broker:
            broker.inject("t", 0, ErrorCode.NOT_LEADER_OR_FOLLOWER, ("write_then", ErrorCode.REQUEST_TIMED_OUT),
                          ("write_then", ErrorCode.NETWORK_EXCEPTION), ErrorCode.NOT_ENOUGH_REPLICAS)
            values = [b"%d" % i for i in range(300)]
            metas = await produce_all(broker, values, linger_ms=1, batch_size_bytes=400, retry_backoff_ms=5,
                                      in_flight_per_partition_max=5)
            assert [m.offset for m in metas] == list(range(300))
            assert broker.partitions[("t", 0)].values() == values
            seqs = [s for s in broker.sequences_seen if s[1] == 0]
            assert len(seqs) > len(broker.partitions[("t", 0)].batches)  # retries did happen
    run(main())


def test_dropped_connection_and_timeout_are_retried_without_loss():
    async def main():
        async with FakeBroker({"t": 1}) as broker:
            broker.inject("t", 0, ("close",), ("delay", 1.5))
            values = [b"v%d" % i for i in range(50)]
            metas = await produce_all(broker, values, linger_ms=1, batch_size_bytes=300, retry_backoff_ms=5,
                                      request_timeout_ms=500, in_flight_per_partition_max=5)
            assert all(not isinstance(m, BaseException) for m in metas), metas
            assert broker.partitions[("t", 0)].values() == values
    run(main())


def test_keyed_records_keep_their_order_per_partition():
    async def main():
        async with FakeBroker({"t": 4}) as broker:
            async with Producer(bootstrap=broker.bootstrap, linger_ms=1) as producer:
                futures = [await producer.send("t", b"%s:%d" % (k, i), key=k)
                           for i in range(40) for k in (b"a", b"b", b"c")]
                metas = await asyncio.gather(*futures)
            for k in (b"a", b"b", b"c"):
                parts = {m.partition for m, f in zip(metas, range(len(metas))) if (f % 3) == (b"abc".index(k))}
                assert parts == {key_partition(k, 4)}
                vals = [v for v in broker.partitions[("t", key_partition(k, 4))].values() if v.startswith(k + b":")]
                assert vals == [b"%s:%d" % (k, i) for i in range(40)]
    run(main())


def test_buffer_full_send_blocks_then_times_out_clearly():
    async def main():
        async with FakeBroker({"t": 1}) as broker:
            broker.hold.clear()  # the broker stops answering produce requests
            async with Producer(bootstrap=broker.bootstrap, buffer_memory_bytes=2000, max_block_ms=300,
                                linger_ms=0, batch_size_bytes=500, delivery_timeout_ms=60_000) as producer:
                with pytest.raises(BufferFullTimeoutError, match="max_block_ms=300"):
                    for _ in range(100):
                        await producer.send("t", b"x" * 100)
                broker.hold.set()
                await producer.flush()
            assert broker.partitions[("t", 0)].next_offset > 0
    run(main())


def test_unknown_topic_and_bad_arguments_raise_clear_errors():
    async def main():
        async with FakeBroker({"t": 2}) as broker:
            async with Producer(bootstrap=broker.bootstrap, unknown_topic_wait_ms=200) as producer:
                with pytest.raises(UnknownTopicError, match="does not exist"):
                    await producer.send("nope", b"x")
                with pytest.raises(ValueError, match="partition 5 does not exist"):
                    await producer.send("t", b"x", partition=5)
                with pytest.raises(TypeError, match="value must be bytes"):
                    await producer.send("t", 12)
                await producer.send_and_wait("t", b"known now")   # the topic is cached from here on
                for topic in ("", 5, ["t"], None):
                    with pytest.raises(ValueError, match="topic must be a non-empty string"):
                        await producer.send(topic, b"x")
                with pytest.raises(ValueError, match="partition must be a non-negative integer"):
                    await producer.send("t", b"x", partition=-1)
                with pytest.raises(ValueError, match="partition must be a non-negative integer"):
                    await producer.send("t", b"x", partition="0")
                # Headers: pairs or a dict; a two-letter string is not a (name, value) pair.
                for headers, word in ((5, "list of"), ("ab", "list of"), (["ab"], "pair"), ([("a",)], "pair")):
                    with pytest.raises(RecordHeaderError, match=word):
                        await producer.send("t", b"x", headers=headers)
                await producer.send_and_wait("t", b"h", headers={"trace": "1"}, partition=0)
                [written] = [r for blob in broker.partitions[("t", 0)].batches for r in read_records(blob)
                             if r.value == b"h"]
                assert written.headers == (("trace", b"1"),)
            with pytest.raises(ClientClosedError):
                await producer.send("t", b"x")
    run(main())
    with pytest.raises(ValueError, match="acks"):
        Producer(bootstrap="127.0.0.1:1", acks=2)
    with pytest.raises(ValueError, match="enable_idempotence=True needs acks='all'"):
        Producer(bootstrap="127.0.0.1:1", acks=1, enable_idempotence=True)
    with pytest.raises(ValueError, match="not HOST:PORT"):
        Producer(bootstrap="localhost")
    for bootstrap in (123, [9092], b"127.0.0.1:9092"):
        with pytest.raises(ValueError, match="must be 'HOST:PORT"):
            Producer(bootstrap=bootstrap)
        with pytest.raises(ValueError, match="must be 'HOST:PORT"):
            Consumer("t", bootstrap=bootstrap)
    with pytest.raises(ValueError, match="topics to read must be non-empty strings"):
        Consumer(123, bootstrap="127.0.0.1:1")
    for flag in ("from_beginning", "enable_auto_commit"):
        with pytest.raises(ValueError, match=f"{flag}='yes' must be True or False"):
            Consumer("t", bootstrap="127.0.0.1:1", **{flag: "yes"})


def test_delivery_timeout_when_no_broker_answers():
    async def main():
        async with FakeBroker({"t": 1}) as broker:
            producer = await Producer(bootstrap=broker.bootstrap, delivery_timeout_ms=400, linger_ms=0,
                                      request_timeout_ms=200, retry_backoff_ms=20).start()
            broker.hold.clear()
            future = await producer.send("t", b"x")
            with pytest.raises(DeliveryTimeoutError):
                await future
            broker.hold.set()
            await producer.close()
    run(main())


def test_send_waits_max_block_ms_for_a_cluster_that_does_not_answer_yet():
    """A producer made while every broker was down (a cluster restarting) failed its first
    send() at once with NoBrokersError; Kafka's producer waits max.block.ms for metadata. It
    now waits, and says how long it waited."""
    import socket
    import time
    from common.errors import NoBrokersError

    async def main():
        with socket.socket() as s:   # a port nobody listens on
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        producer = await Producer(bootstrap=f"127.0.0.1:{port}", max_block_ms=800).start()
        started = time.monotonic()
        with pytest.raises(NoBrokersError, match="waited max_block_ms=800"):
            await producer.send("t", b"x")
        assert 0.7 <= time.monotonic() - started < 5, time.monotonic() - started
        await producer.close()
    run(main())


def test_acks_zero_resolves_without_offsets():
    async def main():
        async with FakeBroker({"t": 1}) as broker:
            metas = await produce_all(broker, [b"a", b"b"], acks=0)
            assert [m.offset for m in metas] == [-1, -1]
            for _ in range(50):
                if broker.partitions[("t", 0)].next_offset == 2:
                    break
                await asyncio.sleep(0.02)
            assert broker.partitions[("t", 0)].values() == [b"a", b"b"]
    run(main())


def test_gzip_batches_round_trip_through_consumer():
    async def main():
        async with FakeBroker({"t": 1}) as broker:
            values = [b"hello %d" % i * 10 for i in range(30)]
            await produce_all(broker, values, compression="gzip")
            async with Consumer("t", bootstrap=broker.bootstrap, from_beginning=True) as consumer:
                got = []
                while len(got) < 30:
                    got += await consumer.poll(500)
                assert [r.value for r in got] == values
    run(main())


# ------------------------------------------------------------------ consumer against the fake broker

def test_consumer_seeks_and_reports_position_and_lag():
    async def main():
        async with FakeBroker({"t": 2}) as broker:
            await produce_all(broker, [b"%d" % i for i in range(20)])
            async with Consumer(bootstrap=broker.bootstrap) as consumer:
                await consumer.assign([("t", 0), ("t", 1)])
                tp = TopicPartition("t", 0)
                assert consumer.position(tp) == 20   # default start: the end
                await consumer.seek(tp, 15)
                got = await consumer.poll(1000)
                assert [r.offset for r in got] == [15, 16, 17, 18, 19]
                assert consumer.position(tp) == 20 and consumer.lag(tp) == 0
                await consumer.seek_to_beginning(tp)
                got = await consumer.poll(1000, max_records=3)
                assert [r.offset for r in got] == [0, 1, 2]
                assert consumer.lag(tp) == 17
                with pytest.raises(ValueError, match="not assigned"):
                    consumer.position(("t", 9))
                with pytest.raises(ValueError, match="partition"):
                    await consumer.assign([("t", 7)])
    run(main())


def test_consumer_steps_over_control_batches_before_between_and_after_records():
    """A leader's own batches (control batches) take offsets but are not records: the consumer
    returns every record once, in order, and its position ends after the last batch."""
    from common.batch import BatchBuilder

    def control(part):
        b = BatchBuilder(is_control=True)
        b.append(b"", timestamp_ms=0)
        broker.append(part, bytearray(b.build()), _header(b))

    def _header(builder):
        from common.batch import read_header
        return read_header(builder.build())

    async def main():
        nonlocal broker
        async with FakeBroker({"t": 1}) as b:
            broker = b
            part = b.partitions[("t", 0)]
            control(part)
            await produce_all(b, [b"a", b"b"])
            control(part)
            await produce_all(b, [b"c"])
            control(part)
            async with Consumer("t", bootstrap=b.bootstrap, from_beginning=True) as consumer:
                got = []
                for _ in range(5):
                    got += await consumer.poll(200)
                assert [(r.offset, r.value) for r in got] == [(1, b"a"), (2, b"b"), (4, b"c")]
                assert consumer.position(TP) == 6 and consumer.lag(TP) == 0
    broker = None
    run(main())


def test_a_finally_failed_batch_bumps_the_epoch_and_later_records_still_go():
    """A non-retriable answer fails that batch's records only; the sequence gap it leaves is
    closed by a new producer epoch, with every partition restarting at sequence 0."""
    async def main():
        async with FakeBroker({"t": 1}) as broker:
            broker.inject("t", 0, ErrorCode.MESSAGE_TOO_LARGE)
            async with Producer(bootstrap=broker.bootstrap, linger_ms=0) as producer:
                first_id = producer.producer_id
                with pytest.raises(Exception, match="MESSAGE_TOO_LARGE"):
                    await producer.send_and_wait("t", b"rejected")
                metas = [await producer.send_and_wait("t", b"after%d" % i) for i in range(3)]
                assert producer.producer_id != first_id or producer.producer_epoch > 0
            assert [m.offset for m in metas] == [0, 1, 2]
            assert broker.partitions[("t", 0)].values() == [b"after0", b"after1", b"after2"]
            assert [s[2] for s in broker.sequences_seen] == [0, 0, 1, 2]
    run(main())


def test_a_partition_at_its_in_flight_limit_sets_no_timer():
    """Waiting for answers is not a deadline: the sender must sleep until one arrives (or the
    delivery timeout), not spin."""
    acc = accumulator(batch_size_bytes=300, linger_ms=5, in_flight_per_partition_max=1)
    for _ in range(4):
        add(acc, TP, now_ms=0)
    (batch,) = acc.drain(10, lambda tp: 1)[1]
    assert acc.next_ready_ms(10) == acc.delivery_timeout_ms
    acc.complete(batch, error_code=ErrorCode.NONE, base_offset=0, now_ms=11)
    assert acc.next_ready_ms(11) == 5   # the next batch is overdue: send at once


def test_producer_follows_a_leader_move_after_not_leader():
    """The old leader answers NOT_LEADER_OR_FOLLOWER: the producer refreshes metadata and sends
    the same batch, with the same sequence, to the new leader (which holds the same replicated
    log and producer state), so nothing is lost, duplicated or reordered."""
    from fake_broker import ClusterView

    async def main():
        view = ClusterView()
        async with FakeBroker({"t": 1}, broker_id=1, view=view) as a, \
                FakeBroker({"t": 1}, broker_id=2, view=view) as b:
            b.partitions = a.partitions   # one replicated log
            view.brokers = [a, b]
            view.leaders[("t", 0)] = (1, 0)
            async with Producer(bootstrap=a.bootstrap, linger_ms=0, retry_backoff_ms=5) as producer:
                first = [await producer.send_and_wait("t", b"a%d" % i) for i in range(3)]
                view.leaders[("t", 0)] = (2, 1)
                later = [await producer.send("t", b"b%d" % i) for i in range(20)]
                metas = await asyncio.gather(*later)
            assert a.partitions[("t", 0)].values() == [b"a0", b"a1", b"a2"] + [b"b%d" % i for i in range(20)]
            assert [m.offset for m in first + metas] == list(range(23))
            refused = a.sequences_seen[3]
            assert refused[2] == 3 and b.sequences_seen[0] == refused   # resent as is
    run(main())


def test_a_leader_without_the_producer_state_gets_a_new_epoch_from_sequence_zero():
    """OUT_OF_ORDER_SEQUENCE for a partition's oldest outstanding batch cannot heal by waiting:
    the producer takes a new epoch and resends from sequence 0 (allowed because the leader
    refused the batch's only attempt before appending it)."""
    from fake_broker import ClusterView

    async def main():
        view = ClusterView()
        async with FakeBroker({"t": 1}, broker_id=1, view=view) as a, \
                FakeBroker({"t": 1}, broker_id=2, view=view) as b:
            view.brokers = [a, b]
            view.leaders[("t", 0)] = (1, 0)
            async with Producer(bootstrap=a.bootstrap, linger_ms=0, retry_backoff_ms=5) as producer:
                await producer.send_and_wait("t", b"a0")
                view.leaders[("t", 0)] = (2, 1)   # b has an empty log and knows no producer
                await producer._network.refresh_metadata()
                meta = await producer.send_and_wait("t", b"b0")
                assert producer.producer_epoch == 1   # bumped by the producer itself
            assert meta.offset == 0 and b.partitions[("t", 0)].values() == [b"b0"]
            assert [s[2] for s in b.sequences_seen] == [1, 0]
    run(main())


def test_one_fetch_request_carries_every_partition_the_broker_leads():
    async def main():
        async with FakeBroker({"t": 3, "u": 2}) as broker:
            async with Producer(bootstrap=broker.bootstrap) as producer:
                for p in range(3):
                    await producer.send_and_wait("t", b"t%d" % p, partition=p)
            async with Consumer("t", "u", bootstrap=broker.bootstrap, from_beginning=True) as consumer:
                got = []
                while len(got) < 3:
                    got += await consumer.poll(500)
            assert sorted(r.value for r in got) == [b"t0", b"t1", b"t2"]
            assert broker.fetch_sizes[0] == 5
    run(main())


def test_one_in_flight_never_sends_a_second_batch_before_the_first_is_answered():
    """The non-idempotent producer's rule (leaders cannot refuse a gap it leaves): one batch per
    partition in flight, so a retried batch is never overtaken."""
    acc = Accumulator(batch_size_bytes=300, linger_ms=0, in_flight_per_partition_max=1, idempotent=False)
    for _ in range(6):
        add(acc, TP, now_ms=0)
    (first,) = acc.drain(0, lambda tp: 1)[1]
    assert acc.drain(1, lambda tp: 1) == {}
    acc.complete(first, error_code=ErrorCode.NOT_ENOUGH_REPLICAS, base_offset=-1, now_ms=2)
    (again,) = acc.drain(200, lambda tp: 1)[1]
    assert again is first
    assert Producer(bootstrap="127.0.0.1:1", acks=1)._acc.in_flight_per_partition_max == 1
    assert Producer(bootstrap="127.0.0.1:1")._acc.in_flight_per_partition_max == 5


def test_send_and_wait_and_flush_do_not_wait_for_linger():
    """With a linger of 10 minutes, send_and_wait and flush still return at once (bounded here
    by a 20 s wait): a caller waiting for its record is never held back for batching."""
    async def main():
        async with FakeBroker({"t": 1}) as broker:
            async with Producer(bootstrap=broker.bootstrap, linger_ms=600_000) as producer:
                meta = await asyncio.wait_for(producer.send_and_wait("t", b"now"), 20)
                queued = [await producer.send("t", b"q%d" % i) for i in range(5)]
                assert not any(f.done() for f in queued)
                await asyncio.wait_for(producer.flush(), 20)
                assert [f.result().offset for f in queued] == [1, 2, 3, 4, 5]
            assert meta.offset == 0
    run(main())


def test_records_of_one_batch_get_consecutive_offsets_and_one_failure():
    """A batch's records resolve together: offsets base + index when acknowledged, the same
    error for each when the batch fails for good."""
    async def main():
        async with FakeBroker({"t": 1}) as broker:
            async with Producer(bootstrap=broker.bootstrap, linger_ms=600_000, acks=1) as producer:
                await producer.send_and_wait("t", b"first")
                ok = [await producer.send("t", b"%d" % i, partition=0) for i in range(10)]
                await producer.flush()
                broker.inject("t", 0, ErrorCode.MESSAGE_TOO_LARGE)
                bad = [await producer.send("t", b"x", partition=0) for _ in range(3)]
                await producer.flush()
                results = await asyncio.gather(*bad, return_exceptions=True)
            assert [f.result().offset for f in ok] == list(range(1, 11))
            assert [type(r).__name__ for r in results] == ["BrokerResponseError"] * 3
            assert results[0] is results[1] is results[2]
    run(main())


def test_keys_headers_timestamps_and_value_types_round_trip():
    """What send() accepts (bytes, str, bytearray, memoryview, None; headers with str, bytes or
    None values; an explicit timestamp) is what a consumer reads back."""
    async def main():
        async with FakeBroker({"t": 1}) as broker:
            async with Producer(bootstrap=broker.bootstrap, linger_ms=600_000) as producer:
                sent = [
                    await producer.send("t", b"v0", key=b"k0", headers=[("h", b"x"), ("e", None)], timestamp_ms=1000),
                    await producer.send("t", "text", key="key", headers=(("s", "str"),), timestamp_ms=999),
                    await producer.send("t", bytearray(b"ba"), key=memoryview(b"mv")),
                    await producer.send("t", None, key=None, timestamp_ms=-1),
                ]
                with pytest.raises(ValueError, match="timestamp_ms"):
                    await producer.send("t", b"v", timestamp_ms=1.5)
                with pytest.raises(TypeError, match="header name must be str"):
                    await producer.send("t", b"v", headers=[(1, b"x")])
                await producer.flush()
            assert [f.result().offset for f in sent] == [0, 1, 2, 3]
            async with Consumer("t", bootstrap=broker.bootstrap, from_beginning=True) as consumer:
                got = []
                while len(got) < 4:
                    got += await consumer.poll(500)
            assert [(r.key, r.value, r.headers) for r in got] == [
                (b"k0", b"v0", (("h", b"x"), ("e", None))), (b"key", b"text", (("s", b"str"),)),
                (b"mv", b"ba", ()), (None, None, ())]
            assert [r.timestamp_ms for r in got][:2] == [1000, 999] and got[3].timestamp_ms == -1
    run(main())


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_records_under_random_faults_land_once_in_order_at_their_offsets(seed):
    """Seeded: records of random sizes, keys and headers, sent while the fake broker answers
    with random retriable errors and lost acknowledgements, each land exactly once, in send
    order per partition, at the offset their future reports."""
    rng = random.Random(seed)

    async def main():
        async with FakeBroker({"t": 3}) as broker:
            for p in range(3):
                faults = [rng.choice([ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.NOT_ENOUGH_REPLICAS,
                                      ("write_then", ErrorCode.REQUEST_TIMED_OUT)]) for _ in range(rng.randrange(7))]
                broker.inject("t", p, *faults)
            sent = []
            async with Producer(bootstrap=broker.bootstrap, linger_ms=rng.choice([0, 1, 5]),
                                batch_size_bytes=rng.choice([300, 2000, 20_000]), retry_backoff_ms=5) as producer:
                for i in range(300):
                    value = None if rng.random() < 0.05 else rng.randbytes(rng.choice([0, 10, 200, 1500]))
                    key = None if rng.random() < 0.5 else b"k%d" % rng.randrange(10)
                    headers = [("h%d" % j, rng.randbytes(3)) for j in range(rng.randrange(3))]
                    future = await producer.send("t", value, key=key, headers=headers)
                    sent.append((future, value, key, headers))
                    if i % 50 == 0:
                        await asyncio.sleep(0)
                await producer.flush()
            for p in range(3):
                mine = [(f.result().offset, v, k, h) for f, v, k, h in sent if f.result().partition == p]
                log = [r for blob in broker.partitions[("t", p)].batches for r in read_records(blob)]
                assert [(r.offset, r.value, r.key, list(r.headers)) for r in log] == \
                    [(o, v, k, h) for o, v, k, h in mine], f"seed={seed} partition={p}"
    run(main())


def test_sends_wait_through_an_unanswered_init_producer_id_and_go_once_it_answers():
    """The chaos run's bug: InitProducerId unanswered past the deadline stopped the producer
    for good (every later send raised ClientClosedError). Now the request is asked again after
    retry_backoff_ms; start() and send() do not fail, and records sent meanwhile are written
    once it answers: all of them, in order, once each."""
    async def main():
        async with FakeBroker({"t": 1}) as broker:
            broker.init_answering.clear()
            async with Producer(bootstrap=broker.bootstrap, linger_ms=0, request_timeout_ms=150,
                                retry_backoff_ms=20, max_block_ms=300, delivery_timeout_ms=10_000) as producer:
                assert producer.producer_id == -1
                futures = [await producer.send("t", b"v%d" % i) for i in range(20)]
                await asyncio.sleep(0.6)
                assert broker.init_requests >= 3 and broker.partitions[("t", 0)].values() == []
                assert not any(f.done() for f in futures)
                broker.init_answering.set()
                metas = await asyncio.gather(*futures)
                more = await producer.send_and_wait("t", b"after")
            assert [m.offset for m in metas] == list(range(20)) and more.offset == 20
            assert broker.partitions[("t", 0)].values() == [b"v%d" % i for i in range(20)] + [b"after"]
            covered = [seq for _, _, base, count in broker.sequences_seen for seq in range(base, base + count)]
            assert covered == list(range(21))   # each record sent once
    run(main())


def test_records_waiting_for_a_producer_id_fail_by_delivery_timeout_not_closed():
    """While no producer id comes, a record fails by its own delivery timeout, as never sent
    (DeliveryTimeoutError, not OutcomeUnknownError); the producer stays usable."""
    async def main():
        async with FakeBroker({"t": 1}) as broker:
            broker.init_answering.clear()
            async with Producer(bootstrap=broker.bootstrap, linger_ms=0, request_timeout_ms=100,
                                retry_backoff_ms=20, max_block_ms=200, delivery_timeout_ms=400) as producer:
                first = await producer.send("t", b"lost")
                with pytest.raises(DeliveryTimeoutError, match="producer id") as caught:
                    await first
                assert not isinstance(caught.value, OutcomeUnknownError)
                broker.init_answering.set()
                assert (await producer.send_and_wait("t", b"kept")).offset == 0
            assert broker.partitions[("t", 0)].values() == [b"kept"]
    run(main())


def test_a_refused_init_producer_id_fails_the_waiting_records_but_not_the_producer():
    """A non-retriable answer (INVALID_CONFIG) fails the records waiting for an identity with that
    error, as never sent; the producer asks again for the next ones and is not closed."""
    async def main():
        async with FakeBroker({"t": 1}) as broker:
            broker.init_answering.clear()
            async with Producer(bootstrap=broker.bootstrap, linger_ms=0, request_timeout_ms=100,
                                retry_backoff_ms=20, max_block_ms=200) as producer:
                refused = await producer.send("t", b"refused")
                broker.init_errors.extend([ErrorCode.NOT_CONTROLLER, ErrorCode.INVALID_CONFIG])
                broker.init_answering.set()
                with pytest.raises(Exception, match="INVALID_CONFIG") as caught:
                    await refused
                assert not isinstance(caught.value, (ClientClosedError, DeliveryTimeoutError))
                assert (await producer.send_and_wait("t", b"later")).offset == 0
            assert broker.partitions[("t", 0)].values() == [b"later"]
    run(main())


def test_a_fresh_producer_id_after_the_last_epoch_is_waited_for_not_fatal():
    """The path the chaos run hit: the sender needs a new producer id (here: the epoch ran out
    after a refused batch) and InitProducerId goes unanswered longer than max_block_ms. The old
    sender stopped and every later send() raised ClientClosedError; now sends issued meanwhile
    wait and are written once it answers, in order, under the new id."""
    from dataplane.client.producer_core import PRODUCER_EPOCH_MAX

    async def main():
        async with FakeBroker({"t": 1}) as broker:
            broker.init_epoch = PRODUCER_EPOCH_MAX
            broker.inject("t", 0, ErrorCode.MESSAGE_TOO_LARGE)
            async with Producer(bootstrap=broker.bootstrap, linger_ms=0, request_timeout_ms=100,
                                retry_backoff_ms=20, max_block_ms=200, delivery_timeout_ms=10_000) as producer:
                first_id = producer.producer_id
                broker.init_answering.clear()
                with pytest.raises(Exception, match="MESSAGE_TOO_LARGE"):
                    await producer.send_and_wait("t", b"rejected")
                futures = [await producer.send("t", b"w%d" % i) for i in range(10)]
                await asyncio.sleep(0.6)
                assert producer.producer_id == -1 and not any(f.done() for f in futures)
                broker.init_answering.set()
                metas = await asyncio.gather(*futures)
                assert producer.producer_id not in (-1, first_id)
            assert [m.offset for m in metas] == list(range(10))
            assert broker.partitions[("t", 0)].values() == [b"w%d" % i for i in range(10)]
            covered = [seq for _, _, base, count in broker.sequences_seen[1:] for seq in range(base, base + count)]
            assert covered == list(range(10))   # each record sent once, from sequence 0 of the new id
    run(main())
