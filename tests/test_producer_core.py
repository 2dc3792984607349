"""The producer core (dataplane/client/producer_core.py): one test per rule, each failing if
its rule is broken. Batches are plain strings; time is moved by hand."""
from __future__ import annotations

import pytest

from common.errors import ErrorCode
from dataplane.client.producer_core import (
    PRODUCER_EPOCH_MAX, Acknowledge, Fail, ProducerCore, Stamp,
)

TP = "t-0"


def core(**options) -> ProducerCore:
    c: ProducerCore = ProducerCore(retry_backoff_ms=10, delivery_timeout_ms=1000, **options)
    c.set_producer_id(producer_id=7, producer_epoch=0)
    return c


def send(c: ProducerCore, batch: str, *, count: int = 1, now_ms: int = 0) -> Stamp:
    assert c.may_send_new(TP)
    return c.send_new(TP, batch, record_count=count, created_ms=now_ms, now_ms=now_ms)


def resend(c: ProducerCore, now_ms: int) -> tuple[str, Stamp]:
    batch = c.retry_due(TP, now_ms)
    assert batch is not None, f"nothing to retry at {now_ms} ms"
    return batch, c.resend(TP, batch, now_ms=now_ms)


def test_a_batch_keeps_its_numbers_for_every_retry():
    """Rule: (producer id, epoch, sequence) stay the same across retries until the outcome is known."""
    c = core()
    first = send(c, "a", count=3)
    assert c.answered("a", error=ErrorCode.NOT_LEADER_OR_FOLLOWER, base_offset=-1, now_ms=1) == []
    _, again = resend(c, 11)
    assert c.no_answer("a", now_ms=20) == []
    _, third = resend(c, 30)
    assert first == again == third == Stamp(producer_id=7, producer_epoch=0, base_sequence=0)
    assert c.answered("a", error=ErrorCode.NONE, base_offset=40, now_ms=31) == [Acknowledge(batch="a", base_offset=40)]
    assert send(c, "b", now_ms=32).base_sequence == 3


def test_an_unanswered_batch_refused_later_is_failed_as_outcome_unknown_never_renumbered():
    """Rule: a batch that may be in the log (an attempt went unanswered) is never given new
    numbers: when the leader then refuses it as out of order, the caller hears "outcome unknown"."""
    c = core()
    send(c, "a")
    c.no_answer("a", now_ms=5)
    resend(c, 20)
    (fail,) = c.answered("a", error=ErrorCode.OUT_OF_ORDER_SEQUENCE, base_offset=-1, now_ms=21)
    assert isinstance(fail, Fail) and fail.outcome_unknown and "may be in the log" in fail.reason
    assert c.retry_due(TP, 10_000) is None and c.outstanding(TP) == 0


def test_duplicate_sequence_fails_as_outcome_unknown_never_as_written():
    """Rule: DUPLICATE_SEQUENCE (a sequence older than the leader's window) is answered at once,
    before the HW passes the batch and with no offset: the records were appended but may not be
    committed (tla/Producer_dupseq_as_written.cfg). The caller hears "outcome unknown", not
    "written at -1"; the batch is not sent again, and with nothing numbered left the partition
    takes a new epoch."""
    c = core()
    send(c, "a")
    c.no_answer("a", now_ms=5)
    resend(c, 20)
    (fail,) = c.answered("a", error=ErrorCode.DUPLICATE_SEQUENCE, base_offset=-1, now_ms=21)
    assert isinstance(fail, Fail), fail
    assert fail.outcome_unknown and fail.error is ErrorCode.DUPLICATE_SEQUENCE
    assert "may be in the log" in fail.reason and "DUPLICATE_SEQUENCE" in fail.reason
    assert c.retry_due(TP, 10_000) is None and c.outstanding(TP) == 0
    assert send(c, "b", now_ms=22) == Stamp(producer_id=7, producer_epoch=1, base_sequence=0)


