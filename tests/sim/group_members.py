"""A seeded simulation of consumers (the SDK's GroupCore, driven as the SDK's driver drives it)
in one group, against the brokers' coordinator core (dataplane/groups/coordinator.py).

Each consumer is a GroupCore plus what the driver does around it: it polls now and then
(consuming one record per owned partition per poll), performs the core's revocations and
assignments inside a poll (commit the processed positions, then RevocationDone; fetch the
committed offsets of new partitions and start there, else at 0), commits on its own now
and then, and forwards requests and answers with random latency. Faults: consumers crash
(stop for good), pause (no ticks, no polls: a stopped process, sometimes past its session
or its max poll interval), leave cleanly, start; the coordinator fails over (requests and
answers in flight lost, a prefix of its writes committed, a new core built from the log).

Checkers (they read only what consumers were told and what they did):
- ownership: no partition is owned by two consumers in one generation;
- hand-over: no consumer is handed a partition that another consumer still in the group
  still reads (eager: everyone revoked before rejoining; cooperative: KIP-429 holds a
  moving partition back until its owner revoked it). Zombies (consumers the coordinator
  evicted, which act on an old generation until they hear of it) are excepted on both sides;
- no skipped record: a consumer that starts a partition at offset c does so only if
  every offset below c was consumed by some consumer;
- a commit of a revocation in a live generation is accepted unless the coordinator moved;
- liveness: once faults stop, the live consumers settle in one generation, owning every
  partition exactly once, and every partition moves forward.
"""
from __future__ import annotations

import dataclasses
import heapq
import itertools
import random
from collections import deque
from typing import Any

from common.errors import ErrorCode
from common.topic_partition import TopicPartition
from common.wire import messages as wire
from dataplane.client.assignors import assignors_for
from dataplane.client.group_core import (
    Answered,
    Close,
    CommitAnswered,
    Failed,
    GroupCore,
    GroupSettings,
    PartitionCounts,
    Polled,
    Ready,
    RevocationDone,
    State,
    Subscribe,
    Tick,
)
from dataplane.groups.coordinator import Coordinator
from dataplane.groups.events import GroupConfig, GroupRecord, Received, Written
from dataplane.groups.events import Tick as CoordinatorTick

GROUP, TOPIC = "g", "t"
TICK_MS = 10
SESSION_MS = 400
HEARTBEAT_MS = 100
MAX_POLL_MS = 1500
CONFIG = GroupConfig(initial_rebalance_delay_ms=50, session_timeout_ms_min=SESSION_MS,
                     offsets_retention_check_interval_ms=60_000)


@dataclasses.dataclass(frozen=True)
class Rates:
    crash: float = 0.001
    pause: float = 0.002
    leave: float = 0.001
    start: float = 0.004
    failover: float = 0.001


@dataclasses.dataclass
class Result:
    seed: int
    violation: str | None
    generations: int
    failovers: int
    revocations: int
    records: int


class SimConsumer:
    def __init__(self, name: str, instance: str | None, strategy: list[str], now_ms: int) -> None:
        self.name = name
        self.instance = instance
        self.core = GroupCore(GroupSettings(group_id=GROUP, group_instance_id=instance, client_id=name,
                                            assignors=tuple(assignors_for(strategy)), session_timeout_ms=SESSION_MS,
                                            heartbeat_interval_ms=HEARTBEAT_MS, max_poll_interval_ms=MAX_POLL_MS),
                              now_ms=now_ms)
        self.positions: dict[TopicPartition, int] = {}
        self.starting: set[TopicPartition] = set()        # assigned, committed offset being looked up
        self.todo: deque[Ready] = deque()                  # callbacks waiting for the next poll
        self.revoking: tuple[TopicPartition, ...] | None = None   # a revocation's commit is out
        self.commit_out = False
        self.alive = True
        self.closing = False
        self.paused_until_ms = 0
        self.next_poll_ms = 0


