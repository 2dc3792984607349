"""The client SDK against real brokers and a controller (tests/cluster_harness.py: subprocesses
on loopback): per-key ordering, retries after lost acknowledgements, a leader killed while
producing and consuming, backpressure from a stopped (SIGSTOP) leader, and clear errors."""
from __future__ import annotations

import asyncio
import collections
import json
import time

import pytest

from cluster_harness import Cluster
from controller_harness import TOKEN
from common.errors import ErrorCode
from common.wire import ConnectionClosedError, ProduceRequest
from dataplane.client import (
    BufferFullTimeoutError,
    Consumer,
    Producer,
    TopicPartition,
    UnknownTopicError,
)
from dataplane.client.partitioner import key_partition

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with Cluster(tmp_path_factory.mktemp("sdk"), brokers=3) as c:
        yield c


def bootstrap(c: Cluster) -> str:
    return ",".join(f"127.0.0.1:{b.port}" for b in c.brokers.values() if b.alive())


def run(coro, timeout_s: float = 90):
    return asyncio.run(asyncio.wait_for(coro, timeout_s))


async def consume_all(c: Cluster, topic: str, count: int, timeout_s: float = 30) -> list:
    async with Consumer(topic, bootstrap=bootstrap(c), from_beginning=True) as consumer:
        got: list = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while len(got) < count and loop.time() < deadline:
            got += await consumer.poll(500)
        got += await consumer.poll(300)   # anything beyond `count` (duplicates) shows up too
        return got


def per_key_first_seen(records) -> dict[bytes, list[bytes]]:
    out: dict[bytes, list[bytes]] = collections.defaultdict(list)
    for r in sorted(records, key=lambda r: (r.partition, r.offset)):
        if r.value not in out[r.key]:
            out[r.key].append(r.value)
    return out


def test_records_of_one_key_stay_in_order_on_one_partition(cluster):
    cluster.create_topic("ordered", partitions=3, replication_factor=3)
    keys = [b"k%d" % i for i in range(6)]

    async def main():
        async with Producer(bootstrap=bootstrap(cluster), linger_ms=2, batch_size_bytes=2048) as producer:
            futures = [await producer.send("ordered", b"%s-%04d" % (k, i), key=k) for i in range(100) for k in keys]
            metas = await asyncio.gather(*futures)
        for meta, i in zip(metas, range(len(metas))):
            assert meta.partition == key_partition(keys[i % len(keys)], 3)
        return await consume_all(cluster, "ordered", 600)
    records = run(main())
    assert len(records) == 600
    for k, values in per_key_first_seen(records).items():
        assert values == [b"%s-%04d" % (k, i) for i in range(100)]
        assert {r.partition for r in records if r.key == k} == {key_partition(k, 3)}


def _drop_every_third_produce_answer(producer: Producer) -> list[int]:
    """After the broker has answered (so the batch is written), report a lost connection instead
    for every third PRODUCE request: the producer must resend with the same sequence."""
    network = producer._network
    real = network.request
    count = [0]

    async def lossy(broker, message, **kw):
        response = await real(broker, message, **kw)
        if isinstance(message, ProduceRequest):
            count[0] += 1
            if count[0] % 3 == 0:
                raise ConnectionClosedError("injected: answer lost after the write")
        return response
    network.request = lossy
    return count


async def _produce_with_lost_acks(cluster, topic: str, n: int) -> tuple[list, int]:
    async with Producer(bootstrap=bootstrap(cluster), linger_ms=1, batch_size_bytes=1024,
                        retry_backoff_ms=10) as producer:
        count = _drop_every_third_produce_answer(producer)
        futures = [await producer.send(topic, b"v%04d" % i, key=b"one-key") for i in range(n)]
        results = await asyncio.gather(*futures, return_exceptions=True)
        return results, producer.retries


def test_lost_acks_are_retried_without_loss_or_reordering(cluster):
    """Every record is acknowledged and present, in order of first appearance."""
    cluster.create_topic("lossy", partitions=1, replication_factor=3)
    results, retries = run(_produce_with_lost_acks(cluster, "lossy", 300))
    assert not [r for r in results if isinstance(r, BaseException)]
    assert retries > 0
    records = run(consume_all(cluster, "lossy", 300))
    assert per_key_first_seen(records)[b"one-key"] == [b"v%04d" % i for i in range(300)]


def test_lost_acks_do_not_duplicate(cluster):
    """Every 3rd produce answer is dropped after the write; the producer resends the same
    (producer id, epoch, sequence) and the leader answers with the original offset: each record
    is in the log once, in order, at the offset the producer was told."""
    cluster.create_topic("dedupe", partitions=1, replication_factor=3)
    results, _ = run(_produce_with_lost_acks(cluster, "dedupe", 300))
    records = run(consume_all(cluster, "dedupe", 300))
    assert [r.value for r in records] == [b"v%04d" % i for i in range(300)]
    assert [m.offset for m in results] == [r.offset for r in records]


