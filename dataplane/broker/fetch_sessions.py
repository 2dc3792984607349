"""Incremental follower fetch sessions (after Kafka's KIP-227), pure: no sockets, no clocks.

A follower's first fetch to a leader broker is full (every partition, asks for a
session); the leader answers with a session id and epoch 1. Each later fetch names
the session and the next epoch and carries only partitions whose position changed,
were added or were removed: an omitted partition keeps its last position. The
leader's answer carries only partitions with records or whose summary (HW, log
start, error...) changed since the last answer in this session.

Anything off (unknown id, wrong epoch, a leader restart forgets every session, a
session evicted to bound their number) is a `SessionError`: the follower forgets
its session and sends a full fetch. Never is an incremental fetch applied to
positions the two sides do not share.

A full fetch after a reset names the session it replaces, so the leader drops it at once.

ISR rule for omitted partitions: an omitted partition was fetched again at its last
position, so the leader must go on judging it. `receive` gives the whole map (sent and
omitted), and the leader steps a partition at its position when something changed there
(the driver keeps a quiet partition's last answer in the session's `notes`:
dataplane/broker/server.py). For a partition where nothing changed, `seen` says where its
follower fetches it and when it was last seen fetching (now, while a fetch of the session
waits): the replica core judges that by its one caught-up rule when its clock for the
follower would run out (dataplane/replica/events.py, Tick.fetching), so a quiet partition
costs the leader nothing between. A partition a fetch removed, or a session dropped, keeps
its word as of its last sighting: the follower did fetch there then.

`Position` and `Summary` are opaque to this module: any values compared by equality.
"""
from __future__ import annotations

import dataclasses
from types import MappingProxyType
from collections import OrderedDict
from typing import Generic, Hashable, Mapping, TypeVar

K = TypeVar("K", bound=Hashable)   # a partition
P = TypeVar("P")                   # a follower's position in it
S = TypeVar("S")                   # the leader's summary of it

NO_SESSION = 0
FULL_EPOCH = 0     # a full fetch's epoch; incremental ones count from 1
# Partitions removed from a session whose last sighting it keeps (`_LeaderSession.left`), at most.
LEFT_MAX = 4096
_UNSENT = object()


