"""Known-bad variants of the replica core, of the producer core and of the controller's
reachability decision, to show the simulation catches them.

Each mutant is a context manager that patches one rule out of
`dataplane.replica.core.Replica`, `dataplane.client.producer_core.ProducerCore`,
`dataplane.client.attempts.Attempts` or
`controller.decisions.reachability` (and undoes it). A regression seed is kept
together with the mutant that reintroduces its bug: the seed must fail with the
mutant and pass without it, which proves the seed still drives the scenario
after any change to the simulation's draws.
"""
from __future__ import annotations

import contextlib

from controller import decisions
from controller.decisions import QuorumElectionTracker, reachability
from dataplane.client.attempts import Attempts
from dataplane.client.producer_core import ProducerCore
from dataplane.replica import core
from dataplane.replica.events import Tick


@contextlib.contextmanager
def _patched(name: str, value, cls=core.Replica):
    old = getattr(cls, name)
    setattr(cls, name, value)
    try:
        yield
    finally:
        setattr(cls, name, old)


def serve_before_epoch_durable():
    """A new leader serves before its epoch-start batch is flushed (the seed-32 bug)."""
    original = core.Replica._become_leader

    def become_leader(self):
        original(self)
        self.epoch_durable = True
    return _patched("_become_leader", become_leader)


def count_written_under_fsync():
    """durability=fsync counts written offsets instead of flushed ones."""
    def stored_offsets(self):
        stored = {self.replica_id: self.written_offset}
        for r, p in self.progress.items():
            stored[r] = min(p.fetch_offset, p.match_offset)
        return stored
    return _patched("stored_offsets", stored_offsets)


def no_divergence_check():
    """The leader never answers with a diverging epoch: followers keep stale tails."""
    return _patched("_divergence", lambda self, fetch_offset, last_fetched_epoch: None)


def ignore_proposed_isr():
    """The HW counts only the accepted ISR, not the union with a pending proposal."""
    return _patched("required_isr", lambda self: frozenset(self.state.isr))


def consumers_read_past_hw():
    """Consumers are answered up to the log end instead of the HW."""
    def answer_consumer(self, req):
        if self.role is not core.Role.LEADER or req.fetch_offset >= self.log_end_offset:
            self._answer(req, error=core.ErrorCode.NOT_LEADER_OR_FOLLOWER)
            return
        self._answer(req, records=self.log.read(req.fetch_offset, max_bytes=self.fetch_max_bytes).records)
    return _patched("_answer_consumer", answer_consumer)


def no_duplicate_detection():
    """The leader writes a retried idempotent batch again instead of answering with its offset."""
    def check(self, headers):
        return core.ErrorCode.NONE, "", None
    return _patched("_check_producer_sequence", check)


def accept_sequence_gaps():
    """The leader accepts any sequence that is not a duplicate (no OUT_OF_ORDER_SEQUENCE)."""
    original = core.Replica._check_producer_sequence

    def check(self, headers):
        error, reason, duplicate = original(self, headers)
        if error is core.ErrorCode.OUT_OF_ORDER_SEQUENCE:
            return core.ErrorCode.NONE, "", None
        return error, reason, duplicate
    return _patched("_check_producer_sequence", check)


def push_stale_divergence():
    """Push mode: a follower applies a diverging append-entries computed from an older state of
    its log (a late copy), cutting batches it had since received from the leader."""
    return _patched("_answers_our_log", lambda self, ev: True)


def producer_renumbers_sent_batches():
    """The issue-12 bug put back: once a batch failed (a delivery timeout, say), the producer
    took a new epoch as soon as no request was in flight and renumbered every batch it still
    held, including batches already sent and perhaps appended whose answer was lost."""
    def advance(self, part):
        if not self.idempotent:
            return
        if part.unresolved_through >= 0 and part.last_acked_sequence >= part.unresolved_through:
            part.unresolved_through = -1
        if any(f.in_flight for f in part.outstanding):   # waited for requests, not for outcomes
            return
        if part.unresolved_through >= 0:
            part.unresolved_through = -1
            part.needs_new_epoch = True
        if part.needs_new_epoch and self.producer_id >= 0 and self._current(part):
            self._bump_epoch()
            for flight in part.outstanding:
                flight.stamp, flight.sequence, flight.maybe_written = None, -1, False
        if part.needs_new_epoch and not self._current(part):
            part.needs_new_epoch = False
    return _patched("_advance", advance, ProducerCore)


