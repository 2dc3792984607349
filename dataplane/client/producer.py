"""The asyncio producer: `send()` queues a record and returns a future of its RecordMetadata.

    async with Producer() as producer:               # finds a `biplane up` cluster
        meta = await producer.send_and_wait("events", b"hello", key=b"user-1")

One sender task drains the accumulator (dataplane/client/accumulator.py: batching) into
PRODUCE requests per leader broker — one per group of partitions that share their fate (same
topic, replicas and ISR), each group on a produce connection ("lane") of its own, so a partition
that cannot complete holds up only its own group (dataplane/client/lanes.py) — and feeds
each partition's answer back to the producer core (dataplane/client/producer_core.py: the
protocol — numbers, retries, epochs, outcomes; this module only performs what it decides).
Retriable errors refresh metadata when they say it is stale, then the batch is resent with
the same numbers. The sender also
refreshes metadata once it is metadata_max_age_ms old, so partitions added to a topic,
new brokers and moved leaders are used without an error first pointing at them.

The per-record path is kept small because it is the producer's cost: `send()` encodes the
record into its partition's open batch at once (common.batch.BatchWriter) and returns a
RecordFuture that the batch's one answer resolves (dataplane/client/futures.py); nothing
else is made or scheduled per record. A caller that waits (send_and_wait, flush) drains
the ready batches itself, ignoring linger, instead of waking the sender task.
"""
from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Iterable, Mapping
from typing import Any, Sequence

from common.batch import NO_HEADERS, Compression, RecordHeaderError, encode_headers
from common.errors import (
    BiplaneError,
    BrokerResponseError,
    BufferFullTimeoutError,
    ClientClosedError,
    ClientError,
    ConnectFailedError,
    DeliveryTimeoutError,
    ErrorCode,
    NoBrokersError,
    OutcomeUnknownError,
    UnknownTopicError,
    error_for,
)
from common.tasks import TaskOwner, cancel_and_wait
from common.wire import (
    Acks,
    InitProducerIdRequest,
    ProducePartition,
    ProduceRequest,
    ProduceTopic,
)
from dataplane.client.accumulator import (
    RECORD_OVERHEAD_BYTES,
    Accumulator,
    ProducerBatch,
    record_size_bytes,
)
from dataplane.client.attempts import Attempt, Attempts
from dataplane.client.lanes import Lanes, fate_key
from dataplane.client.producer_core import Acknowledge, Fail, Outcome
from dataplane.client.network import Network, check_metadata_max_age_ms, parse_bootstrap
from dataplane.client.partitioner import StickyPartitioner
from dataplane.client.futures import RecordFuture
from dataplane.client.records import RecordMetadata, TopicPartition

log = logging.getLogger("biplane.client.producer")

# The `compression` setting, by Kafka's compression.type names.
COMPRESSION = {"none": Compression.NONE, "gzip": Compression.GZIP, "snappy": Compression.SNAPPY,
               "lz4": Compression.LZ4, "zstd": Compression.ZSTD}

_ACKS = {"0": Acks.NONE, "1": Acks.LEADER, "all": Acks.ALL, "-1": Acks.ALL}


def parse_acks(acks: int | str) -> Acks:
    key = str(acks).lower()
    if key not in _ACKS:
        raise ValueError(f"acks={acks!r} is not one of 0, 1, 'all'")
    return _ACKS[key]


_monotonic = time.monotonic
_wall_clock = time.time


def _now_ms() -> int:
    return int(_monotonic() * 1000)


_TIMESTAMP_MS_LIMIT = 1 << 62


def _as_bytes(name: str, data: Any) -> bytes | bytearray | memoryview | None:
    # bytearray and memoryview are copied into the batch at once, so they need no snapshot here.
    if data is None or isinstance(data, (bytes, bytearray, memoryview)):
        return data
    if isinstance(data, str):
        return data.encode()
    raise TypeError(f"{name} must be bytes, str or None, not {type(data).__name__}")


def _header_pairs(headers: Any) -> tuple[Any, ...]:
    """send()'s headers as (name, value) pairs: a sequence of pairs, or a mapping as
    confluent-kafka also takes them; encode_headers checks each pair."""
    if isinstance(headers, Mapping):
        return tuple(headers.items())
    if isinstance(headers, (str, bytes)) or not isinstance(headers, Iterable):
        raise RecordHeaderError(f"headers={headers!r} must be a list of (name, value) pairs or a dict")
    return tuple(headers)


