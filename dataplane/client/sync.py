"""Blocking wrappers: the asyncio clients run on a private event-loop thread.

    from dataplane.client.sync import Producer, Consumer
    with Producer() as producer:
        producer.send_and_wait("events", b"hello")
    with Consumer("events", from_beginning=True) as consumer:
        for record in consumer.poll(timeout_ms=2000): print(record.value)

`send()` here returns a concurrent.futures.Future of RecordMetadata.
"""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import functools
import threading
import time
from typing import Any, Coroutine, Iterator, TypeVar

from common import eventloop
from common.errors import BufferFullTimeoutError, ClientClosedError
from dataplane.client import consumer as _consumer
from dataplane.client import producer as _producer
from dataplane.client.records import ConsumerRecord, RecordMetadata, TopicPartition

T = TypeVar("T")


class _LoopThread:
    def __init__(self, name: str) -> None:
        # uvloop when installed (common.eventloop): a blocking send_and_wait pays the private
        # loop's wake-up and its socket events on the way out and back.
        factory = eventloop.loop_factory()
        self.loop = factory() if factory is not None else asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    @property
    def closed(self) -> bool:
        return self.loop.is_closed() or not self.loop.is_running()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        if self.closed:
            coro.close()   # never to run: no "never awaited" warning
            raise ClientClosedError(f"this {self._thread.name.removeprefix('biplane-')} is closed")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout_s)
        except BaseException:
            future.cancel()
            raise

    def stop(self, drain_s: float = 5.0) -> None:
        """Stop the loop's thread, first cancelling what still runs on it and letting it end:
        a close interrupted by Ctrl-C leaves the client's tasks pending, and a loop closed under
        them printed "Task was destroyed but it is pending!" and a traceback for each."""
        if self.loop.is_running():
            drained = asyncio.run_coroutine_threadsafe(_cancel_all(drain_s), self.loop)
            try:
                drained.result(drain_s + 1)
            except BaseException:   # a second Ctrl-C, or tasks that would not end: stop all the same
                pass
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)
        if not self.loop.is_running() and not self.loop.is_closed():
            self.loop.close()


async def _cancel_all(wait_s: float) -> None:
    me = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not me]
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=wait_s)


class RecordResult(concurrent.futures.Future):
    """The caller's future of one record. A batch's records share one error object; raising it
    from each record's result() restores its traceback first, so it does not grow each time."""

    _traceback = None

    def set_exception(self, exception: BaseException | None) -> None:
        self._traceback = exception.__traceback__ if exception is not None else None
        super().set_exception(exception)

    def result(self, timeout: float | None = None) -> Any:
        error = self.exception(timeout)   # waits, and raises CancelledError or TimeoutError as result() does
        if error is not None:
            raise error.with_traceback(self._traceback)
        return super().result(0)


def _settle(outer: concurrent.futures.Future, *, result: Any = None, error: BaseException | None = None) -> None:
    """Complete a caller's future unless the caller cancelled it meanwhile."""
    try:
        if error is not None:
            outer.set_exception(error)
        else:
            outer.set_result(result)
    except concurrent.futures.InvalidStateError:
        pass


