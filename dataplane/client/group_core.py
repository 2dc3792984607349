"""One consumer's membership of a group, as a pure state machine: the client half of Kafka's
classic group protocol. No sockets, no clock, no tasks: `GroupCore.step(event)` takes an
input and returns a `Ready` of work for the driver (dataplane/client/group.py), which
performs it in this order:

1. `revoke` / `lost` — partitions the consumer must stop reading. For `revoke`, commit
   their processed positions (with auto-commit on; else the user may, in on_revoke: the
   generation is still valid), then call on_revoke; for `lost` (the generation is gone,
   a commit would be refused), call on_revoke without committing. Either way, step
   `RevocationDone` afterwards: the core sends no JoinGroup before it, so the partitions
   it lists as owned when it rejoins are the ones it still reads.
2. `assign` — partitions newly given to this member: look up their committed offsets,
   start reading them, call on_assign.
3. `send` — requests, to the group's coordinator or (FindCoordinator) to any broker.
   Step each answer back as `Answered`, each failure as `Failed`.
4. `need_partition_counts` — the leader needs every subscribed topic's partition count
   to assign: step `PartitionCounts`.
5. `fatal` — an error the consumer cannot recover from (a newer static member took our
   group_instance_id, the group refused our protocol): raise it to the user.

The rules it keeps (Kafka's consumer, ConsumerCoordinator and AbstractCoordinator):
- Coordinator discovery with FindCoordinator; NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE
  or a failed request to it forget the coordinator and ask again, after retry_backoff_ms;
  COORDINATOR_LOAD_IN_PROGRESS retries the same one after the backoff. So does a member
  whose heartbeats went unanswered for a whole session.
- Join: a first join without a member id is answered MEMBER_ID_REQUIRED with the id to
  use (KIP-394); join again with it at once. The leader (the coordinator names it)
  decodes every member's subscription, assigns with the assignor the coordinator chose,
  and sends all assignments in its SyncGroup; the others send none.
- Rejoin on REBALANCE_IN_PROGRESS; on ILLEGAL_GENERATION and UNKNOWN_MEMBER_ID the
  generation is gone, so owned partitions are `lost` (and UNKNOWN_MEMBER_ID also drops
  the member id). Heartbeat answers for an older generation are ignored.
- Eager protocol (range, roundrobin): revoke everything before each rejoin.
  Cooperative (all configured assignors cooperative, KIP-429): keep owned partitions
  through the rebalance, list them in the subscription, revoke only those the new
  assignment leaves out, and rejoin once more when any were revoked.
- Heartbeats every heartbeat_interval_ms while the member has a generation and no join
  or sync is out. A member not polled for max_poll_interval_ms leaves the group (its
  partitions are lost) and rejoins at the next poll. The leader rejoins when the partition
  count of a topic the group reads changes from the one it assigned with.
- Static membership: group_instance_id goes with every request; a static member does
  not send LeaveGroup when it closes, so a restart within the session keeps its
  partitions without a rebalance. FENCED_INSTANCE_ID is fatal.
- Close: revoke (with a commit) everything owned, then LeaveGroup (dynamic members).
Commits are built here (`commit_request`) so they carry the current generation, and
their answers are stepped back (`CommitAnswered`) so they can move the state too.
"""
from __future__ import annotations

import dataclasses
import enum
from typing import Callable, Mapping, TypeVar, dataclass_transform

from common.consumer_protocol import (
    PROTOCOL_TYPE,
    Assignment,
    ConsumerProtocolError,
    Subscription,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
)
from common.errors import ErrorCode
from common.topic_partition import TopicPartition
from common.wire import (
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupProtocol,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupMember,
    LeaveGroupRequest,
    LeaveGroupResponse,
    OffsetCommitPartition,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetCommitTopic,
    SyncGroupAssignment,
    SyncGroupRequest,
    SyncGroupResponse,
)
from dataplane.client.assignors import Assignor, GroupMember, RebalanceProtocol, rebalance_protocol

_T = TypeVar("_T")
NO_GENERATION = -1

