"""Idempotent producer state (dataplane/replica/producer_state.py) and its use by the replica core."""
from __future__ import annotations

import random

import pytest

from common.batch import build_batch, iter_batches
from common.errors import ErrorCode
from dataplane.log.memory import MemoryLog
from dataplane.replica.events import NewMetadata, ProduceRequest, Tick
from dataplane.replica.producer_state import ProducerStateTable
from test_replica_core import Node, config, pump, state


def header(pid=7, epoch=0, seq=0, count=1, ts=0):
    records = build_batch([b"v"] * count, timestamp_ms=ts, producer_id=pid, producer_epoch=epoch,
                          base_sequence=seq)
    return next(iter_batches(records))[1]


def test_sequence_rules_duplicate_gap_fenced_epoch_and_new_epoch():
    """Claim: the next sequence is accepted; a repeat of one of the last 5 batches is a duplicate with
    its offsets; a gap is OUT_OF_ORDER_SEQUENCE; an older epoch is INVALID_PRODUCER_EPOCH; a newer
    epoch must restart at 0; an unknown producer must start at 0 (else UNKNOWN_PRODUCER_ID)."""
    t = ProducerStateTable()
    assert t.check(header(seq=3)).error is ErrorCode.UNKNOWN_PRODUCER_ID
    assert t.check(header(seq=0)).error is ErrorCode.NONE
    t.record(header(seq=0, count=2), base_offset=10)
    assert t.check(header(seq=2)).error is ErrorCode.NONE and t.check(header(seq=2)).duplicate is None
    dup = t.check(header(seq=0, count=2))
    assert dup.error is ErrorCode.NONE and (dup.duplicate.base_offset, dup.duplicate.last_offset) == (10, 11)
    assert t.check(header(seq=5)).error is ErrorCode.OUT_OF_ORDER_SEQUENCE
    assert t.check(header(seq=1)).error is ErrorCode.OUT_OF_ORDER_SEQUENCE  # overlaps, not a repeat
    t.record(header(epoch=2, seq=0), base_offset=20)
    assert t.check(header(epoch=1, seq=1)).error is ErrorCode.INVALID_PRODUCER_EPOCH
    assert t.check(header(epoch=3, seq=4)).error is ErrorCode.OUT_OF_ORDER_SEQUENCE
    assert t.check(header(epoch=3, seq=0)).error is ErrorCode.NONE
    assert t.check(header(pid=-1, seq=-1)).error is ErrorCode.NONE  # not idempotent: no rules


def test_only_the_last_five_batches_answer_with_offsets_older_ones_are_duplicate_sequence():
    """Claim: at most 5 batches are kept per producer; a repeat of an older one is DUPLICATE_SEQUENCE."""
    t = ProducerStateTable()
    for i in range(8):
        t.record(header(seq=i), base_offset=100 + i)
    assert len(t.producers[7].batches) == 5
    assert t.check(header(seq=3)).duplicate.base_offset == 103
    assert t.check(header(seq=2)).error is ErrorCode.DUPLICATE_SEQUENCE


def test_sequences_wrap_at_int32():
    """Claim: after sequence 2**31-1 comes 0 (not a gap, not a fenced epoch)."""
    t = ProducerStateTable()
    t.record(header(seq=0), base_offset=0)
    t.producers[7].batches[-1] = t.producers[7].batches[-1].__class__(
        base_sequence=0x7FFFFFFE, last_sequence=0x7FFFFFFF, base_offset=0, last_offset=1)
    assert t.check(header(seq=0)).error is ErrorCode.NONE


def test_bounded_and_idle_producers_expire():
    """Claim: at most producers_max producers are kept (least recently written goes first), and a
    producer idle longer than producer_idle_ms_max is forgotten when time passes."""
    t = ProducerStateTable(producers_max=3, producer_idle_ms_max=100)
    for pid in range(5):
        t.record(header(pid=pid, ts=pid * 10), base_offset=pid)
    assert sorted(t.producers) == [2, 3, 4]
    assert t.expire(now_ms=125) == 1 and sorted(t.producers) == [3, 4]
    assert t.expire(now_ms=1000) == 2 and len(t) == 0
    with pytest.raises(ValueError, match="producers_max"):
        ProducerStateTable(producers_max=0)


WEEK_MS = 7 * 24 * 3600 * 1000


def test_a_producer_is_idle_by_the_replicas_clock_not_by_its_records_timestamps():
    """Claim (found with kafka-python and aiokafka replaying records stamped in the past): a
    producer's idle time runs from when the replica wrote its batch, or from the batch's timestamp
    if later; after a scan of the log (which knows only timestamps), from the scan."""
    now = 10 * WEEK_MS
    t = ProducerStateTable(producer_idle_ms_max=WEEK_MS)
    t.record(header(seq=0, ts=now - 2 * WEEK_MS), base_offset=0, seen_ms=now)
    assert t.expire(now + 1000) == 0 and t.check(header(seq=1, ts=now - 2 * WEEK_MS)).error is ErrorCode.NONE
    assert t.next_expiry_ms() == now + WEEK_MS + 1
    assert t.expire(now + WEEK_MS + 1) == 1
    scanned = ProducerStateTable(producer_idle_ms_max=WEEK_MS)
    scanned.record(header(seq=0, ts=now - 2 * WEEK_MS), base_offset=0)
    scanned.seen_at(now)
    assert scanned.expire(now + 1000) == 0 and list(scanned.producers) == [7]