def producer_renumbers_unknown_refused():
    """A batch that may be in the log (an attempt went unanswered) is renumbered under a new
    epoch when a leader later refuses it as out of order, instead of failing as outcome unknown.
    tla/Producer_restamp_rejected.cfg is this mistake; its 14-state trace is replayed by
    tests/test_producer_core.py (the_model_s_restamp_trace)."""
    original = ProducerCore._after_error

    def after_error(self, part, flight, error, now_ms, reason=""):
        if error in (core.ErrorCode.OUT_OF_ORDER_SEQUENCE, core.ErrorCode.UNKNOWN_PRODUCER_ID):
            flight.maybe_written = False
        return original(self, part, flight, error, now_ms, reason)
    return _patched("_after_error", after_error, ProducerCore)


def producer_retry_blocked_behind_unnumbered():
    """The seed-291 bug put back: a batch waiting for new numbers (refused at the head) blocks
    the retries of the numbered batches behind it, whose outcome its new epoch waits for; the
    partition sends nothing until those batches reach their delivery timeout."""
    def retry_head(self, part):
        for flight in part.outstanding:
            if flight.in_flight:
                return None
            if flight.done:
                continue
            if flight.stamp is None:
                if self.producer_id < 0 or part.numbered() or (self._current(part) and part.needs_new_epoch):
                    return None
            return flight
        return None
    return _patched("_retry_head", retry_head, ProducerCore)


def producer_never_takes_new_epoch():
    """A partition that needs a new epoch never gets one: once a batch failed while it may be in
    the log (a delivery timeout, say), the partition waits forever and its batches expire unsent."""
    return _patched("_bump_epoch", lambda self: None, ProducerCore)


def late_answer_of_a_given_up_attempt_taken():
    """The producer takes a replaced leader's late answer to an attempt it gave up as news of the
    batch (its retry may be in flight): one request answered twice."""
    def finish(self, batch, attempt):
        self._open.pop(batch, None)
        return True
    return _patched("finish", finish, Attempts)


