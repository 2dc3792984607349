"""A seeded, deterministic simulation of one partition: 3-5 replica cores on MemoryLogs,
the controller's real decisions, a producer, a lossy network and a clock.

`run_simulation(seed=..., policy=..., durability=...)` replays exactly for a seed.
A safety phase with faults (faults.py) is followed by a liveness phase without
them; checkers.py runs after every step. See README.md for the trace format.
"""
from __future__ import annotations

import bisect
import dataclasses
import heapq
import random

from common.batch import HEADER_SIZE, build_batch, iter_batches
from common.errors import ErrorCode
from common.metadata.config import TopicConfig
from common.wire import messages as wire
from controller.decisions import Link
from dataplane.broker import codec
from dataplane.broker.contact import PeerContact, expected_links
from dataplane.log.memory import MemoryLog
from dataplane.replica.actions import (
    Append, NoteAction, PersistAction, ProposeIsr, RefreshMetadata, ReleaseProduce, ReportElection, Send, Truncate,
    TruncateFully,
)
from dataplane.replica.core import Replica, Role
from dataplane.replica.perform import perform
from dataplane.replica.events import (
    CONSUMER_REPLICA_ID, AppendEntries, AppendEntriesReply, FetchRequest, FetchResponse, FlushDone, IsrChangeAccepted, IsrChangeRefused, NewMetadata, ProduceRequest,
    Tick, WriteDone,
)

from dataplane.client.attempts import Attempts
from dataplane.client.producer_core import Acknowledge, Outcome

from sim.checkers import Checker, InvariantViolation
from sim.controller import SimController
from sim.faults import CONTROLLER_ID, GRAY_RATES, Cut, FaultInjector, FaultRates
from sim.producer import SimBatch, SimProducer

CLIENT_ID = 100
TICK_MS = 25
CONTROLLER_TICK_MS = 50
FAULT_TICK_MS = 10
HEARTBEAT_MS = 60
METADATA_RESEND_MS = 300
SESSION_TIMEOUT_MS = 250
REPLICA_LAG_TIME_MAX_MS = 250
PRODUCE_TIMEOUT_MS = 1500
FLUSH_MS_MAX = 25
QUIET_MS = 400  # no produce at the end of the liveness phase, so replicas converge
SETTLE_MS = 1000  # after the faults stop, acks=all must succeed from here on
PEER_UNREACHABLE_MS = 150          # gray runs: a broker reports a replication link silent this long
UNREACHABLE_DECISION_INTERVAL_MS = 500
# Gray runs: a leader cut from its followers this long while the others could commit without it
# must have lost its leadership by the cut's end: the link bound, a heartbeat, a controller
# tick, one damping interval (a decision just before), and the quorum election's round trip.
CUT_MOVE_MS = 1000


@dataclasses.dataclass(frozen=True)
class Heartbeat:
    broker_id: int
    incarnation_id: str
    unreachable: tuple[Link, ...] = ()


@dataclasses.dataclass(frozen=True)
class MetadataRequest:
    broker_id: int


# Replication travels as the brokers' wire messages, translated by the broker's own codec
# (dataplane/broker/codec.py). A fetch carries the request the fetcher remembers for its
# answer (`asked`), as FetchSession's batch does: the wire answer does not repeat it.
@dataclasses.dataclass(frozen=True)
class WireFetch:
    replica_id: int
    asked: FetchRequest
    partition: wire.FetchPartition


@dataclasses.dataclass(frozen=True)
class WireFetchAnswer:
    asked: FetchRequest
    partition: wire.FetchPartitionResponse


TP = ("sim", 0)


def wire_fetch(replica_id: int, request: FetchRequest) -> WireFetch:
    return WireFetch(replica_id=replica_id, asked=request, partition=codec.fetch_to_wire(TP[1], request))


class SimNode:
    """One broker holding one replica: its log, its core, and a shadow of the log for checkers."""

    def __init__(self, node_id: int) -> None:
        self.node_id = node_id
        self.contact = PeerContact()
        self.silent: tuple[Link, ...] = ()   # the links its heartbeats report
        self.log = MemoryLog()
        self.incarnation = 0
        self.replica: Replica | None = None
        self.shadow: list[tuple[int, int, int, bytes]] = []  # (base, next, epoch, ident)
        self.bases: list[int] = []
        self.by_base: dict[int, tuple[int, bytes]] = {}
        self.copies: dict[bytes, int] = {}   # ident -> how many times this log holds it
        self.doubled: set[bytes] = set()     # idents held more than once

    def shadow_range(self, lo: int, hi: int):
        i = bisect.bisect_left(self.bases, lo)
        while i < len(self.shadow) and self.shadow[i][1] <= hi:
            yield self.shadow[i]
            i += 1

    def shadow_append(self, base: int, nxt: int, epoch: int, ident: bytes) -> None:
        assert not self.shadow or self.shadow[-1][1] == base, (self.shadow[-1], base)
        self.shadow.append((base, nxt, epoch, ident))
        self.bases.append(base)
        self.by_base[base] = (nxt, ident)
        copies = self.copies[ident] = self.copies.get(ident, 0) + 1
        if copies > 1:
            self.doubled.add(ident)

    def shadow_truncate(self, offset: int) -> None:
        while self.shadow and self.shadow[-1][1] > offset:
            base, _, _, ident = self.shadow.pop()
            self.bases.pop()
            del self.by_base[base]
            self.copies[ident] -= 1
            if self.copies[ident] <= 1:
                self.doubled.discard(ident)


