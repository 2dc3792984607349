"""The broker's group coordinator driver: cores fed, records written, answers released.

For each partition of the offsets topic this broker leads, it keeps one coordinator
core (coordinator.py). Leadership comes from the metadata image; on becoming leader of
a partition (in a new leader epoch) it waits until the local replica leads with its
epoch durable and its high watermark at the epoch start (everything earlier leaders
committed is then readable), reads the partition up to the high watermark and builds a
core from its records; until then the partition's groups are answered
COORDINATOR_LOAD_IN_PROGRESS. A partition it does not lead answers NOT_COORDINATOR.

A core's writes become one record batch each, produced with acks=all through the
broker's own admission path (RequestHandler.start_produce), in the order the core
returned them; `Written` goes back into the core when the produce is answered, so an
answer that waits for stored state is released only after its records are committed.
A write that fails (leadership lost, too few replicas) makes the partition reload from
its log once its writes in flight are done: the core's memory may hold what the log
does not.

Requests from Biplane's listener and from the Kafka listener reach the same cores
through `handle`. The driver decides nothing about groups: every rule is the core's.
"""
from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import time
import uuid
from typing import TYPE_CHECKING, Any, Coroutine

from common.batch import iter_batches, read_records, build_batch
from common.errors import BiplaneError, ErrorCode
from common.metadata.image import MetadataImage
from common.requests import CreateTopicRequest
from common.tasks import TaskOwner
from common.wire import messages as wire
from dataplane.groups.coordinator import Coordinator
from dataplane.groups import lag
from dataplane.groups.events import GroupConfig, GroupRecord, Received, Step, Tick, TopicsDeleted, Written
from dataplane.groups.placement import OFFSETS_TOPIC, partition_for
from dataplane.groups.records import BadGroupRecord

if TYPE_CHECKING:
    from common.control_client import ControlClient
    from dataplane.broker.server import RequestHandler

TRANSACTION_KEY_TYPE = 1   # FindCoordinator's key_type for a transactional id

log = logging.getLogger("biplane.groups")

READ_BYTES = 1024 * 1024
LOAD_POLL_S = 0.05


@dataclasses.dataclass(frozen=True, slots=True)
class OffsetsTopicSettings:
    """The offsets topic's shape when this broker creates it (Kafka's
    offsets.topic.num.partitions and offsets.topic.replication.factor)."""

    partitions: int = 16
    replication_factor: int | None = None   # None: min(3, live brokers)
    write_timeout_ms: int = 10_000
    segment_bytes: int = 16 * 1024 * 1024

    def topic_config(self, replication_factor: int) -> dict[str, Any]:
        # A majority quorum where there are three replicas or more (a lost broker neither
        # stops commits nor loses an acknowledged one); otherwise every in-sync replica.
        config: dict[str, Any] = {"cleanup_policy": "compact", "segment_bytes": self.segment_bytes}
        if replication_factor >= 3:
            config["commit_policy"] = "quorum"
        return config


class _Partition:
    """One offsets-topic partition this broker leads: its core once loaded."""

    def __init__(self, partition: int, leader_epoch: int) -> None:
        self.partition = partition
        self.leader_epoch = leader_epoch
        self.core: Coordinator | None = None
        self.loader: asyncio.Task | None = None
        self.writes: asyncio.Queue[tuple[int, asyncio.Future]] = asyncio.Queue()
        self.inflight = 0
        self.waiters: dict[int, asyncio.Future[object]] = {}
        self.broken = False   # a write failed: reload once the writes in flight are done


