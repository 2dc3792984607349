"""The workload: idempotent acks=all producers (the real SDK) writing to every partition at a
fixed rate, tailing consumers, and the final read-back. Everything they observe becomes the
history's sends and seen lists. Bounded: a producer keeps at most `outstanding_max` records
without an outcome per partition, and a consumer remembers each (partition, offset) once.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any

from dataplane.client import ClientClosedError, Consumer, Producer, TopicPartition
from tests.chaos.history import Seen, Send, record_value, tp_key

OUTSTANDING_MAX = 400
READ_BACK_S_MAX = 120.0
CLOSE_S_MAX = 30.0
START_S_MAX = 60.0


def error_name(exc: BaseException) -> str:
    code = getattr(exc, "code", None)
    name = type(exc).__name__
    return f"{name}:{getattr(code, 'name', code)}" if code is not None else name


class ProducerSlot:
    """One logical producer of the workload: one SDK producer for the whole run. The SDK keeps a
    producer usable through every fault (failed requests are retried, records fail by their own
    delivery timeout), so one that stops (send() raises ClientClosedError) is a finding: it is
    not replaced (that would hide it); its death is noted once, with its cause, and every send
    it then refuses counts as a failed record."""

    def __init__(self, *, name: str, factory: Any) -> None:
        self.name = name
        self.label = name
        self.producer: Producer = factory(f"chaos-{name}")
        self.died_at_s: float | None = None

    async def start(self) -> None:
        await self.producer.start()

    def note_death(self, exc: BaseException, at_s: float) -> str | None:
        """The note for the first refused send after the producer stopped; None after that."""
        if self.died_at_s is not None:
            return None
        self.died_at_s = at_s
        cause = getattr(self.producer, "_fatal", None)
        return (f"SDK producer {self.name} stopped at {at_s:.1f} s (send() raised {error_name(exc)}: {exc}; "
                f"cause: {type(cause).__name__ if cause is not None else 'closed'}: {cause}); not replaced")


class Workload:
    def __init__(self, *, bootstrap: str, topics: list[str], partitions: int, producers: int, consumers: int,
                 interval_s: float, t0: float, request_timeout_ms: int, delivery_timeout_ms: int) -> None:
        self.bootstrap = bootstrap
        self.topics = topics
        self.partitions = partitions
        self.producer_names = [f"p{i}" for i in range(1, producers + 1)]
        self.consumer_count = consumers
        self.interval_s = interval_s
        self.t0 = t0
        self.request_timeout_ms = request_timeout_ms
        self.delivery_timeout_ms = delivery_timeout_ms
        self.sends: list[Send] = []
        self.seen: list[Seen] = []
        self._seen_keys: dict[tuple[str, int], str] = {}
        self._slots: list[ProducerSlot] = []
        self.producer_restarts: list[str] = []
        self._consumers: list[Consumer] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._stop_sending = asyncio.Event()
        self._stop_consuming = asyncio.Event()
        self._pending: set[asyncio.Future[Any]] = set()
        self.errors: list[str] = []   # workload-side exceptions (not record outcomes)

    def now(self) -> float:
        return time.monotonic() - self.t0

    async def start(self) -> None:
        for name in self.producer_names:
            slot = ProducerSlot(name=name, factory=self._new_producer)
            await slot.start()
            self._slots.append(slot)
            for topic in self.topics:
                for partition in range(self.partitions):
                    self._tasks.append(asyncio.create_task(self._produce(slot, topic, partition)))
        for i in range(self.consumer_count):
            mine = [t for j, t in enumerate(self.topics) if j % self.consumer_count == i]
            consumer = await self._assigned_consumer([TopicPartition(t, p) for t in mine
                                                      for p in range(self.partitions)])
            self._consumers.append(consumer)
            self._tasks.append(asyncio.create_task(self._consume(f"k{i + 1}", consumer)))

    async def _assigned_consumer(self, tps: list[TopicPartition]) -> Consumer:
        """A started consumer reading tps from their start; retried (bounded) while the
        cluster is slow to answer its first offset look-up."""
        deadline = time.monotonic() + START_S_MAX
        while True:
            consumer = Consumer(bootstrap=self.bootstrap, from_beginning=True, fetch_max_wait_ms=200,
                                request_timeout_ms=self.request_timeout_ms)
            try:
                await consumer.start()
                await consumer.assign(tps)
                return consumer
            except Exception as exc:  # noqa: BLE001 - retried, and noted
                self.errors.append(f"consumer start at {self.now():.1f} s: {error_name(exc)}: {exc}")
                await consumer.close()
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(1.0)

    def _new_producer(self, client_id: str) -> Producer:
        return Producer(bootstrap=self.bootstrap, acks="all", enable_idempotence=True, linger_ms=5,
                        request_timeout_ms=self.request_timeout_ms, delivery_timeout_ms=self.delivery_timeout_ms,
                        max_block_ms=5_000, client_id=client_id)

    async def _produce(self, slot: "ProducerSlot", topic: str, partition: int) -> None:
        """One partition's sends from one producer slot, numbered from 0."""
        tp = tp_key(topic, partition)
        outstanding: set[int] = set()
        seq = 0
        next_at = time.monotonic()
        while not self._stop_sending.is_set():
            if len(outstanding) >= OUTSTANDING_MAX:
                await asyncio.sleep(0.05)
                continue
            name = slot.label
            value = record_value(name, topic, partition, seq)
            sent_s = self.now()
            index = len(self.sends)
            self.sends.append(Send(producer=name, tp=tp, seq=seq, value=value, sent_s=sent_s, done_s=None,
                                   offset=None, error=None))
            outstanding.add(index)
            seq += 1
            producer = slot.producer
            try:
                future = await producer.send(topic, value, partition=partition)
            except Exception as exc:  # noqa: BLE001 - a refused send is an outcome of the record
                self._settle(index, None, exc)
                outstanding.discard(index)
                if isinstance(exc, ClientClosedError) and not self._stop_sending.is_set():
                    note = slot.note_death(exc, self.now())
                    if note:
                        self.producer_restarts.append(note)
            else:
                waiter = asyncio.ensure_future(self._await_record(index, future, outstanding, index))
                self._pending.add(waiter)
                waiter.add_done_callback(self._pending.discard)
            next_at += self.interval_s
            delay = next_at - time.monotonic()
            if delay > 0:
                try:
                    await asyncio.wait_for(self._stop_sending.wait(), delay)
                except asyncio.TimeoutError:
                    pass
            else:
                next_at = time.monotonic()

    async def _await_record(self, index: int, future: Any, outstanding: set[int], key: int) -> None:
        try:
            metadata = await future
        except Exception as exc:  # noqa: BLE001 - every failure is recorded by name
            self._settle(index, None, exc)
        else:
            self._settle(index, int(metadata.offset), None)
        finally:
            outstanding.discard(key)

    def _settle(self, index: int, offset: int | None, exc: BaseException | None) -> None:
        s = self.sends[index]
        self.sends[index] = Send(producer=s.producer, tp=s.tp, seq=s.seq, value=s.value, sent_s=s.sent_s,
                                 done_s=self.now(), offset=offset if exc is None else None,
                                 error=None if exc is None else error_name(exc))

    async def _consume(self, name: str, consumer: Consumer) -> None:
        while not self._stop_consuming.is_set():
            try:
                records = await consumer.poll(timeout_ms=300)
            except Exception as exc:  # noqa: BLE001 - keep tailing; note what happened
                self.errors.append(f"consumer {name}: {error_name(exc)}: {exc}")
                await asyncio.sleep(0.3)
                continue
            at = self.now()
            for r in records:
                key = (tp_key(r.topic, r.partition), r.offset)
                value = r.value.decode(errors="replace") if r.value is not None else "<null>"
                if self._seen_keys.get(key) == value:
                    continue
                self._seen_keys[key] = value
                self.seen.append(Seen(consumer=name, tp=key[0], offset=r.offset, value=value, at_s=at))

    async def stop_sending(self) -> None:
        """Stop new sends, then wait (bounded) for every outstanding record's outcome."""
        self._stop_sending.set()
        deadline = time.monotonic() + self.delivery_timeout_ms / 1000 + CLOSE_S_MAX
        while self._pending and time.monotonic() < deadline:
            await asyncio.wait(set(self._pending), timeout=max(0.1, deadline - time.monotonic()))
        for slot in self._slots:
            try:
                await asyncio.wait_for(slot.producer.close(timeout_ms=5_000), 10)
            except Exception as exc:  # noqa: BLE001
                self.errors.append(f"producer close: {error_name(exc)}: {exc}")

    async def stop_consuming(self) -> None:
        self._stop_consuming.set()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for consumer in self._consumers:
            try:
                await asyncio.wait_for(consumer.close(), 10)
            except Exception as exc:  # noqa: BLE001
                self.errors.append(f"consumer close: {error_name(exc)}: {exc}")


