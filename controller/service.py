"""The asyncio controller: one Raft node, its committed image, and on the leader a pending one.

Every node mirrors the committed image from the outcomes the Raft thread hands
over (`on_applied`, `on_reset`), keeps a bounded window of recent records for
brokers' metadata fetches, and answers reads from it.

The leader trusts its view only after a marker it proposed in the current term
has committed: by then every command of earlier terms is applied, so
`pending = committed.copy()` is the whole truth. From then on a single
sequential command path (the event loop itself: the core's step, staging and
applying to `pending` happen with no await in between) turns requests and the
periodic timer into records (`execute`: the leader's `ControllerCore` decides,
this service holds no rules), applies them to `pending` (so the next decision
sees them), and groups what was staged in one loop turn into one Raft command
`{"expected_offset", "records"}`. Several commands may be in flight. If any of
them fails or commits differently from `pending`, the view is dropped and
rebuilt behind a new marker.
"""
from __future__ import annotations

import asyncio
import dataclasses
import functools
import itertools
import logging
import time
from collections import deque
from typing import Callable, Protocol

from common.errors import CommitFailedError, NotControllerError, RecordRejected
from common.metadata import FenceBroker, MetadataImage, Record, dump_record
from common.tasks import cancel_and_wait
from common.usage import BrokerUsage, merge_report
from controller.core import AddPartitions, AlterConfig, ControllerCore, CreateTopic, DeleteTopic, Event, Step, Tick
from controller.decisions import Hearing, LeaderSettings
from controller.replicated import Outcome, batch_command, marker_command

log = logging.getLogger("biplane.controller")

# A tick this much later than its interval means the controller did not run meanwhile.
PAUSE_CREDIT_MIN_MS = 250

_CHECKABLE = (CreateTopic, DeleteTopic, AlterConfig, AddPartitions)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ControllerNode:
    node_id: int
    raft_address: str
    api_url: str
    priority: int = 1


@dataclasses.dataclass(frozen=True, kw_only=True)
class Committed:
    """Offsets a staged group of records got; `rejected` holds the ones pending refused."""

    offsets: tuple[int, ...]
    records: tuple[Record, ...] = ()
    rejected: tuple[str, ...] = ()

    @property
    def last_offset(self) -> int | None:
        return self.offsets[-1] if self.offsets else None


@dataclasses.dataclass
class _Batch:
    expected_offset: int
    records: list[Record] = dataclasses.field(default_factory=list)
    # (future, first_index, count, rejected)
    waiters: list[tuple[asyncio.Future[Committed], int, int, tuple[str, ...]]] = dataclasses.field(
        default_factory=list)


@dataclasses.dataclass(frozen=True, kw_only=True)
class FetchResult:
    """Records after a broker's offset, or the whole image when it is too far behind."""

    offset: int                          # committed offset this answer reflects
    records: list[tuple[int, dict]] | None = None
    image: dict | None = None


class RaftSettingsView(Protocol):
    @property
    def self_address(self) -> str: ...
    @property
    def peer_addresses(self) -> tuple[str, ...]: ...


class RaftStatusView(Protocol):
    """What the service reads of a Raft node's status (controller.raft.RaftStatus)."""

    @property
    def is_leader(self) -> bool: ...
    @property
    def leader_address(self) -> str | None: ...
    @property
    def term(self) -> int: ...
    @property
    def connected_peers(self) -> tuple[str, ...]: ...
    @property
    def commit_index(self) -> int: ...
    @property
    def last_applied(self) -> int: ...
    @property
    def last_log_index(self) -> int: ...
    @property
    def match_index(self) -> tuple[tuple[str, int], ...]: ...


class RaftHandle(Protocol):
    """The Raft node the service drives (controller.raft.RaftNode, or a test's stand-in)."""

    @property
    def settings(self) -> RaftSettingsView: ...
    def start(self) -> None: ...
    def stop(self) -> None: ...
    def hand_over(self) -> None: ...
    def status(self) -> RaftStatusView: ...
    def propose(self, command_json: str) -> "asyncio.Future[Outcome]": ...


class RaftFactory(Protocol):
    """Builds the Raft node once the loop runs; the callbacks run on that loop."""

    def __call__(self, *, loop: asyncio.AbstractEventLoop, on_applied: Callable[[Outcome], None],
                 on_reset: Callable[[dict], None], on_role_change: Callable[[], None]) -> RaftHandle: ...


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


