"""A seeded simulation of the group coordinator's core with members that misbehave.

Members join, consume, commit, leave, crash (silently: they just stop) and pause past
their session timeout, then carry on with what they held. Requests and answers take a
random time on the way; the coordinator's writes commit in order after a random delay,
and the coordinator fails over: a random prefix of its writes in flight commits, every
request and answer in flight is lost, and a fresh core is built from the committed
records (as the broker does from the offsets topic). Now and then an operator resets a
partition's offset from outside the group.

Checkers (they read only what members were told and what the log holds):
- ownership: no partition is held by two owners in one generation (an owner is a
  member id, or its group.instance.id for static members, whose replacement takes over);
- durability: an acknowledged commit's record is in the committed log when it is
  acknowledged, and every core built after a failover holds the log's latest offsets;
- monotonic offsets: a partition's committed offset goes back only by an operator reset;
- liveness: after the faults stop, the live members settle into one generation that
  holds every partition exactly once.
"""
from __future__ import annotations

import dataclasses
import heapq
import itertools
import json
import random
from typing import Any

from common.errors import ErrorCode
from common.wire import messages as wire
from dataplane.groups import records
from dataplane.groups.coordinator import Coordinator
from dataplane.groups.events import GroupConfig, GroupRecord, Received, Tick, Written

GROUP, TOPIC = "g", "t"
TICK_MS = 10
SESSION_MS = 300
REBALANCE_MS = 1000
HEARTBEAT_MS = 90
CONFIG = GroupConfig(initial_rebalance_delay_ms=50, session_timeout_ms_min=SESSION_MS,
                     offsets_retention_check_interval_ms=60_000)


@dataclasses.dataclass(frozen=True)
class Rates:
    """Per-tick chances of each fault (per member where it names one)."""

    crash: float = 0.002
    pause: float = 0.002
    leave: float = 0.002
    start: float = 0.01
    failover: float = 0.002
    reset: float = 0.003


@dataclasses.dataclass
class Result:
    seed: int
    violation: str | None
    generations: int
    failovers: int
    acked_commits: int
    fenced: int


class Member:
    def __init__(self, name: str, instance: str | None) -> None:
        self.name = name
        self.instance = instance
        self.member_id = ""
        self.generation = -1
        self.held: dict[int, int] = {}     # partition -> position (next offset to read)
        self.fetching = False
        self.fetch_rid = -1                 # the offset fetch whose answer counts (older ones are stale)
        self.busy: str | None = None        # the group request in flight (join, sync, heartbeat)
        self.commit_inflight = False
        self.next_heartbeat_ms = 0
        self.paused_until_ms = 0
        self.alive = True
        self.needs_join = True

    @property
    def owner(self) -> str:
        return self.instance or self.member_id


