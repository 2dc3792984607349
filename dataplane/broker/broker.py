"""Broker: wires the listener, metadata learner, lifecycle, replica manager and fetcher together.

    async with Broker(config) as broker:   # listening, registering, replicating
        print(broker.port)
        await broker.wait_stopped()
    # or: await broker.stop()  (idempotent; writes the clean-shutdown marker)
"""
from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from typing import Any

from common.control_client import ControlClient
from common.eventloop import LoopStalls, LoopWatchdog
from common.errors import BiplaneError
from common.heap import LongLivedFreezer
from common.metadata.image import MetadataImage
from common.metadata.per_topic import PerTopic
from common.metrics import MetricsServer
from common.tasks import cancel_and_wait
from common.topic_partition import TopicPartition
from common.requests import UnreachablePeer
from common.usage import BrokerUsage
from dataplane.broker.config import BrokerConfig
from dataplane.broker.contact import Expected, PeerContact, topic_links
from dataplane.broker.fetcher import Fetcher
from dataplane.broker.listener import start_pipelined_server
from dataplane.broker.lifecycle import (
    HeartbeatThread,
    Lifecycle,
    take_clean_shutdown_marker,
    write_clean_shutdown_marker,
)
from dataplane.broker.metadata import MetadataLearner
from dataplane.broker.metadata_lag import MetadataLag
from dataplane.broker.metrics import BrokerCollector, BrokerMetrics, Counters, GroupCollector
from dataplane.broker.offline import OfflineRecovery
from dataplane.broker.partition import PartitionDriver, now_ms
from dataplane.broker.producer_ids import ProducerIds
from dataplane.broker.pusher import Pusher
from dataplane.broker.replicas import ReplicaManager
from dataplane.broker.budget import ProduceBudget
from dataplane.replica.state import Role
from dataplane.groups import lag as group_lag
from dataplane.groups.driver import GroupCoordinator, OffsetsTopicSettings
from dataplane.groups.events import GroupConfig
from dataplane.kafka.listener import start_kafka_server
from dataplane.kafka.registry import Context as KafkaContext, TopicDefaults
from dataplane.broker.server import RequestHandler
from dataplane.log.lock import DirectoryLock

log = logging.getLogger("biplane.broker")

# A stall this long is logged (WARNING, event "loop.stall"): a sixth of the session
# timeout (1.5 s), so a few of them in a row show before the controller fences us.
LOOP_STALL_WARN_MS = 250.0
LINKS_REFRESH_MS = 250   # Broker.expected_links


