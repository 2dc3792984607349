"""The data-plane listener: answers PRODUCE, FETCH, LIST_OFFSETS, METADATA, API_VERSIONS, INIT_PRODUCER_ID,
and the consumer-group requests (through the broker's group coordinator, dataplane/groups/driver.py).

Every partition is answered on its own: an unknown partition, a stale or
future epoch, a corrupt or oversized batch gets its error code and the other
partitions of the same request (and every other connection) are served as
usual. Produce requests are checked by the core alone (dataplane/replica/admission.py:
role, the client's leader epoch, acks, batch headers, CRC and sizes); so are a
consumer's leader epoch and list-offsets (`Replica.client_epoch_error`): a client
that knows a newer epoch than ours gets UNKNOWN_LEADER_EPOCH and makes us refresh
metadata, but never makes the leader stop (only a replica's word can do that).

FETCH long-polls up to min(max_wait_ms, fetch_wait_ms_max): it answers at
once when any partition has data, an error or a divergence; otherwise it
waits for a change on one of the partitions. In a session, a partition not served here
yet (LEADER_NOT_AVAILABLE: still opening, or its epoch start not stored) waits too.
A follower's fetch may belong to an incremental session (after Kafka's KIP-227,
dataplane/broker/fetch_sessions.py): it names only the partitions whose position changed,
the others keep theirs, and the answer carries only partitions with records or a changed
summary (HW, log start and end, error, leader, divergence). Every partition of the session is
waited on, and stepped at its last position when something changed there (`_Quiet`),
which wakes the long-poll; a wake looks only at those (`_Watch`), so an idle session
costs nothing per partition. A quiet partition's follower stays in the ISR on the
session's word: when the core's caught-up clock for it runs out, the driver's Tick
says where the session holds it and when the follower was last seen fetching
(`follower_fetching`). An error travels once, like any summary change (Kafka repeats it on every
answer; here the follower's core already backs off and waits for metadata, or, refused as not served
yet, waits in the session, and a repeat
would end every long-poll at once). Sessions live in this process only: a restarted
broker answers FETCH_SESSION_ID_NOT_FOUND and the follower starts over with a full fetch. A new high watermark alone does
not end a follower's long-poll: the HW rides on its next answer (data, or the
long-poll's end), as Raft's commit index rides on the next append. Ending it
would cost every acks=all request an answer and a new fetch per follower,
racing the producer's next request.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Mapping

from common.errors import BiplaneError, ErrorCode
from common.metadata.image import MetadataImage
from common.topic_partition import TopicPartition
from common.wire import RequestHeader
from common.wire import messages as wire
from dataplane.broker.codec import append_refusal, fetch_answer_to_wire, fetch_from_wire, fetch_refusal
from dataplane.broker.fetch_sessions import FULL_EPOCH, NO_SESSION, IncrementalFetch, LeaderSessions, SessionError
from dataplane.broker.metrics import BrokerMetrics, Counters
from dataplane.broker.partition import PartitionDriver, now_ms
from dataplane.broker.producer_ids import ProducerIds
from dataplane.broker.pusher import PAIR_TP, answer_append_entries
from dataplane.broker.replicas import ReplicaManager
from dataplane.groups.placement import is_internal
from dataplane.replica.events import FetchOrder, StillFetching

if TYPE_CHECKING:
    from dataplane.groups.driver import GroupCoordinator

log = logging.getLogger("biplane.broker.server")

SESSIONLESS_EPOCH = -1   # a fetch outside any session (consumers, a follower's express fetch)
NOT_READY_POLL_S = 1.0
END_ON_ARRIVAL_MAX = 1024   # follower brokers whose request to end a long-poll came first, kept at most


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Quiet:
    """A session partition's last answer while nothing changes: no records, and no error but
    "not served yet"."""

    answer: wire.FetchPartitionResponse
    changed: asyncio.Future[None]   # the driver's: done at its next change
    fetches: int                    # the core's count of this follower's fetches after that step


@dataclasses.dataclass(eq=False)
class _Watch:
    """What a session's long-polls look at, kept across its fetches so that one costs what
    changed, not the session's size (thousands of idle partitions per follower broker): the
    partitions stepped on every wake (`active`: no quiet answer kept) and those whose driver
    changed since (`dirty`, set by done-callbacks on the drivers' futures, each hooked once).
    A quiet partition is not stepped again for its follower's ISR clock: the core asks the
    session when that clock runs out (RequestHandler.follower_fetching). A partition with no
    replica to answer here (still opening, or not ours) is `unready`: looked at again as soon as
    its replica opens here (RequestHandler.replica_opened), else every NOT_READY_POLL_S (its
    error may change: the topic learned, the partition led elsewhere), not on every wake:
    while thousands open, every wake of a session looked at each of them, a sixth of the
    leader's work. (Polled every 50 ms instead of told, they were five in six of the partitions
    a leader looked at while 2,000 opened.)"""

    wake: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    active: set[TopicPartition] = dataclasses.field(default_factory=set)
    dirty: set[TopicPartition] = dataclasses.field(default_factory=set)
    unready: set[TopicPartition] = dataclasses.field(default_factory=set)
    unready_due_s: float = 0.0
    # The follower asked the waiting long-poll to end at once (RequestHandler._end_long_poll):
    # it answers as it stands.
    end_now: bool = False
    epoch: int = 0   # the session epoch of the long-poll now or last waiting on this watch
    hooked: dict[TopicPartition, asyncio.Future[None]] = dataclasses.field(default_factory=dict)
    # Each hooked future's partition, driver and what the long-poll last saw of it (log end,
    # epoch, role: PartitionDriver.followed_state).
    _hooked_tp: dict[asyncio.Future[None], tuple[TopicPartition, PartitionDriver, tuple]] = dataclasses.field(
        default_factory=dict)

    def hook(self, tp: TopicPartition, driver: PartitionDriver) -> None:
        """Watch `driver` for a change after this long-poll stepped `tp` (its future taken
        now: one hooked earlier that resolves now was resolved by that step, which saw it)."""
        changed = driver.changed()
        if self.hooked.get(tp) is not changed:
            self.hooked[tp] = changed
            changed.add_done_callback(self._changed)
            self._hooked_tp[changed] = (tp, driver, driver.followed_state())

    def _changed(self, future: asyncio.Future[None]) -> None:
        hooked = self._hooked_tp.pop(future, None)
        if hooked is None:
            return
        tp, driver, seen = hooked
        if self.hooked.get(tp) is not future:
            return
        self.dirty.add(tp)
        if driver.followed_state() == seen and not driver.closed and driver.failed is None:
            # A new HW alone does not end the long-poll: it rides on the next answer, and
            # the partition is stepped then. Waking for it cost the leader a step and a
            # session pass per follower for every acks=all request (the HW moves once per
            # request, after the first follower's fetch).
            self.hook(tp, driver)
            return
        self.wake.set()

    def unhook(self) -> None:
        """This watch is replaced or its session gone: its callbacks leave the drivers' futures
        (an idle partition's future may stay pending for good)."""
        for future in self._hooked_tp:
            future.remove_done_callback(self._changed)
        self._hooked_tp.clear()
        self.hooked.clear()


GROUP_REQUESTS = frozenset({
    wire.FindCoordinatorRequest, wire.JoinGroupRequest, wire.SyncGroupRequest, wire.HeartbeatRequest,
    wire.LeaveGroupRequest, wire.OffsetCommitRequest, wire.OffsetFetchRequest, wire.DescribeGroupsRequest,
    wire.ListGroupsRequest, wire.DeleteGroupsRequest,
})


class RequestHandler:
    def __init__(self, *, broker_id: int, image: Callable[[], MetadataImage], replicas: ReplicaManager,
                 producer_ids: ProducerIds, refresh_metadata: Callable[[], None], fetch_wait_ms_max: int,
                 metrics: BrokerMetrics | None = None, heard: Callable[[int], None] | None = None) -> None:
        self.broker_id = broker_id
        # Told the peer's id on a follower's fetch and a leader's append-entries
        # (dataplane/broker/contact.py).
        self.heard = heard
        self.image = image
        self.replicas = replicas
        self.producer_ids = producer_ids
        self.refresh_metadata = refresh_metadata
        self.fetch_wait_ms_max = fetch_wait_ms_max
        # Followers' incremental fetch sessions, this process's only: ids start at random so
        # that a restarted broker does not take an old session id for one of its own.
        self.fetch_sessions: LeaderSessions[TopicPartition, wire.FetchPartition, tuple] = LeaderSessions(
            first_id=random.randrange(1, 2**30))
        self._watches: dict[int, _Watch] = {}   # per session id (_fetch_in_session)
        # The watches holding a partition as unready, by partition, until it opens here.
        self._awaiting_open: dict[TopicPartition, set[_Watch]] = {}
        # Per follower broker: the epoch of its session fetch to answer at once when it arrives
        # (its request to end it came first: _end_long_poll).
        self._end_on_arrival: dict[int, int] = {}
        # Told each partition a follower's session fetch removes (set by the broker: a leader
        # whose followers' clocks its sessions time must hear it, ReplicaManager.unpark).
        self.on_session_left: Callable[[TopicPartition], None] | None = None
        self.counters = Counters()
        # Set by the broker once built (it produces through this handler).
        self.groups: "GroupCoordinator | None" = None
        self.metrics = metrics if metrics is not None else BrokerMetrics()

    def start(self, header: RequestHeader, request: Any) -> Awaitable[Any]:
        """Begin handling in arrival order; produce requests reach their cores before this returns."""
        if type(request) is wire.ProduceRequest:
            self.counters.request("ProduceRequest")
            return self.start_produce(request)
        return self.handle(header, request)

    async def handle(self, header: RequestHeader, request: Any) -> Any:
        kind = type(request)
        self.counters.request(kind.__name__)
        if kind is wire.ProduceRequest:
            return await self.start_produce(request)
        if kind is wire.FetchRequest:
            return await self.fetch(request)
        if kind is wire.ListOffsetsRequest:
            return self.list_offsets(request)
        if kind is wire.MetadataRequest:
            return self.metadata(request)
        if kind is wire.ApiVersionsRequest:
            return wire.api_versions_response()
        if kind is wire.InitProducerIdRequest:
            return await self.init_producer_id(request)
        if kind is wire.AppendEntriesRequest:
            return await self.append_entries(request)
        if kind in GROUP_REQUESTS:
            assert self.groups is not None, "the broker sets its group coordinator before it listens"
            return await self.groups.handle(request)
        raise AssertionError(f"no handler for {kind.__name__}")

    # ------------------------------------------------------------ shared

    def _current_leader(self, topic: str, partition: int) -> wire.LeaderIdAndEpoch:
        info = self.image().get_partition(topic, partition)
        if info is None or info.leader is None:
            return wire.NO_LEADER if info is None else wire.LeaderIdAndEpoch(leader_epoch=info.leader_epoch)
        return wire.LeaderIdAndEpoch(leader_id=info.leader, leader_epoch=info.leader_epoch)

    def _locate(self, topic: str, partition: int) -> tuple[PartitionDriver | None, ErrorCode]:
        """The local driver for a partition, or the error to answer."""
        if self.image().get_partition(topic, partition) is None:
            return None, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        driver = self.replicas.get(topic, partition)
        if driver is None and (topic, partition) in self.replicas.opening:
            # Assigned here and still opening: retriable, the same leader answers soon.
            return None, ErrorCode.LEADER_NOT_AVAILABLE
        if driver is None or driver.closed:
            return None, ErrorCode.NOT_LEADER_OR_FOLLOWER
        if driver.failed is not None:
            return None, ErrorCode.KAFKA_STORAGE_ERROR
        return driver, ErrorCode.NONE

    # ------------------------------------------------------------ produce

    def start_produce(self, request: wire.ProduceRequest, *, answer_acks_0: bool = False,
                      internal: bool = False) -> Awaitable[wire.ProduceResponse | None]:
        """Check and submit every partition now, in request order; the awaitable gives the answer
        (None for acks=0, unless `answer_acks_0`: the Kafka listener acts on its errors).
        `internal`: the broker's own write (the group coordinator's); clients may not write
        to internal topics, whose records the broker must be able to read back."""
        started = time.perf_counter()
        acks, timeout_ms = request.acks, request.timeout_ms
        parts = [(t.topic, p.partition, self._submit_partition(t.topic, p, acks, timeout_ms, internal))
                 for t in request.topics for p in t.partitions]

        async def answer() -> wire.ProduceResponse | None:
            by_topic: dict[str, list[wire.ProducePartitionResponse]] = {}
            for topic, partition, item in parts:
                if not isinstance(item, wire.ProducePartitionResponse):
                    driver, future = item
                    release = await future
                    if release.error is not ErrorCode.NONE:
                        self.counters.error("ProduceRequest", release.error)
                        if release.error is ErrorCode.REQUEST_TIMED_OUT:
                            log.info("produce to %s-%d %s", topic, partition, release.reason,
                                     extra={"event": "produce.timed_out", "topic": topic, "partition": partition})
                    leader = (wire.LeaderIdAndEpoch(leader_id=self.broker_id, leader_epoch=driver.replica.leader_epoch)
                              if release.error is ErrorCode.NONE else self._current_leader(topic, partition))
                    item = wire.ProducePartitionResponse(
                        partition=partition, error_code=release.error, base_offset=release.base_offset,
                        log_start_offset=driver.log.log_start_offset, current_leader=leader,
                        error_message=release.reason or None)
                by_topic.setdefault(topic, []).append(item)
            self.metrics.observe_produce(acks, time.perf_counter() - started)
            if acks == 0 and not answer_acks_0:
                return None
            return wire.ProduceResponse(topics=tuple(
                wire.ProduceTopicResponse(topic=t, partitions=tuple(ps)) for t, ps in by_topic.items()))
        return answer()

    def _submit_partition(self, topic: str, p: wire.ProducePartition, acks: int, timeout_ms: int,
                          internal: bool = False):
        """A refusal (ProducePartitionResponse), or (driver, future of the core's release).
        Every check of the request is the core's (dataplane/replica/admission.py)."""
        def refuse(code: ErrorCode, message: str) -> wire.ProducePartitionResponse:
            self.counters.error("ProduceRequest", code)
            return wire.ProducePartitionResponse(partition=p.partition, error_code=code, error_message=message,
                                                 current_leader=self._current_leader(topic, p.partition))

        if is_internal(topic) and not internal:
            return refuse(ErrorCode.INVALID_TOPIC, f"{topic} is internal: only the brokers' group coordinator "
                                                   f"writes to it; commit offsets with OffsetCommit")
        driver, error = self._locate(topic, p.partition)
        if driver is None:
            return refuse(error, f"{topic}-{p.partition}: {error.name} on broker {self.broker_id}")
        topic_info = self.image().topics.get(topic)
        try:
            # The records view into the request's own frame is patched in place by the log: no copy.
            future = driver.submit_produce(
                p.records if p.records is not None else b"", acks=acks, timeout_ms=timeout_ms,
                leader_epoch=p.current_leader_epoch,
                batch_bytes_max=topic_info.config.max_message_bytes if topic_info is not None else None)
        except BiplaneError as exc:
            return refuse(exc.code, str(exc))
        return driver, future

    # ------------------------------------------------------------ fetch

    async def fetch(self, request: wire.FetchRequest) -> wire.FetchResponse:
        started = time.perf_counter()
        response = await self._fetch(request)
        self.metrics.observe_fetch(request.replica_id >= 0, time.perf_counter() - started)
        return response

    async def _fetch(self, request: wire.FetchRequest) -> wire.FetchResponse:
        loop = asyncio.get_running_loop()
        wait_s = max(0, min(request.max_wait_ms, self.fetch_wait_ms_max)) / 1000
        deadline = loop.time() + wait_s
        follower = request.replica_id >= 0
        if follower and self.heard is not None:
            self.heard(request.replica_id)
        if follower and request.session_epoch != SESSIONLESS_EPOCH:
            try:
                session_id, partitions, fetch = self._session_receive(request)
            except SessionError as exc:
                code = (ErrorCode.INVALID_FETCH_SESSION_EPOCH if exc.reason == "wrong_epoch"
                        else ErrorCode.FETCH_SESSION_ID_NOT_FOUND)
                self.counters.error("FetchRequest", code)
                return wire.FetchResponse(error_code=code)
            return await self._fetch_in_session(request, fetch, session_id, partitions, deadline)
        # Outside a session: a consumer's, or a follower's express fetch (no wait).
        partitions = {TopicPartition(t.topic, p.partition): p for t in request.topics for p in t.partitions}
        # A follower's express fetch: sent while the session fetch it names was out.
        order = ((request.session_id, request.session_epoch_out, 1)
                 if follower and request.session_id != NO_SESSION and request.session_epoch_out >= 0 else None)
        if follower and not partitions and request.session_epoch_out >= 0:
            self._end_long_poll(request.replica_id, request.session_epoch_out)
        stepped: dict[TopicPartition, int] = {}  # the core's fetch count after our own step of each partition
        while True:
            answers: dict[TopicPartition, wire.FetchPartitionResponse] = {}
            changes: list[asyncio.Future] = []
            ready = False  # an answer that cannot wait (an error, a divergence, a stale long-poll)
            budget = max(1, request.max_bytes)
            for tp, p in partitions.items():
                if follower and tp in stepped and self._fetched_since(request.replica_id, tp, stepped[tp], p):
                    # The follower has fetched from elsewhere since and moved on: this
                    # long-poll is old news. End it, so its newer request can come.
                    answers[tp], _ = self._state_answer(tp, p.partition)
                    ready = True
                    continue
                # The response stays near max_bytes: once it is spent, each further
                # partition carries at most its first batch (a reader must progress).
                answer, driver, now = self._fetch_partition(request.replica_id, tp, p,
                                                            max(1, min(budget, p.partition_max_bytes)), order=order)
                if follower:
                    stepped[tp] = driver.replica.fetch_count(request.replica_id) if driver is not None else -1
                budget -= len(answer.records or b"")
                answers[tp] = answer
                ready = ready or (now and not answer.records)
                if driver is not None:
                    changes.append(driver.changed())
            remaining = deadline - loop.time()
            if remaining <= 0 and wait_s > 0 and follower and log.isEnabledFor(logging.DEBUG):
                log.debug("fetch from replica %d waited %.0f ms for nothing", request.replica_id, wait_s * 1000)
            # min_bytes: the long-poll ends once that much is there (at least one byte).
            found_bytes = max(1, request.max_bytes) - budget
            if ready or found_bytes >= max(1, request.min_bytes) or remaining <= 0 or not changes:
                return self._fetch_response(answers)
            await asyncio.wait(changes, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)

    async def _fetch_in_session(self, request: wire.FetchRequest,
                                fetch: IncrementalFetch[TopicPartition, wire.FetchPartition], session_id: int,
                                partitions: Mapping[TopicPartition, wire.FetchPartition],
                                deadline: float) -> wire.FetchResponse:
        """A follower's session long-poll. Each wake steps only the session's active
        partitions and those whose driver changed (_Watch); every other partition's kept
        answer stands, and was sent in an earlier answer. While it waits, the follower counts
        as fetching at every position of the session (LeaderSessions.seen)."""
        self.fetch_sessions.began(session_id, now_ms())
        try:
            return await self._long_poll_session(request, fetch, session_id, partitions, deadline)
        finally:
            self.fetch_sessions.ended(session_id, now_ms())

    def replica_opened(self, tp: TopicPartition) -> None:
        """`tp`'s replica opened here: the session long-polls that answered it unready look at
        it now (at the next loop turn), not at their next poll."""
        for watch in self._awaiting_open.pop(tp, ()):
            if tp in watch.unready:
                watch.unready.discard(tp)
                watch.dirty.add(tp)
                watch.wake.set()

    def _end_long_poll(self, follower: int, epoch: int) -> None:
        """A follower's sessionless fetch naming no partition: answer its session fetch of
        `epoch` now, as it stands. Its fetcher sends one for partitions that joined while the
        long-poll waited: the next session fetch carries them at once. Abandoning the long-poll
        instead (closing its connection) left the session's state unknown, and the next fetch,
        full, carried every partition followed here: while thousands of partitions opened,
        most session fetches were full.

        The two travel on two connections, so this request may come before the long-poll it
        names: that one is then answered as soon as it arrives. Ending nothing then (as before)
        left the newcomers out of the session until the long-poll ran out, up to
        fetch_wait_ms_max. A request naming a long-poll answered already ends nothing: the
        session's next fetch has the next epoch."""
        session_id = self.fetch_sessions.waiting_session(follower)
        watch = self._watches.get(session_id) if session_id is not None else None
        if watch is not None and watch.epoch == epoch:
            watch.end_now = True
            watch.wake.set()
        else:
            if len(self._end_on_arrival) >= END_ON_ARRIVAL_MAX and follower not in self._end_on_arrival:
                del self._end_on_arrival[next(iter(self._end_on_arrival))]   # bounded, whoever asks
            self._end_on_arrival[follower] = epoch

    async def _long_poll_session(self, request: wire.FetchRequest,
                                 fetch: IncrementalFetch[TopicPartition, wire.FetchPartition], session_id: int,
                                 partitions: Mapping[TopicPartition, wire.FetchPartition],
                                 deadline: float) -> wire.FetchResponse:
        loop = asyncio.get_running_loop()
        notes = self.fetch_sessions.notes(session_id)
        watch = self._watch(session_id, fetch, partitions)
        watch.epoch = fetch.epoch
        watch.end_now = self._end_on_arrival.pop(request.replica_id, None) == fetch.epoch
        answers: dict[TopicPartition, wire.FetchPartitionResponse] = {}
        stepped: dict[TopicPartition, int] = {}  # the core's fetch count after our own step of each partition
        replica_id = request.replica_id
        # Each partition's position as this fetch holds it (sent now, or earlier and kept:
        # omitted means unchanged) is the follower's word as of this fetch.
        order = (session_id, fetch.epoch, 0)
        while True:
            watch.wake.clear()
            look = watch.active | watch.dirty
            watch.dirty.clear()
            if watch.unready and loop.time() >= watch.unready_due_s:
                look |= watch.unready   # those still without a replica go back below
                for tp in watch.unready:
                    self._not_awaiting_open(tp, watch)
                watch.unready.clear()
            ready = False  # an answer that cannot wait (an error, a divergence, a stale long-poll)
            budget = max(1, request.max_bytes)
            for tp in sorted(look):
                p = partitions.get(tp)
                if p is None:   # left the session
                    watch.active.discard(tp)
                    continue
                quiet = notes.get(tp)
                if isinstance(quiet, _Quiet) and tp not in stepped:
                    stepped[tp] = quiet.fetches
                if tp in stepped and self._fetched_since(replica_id, tp, stepped[tp], p):
                    # The follower has fetched from elsewhere since (express) and moved on:
                    # this long-poll is old news. End it, so its newer request can come.
                    answers[tp], _ = self._state_answer(tp, p.partition)
                    ready = True
                    notes.pop(tp, None)
                    watch.active.add(tp)
                    continue
                if isinstance(quiet, _Quiet) and not quiet.changed.done():
                    answers[tp] = quiet.answer   # looked at for a change that was not its own
                    continue
                # The response stays near max_bytes: once it is spent, each further
                # partition carries at most its first batch (a reader must progress).
                answer, driver, now = self._fetch_partition(replica_id, tp, p,
                                                            max(1, min(budget, p.partition_max_bytes)), order=order)
                if driver is not None:
                    stepped[tp] = driver.replica.fetch_count(replica_id)
                else:   # nothing stepped: once open, its first look is a step, not "fetched since"
                    stepped.pop(tp, None)
                budget -= len(answer.records or b"")
                answers[tp] = answer
                if answer.error_code is ErrorCode.LEADER_NOT_AVAILABLE:
                    # Not served here yet (still opening, or its epoch start not stored): the
                    # session holds it, and its open or its epoch start's flush wakes this.
                    # Answering it at once ended the long-poll for nothing the follower can
                    # act on, a round per newcomer while thousands opened.
                    now = False
                quiet_now = not now
                if now and not answer.records:
                    # An error or a divergence the follower has heard already does not end a
                    # long-poll again: it would answer at once, omitting it, over and over.
                    now = self.fetch_sessions.carries(session_id, tp, False, _summary(answer))
                ready = ready or (now and not answer.records)
                if driver is None:
                    if not watch.unready:
                        watch.unready_due_s = loop.time() + NOT_READY_POLL_S
                    watch.unready.add(tp)
                    self._awaiting_open.setdefault(tp, set()).add(watch)
                    watch.active.discard(tp)
                    notes.pop(tp, None)
                    continue
                watch.hook(tp, driver)
                changed = watch.hooked[tp]
                if quiet_now:
                    notes[tp] = _Quiet(answer=answer, changed=changed, fetches=stepped[tp])
                    watch.active.discard(tp)
                else:   # records, an error or a divergence: step it each time
                    notes.pop(tp, None)
                    watch.active.add(tp)
            remaining = deadline - loop.time()
            found_bytes = max(1, request.max_bytes) - budget
            if ready or found_bytes >= max(1, request.min_bytes) or remaining <= 0 or watch.end_now:
                carried = self.fetch_sessions.answer(
                    session_id, {tp: (bool(a.records), _summary(a)) for tp, a in answers.items()})
                return self._fetch_response({tp: answers[tp] for tp in carried}, session_id)
            # A session whose partitions are all still opening here (their errors answered
            # once) waits here too, for an open or the unready poll, rather than answer
            # nothing at once, over and over.
            if watch.unready:
                remaining = min(remaining, max(watch.unready_due_s - loop.time(), 0.0))
            try:
                async with asyncio.timeout(remaining):
                    await watch.wake.wait()
            except TimeoutError:
                pass

    def follower_fetching(self, tp: TopicPartition, replica_id: int, in_isr: bool = True) -> StillFetching | None:
        """What this broker's fetch sessions know of follower `replica_id` on `tp`, for the
        core's caught-up rule (PartitionDriver.tick): its kept position and when it was last
        seen fetching there (an earlier sighting only for an ISR member's clock, never to join)."""
        seen = self.fetch_sessions.seen(replica_id, tp, now_ms(), earlier=in_isr)
        if seen is None:
            return None
        position, seen_ms = seen
        return StillFetching(replica_id=replica_id, fetch_offset=position.fetch_offset, seen_ms=seen_ms)

    def sessions_holding(self, tp: TopicPartition, replica_ids: tuple[int, ...],
                         slack_ms: int) -> tuple[int, ...] | None:
        """The session ids of followers `replica_ids` here if each holds `tp` and is live
        (LeaderSessions.holding), in that order; None if any does not."""
        now = now_ms()
        found = []
        for replica_id in replica_ids:
            session_id = self.fetch_sessions.holding(replica_id, tp, now, slack_ms)
            if session_id is None:
                return None
            found.append(session_id)
        return tuple(found)

    def sessions_live(self, session_ids: tuple[int, ...], slack_ms: int) -> bool:
        """Every one of these sessions is still live (LeaderSessions.live)."""
        now = now_ms()
        return all(self.fetch_sessions.live(session_id, now, slack_ms) for session_id in session_ids)

    def _watch(self, session_id: int, fetch: IncrementalFetch[TopicPartition, wire.FetchPartition],
               partitions: Mapping[TopicPartition, wire.FetchPartition]) -> _Watch:
        """The session's watch, brought up to this fetch: what it names is stepped again, what
        it forgets is dropped. A full fetch starts a new one (and drops those of sessions gone)."""
        watch = self._watches.get(session_id)
        if watch is None or fetch.full:
            for sid, old in list(self._watches.items()):
                if sid == session_id or sid not in self.fetch_sessions:
                    old.unhook()
                    for tp in old.unready:
                        self._not_awaiting_open(tp, old)
                    del self._watches[sid]
            watch = self._watches[session_id] = _Watch()
            watch.active.update(partitions)
            return watch
        watch.active.update(fetch.changed)
        for tp in fetch.removed:
            watch.active.discard(tp)
            watch.dirty.discard(tp)
            if tp in watch.unready:
                watch.unready.discard(tp)
                self._not_awaiting_open(tp, watch)
            watch.hooked.pop(tp, None)   # its callback, when it runs, finds nothing hooked
        return watch

    def _not_awaiting_open(self, tp: TopicPartition, watch: _Watch) -> None:
        waiting = self._awaiting_open.get(tp)
        if waiting is not None:
            waiting.discard(watch)
            if not waiting:
                del self._awaiting_open[tp]

    def _session_receive(self, request: wire.FetchRequest) -> tuple[
            int, Mapping[TopicPartition, wire.FetchPartition], IncrementalFetch[TopicPartition, wire.FetchPartition]]:
        """A follower's session fetch applied to its session: (session id, every partition it
        follows here at its position, sent now or earlier; the fetch as received)."""
        fetch: IncrementalFetch[TopicPartition, wire.FetchPartition] = IncrementalFetch(
            session_id=request.session_id, epoch=request.session_epoch,
            changed={TopicPartition(t.topic, p.partition): p for t in request.topics for p in t.partitions},
            removed=frozenset(TopicPartition(t.topic, p) for t in request.forgotten_topics for p in t.partitions),
            full=request.session_epoch == FULL_EPOCH)
        session_id, _, positions = self.fetch_sessions.receive(fetch, owner=request.replica_id)
        if fetch.removed and self.on_session_left is not None:
            for tp in fetch.removed:
                self.on_session_left(tp)
        return session_id, positions, fetch

    def _fetched_since(self, replica_id: int, tp: TopicPartition, fetches: int, p: wire.FetchPartition) -> bool:
        driver = self.replicas.get(*tp)
        return driver is not None and driver.replica.fetched_since(replica_id, fetches, p.fetch_offset,
                                                                   p.last_fetched_epoch)

    def _state_answer(self, tp: TopicPartition, partition: int
                      ) -> tuple[wire.FetchPartitionResponse, PartitionDriver | None]:
        driver, error = self._locate(*tp)
        if driver is None:
            return wire.FetchPartitionResponse(partition=partition, error_code=error,
                                               current_leader=self._current_leader(*tp)), None
        r = driver.replica
        return wire.FetchPartitionResponse(
            partition=partition, high_watermark=r.high_watermark, last_stable_offset=r.high_watermark,
            log_start_offset=driver.log.log_start_offset, log_end_offset=driver.log.log_end_offset,
            current_leader=wire.LeaderIdAndEpoch(leader_id=self.broker_id, leader_epoch=r.leader_epoch)), driver

    def _fetch_partition(self, replica_id: int, tp: TopicPartition, p: wire.FetchPartition, message_bytes_max: int,
                         order: FetchOrder | None = None
                         ) -> tuple[wire.FetchPartitionResponse, PartitionDriver | None, bool]:
        """(answer, driver to wait on, whether to answer now). `message_bytes_max`: this
        partition's share of the request's byte budget; `order`: where a follower's fetch stands
        among those it sent (FetchRequest.order)."""
        def refuse(code: ErrorCode):
            return fetch_refusal(p.partition, code, self._current_leader(*tp)), None, True

        driver, error = self._locate(*tp)
        if driver is None:
            return refuse(error)
        try:
            a = driver.fetch(fetch_from_wire(replica_id, tp, p, max_bytes=message_bytes_max, order=order))
        except BiplaneError as exc:
            return refuse(exc.code)
        answer = fetch_answer_to_wire(p.partition, a, log_start_offset=driver.log.log_start_offset,
                                      leader_if_error=self._current_leader(*tp) if a.error is not ErrorCode.NONE
                                      else wire.NO_LEADER)
        now = bool(a.records) or a.error is not ErrorCode.NONE or a.diverging
        return answer, driver, now

    def _fetch_response(self, answers: dict[TopicPartition, wire.FetchPartitionResponse],
                        session_id: int = NO_SESSION) -> wire.FetchResponse:
        """The answer, with its partitions' errors counted: those sent, not each look of a
        long-poll at a partition that cannot be answered yet."""
        by_topic: dict[str, list[wire.FetchPartitionResponse]] = {}
        for (topic, _), a in answers.items():
            by_topic.setdefault(topic, []).append(a)
            if a.error_code is not ErrorCode.NONE:
                self.counters.error("FetchRequest", a.error_code)
        return wire.FetchResponse(session_id=session_id, topics=tuple(
            wire.FetchTopicResponse(topic=t, partitions=tuple(ps)) for t, ps in by_topic.items()))

    # ------------------------------------------------------------ push replication

    async def append_entries(self, request: wire.AppendEntriesRequest) -> wire.AppendEntriesResponse:
        """A push leader's append-entries, stepped into this follower's core (before the first
        await, so one connection's requests reach the core in order)."""
        if self.heard is not None:
            self.heard(request.leader_id)
        if (request.topic, request.partition) == PAIR_TP:   # the broker pair's heartbeat: contact only
            return wire.AppendEntriesResponse(follower_id=self.broker_id, leader_epoch=-1, topic=request.topic,
                                              partition=request.partition)
        driver, error = self._locate(request.topic, request.partition)
        if driver is None:
            self.counters.error("AppendEntriesRequest", error)
            return append_refusal(request, error, replica_id=self.broker_id, leader_epoch=-1)
        try:
            return await answer_append_entries(request, driver.step, flushed=driver.flushed_to)
        except BiplaneError as exc:
            self.counters.error("AppendEntriesRequest", exc.code)
            return append_refusal(request, exc.code, replica_id=self.broker_id,
                                  leader_epoch=driver.replica.leader_epoch)

    # ------------------------------------------------------------ list offsets

    def list_offsets(self, request: wire.ListOffsetsRequest) -> wire.ListOffsetsResponse:
        topics = []
        for t in request.topics:
            parts = []
            for p in t.partitions:
                driver, error = self._locate(t.topic, p.partition)
                offset, timestamp, epoch = -1, -1, -1
                if driver is not None:
                    error, offset, timestamp = driver.replica.list_offset(p.timestamp, p.current_leader_epoch)
                    if error is ErrorCode.NONE and offset >= 0:  # "none found" carries no epoch, as in Kafka
                        epoch = driver.replica.leader_epoch
                    elif error is ErrorCode.UNKNOWN_LEADER_EPOCH:
                        self.refresh_metadata()  # list_offset is read-only: it asks through us
                if error is not ErrorCode.NONE:
                    self.counters.error("ListOffsetsRequest", error)
                parts.append(wire.ListOffsetsPartitionResponse(partition=p.partition, error_code=error,
                                                               timestamp=timestamp, offset=offset,
                                                               leader_epoch=epoch))
            topics.append(wire.ListOffsetsTopicResponse(topic=t.topic, partitions=tuple(parts)))
        return wire.ListOffsetsResponse(topics=tuple(topics))

    def end_offset_for_epoch(self, topic: str, partition: int, epoch: int,
                             current_leader_epoch: int) -> tuple[ErrorCode, int, int]:
        """(error, epoch, end offset) of a client's OffsetForLeaderEpoch (the core's answer)."""
        driver, error = self._locate(topic, partition)
        if driver is None:
            self.counters.error("OffsetForLeaderEpoch", error)
            return error, -1, -1
        error, found, end = driver.replica.end_offset_for_epoch(epoch, current_leader_epoch)
        if error is ErrorCode.UNKNOWN_LEADER_EPOCH:
            self.refresh_metadata()  # read-only in the core: it asks through us
        if error is not ErrorCode.NONE:
            self.counters.error("OffsetForLeaderEpoch", error)
        return error, found, end

    # ------------------------------------------------------------ metadata

    def metadata(self, request: wire.MetadataRequest) -> wire.MetadataResponse:
        image = self.image()
        brokers = tuple(wire.MetadataBroker(node_id=b.broker_id, host=b.host, port=b.port, rack=b.rack)
                        for b in sorted(image.brokers.values(), key=lambda b: b.broker_id) if not b.fenced)
        names = sorted(image.topics) if request.topics is None else list(request.topics)
        topics = []
        for name in names:
            if name not in image.topics:
                topics.append(wire.MetadataTopic(topic=name, error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION))
                continue
            parts = []
            for info in image.topic_partitions(name):
                parts.append(wire.MetadataPartition(
                    partition=info.partition,
                    error_code=ErrorCode.NONE if info.leader is not None else ErrorCode.LEADER_NOT_AVAILABLE,
                    leader_id=info.leader if info.leader is not None else -1, leader_epoch=info.leader_epoch,
                    replicas=tuple(info.replicas), isr=tuple(info.isr),
                    offline_replicas=tuple(r for r in info.replicas if not image.is_unfenced(r))))
            topics.append(wire.MetadataTopic(topic=name, partitions=tuple(parts)))
        return wire.MetadataResponse(brokers=brokers, controller_id=-1, metadata_offset=image.offset,
                                     topics=tuple(topics))

    # ------------------------------------------------------------ producer ids

    async def init_producer_id(self, request: wire.InitProducerIdRequest) -> wire.InitProducerIdResponse:
        try:
            pid, epoch = await self.producer_ids.init(request.producer_id, request.producer_epoch)
        except BiplaneError as exc:
            code = exc.code if exc.code is not ErrorCode.UNKNOWN else ErrorCode.NOT_CONTROLLER
            self.counters.error("InitProducerIdRequest", code)
            return wire.InitProducerIdResponse(error_code=code)
        return wire.InitProducerIdResponse(producer_id=pid, producer_epoch=epoch)


__all__ = ["RequestHandler"]


def _summary(a: wire.FetchPartitionResponse) -> tuple:
    """What a session compares to decide whether a partition without records travels again."""
    return (a.error_code, a.high_watermark, a.log_start_offset, a.log_end_offset, a.diverging_epoch,
            a.current_leader, a.flush_after_append)
