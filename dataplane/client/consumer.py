"""The asyncio consumer: read a topic's partitions as a member of a consumer group, or the
partitions the caller assigns itself; seek, then poll or iterate.

    async with Consumer("events", group_id="billing") as consumer:     # a group member
        async for record in consumer:
            ...

    async with Consumer("events", from_beginning=True) as consumer:    # manual: every partition
        async for record in consumer:
            ...

Groups (group_id=...): the consumer joins the group through Kafka's classic group protocol,
so Biplane consumers and Kafka clients (librdkafka, Java, ...) can share one group. The
group's leader shares the subscribed topics' partitions among the members with the first
assignor in partition_assignment_strategy that every member has ("range", "roundrobin",
"cooperative-sticky"; cooperative rebalancing, KIP-429, when every configured assignor is
cooperative). A partition starts at the group's committed offset, else at auto_offset_reset.
Heartbeats go from a task of their own, so processing between polls does not starve them;
a consumer not polled for max_poll_interval_ms leaves the group and rejoins at its next
poll. Rebalances are performed inside poll() and close(): on_revoke(partitions) runs
after the consumer committed their processed positions (with enable_auto_commit) and
before they go to another member; on_assign(partitions) after their positions are known.
Partitions lost without a chance to commit (the group moved on without this consumer)
get on_revoke too. Offsets handed out by poll() (or the iterator) count as processed:
with enable_auto_commit they are committed every auto_commit_interval_ms, on revocation
and on close; commit(), commit_async() and committed() do it by hand. Processing that
blocks the event loop itself (CPU-bound work in the loop's thread) blocks heartbeats too:
run it in an executor.

Manual assignment (no group_id, or assign()/assign_topic() with no subscribe()): the caller
says which partitions to read; partitions added to a topic are not assigned by themselves:
assign_topic() again to read them too.

Fetching: each leader broker gets one FETCH request for all of its assigned partitions at
a time, on a connection used for fetches only (long polls never hold up anything else).
Brokers serve only records below the high watermark. Positions advance as records are
handed out; a leader change or an unknown-leader answer refreshes metadata and the fetch
goes to the new leader from the same position. Metadata older than metadata_max_age_ms is
refreshed too, while polling, so a leader moved without any error (a preferred-leader
rebalance, say) and new brokers are followed.
"""
from __future__ import annotations

import asyncio
import collections
import functools
import inspect
import logging
import time
from typing import Any, AsyncIterator, Callable, Iterable, Mapping, Sequence

from common.batch import INT64_MAX, read_records, scan_valid_prefix, validate_batch
from common.errors import (
    BiplaneError,
    ClientClosedError,
    ClientError,
    ErrorCode,
    OffsetCommitError,
    UnknownTopicError,
    error_for,
)
from common.tasks import cancel_and_wait, retrieve_exception
from common.wire import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    FetchPartition,
    FetchRequest,
    FetchTopic,
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsTopic,
)
from dataplane.client.assignors import assignors_for
from dataplane.client.group import GroupDriver
from dataplane.client.group_core import GroupSettings
from dataplane.client.network import Network, check_metadata_max_age_ms, parse_bootstrap
from dataplane.client.records import ConsumerRecord, TopicPartition

log = logging.getLogger("biplane.client.consumer")

_RESETS = ("earliest", "latest", "none")
DEFAULT_ASSIGNMENT_STRATEGY = ("range", "cooperative-sticky")   # Kafka's consumer default
POLLED_EVERY_S = 0.1   # the iterator tells the group it is alive at most this often
# A callback gets the partitions; it may be a plain function or a coroutine function.
RebalanceCallback = Callable[[set[TopicPartition]], Any]