# Errors after which the coordinator must be found again.
_COORDINATOR_GONE = frozenset({ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE})
# Errors no retry can fix: the user must change something.
_FATAL = frozenset({ErrorCode.FENCED_INSTANCE_ID, ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
                    ErrorCode.INVALID_GROUP_ID, ErrorCode.INVALID_SESSION_TIMEOUT,
                    ErrorCode.GROUP_MAX_SIZE_REACHED})


@dataclass_transform(frozen_default=True, kw_only_default=True)
def _frozen(cls: type[_T]) -> type[_T]:
    return dataclasses.dataclass(frozen=True, kw_only=True, slots=True)(cls)


# ------------------------------------------------------------------ inputs


@_frozen
class Tick:
    now_ms: int


@_frozen
class Subscribe:
    topics: tuple[str, ...]
    now_ms: int


@_frozen
class Polled:
    """The user called poll(): the member is alive, not stuck in its processing."""

    now_ms: int


@_frozen
class PartitionCounts:
    """Partition counts of topics, from the latest metadata (the ones asked for, and any others)."""

    counts: Mapping[str, int]
    now_ms: int


@_frozen
class Answered:
    request: object
    response: object
    now_ms: int


@_frozen
class Failed:
    """A request went unanswered (connection lost, timed out)."""

    request: object
    reason: str
    now_ms: int


@_frozen
class RevocationDone:
    now_ms: int


@_frozen
class CommitAnswered:
    request: OffsetCommitRequest
    response: OffsetCommitResponse
    now_ms: int


@_frozen
class Close:
    now_ms: int


@_frozen
class WantCoordinator:
    """Find the coordinator although the member has not joined (to commit or read offsets)."""

    now_ms: int


Event = Tick | Subscribe | Polled | PartitionCounts | Answered | Failed | RevocationDone | CommitAnswered | Close | \
    WantCoordinator


# ------------------------------------------------------------------ outputs


@_frozen
class Coordinator:
    node_id: int
    host: str
    port: int


@_frozen
class Send:
    """`to` None: any broker (FindCoordinator); else the coordinator."""

    request: object
    to: Coordinator | None


@_frozen
class Fatal:
    code: ErrorCode
    message: str


@dataclasses.dataclass(kw_only=True, slots=True)
class Ready:
    revoke: tuple[TopicPartition, ...] = ()
    lost: tuple[TopicPartition, ...] = ()
    assign: tuple[TopicPartition, ...] = ()
    send: list[Send] = dataclasses.field(default_factory=list)
    need_partition_counts: tuple[str, ...] = ()
    fatal: Fatal | None = None
    commit_error: ErrorCode = ErrorCode.NONE   # the first error of a CommitAnswered
    left: bool = False                          # Close is done: the member has left (or need not)


class State(enum.Enum):
    IDLE = "idle"               # no subscription yet
    REJOIN = "rejoin"           # must (re)join when the coordinator is known and revocation done
    JOINING = "joining"         # JoinGroup out
    ASSIGNING = "assigning"     # leader: waiting for partition counts to assign
    SYNCING = "syncing"         # SyncGroup out
    STABLE = "stable"
    LEAVING = "leaving"         # LeaveGroup out
    CLOSED = "closed"


@_frozen
class GroupSettings:
    group_id: str
    group_instance_id: str | None
    client_id: str
    assignors: tuple[Assignor, ...]
    session_timeout_ms: int
    heartbeat_interval_ms: int
    max_poll_interval_ms: int
    retry_backoff_ms: int = 100

    def __post_init__(self) -> None:
        if not self.group_id:
            raise ValueError("group_id must be a non-empty string")
        if not self.assignors:
            raise ValueError("at least one assignor is needed")
        if self.heartbeat_interval_ms >= self.session_timeout_ms:
            raise ValueError(f"heartbeat_interval_ms={self.heartbeat_interval_ms} must be below "
                             f"session_timeout_ms={self.session_timeout_ms} (Kafka uses a third of it)")


