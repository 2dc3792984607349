"""The replica manager: which partitions this broker holds, as the metadata says.

For each partition that lists this broker among its replicas it opens (or
creates) a PartitionLog in `<data_dir>/<topic>-<partition>/` and a driver
around a fresh replica core, and feeds it every change of the partition's
state (NewMetadata). A partition that leaves this broker (topic deleted,
reassigned away) is stopped, closed and its directory removed. A directory
remembers its topic id, so a topic deleted and re-created under the same name
while this broker was down does not inherit the old data.

It also runs the cores' clocks: one heap of timers, a replica ticked only when the time its
core asked for (Replica.next_tick_ms, told after every step) has come, at most once every
`tick_interval_ms`, so that idle replicas cost nothing however many there are. It carries
the core's messages for the controller: ISR proposals (alter-isr) and quorum
election reports.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import heapq
import itertools
import threading
import logging
import os
import shutil
import time
from typing import Callable, Iterable

from common import fds
from common.control_client import ControlClient
from common.durable import fsync_dir, temp_path, write_synced
from common.errors import BiplaneError
from common.eventloop import in_slices, step_aside
from common.heap import LongLivedFreezer
from common.metadata.image import MetadataImage, PartitionInfo, TopicInfo
from common.metadata.per_topic import PerTopic
from common.requests import AlterIsrRequest, ElectionReport, OfflineReplica
from common.tasks import TaskOwner
from common.topic_partition import TopicPartition
from common.usage import ReplicaUsage
from dataplane.broker.budget import ProduceBudget
from dataplane.broker.config import BrokerConfig
from dataplane.broker.metrics import BrokerMetrics
from dataplane.broker.parked import ParkedClocks, live_slack_ms
from dataplane.broker.partition import PartitionDriver, now_ms
from dataplane.log.cleaner import CompactionConfig, IoThrottle
from dataplane.log.interface import LogConfig
from dataplane.log.space import is_disk_full
from dataplane.replica.actions import ProposeIsr, ReportElection
from dataplane.replica.events import (
    AppendEntries, FetchRequest, IsrChangeAccepted, IsrChangeRefused, NewMetadata, StillFetching,
)
from dataplane.replica.state import PartitionState, ReplicationConfig

log = logging.getLogger("biplane.broker.replicas")

TOPIC_ID_FILE = "topic_id"
# Passes over every partition on the event loop (metadata, ticks) yield after this many
# partitions (the ticks step aside, common.eventloop.step_aside), so heartbeats, fetch
# sessions and requests run between slices however many partitions the broker holds.
PARTITIONS_PER_SLICE = 64
# The periodic passes of retention and the cleaner look at every replica for the few with
# work (a closed segment, a compacted topic): a look costs about a microsecond, so they
# yield after this many. In one go, at 10,000 replicas, each pass held the loop for 5-9 ms,
# a steady load's slowest requests.
LOOKS_PER_SLICE = 1000
# Replica changes kept for the fetcher's follow check (ReplicaManager.follow_changed_since).
FOLLOW_LOG_MAX = 4096
# Replicas opened at once (each in a thread: directory, log recovery, producer snapshot).
OPEN_PARALLELISM = 4
# Threads for the logs' fsyncs (FlushCoalescer): the loop hands each one over by the pool's
# submit, with no asyncio future chained to it (each chained future woke the loop once more).
FLUSH_THREADS = 6
# How often the parked leaders' sessions are looked at (run_parked): a follower that stops
# fetching is noticed this much after the session's slack (parked.py) at most.
PARK_CHECK_S = 0.5


def replica_dir_name(tp: TopicPartition) -> str:
    return f"{tp[0]}-{tp[1]}"


def partition_dir(data_dir: str, tp: TopicPartition) -> str:
    return os.path.join(data_dir, replica_dir_name(tp))


def log_config_of(topic: TopicInfo) -> LogConfig:
    c = topic.config
    deletes = c.retention_deletes  # cleanup_policy=compact alone: retention deletes nothing
    return LogConfig(segment_bytes=c.segment_bytes, segment_ms=c.segment_ms,
                     retention_bytes=None if c.retention_bytes < 0 or not deletes else c.retention_bytes,
                     retention_ms=None if c.retention_ms < 0 or not deletes else c.retention_ms)


def compaction_config_of(topic: TopicInfo) -> CompactionConfig:
    c = topic.config
    return CompactionConfig(delete_retention_ms=c.delete_retention_ms,
                            min_cleanable_dirty_ratio=c.min_cleanable_dirty_ratio,
                            min_compaction_lag_ms=c.min_compaction_lag_ms)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ByteTotals:
    """Bytes a broker (or one replica) has produced, replicated in and served since it started."""

    produce_bytes: int = 0
    replicated_bytes: int = 0
    fetch_bytes: int = 0

    @classmethod
    def of(cls, driver: PartitionDriver) -> ByteTotals:
        return cls(produce_bytes=driver.produce_bytes, replicated_bytes=driver.replicated_bytes,
                   fetch_bytes=driver.fetch_bytes)

    def plus(self, other: ByteTotals) -> ByteTotals:
        return ByteTotals(produce_bytes=self.produce_bytes + other.produce_bytes,
                          replicated_bytes=self.replicated_bytes + other.replicated_bytes,
                          fetch_bytes=self.fetch_bytes + other.fetch_bytes)


USAGE_FULL_EVERY_S = 30.0   # ReplicaManager.usage_report
# A full pass reads this many replicas again per report, so a report costs a bounded slice
# of one (10,000 replicas read in one report held the loop about 100 ms, once every
# USAGE_FULL_EVERY_S on every broker).
USAGE_REREADS_PER_REPORT = 256


@dataclasses.dataclass(frozen=True, kw_only=True)
class _KeptUsage:
    """A replica's row of the last usage report, as read then."""

    driver: PartitionDriver
    counters: tuple[int, int, int, int]  # produced bytes, records, fetched, replicated bytes
    figures: tuple[int | float, ...]
    usage: ReplicaUsage


@dataclasses.dataclass(frozen=True, kw_only=True)
class UsageReport:
    replicas: list[ReplicaUsage]
    log_bytes: int
    totals: ByteTotals