def test_duplicate_sequence_proven_written_by_a_later_ack_needs_no_new_epoch():
    """As for any batch failed as outcome unknown: a later sequence acknowledged proves the
    DUPLICATE_SEQUENCE batch committed, so the partition keeps its epoch."""
    c = core()
    send(c, "a")
    send(c, "b")
    (fail,) = c.answered("a", error=ErrorCode.DUPLICATE_SEQUENCE, base_offset=-1, now_ms=1)
    assert isinstance(fail, Fail) and fail.outcome_unknown
    assert not c.may_send_new(TP)                   # unresolved until b's outcome is known
    assert c.answered("b", error=ErrorCode.NONE, base_offset=9, now_ms=2) == [Acknowledge(batch="b", base_offset=9)]
    assert c.producer_epoch == 0 and send(c, "c", now_ms=3).base_sequence == 2


def test_delivery_timeout_while_in_flight_fails_unknown_and_takes_no_epoch_under_it():
    """The issue's bug: after a delivery timeout the producer took a new epoch and renumbered
    every queued batch, including one already appended whose answer was lost. Rule: the batch
    in flight fails as outcome unknown, keeps its numbers, and the partition takes a new epoch
    only after its request ended; only a never-sent batch is numbered under it."""
    c = core()
    stamp = send(c, "a")
    (fail,) = c.expire(1000)
    assert isinstance(fail, Fail) and fail.outcome_unknown
    assert not c.may_send_new(TP) and c.producer_epoch == 0   # "a" is still in flight
    assert c.answered("a", error=ErrorCode.REQUEST_TIMED_OUT, base_offset=-1, now_ms=1001) == []
    assert c.retry_due(TP, 5000) is None                     # not resent, under any numbers
    assert c.producer_epoch == 1 and c.may_send_new(TP)      # now a new epoch, for new batches
    assert send(c, "b", now_ms=1002) == Stamp(producer_id=7, producer_epoch=1, base_sequence=0)
    assert stamp.producer_epoch == 0


def test_a_failed_unknown_batch_proven_written_by_a_later_ack_needs_no_new_epoch():
    """Rule (Kafka's unresolved sequences): a leader appends a producer's batches in sequence
    order only, so a later batch acknowledged proves the unknown one was written."""
    c = core()
    send(c, "a")
    send(c, "b")
    c.expire(1000)   # both fail as unknown, both still in flight
    c.answered("a", error=ErrorCode.REQUEST_TIMED_OUT, base_offset=-1, now_ms=1001)
    c.answered("b", error=ErrorCode.NONE, base_offset=9, now_ms=1002)   # late success: nobody told
    assert c.producer_epoch == 0 and c.may_send_new(TP)
    assert send(c, "c", now_ms=1003).base_sequence == 2


def test_a_new_epoch_waits_for_every_numbered_batch_of_the_partition():
    """Rule: a new epoch is taken only when no batch of that partition is in flight."""
    c = core()
    send(c, "a")
    send(c, "b")
    send(c, "c")
    # "a" is refused at the head: the leader lacks our state; "b" and "c" are still out.
    c.answered("a", error=ErrorCode.UNKNOWN_PRODUCER_ID, base_offset=-1, now_ms=1)
    assert c.producer_epoch == 0 and c.retry_due(TP, 100) is None
    c.answered("b", error=ErrorCode.OUT_OF_ORDER_SEQUENCE, base_offset=-1, now_ms=2)
    assert c.producer_epoch == 0
    c.answered("c", error=ErrorCode.OUT_OF_ORDER_SEQUENCE, base_offset=-1, now_ms=3)
    assert c.producer_epoch == 1
    # All three were refused before any append: they go again, in order, from sequence 0.
    seen = []
    for now in (20, 21, 22):
        batch, stamp = resend(c, now)
        seen.append((batch, stamp.producer_epoch, stamp.base_sequence))
        c.answered(batch, error=ErrorCode.NONE, base_offset=now, now_ms=now)
    assert seen == [("a", 1, 0), ("b", 1, 1), ("c", 1, 2)]


