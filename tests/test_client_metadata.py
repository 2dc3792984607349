"""Metadata kept fresh without errors (metadata_max_age_ms): the pure due-time rule, the
constructor check, and the producer and consumer against tests/fake_broker.py noticing a
new partition, a new broker and a moved leader that no error pointed at."""
from __future__ import annotations

import asyncio
import math

import pytest

from dataplane.client import Consumer, Producer, TopicPartition
from dataplane.client.metadata import metadata_refresh_due_ms
from fake_broker import ClusterView, FakeBroker, two_brokers_one_log


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


# ------------------------------------------------------------------ the rule (pure)

def test_refresh_is_due_once_the_metadata_is_max_age_old():
    assert metadata_refresh_due_ms(updated_ms=1_000, attempted_ms=990, max_age_ms=300_000,
                                   retry_backoff_ms=1_000) == 301_000
    # A successful refresh (for an error, say) pushes the next one back a whole max age.
    assert metadata_refresh_due_ms(updated_ms=250_000, attempted_ms=249_990, max_age_ms=300_000,
                                   retry_backoff_ms=1_000) == 550_000


def test_a_failed_refresh_is_retried_after_the_backoff_not_at_once():
    """The last attempt (at 302 s) got no answer: the age alone would say 'now' for ever."""
    assert metadata_refresh_due_ms(updated_ms=1_000, attempted_ms=302_000, max_age_ms=300_000,
                                   retry_backoff_ms=1_000) == 303_000


def test_no_periodic_refresh_before_a_first_answer():
    assert metadata_refresh_due_ms(updated_ms=None, attempted_ms=None, max_age_ms=1,
                                   retry_backoff_ms=1) == math.inf
    assert metadata_refresh_due_ms(updated_ms=None, attempted_ms=5, max_age_ms=1,
                                   retry_backoff_ms=1) == math.inf


@pytest.mark.parametrize("bad", [0, -5, 1.5, "300000", True, None])
def test_bad_metadata_max_age_is_refused_with_its_name_and_value(bad):
    for make in (lambda: Producer(bootstrap="127.0.0.1:9", metadata_max_age_ms=bad),
                 lambda: Consumer(bootstrap="127.0.0.1:9", metadata_max_age_ms=bad)):
        with pytest.raises(ValueError, match=rf"metadata_max_age_ms={bad!r} must be a positive integer"):
            make()


def test_metadata_max_age_defaults_to_five_minutes():
    assert Producer(bootstrap="127.0.0.1:9").metadata_max_age_ms == 300_000
    assert Consumer(bootstrap="127.0.0.1:9").metadata_max_age_ms == 300_000


# ------------------------------------------------------------------ producer

def test_producer_uses_a_partition_added_later_without_any_error():
    """The topic grows from 1 to 2 partitions. Before a refresh the producer refuses
    partition 1 (it does not know it); after the refresh it asked for on its own (no error,
    no retry happened), a record sent to partition 1 lands there."""
    async def main():
        async with FakeBroker({"t": 1}) as broker:
            async with Producer(bootstrap=broker.bootstrap, linger_ms=0, metadata_max_age_ms=20) as producer:
                await producer.send_and_wait("t", b"a")
                with pytest.raises(ValueError, match="partition 1 does not exist"):
                    await producer.send("t", b"too early", partition=1)
                seen = broker.metadata_requests
                broker.add_partitions("t", 2)
                # The first request counted after the change was answered with 2 partitions;
                # refreshes go one at a time, so a second one means the first was applied.
                await broker.metadata_requests_reach(seen + 2)
                meta = await producer.send_and_wait("t", b"b", partition=1)
                keyed = [await producer.send_and_wait("t", b"k", key=b"key-%d" % i) for i in range(20)]
                assert producer.retries == 0
            assert (meta.partition, meta.offset) == (1, 0)
            assert broker.partitions[("t", 1)].values()[0] == b"b"
            assert {m.partition for m in keyed} == {0, 1}   # keys hash over both partitions now
    run(main())


