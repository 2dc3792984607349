"""The idempotent producer's protocol, per partition: numbering, epochs, retries, in-flight
accounting. Pure: no clock (time comes in as `now_ms`), no socket, no asyncio.

The driver (dataplane/client/producer.py, or tests/sim) owns batching and I/O. It asks
`may_send_new(tp)` before taking a never-sent batch off its queue and `send_new` to number it;
`next_retry(tp)` hands back a batch to send again; every request ends in exactly one of
`answered(...)` (the leader's error code and base offset) or `no_answer(...)` (request timeout,
connection lost); `expire(now_ms)` runs the delivery timeout. The producer identity is asked
for when `id_request_due(now_ms)` says so (`id_request_sent`, then `set_producer_id` or
`id_request_failed`: a failure is asked again after the backoff; the producer never stops on one
unless the answer is fatal). Each returns the outcomes to give
to callers: `Acknowledge(batch, base_offset)` or `Fail(batch, error, outcome_unknown, reason)`.

Rules (Kafka's idempotent producer, KIP-98/360/679; DESIGN.md §3):
- A batch keeps its (producer id, epoch, sequence) for every retry until its outcome is known.
- A batch that may be in the log (an attempt went unanswered, or was answered with an error
  given after an append) is never numbered again: it is retried as it is, or failed to its
  caller with outcome_unknown=True. Only a batch whose every attempt was refused before any
  append (the sequence refusals below) counts as unsent and may take new numbers. That needs a
  transport delivering each attempt at most once (TCP; a retry is a new attempt): then no copy
  of such a batch is left to land later. TLC checks it (tla/ProducerRefused.cfg passes;
  tla/Producer_renumber_refused_dup.cfg, the same over a network that duplicates requests,
  does not; tla/README.md).
- A partition takes a new epoch (or producer id) only when none of its numbered batches is
  outstanding, and only unsent batches are numbered under it. Without that, a re-numbered copy
  of an appended batch is a new batch to the leader: a duplicate.
- OUT_OF_ORDER_SEQUENCE / UNKNOWN_PRODUCER_ID for a batch behind an earlier outstanding one:
  the earlier one fills the gap, so retry as is. For the oldest outstanding batch: the leader
  lacks our sequence state, waiting will not help; the partition takes a new epoch.
- A batch failed while it may be in the log leaves the partition "unresolved": once nothing is
  outstanding, a later acknowledged sequence proves it was written (leaders append in sequence
  order only), otherwise the partition takes a new epoch.
- A duplicate is answered by the leader with the original offsets (error NONE), once its HW
  passes them; that is what the caller gets. The leader remembers a producer's last 5 batches,
  so the window of batches sent since the oldest unfinished one (finished ones inside it
  included) is at most 5: a retry is then always among the batches the leader can answer with
  their offsets. DUPLICATE_SEQUENCE (a sequence older than those 5) is answered at once, with
  no offset and without waiting for the HW: the batch was appended but may be uncommitted (a
  leader change can still drop it). It is not a success: the batch fails with
  outcome_unknown=True (tla/Producer_dupseq_as_written.cfg is the model of taking it as
  written). Within the window it cannot come.
"""
from __future__ import annotations

import dataclasses
from typing import Generic, Hashable, TypeVar

from common.errors import ErrorCode

SEQUENCE_MASK = 0x7FFFFFFF
PRODUCER_EPOCH_MAX = 32_767
# Leaders keep this many batches per producer to answer duplicates with their offsets
# (dataplane/replica/producer_state.py); more outstanding could not be recognised on retry.
OUTSTANDING_PER_PARTITION_MAX = 5