def test_out_of_order_behind_an_earlier_outstanding_batch_is_retried_as_is():
    """Rule: OUT_OF_ORDER_SEQUENCE for a batch behind an earlier one still outstanding means the
    earlier one fills the gap: retry with the same numbers, no new epoch."""
    c = core()
    send(c, "a")
    send(c, "b")
    assert c.no_answer("a", now_ms=1) == []
    assert c.answered("b", error=ErrorCode.OUT_OF_ORDER_SEQUENCE, base_offset=-1, now_ms=2) == []
    assert resend(c, 20) == ("a", Stamp(producer_id=7, producer_epoch=0, base_sequence=0))
    assert c.retry_due(TP, 30) is None     # one retry at a time, in order
    c.answered("a", error=ErrorCode.NONE, base_offset=0, now_ms=31)
    assert resend(c, 32) == ("b", Stamp(producer_id=7, producer_epoch=0, base_sequence=1))
    assert c.producer_epoch == 0


def test_out_of_order_at_the_head_takes_a_new_epoch_and_renumbers_a_refused_batch():
    """Rule (Kafka, KIP-360): OUT_OF_ORDER_SEQUENCE for the oldest outstanding batch cannot heal
    by waiting; a batch refused before any append may take new numbers under a new epoch."""
    c = core()
    send(c, "a")
    c.answered("a", error=ErrorCode.NONE, base_offset=0, now_ms=1)
    send(c, "b")
    assert c.answered("b", error=ErrorCode.OUT_OF_ORDER_SEQUENCE, base_offset=-1, now_ms=2) == []
    assert resend(c, 20) == ("b", Stamp(producer_id=7, producer_epoch=1, base_sequence=0))


def test_the_model_s_restamp_trace_a_refused_retry_of_an_unanswered_batch_is_not_renumbered():
    """tla/Producer_restamp_rejected.cfg's counterexample, step by step: "a" and "b" are sent;
    "a" goes unanswered and fails by delivery timeout; "b"'s first attempt goes unanswered (it
    may still be appended) and its retry is refused OUT_OF_ORDER_SEQUENCE ("a" is missing).
    Renumbering "b" under a new epoch would let both copies land. Rule: "b" fails as outcome
    unknown; the new epoch numbers only never-sent batches."""
    c = core()
    send(c, "a", now_ms=0)
    b = send(c, "b", now_ms=500)
    c.no_answer("a", now_ms=100)
    assert resend(c, 110)[0] == "a"
    c.no_answer("a", now_ms=200)
    assert resend(c, 210)[0] == "a"
    c.no_answer("b", now_ms=300)                    # b's first attempt: unanswered
    (fail_a,) = c.expire(1000)                      # a is still in flight: fails, stays counted
    assert fail_a.batch == "a" and fail_a.outcome_unknown
    c.no_answer("a", now_ms=1001)
    assert resend(c, 1010) == ("b", b)              # b goes again as it is
    (fail_b,) = c.answered("b", error=ErrorCode.OUT_OF_ORDER_SEQUENCE, base_offset=-1, now_ms=1011)
    assert isinstance(fail_b, Fail) and fail_b.outcome_unknown and "may be in the log" in fail_b.reason
    assert c.retry_due(TP, 10_000) is None
    assert send(c, "c", now_ms=1012) == Stamp(producer_id=7, producer_epoch=1, base_sequence=0)


def test_a_definite_refusal_leaves_a_gap_closed_by_a_new_epoch():
    """Rule: a batch refused for good (never appended) leaves its sequence unwritten; the
    partition's later batches go under a new epoch from sequence 0."""
    c = core()
    send(c, "a")
    (fail,) = c.answered("a", error=ErrorCode.MESSAGE_TOO_LARGE, base_offset=-1, now_ms=1)
    assert isinstance(fail, Fail) and not fail.outcome_unknown and fail.error is ErrorCode.MESSAGE_TOO_LARGE
    assert send(c, "b", now_ms=2) == Stamp(producer_id=7, producer_epoch=1, base_sequence=0)


