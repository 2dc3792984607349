"""Pull replication: one fetch session per leader broker for every partition followed there.

The cores say what to fetch (a FetchRequest per partition, the latest one
wins); a session batches them into one wire FETCH that long-polls the leader
for up to `fetch_wait_ms_max`, and feeds each partition's answer back into its
core as a FetchResponse (translations: codec.py).

The long-poll is incremental (after Kafka's KIP-227, fetch_sessions.py): the first
fetch to a leader is full and opens a session there; later ones carry only the
partitions whose request changed (position, epoch, flushed offset) and name those
no longer followed, and the leader answers only partitions with news. A request the
answer omits stays parked in the session, unsent, until an answer comes, its core asks anew,
or the broker says its replica no longer follows that leader (`follows`); its core is told
the leader holds it (FetchHeld) and sets no timer to ask again.
A session error (the leader restarted, evicted the session, saw
another epoch), a broken connection or an abandoned long-poll makes the next fetch
full. The express fetch (below) is outside the session: its answer carries all it asked.

A connection answers requests in order, so while the long-poll waits a
follower's fresh news (its flushed offset moved: the leader may be holding
acks=all for it) would wait too. Such a request goes out at once on a second
"express" connection with no wait — only when it says something the waiting
long-poll does not (another position or flushed offset), so the express path
never spins on repeats. For a partition that starts following this leader while the
long-poll waits, the fetcher asks the leader to end the long-poll at once (an express fetch
naming no partition), and the next, incremental, one carries it. Closing the long-poll's
connection instead would leave the leader's session state unknown, and the next fetch full.
A partition the leader refused (an error other than "not served yet") leaves the session, and
its next ask goes express while the leader goes on refusing it. Express stays the exception: a
partition answered without a new position (a new HW) stays parked, and after an answer with
records the next long-poll waits (up to `REJOIN_WAIT_S`) for those partitions' cores to ask
again, which under acks=all is once the records are flushed: it carries their new position
and flushed offset, one request per produce, all in the session.

Throttle: partitions this broker is adding by a reassignment are paced by the
`ReplicationThrottle` (throttle.py): while the throttle says wait, they stay pending
(neither loop sends them) and the main loop wakes when the wait is over; their fetch size
is capped so one answer does not overshoot, and the bytes they receive are counted.

Errors: a partition-level error is delivered after `fetch_error_backoff_ms`
(the core asks again as soon as it hears). A partition its leader is still opening, or whose
epoch start it has not stored yet (LEADER_NOT_AVAILABLE), waits in the session instead: the
leader holds it there and answers when it serves it (RequestHandler.replica_opened), so its
core is told the request is held. Asked again after a backoff (50 ms, then doubling up to
800), the partitions of 10,000 being opened were refused 11,000-19,000 times per broker, a
round on both sides each. A broken connection puts the
requests back, backs off (doubling up to `reconnect_backoff_ms_max`) and
reconnects to the leader's address as the metadata says then.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import Callable, Collection, Mapping

from common.errors import BiplaneError, ErrorCode
from common.tasks import cancel_and_wait
from common.topic_partition import TopicPartition
from common.wire import WireClient
from common.wire import messages as wire
from dataplane.broker.codec import fetch_answer_from_wire, fetch_failed, fetch_to_wire
from dataplane.broker.fetch_sessions import FollowerSession
from dataplane.broker.throttle import ReplicationThrottle
from dataplane.replica.events import FetchHeld, FetchRequest, FetchResponse

log = logging.getLogger("biplane.broker.fetcher")

AddressOf = Callable[[int], "tuple[str, int] | None"]
Deliver = Callable[[TopicPartition, FetchResponse | FetchHeld], None]
Heard = Callable[[int], None]
Follows = Callable[[TopicPartition, int], bool]
SessionFetched = Callable[[int, bool, int], None]   # (leader, full, partitions carried) of each session fetch
# A parked request whose replica stopped following that leader is dropped within this
# (Fetcher.follows): checking every parked request on every round was a walk of them all.
# Only the partitions whose replica changed role, epoch or liveness since the last check are
# looked at (`follows_changed`): at thousands of idle partitions a walk a second was 1% of a
# core, and a walk of the whole session after any change (a topic created elsewhere) held the
# loop 10-17 ms.
FOLLOWS_CHECK_S = 1.0
# (version last checked, or None at first) -> (current version, partitions changed since, or
# None when unknown: look at all).
FollowsChanged = Callable[[int | None], "tuple[int, Collection[TopicPartition] | None]"]
# How long the next long-poll waits for the partitions just answered with records to ask
# again (FetchSession._await_next_requests): about a small flush's fsync, so a slow disk
# delays the other partitions' long-poll by no more than this.
REJOIN_WAIT_S = 0.1
SESSION_ERRORS = {ErrorCode.FETCH_SESSION_ID_NOT_FOUND: "unknown_session",
                  ErrorCode.INVALID_FETCH_SESSION_EPOCH: "wrong_epoch"}


class Fetcher:
    def __init__(self, *, broker_id: int, address_of: AddressOf, deliver: Deliver, fetch_wait_ms_max: int = 500,
                 fetch_max_bytes: int = 8 * 1024 * 1024, fetch_error_backoff_ms: int = 50,
                 reconnect_backoff_ms_max: int = 1000, request_timeout_ms: int = 10_000,
                 max_frame_bytes: int = 64 * 1024 * 1024,
                 on_round_trip: Callable[[float], None] | None = None, heard: Heard | None = None,
                 on_session_fetch: SessionFetched | None = None,
                 on_session_error: Callable[[str], None] | None = None,
                 follows: Follows | None = None, follows_changed: FollowsChanged | None = None) -> None:
        self.broker_id = broker_id
        # Seconds from sending a fetch to its answer, for each answer that brought records
        # (an empty one measured the long-poll's wait, not replication).
        self.on_round_trip = on_round_trip
        self.heard = heard   # told the leader's id on every answer (dataplane/broker/contact.py)
        self.on_session_fetch = on_session_fetch
        self.on_session_error = on_session_error   # told the reason of each session error heard
        # Whether a partition's replica here still follows that leader (open, not failed):
        # a parked request outlives its core otherwise, and the leader would go on counting
        # a dead replica as caught up while the partition is idle.
        self.follows = follows
        self.follows_changed = follows_changed   # where a `follows` answer may have changed
        self.address_of = address_of
        self.deliver = deliver
        self.limits = dict(fetch_wait_ms_max=fetch_wait_ms_max, fetch_max_bytes=fetch_max_bytes,
                           fetch_error_backoff_ms=fetch_error_backoff_ms,
                           reconnect_backoff_ms_max=reconnect_backoff_ms_max,
                           request_timeout_ms=request_timeout_ms, max_frame_bytes=max_frame_bytes)
        self.sessions: dict[int, FetchSession] = {}
        self._leader_of: dict[TopicPartition, int] = {}   # the session each partition last asked in
        self.throttle = ReplicationThrottle()

    def configure_throttle(self, rate_bytes_per_s: int | None, partitions: frozenset[TopicPartition]) -> None:
        """From the metadata: the cluster's reassignment throttle and the partitions it paces.
        Told on every metadata image; the sessions are rewired only when either changed."""
        if (rate_bytes_per_s, partitions) == (self.throttle.rate_bytes_per_s, self.throttle.keys):
            return
        self.throttle.configure(rate_bytes_per_s, partitions)
        for session in self.sessions.values():
            session.rewire()
            session.wake()

    def left(self, tp: TopicPartition, leader_id: int) -> None:
        """`tp` no longer follows `leader_id` (closed, led elsewhere): forget where it asked."""
        if self._leader_of.get(tp) == leader_id:
            del self._leader_of[tp]

    def held(self, tp: TopicPartition) -> bool:
        """Whether the throttle keeps `tp` out of fetches now."""
        return self.throttle.applies(tp) and self.throttle.wait_s(time.monotonic()) > 0

    def submit(self, leader_id: int, tp: TopicPartition, request: FetchRequest) -> None:
        if leader_id == self.broker_id:
            return  # the core never fetches from itself; be safe
        session = self.sessions.get(leader_id)
        if session is None:
            session = self.sessions[leader_id] = FetchSession(self, leader_id)
        # A partition follows one leader at a time: drop its requests queued elsewhere (only
        # when it asks another leader than last time: an idle follower asks its own again).
        if self._leader_of.get(tp) != leader_id:
            self._leader_of[tp] = leader_id
            for other in self.sessions.values():
                if other is not session:
                    other.forget(tp)
        session.submit(tp, request)

    async def close(self) -> None:
        for session in list(self.sessions.values()):
            await session.close()
        self.sessions.clear()


class FetchSession:
    def __init__(self, fetcher: Fetcher, leader_id: int) -> None:
        self.fetcher = fetcher
        self.leader_id = leader_id
        self.limits = fetcher.limits
        self.pending: dict[TopicPartition, FetchRequest] = {}
        self._main_busy = False
        self._main_rounds = 0     # session fetches sent so far
        self._nudged = -1         # the one the leader was last asked to end (_main_rounds then)
        # Left the session answered with an error: the core's next ask goes express, as the
        # leader may refuse it again (its metadata or ours behind): joining, it would end the
        # long-poll once per error backoff for as long as that lasts.
        self._refused: set[TopicPartition] = set()
        self._last_sent: dict[TopicPartition, FetchRequest] = {}   # by either loop
        self._follows_checked_s = 0.0
        self._follows_checked_version: int | None = None
        # Answered with records, by the request answered: the next long-poll waits for their next.
        self._awaited: dict[TopicPartition, FetchRequest] = {}
        # The requests pending when the last long-poll's answer came: a core's repeat sent
        # before it is answered already; one sent after is its next request, at any position.
        self._pending_at_answer: dict[TopicPartition, FetchRequest] = {}
        # The long-poll is an incremental fetch session: the leader keeps each partition's
        # position and answers only what changed. Every partition the session carries, by the
        # request the leader has for it; one left unanswered stays (parked, unsent) until its
        # core asks anew or an answer moves it on. A round costs what changed, not this size.
        self.session: FollowerSession[TopicPartition, wire.FetchPartition] = FollowerSession()
        self._in_session: dict[TopicPartition, FetchRequest] = {}
        # Express requests for partitions of the long-poll in flight: they replace the
        # session's once it ends (its answer is for the request it carried).
        self._overtaken: dict[TopicPartition, FetchRequest] = {}
        self._wake = asyncio.Event()      # the main loop's: something is pending
        self._wake_exp = asyncio.Event()  # the express loop's: something new arrived
        self._clients: dict[str, WireClient | None] = {"main": None, "express": None}
        self._failed = {"main": 0, "express": 0}   # rounds each connection failed so far
        self._backoff_ms = 0
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._main_loop()), loop.create_task(self._express_loop())]

    def submit(self, tp: TopicPartition, request: FetchRequest) -> None:
        self.pending[tp] = request
        self._wake.set()
        if not self._main_busy:
            return
        # Express only ever sends while a long-poll is out, never a repeat of what the long-poll
        # carries (a core not yet told its request is held asks again after fetch_retry_ms),
        # and asks the leader to end a long-poll once: waking it for nothing cost a look at
        # everything pending, thousands a second (and newcomers wait there until the long-poll ends).
        if tp in self._in_session:
            if not self._repeats_sent(tp, request):
                self._wake_exp.set()
        elif tp in self._refused or self._nudged != self._main_rounds:
            self._wake_exp.set()

    def wake(self) -> None:
        self._wake.set()
        self._wake_exp.set()

    def forget(self, tp: TopicPartition) -> None:
        """`tp` follows another leader now, or none: the next fetch here drops it from the session,
        and nothing of it is kept here."""
        self.pending.pop(tp, None)
        self._leave(tp)
        self._refused.discard(tp)
        self._last_sent.pop(tp, None)
        if self._awaited.pop(tp, None) is not None:
            self._wake.set()

    def rewire(self) -> None:
        """The throttle changed: the session's partitions are told again with their fetch size
        as it says now (those it left as they were do not travel)."""
        for tp, request in self._in_session.items():
            self.session.want(tp, self._wire_partition(tp, request))

    def _join(self, tp: TopicPartition, request: FetchRequest) -> None:
        self._refused.discard(tp)
        self._in_session[tp] = request
        self.session.want(tp, self._wire_partition(tp, request))

    def _leave(self, tp: TopicPartition) -> None:
        self._in_session.pop(tp, None)
        self._overtaken.pop(tp, None)
        self.session.drop(tp)

    # ------------------------------------------------------------ loops

    async def _next_batch(self) -> dict[TopicPartition, FetchRequest]:
        """The pending requests the throttle lets go now (waits until there is one, unless
        the session has partitions to long-poll for)."""
        while True:
            throttled = self.fetcher.throttle.active
            held = {tp for tp in self.pending if self.fetcher.held(tp)} if throttled else set()
            for tp in [tp for tp in self._in_session if self.fetcher.held(tp)] if throttled else ():
                # Out of the session while the throttle holds it (it rejoins when let go).
                self.pending.setdefault(tp, self._in_session[tp])
                self._leave(tp)
                held.add(tp)
            if len(held) < len(self.pending) or self._in_session:
                batch = {tp: r for tp, r in self.pending.items() if tp not in held}
                self.pending = {tp: r for tp, r in self.pending.items() if tp in held}
                return batch
            self._wake.clear()
            if not held:
                await self._wake.wait()
                continue
            try:
                async with asyncio.timeout(max(0.001, self.fetcher.throttle.wait_s(time.monotonic()))):
                    await self._wake.wait()
            except TimeoutError:
                pass

    async def _main_loop(self) -> None:
        while True:
            news = await self._next_batch()
            for tp, request in news.items():
                # Asked after any express request of it still waiting to join: that one would
                # put the session back behind what this round carries once the round ends.
                self._overtaken.pop(tp, None)
                self._join(tp, request)
            # After the news joined: a newcomer whose replica went meanwhile is looked at with
            # the rest (checked before, out of the session for that look, it stayed for good).
            self._check_follows()
            self._main_busy = True
            self._main_rounds += 1
            try:
                answered = await self._round("main", news, self.limits["fetch_wait_ms_max"])
            finally:
                self._main_busy = False
                self._wake.set()
            # The requests answered with records (delivered: still in the session).
            rejoining = {tp: self._in_session[tp] for tp, a in answered.items()
                         if a.records and tp in self._in_session}
            for tp, request in self._overtaken.items():
                self._join(tp, request)
            self._overtaken.clear()
            # Answered and moved on (records, an error, a divergence): its core asks anew.
            # Answered with a new HW alone, held until the leader serves it, or omitted: it
            # stays in the session.
            moved = [tp for tp, a in answered.items() if not _stays(a)]
            if rejoining:
                await self._await_next_requests(rejoining)
            for tp in moved:
                if tp not in self.pending:
                    self._leave(tp)
                    if answered[tp].error_code is not ErrorCode.NONE:
                        self._refused.add(tp)

    def _check_follows(self) -> None:
        """Forget the parked requests whose replica no longer follows this leader, and the
        partitions it refused whose replica went meanwhile (at most every FOLLOWS_CHECK_S, looking
        only at the partitions that changed since the last look)."""
        follows = self.fetcher.follows
        if follows is None or time.monotonic() - self._follows_checked_s < FOLLOWS_CHECK_S:
            return
        changed_since = self.fetcher.follows_changed
        if changed_since is None:
            look: Collection[TopicPartition] | None = None
        else:
            version, look = changed_since(self._follows_checked_version)
            if version == self._follows_checked_version:
                return
            self._follows_checked_version = version
        self._follows_checked_s = time.monotonic()
        if look is None:
            candidates = [*self._in_session, *self._refused]
        else:
            candidates = [tp for tp in look if tp in self._in_session or tp in self._refused]
        for tp in [tp for tp in candidates if not follows(tp, self.leader_id)]:
            self.forget(tp)
            self.fetcher.left(tp, self.leader_id)

    async def _await_next_requests(self, answered: dict[TopicPartition, FetchRequest]) -> None:
        """Hold the next long-poll until the cores of the partitions just `answered` with records
        ask again, for at most REJOIN_WAIT_S. A repeat of the request answered, sent before the
        answer came, is answered already: it is dropped. A request sent after it is the core's
        next, even from the same position (a full disk left the records unapplied).

        A caught-up follower under acks=all asks again only once the records are flushed
        (its fetch carries the flushed offset the leader waits for). A long-poll sent
        without it would drop the partition from the session; its request would then have to
        end the long-poll to join again (abandoned, as once, it made the next session fetch
        full: one full fetch of every partition per record produced)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + REJOIN_WAIT_S
        self._awaited = dict(answered)
        try:
            await asyncio.sleep(0)   # a small flush runs inline a loop turn later
            while any(not self._asked_again(tp, r) for tp, r in self._awaited.items()):
                self._wake.clear()
                try:
                    async with asyncio.timeout(max(0.0, deadline - loop.time())):
                        await self._wake.wait()
                except TimeoutError:
                    break
        finally:
            self._awaited = {}
        for tp, request in answered.items():
            if tp in self.pending and not self._asked_again(tp, request):
                del self.pending[tp]   # asked before the records came: answered already
        self._pending_at_answer = {}

    def _asked_again(self, tp: TopicPartition, answered: FetchRequest) -> bool:
        newer = self.pending.get(tp)
        if newer is None:
            return False
        return newer is not self._pending_at_answer.get(tp) or _asked_at(newer) != _asked_at(answered)

    def _express_ok(self, tp: TopicPartition, request: FetchRequest) -> bool:
        """News of a partition in the session that the waiting long-poll does not carry (a new
        flushed offset, a new position); a repeat of what was sent waits for the long-poll to
        end, so nothing spins. The ask of one the leader refused (`_refused`). A newcomer joins
        the session instead (_joining)."""
        if self.fetcher.held(tp):
            return False
        if tp in self._in_session:
            return not self._repeats_sent(tp, request)
        return tp in self._refused

    def _joining(self) -> bool:
        """Whether a partition waits to join the session while its long-poll is out, and the
        leader has not been asked to end that long-poll yet."""
        return (self._main_busy and self._nudged != self._main_rounds
                and any(tp not in self._in_session and tp not in self._refused and not self.fetcher.held(tp)
                        for tp in self.pending))

    def _repeats_sent(self, tp: TopicPartition, request: FetchRequest) -> bool:
        """A request of a partition in the session from the position it was last sent at."""
        if tp not in self._in_session:
            return False
        last = self._last_sent.get(tp)
        return last is not None and _position(request) == _position(last)

    def _express_ready(self) -> bool:
        return self._main_busy and any(self._express_ok(tp, r) for tp, r in self.pending.items())

    async def _express_loop(self) -> None:
        while True:
            while not (self._express_ready() or self._joining()):
                await self._wake_express()
            batch = {tp: r for tp, r in self.pending.items() if self._express_ok(tp, r)}
            if batch:
                for tp, request in batch.items():
                    del self.pending[tp]
                    if tp in self._in_session:
                        self._overtaken[tp] = request
                answered = await self._round("express", batch, 0)
                for tp in batch:
                    a = answered.get(tp)
                    if a is not None and (a.error_code is ErrorCode.NONE or _not_served_yet(a)):
                        # Served, or to be held by a session until it is: it joins from now on.
                        self._refused.discard(tp)
            if self._joining():
                # Ask the leader to end the long-poll now (a fetch naming no partition): the
                # next one carries the newcomers, and the leader holds each there until it
                # serves it. Abandoning the long-poll (closing its connection) made the next
                # session fetch full, of every partition followed there; fetching a newcomer
                # express first cost a round more, and while thousands of partitions opened
                # most of those were refused (the leader not serving them yet).
                nudged = self._nudged = self._main_rounds
                failed = self._failed["express"]
                await self._round("express", {}, 0)
                if self._failed["express"] != failed and self._nudged == nudged:
                    self._nudged = -1   # it failed (and _broken backed off): ask again

    async def _wake_express(self) -> None:
        self._wake_exp.clear()
        await self._wake_exp.wait()

    async def _round(self, which: str, batch: dict[TopicPartition, FetchRequest],
                     wait_ms: int) -> dict[TopicPartition, wire.FetchPartitionResponse]:
        """One wire FETCH; every answer is delivered. Returns the answers.

        The express loop's asks for `batch`. The main loop's is a session fetch for every
        partition of the session (`batch`: those that joined it or asked anew for this one);
        it carries only what changed since the last."""
        in_session = which == "main"
        for tp, request in batch.items():
            self._last_sent[tp] = request
        if log.isEnabledFor(logging.DEBUG):
            log.debug("fetch %s from broker %d: %s", which, self.leader_id,
                      {f"{t}-{p}": r.fetch_offset for (t, p), r in batch.items()})
        # Built before any wait for a connection: while the main loop is busy its session fetch
        # is built, so an express fetch can say which one it was sent after (_wire_request).
        message = self._session_request(wait_ms) if in_session else self._wire_request(batch, wait_ms)
        try:
            client = await self._client(which)
            timeout_s = (wait_ms + self.limits["request_timeout_ms"]) / 1000
            # asyncio.timeout, not wait_for: no task per round between the request and its write.
            sent = time.perf_counter()
            async with asyncio.timeout(timeout_s):
                response = await client.request(message)
            took_s = time.perf_counter() - sent
        except (BiplaneError, OSError, asyncio.TimeoutError) as exc:
            if in_session:
                self.session.reset()   # the leader may or may not have applied it
            # A session's partitions stay in it: the next fetch, full, carries them again.
            await self._broken(which, {} if in_session else batch, exc)
            return {}
        self._backoff_ms = 0
        if self.fetcher.heard is not None:
            self.fetcher.heard(self.leader_id)
        if in_session and response.error_code in SESSION_ERRORS:
            # The leader restarted, evicted our session or saw another epoch: start over at
            # once with a full fetch of the same requests (nothing was answered).
            reason = SESSION_ERRORS[response.error_code]
            log.info("fetch session with broker %d refused (%s): the next fetch is full", self.leader_id, reason,
                     extra={"event": "fetch.session_reset", "leader": self.leader_id, "reason": reason})
            if self.fetcher.on_session_error is not None:
                self.fetcher.on_session_error(reason)
            self.session.reset()
            return {}
        if response.error_code is not ErrorCode.NONE:
            if in_session:
                # Every partition of the session hears the error; their cores ask anew.
                self.session.reset()
                batch = dict(self._in_session)
                for tp in batch:
                    self._leave(tp)
            self._deliver_later(batch, {}, error=response.error_code)
            return {}
        if in_session:
            self.session.answered(response.session_id, message.session_epoch)
        answered: dict[TopicPartition, wire.FetchPartitionResponse] = {}
        records = False
        for t in response.topics:
            for p in t.partitions:
                answered[TopicPartition(t.topic, p.partition)] = p
                records = records or bool(p.records)
        if records and self.fetcher.on_round_trip is not None:
            self.fetcher.on_round_trip(took_s)
        if in_session:
            self._pending_at_answer = {tp: self.pending[tp] for tp in answered if tp in self.pending}
            # Each answer is for the request the session carried (an express one that
            # overtook it joins the session after this).
            self._deliver({tp: self._in_session[tp] for tp in answered if tp in self._in_session}, answered)
            # The requests this fetch brought into the session that its answer omits: the
            # leader holds them now, and answers when something changes there (a broken
            # session resends them). Their cores need not ask again on their timers.
            for tp, request in batch.items():
                if tp not in answered and self._in_session.get(tp) is request:
                    self._tell_held(tp, request)
        else:
            self._deliver(batch, answered)
        return answered

    # ------------------------------------------------------------ messages

    def _wire_partition(self, tp: TopicPartition, r: FetchRequest) -> wire.FetchPartition:
        p = fetch_to_wire(tp[1], r)
        throttle = self.fetcher.throttle
        if throttle.applies(tp):
            return dataclasses.replace(p, partition_max_bytes=throttle.partition_fetch_bytes(p.partition_max_bytes))
        return p

    def _wire_request(self, batch: dict[TopicPartition, FetchRequest], wait_ms: int) -> wire.FetchRequest:
        """A fetch outside the session (the express one): the leader answers every partition.
        It names the last session fetch sent before it (the session's id and that fetch's
        epoch, whether it is out or answered already): the two travel on two connections, and
        the leader tells by these which was sent first (Replica._late_fetch). It named the next
        epoch, which is the one out only while a session fetch is out: the express loop sends
        only then, but with its news sent after awaiting a request to end the long-poll (as it
        once was), the session fetch sent after it, with newer news, looked older, and the leader
        dropped that news (a follower's flushed offset: out of the ISR for good). One naming no
        partition asks the leader to end the session fetch it names now (one answered already
        ends nothing; after a session reset it names none)."""
        return wire.FetchRequest(
            replica_id=self.fetcher.broker_id, max_wait_ms=wait_ms, min_bytes=1,
            max_bytes=self.limits["fetch_max_bytes"],
            topics=_by_topic({tp: self._wire_partition(tp, r) for tp, r in batch.items()}),
            session_id=self.session.session_id, session_epoch_out=self.session.last_epoch)

    def _session_request(self, wait_ms: int) -> wire.FetchRequest:
        """The session's next fetch (what changed in it since the last)."""
        fetch = self.session.build()
        forgotten: dict[str, list[int]] = {}
        for topic, partition in fetch.removed:
            forgotten.setdefault(topic, []).append(partition)
        if self.fetcher.on_session_fetch is not None:
            self.fetcher.on_session_fetch(self.leader_id, fetch.full, len(fetch.changed))
        return wire.FetchRequest(
            replica_id=self.fetcher.broker_id, max_wait_ms=wait_ms, min_bytes=1,
            max_bytes=self.limits["fetch_max_bytes"], session_id=fetch.session_id, session_epoch=fetch.epoch,
            topics=_by_topic(fetch.changed),
            forgotten_topics=tuple(wire.ForgottenTopic(topic=t, partitions=tuple(ps)) for t, ps in forgotten.items()))

    def _deliver(self, batch: dict[TopicPartition, FetchRequest],
                 answered: dict[TopicPartition, wire.FetchPartitionResponse]) -> None:
        failed = {}
        throttle = self.fetcher.throttle
        for tp, request in batch.items():
            p = answered.get(tp)
            if p is None:
                failed[tp] = request
                continue
            if throttle.applies(tp) and p.records:
                throttle.record(time.monotonic(), len(p.records))
            if _not_served_yet(p) and tp in self._in_session:
                # The leader's session holds it until it serves it (RequestHandler.replica_opened).
                # One that left the session meanwhile (it follows another leader now, say) hears
                # the error below, as any other.
                self._tell_held(tp, request)
                continue
            event = fetch_answer_from_wire(self.leader_id, request, p, tp)
            if event.error is not ErrorCode.NONE:
                self._deliver_later({tp: request}, {tp: event})
                continue
            self.fetcher.deliver(tp, event)
        if failed:
            self._deliver_later(failed, {}, error=ErrorCode.UNKNOWN)

    def _tell_held(self, tp: TopicPartition, request: FetchRequest) -> None:
        """The leader holds `request` in the session: its core sets no timer to ask again."""
        self.fetcher.deliver(tp, FetchHeld(leader_id=self.leader_id, fetch_offset=request.fetch_offset,
                                           last_fetched_epoch=request.last_fetched_epoch))

    def _deliver_later(self, batch: dict[TopicPartition, FetchRequest], events: dict[TopicPartition, FetchResponse],
                       *, error: ErrorCode = ErrorCode.UNKNOWN) -> None:
        def later() -> None:
            for tp, request in batch.items():
                event = events.get(tp) or fetch_failed(self.leader_id, request, error, tp)
                self.fetcher.deliver(tp, event)
        delay_ms = self.limits["fetch_error_backoff_ms"]
        asyncio.get_running_loop().call_later(delay_ms / 1000, later)

    # ------------------------------------------------------------ connections

    async def _client(self, which: str) -> WireClient:
        client = self._clients[which]
        if client is not None and not client.closed:
            return client
        address = self.fetcher.address_of(self.leader_id)
        if address is None:
            raise BiplaneError(f"no address known for broker {self.leader_id}", code=ErrorCode.LEADER_NOT_AVAILABLE)
        client = await WireClient.connect(*address, timeout_s=self.limits["request_timeout_ms"] / 1000,
                                          max_frame_bytes=self.limits["max_frame_bytes"], inflight_requests_max=1)
        self._clients[which] = client
        return client

    async def _broken(self, which: str, batch: dict[TopicPartition, FetchRequest], exc: BaseException) -> None:
        log.info("fetch from broker %d failed (%s): %s", self.leader_id, which, exc,
                 extra={"event": "fetch.failed", "leader": self.leader_id})
        self._failed[which] += 1
        client, self._clients[which] = self._clients[which], None
        if client is not None:
            await client.close()
        self._backoff_ms = min(max(2 * self._backoff_ms, 50), self.limits["reconnect_backoff_ms_max"])
        await asyncio.sleep(self._backoff_ms / 1000)
        for tp, request in batch.items():
            # Unless the core asked anew meanwhile, or its newer request went out already (the
            # long-poll carried it during the backoff): sent after it, this one would be taken
            # for the newer word.
            if self._last_sent.get(tp) is request:
                self.pending.setdefault(tp, request)
        self._wake.set()
        self._wake_exp.set()

    async def close(self) -> None:
        await cancel_and_wait(*self._tasks)
        for which, client in list(self._clients.items()):
            if client is not None:
                await client.close()
            self._clients[which] = None


