"""The blocking producer (dataplane.client.sync.Producer) against tests/fake_broker.py running
on its own event-loop thread: order across send and send_and_wait, errors through the
future, a snapshot of mutable values, blocking and its timeout when nothing is taken."""
from __future__ import annotations

import asyncio
import concurrent.futures
import threading

import pytest

from common.errors import ErrorCode
from dataplane.client import BufferFullTimeoutError
from dataplane.client.sync import Producer
from fake_broker import FakeBroker


class BrokerThread:
    """A FakeBroker served from a private loop thread; stopped by the fixture."""

    def __init__(self, topics: dict[str, int]) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.broker = FakeBroker(topics)
        self.call(self.broker.__aenter__())

    def call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    def stop(self) -> None:
        self.call(self.broker.__aexit__(None, None, None))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def fake():
    b = BrokerThread({"t": 2})
    try:
        yield b
    finally:
        b.stop()


def test_sends_and_send_and_wait_keep_their_order(fake):
    """Records sent from one thread land in send order, send_and_wait included, with the
    offsets their futures report; a bytearray reused after send() does not change the record."""
    buf = bytearray(b"before")
    with Producer(bootstrap=fake.broker.bootstrap, linger_ms=50) as producer:
        futures = [producer.send("t", b"%d" % i, partition=0) for i in range(500)]
        futures.append(producer.send("t", buf, partition=0))
        buf[:] = b"after!"
        last = producer.send_and_wait("t", b"last", partition=0)
        metas = [f.result(10) for f in futures]
    assert [m.offset for m in metas] == list(range(501))
    assert last.offset == 501
    values = fake.broker.partitions[("t", 0)].values()
    assert values == [b"%d" % i for i in range(500)] + [b"before", b"last"]


def test_bad_arguments_and_unknown_topics_fail_the_future(fake):
    with Producer(bootstrap=fake.broker.bootstrap, unknown_topic_wait_ms=200) as producer:
        bad = producer.send("t", 12345)
        with pytest.raises(TypeError, match="value must be bytes"):
            bad.result(10)
        with pytest.raises(ValueError, match="partition 7 does not exist"):
            producer.send_and_wait("t", b"v", partition=7)
        unknown = producer.send("nope", b"v")
        with pytest.raises(Exception, match="does not exist"):
            unknown.result(10)
        assert producer.send_and_wait("t", b"still fine", partition=1).offset == 0


def test_send_blocks_when_nothing_is_taken_then_times_out_clearly(fake):
    """With the broker holding every answer, the buffer fills, the hand-off queue fills behind
    it, and send() raises BufferFullTimeoutError after max_block_ms. A record already handed
    off that waited as long for memory fails the same way through its future; after the
    broker answers again, flush() delivers every other accepted record, in order."""
    fake.loop.call_soon_threadsafe(fake.broker.hold.clear)
    producer = Producer(bootstrap=fake.broker.bootstrap, buffer_memory_bytes=4000, batch_size_bytes=1000,
                        max_block_ms=300, linger_ms=0)
    producer.handoff_records_max = 8
    accepted: list[concurrent.futures.Future] = []
    try:
        with pytest.raises(BufferFullTimeoutError, match="max_block_ms=300"):
            for _ in range(200):
                accepted.append(producer.send("t", b"x" * 100, partition=0))
        fake.loop.call_soon_threadsafe(fake.broker.hold.set)
        producer.flush()
        assert all(f.done() for f in accepted)
        failed = [f for f in accepted if f.exception() is not None]
        delivered = [f.result().offset for f in accepted if f.exception() is None]
        assert all(isinstance(f.exception(), BufferFullTimeoutError) for f in failed)
        assert len(delivered) >= len(accepted) - 8 and delivered == list(range(len(delivered)))
    finally:
        fake.loop.call_soon_threadsafe(fake.broker.hold.set)
        producer.close()
    assert fake.broker.partitions[("t", 0)].next_offset == len(delivered)