def test_producer_follows_a_leader_moved_to_a_new_broker_without_any_error():
    """Broker 2 joins and becomes the leader while broker 1 would still accept the writes
    (nothing refuses, nothing fails): the aged metadata is fetched again, and the next
    batch goes straight to broker 2 with the next sequence; broker 1 sees no more produce."""
    async def main():
        view = ClusterView()
        async with FakeBroker({"t": 1}, broker_id=1, view=view) as a, \
                FakeBroker({"t": 1}, broker_id=2, view=view) as b:
            b.partitions = a.partitions   # one replicated log
            view.brokers = [a]
            view.leaders[("t", 0)] = (1, 0)
            async with Producer(bootstrap=a.bootstrap, linger_ms=0, metadata_max_age_ms=20) as producer:
                first = [await producer.send_and_wait("t", b"a%d" % i) for i in range(3)]
                seen = a.metadata_requests
                view.brokers = [a, b]
                view.leaders[("t", 0)] = (2, 1)
                await a.metadata_requests_reach(seen + 2)
                later = [await producer.send_and_wait("t", b"b%d" % i) for i in range(3)]
                assert producer.retries == 0
            assert a.produce_requests == 3 and b.produce_requests == 3
            assert [s[2] for s in b.sequences_seen] == [3, 4, 5]
            assert [m.offset for m in first + later] == list(range(6))
            assert a.partitions[("t", 0)].values() == [b"a0", b"a1", b"a2", b"b0", b"b1", b"b2"]
    run(main())


def test_an_idle_producer_refreshes_on_its_own():
    """Nothing is sent after the first record, yet the sender wakes for the max age: the
    metadata requests keep coming while the producer sits idle."""
    async def main():
        async with FakeBroker({"t": 1}) as broker:
            async with Producer(bootstrap=broker.bootstrap, metadata_max_age_ms=10) as producer:
                await producer.send_and_wait("t", b"a")
                await broker.metadata_requests_reach(broker.metadata_requests + 3)
                assert producer.records_sent == 1 and broker.produce_requests == 1
    run(main())


# ------------------------------------------------------------------ consumer

def test_consumer_moves_its_fetches_to_a_new_leader_without_any_error():
    """Broker 1 keeps serving fetches after the leader moved to broker 2 (the fake never
    refuses one), so only an aged-metadata refresh can move the consumer: it does, and the
    records written afterwards are read from broker 2 in order, none twice."""
    async def main():
        async with two_brokers_one_log({"t": 1}) as (view, a, b):
            async with Producer(bootstrap=a.bootstrap, linger_ms=0) as producer:
                for i in range(3):
                    await producer.send_and_wait("t", b"a%d" % i)
            async with Consumer("t", bootstrap=a.bootstrap, from_beginning=True, fetch_max_wait_ms=10,
                                metadata_max_age_ms=20) as consumer:
                got = []
                while len(got) < 3:
                    got += await consumer.poll(timeout_ms=100)
                view.leaders[("t", 0)] = (2, 1)
                while not b.fetch_sizes:   # bounded by run()'s timeout
                    got += await consumer.poll(timeout_ms=50)
                a_fetches = len(a.fetch_sizes)
                async with Producer(bootstrap=b.bootstrap, linger_ms=0) as producer:
                    for i in range(3):
                        await producer.send_and_wait("t", b"b%d" % i)
                while len(got) < 6:
                    got += await consumer.poll(timeout_ms=100)
                assert consumer.position(TopicPartition("t", 0)) == 6
            assert [r.value for r in got] == [b"a0", b"a1", b"a2", b"b0", b"b1", b"b2"]
            assert [r.offset for r in got] == list(range(6))
            assert len(a.fetch_sizes) <= a_fetches + 1   # at most the fetch already out
    run(main())
