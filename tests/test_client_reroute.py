"""A produce request held by a leader that was replaced is given up and its batch retried as it
is on the new leader, long before the request timeout (dataplane/client/attempts.py): the rule
in isolation, then the producer against fake brokers (tests/fake_broker.py) sharing one log."""
from __future__ import annotations

import asyncio
import contextlib

import pytest

from common.wire import ConnectionClosedError, WireClient
from dataplane.client import Producer, TopicPartition
from dataplane.client.attempts import Attempts, deposed
from dataplane.client.network import Network
from fake_broker import two_brokers_one_log


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


# ------------------------------------------------------------------ the rule

def test_only_a_newer_epoch_on_another_live_broker_deposes_an_attempt():
    attempts: Attempts[str] = Attempts()
    a = attempts.start("b1", broker=1, leader_epoch=4, now_ms=0)
    assert deposed(a, leader_id=2, leader_epoch=5)
    assert not deposed(a, leader_id=1, leader_epoch=5)    # re-elected: it answers (or fences) itself
    assert not deposed(a, leader_id=2, leader_epoch=4)    # an older view of the cluster
    assert not deposed(a, leader_id=-1, leader_epoch=6)   # no leader yet: nowhere to retry


def test_a_given_up_attempt_is_forgotten_and_its_late_answer_is_not_news():
    attempts: Attempts[str] = Attempts()
    first = attempts.start("x", broker=1, leader_epoch=0, now_ms=0)
    attempts.start("y", broker=3, leader_epoch=0, now_ms=0)
    leaders = {"x": (2, 1), "y": (3, 0)}
    assert attempts.give_up_deposed(leaders.get) == ["x"]
    assert attempts.given_up == 1 and len(attempts) == 1
    again = attempts.start("x", broker=2, leader_epoch=1, now_ms=10)
    assert not attempts.finish("x", first)    # the old leader's answer: dropped
    assert attempts.finish("x", again)        # the retry's answer: the batch's news
    assert not attempts.finish("x", again)    # once


def test_metadata_is_probed_only_while_an_attempt_waits_long_and_not_more_often_than_the_interval():
    attempts: Attempts[str] = Attempts(probe_after_ms=1_000, probe_interval_ms=500)
    assert not attempts.probe_due(5_000) and attempts.next_probe_ms() is None
    attempts.start("x", broker=1, leader_epoch=0, now_ms=100)
    attempts.start("y", broker=2, leader_epoch=0, now_ms=900)
    assert attempts.next_probe_ms() == 1_100
    assert not attempts.probe_due(1_099)
    assert attempts.probe_due(1_100)
    assert attempts.slow_brokers(1_100) == {1}    # asked for metadata last
    attempts.probed(1_100)
    assert not attempts.probe_due(1_599) and attempts.next_probe_ms() == 1_600
    assert attempts.probe_due(1_600)
    attempts.finish("x", attempts.start("x", broker=1, leader_epoch=0, now_ms=1_600))
    assert attempts.next_probe_ms() == 1_900      # y is the oldest now


# ------------------------------------------------------------------ the producer

@contextlib.asynccontextmanager
async def two_brokers_one_log_and_a_producer():
    """(view, broker 1, broker 2, producer): fake_broker.two_brokers_one_log and a producer
    with a 30 s request timeout."""
    async with two_brokers_one_log({"t": 1}) as (view, a, b):
        async with Producer(bootstrap=a.bootstrap, linger_ms=0, retry_backoff_ms=5,
                            request_timeout_ms=30_000) as producer:
            yield view, a, b, producer


def test_a_batch_held_by_a_replaced_leader_is_retried_as_is_on_the_new_one_before_the_request_timeout():
    """Broker 1 appends "a0" and holds its answer (a leader cut from its followers waits for
    them); the controller moves the partition to broker 2. With a 30 s request timeout the
    producer used to wait 30 s. It now asks for metadata once the request has waited 1 s,
    gives the attempt up and sends the batch again, with the same sequence, to broker 2, which
    holds the same log and answers it as a duplicate with its original offset."""
    async def main():
        async with two_brokers_one_log_and_a_producer() as (view, a, b, producer):
            await producer.send_and_wait("t", b"warm-up")
            a.inject("t", 0, ("delay", 20.0))
            future = await producer.send("t", b"a0")
            await asyncio.sleep(0.2)
            assert a.sequences_seen[-1][2] == 1 and not future.done()
            view.leaders[("t", 0)] = (2, 1)
            meta = await asyncio.wait_for(future, 10)   # far below the 30 s request timeout
            assert meta.offset == 1
            assert producer._attempts.given_up == 1
            assert b.sequences_seen == [("t", 0, 1, 1)]   # the same numbers: not re-stamped
            later = await producer.send_and_wait("t", b"b0")
            assert a.partitions[("t", 0)].values() == [b"warm-up", b"a0", b"b0"]
            assert later.offset == 2
    run(main())