class SessionError(Exception):
    """The leader cannot apply an incremental fetch: the follower must send a full one."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason   # "unknown_session" or "wrong_epoch"


@dataclasses.dataclass(frozen=True)
class IncrementalFetch(Generic[K, P]):
    """What a follower sends: full=True carries every partition and opens a new session."""

    session_id: int
    epoch: int
    changed: Mapping[K, P]
    removed: frozenset[K]
    full: bool


@dataclasses.dataclass
class _LeaderSession(Generic[K, P, S]):
    session_id: int
    owner: int         # the follower broker's id: a session answers to it alone
    next_epoch: int
    positions: dict[K, P]
    sent: dict[K, S]   # the summary last answered per partition
    # The driver's notes on a partition at its current position (server.py keeps a quiet
    # partition's last answer there); dropped when the position changes or it leaves.
    notes: dict[K, object] = dataclasses.field(default_factory=dict)
    waiting: int = 0            # fetches of this session begun and not yet answered
    seen_ms: int | None = None  # when one last began or was answered
    # Partitions a fetch removed: where the follower last fetched each and when it was last
    # seen fetching before that (the leader's clock for it goes on from there).
    left: dict[K, tuple[P, int]] = dataclasses.field(default_factory=dict)


class LeaderSessions(Generic[K, P, S]):
    """One leader broker's sessions, at most `max_sessions` (the least recently used goes)."""

    def __init__(self, max_sessions: int = 1000, first_id: int = 1) -> None:
        if max_sessions < 1:
            raise ValueError("max_sessions must be at least 1")
        self.max_sessions = max_sessions
        self._next_id = first_id
        self._sessions: OrderedDict[int, _LeaderSession[K, P, S]] = OrderedDict()
        self._owned: dict[int, int] = {}   # follower broker -> its session (a full fetch replaces it)
        # Each follower broker's last session dropped (replaced, refused, evicted): where it held
        # its partitions and when it was last seen fetching stay true of that moment.
        self._dropped: dict[int, _LeaderSession[K, P, S]] = {}
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._sessions

    def receive(self, fetch: IncrementalFetch[K, P], owner: int) -> tuple[int, int, Mapping[K, P]]:
        """Apply a fetch from follower broker `owner`: (session id, epoch to answer with, every
        partition's position: a read-only view of the session's, not a copy of thousands per fetch).

        Raises SessionError for an incremental fetch the leader has no matching session for.
        Ids must not repeat across leader restarts (the driver seeds `first_id`), and a session
        belongs to one follower, so a stale id can never land on another follower's session."""
        if fetch.full:
            # A follower broker keeps one session per leader, so a full fetch starts its only
            # one over: every session it owns goes, not just the one it names. A restarted
            # follower, or one whose full fetch was abandoned before its answer, names none.
            for stale in [i for i, s in self._sessions.items() if s.owner == owner]:
                self._drop(stale)
            while len(self._sessions) >= self.max_sessions:
                self._drop(next(iter(self._sessions)))
                self.evicted += 1
            session_id = self._next_id
            self._next_id += 1
            session: _LeaderSession[K, P, S] = _LeaderSession(session_id, owner, 1, dict(fetch.changed), {})
            self._sessions[session_id] = session
            self._owned[owner] = session_id
            return session_id, FULL_EPOCH, MappingProxyType(session.positions)
        found = self._sessions.get(fetch.session_id)
        if found is None or found.owner != owner:
            raise SessionError("unknown_session")
        if fetch.epoch != found.next_epoch:
            # The follower's view and ours may differ: drop the session, never guess.
            self._drop(fetch.session_id)
            raise SessionError("wrong_epoch")
        self._sessions.move_to_end(fetch.session_id)
        for key in fetch.removed:
            if key in found.positions and found.seen_ms is not None:
                found.left[key] = (found.positions[key], found.seen_ms)
                if len(found.left) > LEFT_MAX:
                    # The oldest words first: one older than a lag time keeps no follower in an ISR.
                    del found.left[next(iter(found.left))]
            found.positions.pop(key, None)
            found.sent.pop(key, None)
            found.notes.pop(key, None)
        for key in fetch.changed:
            found.notes.pop(key, None)
            found.left.pop(key, None)
        found.positions.update(fetch.changed)
        epoch = found.next_epoch
        found.next_epoch += 1
        return found.session_id, epoch, MappingProxyType(found.positions)

    def _drop(self, session_id: int) -> None:
        session = self._sessions.pop(session_id)
        if self._owned.get(session.owner) == session_id:
            del self._owned[session.owner]
        if session.seen_ms is not None:
            self._dropped[session.owner] = session

    def began(self, session_id: int, at_ms: int) -> None:
        """A fetch of this session (received) waits for its answer from `at_ms`."""
        session = self._sessions.get(session_id)
        if session is not None:
            session.waiting += 1
            session.seen_ms = at_ms

    def ended(self, session_id: int, at_ms: int) -> None:
        """That fetch was answered, or given up, at `at_ms`: until then the follower was
        waiting at every position of the session."""
        session = self._sessions.get(session_id)
        if session is not None and session.waiting > 0:
            session.waiting -= 1
            session.seen_ms = at_ms

    def waiting_session(self, owner: int) -> int | None:
        """The session id of follower broker `owner` here while one of its fetches waits."""
        session_id = self._owned.get(owner)
        session = self._sessions.get(session_id) if session_id is not None else None
        return session_id if session is not None and session.waiting > 0 else None

    def seen(self, owner: int, key: K, now_ms: int, *, earlier: bool = True) -> tuple[P, int] | None:
        """Where follower broker `owner` fetches `key` in its session here, and when it was
        last seen fetching there (`now_ms` while a fetch waits); None: no session holds it.
        With `earlier`, a partition the session removed, or a session dropped (replaced by a
        full fetch that does not carry `key`, refused, evicted), keeps its word as of its last
        sighting: the follower did fetch there then, and an ISR member's clock told nothing
        would count it unseen since longer ago. Without it (a follower asking to join the ISR),
        only a session holding `key` now speaks."""
        session_id = self._owned.get(owner)
        session = self._sessions.get(session_id) if session_id is not None else None
        if session is not None and session.seen_ms is not None and key in session.positions:
            return session.positions[key], now_ms if session.waiting > 0 else session.seen_ms
        if not earlier:
            return None
        for earlier_session in (session, self._dropped.get(owner)):
            if earlier_session is None or earlier_session.seen_ms is None:
                continue
            if key in earlier_session.left:
                return earlier_session.left[key]
            if earlier_session is not session and key in earlier_session.positions:
                return earlier_session.positions[key], earlier_session.seen_ms
        return None

    def holding(self, owner: int, key: K, now_ms: int, slack_ms: int) -> int | None:
        """The id of follower broker `owner`'s session here if it holds `key` and is live (a
        fetch of it waits, or one was answered within `slack_ms`), else None."""
        session_id = self._owned.get(owner)
        if session_id is None or key not in self._sessions[session_id].positions:
            return None
        return session_id if self.live(session_id, now_ms, slack_ms) else None

    def live(self, session_id: int, now_ms: int, slack_ms: int) -> bool:
        """The session is still its follower's (not dropped or replaced) and that follower is
        fetching in it: a fetch waits, or the last was answered within `slack_ms`."""
        session = self._sessions.get(session_id)
        if session is None or session.seen_ms is None or self._owned.get(session.owner) != session_id:
            return False
        return session.waiting > 0 or now_ms - session.seen_ms <= slack_ms

    def notes(self, session_id: int) -> dict[K, object]:
        """The driver's notes on the session's partitions (see `_LeaderSession.notes`)."""
        session = self._sessions.get(session_id)
        return session.notes if session is not None else {}

    def carries(self, session_id: int, key: K, has_records: bool, summary: S) -> bool:
        """Whether an answer now would carry `key` (nothing is recorded: a long-poll asks this
        on each wake and records with `answer` when it ends)."""
        session = self._sessions.get(session_id)
        return session is None or has_records or session.sent.get(key, _UNSENT) != summary

    def answer(self, session_id: int, results: Mapping[K, tuple[bool, S]]) -> list[K]:
        """Which partitions the answer carries: `results` maps each to (has records, summary).

        A full fetch's answer (nothing sent yet) carries every partition."""
        session = self._sessions.get(session_id)
        if session is None:
            return list(results)
        carried = []
        for key, (has_records, summary) in results.items():
            if has_records or key not in session.sent or session.sent[key] != summary:
                carried.append(key)
                session.sent[key] = summary
        return carried