# Refusals a leader gives before appending anything: the attempt was not written.
# (NOT_ENOUGH_REPLICAS is Kafka's before-append refusal of acks=all below min_insync_replicas;
# its after-append twin, NOT_ENOUGH_REPLICAS_AFTER_APPEND, is not here.)
REFUSED_BEFORE_APPEND = frozenset({
    ErrorCode.OUT_OF_ORDER_SEQUENCE, ErrorCode.UNKNOWN_PRODUCER_ID, ErrorCode.INVALID_PRODUCER_EPOCH,
    ErrorCode.MESSAGE_TOO_LARGE, ErrorCode.RECORD_LIST_TOO_LARGE, ErrorCode.INVALID_REQUIRED_ACKS,
    ErrorCode.INVALID_RECORD, ErrorCode.CORRUPT_MESSAGE, ErrorCode.NOT_ENOUGH_REPLICAS,
})
_SEQUENCE_REFUSALS = frozenset({
    ErrorCode.OUT_OF_ORDER_SEQUENCE, ErrorCode.UNKNOWN_PRODUCER_ID, ErrorCode.INVALID_PRODUCER_EPOCH,
})

# InitProducerId answers that end the producer, as Kafka's are fatal for it: fenced by a newer
# instance, or a broker without idempotence support. Other non-retriable refusals (INVALID_CONFIG,
# ...) fail only the batches waiting for an identity; retriable ones fail nothing.
ID_FATAL = frozenset({ErrorCode.INVALID_PRODUCER_EPOCH, ErrorCode.UNSUPPORTED_VERSION})


def id_error_kind(error: ErrorCode) -> str:
    """"retry", "refused" or "fatal": what an InitProducerId failure with `error` means."""
    if error in ID_FATAL:
        return "fatal"
    if error.retriable or error in (ErrorCode.NETWORK_EXCEPTION, ErrorCode.REQUEST_TIMED_OUT):
        return "retry"
    return "refused"


B = TypeVar("B", bound=Hashable)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Stamp:
    """What a batch carries in its header; (-1, -1, -1) without idempotence."""

    producer_id: int
    producer_epoch: int
    base_sequence: int


NO_STAMP = Stamp(producer_id=-1, producer_epoch=-1, base_sequence=-1)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Acknowledge(Generic[B]):
    batch: B
    base_offset: int


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Fail(Generic[B]):
    """outcome_unknown: the records may be in the log (an attempt went unanswered, or the
    leader answered DUPLICATE_SEQUENCE: appended earlier, perhaps not committed)."""

    batch: B
    error: ErrorCode
    outcome_unknown: bool
    reason: str


Outcome = Acknowledge[B] | Fail[B]


@dataclasses.dataclass(eq=False, slots=True)
class _Flight(Generic[B]):
    batch: B
    tp: Hashable
    record_count: int
    created_ms: int
    stamp: Stamp | None = None      # None: unsent (or refused before any append) and to be numbered
    sequence: int = -1              # unwrapped base sequence within the stamp's epoch
    attempts: int = 0
    in_flight: bool = False         # a request carrying it awaits an answer
    maybe_written: bool = False     # some attempt could have been appended
    retry_at_ms: int = 0
    done: bool = False              # its caller was told (acknowledged or failed)
    last_refusal: ErrorCode | None = None   # the leader's last error for it: named if it expires

    @property
    def last_sequence(self) -> int:
        return self.sequence + self.record_count - 1


@dataclasses.dataclass(slots=True)
class _Partition(Generic[B]):
    producer_id: int = -1
    producer_epoch: int = -1
    next_sequence: int = 0                      # unwrapped
    last_acked_sequence: int = -1               # unwrapped, in this epoch
    unresolved_through: int = -1                # highest sequence failed while maybe written
    needs_new_epoch: bool = False
    outstanding: list[_Flight[B]] = dataclasses.field(default_factory=list)  # send order

    def numbered(self) -> list[_Flight[B]]:
        """Numbered batches whose outcome may still change the leader's sequence state."""
        return [f for f in self.outstanding if f.stamp is not None and (not f.done or f.in_flight)]


