"""Push replication in the replica core (dataplane/replica/push.py), driven by hand over MemoryLogs."""
from __future__ import annotations

import pytest

from common.batch import build_batch, iter_batches
from common.errors import ErrorCode
from dataplane.log.interface import LogConfig
from dataplane.log.memory import MemoryLog
from dataplane.replica.actions import ProposeIsr, Send, TruncateFully
from dataplane.replica.core import Replica
from dataplane.replica.events import (
    AppendEntries, AppendEntriesReply, FetchRequest, NewMetadata, ProduceRequest, Tick,
)
from test_replica_core import Node, batches_from, leader_past_retention, config, pump, state

PUSH = config(replication_mode="push")


def push_cluster(*, fetch_max_bytes=1024 * 1024, inflight=4, cfg=PUSH, st=None, **leader_kw) -> dict[int, Node]:
    nodes = {i: Node(i, fetch_max_bytes=fetch_max_bytes) for i in (1, 2, 3)}
    for i in (2, 3):
        nodes[i].replica.push_capable = True
    nodes[1].replica = Replica(replica_id=1, log=nodes[1].log, fetch_max_bytes=fetch_max_bytes,
                               push_inflight_max=inflight, push_capable=True, **{"fetch_backoff_ms": 10, **leader_kw})
    for n in nodes.values():
        n.step(NewMetadata(partition=st or state(), config=cfg))
    return nodes


def produce(node: Node, rid: int, acks: int = -1, value: bytes = b"v"):
    return node.step(ProduceRequest(request_id=rid, records=build_batch([value], timestamp_ms=0), acks=acks,
                                    timeout_ms=5000))


def test_leader_pushes_after_its_write_and_acks_all_completes_without_any_follower_fetch():
    """Claim: in push mode the leader sends append-entries right after the write; followers append,
    reply with written/flushed/match offsets, never fetch; the HW passes the batch and acks=all is
    released."""
    nodes = push_cluster()
    pump(nodes, now_ms=0, rounds=5)
    produce(nodes[1], 1)
    sent = [s.message for s in nodes[1].actions if isinstance(s, Send)]
    assert any(isinstance(m, AppendEntries) and m.records for m in sent)
    pump(nodes, now_ms=100, rounds=10)
    assert nodes[1].released()[1].error is ErrorCode.NONE
    for i in (2, 3):
        assert nodes[i].log.log_end_offset == nodes[1].log.log_end_offset
        assert not [m for m in nodes[i].sent() if isinstance(m, FetchRequest)]


def test_at_most_inflight_max_append_entries_per_follower():
    """Claim: with replies withheld, a follower never has more than push_inflight_max requests out."""
    nodes = push_cluster(inflight=2)
    pump(nodes, now_ms=0, rounds=5)
    leader = nodes[1]
    leader.take(Send)
    for rid in range(1, 8):
        produce(leader, rid, 1)
    to_2 = [s for s in leader.take(Send) if s.to_broker == 2 and isinstance(s.message, AppendEntries)]
    assert 1 <= len(to_2) <= 2
    assert len(leader.replica.progress[2].push_inflight) <= 2


def test_a_follower_far_behind_recovers_chunk_by_chunk_then_rejoins_the_normal_path():
    """Claim: a follower cut off while the leader wrote is brought up by a recovery loop that reads
    the log in chunks (one out at a time, no flush asked below waiting acks=all) and ends with the
    same log as the leader, back on the pipelined path."""
    nodes = push_cluster(fetch_max_bytes=150)
    pump(nodes, now_ms=0, rounds=5)
    leader = nodes[1]
    for rid in range(1, 30):
        produce(leader, rid, 1, b"x" * 60)
    pump(nodes, now_ms=100, rounds=40, drop=(3,))
    assert nodes[3].log.log_end_offset < leader.log.log_end_offset
    leader.step(Tick(now_ms=5000))  # its window timed out: recovery
    assert leader.replica.progress[3].push_recovering
    chunks = []
    for _ in range(200):
        out = [s for s in leader.take(Send) if s.to_broker == 3]
        assert len([s for s in out if s.message.records]) <= 1 or not leader.replica.progress[3].push_recovering
        for s in out:
            if isinstance(s.message, AppendEntries) and s.message.records:
                chunks.append(s.message)
        for s in out:
            nodes[3].step(s.message)
        for s in nodes[3].take(Send):
            leader.step(s.message)
        if nodes[3].log.log_end_offset == leader.log.log_end_offset and not leader.replica.progress[3].push_inflight:
            break
    assert len(chunks) >= 5 and not any(c.flush_after_append for c in chunks)
    assert nodes[3].log.read(0, max_bytes=1 << 20).records == leader.log.read(0, max_bytes=1 << 20).records
    assert not leader.replica.progress[3].push_recovering