OpenKey = tuple[int, str, int]


def open_key(topic: TopicInfo, tp: TopicPartition) -> OpenKey:
    """Where a replica waiting to open stands (smallest first): the newest topic first, by its
    creation time in the metadata, then by name and partition. Every broker holds the same
    metadata, so every broker opens a backlog in the same order."""
    return -topic.created_at_ms, tp.topic, tp.partition


class NewestFirst:
    """At most `slots` holders at once; waiters enter by key, smallest first (`open_key`), and
    in arrival order on equal keys.

    A topic created while thousands of replicas open is served at once, not after them. And a
    partition's replicas open at about the same time on each of its brokers: a backlog entered
    in the order its metadata arrived (newest arrival first, as before) opened in a different
    order on each broker, since each learned the topics in its own batches, so a follower often
    opened seconds before its leader, was refused and backed off, and a follower opened more
    than a lag time after its leader left the ISR and had to join it again."""

    def __init__(self, slots: int) -> None:
        self._free = slots
        self._waiters: list[tuple[OpenKey, int, asyncio.Future[None]]] = []   # a heap
        self._arrivals = itertools.count()

    def entered(self, key: OpenKey) -> _Slot:
        """`async with slots.entered(key):` holds a slot."""
        return _Slot(self, key)

    async def _enter(self, key: OpenKey) -> None:
        if self._free > 0:
            self._free -= 1
            return
        waiter = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (key, next(self._arrivals), waiter))
        try:
            await waiter
        except asyncio.CancelledError:
            # A cancelled waiter stays in the heap, done: _release passes over it.
            if not waiter.cancelled():
                self._release()  # handed the slot as it was cancelled: pass it on
            raise

    def _release(self) -> None:
        while self._waiters:
            _, _, waiter = heapq.heappop(self._waiters)
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1


class _Slot:
    def __init__(self, slots: NewestFirst, key: OpenKey) -> None:
        self._slots = slots
        self._key = key

    async def __aenter__(self) -> None:
        await self._slots._enter(self._key)

    async def __aexit__(self, *exc: object) -> None:
        self._slots._release()


class CleanerStopped(Exception):
    """Ends a cleaning pass in its worker thread when the broker stops."""