def test_leader_kill_loses_no_acknowledged_record_and_consumer_follows(cluster):
    """kill -9 of partition 0's leader while a producer (acks=all) and a consumer run: every
    acknowledged record is read by the consumer, which moves to the new leader by itself."""
    cluster.create_topic("failover", partitions=2, replication_factor=3)
    victim = cluster.wait_leader("failover", 0)
    n = 600

    async def main():
        acked: list[bytes] = []
        seen: list = []
        new_leader: list[int] = []
        async with Consumer("failover", bootstrap=bootstrap(cluster), from_beginning=True) as consumer:
            async def consume():
                while len({r.value for r in seen}) < n:
                    seen.extend(await consumer.poll(300))

            reader = asyncio.get_running_loop().create_task(consume())
            async with Producer(bootstrap=bootstrap(cluster), linger_ms=2, retry_backoff_ms=50) as producer:
                futures = []
                for i in range(n):
                    futures.append(await producer.send("failover", b"r%04d" % i, key=b"k%d" % (i % 4)))
                    if i == n // 3:
                        await producer.flush()
                        await asyncio.to_thread(cluster.brokers[victim].kill)
                        new_leader.append(await asyncio.to_thread(cluster.wait_leader, "failover", 0,
                                                                  not_broker=victim))
                    if i % 20 == 0:
                        await asyncio.sleep(0.02)
                _, pending = await asyncio.wait(futures, timeout=60)
                if pending:
                    raise AssertionError(f"{n - len(pending)} of {n} sends settled in 60 s; "
                                         f"queues {producer._acc.partitions}; "
                                         f"metadata {producer._network.metadata.topics}")
                for i, future in enumerate(futures):
                    assert future.exception() is None, (i, future.exception())
                    acked.append(b"r%04d" % i)
            try:
                await asyncio.wait_for(reader, 60)
            except asyncio.TimeoutError:
                raise AssertionError(f"consumer saw {len({r.value for r in seen})} of {n} in 60 s; positions "
                                     f"{consumer._positions}, HW {consumer._high_watermarks}, metadata "
                                     f"{consumer._network.metadata.topics}") from None
        return acked, seen, new_leader
    try:
        acked, seen, new_leader = run(main(), 200)
    finally:
        cluster.restart(victim, kill=True)
    assert set(acked) <= {r.value for r in seen}
    assert new_leader and new_leader[0] != victim
    for k, values in per_key_first_seen(seen).items():
        assert values == sorted(values), k
    duplicates = len(seen) - len({r.value for r in seen})
    print(f"duplicates after the leader kill: {duplicates} (zero needs the broker's sequence checks)")


def test_records_held_by_a_paused_leader_go_to_its_successor_without_waiting_for_the_request_timeout(cluster):
    """SIGSTOP of a partition's leader while records are in flight to it. The controller fences
    it and elects another replica; the producer learns that from metadata while its request
    still waits (request_timeout_ms is 30 s), gives the attempt up and sends the same batch,
    with the same numbers, to the new leader. Every record is acknowledged long before the
    request timeout, and the log holds each once (the paused leader's copy, if any, is
    truncated when it returns)."""
    cluster.create_topic("held", partitions=1, replication_factor=3, config={"commit_policy": "quorum"})
    victim = cluster.wait_leader("held", 0)
    n = 20

    async def main():
        async with Producer(bootstrap=bootstrap(cluster), linger_ms=0, request_timeout_ms=30_000,
                            delivery_timeout_ms=60_000, retry_backoff_ms=50) as producer:
            await producer.send_and_wait("held", b"warm-up")
            cluster.brokers[victim].pause()
            paused_at = time.monotonic()
            try:
                futures = [await producer.send("held", b"h%02d" % i) for i in range(n)]
                done, pending = await asyncio.wait(futures, timeout=20)
                took_s = time.monotonic() - paused_at
                successor = cluster.partition("held", 0)["leader"]
            finally:
                cluster.brokers[victim].resume()
            assert not pending, f"{len(pending)} of {n} records not acknowledged 20 s after the pause"
            assert all(f.exception() is None for f in futures), [f.exception() for f in futures]
            assert producer._attempts.given_up >= 1   # the mechanism: an attempt given up, not timed out
            assert successor != victim
            print(f"acknowledged {took_s:.2f} s after SIGSTOP of broker {victim} (request timeout 30 s); "
                  f"{producer._attempts.given_up} attempt(s) given up; new leader {successor}")
            return [f.result().offset for f in futures]
    offsets = run(main(), 60)
    assert offsets == sorted(offsets) and len(set(offsets)) == n
    got = [r.value for r in run(consume_all(cluster, "held", n + 1))]
    assert got == [b"warm-up"] + [b"h%02d" % i for i in range(n)]