class ProducerCore(Generic[B]):
    """Limits are constructor arguments; times in ms."""

    def __init__(self, *, idempotent: bool = True, in_flight_per_partition_max: int = 5,
                 retry_backoff_ms: int = 100, delivery_timeout_ms: int = 120_000,
                 retries_max: int = 2_147_483_647) -> None:
        limit = OUTSTANDING_PER_PARTITION_MAX if idempotent else 1
        if not isinstance(in_flight_per_partition_max, int) or not 1 <= in_flight_per_partition_max:
            raise ValueError(f"in_flight_per_partition_max={in_flight_per_partition_max!r} must be an integer >= 1")
        if idempotent and in_flight_per_partition_max > limit:
            raise ValueError(f"in_flight_per_partition_max={in_flight_per_partition_max} is above {limit}: a "
                             f"leader remembers only the last {limit} batches of a producer, so a retry of an "
                             f"older one could not be answered with its offset; use 1..{limit}")
        for name, value in (("retry_backoff_ms", retry_backoff_ms), ("retries_max", retries_max)):
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"{name}={value!r} must be an integer >= 0")
        if not isinstance(delivery_timeout_ms, int) or delivery_timeout_ms < 1:
            raise ValueError(f"delivery_timeout_ms={delivery_timeout_ms!r} must be an integer >= 1")
        self.idempotent = idempotent
        self.in_flight_per_partition_max = in_flight_per_partition_max if idempotent else 1
        self.retry_backoff_ms = retry_backoff_ms
        self.delivery_timeout_ms = delivery_timeout_ms
        self.retries_max = retries_max
        self.producer_id = -1
        self.producer_epoch = -1
        self.partitions: dict[Hashable, _Partition[B]] = {}
        self._flights: dict[B, _Flight[B]] = {}
        self._id_request_out = False     # an InitProducerId request awaits its end
        self._id_retry_at_ms = 0         # when the next one may go (after a failure: backoff)
        self.id_requests_failed = 0
        self.fatal_error: ErrorCode | None = None   # an InitProducerId answer that ends the producer

    # ------------------------------------------------------------ identity

    @property
    def producer_id_wanted(self) -> bool:
        """The driver must fetch a producer id (InitProducerId) and call set_producer_id."""
        return self.idempotent and self.producer_id < 0

    def id_request_due_ms(self) -> int | None:
        """When the driver should send InitProducerId (None: not now: none wanted, one is out,
        or a fatal answer came). Failed requests are asked again after retry_backoff_ms, for as
        long as the producer lives: waiting batches are bounded by their own delivery timeout."""
        if not self.producer_id_wanted or self._id_request_out or self.fatal_error is not None:
            return None
        return self._id_retry_at_ms

    def id_request_due(self, now_ms: int) -> bool:
        due = self.id_request_due_ms()
        return due is not None and now_ms >= due

    def id_request_sent(self, now_ms: int) -> None:
        """The driver sent InitProducerId (id_request_due said so); it ends in set_producer_id
        or id_request_failed."""
        if not self.id_request_due(now_ms):
            raise RuntimeError("id_request_sent() while id_request_due is false")
        self._id_request_out = True

    def set_producer_id(self, *, producer_id: int, producer_epoch: int) -> None:
        if producer_id < 0 or not 0 <= producer_epoch <= PRODUCER_EPOCH_MAX:
            raise ValueError(f"producer id {producer_id} / epoch {producer_epoch} is not a valid identity")
        self.producer_id, self.producer_epoch = producer_id, producer_epoch
        self._id_request_out = False
        self._id_retry_at_ms = 0

    def id_request_failed(self, *, error: ErrorCode, now_ms: int, reason: str = "") -> list[Outcome[B]]:
        """InitProducerId ended without an identity: `error` is the answer's code, or
        NETWORK_EXCEPTION / REQUEST_TIMED_OUT when no broker answered. Retriable: asked again
        after retry_backoff_ms, nothing fails. Refused (not retriable, e.g. INVALID_CONFIG): the
        batches waiting here for numbers fail with it (never sent: not outcome-unknown) and the
        request is still asked again after the backoff, for later batches (Kafka's producer
        returns to "uninitialized"). Fatal (id_error_kind): the same, and fatal_error is set:
        the driver stops the producer."""
        if not self._id_request_out:
            raise RuntimeError("id_request_failed() without a request out (answer each request once)")
        self._id_request_out = False
        self.id_requests_failed += 1
        self._id_retry_at_ms = now_ms + self.retry_backoff_ms
        kind = id_error_kind(error)
        if kind == "retry":
            return []
        if kind == "fatal":
            self.fatal_error = error
        why = f"no producer id: InitProducerId answered {error.name}; not sent" + (f": {reason}" if reason else "")
        out: list[Outcome[B]] = []
        for part in self.partitions.values():
            for flight in list(part.outstanding):
                if flight.stamp is None and not flight.done and not flight.in_flight:
                    out.append(Fail(batch=flight.batch, error=error, outcome_unknown=False, reason=why))
                    self._finish(part, flight)
        return out

    def _bump_epoch(self) -> None:
        # Local, as Kafka's idempotent producer does (KIP-360): leaders accept a newer epoch
        # starting at sequence 0. At the int16 limit a fresh producer id is needed instead.
        if self.producer_epoch < PRODUCER_EPOCH_MAX:
            self.producer_epoch += 1
        else:
            self.producer_id = self.producer_epoch = -1

    # ------------------------------------------------------------ sending

    def _partition(self, tp: Hashable) -> _Partition[B]:
        part = self.partitions.get(tp)
        if part is None:
            part = self.partitions[tp] = _Partition()
        return part

    def in_flight(self, tp: Hashable) -> int:
        part = self.partitions.get(tp)
        return 0 if part is None else sum(1 for f in part.outstanding if f.in_flight)

    def outstanding(self, tp: Hashable | None = None) -> int:
        """Batches in the window: from the oldest not finished (awaiting an answer, a retry or
        new numbers) to the newest sent, finished ones between them included."""
        if tp is not None:
            part = self.partitions.get(tp)
            return 0 if part is None else len(part.outstanding)
        return sum(len(p.outstanding) for p in self.partitions.values())

    def in_flight_total(self) -> int:
        return sum(1 for f in self._flights.values() if f.in_flight)

    def may_send_new(self, tp: Hashable) -> bool:
        """May a never-sent batch of tp be numbered and sent now?"""
        part = self._partition(tp)
        if any(not f.done and not f.in_flight for f in part.outstanding):
            return False     # a retry or a batch waiting for new numbers goes first
        if len(part.outstanding) >= self.in_flight_per_partition_max:
            return False
        if not self.idempotent:
            return True
        if self.producer_id < 0 or part.unresolved_through >= 0:
            return False
        # A partition moves to a newer identity only with nothing numbered outstanding.
        if self._current(part):
            return not part.needs_new_epoch
        return not part.numbered()

    def send_new(self, tp: Hashable, batch: B, *, record_count: int, created_ms: int, now_ms: int) -> Stamp:
        """Number a never-sent batch and count it in flight (the caller checked may_send_new)."""
        if not self.may_send_new(tp):
            raise RuntimeError(f"send_new({tp}) while may_send_new is false")
        if batch in self._flights:
            raise RuntimeError(f"send_new({tp}) of a batch already sent")
        part = self._partition(tp)
        flight = _Flight(batch=batch, tp=tp, record_count=record_count, created_ms=created_ms)
        self._flights[batch] = flight
        part.outstanding.append(flight)
        self._number(part, flight)
        self._launch(flight)
        assert flight.stamp is not None
        return flight.stamp

    def _number(self, part: _Partition[B], flight: _Flight[B]) -> None:
        if not self.idempotent:
            flight.stamp = NO_STAMP
            return
        if not self._current(part):
            assert not part.numbered(), "a partition changes identity only with nothing numbered outstanding"
            part.producer_id, part.producer_epoch = self.producer_id, self.producer_epoch
            part.next_sequence, part.last_acked_sequence = 0, -1
        flight.sequence = part.next_sequence
        part.next_sequence += flight.record_count
        flight.stamp = Stamp(producer_id=part.producer_id, producer_epoch=part.producer_epoch,
                             base_sequence=flight.sequence & SEQUENCE_MASK)

    def _current(self, part: _Partition[B]) -> bool:
        return (part.producer_id, part.producer_epoch) == (self.producer_id, self.producer_epoch)

    def _launch(self, flight: _Flight[B]) -> None:
        flight.attempts += 1
        flight.in_flight = True

    def retry_due(self, tp: Hashable, now_ms: int) -> B | None:
        """The batch of tp to send again now, if any (a query: `resend` sends it). Retries go
        one at a time and in order, so a retried batch is never overtaken (a batch waiting for
        new numbers lets the numbered ones behind it go first; see _retry_head)."""
        flight = self._retry_candidate(tp, now_ms)
        return None if flight is None else flight.batch

    def _retry_candidate(self, tp: Hashable, now_ms: int) -> _Flight[B] | None:
        part = self.partitions.get(tp)
        flight = None if part is None else self._retry_head(part)
        return flight if flight is not None and now_ms >= flight.retry_at_ms else None

    def _retry_head(self, part: _Partition[B]) -> _Flight[B] | None:
        """The batch to send again next, once its backoff ends (None: it waits for an answer)."""
        for flight in part.outstanding:
            if flight.in_flight:
                return None
            if flight.done:
                continue
            if flight.stamp is None:
                # Never appended, waiting for new numbers: only under a new identity, and only
                # once nothing numbered is outstanding. Numbered batches behind it go first, as
                # they are: the new epoch waits for their outcome, and they cannot overtake it
                # (their sequences follow one it was refused before any append, so no leader
                # appends them under the old identity; they are refused and follow it).
                if self.producer_id < 0 or part.numbered() or (self._current(part) and part.needs_new_epoch):
                    continue
            return flight
        return None

    def resend(self, tp: Hashable, batch: B, *, now_ms: int) -> Stamp:
        """Send `batch` again (the one retry_due named): its stamp, new only if it was never
        appended and the partition moved to a new identity; counted in flight."""
        flight = self._retry_candidate(tp, now_ms)
        if flight is None or flight.batch is not batch:
            raise RuntimeError(f"resend({tp}) of a batch retry_due did not name")
        part = self._partition(tp)
        if flight.stamp is None:
            part.needs_new_epoch = False
            self._number(part, flight)
        self._launch(flight)
        assert flight.stamp is not None
        return flight.stamp

    def next_due_ms(self) -> int | None:
        """The earliest time a retry's backoff or a delivery timeout ends (None: none pending).
        A retry waiting for an earlier batch's answer has no time of its own: a driver that
        slept until its backoff ended would wake to nothing and spin."""
        times = [f.created_ms + self.delivery_timeout_ms for f in self._flights.values() if not f.done]
        id_due = self.id_request_due_ms()
        if id_due is not None:
            times.append(id_due)
        for part in self.partitions.values():
            head = self._retry_head(part)
            if head is not None:
                times.append(head.retry_at_ms)
        return min(times, default=None)

    # ------------------------------------------------------------ answers

    def answered(self, batch: B, *, error: ErrorCode, base_offset: int, now_ms: int) -> list[Outcome[B]]:
        """The leader answered the request carrying `batch`."""
        flight = self._in_flight(batch, "answered")
        flight.in_flight = False
        part = self.partitions[flight.tp]
        out: list[Outcome[B]] = []
        if error is ErrorCode.DUPLICATE_SEQUENCE and self.idempotent:
            # Appended once, perhaps not committed, offset forgotten: outcome unknown.
            flight.maybe_written = True
            if flight.done:
                self._finish(part, flight)
            else:
                out.append(self._fail(part, flight, error, now_ms, why=(
                    "the leader answered DUPLICATE_SEQUENCE: it appended these records earlier, "
                    "but no longer knows their offset and they may not be committed yet")))
        elif error in (ErrorCode.NONE, ErrorCode.DUPLICATE_SEQUENCE):
            if flight.stamp is not None and flight.stamp.producer_id == part.producer_id \
                    and flight.stamp.producer_epoch == part.producer_epoch:
                part.last_acked_sequence = max(part.last_acked_sequence, flight.last_sequence)
            if not flight.done:
                out.append(Acknowledge(batch=batch, base_offset=base_offset))
            self._finish(part, flight)
        else:
            if error not in REFUSED_BEFORE_APPEND:
                flight.maybe_written = True
            flight.last_refusal = error
            out += self._after_error(part, flight, error, now_ms)
        self._advance(part)
        return out

    def no_answer(self, batch: B, *, now_ms: int, reason: str = "no answer", sent: bool = True) -> list[Outcome[B]]:
        """The request carrying `batch` ended without an answer (timeout, connection lost):
        the batch may have been appended. `sent=False`: no connection could be made, so this
        attempt wrote nothing (an earlier one may have)."""
        flight = self._in_flight(batch, "no_answer")
        flight.in_flight = False
        if sent:
            flight.maybe_written = True
        part = self.partitions[flight.tp]
        out = self._after_error(part, flight, ErrorCode.NETWORK_EXCEPTION, now_ms, reason=reason)
        self._advance(part)
        return out

    def _after_error(self, part: _Partition[B], flight: _Flight[B], error: ErrorCode, now_ms: int,
                     reason: str = "") -> list[Outcome[B]]:
        if flight.done:               # its caller already heard (delivery timeout): just let go
            self._finish(part, flight)
            return []
        expired = now_ms >= flight.created_ms + self.delivery_timeout_ms
        if self.idempotent and error in _SEQUENCE_REFUSALS:
            if self._earlier_pending(part, flight) and not expired:
                self._retry_later(flight, now_ms)   # the earlier batch fills the gap
                return []
            # The oldest outstanding batch is refused: the leader lacks our sequence state
            # (or an earlier batch failed). A new epoch is the way on, taken once nothing
            # numbered is outstanding.
            part.needs_new_epoch = True
            if not flight.maybe_written and not expired and flight.attempts <= self.retries_max:
                flight.stamp, flight.sequence = None, -1   # never appended: it may take new numbers
                self._retry_later(flight, now_ms)
                return []
            return [self._fail(part, flight, error, now_ms, reason)]
        if (error.retriable or error is ErrorCode.NETWORK_EXCEPTION) and not expired \
                and flight.attempts <= self.retries_max:
            self._retry_later(flight, now_ms)
            return []
        return [self._fail(part, flight, error, now_ms, reason)]

    def _earlier_pending(self, part: _Partition[B], flight: _Flight[B]) -> bool:
        """Is a numbered batch ahead of `flight` still able to land (so a gap may close)?"""
        for other in part.outstanding:
            if other is flight:
                return False
            if other.stamp is not None and (not other.done or other.in_flight):
                return True
        return False

    def _retry_later(self, flight: _Flight[B], now_ms: int) -> None:
        flight.retry_at_ms = now_ms + self.retry_backoff_ms

    def _fail(self, part: _Partition[B], flight: _Flight[B], error: ErrorCode, now_ms: int,
              reason: str = "", *, why: str = "") -> Fail[B]:
        expired = now_ms >= flight.created_ms + self.delivery_timeout_ms
        if expired and not reason and flight.last_refusal is not None:
            # A retriable refusal retried until the deadline: what the user can act on.
            reason = f"the leader last answered {flight.last_refusal.name}"
        if flight.maybe_written:
            if why:
                expired = False
            else:
                why = (f"not acknowledged within delivery_timeout_ms={self.delivery_timeout_ms}"
                       if expired else f"gave up after {flight.attempts} attempt(s) ({error.name})"
                       ) + "; an attempt went unanswered"
            fail = Fail(batch=flight.batch, error=ErrorCode.REQUEST_TIMED_OUT if expired else error,
                        outcome_unknown=True,
                        reason=f"{why}, so the records may be in the log "
                               f"(read the partition to know){': ' + reason if reason else ''}")
        else:
            fail = Fail(batch=flight.batch, error=ErrorCode.REQUEST_TIMED_OUT if expired else error,
                        outcome_unknown=False,
                        reason=(f"not written within delivery_timeout_ms={self.delivery_timeout_ms}" if expired
                                else f"refused by the leader ({error.name}); not written") + (
                                    f": {reason}" if reason else ""))
        flight.done = True
        if flight.stamp is not None and self.idempotent:
            if flight.maybe_written:
                part.unresolved_through = max(part.unresolved_through, flight.last_sequence)
            else:
                part.needs_new_epoch = True   # a sequence that will never be written: a gap
        if not flight.in_flight:
            self._finish(part, flight)
        return fail

    def _finish(self, part: _Partition[B], flight: _Flight[B]) -> None:
        flight.done = True
        del self._flights[flight.batch]
        # A finished batch leaves the window only once every batch sent before it finished:
        # the window spans the sequences a retry may still need the leader to recognise.
        outstanding = part.outstanding
        while outstanding and outstanding[0].done and not outstanding[0].in_flight:
            outstanding.pop(0)

    def _in_flight(self, batch: B, event: str) -> _Flight[B]:
        flight = self._flights.get(batch)
        if flight is None or not flight.in_flight:
            raise RuntimeError(f"{event}() for a batch that is not in flight: {batch!r} (answer each request once)")
        return flight

    def _advance(self, part: _Partition[B]) -> None:
        """Settle what waits for nothing numbered to be outstanding: resolve or take a new epoch."""
        if not self.idempotent:
            return
        if part.unresolved_through >= 0 and part.last_acked_sequence >= part.unresolved_through:
            part.unresolved_through = -1   # a later sequence was acknowledged: those were written
        if part.numbered():
            return
        if part.unresolved_through >= 0:
            part.unresolved_through = -1
            part.needs_new_epoch = True
        if part.needs_new_epoch and self.producer_id >= 0 and self._current(part):
            self._bump_epoch()
        if part.needs_new_epoch and not self._current(part):
            part.needs_new_epoch = False   # _number moves it to the new identity at sequence 0

    # ------------------------------------------------------------ time

    def expire(self, now_ms: int) -> list[Outcome[B]]:
        """Fail batches past delivery_timeout_ms (in flight or not; an in-flight one stays
        counted until its request ends, so no new epoch is taken under it)."""
        out: list[Outcome[B]] = []
        touched: list[_Partition[B]] = []
        for part in self.partitions.values():
            for flight in list(part.outstanding):
                if not flight.done and now_ms >= flight.created_ms + self.delivery_timeout_ms:
                    if flight.in_flight:
                        flight.maybe_written = True
                    out.append(self._fail(part, flight, ErrorCode.REQUEST_TIMED_OUT, now_ms, ""))
                    touched.append(part)
        for part in touched:
            self._advance(part)
        return out

    def abandon(self) -> list[B]:
        """Forget every batch (the producer closes); returns those whose callers were not told."""
        left = [f.batch for f in self._flights.values() if not f.done]
        self._flights.clear()
        for part in self.partitions.values():
            part.outstanding.clear()
        return left