class Producer:
    """Blocking producer; takes the same options as dataplane.client.producer.Producer.

    `send` hands records to the producer's event-loop thread through a queue: one wakeup
    of that thread takes every record queued since, so a sender in a tight loop pays no
    thread round trip per record. Records from one thread keep their order. The queue holds
    at most `handoff_records_max` records; beyond that, as when the producer's buffer is
    full, send() blocks (up to max_block_ms, then BufferFullTimeoutError).
    """

    handoff_records_max = 4096

    def __init__(self, **options: Any) -> None:
        self._loop = _LoopThread("biplane-producer")
        try:
            self._inner = self._loop.run(self._make(options))
        except BaseException:
            self._loop.stop()
            raise
        self._handoff: collections.deque = collections.deque()
        self._handoff_lock = threading.Lock()
        self._handoff_room = threading.Condition(self._handoff_lock)
        self._handed_off = 0          # records handed off and not yet in the producer (bounded)
        self._pumping = False         # a turn of the loop thread is scheduled or running to take the queue
        self._pump_task: asyncio.Task | None = None
        self._waiting: dict[Any, list] = {}   # batch outcome -> [(record future, caller's future)]

    @staticmethod
    async def _make(options: dict) -> _producer.Producer:
        return await _producer.Producer(**options).start()

    def send(self, topic: str, value: Any, key: Any = None, headers: Any = None,
             partition: int | None = None, timestamp_ms: int | None = None) -> concurrent.futures.Future:
        """Queue one record; returns a concurrent.futures.Future of its RecordMetadata. Errors
        found on the loop thread (a bad argument, an unknown topic) arrive through the future."""
        return self._hand_off(topic, value, key, headers, partition, timestamp_ms, False)

    def send_and_wait(self, topic: str, value: Any, key: Any = None, headers: Any = None,
                      partition: int | None = None, timestamp_ms: int | None = None) -> RecordMetadata:
        # Through the same queue as send(), so it never overtakes records sent before it.
        return self._hand_off(topic, value, key, headers, partition, timestamp_ms, True).result()

    def _hand_off(self, topic: str, value: Any, key: Any, headers: Any, partition: int | None,
                  timestamp_ms: int | None, expedite: bool) -> concurrent.futures.Future:
        self._inner._check_open()
        # The caller may reuse a mutable buffer as soon as send() returns: keep a snapshot.
        if isinstance(value, (bytearray, memoryview)):
            value = bytes(value)
        if isinstance(key, (bytearray, memoryview)):
            key = bytes(key)
        outer = RecordResult()
        item = (topic, value, key, headers, partition, timestamp_ms, expedite, outer)
        with self._handoff_lock:
            if self._handed_off >= self.handoff_records_max:
                deadline = time.monotonic() + self._inner.max_block_ms / 1000
                while self._handed_off >= self.handoff_records_max:
                    if not self._handoff_room.wait(deadline - time.monotonic()):
                        raise BufferFullTimeoutError(
                            f"send() waited max_block_ms={self._inner.max_block_ms} for the producer to take "
                            f"{self.handoff_records_max} queued records (buffer full: brokers slow or unreachable?)")
            self._handed_off += 1
            self._handoff.append(item)
            wake = not self._pumping
            self._pumping = True
        if wake:
            self._loop.loop.call_soon_threadsafe(self._pump)
        return outer

    def _take(self, done: int) -> tuple | None:
        """Count `done` records as in the producer (making room), then the next one to queue."""
        with self._handoff_lock:
            if done:
                self._handed_off -= done
                self._handoff_room.notify_all()
            if self._handoff:
                return self._handoff.popleft()
            self._pumping = False
            return None

    def _pump(self) -> None:
        """On the loop thread: queue every handed-off record that can go without waiting; the
        first that must wait (metadata, memory) continues in a task, keeping the order."""
        inner = self._inner
        done = 0
        while (item := self._take(done)) is not None:
            done = 1
            topic, value, key, headers, partition, timestamp_ms, expedite, outer = item
            try:
                future = inner._try_send(topic, value, key, headers, partition, timestamp_ms)
            except BaseException as exc:   # a bad argument or a closed producer: the caller hears of it
                _settle(outer, error=exc)
                continue
            if future is None:
                self._pump_task = self._loop.loop.create_task(self._pump_slowly(item))
                return
            self._link(future, outer, expedite)

    async def _pump_slowly(self, item: tuple | None) -> None:
        while item is not None:
            topic, value, key, headers, partition, timestamp_ms, expedite, outer = item
            try:
                future = await self._inner.send(topic, value, key=key, headers=headers, partition=partition,
                                                timestamp_ms=timestamp_ms)
            except BaseException as exc:
                _settle(outer, error=exc)
                if isinstance(exc, asyncio.CancelledError):
                    raise
            else:
                self._link(future, outer, expedite)
            item = self._take(1)

    def _link(self, future: Any, outer: concurrent.futures.Future, expedite: bool) -> None:
        # One callback per batch settles every caller's future in it.
        outcome = future._outcome
        waiting = self._waiting.get(outcome)
        if waiting is None:
            waiting = self._waiting[outcome] = []
            future.add_done_callback(functools.partial(self._settle_batch, outcome))
        waiting.append((future, outer))
        if expedite:
            self._inner._expedite(future)

    def _settle_batch(self, outcome: Any, _: Any) -> None:
        for future, outer in self._waiting.pop(outcome, ()):
            error = future.exception()
            if error is not None:
                _settle(outer, error=error)
            else:
                _settle(outer, result=future.result())

    async def _drained_handoff(self) -> None:
        while self._pumping and self._pump_task is not None and not self._pump_task.done():
            await asyncio.shield(self._pump_task)

    async def _flush(self) -> None:
        await self._drained_handoff()
        await self._inner.flush()

    async def _close(self, timeout_ms: int | None) -> None:
        await self._drained_handoff()
        await self._inner.close(timeout_ms)

    def flush(self) -> None:
        self._loop.run(self._flush())

    def close(self, timeout_ms: int | None = None) -> None:
        """Idempotent; other calls raise ClientClosedError after it."""
        if self._loop.closed:
            return
        try:
            self._loop.run(self._close(timeout_ms))
        finally:
            self._loop.stop()

    @property
    def producer_id(self) -> int:
        return self._inner.producer_id

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


