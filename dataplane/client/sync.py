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
import concurrent.futures
import threading
from typing import Any, Coroutine, Iterator, TypeVar

from dataplane.client import consumer as _consumer
from dataplane.client import producer as _producer
from dataplane.client.records import ConsumerRecord, RecordMetadata, TopicPartition

T = TypeVar("T")


class _LoopThread:
    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout_s)
        except BaseException:
            future.cancel()
            raise

    def stop(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)
        if not self.loop.is_running() and not self.loop.is_closed():
            self.loop.close()


class Producer:
    """Blocking producer; takes the same options as dataplane.client.producer.Producer."""

    def __init__(self, **options: Any) -> None:
        self._loop = _LoopThread("biplane-producer")
        try:
            self._inner = self._loop.run(self._make(options))
        except BaseException:
            self._loop.stop()
            raise

    @staticmethod
    async def _make(options: dict) -> _producer.Producer:
        return await _producer.Producer(**options).start()

    def send(self, topic: str, value: Any, key: Any = None, headers: Any = None,
             partition: int | None = None, timestamp_ms: int | None = None) -> concurrent.futures.Future:
        async def queue() -> concurrent.futures.Future:
            inner = await self._inner.send(topic, value, key=key, headers=headers, partition=partition,
                                           timestamp_ms=timestamp_ms)
            outer: concurrent.futures.Future = concurrent.futures.Future()

            def copy(f: asyncio.Future) -> None:
                if f.cancelled():
                    outer.cancel()
                elif f.exception() is not None:
                    outer.set_exception(f.exception())
                else:
                    outer.set_result(f.result())
            inner.add_done_callback(copy)
            return outer
        return self._loop.run(queue())

    def send_and_wait(self, topic: str, value: Any, key: Any = None, headers: Any = None,
                      partition: int | None = None, timestamp_ms: int | None = None) -> RecordMetadata:
        return self._loop.run(self._inner.send_and_wait(topic, value, key=key, headers=headers,
                                                        partition=partition, timestamp_ms=timestamp_ms))

    def flush(self) -> None:
        self._loop.run(self._inner.flush())

    def close(self, timeout_ms: int | None = None) -> None:
        try:
            self._loop.run(self._inner.close(timeout_ms))
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
        while True:
            yield from self.poll(self._inner.fetch_max_wait_ms, max_records=500)

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

    def close(self) -> None:
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