async def read_back(*, bootstrap: str, topics: list[str], partitions: int, request_timeout_ms: int
                    ) -> tuple[dict[str, list[tuple[int, str]]], dict[str, int], list[str], list[str]]:
    """Every partition from its start to its high watermark (asked once per partition, before
    reading it). A partition that cannot be read (no leader answers) is tried again until
    READ_BACK_S_MAX; then it is left out of the reads and named in the third list."""
    reads: dict[str, list[tuple[int, str]]] = {}
    hws: dict[str, int] = {}
    notes: list[str] = []
    pending = [TopicPartition(t, p) for t in topics for p in range(partitions)]
    deadline = time.monotonic() + READ_BACK_S_MAX
    attempt = 0
    while pending and time.monotonic() < deadline:
        attempt += 1
        for tp in list(pending):
            key = tp_key(tp.topic, tp.partition)
            try:
                reads[key], hws[key] = await _read_partition(bootstrap, tp, request_timeout_ms,
                                                             max(1.0, deadline - time.monotonic()))
                pending.remove(tp)
            except Exception as exc:  # noqa: BLE001 - tried again; noted
                if attempt <= 2 or not pending:
                    notes.append(f"read-back of {key}, attempt {attempt}: {error_name(exc)}: {exc}")
        if pending:
            await asyncio.sleep(2.0)
    unreadable = [tp_key(tp.topic, tp.partition) for tp in pending]
    if unreadable:
        notes.append(f"read-back: {unreadable} unreadable for {READ_BACK_S_MAX:.0f} s after the last heal")
    return reads, hws, unreadable, notes


async def _read_partition(bootstrap: str, tp: TopicPartition, request_timeout_ms: int,
                          time_s_max: float) -> tuple[list[tuple[int, str]], int]:
    consumer = Consumer(bootstrap=bootstrap, from_beginning=True, fetch_max_wait_ms=100,
                        request_timeout_ms=request_timeout_ms)
    try:
        await consumer.start()
        await consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = int((await consumer.end_offsets([tp]))[tp])
        by_offset: dict[int, str] = {}
        deadline = time.monotonic() + time_s_max
        while end > 0 and time.monotonic() < deadline:
            for r in await consumer.poll(timeout_ms=500):
                if r.offset < end:
                    by_offset[r.offset] = r.value.decode(errors="replace") if r.value is not None else "<null>"
            position = consumer.position(tp)
            if position is not None and position >= end:
                return sorted(by_offset.items()), end
        if end > 0:
            raise TimeoutError(f"read only to {consumer.position(tp)} of high watermark {end}")
        return [], end
    finally:
        await consumer.close()
