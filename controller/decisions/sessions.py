"""Broker sessions and the lifecycle decisions: register, fence, unfence.

Sessions live in the controller leader's memory only (never replicated). Brokers
heartbeat the followers too (liveness-only heartbeats: dataplane/broker/lifecycle.py,
`FollowerBeats`), and a follower keeps what it heard (`Hearing`), so a new leader already
knows who went quiet while it followed: such a broker's session runs from its last
heartbeat heard here, as if this node had led all along (`heard_before_start`), and one
quiet for a session timeout by then is fenced at the new leader's first look. Without it a
broker cut off together with the old leader (or killed during the election) was fenced a
session timeout plus the grace below after the new leader's start (4.7 s at the defaults),
not a session timeout after it went quiet, and its partitions waited that long for a new
leader. A silence counts only while this node was hearing the other brokers
(`Hearing.listening_since`): a follower that was itself stopped or cut off heard nobody, and
gives everyone a session from when it hears again.

A broker the new leader did not hear lately (never, as another incarnation, or not within a
session timeout and the grace: one that heartbeats another controller only) gets a session
from the leader's first look (`started_at_ms`), as Kafka's controller gives every broker on
failover, plus a grace: when the last leader lost its peers but not the brokers, heartbeats of
a broker that cannot reach this node go on to that leader until it falls back
(raft_rules.leader_fallback_s), and only then look for us.

A session times the broker, not the controller: time in which the leader itself did not
run (stopped, or kept off the CPU by a loaded machine) is given back to every session
(`credit`), since the heartbeats sent meanwhile wait unread in its sockets. Without it a
leader that resumed after 1.5 s fenced every broker at its first tick, before reading
the heartbeats that had arrived.

A broker registers fenced. It is unfenced once it heartbeats with its current
incarnation and has applied metadata up to the record that fenced it (its
registration or the FenceBroker), so it knows what it lost.
A broker that heartbeats `want_shutdown` (a controlled shutdown) is fenced at
once, its leaderships moved and its ISR places given up while it still serves,
and it is not unfenced again: it comes back only by registering anew.
A broker that registers after an unclean shutdown leaves every ISR (KIP-966:
its unflushed tail may be gone) and comes back through the leader's normal ISR
expansion. As everywhere, an ISR never empties: if it was the last member it
stays, and it is elected again when it returns (the only copy left).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from common.errors import StaleBrokerError, UnknownBrokerError
from common.metadata.image import MetadataImage
from common.metadata.records import FenceBroker, Record, RegisterBroker, UnfenceBroker
from common.requests import HeartbeatRequest, RegisterBrokerRequest
from controller.decisions.plan import Plan, without_broker

SESSION_TIMEOUT_MS = 1500


@dataclass(frozen=True, slots=True)
class Session:
    incarnation_id: str
    last_heartbeat_ms: int
    metadata_offset: int
    want_shutdown: bool = False


class Hearing:
    """The heartbeats a follower answered "not the leader", kept for its next leadership.
    Bounded by the brokers that heartbeat. Pure: handed the clock's readings.

    `gap_ms_max`: longer than this without any broker heard, this node was not hearing (it
    was stopped, starved or cut off), so a broker's silence before counts for nothing.
    `forget_ms`: a broker last heard longer ago than this, while it stayed unfenced, is one
    that does not heartbeat this node (a version before follower heartbeats, or a list of
    controllers without this one): its silence says nothing, and it gets the grace.
    `max_brokers`: how many brokers it keeps at most. It keeps brokers whose registration this
    node has not applied yet (a follower behind, or just restarted, still hears them); a
    session later uses a broker heard only if the incarnation matches its registration."""

    def __init__(self, *, gap_ms_max: int, forget_ms: int, max_brokers: int = 4096) -> None:
        if gap_ms_max <= 0 or forget_ms <= 0 or max_brokers <= 0:
            raise ValueError(f"gap_ms_max, forget_ms and max_brokers must be > 0, got {gap_ms_max}, "
                             f"{forget_ms} and {max_brokers}")
        self.gap_ms_max = gap_ms_max
        self.forget_ms = forget_ms
        self.max_brokers = max_brokers
        self._heard: dict[int, tuple[str, int]] = {}   # broker -> (incarnation, ms)
        self.listening_since: int | None = None
        self._last_any_ms: int | None = None

    def _deaf(self, now_ms: int) -> bool:
        """Whether this node heard no broker for longer than `gap_ms_max` by `now_ms`."""
        return self._last_any_ms is None or now_ms - self._last_any_ms > self.gap_ms_max

    def heard(self, broker_id: int, incarnation_id: str, now_ms: int) -> None:
        if broker_id not in self._heard and len(self._heard) >= self.max_brokers:
            self._heard = {b: v for b, v in self._heard.items() if now_ms - v[1] <= self.forget_ms}
            if len(self._heard) >= self.max_brokers:
                return   # more ids than any cluster has brokers: not a broker's to keep
        if self._deaf(now_ms):
            self.listening_since = now_ms
        self._last_any_ms = now_ms
        self._heard[broker_id] = (incarnation_id, now_ms)

    def as_of(self, now_ms: int) -> dict[int, tuple[str, int]]:
        """Broker -> (incarnation, ms from which its silence counts) at a leadership's start:
        its last heartbeat heard, but no earlier than the start of this node's unbroken
        listening (now, if it hears nobody lately); none for a broker heard longer ago than
        `forget_ms`."""
        if self._deaf(now_ms):
            since = now_ms
        else:
            assert self.listening_since is not None
            since = self.listening_since
        return {b: (inc, max(at, since)) for b, (inc, at) in self._heard.items()
                if now_ms - at <= self.forget_ms}


class BrokerSessions:
    """Last heartbeat per broker. Bounded by the number of brokers that heartbeat."""

    def __init__(self, *, session_timeout_ms: int = SESSION_TIMEOUT_MS,
                 started_at_ms: int | None = None, new_leader_grace_ms: int = 0,
                 heard_before_start: Mapping[int, tuple[str, int]] | None = None) -> None:
        if session_timeout_ms <= 0 or new_leader_grace_ms < 0:
            raise ValueError(f"session_timeout_ms must be > 0 and new_leader_grace_ms >= 0, got "
                             f"{session_timeout_ms} and {new_leader_grace_ms}")
        self.session_timeout_ms = session_timeout_ms
        self.started_at_ms = started_at_ms
        # A broker this leader has not heard from yet gets the session timeout plus this from
        # the leader's start: when the last leader lost its peers but not the brokers, they go
        # on heartbeating it until it falls back (raft_rules.leader_fallback_s), then find us.
        self.new_leader_grace_ms = new_leader_grace_ms
        # Broker -> (incarnation, when): from when the broker's silence counts, as this node
        # heard it while following (Hearing.as_of); such a broker gets no grace.
        self.heard_before_start: dict[int, tuple[str, int]] = dict(heard_before_start or {})
        self._sessions: dict[int, Session] = {}

    def _start(self, now_ms: int) -> None:
        if self.started_at_ms is None:
            self.started_at_ms = now_ms

    def heartbeat(self, broker_id: int, incarnation_id: str, now_ms: int,
                  metadata_offset: int, *, want_shutdown: bool = False) -> None:
        self._start(now_ms)
        old = self._sessions.get(broker_id)
        # A shutdown once asked for holds for the incarnation: a heartbeat without the
        # flag that was sent earlier and arrives late must not unfence it.
        if old is not None and old.incarnation_id == incarnation_id:
            want_shutdown = want_shutdown or old.want_shutdown
            # Nor does a heartbeat sent earlier take the applied offset back (a follower's copy
            # that reached the leader late: dataplane/broker/lifecycle.py, FollowerBeats).
            metadata_offset = max(metadata_offset, old.metadata_offset)
        self._sessions[broker_id] = Session(incarnation_id, now_ms, metadata_offset, want_shutdown)

    def credit(self, ms: int, now_ms: int) -> None:
        """Give `ms` back to every session (the leader did not run for that long), never
        moving a last heartbeat past `now_ms`."""
        if ms <= 0:
            return
        self._sessions = {b: replace(s, last_heartbeat_ms=min(now_ms, s.last_heartbeat_ms + ms))
                          for b, s in self._sessions.items()}
        if self.started_at_ms is not None:
            self.started_at_ms = min(now_ms, self.started_at_ms + ms)
        self.heard_before_start = {b: (inc, min(now_ms, at + ms))
                                   for b, (inc, at) in self.heard_before_start.items()}

    def shutting_down(self, broker_id: int, incarnation_id: str) -> bool:
        s = self._sessions.get(broker_id)
        return s is not None and s.incarnation_id == incarnation_id and s.want_shutdown

    def forget(self, broker_id: int) -> None:
        self._sessions.pop(broker_id, None)

    def get(self, broker_id: int) -> Session | None:
        return self._sessions.get(broker_id)

    def last_seen_ms(self, broker_id: int, incarnation_id: str, now_ms: int) -> int:
        """Last heartbeat of this incarnation: this leader's, else the last this node heard while
        following, else the sessions' start plus the new leader's grace."""
        self._start(now_ms)
        s = self._sessions.get(broker_id)
        if s is not None and s.incarnation_id == incarnation_id:
            return s.last_heartbeat_ms
        assert self.started_at_ms is not None
        heard = self.heard_before_start.get(broker_id)
        if heard is not None and heard[0] == incarnation_id:
            return heard[1]
        return self.started_at_ms + self.new_leader_grace_ms

    def is_alive(self, broker_id: int, incarnation_id: str, now_ms: int) -> bool:
        return now_ms - self.last_seen_ms(broker_id, incarnation_id, now_ms) \
            <= self.session_timeout_ms

    def expired(self, now_ms: int) -> list[int]:
        """Brokers that heartbeated once and then not within the session timeout."""
        self._start(now_ms)
        return sorted(b for b, s in self._sessions.items()
                      if now_ms - s.last_heartbeat_ms > self.session_timeout_ms)


def check_heartbeat(image: MetadataImage, request: HeartbeatRequest) -> None:
    """Raise unless the heartbeat comes from the registered incarnation."""
    info = image.brokers.get(request.broker_id)
    if info is None:
        raise UnknownBrokerError(request.broker_id)
    if info.incarnation_id != request.incarnation_id:
        raise StaleBrokerError(request.broker_id, expected=info.incarnation_id,
                               actual=request.incarnation_id)


def register_broker(image: MetadataImage, request: RegisterBrokerRequest,
                    now_ms: int) -> list[Record]:
    """Records registering a broker: fenced, its leaderships moved; out of every ISR
    after an unclean shutdown. A retry with the same incarnation changes nothing.

    The caller should also `sessions.heartbeat(...)` the new incarnation.
    """
    old = image.brokers.get(request.broker_id)
    if old is not None and old.incarnation_id == request.incarnation_id:
        return []
    plan = Plan(image)
    plan.add(RegisterBroker(
        broker_id=request.broker_id, incarnation_id=request.incarnation_id,
        host=request.host, port=request.port, rack=request.rack, priority=request.priority,
        clean_shutdown=request.clean_shutdown, at_ms=now_ms, kafka_port=request.kafka_port))
    reason = ("registered after unclean shutdown" if not request.clean_shutdown
              else "registered")
    for p in list(plan.image.partitions()):
        if request.broker_id in p.replicas:
            c = without_broker(plan.image, p, request.broker_id,
                               leave_isr=not request.clean_shutdown, reason=reason)
            if c is not None:
                plan.add(c)
    return plan.records


def fence_broker(image: MetadataImage, broker_id: int, now_ms: int, *,
                 reason: str) -> list[Record]:
    """Fence one unfenced broker: FenceBroker, then its leaderships moved and ISRs shrunk."""
    info = image.brokers.get(broker_id)
    if info is None or info.fenced:
        return []
    plan = Plan(image)
    plan.add(FenceBroker(broker_id=broker_id, at_ms=now_ms, reason=reason,
                         incarnation_id=info.incarnation_id))
    for p in list(plan.image.partitions()):
        if broker_id in p.replicas:
            c = without_broker(plan.image, p, broker_id, leave_isr=True, reason=reason)
            if c is not None:
                plan.add(c)
    return plan.records


def fence_expired(image: MetadataImage, sessions: BrokerSessions, now_ms: int) -> list[Record]:
    """Fence every unfenced broker whose current incarnation missed its session timeout."""
    plan = Plan(image)
    for broker_id in image.unfenced_broker_ids():
        info = plan.image.brokers[broker_id]
        if not sessions.is_alive(broker_id, info.incarnation_id, now_ms):
            plan.extend(fence_broker(plan.image, broker_id, now_ms, reason="session expired"))
    return plan.records


def fence_shutting_down(image: MetadataImage, sessions: BrokerSessions, now_ms: int) -> list[Record]:
    """Fence every unfenced broker whose current incarnation asked for a controlled shutdown."""
    plan = Plan(image)
    for broker_id in image.unfenced_broker_ids():
        info = plan.image.brokers[broker_id]
        if sessions.shutting_down(broker_id, info.incarnation_id):
            plan.extend(fence_broker(plan.image, broker_id, now_ms, reason="controlled shutdown"))
    return plan.records


def unfence_ready(image: MetadataImage, sessions: BrokerSessions, now_ms: int) -> list[Record]:
    """Unfence fenced brokers that heartbeat with their current incarnation and have
    applied metadata up to the record that fenced them (never one shutting down, nor one
    decommissioned)."""
    records: list[Record] = []
    for broker_id in sorted(image.brokers):
        info = image.brokers[broker_id]
        if not info.fenced or info.decommissioned:
            continue
        s = sessions.get(broker_id)
        if s is None or s.incarnation_id != info.incarnation_id or s.want_shutdown:
            continue
        if not sessions.is_alive(broker_id, info.incarnation_id, now_ms):
            continue
        caught_up = info.fenced_offset if info.fenced_offset is not None else -1
        if s.metadata_offset >= caught_up:
            records.append(UnfenceBroker(broker_id=broker_id, at_ms=now_ms,
                                         reason=f"caught up to offset {s.metadata_offset}",
                                         fenced_offset=info.fenced_offset))
    return records