def test_the_old_leaders_late_answer_while_the_retry_waits_is_dropped():
    """Broker 1 answers "a0" after 2 s, while its retry on broker 2 is still waiting (broker 2
    holds it 2 s too). The late answer belongs to a given-up attempt: it must not be taken as
    the retry's (the core would then be told twice of one request and stop the producer)."""
    async def main():
        async with two_brokers_one_log_and_a_producer() as (view, a, b, producer):
            a.inject("t", 0, ("delay", 2.0))
            b.inject("t", 0, ("delay", 2.0))
            future = await producer.send("t", b"a0")
            await asyncio.sleep(0.2)
            view.leaders[("t", 0)] = (2, 1)
            meta = await asyncio.wait_for(future, 10)
            assert meta.offset == 0
            assert b.sequences_seen == [("t", 0, 0, 1)]
            # Broker 2 answers b0 after the retry (one connection answers in order).
            assert (await producer.send_and_wait("t", b"b0")).offset == 1
            assert producer._fatal is None
            assert a.partitions[("t", 0)].values() == [b"a0", b"b0"]
    run(main())


# ------------------------------------------------------------------ a refresh held by a silent broker

def test_a_refresh_asks_the_next_broker_when_one_does_not_answer_and_asks_that_one_last_next_time():
    """A broker cut off or stopped keeps its connection and never answers. The refresh used to
    wait on it for its request bound (5 s) before asking the next broker; it now asks the next
    one after METADATA_HEDGE_MS and takes the first answer."""
    async def main():
        async with two_brokers_one_log({"t": 1}) as (view, a, b):
            network = Network([("127.0.0.1", a.port)], request_timeout_ms=30_000)
            try:
                await network.refresh_metadata({"t"})
                assert sorted(network.metadata.brokers) == [1, 2]
                a.metadata_answering.clear()
                view.leaders[("t", 0)] = (2, 1)
                asked_a, asked_b = a.metadata_requests, b.metadata_requests
                await asyncio.wait_for(network.refresh_metadata(), 2.5)   # not the 5 s bound
                assert a.metadata_requests == asked_a + 1, "broker 1, first in the order, was not asked"
                assert b.metadata_requests == asked_b + 1
                assert network.metadata.leader(TopicPartition("t", 0)) == 2
                network._last_refresh = 0.0
                await asyncio.wait_for(network.refresh_metadata(), 2.5)
                assert a.metadata_requests == asked_a + 1, "the broker that did not answer was asked first again"
                assert b.metadata_requests == asked_b + 2
                # Silent with metadata comes before slow with produce (ask_last): a leader cut off
                # answers at once, from a stale view.
                asked: list = []
                request = network.request

                async def recording(broker, message, **kwargs):
                    asked.append(broker)
                    return await request(broker, message, **kwargs)

                network.request = recording
                network._last_refresh = 0.0
                await asyncio.wait_for(network.start_refresh(ask_last=frozenset({2})), 2.5)
                assert asked == [1, 2], f"asked {asked}: the slow broker came before the one that did not answer"
            finally:
                a.metadata_answering.set()
                await network.close()
    run(main())


def test_a_held_batch_moves_to_the_new_leader_though_a_refresh_was_waiting_on_the_old_one():
    """The chaos harness's `isolate` of a leader (seed 7): a refresh started just before the cut
    asked the leader first and waited on it; every probe for the held produce request joined
    that refresh, so the producer learnt of the new leader only when it timed out, and
    acknowledged 3.5 s after the cut. Now the refresh asks the next broker within 0.5 s."""
    async def main():
        async with two_brokers_one_log_and_a_producer() as (view, a, b, producer):
            await producer.send_and_wait("t", b"warm-up")
            a.inject("t", 0, ("delay", 20.0))
            a.metadata_answering.clear()
            try:
                future = await producer.send("t", b"a0")
                await asyncio.sleep(0.1)
                producer._network._last_refresh = 0.0
                producer._network.start_refresh()   # asks broker 1 first, as any refresh before the cut would
                view.leaders[("t", 0)] = (2, 1)
                meta = await asyncio.wait_for(future, 3.0)   # the refresh's own bound is 5 s
                assert meta.offset == 1
                assert producer._attempts.given_up == 1
                assert b.sequences_seen == [("t", 0, 1, 1)]
            finally:
                a.metadata_answering.set()
    run(main())