class FollowerSession(Generic[K, P]):
    """A follower's side of its session with one leader broker.

    The driver says what changed (`want`, `drop`) rather than handing over every partition
    each time: building an incremental fetch then costs what changed, not the session's size
    (thousands of parked partitions per leader)."""

    def __init__(self) -> None:
        self.session_id = NO_SESSION
        self.next_epoch = FULL_EPOCH
        self.wanted: dict[K, P] = {}     # every partition followed there, at its position now
        self._sent: dict[K, P] = {}      # the leader's positions, as of the last fetch it accepted
        self._touched: set[K] = set()    # wanted or dropped since the last fetch was built
        self._in_flight: IncrementalFetch[K, P] | None = None
        # The session a full fetch names so that the leader drops it (Kafka does the same):
        # without it every reset would leave a session behind until evicted.
        self._closing = NO_SESSION

    def want(self, key: K, position: P) -> None:
        self.wanted[key] = position
        self._touched.add(key)

    def drop(self, key: K) -> None:
        if self.wanted.pop(key, _UNSENT) is not _UNSENT:
            self._touched.add(key)

    def build(self) -> IncrementalFetch[K, P]:
        """The next fetch: full without a session, else what changed since the last one."""
        if self.session_id == NO_SESSION:
            fetch = IncrementalFetch(self._closing, FULL_EPOCH, dict(self.wanted), frozenset(), True)
        else:
            changed: dict[K, P] = {}
            removed: set[K] = set()
            for key in self._touched:
                if key in self.wanted:
                    p = self.wanted[key]
                    q = self._sent.get(key, _UNSENT)
                    if q is _UNSENT or (q is not p and q != p):
                        changed[key] = p
                elif key in self._sent:
                    removed.add(key)
            fetch = IncrementalFetch(self.session_id, self.next_epoch, changed, frozenset(removed), False)
        self._touched = set()
        self._in_flight = fetch
        return fetch

    @property
    def last_epoch(self) -> int:
        """The epoch of the last fetch built in this session, out or answered (-1: none since it
        started over). A fetch on another connection sent after it and before the next one names
        it, so the leader can tell which of them carries the newer word (Replica._late_fetch)."""
        return self.next_epoch if self._in_flight is not None else self.next_epoch - 1

    def answered(self, session_id: int, epoch: int) -> None:
        """The leader accepted the fetch last built."""
        fetch, self._in_flight = self._in_flight, None
        if fetch is None:
            return
        if epoch != fetch.epoch or (self.session_id != NO_SESSION and session_id != self.session_id):
            self.reset()
            return
        self.session_id = session_id
        self.next_epoch = epoch + 1
        if fetch.full:
            self._sent = dict(fetch.changed)
        else:
            self._sent.update(fetch.changed)
            for key in fetch.removed:
                self._sent.pop(key, None)
        self._closing = NO_SESSION

    def reset(self) -> None:
        """A session error, a lost connection or a leader restart: the next fetch is full."""
        if self.session_id != NO_SESSION:
            self._closing = self.session_id
        self.session_id = NO_SESSION
        self.next_epoch = FULL_EPOCH
        self._sent = {}
        self._in_flight = None