class GroupCoordinator:
    def __init__(self, *, broker_id: int, requests: "RequestHandler", control: "ControlClient | None",
                 config: GroupConfig, settings: OffsetsTopicSettings, tick_interval_ms: int = 100) -> None:
        self.broker_id = broker_id
        self.requests = requests
        self.control = control
        self.config = config
        self.settings = settings
        self.tick_interval_ms = tick_interval_ms
        self._partitions: dict[int, _Partition] = {}
        self._request_ids = itertools.count(1)
        # The cores' clock starts at wall-clock time and moves with the monotonic clock.
        self._wall_start_ms = time.time_ns() // 1_000_000
        self._monotonic_start_ms = time.monotonic_ns() // 1_000_000
        self._tasks = TaskOwner()
        self._creating: asyncio.Task | None = None
        self._closed = False
        # Topic ids as of the newest image seen (a deletion is a name gone or a new id), and its
        # offset: an older image, or the empty one a learner starts over from after a drift,
        # deletes nothing.
        self._topic_ids: dict[str, str] = {}
        self._topics_offset = -1

    # ------------------------------------------------------------------ time

    def now_ms(self) -> int:
        """Wall-clock ms as of this driver's start, moved on by the monotonic clock: the cores
        time sessions and rebalances with it, and stamp commits with it (offset retention reads
        those as wall-clock time). It never goes back, as the cores require, and never jumps:
        the wall clock held at its last reading kept every session and rebalance deadline
        still for as long as the clock had been stepped forward, once it was set right."""
        return self._wall_start_ms + time.monotonic_ns() // 1_000_000 - self._monotonic_start_ms

    # ------------------------------------------------------------------ leadership

    def partition_count(self, image: MetadataImage) -> int:
        topic = image.topics.get(OFFSETS_TOPIC)
        return topic.config.partitions if topic is not None else self.settings.partitions

    async def on_metadata(self, image: MetadataImage) -> None:
        if self._closed:
            return
        if image.offset > self._topics_offset:
            topics = image.topics
            deleted = frozenset(name for name, topic_id in self._topic_ids.items()
                                if name not in topics or topics[name].topic_id != topic_id)
            self._topic_ids = {name: t.topic_id for name, t in topics.items()}
            self._topics_offset = image.offset
            if deleted:
                self._topics_deleted(deleted)
        leading: dict[int, int] = {}
        for info in image.topic_partitions(OFFSETS_TOPIC) if OFFSETS_TOPIC in image.topics else ():
            if info.leader == self.broker_id:
                leading[info.partition] = info.leader_epoch
        for p, state in list(self._partitions.items()):
            if leading.get(p) != state.leader_epoch:
                self._unload(p, "leadership moved" if p not in leading else "a new leader epoch")
        for p, epoch in leading.items():
            if p not in self._partitions:
                state = self._partitions[p] = _Partition(p, epoch)
                state.loader = self._spawn(self._load(state), f"groups-load-{p}")
                self._spawn(self._write_loop(state), f"groups-writes-{p}")

    def _topics_deleted(self, topics: frozenset[str], only: "_Partition | None" = None) -> None:
        for state in [only] if only is not None else list(self._partitions.values()):
            if state.core is not None and not state.broken:
                self._perform(state, state.core.step(TopicsDeleted(topics=topics, now_ms=self.now_ms())))

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task:
        task = self._tasks.spawn(coro, name=name)
        task.add_done_callback(_log_failure)
        return task

    def _unload(self, p: int, why: str) -> None:
        state = self._partitions.pop(p)
        if state.loader is not None:
            state.loader.cancel()
        for waiter in state.waiters.values():
            if not waiter.done():
                waiter.set_exception(_Unloaded())
        state.waiters.clear()
        log.info("offsets partition %d unloaded (%s)", p, why,
                 extra={"event": "groups.unloaded", "partition": p, "why": why})
        state.writes.put_nowait((-1, asyncio.get_running_loop().create_future()))  # ends its write loop

    async def _load(self, state: _Partition, high_watermark_min: int = 0) -> None:
        """Wait for the local replica to lead with everything committed readable (and its high
        watermark at `high_watermark_min` or past it), then build the core."""
        started = time.monotonic()
        while True:
            driver = self.requests.replicas.get(OFFSETS_TOPIC, state.partition)
            if driver is not None and not driver.closed and driver.is_leader and \
                    driver.replica.leader_epoch == state.leader_epoch and driver.replica.epoch_durable and \
                    driver.replica.high_watermark >= max(driver.replica.epoch_start_offset, high_watermark_min):
                break
            await asyncio.sleep(LOAD_POLL_S)
        high_watermark = driver.replica.high_watermark
        stored = await asyncio.to_thread(_read_records, driver.log, high_watermark)
        if self._partitions.get(state.partition) is not state:
            return
        try:
            state.core = Coordinator(config=self.config, now_ms=self.now_ms(), stored=stored)
        except BadGroupRecord as exc:
            log.error("offsets partition %d cannot be loaded: %s", state.partition, exc,
                      extra={"event": "groups.load_failed", "partition": state.partition})
            return
        log.info("offsets partition %d loaded: %d groups from %d records below offset %d (%.3f s)",
                 state.partition, len(state.core.groups), len(stored), high_watermark,
                 time.monotonic() - started,
                 extra={"event": "groups.loaded", "partition": state.partition, "records": len(stored)})
        # Topics deleted while another broker led this partition (or before a reload); not by
        # an empty image (a learner starting over), which would delete every group's offsets.
        image = self.requests.image()
        gone = frozenset(t for group in state.core.groups.values() for t, _ in group.offsets
                         if t not in image.topics) if image.offset >= 0 else frozenset()
        if gone:
            self._topics_deleted(gone, only=state)

    # ------------------------------------------------------------------ feeding the cores

    def _perform(self, state: _Partition, step: Step) -> None:
        for write in step.writes:
            batch = build_batch([r.value for r in write.records], keys=[r.key for r in write.records],
                                timestamp_ms=self.now_ms())
            produced = self.requests.start_produce(wire.ProduceRequest(
                acks=int(wire.Acks.ALL), timeout_ms=self.settings.write_timeout_ms, topics=(wire.ProduceTopic(
                    topic=OFFSETS_TOPIC, partitions=(wire.ProducePartition(partition=state.partition,
                                                                           records=batch),)),)),
                internal=True)
            state.inflight += 1
            state.writes.put_nowait((write.write_id, asyncio.ensure_future(produced)))
        for answer in step.answers:
            waiter = state.waiters.pop(answer.request_id, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(answer.response)

    async def _write_loop(self, state: _Partition) -> None:
        """Writes' outcomes go back into the core in the order the core made them."""
        while True:
            write_id, produced = await state.writes.get()
            if write_id < 0:
                return
            ok, reason = False, ""
            try:
                response = await produced
                code = response.topics[0].partitions[0].error_code if response is not None else ErrorCode.UNKNOWN
                ok, reason = code is ErrorCode.NONE, code.name
            except BiplaneError as exc:
                reason = str(exc)
            state.inflight -= 1
            if self._partitions.get(state.partition) is not state or state.core is None:
                continue
            if not ok:
                log.warning("offsets partition %d: a write failed (%s); the partition reloads from its log",
                            state.partition, reason, extra={"event": "groups.write_failed",
                                                             "partition": state.partition})
                state.broken = True
            self._perform(state, state.core.step(Written(write_id=write_id, ok=ok, now_ms=self.now_ms())))
            if state.broken and state.inflight == 0:
                self._reload(state)

    def _reload(self, state: _Partition) -> None:
        """After a failed write: its records may be in the log and commit later, so the new
        core waits until the high watermark passes today's log end (or leadership moves)."""
        state.core = None
        state.broken = False
        driver = self.requests.replicas.get(OFFSETS_TOPIC, state.partition)
        log_end = driver.log.log_end_offset if driver is not None and not driver.closed else 0
        state.loader = self._spawn(self._load(state, log_end), f"groups-load-{state.partition}")

    async def run_ticks(self) -> None:
        while True:
            await asyncio.sleep(self.tick_interval_ms / 1000)
            for state in list(self._partitions.values()):
                if state.core is not None and not state.broken:
                    self._perform(state, state.core.step(Tick(now_ms=self.now_ms())))

    # ------------------------------------------------------------------ requests

    def _route(self, group_id: str) -> tuple[_Partition | None, ErrorCode]:
        image = self.requests.image()
        if OFFSETS_TOPIC not in image.topics:
            return None, ErrorCode.NOT_COORDINATOR
        state = self._partitions.get(partition_for(group_id, self.partition_count(image)))
        if state is None:
            return None, ErrorCode.NOT_COORDINATOR
        if state.core is None or state.broken:
            return None, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        return state, ErrorCode.NONE

    async def _ask(self, state: _Partition, request: object, *, client_host: str = "",
                   member_id_required: bool = True) -> object:
        assert state.core is not None
        rid = next(self._request_ids)
        waiter: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        state.waiters[rid] = waiter
        try:
            missing: frozenset[tuple[str, int]] = frozenset()
            if isinstance(request, wire.OffsetCommitRequest):
                image = self.requests.image()
                missing = frozenset((t.topic, p.partition) for t in request.topics for p in t.partitions
                                    if image.get_partition(t.topic, p.partition) is None)
            self._perform(state, state.core.step(Received(
                request_id=rid, request=request, now_ms=self.now_ms(), client_host=client_host,
                fresh_member_id=str(uuid.uuid4()), member_id_required=member_id_required,
                missing_partitions=missing)))
            return await waiter
        finally:
            state.waiters.pop(rid, None)

    async def handle(self, request: Any, *, client_host: str = "", member_id_required: bool = True) -> Any:
        """The answer to one group request (common/wire/messages.py's group messages)."""
        kind = type(request)
        if kind is wire.FindCoordinatorRequest:
            return await self.find_coordinator(request)
        if kind is wire.ListGroupsRequest:
            return self.list_groups(request)
        if kind is wire.DescribeGroupsRequest:
            return self.describe_groups(request)
        if kind is wire.DeleteGroupsRequest:
            return await self.delete_groups(request)
        state, error = self._route(request.group_id)
        if state is None:
            return _refusal(request, error)
        try:
            return await self._ask(state, request, client_host=client_host, member_id_required=member_id_required)
        except asyncio.CancelledError:
            raise
        except _Unloaded:
            return _refusal(request, ErrorCode.NOT_COORDINATOR)

    async def find_coordinator(self, request: wire.FindCoordinatorRequest, *, kafka: bool = False
                               ) -> wire.FindCoordinatorResponse:
        if request.key_type == TRANSACTION_KEY_TYPE:
            # A transactional producer asks this first; only this code makes Kafka's clients
            # give up at once (any other is retried until their timeout), and the message says why.
            return wire.FindCoordinatorResponse(error_code=ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                                                error_message="Biplane does not support transactions; an "
                                                              "idempotent producer without transactional.id "
                                                              "works")
        if request.key_type != wire.GROUP_KEY_TYPE:
            return wire.FindCoordinatorResponse(error_code=ErrorCode.INVALID_REQUEST,
                                                error_message=f"key_type {request.key_type} is not served: "
                                                              f"only groups ({wire.GROUP_KEY_TYPE})")
        if not request.key:
            return wire.FindCoordinatorResponse(error_code=ErrorCode.INVALID_GROUP_ID,
                                                error_message="the group id is empty")
        image = self.requests.image()
        if OFFSETS_TOPIC not in image.topics:
            await self._ensure_topic(image)
            return wire.FindCoordinatorResponse(error_code=ErrorCode.COORDINATOR_NOT_AVAILABLE,
                                                error_message=f"{OFFSETS_TOPIC} is being created")
        p = partition_for(request.key, self.partition_count(image))
        info = image.get_partition(OFFSETS_TOPIC, p)
        broker = image.brokers.get(info.leader) if info is not None and info.leader is not None else None
        port = (broker.kafka_port if kafka else broker.port) if broker is not None else None
        if broker is None or broker.fenced or port is None:
            return wire.FindCoordinatorResponse(error_code=ErrorCode.COORDINATOR_NOT_AVAILABLE,
                                                error_message=f"{OFFSETS_TOPIC}-{p} has no leader now")
        return wire.FindCoordinatorResponse(node_id=broker.broker_id, host=broker.host, port=port)

    async def _ensure_topic(self, image: MetadataImage) -> None:
        """Ask the controller for the offsets topic (once at a time; the answer comes back in
        the metadata)."""
        if self.control is None or (self._creating is not None and not self._creating.done()):
            return
        live = sum(1 for b in image.brokers.values() if not b.fenced)
        rf = self.settings.replication_factor or max(1, min(3, live))
        control = self.control

        async def create() -> None:
            try:
                await control.create_topic(CreateTopicRequest(
                    name=OFFSETS_TOPIC, partitions=self.settings.partitions, replication_factor=rf,
                    config=self.settings.topic_config(rf)))
                log.info("created %s (%d partitions, replication factor %d)", OFFSETS_TOPIC,
                         self.settings.partitions, rf, extra={"event": "groups.topic_created"})
            except BiplaneError as exc:
                if exc.code is not ErrorCode.TOPIC_ALREADY_EXISTS:
                    log.warning("could not create %s: %s", OFFSETS_TOPIC, exc,
                                extra={"event": "groups.topic_create_failed"})
            self.requests.refresh_metadata()
        self._creating = self._spawn(create(), "groups-create-topic")

    def list_groups(self, request: wire.ListGroupsRequest) -> wire.ListGroupsResponse:
        """The groups this broker coordinates (clients ask every broker)."""
        groups = [g for state in self._partitions.values() if state.core is not None
                  for g in state.core.listed(request.states_filter)]
        loading = any(state.core is None for state in self._partitions.values())
        return wire.ListGroupsResponse(error_code=ErrorCode.COORDINATOR_LOAD_IN_PROGRESS if loading
                                       else ErrorCode.NONE, groups=tuple(groups))

    def describe_groups(self, request: wire.DescribeGroupsRequest) -> wire.DescribeGroupsResponse:
        described = []
        for group_id in request.groups:
            state, error = self._route(group_id)
            if state is None or state.core is None:
                described.append(wire.DescribedGroup(error_code=error, group_id=group_id))
            else:
                described.append(state.core.describe(group_id))
        return wire.DescribeGroupsResponse(groups=tuple(described))

    async def delete_groups(self, request: wire.DeleteGroupsRequest) -> wire.DeleteGroupsResponse:
        results: dict[str, ErrorCode] = {}
        by_partition: dict[int, list[str]] = {}
        states: dict[int, _Partition] = {}
        for group_id in request.groups:
            state, error = self._route(group_id)
            if state is None:
                results[group_id] = error
            else:
                by_partition.setdefault(state.partition, []).append(group_id)
                states[state.partition] = state
        answers = await asyncio.gather(*(
            self._ask(states[p], wire.DeleteGroupsRequest(groups=tuple(ids))) for p, ids in by_partition.items()),
            return_exceptions=True)
        for (p, ids), answer in zip(by_partition.items(), answers):
            if isinstance(answer, wire.DeleteGroupsResponse):
                results.update({r.group_id: r.error_code for r in answer.results})
            else:
                results.update({g: ErrorCode.NOT_COORDINATOR for g in ids})
        return wire.DeleteGroupsResponse(results=tuple(
            wire.DeleteGroupsResult(group_id=g, error_code=results[g]) for g in request.groups))

    # ------------------------------------------------------------------ what operators see

    def snapshot(self) -> list[lag.GroupSnapshot]:
        """The groups of every loaded partition, copied (call on the event loop: the cores are its).
        Offsets in a core are the committed ones only, so a snapshot never shows one a
        failover could lose."""
        cores = [state.core for _, state in sorted(self._partitions.items()) if state.core is not None]
        return lag.snapshot(g for core in cores for g in core.groups.values())

    # ------------------------------------------------------------------ stop

    async def close(self) -> None:
        self._closed = True
        for p in list(self._partitions):
            self._unload(p, "broker stopping")
        await self._tasks.cancel_and_wait()


def _log_failure(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("%s ended: %r", task.get_name(), task.exception(), exc_info=task.exception())


class _Unloaded(Exception):
    """The partition a request waited on is no longer ours."""


def _refusal(request: Any, code: ErrorCode) -> Any:
    """The request's answer carrying only `code` (NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS)."""
    kind = type(request)
    if kind is wire.JoinGroupRequest:
        return wire.JoinGroupResponse(error_code=code, member_id=request.member_id)
    if kind is wire.SyncGroupRequest:
        return wire.SyncGroupResponse(error_code=code)
    if kind is wire.HeartbeatRequest:
        return wire.HeartbeatResponse(error_code=code)
    if kind is wire.LeaveGroupRequest:
        return wire.LeaveGroupResponse(error_code=code, members=tuple(
            wire.LeaveGroupMemberResponse(member_id=m.member_id, group_instance_id=m.group_instance_id,
                                          error_code=code) for m in request.members))
    if kind is wire.OffsetCommitRequest:
        return wire.OffsetCommitResponse(topics=tuple(wire.OffsetCommitTopicResponse(topic=t.topic, partitions=tuple(
            wire.OffsetCommitPartitionResponse(partition=p.partition, error_code=code) for p in t.partitions))
            for t in request.topics))
    if kind is wire.OffsetFetchRequest:
        return wire.OffsetFetchResponse(error_code=code)
    raise TypeError(f"{kind.__name__} is not a group request")


def _read_records(log_: Any, high_watermark: int) -> list[GroupRecord]:
    """Every keyed record below the high watermark, in log order (control batches skipped)."""
    out: list[GroupRecord] = []
    offset = log_.log_start_offset
    while offset < high_watermark:
        read = log_.read(offset, max_bytes=READ_BYTES, max_offset=high_watermark)
        if not read.records:
            break
        for pos, header in iter_batches(read.records):
            if header.is_control:
                continue
            for record in read_records(read.records, pos):
                if record.offset >= offset and record.offset < high_watermark and record.key is not None:
                    out.append(GroupRecord(key=bytes(record.key),
                                           value=None if record.value is None else bytes(record.value)))
        offset = max(offset + 1, read.next_offset)
    return out


__all__ = ["GroupCoordinator", "OffsetsTopicSettings"]