class MemberSimulation:
    def __init__(self, seed: int, *, strategy: list[str], partitions: int = 6, consumers: int = 3,
                 rates: Rates = Rates()) -> None:
        self.rng = random.Random(seed)
        self.seed = seed
        self.strategy = strategy
        self.partitions = partitions
        self.all_partitions = {TopicPartition(TOPIC, p) for p in range(partitions)}
        self.rates = rates
        self.now = 0
        self.log: list[GroupRecord] = []
        self.core: Coordinator | None = Coordinator(config=CONFIG, now_ms=0)
        self.core_down_until = 0
        self.writes: list[tuple[int, int, tuple[GroupRecord, ...]]] = []
        self.queue: list[tuple[int, int, str, int, Any]] = []   # (due, seq, "request"|"answer", id, payload)
        self.seq = itertools.count()
        self.request_ids = itertools.count(1)
        self.waiting: dict[int, tuple[SimConsumer, Any]] = {}
        self.consumers: list[SimConsumer] = []
        self.names = itertools.count(1)
        self.instances = itertools.count(1)
        self.violation: str | None = None
        self.consumed: dict[TopicPartition, set[int]] = {tp: set() for tp in self.all_partitions}
        self.owner_of: dict[tuple[int, TopicPartition], str] = {}   # (generation, partition) -> consumer
        self.failovers = 0
        self.revocations = 0
        for _ in range(consumers):
            self._start_consumer()

    # ------------------------------------------------------------ plumbing

    def _fail(self, message: str) -> None:
        if self.violation is None:
            self.violation = f"seed={self.seed} strategy={self.strategy} t={self.now}ms: {message}"

    def _latency(self) -> int:
        return self.rng.choice((0, 0, TICK_MS, 2 * TICK_MS, 5 * TICK_MS))

    def _send(self, c: SimConsumer, request: object) -> None:
        rid = next(self.request_ids)
        self.waiting[rid] = (c, request)
        heapq.heappush(self.queue, (self.now + self._latency(), next(self.seq), "request", rid, request))

    def _step_coordinator(self, event: Any) -> None:
        assert self.core is not None
        step = self.core.step(event)
        for w in step.writes:
            due = max([self.now + self.rng.choice((0, TICK_MS, 3 * TICK_MS))] + [d for d, *_ in self.writes])
            self.writes.append((due, w.write_id, w.records))
        for a in step.answers:
            heapq.heappush(self.queue, (self.now + self._latency(), next(self.seq), "answer", a.request_id,
                                        a.response))

    def _failover(self) -> None:
        self.failovers += 1
        keep = self.rng.randint(0, len(self.writes))
        self.log += [r for _, _, recs in self.writes[:keep] for r in recs]
        self.writes = []
        self.queue = []
        lost, self.waiting = list(self.waiting.values()), {}
        for c, request in lost:
            if c.alive:
                self._request_failed(c, request)
        self.core = None
        self.core_down_until = self.now + self.rng.choice((0, 50, 300))

    # ------------------------------------------------------------ consumers

    def _start_consumer(self) -> None:
        instance = f"i{next(self.instances)}" if self.rng.random() < 0.3 else None
        c = SimConsumer(f"c{next(self.names)}", instance, self.strategy, self.now)
        self.consumers.append(c)
        self._step(c, Subscribe(topics=(TOPIC,), now_ms=self.now))

    def _step(self, c: SimConsumer, event: Any) -> None:
        if not c.alive:
            return
        self._perform(c, c.core.step(event))

    def _perform(self, c: SimConsumer, ready: Ready) -> None:
        if ready.fatal is not None:
            if ready.fatal.code is not ErrorCode.FENCED_INSTANCE_ID:
                self._fail(f"{c.name}: unexpected fatal error {ready.fatal}")
            c.alive = False   # a replaced static member stops, as Kafka's clients do
            return
        if ready.revoke or ready.lost or ready.assign:
            c.todo.append(ready)
        for send in ready.send:
            if send.to is None:   # FindCoordinator: any broker knows where the coordinator is
                up = self.core is not None
                response = wire.FindCoordinatorResponse(node_id=0, host="sim", port=1) if up else \
                    wire.FindCoordinatorResponse(error_code=ErrorCode.COORDINATOR_NOT_AVAILABLE)
                rid = next(self.request_ids)
                self.waiting[rid] = (c, send.request)
                heapq.heappush(self.queue, (self.now + self._latency(), next(self.seq), "answer", rid, response))
            else:
                self._send(c, send.request)
        if ready.need_partition_counts:
            self._step(c, PartitionCounts(counts={t: self.partitions if t == TOPIC else 0
                                                  for t in ready.need_partition_counts}, now_ms=self.now))
        if ready.left:
            c.alive = False

    def _answered(self, c: SimConsumer, request: object, response: Any) -> None:
        if isinstance(request, wire.OffsetCommitRequest):
            c.commit_out = False
            self._step(c, CommitAnswered(request=request, response=response, now_ms=self.now))
            self._commit_done(c, request, response)
        elif isinstance(request, wire.OffsetFetchRequest):
            self._start_partitions(c, response)
        else:
            self._step(c, Answered(request=request, response=response, now_ms=self.now))

    def _request_failed(self, c: SimConsumer, request: object) -> None:
        if isinstance(request, wire.OffsetCommitRequest):
            c.commit_out = False
            self._commit_done(c, request, None)
        elif isinstance(request, wire.OffsetFetchRequest):
            c.starting.clear()
            c.positions = {tp: p for tp, p in c.positions.items() if tp in c.core.owned}
            self._look_up(c, c.core.owned - set(c.positions))   # ask again, as the driver does
        else:
            self._step(c, Failed(request=request, reason="lost", now_ms=self.now))

    def _commit_done(self, c: SimConsumer, request: wire.OffsetCommitRequest, response: Any) -> None:
        if c.revoking is None:
            return
        if response is not None:
            codes = {p.error_code for t in response.topics for p in t.partitions}
            # The commit of a revocation carries a generation the member still had when it
            # revoked; only the coordinator moving, or the member having been evicted
            # meanwhile (a pause past its session), may refuse it.
            allowed = {ErrorCode.NONE, ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE,
                       ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ErrorCode.UNKNOWN_MEMBER_ID,
                       ErrorCode.ILLEGAL_GENERATION, ErrorCode.REBALANCE_IN_PROGRESS}
            if not codes <= allowed:
                self._fail(f"{c.name}: the commit of its revoked partitions was refused with {codes}")
        for tp in c.revoking:
            c.positions.pop(tp, None)
        c.revoking = None
        self.revocations += 1
        self._step(c, RevocationDone(now_ms=self.now))

    def _look_up(self, c: SimConsumer, partitions: set[TopicPartition]) -> None:
        partitions = partitions - c.starting
        if not partitions:
            return
        c.starting |= partitions
        self._send(c, wire.OffsetFetchRequest(group_id=GROUP, topics=(wire.OffsetFetchTopic(
            topic=TOPIC, partitions=tuple(sorted(tp.partition for tp in partitions))),)))

    def _start_partitions(self, c: SimConsumer, response: wire.OffsetFetchResponse) -> None:
        for t in response.topics:
            for p in t.partitions:
                tp = TopicPartition(t.topic, p.partition)
                if tp not in c.starting:
                    continue
                c.starting.discard(tp)
                if tp not in c.core.owned or p.error_code != ErrorCode.NONE:
                    continue
                start = max(p.committed_offset, 0)
                missing = [o for o in range(start) if o not in self.consumed[tp]]
                if missing:
                    self._fail(f"{c.name} starts {tp} at committed offset {start}, but offsets {missing[:5]} "
                               f"were never consumed: records skipped")
                c.positions[tp] = start
        if c.starting == set() and c.core.owned - set(c.positions):
            self._look_up(c, c.core.owned - set(c.positions))

    def _poll(self, c: SimConsumer) -> None:
        self._step(c, Polled(now_ms=self.now))
        while c.todo and c.revoking is None and c.alive:
            ready = c.todo.popleft()
            gone = ready.revoke or ready.lost
            if ready.revoke:
                held = {tp: c.positions[tp] for tp in ready.revoke if tp in c.positions}
                c.revoking = ready.revoke
                if held:
                    c.commit_out = True
                    self._send(c, c.core.commit_request(held))
                else:
                    self._commit_done(c, wire.OffsetCommitRequest(group_id=GROUP), None)
            elif ready.lost:
                for tp in ready.lost:
                    c.positions.pop(tp, None)
                self._step(c, RevocationDone(now_ms=self.now))
            if ready.assign:
                self._check_handover(c, ready.assign)
                self._look_up(c, set(ready.assign))
            if gone and c.revoking is not None:
                break
        for tp in list(c.positions):
            if tp in c.core.owned or c.revoking is not None and tp in c.revoking:
                self.consumed[tp].add(c.positions[tp])
                c.positions[tp] += 1
        if not c.commit_out and c.revoking is None and c.positions and c.core.in_generation \
                and self.rng.random() < 0.1:
            c.commit_out = True
            self._send(c, c.core.commit_request(dict(c.positions)))

    def _check_handover(self, c: SimConsumer, assigned: tuple[TopicPartition, ...]) -> None:
        generation = c.core.generation_id
        group = self.core.groups.get(GROUP) if self.core is not None else None
        if group is None or c.core.member_id not in group.members or generation != group.generation:
            return   # a zombie acting on an assignment of a generation the group has left
        for tp in assigned:
            key = (generation, tp)
            if key in self.owner_of and self.owner_of[key] != c.name:
                self._fail(f"{tp} owned by {self.owner_of[key]} and {c.name} in generation {generation}")
            self.owner_of[key] = c.name
        members = group.members
        for other in self.consumers:
            if other is c or not other.alive or other.core.member_id not in members:
                continue   # zombies (evicted, fenced) may still think they own it
            reading = set(assigned) & (set(other.positions) | other.starting)
            if reading:
                self._fail(f"{c.name} was given {sorted(reading)} while {other.name} (generation "
                           f"{other.core.generation_id}, still in the group) still reads them")

    # ------------------------------------------------------------ run

    def _faults(self) -> None:
        r = self.rates
        live = [c for c in self.consumers if c.alive and not c.closing]
        if self.core is not None and self.rng.random() < r.failover:
            self._failover()
        if live and self.rng.random() < r.crash:
            self.rng.choice(live).alive = False
        if live and self.rng.random() < r.pause:
            c = self.rng.choice(live)
            c.paused_until_ms = self.now + self.rng.choice((200, SESSION_MS * 2, MAX_POLL_MS + 500))
        if len(live) > 1 and self.rng.random() < r.leave:
            c = self.rng.choice(live)
            c.closing = True
            self._step(c, Close(now_ms=self.now))
        if len(live) < 5 and self.rng.random() < r.start:
            self._start_consumer()

    def _tick(self, faults: bool) -> None:
        self.now += TICK_MS
        if self.core is None and self.now >= self.core_down_until:
            self.core = Coordinator(config=CONFIG, now_ms=self.now, stored=tuple(self.log))
        while self.queue and self.queue[0][0] <= self.now:
            _, _, kind, rid, payload = heapq.heappop(self.queue)
            if kind == "request":
                if self.core is None:
                    c, request = self.waiting.pop(rid)
                    self._request_failed(c, request)
                    continue
                self._step_coordinator(Received(request_id=rid, request=payload, now_ms=self.now,
                                                fresh_member_id=f"m{rid}"))
            else:
                c, request = self.waiting.pop(rid)
                if c.alive:
                    self._answered(c, request, payload)
        if self.core is not None:
            while self.writes and self.writes[0][0] <= self.now:
                _, write_id, recs = self.writes.pop(0)
                self.log += recs
                self._step_coordinator(Written(write_id=write_id, ok=True, now_ms=self.now))
            self._step_coordinator(CoordinatorTick(now_ms=self.now))
        if faults:
            self._faults()
        for c in list(self.consumers):
            if not c.alive or self.now < c.paused_until_ms:
                continue
            self._step(c, Tick(now_ms=self.now))
            if self.now >= c.next_poll_ms and not c.closing:
                c.next_poll_ms = self.now + self.rng.choice((10, 30, 60))
                self._poll(c)
            elif c.closing:
                self._poll_closing(c)
        self._check_generations()

    def _poll_closing(self, c: SimConsumer) -> None:
        """close() runs the revocation the core asked for, as the driver's close does."""
        while c.todo and c.revoking is None and c.alive:
            ready = c.todo.popleft()
            if ready.revoke:
                held = {tp: c.positions[tp] for tp in ready.revoke if tp in c.positions}
                c.revoking = ready.revoke
                if held:
                    self._send(c, c.core.commit_request(held))
                else:
                    self._commit_done(c, wire.OffsetCommitRequest(group_id=GROUP), None)
            elif ready.lost:
                self._step(c, RevocationDone(now_ms=self.now))

    def _check_generations(self) -> None:
        by_generation: dict[int, dict[TopicPartition, str]] = {}
        for c in self.consumers:
            if not c.alive or c.core.state is not State.STABLE:
                continue
            seen = by_generation.setdefault(c.core.generation_id, {})
            for tp in c.core.owned:
                if tp in seen:
                    self._fail(f"{tp} owned by {seen[tp]} and {c.name} in generation {c.core.generation_id}")
                seen[tp] = c.name

    def _settled(self) -> str | None:
        live = [c for c in self.consumers if c.alive]
        if not live:
            return None
        generations = {c.core.generation_id for c in live}
        states = {c.core.state for c in live}
        if len(generations) != 1 or states != {State.STABLE}:
            return f"live consumers in generations {sorted(generations)}, states {sorted(s.value for s in states)}"
        group = self.core.groups.get(GROUP) if self.core is not None else None
        if group is None or group.generation not in generations or \
                set(group.members) != {c.core.member_id for c in live}:
            return "the coordinator's group is not the live consumers' (a rebalance is still to come)"
        owned = sorted(tp for c in live for tp in c.core.owned)
        if owned != sorted(self.all_partitions):
            return f"partitions owned: {owned}"
        if any(c.todo or c.starting or c.revoking for c in live):
            return "callbacks still pending"
        return None

    def run(self, *, duration_ms: int = 20_000, settle_ms: int = 15_000) -> Result:
        while self.now < duration_ms and self.violation is None:
            self._tick(faults=True)
        for c in self.consumers:
            c.paused_until_ms = min(c.paused_until_ms, self.now)
        if not any(c.alive and not c.closing for c in self.consumers):
            self._start_consumer()
        end = self.now + settle_ms
        while self.now < end and self.violation is None and self._settled() is not None:
            self._tick(faults=False)
        if self.violation is None and (why := self._settled()) is not None:
            self._fail(f"the group did not settle within {settle_ms} ms after the faults stopped: {why}")
        # Liveness of consumption: in a settled group every partition's owner moves forward.
        if self.violation is None:
            def positions() -> dict[TopicPartition, int]:
                return {tp: pos for c in self.consumers if c.alive for tp, pos in c.positions.items()}
            before = positions()
            for _ in range(100):
                self._tick(faults=False)
            after = positions()
            stuck = [tp for tp in self.all_partitions if after.get(tp, -1) <= before.get(tp, -1)]
            if stuck:
                self._fail(f"settled, but partitions {sorted(stuck)} do not move")
        generation = self.core.groups[GROUP].generation if self.core and GROUP in self.core.groups else 0
        return Result(seed=self.seed, violation=self.violation, generations=generation, failovers=self.failovers,
                      revocations=self.revocations, records=sum(len(s) for s in self.consumed.values()))