def test_a_diverging_follower_is_truncated_by_the_epoch_rule_and_ignores_a_late_copy():
    """Claim: a follower holding batches of an old epoch the new leader never had is cut back to
    where that epoch ends on the leader and then receives the leader's batches; a diverging
    append-entries computed from another state of its log is ignored."""
    old = MemoryLog()
    old.append_as_leader(build_batch([b"a"], timestamp_ms=0), leader_epoch=1)
    old.append_as_leader(build_batch([b"stale"], timestamp_ms=0), leader_epoch=1)
    new = MemoryLog()
    new.append_as_leader(build_batch([b"a"], timestamp_ms=0), leader_epoch=1)
    leader, follower = Node(1, log=new), Node(2, log=old)
    leader.replica.push_capable = follower.replica.push_capable = True
    nodes = {1: leader, 2: follower}
    st = state(epoch=2, isr=(1, 2), replicas=(1, 2))
    for n in nodes.values():
        n.step(NewMetadata(partition=st, config=PUSH))
    late = AppendEntries(leader_id=1, leader_epoch=2, prev_offset=7, prev_epoch=1, records=b"", high_watermark=0,
                         diverging_epoch=1, diverging_end_offset=0)
    follower.step(late)
    assert follower.log.log_end_offset == 2
    pump(nodes, now_ms=0, rounds=20)
    values = [h.leader_epoch for _, h in iter_batches(follower.log.read(0, max_bytes=1 << 20).records)]
    assert values == [1, 2] and follower.log.log_end_offset == leader.log.log_end_offset


def test_stale_epoch_append_entries_is_fenced():
    """Claim: append-entries from an older leader epoch is refused FENCED_LEADER_EPOCH, nothing appended."""
    nodes = push_cluster(st=state(epoch=3))
    ready = nodes[2].replica.step(AppendEntries(leader_id=1, leader_epoch=2, prev_offset=0, prev_epoch=-1,
                                                records=build_batch([b"x"], timestamp_ms=0), high_watermark=0))
    replies = [s.message for s in ready.answers if isinstance(s.message, AppendEntriesReply)]
    assert [r.error for r in replies] == [ErrorCode.FENCED_LEADER_EPOCH] and ready.persist == ()


def test_flush_after_append_is_asked_only_under_durability_fsync():
    """Claim: with an acks=all request waiting, append-entries ask the follower to flush under
    durability=fsync (the HW counts flushed offsets) and never under durability=write (it counts
    written ones, so a flush would only hold the follower's answer)."""
    asked = {}
    for durability in ("fsync", "write"):
        nodes = push_cluster(cfg=config(replication_mode="push", durability=durability))
        pump(nodes, now_ms=0, rounds=5)
        nodes[1].take(Send)
        produce(nodes[1], 1)
        sends = nodes[1].take(Send)
        data = [s for s in sends if isinstance(s.message, AppendEntries) and s.message.records]
        assert {s.to_broker for s in data} == {2, 3}
        asked[durability] = {s.message.flush_after_append for s in data}
        for s in sends:
            nodes[s.to_broker].step(s.message)
        pump(nodes, now_ms=100, rounds=10)
        assert nodes[1].released()[1].error is ErrorCode.NONE
    assert asked == {"fsync": {True}, "write": {False}}


def _quiet_push_cluster(**cfg) -> dict[int, Node]:
    """A push leader run as the broker runs it (fetch_backoff_ms=0: a long-polling driver,
    push_heartbeat_ms=100), its followers caught up, flushed and told the HW."""
    nodes = push_cluster(fetch_backoff_ms=0, push_heartbeat_ms=100, cfg=config(replication_mode="push", **cfg))
    pump(nodes, now_ms=0, rounds=5)
    pump(nodes, rounds=50)  # until quiet: nothing in flight
    leader = nodes[1]
    assert leader.replica.epoch_durable and not any(p.push_inflight for p in leader.replica.progress.values())
    leader.step(Tick(now_ms=1200))
    for _ in range(3):   # a heartbeat or two carry the last HW and flushed offsets
        pump(nodes, rounds=5)
        leader.step(Tick(now_ms=leader.replica.now_ms + 100))
    pump(nodes, rounds=5)
    return nodes


def _beats(leader: Node) -> set[int]:
    return {s.to_broker for s in leader.take(Send) if isinstance(s.message, AppendEntries)}


def test_a_quiet_follower_hears_from_the_leader_once_per_share_of_the_lag_time():
    """Claim: a follower caught up, flushed, in the ISR and told the HW gets an empty
    append-entries only every QUIET_REFRESH of replica_lag_time_max_ms (2,500 ms of 10 s), not
    every push_heartbeat_ms; the core's next tick says so; and the lag rule never drops it."""
    nodes = _quiet_push_cluster(replica_lag_time_max_ms=10_000)
    leader = nodes[1]
    last = max(p.push_last_sent_ms for p in leader.replica.progress.values())
    assert leader.replica.next_tick_ms() == last + 2500
    leader.step(Tick(now_ms=last + 2499))
    assert not _beats(leader)
    leader.step(Tick(now_ms=last + 2500))
    beats = [s for s in leader.actions if isinstance(s, Send) and isinstance(s.message, AppendEntries)]
    assert {s.to_broker for s in beats} == {2, 3}
    for now in range(last + 2500, last + 30_000, 100):   # three lag times, quiet
        pump(nodes, rounds=5)
        leader.step(Tick(now_ms=now))
    assert leader.replica.state is not None and leader.replica.state.isr == (1, 2, 3)
    assert not [a for a in leader.actions if isinstance(a, ProposeIsr)], "a quiet follower was dropped"


