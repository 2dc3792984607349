"""One partition replica as leader or follower: `step(event) -> Ready`, no I/O.

The core owns the protocol (docs/design.md#protocol-rules-and-where-they-live): offsets are assigned through Append
actions, followers are tracked through epoch-checked fetches, the high
watermark (HW) follows `watermark.py`, produce requests are released through
one path whatever their acks, ISR changes are proposed to the controller, and
a quorum-election fence is answered with a report of the flushed log.
Also here: idempotent producers (producer_state.py: duplicates answered with their
original offsets, gaps and fenced epochs refused; rebuilt from the log on every
replica), backpressure (produce requests wait while the bytes written in this epoch
and not passed by the HW exceed `unreplicated_bytes_max`), lazy flush (a follower is
asked to flush after an append only when acks=all requests wait on that range), and
push replication (push.py, when the driver is `push_capable`).

Time enters only through Tick (a clock for waits, one for timestamps); the log is read through `LogView`.
Roles:
- UNATTACHED: built, no metadata yet (a fresh process never acts before it
  hears from the controller);
- LEADER / FOLLOWER: as the metadata says;
- ELECTION: a quorum-election fence is known; serve nothing, flush, report;
- STOPPED: no leader, not a replica, or a newer epoch was seen: wait for metadata.

The driver's contract (the broker, or tests/sim; both through `perform.perform`):
- perform each Ready in order: persist (Append/Truncate applied to the log before
  the next step; WriteDone when written; Flush asynchronous, FlushDone with the
  log's flushed offset when it completes), then send, answers, release, notes;
- build a fresh Replica after a restart (`unclean_start=True` when the shutdown was
  not clean) and feed it metadata learned after the restart; a Replica never acts
  before its first NewMetadata;
- consumers' fetches come in with replica_id -1; their answer is in `Ready.answers`, to -1.
"""
from __future__ import annotations

import collections
import dataclasses
import enum
from collections.abc import Callable
from typing import Any

from common.batch import BatchHeader, Buffer, build_batch, iter_batches
from common.errors import CorruptBatchError, ErrorCode
from dataplane.replica.actions import (
    Append, Flush, NoteAction, PersistAction, ProposeIsr, Ready, RefreshMetadata, Rejected, ReleaseProduce,
    ReportElection, Send, SendAction, StopLeading, Truncate, TruncateFully,
)
from dataplane.replica.events import (
    CONSUMER_REPLICA_ID, AppendEntries, AppendEntriesReply, BrokerBudget, FetchHeld, FetchOrder, FetchRequest,
    FetchResponse,
    FlushDone, IsrChangeAccepted, IsrChangeRefused, NewMetadata, ProduceRequest, StillFetching, Tick, WriteDone,
)
from dataplane.replica import invariants
from common.epochs import EpochCheck, check_epoch
from dataplane.replica.logview import LogView
from dataplane.replica.producer_state import ProducerStateTable
from dataplane.replica.admission import VALID_ACKS, PendingProduce, ProduceAdmission
from dataplane.replica.push import PushMixin
from dataplane.replica.state import PartitionState, ReplicationConfig
from dataplane.replica.state import Role as Role  # the core's roles, imported from here by its users
from dataplane.replica.watermark import follower_stored_offset, next_high_watermark, stored_offset

# The controller judged the proposal at its own epochs and declined it: nothing of it was
# committed. Every other answer leaves the proposal open: a stale-epoch refusal (an earlier
# copy may have been accepted) and an unknown outcome (a controller that lost its leadership
# before the commit, a timeout, an internal error: the next controller leader may still
# commit it). Only a newer partition epoch from metadata settles those.
_DECLINED_ISR_REFUSALS = frozenset({ErrorCode.INELIGIBLE_REPLICA, ErrorCode.INVALID_REQUEST,
                                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION})
# The epoch-start batch's one control record is keyed as Kafka's control records are
# (version int16, type int16), with type LEADER_CHANGE (2), as KRaft starts each epoch of
# its log: Kafka clients parse control keys (librdkafka refuses a batch without one).
EPOCH_START_CONTROL_KEY = b"\x00\x00\x00\x02"
EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1


class Unknown(enum.Enum):
    """A value its holder does not know (`Replica.move_clock`'s due_ms: work it out)."""

    UNKNOWN = "unknown"


UNKNOWN = Unknown.UNKNOWN


@dataclasses.dataclass(slots=True)
class FollowerProgress:
    """What the leader knows of one follower, learned from its fetches in this epoch."""

    fetch_offset: int = 0      # its log end when it last fetched
    match_offset: int = 0      # end of the prefix verified equal to ours
    flushed_offset: int = 0    # its flushed offset as reported
    last_caught_up_ms: int = 0
    last_fetch_ms: int = -1
    last_fetch_leader_end: int = 0  # our log end when it last fetched (Kafka's lag rule)
    # Push mode (push.py): next offset to send, requests out as (end offset, sent at),
    # whether it is in recovery (one chunk at a time), when we last sent anything.
    push_next: int = -1
    push_inflight: collections.deque[tuple[int, int]] = dataclasses.field(default_factory=collections.deque)
    push_recovering: bool = True
    push_last_sent_ms: int = -1
    push_hw_sent: int = -1     # the HW our last append-entries carried (-1: none, or its window was lost)
    # The leader's ISR generation at its last fetch: only a fetch made since the last ISR
    # change (or refusal) may bring it back into the ISR, never stale progress.
    fetch_generation: int = -1
    # Every fetch request stepped from it, over any of its connections (a broker's fetcher
    # has a long-poll and an "express" one), counted, and the newest one's position and
    # flushed offset, whatever its answer (see Replica._remember_fetch); one sent before a
    # newer one already stepped is not (Replica._late_fetch).
    fetches: int = 0
    asked_offset: int = -1
    asked_epoch: int = -1
    asked_flushed: int = 0
    order: FetchOrder | None = None   # the newest one's place among those it sent (None: unknown)