def test_backpressure_from_a_stopped_leader(cluster):
    """With the leader stopped (SIGSTOP), send() blocks once buffer memory is full and then fails
    with BufferFullTimeoutError naming the limits; after SIGCONT everything queued is delivered."""
    cluster.create_topic("slow", partitions=1, replication_factor=3)
    leader = cluster.wait_leader("slow", 0)

    async def main():
        async with Producer(bootstrap=bootstrap(cluster), buffer_memory_bytes=32 * 1024, max_block_ms=400,
                            linger_ms=0, batch_size_bytes=4096) as producer:
            await producer.send_and_wait("slow", b"warm-up")
            futures = []
            cluster.brokers[leader].pause()
            try:
                with pytest.raises(BufferFullTimeoutError, match="buffer_memory_bytes=32768"):
                    for i in range(1000):
                        futures.append(await producer.send("slow", b"x" * 1024))
            finally:
                cluster.brokers[leader].resume()
            assert 10 < len(futures) < 40   # the buffer held about 32 KiB
            results = await asyncio.gather(*futures, return_exceptions=True)
            assert not [r for r in results if isinstance(r, BaseException)]
    run(main())


def test_unknown_topic_and_bad_arguments(cluster):
    cluster.create_topic("small", partitions=2, replication_factor=1)

    async def main():
        async with Producer(bootstrap=bootstrap(cluster), unknown_topic_wait_ms=300) as producer:
            with pytest.raises(UnknownTopicError, match="'missing' does not exist") as err:
                await producer.send("missing", b"x")
            assert err.value.code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION and not err.value.retriable
            with pytest.raises(ValueError, match="partition 2 does not exist: topic 'small' has 2"):
                await producer.send("small", b"x", partition=2)
        async with Consumer(bootstrap=bootstrap(cluster), unknown_topic_wait_ms=300) as consumer:
            with pytest.raises(UnknownTopicError):
                await consumer.assign_topic("missing")
            await consumer.assign([TopicPartition("small", 1)])
            with pytest.raises(ValueError, match="offset"):
                await consumer.seek(("small", 1), -5)
            # One past Kafka's int64 could not be sent: the consumer waited there silently.
            for wrong in (2**63, 10**30, True, 1.0):
                with pytest.raises(ValueError, match="must be an integer from 0 to 9223372036854775807"):
                    await consumer.seek(("small", 1), wrong)
            with pytest.raises(ValueError, match="timestamp_ms"):
                await consumer.seek_to_time(2**63, ("small", 1))
            with pytest.raises(ValueError, match="timestamp 18446744073709551616 for .*small"):
                await consumer.offsets_for_times({("small", 1): 2**64})
            await consumer.seek(("small", 1), 2**63 - 1)   # the largest is allowed (past the end: reset)
    run(main())


def biplane(*argv: str, stdin: str | None = None, timeout_s: float = 60):
    import subprocess
    import sys
    return subprocess.run([sys.executable, "-m", "common.cli", *argv], input=stdin, capture_output=True, text=True,
                          timeout=timeout_s)


def test_cli_produce_and_consume(cluster):
    cluster.create_topic("cli", partitions=1, replication_factor=3)
    boot = bootstrap(cluster)
    r = biplane("produce", "cli", "--bootstrap", boot, "--key-separator", ":", "--acks", "1",
                stdin="a:first\nsecond\nb:third\n")
    assert r.returncode == 0 and "sent 3 record(s)" in r.stderr, r.stderr
    r = biplane("consume", "cli", "--bootstrap", boot, "--from-beginning", "--max-records", "3", "--format", "json")
    assert r.returncode == 0, r.stderr
    docs = [json.loads(line) for line in r.stdout.splitlines()]
    assert [(d["key"], d["value"]) for d in docs] == [("a", "first"), (None, "second"), ("b", "third")]
    r = biplane("consume", "cli", "--bootstrap", boot, "--offset", str(docs[1]["offset"]), "--max-records", "2")
    assert r.stdout.splitlines() == ["second", "third"]
    r = biplane("consume", "cli", "--bootstrap", boot, "--from-beginning", "--idle-timeout-ms", "500", "--print-key")
    assert r.returncode == 0 and r.stdout.splitlines() == ["a\tfirst", "None\tsecond", "b\tthird"]
    r = biplane("produce", "no-such-topic", "--bootstrap", boot, stdin="x\n")
    assert r.returncode == 1 and "'no-such-topic' does not exist" in r.stderr
    r = biplane("consume", "cli", "--bootstrap", boot, "--max-records", "0")
    assert r.returncode == 2 and "--max-records 0 must be at least 1" in r.stderr
    r = biplane("produce", "cli", "--bootstrap", "nohostport", stdin="x\n")
    assert r.returncode == 1 and "not HOST:PORT" in r.stderr