class NodeEffects:
    """One node's effects for `perform` (dataplane/replica/perform.py): the simulated disk,
    network and clients instead of the broker's coalescer, sockets and futures."""

    def __init__(self, sim: "Simulation", node: SimNode, asked: FetchRequest | None) -> None:
        self.sim, self.node, self.asked = sim, node, asked

    def persisted(self, action: PersistAction, previous_end: int) -> None:
        self.sim._persisted(self.node, action)

    def flush(self, up_to: int) -> None:
        sim, node = self.sim, self.node
        sim._at(sim.now_ms + sim.disk_rng.randint(1, FLUSH_MS_MAX), "flush_done", (node.node_id, node.incarnation))

    def send_fetch(self, leader_id: int, request: FetchRequest) -> None:
        self.sim._send(self.node.node_id, leader_id, wire_fetch(self.node.node_id, request))

    def send_append_entries(self, follower_id: int, message: AppendEntries) -> None:
        self.sim._send(self.node.node_id, follower_id, codec.append_entries_to_wire(TP, follower_id, message))

    def propose_isr(self, proposal: ProposeIsr) -> None:
        self.sim._trace_node("ProposeIsr", self.node, new_isr=list(proposal.new_isr))
        self.sim._send(self.node.node_id, CONTROLLER_ID, proposal)

    def report_election(self, report: ReportElection) -> None:
        self.sim._trace_node("ReportElection", self.node, fenced_epoch=report.fenced_epoch,
                             last_epoch=report.last_epoch, end_offset=report.end_offset)
        self.sim._send(self.node.node_id, CONTROLLER_ID, report)

    def answer(self, answer: Send) -> None:
        to = CLIENT_ID if answer.to_broker == CONSUMER_REPLICA_ID else answer.to_broker
        message = answer.message
        if isinstance(message, AppendEntriesReply):
            self.sim._send(self.node.node_id, to, codec.append_reply_to_wire(TP, message))
            return
        assert isinstance(message, FetchResponse) and self.asked is not None, message
        replica = self.node.replica
        assert replica is not None
        # The core's view of the leader stands in for the broker's metadata on an error.
        leader = wire.LeaderIdAndEpoch(leader_id=self.node.node_id, leader_epoch=replica.leader_epoch)
        self.sim._send(self.node.node_id, to, WireFetchAnswer(asked=self.asked, partition=codec.fetch_answer_to_wire(
            TP[1], message, log_start_offset=self.node.log.log_start_offset, leader_if_error=leader)))

    def release(self, release: ReleaseProduce) -> None:
        self.sim._on_release(self.node, release)

    def note(self, note: NoteAction) -> None:
        if isinstance(note, RefreshMetadata):
            self.sim._send(self.node.node_id, CONTROLLER_ID, MetadataRequest(self.node.node_id))

    def written(self, done: WriteDone) -> None:
        self.sim.step_node(self.node, done)


@dataclasses.dataclass
class SimResult:
    seed: int
    policy: str
    durability: str
    steps: int
    acked: int
    violation: str | None
    liveness_error: str | None
    trace: list | None