def test_a_batch_refused_below_min_insync_until_its_timeout_fails_as_not_written_naming_the_refusal():
    """Rule: NOT_ENOUGH_REPLICAS is refused before any append (Kafka's rule; admission.py): a
    batch refused so until its delivery timeout was not written, and the caller hears why. A
    user stopping two of three brokers was told the record "may be in the log", with
    REQUEST_TIMED_OUT and no word of the ISR."""
    c = core()
    send(c, "a")
    now = 1
    while now < 1000:
        assert c.answered("a", error=ErrorCode.NOT_ENOUGH_REPLICAS, base_offset=-1, now_ms=now) == []
        _, _ = resend(c, now + 10)
        now += 20
    (fail,) = c.answered("a", error=ErrorCode.NOT_ENOUGH_REPLICAS, base_offset=-1, now_ms=1001)
    assert isinstance(fail, Fail) and not fail.outcome_unknown, fail
    assert "not written" in fail.reason and "NOT_ENOUGH_REPLICAS" in fail.reason, fail.reason


def test_a_batch_whose_every_attempt_found_no_connection_fails_as_not_written():
    """Rule: an attempt that could not connect sent nothing. With every broker refusing
    connections, a record that never left the client was reported "may be in the log"."""
    c = core()
    send(c, "a")
    now = 1
    while now < 1000:
        assert c.no_answer("a", now_ms=now, reason="cannot connect", sent=False) == []
        resend(c, now + 10)
        now += 20
    (fail,) = c.no_answer("a", now_ms=1001, reason="cannot connect", sent=False)
    assert isinstance(fail, Fail) and not fail.outcome_unknown and "not written" in fail.reason, fail
    # One attempt that went out unanswered makes it unknown, whatever the later ones found.
    c = core()
    send(c, "b")
    c.no_answer("b", now_ms=1, reason="timed out")
    resend(c, 20)
    (fail,) = c.no_answer("b", now_ms=1001, reason="cannot connect", sent=False)
    assert fail.outcome_unknown


def test_a_duplicate_resolves_with_the_offset_the_leader_returns():
    """Rule: a retry the leader recognises as a duplicate resolves with the original offset
    (the leader answers NONE with it; see tests/test_producer_state.py)."""
    c = core()
    send(c, "a")
    c.no_answer("a", now_ms=1)
    resend(c, 20)
    assert c.answered("a", error=ErrorCode.NONE, base_offset=17, now_ms=21) == [Acknowledge(batch="a", base_offset=17)]


def test_other_partitions_move_to_a_new_epoch_only_when_idle():
    """A bump taken for one partition reaches another only once it has nothing numbered out;
    until then that partition sends nothing new (Kafka's drain rule)."""
    c = core()
    send(c, "a")
    assert c.send_new("u-0", "x", record_count=1, created_ms=0, now_ms=0).producer_epoch == 0
    c.answered("a", error=ErrorCode.MESSAGE_TOO_LARGE, base_offset=-1, now_ms=1)
    assert c.producer_epoch == 1
    assert not c.may_send_new("u-0")   # x (epoch 0) still out: a new-epoch batch could overtake it
    c.answered("x", error=ErrorCode.NONE, base_offset=0, now_ms=3)
    assert c.send_new("u-0", "z", record_count=1, created_ms=0, now_ms=4) == \
        Stamp(producer_id=7, producer_epoch=1, base_sequence=0)


def test_the_last_epoch_asks_for_a_fresh_producer_id():
    c: ProducerCore = ProducerCore(retry_backoff_ms=10)
    assert c.producer_id_wanted and not c.may_send_new(TP)
    c.set_producer_id(producer_id=7, producer_epoch=PRODUCER_EPOCH_MAX)
    send(c, "a")
    c.answered("a", error=ErrorCode.MESSAGE_TOO_LARGE, base_offset=-1, now_ms=1)
    assert c.producer_id_wanted and not c.may_send_new(TP)
    c.set_producer_id(producer_id=8, producer_epoch=0)
    assert send(c, "b") == Stamp(producer_id=8, producer_epoch=0, base_sequence=0)