class GroupCore:
    def __init__(self, settings: GroupSettings, *, now_ms: int) -> None:
        self.settings = settings
        self.protocol = rebalance_protocol(settings.assignors)
        self.now_ms = now_ms
        self.state = State.IDLE
        self.topics: tuple[str, ...] = ()
        self.coordinator: Coordinator | None = None
        self.member_id = ""
        self.generation_id = NO_GENERATION
        self.leader_id = ""
        self.protocol_name: str | None = None
        self.owned: frozenset[TopicPartition] = frozenset()
        self.counts: dict[str, int] = {}
        self._counts_at_join: dict[str, int] = {}   # what the assignment was made from
        self._group_topics: frozenset[str] = frozenset()   # leader: every topic the group reads
        self._members: tuple[GroupMember, ...] = ()        # leader: the members to assign to
        self._find_out = False
        self._want_coordinator = False
        self._heartbeat_out = False
        self._revoking = False
        self._closing = False
        self._rejoin_after_sync = False
        self._retry_at_ms = now_ms        # no FindCoordinator or JoinGroup before this
        self._next_heartbeat_ms = now_ms
        self._last_heartbeat_ok_ms = now_ms
        self._last_poll_ms = now_ms
        self._ready = Ready()

    # ------------------------------------------------------------------ entry

    def step(self, event: Event) -> Ready:
        if event.now_ms < self.now_ms:
            raise ValueError(f"{type(event).__name__} went back in time: now_ms={event.now_ms} after {self.now_ms}")
        self.now_ms = event.now_ms
        handler = _HANDLERS.get(type(event))
        if handler is None:
            raise TypeError(f"{type(event).__name__} is not an input of GroupCore; expected one of "
                            f"{', '.join(t.__name__ for t in _HANDLERS)}")
        handler(self, event)
        if self.state is not State.CLOSED:
            self._advance()
        ready, self._ready = self._ready, Ready()
        return ready

    @property
    def assignment(self) -> frozenset[TopicPartition]:
        return self.owned

    @property
    def is_leader(self) -> bool:
        return bool(self.member_id) and self.leader_id == self.member_id

    @property
    def group_topics(self) -> frozenset[str]:
        """As leader: every topic the group's members read (from the last join)."""
        return self._group_topics

    @property
    def in_generation(self) -> bool:
        return self.generation_id != NO_GENERATION and bool(self.member_id)

    def wake_at_ms(self) -> int | None:
        """When a Tick next has work to do (None: only an answer or a user call can move it).
        Every time given is one at which a Tick changes something, so a driver that sleeps
        until it never spins."""
        if self.state is State.CLOSED or self._ready.fatal is not None:
            return None
        times = []
        if self.in_generation:
            times.append(self._last_poll_ms + self.settings.max_poll_interval_ms + 1)
        if self.coordinator is None:
            if not self._find_out and (self.state is not State.IDLE or self._want_coordinator):
                times.append(self._retry_at_ms)
        else:
            if self.state is State.REJOIN and not self._revoking:
                times.append(self._retry_at_ms)
            if self.in_generation and self.state in (State.STABLE, State.REJOIN) and not self._heartbeat_out:
                times.append(self._next_heartbeat_ms)
                times.append(self._last_heartbeat_ok_ms + self.settings.session_timeout_ms + 1)
        return min(times) if times else None

    def commit_request(self, offsets: Mapping[TopicPartition, int]) -> OffsetCommitRequest:
        """An OffsetCommit for `offsets` (next offset to read, per partition) in this generation;
        outside one (-1, ""), which the coordinator accepts only while the group is empty."""
        topics: dict[str, list[OffsetCommitPartition]] = {}
        for tp, offset in sorted(offsets.items()):
            topics.setdefault(tp.topic, []).append(OffsetCommitPartition(partition=tp.partition,
                                                                         committed_offset=offset))
        member_id = self.member_id if self.in_generation else ""
        return OffsetCommitRequest(group_id=self.settings.group_id, generation_id=self.generation_id,
                                   member_id=member_id, group_instance_id=self.settings.group_instance_id,
                                   topics=tuple(OffsetCommitTopic(topic=t, partitions=tuple(ps))
                                                for t, ps in topics.items()))

    # ------------------------------------------------------------------ handlers

    def _on_tick(self, ev: Tick) -> None:
        if not self.in_generation:
            return
        if self.now_ms - self._last_poll_ms > self.settings.max_poll_interval_ms and not self._closing:
            # Kafka's rule: a member stuck in its processing leaves, so the group can move on.
            self._send_leave()
            self._lose_generation(reset_member_id=True)
            self.state = State.IDLE   # back in at the next poll
            return
        if self.now_ms - self._last_heartbeat_ok_ms > self.settings.session_timeout_ms and \
                self.state in (State.STABLE, State.REJOIN) and self.coordinator is not None and \
                not self._heartbeat_out:
            self._forget_coordinator()   # silent for a whole session: find it again

    def _on_subscribe(self, ev: Subscribe) -> None:
        if self._closing:
            return
        topics = tuple(sorted(set(ev.topics)))
        if not topics:
            raise ValueError("subscribe needs at least one topic")
        changed = topics != self.topics
        self.topics = topics
        if self.state is State.IDLE or changed:
            self._request_rejoin(after_current=True)

    def _on_polled(self, ev: Polled) -> None:
        self._last_poll_ms = ev.now_ms
        if self.state is State.IDLE and self.topics and not self._closing:
            self._request_rejoin()

    def _on_counts(self, ev: PartitionCounts) -> None:
        self.counts.update(ev.counts)
        if self.state is State.ASSIGNING:
            if all(t in self.counts for t in self._group_topics):
                self._assign_and_sync()
            return
        if self.state is State.STABLE and self.leader_id == self.member_id:
            # Kafka's rule: the leader watches the counts it assigned from, for every topic the
            # group reads; a change means partitions nobody reads (or that are gone).
            if any(self.counts.get(t) != self._counts_at_join.get(t) for t in self._group_topics if t in self.counts):
                self._request_rejoin(after_current=True)

    def _on_revocation_done(self, ev: RevocationDone) -> None:
        if not self._revoking:
            raise ValueError("RevocationDone without a revocation asked for")
        self._revoking = False
        if self._closing and self.state is not State.CLOSED:
            if self.owned:
                # Closing while a revocation was under way: what it left us goes now, committed too.
                self._start_revocation(revoke=self.in_generation)
                return
            self._send_leave()
            self.generation_id = NO_GENERATION
            self._finish_close()

    def _on_close(self, ev: Close) -> None:
        if self._closing or self.state is State.CLOSED:
            return
        self._closing = True
        self.state = State.LEAVING   # answers to a join or sync still out are ignored from now
        if self._revoking:
            return   # leave once the revocation under way is done (_on_revocation_done)
        if self.owned:
            # Commit what was processed and tell the user; then leave (_on_revocation_done).
            self._start_revocation(revoke=self.in_generation)
            return
        self._send_leave()
        self.generation_id = NO_GENERATION
        self._finish_close()

    def _on_want_coordinator(self, ev: WantCoordinator) -> None:
        self._want_coordinator = True

    def _on_commit_answered(self, ev: CommitAnswered) -> None:
        codes = [p.error_code for t in ev.response.topics for p in t.partitions if p.error_code != ErrorCode.NONE]
        if not codes:
            return
        code = codes[0]
        self._ready.commit_error = code
        stale = ev.request.generation_id != self.generation_id or ev.request.member_id != self.member_id
        if stale and code in (ErrorCode.ILLEGAL_GENERATION, ErrorCode.UNKNOWN_MEMBER_ID,
                              ErrorCode.REBALANCE_IN_PROGRESS):
            return   # about a generation this member already left: the join since then stands
        self._react_to_group_error(code)

    def _on_answered(self, ev: Answered) -> None:
        handler = _ANSWERS.get(type(ev.request))
        if handler is None:
            raise TypeError(f"{type(ev.request).__name__} is not a request GroupCore sends")
        handler(self, ev.request, ev.response)

    def _on_failed(self, ev: Failed) -> None:
        request = ev.request
        if isinstance(request, FindCoordinatorRequest):
            self._find_out = False
            self._retry_at_ms = self.now_ms + self.settings.retry_backoff_ms
            return
        if isinstance(request, HeartbeatRequest):
            self._heartbeat_out = False
        if isinstance(request, LeaveGroupRequest):
            return   # leaving is best effort: the session timeout removes us anyway
        self._forget_coordinator()

    # ------------------------------------------------------------------ answers

    def _answer_find(self, request: FindCoordinatorRequest, response: FindCoordinatorResponse) -> None:
        self._find_out = False
        if response.error_code == ErrorCode.NONE and response.node_id >= 0:
            self.coordinator = Coordinator(node_id=response.node_id, host=response.host, port=response.port)
            self._last_heartbeat_ok_ms = self.now_ms
            self._retry_at_ms = self.now_ms
            return
        if response.error_code in _FATAL:
            self._fail(response.error_code, f"FindCoordinator for group {self.settings.group_id!r}: "
                                            f"{response.error_message or response.error_code.name}")
            return
        self._retry_at_ms = self.now_ms + self.settings.retry_backoff_ms

    def _answer_join(self, request: JoinGroupRequest, response: JoinGroupResponse) -> None:
        if self.state is not State.JOINING:
            return
        code = response.error_code
        if code == ErrorCode.MEMBER_ID_REQUIRED:
            self.member_id = response.member_id
            self.state = State.REJOIN
            self._retry_at_ms = self.now_ms   # KIP-394: at once, with the id
            return
        if code != ErrorCode.NONE:
            self.state = State.REJOIN
            self._react_to_group_error(code)
            if self.state is State.REJOIN:
                self._retry_at_ms = max(self._retry_at_ms, self.now_ms + self.settings.retry_backoff_ms)
            return
        self.member_id = response.member_id
        self.generation_id = response.generation_id
        self.leader_id = response.leader
        self.protocol_name = response.protocol_name
        self._last_heartbeat_ok_ms = self.now_ms
        if response.leader == response.member_id:
            members = []
            for m in response.members:
                try:
                    subscription, _ = decode_subscription(m.metadata)
                except ConsumerProtocolError:
                    subscription = Subscription(topics=())   # a member we cannot read gets nothing
                members.append(GroupMember(member_id=m.member_id, group_instance_id=m.group_instance_id,
                                           subscription=subscription))
            self._members = tuple(members)
            self._group_topics = frozenset(t for m in members for t in m.subscription.topics)
            self.state = State.ASSIGNING
            if self._group_topics:
                self._ready.need_partition_counts = tuple(sorted(self._group_topics))
            else:
                self._assign_and_sync()
            return
        self._group_topics = frozenset()
        self._send_sync(())

    def _assign_and_sync(self) -> None:
        assignor = next((a for a in self.settings.assignors if a.name == self.protocol_name), None)
        if assignor is None:
            self._fail(ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
                       f"the coordinator chose assignor {self.protocol_name!r}, which this consumer does not have "
                       f"(it has {[a.name for a in self.settings.assignors]})")
            return
        counts = {t: self.counts[t] for t in self._group_topics}
        result = assignor.assign(self._members, counts)
        self._send_sync(tuple(SyncGroupAssignment(member_id=member_id,
                                                  assignment=encode_assignment(Assignment(partitions=tuple(tps))))
                              for member_id, tps in result.items()))

    def _send_sync(self, assignments: tuple[SyncGroupAssignment, ...]) -> None:
        self.state = State.SYNCING
        self._to_coordinator(SyncGroupRequest(group_id=self.settings.group_id, generation_id=self.generation_id,
                                              member_id=self.member_id,
                                              group_instance_id=self.settings.group_instance_id,
                                              assignments=assignments))

    def _answer_sync(self, request: SyncGroupRequest, response: SyncGroupResponse) -> None:
        if self.state is not State.SYNCING or request.generation_id != self.generation_id:
            return
        if response.error_code != ErrorCode.NONE:
            self.state = State.REJOIN
            self._react_to_group_error(response.error_code)
            return
        try:
            given = frozenset(decode_assignment(response.assignment).partitions)
        except ConsumerProtocolError as exc:
            self._fail(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, f"the group's leader sent an assignment this "
                                                              f"consumer cannot read: {exc}")
            return
        self.state = State.STABLE
        self._counts_at_join = {t: self.counts[t] for t in self._group_topics if t in self.counts}
        self._next_heartbeat_ms = self.now_ms + self.settings.heartbeat_interval_ms
        self._last_heartbeat_ok_ms = self.now_ms
        revoked = self.owned - given
        added = given - self.owned
        self.owned = given
        if added:
            self._ready.assign = tuple(sorted(added))
        if revoked:
            # Cooperative only (an eager member owns nothing here): give them up, then rejoin
            # so the partitions reach their new member.
            self._ready.revoke = tuple(sorted(revoked))
            self._revoking = True
        if revoked or self._rejoin_after_sync:
            self._rejoin_after_sync = False
            self._request_rejoin()

    def _answer_heartbeat(self, request: HeartbeatRequest, response: HeartbeatResponse) -> None:
        self._heartbeat_out = False
        if request.generation_id != self.generation_id or request.member_id != self.member_id:
            return   # about a generation we already left
        if response.error_code == ErrorCode.NONE:
            self._last_heartbeat_ok_ms = self.now_ms
            return
        self._last_heartbeat_ok_ms = self.now_ms if response.error_code == ErrorCode.REBALANCE_IN_PROGRESS \
            else self._last_heartbeat_ok_ms
        self._react_to_group_error(response.error_code)

    def _answer_leave(self, request: LeaveGroupRequest, response: LeaveGroupResponse) -> None:
        pass   # nothing depends on it: the member already let its partitions go

    # ------------------------------------------------------------------ shared rules

    def _react_to_group_error(self, code: ErrorCode) -> None:
        if code in _FATAL:
            self._fail(code, _FATAL_TEXT.get(code, code.name))
        elif code in _COORDINATOR_GONE:
            self._forget_coordinator()
        elif code == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS:
            self._retry_at_ms = self.now_ms + self.settings.retry_backoff_ms
        elif code == ErrorCode.REBALANCE_IN_PROGRESS:
            self._request_rejoin()
        elif code in (ErrorCode.ILLEGAL_GENERATION, ErrorCode.UNKNOWN_MEMBER_ID):
            self._lose_generation(reset_member_id=code == ErrorCode.UNKNOWN_MEMBER_ID)
            self._request_rejoin()

    def _request_rejoin(self, *, after_current: bool = False) -> None:
        """`after_current`: what the join under way (if any) sent is out of date, so join once more
        after it (a new subscription, new partition counts); otherwise that join will do."""
        if self._closing or self.state in (State.CLOSED, State.LEAVING):
            return
        if self.state in (State.JOINING, State.SYNCING, State.ASSIGNING):
            self._rejoin_after_sync = self._rejoin_after_sync or after_current
            return
        self.state = State.REJOIN
        if self.protocol is RebalanceProtocol.EAGER and self.owned and not self._revoking:
            self._start_revocation(revoke=self.in_generation)

    def _start_revocation(self, *, revoke: bool) -> None:
        partitions = tuple(sorted(self.owned))
        self.owned = frozenset()
        self._revoking = True
        if revoke:
            self._ready.revoke = partitions
        else:
            self._ready.lost = partitions

    def _lose_generation(self, *, reset_member_id: bool) -> None:
        self.generation_id = NO_GENERATION
        if self.state in (State.JOINING, State.ASSIGNING, State.SYNCING):
            self.state = State.REJOIN   # answers to that round would not match us any more
        if reset_member_id:
            self.member_id = ""
        if self.owned and not self._revoking:
            self._start_revocation(revoke=False)

    def _forget_coordinator(self) -> None:
        self.coordinator = None
        self._heartbeat_out = False
        if self.state in (State.JOINING, State.ASSIGNING, State.SYNCING):
            self.state = State.REJOIN   # that round is lost with the coordinator: join the next one
        self._retry_at_ms = max(self._retry_at_ms, self.now_ms + self.settings.retry_backoff_ms)

    def _fail(self, code: ErrorCode, message: str) -> None:
        self._ready.fatal = Fatal(code=code, message=f"group {self.settings.group_id!r}: {message}")
        self.state = State.CLOSED

    def _finish_close(self) -> None:
        self.state = State.CLOSED
        self._ready.left = True

    def _to_coordinator(self, request: object) -> None:
        assert self.coordinator is not None, "a request for the coordinator before one is known"
        self._ready.send.append(Send(request=request, to=self.coordinator))

    def _send_leave(self) -> None:
        if self.member_id and self.coordinator is not None and self.settings.group_instance_id is None:
            self._to_coordinator(LeaveGroupRequest(group_id=self.settings.group_id,
                                                   members=(LeaveGroupMember(member_id=self.member_id),)))

    def _subscription(self) -> bytes:
        owned = tuple(sorted(self.owned)) if self.protocol is RebalanceProtocol.COOPERATIVE else ()
        return encode_subscription(Subscription(topics=self.topics, owned_partitions=owned,
                                                generation_id=self.generation_id))

    # ------------------------------------------------------------------ what to do next

    def _advance(self) -> None:
        if self._ready.fatal is not None:
            return
        if self.coordinator is None:
            if not self._find_out and self.now_ms >= self._retry_at_ms and \
                    (self.state is not State.IDLE or self._want_coordinator):
                self._find_out = True
                self._ready.send.append(Send(request=FindCoordinatorRequest(key=self.settings.group_id), to=None))
            return
        if self.state is State.REJOIN and not self._revoking and self.now_ms >= self._retry_at_ms:
            self.state = State.JOINING
            self._heartbeat_out = False
            metadata = self._subscription()
            self._to_coordinator(JoinGroupRequest(
                group_id=self.settings.group_id, session_timeout_ms=self.settings.session_timeout_ms,
                rebalance_timeout_ms=self.settings.max_poll_interval_ms, member_id=self.member_id,
                group_instance_id=self.settings.group_instance_id, protocol_type=PROTOCOL_TYPE,
                protocols=tuple(JoinGroupProtocol(name=a.name, metadata=metadata) for a in self.settings.assignors),
                client_id=self.settings.client_id))
            return
        if self.in_generation and self.state in (State.STABLE, State.REJOIN) and not self._heartbeat_out \
                and self.now_ms >= self._next_heartbeat_ms:
            self._heartbeat_out = True
            self._next_heartbeat_ms = self.now_ms + self.settings.heartbeat_interval_ms
            self._to_coordinator(HeartbeatRequest(group_id=self.settings.group_id, generation_id=self.generation_id,
                                                  member_id=self.member_id,
                                                  group_instance_id=self.settings.group_instance_id))


