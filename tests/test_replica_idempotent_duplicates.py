"""The leader's answers to a retried idempotent batch (dataplane/replica/core.py's produce path
and producer_state.py), as the producer core relies on them (issue 12): a duplicate within the
leader's window of 5 batches is answered with its original offset only once the HW passes it
(acks=all), never at once; DUPLICATE_SEQUENCE, for an older one, is answered at once, before the
HW passes the batch, which is why the client fails it as outcome unknown."""
from __future__ import annotations

from common.batch import build_batch
from common.errors import ErrorCode
from dataplane.replica.events import ProduceRequest, Tick
from test_replica_core import cluster, pump


def idem(value: bytes, seq: int) -> bytes:
    return build_batch([value], timestamp_ms=0, producer_id=5, producer_epoch=0, base_sequence=seq)


def leader_of_three():
    nodes = cluster()
    leader = nodes[1]
    leader.step(Tick(now_ms=0))
    leader.released()
    return nodes, leader


def test_a_duplicate_within_the_window_waits_for_the_hw_and_gets_the_original_offset():
    nodes, leader = leader_of_three()
    leader.step(ProduceRequest(request_id=1, records=idem(b"a", 0), acks=-1, timeout_ms=1000))
    end = leader.log.log_end_offset
    leader.step(ProduceRequest(request_id=2, records=idem(b"a", 0), acks=-1, timeout_ms=1000))
    assert leader.released() == {}, "a duplicate of an uncommitted batch must not be answered yet"
    assert leader.log.log_end_offset == end, "the retry is not written again"
    pump(nodes)
    released = leader.released()
    assert released[1].error is released[2].error is ErrorCode.NONE
    assert released[2].base_offset == released[1].base_offset == 1
    assert leader.replica.high_watermark > released[2].base_offset


def test_duplicate_sequence_is_answered_at_once_before_the_hw_passes_the_batch():
    nodes, leader = leader_of_three()
    for seq in range(6):   # seq 0 leaves the window of the last 5 batches
        leader.step(ProduceRequest(request_id=10 + seq, records=idem(b"v%d" % seq, seq), acks=-1, timeout_ms=1000))
    assert leader.released() == {}
    leader.step(ProduceRequest(request_id=20, records=idem(b"v0", 0), acks=-1, timeout_ms=1000))
    released = leader.released()
    assert released[20].error is ErrorCode.DUPLICATE_SEQUENCE
    assert leader.replica.high_watermark <= 1, "seq 0 (offset 1) is not committed: a leader change may drop it"