class Consumer:
    """Options (keyword-only): bootstrap (default: the `biplane up` cluster), from_beginning
    (start assigned partitions at their earliest offset instead of their end),
    auto_offset_reset ("earliest", "latest" or "none": where to start a partition whose
    position is out of range, or, in a group, that has no committed offset),
    fetch_max_wait_ms, fetch_min_bytes, partition_max_bytes, fetch_max_bytes,
    buffered_records_max (records fetched but not yet handed out, per consumer),
    request_timeout_ms, unknown_topic_wait_ms, metadata_max_age_ms (default 300000, Kafka's
    metadata.max.age.ms: poll() refreshes metadata older than this although no error asked).

    Groups (Kafka's names and defaults): group_id (join this group; the topics given are
    subscribed), group_instance_id (static membership: a restart within the session keeps
    the partitions, no rebalance), session_timeout_ms (45000), heartbeat_interval_ms (3000),
    max_poll_interval_ms (300000, also the rebalance timeout), enable_auto_commit (True),
    auto_commit_interval_ms (5000), partition_assignment_strategy (assignor names in order
    of preference, default "range", "cooperative-sticky"), client_id."""

    def __init__(self, *topics: str, bootstrap: str | Sequence[str] | None = None, from_beginning: bool = False,
                 auto_offset_reset: str = "latest", fetch_max_wait_ms: int = 500, fetch_min_bytes: int = 1,
                 partition_max_bytes: int = 1024 * 1024, fetch_max_bytes: int = 50 * 1024 * 1024,
                 buffered_records_max: int = 10_000, request_timeout_ms: int = 30_000,
                 unknown_topic_wait_ms: int = 5_000, metadata_max_age_ms: int = 300_000,
                 group_id: str | None = None, group_instance_id: str | None = None,
                 session_timeout_ms: int = 45_000, heartbeat_interval_ms: int = 3_000,
                 max_poll_interval_ms: int = 300_000, enable_auto_commit: bool = True,
                 auto_commit_interval_ms: int = 5_000,
                 partition_assignment_strategy: str | Sequence[str] = DEFAULT_ASSIGNMENT_STRATEGY,
                 client_id: str = "biplane-consumer") -> None:
        if bootstrap is None:
            from dataplane.client.discovery import default_bootstrap
            bootstrap = default_bootstrap()
        if not all(isinstance(t, str) and t for t in topics):
            raise ValueError(f"the topics to read must be non-empty strings, got {list(topics)!r} "
                             "(Consumer('orders', 'payments', ...))")
        for name, flag in (("from_beginning", from_beginning), ("enable_auto_commit", enable_auto_commit)):
            if type(flag) is not bool:
                raise ValueError(f"{name}={flag!r} must be True or False")
        if auto_offset_reset not in _RESETS:
            raise ValueError(f"auto_offset_reset={auto_offset_reset!r} is not one of {_RESETS}")
        for name, value, low in (("fetch_max_wait_ms", fetch_max_wait_ms, 0), ("fetch_min_bytes", fetch_min_bytes, 0),
                                 ("partition_max_bytes", partition_max_bytes, 1),
                                 ("fetch_max_bytes", fetch_max_bytes, 1), ("buffered_records_max", buffered_records_max, 1),
                                 ("request_timeout_ms", request_timeout_ms, 1)):
            if not isinstance(value, int) or value < low:
                raise ValueError(f"{name}={value!r} must be an integer >= {low}")
        self.metadata_max_age_ms = check_metadata_max_age_ms(metadata_max_age_ms)
        self._network = Network(parse_bootstrap(bootstrap), request_timeout_ms=request_timeout_ms,
                                metadata_max_age_ms=metadata_max_age_ms)
        self._initial_topics = list(topics)
        self.from_beginning = from_beginning
        self.auto_offset_reset = "earliest" if from_beginning and auto_offset_reset == "latest" else auto_offset_reset
        self.fetch_max_wait_ms = fetch_max_wait_ms
        self.fetch_min_bytes = fetch_min_bytes
        self.partition_max_bytes = partition_max_bytes
        self.fetch_max_bytes = fetch_max_bytes
        self.buffered_records_max = buffered_records_max
        self.request_timeout_ms = request_timeout_ms
        self.unknown_topic_wait_ms = unknown_topic_wait_ms
        self._positions: dict[TopicPartition, int] = {}
        self._pending_reset: dict[TopicPartition, int] = {}   # tp -> timestamp to look up
        self._high_watermarks: dict[TopicPartition, int] = {}
        self._buffer: collections.deque[ConsumerRecord] = collections.deque()
        self._fetches: dict[int, asyncio.Task] = {}   # broker id -> its fetch; -1: a metadata refresh
        self._refresh: asyncio.Task | None = None
        self._started = False
        self._closed = False
        self.group_id = group_id
        self.enable_auto_commit = enable_auto_commit
        self.auto_commit_interval_ms = auto_commit_interval_ms
        self._group: GroupDriver | None = None
        if group_id is not None:
            self._group = GroupDriver(self._network, _group_settings(
                group_id=group_id, group_instance_id=group_instance_id, client_id=client_id,
                session_timeout_ms=session_timeout_ms, heartbeat_interval_ms=heartbeat_interval_ms,
                max_poll_interval_ms=max_poll_interval_ms, strategy=partition_assignment_strategy),
                request_timeout_ms=request_timeout_ms, metadata_max_age_ms=metadata_max_age_ms)
        elif group_instance_id is not None:
            raise ValueError("group_instance_id needs a group_id: static membership is membership of a group")
        if type(enable_auto_commit) is not bool:
            raise ValueError(f"enable_auto_commit={enable_auto_commit!r} must be True or False")
        if type(auto_commit_interval_ms) is not int or auto_commit_interval_ms < 1:
            raise ValueError(f"auto_commit_interval_ms={auto_commit_interval_ms!r} must be a positive integer")
        self._subscription: tuple[str, ...] = ()
        self._on_assign: RebalanceCallback | None = None
        self._on_revoke: RebalanceCallback | None = None
        self._announced: set[TopicPartition] = set()   # on_assign'ed and not yet on_revoke'd
        self._next_auto_commit_s = 0.0
        self._polled_s = 0.0
        self._auto_commit: asyncio.Task | None = None

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> "Consumer":
        if self._started:
            return self
        self._started = True
        if self._group is not None and self._initial_topics:
            await self.subscribe(self._initial_topics)
            return self
        for topic in self._initial_topics:
            await self.assign_topic(topic)
        return self

    async def __aenter__(self) -> "Consumer":
        return await self.start()

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop. In a group: commit the processed positions (enable_auto_commit), call on_revoke,
        leave the group (a static member stays, for its session); bounded by request_timeout_ms."""
        if self._closed:
            return
        if self._group is not None:
            try:
                await self._leave_group()
            finally:
                await self._group.stop()
                await cancel_and_wait(self._auto_commit)
        self._closed = True
        await cancel_and_wait(*self._fetches.values())
        self._fetches.clear()
        await self._network.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosedError("the consumer is closed; create a new one")

    # ------------------------------------------------------------ assignment and positions

    async def partitions_for(self, topic: str) -> list[TopicPartition]:
        meta = self._network.metadata
        deadline = time.monotonic() + self.unknown_topic_wait_ms / 1000
        while True:
            await self._network.refresh_metadata({topic})
            count = meta.partition_count(topic)
            if count:
                return [TopicPartition(topic, p) for p in range(count)]
            if time.monotonic() >= deadline:
                raise UnknownTopicError(f"topic {topic!r} does not exist (waited {self.unknown_topic_wait_ms} ms); "
                                        f"create it first: `biplane topic create {topic}`")
            await asyncio.sleep(0.1)

    async def assign_topic(self, topic: str) -> list[TopicPartition]:
        """Assign every partition of `topic` (in addition to what is assigned already)."""
        tps = await self.partitions_for(topic)
        await self.assign([tp for tp in tps if tp not in self._positions] + list(self._positions))
        return tps

    async def assign(self, partitions: Iterable[TopicPartition | tuple[str, int]]) -> None:
        """Read exactly these partitions. New ones start at the beginning or the end (from_beginning)."""
        self._check_open()
        if self._subscription:
            raise ValueError(f"this consumer is subscribed to {list(self._subscription)} in group "
                             f"{self.group_id!r}: the group assigns its partitions; assign() is for a consumer "
                             "that does not subscribe()")
        self._started = True
        tps = [TopicPartition(*tp) for tp in partitions]
        for tp in tps:
            if not isinstance(tp.partition, int) or tp.partition < 0:
                raise ValueError(f"partition {tp.partition!r} of {tp.topic!r} must be a non-negative integer")
        await self._check_exist(tps, ValueError)
        keep = set(tps)
        for tp in list(self._positions):
            if tp not in keep:
                self._forget(tp)
        for tp in tps:
            if tp not in self._positions and tp not in self._pending_reset:
                self._pending_reset[tp] = EARLIEST_TIMESTAMP if self.from_beginning else LATEST_TIMESTAMP
        await self._resolve_resets()

    # ------------------------------------------------------------ groups

    async def subscribe(self, topics: str | Iterable[str], *, on_assign: RebalanceCallback | None = None,
                        on_revoke: RebalanceCallback | None = None) -> None:
        """Read `topics` as a member of the consumer's group: the group's leader decides which of
        their partitions are this consumer's. Subscribing again replaces the topics (and rejoins).
        on_assign / on_revoke get a set of TopicPartition; each may be a coroutine function."""
        self._check_open()
        if self._group is None:
            raise ValueError("subscribe() needs a group: Consumer(..., group_id=\"NAME\"); without a group, "
                             "use assign() or assign_topic()")
        names = (topics,) if isinstance(topics, str) else tuple(topics)
        if not names or not all(isinstance(t, str) and t for t in names):
            raise ValueError(f"subscribe() needs one or more topic names, got {topics!r}")
        if self.assignment() and not self._subscription:
            raise ValueError(f"this consumer reads partitions it assigned itself "
                             f"({sorted(str(tp) for tp in self.assignment())}): a consumer either assigns or "
                             "subscribes; use another Consumer for the group")
        for callback, name in ((on_assign, "on_assign"), (on_revoke, "on_revoke")):
            if callback is not None and not callable(callback):
                raise ValueError(f"{name}={callback!r} is not callable")
        for topic in names:
            await self.partitions_for(topic)   # a clear error now for a topic that does not exist
        self._started = True
        self._subscription = tuple(dict.fromkeys(names))
        self._on_assign, self._on_revoke = on_assign, on_revoke
        self._next_auto_commit_s = time.monotonic() + self.auto_commit_interval_ms / 1000
        self._group.subscribe(self._subscription)

    def subscription(self) -> tuple[str, ...]:
        return self._subscription

    async def _maintain_group(self) -> None:
        """In the user's own time (poll): apply what the group decided, in order, and auto-commit."""
        group = self._group
        assert group is not None
        if group.fatal is not None:
            raise group.fatal
        group.polled()
        self._polled_s = time.monotonic()
        while (work := group.take_work()) is not None:
            if work.revoke or work.lost:
                await self._give_up(set(work.revoke or work.lost), commit=bool(work.revoke))
            if work.assign and not await self._take_up(set(work.assign)):
                group.work.appendleft(type(work)(assign=work.assign))   # at the next round
                break
        if group.fatal is not None:
            raise group.fatal
        if self.enable_auto_commit and time.monotonic() >= self._next_auto_commit_s and group.core.in_generation \
                and (self._auto_commit is None or self._auto_commit.done()):
            self._next_auto_commit_s = time.monotonic() + self.auto_commit_interval_ms / 1000
            offsets = self._processed()
            if offsets:
                self._auto_commit = asyncio.get_running_loop().create_task(self._commit_logged(offsets, "auto-commit"))

    def _processed(self, tps: Iterable[TopicPartition] | None = None) -> dict[TopicPartition, int]:
        """The positions to commit: the next offset after every record handed out."""
        wanted = self._positions if tps is None else {tp: self._positions[tp] for tp in tps if tp in self._positions}
        return dict(wanted)

    async def _commit_logged(self, offsets: dict[TopicPartition, int], what: str) -> None:
        assert self._group is not None
        try:
            await self._group.commit(offsets)
        except BiplaneError as exc:
            # The records stay uncommitted: the next owner reads them again (at least once).
            log.warning("group %r: %s of %d partition(s) failed: %s", self.group_id, what, len(offsets), exc)

    async def _give_up(self, tps: set[TopicPartition], *, commit: bool) -> None:
        assert self._group is not None
        try:
            if commit and self.enable_auto_commit:
                await self._commit_logged(self._processed(tps), "commit of revoked partitions")
            announced = tps & self._announced
            self._announced -= tps
            if announced:
                await _call(self._on_revoke, announced)
        finally:
            for tp in tps:
                self._forget(tp)
            self._group.revocation_done()

    async def _take_up(self, tps: set[TopicPartition]) -> bool:
        """Start reading newly assigned partitions; False if their committed offsets could not be
        read yet (the coordinator moving: try again)."""
        assert self._group is not None
        try:
            committed = await self._group.committed(sorted(tps))
        except BiplaneError as exc:
            log.info("group %r: reading the committed offsets of %s failed, retrying: %s", self.group_id,
                     sorted(str(tp) for tp in tps), exc)
            return False
        for tp in sorted(tps):
            offset = committed.get(tp)
            if offset is not None:
                self._pending_reset.pop(tp, None)
                self._positions[tp] = offset
            elif self.auto_offset_reset == "none":
                raise ClientError(f"group {self.group_id!r} has no committed offset for {tp} and "
                                  "auto_offset_reset='none': commit one (biplane group reset-offsets) or choose "
                                  "'earliest' or 'latest'", code=ErrorCode.OFFSET_OUT_OF_RANGE)
            else:
                self._pending_reset[tp] = EARLIEST_TIMESTAMP if self.auto_offset_reset == "earliest" \
                    else LATEST_TIMESTAMP
        try:
            await self._resolve_resets()
        except ClientError as exc:
            log.debug("offset lookup failed: %s", exc)   # poll() tries again
        self._announced |= tps
        await _call(self._on_assign, set(tps))
        return True

    async def _leave_group(self) -> None:
        group = self._group
        assert group is not None
        group.close()
        deadline = time.monotonic() + self.request_timeout_ms / 1000
        while (work := group.take_work()) is not None:
            if work.revoke or work.lost:
                await self._give_up(set(work.revoke or work.lost), commit=bool(work.revoke))
            # Partitions assigned but never started are dropped: the core revokes them with the rest.
        await group.wait_left(max(1, int((deadline - time.monotonic()) * 1000)))

    def _need_group(self, what: str) -> GroupDriver:
        self._check_open()
        if self._group is None:
            raise ValueError(f"{what} needs a group: Consumer(..., group_id=\"NAME\")")
        return self._group

    def _offsets(self, offsets: Mapping[TopicPartition | tuple[str, int], int] | None) -> dict[TopicPartition, int]:
        if offsets is None:
            return self._processed()
        out = {}
        for tp, offset in offsets.items():
            tp = TopicPartition(*tp)
            out[tp] = _int64(offset, f"offset {offset!r} for {tp}",
                             "the next offset to read (the last processed record's offset + 1)")
        return out

    async def commit(self, offsets: Mapping[TopicPartition | tuple[str, int], int] | None = None) -> None:
        """Commit, and wait for the coordinator's acknowledgement. Default: the position of every
        assigned partition (everything poll() handed out). Raises OffsetCommitError if refused."""
        group = self._need_group("commit()")
        await group.commit(self._offsets(offsets))

    def commit_async(self, offsets: Mapping[TopicPartition | tuple[str, int], int] | None = None
                     ) -> asyncio.Task[None]:
        """commit() in the background; the task returned raises what commit() would."""
        group = self._need_group("commit_async()")
        task = asyncio.get_running_loop().create_task(group.commit(self._offsets(offsets)))
        task.add_done_callback(retrieve_exception)   # an unawaited failure is not "never retrieved"
        return task

    async def committed(self, partitions: Iterable[TopicPartition | tuple[str, int]] | None = None
                        ) -> dict[TopicPartition, int | None]:
        """The group's committed offset per partition (None: none committed). Default: the assignment."""
        group = self._need_group("committed()")
        tps = sorted(TopicPartition(*tp) for tp in (self.assignment() if partitions is None else partitions))
        if not tps:
            return {}
        return await group.committed(tps)

    def _forget(self, tp: TopicPartition) -> None:
        self._positions.pop(tp, None)
        self._pending_reset.pop(tp, None)
        self._high_watermarks.pop(tp, None)
        self._buffer = collections.deque(r for r in self._buffer if (r.topic, r.partition) != tp)

    def assignment(self) -> set[TopicPartition]:
        return set(self._positions) | set(self._pending_reset)

    def _drop_buffered(self, tp: TopicPartition) -> None:
        self._buffer = collections.deque(r for r in self._buffer if (r.topic, r.partition) != tp)

    def _assigned(self, tp: TopicPartition | tuple[str, int]) -> TopicPartition:
        tp = TopicPartition(*tp)
        if tp not in self.assignment():
            raise ValueError(f"{tp} is not assigned to this consumer (assigned: "
                             f"{sorted(str(t) for t in self.assignment())})")
        return tp

    async def seek(self, tp: TopicPartition | tuple[str, int], offset: int) -> None:
        tp = self._assigned(tp)
        _int64(offset, f"offset {offset!r}", "the next offset to read")
        self._pending_reset.pop(tp, None)
        self._positions[tp] = offset
        self._drop_buffered(tp)

    async def seek_to_beginning(self, *tps: TopicPartition) -> None:
        await self._seek_to(tps, EARLIEST_TIMESTAMP)

    async def seek_to_end(self, *tps: TopicPartition) -> None:
        await self._seek_to(tps, LATEST_TIMESTAMP)

    async def seek_to_time(self, timestamp_ms: int, *tps: TopicPartition) -> None:
        """Position at the first record with a timestamp >= timestamp_ms (the end if none)."""
        await self._seek_to(tps, _int64(timestamp_ms, f"timestamp_ms {timestamp_ms!r}", "ms since the epoch"))

    async def _seek_to(self, tps: Sequence[TopicPartition | tuple[str, int]], timestamp: int) -> None:
        targets = [self._assigned(tp) for tp in tps] if tps else list(self.assignment())
        for tp in targets:
            self._positions.pop(tp, None)
            self._pending_reset[tp] = timestamp
            self._drop_buffered(tp)
        await self._resolve_resets()

    def position(self, tp: TopicPartition | tuple[str, int]) -> int | None:
        """The offset of the next record poll() will return for tp (None while a seek is pending)."""
        return self._positions.get(self._assigned(tp))

    def highwater(self, tp: TopicPartition | tuple[str, int]) -> int | None:
        """The partition's high watermark as of the last fetch (None before one)."""
        return self._high_watermarks.get(self._assigned(tp))

    def lag(self, tp: TopicPartition | tuple[str, int]) -> int | None:
        """Records committed but not yet returned: HW - position (None until both are known)."""
        tp = self._assigned(tp)
        hw, pos = self._high_watermarks.get(tp), self._positions.get(tp)
        return None if hw is None or pos is None else max(0, hw - pos)

    async def end_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return await self._list_offsets(await self._existing({TopicPartition(*tp): LATEST_TIMESTAMP for tp in tps}))

    async def beginning_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return await self._list_offsets(await self._existing({TopicPartition(*tp): EARLIEST_TIMESTAMP
                                                              for tp in tps}))

    async def _existing(self, wanted: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
        """`wanted`, once each of its partitions is known to exist (an unknown one was retried
        until request_timeout_ms and then failed with no reason given)."""
        self._check_open()
        await self._check_exist(wanted, UnknownTopicError)
        return wanted

    async def _check_exist(self, tps: Iterable[TopicPartition], error: Callable[[str], Exception]) -> None:
        """UnknownTopicError once a topic is still unknown after unknown_topic_wait_ms
        (partitions_for), and `error` naming the partitions a known topic does not have."""
        tps = list(tps)
        for topic in {tp.topic for tp in tps}:
            count = len(await self.partitions_for(topic))
            missing = sorted(tp.partition for tp in tps if tp.topic == topic and not 0 <= tp.partition < count)
            if missing:
                raise error(f"topic {topic!r} has {count} partition(s), 0 to {count - 1}: "
                            f"partition(s) {missing} do not exist")

    async def offsets_for_times(self, timestamps: Mapping[TopicPartition | tuple[str, int], int]
                                ) -> dict[TopicPartition, int]:
        """Per partition, the offset of the first record with a timestamp >= the one given (ms since
        the epoch); the partition's end when there is none."""
        wanted = {}
        for tp, ts in timestamps.items():
            key = TopicPartition(*tp)
            wanted[key] = _int64(ts, f"timestamp {ts!r} for {key}", "ms since the epoch")
        return await self._list_offsets(await self._existing(wanted))

    async def _resolve_resets(self) -> None:
        if not self._pending_reset:
            return
        wanted = dict(self._pending_reset)
        found = await self._list_offsets(wanted)
        for tp, offset in found.items():
            if self._pending_reset.get(tp) == wanted[tp]:
                del self._pending_reset[tp]
                self._positions[tp] = offset

    async def _list_offsets(self, wanted: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
        """LIST_OFFSETS against each leader; retries on stale metadata for up to request_timeout_ms."""
        meta = self._network.metadata
        result: dict[TopicPartition, int] = {}
        deadline = time.monotonic() + self.request_timeout_ms / 1000
        todo = dict(wanted)
        last_error: str = "no leader known for them"
        while todo:
            if any(meta.leader(tp) is None for tp in todo):
                await self._network.refresh_metadata({tp.topic for tp in todo})
            by_broker: dict[int, list[TopicPartition]] = {}
            for tp in todo:
                leader = meta.leader(tp)
                if leader is not None:
                    by_broker.setdefault(leader, []).append(tp)
            for broker, tps in by_broker.items():
                topics: dict[str, list[ListOffsetsPartition]] = {}
                for tp in tps:
                    topics.setdefault(tp.topic, []).append(ListOffsetsPartition(
                        partition=tp.partition, current_leader_epoch=meta.leader_epoch(tp), timestamp=todo[tp]))
                request = ListOffsetsRequest(topics=tuple(ListOffsetsTopic(topic=t, partitions=tuple(ps))
                                                          for t, ps in topics.items()))
                try:
                    response = await self._network.request(broker, request)
                except BiplaneError as exc:
                    last_error = str(exc)
                    for tp in tps:
                        meta.forget_leader(tp)
                    continue
                for topic in response.topics:
                    for p in topic.partitions:
                        tp = TopicPartition(topic.topic, p.partition)
                        if tp not in todo:
                            continue
                        if p.error_code == ErrorCode.NONE:
                            offset = p.offset
                            if offset < 0:   # no record at or after that time: the end
                                todo[tp] = LATEST_TIMESTAMP
                                continue
                            result[tp] = offset
                            del todo[tp]
                        elif p.error_code.retriable:
                            last_error = p.error_code.name
                            if p.error_code.invalid_metadata:
                                meta.forget_leader(tp)
                        else:
                            raise error_for(p.error_code, topic=tp.topic, partition=tp.partition,
                                            what="list offsets")
            if todo:
                if time.monotonic() >= deadline:
                    raise ClientError(f"could not look up offsets of {sorted(str(t) for t in todo)} within "
                                      f"request_timeout_ms={self.request_timeout_ms}: {last_error}",
                                      code=ErrorCode.REQUEST_TIMED_OUT)
                await asyncio.sleep(0.1)
                await self._network.refresh_metadata({tp.topic for tp in todo})
        return result

    # ------------------------------------------------------------ fetching

    async def poll(self, timeout_ms: int = 1000, *, max_records: int | None = None) -> list[ConsumerRecord]:
        """Records available within timeout_ms (maybe none), in offset order per partition."""
        self._check_open()
        await self.start()
        if not isinstance(timeout_ms, (int, float)) or timeout_ms < 0:
            raise ValueError(f"timeout_ms {timeout_ms!r} must be a non-negative number")
        return await self._poll(time.monotonic() + timeout_ms / 1000, max_records)

    async def _poll(self, deadline: float, max_records: int | None) -> list[ConsumerRecord]:
        group_waiter: asyncio.Task | None = None
        try:
            while True:
                if self._group is not None:
                    await self._maintain_group()
                    if group_waiter is None or group_waiter.done():
                        group_waiter = asyncio.get_running_loop().create_task(self._group.changed.wait())
                if self._buffer or not await self._fetch_round(deadline, group_waiter):
                    return self._take(max_records)
        finally:
            await cancel_and_wait(group_waiter)

    async def _fetch_round(self, deadline: float, group_waiter: asyncio.Task | None) -> bool:
        """One round of fetching: False once the deadline passed."""
        if self._pending_reset:
            try:
                await self._resolve_resets()
            except ClientError as exc:
                log.debug("offset lookup failed: %s", exc)
        self._start_fetches()
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        waiters = list(self._fetches.values()) + ([group_waiter] if group_waiter is not None else [])
        if not waiters:
            await asyncio.sleep(min(remaining, 0.1))
            return True
        done, _ = await asyncio.wait(waiters, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if task is not group_waiter:
                task.result()  # errors the fetch could not handle surface here
        return True

    def _take(self, max_records: int | None) -> list[ConsumerRecord]:
        out: list[ConsumerRecord] = []
        while self._buffer and (max_records is None or len(out) < max_records):
            record = self._buffer.popleft()
            tp = TopicPartition(record.topic, record.partition)
            position = self._positions.get(tp)
            if position is None or record.offset < position:
                continue   # unassigned or sought elsewhere since it was fetched
            # record.offset > position: control batches (or compaction) left a gap; step over it.
            self._positions[tp] = record.offset + 1
            out.append(record)
        return out

    def __aiter__(self) -> AsyncIterator[ConsumerRecord]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[ConsumerRecord]:
        # In a group, one record at a time: a record handed out counts as processed (the
        # README's rule, and Kafka's: the position moves past it), so a close() after a break
        # commits up to the record the loop broke on and none of the fetched records after it.
        # Records already fetched are handed out directly while the group has nothing to do.
        if self._group is None:
            while not self._closed:
                for record in await self.poll(timeout_ms=self.fetch_max_wait_ms, max_records=500):
                    yield record
            return
        while not self._closed:
            records = self._take(1) if self._buffer and not self._group_due() else \
                await self.poll(timeout_ms=self.fetch_max_wait_ms, max_records=1)
            for record in records:
                yield record

    def _group_due(self) -> bool:
        """Whether poll() has group work to do: the group's (rebalance work, an error), an
        auto-commit, or telling the group the consumer is alive (at most every 100 ms)."""
        group = self._group
        assert group is not None
        now = time.monotonic()
        return group.changed.is_set() or group.fatal is not None or now - self._polled_s >= POLLED_EVERY_S or \
            (self.enable_auto_commit and now >= self._next_auto_commit_s)

    def _start_fetches(self) -> None:
        if len(self._buffer) >= self.buffered_records_max:
            return
        meta = self._network.metadata
        buffered = {TopicPartition(r.topic, r.partition) for r in self._buffer}
        by_broker: dict[int, list[TopicPartition]] = {}
        missing = False
        for tp in self._positions:
            if tp in buffered:
                continue
            leader = meta.leader(tp)
            if leader is None:
                missing = True
            elif leader not in self._fetches:
                by_broker.setdefault(leader, []).append(tp)
        if missing or time.monotonic() * 1000 >= self._network.metadata_refresh_due_ms():
            self._spawn_refresh()
        for broker, tps in by_broker.items():
            task = asyncio.get_running_loop().create_task(self._fetch(broker, tps))
            self._fetches[broker] = task
            task.add_done_callback(functools.partial(self._forget_fetch, broker))

    def _forget_fetch(self, broker: int, task: asyncio.Task[None]) -> None:
        if self._fetches.get(broker) is task:
            del self._fetches[broker]

    def _spawn_refresh(self) -> None:
        if self._refresh is None or self._refresh.done():
            async def refresh() -> None:
                try:
                    await self._network.refresh_metadata({tp.topic for tp in self._positions})
                except BiplaneError as exc:
                    log.debug("metadata refresh failed: %s", exc)
                    await asyncio.sleep(0.2)
            self._refresh = asyncio.get_running_loop().create_task(refresh())
            self._fetches[-1] = self._refresh   # poll() wakes when it finishes
            self._refresh.add_done_callback(lambda t: self._fetches.pop(-1, None) if self._fetches.get(-1) is t else None)

    async def _fetch(self, broker: int, tps: list[TopicPartition]) -> None:
        meta = self._network.metadata
        asked = {tp: self._positions[tp] for tp in tps}
        topics: dict[str, list[FetchPartition]] = {}
        for tp, offset in asked.items():
            topics.setdefault(tp.topic, []).append(FetchPartition(
                partition=tp.partition, current_leader_epoch=meta.leader_epoch(tp), fetch_offset=offset,
                partition_max_bytes=self.partition_max_bytes))
        request = FetchRequest(max_wait_ms=self.fetch_max_wait_ms, min_bytes=self.fetch_min_bytes,
                               max_bytes=self.fetch_max_bytes, session_id=0, session_epoch=-1,
                               topics=tuple(FetchTopic(topic=t, partitions=tuple(ps)) for t, ps in topics.items()))
        try:
            response = await self._network.request(broker, request, purpose="fetch",
                                                   timeout_ms=self.request_timeout_ms + self.fetch_max_wait_ms)
        except BiplaneError as exc:
            log.debug("fetch from broker %d failed: %s", broker, exc)
            for tp in tps:
                if meta.leader(tp) == broker:
                    meta.forget_leader(tp)
            await asyncio.sleep(0.1)
            return
        if response.error_code != ErrorCode.NONE:
            log.debug("fetch from broker %d answered %s", broker, response.error_code.name)
            await asyncio.sleep(0.1)
            return
        for topic in response.topics:
            for p in topic.partitions:
                tp = TopicPartition(topic.topic, p.partition)
                if tp not in asked or self._positions.get(tp) != asked[tp]:
                    continue   # reassigned or sought while the fetch was out
                self._handle_partition(tp, asked[tp], p)

    def _handle_partition(self, tp: TopicPartition, fetch_offset: int, p: Any) -> None:
        meta = self._network.metadata
        code = p.error_code
        if code == ErrorCode.NONE:
            if p.high_watermark >= 0:
                self._high_watermarks[tp] = p.high_watermark
            records = p.records
            if records:
                self._decode_into_buffer(tp, fetch_offset, p.high_watermark, records)
            return
        if code == ErrorCode.OFFSET_OUT_OF_RANGE:
            if self.auto_offset_reset == "none":
                raise error_for(code, topic=tp.topic, partition=tp.partition, what=f"fetch at offset {fetch_offset}")
            self._positions.pop(tp, None)
            self._pending_reset[tp] = EARLIEST_TIMESTAMP if self.auto_offset_reset == "earliest" else LATEST_TIMESTAMP
            return
        if code.retriable:
            if code.invalid_metadata:
                if p.current_leader.leader_id >= 0:
                    meta.note_leader(tp, p.current_leader.leader_id, p.current_leader.leader_epoch)
                if code != ErrorCode.UNKNOWN_LEADER_EPOCH or p.current_leader.leader_id < 0:
                    meta.forget_leader(tp)
            return
        raise error_for(code, topic=tp.topic, partition=tp.partition, what=f"fetch at offset {fetch_offset}")

    def _decode_into_buffer(self, tp: TopicPartition, fetch_offset: int, high_watermark: int, records: Any) -> None:
        # A broker may cut the last batch short at partition_max_bytes: keep the whole ones.
        valid_bytes, headers = scan_valid_prefix(records)
        if not headers:
            validate_batch(records, 0)   # raises CorruptBatchError naming the fault if it is not a cut
            raise ClientError(f"{tp}: the batch at offset {fetch_offset} is larger than partition_max_bytes="
                              f"{self.partition_max_bytes}; raise it", code=ErrorCode.RECORD_LIST_TOO_LARGE)
        pos = 0
        appended = 0
        for header in headers:
            start, pos = pos, pos + header.size_bytes
            if header.is_control or header.next_offset <= fetch_offset:
                continue
            for r in read_records(records, start):
                if r.offset >= fetch_offset and (high_watermark < 0 or r.offset < high_watermark):
                    self._buffer.append(ConsumerRecord(topic=tp.topic, partition=tp.partition, offset=r.offset,
                                                       timestamp_ms=r.timestamp_ms, key=r.key, value=r.value,
                                                       headers=r.headers))
                    appended += 1
        if not appended and headers[-1].next_offset > fetch_offset:
            # Only control batches (or records already seen): step over them, or we would
            # fetch the same bytes for ever.
            self._positions[tp] = min(headers[-1].next_offset, high_watermark) if high_watermark >= 0 \
                else headers[-1].next_offset

def _group_settings(*, group_id: Any, group_instance_id: Any, client_id: Any, session_timeout_ms: Any,
                    heartbeat_interval_ms: Any, max_poll_interval_ms: Any, strategy: Any) -> GroupSettings:
    """The group options, checked with the field, the value and what is allowed."""
    if not isinstance(group_id, str) or not group_id:
        raise ValueError(f"group_id={group_id!r} must be a non-empty string")
    if group_instance_id is not None and (not isinstance(group_instance_id, str) or not group_instance_id):
        raise ValueError(f"group_instance_id={group_instance_id!r} must be a non-empty string (or None: "
                         "a dynamic member)")
    for name, value in (("session_timeout_ms", session_timeout_ms), ("heartbeat_interval_ms", heartbeat_interval_ms),
                        ("max_poll_interval_ms", max_poll_interval_ms)):
        if type(value) is not int or value < 1:
            raise ValueError(f"{name}={value!r} must be a positive integer (milliseconds)")
    if heartbeat_interval_ms >= session_timeout_ms:
        raise ValueError(f"heartbeat_interval_ms={heartbeat_interval_ms} must be below session_timeout_ms="
                         f"{session_timeout_ms} (Kafka's advice: a third of it at most)")
    return GroupSettings(group_id=group_id, group_instance_id=group_instance_id, client_id=str(client_id),
                         assignors=tuple(assignors_for(strategy)), session_timeout_ms=session_timeout_ms,
                         heartbeat_interval_ms=heartbeat_interval_ms, max_poll_interval_ms=max_poll_interval_ms)


async def _call(callback: RebalanceCallback | None, partitions: set[TopicPartition]) -> None:
    if callback is None:
        return
    result = callback(set(partitions))
    if inspect.isawaitable(result):
        await result


__all__ = ["Consumer"]


def _int64(value: object, what: str, meaning: str) -> int:
    """An offset or timestamp the caller gave: an int in 0..2**63-1 (Kafka's int64 on the wire;
    one past it could not be sent, and a consumer positioned there waited silently)."""
    if type(value) is not int or not 0 <= value <= INT64_MAX:
        raise ValueError(f"{what} must be an integer from 0 to {INT64_MAX}: {meaning}")
    return value