def test_a_failed_id_request_is_asked_again_after_the_backoff_and_batches_wait_for_it():
    """The chaos run's bug: InitProducerId unanswered stopped the producer for good. Rule: a
    failed request (no answer, or a retriable error) fails nothing and is asked again after
    retry_backoff_ms, one at a time; batches waiting for the identity are numbered only once it
    comes (here: the epoch ran out, so "a", refused before any append, waits for a fresh id)."""
    c: ProducerCore = ProducerCore(retry_backoff_ms=10, delivery_timeout_ms=1000)
    c.set_producer_id(producer_id=7, producer_epoch=PRODUCER_EPOCH_MAX)
    send(c, "a")
    assert c.answered("a", error=ErrorCode.OUT_OF_ORDER_SEQUENCE, base_offset=-1, now_ms=1) == []
    assert c.producer_id_wanted and c.id_request_due(1)
    for error, now in ((ErrorCode.REQUEST_TIMED_OUT, 100), (ErrorCode.NOT_CONTROLLER, 200)):
        c.id_request_sent(now - 50)
        assert not c.id_request_due(now - 50) and c.next_due_ms() == 1000   # one request out at a time
        assert c.id_request_failed(error=error, now_ms=now) == []             # nothing fails
        assert not c.id_request_due(now + 9) and c.next_due_ms() == now + 10  # the backoff
        assert c.retry_due(TP, now + 10) is None and not c.may_send_new(TP)   # no numbers yet
        assert c.expire(now + 10) == [] and c.fatal_error is None
    c.id_request_sent(210)
    c.set_producer_id(producer_id=8, producer_epoch=0)
    assert not c.id_request_due(10_000) and c.id_request_due_ms() is None
    assert resend(c, 220) == ("a", Stamp(producer_id=8, producer_epoch=0, base_sequence=0))
    assert c.answered("a", error=ErrorCode.NONE, base_offset=3, now_ms=221) == [Acknowledge(batch="a", base_offset=3)]
    assert send(c, "b", now_ms=222).base_sequence == 1


def test_a_batch_waiting_for_an_id_fails_by_its_own_delivery_timeout_as_never_sent():
    """Rule: the id request is retried for as long as batches wait; each fails by its own
    delivery timeout, as not written (it was never sent under the identity it waits for)."""
    c: ProducerCore = ProducerCore(retry_backoff_ms=10, delivery_timeout_ms=1000)
    c.set_producer_id(producer_id=7, producer_epoch=PRODUCER_EPOCH_MAX)
    send(c, "a")
    c.answered("a", error=ErrorCode.OUT_OF_ORDER_SEQUENCE, base_offset=-1, now_ms=1)
    now = 1
    while now < 1000:
        c.id_request_sent(now)
        c.id_request_failed(error=ErrorCode.NETWORK_EXCEPTION, now_ms=now + 5)
        now += 15
    (fail,) = c.expire(1000)
    assert isinstance(fail, Fail) and fail.batch == "a" and not fail.outcome_unknown
    assert fail.error == ErrorCode.REQUEST_TIMED_OUT and c.id_request_due_ms() is not None   # still asking