@pytest.mark.parametrize("durability", ["write", "fsync"])
def test_news_for_a_follower_brings_its_heartbeat_back_to_push_heartbeat_ms(durability):
    """Claim: once there is news for a quiet follower, it hears within push_heartbeat_ms, not a
    share of the lag time. After an acks=1 write it appended: under durability=write the new HW
    it was not sent; under fsync the flush it has not reported (the HW waits on it)."""
    nodes = _quiet_push_cluster(replica_lag_time_max_ms=10_000, durability=durability)
    leader = nodes[1]
    now = leader.replica.now_ms
    produce(leader, 1, acks=1)
    pump(nodes, rounds=5)   # the followers append and answer
    progress = leader.replica.progress.values()
    if durability == "write":
        assert leader.replica.high_watermark == leader.log.log_end_offset
        assert all(p.push_hw_sent < leader.replica.high_watermark for p in progress)
    else:
        assert all(p.flushed_offset < p.match_offset == leader.log.log_end_offset for p in progress)
    assert leader.replica.next_tick_ms() <= now + 100
    leader.step(Tick(now_ms=now + 100))
    assert _beats(leader) == {2, 3}


def test_an_idle_follower_hears_from_the_leader_every_push_heartbeat_ms_not_at_every_reply():
    """Claim: a leader run with fetch_backoff_ms=0 (a long-polling driver) and push_heartbeat_ms=100
    answers a heartbeat reply with nothing until 100 ms have passed, so the two do not trade
    empty append-entries without pause; then it sends one (while it has news: a follower that
    is not in the ISR)."""
    nodes = push_cluster(fetch_backoff_ms=0, push_heartbeat_ms=100, st=state(isr=(1, 2)))
    pump(nodes, now_ms=0, rounds=5)
    pump(nodes, rounds=50)  # until quiet: nothing in flight
    leader = nodes[1]
    assert leader.replica.epoch_durable and not any(p.push_inflight for p in leader.replica.progress.values())
    leader.step(Tick(now_ms=1200))
    beats = [s for s in leader.take(Send) if isinstance(s.message, AppendEntries)]
    assert 3 in {s.to_broker for s in beats} and not any(s.message.records for s in beats)
    for s in beats:
        nodes[s.to_broker].step(s.message)
    for i in (2, 3):
        for s in nodes[i].take(Send):
            leader.step(s.message)
    leader.take(ProposeIsr)
    leader.step(Tick(now_ms=1299))
    assert 3 not in _beats(leader)
    leader.step(Tick(now_ms=1300))
    assert 3 in _beats(leader)


@pytest.mark.parametrize("follower_batches", [None, 0, 10])
def test_push_follower_ending_below_the_leaders_log_start_starts_over_there_and_rejoins_the_isr(
        follower_batches):
    """Claim: in push mode too, a follower whose log ends below the leader's log start (retention
    deleted what it lacks) is told to start over there, empties its log once, is brought up by
    append-entries from there and is proposed back into the ISR."""
    nodes = {1: Node(1, log=MemoryLog(config=LogConfig(segment_bytes=1024, retention_bytes=1024))),
             2: Node(2), 3: Node(3)}
    nodes[1].replica = Replica(replica_id=1, log=nodes[1].log, push_capable=True, fetch_backoff_ms=10)
    for i in (2, 3):
        nodes[i].replica.push_capable = True
    for n in nodes.values():
        n.step(NewMetadata(partition=state(isr=(1, 2)), config=PUSH))
    start = leader_past_retention(nodes, follower_batches=follower_batches)
    nodes[3].take(TruncateFully)
    nodes[1].take(ProposeIsr)
    nodes[1].step(Tick(now_ms=5000))  # its window timed out: recovery
    pump(nodes, now_ms=5000, rounds=60)
    assert [a.offset for a in nodes[3].take(TruncateFully)] == [start]
    follower, leader = nodes[3].log, nodes[1].log
    assert (follower.log_start_offset, follower.log_end_offset) == (start, leader.log_end_offset)
    assert batches_from(follower, start) == batches_from(leader, start)
    assert [p.new_isr for p in nodes[1].take(ProposeIsr)] == [(1, 2, 3)]
    assert not [m for m in nodes[3].sent() if isinstance(m, FetchRequest)]