def test_bench_prints_rates_and_percentiles(cluster):
    r = biplane("bench", "--bootstrap", bootstrap(cluster), "--controller", cluster.api_url, "--token", TOKEN,
                "--topic", "benchsmall", "--records", "300", "--record-size", "100", "--json", timeout_s=120)
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert result["produce"]["records"] == 300 and result["produce"]["failed"] == 0
    assert result["consume"]["records"] == 300
    p = result["produce"]
    assert 0 < p["latency_ms_p50"] <= p["latency_ms_p99"] <= p["latency_ms_p999"] <= p["latency_ms_max"]
    assert p["latency_samples"] == 300 and p["client_cpu_us_per_record"] > 0


def test_seek_to_time_iteration_position_and_lag(cluster):
    cluster.create_topic("timed", partitions=1, replication_factor=3)
    tp = TopicPartition("timed", 0)
    # Later than the leader's own first batch (stamped now): a time lookup goes by the highest
    # timestamp so far, as Kafka's time index does.
    base = int(time.time() * 1000) + 3_600_000

    async def main():
        async with Producer(bootstrap=bootstrap(cluster)) as producer:
            for i in range(10):
                await producer.send_and_wait("timed", b"t%d" % i, partition=0, timestamp_ms=base + i * 1000)
        async with Consumer(bootstrap=bootstrap(cluster)) as consumer:
            await consumer.assign([tp])
            await consumer.seek_to_time(base + 6500, tp)
            got = []
            async for record in consumer:
                got.append(record)
                if len(got) == 3:
                    break
            assert [r.value for r in got] == [b"t7", b"t8", b"t9"]
            assert consumer.position(tp) == got[-1].offset + 1 and consumer.lag(tp) == 0
            await consumer.seek_to_beginning(tp)
            first = await consumer.poll(2000, max_records=1)
            assert first[0].value == b"t0" and consumer.lag(tp) == 9   # the leader's own batch is not a record
            await consumer.seek_to_time(base + 10 * 3_600_000, tp)   # later than every record: the end
            assert consumer.position(tp) == (await consumer.end_offsets([tp]))[tp]
    run(main())


def test_consumer_follows_a_preferred_leader_election(cluster):
    """Leadership moves (reassignment to a new replica order + preferred election) while a
    consumer reads: it finds the new leader by itself and reads on from the same position."""
    from dataplane.client.admin import AdminClient
    cluster.create_topic("moving", partitions=1, replication_factor=3)
    old = cluster.wait_leader("moving", 0)
    replicas = cluster.partition("moving", 0)["replicas"]
    target = [b for b in replicas if b != old] + [old]

    async def main():
        async with Producer(bootstrap=bootstrap(cluster), linger_ms=1) as producer, \
                Consumer("moving", bootstrap=bootstrap(cluster), from_beginning=True) as consumer:
            for i in range(50):
                await producer.send("moving", b"m%03d" % i)
            await producer.flush()
            got = []
            while len(got) < 50:
                got += await consumer.poll(1000)
            async with AdminClient(cluster.api_url, TOKEN) as admin:
                await admin.reassign("moving", 0, target)
                for _ in range(100):
                    elected = await admin.elect_preferred([("moving", 0)])
                    views = (await admin.partitions("moving")).partitions
                    leaders = [p.leader for p in views]
                    if leaders == [target[0]]:
                        break
                    await asyncio.sleep(0.1)
                assert leaders == [target[0]], elected
                elected_epoch = views[0].leader_epoch
            # Until the brokers apply the election, the old leader still leads epoch 0 and could
            # take and serve all 50 records below: nothing would make the consumer move.
            cluster.wait_leader("moving", 0, not_broker=old)
            cluster.wait_not_leading("moving", 0, old)
            for i in range(50, 100):
                await producer.send("moving", b"m%03d" % i)
            await producer.flush()
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 30
            while len(got) < 100 and loop.time() < deadline:
                got += await consumer.poll(500)
            # The consumer left the old leader's epoch for the elected one's (or a later one: on a
            # loaded machine a session may expire and move leadership again before the end).
            tp = TopicPartition("moving", 0)
            assert consumer._network.metadata.leader_epoch(tp) >= elected_epoch
            return got
    got = run(main())
    assert [r.value for r in got] == [b"m%03d" % i for i in range(100)]