class Consumer:
    """Blocking consumer; takes the same arguments as dataplane.client.consumer.Consumer."""

    def __init__(self, *topics: str, **options: Any) -> None:
        self._loop = _LoopThread("biplane-consumer")
        try:
            self._inner = self._loop.run(self._make(topics, options))
        except BaseException:
            self._loop.stop()
            raise

    @staticmethod
    async def _make(topics: tuple, options: dict) -> _consumer.Consumer:
        return await _consumer.Consumer(*topics, **options).start()

    def poll(self, timeout_ms: int = 1000, *, max_records: int | None = None) -> list[ConsumerRecord]:
        return self._loop.run(self._inner.poll(timeout_ms, max_records=max_records))

    def __iter__(self) -> Iterator[ConsumerRecord]:
        # In a group one record at a time, as the asyncio iterator: a record handed out counts
        # as processed, and no fetched record after it does.
        batch = 1 if self._inner.group_id is not None else 500
        while True:
            yield from self.poll(self._inner.fetch_max_wait_ms, max_records=batch)

    def subscribe(self, topics: Any, *, on_assign: Any = None, on_revoke: Any = None) -> None:
        """Join the consumer's group for `topics`; the callbacks run on the consumer's own thread,
        inside poll() and close()."""
        self._loop.run(self._inner.subscribe(topics, on_assign=on_assign, on_revoke=on_revoke))

    def commit(self, offsets: Any = None) -> None:
        self._loop.run(self._inner.commit(offsets))

    def committed(self, partitions: Any = None) -> dict[TopicPartition, int | None]:
        return self._loop.run(self._inner.committed(partitions))

    def offsets_for_times(self, timestamps: Any) -> dict[TopicPartition, int]:
        return self._loop.run(self._inner.offsets_for_times(timestamps))

    def assign(self, partitions: Any) -> None:
        self._loop.run(self._inner.assign(partitions))

    def assign_topic(self, topic: str) -> list[TopicPartition]:
        return self._loop.run(self._inner.assign_topic(topic))

    def assignment(self) -> set[TopicPartition]:
        return self._inner.assignment()

    def seek(self, tp: Any, offset: int) -> None:
        self._loop.run(self._inner.seek(tp, offset))

    def seek_to_beginning(self, *tps: Any) -> None:
        self._loop.run(self._inner.seek_to_beginning(*tps))

    def seek_to_end(self, *tps: Any) -> None:
        self._loop.run(self._inner.seek_to_end(*tps))

    def seek_to_time(self, timestamp_ms: int, *tps: Any) -> None:
        self._loop.run(self._inner.seek_to_time(timestamp_ms, *tps))

    def position(self, tp: Any) -> int | None:
        return self._inner.position(tp)

    def lag(self, tp: Any) -> int | None:
        return self._inner.lag(tp)

    def highwater(self, tp: Any) -> int | None:
        return self._inner.highwater(tp)

    def end_offsets(self, tps: Any) -> dict[TopicPartition, int]:
        return self._loop.run(self._inner.end_offsets(tps))

    def beginning_offsets(self, tps: Any) -> dict[TopicPartition, int]:
        return self._loop.run(self._inner.beginning_offsets(tps))

    def close(self) -> None:
        """Idempotent; other calls raise ClientClosedError after it."""
        if self._loop.closed:
            return
        try:
            self._loop.run(self._inner.close())
        finally:
            self._loop.stop()

    def __enter__(self) -> "Consumer":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


def __getattr__(name: str) -> Any:
    if name in ("Admin", "AdminClient"):
        from dataplane.client.admin import SyncAdminClient
        return SyncAdminClient
    raise AttributeError(name)