def test_a_refused_id_request_fails_waiting_batches_and_a_fatal_one_stops_asking():
    """Not retriable (INVALID_CONFIG): the batches waiting for numbers fail with it, as never
    sent, and the request goes again after the backoff for later ones. Fatal (fenced): the
    same, and the core asks no more."""
    c: ProducerCore = ProducerCore(retry_backoff_ms=10, delivery_timeout_ms=1000)
    c.set_producer_id(producer_id=7, producer_epoch=PRODUCER_EPOCH_MAX)
    send(c, "a")
    c.answered("a", error=ErrorCode.OUT_OF_ORDER_SEQUENCE, base_offset=-1, now_ms=1)
    c.id_request_sent(1)
    (fail,) = c.id_request_failed(error=ErrorCode.INVALID_CONFIG, now_ms=2)
    assert isinstance(fail, Fail) and fail.batch == "a" and fail.error == ErrorCode.INVALID_CONFIG
    assert not fail.outcome_unknown and "InitProducerId answered INVALID_CONFIG" in fail.reason
    assert c.outstanding(TP) == 0 and c.fatal_error is None and c.id_request_due(12)
    c.id_request_sent(12)
    assert c.id_request_failed(error=ErrorCode.INVALID_PRODUCER_EPOCH, now_ms=13) == []
    assert c.fatal_error == ErrorCode.INVALID_PRODUCER_EPOCH and c.id_request_due_ms() is None


def test_at_most_five_batches_outstanding_per_partition():
    """The leader keeps a producer's last 5 batches: more outstanding could not be recognised as
    duplicates on retry, so the core refuses the setting and holds the window."""
    with pytest.raises(ValueError, match="in_flight_per_partition_max=6 is above 5"):
        ProducerCore(in_flight_per_partition_max=6)
    c = core(in_flight_per_partition_max=5)
    for i in range(5):
        send(c, f"b{i}")
    assert not c.may_send_new(TP)
    c.expire(1000)   # all failed to their callers, yet still in flight: still counted
    assert not c.may_send_new(TP)


def test_without_idempotence_batches_carry_no_numbers_and_go_one_at_a_time():
    c: ProducerCore = ProducerCore(idempotent=False, retry_backoff_ms=10)
    assert c.send_new(TP, "a", record_count=1, created_ms=0, now_ms=0).producer_id == -1
    assert not c.may_send_new(TP)
    c.no_answer("a", now_ms=1)
    assert resend(c, 11)[0] == "a"


def test_the_window_keeps_acknowledged_batches_behind_an_unfinished_one():
    """Rule: a retry must be among the leader's last 5 batches of the producer, or it cannot be
    answered with its offset (DUPLICATE_SEQUENCE). Batches acknowledged after an unfinished one
    therefore stay in the window until it finishes."""
    c = core(in_flight_per_partition_max=5)
    for i in range(5):
        send(c, f"b{i}")
    c.no_answer("b0", now_ms=1)          # b0 was appended, its answer lost
    resend(c, 20)                        # its retry is in flight
    for i in range(1, 5):
        c.answered(f"b{i}", error=ErrorCode.NONE, base_offset=i, now_ms=21)
    assert not c.may_send_new(TP)        # 4 more now would push b0 out of the leader's memory
    assert c.answered("b0", error=ErrorCode.NONE, base_offset=0, now_ms=22) == [Acknowledge(batch="b0", base_offset=0)]
    assert c.may_send_new(TP) and c.outstanding(TP) == 0


def test_a_retry_waiting_for_an_earlier_answer_sets_no_timer():
    """A retry blocked behind a batch in flight has no due time: a driver sleeping until its
    backoff ended would wake to nothing and spin until the answer came."""
    c = core()
    send(c, "a")
    send(c, "b")
    c.no_answer("a", now_ms=1)
    resend(c, 11)                                   # "a" in flight again
    c.answered("b", error=ErrorCode.NOT_LEADER_OR_FOLLOWER, base_offset=-1, now_ms=12)
    assert c.retry_due(TP, 100) is None
    assert c.next_due_ms() == 1000                  # the delivery timeout, not b's backoff (22)


