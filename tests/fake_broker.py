"""An in-process fake broker for client tests: one wire server on 127.0.0.1 (port 0) that
keeps each partition's log in memory, deduplicates idempotent batches by sequence the way
a real leader does, and answers from a script of injected faults.

Faults (per partition, consumed in order by PRODUCE): an ErrorCode to answer instead of
writing; ("write_then", code) to write the batch and still answer the error (a lost
acknowledgement, so the client retries a batch the log already holds); ("delay", seconds)
to hold the answer (a timeout); ("close",) to drop the connection without answering.

INIT_PRODUCER_ID: while `init_answering` is clear, requests get no answer (held until it is
set, then their connection is dropped); `init_errors` are answered first, one per request;
ids are handed out with epoch `init_epoch`.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
from dataclasses import dataclass, field
from typing import Any

from common.batch import iter_batches, read_records, set_base_offset
from common.errors import ErrorCode
from common.wire import (
    FetchPartitionResponse,
    FetchResponse,
    FetchTopicResponse,
    InitProducerIdResponse,
    LeaderIdAndEpoch,
    ListOffsetsPartitionResponse,
    ListOffsetsResponse,
    ListOffsetsTopicResponse,
    MetadataBroker,
    MetadataPartition,
    MetadataResponse,
    MetadataTopic,
    ProducePartitionResponse,
    ProduceResponse,
    ProduceTopicResponse,
    start_server,
    FetchRequest,
    InitProducerIdRequest,
    ListOffsetsRequest,
    MetadataRequest,
    ProduceRequest,
)


@dataclass
class FakePartition:
    batches: list[bytes] = field(default_factory=list)
    next_offset: int = 0
    # producer id -> (epoch, the last 5 batches written as (base sequence, last sequence, base offset))
    producers: dict[int, tuple[int, collections.deque]] = field(default_factory=dict)
    faults: collections.deque = field(default_factory=collections.deque)
    leader_epoch: int = 0
    requests: int = 0

    def values(self) -> list[bytes]:
        out = []
        for blob in self.batches:
            out += [r.value for r in read_records(blob)]
        return out


@dataclass
class ClusterView:
    """What several fake brokers agree on: the brokers, and (topic, partition) -> (leader id, epoch)."""

    brokers: list = field(default_factory=list)
    leaders: dict = field(default_factory=dict)


class FakeBroker:
    def __init__(self, topics: dict[str, int], *, broker_id: int = 1, dedupe: bool = True,
                 view: "ClusterView | None" = None) -> None:
        self.broker_id = broker_id
        self.view = view   # shared by several fake brokers: who leads what; None: this one leads all
        self.dedupe = dedupe
        self.partitions = {(t, p): FakePartition() for t, n in topics.items() for p in range(n)}
        self.topics = dict(topics)
        self.server: asyncio.AbstractServer | None = None
        self.port = 0
        self.produce_requests = 0
        self.sequences_seen: list[tuple[str, int, int, int]] = []  # topic, partition, base_sequence, count
        self.hold = asyncio.Event()
        self.hold.set()
        self.next_producer_id = 1000
        self.init_answering = asyncio.Event()
        self.init_answering.set()
        self.init_errors: collections.deque = collections.deque()
        self.init_epoch = 0
        self.init_requests = 0
        self.fetch_sizes: list[int] = []   # partitions per FETCH request
        self.metadata_requests = 0
        self._metadata_answered = asyncio.Event()
        self.metadata_answering = asyncio.Event()   # cleared: METADATA is read and never answered (a cut-off broker)
        self.metadata_answering.set()
        # Set: METADATA names these leaders, whatever the view says (a broker cut off from the
        # controller answers from what it knew at the cut).
        self.stale_leaders: dict | None = None

    async def __aenter__(self) -> "FakeBroker":
        self.server = await start_server(self.handle, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.server.close()
        await self.server.wait_closed()

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def leader(self, topic: str, partition: int) -> tuple[int, int]:
        if self.stale_leaders is not None and (topic, partition) in self.stale_leaders:
            return self.stale_leaders[(topic, partition)]
        if self.view is None:
            return self.broker_id, self.partitions[(topic, partition)].leader_epoch
        return self.view.leaders.get((topic, partition), (self.view.brokers[0].broker_id, 0))

    def add_partitions(self, topic: str, count: int) -> None:
        """Grow `topic` to `count` partitions (empty, led here), as the controller would."""
        assert count >= self.topics[topic], (topic, count)
        for p in range(self.topics[topic], count):
            self.partitions[(topic, p)] = FakePartition()
        self.topics[topic] = count

    async def metadata_requests_reach(self, count: int) -> None:
        """Return once `count` METADATA requests have been answered (bound it by the test's timeout)."""
        while self.metadata_requests < count:
            self._metadata_answered.clear()
            await self._metadata_answered.wait()

    def inject(self, topic: str, partition: int, *faults: Any) -> None:
        self.partitions[(topic, partition)].faults.extend(faults)

    async def handle(self, header: Any, request: Any) -> Any:
        if isinstance(request, MetadataRequest):
            self.metadata_requests += 1
            if not self.metadata_answering.is_set():
                await self.metadata_answering.wait()
            self._metadata_answered.set()
            names = self.topics if request.topics is None else request.topics
            brokers = ((MetadataBroker(node_id=self.broker_id, host="127.0.0.1", port=self.port),) if self.view is None
                       else tuple(MetadataBroker(node_id=b.broker_id, host="127.0.0.1", port=b.port)
                                  for b in self.view.brokers))
            return MetadataResponse(
                brokers=brokers,
                controller_id=1, metadata_offset=1,
                topics=tuple(
                    MetadataTopic(topic=t, partitions=tuple(
                        MetadataPartition(partition=p, leader_id=self.leader(t, p)[0],
                                          leader_epoch=self.leader(t, p)[1],
                                          replicas=(self.broker_id,), isr=(self.broker_id,))
                        for p in range(self.topics[t])))
                    if t in self.topics else MetadataTopic(topic=t, error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
                    for t in names))
        if isinstance(request, InitProducerIdRequest):
            self.init_requests += 1
            if not self.init_answering.is_set():
                await self.init_answering.wait()   # its client gave up long ago: never answer it
                raise ConnectionResetError("fault: InitProducerId held, then the connection dropped")
            if self.init_errors:
                return InitProducerIdResponse(error_code=self.init_errors.popleft())
            self.next_producer_id += 1
            return InitProducerIdResponse(producer_id=self.next_producer_id, producer_epoch=self.init_epoch)
        if isinstance(request, ProduceRequest):
            return await self.produce(request)
        if isinstance(request, FetchRequest):
            return self.fetch(request)
        if isinstance(request, ListOffsetsRequest):
            return ListOffsetsResponse(topics=tuple(ListOffsetsTopicResponse(topic=t.topic, partitions=tuple(
                ListOffsetsPartitionResponse(partition=p.partition,
                                             offset=0 if p.timestamp == -2 else self.partitions[(t.topic, p.partition)].next_offset)
                for p in t.partitions)) for t in request.topics))
        raise AssertionError(f"unexpected request {request!r}")

    async def produce(self, request: ProduceRequest) -> Any:
        await self.hold.wait()
        self.produce_requests += 1
        delay = 0.0
        out = []
        for topic in request.topics:
            answers = []
            for p in topic.partitions:
                part = self.partitions[(topic.topic, p.partition)]
                part.requests += 1
                blob = bytearray(p.records)
                (_, h), = list(iter_batches(blob))
                self.sequences_seen.append((topic.topic, p.partition, h.base_sequence, h.record_count))
                if self.leader(topic.topic, p.partition)[0] != self.broker_id:
                    answers.append(ProducePartitionResponse(partition=p.partition,
                                                            error_code=ErrorCode.NOT_LEADER_OR_FOLLOWER))
                    continue
                fault = part.faults.popleft() if part.faults else None
                if isinstance(fault, tuple) and fault[0] == "close":
                    raise ConnectionResetError("fault: drop the connection")
                if isinstance(fault, tuple) and fault[0] == "delay":
                    delay = max(delay, fault[1])
                    fault = None
                if isinstance(fault, ErrorCode):
                    answers.append(ProducePartitionResponse(partition=p.partition, error_code=fault))
                    continue
                code, base = self.append(part, blob, h)
                if isinstance(fault, tuple) and fault[0] == "write_then":
                    code = fault[1]
                answers.append(ProducePartitionResponse(partition=p.partition, error_code=code, base_offset=base,
                                                        current_leader=LeaderIdAndEpoch(leader_id=self.broker_id,
                                                                                        leader_epoch=part.leader_epoch)))
            out.append(ProduceTopicResponse(topic=topic.topic, partitions=tuple(answers)))
        if delay:
            await asyncio.sleep(delay)
        if request.acks == 0:
            return None
        return ProduceResponse(topics=tuple(out))

    def append(self, part: FakePartition, blob: bytearray, h: Any) -> tuple[ErrorCode, int]:
        # A real leader's rules (dataplane/replica/producer_state.py): the last 5 batches of a
        # producer are recognised as duplicates, older ones answer DUPLICATE_SEQUENCE, and a
        # batch must follow the last sequence exactly (a new epoch starts at 0).
        last_seq = h.base_sequence + h.record_count - 1
        if self.dedupe and h.producer_id >= 0:
            epoch, recent = part.producers.get(h.producer_id, (h.producer_epoch, collections.deque(maxlen=5)))
            if epoch == h.producer_epoch and recent:
                for base_seq, end_seq, base in recent:
                    if (base_seq, end_seq) == (h.base_sequence, last_seq):
                        return ErrorCode.NONE, base   # a duplicate: its original offset
                if h.base_sequence < recent[0][0]:
                    return ErrorCode.DUPLICATE_SEQUENCE, -1
                if h.base_sequence != recent[-1][1] + 1:
                    return ErrorCode.OUT_OF_ORDER_SEQUENCE, -1
            elif h.base_sequence != 0:
                return ErrorCode.OUT_OF_ORDER_SEQUENCE, -1
        base = part.next_offset
        set_base_offset(blob, base)
        part.batches.append(bytes(blob))
        part.next_offset += h.record_count
        if h.producer_id >= 0:
            epoch, recent = part.producers.get(h.producer_id, (h.producer_epoch, collections.deque(maxlen=5)))
            if epoch != h.producer_epoch:
                recent = collections.deque(maxlen=5)
            recent.append((h.base_sequence, last_seq, base))
            part.producers[h.producer_id] = (h.producer_epoch, recent)
        return ErrorCode.NONE, base

    def fetch(self, request: FetchRequest) -> Any:
        self.fetch_sizes.append(sum(len(t.partitions) for t in request.topics))
        topics = []
        for t in request.topics:
            parts = []
            for p in t.partitions:
                part = self.partitions[(t.topic, p.partition)]
                blobs = [b for b in part.batches if self._end(b) > p.fetch_offset]
                parts.append(FetchPartitionResponse(partition=p.partition, high_watermark=part.next_offset,
                                                    records=b"".join(blobs)))
            topics.append(FetchTopicResponse(topic=t.topic, partitions=tuple(parts)))
        return FetchResponse(topics=tuple(topics))

    @staticmethod
    def _end(blob: bytes) -> int:
        (_, h), = list(iter_batches(blob))
        return h.next_offset


@contextlib.asynccontextmanager
async def two_brokers_one_log(topics: dict[str, int]):
    """Fake brokers 1 and 2 sharing one replicated log (producer state included), broker 1
    leading every partition at epoch 0 until the test moves one in `view.leaders`:
    yields (view, broker 1, broker 2)."""
    view = ClusterView()
    async with FakeBroker(topics, broker_id=1, view=view) as a, FakeBroker(topics, broker_id=2, view=view) as b:
        b.partitions = a.partitions
        view.brokers = [a, b]
        for topic, count in topics.items():
            for p in range(count):
                view.leaders[(topic, p)] = (1, 0)
        yield view, a, b