class ControllerService:
    def __init__(self, *, node_id: int, nodes: list[ControllerNode], raft_factory: RaftFactory,
                 leader_settings: LeaderSettings = LeaderSettings(), periodic_interval_ms: int = 75,
                 inflight_batches_max: int = 16, batch_records_max: int = 2000,
                 metadata_window_records: int = 20_000, commit_timeout_ms: int = 5000,
                 clock_ms: Callable[[], int] = wall_clock_ms,
                 monotonic_s: Callable[[], float] = time.monotonic) -> None:
        self.node_id = node_id
        self.nodes = {n.node_id: n for n in nodes}
        if node_id not in self.nodes:
            raise ValueError(f"node id {node_id} is not in the cluster {sorted(self.nodes)}")
        self._by_raft = {n.raft_address: n for n in nodes}
        self._raft_factory = raft_factory
        self.leader_settings = leader_settings
        self.session_timeout_ms = leader_settings.session_timeout_ms
        self.periodic_interval_ms = periodic_interval_ms
        self.inflight_batches_max = inflight_batches_max
        self.batch_records_max = batch_records_max
        self.metadata_window_records = metadata_window_records
        self.commit_timeout_ms = commit_timeout_ms
        self.clock_ms = clock_ms
        self.monotonic_s = monotonic_s   # times the timer's own lag (_paused_ms)

        self.committed = MetadataImage()
        self.window: deque[tuple[int, dict]] = deque(maxlen=metadata_window_records)
        self.usage: dict[int, BrokerUsage] = {}
        self._usage_incarnation: dict[int, str] = {}
        self.broker_offsets: dict[int, int] = {}
        self.broker_opening: dict[int, int] = {}   # replicas each broker said are still opening
        # The heartbeats answered "not the leader" here: when this node leads next, a broker's
        # silence counts from its last one (sessions.Hearing).
        self.hearing = self._new_hearing()
        self.pending: MetadataImage | None = None
        self.core: ControllerCore | None = None   # the leader's decisions and unreplicated state (with `pending`)
        self.trusted_term: int | None = None
        self.raft: RaftHandle | None = None
        self.stats = {"records_committed": 0, "batches_committed": 0, "batches_failed": 0,
                      "leader_elections_won": 0, "records_rejected": 0}

        self._open: deque[_Batch] = deque()    # staged, not yet proposed; each <= batch_records_max
        self._flush_scheduled = False
        self._inflight: deque[tuple[_Batch, asyncio.Future[Outcome]]] = deque()
        self._marker: tuple[int, float] | None = None   # (term, monotonic start) of the marker in flight
        self._marker_nonce = itertools.count(1)
        self._advanced = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopped = False
        self._resigning = False
        self._last_tick_s: float | None = None   # time.monotonic() of the last _tick

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.raft = self._raft_factory(loop=loop, on_applied=self._on_applied, on_reset=self._on_reset,
                                       on_role_change=self._on_role_change)
        self.raft.start()
        self._task = loop.create_task(self._timer(), name="controller-timer")

    async def resign(self, timeout_s: float = 2.0) -> bool:
        """Before a stop: decide nothing more as leader, and hand Raft's leadership to a caught-up
        peer. A stopping leader went on deciding while its API was closing, so it heard no
        heartbeat and fenced every broker 1.5 s later (an operator's `biplane restart
        controller` of the leader). True once another node leads or this one never did; waits
        up to `timeout_s` for the handover, asking again while no peer is caught up."""
        self._resigning = True
        self._untrust("controller is stopping")
        # Brokers' metadata long-polls end now (empty), so the API closes without waiting them
        # out; the brokers ask again, of the next leader.
        self._wake_metadata_waiters()
        if self.raft is None or not self.raft.settings.peer_addresses:
            return True   # a lone controller has nobody to hand over to: dropping its view is all
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        asked_at = None
        while self.raft.status().is_leader:
            if loop.time() >= deadline:
                log.warning("controller %d still leads %.1f s after asking a peer to take over; stopping "
                            "anyway (the others elect a leader after their election timeout)", self.node_id,
                            timeout_s, extra={"event": "controller.handover_timed_out"})
                return False
            if asked_at is None or loop.time() - asked_at >= 0.25:
                self.raft.hand_over()
                asked_at = loop.time()
            await asyncio.sleep(0.02)
        return True

    async def stop(self) -> None:
        """Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        errors = await cancel_and_wait(self._task)
        self._untrust("controller is shutting down")
        if self.raft is not None:
            await asyncio.to_thread(self.raft.stop)
        if errors:
            raise errors[0]  # the timer failed: say so, after closing the rest

    # ------------------------------------------------------------ roles

    @property
    def is_leader(self) -> bool:
        """True only while this node's view is trusted (its marker committed in this term)."""
        return self.pending is not None

    def raft_status(self) -> RaftStatusView | None:
        """Raft's status (metrics); None before start()."""
        return self.raft.status() if self.raft is not None else None

    def leader_node(self) -> ControllerNode | None:
        if self.is_leader:
            return self.nodes[self.node_id]
        if self.raft is None:
            return None
        status = self.raft.status()
        if status.is_leader:
            return self.nodes[self.node_id]
        return self._by_raft.get(status.leader_address) if status.leader_address else None

    def require_leader(self) -> MetadataImage:
        if self.pending is None:
            leader = self.leader_node()
            where = (f"controller {leader.node_id} at {leader.api_url}" if leader and leader.node_id != self.node_id
                     else "no controller yet (election in progress)")
            err = NotControllerError(f"controller {self.node_id} is not the leader; the leader is {where}")
            err.leader = leader if leader and leader.node_id != self.node_id else None
            raise err
        return self.pending

    def require_core(self) -> tuple[MetadataImage, ControllerCore]:
        """The pending image and the leader's core; NotControllerError unless trusted."""
        image = self.require_leader()
        assert self.core is not None, "a trusted leader has its core"
        return image, self.core

    def _untrust(self, why: str) -> None:
        if self.pending is not None:
            log.info("controller %d drops its leader view: %s", self.node_id, why)
        self.pending = None
        self.trusted_term = None
        self.core = None
        error = CommitFailedError(f"controller {self.node_id} lost its leader view ({why}); "
                                  "the request may or may not take effect: check and retry")
        while self._open:
            _fail_waiters(self._open.popleft(), error)
        while self._inflight:
            b, fut = self._inflight.popleft()
            _fail_waiters(b, error)
            fut.cancel()

    def _trust(self, term: int) -> None:
        self.pending = self.committed.copy()
        self.trusted_term = term
        now_ms = self.clock_ms()
        heard = self.hearing.as_of(now_ms)
        self.core = ControllerCore(self.leader_settings, heard_before_start=heard)
        self.hearing = self._new_hearing()
        self.stats["leader_elections_won"] += 1
        # Which brokers' silence counts from what was heard while following (the rest get the
        # grace): the first thing to read when a broker is fenced sooner or later than expected.
        log.info("controller %d leads in term %d at offset %d; brokers heard while following "
                 "(ms ago their silence counts from): %s", self.node_id, term, self.pending.offset,
                 {b: now_ms - at for b, (_, at) in sorted(heard.items())} or "none")

    async def _timer(self) -> None:
        while True:
            try:
                self._tick()
            except Exception:
                log.exception("controller timer failed")
            await asyncio.sleep(self.periodic_interval_ms / 1000)

    def _on_role_change(self) -> None:
        # Raft's role changed: act now rather than at the next timer tick.
        if not self._stopped:
            try:
                self._tick()
            except Exception:
                log.exception("controller role change handling failed")

    def _tick(self) -> None:
        assert self.raft is not None, "started"
        if self._resigning:
            return   # no marker, no decisions: a peer takes over (resign)
        paused_ms = self._paused_ms()
        status = self.raft.status()
        if self.pending is not None and (not status.is_leader or status.term != self.trusted_term):
            self._untrust(f"raft is now {'leader' if status.is_leader else 'follower'} in term {status.term}")
        if status.is_leader and self.pending is None and self._marker_due(status.term):
            self._propose_marker(status.term)
        if self.pending is not None:
            image, core = self.require_core()
            now_ms = self.clock_ms()
            step = core.step(image, Tick(now_ms=now_ms, paused_ms=paused_ms))
            for warning in step.warnings:
                log.warning("%s", warning)
            if step.records:
                # Nobody awaits the periodic pass: a lost leadership fails it, and the pass
                # of whichever controller leads next decides again from the committed image.
                silent_ms = {r.broker_id: _silent_ms(core, r.broker_id, now_ms)
                             for r in step.records if isinstance(r, FenceBroker)}
                self.stage(list(step.records)).add_done_callback(
                    functools.partial(_note_periodic_outcome, self.node_id, silent_ms))

    def _paused_ms(self) -> int:
        """How much later than its interval this tick runs, when that is a stall (at least
        PAUSE_CREDIT_MIN_MS): the time this process did not run. Smaller lags are left to the
        session timeout's margin, so a controller that merely runs a little late every tick
        does not slow the fencing of brokers that are really gone."""
        now = self.monotonic_s()
        last, self._last_tick_s = self._last_tick_s, now
        if last is None:
            return 0
        lag_ms = int((now - last) * 1000) - self.periodic_interval_ms
        return lag_ms if lag_ms >= PAUSE_CREDIT_MIN_MS else 0

    def _marker_due(self, term: int) -> bool:
        # pysyncobj may never call back for an entry a lost leadership left behind, so a
        # marker of another term, or one older than the commit timeout, is given up.
        if self._marker is None:
            return True
        marker_term, started = self._marker
        return marker_term != term or time.monotonic() - started > self.commit_timeout_ms / 1000

    def _propose_marker(self, term: int) -> None:
        raft = self.raft
        assert raft is not None, "started"
        self._marker = marker = (term, time.monotonic())
        fut = raft.propose(marker_command(node=raft.settings.self_address, term=term,
                                          nonce=next(self._marker_nonce)))

        def done(f: asyncio.Future[Outcome]) -> None:
            if self._marker is marker:
                self._marker = None
            if f.cancelled() or f.exception() is not None:
                return
            status = raft.status()
            if (status.is_leader and status.term == term and self.pending is None and not self._stopped
                    and not self._resigning):   # a marker committing after SIGTERM must not re-trust
                self._trust(term)

        fut.add_done_callback(done)

    # ------------------------------------------------------------ command path

    def stage(self, records: list[Record]) -> asyncio.Future[Committed]:
        """Apply records to `pending` now and queue them for the next Raft command.

        Returns a future with a `Committed`. Records `pending` rejects are not
        proposed; their messages are in `Committed.rejected`. Must be called on
        the loop with no await between the decision and this call.
        """
        pending = self.require_leader()
        fut: asyncio.Future[Committed] = asyncio.get_running_loop().create_future()
        if not self._open or len(self._open[-1].records) >= self.batch_records_max:
            # One decision's records stay in one command; a full command starts the next.
            self._open.append(_Batch(expected_offset=pending.offset))
        batch = self._open[-1]
        first = len(batch.records)
        rejected: list[str] = []
        for record in records:
            try:
                pending.apply(record, pending.offset + 1)
            except RecordRejected as exc:
                rejected.append(str(exc))
                self.stats["records_rejected"] += 1
                continue
            batch.records.append(record)
        batch.waiters.append((fut, first, len(batch.records) - first, tuple(rejected)))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)
        return fut

    async def commit(self, records: list[Record]) -> Committed:
        fut = self.stage(records)
        return await fut

    async def execute(self, event: Event) -> tuple[Step, Committed | None]:
        """Step the leader's core with `event` on the pending image, stage what it decided,
        and await the commit when the step says so (else the commit is None).

        The one way the RPC and API handlers change the leader's state. The core raises
        BiplaneError on bad input; nothing is changed or staged then.
        """
        image, core = self.require_core()
        step = core.step(image, event)
        if not step.wait_for_commit:
            return step, None
        return step, await self.commit(list(step.records))

    def check(self, event: Event) -> Step:
        """Decide `event` on the pending image and stage nothing: a dry run (Kafka's
        validate_only). Only for the admin API's topic writes, whose steps change nothing
        but the records they return; BiplaneError when the event would be refused."""
        if not isinstance(event, _CHECKABLE):
            raise TypeError(f"{type(event).__name__} cannot be checked without being applied")
        image, core = self.require_core()
        return core.step(image, event)

    async def decide(self, decision: Callable[[MetadataImage], list[Record]]) -> Committed:
        """Run a pure decision on the pending image, stage its records, await their commit.

        For tests and tools that write records of their own; handlers use `execute`.
        The decision raises BiplaneError on bad input; nothing is staged then.
        """
        records = decision(self.require_leader())
        return await self.commit(list(records))

    def _flush(self) -> None:
        self._flush_scheduled = False
        # The rest waits for the next commit outcome, which flushes again.
        while self._open and self.pending is not None and len(self._inflight) < self.inflight_batches_max:
            batch = self._open.popleft()
            if not batch.records:
                _resolve_waiters(batch, ())
                continue
            assert self.raft is not None, "started"
            fut = self.raft.propose(batch_command(expected_offset=batch.expected_offset, records=batch.records))
            self._inflight.append((batch, fut))
            fut.add_done_callback(functools.partial(self._on_proposal_done, batch))
            asyncio.get_running_loop().call_later(self.commit_timeout_ms / 1000, self._check_timeout, fut)

    def _check_timeout(self, fut: asyncio.Future[Outcome]) -> None:
        if not fut.done() and any(f is fut for _, f in self._inflight):
            self._untrust(f"a proposal did not commit within {self.commit_timeout_ms} ms")

    def _on_proposal_done(self, batch: _Batch, fut: asyncio.Future[Outcome]) -> None:
        if not self._inflight or self._inflight[0][1] is not fut:
            return  # already failed by _untrust
        self._inflight.popleft()
        if fut.cancelled() or fut.exception() is not None:
            self.stats["batches_failed"] += 1
            _fail_waiters(batch, CommitFailedError(f"proposal failed: {fut.exception() if not fut.cancelled() else 'cancelled'}"))
            self._untrust(f"proposal failed: {fut.exception() if not fut.cancelled() else 'cancelled'}")
            return
        outcome: Outcome = fut.result()
        if outcome.kind != "batch" or outcome.rejected or len(outcome.applied) != len(batch.records):
            self.stats["batches_failed"] += 1
            error = CommitFailedError(f"the committed image diverged from this leader's view "
                                      f"({outcome.kind}: {outcome.message or outcome.rejected}); retry")
            _fail_waiters(batch, error)
            self._untrust("committed outcome differs from the pending view")
            return
        self.stats["batches_committed"] += 1
        _resolve_waiters(batch, tuple(off for off, _ in outcome.applied))
        if self._open and not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _new_hearing(self) -> Hearing:
        # Brokers heartbeat every few hundred ms: half a session without any heard means this
        # node was not listening, and it must not count that as their silence. One silent for
        # longer than a session and the grace yet unfenced was heartbeating another controller.
        s = self.leader_settings
        return Hearing(gap_ms_max=max(1, s.session_timeout_ms // 2),
                       forget_ms=s.session_timeout_ms + s.new_leader_grace_ms)

    def note_heartbeat_refused(self, broker_id: int, incarnation_id: str) -> None:
        """A heartbeat this node answered "not the leader": kept for its next leadership, also
        from a broker whose registration this node has not applied yet (Hearing bounds them)."""
        # Leading by now (the body's read let the trust in): the heartbeat's retry is heard.
        if not self.is_leader:
            self.hearing.heard(broker_id, incarnation_id, self.clock_ms())

    def note_heartbeat(self, broker_id: int, metadata_offset: int, usage: BrokerUsage | None,
                       replicas_opening: int = 0, incarnation_id: str = "") -> bool:
        """Keep what a heartbeat reports for the views (/v1/brokers, snapshots). Not leader
        state: no decision reads it, and it outlives this node's leadership. False when the
        usage report was incremental on a base not kept here (from another process of the
        broker, or a report this node did not take): the broker must send a complete one."""
        self.broker_offsets[broker_id] = metadata_offset
        self.broker_opening[broker_id] = replicas_opening
        if usage is None:
            return True
        same_process = self._usage_incarnation.get(broker_id) == incarnation_id
        merged = merge_report(self.usage.get(broker_id) if same_process else None, usage)
        if merged is None:
            return False
        self.usage[broker_id] = merged
        self._usage_incarnation[broker_id] = incarnation_id
        return True

    # ------------------------------------------------------------ committed mirror

    def _on_applied(self, outcome: Outcome) -> None:
        if outcome.kind != "batch":
            return
        for offset, record in outcome.applied:
            # The Raft thread already applied this record to its own image; ours must agree.
            self.committed.apply(record, offset)
            self.window.append((offset, dump_record(record)))
        if outcome.applied:
            self.stats["records_committed"] += len(outcome.applied)
            assert self.committed.offset == outcome.offset, (self.committed.offset, outcome.offset)
            self._wake_metadata_waiters()

    def _on_reset(self, state: dict) -> None:
        self.committed = MetadataImage.from_dict(state)
        self.window.clear()
        self._untrust("state was replaced by a snapshot")
        self._wake_metadata_waiters()

    # ------------------------------------------------------------ metadata for brokers

    def _wake_metadata_waiters(self) -> None:
        """End every metadata long-poll's wait (each looks again at what is committed); later
        ones wait on a fresh event."""
        self._advanced.set()
        self._advanced = asyncio.Event()

    async def fetch_metadata(self, *, after_offset: int, wait_ms: int, records_max: int = 5000) -> FetchResult:
        """Committed records with offset > `after_offset`; waits up to `wait_ms` for one."""
        deadline = time.monotonic() + wait_ms / 1000
        while self.committed.offset == after_offset and not self._resigning:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return FetchResult(offset=self.committed.offset, records=[])
            try:
                await asyncio.wait_for(self._advanced.wait(), remaining)
            except asyncio.TimeoutError:
                return FetchResult(offset=self.committed.offset, records=[])
        first_kept = self.window[0][0] if self.window else self.committed.offset + 1
        if after_offset > self.committed.offset or after_offset + 1 < first_kept:
            # Too far behind the window (or ahead of this history): start over from the image.
            return FetchResult(offset=self.committed.offset, image=self.committed.to_dict())
        start = after_offset + 1 - first_kept
        records = list(itertools.islice(self.window, start, start + records_max))
        return FetchResult(offset=self.committed.offset, records=records)

    # ------------------------------------------------------------ cluster view

    def cluster_view(self) -> dict:
        status = self.raft.status() if self.raft is not None else None
        leader = self.leader_node()
        return {
            "node_id": self.node_id,
            "leader_id": leader.node_id if leader else None,
            "leader_api_url": leader.api_url if leader else None,
            "term": status.term if status else None,
            "metadata_offset": self.committed.offset,
            "controllers": [
                {"node_id": n.node_id, "raft_address": n.raft_address, "api_url": n.api_url,
                 "priority": n.priority, "is_leader": bool(leader and leader.node_id == n.node_id),
                 "connected": (n.node_id == self.node_id
                               or (status is not None and n.raft_address in status.connected_peers))}
                for n in sorted(self.nodes.values(), key=lambda n: n.node_id)
            ],
        }


def _silent_ms(core: ControllerCore, broker_id: int, now_ms: int) -> int | None:
    session = core.state.sessions.get(broker_id)
    return None if session is None else now_ms - session.last_heartbeat_ms


def _note_periodic_outcome(node_id: int, silent_ms: dict[int, int | None], fut: asyncio.Future[Committed]) -> None:
    if fut.cancelled():
        return
    if fut.exception() is not None:
        log.info("periodic decisions not committed: %s", fut.exception(),
                 extra={"event": "controller.periodic_not_committed"})
        return
    # One line per committed fence, from the leader that decided it (never replayed): an
    # operator's, and the fault harness's, record of every fence (tests/chaos/fences.py).
    for record in fut.result().records:
        if isinstance(record, FenceBroker):
            log.warning("broker fenced: broker_id=%d reason=%r at_ms=%d silent_ms=%s controller=%d",
                        record.broker_id, record.reason, record.at_ms, silent_ms.get(record.broker_id),
                        node_id, extra={"event": "controller.broker_fenced", "broker_id": record.broker_id})


def _fail_waiters(batch: _Batch, error: BaseException) -> None:
    for fut, _, _, _ in batch.waiters:
        if not fut.done():
            fut.set_exception(error)
    batch.waiters.clear()


def _resolve_waiters(batch: _Batch, offsets: tuple[int, ...]) -> None:
    for fut, first, count, rejected in batch.waiters:
        if not fut.done():
            fut.set_result(Committed(offsets=offsets[first:first + count],
                                     records=tuple(batch.records[first:first + count]),
                                     rejected=rejected))
    batch.waiters.clear()