class _Signal:
    """Wakes every coroutine waiting for the producer's state to change; each re-checks its own
    condition. (asyncio.Condition would take a lock per notification, one per batch answered.)"""

    def __init__(self) -> None:
        self._waiters: list[asyncio.Future] = []

    def notify(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def wait_for(self, predicate: Any, timeout_s: float | None = None) -> None:
        """Return once predicate() holds; TimeoutError after timeout_s (None: no limit)."""
        async with asyncio.timeout(timeout_s):
            while not predicate():
                waiter = asyncio.get_running_loop().create_future()
                self._waiters.append(waiter)
                await waiter


# The longest wait between metadata refreshes while partitions have no leader and no broker
# answers (Kafka's reconnect.backoff.max.ms is 1 s).
METADATA_RETRY_MAX_MS = 1000


def next_metadata_wait_ms(previous_ms: int, first_ms: int) -> int:
    """The wait before the next metadata request after one no broker answered: `first_ms`
    (retry_backoff_ms), then doubling to METADATA_RETRY_MAX_MS."""
    return min(previous_ms * 2 or first_ms, METADATA_RETRY_MAX_MS)


class Producer:
    """Options (keyword-only; times in ms, sizes in bytes):

    bootstrap: "HOST:PORT,..." (default: the cluster found by `biplane up`'s cluster.json);
    acks: 0, 1 or "all" (default "all"); enable_idempotence: default on with acks="all",
    off otherwise (it needs acks="all"); batch_size_bytes; linger_ms; buffer_memory_bytes and
    max_block_ms (send() waits that long for buffer space, then raises BufferFullTimeoutError);
    compression: "none", "gzip", "snappy", "lz4" or "zstd" (Kafka's compression.type; brokers
    keep batches compressed as sent and consumers decompress them); request_timeout_ms (a
    request to a leader the metadata shows replaced is not waited out: after 1 s the producer
    looks, and sends the batch, unchanged, to the new leader; dataplane/client/attempts.py);
    delivery_timeout_ms (a record's whole
    budget, retries included; a record sent but not acknowledged by then fails with
    OutcomeUnknownError, a DeliveryTimeoutError saying it may be in the log); retry_backoff_ms;
    in_flight_per_partition_max (default 5, at most 5 with idempotence, the batches a leader
    remembers per producer: leaders check idempotent sequences and refuse a batch whose
    predecessor is missing, so a retried batch is never overtaken; without idempotence it is
    always 1);
    produce_lanes_per_broker_max (default 8): connections per broker for produce requests.
    Partitions of one topic with the same replicas and ISR go in one request on one connection;
    other groups get their own, so an `isr` partition waiting out a lost follower, or one
    short of its quorum, does not hold up the acknowledgements of partitions that can
    complete (a broker answers a request when all its partitions are done, and a
    connection's requests in order). Past the bound, groups share connections; 1 gives one
    connection per broker, as Kafka's producer has.
    unknown_topic_wait_ms (how long send() waits for a topic the cluster does not know yet);
    metadata_max_age_ms (default 300000, Kafka's metadata.max.age.ms: cached metadata older
    than this is fetched again in the background although no error asked for it; the
    per-record path never looks at it).

    buffer_memory_bytes (default 32 MiB, Kafka's) bounds what is queued and in flight. When the
    brokers are the bottleneck the buffer stays full, and a record's send-to-ack latency is
    mostly its wait behind the buffer: about buffer_memory_bytes / throughput. Measured with
    `biplane bench` (1 KiB records, 1 MiB batches, acks=all, 3 brokers on 2 cores): 32 MiB gave
    129-145k records/s at p50 ~160 ms, p99 ~340 ms; 16 MiB the same throughput at p50 ~90 ms,
    p99 ~160 ms; 8 MiB p50 ~60 ms but up to a fifth less throughput. Lower it when latency
    under saturation matters more than the last few percent of throughput.
    """

    def __init__(self, *, bootstrap: str | Sequence[str] | None = None, acks: int | str = "all",
                 enable_idempotence: bool | None = None, batch_size_bytes: int = 1_048_576, linger_ms: int = 5,
                 buffer_memory_bytes: int = 32 * 1024 * 1024, max_block_ms: int = 60_000,
                 compression: str = "none", request_timeout_ms: int = 30_000,
                 delivery_timeout_ms: int = 120_000, retry_backoff_ms: int = 100,
                 in_flight_per_partition_max: int = 5, request_bytes_max: int = 4 * 1024 * 1024,
                 unknown_topic_wait_ms: int = 5_000, metadata_max_age_ms: int = 300_000,
                 produce_lanes_per_broker_max: int = 8, client_id: str = "biplane-producer") -> None:
        if bootstrap is None:
            from dataplane.client.discovery import default_bootstrap
            bootstrap = default_bootstrap()
        self.acks = parse_acks(acks)
        if enable_idempotence is None:
            enable_idempotence = self.acks == Acks.ALL
        if enable_idempotence and self.acks != Acks.ALL:
            raise ValueError(f"enable_idempotence=True needs acks='all' (got acks={acks!r}); "
                             "set acks='all' or enable_idempotence=False")
        codec = COMPRESSION.get(compression) if isinstance(compression, str) else None
        if codec is None:
            raise ValueError(f"compression={compression!r} is not one of {', '.join(map(repr, COMPRESSION))} "
                             "(Kafka's compression.type names)")
        for name, value in (("max_block_ms", max_block_ms), ("request_timeout_ms", request_timeout_ms),
                            ("unknown_topic_wait_ms", unknown_topic_wait_ms),
                            ("request_bytes_max", request_bytes_max)):
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"{name}={value!r} must be a non-negative integer")
        self.idempotent = bool(enable_idempotence)
        self.max_block_ms = max_block_ms
        self.request_timeout_ms = request_timeout_ms
        self.request_bytes_max = request_bytes_max
        self.unknown_topic_wait_ms = unknown_topic_wait_ms
        self.metadata_max_age_ms = check_metadata_max_age_ms(metadata_max_age_ms)
        self.client_id = client_id
        addresses = parse_bootstrap(bootstrap)
        self._network = Network(addresses, request_timeout_ms=request_timeout_ms,
                                metadata_max_age_ms=metadata_max_age_ms)
        self._topics_metadata = self._network.metadata.topics  # updated in place, never replaced
        self._partitioner = StickyPartitioner()
        self._acc = Accumulator(batch_size_bytes=batch_size_bytes, linger_ms=linger_ms,
                                buffer_memory_bytes=buffer_memory_bytes,
                                in_flight_per_partition_max=in_flight_per_partition_max if self.idempotent else 1,
                                retry_backoff_ms=retry_backoff_ms, delivery_timeout_ms=delivery_timeout_ms,
                                idempotent=self.idempotent,
                                compression=codec,
                                on_batch_closed=self._batch_closed)
        self._lanes = Lanes(produce_lanes_per_broker_max)
        self._attempts: Attempts[ProducerBatch] = Attempts()   # produce attempts awaiting an answer
        self._attempts_checked = -1   # the metadata version they were last checked against
        self._tps: dict[str, tuple[Any, list[TopicPartition]]] = {}
        self._flush_holds = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wakeup = asyncio.Event()   # binds to no loop until awaited
        self._changed = _Signal()   # memory freed, batches finished, the sender stopped
        self._sender: asyncio.Task | None = None
        self._tasks = TaskOwner()   # requests and refreshes the sender started
        # One metadata refresh for partitions without a leader at a time, and after one that
        # failed the next waits retry_backoff_ms (doubling to METADATA_RETRY_MAX_MS): with every
        # broker refusing connections at once, each failure woke the sender, which started
        # another (hundreds of tasks, half a core).
        self._leader_refresh: asyncio.Task[None] | None = None
        self._leader_refresh_due_ms = 0
        self._leader_refresh_backoff_ms = 0
        self._started = False
        self._closing = False
        self._closed = False
        self._fatal: BaseException | None = None
        self._refusing = False   # closing, closed or failed: send() raises (one check per record)
        self.records_sent = 0
        self.retries = 0

    @property
    def producer_id(self) -> int:
        return self._acc.core.producer_id

    @property
    def producer_epoch(self) -> int:
        return self._acc.core.producer_epoch

    @property
    def batch_size_bytes(self) -> int:
        return self._acc.batch_size_bytes

    @property
    def linger_ms(self) -> int:
        return self._acc.linger_ms

    @property
    def buffer_memory_bytes(self) -> int:
        return self._acc.buffer_memory_bytes

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> "Producer":
        """Start the sender. With idempotence it asks for a producer id at once, and start()
        waits (at most max_block_ms) for that first request to end, without failing: if it
        failed, the sender keeps asking after retry_backoff_ms while records wait, each bounded
        by its delivery_timeout_ms."""
        if self._started:
            return self
        self._loop = asyncio.get_running_loop()
        self._started = True
        self._sender = asyncio.get_running_loop().create_task(self._run_sender())
        if self.idempotent:
            core = self._acc.core
            try:
                await self._changed.wait_for(lambda: not core.producer_id_wanted or core.id_requests_failed > 0
                                             or self._fatal is not None, self.max_block_ms / 1000)
            except TimeoutError:
                pass
        return self

    async def __aenter__(self) -> "Producer":
        return await self.start()

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()

    def _maybe_request_producer_id(self, now_ms: int) -> None:
        """Send InitProducerId when the core says it is due (it owns when, and the backoff)."""
        core = self._acc.core
        if core.id_request_due(now_ms):
            core.id_request_sent(now_ms)
            self._tasks.spawn(self._request_producer_id())

    async def _request_producer_id(self) -> None:
        """One InitProducerId request to one broker (the next known one each time); its end goes
        to the core: an identity, or a failure the core retries after its backoff."""
        request = InitProducerIdRequest(producer_id=-1, producer_epoch=-1, transaction_timeout_ms=60_000)
        error, reason = ErrorCode.NONE, ""
        response: Any = None
        try:
            if not self._network.metadata.brokers:
                await self._network.refresh_metadata()
            brokers = sorted(self._network.metadata.brokers)
            if not brokers:
                raise NoBrokersError("the metadata names no broker")
            broker = brokers[self._acc.core.id_requests_failed % len(brokers)]
            response = await self._network.request(broker, request)
            error = response.error_code
            reason = f"broker {broker}"
        except BiplaneError as exc:   # no answer: retriable, whatever the cause
            error = exc.code if exc.code.retriable else ErrorCode.NETWORK_EXCEPTION
            reason = f"no broker answered InitProducerIdRequest: {exc}"
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # unexpected: still ends the request, or no id would ever be asked for again
            log.exception("InitProducerId request failed unexpectedly")
            error, reason = ErrorCode.NETWORK_EXCEPTION, f"{type(exc).__name__}: {exc}"
        now = _now_ms()
        if error == ErrorCode.NONE:
            self._acc.core.set_producer_id(producer_id=response.producer_id, producer_epoch=response.producer_epoch)
            log.debug("producer id %d epoch %d", response.producer_id, response.producer_epoch)
        else:
            log.log(logging.DEBUG if error.retriable else logging.WARNING,
                    "could not get a producer id (%s, %s); retry_backoff_ms=%d", error.name, reason,
                    self._acc.core.retry_backoff_ms)
            for outcome in self._acc.producer_id_failed(error=error, now_ms=now, reason=reason):
                self._settle(outcome, None)
            if self._acc.core.fatal_error is not None:
                self._stop(ClientError(f"could not get a producer id: {error.name} ({reason})", code=error))
                if self._sender is not None:
                    self._sender.cancel()
        self._changed.notify()
        self._wakeup.set()

    async def flush(self) -> None:
        """Send everything queued now (ignoring linger) and wait until each record is acknowledged or failed."""
        self._check_open()
        await self.start()
        self._hold_flushing(1)
        try:
            self._drain_now()
            await self._changed.wait_for(lambda: self._acc.pending_batches() == 0 or self._fatal is not None)
        finally:
            self._hold_flushing(-1)

    def _hold_flushing(self, step: int) -> None:
        # While anyone waits in flush() or send_and_wait(), queued batches leave without lingering.
        self._flush_holds += step
        self._acc.flushing = self._flush_holds > 0

    async def close(self, timeout_ms: int | None = None) -> None:
        """Send what is queued (waiting up to timeout_ms, default delivery_timeout_ms), then close. Idempotent."""
        if self._closed:
            return
        self._closing = True
        self._refusing = True
        if self._started and self._sender is not None:
            self._acc.flushing = True
            self._wakeup.set()
            try:
                await self._changed.wait_for(lambda: self._acc.pending_batches() == 0 or self._fatal is not None,
                                             (timeout_ms if timeout_ms is not None
                                              else self._acc.delivery_timeout_ms) / 1000)
            except TimeoutError:
                pass
            await cancel_and_wait(self._sender, *self._tasks)
            closed = ClientClosedError("the producer was closed before this record was acknowledged; "
                                       "if it had been sent, it may be in the log")
            for batch in self._acc.fail_all():
                self._fail_batch(batch, closed)
        self._closed = True
        await self._network.close()

    def _check_open(self) -> None:
        if self._closing or self._closed:
            raise ClientClosedError("the producer is closed; create a new one")
        if self._fatal is not None:
            raise ClientClosedError(f"the producer stopped after a fatal error: {self._fatal}")

    # ------------------------------------------------------------ sending

    async def send(self, topic: str, value: bytes | str | None, key: bytes | str | None = None,
                   headers: Sequence[tuple[str, bytes | str | None]] | None = None,
                   partition: int | None = None, timestamp_ms: int | None = None) -> RecordFuture:
        """Queue one record; returns (once queued) a future resolving to RecordMetadata(topic, partition, offset).

        The record is encoded into its batch here; the future is an asyncio future-like
        (see dataplane/client/futures.py) resolved together with the rest of its batch."""
        if not self._started:
            self._check_open()
            await self.start()
        future = self._try_send(topic, value, key, headers, partition, timestamp_ms)
        if future is not None:
            return future
        deadline = time.monotonic() + self.max_block_ms / 1000
        while future is None:
            await self._wait_to_send(topic, value, key, headers, deadline)
            future = self._try_send(topic, value, key, headers, partition, timestamp_ms)
        return future

    def _try_send(self, topic: str, value: Any, key: Any, headers: Any, partition: int | None,
                  timestamp_ms: int | None) -> RecordFuture | None:
        """send() without waiting: the record's future, or None when send() would have to wait
        (for the topic's metadata or for buffer memory). Bad arguments raise here.

        This runs once per record, so the common case is checked first and cheaply: a topic
        seen before is in `_tps` only if it was valid, and bytes need no conversion."""
        if self._refusing:
            self._check_open()
        if value is not None and type(value) is not bytes:
            value = _as_bytes("value", value)
        if key is not None and type(key) is not bytes:
            key = _as_bytes("key", key)
        header_bytes = NO_HEADERS if not headers else encode_headers(_header_pairs(headers))
        if timestamp_ms is None:
            timestamp_ms = int(_wall_clock() * 1000)
        elif type(timestamp_ms) is not int or not -1 <= timestamp_ms < _TIMESTAMP_MS_LIMIT:
            raise ValueError(f"timestamp_ms must be an integer in [-1, {_TIMESTAMP_MS_LIMIT}), not {timestamp_ms!r}")
        # The topic's partitions, rebuilt only when a metadata answer replaced the topic's entry.
        cached = self._tps.get(topic) if type(topic) is str else None
        if cached is not None and cached[0] is self._topics_metadata.get(topic):
            tps = cached[1]
        else:
            if type(topic) is not str or not topic:
                raise ValueError(f"topic must be a non-empty string, not {topic!r}")
            parts = self._topics_metadata.get(topic)
            if not parts:
                return None
            tps = [TopicPartition(topic, p) for p in range(len(parts))]
            self._tps[topic] = (parts, tps)
        if partition is None:
            tp = tps[self._partitioner.partition(topic, key, len(tps))]
        elif type(partition) is not int or partition < 0:
            raise ValueError(f"partition must be a non-negative integer or None, not {partition!r}")
        elif partition >= len(tps):
            raise ValueError(f"partition {partition} does not exist: topic {topic!r} has {len(tps)} "
                             f"partition(s), 0..{len(tps) - 1}")
        else:
            tp = tps[partition]
        acc = self._acc
        used = acc.buffer_used_bytes
        if used and (used + RECORD_OVERHEAD_BYTES + len(header_bytes) + (len(value) if value is not None else 0)
                     + (len(key) if key is not None else 0)) > acc.buffer_memory_bytes:
            return None   # the bound record_size_bytes() gives, inline
        batch, index = acc.append(tp, value, key, header_bytes, timestamp_ms, now_ms=int(_monotonic() * 1000))
        if index == 0:
            batch.outcome.loop = self._loop
            self._wakeup.set()  # a new batch: the sender recomputes its linger deadline (the last one may be full)
        elif acc.linger_ms == 0:
            self._wakeup.set()
        return RecordFuture(batch.outcome, index)

    async def _wait_to_send(self, topic: str, value: Any, key: Any, headers: Any, deadline: float) -> None:
        """Wait for what _try_send lacked: the topic's partitions, then buffer memory."""
        if self._network.metadata.partition_count(topic) is None:
            await self._partition_count(topic, deadline)
        value_b, key_b = _as_bytes("value", value), _as_bytes("key", key)
        size = record_size_bytes(value_b, key_b, encode_headers(_header_pairs(headers)) if headers else NO_HEADERS)
        if not self._acc.has_memory_for(size):
            await self._wait_for_memory(size, deadline)

    async def send_and_wait(self, topic: str, value: bytes | str | None, key: bytes | str | None = None,
                            headers: Sequence[tuple[str, bytes | str | None]] | None = None,
                            partition: int | None = None, timestamp_ms: int | None = None) -> RecordMetadata:
        future = await self.send(topic, value, key=key, headers=headers, partition=partition,
                                 timestamp_ms=timestamp_ms)
        self._hold_flushing(1)  # nobody else will fill this batch while we wait: no point lingering
        try:
            self._drain_now()
            return await future
        finally:
            self._hold_flushing(-1)

    def _expedite(self, future: RecordFuture) -> None:
        """Someone waits for this record now: no lingering until it is answered."""
        self._hold_flushing(1)
        future.add_done_callback(lambda _: self._hold_flushing(-1))
        self._drain_now()

    def _drain_now(self) -> None:
        """Send what is ready at once, from the caller's turn of the loop, rather than a turn
        later from the sender task (a synchronous send pays no extra hop)."""
        acc = self._acc
        if self._sender is not None and self._fatal is None and not acc.core.producer_id_wanted:
            drained = acc.drain(_now_ms(), self._network.metadata.leader, request_bytes_max=self.request_bytes_max,
                                closing=self._closing)
            self._send_drained(drained)
        self._wakeup.set()   # the sender recomputes its deadlines (and handles what could not go)

    async def _partition_count(self, topic: str, deadline: float) -> int:
        meta = self._network.metadata
        count = meta.partition_count(topic)
        if count is not None:
            return count
        self._network.want_topic(topic)
        topic_deadline = min(deadline, time.monotonic() + self.unknown_topic_wait_ms / 1000)
        pause_ms = 0
        while True:
            try:
                await self._network.refresh_metadata({topic})
            except NoBrokersError as exc:
                # No broker answers (a cluster starting or restarting): wait for one up to
                # max_block_ms, as Kafka's producer waits for metadata, rather than fail at once.
                if time.monotonic() >= deadline:
                    raise NoBrokersError(f"{exc} (send() waited max_block_ms={self.max_block_ms} for the "
                                         f"metadata of topic {topic!r})") from None
                pause_ms = next_metadata_wait_ms(pause_ms, self._acc.core.retry_backoff_ms)
                await asyncio.sleep(min(pause_ms / 1000, max(0.0, deadline - time.monotonic())))
                topic_deadline = max(topic_deadline, min(deadline, time.monotonic() + self.unknown_topic_wait_ms / 1000))
                continue
            count = meta.partition_count(topic)
            if count is not None:
                return count
            if time.monotonic() >= topic_deadline:
                if topic in meta.unknown_topics:
                    raise UnknownTopicError(f"topic {topic!r} does not exist (waited "
                                            f"{self.unknown_topic_wait_ms} ms); create it first: "
                                            f"`biplane topic create {topic} --partitions N`")
                error = meta.topic_errors.get(topic, ErrorCode.LEADER_NOT_AVAILABLE)
                raise ClientError(f"no metadata for topic {topic!r} after waiting: {error.name}", code=error)
            await asyncio.sleep(0.1)

    async def _wait_for_memory(self, size: int, deadline: float) -> None:
        try:
            await self._changed.wait_for(
                lambda: self._acc.has_memory_for(size) or self._fatal is not None or self._closing,
                max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            raise BufferFullTimeoutError(
                f"send() waited max_block_ms={self.max_block_ms} for {size} bytes of buffer memory: "
                f"{self._acc.buffer_used_bytes} of buffer_memory_bytes={self._acc.buffer_memory_bytes} are "
                "held by records not yet acknowledged (brokers slow or unreachable?); raise "
                "buffer_memory_bytes or max_block_ms, or send more slowly") from None
        self._check_open()

    def _batch_closed(self, tp: TopicPartition) -> None:
        count = self._network.metadata.partition_count(tp.topic)
        if count:
            self._partitioner.batch_sent(tp.topic, tp.partition, count)

    # ------------------------------------------------------------ the sender

    async def _run_sender(self) -> None:
        try:
            while True:
                now = _now_ms()
                for outcome in self._acc.expire(now):
                    self._settle(outcome, None)
                self._maybe_request_producer_id(now)
                self._reroute_deposed(now)
                drained = self._acc.drain(now, self._network.metadata.leader,
                                          request_bytes_max=self.request_bytes_max, closing=self._closing)
                self._send_drained(drained)
                self._changed.notify()
                if self._needs_metadata():
                    if (self._leader_refresh is None or self._leader_refresh.done()) \
                            and now >= self._leader_refresh_due_ms:
                        self._leader_refresh = self._tasks.spawn(self._refresh_for_leaders())
                elif now >= self._network.metadata_refresh_due_ms():
                    self._network.start_refresh().add_done_callback(self._aged_refresh_done)
                next_ms = self._acc.next_ready_ms(now)
                timeout = None if next_ms is None else max(0.0, (next_ms - now) / 1000)
                if self._needs_metadata():
                    wait_s = max(0.1, (self._leader_refresh_due_ms - now) / 1000)
                    timeout = wait_s if timeout is None else min(timeout, wait_s)
                else:
                    # Wake when the metadata turns too old even if nothing is sent meanwhile.
                    due_s = (self._network.metadata_refresh_due_ms() - now) / 1000
                    if due_s < math.inf:
                        timeout = max(0.0, due_s) if timeout is None else max(0.0, min(timeout, due_s))
                probe_ms = self._attempts.next_probe_ms()
                if probe_ms is not None:
                    probe_s = max(0.0, (probe_ms - now) / 1000)
                    timeout = probe_s if timeout is None else min(timeout, probe_s)
                self._wakeup.clear()
                if drained:
                    continue
                try:
                    async with asyncio.timeout(timeout):   # no extra task, unlike wait_for
                        await self._wakeup.wait()
                except TimeoutError:
                    pass
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # a bug: every waiter must hear of it
            log.exception("producer sender stopped")
            self._stop(exc)

    def _stop(self, exc: BaseException) -> None:
        """The producer cannot go on (a bug, or a fatal InitProducerId answer): send() refuses
        from now on and every queued record fails."""
        self._fatal = exc
        self._refusing = True
        for batch in self._acc.fail_queued():
            self._fail_batch(batch, ClientClosedError(f"producer stopped: {exc}"))
        self._changed.notify()

    def _needs_metadata(self) -> bool:
        meta = self._network.metadata
        return any(state.queue and meta.leader(tp) is None for tp, state in self._acc.partitions.items()) \
            or any(self._acc.core.outstanding(tp) and meta.leader(tp) is None  # type: ignore[arg-type]
                   for tp in self._acc.core.partitions)

    def _reroute_deposed(self, now: int) -> None:
        """Give up attempts whose leader was replaced (dataplane/client/attempts.py): the core
        retries each batch as it is, on the new leader. Ask for metadata when one waits long."""
        attempts = self._attempts
        if not attempts:
            return
        meta = self._network.metadata
        if meta.version != self._attempts_checked:
            self._attempts_checked = meta.version

            def leader_of(batch: ProducerBatch) -> tuple[int, int] | None:
                info = meta.partition(batch.tp)
                return None if info is None else (info.leader_id, info.leader_epoch)

            for batch in attempts.give_up_deposed(leader_of):
                info = meta.partition(batch.tp)
                assert info is not None
                reason = (f"leadership of {batch.tp} moved to broker {info.leader_id} (leader epoch "
                          f"{info.leader_epoch}) while the request waited; retried there as it is")
                log.debug("%s", reason)
                self.retries += 1
                for outcome in self._acc.no_answer(batch, now_ms=now, reason=reason):
                    self._settle(outcome, reason)
        if attempts.probe_due(now):
            attempts.probed(now)
            self._network.start_refresh(ask_last=frozenset(attempts.slow_brokers(now))).add_done_callback(
                self._aged_refresh_done)

    def _aged_refresh_done(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.debug("periodic metadata refresh failed: %s", task.exception())
        self._wakeup.set()   # the sender drains with the new leaders and sets its next deadline

    async def _refresh_quietly(self) -> None:
        try:
            await self._network.refresh_metadata()
        except BiplaneError as exc:
            log.debug("metadata refresh failed: %s", exc)
        self._wakeup.set()

    async def _refresh_for_leaders(self) -> None:
        """The sender's refresh for partitions without a leader, paced (see __init__)."""
        try:
            await self._network.refresh_metadata()
            self._leader_refresh_backoff_ms = 0
        except BiplaneError as exc:
            log.debug("metadata refresh failed: %s", exc)
            self._leader_refresh_backoff_ms = next_metadata_wait_ms(self._leader_refresh_backoff_ms,
                                                                    self._acc.core.retry_backoff_ms)
        self._leader_refresh_due_ms = _now_ms() + self._leader_refresh_backoff_ms
        self._wakeup.set()

    def _send_drained(self, drained: dict[int, list[ProducerBatch]]) -> None:
        """One request per broker and lane (dataplane/client/lanes.py)."""
        meta, core = self._network.metadata, self._acc.core

        def key_of(tp: TopicPartition) -> Any:
            info = meta.partition(tp)
            return fate_key(tp, info.replicas, info.isr) if info is not None else fate_key(tp, (), ())

        def others_in_flight(tp: TopicPartition) -> bool:
            return core.in_flight(tp) > 1   # the batch drained now counts already

        now = _now_ms()
        for broker, batches in drained.items():
            for lane, lane_batches in self._lanes.split(broker, batches, key_of, others_in_flight).items():
                # Registered here, not in the task: the sender's next wake-up counts them.
                attempts = [None if self.acks == Acks.NONE else
                            self._attempts.start(b, broker=broker, leader_epoch=meta.leader_epoch(b.tp), now_ms=now)
                            for b in lane_batches]
                self._tasks.spawn(self._stop_on_bug(self._send_batches(broker, lane_batches, attempts, lane)))

    async def _stop_on_bug(self, work: Any) -> None:
        """Run a request's task; an exception it was not written for stops the producer, loudly,
        rather than ending the task unseen with its batches never answered."""
        try:
            await work
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            log.exception("producer request handling failed")
            self._stop(exc)

    async def _send_batches(self, broker: int, batches: list[ProducerBatch], attempts: list[Attempt | None],
                            lane: int = 0) -> None:
        purpose = "produce" if lane == 0 else f"produce-{lane}"
        meta = self._network.metadata
        by_topic: dict[str, list[ProducePartition]] = {}
        for batch in batches:
            by_topic.setdefault(batch.tp.topic, []).append(ProducePartition(
                partition=batch.tp.partition, current_leader_epoch=meta.leader_epoch(batch.tp),
                records=batch.payload))
        request = ProduceRequest(acks=int(self.acks), timeout_ms=self.request_timeout_ms,
                                 topics=tuple(ProduceTopic(topic=t, partitions=tuple(ps)) for t, ps in by_topic.items()))
        answers: dict[TopicPartition, tuple[ErrorCode, int, str | None]] = {}
        unanswered: str | None = None
        sent = True
        try:
            if self.acks == Acks.NONE:
                await self._network.send_only(broker, request, purpose=purpose)
                answers = {b.tp: (ErrorCode.NONE, -1, None) for b in batches}
            else:
                response = await self._network.request(broker, request, purpose=purpose,
                                                       timeout_ms=self.request_timeout_ms + 1_000)
                for topic in response.topics:
                    for p in topic.partitions:
                        tp = TopicPartition(topic.topic, p.partition)
                        answers[tp] = (p.error_code, p.base_offset, p.error_message)
                        if p.current_leader.leader_id >= 0:
                            meta.note_leader(tp, p.current_leader.leader_id, p.current_leader.leader_epoch)
        except ConnectFailedError as exc:
            # No connection: this attempt wrote nothing (the caller hears "not sent" unless an
            # earlier attempt went unanswered).
            unanswered, sent = f"{exc.code.name}: {exc}", False
        except BiplaneError as exc:
            # Sent or not, answered or not: we cannot tell, so the batches may be in the log.
            unanswered = f"{exc.code.name}: {exc}"
        except asyncio.CancelledError:
            raise
        stale = unanswered is not None
        now = _now_ms()
        for batch, attempt in zip(batches, attempts):
            if attempt is not None and not self._attempts.finish(batch, attempt):
                continue   # given up when its leader was replaced: this is the old leader's late news
            if unanswered is not None:
                outcomes = self._acc.no_answer(batch, now_ms=now, reason=unanswered, sent=sent)
                message: str | None = unanswered
                if meta.leader(batch.tp) == broker:
                    meta.forget_leader(batch.tp)
            else:
                code, base_offset, message = answers.get(
                    batch.tp, (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1,
                               "the broker's answer left this partition out"))
                outcomes = self._acc.complete(batch, error_code=code, base_offset=base_offset, now_ms=now)
                if code.invalid_metadata:
                    stale = True
                    if code in (ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.FENCED_LEADER_EPOCH) \
                            and meta.leader(batch.tp) == broker:
                        meta.forget_leader(batch.tp)
            if not outcomes:
                self.retries += 1
                log.debug("retrying %s (attempt %d): %s", batch.tp, batch.attempts, message)
            for outcome in outcomes:
                self._settle(outcome, message)
            if self._acc.core.in_flight(batch.tp) == 0:
                self._lanes.release(batch.tp)
        if stale:
            await self._refresh_quietly()
        self._changed.notify()
        self._wakeup.set()

    def _settle(self, outcome: Outcome[ProducerBatch], message: str | None) -> None:
        batch = outcome.batch
        if isinstance(outcome, Acknowledge):
            self.records_sent += batch.record_count
            batch.outcome.resolve(outcome.base_offset)
            return
        assert isinstance(outcome, Fail)
        where = f"{batch.record_count} record(s) for {batch.tp}"
        error: BiplaneError
        if outcome.outcome_unknown:
            error = OutcomeUnknownError(f"{where}: {outcome.reason}", code=outcome.error)
        elif outcome.error == ErrorCode.REQUEST_TIMED_OUT:
            error = DeliveryTimeoutError(f"{where}: {outcome.reason}")
        else:
            error = error_for(outcome.error, topic=batch.tp.topic, partition=batch.tp.partition,
                              message=message or outcome.reason, what="produce")
        self._fail_batch(batch, error)

    @staticmethod
    def _fail_batch(batch: ProducerBatch, error: BaseException) -> None:
        batch.outcome.fail(error)


__all__ = ["Producer", "parse_acks", "BrokerResponseError"]