class ReplicaManager:
    def __init__(self, *, config: BrokerConfig, control: ControlClient, clean_start: bool,
                 send_fetch: Callable[[int, TopicPartition, FetchRequest], None],
                 send_append_entries: Callable[[int, TopicPartition, AppendEntries], None],
                 refresh_metadata: Callable[[], None], metrics: BrokerMetrics | None = None,
                 data_dir_locked: bool = False, heap: LongLivedFreezer | None = None) -> None:
        self.config = config
        # The broker holds its data directory's lock: each replica's log then locks itself
        # in this process only, with no file held open for it (dataplane/log/lock.py).
        self.data_dir_locked = data_dir_locked
        # Told of each replica opened and removed (a broker process's; a test's has none).
        self.heap = heap
        self.metrics = metrics if metrics is not None else BrokerMetrics()
        self.broker_id = config.broker_id
        self.control = control
        self.clean_start = clean_start
        self._send_fetch = send_fetch
        # The request handler's fetch sessions, once it is built (PartitionDriver.tick).
        self.follower_fetching: Callable[[TopicPartition, int, bool], StillFetching | None] | None = None
        # ... and whether its followers' sessions hold a partition, live (park), or still are.
        self.sessions_holding: Callable[[TopicPartition, tuple[int, ...], int], tuple[int, ...] | None] | None = None
        self.sessions_live: Callable[[tuple[int, ...], int], bool] | None = None
        # ... and told of each replica opened here (a session waiting for it answers at once).
        self.on_opened: Callable[[TopicPartition], None] | None = None
        # Quiet leaders whose followers' caught-up clocks their sessions keep: no timer each.
        self.parked: ParkedClocks[TopicPartition] = ParkedClocks()
        # Counts the replicas' changes of role, leader epoch or liveness (Fetcher's follow
        # check); the partitions of the latest ones, from version _follow_log_start on.
        self.follow_changes = 0
        self._follow_log: list[TopicPartition] = []
        self._follow_log_start = 0
        self._send_append_entries = send_append_entries
        self._refresh_metadata = refresh_metadata
        self.drivers: dict[TopicPartition, PartitionDriver] = {}
        self.budget = ProduceBudget(unreplicated_bytes_max=config.unreplicated_bytes_max)
        self._fed: dict[TopicPartition, tuple] = {}
        self._isr_inflight: set[TopicPartition] = set()
        # The usage report's rows, and what it must read again: replicas stepped, opened or
        # removed since the last (`_usage_touched`) and those whose rates were not zero.
        self._usage_kept: dict[TopicPartition, _KeptUsage] = {}
        self._usage_touched: set[TopicPartition] = set()
        self._usage_busy: set[TopicPartition] = set()
        self._usage_sums = (0, 0, 0, 0, 0)   # the rows' counters and log bytes, added up
        self._usage_full_at = -USAGE_FULL_EVERY_S
        # The replicas a full pass still has to read again, a slice per report from
        # _usage_reread_at on (USAGE_REREADS_PER_REPORT).
        self._usage_rereads: list[TopicPartition] = []
        self._usage_reread_at = 0
        # The last report's rows (in _usage_kept's order) and each one's place: a report with
        # the same replicas copies the list and replaces the rows that changed, where building
        # it row by row cost 2 ms each second at 10,000 replicas. None: rebuild it.
        self._usage_rows: list[ReplicaUsage] | None = None
        self._usage_place: dict[TopicPartition, int] = {}
        self._usage_at: float | None = None   # when the previous report was made
        # Byte counters of the drivers already closed (moved away, reopened), so that the
        # broker's totals (usage_report) never go down within this process.
        self._retired_bytes = ByteTotals()
        self.counters_since_ms = int(time.time() * 1000)  # wall clock: readers compare it across reports
        self._tasks = TaskOwner()  # ISR proposals and election reports to the controller
        self._lock = asyncio.Lock()
        self._closed = False
        self._swept = False
        self.reopening: set[TopicPartition] = set()  # offline partitions opened again (offline.py)
        # After a crash: the replica directories the crash left (a stop before each is opened
        # again cannot count as clean; a brand-new data directory also starts without the
        # clean-shutdown marker, and holds none).
        self._left_by_crash = frozenset() if clean_start else _replica_dirs(config.data_dir)
        # Replicas being opened (a task each; server.py answers them "not available" meanwhile),
        # and replicas that left being closed and removed (a task each).
        self.opening: dict[TopicPartition, asyncio.Future[None]] = {}
        self._closing: dict[TopicPartition, asyncio.Future[None]] = {}
        self._image: MetadataImage | None = None  # the newest image applied
        # Timers: (due ms, sequence, partition) in a heap, and each partition's current due
        # time; an entry whose time is not its partition's current one is stale and skipped.
        self._timers: list[tuple[int, int, TopicPartition]] = []
        self._due: dict[TopicPartition, int] = {}
        self._timer_sequence = itertools.count()
        self._wake_at_ms: int | None = None  # when run_ticks means to wake (None: nothing due)
        self._timers_changed = asyncio.Event()  # a time earlier than that was set
        # Opening reads logs and producer snapshots: a few at a time, in threads of their own,
        # so that many new replicas neither stall the loop nor take every default worker.
        self._open_slots = NewestFirst(OPEN_PARALLELISM)
        self._opener = concurrent.futures.ThreadPoolExecutor(max_workers=OPEN_PARALLELISM,
                                                             thread_name_prefix="replica-open")
        self._flusher = concurrent.futures.ThreadPoolExecutor(max_workers=FLUSH_THREADS, thread_name_prefix="flush")
        # Assigned partitions whose open failed, with why (offline.py tries them again).
        self.open_failures: dict[TopicPartition, str] = {}
        # Partitions whose driver failed since (PartitionDriver._fail), for OfflineRecovery.
        self.failed: set[TopicPartition] = set()
        # Partitions whose log write (or open) failed, with the leader epoch the metadata stood at
        # then, until the metadata shows them out of leadership and the ISR; what the heartbeats
        # say of them (controller/decisions/offline.py), rebuilt on the loop, read by their thread.
        self._offline: dict[TopicPartition, int] = {}
        self.offline_latest: tuple[OfflineReplica, ...] = ()
        # Each hosted partition's topic as of the newest image (the cleaner reads its config).
        self._topics: dict[TopicPartition, TopicInfo] = {}
        # What on_metadata last walked: per topic, the partitions hosted here (a topic unchanged
        # since is skipped: an ISR change costs its topic, not every partition), and the
        # unfenced brokers it walked with.
        self._walked: PerTopic[frozenset[TopicPartition]] = PerTopic()
        self._walked_unfenced: frozenset[int] | None = None
        self._rewalk: set[str] = set()   # topics to walk again whatever the image says (a reopen)
        # One thread: one partition is cleaned at a time on this broker.
        self._cleaner = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="log-cleaner")
        self._cleaner_stop = threading.Event()
        # The cluster's log_cleaner_io_bytes_per_s when set (dynamic config), else the flag's.
        self.cleaner_io_bytes_per_s = config.log_cleaner_io_bytes_per_second

    def get(self, topic: str, partition: int) -> PartitionDriver | None:
        return self.drivers.get(TopicPartition(topic, partition))

    # ------------------------------------------------------------ metadata

    async def on_metadata(self, image: MetadataImage) -> None:
        """Apply an image to the replicas: feed the open ones, start opening the new ones,
        stop the ones that left. Nothing here waits on one partition's disk work: opens and
        closes run in tasks of their own (a few at a time, in threads), so a newer image
        is applied while earlier replicas are still opening; a replica still opening answers
        LEADER_NOT_AVAILABLE (retriable, server.py) and is fed the newest image once open."""
        async with self._lock:  # one image at a time (reopen shares the lock)
            if self._closed:
                return
            if self._image is not None and image.offset < self._image.offset:
                # An older image (a reopen's, taken before it awaited other reopens): the newest
                # one applies, or the replicas would be fed metadata they have moved past.
                image = self._image
            self._image = image
            self.cleaner_io_bytes_per_s = (image.cluster_config.log_cleaner_io_bytes_per_s
                                           or self.config.log_cleaner_io_bytes_per_second)
            unfenced = frozenset(image.unfenced_broker_ids())
            walk_all = unfenced != self._walked_unfenced   # every partition's fenced replicas may differ
            rewalk = set(self._rewalk)
            fed = 0
            topics = image.topics
            for name in sorted(topics):
                if not walk_all and name not in rewalk and self._walked.current(image, name) is not None:
                    continue
                topic = topics[name]
                hosted: set[TopicPartition] = set()
                for info in image.topic_partitions(name):
                    if self.broker_id not in info.replicas:
                        continue
                    fed += 1
                    if fed % PARTITIONS_PER_SLICE == 0:
                        # One loop turn, not step_aside's millisecond: applying leadership moves
                        # promptly matters more here (a failover walks every partition).
                        await asyncio.sleep(0)
                    hosted.add(info.tp)
                    self._topics[info.tp] = topic
                    driver = self.drivers.get(info.tp)
                    if driver is not None:
                        self._feed(driver, topic, info, image)
                    elif info.tp not in self.opening:
                        self.opening[info.tp] = asyncio.ensure_future(self._open_and_feed(info.tp))
                before = self._walked.last(name)
                self._walked.record(image, name, frozenset(hosted))
                if before is not None:
                    self._leave(before - hosted, image)
            for hosted_before in self._walked.drop_gone(image):
                self._leave(hosted_before, image)
            # Only a whole walk counts: one cut short (cancelled, failed) is done again in full.
            self._walked_unfenced = unfenced
            self._rewalk -= rewalk
            if self._offline:
                self._publish_offline()
            if not self._swept:
                # Replicas deleted or moved away while this broker was down.
                self._swept = True
                keep = {os.path.basename(partition_dir(self.config.data_dir, tp))
                        for hosted_tps in self._walked.values() for tp in hosted_tps}
                await asyncio.get_running_loop().run_in_executor(None, _remove_orphans, self.config.data_dir, keep)

    def _leave(self, tps: Iterable[TopicPartition], image: MetadataImage) -> None:
        """These partitions are no longer hosted here: their replicas stop."""
        for tp in tps:
            self._topics.pop(tp, None)
            if tp in self.drivers:
                self._remove(tp, image)

    def _hosted_topic(self, tp: TopicPartition) -> tuple[TopicInfo, PartitionInfo] | None:
        """The partition's topic and state in the newest image, if this broker holds a replica."""
        image = self._image
        info = image.get_partition(*tp) if image is not None else None
        if info is None or self.broker_id not in info.replicas:
            return None
        return image.topics[tp[0]], info  # type: ignore[union-attr]

    async def _open_and_feed(self, tp: TopicPartition) -> None:
        """Open one replica (after a close of the same directory in flight), then feed it the
        newest image; a replica that left meanwhile is closed and removed again."""
        try:
            closing = self._closing.get(tp)
            if closing is not None:
                await asyncio.wait([closing])
            hosted = self._hosted_topic(tp)
            if hosted is None:
                return  # left while a close of its directory finished
            async with self._open_slots.entered(open_key(hosted[0], tp)):
                hosted = self._hosted_topic(tp)
                if hosted is None or self._closed:
                    return  # left before its turn came
                driver = await self._open(*hosted)
            if driver is None:
                return
            now = self._hosted_topic(tp)
            if now is not None and now[0].topic_id == hosted[0].topic_id and not self._closed:
                self.drivers[tp] = driver
                if self.heap is not None:
                    self.heap.grown()
                self.usage_touched(tp)
                self._feed(driver, now[0], now[1], self._image)  # type: ignore[arg-type]
                if self.on_opened is not None:
                    self.on_opened(tp)
                return
            await driver.close()  # stopping, or the replica left (or its topic was re-created) while opening
            if not self._closed:
                await asyncio.get_running_loop().run_in_executor(None, shutil.rmtree, driver.directory, True)
                if now is not None:
                    self.opening[tp] = asyncio.ensure_future(self._open_and_feed(tp))  # the new topic's
                    return
        finally:
            if self.opening.get(tp) is asyncio.current_task():
                del self.opening[tp]

    async def settled(self) -> None:
        """Until no open or close started by metadata is in flight (tests, stopping)."""
        while self.opening or self._closing:
            await asyncio.wait([*self.opening.values(), *self._closing.values()])

    def _feed(self, driver: PartitionDriver, topic: TopicInfo, info: PartitionInfo, image: MetadataImage) -> None:
        fenced = frozenset(r for r in info.replicas if not image.is_unfenced(r))
        key = (info.leader_epoch, info.partition_epoch, info.fenced_for_election, info.isr, info.replicas,
               topic.config, fenced)
        before = self._fed.get(info.tp)
        if before == key:
            return
        self._fed[info.tp] = key
        if before is not None and before[5] != topic.config:
            # Retention, segment size and age apply to the open log from its next roll or
            # retention pass (they were read only when it opened).
            driver.log.config = log_config_of(topic)
        old_isr = before[3] if before is not None else None   # the ISR this replica was last fed
        if old_isr is not None and old_isr != info.isr and info.leader == self.broker_id:
            self.metrics.isr_changed(old_isr, info.isr)
        event = NewMetadata(partition=PartitionState.from_info(info),
                            config=ReplicationConfig.from_topic_config(topic.config), fenced_replicas=fenced)
        try:
            driver.step(event)
        except BiplaneError as exc:
            log.warning("%s-%d: metadata not applied: %s", *info.tp, exc)

    async def _open(self, topic: TopicInfo, info: PartitionInfo) -> PartitionDriver | None:
        directory = partition_dir(self.config.data_dir, info.tp)
        loop = asyncio.get_running_loop()

        def build() -> PartitionDriver:   # in an opener thread: one hand-off per replica, not two
            existed = _prepare_dir(directory, topic.topic_id, topic.ever_under_write)
            return PartitionDriver(
                broker_id=self.broker_id, tp=info.tp, directory=directory, log_config=log_config_of(topic),
                hooks=self, unclean_start=(existed and not self.clean_start) or info.tp in self.reopening,
                written_under_write=topic.ever_under_write,
                flush_debounce_ms=self.config.flush_debounce_ms,
                fetch_max_bytes=self.config.partition_fetch_max_bytes,
                push_heartbeat_ms=self.config.push_heartbeat_ms, budget=self.budget,
                parent_locked=self.data_dir_locked, flush_executor=self._flusher,
                on_fsync=self.metrics.observe_fsync, on_due=self.schedule_tick,
                follower_fetching=self._follower_fetching, on_follow_change=self._follow_changed,
                on_usage=self.usage_touched, on_park=self.park)

        try:
            driver = await loop.run_in_executor(self._opener, build)
        except (BiplaneError, OSError) as exc:
            # A full disk is logged once for the whole filesystem (dataplane/log/space.py) and
            # the open is tried again (dataplane/broker/offline.py): a warning here.
            log_fn = log.warning if is_disk_full(exc) else log.error
            hint = f"; {fds.open_files_hint(len(self.drivers))}" if fds.too_many_open_files(exc) else ""
            log_fn("cannot open %s-%d in %s: %s%s", *info.tp, directory, exc, hint,
                   extra={"event": "partition.open_failed", "topic": info.topic, "partition": info.partition})
            self.open_failures[info.tp] = f"opening it failed: {exc}"
            self.partition_offline(info.tp)
            return None
        self.open_failures.pop(info.tp, None)
        log.info("opened %s-%d at log end %d", *info.tp, driver.log.log_end_offset,
                 extra={"event": "partition.opened", "topic": info.topic, "partition": info.partition})
        return driver

    async def reopen(self, tp: TopicPartition, image: MetadataImage) -> bool:
        """Close a partition whose log went offline and open it again from disk, with the
        log's recovery; the core starts afresh from the log and `image`. True if it is open."""
        async with self._lock:
            driver = self.drivers.get(tp)
            if driver is not None and driver.failed is None:
                return True  # not offline (opened meanwhile)
            if driver is not None:
                del self.drivers[tp]
                self.usage_touched(tp)
                self._retired_bytes = self._retired_bytes.plus(ByteTotals.of(driver))
                self._fed.pop(tp, None)
                self.reopening.add(tp)  # its log was not closed by a clean stop of this broker
            self._rewalk.add(tp[0])     # the metadata pass below opens it, whatever changed
        try:
            if driver is not None:
                await driver.close()
                if self.heap is not None:
                    self.heap.shrunk()   # its reopening counts as grown
        finally:
            await self.on_metadata(image)
        opening = self.opening.get(tp)
        if opening is not None:
            await asyncio.wait([opening])
        if tp in self._offline:
            self._publish_offline()  # back online: a lone in-sync leader may now be given a new epoch
        return tp in self.drivers

    # ------------------------------------------------------------ offline replicas

    def partition_offline(self, tp: TopicPartition) -> None:
        """A driver's log write failed (PartitionDriver._fail) or its open did: say so in the
        heartbeats. Also a second failure (after a reopen, or before the controller acted): it
        is then offline again, at the newest epoch."""
        self.failed.add(tp)
        info = self._image.get_partition(*tp) if self._image is not None else None
        if info is not None:
            self._offline[tp] = max(self._offline.get(tp, -1), info.leader_epoch)
            self._publish_offline()

    def _publish_offline(self) -> None:
        """The heartbeats' `offline`, from the newest image (OfflineReplica.follow says until
        when, OfflineReplica.stands when the controller acts)."""
        image = self._image
        out = []
        for tp, leader_epoch in list(self._offline.items()):
            driver = self.drivers.get(tp)
            report = OfflineReplica(topic=tp[0], partition=tp[1], leader_epoch=leader_epoch,
                                    online=driver is not None and driver.failed is None).follow(
                image.get_partition(*tp) if image is not None else None, self.broker_id)
            if report is None:
                del self._offline[tp]
                continue
            self._offline[tp] = report.leader_epoch
            out.append(report)
        self.offline_latest = tuple(out)

    def _remove(self, tp: TopicPartition, image: MetadataImage) -> None:
        """Stop a replica that left this broker now; close it and remove its directory in a task
        (an open of the same partition waits for it)."""
        self.open_failures.pop(tp, None)
        driver = self.drivers.pop(tp)
        self.parked.leave(tp)
        self.usage_touched(tp)
        self._retired_bytes = self._retired_bytes.plus(ByteTotals.of(driver))
        self._fed.pop(tp, None)
        info = image.get_partition(*tp)
        topic = image.topics.get(tp[0])
        if info is not None and topic is not None:
            self._feed(driver, topic, info, image)  # lets the core stop (release producers, stop leading)
        self._closing[tp] = asyncio.ensure_future(self._close_and_delete(tp, driver))

    async def _close_and_delete(self, tp: TopicPartition, driver: PartitionDriver) -> None:
        try:
            await driver.close()
            if self.heap is not None:
                self.heap.shrunk()
            await asyncio.get_running_loop().run_in_executor(None, shutil.rmtree, driver.directory, True)
            log.info("removed replica %s-%d", *tp, extra={"event": "partition.removed", "topic": tp[0],
                                                             "partition": tp[1]})
        except Exception as exc:  # noqa: BLE001 - logged: a task of its own has no caller to raise to
            log.error("%s-%d: removing the replica failed: %r", *tp, exc,
                      extra={"event": "partition.close_failed", "topic": tp[0], "partition": tp[1]})
        finally:
            if self._closing.get(tp) is asyncio.current_task():
                del self._closing[tp]

    # ------------------------------------------------------------ core hooks

    def send_fetch(self, leader_id: int, tp: TopicPartition, request: FetchRequest) -> None:
        self._send_fetch(leader_id, tp, request)

    def send_append_entries(self, follower_id: int, tp: TopicPartition, message: AppendEntries) -> None:
        self._send_append_entries(follower_id, tp, message)

    def propose_isr(self, tp: TopicPartition, proposal: ProposeIsr) -> None:
        if tp in self._isr_inflight:
            return  # the core repeats its proposal on a timer until it is settled
        self._isr_inflight.add(tp)
        self._tasks.spawn(self._alter_isr(tp, proposal))

    async def _alter_isr(self, tp: TopicPartition, proposal: ProposeIsr) -> None:
        try:
            answer = await self.control.alter_isr(AlterIsrRequest(
                broker_id=self.broker_id, topic=tp[0], partition=tp[1], leader_epoch=proposal.leader_epoch,
                partition_epoch=proposal.partition_epoch, new_isr=proposal.new_isr))
            log.info("%s-%d ISR -> %s accepted", *tp, list(proposal.new_isr),
                     extra={"event": "partition.isr_changed", "topic": tp[0], "partition": tp[1]})
            driver = self.drivers.get(tp)
            if driver is not None:
                # The core takes the answer now (whether it settles its proposal is its rule).
                try:
                    driver.step(IsrChangeAccepted(partition=PartitionState.from_info(answer.partition)))
                except (BiplaneError, ValueError) as exc:
                    log.warning("%s-%d: accepted ISR change not applied: %s", *tp, exc)
        except BiplaneError as exc:
            log.info("%s-%d ISR -> %s refused: %s", *tp, list(proposal.new_isr), exc,
                     extra={"event": "partition.isr_refused", "topic": tp[0], "partition": tp[1]})
            driver = self.drivers.get(tp)
            if driver is not None:
                # The core tells a declined proposal from an unknown outcome (its rule is
                # in IsrChangeRefused): every answer goes to it as it came.
                try:
                    driver.step(IsrChangeRefused(leader_epoch=proposal.leader_epoch,
                                                 partition_epoch=proposal.partition_epoch,
                                                 new_isr=proposal.new_isr, error=exc.code, reason=str(exc)))
                except BiplaneError as step_exc:
                    log.warning("%s-%d: refusal not applied: %s", *tp, step_exc)
        finally:
            self._isr_inflight.discard(tp)

    def report_election(self, tp: TopicPartition, report: ReportElection) -> None:
        self._tasks.spawn(self._report(tp, report))

    async def _report(self, tp: TopicPartition, report: ReportElection) -> None:
        try:
            answer = await self.control.election_report(ElectionReport(
                broker_id=self.broker_id, topic=tp[0], partition=tp[1], fenced_epoch=report.fenced_epoch,
                last_epoch=report.last_epoch, end_offset=max(report.end_offset, 0),
                unclean=report.unclean))
        except BiplaneError as exc:
            log.info("%s-%d election report failed: %s", *tp, exc)
            return
        if not answer.accepted and answer.reason and not answer.reason.startswith("duplicate"):
            log.info("%s-%d election report at fenced epoch %d not kept: %s", *tp, report.fenced_epoch,
                     answer.reason)

    def refresh_metadata(self, tp: TopicPartition, reason: str) -> None:
        self._refresh_metadata()

    # ------------------------------------------------------------ clock, usage

    def _follower_fetching(self, tp: TopicPartition, replica_id: int, in_isr: bool) -> StillFetching | None:
        return self.follower_fetching(tp, replica_id, in_isr) if self.follower_fetching is not None else None

    def _follow_changed(self, tp: TopicPartition) -> None:
        self.follow_changes += 1
        self._follow_log.append(tp)
        if len(self._follow_log) > FOLLOW_LOG_MAX:
            dropped = len(self._follow_log) // 2
            del self._follow_log[:dropped]
            self._follow_log_start += dropped

    def follow_changed_since(self, version: int | None) -> tuple[int, set[TopicPartition] | None]:
        """(the current version, the partitions whose replica changed role, leader epoch or
        liveness since `version`); None for the partitions when they are no longer known (a
        caller that is that far behind, or new, looks at all of its own)."""
        if version is not None and version == self.follow_changes:
            return version, set()
        if version is None or version < self._follow_log_start:
            return self.follow_changes, None
        return self.follow_changes, set(self._follow_log[version - self._follow_log_start:])

    def park(self, tp: TopicPartition, followers: tuple[int, ...], lag_ms: int, other_due_ms: int | None) -> bool:
        """A quiet leader's offer (PartitionDriver._park): if every ISR follower's fetch session
        holds `tp` and is live, its caught-up clocks are theirs to keep (parked.py), and its
        timer is set for the core's other rules only. False (nothing done) otherwise."""
        if self.sessions_holding is None:
            return False
        sessions = self.sessions_holding(tp, followers, live_slack_ms(lag_ms))
        if sessions is None:
            return False
        self.schedule_tick(tp, other_due_ms)
        self.parked.park(tp, sessions=sessions, lag_ms=lag_ms)
        return True

    def unpark(self, tp: TopicPartition) -> None:
        """A follower's session no longer holds `tp`: tick it now if it was parked."""
        if self.parked.leave(tp):
            self.schedule_tick(tp, now_ms())

    async def run_parked(self) -> None:
        """Tick the parked leaders of each group whose sessions are no longer all live."""
        while True:
            await asyncio.sleep(PARK_CHECK_S)
            if self.sessions_live is not None and len(self.parked):
                now = now_ms()
                for tp in self.parked.stale(self.sessions_live):
                    self.schedule_tick(tp, now)

    def schedule_tick(self, tp: TopicPartition, due_ms: int | None) -> None:
        """A replica's core next wants a Tick at `due_ms` (None: at no time). A parked replica
        was stepped or ticked: its timer is its own again."""
        if self.parked:
            self.parked.leave(tp)
        if due_ms is None:
            self._due.pop(tp, None)
            return
        if self._due.get(tp) == due_ms:
            return
        self._due[tp] = due_ms
        heapq.heappush(self._timers, (due_ms, next(self._timer_sequence), tp))
        if len(self._timers) > 4 * len(self._due) + 256:
            # Mostly stale entries (every fetch moves a leader's lag timer): keep the current ones.
            self._timers = [(due, next(self._timer_sequence), t) for t, due in self._due.items()]
            heapq.heapify(self._timers)
        if self._wake_at_ms is None or due_ms < self._wake_at_ms:
            self._timers_changed.set()

    def _take_due(self, now: int) -> list[TopicPartition]:
        due: list[TopicPartition] = []
        while self._timers and self._timers[0][0] <= now:
            at, _, tp = heapq.heappop(self._timers)
            if self._due.get(tp) == at:
                del self._due[tp]
                due.append(tp)
        return due

    async def run_ticks(self) -> None:
        """Tick each replica whose timer is due; wake when the earliest timer is, but at most
        once every tick_interval_ms (the resolution ticking every replica had)."""
        interval = self.config.tick_interval_ms
        last_run = 0
        while True:
            now = now_ms()
            # Taken before ticking: a replica that asks again for a time already past waits
            # for the next pass.
            for i, tp in enumerate(self._take_due(now)):
                if i and i % PARTITIONS_PER_SLICE == 0:
                    await step_aside()
                    now = now_ms()
                driver = self.drivers.get(tp)
                if driver is None:
                    continue
                try:
                    driver.tick(now)
                except BiplaneError as exc:
                    log.debug("%s-%d tick: %s", *tp, exc)
            last_run = now
            self._timers_changed.clear()
            self._wake_at_ms = max(self._timers[0][0], last_run + interval) if self._timers else None
            timeout = None if self._wake_at_ms is None else max(self._wake_at_ms - now_ms(), 0) / 1000
            try:
                # asyncio.timeout, not wait_for: no task per wake (one per flush debounce under load).
                async with asyncio.timeout(timeout):
                    await self._timers_changed.wait()
            except TimeoutError:
                pass
            if self._wake_at_ms is not None:
                # Woken early by a nearer timer: still no sooner than the interval allows.
                rest = last_run + interval - now_ms()
                if rest > 0:
                    await asyncio.sleep(rest / 1000)

    async def run_retention(self) -> None:
        interval = self.config.retention_check_interval_ms / 1000
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(interval)
            wall_ms = int(time.time() * 1000)
            async for tp, driver in in_slices(list(self.drivers.items()), LOOKS_PER_SLICE):
                if driver.closed or driver.failed:
                    continue
                if driver.log.segment_count < 2:
                    continue  # only the active segment, which retention keeps: no thread hop each
                topic = self._topics.get(tp)
                if topic is not None and not topic.config.retention_deletes:
                    continue  # cleanup_policy=compact: the cleaner alone removes records
                # Only below the HW (Kafka's rule): a log start past uncommitted offsets would
                # restart a follower at offsets the leader could still cut.
                below = driver.replica.high_watermark
                try:
                    deleted = await loop.run_in_executor(
                        None, functools.partial(driver.log.apply_retention, wall_ms, below_offset=below))
                except (BiplaneError, OSError) as exc:
                    log.warning("%s-%d retention failed: %s", *tp, exc)
                    continue
                if deleted:
                    log.info("%s-%d retention deleted %d segment(s)", *tp, len(deleted))

    async def run_cleaner(self) -> None:
        """Compact the partitions of compacted topics, one at a time in the cleaner's thread,
        at most log_cleaner_io_bytes_per_second (or the cluster's log_cleaner_io_bytes_per_s,
        applied live), each replica (leader or follower) below its own HW. The topic's settings are read afresh for every pass."""
        interval = self.config.log_cleaner_interval_ms / 1000
        loop = asyncio.get_running_loop()
        stop = self._cleaner_stop

        def sleep(seconds: float) -> None:
            if stop.wait(seconds):
                raise CleanerStopped()
        throttle = IoThrottle(self.config.log_cleaner_io_bytes_per_second, sleep=sleep)

        def pace(moved_bytes: int) -> None:
            if stop.is_set():
                raise CleanerStopped()
            throttle(moved_bytes)
        while True:
            await asyncio.sleep(interval)
            async for tp, driver in in_slices(list(self.drivers.items()), LOOKS_PER_SLICE):
                throttle.bytes_per_second = self.cleaner_io_bytes_per_s   # live: read at every partition
                topic = self._topics.get(tp)
                if topic is None or not topic.config.compacted or driver.closed or driver.failed:
                    continue
                wall_ms = int(time.time() * 1000)
                below = max(driver.replica.high_watermark, 0)
                try:
                    result = await loop.run_in_executor(self._cleaner, functools.partial(
                        driver.log.clean, wall_ms, below_offset=below, config=compaction_config_of(topic),
                        throttle=pace))
                except CleanerStopped:
                    return
                except (BiplaneError, OSError) as exc:
                    if driver.closed:
                        continue  # closed (moved away, stopping) under the pass: nothing lost
                    log.warning("%s-%d compaction failed: %s", *tp, exc)
                    continue
                if result is not None and result.segments_cleaned:
                    log.info("%s-%d compaction removed %d record(s) from %d segment(s), %d -> %d bytes", *tp,
                             result.records_removed, result.segments_cleaned, result.bytes_before,
                             result.bytes_after, extra={"event": "partition.compacted", "topic": tp[0],
                                                        "partition": tp[1]})

    def usage_touched(self, tp: TopicPartition) -> None:
        """Its figures may have changed: the next usage report reads it again (told by the
        driver after each step that moved its log or HW, each produce it counts and each fetch
        answered with records, and here on open and removal)."""
        self._usage_touched.add(tp)

    def usage_report(self) -> UsageReport:
        """Per replica: sizes, offsets, and rates since the previous call; the logs' bytes on
        disk; and the bytes produced, replicated and fetched since the process started (the
        open replicas' counters plus those of every replica closed since).

        It costs what changed: only replicas touched since the previous call (their log or HW
        moved, a produce or a fetch counted, opened, removed) or whose rates were not zero are
        read again; the others keep their row, the same ReplicaUsage object, and the sums are
        moved by the rows read. At thousands of idle replicas a walk over all of them each second was a
        chunk of milliseconds on the loop. Every USAGE_FULL_EVERY_S a pass reads all of them
        again, for what changes outside a step (retention, compaction), in slices of
        USAGE_REREADS_PER_REPORT per report."""
        now = time.monotonic()
        if self._usage_reread_at >= len(self._usage_rereads) and now - self._usage_full_at >= USAGE_FULL_EVERY_S:
            self._usage_full_at = now
            self._usage_rereads, self._usage_reread_at = list(set(self.drivers) | set(self._usage_kept)), 0
        end = self._usage_reread_at + USAGE_REREADS_PER_REPORT
        reread = set(self._usage_rereads[self._usage_reread_at:end])
        self._usage_reread_at = end
        # A row not read at the previous report had the same counters then (nothing touched it).
        elapsed = max(now - self._usage_at, 1e-3) if self._usage_at is not None else 1e-3
        self._usage_at = now
        touched, self._usage_touched = self._usage_touched, set()
        look = touched | self._usage_busy | reread
        sums = list(self._usage_sums)
        changed: list[tuple[TopicPartition, ReplicaUsage]] = []
        for tp in look:
            d = self.drivers.get(tp)
            kept = self._usage_kept.get(tp)
            if kept is not None and kept.driver is not d:   # gone, or reopened as another driver
                del self._usage_kept[tp]
                self._usage_rows = None
                self._usage_busy.discard(tp)
                for k, v in enumerate((*kept.counters, kept.figures[0])):
                    sums[k] -= int(v)
                kept = None
            if d is None or d.closed:
                continue
            counters = (d.produce_bytes, d.produce_records, d.fetch_bytes, d.replicated_bytes)
            before = kept.counters if kept is not None else counters
            rates = tuple(max(0.0, (c - b) / elapsed) for c, b in zip(counters[:3], before[:3]))
            if kept is not None and tp not in reread and tp not in touched:
                figures = kept.figures[:4] + rates   # not stepped since: only its rates moved
            else:
                figures = (d.log.size_bytes, d.log.log_start_offset, d.log.log_end_offset,
                           max(d.replica.high_watermark, 0), *rates)
            if kept is None or kept.figures != figures:
                # Unchanged figures keep their object: the heartbeat's incremental report
                # (common/usage.py, UsageReports) tells an idle replica by identity.
                usage = ReplicaUsage(
                    topic=tp[0], partition=tp[1], size_bytes=int(figures[0]), log_start_offset=int(figures[1]),
                    log_end_offset=int(figures[2]), high_watermark=int(figures[3]),
                    produce_bytes_per_s=figures[4], produce_records_per_s=figures[5], fetch_bytes_per_s=figures[6])
                changed.append((tp, usage))
            else:
                usage = kept.usage
            old = (*kept.counters, kept.figures[0]) if kept is not None else (0, 0, 0, 0, 0)
            for k, (v, o) in enumerate(zip((*counters, figures[0]), old)):
                sums[k] += int(v) - int(o)
            self._usage_kept[tp] = _KeptUsage(driver=d, counters=counters, figures=figures, usage=usage)
            if any(rates):
                self._usage_busy.add(tp)
            else:
                self._usage_busy.discard(tp)
        self._usage_sums = (sums[0], sums[1], sums[2], sums[3], sums[4])
        if self._usage_rows is None:
            self._usage_rows = [k.usage for k in self._usage_kept.values()]
            self._usage_place = {tp: i for i, tp in enumerate(self._usage_kept)}
        elif changed:
            # A new list: the heartbeat thread keeps the last one as the base of its next report.
            # A new replica's row goes at the end, as in _usage_kept: while thousands open, the
            # list and its places were rebuilt every second.
            rows = list(self._usage_rows)
            for tp, usage in changed:
                place = self._usage_place.get(tp)
                if place is None:
                    self._usage_place[tp] = len(rows)
                    rows.append(usage)
                else:
                    rows[place] = usage
            self._usage_rows = rows
        retired = self._retired_bytes
        return UsageReport(replicas=self._usage_rows, log_bytes=sums[4],
                           totals=ByteTotals(produce_bytes=retired.produce_bytes + sums[0],
                                             replicated_bytes=retired.replicated_bytes + sums[3],
                                             fetch_bytes=retired.fetch_bytes + sums[2]))

    async def close(self) -> list[str]:
        """Close every replica; what keeps this stop from counting as clean (empty: none). A
        replica that failed, did not open, did not close, or may still lack records it counted
        under write (restarted after a crash and not caught up since) cannot vouch for its log:
        the next start must treat them as after a crash."""
        async with self._lock:
            self._closed = True
            # A pass in progress stops at its next read or write; its .cleaned file is
            # dropped when the log opens again.
            self._cleaner_stop.set()
            self._cleaner.shutdown(wait=False, cancel_futures=True)
            # Ended before the drivers close: none of them steps a driver that is closing.
            for exc in await self._tasks.cancel_and_wait():
                log.warning("controller request ended with %r", exc)
            # Opens in flight finish and close what they opened; those still waiting for a
            # turn see the broker stopping and open nothing.
            await self.settled()
            self._opener.shutdown(wait=False)
            # Together: each close flushes its log and writes a producer snapshot (fsyncs
            # in worker threads), so one after the other would add up with many partitions.
            drivers = list(self.drivers.values())
            unclean = [f"{d.tp[0]}-{d.tp[1]} offline" for d in drivers if d.failed is not None]
            unclean += [f"{d.tp[0]}-{d.tp[1]} not caught up since the last crash" for d in drivers
                        if d.failed is None and d.replica.may_lack_counted_records()]
            # A log that failed to open is as the last stop left it: as a crash left it after
            # one, or unflushed if it was offline in this run.
            unclean += [f"{tp[0]}-{tp[1]} not open" for tp in self.open_failures
                        if tp in self.reopening or replica_dir_name(tp) in self._left_by_crash]
            # A log not opened since the crash is as the crash left it.
            if self._left_by_crash and self._image is None:
                unclean.append("no metadata applied since the crash")
            unclean += [f"{tp[0]}-{tp[1]} not opened since the crash" for tp in self._topics
                        if tp not in self.drivers and tp not in self.open_failures
                        and replica_dir_name(tp) in self._left_by_crash]
            results = await asyncio.gather(*(d.close() for d in drivers), return_exceptions=True)
            for driver, result in zip(drivers, results):
                if isinstance(result, BaseException):
                    unclean.append(f"{driver.tp[0]}-{driver.tp[1]} close failed")
                    log.error("%s-%d: close failed: %r", *driver.tp, result,
                              extra={"event": "partition.close_failed", "topic": driver.tp[0],
                                     "partition": driver.tp[1]})
            self._flusher.shutdown(wait=False)
            return unclean