def _same_position(answer: wire.FetchPartitionResponse) -> bool:
    """Whether the follower asks again from the same position after `answer`."""
    return answer.error_code is ErrorCode.NONE and not answer.records and answer.diverging_epoch.end_offset < 0


def _not_served_yet(answer: wire.FetchPartitionResponse) -> bool:
    """The leader is still opening the partition, or has not stored its epoch start yet."""
    return answer.error_code is ErrorCode.LEADER_NOT_AVAILABLE


def _stays(answer: wire.FetchPartitionResponse) -> bool:
    """Whether `answer` leaves the partition where it was in the session: at the same position
    (a new HW alone), or held there by the leader until it serves it."""
    return _same_position(answer) or _not_served_yet(answer)


def _asked_at(request: FetchRequest) -> tuple[int, int, int]:
    """Where a request asks from, under which leader epoch: a request sent while the answer to
    another was out repeats it only if these match (a new epoch learned meanwhile is news)."""
    return (request.fetch_offset, request.last_fetched_epoch, request.current_leader_epoch)


def _position(request: FetchRequest) -> tuple[int, int, int]:
    return (request.fetch_offset, request.last_fetched_epoch, request.flushed_offset)


def _by_topic(partitions: Mapping[TopicPartition, wire.FetchPartition]) -> tuple[wire.FetchTopic, ...]:
    topics: dict[str, list[wire.FetchPartition]] = {}
    for (topic, _), p in partitions.items():
        topics.setdefault(topic, []).append(p)
    return tuple(wire.FetchTopic(topic=t, partitions=tuple(ps)) for t, ps in topics.items())