def producer_expires_early():
    """Batches fail by their delivery timeout at half of it (a producer giving up too soon)."""
    original = ProducerCore.expire

    def expire(self, now_ms):
        return original(self, now_ms + self.delivery_timeout_ms // 2)
    return _patched("expire", expire, ProducerCore)


@contextlib.contextmanager
def backlog_taken_only_on_ticks():
    """Requests waiting behind the backpressure bound are re-examined only on a tick, not after
    the event that made room (a backlog released late)."""
    original_step, original_admit = core.Replica.step, core.Replica._admit_backlog

    def step(self, event):
        self.mutant_ticking = isinstance(event, Tick)
        return original_step(self, event)

    def admit_backlog(self):
        if getattr(self, "mutant_ticking", False):
            original_admit(self)
    with _patched("step", step), _patched("_admit_backlog", admit_backlog):
        yield


@contextlib.contextmanager
def isr_settled_by_unknown_outcome():
    """A leader drops its ISR proposal on any answer but a stale-epoch one, including an unknown
    outcome (a controller that lost its leadership before the commit): an expansion that the next
    controller leader commits is not counted by the HW (the long fault run's lost records)."""
    from common.errors import ErrorCode
    old = core._DECLINED_ISR_REFUSALS
    core._DECLINED_ISR_REFUSALS = frozenset(ErrorCode) - {
        ErrorCode.FENCED_LEADER_EPOCH, ErrorCode.UNKNOWN_LEADER_EPOCH,
        ErrorCode.INVALID_UPDATE_VERSION, ErrorCode.NOT_LEADER_OR_FOLLOWER}
    try:
        yield
    finally:
        core._DECLINED_ISR_REFUSALS = old


def quorum_move_without_election():
    """Gray runs: a quorum leader its followers report unreachable is replaced as an isr one
    is, by a reporting follower straight away, without fencing the partition for a quorum
    election: the new leader may lack records acknowledged by the old leader and the other
    follower (TLA+'s DataPlane_elect_unfenced)."""
    return _patched("is_quorum", lambda image, p: False, cls=reachability)


def isr_move_only_with_min_insync_left():
    """Gray runs: issue 19's isr rule as first built. The leadership moved only while the ISR
    without the leader still met min_insync_replicas, and only such shrinks were refused; a cut
    of both followers whose lag clocks ran out apart shrank the ISR one follower at a time and
    left the cut leader alone with it for the whole cut."""
    move, refuse = decisions.move_unreachable_leaders, decisions.refuse_lonely_shrink

    def too_small(image, p) -> bool:
        config = image.topics[p.topic].config
        return config.commit_policy == "isr" and len(p.isr) - 1 < config.min_insync_replicas

    def moved(image, reports, now_ms):
        records, exclusions = move(image, reports, now_ms)
        return [r for r in records if not too_small(image, image.partition(r.topic, r.partition))], exclusions

    def refused(image, request, reports, now_ms):
        if not too_small(image, image.partition(request.topic, request.partition)):
            refuse(image, request, reports, now_ms)
    return _patched_all(decisions, move_unreachable_leaders=moved, refuse_lonely_shrink=refused)


def no_check_quorum():
    """Gray runs: a leader counts as cut off only when a majority of the replicas says so. Under
    push replication with the followers' packets to the leader cut, the followers hear the
    leader and report nothing: the leader kept its leadership for the whole cut."""
    def cut_off(self, image, p, now_ms):
        return 2 * self.votes(image, p, now_ms) > len(p.replicas)
    return _patched("cut_off", cut_off, cls=reachability.ReachabilityReports)


def exclusion_for_the_whole_round():
    """Gray runs: the old leader's election report is refused for the whole round, not for a
    while. Under durability=write with a replica restarted after a crash (its report unclean),
    the others' reports are never enough and the partition stays without a leader."""
    exclude = QuorumElectionTracker.exclude

    def excluded(self, topic, partition, fenced_epoch, broker_id, until_ms=None):
        exclude(self, topic, partition, fenced_epoch, broker_id, None)
    return _patched("exclude", excluded, cls=QuorumElectionTracker)


@contextlib.contextmanager
def _patched_all(owner, **values):
    old = {name: getattr(owner, name) for name in values}
    for name, value in values.items():
        setattr(owner, name, value)
    try:
        yield
    finally:
        for name, value in old.items():
            setattr(owner, name, value)


MUTANTS = {
    "no_check_quorum": no_check_quorum,
    "exclusion_for_the_whole_round": exclusion_for_the_whole_round,
    "quorum_move_without_election": quorum_move_without_election,
    "isr_move_only_with_min_insync_left": isr_move_only_with_min_insync_left,
    "isr_settled_by_unknown_outcome": isr_settled_by_unknown_outcome,
    "backlog_taken_only_on_ticks": backlog_taken_only_on_ticks,
    "producer_retry_blocked_behind_unnumbered": producer_retry_blocked_behind_unnumbered,
    "producer_never_takes_new_epoch": producer_never_takes_new_epoch,
    "producer_expires_early": producer_expires_early,
    "late_answer_of_a_given_up_attempt_taken": late_answer_of_a_given_up_attempt_taken,
    "producer_renumbers_sent_batches": producer_renumbers_sent_batches,
    "producer_renumbers_unknown_refused": producer_renumbers_unknown_refused,
    "push_stale_divergence": push_stale_divergence,
    "no_duplicate_detection": no_duplicate_detection,
    "accept_sequence_gaps": accept_sequence_gaps,
    "serve_before_epoch_durable": serve_before_epoch_durable,
    "count_written_under_fsync": count_written_under_fsync,
    "no_divergence_check": no_divergence_check,
    "ignore_proposed_isr": ignore_proposed_isr,
    "consumers_read_past_hw": consumers_read_past_hw,
}