def _prepare_dir(directory: str, topic_id: str, entry_durable: bool = False) -> bool:
    """Make the directory hold data of `topic_id` only; True if it held data of it already.
    `entry_durable`: a new directory and its marker are on disk before this returns (a
    topic that has been under durability=write, whose records count before a flush)."""
    marker = os.path.join(directory, TOPIC_ID_FILE)
    try:
        with open(marker) as f:
            found = f.read().strip()
    except FileNotFoundError:
        found = None
    if found == topic_id:
        return True
    if os.path.isdir(directory):
        log.warning("wiping %s: it holds topic id %r, metadata says %r", directory, found, topic_id)
        shutil.rmtree(directory)
    os.makedirs(directory)
    # The marker's data is synced, its name not yet: under fsync the log's first flush syncs this
    # directory (its own) before anything in it counts, and a crash before that loses only an
    # empty log, which is opened again as new. One fsync per new replica instead of three. Under
    # write records count before a flush: a crash must not take the directory, so that the
    # replica restarts as one that may lack them (unclean), not as a new one.
    tmp = temp_path(marker)
    write_synced(tmp, (topic_id + "\n").encode())
    os.replace(tmp, marker)
    if entry_durable:
        fsync_dir(directory)
        fsync_dir(os.path.dirname(os.path.abspath(directory)))
    return False


def _replica_dirs(data_dir: str) -> frozenset[str]:
    """The names of the replica directories in `data_dir` (those holding a topic id)."""
    return frozenset(n for n in os.listdir(data_dir) if os.path.isfile(os.path.join(data_dir, n, TOPIC_ID_FILE)))


def _remove_orphans(data_dir: str, keep: set[str]) -> None:
    for name in sorted(_replica_dirs(data_dir) - keep):
        path = os.path.join(data_dir, name)
        log.info("removing %s: no replica of it is assigned here", path, extra={"event": "partition.orphan_removed"})
        shutil.rmtree(path, ignore_errors=True)