class Replica(ProduceAdmission, PushMixin):
    """The replica core. Limits are constructor arguments with units last."""

    def __init__(self, *, replica_id: int, log: LogView, partition: object = None, now_ms: int = 0,
                 fetch_max_bytes: int = 1024 * 1024, flush_debounce_ms: int = 5,
                 fetch_backoff_ms: int = 50, fetch_timeout_ms: int = 1000, fetch_retry_ms: int | None = None,
                 isr_proposal_retry_ms: int = 1000, election_report_retry_ms: int = 500,
                 pending_produce_max: int = 10_000, unreplicated_bytes_max: int = 8 * 1024 * 1024,
                 push_inflight_max: int = 4, push_heartbeat_ms: int | None = None,
                 push_capable: bool = False, producers_max: int = 10_000,
                 producer_idle_ms_max: int = 7 * 24 * 3600 * 1000, unclean_start: bool = False,
                 written_under_write: bool = False, producer_state: ProducerStateTable | None = None,
                 check_invariants: bool | None = None,
                 held_produce_max: int = 0, wall_ms: int | None = None) -> None:
        for name, value in (("fetch_max_bytes", fetch_max_bytes), ("flush_debounce_ms", flush_debounce_ms),
                            ("fetch_backoff_ms", fetch_backoff_ms), ("fetch_timeout_ms", fetch_timeout_ms),
                            ("fetch_retry_ms", fetch_timeout_ms if fetch_retry_ms is None else fetch_retry_ms),
                            ("isr_proposal_retry_ms", isr_proposal_retry_ms),
                            ("election_report_retry_ms", election_report_retry_ms),
                            ("pending_produce_max", pending_produce_max),
                            ("unreplicated_bytes_max", unreplicated_bytes_max),
                            ("push_inflight_max", push_inflight_max), ("held_produce_max", held_produce_max),
                            ("push_heartbeat_ms", fetch_backoff_ms if push_heartbeat_ms is None
                             else push_heartbeat_ms)):
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative int, got {value!r}")
        self.replica_id = replica_id
        self.partition = partition
        self.log = log
        self.fetch_max_bytes = fetch_max_bytes
        self.flush_debounce_ms = flush_debounce_ms
        self.fetch_backoff_ms = fetch_backoff_ms
        self.fetch_timeout_ms = fetch_timeout_ms
        # How long a pull follower's fetch goes unanswered before it asks again (None: the
        # fetch timeout). A driver whose fetcher answers or fails every request it takes, and
        # resends on its own after a broken connection, can make this long: each re-ask of a
        # quiet partition is a step for nothing (the broker's thousands of idle followers).
        self.fetch_retry_ms = fetch_timeout_ms if fetch_retry_ms is None else fetch_retry_ms
        self.isr_proposal_retry_ms = isr_proposal_retry_ms
        self.election_report_retry_ms = election_report_retry_ms
        self.pending_produce_max = pending_produce_max
        self.unreplicated_bytes_max = unreplicated_bytes_max
        self.push_inflight_max = max(1, push_inflight_max)
        # How often an idle push follower hears from us (None: every fetch_backoff_ms). A
        # driver whose fetches long-poll runs with fetch_backoff_ms=0 and must set it, or
        # leader and followers would trade empty append-entries without pause.
        self.push_heartbeat_ms = fetch_backoff_ms if push_heartbeat_ms is None else push_heartbeat_ms
        # A driver that carries append-entries says so; until then push topics replicate by
        # fetching (every replica of a partition runs the same driver code, so they agree).
        self.push_capable = push_capable
        # Idempotent producers' state, rebuilt from the log's batch headers on every replica.
        # A driver may hand in a table it already loaded for this log (from a snapshot and
        # the log past it) whose rebuild() after a truncation it performs off its event
        # loop (dataplane/broker/producer_state.py); the rules stay the table's.
        if producer_state is None:
            producer_state = ProducerStateTable(producers_max=producers_max,
                                                producer_idle_ms_max=producer_idle_ms_max)
            producer_state.rebuild(log)
        producer_state.seen_at(now_ms if wall_ms is None else wall_ms)
        self.producer_state = producer_state
        self._producer_state_stale = False

        self.now_ms = now_ms
        # Two clocks (Tick): waits run on now_ms, which never goes back; record timestamps are
        # compared with wall_ms. One wall clock for both held every wait of a broker still
        # for as long as its clock had been stepped forward, once it was set right again.
        self.wall_ms = now_ms if wall_ms is None else wall_ms
        # After an unclean shutdown, data this replica wrote but had not flushed may be
        # gone. Under durability=write the commit rule counted it, so until the replica
        # has caught up with a leader again (or leads) its log cannot vouch for it in an
        # election: its reports say `unclean`. `written_under_write`: the log may have taken
        # records under durability=write before the crash, whatever the topic says now (the
        # metadata's TopicInfo.ever_under_write; an alter to fsync brings back nothing a crash
        # took). A topic that leaves write while this replica runs sets it too (_set_config).
        self.unclean_start = unclean_start
        self.written_under_write = written_under_write
        self.role = Role.UNATTACHED
        self.state: PartitionState | None = None
        self.config = ReplicationConfig()
        self.leader_epoch = -1
        self.partition_epoch = -1
        self.high_watermark = 0
        # Local log, as the core has asked for it (refreshed from the view each step).
        self.log_end_offset = log.log_end_offset
        self.last_epoch = log.epoch_before(self.log_end_offset)
        self.written_offset = self.log_end_offset
        self.flushed_offset = min(log.flushed_offset, self.log_end_offset)
        self._flush_requested = self.flushed_offset
        self._unflushed_since_ms: int | None = None
        # Leader state.
        self.epoch_start_offset = 0
        self.epoch_durable = False
        self.progress: dict[int, FollowerProgress] = {}
        self.pending_isr: tuple[int, ...] | None = None
        self._pending_isr_sent_ms = 0
        self._isr_generation = 0
        self._isr_generation_ms = 0   # when it last changed
        self._isr_refused_ms: int | None = None
        # Asking the fetch sessions after followers that may join (_join_candidates): when
        # last, and how long until the next ask (doubling while none is seen, up to the lag time).
        self._join_asked_ms: int | None = None
        self._join_ask_ms = 0
        self.fenced_replicas: frozenset[int] = frozenset()
        self.pending: dict[int, PendingProduce] = {}
        # Backpressure: produce requests waiting for room (arrival order), and the bytes this
        # leader appended as (next offset, running total) so the HW tells what is replicated.
        self._backlog: dict[int, tuple[ProduceRequest, list[BatchHeader], int]] = {}
        self._backlog_bytes = 0
        # Requests held (arrival order, not counted in held_bytes) until this leader can take
        # them at all: its epoch start flushed, its producer table loaded, broker-wide room
        # (admission.py). 0: none are held; before the epoch start is flushed they are refused.
        self.held_produce_max = held_produce_max
        self._held: dict[int, tuple[ProduceRequest, int]] = {}
        self.broker_bytes_max: int | None = None
        self._broker_others_bytes = 0
        self._append_sizes: collections.deque[tuple[int, int]] = collections.deque()
        self._appended_bytes = 0
        self._replicated_bytes = 0
        # Request ids per acks value in offset order: each is released in that order, so
        # releasing is O(released), not O(pending). Ids already gone are skipped.
        self._waiting: dict[int, collections.deque[int]] = {a: collections.deque() for a in VALID_ACKS}
        # Follower state.
        self.leader_id: int | None = None
        self._fetch_inflight = False
        self._fetch_held = False   # the transport holds the fetch in flight (FetchHeld): no retry
        self._fetch_sent_ms = 0
        self._next_fetch_ms = 0
        self._reported_flushed = 0
        self._push_match = 0  # push mode: end of the prefix verified equal to the leader's
        # Election state.
        self._report_sent_ms: int | None = None

        # Our own rules checked after every step (invariants.py): on in tests and the
        # simulation, off in production unless BIPLANE_CORE_ASSERTIONS says so.
        self.check_invariants = invariants.enabled_by_default() if check_invariants is None else check_invariants

        self._persist: list[PersistAction] = []
        self._send: list[SendAction] = []
        self._answers: list[Send] = []
        self._release: list[ReleaseProduce] = []
        self._notes: list[NoteAction] = []

    # ------------------------------------------------------------------ entry

    def step(self, event: object) -> Ready:
        handler = _HANDLERS.get(type(event))
        if handler is None:
            raise TypeError(f"Replica.step got {type(event).__name__}; expected one of "
                            f"{sorted(t.__name__ for t in _HANDLERS)}")
        self._sync_from_log()
        was = invariants.before(self) if self.check_invariants else None
        handler(self, event)
        self._after_event()
        if was is not None:
            invariants.check(self, was, event)
        ready = Ready(persist=tuple(self._persist), send=tuple(self._send), answers=tuple(self._answers),
                      release=tuple(self._release), notes=tuple(self._notes))
        self._persist, self._send, self._answers, self._release, self._notes = [], [], [], [], []
        return ready

    def _sync_from_log(self) -> None:
        end = self.log.log_end_offset
        if end != self.log_end_offset:
            # Under the driver's contract this cannot differ; if a write failed, the
            # log is the truth and the core follows it rather than its own prediction.
            self.log_end_offset = end
            self.last_epoch = self.log.epoch_before(end)
        self.written_offset = min(self.written_offset, end)
        self.flushed_offset = min(self.flushed_offset, end)
        if self._producer_state_stale:
            # A truncation removed batches the table may know: only the log can say what is left.
            self._producer_state_stale = False
            self.producer_state.rebuild(self.log)
            self.producer_state.seen_at(self.wall_ms)

    def _after_event(self) -> None:
        if self.role is Role.LEADER:
            self._advance_high_watermark()
            self._admit_backlog()
            self._admit_held()
            self._release_ready()
            if self._pushing:
                self._push_all()
        if self.flushed_offset < self.log_end_offset and self._unflushed_since_ms is None:
            self._unflushed_since_ms = self.now_ms

    # ------------------------------------------------------------- metadata

    def _on_new_metadata(self, ev: NewMetadata) -> None:
        st = ev.partition
        if self.state is not None:
            if st.leader_epoch < self.leader_epoch:
                return  # older news; the controller's decisions only move forward
            if (st.leader_epoch, st.partition_epoch) == (self.leader_epoch, self.partition_epoch):
                # The partition is as it was: which replicas are fenced, or its topic's config (an
                # alter), changed. How it replicates and commits is fixed at creation
                # (common.metadata.config.PROTOCOL_KEYS); the rest, min_insync_replicas above
                # all, applies from here, as in Kafka.
                self.fenced_replicas = frozenset(ev.fenced_replicas)
                self._set_config(ev.config)
                return
            if st.leader_epoch == self.leader_epoch and st.partition_epoch < self.partition_epoch:
                return
        new_epoch = st.leader_epoch > self.leader_epoch or self.state is None
        old_isr = self.state.isr if self.state is not None else ()
        self.state = st
        self._set_config(ev.config)
        self.fenced_replicas = frozenset(ev.fenced_replicas)
        self.leader_epoch, self.partition_epoch = st.leader_epoch, st.partition_epoch
        if self.replica_id not in st.replicas:
            self._become_stopped("not a replica of this partition any more")
        elif st.leader is None:
            if st.fenced_for_election:
                if new_epoch or self.role is not Role.ELECTION:
                    self._become_election()
            else:
                self._become_stopped("partition has no leader")
        elif st.leader == self.replica_id:
            if new_epoch or self.role is not Role.LEADER:
                self._become_leader()
            else:
                self._leader_metadata_update(old_isr)
        elif new_epoch or self.role is not Role.FOLLOWER or self.leader_id != st.leader:
            self._become_follower(st.leader)

    def _leave_role(self, error: ErrorCode) -> None:
        for request_id in [*self._held, *self._backlog]:
            self._release.append(ReleaseProduce(request_id=request_id, error=error))
        self._held.clear()
        self._backlog.clear()
        self._backlog_bytes = 0
        self._append_sizes.clear()
        self._appended_bytes = self._replicated_bytes = 0
        for p in self.pending.values():
            self._release.append(ReleaseProduce(request_id=p.request_id, error=error))
        self.pending.clear()
        for queue in self._waiting.values():
            queue.clear()
        self.progress.clear()
        self.pending_isr = None
        self._new_isr_generation()
        self._isr_refused_ms = None
        self.leader_id = None
        self._fetch_inflight = False
        self._report_sent_ms = None

    def _become_stopped(self, reason: str) -> None:
        if self.role is Role.LEADER:
            self._notes.append(StopLeading(leader_epoch=self.leader_epoch, reason=reason))
        self._leave_role(ErrorCode.NOT_LEADER_OR_FOLLOWER)
        self.role = Role.STOPPED

    def _become_leader(self) -> None:
        if self.last_epoch >= self.leader_epoch:
            # Our log already holds this epoch: an earlier incarnation led it (or followed
            # it). Leading it again could write different batches under the same epoch.
            self._notes.append(RefreshMetadata(seen_epoch=self.last_epoch, known_epoch=self.leader_epoch,
                                               reason="log already holds this leader epoch"))
            self._become_stopped("log already holds this leader epoch")
            return
        self._leave_role(ErrorCode.NOT_LEADER_OR_FOLLOWER)
        self.role = Role.LEADER
        # Elected, our log is the one every replica now follows: nothing it lost in the
        # crash can be asked of it any more (the election chose it knowing that).
        self.unclean_start = False
        self.high_watermark = min(self.high_watermark, self.log_end_offset)
        self.epoch_start_offset = self.log_end_offset
        assert self.state is not None
        self.progress = {r: FollowerProgress(last_caught_up_ms=self.now_ms, last_fetch_leader_end=0)
                         for r in self.state.replicas if r != self.replica_id}
        # Raft's rule: the HW only counts offsets of our own epoch, so the epoch
        # starts with a batch of ours (a control batch consumers skip).
        marker = build_batch([b""], keys=[EPOCH_START_CONTROL_KEY], timestamp_ms=self.wall_ms, is_control=True,
                             leader_epoch=self.leader_epoch)
        self._append_as_leader(marker)
        # Serve nothing of this epoch until the marker is flushed: after a crash the log
        # then shows we led it, and a restarted incarnation handed the same epoch by
        # late metadata refuses it (see _become_leader) instead of writing different
        # batches under an epoch followers already hold.
        self.epoch_durable = False
        self._request_flush()

    def _become_follower(self, leader_id: int) -> None:
        if self.role is Role.LEADER:
            self._notes.append(StopLeading(leader_epoch=self.leader_epoch, reason=f"replica {leader_id} leads"))
        self._leave_role(ErrorCode.NOT_LEADER_OR_FOLLOWER)
        self.role = Role.FOLLOWER
        self.leader_id = leader_id
        self._push_match = 0
        if not self._pushing:
            self._send_fetch()

    def _become_election(self) -> None:
        if self.role is Role.LEADER:
            self._notes.append(StopLeading(leader_epoch=self.leader_epoch, reason="quorum election"))
        self._leave_role(ErrorCode.NOT_LEADER_OR_FOLLOWER)
        self.role = Role.ELECTION
        # A report of unflushed data could be lost in a crash before the election
        # and elect a replica that no longer has an acknowledged record.
        if self.flushed_offset < self.log_end_offset:
            self._request_flush()
        else:
            self._report_election()

    def _set_config(self, config: ReplicationConfig) -> None:
        if self.config.durability == "write" and config.durability != "write":
            self.written_under_write = True   # what it counted under write may still be missing
        self.config = config

    def may_lack_counted_records(self) -> bool:
        """Restarted after a crash, not caught up or elected since, and its log took records
        under durability=write (counted before they were on disk): an election cannot take its
        flushed log's word for what was committed."""
        return self.unclean_start and (self.config.durability == "write" or self.written_under_write)

    def _report_election(self) -> None:
        # An unclean report still goes: during the election there is no leader to catch up
        # with, so a replica that stayed silent could never be counted, and a partition
        # whose up replicas are all unclean would wait forever. The controller counts it
        # only when every replica has reported (decisions/elections.elect_quorum).
        self._report_sent_ms = self.now_ms
        self._send.append(ReportElection(replica_id=self.replica_id, fenced_epoch=self.leader_epoch,
                                         last_epoch=self.log.epoch_before(self.flushed_offset),
                                         end_offset=self.flushed_offset,
                                         unclean=self.may_lack_counted_records()))

    def _leader_metadata_update(self, old_isr: tuple[int, ...]) -> None:
        st = self.state
        assert st is not None
        # Any newer partition epoch settles our proposal: accepted, or overtaken.
        self.pending_isr = None
        self._new_isr_generation()
        self._isr_refused_ms = None
        for r in st.replicas:
            if r != self.replica_id and r not in self.progress:
                self.progress[r] = FollowerProgress(last_caught_up_ms=self.now_ms)
        for r in list(self.progress):
            if r not in st.replicas:
                del self.progress[r]
        if (self.config.commit_policy == "isr" and len(st.isr) < self.config.min_insync_replicas
                and len(old_isr) >= self.config.min_insync_replicas):
            for p in list(self.pending.values()):
                if p.acks == -1:
                    del self.pending[p.request_id]
                    self._release.append(ReleaseProduce(request_id=p.request_id,
                                                        error=ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND))

    def _append_as_leader(self, records: Buffer, record_count: int | None = None) -> tuple[int, int]:
        count = (sum(h.record_count for _, h in iter_batches(records, validate=False))
                 if record_count is None else record_count)
        base = self.log_end_offset
        last = base + count - 1
        self._persist.append(Append(as_leader=True, records=records, base_offset=base, last_offset=last,
                                    leader_epoch=self.leader_epoch))
        self.log_end_offset = last + 1
        self.last_epoch = self.leader_epoch
        return base, last

    def _release_ready(self) -> None:
        # One path for every acks value: acks only decides which offset must be reached.
        reached = {0: self.log_end_offset, 1: self.written_offset, -1: self.high_watermark}
        for acks, queue in self._waiting.items():
            while queue:
                p = self.pending.get(queue[0])
                if p is not None and p.acks == acks:
                    if reached[acks] <= p.last_offset:
                        break
                    del self.pending[p.request_id]
                    self._release.append(ReleaseProduce(request_id=p.request_id, base_offset=p.base_offset,
                                                        record_count=p.record_count))
                queue.popleft()

    # ------------------------------------------------------- leader: fetches

    def _on_fetch_request(self, req: FetchRequest) -> None:
        if req.replica_id == CONSUMER_REPLICA_ID:
            self._answer_consumer(req)
            return
        late = self._late_fetch(req)
        if not late:
            req = self._remember_fetch(req)
        check = check_epoch(theirs=req.current_leader_epoch, ours=self.leader_epoch)
        if check is EpochCheck.STALE:
            self._notes.append(Rejected(event="FetchRequest", error=ErrorCode.FENCED_LEADER_EPOCH,
                                        their_epoch=req.current_leader_epoch, our_epoch=self.leader_epoch))
            self._answer(req, error=ErrorCode.FENCED_LEADER_EPOCH)
            return
        if check is EpochCheck.NEWER:
            # A follower knows a newer epoch than ours: we must not lead on.
            self._saw_newer_epoch(req.current_leader_epoch, f"fetch from replica {req.replica_id}")
            self._answer(req, error=ErrorCode.UNKNOWN_LEADER_EPOCH)
            return
        if self.role is not Role.LEADER or req.replica_id not in self.progress:
            self._answer(req, error=ErrorCode.NOT_LEADER_OR_FOLLOWER)
            return
        if not self.epoch_durable:
            self._answer(req, error=ErrorCode.LEADER_NOT_AVAILABLE)
            return
        diverging = self._divergence(req.fetch_offset, req.last_fetched_epoch)
        if diverging is not None:
            epoch, end = diverging
            self._answer(req, diverging_epoch=epoch, diverging_end_offset=end)
            return
        if not late:
            self._record_progress(req.replica_id, log_end_offset=req.fetch_offset,
                                  match_offset=req.fetch_offset, flushed_offset=req.flushed_offset)
            self._advance_high_watermark()
        max_bytes = min(self.fetch_max_bytes, req.max_bytes or self.fetch_max_bytes)
        records: bytes | memoryview = b""
        if req.fetch_offset < self.log_end_offset:
            records = self.log.read(req.fetch_offset, max_bytes=max_bytes).records
        self._answer(req, records=records)

    def _late_fetch(self, req: FetchRequest) -> bool:
        """A follower's fetch sent before one of its fetches already stepped here (its express
        and its session fetches travel on two connections, and we may read the newer first): old
        news, answered but neither counted nor recorded. Taking it (latest wins) put the
        follower back while its newer request sat parked in a long-poll that saw nothing to
        answer: acks=all waited on that follower until the long-poll ran out (up to 30 s).
        Fetches of another session (a restarted follower, a session started over) or of unknown
        order are taken as they come: a follower that came back with less reports it."""
        p = self.progress.get(req.replica_id)
        return (p is not None and req.order is not None and p.order is not None
                and req.order[0] == p.order[0] and req.order < p.order)

    def _remember_fetch(self, req: FetchRequest) -> FetchRequest:
        """Count a follower's fetch and keep its position; a request overtaken by a newer one
        from the same position carries an older flushed offset (a follower sends its news on
        a second connection while a long-poll waits), and counting it would hold the HW back,
        so it counts the newest flushed offset reported from that position."""
        p = self.progress.get(req.replica_id)
        if p is None:
            return req
        p.fetches += 1
        if ((p.asked_offset, p.asked_epoch) == (req.fetch_offset, req.last_fetched_epoch)
                and p.asked_flushed > req.flushed_offset):
            req = dataclasses.replace(req, flushed_offset=p.asked_flushed)
        p.asked_offset, p.asked_epoch, p.asked_flushed = req.fetch_offset, req.last_fetched_epoch, req.flushed_offset
        p.order = req.order
        return req

    def fetched_since(self, replica_id: int, fetches: int, fetch_offset: int, last_fetched_epoch: int) -> bool:
        """Has this follower fetched again, from another position, since its `fetches`-th fetch?
        A long-poll from the old position is then old news (its connection's driver ends it)."""
        p = self.progress.get(replica_id)
        return (p is not None and p.fetches != fetches
                and (p.asked_offset, p.asked_epoch) != (fetch_offset, last_fetched_epoch))

    def fetch_count(self, replica_id: int) -> int:
        """How many fetches of this follower were counted in this leadership (a late one is not,
        _late_fetch; -1: not a follower of ours)."""
        p = self.progress.get(replica_id)
        return -1 if p is None else p.fetches

    def _divergence(self, fetch_offset: int, last_fetched_epoch: int) -> tuple[int, int] | None:
        """None if the follower's log up to fetch_offset equals ours, else where its epoch ends here.

        (-1, our log start) when nothing of its log can be continued here: its epoch is older
        than every epoch we hold, or its log ends below our log start (retention deleted what
        it still lacks); a follower whose log ends below that offset starts over there."""
        if last_fetched_epoch < 0 and self.log.log_start_offset <= fetch_offset <= self.log_end_offset:
            # An empty log (no batch, so no epoch) starting here: at our log start, or where
            # an earlier leader's log started when it was emptied (_start_at); both offsets
            # start a batch of the same committed prefix.
            return None
        if fetch_offset < self.log.log_start_offset:
            return (-1, self.log.log_start_offset)
        epoch, end = self.log.end_offset_for_epoch(last_fetched_epoch)
        if epoch == last_fetched_epoch and epoch >= 0 and end >= fetch_offset:
            # Its last batch is of an epoch we hold up to at least there: one leader per
            # epoch wrote both, so the prefixes are the same.
            return None
        if epoch < 0:
            return (-1, self.log.log_start_offset)
        return (epoch, end)

    def _answer(self, req: FetchRequest, *, error: ErrorCode = ErrorCode.NONE, records: bytes | memoryview = b"",
                diverging_epoch: int = -1, diverging_end_offset: int = -1) -> None:
        flush = False
        if records and self.config.durability == "fsync":
            new_end = req.fetch_offset
            for _, h in iter_batches(records, validate=False):
                new_end = h.next_offset
            flush = self._acks_all_waiting_in(req.flushed_offset, new_end)
        self._answers.append(Send(to_broker=req.replica_id, message=FetchResponse(
            leader_id=self.replica_id, leader_epoch=self.leader_epoch, fetch_offset=req.fetch_offset,
            last_fetched_epoch=req.last_fetched_epoch, error=error, records=records,
            high_watermark=self.high_watermark, log_end_offset=self.log_end_offset,
            diverging_epoch=diverging_epoch, diverging_end_offset=diverging_end_offset,
            flush_after_append=flush, partition=self.partition)))

    def _acks_all_waiting_in(self, lo: int, hi: int) -> bool:
        """Lazy flush: does an acks=all request wait on an offset in [lo, hi)? Only then does a
        follower flush right after this append; catch-up chunks below every waiting request
        (recovery) and appends with nobody waiting are flushed on the follower's debounce."""
        queue = self._waiting[-1]
        low = next((self.pending[i].last_offset for i in queue if i in self.pending
                    and self.pending[i].acks == -1), None)
        if low is None or low >= hi:
            return False
        high = next(self.pending[i].last_offset for i in reversed(queue) if i in self.pending
                    and self.pending[i].acks == -1)
        return high >= lo

    def _answer_consumer(self, req: FetchRequest) -> None:
        # The answer names CONSUMER_REPLICA_ID and carries only data below the HW.
        epoch_error = self._check_client_epoch(req.current_leader_epoch, "a consumer's fetch")
        if epoch_error is not ErrorCode.NONE:
            self._answer(req, error=epoch_error)
            return
        if self.role is not Role.LEADER:
            self._answer(req, error=ErrorCode.NOT_LEADER_OR_FOLLOWER)
            return
        if req.fetch_offset > self.log_end_offset or req.fetch_offset < self.log.log_start_offset:
            self._answer(req, error=ErrorCode.OFFSET_OUT_OF_RANGE)
            return
        records: bytes | memoryview = b""
        if req.fetch_offset < self.high_watermark:
            max_bytes = min(self.fetch_max_bytes, req.max_bytes or self.fetch_max_bytes)
            records = self.log.read(req.fetch_offset, max_bytes=max_bytes, max_offset=self.high_watermark).records
        self._answer(req, records=records)

    def list_offset(self, timestamp_ms: int, leader_epoch: int = -1) -> tuple[ErrorCode, int, int]:
        """A consumer's list-offsets: (error, offset, timestamp). EARLIEST (-2) is the log
        start, LATEST (-1) the HW (timestamp -1 for both), and a time the first record below
        the HW stamped at or after it, with that record's timestamp; no such record is
        offset -1, timestamp -1, as Kafka answers (clients then read from the end).
        Read-only; leaders only, and only once the epoch-start batch is flushed (the HW may
        still be below what consumers saw before). `leader_epoch`: the client's
        (`client_epoch_error`); a read-only call emits no note, so on UNKNOWN_LEADER_EPOCH
        its caller refreshes."""
        epoch_error = self.client_epoch_error(leader_epoch)
        if epoch_error is not ErrorCode.NONE:
            return epoch_error, -1, -1
        if self.role is not Role.LEADER:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER, -1, -1
        if not self.epoch_durable:
            return ErrorCode.LEADER_NOT_AVAILABLE, -1, -1
        if timestamp_ms == EARLIEST_TIMESTAMP:
            return ErrorCode.NONE, self.log.log_start_offset, -1
        if self.high_watermark < self.epoch_start_offset:
            # A new leader learns the HW only as followers catch up; until it passes the epoch
            # start it may be below offsets consumers already read (Kafka's KIP-207 answer).
            return ErrorCode.OFFSET_NOT_AVAILABLE, -1, -1
        if timestamp_ms == LATEST_TIMESTAMP:
            return ErrorCode.NONE, self.high_watermark, -1
        if timestamp_ms < 0:
            return ErrorCode.INVALID_REQUEST, -1, -1
        found = self.log.offset_for_timestamp(timestamp_ms)
        if found is None or found[0] >= self.high_watermark:
            return ErrorCode.NONE, -1, -1
        return ErrorCode.NONE, found[0], found[1]

    def end_offset_for_epoch(self, epoch: int, leader_epoch: int = -1) -> tuple[ErrorCode, int, int]:
        """A client's OffsetForLeaderEpoch (KIP-320: a consumer checking whether the log
        was truncated under it): (error, the largest epoch <= `epoch` in the log, where
        it ends: the next epoch's start, or the log end offset for the latest). Read-only
        and leaders only, like list_offset; (NONE, -1, -1) when the log holds no such epoch."""
        epoch_error = self.client_epoch_error(leader_epoch)
        if epoch_error is not ErrorCode.NONE:
            return epoch_error, -1, -1
        if self.role is not Role.LEADER:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER, -1, -1
        found, end = self.log.end_offset_for_epoch(epoch)
        if found < 0:
            return ErrorCode.NONE, -1, -1
        return ErrorCode.NONE, found, end

    def _on_append_entries_reply(self, ev: AppendEntriesReply) -> None:
        check = check_epoch(theirs=ev.leader_epoch, ours=self.leader_epoch)
        if check is EpochCheck.STALE:
            self._notes.append(Rejected(event="AppendEntriesReply", error=ErrorCode.FENCED_LEADER_EPOCH,
                                        their_epoch=ev.leader_epoch, our_epoch=self.leader_epoch))
            return
        if check is EpochCheck.NEWER:
            self._saw_newer_epoch(ev.leader_epoch, f"append-entries reply from replica {ev.replica_id}")
            return
        if self.role is not Role.LEADER or ev.replica_id not in self.progress:
            return
        if self._pushing:
            self._on_push_reply(ev)
            return
        if ev.error is not ErrorCode.NONE:
            return
        self._record_progress(ev.replica_id, log_end_offset=ev.log_end_offset, match_offset=ev.match_offset,
                              flushed_offset=ev.flushed_offset)

    def _record_progress(self, replica_id: int, *, log_end_offset: int, match_offset: int,
                         flushed_offset: int) -> None:
        # Latest report wins (a fetch sent before one already stepped never gets here:
        # _late_fetch); it cannot overstate within our epoch.
        p = self.progress[replica_id]
        leader_end = self.log_end_offset
        if log_end_offset >= leader_end:
            p.last_caught_up_ms = self.now_ms
        elif p.last_fetch_ms >= 0 and log_end_offset >= p.last_fetch_leader_end:
            # Kafka's rule: it has reached what we had at its previous fetch.
            p.last_caught_up_ms = max(p.last_caught_up_ms, p.last_fetch_ms)
        p.last_fetch_ms = self.now_ms
        p.last_fetch_leader_end = leader_end
        p.fetch_generation = self._isr_generation
        p.fetch_offset = log_end_offset
        p.match_offset = match_offset
        p.flushed_offset = min(flushed_offset, log_end_offset)
        self._maybe_change_isr()

    # ------------------------------------------------------ leader: watermark

    def stored_offsets(self) -> dict[int, int]:
        """Replica id -> offset the commit rule counts for it (leader included)."""
        durability = self.config.durability
        stored = {self.replica_id: stored_offset(written_offset=self.written_offset,
                                                 flushed_offset=self.flushed_offset, durability=durability)}
        for r, p in self.progress.items():
            stored[r] = follower_stored_offset(written_offset=p.fetch_offset, flushed_offset=p.flushed_offset,
                                               match_offset=p.match_offset, durability=durability)
        return stored

    def required_isr(self) -> frozenset[int]:
        """ISR ∪ proposed ISR: until the controller answers, both must hold a record."""
        isr = set(self.state.isr) if self.state is not None else set()
        if self.pending_isr is not None:
            isr |= set(self.pending_isr)
        return frozenset(isr)

    def _commit_wait(self, end: int) -> str:
        """What a produce waiting for its records below `end` to commit still waits for, in
        words a user can act on (the answer's error message says it)."""
        stored = self.stored_offsets()
        policy = self.config.commit_policy
        if policy == "isr":
            required = sorted(self.required_isr() | {self.replica_id})
            behind = [r for r in required if stored.get(r, 0) < end]
            rule = f"every in-sync replica {required}"
        else:
            behind = sorted(r for r in self.state.replicas if stored.get(r, 0) < end) if self.state else []
            rule = f"{self.config.quorum_required_acks} replicas"
        pull = self.config.replication_mode == "pull"
        words = ", ".join(f"replica {r} at {stored.get(r, 0)}"
                          + (" (no fetch from it in this epoch)" if pull and r != self.replica_id
                             and (r not in self.progress or not self.progress[r].fetches) else "")
                          for r in behind)
        return (f"timed out before offset {end - 1} was {self.config.durability}-stored on {rule} "
                f"(commit_policy={policy}, high watermark {self.high_watermark}, epoch start "
                f"{self.epoch_start_offset}); behind: {words or 'none'}")

    def _advance_high_watermark(self) -> None:
        if self.role is not Role.LEADER:
            return
        self.high_watermark = next_high_watermark(
            high_watermark=self.high_watermark, epoch_start_offset=self.epoch_start_offset,
            leader_id=self.replica_id, stored=self.stored_offsets(), commit_policy=self.config.commit_policy,
            required_isr=self.required_isr(), quorum_required_acks=self.config.quorum_required_acks)

    # ------------------------------------------------------------ leader: ISR

    def _maybe_change_isr(self) -> None:
        new_isr = self._wanted_isr()
        if new_isr is not None:
            self._propose_isr(new_isr)

    def _wanted_isr(self) -> tuple[int, ...] | None:
        """The ISR this leader would propose now (lagging followers out, caught-up ones in), if any."""
        if self.role is not Role.LEADER or self.pending_isr is not None or self.state is None:
            return None
        if self._isr_refused_ms is not None and self.now_ms - self._isr_refused_ms < self.isr_proposal_retry_ms:
            return None
        isr = list(self.state.isr)
        lag_max = self.config.replica_lag_time_max_ms
        lagging = [r for r in isr if r in self.progress
                   and self.now_ms - self.progress[r].last_caught_up_ms > lag_max]
        if lagging:
            return tuple(r for r in isr if r not in lagging)
        if all(r in isr for r in self.state.replicas):
            return None  # nobody to join (asked after every step: skip the offsets below)
        stored = self.stored_offsets()
        floor = max(self.high_watermark, self.epoch_start_offset)
        joining = [r for r in self.state.replicas if r not in isr and r in self.progress
                   and r not in self.fenced_replicas
                   and self.progress[r].fetch_generation == self._isr_generation
                   and stored[r] >= floor and self.now_ms - self.progress[r].last_caught_up_ms <= lag_max]
        if joining:
            return tuple(r for r in self.state.replicas if r in isr or r in joining)
        return None

    def _new_isr_generation(self, *, ask_again: bool = True) -> None:
        """A new ISR generation; with `ask_again`, the sessions are asked after the followers
        that may join at once (_join_candidates), else when the current interval ends."""
        self._isr_generation += 1
        self._isr_generation_ms = self.now_ms
        if ask_again:
            self._join_asked_ms = None
            self._join_ask_ms = max(1, self.isr_proposal_retry_ms)

    def _join_candidates(self) -> tuple[int, ...]:
        """Followers out of the ISR whose newest fetch we stepped was at our log end, but
        before the ISR generation changed, so it cannot bring them back (_wanted_isr). In a
        fetch session such a follower's long-poll is not stepped again while nothing changes
        for it: a quiet partition's follower would stay out of the ISR until the next record.
        The session's sighting of it since the change counts instead (_still_fetching)."""
        if self.role is not Role.LEADER or self._pushing or self.state is None or self.pending_isr is not None:
            return ()
        isr = self.state.isr
        return tuple(r for r in self.state.replicas
                     if r not in isr and r not in self.fenced_replicas and (p := self.progress.get(r)) is not None
                     and p.fetch_generation != self._isr_generation and p.last_fetch_ms >= 0
                     and p.fetch_offset >= self.log_end_offset)

    def _join_ask_due_ms(self) -> int | None:
        """When to ask the sessions after the join candidates next; None: there are none."""
        if not self._join_candidates():
            return None
        return self.now_ms if self._join_asked_ms is None else self._join_asked_ms + self._join_ask_ms

    def _joiners_to_ask(self, now_ms: int) -> tuple[int, ...]:
        """The join candidates a Tick at `now_ms` asks the sessions after, if it is time to."""
        ask_at = self._join_ask_due_ms()
        return self._join_candidates() if ask_at is not None and now_ms >= ask_at else ()

    def _propose_isr(self, new_isr: tuple[int, ...]) -> None:
        self.pending_isr = new_isr
        self._pending_isr_sent_ms = self.now_ms
        self._send_isr_proposal()

    def _on_isr_change_accepted(self, ev: IsrChangeAccepted) -> None:
        if self.role is not Role.LEADER or self.state is None or self.pending_isr is None:
            return
        if ev.partition != dataclasses.replace(self.state, isr=self.pending_isr,
                                               partition_epoch=self.partition_epoch + 1):
            return  # not exactly our open proposal as the next change: the metadata settles it
        old_isr = self.state.isr
        self.state = ev.partition
        self.partition_epoch = ev.partition.partition_epoch
        self._leader_metadata_update(old_isr)

    def _on_isr_change_refused(self, ev: IsrChangeRefused) -> None:
        if (self.role is not Role.LEADER or self.pending_isr is None or tuple(ev.new_isr) != self.pending_isr
                or (ev.leader_epoch, ev.partition_epoch) != (self.leader_epoch, self.partition_epoch)):
            return  # refuses a proposal we no longer hold: ours is still open (or settled)
        if ev.error not in _DECLINED_ISR_REFUSALS:
            # It may be (or become) the ISR: keep counting the union. Settling here once let
            # an expansion that committed under the next controller leader go uncounted, and
            # the joiner, elected later, lacked acknowledged records.
            return
        self._notes.append(Rejected(event="ProposeIsr", error=ev.error,
                                    their_epoch=ev.leader_epoch, our_epoch=self.leader_epoch,
                                    reason=f"ISR -> {list(ev.new_isr)} refused: {ev.reason}"))
        self.pending_isr = None
        # Progress seen so far led to the refused proposal: only fresh fetches count again,
        # and nothing is proposed for a retry interval.
        # A refused joiner is asked after no sooner than its interval says (which goes on
        # doubling), so a controller that keeps refusing is not asked every retry interval.
        self._new_isr_generation(ask_again=False)
        self._isr_refused_ms = self.now_ms

    def _send_isr_proposal(self) -> None:
        assert self.pending_isr is not None
        self._send.append(ProposeIsr(replica_id=self.replica_id, new_isr=self.pending_isr,
                                     leader_epoch=self.leader_epoch, partition_epoch=self.partition_epoch))

    # ------------------------------------------------------------- follower

    def _send_fetch(self) -> None:
        assert self.leader_id is not None
        self._fetch_inflight = True
        self._fetch_held = False
        self._fetch_sent_ms = self.now_ms
        self._reported_flushed = self.flushed_offset
        self._send.append(Send(to_broker=self.leader_id, message=FetchRequest(
            replica_id=self.replica_id, fetch_offset=self.log_end_offset, last_fetched_epoch=self.last_epoch,
            flushed_offset=self.flushed_offset, current_leader_epoch=self.leader_epoch,
            max_bytes=self.fetch_max_bytes, partition=self.partition)))

    def _is_fetch_in_flight(self, leader_id: int, fetch_offset: int, last_fetched_epoch: int) -> bool:
        """Whether that names the fetch this follower has out: to that leader, from its log as it is."""
        return (self.role is Role.FOLLOWER and self._fetch_inflight and leader_id == self.leader_id
                and (fetch_offset, last_fetched_epoch) == (self.log_end_offset, self.last_epoch))

    def _on_fetch_held(self, ev: FetchHeld) -> None:
        if self._is_fetch_in_flight(ev.leader_id, ev.fetch_offset, ev.last_fetched_epoch):
            self._fetch_held = True

    def _on_fetch_response(self, ev: FetchResponse) -> None:
        check = check_epoch(theirs=ev.leader_epoch, ours=self.leader_epoch)
        if check is EpochCheck.STALE:
            self._notes.append(Rejected(event="FetchResponse", error=ErrorCode.FENCED_LEADER_EPOCH,
                                        their_epoch=ev.leader_epoch, our_epoch=self.leader_epoch))
            if ev.error is not ErrorCode.NONE and self._is_fetch_in_flight(ev.leader_id, ev.fetch_offset,
                                                                          ev.last_fetched_epoch):
                # Our leader has not learned our epoch yet and refused the fetch we have out
                # (it answers with its own, older epoch): ask again after the backoff rather
                # than wait out fetch_retry_ms for an answer that will not come.
                self._fetch_inflight = False
                self._next_fetch_ms = self.now_ms + self.fetch_backoff_ms
            return
        if check is EpochCheck.NEWER:
            self._saw_newer_epoch(ev.leader_epoch, f"fetch response from replica {ev.leader_id}")
            return
        if self.role is not Role.FOLLOWER or ev.leader_id != self.leader_id:
            return
        if (ev.fetch_offset, ev.last_fetched_epoch) != (self.log_end_offset, self.last_epoch):
            return  # answers a request made from another state of our log: a duplicate or late
        self._fetch_inflight = False
        if ev.error is not ErrorCode.NONE:
            if ev.error is ErrorCode.FENCED_LEADER_EPOCH:
                self._notes.append(RefreshMetadata(seen_epoch=ev.leader_epoch, known_epoch=self.leader_epoch,
                                                   reason="leader refused our epoch"))
            self._next_fetch_ms = self.now_ms + self.fetch_backoff_ms
            return
        if ev.diverging:
            self._truncate_diverging(ev.diverging_epoch, ev.diverging_end_offset)
            self._send_fetch()
            return
        if ev.records:
            if not self._append_as_follower(ev.records):
                self._next_fetch_ms = self.now_ms + self.fetch_backoff_ms
                return
        self.high_watermark = min(ev.high_watermark, self.log_end_offset)
        if self.unclean_start and self.log_end_offset >= ev.log_end_offset:
            self.unclean_start = False
        if ev.flush_after_append:
            self._request_flush()
        if ev.records and ev.flush_after_append and self.log_end_offset >= ev.log_end_offset:
            # Caught up, and acks=all waits on what we just appended: the fetch that counts
            # carries our flushed offset, so it goes when the flush is done (_on_flush_done).
            # One sent now would only long-poll with the old flushed offset, and the leader
            # would step it and then a second one. Behind, we fetch at once (pipelined).
            self._next_fetch_ms = self.now_ms + self.fetch_timeout_ms  # should the flush never report
        elif ev.records:
            self._send_fetch()
        else:
            self._next_fetch_ms = self.now_ms + self.fetch_backoff_ms

    def _truncate_diverging(self, leader_epoch: int, leader_end: int) -> None:
        if leader_epoch < 0 and leader_end > self.log_end_offset:
            # The leader's log starts past our end: what we lack is gone there, so our log
            # cannot be continued (Kafka's truncateFullyAndStartAt).
            self._start_at(leader_end)
            return
        mine_epoch, mine_end = self.log.end_offset_for_epoch(leader_epoch) if leader_epoch >= 0 else (-1, -1)
        if mine_epoch < 0:
            offset = min(leader_end, self.log_end_offset) if leader_epoch < 0 else self.log.log_start_offset
        elif mine_epoch == leader_epoch:
            offset = min(leader_end, mine_end)
        else:
            # We never had the leader's epoch: cut to where our older one ends and ask again.
            offset = mine_end
        offset = max(offset, self.log.log_start_offset)
        if offset >= self.log_end_offset:
            return
        self._cut_to(offset)

    def _cut_to(self, offset: int) -> None:
        """Truncate the log at `offset` and pull every offset the core tracks down with it
        (both the fetch path and the push path cut here)."""
        self._persist.append(Truncate(offset=offset))
        self._producer_state_stale = True
        self.log_end_offset = offset
        self.last_epoch = self.log.epoch_before(offset)
        self.written_offset = min(self.written_offset, offset)
        self.flushed_offset = min(self.flushed_offset, offset)
        self._flush_requested = min(self._flush_requested, offset)
        self.high_watermark = min(self.high_watermark, offset)

    def _start_at(self, offset: int) -> None:
        """Empty the log and restart it at `offset`, the leader's log start, past our end.

        What we drop the leader no longer holds either, so no fetch could continue it. The
        empty log is durable at `offset`; the HW stays where it is until the leader's next
        answer says more, as always (a broker's retention deletes only below its HW, but
        the core does not lean on another module's rule)."""
        assert offset > self.log_end_offset, (offset, self.log_end_offset)
        self._persist.append(TruncateFully(offset=offset))
        self._producer_state_stale = True
        self.log_end_offset = offset
        self.last_epoch = -1
        self.written_offset = self.flushed_offset = self._flush_requested = offset
        self._reported_flushed = min(self._reported_flushed, offset)
        self._unflushed_since_ms = None

    def _append_as_follower(self, records: Buffer) -> bool:
        try:
            headers = [h for _, h in iter_batches(records)]
        except CorruptBatchError as exc:
            self._notes.append(Rejected(event="FetchResponse", error=ErrorCode.CORRUPT_MESSAGE,
                                        their_epoch=self.leader_epoch, our_epoch=self.leader_epoch, reason=str(exc)))
            return False
        expected = self.log_end_offset
        for h in headers:
            # Gaps are what compaction leaves in the leader's log; an overlap is an error.
            if h.base_offset < expected or h.leader_epoch > self.leader_epoch:
                self._notes.append(Rejected(event="FetchResponse", error=ErrorCode.INVALID_REQUEST,
                                            their_epoch=h.leader_epoch, our_epoch=self.leader_epoch,
                                            reason=f"batch at {h.base_offset}, expected {expected} or above"))
                return False
            expected = h.next_offset
        self._persist.append(Append(as_leader=False, records=records, base_offset=headers[0].base_offset,
                                    last_offset=expected - 1, leader_epoch=headers[-1].leader_epoch))
        for h in headers:
            self.producer_state.record(h, base_offset=h.base_offset, seen_ms=self.wall_ms)
        self.log_end_offset = expected
        self.last_epoch = headers[-1].leader_epoch
        return True

    @property
    def _pushing(self) -> bool:
        return self.push_capable and self.config.replication_mode == "push"

    def _following(self, leader_id: int) -> bool:
        return self.role is Role.FOLLOWER and self.leader_id == leader_id

    # ----------------------------------------------------------- local I/O

    def _on_write_done(self, ev: WriteDone) -> None:
        self.written_offset = max(self.written_offset, min(ev.last_offset + 1, self.log_end_offset))

    def _on_flush_done(self, ev: FlushDone) -> None:
        self.flushed_offset = min(ev.flushed_offset, self.log_end_offset)
        if self.flushed_offset >= self.log_end_offset:
            self._unflushed_since_ms = None
        if self.role is Role.LEADER and self.flushed_offset > self.epoch_start_offset:
            self.epoch_durable = True
        if self.role is Role.ELECTION and self._report_sent_ms is None and self.flushed_offset >= self.log_end_offset:
            self._report_election()
        elif self.role is Role.FOLLOWER and self.flushed_offset > self._reported_flushed:
            # The leader may be holding acks=all for this flush: tell it now rather than
            # on the next (possibly long-polling) fetch.
            if self._pushing:
                assert self.leader_id is not None  # a follower knows its leader
                self._reported_flushed = self.flushed_offset
                self._reply_append_entries(self.leader_id)
            elif self.config.durability == "fsync":
                self._send_fetch()
            # Under durability=write the HW counts written offsets: a (lazy) flush is news to
            # nobody, and an extra fetch for it would race the next records; it rides on the
            # next fetch.

    def _debounce_ms(self) -> int:
        """The topic's flush_debounce_ms, else the replica's own."""
        topic = self.config.flush_debounce_ms
        return self.flush_debounce_ms if topic is None else topic

    def _request_flush(self) -> None:
        if self._flush_requested >= self.log_end_offset:
            return  # a flush already asked for covers it
        self._flush_requested = self.log_end_offset
        self._persist.append(Flush(up_to=self.log_end_offset))

    # ----------------------------------------------------------------- time

    def move_clock(self, now_ms: int, wall_ms: int | None = None, *,
                   due_ms: int | None | Unknown = UNKNOWN) -> bool:
        """Do what a Tick at `now_ms` does when none of its timed rules is due by then
        (`next_tick_ms`): move the clocks, nothing else, for a fraction of a step. False, with
        nothing moved, when one is due: the driver steps a Tick instead. A driver moves the
        clock this way before an event that needs it fresh (a fetch stamps a follower caught up
        at `now_ms`); with thousands of quiet partitions, a whole Tick step before each was
        half the cost of keeping their followers in the ISR. `due_ms`: the caller's copy of
        `next_tick_ms()` from after the last step (a rule due then is due still; none comes
        due but by time), so that it is not worked out twice per event."""
        if now_ms < self.now_ms:
            raise ValueError(f"the clock went back: now_ms={now_ms} after {self.now_ms}")
        due = self.next_tick_ms() if isinstance(due_ms, Unknown) else due_ms
        if due is not None and due <= now_ms:
            return False
        self.wall_ms = self.wall_ms + (now_ms - self.now_ms) if wall_ms is None else wall_ms
        self.now_ms = now_ms
        return True

    def next_tick_ms(self, *, caught_up_clocks: bool = True) -> int | None:
        """The earliest clock reading at which a Tick would act (None: no Tick would).
        `caught_up_clocks=False` leaves out when an ISR follower's caught-up clock runs out (a
        driver that watches the followers' fetch sessions itself times the rest).

        A Tick before it only moves `now_ms`, so a driver may skip it: drivers keep one timer
        per replica at this time, asked after every step (any event may start or end a wait),
        instead of ticking every replica. Each term is one timed rule of `_on_tick` (and of
        `_after_event`, which every Tick runs): an earlier answer costs a Tick that does
        nothing, a later one would delay a rule, so a rule added there belongs here too."""
        due: list[int] = []
        expiry = self.producer_state.next_expiry_ms()  # a wall-clock time
        if expiry is not None:
            due.append(self.now_ms + max(expiry - self.wall_ms, 0))
        if self._unflushed_since_ms is not None and self.flushed_offset < self.log_end_offset:
            due.append(self._unflushed_since_ms + self._debounce_ms())
        if self.role is Role.LEADER:
            due += [p.deadline_ms for p in self.pending.values()]
            due += [deadline_ms for _, deadline_ms in self._held.values()]
            due += [deadline_ms for _, _, deadline_ms in self._backlog.values()]
            if self._pushing:
                for replica_id, p in self.progress.items():
                    if p.push_inflight:  # lost window (_push_timeouts)
                        due.append(p.push_inflight[0][1] + self.fetch_timeout_ms)
                    else:  # heartbeat (_push_to)
                        due.append(p.push_last_sent_ms + self._push_heartbeat_interval_ms(replica_id))
            if self.pending_isr is not None:
                due.append(self._pending_isr_sent_ms + self.isr_proposal_retry_ms)
            elif self.state is not None:
                if self._wanted_isr() is not None:
                    due.append(self.now_ms)
                else:  # times already past are those a refusal holds back: its own term covers them
                    if self._isr_refused_ms is not None and self._isr_refused_ms + self.isr_proposal_retry_ms > self.now_ms:
                        due.append(self._isr_refused_ms + self.isr_proposal_retry_ms)
                    lag_max = self.config.replica_lag_time_max_ms
                    if caught_up_clocks:
                        due += [t for t in (self.progress[r].last_caught_up_ms + lag_max + 1
                                            for r in self.state.isr if r in self.progress) if t > self.now_ms]
                    ask_at = self._join_ask_due_ms()
                    if ask_at is not None:
                        due.append(ask_at)
        elif self.role is Role.FOLLOWER and not self._pushing:
            if not self._fetch_inflight:
                due.append(self._next_fetch_ms)
            elif not self._fetch_held:
                due.append(self._fetch_sent_ms + self.fetch_retry_ms)
        elif self.role is Role.ELECTION and self._report_sent_ms is not None:
            due.append(self._report_sent_ms + self.election_report_retry_ms)
        return min(due) if due else None

    def refresh_caught_up(self, now_ms: int, wall_ms: int | None,
                          fetching: tuple[StillFetching, ...]) -> tuple[bool, int | None]:
        """Do what a Tick at `now_ms` carrying `fetching` does when that news is all it would act
        on: a quiet leader's refresh of its followers' caught-up clocks from their fetch sessions,
        once per lag time per partition (an idle broker's largest single kind of work at
        thousands of partitions), for a fraction of a step. (True, next_tick_ms()) when done so,
        with the core as that Tick would leave it; (False, None), with nothing changed, when the
        Tick would do more (a deadline, a flush, an ISR change, a join to ask about): the
        driver steps it instead. Checked against the Tick in tests/test_replica_core.py."""
        if now_ms < self.now_ms:
            raise ValueError(f"the clock went back: now_ms={now_ms} after {self.now_ms}")
        # Every timed rule of the Tick is a term of next_tick_ms (asked below, after the news);
        # the after-step rules (HW, admission, releases) act on what events change, and only
        # clocks move here. Left to a whole step: another role, push, a log that moved under the
        # core (the step's _sync_from_log), and a join to ask about (the Tick times its next ask
        # before its news, which may then leave nothing due).
        if (self.role is not Role.LEADER or self._pushing or self.state is None or self._producer_state_stale
                or self.log.log_end_offset != self.log_end_offset or self._joiners_to_ask(now_ms)):
            return False, None
        was_now, was_wall = self.now_ms, self.wall_ms
        kept = [(p, p.last_caught_up_ms, p.fetch_generation) for news in fetching
                if (p := self.progress.get(news.replica_id)) is not None]
        was = invariants.before(self) if self.check_invariants else None
        self.wall_ms = self.wall_ms + (now_ms - self.now_ms) if wall_ms is None else wall_ms
        self.now_ms = now_ms
        for news in fetching:
            self._still_fetching(news)
        due = self.next_tick_ms()   # due now too when the news leaves an ISR change to propose
        if due is not None and due <= now_ms:
            self.now_ms, self.wall_ms = was_now, was_wall
            for p, caught_up_ms, generation in kept:
                p.last_caught_up_ms, p.fetch_generation = caught_up_ms, generation
            return False, None
        if was is not None:
            invariants.check(self, was, Tick(now_ms=now_ms, wall_ms=wall_ms, fetching=fetching))
        return True, due

    def isr_followers(self) -> tuple[int, ...]:
        """The ISR followers whose caught-up clocks this pull leader keeps (empty otherwise)."""
        if self.role is not Role.LEADER or self._pushing or self.state is None:
            return ()
        return tuple(r for r in self.state.isr if r in self.progress)

    def caught_up_due(self, now_ms: int) -> tuple[int, ...]:
        """The followers a Tick at `now_ms` wants news of (`Tick.fetching`): every ISR follower
        once some ISR follower's caught-up clock has run out by then, so that their clocks move
        on together (one Tick per lag time for a quiet partition, not one per follower); and
        the followers that may join the ISR (_join_candidates) when it is time to ask. Empty
        unless this is a pull leader."""
        if self.role is not Role.LEADER or self._pushing or self.state is None:
            return ()
        followers = self.isr_followers()
        lag_max = self.config.replica_lag_time_max_ms
        wanted = followers if any(now_ms - self.progress[r].last_caught_up_ms > lag_max for r in followers) else ()
        return wanted + self._joiners_to_ask(now_ms)

    def _still_fetching(self, news: StillFetching) -> None:
        """Kafka's rule for a fetch at our log end, applied to a fetch session's: the follower
        is caught up as of when it was seen fetching, if its kept position is the one we last
        stepped a fetch from (its newest, not diverging) and still our log end. Anything else
        (records since, a new position, a new flushed offset) is a fetch the driver steps."""
        if self.role is not Role.LEADER or self._pushing:
            return
        p = self.progress.get(news.replica_id)
        if (p is None or p.last_fetch_ms < 0 or news.fetch_offset != p.fetch_offset
                or p.asked_offset != p.fetch_offset or p.match_offset != p.fetch_offset
                or p.fetch_offset < self.log_end_offset):
            return
        seen_ms = min(news.seen_ms, self.now_ms)
        p.last_caught_up_ms = max(p.last_caught_up_ms, seen_ms)
        if seen_ms >= self._isr_generation_ms:
            # Seen fetching since the ISR last changed: a fetch of this generation, as one we
            # stepped now would be (what lets a caught-up follower out of the ISR join again).
            p.fetch_generation = self._isr_generation

    def _on_tick(self, ev: Tick) -> None:
        if ev.now_ms < self.now_ms:
            raise ValueError(f"Tick went back in time: now_ms={ev.now_ms} after {self.now_ms}")
        self.wall_ms = self.wall_ms + (ev.now_ms - self.now_ms) if ev.wall_ms is None else ev.wall_ms
        self.now_ms = ev.now_ms
        if self._joiners_to_ask(self.now_ms):
            # The driver asked the sessions after them for this Tick (caught_up_due): until one
            # is seen, ask again after twice as long, up to the lag time.
            if self._join_asked_ms is not None:
                self._join_ask_ms = min(2 * self._join_ask_ms, self.config.replica_lag_time_max_ms)
            self._join_asked_ms = self.now_ms
        for news in ev.fetching:
            self._still_fetching(news)
        self.producer_state.expire(self.wall_ms)
        if (self._unflushed_since_ms is not None and self.flushed_offset < self.log_end_offset
                and self.now_ms - self._unflushed_since_ms >= self._debounce_ms()):
            self._unflushed_since_ms = None
            self._request_flush()
        if self.role is Role.LEADER:
            for p in list(self.pending.values()):
                if self.now_ms >= p.deadline_ms:
                    del self.pending[p.request_id]
                    self._release.append(ReleaseProduce(request_id=p.request_id, error=ErrorCode.REQUEST_TIMED_OUT,
                                                        reason=self._commit_wait(p.last_offset + 1)))
            self._time_out_held()
            for request_id, (request, _, deadline_ms) in list(self._backlog.items()):
                if self.now_ms >= deadline_ms:
                    del self._backlog[request_id]
                    self._backlog_bytes -= len(request.records)
                    self._release.append(ReleaseProduce(request_id=request_id, error=ErrorCode.REQUEST_TIMED_OUT))
            if self._pushing:
                self._push_timeouts()
            if self.pending_isr is not None:
                if self.now_ms - self._pending_isr_sent_ms >= self.isr_proposal_retry_ms:
                    self._pending_isr_sent_ms = self.now_ms
                    self._send_isr_proposal()
            else:
                self._maybe_change_isr()
        elif self.role is Role.FOLLOWER and self._pushing:
            pass  # the leader drives a push follower (heartbeats, recovery)
        elif self.role is Role.FOLLOWER:
            if self._fetch_inflight:
                if not self._fetch_held and self.now_ms - self._fetch_sent_ms >= self.fetch_retry_ms:
                    self._send_fetch()
            elif self.now_ms >= self._next_fetch_ms:
                self._send_fetch()
        elif self.role is Role.ELECTION and self._report_sent_ms is not None:
            if self.now_ms - self._report_sent_ms >= self.election_report_retry_ms:
                self._report_election()

    # -------------------------------------------------------------- fencing

    def _saw_newer_epoch(self, epoch: int, source: str) -> None:
        self._notes.append(RefreshMetadata(seen_epoch=epoch, known_epoch=self.leader_epoch,
                                           reason=f"newer leader epoch in {source}"))
        if self.role in (Role.LEADER, Role.FOLLOWER):
            self._become_stopped(f"leader epoch {epoch} seen in {source}")


# One handler per event type; `step` looks the handler up by the event's exact type, so each
# handler gets the type it declares (Any: the table's value type cannot say which).
_HANDLERS: dict[type, Callable[[Replica, Any], None]] = {
    NewMetadata: Replica._on_new_metadata,
    ProduceRequest: Replica._on_produce,
    BrokerBudget: Replica._on_broker_budget,
    FetchRequest: Replica._on_fetch_request,
    FetchResponse: Replica._on_fetch_response,
    FetchHeld: Replica._on_fetch_held,
    AppendEntries: Replica._on_append_entries,
    AppendEntriesReply: Replica._on_append_entries_reply,
    WriteDone: Replica._on_write_done,
    IsrChangeAccepted: Replica._on_isr_change_accepted,
    IsrChangeRefused: Replica._on_isr_change_refused,
    FlushDone: Replica._on_flush_done,
    Tick: Replica._on_tick,
}