class GroupSimulation:
    def __init__(self, seed: int, *, partitions: int = 6, members: int = 3, rates: Rates = Rates(),
                 fence: bool = True) -> None:
        self.rng = random.Random(seed)
        self.seed = seed
        self.partitions = partitions
        self.rates = rates
        self.fence = fence
        self.now = 0
        self.log: list[GroupRecord] = []
        self.log_origin: list[str] = []           # "reset" for an operator's records
        self.core: Coordinator | None = Coordinator(config=CONFIG, now_ms=0, fence_generations=fence)
        self.core_down_until = 0
        self.writes: list[tuple[int, int, tuple[GroupRecord, ...], str]] = []  # (due, write id, records, origin)
        self.queue: list[tuple[int, int, str, Any, Any]] = []  # (due, seq, kind, target, payload)
        self.seq = itertools.count()
        self.request_ids = itertools.count(1)
        self.waiting: dict[int, tuple[Member | None, Any]] = {}  # request id -> (who asked, the request)
        self.members: list[Member] = []
        self.names = itertools.count(1)
        self.instances = itertools.count(1)
        self.violation: str | None = None
        self.owned: dict[tuple[int, int], str] = {}   # (generation, partition) -> owner
        self.committed_model: dict[int, int] = {}
        self.acked = 0
        self.failovers = 0
        self.fenced = 0
        self.max_generation = 0
        for _ in range(members):
            self._start_member()

    # ------------------------------------------------------------ plumbing

    def _fail(self, message: str) -> None:
        if self.violation is None:
            self.violation = f"seed={self.seed} t={self.now}ms: {message}"

    def _latency(self) -> int:
        return self.rng.choice((0, 0, TICK_MS, 2 * TICK_MS, 5 * TICK_MS))

    def _send(self, member: Member | None, request: object) -> int:
        rid = next(self.request_ids)
        self.waiting[rid] = (member, request)
        heapq.heappush(self.queue, (self.now + self._latency(), next(self.seq), "request", rid, request))
        return rid

    def _step_core(self, event: Any) -> None:
        assert self.core is not None
        step = self.core.step(event)
        for w in step.writes:
            origin = "reset" if isinstance(event, Received) and isinstance(event.request, wire.OffsetCommitRequest) \
                and event.request.generation_id < 0 else "group"
            due = max([self.now + self.rng.choice((0, TICK_MS, 3 * TICK_MS))] + [d for d, *_ in self.writes])
            self.writes.append((due, w.write_id, w.records, origin))
        for a in step.answers:
            heapq.heappush(self.queue, (self.now + self._latency(), next(self.seq), "answer", a.request_id,
                                        a.response))

    def _commit_writes(self) -> None:
        while self.writes and self.writes[0][0] <= self.now:
            _, write_id, recs, origin = self.writes.pop(0)
            self._append(recs, origin)
            self._step_core(Written(write_id=write_id, ok=True, now_ms=self.now))

    def _append(self, recs: tuple[GroupRecord, ...], origin: str) -> None:
        for r in recs:
            self.log.append(r)
            self.log_origin.append(origin)
            key = json.loads(r.key)
            if key[0] != "offset" or r.value is None:
                continue
            offset = json.loads(r.value)["offset"]
            before = self.committed_model.get(key[3])
            if before is not None and offset < before and origin != "reset":
                self._fail(f"partition {key[3]}'s committed offset went back from {before} to {offset} "
                           f"without a reset")
            self.committed_model[key[3]] = offset

    def _failover(self) -> None:
        self.failovers += 1
        keep = self.rng.randint(0, len(self.writes))
        for _, _, recs, origin in self.writes[:keep]:
            self._append(recs, origin)
        self.writes = []
        self.queue = [q for q in self.queue if q[2] not in ("request", "answer")]
        heapq.heapify(self.queue)
        lost = list(self.waiting.items())
        self.waiting.clear()
        for _, (member, request) in lost:
            if member is not None:
                self._lost(member, request)
        self.core = None
        self.core_down_until = self.now + self.rng.choice((0, 50, 200))

    def _bring_up(self) -> None:
        self.core = Coordinator(config=CONFIG, now_ms=self.now, stored=tuple(self.log), fence_generations=self.fence)
        group = self.core.groups.get(GROUP)
        stored = {tp[1]: c.offset for tp, c in group.offsets.items()} if group is not None else {}
        latest = {p: o for p, o in self.committed_model.items()}
        if group is None:
            latest = {}
        if stored != latest:
            self._fail(f"after failover the coordinator holds offsets {stored}, the log's latest are {latest}")

    # ------------------------------------------------------------ members

    def _start_member(self, instance: str | None = None) -> None:
        if instance is None and self.rng.random() < 0.3:
            instance = f"i{next(self.instances)}"
        self.members.append(Member(f"c{next(self.names)}", instance))

    def _join(self, m: Member) -> None:
        m.held.clear()
        m.fetching = False
        m.fetch_rid = -1
        m.needs_join = False
        m.busy = "join"
        self._send(m, wire.JoinGroupRequest(group_id=GROUP, session_timeout_ms=SESSION_MS,
                                            rebalance_timeout_ms=REBALANCE_MS, member_id=m.member_id,
                                            group_instance_id=m.instance, client_id=m.name,
                                            protocols=(wire.JoinGroupProtocol(name="range", metadata=b""),)))

    def _commit(self, m: Member) -> None:
        if not m.held or m.commit_inflight or m.fetching:
            return
        m.commit_inflight = True
        self._send(m, wire.OffsetCommitRequest(
            group_id=GROUP, generation_id=m.generation, member_id=m.member_id, group_instance_id=m.instance,
            topics=(wire.OffsetCommitTopic(topic=TOPIC, partitions=tuple(
                wire.OffsetCommitPartition(partition=p, committed_offset=pos) for p, pos in sorted(m.held.items()))),)))

    def _act(self, m: Member) -> None:
        if not m.alive or self.now < m.paused_until_ms:
            return
        if m.needs_join and m.busy is None:
            self._join(m)
            return
        for p in m.held:
            if not m.fetching and self.rng.random() < 0.3:
                m.held[p] += 1
        if self.rng.random() < 0.05:
            self._commit(m)
        if m.busy is None and m.generation >= 0 and self.now >= m.next_heartbeat_ms:
            m.busy = "heartbeat"
            m.next_heartbeat_ms = self.now + HEARTBEAT_MS
            self._send(m, wire.HeartbeatRequest(group_id=GROUP, generation_id=m.generation, member_id=m.member_id,
                                                group_instance_id=m.instance))

    def _lost(self, m: Member, request: object) -> None:
        """The coordinator went away with this request: try again as a client would."""
        if isinstance(request, wire.OffsetCommitRequest):
            m.commit_inflight = False
        elif isinstance(request, wire.OffsetFetchRequest):
            m.fetching = False
            m.needs_join = True
            m.busy = None
        else:
            m.busy = None
            if isinstance(request, (wire.JoinGroupRequest, wire.SyncGroupRequest)):
                m.needs_join = True

    def _answered(self, m: Member, rid: int, request: object, response: Any) -> None:
        if not m.alive:
            return
        code = getattr(response, "error_code", ErrorCode.NONE)
        if code is ErrorCode.FENCED_INSTANCE_ID:
            self.fenced += 1
            m.alive = False  # a replaced static member stops, as Kafka's clients do
            return
        if isinstance(request, wire.OffsetCommitRequest):
            m.commit_inflight = False
            codes = {p.error_code for t in response.topics for p in t.partitions}
            if codes == {ErrorCode.NONE}:
                self.acked += 1
                self._check_acked(request)
            return
        if isinstance(request, wire.OffsetFetchRequest):
            if rid != m.fetch_rid:
                return  # for a generation the member has left since
            m.fetching = False
            m.held = {p.partition: max(p.committed_offset, 0) for t in response.topics for p in t.partitions}
            return
        m.busy = None
        if isinstance(request, wire.JoinGroupRequest):
            if code is ErrorCode.MEMBER_ID_REQUIRED:
                m.member_id = response.member_id
                self._join(m)
            elif code is ErrorCode.NONE:
                m.member_id = response.member_id
                assignments: tuple[wire.SyncGroupAssignment, ...] = ()
                if response.leader == m.member_id and response.members:
                    ids = sorted(x.member_id for x in response.members)
                    share: dict[str, list[int]] = {i: [] for i in ids}
                    for p in range(self.partitions):
                        share[ids[p * len(ids) // self.partitions]].append(p)
                    assignments = tuple(wire.SyncGroupAssignment(member_id=i, assignment=json.dumps(ps).encode())
                                        for i, ps in share.items())
                m.busy = "sync"
                self._send(m, wire.SyncGroupRequest(group_id=GROUP, generation_id=response.generation_id,
                                                    member_id=m.member_id, group_instance_id=m.instance,
                                                    assignments=assignments))
                m.generation = response.generation_id
            else:
                if code is ErrorCode.UNKNOWN_MEMBER_ID:
                    m.member_id = ""
                m.needs_join = True
            return
        if isinstance(request, wire.SyncGroupRequest):
            if code is ErrorCode.NONE:
                partitions = json.loads(response.assignment) if response.assignment else []
                for p in partitions:
                    owner = self.owned.setdefault((request.generation_id, p), m.owner)
                    if owner != m.owner:
                        self._fail(f"partition {p} held by {owner} and {m.owner} in generation "
                                   f"{request.generation_id}")
                self.max_generation = max(self.max_generation, request.generation_id)
                m.generation = request.generation_id
                m.held = {}
                if partitions:
                    m.fetching = True
                    m.fetch_rid = self._send(m, wire.OffsetFetchRequest(group_id=GROUP, topics=(
                        wire.OffsetFetchTopic(topic=TOPIC, partitions=tuple(partitions)),)))
                return
            self._rejoin_after(m, code)
            return
        if isinstance(request, wire.HeartbeatRequest) and code is not ErrorCode.NONE:
            if code is ErrorCode.REBALANCE_IN_PROGRESS:
                self._commit(m)  # what it consumed, before giving its partitions up (eager rebalance)
            self._rejoin_after(m, code)
        if isinstance(request, wire.LeaveGroupRequest):
            m.alive = False

    def _rejoin_after(self, m: Member, code: ErrorCode) -> None:
        if code is ErrorCode.UNKNOWN_MEMBER_ID:
            m.member_id = ""
        m.generation = -1
        m.held.clear()
        m.needs_join = True

    def _check_acked(self, request: wire.OffsetCommitRequest) -> None:
        for t in request.topics:
            for p in t.partitions:
                key = records.offset_key(GROUP, t.topic, p.partition)
                if not any(r.key == key and r.value is not None and json.loads(r.value)["offset"] == p.committed_offset
                           for r in self.log):
                    self._fail(f"commit of offset {p.committed_offset} for partition {p.partition} acknowledged "
                               f"before its record was committed")

    # ------------------------------------------------------------ faults

    def _faults(self) -> None:
        r = self.rates
        live = [m for m in self.members if m.alive]
        for m in live:
            roll = self.rng.random()
            if roll < r.crash:
                m.alive = False
                if m.instance is not None and self.rng.random() < 0.7:
                    self._start_member(m.instance)   # a static member restarted
            elif roll < r.crash + r.pause:
                m.paused_until_ms = self.now + self.rng.choice((SESSION_MS // 2, 2 * SESSION_MS, 3 * SESSION_MS))
                if m.instance is not None and self.rng.random() < 0.5:
                    self._start_member(m.instance)   # a hung static member restarted beside the zombie
            elif roll < r.crash + r.pause + r.leave and m.member_id:
                m.busy = "leave"
                self._send(m, wire.LeaveGroupRequest(group_id=GROUP, members=(
                    wire.LeaveGroupMember(member_id=m.member_id, group_instance_id=m.instance),)))
        if len(live) < 5 and self.rng.random() < r.start:
            self._start_member()
        if self.core is not None and self.rng.random() < r.failover:
            self._failover()
        if self.rng.random() < r.reset:
            p = self.rng.randrange(self.partitions)
            self._send(None, wire.OffsetCommitRequest(group_id=GROUP, topics=(wire.OffsetCommitTopic(
                topic=TOPIC, partitions=(wire.OffsetCommitPartition(partition=p, committed_offset=0),)),)))

    # ------------------------------------------------------------ run

    def _tick(self, faults: bool) -> None:
        self.now += TICK_MS
        if self.core is None and self.now >= self.core_down_until:
            self._bring_up()
        while self.queue and self.queue[0][0] <= self.now:
            _, _, kind, rid, payload = heapq.heappop(self.queue)
            if kind == "request":
                if self.core is None:
                    member, request = self.waiting.pop(rid)
                    if member is not None:
                        self._lost(member, request)
                    continue
                self._step_core(Received(request_id=rid, request=payload, now_ms=self.now,
                                         fresh_member_id=f"id{rid}"))
            else:
                member, request = self.waiting.pop(rid)
                if member is not None:
                    self._answered(member, rid, request, payload)
        if self.core is not None:
            self._commit_writes()
            self._step_core(Tick(now_ms=self.now))
        if faults:
            self._faults()
        for m in list(self.members):
            self._act(m)

    def _settled(self) -> str | None:
        live = [m for m in self.members if m.alive]
        if not live:
            return None
        generations = {m.generation for m in live}
        if len(generations) != 1 or -1 in generations:
            return f"live members in generations {sorted(generations)}"
        held = sorted(p for m in live for p in m.held)
        if held != list(range(self.partitions)) or any(m.fetching for m in live):
            return f"partitions held {held}"
        return None

    def run(self, *, duration_ms: int = 20_000, settle_ms: int = 6_000) -> Result:
        while self.now < duration_ms and self.violation is None:
            self._tick(faults=True)
        if not any(m.alive for m in self.members):
            self._start_member()
        end = self.now + settle_ms
        while self.now < end and self.violation is None:
            self._tick(faults=False)
            if self._settled() is None and self.now > end - settle_ms // 2:
                break
        if self.violation is None:
            why = self._settled()
            if why is not None:
                self._fail(f"the group did not settle after the faults stopped: {why}")
        return Result(seed=self.seed, violation=self.violation, generations=self.max_generation,
                      failovers=self.failovers, acked_commits=self.acked, fenced=self.fenced)


def run_group_simulation(seed: int, *, fence: bool = True, rates: Rates = Rates(), duration_ms: int = 20_000
                         ) -> Result:
    return GroupSimulation(seed, rates=rates, fence=fence).run(duration_ms=duration_ms)
