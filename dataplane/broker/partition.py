"""PartitionDriver: one local replica — its on-disk log, its pure core, and the effects of its Readies.

The core decides; `perform` (dataplane/replica/perform.py, shared with the
simulation) performs each Ready in the core's written order: persist (Append and
Truncate inline on the log, Flush through the FlushCoalescer in a thread), then
send, answers, release, notes; a WriteDone goes back into the core once the
appends are written, and a FlushDone when a flush completes. This driver supplies
the effects (`persisted`, `flush`, `send_*`, `answer`, `release`, `note`). Appends run inline on the event loop: a
1 MiB append is a memcpy into the page cache (well under a millisecond), and
keeping it inline keeps the "applied before the next step" rule trivially true.

Messages the core sends to other brokers are handed to `hooks` (fetch requests
to the fetcher, ISR proposals and election reports to the controller); the
core's answers (Ready.answers) are returned by `step()` to the server that is
answering that fetch or append-entries.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import itertools
import logging
import time
from typing import Callable, Protocol

from common.batch import Buffer
from common.errors import (BiplaneError, ErrorCode, InvalidRequestError, LogTruncatedError,
                           PartitionOfflineError, StorageError)
from common.topic_partition import TopicPartition
from dataplane.broker.budget import ProduceBudget
from dataplane.broker.producer_state import BrokerProducerState, plain_entries
from dataplane.log.flusher import FlushCoalescer
from dataplane.log.interface import LogConfig
from dataplane.log.log import PartitionLog
from dataplane.log.space import offline_hint
from dataplane.replica.actions import (
    Append, NoteAction, PersistAction, ProposeIsr, Ready, RefreshMetadata, Rejected, ReleaseProduce, ReportElection, Send,
    StopLeading, Truncate, TruncateFully,
)
from dataplane.replica.core import UNKNOWN, Replica, Role, Unknown
from dataplane.replica.events import (
    AppendEntries, AppendEntriesReply, BrokerBudget, FetchRequest, FetchResponse, FlushDone, ProduceRequest,
    StillFetching, Tick, WriteDone,
)
from dataplane.replica.perform import perform

log = logging.getLogger("biplane.broker.partition")

# Producer snapshots between segment rolls (see PartitionDriver.__init__).
SNAPSHOT_EVERY_OFFSETS = 2048
SNAPSHOT_INTERVAL_S = 10.0
# An event moves the core's clock first when it is this old (Replica.move_clock; a Tick step
# when a timed rule is due by now): replicas are ticked only when a timer of theirs is due
# (ReplicaManager), and an event must not see an idle replica's old clock (a fetch would stamp
# a follower caught up seconds ago). Ticking every replica every 10 ms kept the clock as fresh.
CLOCK_STALE_MS = 10

# A follower core asks again after this long without an answer, until the fetcher says the
# leader's fetch session holds its request (FetchHeld): from then on it waits for the answer
# with no timer (a re-ask of a parked request was a step for nothing, for each of thousands of
# idle followers).
FETCH_RETRY_MS = 10_000
# A fetch answer left unapplied because the disk is full reaches the core this much later as a
# storage error, so that it asks again then (each retry fetches the same records, 10 a second
# while the disk stays full), not after FETCH_RETRY_MS: a follower in the ISR that waits that
# long after space is back holds every acks=all produce until the leader shrinks the ISR.
DISK_FULL_REFETCH_MS = 100


class DriverHooks(Protocol):
    def send_fetch(self, leader_id: int, tp: TopicPartition, request: FetchRequest) -> None: ...
    def send_append_entries(self, follower_id: int, tp: TopicPartition, message: AppendEntries) -> None: ...
    def propose_isr(self, tp: TopicPartition, proposal: ProposeIsr) -> None: ...
    def report_election(self, tp: TopicPartition, report: ReportElection) -> None: ...
    def refresh_metadata(self, tp: TopicPartition, reason: str) -> None: ...
    def partition_offline(self, tp: TopicPartition) -> None: ...


def now_ms() -> int:
    """The cores' clock for waits (timeouts, heartbeats, the ISR lag rule): monotonic
    milliseconds. It was the wall clock once, held at its last reading when stepped back: a
    clock stepped forward an hour and set right again held every timer of the broker still
    for that hour (push followers got no heartbeat, lost windows were never resent)."""
    return time.monotonic_ns() // 1_000_000


def wall_ms() -> int:
    """The cores' clock for what is compared with record timestamps: the epoch-start batch's
    stamp and producer expiry (retention and time lookups read both as wall-clock time)."""
    return time.time_ns() // 1_000_000


class PartitionDriver:
    def __init__(self, *, broker_id: int, tp: TopicPartition, directory: str, log_config: LogConfig,
                 hooks: DriverHooks, unclean_start: bool, written_under_write: bool = False,
                 flush_debounce_ms: int = 0,
                 fetch_max_bytes: int = 1024 * 1024, push_heartbeat_ms: int = 100, held_produce_max: int = 1000,
                 budget: ProduceBudget | None = None, on_fsync: Callable[[float], None] | None = None,
                 on_due: Callable[[TopicPartition, int | None], None] | None = None,
                 follower_fetching: Callable[[TopicPartition, int, bool], StillFetching | None] | None = None,
                 on_follow_change: Callable[[TopicPartition], None] | None = None,
                 on_usage: Callable[[TopicPartition], None] | None = None,
                 on_park: Callable[[TopicPartition, tuple[int, ...], int, int | None], bool] | None = None,
                 flush_executor: concurrent.futures.Executor | None = None, parent_locked: bool = False) -> None:
        self.tp = tp
        # Told after every step when the core next wants a Tick (Replica.next_tick_ms).
        self.on_due = on_due
        # That answer as of the last step: only time has passed since, so it still says
        # whether a timed rule is due (Replica.move_clock, asked before each event).
        self._due: int | None | Unknown = UNKNOWN
        # True while step() runs: a step it causes (the WriteDone of its appends, the Tick a
        # stale clock needs before an event) is nested and leaves the after-step work to it.
        self._stepping = False
        # What the leader's fetch sessions know of a follower here (Tick.fetching).
        self.follower_fetching = follower_fetching
        # Offered a quiet leader whose followers' sessions all hold it (ISR followers, lag time,
        # when the core's other timed rules are next due): True if the broker now times its
        # followers' clocks by their sessions (ReplicaManager.park) rather than by a Tick.
        self.on_park = on_park
        # Told when this replica may have started or stopped following a leader (its role or
        # leader epoch changed, it failed, it closed): the fetcher then checks its parked requests.
        self.on_follow_change = on_follow_change
        # Told after each step and each produce counted: its usage figures may have changed
        # (ReplicaManager.usage_report reads only such replicas again).
        self.on_usage = on_usage
        self.directory = directory
        self.hooks = hooks
        self.log = PartitionLog(directory, config=log_config, parent_locked=parent_locked)
        self.coalescer = FlushCoalescer(self.log, debounce_ms=flush_debounce_ms, on_fsync=on_fsync,
                                        executor=flush_executor)
        # Idempotent producers: from the newest snapshot plus the log past it (the
        # constructor runs in a worker thread: ReplicaManager._open); after a truncation
        # the table rebuilds itself in a worker thread (producer_state.py).
        self.producer_state = BrokerProducerState(name=f"{tp[0]}-{tp[1]}")
        loaded = self.producer_state.load(self.log)
        # A new, empty log has nothing to tell (one line per replica while thousands open).
        empty = loaded.snapshot_offset < 0 and loaded.scanned_bytes == 0 and not len(self.producer_state)
        log.log(logging.DEBUG if empty else logging.INFO,
                "%s-%d producer state: %d producers from snapshot at %d and %d bytes of log from %d to %d "
                "(%.3f s)", *tp, len(self.producer_state), loaded.snapshot_offset, loaded.scanned_bytes,
                loaded.scan_start_offset, loaded.up_to_offset, loaded.elapsed_s,
                extra={"event": "partition.producer_state_loaded", "topic": tp[0], "partition": tp[1],
                       "snapshot_offset": loaded.snapshot_offset, "scanned_bytes": loaded.scanned_bytes})
        self.producer_state.on_loaded = self._on_room  # held produce requests go on
        # A snapshot is written at each segment roll (and at a clean close), one at a time,
        # and between rolls once the log moved on by SNAPSHOT_EVERY_OFFSETS (at most every
        # SNAPSHOT_INTERVAL_S): a start after a crash then scans that much, not a segment.
        self._snapshot_segment_base = self.log.active_segment_base_offset
        self._snapshot_write: asyncio.Future[bool] | None = None
        self._snapshot_offset = loaded.snapshot_offset if loaded.snapshot_offset >= 0 else self.log.log_start_offset
        self._snapshot_at_s = -SNAPSHOT_INTERVAL_S
        self.producer_snapshots_written = 0
        # fetch_backoff_ms=0: the fetcher long-polls, so an empty answer already waited;
        # the fetcher itself backs off after errors, and resends what a broken connection or a
        # timed-out round lost (fetcher.py): the core's own re-ask is only a safety net. Push
        # followers, which nothing long-polls for, hear from an idle leader every push_heartbeat_ms.
        self.replica = Replica(replica_id=broker_id, log=self.log, partition=tp, now_ms=now_ms(), wall_ms=wall_ms(),
                               fetch_backoff_ms=0, fetch_max_bytes=fetch_max_bytes, unclean_start=unclean_start,
                               written_under_write=written_under_write,
                               fetch_retry_ms=FETCH_RETRY_MS,
                               push_heartbeat_ms=push_heartbeat_ms,
                               push_capable=True,  # this driver carries append-entries (pusher.py)
                               producer_state=self.producer_state,
                               # Produce requests wait in the core, in order, for the epoch start,
                               # a loading producer table or broker-wide room (admission.py).
                               held_produce_max=held_produce_max)
        self.failed: str | None = None
        self.closed = False
        self._request_ids = itertools.count(1)
        self._produce_waiters: dict[int, asyncio.Future[ReleaseProduce]] = {}
        # Answers of the step being performed (Ready.answers), returned by step().
        self._answers: list[FetchResponse | AppendEntriesReply] = []
        # The broker-wide bound on produce bytes held by its leaders (None: only the core's own);
        # it enters the core as BrokerBudget events (what the others hold, the bound).
        self.budget = budget
        self._reported_bytes = 0  # what this partition last reported to the budget
        self._told_budget: tuple[int, int] | None = None
        self._changed: asyncio.Future[None] | None = None
        self._seen = self._observed()
        self._usage_start = self.log.log_start_offset   # as a usage report last had it (step)
        # Counters for usage reports and /metrics.
        self.produce_records = 0
        self.produce_bytes = 0
        self.fetch_bytes = 0
        self.replicated_bytes = 0  # appended as a follower (pulled or pushed from the leader)

    # ------------------------------------------------------------------ inputs

    def step(self, event: object) -> list[FetchResponse | AppendEntriesReply]:
        """Feed one event to the core and perform its Ready; returns fetch answers it produced."""
        if self.closed:
            return []
        if self.failed is not None:
            raise PartitionOfflineError(f"partition {self.tp[0]}-{self.tp[1]} is offline: {self.failed}")
        if isinstance(event, (FetchResponse, AppendEntries)) and event.records and not self.log.space.has_room(
                len(event.records)):
            # Disk full: leave replicated data unapplied (as if lost), rather than fail the append.
            if isinstance(event, FetchResponse):
                self._refetch_later(event)
            else:   # the pusher answers the leader with the error (it resends)
                self.log.space.check_room(len(event.records), f"append-entries to {self.tp[0]}-{self.tp[1]}")
            return []
        nested = self._stepping
        if not nested:  # a step inside a step runs on the outer one's clock
            now = now_ms()
            if not isinstance(event, Tick) and now - self.replica.now_ms >= CLOCK_STALE_MS:
                self._stepping = True   # a Tick's after-step work is done once, after the event
                try:
                    self._catch_up_clock(now)
                finally:
                    self._stepping = False
                if self.closed:
                    return []
                if self.failed is not None:
                    raise PartitionOfflineError(f"partition {self.tp[0]}-{self.tp[1]} is offline: {self.failed}")
        self._due = UNKNOWN   # until this step's answer (a step that raises leaves it unknown)
        self._stepping = True
        try:
            ready = self.replica.step(event)
            outer, self._answers = self._answers, []
            try:
                if ready:
                    self._perform(ready)
                answers = self._answers
            finally:
                self._answers = outer
        finally:
            self._stepping = nested
        if nested:
            # The WriteDone of an Append this step's outer step performed: perform() returns
            # right after it, and the outer step then looks at the core once for both (its
            # timer, budget, watchers). Doing that here too doubled it for every append.
            return answers
        if self.log.active_segment_base_offset != self._snapshot_segment_base:
            self._on_roll()
        elif self.log.log_end_offset - self._snapshot_offset >= SNAPSHOT_EVERY_OFFSETS:
            self._maybe_snapshot_between_rolls()
        if self.budget is not None:
            self._reported_bytes = self.replica.held_bytes() if self.is_leader else 0
            self.budget.update(self.tp, self._reported_bytes)
            if self.replica.waiting_for_room():
                self.budget.call_when_room(self.tp, self._on_room)
        moved = self._notify_if_changed()
        self._set_due(self.replica.next_tick_ms())
        if self.on_usage is not None and (moved or self.log.log_start_offset != self._usage_start):
            # Only a step that moved what a usage report reads (a Tick of an idle replica does
            # not): each touched replica is read again at the next report, once a second.
            self._usage_start = self.log.log_start_offset
            self.on_usage(self.tp)
        return answers

    def _refetch_later(self, unapplied: FetchResponse) -> None:
        refused = dataclasses.replace(unapplied, records=b"", error=ErrorCode.KAFKA_STORAGE_ERROR)

        def later() -> None:
            if not self.closed and self.failed is None:
                try:
                    self.step(refused)
                    self.tick(now_ms())   # its next fetch is due now: no wait for the timer
                except BiplaneError:
                    pass  # went offline meanwhile; step already said so
        asyncio.get_running_loop().call_later(DISK_FULL_REFETCH_MS / 1000, later)

    def tick(self, now: int) -> None:
        if self.closed or self.failed is not None:
            return
        now = max(now, self.replica.now_ms)
        fetching: tuple[StillFetching, ...] = ()
        wall = wall_ms()
        if self.follower_fetching is not None:
            ask = self.follower_fetching
            isr = self.replica.isr_followers()
            fetching = tuple(news for r in self.replica.caught_up_due(now)
                             if (news := ask(self.tp, r, r in isr)) is not None)
            if fetching and not self._stepping:
                # A quiet leader's refresh from its fetch sessions: no log, HW, epoch or role
                # moves, so nothing after a step (answers, budget, watchers, usage) has work.
                done, due = self.replica.refresh_caught_up(now, wall, fetching)
                if done:
                    if not self._park(fetching, due, isr):
                        self._set_due(due)
                    return
        self.step(Tick(now_ms=now, wall_ms=wall, fetching=fetching))

    def _park(self, fetching: tuple[StillFetching, ...], due: int | None, followers: tuple[int, ...]) -> bool:
        """After a quiet leader's refresh, hand its followers' caught-up clocks to their fetch
        sessions when every ISR follower's news came from one: the broker watches the few
        sessions, not thousands of partitions each lag time, and ticks this replica when one
        is no longer fetching (or left it) or when the core's other rules are due. The core's
        clocks stay as they are till then: any step first ticks it on the sessions' word."""
        if self.on_park is None:
            return False
        told = {news.replica_id: news for news in fetching}
        if not followers or not all(r in told and self._counted(told[r]) for r in followers):
            return False
        if not self.on_park(self.tp, followers, self.replica.config.replica_lag_time_max_ms,
                            self.replica.next_tick_ms(caught_up_clocks=False)):
            return False
        self._due = due   # what a step's clock catch-up compares with (_catch_up_clock)
        return True

    def _counted(self, news: StillFetching) -> bool:
        """The refresh took this news (the core's rule may refuse a session's word: another
        position, records since): a clock it left alone runs on a timer of its own."""
        p = self.replica.progress.get(news.replica_id)
        return p is not None and p.last_caught_up_ms >= min(news.seen_ms, self.replica.now_ms)

    def _set_due(self, due: int | None) -> None:
        """The core's next_tick_ms() after a step: kept for the clock's catch-up, and told to the
        broker's timers."""
        self._due = due
        if self.on_due is not None:
            self.on_due(self.tp, due)

    def tick_if_due(self, now: int) -> None:
        """Tick now if a timed rule of the core is due by `now` (an event may have left one due
        at once: a follower's next fetch after an empty answer); else only move its clock,
        which is all a Tick would do, without a whole step after every fetch answer."""
        if self.closed or self.failed is not None:
            return
        self._catch_up_clock(now)

    def _catch_up_clock(self, now: int) -> None:
        """Bring the core to `now`: a Tick when a timed rule is due by then, else the clock alone
        moves (Replica.move_clock, told the core's answer after the last step: only time has
        passed since)."""
        if not self.replica.move_clock(max(now, self.replica.now_ms), wall_ms(), due_ms=self._due):
            self.tick(now)

    def submit_produce(self, records: Buffer, *, acks: int, timeout_ms: int, leader_epoch: int | None = None,
                       batch_bytes_max: int | None = None) -> asyncio.Future[ReleaseProduce]:
        """Step the produce into the core now (so requests keep their arrival order); the
        future resolves when the core releases it. The core decides everything, including
        holding it while a new leader's epoch start is unflushed, its producer table loads
        or the broker's leaders together hold `budget.unreplicated_bytes_max`."""
        if self.failed is not None:
            raise PartitionOfflineError(f"partition {self.tp[0]}-{self.tp[1]} is offline: {self.failed}")
        if self.is_leader:  # disk full: StorageError (KAFKA_STORAGE_ERROR) before the core sees it
            self.log.space.check_room(len(records), f"produce to {self.tp[0]}-{self.tp[1]}")
        self._tell_budget()
        request_id = next(self._request_ids)
        future: asyncio.Future[ReleaseProduce] = asyncio.get_running_loop().create_future()
        self._produce_waiters[request_id] = future
        try:
            self.step(ProduceRequest(request_id=request_id, records=records, acks=acks, timeout_ms=timeout_ms,
                                     leader_epoch=leader_epoch, batch_bytes_max=batch_bytes_max))
        except BaseException:
            self._produce_waiters.pop(request_id, None)
            raise

        def count(f: asyncio.Future[ReleaseProduce]) -> None:
            if not f.cancelled() and f.result().error is ErrorCode.NONE:
                self.produce_records += f.result().record_count
                self.produce_bytes += len(records)
                if self.on_usage is not None:
                    self.on_usage(self.tp)
        future.add_done_callback(count)
        return future

    def _tell_budget(self) -> None:
        """Step what the broker's other leaders hold into the core, when it changed."""
        if self.budget is None or self.closed or self.failed is not None:
            return
        told = (self.budget.total_bytes - self._reported_bytes, self.budget.unreplicated_bytes_max)
        if told != self._told_budget:
            self._told_budget = told
            self.step(BrokerBudget(others_bytes=told[0], bytes_max=told[1]))

    # ------------------------------------------------------------ producer snapshots

    def _on_roll(self) -> None:
        """The active segment changed: snapshot the producer table at the log end, unless a
        truncation (pending or being rebuilt) means the table does not describe the log."""
        self._snapshot_segment_base = self.log.active_segment_base_offset
        if not self.producer_state.current:
            return
        if self._snapshot_write is not None and not self._snapshot_write.done():
            log.debug("%s-%d: a producer snapshot is still being written; skipping this roll's", *self.tp)
            return
        self._snapshot_write = self._write_snapshot()

    def _maybe_snapshot_between_rolls(self) -> None:
        if (not self.producer_state.current or time.monotonic() - self._snapshot_at_s < SNAPSHOT_INTERVAL_S
                or (self._snapshot_write is not None and not self._snapshot_write.done())):
            return
        self._snapshot_write = self._write_snapshot()

    def _write_snapshot(self) -> asyncio.Future[bool]:
        """Capture the table on the loop (it must match the log end exactly), write it in a thread."""
        snapshots = self.log.producer_snapshots
        generation = snapshots.generation
        offset = self.log.log_end_offset
        self._snapshot_offset, self._snapshot_at_s = offset, time.monotonic()
        captured = self.producer_state.capture()
        future = asyncio.get_running_loop().run_in_executor(
            None, lambda: snapshots.write(offset, plain_entries(captured), generation=generation))

        def written(f: asyncio.Future[bool]) -> None:
            if f.cancelled():
                return
            exc = f.exception()
            if exc is not None:
                log.warning("%s-%d: producer snapshot at %d not written: %s", *self.tp, offset, exc,
                            extra={"event": "partition.producer_snapshot_failed", "topic": self.tp[0],
                                   "partition": self.tp[1]})
            elif f.result():
                self.producer_snapshots_written += 1
        future.add_done_callback(written)
        return future

    def _on_room(self) -> None:
        """The budget has room, or the producer table has loaded: held requests may go on."""
        if self.closed or self.failed is not None:
            return
        self._tell_budget()
        self.tick(now_ms())  # an event, so the core takes what it holds (Replica._after_event)

    def fetch(self, request: FetchRequest) -> FetchResponse:
        """Answer one fetch (a follower's or a consumer's) as the core decides, right now."""
        for answer in self.step(request):
            if isinstance(answer, FetchResponse) and answer.fetch_offset == request.fetch_offset:
                if answer.records:
                    self.fetch_bytes += len(answer.records)
                    if self.on_usage is not None:
                        self.on_usage(self.tp)
                return answer
        raise AssertionError(f"core gave no answer to {request}")

    async def flushed_to(self, offset: int) -> int:
        """Wait until the log is flushed up to `offset` (or cut below it); the flushed offset."""
        try:
            await self.coalescer.flush_to(min(offset, self.log.log_end_offset))
        except (LogTruncatedError, InvalidRequestError):
            pass
        return self.log.flushed_offset

    def followed_state(self) -> tuple[int, int, Role, bool]:
        """What ends a follower's long-poll when it moves: log end, epoch, role, and whether a
        leader serves its epoch yet (its epoch start stored: a follower refused until then
        waits in its session, fetcher.py), not the HW."""
        r = self.replica
        return (self.log.log_end_offset, r.leader_epoch, r.role, r.epoch_durable)

    def changed(self) -> asyncio.Future[None]:
        """Resolves at the next change of log end, HW, epoch, role or serving (followed_state;
        long-polling fetches wait on it)."""
        if self._changed is None or self._changed.done():
            self._changed = asyncio.get_running_loop().create_future()
        return self._changed

    # ------------------------------------------------------------------ Ready

    def _perform(self, ready: Ready) -> None:
        try:
            perform(ready, self.log, self)
        except PartitionOfflineError:
            raise
        except (StorageError, OSError) as exc:
            self._fail(f"{type(exc).__name__}: {exc}")
            raise PartitionOfflineError(f"partition {self.tp[0]}-{self.tp[1]} went offline: {exc}") from exc

    # Effects (dataplane/replica/perform.py): what a Ready does outside the core.

    def persisted(self, action: PersistAction, previous_end: int) -> None:
        if isinstance(action, Append) and not action.as_leader:
            self.replicated_bytes += len(action.records)
        elif isinstance(action, Truncate):
            log.info("%s-%d truncates its log from %d to %d (diverged from the leader)", *self.tp,
                     previous_end, action.offset,
                     extra={"event": "partition.truncated", "topic": self.tp[0], "partition": self.tp[1]})
            self.producer_state.truncated = True  # no snapshot until the core rebuilds it
        elif isinstance(action, TruncateFully):
            log.info("%s-%d empties its log at %d and starts it at %d (the leader's log starts there)",
                     *self.tp, previous_end, action.offset,
                     extra={"event": "partition.truncated_fully", "topic": self.tp[0], "partition": self.tp[1]})
            self.producer_state.truncated = True

    def flush(self, up_to: int) -> None:
        # Started now (no task in between): the fsync is on its thread before the sends.
        self.coalescer.when_flushed(min(up_to, self.log.log_end_offset), self._flushed)

    def send_fetch(self, leader_id: int, request: FetchRequest) -> None:
        self.hooks.send_fetch(leader_id, self.tp, request)

    def send_append_entries(self, follower_id: int, message: AppendEntries) -> None:
        self.hooks.send_append_entries(follower_id, self.tp, message)

    def propose_isr(self, proposal: ProposeIsr) -> None:
        self.hooks.propose_isr(self.tp, proposal)

    def report_election(self, report: ReportElection) -> None:
        self.hooks.report_election(self.tp, report)

    def answer(self, answer: Send) -> None:
        # To the fetch / append-entries being answered (fetch(), pusher.answer_append_entries).
        message = answer.message
        if not isinstance(message, (FetchResponse, AppendEntriesReply)):
            raise AssertionError(f"core answered with {type(message).__name__}")
        self._answers.append(message)

    def release(self, release: ReleaseProduce) -> None:
        future = self._produce_waiters.pop(release.request_id, None)
        if future is not None and not future.done():
            future.set_result(release)

    def note(self, note: NoteAction) -> None:
        if isinstance(note, RefreshMetadata):
            self.hooks.refresh_metadata(self.tp, note.reason)
        elif isinstance(note, StopLeading):
            log.info("%s-%d stops leading epoch %d: %s", *self.tp, note.leader_epoch, note.reason,
                     extra={"event": "partition.stop_leading", "topic": self.tp[0], "partition": self.tp[1]})
        elif isinstance(note, Rejected):
            log.debug("%s-%d rejected %s: %s %s", *self.tp, note.event, note.error.name, note.reason)

    def written(self, done: WriteDone) -> None:
        self._answers += self.step(done)

    def _flushed(self, flushed: int | None, exc: BaseException | None) -> None:
        """A Flush the core asked for is done: step FlushDone (or take the partition offline)."""
        if self.closed:
            return
        if isinstance(exc, StorageError) and not isinstance(exc, LogTruncatedError):
            self._fail(f"flush failed: {exc}")
            return
        # No error, or the range was truncated before it was durable (or is past the log
        # end after a cut): report what is flushed now.
        if self.failed is None:
            try:
                self.step(FlushDone(flushed_offset=self.log.flushed_offset))
            except BiplaneError:
                pass  # went offline meanwhile; step already said so
            except Exception:  # our bug: loud, but the partition's other work goes on
                log.exception("%s-%d: stepping FlushDone failed", *self.tp)

    def _fail(self, reason: str) -> None:
        if self.failed is None:
            self.failed = reason
            if self.on_follow_change is not None:
                self.on_follow_change(self.tp)
            log.error("%s-%d is offline: %s; %s", *self.tp, reason, offline_hint(reason),
                      extra={"event": "partition.offline", "topic": self.tp[0], "partition": self.tp[1]})
            self.hooks.partition_offline(self.tp)
        self._fail_waiters(ErrorCode.KAFKA_STORAGE_ERROR)
        if self.budget is not None:
            self.budget.forget(self.tp)  # it holds nothing for anyone any more
        self._wake_long_polls()   # one holding it answers the error now

    def _fail_waiters(self, error: ErrorCode) -> None:
        for request_id, future in list(self._produce_waiters.items()):
            if not future.done():
                future.set_result(ReleaseProduce(request_id=request_id, error=error))
        self._produce_waiters.clear()

    def _observed(self) -> tuple:
        """What the long-polls wait on: what ends a follower's (followed_state), then the HW."""
        return (*self.followed_state(), self.replica.high_watermark)

    def _notify_if_changed(self) -> bool:
        """Wake the long-polls waiting on this replica if its log end, HW, epoch, role or
        serving (followed_state) moved since the last step; whether they did."""
        seen = self._observed()
        if seen == self._seen:
            return False
        if seen[1:3] != self._seen[1:3] and self.on_follow_change is not None:   # epoch or role
            self.on_follow_change(self.tp)
        self._seen = seen
        self._wake_long_polls()
        return True

    def _wake_long_polls(self) -> None:
        """Resolve the future the long-polls waiting on this replica hold (changed())."""
        if self._changed is not None and not self._changed.done():
            self._changed.set_result(None)

    # ------------------------------------------------------------------ state

    @property
    def is_leader(self) -> bool:
        return self.replica.role is Role.LEADER

    async def close(self) -> None:
        """Stop serving, fail waiting producers (retriably), flush and close the log. Idempotent."""
        if self.closed:
            return
        self.closed = True
        if self.on_follow_change is not None:
            self.on_follow_change(self.tp)
        self._fail_waiters(ErrorCode.NOT_LEADER_OR_FOLLOWER)
        if self.budget is not None:
            self.budget.forget(self.tp)
        self._wake_long_polls()
        await self.coalescer.close()
        if self._snapshot_write is not None:
            await asyncio.gather(self._snapshot_write, return_exceptions=True)
        if self.failed is None and self.producer_state.current:
            # Clean shutdown: the next open reads no log at all for producer state.
            await asyncio.gather(self._write_snapshot(), return_exceptions=True)
        self.producer_state.close()
        await asyncio.get_running_loop().run_in_executor(None, self.log.close)
