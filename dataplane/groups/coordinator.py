"""The group coordinator's core: Kafka's classic group protocol as a pure state machine.

One `Coordinator` serves the groups of one partition of the offsets topic. `step` takes
a request, a tick or a write's outcome and returns answers and records to write; it
never reads a clock, opens a socket or sleeps.

The rules it keeps:
- Generations fence: a sync, heartbeat or commit names the generation it belongs to,
  and one from another generation is refused (ILLEGAL_GENERATION); an unknown member
  gets UNKNOWN_MEMBER_ID; a member replaced by a newer holder of its group.instance.id
  gets FENCED_INSTANCE_ID.
- A rebalance ends when every member (and every id handed out for a first join) has
  rejoined, or at the rebalance timeout, which removes whoever did not. The first
  rebalance out of Empty waits `initial_rebalance_delay_ms` (extended by each new
  member, up to the rebalance timeout) so a group starting together forms at once.
- An answer that depends on stored state is released only once the records behind it
  are committed: a sync once the assignment is, a commit once its offsets are, a delete
  once its tombstones are. Offsets change in memory only when committed, so OffsetFetch
  never shows an offset a failover could lose; records of one partition commit in
  order, so a new generation's assignment commits after every commit accepted before it.
- Commits come from members of the current generation (also while it rebalances, so
  members commit what they consumed before rejoining), or from outside the group
  (generation -1, member "") only while it is Empty.
- Offsets of an Empty group expire `offsets_retention_ms` after the later of the group
  becoming empty and the commit; an Empty group with no offsets left is removed.
- A deleted topic's offsets go with it, in every group (Kafka's rule): a topic created
  again under that name starts from the consumers' reset policy, not from offsets of
  records that no longer exist.
"""
from __future__ import annotations

import collections
from typing import Callable

from common.errors import ErrorCode
from common.wire import messages as wire
from dataplane.groups import records
from dataplane.groups.events import (
    Answer, GroupConfig, GroupRecord, Received, Step, Tick, TopicsDeleted, Write, Written,
)
from dataplane.groups.state import CommittedOffset, Group, GroupState, Member

State = GroupState