def test_a_probe_does_not_take_the_word_of_the_cut_off_leader_it_probes_about():
    """The fault harness's seed 7 (a leader partitioned with a controller at 74.0 s): the leader,
    cut off from its followers and the controller, held the produce requests and answered
    METADATA at once from what it knew at the cut, naming itself. The other brokers had been
    marked as having left a METADATA unanswered (a hedge, during earlier faults), so every probe
    asked the cut-off leader first and took its stale word: the batches waited for the request
    timeout although the controller had moved the partition 1.3 s after the cut. A probe now
    asks a broker slow with produce last of all."""
    async def main():
        async with two_brokers_one_log_and_a_producer() as (view, a, b, producer):
            await producer.send_and_wait("t", b"warm-up")
            producer._network._unanswered.add(2)   # left a METADATA unanswered once
            a.inject("t", 0, ("delay", 20.0))
            a.stale_leaders = {("t", 0): (1, 0)}
            future = await producer.send("t", b"a0")
            await asyncio.sleep(0.2)
            view.leaders[("t", 0)] = (2, 1)
            meta = await asyncio.wait_for(future, 5)   # probed after 1 s; the request timeout is 30 s
            assert meta.offset == 1
            assert producer._attempts.given_up == 1
            assert b.sequences_seen == [("t", 0, 1, 1)]
    run(main())


def test_a_cancelled_connect_fails_the_others_waiting_for_it_instead_of_leaving_them_waiting(monkeypatch):
    """A hedged metadata request that loses is cancelled, possibly while it connects; a produce
    request waiting for the same connection must hear of it, not wait forever."""
    async def main():
        hang = asyncio.Event()

        async def never_connects(*args, **kwargs):
            await hang.wait()

        monkeypatch.setattr(WireClient, "connect", never_connects)
        network = Network([("127.0.0.1", 1)])
        first = asyncio.ensure_future(network.client(("127.0.0.1", 1)))
        await asyncio.sleep(0.05)
        second = asyncio.ensure_future(network.client(("127.0.0.1", 1)))
        await asyncio.sleep(0.05)
        first.cancel()
        with pytest.raises(ConnectionClosedError, match="abandoned"):
            await asyncio.wait_for(second, 2)
    run(main())


def test_while_no_broker_answers_metadata_refreshes_for_a_leaderless_partition_are_paced():
    """Every broker refusing connections: each failed refresh woke the sender, which started
    another at once, so a producer with one record waiting ran hundreds of refresh tasks and
    half a core. Now one at a time, the next after retry_backoff_ms doubling to 1 s."""
    from common.errors import NoBrokersError

    async def main():
        async with two_brokers_one_log_and_a_producer() as (view, a, b, producer):
            await producer.send_and_wait("t", b"warm-up")
            calls: list[float] = []
            loop = asyncio.get_running_loop()

            async def refused(*args, **kwargs):
                calls.append(loop.time())
                raise NoBrokersError("no broker answered a metadata request: connection refused")
            real = producer._network.refresh_metadata
            producer._network.refresh_metadata = refused
            producer._network.metadata.forget_leader(TopicPartition("t", 0))
            await producer.send("t", b"waits")
            await asyncio.sleep(1.6)
            # 5 ms backoff here: 5, 10, 20, ... 640, 1000 ms apart: at most a dozen in 1.6 s.
            assert 3 <= len(calls) <= 12, len(calls)
            # Each gap at least its backoff, less the loop's timer slack (asyncio runs a timer up
            # to its clock resolution early): a busy machine only makes gaps longer, so the
            # bound holds there too; a refresh started at once, or no doubling, breaks it.
            gaps = [later - earlier for earlier, later in zip(calls, calls[1:])]
            floors = [min(0.005 * 2 ** i, 1.0) - 0.002 for i in range(len(gaps))]
            assert all(g >= floor for g, floor in zip(gaps, floors)), (gaps, floors)
            producer._network.refresh_metadata = real   # the brokers answer again: it is delivered
            await producer.flush()
    run(main())