def test_a_batch_awaiting_its_retry_keeps_its_numbers_when_an_earlier_one_fails():
    """The issue's bug, at unit scale: "a" fails by delivery timeout while "b" (sent, answer
    lost, so perhaps appended) waits for its retry. The old producer took a new epoch as soon as
    no request was in flight and renumbered "b": the leader then appended it a second time.
    Rule: "b" goes again with its own numbers; the new epoch waits for its outcome."""
    c = core()
    send(c, "a", now_ms=0)
    b = send(c, "b", now_ms=500)
    c.no_answer("a", now_ms=600)
    (fail,) = c.expire(1000)
    assert fail.batch == "a" and fail.outcome_unknown
    c.no_answer("b", now_ms=1001)                   # nothing in flight now
    assert resend(c, 1100) == ("b", b) and c.producer_epoch == 0
    c.answered("b", error=ErrorCode.NONE, base_offset=5, now_ms=1101)   # proves "a" written too
    assert c.producer_epoch == 0 and send(c, "c", now_ms=1102).base_sequence == 2


def test_a_batch_waiting_for_new_numbers_lets_the_numbered_ones_behind_it_go_first():
    """Found by the simulation (seed 291 isr/write): "b" and "c" were refused out of order behind
    "a" and waited, numbered, for their retry; "a" failed by its delivery timeout, then "b"'s
    retry was refused at the head. "b" then waited for new numbers until nothing numbered was
    outstanding, while "c", numbered, waited behind "b" for its retry: neither went until "b"'s
    own delivery timeout. Rule: "c" goes first as it is (it cannot be appended: "b"'s sequence
    never was), is refused, and the new epoch numbers "b" then "c"."""
    c = core()
    send(c, "a", now_ms=0)
    send(c, "b", now_ms=500)
    send(c, "c", now_ms=500)
    c.no_answer("a", now_ms=510)
    assert c.answered("b", error=ErrorCode.OUT_OF_ORDER_SEQUENCE, base_offset=-1, now_ms=511) == []
    assert c.answered("c", error=ErrorCode.OUT_OF_ORDER_SEQUENCE, base_offset=-1, now_ms=512) == []
    (fail,) = c.expire(1000)
    assert fail.batch == "a" and fail.outcome_unknown
    assert resend(c, 1000) == ("b", Stamp(producer_id=7, producer_epoch=0, base_sequence=1))
    assert c.answered("b", error=ErrorCode.OUT_OF_ORDER_SEQUENCE, base_offset=-1, now_ms=1001) == []
    assert c.next_due_ms() == 522                   # c's retry is due, not b's delivery timeout (1500)
    assert resend(c, 1020) == ("c", Stamp(producer_id=7, producer_epoch=0, base_sequence=2))
    assert c.answered("c", error=ErrorCode.OUT_OF_ORDER_SEQUENCE, base_offset=-1, now_ms=1021) == []
    assert c.producer_epoch == 1
    assert resend(c, 1031) == ("b", Stamp(producer_id=7, producer_epoch=1, base_sequence=0))
    assert c.retry_due(TP, 1100) is None            # one at a time, in order
    assert c.answered("b", error=ErrorCode.NONE, base_offset=9, now_ms=1032) == [Acknowledge(batch="b", base_offset=9)]
    assert resend(c, 1033) == ("c", Stamp(producer_id=7, producer_epoch=1, base_sequence=1))


@pytest.mark.parametrize("mutant,test", [
    ("producer_renumbers_sent_batches", test_a_batch_awaiting_its_retry_keeps_its_numbers_when_an_earlier_one_fails),
    ("producer_renumbers_unknown_refused",
     test_an_unanswered_batch_refused_later_is_failed_as_outcome_unknown_never_renumbered),
    ("producer_renumbers_unknown_refused",
     test_the_model_s_restamp_trace_a_refused_retry_of_an_unanswered_batch_is_not_renumbered),
    ("producer_retry_blocked_behind_unnumbered",
     test_a_batch_waiting_for_new_numbers_lets_the_numbered_ones_behind_it_go_first),
])
def test_the_rule_tests_fail_on_the_simulation_s_mutants(mutant, test):
    """Claim: these unit tests are not vacuous: with the rule patched out (tests/sim/mutants.py,
    the same mutants the simulation's regression seeds catch) the named test fails."""
    from sim import mutants
    with mutants.MUTANTS[mutant]():
        with pytest.raises((AssertionError, ValueError)):   # a failed check or a missing outcome
            test()
    test()