def test_a_leader_keeps_a_producer_that_sends_old_timestamps():
    """Claim: on the core, an idempotent producer whose records are stamped two weeks before the
    leader's wall clock gets its second batch accepted, not UNKNOWN_PRODUCER_ID (the Tick between
    them expires idle producers)."""
    nodes = {i: Node(i) for i in (1, 2, 3)}
    for n in nodes.values():
        n.step(NewMetadata(partition=state(), config=config()))
    pump(nodes)
    leader = nodes[1]
    wall = 2 * WEEK_MS   # idem() stamps its records at 0
    leader.step(Tick(now_ms=leader.replica.now_ms + 10, wall_ms=wall))
    idem(leader, 1, 0, acks=1)
    leader.step(Tick(now_ms=leader.replica.now_ms + 1000, wall_ms=wall + 1000))
    idem(leader, 2, 1, acks=1)
    released = leader.released()
    assert released[1].error is ErrorCode.NONE
    assert released[2].error is ErrorCode.NONE, released[2]


def test_rebuild_from_the_log_matches_state_built_by_appends():
    """Claim (seed 5): scanning a log's batch headers gives the same table as recording each append."""
    rng = random.Random(5)
    log, live = MemoryLog(), ProducerStateTable()
    next_seq: dict[int, int] = {}
    for _ in range(200):
        pid = rng.randint(0, 9)
        count = rng.randint(1, 4)
        records = build_batch([b"x"] * count, timestamp_ms=rng.randint(0, 1000), producer_id=pid,
                              producer_epoch=0, base_sequence=next_seq.get(pid, 0))
        next_seq[pid] = next_seq.get(pid, 0) + count
        base = log.log_end_offset
        log.append_as_leader(records, leader_epoch=1)
        live.record(next(iter_batches(records))[1], base_offset=base)
    rebuilt = ProducerStateTable()
    rebuilt.rebuild(log, chunk_bytes=300)
    assert {p: (e.epoch, list(e.batches)) for p, e in rebuilt.producers.items()} == \
           {p: (e.epoch, list(e.batches)) for p, e in live.producers.items()}, "seed=5"


def idem(node, rid, seq, *, acks=-1, epoch=0, pid=42):
    records = build_batch([f"r{seq}".encode()], timestamp_ms=0, producer_id=pid, producer_epoch=epoch,
                          base_sequence=seq)
    return node.step(ProduceRequest(request_id=rid, records=records, acks=acks, timeout_ms=1000))


def test_leader_answers_a_retried_batch_with_its_original_offset_and_writes_it_once():
    """Claim: a retry of a written batch gets the original offset, no second copy in the log; a
    gap is refused OUT_OF_ORDER_SEQUENCE and writes nothing."""
    nodes = {i: Node(i) for i in (1, 2, 3)}
    for n in nodes.values():
        n.step(NewMetadata(partition=state(), config=config()))
    leader = nodes[1]
    idem(leader, 1, 0)
    pump(nodes)
    first = leader.released()[1]
    end = leader.log.log_end_offset
    idem(leader, 2, 0)
    again = leader.released()[2]
    assert again.error is ErrorCode.NONE and again.base_offset == first.base_offset
    assert leader.log.log_end_offset == end
    idem(leader, 3, 5)
    assert leader.released()[3].error is ErrorCode.OUT_OF_ORDER_SEQUENCE
    assert leader.log.log_end_offset == end


def test_producer_state_survives_a_leader_change():
    """Claim: followers learn producer state from appended batches, so after a leader change the new
    leader still answers a retry of a batch the old leader wrote with its offset."""
    nodes = {i: Node(i) for i in (1, 2, 3)}
    for n in nodes.values():
        n.step(NewMetadata(partition=state(), config=config()))
    idem(nodes[1], 1, 0)
    pump(nodes)
    idem(nodes[1], 2, 1)
    pump(nodes, now_ms=0, rounds=5)
    offsets = nodes[1].released()
    assert offsets[2].error is ErrorCode.NONE
    for n in nodes.values():
        n.step(NewMetadata(partition=state(leader=2, epoch=2), config=config()))
    pump(nodes, now_ms=200, rounds=5)
    idem(nodes[2], 3, 1)
    pump(nodes, now_ms=400, rounds=5)
    assert nodes[2].released()[3].base_offset == offsets[2].base_offset
    # And a restarted replica rebuilds it from its log.
    fresh = Node(3, log=nodes[3].log)
    assert fresh.replica.producer_state.producers[42].last_sequence == 1