_FATAL_TEXT = {
    ErrorCode.FENCED_INSTANCE_ID: "another consumer joined with the same group_instance_id and fenced this one; "
                                  "give each consumer its own group_instance_id",
    ErrorCode.INCONSISTENT_GROUP_PROTOCOL: "the group's members use another protocol type or no assignor in "
                                           "common with this consumer's partition_assignment_strategy",
    ErrorCode.INVALID_SESSION_TIMEOUT: "session_timeout_ms is outside what the brokers allow",
    ErrorCode.GROUP_MAX_SIZE_REACHED: "the group has as many members as the brokers allow",
    ErrorCode.INVALID_GROUP_ID: "the group id is not valid",
}

_HANDLERS: dict[type, Callable[..., None]] = {
    Tick: GroupCore._on_tick, Subscribe: GroupCore._on_subscribe, Polled: GroupCore._on_polled,
    PartitionCounts: GroupCore._on_counts, Answered: GroupCore._on_answered, Failed: GroupCore._on_failed,
    RevocationDone: GroupCore._on_revocation_done, CommitAnswered: GroupCore._on_commit_answered,
    Close: GroupCore._on_close, WantCoordinator: GroupCore._on_want_coordinator,
}
_ANSWERS: dict[type, Callable[..., None]] = {
    FindCoordinatorRequest: GroupCore._answer_find, JoinGroupRequest: GroupCore._answer_join,
    SyncGroupRequest: GroupCore._answer_sync, HeartbeatRequest: GroupCore._answer_heartbeat,
    LeaveGroupRequest: GroupCore._answer_leave,
}