def test_a_failed_batch_fails_each_callers_future_with_a_traceback_that_does_not_grow(fake):
    with Producer(bootstrap=fake.broker.bootstrap, linger_ms=600_000, acks=1) as producer:
        fake.broker.inject("t", 0, ErrorCode.MESSAGE_TOO_LARGE)
        futures = [producer.send("t", b"x", partition=0) for _ in range(5)]
        producer.flush()
        depths = []
        for f in futures * 2:
            assert isinstance(f, concurrent.futures.Future)
            with pytest.raises(Exception, match="MESSAGE_TOO_LARGE") as caught:
                f.result(10)
            tb, depth = caught.value.__traceback__, 0
            while tb is not None:
                tb, depth = tb.tb_next, depth + 1
            depths.append(depth)
        assert len(set(depths)) == 1


def test_a_closed_client_may_be_closed_again_and_says_it_is_closed(fake, recwarn):
    """A second close() raised "Event loop is closed", and so did flush(), poll() or a topic
    list after close(), each with a "coroutine was never awaited" warning. close() is
    idempotent, as the asyncio clients' is, and every other call raises ClientClosedError."""
    from common.errors import ClientClosedError
    from dataplane.client.admin import SyncAdminClient
    from dataplane.client.sync import Consumer
    producer = Producer(bootstrap=fake.broker.bootstrap)
    producer.send_and_wait("t", b"x", partition=0)
    producer.close()
    producer.close()
    with pytest.raises(ClientClosedError, match="producer is closed"):
        producer.flush()
    consumer = Consumer(bootstrap=fake.broker.bootstrap)
    consumer.close()
    consumer.close()
    with pytest.raises(ClientClosedError, match="consumer is closed"):
        consumer.poll(100)
    admin = SyncAdminClient("http://127.0.0.1:9", "token")
    admin.close()
    admin.close()
    with pytest.raises(ClientClosedError, match="admin client is closed"):
        admin.list_topics()
    assert not [w for w in recwarn.list if "never awaited" in str(w.message)]


def test_offsets_of_an_unknown_topic_or_partition_are_refused_naming_it(fake):
    """end_offsets of a topic or partition that does not exist was retried for the whole
    request_timeout_ms (30 s) and then failed with an empty reason; it now fails as assign()
    does, after unknown_topic_wait_ms, naming what exists. The sync consumer has
    beginning_offsets too (only the asyncio one had)."""
    import time as clock
    from common.errors import UnknownTopicError
    from dataplane.client.sync import Consumer
    with Consumer(bootstrap=fake.broker.bootstrap, unknown_topic_wait_ms=300) as consumer:
        started = clock.monotonic()
        with pytest.raises(UnknownTopicError, match="'nope' does not exist"):
            consumer.end_offsets([("nope", 0)])
        with pytest.raises(UnknownTopicError, match=r"has 2 partition\(s\), 0 to 1: partition\(s\) \[7\] do not exist"):
            consumer.end_offsets([("t", 0), ("t", 7)])
        assert clock.monotonic() - started < 5
        assert set(consumer.beginning_offsets([("t", 0), ("t", 1)]).values()) == {0}


INTERRUPTED_CLOSE = """
import os, signal, sys, threading
sys.path[:0] = [{repo!r}, {tests!r}]
from test_client_sync import BrokerThread
from dataplane.client.sync import Producer
fake = BrokerThread({{"t": 1}})
fake.loop.call_soon_threadsafe(fake.broker.hold.clear)   # produce requests are read, never answered
producer = Producer(bootstrap=fake.broker.bootstrap)
for i in range(10):
    producer.send("t", b"queued")
threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
try:
    producer.close()   # waits for the acknowledgements that never come
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


def test_ctrl_c_during_a_blocked_close_ends_quietly():
    """Ctrl-C while close() waits for acknowledgements raises KeyboardInterrupt in the caller and
    ends the producer's tasks before its loop closes: it printed "Task was destroyed but it is
    pending!" and a traceback for each of them (a loop stopped under pending tasks)."""
    import subprocess
    import sys
    from pathlib import Path
    tests = Path(__file__).resolve().parent
    script = INTERRUPTED_CLOSE.format(repo=str(tests.parent), tests=str(tests))
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert "interrupted" in r.stdout, (r.stdout, r.stderr)
    assert "Task was destroyed" not in r.stderr and "Traceback" not in r.stderr, r.stderr