class Coordinator:
    def __init__(self, *, config: GroupConfig, now_ms: int, stored: list[GroupRecord] | tuple[GroupRecord, ...] = (),
                 fence_generations: bool = True) -> None:
        """`stored`: the partition's records, in log order (a coordinator taking over).
        `fence_generations` False exists only for the simulation's mutant check."""
        self.config = config
        self.now_ms = now_ms
        self.groups: dict[str, Group] = records.load(stored, now_ms)
        self._fence = fence_generations
        self._next_write = 1
        self._on_written: dict[int, Callable[[bool], None]] = {}
        self._step = Step()
        self._next_expiry_ms = now_ms + config.offsets_retention_check_interval_ms
        # Commits whose write is in flight, per group, and when each topic was last deleted (by
        # the count of deletions): a commit accepted before its topic's deletion and stored after
        # it must not bring the deleted topic's offsets back, nor lose its group meanwhile.
        self._commits_in_flight: collections.Counter[str] = collections.Counter()
        self._deletions = 0
        self._deleted_at: dict[str, int] = {}

    # ------------------------------------------------------------------ entry

    def step(self, event: Received | Tick | Written | TopicsDeleted) -> Step:
        if event.now_ms < self.now_ms:
            raise ValueError(f"{type(event).__name__} went back in time: now_ms={event.now_ms} after {self.now_ms}")
        self.now_ms = event.now_ms
        self._step = Step()
        if isinstance(event, Received):
            handler = _HANDLERS.get(type(event.request))
            if handler is None:
                raise TypeError(f"{type(event.request).__name__} is not a group request; expected one of "
                                f"{', '.join(t.__name__ for t in _HANDLERS)}")
            handler(self, event)
        elif isinstance(event, Tick):
            self._tick()
        elif isinstance(event, TopicsDeleted):
            self._topics_deleted(event.topics)
        elif isinstance(event, Written):
            done = self._on_written.pop(event.write_id, None)
            if done is None:
                raise ValueError(f"Written({event.write_id}) names no write in flight")
            done(event.ok)
        else:
            raise TypeError(f"{type(event).__name__} is not an input of the coordinator")
        step, self._step = self._step, Step()
        return step

    def _answer(self, request_id: int, response: object) -> None:
        self._step.answers.append(Answer(request_id=request_id, response=response))

    def _write(self, recs: list[GroupRecord], done: Callable[[bool], None]) -> None:
        write_id = self._next_write
        self._next_write += 1
        self._on_written[write_id] = done
        self._step.writes.append(Write(write_id=write_id, records=tuple(recs)))

    @property
    def writes_in_flight(self) -> int:
        return len(self._on_written)

    # ------------------------------------------------------------------ join

    def _join(self, ev: Received) -> None:
        req = ev.request
        assert isinstance(req, wire.JoinGroupRequest)
        rid = ev.request_id

        def refuse(code: ErrorCode, member_id: str = "") -> None:
            self._answer(rid, wire.JoinGroupResponse(error_code=code, member_id=member_id or req.member_id))

        if not req.group_id:
            return refuse(ErrorCode.INVALID_GROUP_ID)
        c = self.config
        if not c.session_timeout_ms_min <= req.session_timeout_ms <= c.session_timeout_ms_max:
            return refuse(ErrorCode.INVALID_SESSION_TIMEOUT)
        if not req.protocol_type or not req.protocols:
            return refuse(ErrorCode.INCONSISTENT_GROUP_PROTOCOL)
        group = self.groups.get(req.group_id)
        if group is not None and group.state is State.DEAD:
            return refuse(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        if group is not None and group.members:
            names = {p.name for p in req.protocols}
            if req.protocol_type != group.protocol_type or not (group.candidate_protocols() & names):
                return refuse(ErrorCode.INCONSISTENT_GROUP_PROTOCOL)
        if group is None:
            group = self.groups[req.group_id] = Group(group_id=req.group_id, state_since_ms=self.now_ms)
        protocols = tuple((p.name, bytes(p.metadata)) for p in req.protocols)

        if req.group_instance_id is not None and req.group_instance_id in group.static:
            return self._static_rejoin(group, ev, protocols)
        if not req.member_id:
            if len(group.members) + len(group.pending) >= c.group_members_max:
                return refuse(ErrorCode.GROUP_MAX_SIZE_REACHED)
            new_id = ev.fresh_member_id
            if not new_id:
                raise ValueError("a JoinGroup without a member id needs Received.fresh_member_id")
            if ev.member_id_required and req.group_instance_id is None:
                # KIP-394: the id is handed out first and the member joins with it, so a
                # join whose answer is lost leaves no ghost member behind.
                group.pending[new_id] = self.now_ms + req.session_timeout_ms
                return refuse(ErrorCode.MEMBER_ID_REQUIRED, new_id)
            return self._add_member(group, ev, new_id, protocols)
        if req.member_id in group.pending:
            del group.pending[req.member_id]
            return self._add_member(group, ev, req.member_id, protocols)
        member = group.members.get(req.member_id)
        if member is None:
            return refuse(ErrorCode.UNKNOWN_MEMBER_ID)
        if member.instance_id is not None and member.instance_id != req.group_instance_id:
            return refuse(ErrorCode.FENCED_INSTANCE_ID)
        self._rejoin(group, member, ev, protocols)

    def _new_member(self, group: Group, ev: Received, member_id: str,
                    protocols: tuple[tuple[str, bytes], ...]) -> Member:
        req = ev.request
        assert isinstance(req, wire.JoinGroupRequest)
        return Member(member_id=member_id, instance_id=req.group_instance_id, client_id=req.client_id,
                      client_host=ev.client_host, session_timeout_ms=req.session_timeout_ms,
                      rebalance_timeout_ms=req.rebalance_timeout_ms, protocol_type=req.protocol_type,
                      protocols=protocols, last_heard_ms=self.now_ms)

    def _add_member(self, group: Group, ev: Received, member_id: str,
                    protocols: tuple[tuple[str, bytes], ...]) -> None:
        req = ev.request
        assert isinstance(req, wire.JoinGroupRequest)
        member = self._new_member(group, ev, member_id, protocols)
        member.join_request = ev.request_id
        if not group.members:
            group.protocol_type = req.protocol_type
        group.members[member_id] = member
        if member.instance_id is not None:
            group.static[member.instance_id] = member_id
        if group.leader is None:
            group.leader = member_id
        if group.state is State.PREPARING_REBALANCE and group.initial_join:
            # Each newcomer of the first rebalance buys the group another delay, up to its
            # rebalance timeout (Kafka's InitialDelayedJoin).
            group.join_deadline_ms = min(self.now_ms + self.config.initial_rebalance_delay_ms,
                                         group.rebalance_started_ms + group.rebalance_timeout_ms())
        self._prepare_rebalance(group)
        self._maybe_complete_join(group)

    def _rejoin(self, group: Group, member: Member, ev: Received, protocols: tuple[tuple[str, bytes], ...]) -> None:
        member.last_heard_ms = self.now_ms
        changed = protocols != member.protocols
        if group.state is State.COMPLETING_REBALANCE and not changed:
            # A join answer lost on the way: the same generation again.
            return self._answer(ev.request_id, self._join_response(group, member))
        if group.state is State.STABLE and not changed and member.member_id != group.leader:
            return self._answer(ev.request_id, self._join_response(group, member))
        if member.join_request is not None and member.join_request != ev.request_id:
            self._answer(member.join_request, wire.JoinGroupResponse(
                error_code=ErrorCode.REBALANCE_IN_PROGRESS, member_id=member.member_id))
        member.protocols = protocols
        member.join_request = ev.request_id
        self._prepare_rebalance(group)
        self._maybe_complete_join(group)

    def _static_rejoin(self, group: Group, ev: Received, protocols: tuple[tuple[str, bytes], ...]) -> None:
        """A known group.instance.id joins again (a restarted static member): it takes the
        old member's place under a new member id; the old id is fenced from now on."""
        req = ev.request
        assert isinstance(req, wire.JoinGroupRequest) and req.group_instance_id is not None
        old_id = group.static[req.group_instance_id]
        if req.member_id and req.member_id != old_id:
            return self._answer(ev.request_id, wire.JoinGroupResponse(
                error_code=ErrorCode.FENCED_INSTANCE_ID, member_id=req.member_id))
        old = group.members[old_id]
        if req.member_id == old_id:
            return self._rejoin(group, old, ev, protocols)
        new_id = ev.fresh_member_id
        if not new_id:
            raise ValueError("a static JoinGroup without a member id needs Received.fresh_member_id")
        member = self._new_member(group, ev, new_id, protocols)
        member.assignment = old.assignment
        for waiting, code in ((old.join_request, None), (old.sync_request, ErrorCode.FENCED_INSTANCE_ID)):
            if waiting is not None:
                self._answer(waiting, wire.JoinGroupResponse(error_code=ErrorCode.FENCED_INSTANCE_ID,
                                                             member_id=old_id) if code is None
                             else wire.SyncGroupResponse(error_code=code))
        del group.members[old_id]
        group.members[new_id] = member
        group.static[req.group_instance_id] = new_id
        if group.leader == old_id:
            group.leader = new_id
        if group.state is State.STABLE and protocols == old.protocols:
            # Nothing changed: no rebalance. The replacement is stored before it is
            # answered, so a failover does not bring the fenced id back.
            def stored(ok: bool, rid: int = ev.request_id) -> None:
                current = group.members.get(new_id)
                if not ok or current is None:
                    self._answer(rid, wire.JoinGroupResponse(error_code=ErrorCode.UNKNOWN_MEMBER_ID
                                                             if ok else ErrorCode.NOT_COORDINATOR,
                                                             member_id=new_id))
                    return
                self._answer(rid, self._join_response(group, current))
            self._write([records.group_record(group)], stored)
            return
        member.join_request = ev.request_id
        self._prepare_rebalance(group)
        self._maybe_complete_join(group)

    def _join_response(self, group: Group, member: Member) -> wire.JoinGroupResponse:
        assert group.protocol is not None
        members: tuple[wire.JoinGroupMember, ...] = ()
        if member.member_id == group.leader:
            members = tuple(wire.JoinGroupMember(member_id=m.member_id, group_instance_id=m.instance_id,
                                                 metadata=m.metadata_for(group.protocol))
                            for m in group.members.values())
        return wire.JoinGroupResponse(generation_id=group.generation, protocol_name=group.protocol,
                                      leader=group.leader or "", member_id=member.member_id, members=members)

    def _prepare_rebalance(self, group: Group) -> None:
        if group.state is State.PREPARING_REBALANCE:
            return
        if group.state is State.COMPLETING_REBALANCE:
            self._reset_assignments(group, ErrorCode.REBALANCE_IN_PROGRESS)
        group.initial_join = group.state is State.EMPTY
        group.rebalance_started_ms = self.now_ms
        if group.initial_join:
            group.join_deadline_ms = min(self.now_ms + self.config.initial_rebalance_delay_ms,
                                         self.now_ms + group.rebalance_timeout_ms())
        else:
            group.join_deadline_ms = self.now_ms + group.rebalance_timeout_ms()
        group.transition(State.PREPARING_REBALANCE, self.now_ms)

    def _reset_assignments(self, group: Group, code: ErrorCode) -> None:
        for m in group.members.values():
            m.assignment = b""
            if m.sync_request is not None:
                self._answer(m.sync_request, wire.SyncGroupResponse(error_code=code))
                m.sync_request = None

    def _maybe_complete_join(self, group: Group, *, deadline_passed: bool = False) -> None:
        if group.state is not State.PREPARING_REBALANCE:
            return
        if group.initial_join and not deadline_passed:
            return
        if not deadline_passed and not group.all_joined():
            return
        for m in [m for m in group.members.values() if m.join_request is None]:
            self._remove_member(group, m)
        group.pending.clear()
        group.generation += 1
        if not group.members:
            self._become_empty(group)
            return
        group.protocol = group.select_protocol()
        if group.leader not in group.members:
            group.leader = next(iter(group.members))
        group.initial_join = False
        group.transition(State.COMPLETING_REBALANCE, self.now_ms)
        for m in group.members.values():
            assert m.join_request is not None
            self._answer(m.join_request, self._join_response(group, m))
            m.join_request = None
            m.last_heard_ms = self.now_ms

    def _become_empty(self, group: Group) -> None:
        group.protocol = None
        group.leader = None
        group.transition(State.EMPTY, self.now_ms)
        self._write([records.group_record(group)], lambda ok: None)

    def _remove_member(self, group: Group, member: Member) -> None:
        del group.members[member.member_id]
        if member.instance_id is not None and group.static.get(member.instance_id) == member.member_id:
            del group.static[member.instance_id]
        if group.leader == member.member_id:
            group.leader = next(iter(group.members), None)
        for waiting, response in ((member.join_request, wire.JoinGroupResponse(
                error_code=ErrorCode.UNKNOWN_MEMBER_ID, member_id=member.member_id)),
                                  (member.sync_request, wire.SyncGroupResponse(
                                      error_code=ErrorCode.UNKNOWN_MEMBER_ID))):
            if waiting is not None:
                self._answer(waiting, response)

    def _member_left(self, group: Group, member: Member) -> None:
        """A member left or expired: the others rebalance without it."""
        self._remove_member(group, member)
        if group.state in (State.STABLE, State.COMPLETING_REBALANCE):
            if group.members:
                self._prepare_rebalance(group)
            else:
                group.generation += 1
                self._reset_assignments(group, ErrorCode.UNKNOWN_MEMBER_ID)
                self._become_empty(group)
        else:
            self._maybe_complete_join(group)

    # ------------------------------------------------------------------ member checks

    def _check_member(self, group: Group | None, member_id: str, instance_id: str | None,
                      generation: int) -> ErrorCode:
        """Fence first: the instance, then the member, then the generation."""
        if group is None or group.state in (State.EMPTY, State.DEAD):
            return ErrorCode.UNKNOWN_MEMBER_ID
        if instance_id is not None and instance_id in group.static and group.static[instance_id] != member_id:
            return ErrorCode.FENCED_INSTANCE_ID
        member = group.members.get(member_id)
        if member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if self._fence and generation != group.generation:
            return ErrorCode.ILLEGAL_GENERATION
        return ErrorCode.NONE

    # ------------------------------------------------------------------ sync

    def _sync(self, ev: Received) -> None:
        req = ev.request
        assert isinstance(req, wire.SyncGroupRequest)
        group = self.groups.get(req.group_id)
        error = self._check_member(group, req.member_id, req.group_instance_id, req.generation_id)
        if error is not ErrorCode.NONE:
            return self._answer(ev.request_id, wire.SyncGroupResponse(error_code=error))
        assert group is not None
        member = group.members[req.member_id]
        member.last_heard_ms = self.now_ms
        if group.state is State.PREPARING_REBALANCE:
            return self._answer(ev.request_id, wire.SyncGroupResponse(error_code=ErrorCode.REBALANCE_IN_PROGRESS))
        if group.state is State.STABLE:
            return self._answer(ev.request_id, wire.SyncGroupResponse(assignment=member.assignment))
        member.sync_request = ev.request_id
        if member.member_id != group.leader:
            return
        given = {a.member_id: bytes(a.assignment) for a in req.assignments}
        for m in group.members.values():
            m.assignment = given.get(m.member_id, b"")
        generation = group.generation

        def stored(ok: bool) -> None:
            if group.state is not State.COMPLETING_REBALANCE or group.generation != generation:
                return  # a newer rebalance answered the waiting syncs already
            if not ok:
                self._reset_assignments(group, ErrorCode.NOT_COORDINATOR)
                self._prepare_rebalance(group)
                return
            group.transition(State.STABLE, self.now_ms)
            for m in group.members.values():
                if m.sync_request is not None:
                    self._answer(m.sync_request, wire.SyncGroupResponse(assignment=m.assignment))
                    m.sync_request = None
        self._write([records.group_record(group)], stored)

    # ------------------------------------------------------------------ heartbeat, leave

    def _heartbeat(self, ev: Received) -> None:
        req = ev.request
        assert isinstance(req, wire.HeartbeatRequest)
        group = self.groups.get(req.group_id)
        error = self._check_member(group, req.member_id, req.group_instance_id, req.generation_id)
        if error is ErrorCode.NONE:
            assert group is not None
            group.members[req.member_id].last_heard_ms = self.now_ms
            if group.state is State.PREPARING_REBALANCE:
                error = ErrorCode.REBALANCE_IN_PROGRESS
        self._answer(ev.request_id, wire.HeartbeatResponse(error_code=error))

    def _leave(self, ev: Received) -> None:
        req = ev.request
        assert isinstance(req, wire.LeaveGroupRequest)
        group = self.groups.get(req.group_id)
        answers = []
        for who in req.members:
            code = self._leave_one(group, who)
            answers.append(wire.LeaveGroupMemberResponse(member_id=who.member_id,
                                                         group_instance_id=who.group_instance_id, error_code=code))
        self._answer(ev.request_id, wire.LeaveGroupResponse(members=tuple(answers)))

    def _leave_one(self, group: Group | None, who: wire.LeaveGroupMember) -> ErrorCode:
        if group is None or group.state is State.DEAD:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if who.group_instance_id is not None:
            current = group.static.get(who.group_instance_id)
            if current is None:
                return ErrorCode.UNKNOWN_MEMBER_ID
            if who.member_id and who.member_id != current:
                return ErrorCode.FENCED_INSTANCE_ID
            self._member_left(group, group.members[current])
            return ErrorCode.NONE
        if who.member_id in group.pending:
            del group.pending[who.member_id]
            self._maybe_complete_join(group)
            return ErrorCode.NONE
        member = group.members.get(who.member_id)
        if member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        self._member_left(group, member)
        return ErrorCode.NONE

    # ------------------------------------------------------------------ offsets

    def _commit(self, ev: Received) -> None:
        req = ev.request
        assert isinstance(req, wire.OffsetCommitRequest)
        group = self.groups.get(req.group_id)

        def answer_all(code_of: Callable[[int, wire.OffsetCommitPartition], ErrorCode]) -> wire.OffsetCommitResponse:
            return wire.OffsetCommitResponse(topics=tuple(
                wire.OffsetCommitTopicResponse(topic=t.topic, partitions=tuple(
                    wire.OffsetCommitPartitionResponse(partition=p.partition, error_code=code_of(i, p))
                    for p in t.partitions)) for i, t in enumerate(req.topics)))

        error = self._commit_error(group, req)
        if error is not ErrorCode.NONE:
            return self._answer(ev.request_id, answer_all(lambda i, p: error))
        if group is None:
            # A group only used to keep offsets (manual assignment): it exists from its first commit.
            group = self.groups[req.group_id] = Group(group_id=req.group_id, state_since_ms=self.now_ms)
        if req.member_id in group.members:
            group.members[req.member_id].last_heard_ms = self.now_ms
        accepted: dict[tuple[str, int], CommittedOffset] = {}
        recs = []
        refused: dict[tuple[str, int], ErrorCode] = {}
        for t in req.topics:
            for p in t.partitions:
                if (t.topic, p.partition) in ev.missing_partitions:
                    refused[(t.topic, p.partition)] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                    continue
                if p.committed_metadata is not None and \
                        len(p.committed_metadata.encode()) > self.config.offset_metadata_bytes_max:
                    refused[(t.topic, p.partition)] = ErrorCode.OFFSET_METADATA_TOO_LARGE
                    continue
                committed = CommittedOffset(offset=p.committed_offset, leader_epoch=p.committed_leader_epoch,
                                            metadata=p.committed_metadata, commit_ms=self.now_ms)
                accepted[(t.topic, p.partition)] = committed
                recs.append(records.offset_record(req.group_id, t.topic, p.partition, committed))

        def code(ok: bool) -> Callable[[int, wire.OffsetCommitPartition], ErrorCode]:
            def of(i: int, p: wire.OffsetCommitPartition) -> ErrorCode:
                refusal = refused.get((req.topics[i].topic, p.partition))
                if refusal is not None:
                    return refusal
                return ErrorCode.NONE if ok else ErrorCode.NOT_COORDINATOR
            return of

        if not recs:
            return self._answer(ev.request_id, answer_all(code(True)))
        rid = ev.request_id
        target = group
        deletions_before = self._deletions
        self._commits_in_flight[target.group_id] += 1

        def stored(ok: bool) -> None:
            self._commits_in_flight[target.group_id] -= 1
            if not self._commits_in_flight[target.group_id]:
                del self._commits_in_flight[target.group_id]
            if ok and self.groups.get(target.group_id) is target:
                target.offsets.update(accepted)
                late = [tp for tp in accepted if self._deleted_at.get(tp[0], -1) >= deletions_before]
                if late:
                    self._drop_offsets(target, late)
            if not self._commits_in_flight:
                self._deleted_at.clear()   # no commit left that began before a deletion
            self._answer(rid, answer_all(code(ok)))
        self._write(recs, stored)

    def _commit_error(self, group: Group | None, req: wire.OffsetCommitRequest) -> ErrorCode:
        if not req.group_id:
            return ErrorCode.INVALID_GROUP_ID
        if group is not None and group.state is State.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if req.generation_id < 0 and not req.member_id:
            # From outside the group: only while nobody in it is consuming.
            if group is None or group.state is State.EMPTY:
                return ErrorCode.NONE
            # Kafka's answers: "" is no member of an active group.
            return ErrorCode.REBALANCE_IN_PROGRESS if group.state is State.COMPLETING_REBALANCE \
                else ErrorCode.UNKNOWN_MEMBER_ID
        if group is None or group.state is State.EMPTY:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if req.group_instance_id is not None and req.group_instance_id in group.static and \
                group.static[req.group_instance_id] != req.member_id:
            return ErrorCode.FENCED_INSTANCE_ID
        if group.state is State.COMPLETING_REBALANCE and self._fence:
            return ErrorCode.REBALANCE_IN_PROGRESS
        if req.member_id not in group.members:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if self._fence and req.generation_id != group.generation:
            return ErrorCode.ILLEGAL_GENERATION
        return ErrorCode.NONE

    def _offset_fetch(self, ev: Received) -> None:
        req = ev.request
        assert isinstance(req, wire.OffsetFetchRequest)
        group = self.groups.get(req.group_id)
        offsets = group.offsets if group is not None else {}
        wanted: dict[str, list[int]] = {}
        if req.topics is None:
            for topic, partition in sorted(offsets):
                wanted.setdefault(topic, []).append(partition)
        else:
            for t in req.topics:
                wanted.setdefault(t.topic, []).extend(t.partitions)
        topics = []
        for topic, partitions in wanted.items():
            parts = []
            for partition in partitions:
                c = offsets.get((topic, partition))
                parts.append(wire.OffsetFetchPartitionResponse(partition=partition) if c is None else
                             wire.OffsetFetchPartitionResponse(partition=partition, committed_offset=c.offset,
                                                               committed_leader_epoch=c.leader_epoch,
                                                               metadata=c.metadata))
            topics.append(wire.OffsetFetchTopicResponse(topic=topic, partitions=tuple(parts)))
        self._answer(ev.request_id, wire.OffsetFetchResponse(topics=tuple(topics)))

    # ------------------------------------------------------------------ operators

    def describe(self, group_id: str) -> wire.DescribedGroup:
        group = self.groups.get(group_id)
        if group is None:
            return wire.DescribedGroup(group_id=group_id, group_state=State.DEAD.value)
        stable = group.state is State.STABLE
        protocol = group.protocol or ""
        return wire.DescribedGroup(
            group_id=group_id, group_state=group.state.value, protocol_type=group.protocol_type,
            protocol_data=protocol if stable else "",
            members=tuple(wire.DescribedGroupMember(
                member_id=m.member_id, group_instance_id=m.instance_id, client_id=m.client_id,
                client_host=m.client_host, member_metadata=m.metadata_for(protocol) if stable else b"",
                member_assignment=m.assignment if stable else b"") for m in group.members.values()))

    def listed(self, states: tuple[str, ...] = ()) -> list[wire.ListedGroup]:
        wanted = {s.lower() for s in states}
        return [wire.ListedGroup(group_id=g.group_id, protocol_type=g.protocol_type, group_state=g.state.value)
                for g in self.groups.values()
                if g.state is not State.DEAD and (not wanted or g.state.value.lower() in wanted)]

    def _describe(self, ev: Received) -> None:
        req = ev.request
        assert isinstance(req, wire.DescribeGroupsRequest)
        self._answer(ev.request_id, wire.DescribeGroupsResponse(groups=tuple(self.describe(g) for g in req.groups)))

    def _list(self, ev: Received) -> None:
        req = ev.request
        assert isinstance(req, wire.ListGroupsRequest)
        self._answer(ev.request_id, wire.ListGroupsResponse(groups=tuple(self.listed(req.states_filter))))

    def _delete(self, ev: Received) -> None:
        req = ev.request
        assert isinstance(req, wire.DeleteGroupsRequest)
        results: dict[str, ErrorCode] = {}
        recs: list[GroupRecord] = []
        deleting: list[Group] = []
        for group_id in req.groups:
            group = self.groups.get(group_id)
            if group is None or group.state is State.DEAD:
                results[group_id] = ErrorCode.GROUP_ID_NOT_FOUND
            elif group.state is not State.EMPTY:
                results[group_id] = ErrorCode.NON_EMPTY_GROUP
            else:
                group.transition(State.DEAD, self.now_ms)
                deleting.append(group)
                recs.extend(records.offset_tombstone(group_id, t, p) for t, p in sorted(group.offsets))
                recs.append(records.group_tombstone(group_id))
                results[group_id] = ErrorCode.NONE
        rid = ev.request_id

        def respond(ok: bool) -> None:
            for group in deleting:
                if ok:
                    del self.groups[group.group_id]
                else:
                    group.transition(State.EMPTY, self.now_ms)
                    results[group.group_id] = ErrorCode.NOT_COORDINATOR
            self._answer(rid, wire.DeleteGroupsResponse(results=tuple(
                wire.DeleteGroupsResult(group_id=g, error_code=results[g]) for g in req.groups)))
        if recs:
            self._write(recs, respond)
        else:
            respond(True)

    # ------------------------------------------------------------------ time

    def _tick(self) -> None:
        now = self.now_ms
        for group in list(self.groups.values()):
            for member_id, deadline in list(group.pending.items()):
                if deadline <= now:
                    del group.pending[member_id]
                    self._maybe_complete_join(group)
            for member in list(group.members.values()):
                waiting = member.join_request is not None or member.sync_request is not None
                if not waiting and member.last_heard_ms + member.session_timeout_ms <= now \
                        and member.member_id in group.members:
                    self._member_left(group, member)
            if group.state is State.PREPARING_REBALANCE and group.join_deadline_ms <= now:
                self._maybe_complete_join(group, deadline_passed=True)
        if now >= self._next_expiry_ms:
            self._next_expiry_ms = now + self.config.offsets_retention_check_interval_ms
            self._expire_offsets()

    def _expire_offsets(self) -> None:
        now, retention = self.now_ms, self.config.offsets_retention_ms
        for group in list(self.groups.values()):
            if group.state is not State.EMPTY:
                continue
            expired = [tp for tp, c in group.offsets.items()
                       if max(group.state_since_ms, c.commit_ms) + retention <= now]
            if not expired and group.offsets:
                continue
            self._drop_offsets(group, expired)

    def _topics_deleted(self, topics: frozenset[str]) -> None:
        if self._commits_in_flight:
            for topic in topics:
                self._deleted_at[topic] = self._deletions
            self._deletions += 1
        for group in list(self.groups.values()):
            gone = [tp for tp in group.offsets if tp[0] in topics]
            if gone:
                self._drop_offsets(group, gone)

    def _drop_offsets(self, group: Group, tps: list[tuple[str, int]]) -> None:
        """Forget these offsets now (nobody may read them again) and write their tombstones; an
        Empty group left with no offsets is removed too. A tombstone that fails to commit is
        written again by the same rule after the partition reloads."""
        recs = [records.offset_tombstone(group.group_id, t, p) for t, p in sorted(tps)]
        for tp in tps:
            del group.offsets[tp]
        if group.state is State.EMPTY and not group.offsets and group.group_id not in self._commits_in_flight:
            recs.append(records.group_tombstone(group.group_id))
            del self.groups[group.group_id]
        if recs:
            self._write(recs, lambda ok: None)


_HANDLERS: dict[type, Callable[[Coordinator, Received], None]] = {
    wire.JoinGroupRequest: Coordinator._join,
    wire.SyncGroupRequest: Coordinator._sync,
    wire.HeartbeatRequest: Coordinator._heartbeat,
    wire.LeaveGroupRequest: Coordinator._leave,
    wire.OffsetCommitRequest: Coordinator._commit,
    wire.OffsetFetchRequest: Coordinator._offset_fetch,
    wire.DescribeGroupsRequest: Coordinator._describe,
    wire.ListGroupsRequest: Coordinator._list,
    wire.DeleteGroupsRequest: Coordinator._delete,
}