class Broker:
    def __init__(self, config: BrokerConfig, *, heap: LongLivedFreezer | None = None) -> None:
        self.config = config
        self.heap = heap   # told of replicas opened and removed (the process's; none in tests)
        self.port: int | None = None
        self.metrics_port: int | None = None
        self.kafka_port: int | None = None
        self._started = False
        self._stopped = False
        self._stop_event: asyncio.Event | None = None
        self._tasks: list[asyncio.Task] = []
        self._server: asyncio.AbstractServer | None = None
        self._kafka_server: asyncio.AbstractServer | None = None
        self._metrics_server: MetricsServer | None = None
        self._dir_lock: DirectoryLock | None = None
        # Built by start(); stop() closes whichever exist (start may fail half way).
        self.control: ControlClient | None = None
        self.fetcher: Fetcher | None = None
        self.pusher: Pusher | None = None
        self.replicas: ReplicaManager | None = None
        self.lifecycle: Lifecycle | None = None
        self._heartbeats: HeartbeatThread | None = None
        self._usage_latest: BrokerUsage | None = None
        self.contact = PeerContact()
        self._links_for: MetadataImage | None = None
        # Per topic, for the reassignment throttle: the partitions this broker is being added
        # to, and the followers being added to those it leads.
        self._adding: PerTopic[tuple[frozenset[TopicPartition], frozenset[tuple[int, TopicPartition]]]] = PerTopic()
        self._links: dict[str, tuple[Expected, ...]] = {}   # per topic (expected_links)
        self._links_per_topic: PerTopic[tuple[Expected, ...]] = PerTopic()
        self._links_unfenced: frozenset[int] | None = None
        self._links_at_ms = -LINKS_REFRESH_MS
        self._unreachable_latest: tuple[UnreachablePeer, ...] = ()   # read by the heartbeat thread
        self.learner: MetadataLearner | None = None
        self.handler: RequestHandler | None = None
        self.groups: GroupCoordinator | None = None
        # Heartbeats and fetch sessions share this loop with every partition: how long it
        # stalls is measured and exported (biplane_broker_event_loop_*), and logged.
        self.watchdog = LoopWatchdog(name=f"broker {config.broker_id}",
                                     stall_warn_ms=LOOP_STALL_WARN_MS)
        # This broker's registry (docs/metrics.md): hot paths update its instruments, the
        # collector reads the rest when scraped; served when config.metrics_port is set.
        self.metrics = BrokerMetrics()
        self.metrics.exposition.add(BrokerCollector(self))
        self.metrics.exposition.add(GroupCollector(self))

    async def __aenter__(self) -> "Broker":
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()

    async def start(self) -> None:
        if self._started:
            return
        self._started = True
        self._stop_event = asyncio.Event()
        self.watchdog.start()
        c = self.config
        os.makedirs(c.data_dir, exist_ok=True)
        # One broker per data dir: a second one fails here. Under this lock each partition's
        # log locks itself in this process only (no file held per replica: lock.py).
        self._dir_lock = DirectoryLock(c.data_dir)
        clean = take_clean_shutdown_marker(c.data_dir)
        self.control = ControlClient(list(c.controller_urls), secret=c.cluster_secret,
                                     request_timeout_ms=c.request_timeout_ms,
                                     heartbeat_timeout_ms=c.heartbeat_timeout_ms)
        self.learner = learner = MetadataLearner(
            self.control, data_dir=c.data_dir, wait_ms_max=c.metadata_wait_ms_max,
            lag=MetadataLag(records_max=c.metadata_lag_records_max, duration_ms_max=c.metadata_lag_ms_max,
                            stuck_ms_max=c.metadata_stuck_ms_max))
        self.fetcher = Fetcher(broker_id=c.broker_id, address_of=self._address_of, deliver=self._deliver,
                               fetch_wait_ms_max=c.fetch_wait_ms_max, fetch_max_bytes=c.fetch_max_bytes,
                               fetch_error_backoff_ms=c.fetch_error_backoff_ms,
                               reconnect_backoff_ms_max=c.reconnect_backoff_ms_max,
                               request_timeout_ms=c.replica_request_timeout_ms, max_frame_bytes=c.max_frame_bytes,
                               on_round_trip=self.metrics.observe_pull, heard=self._heard,
                               on_session_fetch=self.metrics.observe_session_fetch,
                               on_session_error=self.metrics.observe_session_error, follows=self._follows,
                               follows_changed=self._follows_changed)
        self.pusher = Pusher(broker_id=c.broker_id, address_of=self._address_of, deliver=self._deliver,
                             max_frame_bytes=c.max_frame_bytes, on_round_trip=self.metrics.observe_push,
                             heard=self._heard, request_timeout_ms=c.replica_request_timeout_ms)
        self.replicas = replicas = ReplicaManager(
            config=c, control=self.control, clean_start=clean, send_fetch=self.fetcher.submit,
            send_append_entries=self.pusher.submit, refresh_metadata=self.learner.refresh_soon, metrics=self.metrics,
            data_dir_locked=True, heap=self.heap)   # self._dir_lock, taken above
        self.producer_ids = ProducerIds(self.control, broker_id=c.broker_id, block_size=c.producer_id_block_size)
        self.handler = RequestHandler(broker_id=c.broker_id, image=lambda: learner.image,
                                      replicas=self.replicas, producer_ids=self.producer_ids,
                                      refresh_metadata=self.learner.refresh_soon,
                                      fetch_wait_ms_max=c.fetch_wait_ms_max, metrics=self.metrics,
                                      heard=self._heard)
        replicas.follower_fetching = self.handler.follower_fetching
        replicas.sessions_holding = self.handler.sessions_holding
        replicas.sessions_live = self.handler.sessions_live
        replicas.on_opened = self.handler.replica_opened
        self.handler.on_session_left = replicas.unpark
        self.groups = GroupCoordinator(
            broker_id=c.broker_id, requests=self.handler, control=self.control,
            config=GroupConfig(initial_rebalance_delay_ms=c.group_initial_rebalance_delay_ms,
                               session_timeout_ms_min=c.group_min_session_timeout_ms,
                               session_timeout_ms_max=c.group_max_session_timeout_ms,
                               offsets_retention_ms=c.offsets_retention_minutes * 60_000),
            settings=OffsetsTopicSettings(partitions=c.group_offsets_partitions,
                                          replication_factor=c.group_offsets_replication_factor))
        self.handler.groups = self.groups
        self._server = await start_pipelined_server(self.handler.start, c.host, c.port,
                                                    max_frame_bytes=c.max_frame_bytes)
        self.port = self._server.sockets[0].getsockname()[1]
        if c.kafka_port is not None:
            self._kafka_server = await start_kafka_server(
                KafkaContext(requests=self.handler, control=self.control, broker_id=c.broker_id,
                             cluster_id="biplane", applied=self.learner.wait_applied,
                             topic_defaults=TopicDefaults(partitions=c.default_partitions,
                                                          replication_factor=c.default_replication_factor,
                                                          auto_create=c.auto_create_topics)),
                c.host, c.kafka_port, max_frame_bytes=c.max_frame_bytes)
            self.kafka_port = self._kafka_server.sockets[0].getsockname()[1]
        if c.metrics_port is not None:
            self._metrics_server = await MetricsServer.start(self.metrics.exposition, host=c.host,
                                                             port=c.metrics_port)
            self.metrics_port = self._metrics_server.port
        self.lifecycle = Lifecycle(self.control, broker_id=c.broker_id, host=c.client_host, port=self.port,
                                   kafka_port=self.kafka_port,
                                   rack=c.rack, priority=c.priority, clean_shutdown=clean,
                                   metadata_offset=lambda: learner.offset, usage=lambda: self._usage_latest,
                                   heartbeat_interval_ms=c.heartbeat_interval_ms,
                                   usage_interval_ms=c.usage_interval_ms,
                                   unreachable=lambda: self._unreachable_latest,
                                   # len() of a dict the loop changes: atomic, read from the heartbeat thread
                                   replicas_opening=lambda: self.replicas_opening,
                                   offline=lambda: replicas.offline_latest)
        self._usage_latest = self.usage()
        self._heartbeats = HeartbeatThread(
            self.lifecycle, loop_progress_s=lambda: self.watchdog.last_progress_s,
            loop_stack=self.watchdog.loop_stack,
            loop_stall_ms_max=c.heartbeat_loop_stall_ms_max,
            make_control=lambda: ControlClient(list(c.controller_urls), secret=c.cluster_secret,
                                               request_timeout_ms=c.request_timeout_ms,
                                               heartbeat_timeout_ms=c.heartbeat_timeout_ms))
        self._heartbeats.start()
        self.learner.add_listener(self._apply_cluster_config)
        self.learner.add_listener(self.replicas.on_metadata)
        self.learner.add_listener(self.groups.on_metadata)
        loop = asyncio.get_running_loop()
        offline = OfflineRecovery(self.replicas, lambda: learner.image, data_dir=c.data_dir,
                                  ready=learner.caught_up.is_set)
        for coro in (self.learner.run(), self._heartbeat_support(), self._follow_controller_leader(),
                     self._watch_links(), self.replicas.run_ticks(), self.replicas.run_parked(),
                     self.replicas.run_retention(), self.replicas.run_cleaner(), offline.run(),
                     self.groups.run_ticks(), self.pusher.run_pair_heartbeats(c.push_heartbeat_ms)):
            task = loop.create_task(coro)
            task.add_done_callback(self._task_ended)
            self._tasks.append(task)
        log.info("broker %d listening on %s:%d (clean_start=%s)", c.broker_id, c.host, self.port, clean,
                 extra={"event": "broker.started"})

    def _apply_cluster_config(self, image: MetadataImage) -> None:
        """Dynamic cluster config, live: the reassignment throttle and what it paces (the
        partitions this broker is adding, for its fetcher; the followers being added to the
        partitions it leads, for its pusher); the cleaner and the Kafka listener read the image
        themselves."""
        assert self.fetcher is not None and self.pusher is not None
        me = self.config.broker_id
        rate = image.cluster_config.reassignment_throttle_bytes_per_s
        adding: set[TopicPartition] = set()
        pushed: set[tuple[int, TopicPartition]] = set()
        for name in image.topics:
            known = self._adding.current(image, name)
            if known is None:
                parts = image.topic_partitions(name)
                known = (frozenset(p.tp for p in parts if me in p.adding),
                         frozenset((b, p.tp) for p in parts if p.leader == me for b in p.adding))
                self._adding.record(image, name, known)
            adding |= known[0]
            pushed |= known[1]
        self._adding.drop_gone(image)
        self.fetcher.configure_throttle(rate, frozenset(adding))
        self.pusher.throttle.configure(rate, frozenset(pushed))

    async def _heartbeat_support(self) -> None:
        """What the heartbeat thread needs from the loop: usage figures computed here (the
        replicas are the loop's to read), and notice when the thread ended by itself."""
        assert self._heartbeats is not None
        while True:
            self._usage_latest = self.usage()
            if self.learner is not None and self.lifecycle is not None:
                self.learner.note_committed(self.lifecycle.committed_offset)
            if not self._heartbeats.alive():
                raise RuntimeError(f"the heartbeat thread ended: {self._heartbeats.error!r}")
            await asyncio.sleep(self.config.usage_interval_ms / 1000)

    async def _follow_controller_leader(self) -> None:
        """The metadata long-poll goes where the heartbeats found the controller leader, once
        it lags what that leader committed (MetadataLearner.follow_leader)."""
        assert self.learner is not None and self.lifecycle is not None
        while True:
            self.learner.follow_leader(self.lifecycle.leader_url, self.lifecycle.committed_offset)
            await asyncio.sleep(self.config.heartbeat_interval_ms / 1000)

    def _heard(self, peer: int) -> None:
        # Link silence is on the monotonic clock (now_ms): a wall clock stepped by hours must
        # not make every link look silent (or revive a silent one).
        self.contact.heard(peer, now_ms())

    def expected_links(self) -> dict[str, tuple[Expected, ...]]:
        """The links to watch, one group per topic, worked out again when the metadata image
        changed (an applied batch replaces it), at most once per LINKS_REFRESH_MS, and then
        only for the topics whose partitions or settings changed (the image replaces, never
        edits, what a record touches), or all of them when a broker's fencing changed. The
        same dict, and the same group for a topic unchanged, tell the link check what did
        not change. While thousands of replicas open, their ISR changes replace the image
        many times a second; a link watched up to that much late is nothing against its
        bound of seconds (and a report names the leader epoch, so one about an epoch gone is
        not acted on)."""
        assert self.learner is not None
        image = self.learner.image
        now = now_ms()
        if self._links_for is not image and now - self._links_at_ms >= LINKS_REFRESH_MS:
            self._links_for, self._links_at_ms = image, now
            unfenced = frozenset(image.unfenced_broker_ids())
            walk_all = unfenced != self._links_unfenced   # every partition's links may differ
            self._links_unfenced = unfenced
            links: dict[str, tuple[Expected, ...]] = {}
            for name in sorted(image.topics):
                group = None if walk_all else self._links_per_topic.current(image, name)
                if group is None:
                    fresh = topic_links(image, name, self.config.broker_id, self.config.peer_unreachable_ms)
                    old = self._links_per_topic.last(name)
                    group = old if old is not None and old == fresh else fresh
                    self._links_per_topic.record(image, name, group)
                links[name] = group
            self._links_per_topic.drop_gone(image)
            if links.keys() != self._links.keys() or any(links[n] is not self._links[n] for n in links):
                self._links = links
        return self._links

    async def _watch_links(self) -> None:
        """Keep the links silent past their bound ready for the heartbeat thread."""
        interval_ms = min(self.config.heartbeat_interval_ms, self.config.peer_unreachable_ms // 4)
        last = now_ms()
        while True:
            now = now_ms()
            if now - last > interval_ms + self.config.peer_unreachable_ms // 2:
                # This loop was stalled: the answers it would have seen were not read.
                self.contact.forget_silence()
            last = now
            silent = self.contact.unreachable(self.expected_links(), now)
            latest = tuple(UnreachablePeer(topic=e.tp.topic, partition=e.tp.partition, leader_epoch=e.leader_epoch,
                                           peer=e.peer) for e in silent)
            if latest != self._unreachable_latest:
                log.info("replication links silent past their bound: %s",
                         ", ".join(f"{u.topic}-{u.partition}@{u.leader_epoch}: broker {u.peer}" for u in latest)
                         or "none", extra={"event": "broker.links_silent"})
            self._unreachable_latest = latest
            await asyncio.sleep(interval_ms / 1000)

    def _task_ended(self, task: asyncio.Task) -> None:
        if task.cancelled() or self._stopped:
            return
        exc = task.exception()
        log.error("broker task %s ended: %r; stopping", task.get_coro(), exc, exc_info=exc)
        assert self._stop_event is not None
        self._stop_event.set()

    async def wait_stopped(self) -> None:
        assert self._stop_event is not None
        await self._stop_event.wait()

    def request_stop(self) -> None:
        if self._stop_event is not None:
            self._stop_event.set()

    async def stop(self, *, clean: bool = True) -> None:
        """Stop serving, close every log (flushing it) and write the clean-shutdown marker. Idempotent."""
        if self._stopped or not self._started:
            return
        self._stopped = True
        if self._stop_event is not None:
            self._stop_event.set()
        if clean and self.lifecycle is not None:
            # Still serving: leaderships move while this broker answers, so clients and
            # followers are redirected instead of waiting out its session.
            await self.lifecycle.controlled_shutdown()
        for server in (self._server, self._kafka_server):
            if server is not None:
                server.close()
        await cancel_and_wait(*self._tasks)  # a task that failed was logged when it ended
        if self.groups is not None:
            await self.groups.close()
        if self._heartbeats is not None:
            await asyncio.to_thread(self._heartbeats.stop)
        if self.fetcher is not None:
            await self.fetcher.close()
        if self.pusher is not None:
            await self.pusher.close()
        unclean: list[str] = []
        if self.replicas is not None:
            unclean = await self.replicas.close()
        if self.control is not None:
            await self.control.close()
        if self._metrics_server is not None:
            await self._metrics_server.close()
        self.metrics.exposition.close()
        self.watchdog.stop()
        if self._dir_lock is not None:
            if clean and self.replicas is not None:
                if unclean:
                    # Kafka's rule too: the marker vouches for every log, so one that cannot is enough.
                    log.warning("stopping without the clean-shutdown marker: %d replicas cannot vouch for their "
                                "logs (%s%s); the next start is treated as after a crash (this broker leaves "
                                "every ISR until it catches up)", len(unclean), ", ".join(unclean[:5]),
                                ", ..." if len(unclean) > 5 else "", extra={"event": "broker.stop_unclean"})
                else:
                    write_clean_shutdown_marker(self.config.data_dir)
            self._dir_lock.release()
        log.info("broker %d stopped", self.config.broker_id, extra={"event": "broker.stopped"})

    # ------------------------------------------------------------ glue

    def _address_of(self, broker_id: int) -> tuple[str, int] | None:
        if self.learner is None:
            return None
        info = self.learner.image.brokers.get(broker_id)
        return (info.host, info.port) if info is not None else None

    def _follows_changed(self, version: int | None) -> tuple[int, set[TopicPartition] | None]:
        return self.replicas.follow_changed_since(version) if self.replicas is not None else (-1, None)

    def _follows(self, tp: TopicPartition, leader_id: int) -> bool:
        driver = self.replicas.get(*tp) if self.replicas is not None else None
        return (driver is not None and not driver.closed and driver.failed is None
                and driver.replica.role is Role.FOLLOWER and driver.replica.leader_id == leader_id)

    def _deliver(self, tp: TopicPartition, event) -> None:
        driver = self.replicas.get(*tp) if self.replicas is not None else None
        if driver is None:
            return
        try:
            driver.step(event)
            # An empty answer leaves the core's next fetch due "now", sent on its next
            # tick: tick at once so the follower is long-polling again without a gap.
            driver.tick_if_due(now_ms())
        except BiplaneError as exc:
            log.warning("%s-%d: fetch answer not applied: %s", *tp, exc)
        except Exception:  # our bug: loud, but the session must go on serving other partitions
            log.exception("%s-%d: applying a fetch answer failed", *tp)

    # ------------------------------------------------------------ metrics (BrokerMetricsSource)

    @property
    def broker_id(self) -> int:
        return self.config.broker_id

    @property
    def metadata_offset(self) -> int:
        return self.learner.offset if self.learner is not None else -1

    @property
    def replicas_opening(self) -> int:
        return len(self.replicas.opening) if self.replicas is not None else 0

    @property
    def replicas_parked(self) -> int:
        return len(self.replicas.parked) if self.replicas is not None else 0

    @property
    def metadata_lag(self) -> tuple[int, float]:
        """(records, seconds) behind the controller's committed metadata."""
        if self.learner is None:
            return 0, 0.0
        lag = self.learner.lag
        return lag.records(), lag.duration_ms(int(time.monotonic() * 1000)) / 1000

    @property
    def metadata_image(self) -> MetadataImage:
        return self.learner.image if self.learner is not None else MetadataImage()

    @property
    def offline_replicas(self) -> int:
        if self.replicas is None:
            return 0
        failed = sum(1 for d in self.replicas.drivers.values() if d.failed is not None and not d.closed)
        return failed + len(self.replicas.open_failures)

    @property
    def fenced(self) -> bool:
        return self.lifecycle.fenced if self.lifecycle is not None else True

    @property
    def partition_drivers(self) -> dict[TopicPartition, PartitionDriver]:
        return self.replicas.drivers if self.replicas is not None else {}

    @property
    def produce_budget(self) -> ProduceBudget:
        assert self.replicas is not None, "metrics are served only once start() built the replica manager"
        return self.replicas.budget

    @property
    def request_counters(self) -> Counters:
        assert self.handler is not None, "metrics are served only once start() built the request handler"
        return self.handler.counters

    @property
    def loop_stalls(self) -> LoopStalls:
        return self.watchdog.stalls

    def usage(self) -> BrokerUsage:
        assert self.replicas is not None, "usage is reported only once start() built the replica manager"
        disk = shutil.disk_usage(self.config.data_dir)
        report = self.replicas.usage_report()
        totals = report.totals
        groups = group_lag.usage_report(self.groups.snapshot() if self.groups is not None else [])
        # Built from this broker's own figures, not from input: unvalidated (validating 10,000
        # rows cost 3 ms of the loop each second). The controller validates what it receives.
        return BrokerUsage.model_construct(
            broker_id=self.config.broker_id, at_ms=int(time.time() * 1000),
            disk_total_bytes=disk.total, disk_used_bytes=disk.used, disk_free_bytes=disk.free,
            replicas=report.replicas, log_bytes=report.log_bytes,
            counters_since_ms=self.replicas.counters_since_ms, produce_bytes_total=totals.produce_bytes,
            replicated_bytes_total=totals.replicated_bytes, fetch_bytes_total=totals.fetch_bytes,
            groups=groups.groups, groups_omitted=groups.groups_omitted, group_offsets_omitted=groups.offsets_omitted)