class Simulation:
    def __init__(self, *, seed: int, policy: str, durability: str, replicas: int | None = None,
                 mode: str | None = None,
                 safety_ms: int = 2000, liveness_ms: int = 2000, steps_max: int = 20_000,
                 rates: FaultRates | None = None, trace: bool = False, gray: bool = False,
                 reroute: bool = False) -> None:
        rates = rates or (GRAY_RATES if gray else FaultRates())
        self.seed, self.policy, self.durability = seed, policy, durability
        self.gray = gray
        # Separate streams, so adding a kind of event re-rolls as little as possible.
        self.rng = random.Random(f"{seed}-{policy}-{durability}")  # setup and workload
        self.disk_rng = random.Random(f"{seed}-{policy}-{durability}-disk")
        fault_rng = random.Random(f"{seed}-{policy}-{durability}-faults")
        network_rng = random.Random(f"{seed}-{policy}-{durability}-network")
        # Pull or push replication: half the seeds each unless the caller says.
        self.mode = mode or random.Random(f"{seed}-{policy}-{durability}-mode").choice(("pull", "push"))
        self.tell_fenced = random.Random(f"{seed}-{policy}-{durability}-fenced").random() < 0.5
        # A tight backpressure bound on some seeds: produce requests then wait in the core.
        self.unreplicated_bytes_max = random.Random(f"{seed}-{policy}-{durability}-bp").choice(
            (400, 1000, 8 << 20))
        n = replicas if replicas is not None else self.rng.choice((3, 3, 5))
        self.node_ids = tuple(range(1, n + 1))
        q = self.rng.randint(2, n) if policy == "quorum" else None
        topic = TopicConfig(replication_factor=n, commit_policy=policy, durability=durability,
                            quorum_required_acks=q, min_insync_replicas=2, flush_debounce_ms=15,
                            replica_lag_time_max_ms=REPLICA_LAG_TIME_MAX_MS, replication_mode=self.mode)
        # Small fetches make catch-up take many round trips: more interleavings.
        self.fetch_max_bytes = self.rng.choice((100, 250, 1000, 1 << 20))
        self.now_ms = 0
        self.controller = SimController(replicas=self.node_ids, topic_config=topic, now_ms=0,
                                        session_timeout_ms=SESSION_TIMEOUT_MS,
                                        unreachable_decision_interval_ms=UNREACHABLE_DECISION_INTERVAL_MS)
        # Gray runs: directed cuts between brokers, and heartbeats carrying link reports.
        gray_rng = random.Random(f"{seed}-{policy}-{durability}-gray") if gray else None
        self.faults = FaultInjector(fault_rng, network_rng=network_rng, nodes=self.node_ids, durability=durability,
                                    rates=rates, gray_rng=gray_rng)
        self.cut_epoch: tuple[int | None, int] = (None, -1)   # the partition's (leader, epoch) as a cut began
        self.cut_problem: str | None = None
        self.checker = Checker(policy=policy, durability=durability,
                               quorum_required_acks=self.controller.config.quorum_required_acks)
        self.nodes = {i: SimNode(i) for i in self.node_ids}
        self.safety_ms, self.liveness_ms, self.steps_max = safety_ms, liveness_ms, steps_max
        self.queue: list = []
        self.seq = 0
        self.steps = 0
        self.dirty = False
        self.trace: list | None = [] if trace else None
        self.requests: dict[int, dict] = {}
        self.next_request_id = 1
        self.sent_changes = -1
        self.last_leader: int | None = None
        self.consumed_batches = 0
        self.backlog_with_room: tuple[int, int, int] | None = None  # (ms, replica, request id)
        # One or two idempotent producers (acks=all) on the SDK's producer core, with client
        # request timeouts that are often shorter than the leader's produce timeout.
        self.idem_rng = random.Random(f"{seed}-{policy}-{durability}-idem")
        # Controller leadership moves: an accepted ISR change answered as an unknown outcome,
        # and the proposer's metadata lagging behind the controller that committed it.
        self.isr_answer_rng = random.Random(f"{seed}-{policy}-{durability}-isr-answer")
        self.metadata_lag_until: dict[int, int] = {}
        self.producers: dict[str, SimProducer] = {}
        for k in range(self.idem_rng.choice((1, 1, 2))):
            name = f"{seed}:p{k}"
            self.producers[name] = SimProducer(
                name=name, rng=random.Random(f"{seed}-{policy}-{durability}-idem-{k}"),
                request_timeout_ms=(request_timeout_ms := self.idem_rng.choice((60, 150, 400, 1000))),
                delivery_timeout_ms=request_timeout_ms + self.idem_rng.choice((100, 500, 2000)),
                in_flight_max=self.idem_rng.choice((1, 3, 5)), retry_backoff_ms=self.idem_rng.randint(5, 50),
                # The SDK gives up after 1 s of a 30 s timeout; here the same rule at this
                # run's scale, so attempts are given up well before they time out.
                attempts=Attempts(probe_after_ms=request_timeout_ms // 4, probe_interval_ms=request_timeout_ms // 8)
                if reroute else None)
        self._trace("Config", replicas=list(self.node_ids), policy=policy, durability=durability,
                    mode=self.mode, quorum_required_acks=q, min_insync_replicas=2)
        for i in self.node_ids:
            self._start(self.nodes[i], unclean=False)
            self._at(self.rng.randint(0, TICK_MS - 1), "tick", i)
            self._at(self.rng.randint(0, HEARTBEAT_MS - 1), "heartbeat", i)
        self._at(0, "controller", None)
        self._at(0, "faults", None)
        self._at(30, "consume", None)
        self._at(5, "produce", None)
        self._at(METADATA_RESEND_MS, "metadata", None)

    # ------------------------------------------------------------ plumbing

    def _at(self, t: int, kind: str, arg) -> None:
        self.seq += 1
        heapq.heappush(self.queue, (t, self.seq, kind, arg))

    def _trace(self, name: str, **fields) -> None:
        if self.trace is not None:
            self.trace.append({"step": self.steps, "time_ms": self.now_ms, "action": name, **fields})

    def _trace_node(self, name: str, node: SimNode, **fields) -> None:
        if self.trace is None or node.replica is None:
            return
        r = node.replica
        self._trace(name, replica=node.node_id, role=r.role.value, leader_epoch=r.leader_epoch,
                    log_end_offset=r.log_end_offset, flushed_offset=r.flushed_offset,
                    high_watermark=r.high_watermark, **fields)

    def _send(self, src: int, dst: int, *msgs) -> None:
        """`msgs` travel together: delivered in order, at the same delays (duplicates too)."""
        delays = self.faults.delivery_delays(src, dst)
        lag = self.metadata_lag_until.get(dst, 0) - self.now_ms
        if src == CONTROLLER_ID and lag > 0 and any(isinstance(m, NewMetadata) for m in msgs):
            delays = [max(d, lag) for d in delays]
        for delay in delays:
            for msg in msgs:
                self._at(self.now_ms + delay, "deliver", (src, dst, msg))

    def _start(self, node: SimNode, *, unclean: bool) -> None:
        node.contact = PeerContact()   # a new process hears afresh
        node.silent = ()
        node.replica = Replica(replica_id=node.node_id, log=node.log, now_ms=self.now_ms, fetch_backoff_ms=40,
                               fetch_max_bytes=self.fetch_max_bytes,
                               fetch_timeout_ms=200, flush_debounce_ms=15, isr_proposal_retry_ms=200,
                               election_report_retry_ms=200, unreplicated_bytes_max=self.unreplicated_bytes_max, push_capable=True,
                               unclean_start=unclean, check_invariants=True)
        self._send(node.node_id, CONTROLLER_ID, Heartbeat(node.node_id, f"{node.node_id}-{node.incarnation}"))
        self._send(CONTROLLER_ID, node.node_id, self._metadata())

    def _metadata(self) -> NewMetadata:
        # Half the seeds tell the cores which brokers are fenced (as the broker does);
        # the others leave them to learn it from refused ISR proposals.
        fenced = self.controller.fenced_brokers() if self.tell_fenced else frozenset()
        return NewMetadata(partition=self.controller.partition_state(), config=self.controller.config,
                           fenced_replicas=fenced)

    # ------------------------------------------------------------ stepping

    def step_node(self, node: SimNode, event, asked: FetchRequest | None = None) -> None:
        """Step `event` into the node's core and perform the Ready; `asked`: the fetch
        request being answered, when `event` came as one (its answer echoes it)."""
        if node.replica is None:
            return
        self.dirty = True
        hw_before = node.replica.high_watermark
        flushed_before = node.replica.flushed_offset
        due = node.replica.next_tick_ms() if isinstance(event, Tick) else None
        ready = node.replica.step(event)
        if isinstance(event, Tick) and (due is None or event.now_ms < due) and (
                ready.persist or ready.send or ready.answers or ready.release or ready.notes):
            # Brokers skip such ticks (ReplicaManager's timer heap): one that acts means a
            # timed rule next_tick_ms() does not know.
            raise AssertionError(f"node {node.node_id}: a Tick at {event.now_ms} before next_tick_ms() "
                                 f"= {due} acted: {ready}")
        # Flush before the HW it may have moved, so a trace checker sees the cause first.
        if self.trace is not None and node.replica.flushed_offset != flushed_before:
            self._trace_node("Flush", node, previous=flushed_before)
        if self.trace is not None and node.replica.high_watermark != hw_before:
            self._trace_node("AdvanceHighWatermark", node, previous=hw_before)
        # The broker's own executor: persist on the log, send, answer, release, WriteDone.
        perform(ready, node.log, NodeEffects(self, node, asked))
        replica = node.replica
        if replica is not None and replica.role is Role.LEADER and replica._backlog \
                and replica.unreplicated_bytes() < replica.unreplicated_bytes_max and self.backlog_with_room is None:
            # Evidence against excusing a request late behind backpressure (_check_liveness):
            # the backlog kept a request although the bound had room for it.
            self.backlog_with_room = (self.now_ms, node.node_id, next(iter(replica._backlog)))

    def _persisted(self, node: SimNode, action: PersistAction) -> None:
        if isinstance(action, Append):
            self._shadow_append(node, action)
        elif isinstance(action, Truncate):
            node.shadow_truncate(action.offset)
            self.checker.on_truncate(node)
            self._trace_node("Truncate", node, offset=action.offset)
        elif isinstance(action, TruncateFully):
            # The sim applies no retention, so a leader's log always starts at 0 and this
            # never comes; performed anyway as the broker does, untraced.
            node.shadow_truncate(0)
            self.checker.on_truncate(node)

    def _shadow_append(self, node: SimNode, action: Append) -> None:
        base = action.base_offset
        batches = []  # [base, next, epoch] per batch, for the trace
        for pos, h in iter_batches(action.records, validate=False):
            ident = bytes(action.records[pos + HEADER_SIZE:pos + h.size_bytes])
            if action.as_leader:
                node.shadow_append(base, base + h.record_count, action.leader_epoch, ident)
                batches.append([base, base + h.record_count, action.leader_epoch])
                base += h.record_count
            else:
                node.shadow_append(h.base_offset, h.next_offset, h.leader_epoch, ident)
                batches.append([h.base_offset, h.next_offset, h.leader_epoch])
        self._trace_node("Append", node, as_leader=action.as_leader, base_offset=action.base_offset,
                         last_offset=action.last_offset, epoch=action.leader_epoch, batches=batches)

    def _on_release(self, node: SimNode, release: ReleaseProduce) -> None:
        req = self.requests.get(release.request_id)
        # A duplicated request may be refused while the original still waits: an error
        # never hides a success for the same id.
        if req is None or req.get("base_offset") is not None:
            return
        if "producer" in req:
            self._on_producer_release(node, req, release)
            return
        if release.error is ErrorCode.NONE:
            req["base_offset"] = release.base_offset
            if req["acks"] == -1:
                epoch = node.replica.leader_epoch
                self.checker.record_ack(base_offset=release.base_offset, next_offset=release.base_offset + 1,
                                        ident=req["ident"], epoch=epoch)
                self._trace_node("AckAll", node, base_offset=release.base_offset)
        else:
            req["error"] = release.error
        req["released_ms"] = self.now_ms

    def _receive(self, src: int, node: SimNode, msg) -> None:
        """A message from the network: wire messages through the broker's codec, the rest as is."""
        if isinstance(msg, WireFetch):
            request = codec.fetch_from_wire(msg.replica_id, TP, msg.partition,
                                            max_bytes=msg.partition.partition_max_bytes)
            self.step_node(node, request, asked=msg.asked)
        elif isinstance(msg, WireFetchAnswer):
            self.step_node(node, codec.fetch_answer_from_wire(src, msg.asked, msg.partition, TP))
        elif isinstance(msg, wire.AppendEntriesRequest):
            self.step_node(node, codec.append_entries_from_wire(msg))
        elif isinstance(msg, wire.AppendEntriesResponse):
            self.step_node(node, codec.append_reply_from_wire(msg))
        else:
            self.step_node(node, msg)
            req = self.requests.get(msg.request_id) if isinstance(msg, ProduceRequest) else None
            if req is not None and node.replica is not None and msg.request_id in node.replica._backlog:
                req["backlogged_ms"] = self.now_ms   # waited behind the backpressure bound on arrival

    def _consumed(self, src: int, resp: FetchResponse) -> None:
        if resp.error is not ErrorCode.NONE or not resp.records:
            return
        batches = [(h.base_offset, h.next_offset, bytes(resp.records[pos + HEADER_SIZE:pos + h.size_bytes]))
                   for pos, h in iter_batches(resp.records, validate=False)]
        self.checker.check_consumed(src, batches)
        self.consumed_batches += len(batches)

    def _crash(self, node_id: int) -> None:
        node = self.nodes[node_id]
        self.dirty = True
        self._trace_node("Crash", node)
        node.log.crash()
        node.shadow_truncate(node.log.log_end_offset)
        node.replica = None
        node.incarnation += 1
        self.checker.on_truncate(node)

    def _restart(self, node_id: int) -> None:
        node = self.nodes[node_id]
        if node.replica is None:
            self._start(node, unclean=True)
            self._trace_node("Restart", node)

    # --------------------------------------------------------------- events

    def _handle(self, kind: str, arg) -> None:
        now = self.now_ms
        if kind == "deliver":
            src, dst, msg = arg
            if self.faults.cut(src, dst):
                return
            if src in self.nodes and dst in self.nodes:
                # Brokers speak to each other only to replicate: every word counts as contact.
                self.nodes[dst].contact.heard(src, now)
            if dst == CONTROLLER_ID:
                self._controller_message(src, msg)
            elif dst in self.nodes:
                self._receive(src, self.nodes[dst], msg)
            elif dst == CLIENT_ID and isinstance(msg, WireFetchAnswer):
                self._consumed(src, codec.fetch_answer_from_wire(src, msg.asked, msg.partition, TP))
        elif kind == "tick":
            node = self.nodes[arg]
            self.step_node(node, Tick(now_ms=now))
            if self.gray and node.replica is not None:
                node.silent = self._silent_links(node)   # Broker._watch_links: kept for the next heartbeat
            self._at(now + TICK_MS, "tick", arg)
        elif kind == "heartbeat":
            node = self.nodes[arg]
            if node.replica is not None:
                self._send(arg, CONTROLLER_ID, Heartbeat(arg, f"{arg}-{node.incarnation}", node.silent))
            self._at(now + HEARTBEAT_MS, "heartbeat", arg)
        elif kind == "flush_done":
            node_id, incarnation = arg
            node = self.nodes[node_id]
            if node.replica is not None and node.incarnation == incarnation:
                self.step_node(node, FlushDone(flushed_offset=node.log.flush()))
        elif kind == "controller":
            self.controller.tick(now)
            self._broadcast_if_changed()
            self._at(now + CONTROLLER_TICK_MS, "controller", None)
        elif kind == "faults":
            self._faults(self.faults.plan(now, FAULT_TICK_MS, degraded=self._degraded(),
                                          leader=self.controller.leader(), electing=self._electing()))
            self._at(now + FAULT_TICK_MS, "faults", None)
        elif kind == "metadata":
            for i in self.node_ids:
                self._send(CONTROLLER_ID, i, self._metadata())
            self._at(now + METADATA_RESEND_MS, "metadata", None)
        elif kind == "consume":
            leader = self.controller.leader()
            if leader is not None:
                offset = self.rng.randint(0, max(self.checker.committed_end(), 0))
                self._send(CLIENT_ID, leader, wire_fetch(CONSUMER_REPLICA_ID,
                                                         FetchRequest(replica_id=CONSUMER_REPLICA_ID, fetch_offset=offset)))
            self._at(now + self.rng.randint(20, 80), "consume", None)
        elif kind == "produce":
            if now < self.safety_ms + self.liveness_ms - QUIET_MS:
                self._produce()
            self._produce_idempotent()   # retries go on through the quiet end
            self._at(now + self.rng.randint(5, 40), "produce", None)
        elif kind == "request_timeout":
            name, rid = arg
            self._producer_outcomes(self.producers[name].timed_out(rid, now), None)
        else:
            raise AssertionError(f"unknown event kind {kind}")

    def _silent_links(self, node: SimNode) -> tuple[Link, ...]:
        """What the broker's heartbeat reports (Broker._watch_links, every tick here): the
        links it expects, from the metadata, that were silent past their bound."""
        expected = expected_links(self.controller.image, node.node_id, PEER_UNREACHABLE_MS)
        return tuple(Link(e.tp.topic, e.tp.partition, e.leader_epoch, e.peer)
                     for e in node.contact.unreachable(expected, self.now_ms))

    def _controller_message(self, src: int, msg) -> None:
        if isinstance(msg, Heartbeat):
            self.controller.heartbeat(msg.broker_id, msg.incarnation_id, self.now_ms, msg.unreachable)
        elif isinstance(msg, ProposeIsr):
            refusal = self.controller.propose_isr(msg, self.now_ms)
            if (refusal is None and self.faults.active
                    and self.isr_answer_rng.random() < self.faults.rates.isr_answer_unknown):
                # The real controller's CommitFailedError: its leadership moved before it could
                # answer, and the next leader committed the change. The proposer hears "timed
                # out" and learns the new ISR only when its metadata catches up.
                refusal = (ErrorCode.REQUEST_TIMED_OUT,
                           "controller lost its leader view; the request may or may not take effect")
                self.metadata_lag_until[src] = self.now_ms + self.isr_answer_rng.randint(
                    50, self.faults.rates.metadata_lag_ms_max)
            if refusal is not None:
                code, reason = refusal
                self._trace("IsrRefused", replica=src, new_isr=list(msg.new_isr), error=code.name)
                self._send(CONTROLLER_ID, src, IsrChangeRefused(
                    leader_epoch=msg.leader_epoch, partition_epoch=msg.partition_epoch,
                    new_isr=msg.new_isr, error=code, reason=reason))
                self._send(CONTROLLER_ID, src, self._metadata())
            else:
                # The answer (the broker steps it as IsrChangeAccepted), then the metadata: one
                # draw of delays for both, so the seeds' random draws stay as they were.
                self._send(CONTROLLER_ID, src, IsrChangeAccepted(partition=self.controller.partition_state()),
                           self._metadata())
        elif isinstance(msg, ReportElection):
            self.controller.report(msg, self.now_ms)
        elif isinstance(msg, MetadataRequest):
            self._send(CONTROLLER_ID, src, self._metadata())
        self._broadcast_if_changed()

    def _broadcast_if_changed(self) -> None:
        if self.controller.changes != self.sent_changes:
            self.sent_changes = self.controller.changes
            st = self.controller.partition_state()
            if st.leader is not None and st.leader != self.last_leader:
                self.faults.on_new_leader(st.leader, self.now_ms)
            self.last_leader = st.leader
            self._trace("Metadata", leader=st.leader, leader_epoch=st.leader_epoch,
                        partition_epoch=st.partition_epoch, isr=list(st.isr),
                        fenced_for_election=st.fenced_for_election)
            for i in self.node_ids:
                self._send(CONTROLLER_ID, i, self._metadata())

    def _electing(self) -> list[int]:
        return [i for i, n in self.nodes.items() if n.replica is not None and n.replica.role is Role.ELECTION]

    def _degraded(self) -> set[int]:
        """Replicas a durability=write run counts as faulty (see faults.py)."""
        degraded = {i for i, n in self.nodes.items() if n.replica is None or n.replica.unclean_start}
        if self.policy == "isr":
            degraded |= set(self.node_ids) - set(self.controller.partition.isr)
        return degraded

    def _faults(self, ops: list[tuple]) -> None:
        for op in ops:
            if op[0] == "crash":
                self._crash(op[1])
            elif op[0] == "restart":
                self._restart(op[1])
            elif op[0] == "partition":
                self._trace("Partition", groups={str(k): v for k, v in op[1].items()})
            elif op[0] == "heal":
                self._trace("Heal")
            elif op[0] == "cut":
                p = self.controller.partition
                self.cut_epoch = (p.leader, p.leader_epoch)
                self._trace("Cut", kind=op[1].kind, edges=sorted(op[1].edges))
            elif op[0] == "uncut":
                self._trace("Uncut", kind=op[1].kind)
                self._check_cut(op[1], op[2])

    def _check_cut(self, cut: Cut, ended_ms: int) -> None:
        """A leader its followers' links could not commit with, cut long enough, has lost its
        leadership if the others could commit without it (issue 19's target, in simulated time)."""
        leader, epoch = self.cut_epoch
        if self.cut_problem is not None or cut.kind == "follower" or leader != cut.leader \
                or ended_ms - cut.start_ms < CUT_MOVE_MS:
            return
        p = self.controller.partition
        n = len(p.replicas)
        q = self.controller.config.quorum_required_acks or n
        others_commit = n - 1 >= max(q, n - q + 1) if self.policy == "quorum" else n - 1 >= 2
        if any(cut.start_ms <= at < cut.start_ms + REPLICA_LAG_TIME_MAX_MS for at in self.controller.lonely_shrinks):
            # isr: the followers were lagging already as the cut began (a caught-up follower's
            # lag clock cannot run out this soon), and Kafka's shrink left the leader alone in
            # the ISR before their link reports could come in: no in-sync replica to move to,
            # as in Kafka. Judged by time, not by the reachability rule under test.
            return
        if others_commit and p.leader == leader and p.leader_epoch == epoch:
            self.cut_problem = (f"leader {leader} cut from its followers ({cut.kind}, {self.mode}) from "
                                f"{cut.start_ms} to {ended_ms} ms kept its leadership at epoch {epoch}")

    def _produce_idempotent(self) -> None:
        """Each producer core: fail what passed its delivery timeout, maybe queue a new batch,
        and send what the core allows (a retry first, as the SDK's drain does)."""
        leader = self.controller.leader()
        producing = self.now_ms < self.safety_ms + self.liveness_ms - QUIET_MS
        for name, producer in self.producers.items():
            if producer.core.producer_id_wanted:
                producer.core.set_producer_id(producer_id=self.controller.allocate_producer_id(), producer_epoch=0)
            self._producer_outcomes(producer.expire(self.now_ms), None)
            if producing and producer.rng.random() < 0.5:
                batch = producer.make_batch(self.now_ms)
                if batch is not None:
                    self.checker.idem_seq[batch.ident] = (name, batch.index)
            self._producer_send(name, producer)

    def _producer_send(self, name: str, producer: SimProducer) -> None:
        leader = self.controller.leader()
        if leader is not None:
            epoch = self.controller.partition.leader_epoch
            self._producer_outcomes(producer.reroute(self.now_ms, leader=leader, leader_epoch=epoch), None)
            for send in producer.sends(self.now_ms, self._new_request_id, leader=leader, leader_epoch=epoch):
                self.requests[send.request_id] = {
                    "acks": -1, "ident": send.batch.ident, "sent_ms": self.now_ms, "to": leader, "error": None,
                    "base_offset": None, "producer": name}
                self._at(self.now_ms + producer.request_timeout_ms, "request_timeout", (name, send.request_id))
                self._send(CLIENT_ID, leader, ProduceRequest(request_id=send.request_id, records=send.records,
                                                             acks=-1, timeout_ms=PRODUCE_TIMEOUT_MS))

    def _new_request_id(self) -> int:
        rid = self.next_request_id
        self.next_request_id += 1
        return rid

    def _on_producer_release(self, node: SimNode, req: dict, release: ReleaseProduce) -> None:
        if release.error is ErrorCode.INVALID_REQUEST:
            return   # a duplicated copy of the request refused while the original waits (no TCP here)
        if release.error is ErrorCode.NONE:
            req["base_offset"] = release.base_offset
        req["released_ms"] = self.now_ms
        producer = self.producers[req["producer"]]
        self._producer_outcomes(producer.answered(release.request_id, release.error, release.base_offset,
                                                  self.now_ms), node)
        self._producer_send(req["producer"], producer)   # as the SDK's sender: drain on an answer

    def _producer_outcomes(self, outcomes: list[Outcome[SimBatch]], node: SimNode | None) -> None:
        for outcome in outcomes:
            if isinstance(outcome, Acknowledge):
                assert node is not None and node.replica is not None, "only a leader's answer acknowledges"
                batch = outcome.batch
                base = outcome.base_offset
                self.checker.record_ack(base_offset=base, next_offset=base + len(batch.values), ident=batch.ident,
                                        epoch=node.replica.leader_epoch)
                self.checker.record_producer_ack(producer=batch.producer, index=batch.index, base_offset=base,
                                                 next_offset=base + len(batch.values), ident=batch.ident)
                self._trace_node("AckAll", node, base_offset=base)

    def _produce(self, acks: int | None = None) -> int | None:
        leader = self.controller.leader()
        if leader is None:
            return None
        if acks is None:
            acks = self.rng.choice((-1, -1, -1, 1, 0))
        rid = self.next_request_id
        self.next_request_id += 1
        value = f"{self.seed}:{rid}".encode()
        records = build_batch([value], timestamp_ms=self.now_ms)
        self.requests[rid] = {"acks": acks, "ident": records[HEADER_SIZE:], "sent_ms": self.now_ms,
                              "to": leader, "error": None, "base_offset": None}
        self._send(CLIENT_ID, leader, ProduceRequest(request_id=rid, records=records, acks=acks,
                                                     timeout_ms=PRODUCE_TIMEOUT_MS))
        return rid

    # ------------------------------------------------------------------ run

    def run(self) -> SimResult:
        violation = liveness_error = None
        try:
            self._run_until(self.safety_ms)
            self._faults(self.faults.heal(self.now_ms))
            self._trace("LivenessPhase")
            self._run_until(self.safety_ms + self.liveness_ms)
            liveness_error = self._check_liveness()
        except InvariantViolation as exc:
            violation = str(exc)
        except Exception as exc:  # the core asked the log for something impossible, or crashed
            violation = f"step {self.steps} at {self.now_ms} ms raised {type(exc).__name__}: {exc}"
        return SimResult(seed=self.seed, policy=self.policy, durability=self.durability, steps=self.steps,
                         acked=len(self.checker.acked), violation=violation, liveness_error=liveness_error,
                         trace=self.trace)

    def _run_until(self, end_ms: int) -> None:
        while self.queue and self.queue[0][0] <= end_ms:
            if self.steps >= self.steps_max:
                raise InvariantViolation(f"steps_max={self.steps_max} reached at {self.now_ms} ms "
                                         f"(a livelock, or raise steps_max)")
            t, _, kind, arg = heapq.heappop(self.queue)
            self.now_ms = t
            self.steps += 1
            self.dirty = False
            self._handle(kind, arg)
            if self.dirty:  # steps that touched no replica or log cannot break an invariant
                self.checker.check(self.nodes.values(), self.controller.partition_state())
        self.now_ms = end_ms

    def _check_liveness(self) -> str | None:
        """After the faults stop: one leader, every request released, logs converged; in gray
        runs, no leader kept its leadership through a long cut from its followers."""
        if self.cut_problem is not None:
            return self.cut_problem
        leader_id = self.controller.leader()
        if leader_id is None:
            return "no leader after the liveness phase"
        leader = self.nodes[leader_id].replica
        if leader is None or leader.role is not Role.LEADER:
            return f"replica {leader_id} is leader in metadata but not acting as one"
        for rid, req in self.requests.items():
            if self.now_ms - req["sent_ms"] > PRODUCE_TIMEOUT_MS + 500 and "released_ms" not in req \
                    and req["to"] == leader_id and req["sent_ms"] > self.safety_ms:
                return f"produce request {rid} to the leader was never released"
        # The idempotent producers' requests may be refused (OUT_OF_ORDER while an earlier batch
        # is retried): their batches, not each request, must succeed; checked below.
        settled = [rid for rid, req in self.requests.items()
                   if req["acks"] == -1 and req["sent_ms"] >= self.safety_ms + SETTLE_MS and "producer" not in req]
        if not settled:
            return "no acks=all request was sent after the cluster settled"
        late = [rid for rid, req in self.requests.items()
                if req["acks"] == -1 and req["sent_ms"] >= self.safety_ms + SETTLE_MS and req["to"] == leader_id
                and self.now_ms - req["sent_ms"] > 300 and req["base_offset"] is None and "producer" not in req]
        # A request may miss the 300 ms only when the cluster was too slow for its own load, and
        # only with evidence: it waited in the leader's backlog behind the requests before it (a
        # backpressure bound still full of what the faults left), the backlog never kept a request
        # the bound had room for, and, running on without new requests, it is acknowledged within
        # its produce timeout (checked last, after the end state below).
        behind = [rid for rid in late if "backlogged_ms" in self.requests[rid]]
        if set(late) - set(behind) or (late and self.backlog_with_room is not None):
            why = "" if self.backlog_with_room is None else (
                " (at {} ms replica {} kept request {} in its backlog with room)".format(*self.backlog_with_room))
            return f"acks=all requests {late[:5]} sent to a healed cluster were not acknowledged{why}"
        for node in self.nodes.values():
            stuck = [p.request_id for p in (node.replica.pending.values() if node.replica else ())
                     if p.deadline_ms < self.now_ms]
            stuck += [rid for rid, (_, _, deadline_ms) in (node.replica._backlog.items() if node.replica else ())
                      if deadline_ms < self.now_ms]
            if stuck:
                return f"replica {node.node_id} holds produce requests {stuck[:5]} past their deadline"
        hw = leader.high_watermark
        reference = self.nodes[leader_id]
        for node in self.nodes.values():
            if node.replica is None:
                return f"replica {node.node_id} is down after the liveness phase"
            mine = [e for e in node.shadow if e[1] <= hw]
            theirs = [e for e in reference.shadow if e[1] <= hw]
            if mine != theirs:
                return f"replica {node.node_id} differs from leader {leader_id} below HW {hw}"
        for base, nxt, ident, epoch in self.checker.acked:
            if reference.by_base.get(base) != (nxt, ident):
                return f"acknowledged record at {base} missing from the final leader"
        for name, producer in self.producers.items():
            # A request lost in the safety phase holds its partition until it times out.
            settled_ms = self.safety_ms + max(SETTLE_MS, producer.request_timeout_ms + 200)
            late = [b for b in range(producer.created) if producer.created_ms[b] >= settled_ms]
            # Never idle with work; some batch acknowledged, unless the cluster was shown too slow
            # for this producer's timeouts (producer.py, progress_problem).
            problem = producer.progress_problem(settled_ms=settled_ms, now_ms=self.now_ms)
            if problem:
                return f"producer {name}: {problem}"
            # Every batch gets an outcome by its delivery timeout (plus the request in flight then).
            due_ms = producer.core.delivery_timeout_ms + producer.request_timeout_ms
            hanging = [b for b in range(producer.created) if b not in producer.acked and b not in producer.failed
                       and producer.created_ms[b] + due_ms < self.now_ms]
            if hanging:
                return f"producer {name}: batches {hanging[:5]} have no outcome past their delivery timeout"
            # With client timeouts longer than a healed cluster's acks=all latency, nothing fails
            # (batches still queued at the end are slow, not failed: one in flight is slow).
            if producer.request_timeout_ms >= 400 and producer.core.delivery_timeout_ms >= 2000:
                failed = [b for b in late if b in producer.failed]
                if failed:
                    return (f"producer {name}: batches {failed[:5]} made after the cluster settled failed: "
                            f"{producer.failed[failed[0]].reason}")
        if behind:
            self._run_until(max(self.requests[rid]["sent_ms"] for rid in behind) + PRODUCE_TIMEOUT_MS)
            unanswered = [rid for rid in behind if self.requests[rid]["base_offset"] is None]
            if unanswered:
                req = self.requests[unanswered[0]]
                return (f"acks=all requests {unanswered[:5]} sent to a healed cluster were not acknowledged "
                        f"within their produce timeout (request {unanswered[0]}: {req['error']})")
        return None


def run_simulation(*, seed: int, policy: str, durability: str, **kw) -> SimResult:
    return Simulation(seed=seed, policy=policy, durability=durability, **kw).run()
