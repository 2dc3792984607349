"""Replica core, one test per claim of docs/design.md#protocol-rules-and-where-they-live (leader, follower, fencing, ISR, elections).

Each test drives `Replica.step` by hand over MemoryLogs; `Node` applies the
persist actions the way the broker will, and time only moves through Tick.
"""
from __future__ import annotations

import pytest

from common.batch import build_batch, iter_batches
from common.errors import ErrorCode
from dataplane.log.interface import LogConfig
from dataplane.log.memory import MemoryLog
from dataplane.replica.actions import (
    Append, Flush, ProposeIsr, RefreshMetadata, Rejected, ReleaseProduce, ReportElection, Send, StopLeading,
    Truncate, TruncateFully,
)
from dataplane.replica.core import Replica, Role
from dataplane.replica.events import (
    FetchRequest, FetchResponse, FlushDone, IsrChangeAccepted, IsrChangeRefused, NewMetadata, ProduceRequest,
    StillFetching, Tick, WriteDone,
)
from dataplane.replica.state import PartitionState, ReplicationConfig
from sim.disk import apply_persist


class Node:
    """A replica with its log; completes writes (and flushes, if auto_flush) at once."""

    def __init__(self, replica_id: int, *, log: MemoryLog | None = None, auto_flush: bool = True,
                 fetch_max_bytes: int = 1024 * 1024, unclean_start: bool = False,
                 written_under_write: bool = False) -> None:
        self.log = log if log is not None else MemoryLog()
        self.replica = Replica(replica_id=replica_id, log=self.log, fetch_backoff_ms=10, flush_debounce_ms=5,
                               fetch_max_bytes=fetch_max_bytes, unclean_start=unclean_start,
                               written_under_write=written_under_write)
        self.auto_flush = auto_flush
        self.actions: list = []

    def step(self, event):
        ready = self.replica.step(event)
        self.actions.extend(ready.actions)
        written, flushes = apply_persist(self.log, ready)
        if written:
            self.step(WriteDone(last_offset=written[-1]))
        if flushes and self.auto_flush:
            self.step(FlushDone(flushed_offset=self.log.flush()))
        return ready

    def take(self, kind) -> list:
        found = [a for a in self.actions if isinstance(a, kind)]
        self.actions = [a for a in self.actions if not isinstance(a, kind)]
        return found

    def sent(self) -> list:
        return [s.message for s in self.take(Send)]

    def released(self) -> dict[int, ReleaseProduce]:
        return {r.request_id: r for r in self.take(ReleaseProduce)}


def batch(*values: bytes) -> bytes:
    return build_batch(list(values) or [b"x"], timestamp_ms=0)


def state(*, leader=1, epoch=1, pepoch=None, isr=(1, 2, 3), replicas=(1, 2, 3), fence=False):
    return PartitionState(replicas=replicas, isr=isr, leader=leader, leader_epoch=epoch,
                          partition_epoch=epoch if pepoch is None else pepoch, fenced_for_election=fence)


def config(**kw) -> ReplicationConfig:
    return ReplicationConfig(**kw)


def cluster(cfg: ReplicationConfig | None = None, *, auto_flush=True, st=None) -> dict[int, Node]:
    nodes = {i: Node(i, auto_flush=auto_flush) for i in (1, 2, 3)}
    for n in nodes.values():
        n.step(NewMetadata(partition=st or state(), config=cfg or config()))
    return nodes


def pump(nodes: dict[int, Node], *, rounds: int = 10, now_ms: int | None = None, drop=()) -> None:
    """Deliver follower fetches and leader answers until quiet (drop: replica ids cut off)."""
    for _ in range(rounds):
        moved = False
        for i, n in nodes.items():
            for s in n.take(Send):
                if s.to_broker in nodes and s.to_broker not in drop and i not in drop:
                    nodes[s.to_broker].step(s.message)
                    moved = True
        if not moved:
            if now_ms is None:
                return
            now_ms += 20
            for i, n in nodes.items():
                if i not in drop:
                    n.step(Tick(now_ms=now_ms))


def produce(node: Node, rid: int, acks: int = -1, *values: bytes, timeout_ms: int = 1000):
    return node.step(ProduceRequest(request_id=rid, records=batch(*values), acks=acks, timeout_ms=timeout_ms))


# ------------------------------------------------------------------ leader


def test_new_leader_starts_its_epoch_with_a_control_batch_and_assigns_offsets_after_it():
    """Claim: a new leader appends an epoch-start batch; produced batches get the next offsets."""
    nodes = cluster()
    leader = nodes[1]
    assert leader.replica.role is Role.LEADER and leader.log.log_end_offset == 1
    assert leader.replica.epoch_start_offset == 0
    ready = produce(leader, 1, 1, b"a", b"b")
    append = [a for a in ready.persist if isinstance(a, Append)][0]
    assert (append.base_offset, append.last_offset, append.leader_epoch) == (1, 2, 1)
    assert [h.is_control for _, h in iter_batches(leader.log.read(0, max_bytes=1 << 20).records)] == [True, False]


def test_acks_0_1_all_release_at_their_own_points_through_one_path():
    """Claim: acks=0 is released with the append, acks=1 on WriteDone, acks=all only once the HW passes it."""
    nodes = cluster()
    leader = nodes[1]
    leader.step(Tick(now_ms=0))
    leader.released()
    ready = leader.replica.step(ProduceRequest(request_id=10, records=batch(), acks=0, timeout_ms=100))
    assert [r.request_id for r in ready.release] == [10]
    apply_persist(leader.log, ready)
    ready = leader.replica.step(ProduceRequest(request_id=11, records=batch(), acks=1, timeout_ms=100))
    written, _ = apply_persist(leader.log, ready)
    assert ready.release == ()
    ready = leader.replica.step(WriteDone(last_offset=written[-1]))
    assert [r.request_id for r in ready.release] == [11]
    produce(leader, 12, -1)
    assert 12 not in leader.released()
    pump(nodes)
    released = leader.released()
    assert released[12].error is ErrorCode.NONE and released[12].base_offset == 3
    assert leader.replica.high_watermark == 4


def test_fsync_counts_flushed_offsets_write_counts_written():
    """Claim: under fsync a follower's unflushed data does not move the HW; under write it does."""
    for durability, expect_hw in (("fsync", 0), ("write", 2)):
        nodes = cluster(config(durability=durability), auto_flush=False)
        nodes[1].step(FlushDone(flushed_offset=nodes[1].log.flush()))  # the leader's own data is flushed
        produce(nodes[1], 1, 1)
        nodes[1].step(FlushDone(flushed_offset=nodes[1].log.flush()))
        pump(nodes)
        assert nodes[1].replica.high_watermark == expect_hw, durability


def test_follower_counts_only_its_matched_prefix():
    """Claim: a follower whose flushed log holds an old epoch's tail the leader lacks is not counted for it."""
    stale = MemoryLog()
    stale.append_as_leader(batch(b"a"), leader_epoch=0)
    stale.append_as_leader(batch(b"old1"), leader_epoch=0)
    stale.append_as_leader(batch(b"old2"), leader_epoch=0)
    stale.flush()  # [0, 3) in epoch 0, flushed
    leader_log = MemoryLog()
    leader_log.append_as_leader(batch(b"a"), leader_epoch=0)
    leader_log.flush()
    nodes = {1: Node(1, log=leader_log), 2: Node(2, log=stale), 3: Node(3)}
    for n in nodes.values():
        n.step(NewMetadata(partition=state(isr=(1, 2)), config=config()))
    # Before any answer, replica 2 reports flushed=3 but nothing is verified yet.
    assert nodes[1].replica.high_watermark == 0
    req = nodes[2].sent()[0]
    assert (req.fetch_offset, req.last_fetched_epoch, req.flushed_offset) == (3, 0, 3)
    nodes[1].step(req)
    answer = nodes[1].sent()
    resp = [m for m in answer if isinstance(m, FetchResponse) and m.fetch_offset == 3][0]
    assert (resp.diverging_epoch, resp.diverging_end_offset) == (0, 1)
    assert nodes[1].replica.stored_offsets()[2] == 0
    assert nodes[1].replica.high_watermark == 0


def test_divergence_truncates_only_at_the_epoch_end():
    """Claim: the follower truncates exactly where its last epoch ends on the leader, never on mere overlap."""
    leader_log, follower_log = MemoryLog(), MemoryLog()
    for log in (leader_log, follower_log):
        log.append_as_leader(batch(b"a"), leader_epoch=1)
        log.append_as_leader(batch(b"b"), leader_epoch=1)
    follower_log.append_as_leader(batch(b"lost"), leader_epoch=1)     # epoch-1 tail the leader lacks
    follower_log.append_as_leader(batch(b"lost2"), leader_epoch=1)
    leader_log.append_as_leader(batch(b"new"), leader_epoch=2)
    for log in (leader_log, follower_log):
        log.flush()
    leader, follower = Node(1, log=leader_log), Node(2, log=follower_log)
    st = state(leader=1, epoch=3, isr=(1, 2), replicas=(1, 2))
    leader.step(NewMetadata(partition=st, config=config()))
    follower.step(NewMetadata(partition=st, config=config()))
    leader.step(follower.sent()[0])
    follower.step(leader.sent()[0])
    truncates = follower.take(Truncate)
    assert truncates == [Truncate(offset=2)]
    assert follower.log.log_end_offset == 2
    # The next fetch (2, epoch 1) matches: data flows, no further truncation.
    pump({1: leader, 2: follower})
    assert follower.take(Truncate) == []
    assert follower.log.log_end_offset == leader.log.log_end_offset == 4


def test_behind_follower_is_not_truncated():
    """Claim: a follower that is merely behind in the leader's epoch gets data, not a divergence."""
    nodes = cluster()
    produce(nodes[1], 1, 1, b"a")
    req = FetchRequest(replica_id=2, fetch_offset=1, last_fetched_epoch=1, flushed_offset=1, current_leader_epoch=1)
    nodes[1].step(req)
    resp = [m for m in nodes[1].sent() if m.fetch_offset == 1][0]
    assert not resp.diverging and resp.records


def test_min_insync_replicas_refuses_and_fails_after_append():
    """Claim: acks=all is refused with NOT_ENOUGH_REPLICAS when |ISR| < min ISR at append time,
    and released with NOT_ENOUGH_REPLICAS_AFTER_APPEND when the ISR drops below it while waiting."""
    nodes = cluster(config(min_insync_replicas=2), st=state(isr=(1,)))
    produce(nodes[1], 1, -1)
    assert nodes[1].released()[1].error is ErrorCode.NOT_ENOUGH_REPLICAS
    assert nodes[1].log.log_end_offset == 1  # nothing appended
    nodes = cluster(config(min_insync_replicas=2), st=state(isr=(1, 2)))
    produce(nodes[1], 2, -1)
    assert 2 not in nodes[1].released()
    nodes[1].step(NewMetadata(partition=state(isr=(1,), pepoch=2), config=config(min_insync_replicas=2)))
    assert nodes[1].released()[2].error is ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND


def test_a_config_change_of_a_partition_that_did_not_change_applies_at_once():
    """Claim: metadata with the same epochs and a new topic config (an alter: the controller
    bumps no epoch for it) is taken: a raised min_insync_replicas refuses the next acks=all.
    The core kept the config of its last epoch change, so an alter applied only at the next
    leader or ISR change."""
    nodes = cluster(config(), st=state(isr=(1, 2)))
    produce(nodes[1], 1, -1)
    pump(nodes)
    assert nodes[1].released()[1].error is ErrorCode.NONE
    nodes[1].step(NewMetadata(partition=state(isr=(1, 2)), config=config(min_insync_replicas=3)))
    produce(nodes[1], 2, -1)
    assert nodes[1].released()[2].error is ErrorCode.NOT_ENOUGH_REPLICAS
    # Older news of the same leader epoch changes nothing.
    nodes[1].step(NewMetadata(partition=state(isr=(1, 2), pepoch=2), config=config(min_insync_replicas=3)))
    nodes[1].step(NewMetadata(partition=state(isr=(1, 2), pepoch=1), config=config()))
    produce(nodes[1], 3, -1)
    assert nodes[1].released()[3].error is ErrorCode.NOT_ENOUGH_REPLICAS


def test_produce_times_out_on_tick():
    """Claim: an acks=all request still waiting at its deadline is released with REQUEST_TIMED_OUT."""
    nodes = cluster()
    produce(nodes[1], 5, -1, timeout_ms=100)
    nodes[1].step(Tick(now_ms=99))
    assert 5 not in nodes[1].released()
    nodes[1].step(Tick(now_ms=100))
    release = nodes[1].released()[5]
    assert release.error is ErrorCode.REQUEST_TIMED_OUT
    # The answer says what it waited for: the followers that never fetched it.
    reason = release.reason
    assert "replica 2 at 0 (no fetch from it in this epoch)" in reason, reason
    assert "replica 3 at 0" in reason and "commit_policy=isr" in reason, reason


def test_consumers_read_only_below_the_high_watermark():
    """Claim: a consumer fetch (replica id -1) returns only batches below the HW."""
    nodes = cluster()
    produce(nodes[1], 1, -1, b"committed")
    pump(nodes)
    hw = nodes[1].replica.high_watermark
    produce(nodes[1], 2, 1, b"not yet")
    assert nodes[1].log.log_end_offset > hw
    nodes[1].step(FetchRequest(replica_id=-1, fetch_offset=0))
    resp = [m for m in nodes[1].sent() if m.fetch_offset == 0 and m.leader_id == 1][-1]
    offsets = [h.next_offset for _, h in iter_batches(resp.records)]
    assert offsets and max(offsets) <= hw
    nodes[1].step(FetchRequest(replica_id=-1, fetch_offset=hw))
    assert nodes[1].sent()[-1].records == b""


def epoch_two_over_a_flushed_epoch_one() -> dict[int, Node]:
    """Three replicas holding one flushed epoch-1 batch, told that replica 1 leads epoch 2."""
    logs = {i: MemoryLog() for i in (1, 2, 3)}
    for log in logs.values():
        log.append_as_leader(batch(b"old"), leader_epoch=1)
        log.flush()
    nodes = {i: Node(i, log=logs[i]) for i in (1, 2, 3)}
    for n in nodes.values():
        n.step(NewMetadata(partition=state(leader=1, epoch=2), config=config()))
    return nodes


def test_epoch_start_rule_holds_hw_until_the_new_epoch_is_stored():
    """Claim: a new leader's HW does not count old-epoch data until a required set stores its epoch start."""
    nodes = epoch_two_over_a_flushed_epoch_one()
    assert nodes[1].replica.epoch_start_offset == 1
    leader = nodes[1]
    # Followers report offset 1 (all of epoch 1) before fetching the epoch-start batch.
    for f in (2, 3):
        leader.step(FetchRequest(replica_id=f, fetch_offset=1, last_fetched_epoch=1, flushed_offset=1,
                                 current_leader_epoch=2))
    assert leader.replica.high_watermark == 0
    leader.sent()
    pump(nodes, now_ms=0)  # ticks let the leader flush its epoch-start batch (debounced)
    assert leader.replica.high_watermark == 2


def test_quorum_commits_on_q_replicas_while_one_is_silent():
    """Claim: commit_policy=quorum with q=2 releases acks=all with one follower cut off."""
    nodes = cluster(config(commit_policy="quorum", quorum_required_acks=2))
    produce(nodes[1], 1, -1)
    pump(nodes, drop=(3,))
    assert nodes[1].released()[1].error is ErrorCode.NONE


# ----------------------------------------------------------------- fencing


def test_stale_fetch_is_refused_with_both_epochs():
    """Claim: a fetch carrying an older leader epoch gets FENCED_LEADER_EPOCH; the rejection names both epochs."""
    nodes = cluster(st=state(epoch=4))
    nodes[1].step(FetchRequest(replica_id=2, fetch_offset=0, current_leader_epoch=3))
    rejected = nodes[1].take(Rejected)[-1]
    assert (rejected.their_epoch, rejected.our_epoch, rejected.error) == (3, 4, ErrorCode.FENCED_LEADER_EPOCH)
    assert nodes[1].sent()[-1].error is ErrorCode.FENCED_LEADER_EPOCH
    assert nodes[1].replica.role is Role.LEADER


def test_follower_with_newer_epoch_makes_the_leader_stop():
    """Claim: a fetch with a newer epoch makes the leader stop leading and refresh metadata; produce is refused."""
    nodes = cluster()
    produce(nodes[1], 1, -1)
    nodes[1].step(FetchRequest(replica_id=2, fetch_offset=0, current_leader_epoch=2))
    assert nodes[1].take(StopLeading) and nodes[1].take(RefreshMetadata)
    assert nodes[1].sent()[-1].error is ErrorCode.UNKNOWN_LEADER_EPOCH
    assert nodes[1].released()[1].error is ErrorCode.NOT_LEADER_OR_FOLLOWER
    produce(nodes[1], 2, 1)
    assert nodes[1].released()[2].error is ErrorCode.NOT_LEADER_OR_FOLLOWER


def test_follower_drops_stale_responses_and_refreshes_on_newer():
    """Claim: a follower ignores a response from an older epoch and refreshes metadata on a newer one."""
    nodes = cluster(st=state(epoch=2))
    f = nodes[2]
    f.step(FetchResponse(leader_id=1, leader_epoch=1, fetch_offset=0, last_fetched_epoch=-1, records=batch()))
    assert f.log.log_end_offset == 0 and f.take(Rejected)[-1].their_epoch == 1
    f.step(FetchResponse(leader_id=1, leader_epoch=3, fetch_offset=0, last_fetched_epoch=-1, records=batch()))
    assert f.log.log_end_offset == 0 and f.take(RefreshMetadata)
    assert f.replica.role is Role.STOPPED


def test_duplicate_fetch_response_is_applied_once():
    """Claim: a response that answers an older state of the follower's log is dropped."""
    nodes = cluster()
    produce(nodes[1], 1, 1)
    req = nodes[2].sent()[0]
    nodes[1].step(req)
    resp = [m for m in nodes[1].sent() if m.fetch_offset == req.fetch_offset][0]
    nodes[2].step(resp)
    end = nodes[2].log.log_end_offset
    nodes[2].step(resp)
    assert nodes[2].log.log_end_offset == end == 2


def test_restarted_replica_refuses_to_lead_an_epoch_its_log_holds():
    """Claim: a fresh replica handed leadership of an epoch already in its log stops instead of leading."""
    log = MemoryLog()
    log.append_as_leader(batch(), leader_epoch=5)
    node = Node(1, log=log)
    node.step(NewMetadata(partition=state(epoch=5), config=config()))
    assert node.replica.role is Role.STOPPED and node.take(RefreshMetadata)
    assert log.log_end_offset == 1


def test_leader_serves_nothing_until_its_epoch_start_is_flushed():
    """Claim: before its epoch-start batch is flushed a new leader refuses produce and follower
    fetches (LEADER_NOT_AVAILABLE); once flushed it serves, and a restart then sees the epoch in
    its log and will not lead that epoch again (found by the simulation, seed=32 quorum fsync)."""
    nodes = cluster(auto_flush=False)
    leader = nodes[1]
    produce(leader, 1, -1)
    assert leader.released()[1].error is ErrorCode.LEADER_NOT_AVAILABLE
    leader.step(FetchRequest(replica_id=2, fetch_offset=0, current_leader_epoch=1))
    assert leader.sent()[-1].error is ErrorCode.LEADER_NOT_AVAILABLE
    flushes = leader.take(Flush)
    assert flushes == [Flush(up_to=1)]
    leader.step(FlushDone(flushed_offset=leader.log.flush()))
    produce(leader, 2, 1)
    assert leader.released()[2].error is ErrorCode.NONE
    leader.log.crash()
    again = Node(1, log=leader.log)
    again.step(NewMetadata(partition=state(), config=config()))
    assert again.replica.role is Role.STOPPED


# -------------------------------------------------------------------- ISR


def _leader_proposing_3_out(cfg: ReplicationConfig) -> Node:
    """The leader of (1, 2, 3) with an acks=all produce (request 1) waiting while follower 3 is
    silent past replica_lag_time_max_ms: its proposal to drop 3 is open (and taken)."""
    nodes = cluster(cfg)
    pump(nodes)
    leader = nodes[1]
    leader.take(ProposeIsr)
    produce(leader, 1, -1)
    pump(nodes, now_ms=0, rounds=40, drop=(3,))
    proposals = leader.take(ProposeIsr)
    assert proposals and proposals[0].new_isr == (1, 2)
    assert 1 not in leader.released()  # replica 3 still counts while the change is pending
    return leader


def test_isr_shrinks_after_lag_time_and_counts_the_union_until_accepted():
    """Claim: a follower silent past replica_lag_time_max_ms is proposed out; until the controller
    answers, the HW still needs it (union of old and proposed ISR); after, it does not."""
    cfg = config(replica_lag_time_max_ms=100)
    leader = _leader_proposing_3_out(cfg)
    leader.step(NewMetadata(partition=state(isr=(1, 2), pepoch=2), config=cfg))
    assert leader.replica.pending_isr is None
    assert leader.released()[1].error is ErrorCode.NONE


def _caught_up_leader(cfg: ReplicationConfig) -> tuple[Node, Replica, int]:
    """The leader of (1, 2, 3), every follower caught up, its ISR proposals taken: (its node,
    its core, its log end)."""
    nodes = cluster(cfg)
    pump(nodes)
    leader = nodes[1]
    leader.take(ProposeIsr)
    return leader, leader.replica, leader.replica.log_end_offset


def test_a_fetch_session_word_keeps_a_quiet_follower_caught_up_as_of_when_it_was_seen():
    """Claim (Tick.fetching): a follower whose fetch session holds it at the position the leader
    last stepped a fetch from, still the leader's log end, is caught up as of when it was seen
    fetching there, with no fetch stepped; `caught_up_due` asks for the words only once an ISR
    follower's clock has run out, and then for every ISR follower. Without a word the follower
    leaves the ISR after its lag time, as before."""
    cfg = config(replica_lag_time_max_ms=100)
    leader, r, end = _caught_up_leader(cfg)
    assert r.caught_up_due(100) == (), "nobody's clock has run out yet"
    assert r.caught_up_due(101) == (2, 3)
    leader.step(Tick(now_ms=150, fetching=(StillFetching(replica_id=2, fetch_offset=end, seen_ms=140),
                                           StillFetching(replica_id=3, fetch_offset=end, seen_ms=145))))
    assert leader.take(ProposeIsr) == []
    assert (r.progress[2].last_caught_up_ms, r.progress[3].last_caught_up_ms) == (140, 145)
    assert r.next_tick_ms() == 241, "the next look comes a lag time after the older word"
    leader.step(Tick(now_ms=250, fetching=(StillFetching(replica_id=2, fetch_offset=end, seen_ms=400),)))
    assert r.progress[2].last_caught_up_ms == 250, "a word is never later than the core's clock"
    assert [p.new_isr for p in leader.take(ProposeIsr)] == [(1, 2)], "no word from 3: it leaves the ISR"


def test_a_fetch_session_word_at_another_position_or_behind_new_records_moves_nothing():
    """Claim: the word counts only where Kafka's rule would count the fetch it stands for as
    caught up with nothing new to say: at the follower's last stepped position, and only while
    that is still the leader's log end (records appended since, or a position the core has not
    stepped, need a fetch stepped)."""
    cfg = config(replica_lag_time_max_ms=100)
    nodes = cluster(cfg)
    pump(nodes)
    leader = nodes[1]
    r = leader.replica
    end = r.log_end_offset
    produce(leader, 1, 1)   # appended, not fetched by anyone since
    leader.step(Tick(now_ms=150, fetching=(StillFetching(replica_id=2, fetch_offset=end, seen_ms=140),
                                           StillFetching(replica_id=3, fetch_offset=end + 1, seen_ms=140))))
    assert r.progress[2].last_caught_up_ms == 0 and r.progress[3].last_caught_up_ms == 0
    assert [p.new_isr for p in leader.take(ProposeIsr)] == [(1,)]



def test_a_follower_out_of_the_isr_seen_in_its_fetch_session_since_the_change_joins_again():
    """Claim (regression: replicas out of the ISR for minutes after 5,000 partitions opened):
    a follower whose newest stepped fetch was at the leader's log end, made before the ISR
    changed without it, is asked after (`caught_up_due`) at once and then after 1 s, 2 s, ... up
    to the lag time; a fetch session's word that it fetches there, seen since the change, brings
    it back as a fetch stepped now would. A word from before the change does not (the rule of
    the killed-follower regression below), nor does a quiet Tick."""
    cfg = config(replica_lag_time_max_ms=10_000)
    leader, r, end = _caught_up_leader(cfg)
    assert r.progress[3].fetch_offset == end
    leader.step(Tick(now_ms=50))
    leader.step(NewMetadata(partition=state(isr=(1, 2), pepoch=2), config=cfg))   # 3 went out at 50
    assert r.caught_up_due(50) == (3,) and r.next_tick_ms() == 50, "asked at once"
    leader.step(Tick(now_ms=50, fetching=(StillFetching(replica_id=3, fetch_offset=end, seen_ms=40),)))
    assert leader.take(ProposeIsr) == [], "seen before the change: stale"
    assert r.caught_up_due(1049) == () and r.next_tick_ms() == 1050
    leader.step(Tick(now_ms=1050))
    assert leader.take(ProposeIsr) == [] and r.next_tick_ms() == 3050, "no word: asked again after 2 s"
    leader.step(Tick(now_ms=3050, fetching=(StillFetching(replica_id=3, fetch_offset=end, seen_ms=3050),)))
    assert [p.new_isr for p in leader.take(ProposeIsr)] == [(1, 2, 3)]
    assert r.caught_up_due(4000) == (), "nobody left to ask after"


def test_a_refused_joiner_is_asked_after_on_its_doubling_interval_not_at_once():
    """Claim (review): after the controller refuses to add a follower (INELIGIBLE_REPLICA), the
    session is not asked after it at once again but when its interval, still doubling, ends:
    a controller that keeps refusing is not asked every retry interval by every quiet partition."""
    cfg = config(replica_lag_time_max_ms=10_000)
    leader, r, end = _caught_up_leader(cfg)
    leader.step(NewMetadata(partition=state(isr=(1, 2), pepoch=2), config=cfg))
    word = (StillFetching(replica_id=3, fetch_offset=end, seen_ms=0),)
    leader.step(Tick(now_ms=0, fetching=word))
    assert [p.new_isr for p in leader.take(ProposeIsr)] == [(1, 2, 3)]
    leader.step(IsrChangeRefused(leader_epoch=1, partition_epoch=2, new_isr=(1, 2, 3),
                                 error=ErrorCode.INELIGIBLE_REPLICA, reason="fenced"))
    assert r.caught_up_due(10) == (), "not asked again at once"
    assert r.next_tick_ms() == 1000, "but when the interval the last ask began ends"


def test_isr_expands_when_follower_reaches_the_high_watermark():
    """Claim: a replica outside the ISR that has stored up to the HW is proposed back in, and while
    the proposal is pending it is required for the HW."""
    cfg = config()
    nodes = cluster(cfg, st=state(isr=(1, 2)))
    produce(nodes[1], 1, -1)
    pump(nodes)
    proposals = nodes[1].take(ProposeIsr)
    assert proposals and proposals[-1].new_isr == (1, 2, 3)
    assert nodes[1].replica.required_isr() == frozenset({1, 2, 3})


def test_killed_follower_is_not_proposed_back_from_progress_it_made_before_the_isr_change():
    """Claim (regression): a follower that caught up and then died is shrunk out of the ISR; the
    leader's timer ticks never propose it back from its old progress, only a fetch from it made
    after the ISR change can."""
    cfg = config(replica_lag_time_max_ms=1000)
    nodes = cluster(cfg)
    leader = nodes[1]
    produce(leader, 1, -1)
    pump(nodes)
    assert leader.released()[1].error is ErrorCode.NONE
    leader.take(ProposeIsr)
    # Replica 3 dies now, caught up; the controller fences it and shrinks the ISR.
    leader.step(NewMetadata(partition=state(isr=(1, 2), pepoch=2), config=cfg))
    for t in range(20, 400, 20):
        leader.step(Tick(now_ms=t))
    pump({1: leader, 2: nodes[2]}, now_ms=400, rounds=10)
    assert leader.take(ProposeIsr) == []
    assert leader.replica.required_isr() == frozenset({1, 2})
    # A fetch from replica 3 itself, after the change, is fresh evidence: it may rejoin.
    nodes[3].step(Tick(now_ms=500))
    pump(nodes, now_ms=500, rounds=10)
    assert [p.new_isr for p in leader.take(ProposeIsr)][-1:] == [(1, 2, 3)]


def test_fenced_replica_is_never_proposed_into_the_isr():
    """Claim: a replica the metadata shows fenced is not proposed for the ISR even if it fetches."""
    cfg = config()
    nodes = cluster(cfg, st=state(isr=(1, 2)))
    nodes[1].step(NewMetadata(partition=state(isr=(1, 2)), config=cfg, fenced_replicas=frozenset({3})))
    produce(nodes[1], 1, -1)
    pump(nodes)
    assert nodes[1].take(ProposeIsr) == []
    assert nodes[1].released()[1].error is ErrorCode.NONE


def test_refused_isr_change_clears_the_pending_set_and_is_not_resent_at_once():
    """Claim: IsrChangeRefused matching the pending proposal drops it from the HW's required set
    (acks=all completes over the real ISR); a refusal of another proposal, or a stale-epoch refusal
    (an earlier copy may have been accepted), changes nothing."""
    cfg = config()
    nodes = cluster(cfg, st=state(isr=(1, 2)))
    leader = nodes[1]
    pump(nodes)
    assert leader.take(ProposeIsr)[-1].new_isr == (1, 2, 3)
    leader.step(IsrChangeRefused(leader_epoch=1, partition_epoch=1, new_isr=(1, 2),
                                 error=ErrorCode.INELIGIBLE_REPLICA))
    assert leader.replica.pending_isr == (1, 2, 3)
    leader.step(IsrChangeRefused(leader_epoch=1, partition_epoch=0, new_isr=(1, 2, 3),
                                 error=ErrorCode.INELIGIBLE_REPLICA))
    assert leader.replica.pending_isr == (1, 2, 3)
    leader.step(IsrChangeRefused(leader_epoch=1, partition_epoch=1, new_isr=(1, 2, 3),
                                 error=ErrorCode.INVALID_UPDATE_VERSION))
    assert leader.replica.pending_isr == (1, 2, 3)
    produce(leader, 1, -1)
    pump(nodes, now_ms=0, rounds=6, drop=(3,))
    assert 1 not in leader.released()  # 3 still counts while the proposal is open
    leader.step(IsrChangeRefused(leader_epoch=1, partition_epoch=1, new_isr=(1, 2, 3),
                                 error=ErrorCode.INELIGIBLE_REPLICA, reason="broker 3 is fenced"))
    assert leader.replica.pending_isr is None
    assert leader.released()[1].error is ErrorCode.NONE
    assert any(isinstance(n, Rejected) and "fenced" in n.reason for n in leader.actions)
    leader.step(Tick(now_ms=leader.replica.now_ms + 1))
    assert leader.take(ProposeIsr) == []


def test_an_accepted_isr_shrink_counts_the_hw_over_the_new_isr_before_the_metadata_brings_it():
    """Claim: the controller's answer accepting the leader's shrink settles it at once: acks=all
    waiting on the follower that left completes, without waiting for a metadata long-poll
    (stuck for seconds on a controller cut off, in the fault harness). An answer that is not
    exactly the open proposal as the next partition epoch changes nothing."""
    cfg = config(replica_lag_time_max_ms=100)
    leader = _leader_proposing_3_out(cfg)
    for wrong in (state(isr=(1, 2), pepoch=3),                        # not the next change
                  state(isr=(1, 3), pepoch=2),                        # not our proposal
                  state(isr=(1, 2), pepoch=2, replicas=(1, 2, 3, 4)),  # something else changed too
                  state(isr=(1, 2), epoch=2, pepoch=2)):              # another leader epoch
        leader.step(IsrChangeAccepted(partition=wrong))
        assert leader.replica.pending_isr == (1, 2) and 1 not in leader.released()
    leader.step(IsrChangeAccepted(partition=state(isr=(1, 2), pepoch=2)))
    assert leader.replica.pending_isr is None and leader.replica.state.isr == (1, 2)
    assert leader.replica.partition_epoch == 2
    assert leader.released()[1].error is ErrorCode.NONE
    # The metadata of that same change, when it comes, is old news.
    leader.step(NewMetadata(partition=state(isr=(1, 2), pepoch=2), config=cfg))
    assert leader.replica.state.isr == (1, 2) and leader.take(ProposeIsr) == []


@pytest.mark.parametrize("error", [ErrorCode.REQUEST_TIMED_OUT, ErrorCode.NOT_CONTROLLER, ErrorCode.UNKNOWN])
def test_isr_expansion_with_an_unknown_outcome_still_counts_the_joiner(error):
    """Claim (regression, lost records under controller churn): an answer that does not say the
    controller declined the expansion (a controller that lost its leadership before the commit
    answers REQUEST_TIMED_OUT; the next leader may still commit it) keeps the joiner in the HW's
    required set, so the joiner, elected later, holds every acknowledged record."""
    cfg = config()
    nodes = cluster(cfg, st=state(isr=(1, 2)))
    leader = nodes[1]
    pump(nodes)
    assert leader.take(ProposeIsr)[-1].new_isr == (1, 2, 3)
    leader.step(IsrChangeRefused(leader_epoch=1, partition_epoch=1, new_isr=(1, 2, 3), error=error,
                                 reason="controller 2 lost its leader view; the request may or may not take effect"))
    assert leader.replica.pending_isr == (1, 2, 3)
    assert leader.replica.required_isr() == frozenset({1, 2, 3})
    produce(leader, 1, -1)
    pump(nodes, now_ms=0, rounds=6, drop=(3,))
    assert 1 not in leader.released()  # 3 may already be in the committed ISR: it must hold the record
    # The committed change arrives by metadata and settles the proposal.
    leader.step(NewMetadata(partition=state(isr=(1, 2, 3), pepoch=2), config=cfg))
    assert leader.replica.pending_isr is None
    assert leader.replica.required_isr() == frozenset({1, 2, 3})


def test_client_with_a_newer_leader_epoch_does_not_stop_the_leader():
    """Claim (regression): a produce with a newer leader_epoch is refused UNKNOWN_LEADER_EPOCH and
    the leader keeps leading; only a replica's newer epoch stops it."""
    nodes = cluster()
    leader = nodes[1]
    ready = leader.step(ProduceRequest(request_id=1, records=batch(), acks=1, timeout_ms=1000, leader_epoch=5))
    assert [r.error for r in ready.release] == [ErrorCode.UNKNOWN_LEADER_EPOCH]
    assert not any(isinstance(n, StopLeading) for n in ready.notes)
    assert leader.replica.role is Role.LEADER
    ready = leader.step(ProduceRequest(request_id=2, records=batch(), acks=1, timeout_ms=1000, leader_epoch=1))
    assert leader.released()[2].error is ErrorCode.NONE


# --------------------------------------------------------------- election


def test_quorum_election_fence_flushes_then_reports_the_flushed_log():
    """Claim: on a quorum-election fence a replica stops serving the old epoch, flushes, and only
    then reports (last epoch, end offset) of its flushed log."""
    cfg = config(commit_policy="quorum", quorum_required_acks=2)
    nodes = cluster(cfg, auto_flush=False)
    nodes[1].step(FlushDone(flushed_offset=nodes[1].log.flush()))  # the leader's epoch start
    produce(nodes[1], 1, 1, b"a")
    pump(nodes)
    f = nodes[2]
    assert f.log.log_end_offset == 2 and f.log.flushed_offset < 2
    f.actions.clear()
    ready = f.step(NewMetadata(partition=state(leader=None, epoch=2, fence=True), config=cfg))
    assert [type(a) for a in ready.persist] == [Flush] and not f.take(ReportElection)
    # The old leader's answer at epoch 1 is refused now.
    f.step(FetchResponse(leader_id=1, leader_epoch=1, fetch_offset=2, last_fetched_epoch=1, records=batch()))
    assert f.log.log_end_offset == 2
    f.step(FlushDone(flushed_offset=f.log.flush()))
    report = f.take(ReportElection)
    assert report == [ReportElection(replica_id=2, fenced_epoch=2, last_epoch=1, end_offset=2)]


def test_election_report_names_only_the_flushed_prefix():
    """Claim: the report never includes data above the flushed offset."""
    cfg = config(commit_policy="quorum", quorum_required_acks=2)
    log = MemoryLog()
    log.append_as_leader(batch(), leader_epoch=1)
    log.flush()
    log.append_as_leader(batch(), leader_epoch=1)  # unflushed
    node = Node(2, log=log, auto_flush=False)
    node.step(NewMetadata(partition=state(leader=None, epoch=2, fence=True), config=cfg))
    assert not node.take(ReportElection)
    log.crash()  # the flush never completes
    node2 = Node(2, log=log, auto_flush=False)
    node2.step(NewMetadata(partition=state(leader=None, epoch=2, fence=True), config=cfg))
    assert node2.take(ReportElection) == [ReportElection(replica_id=2, fenced_epoch=2, last_epoch=1, end_offset=1)]


def test_unclean_write_replica_reports_marked_unclean_until_it_caught_up_or_led():
    """Claim: under durability=write a replica restarted after a crash still reports in a quorum
    election (there is no leader to catch up with during one), marked `unclean`; under fsync, or
    once it caught up with a leader, or once it led an epoch, its reports are clean."""
    fence = state(leader=None, epoch=2, fence=True)
    for durability, unclean in (("write", True), ("fsync", False)):
        cfg = config(commit_policy="quorum", quorum_required_acks=2, durability=durability)
        log = MemoryLog()
        log.append_as_leader(batch(), leader_epoch=1)
        log.flush()
        node = Node(2, log=log, unclean_start=True)
        node.step(NewMetadata(partition=fence, config=cfg))
        assert node.take(ReportElection) == [ReportElection(replica_id=2, fenced_epoch=2, last_epoch=1,
                                                            end_offset=1, unclean=unclean)], durability
        assert not node.take(Rejected)
    cfg = config(commit_policy="quorum", quorum_required_acks=2, durability="write")
    nodes = cluster(cfg, st=state(epoch=3))
    produce(nodes[1], 1, -1, b"a")
    pump(nodes)
    nodes[2] = Node(2, log=nodes[2].log, unclean_start=True)  # crashed and restarted
    nodes[2].step(NewMetadata(partition=state(epoch=3), config=cfg))
    assert nodes[2].replica.unclean_start
    pump(nodes)  # caught up with leader 1
    assert not nodes[2].replica.unclean_start
    nodes[3] = Node(3, log=nodes[3].log, unclean_start=True)
    nodes[3].step(NewMetadata(partition=state(leader=3, epoch=4, isr=(3,)), config=cfg))
    assert nodes[3].replica.role is Role.LEADER and not nodes[3].replica.unclean_start


def test_a_replica_that_took_records_under_write_stays_unclean_when_its_topic_moves_to_fsync():
    """Claim: a replica whose log took records under durability=write, restarted after a crash,
    reports `unclean` in a quorum election even when its topic is under fsync now: whether the
    alter came before the crash (the broker's record says so: `written_under_write`) or after
    the restart, while the replica has not caught up yet. The alter brings back nothing the
    crash took. A replica that never took records under write reports clean."""
    fsync = config(commit_policy="quorum", quorum_required_acks=2, durability="fsync")
    write = config(commit_policy="quorum", quorum_required_acks=2, durability="write")
    fence = state(leader=None, epoch=2, fence=True)

    def restarted(written_under_write: bool) -> Node:
        log = MemoryLog()
        log.append_as_leader(batch(), leader_epoch=1)
        log.flush()
        return Node(2, log=log, unclean_start=True, written_under_write=written_under_write)

    for written_under_write, unclean in ((True, True), (False, False)):   # altered before the crash
        node = restarted(written_under_write)
        node.step(NewMetadata(partition=fence, config=fsync))
        assert [r.unclean for r in node.take(ReportElection)] == [unclean], written_under_write
    node = restarted(False)   # altered after the restart, before it caught up
    node.step(NewMetadata(partition=state(epoch=1), config=write))
    node.step(NewMetadata(partition=state(epoch=1), config=fsync))
    node.step(NewMetadata(partition=fence, config=fsync))
    assert [r.unclean for r in node.take(ReportElection)] == [True]


def test_quorum_write_partition_elects_once_every_replica_reports_after_unclean_restarts():
    """Claim (regression, the chaos harness's kill_broker run): leader 1 and follower 2 of a
    quorum + write partition both restart after a crash before either caught up with a leader.
    Only replica 3 is clean, so n - q + 1 = 2 clean reports never come, and without a leader
    nobody can become clean: the partition stayed leaderless for good. Every replica up
    and reporting (two of them unclean) is enough for the controller's election."""
    from controller.decisions import QuorumElectionTracker, elect_leaders, fence_for_election
    from common.requests import ElectionReport
    from metadata_builders import add_topic, apply, cluster as image_cluster

    image = image_cluster(3)
    add_topic(image, "q", [[1, 2, 3]], commit_policy="quorum", durability="write")
    cfg = config(commit_policy="quorum", quorum_required_acks=2, durability="write")
    nodes = cluster(cfg, st=state(epoch=0))  # the image's partition: leader 1, epochs 0
    produce(nodes[1], 1, -1, b"a")
    pump(nodes)
    assert nodes[1].released()[1].error is ErrorCode.NONE
    for i in (1, 2):  # both crash (losing what was not flushed) and restart
        nodes[i].log.crash()
        nodes[i] = Node(i, log=nodes[i].log, unclean_start=True)
    assert [n.log.log_end_offset for n in nodes.values()] == [1, 0, 2]  # the record: only on 3
    apply(image, [fence_for_election(image, image.partition("q", 0))])
    p = image.partition("q", 0)
    tracker = QuorumElectionTracker()
    for i, n in nodes.items():
        n.step(NewMetadata(partition=state(leader=None, epoch=p.leader_epoch, pepoch=p.partition_epoch,
                                           fence=True), config=cfg))
        for r in n.take(ReportElection):
            assert tracker.add(image, ElectionReport(
                broker_id=r.replica_id, topic="q", partition=0, fenced_epoch=r.fenced_epoch,
                last_epoch=r.last_epoch, end_offset=r.end_offset, unclean=r.unclean)) is None
    assert [(r.broker_id, r.unclean) for r in tracker.reports(p)] == [(1, True), (2, True), (3, False)]
    [elected] = elect_leaders(image, tracker)
    assert elected.leader == 3 and elected.isr == (1, 2, 3)  # 3 holds the acknowledged record


def test_unknown_event_is_a_clear_error():
    """Claim: stepping something that is not an event names the type and the accepted ones."""
    with pytest.raises(TypeError, match="Replica.step got str"):
        Replica(replica_id=1, log=MemoryLog()).step("hello")


# ------------------------------------------------------------ plain values


def test_check_epoch_orders_stale_current_newer():
    """Claim: the one fencing comparison says stale / current / newer by epoch alone."""
    from common.epochs import EpochCheck, check_epoch
    assert check_epoch(theirs=3, ours=4) is EpochCheck.STALE
    assert check_epoch(theirs=4, ours=4) is EpochCheck.CURRENT
    assert check_epoch(theirs=5, ours=4) is EpochCheck.NEWER


@pytest.mark.parametrize("fields,match", [
    (dict(isr=(1, 9)), "not in replicas"),
    (dict(leader=9), "leader 9"),
    (dict(replicas=(), isr=(), leader=None), "at least one replica"),
    (dict(epoch=-1), "epochs must be >= 0"),
])
def test_partition_state_refuses_inconsistent_values(fields, match):
    """Claim: a PartitionState that cannot exist is refused with the field and value named."""
    kw = dict(leader=1, epoch=1, isr=(1, 2, 3), replicas=(1, 2, 3))
    kw.update(fields)
    with pytest.raises(ValueError, match=match):
        state(**kw)


def test_replication_config_refuses_unknown_policy():
    """Claim: an unknown commit policy is a clear error naming it."""
    with pytest.raises(ValueError, match="commit_policy 'most'"):
        ReplicationConfig(commit_policy="most")


def test_limits_must_be_non_negative_ints():
    """Claim: a bad limit is refused at construction, naming the argument."""
    with pytest.raises(ValueError, match="fetch_max_bytes"):
        Replica(replica_id=1, log=MemoryLog(), fetch_max_bytes=-1)


def test_produce_with_bad_acks_or_corrupt_batch_is_refused_without_append():
    """Claim: acks outside 0/1/-1 and a corrupt batch are refused with their codes; nothing is appended."""
    nodes = cluster()
    leader = nodes[1]
    end = leader.log.log_end_offset
    leader.step(ProduceRequest(request_id=1, records=batch(), acks=2, timeout_ms=10))
    bad = bytearray(batch())
    bad[-1] ^= 0xFF
    leader.step(ProduceRequest(request_id=2, records=bytes(bad), acks=1, timeout_ms=10))
    released = leader.released()
    assert released[1].error is ErrorCode.INVALID_REQUIRED_ACKS
    assert released[2].error is ErrorCode.CORRUPT_MESSAGE
    assert leader.log.log_end_offset == end


def test_list_offsets_earliest_latest_and_time_stay_below_hw():
    """Claim: list-offsets gives the log start, the HW as latest, and a timestamp lookup that
    sees only records below the HW."""
    nodes = cluster()
    leader = nodes[1]
    leader.step(ProduceRequest(request_id=1, records=build_batch([b"a"], timestamp_ms=100), acks=-1, timeout_ms=99))
    pump(nodes)
    leader.step(ProduceRequest(request_id=2, records=build_batch([b"b"], timestamp_ms=200), acks=1, timeout_ms=99))
    leader.step(ProduceRequest(request_id=3, records=build_batch([b"c"], timestamp_ms=300), acks=1, timeout_ms=99))
    r = leader.replica
    assert r.high_watermark == 2 and leader.log.log_end_offset == 4
    assert r.list_offset(-2) == (ErrorCode.NONE, 0, -1)
    assert r.list_offset(-1) == (ErrorCode.NONE, 2, -1)
    assert r.list_offset(100) == (ErrorCode.NONE, 1, 100)
    # offset 3 matches but is above the HW: no record found, as Kafka answers (not the HW)
    assert r.list_offset(250) == (ErrorCode.NONE, -1, -1)
    assert nodes[2].replica.list_offset(-1)[0] is ErrorCode.NOT_LEADER_OR_FOLLOWER


def test_a_new_leader_answers_offset_not_available_until_its_hw_passes_its_epoch_start():
    """Claim: list-offsets (latest, or by time) on a leader whose HW is still below its epoch
    start answers OFFSET_NOT_AVAILABLE (retriable) rather than an HW consumers may already be
    past; the log start is always known; once the followers store the epoch start, the HW is."""
    nodes = epoch_two_over_a_flushed_epoch_one()
    leader = nodes[1].replica
    assert leader.high_watermark < leader.epoch_start_offset == 1
    assert leader.list_offset(-1) == (ErrorCode.OFFSET_NOT_AVAILABLE, -1, -1)
    assert leader.list_offset(100) == (ErrorCode.OFFSET_NOT_AVAILABLE, -1, -1)
    assert leader.list_offset(-2) == (ErrorCode.NONE, 0, -1)
    assert ErrorCode.OFFSET_NOT_AVAILABLE.retriable
    pump(nodes, now_ms=0)  # ticks let the leader flush its epoch-start batch (debounced)
    assert leader.high_watermark >= leader.epoch_start_offset
    assert leader.list_offset(-1) == (ErrorCode.NONE, leader.high_watermark, -1)


def test_end_offset_for_epoch_answers_a_client_from_the_leaders_log():
    """Claim: a client's OffsetForLeaderEpoch gets where each epoch ends in the leader's log
    (the next epoch's start; the log end for the latest), after the client's own epoch is
    checked; a follower answers NOT_LEADER_OR_FOLLOWER."""
    nodes = epoch_two_over_a_flushed_epoch_one()
    pump(nodes, now_ms=0)
    leader = nodes[1]
    leader.step(ProduceRequest(request_id=1, records=batch(b"new"), acks=1, timeout_ms=99))
    r = leader.replica
    assert r.epoch_start_offset == 1 and leader.log.log_end_offset == 3
    assert r.end_offset_for_epoch(1) == (ErrorCode.NONE, 1, 1)  # epoch 1 ends where epoch 2 starts
    assert r.end_offset_for_epoch(2, 2) == (ErrorCode.NONE, 2, 3)
    assert r.end_offset_for_epoch(5) == (ErrorCode.NONE, 2, 3)  # the largest epoch at or below it
    assert r.end_offset_for_epoch(0) == (ErrorCode.NONE, 0, 0)  # before the first: where that starts (Kafka's)
    assert r.end_offset_for_epoch(2, 1)[0] is ErrorCode.FENCED_LEADER_EPOCH
    assert r.end_offset_for_epoch(2, 3)[0] is ErrorCode.UNKNOWN_LEADER_EPOCH
    assert nodes[2].replica.end_offset_for_epoch(2)[0] is ErrorCode.NOT_LEADER_OR_FOLLOWER


def _figure_8(monkeypatch, *, epoch_start_rule: bool) -> tuple[int, int]:
    """Raft's figure 8 on quorum q=2 of 3, elections by the controller's rule (greatest
    (last epoch, end offset) of flushed-log reports). Returns (A's HW after B stored the
    old-epoch entry x at offset 1, B's log end after following the next leader C)."""
    import dataplane.replica.core as core_module
    if not epoch_start_rule:
        real = core_module.next_high_watermark
        monkeypatch.setattr(core_module, "next_high_watermark", lambda **kw: real(**{**kw, "epoch_start_offset": -1}))
    cfg = config(commit_policy="quorum", quorum_required_acks=2)
    a, b, c = Node(1), Node(2, fetch_max_bytes=1), Node(3)
    nodes = {1: a, 2: b, 3: c}

    def meta(targets, **kw):
        for n in targets:
            n.step(NewMetadata(partition=state(**kw), config=cfg))

    def drop_all():
        for n in nodes.values():
            n.actions.clear()

    meta(nodes.values(), leader=1, epoch=1)
    pump(nodes, now_ms=0)                          # epoch-1 marker at 0 everywhere
    produce(a, 1, 1, b"x")                         # x at offset 1 (epoch 1), only on A
    drop_all()
    meta([b, c], leader=None, epoch=2, fence=True)  # A cut off; B and C report (1, 1)
    assert [r.end_offset for r in b.take(ReportElection) + c.take(ReportElection)] == [1, 1]
    meta([b, c], leader=3, epoch=3)                # C wins the tie; its marker y at 1 (epoch 3)
    drop_all()                                     # ... and C is cut off at once
    meta([a, b], leader=None, epoch=4, fence=True)
    reports = {n.replica.replica_id: n.take(ReportElection)[0] for n in (a, b)}
    assert (reports[1].last_epoch, reports[1].end_offset) == (1, 2)  # A wins with x
    meta([a, b], leader=1, epoch=5)                # A's marker at 2 (epoch 5)
    a.step(b.sent()[-1])                           # B fetches (1, epoch 1): gets x only (1 byte budget)
    b.step([m for m in a.sent() if m.fetch_offset == 1][-1])
    assert b.log.log_end_offset == 2
    b.step(Tick(now_ms=10_000))                    # B flushes x and reports (2, flushed 2)
    a.step([m for m in b.sent() if m.fetch_offset == 2][-1])
    hw_a = a.replica.high_watermark
    drop_all()                                     # A crashes
    meta([b, c], leader=None, epoch=6, fence=True)
    reports = {n.replica.replica_id: n.take(ReportElection)[0] for n in (b, c)}
    assert (reports[3].last_epoch, reports[2].last_epoch) == (3, 1)  # C wins: epoch 3 > 1
    meta([b, c], leader=3, epoch=7)
    c.step(b.sent()[-1])
    b.step([m for m in c.sent() if m.fetch_offset == 2][-1])  # diverging: epoch 1 ends at 1 on C
    return hw_a, b.log.log_end_offset


def test_figure_8_old_epoch_entry_is_not_committed_by_counting(monkeypatch):
    """Claim (Raft figure 8): a new leader does not commit an older epoch's entry by counting
    replicas. With the epoch-start rule A's HW stays at 1 while x (offset 1, epoch 1) sits on a
    quorum, so C, elected next with a newer last epoch, may truncate x. Without the rule the same
    schedule commits x (HW 2) and then truncates it on B: a committed record lost."""
    hw_a, b_end = _figure_8(monkeypatch, epoch_start_rule=True)
    assert hw_a == 1 and b_end == 1
    hw_a, b_end = _figure_8(monkeypatch, epoch_start_rule=False)
    assert hw_a == 2 and b_end == 1


def test_waiting_request_id_is_refused_and_releases_keep_offset_order():
    """Claim: a produce reusing a request id that still waits is refused (INVALID_REQUEST) without an
    append, and acks=all requests are released in offset order once the HW passes them."""
    nodes = cluster()
    leader = nodes[1]
    produce(leader, 1, -1)
    produce(leader, 2, -1)
    end = leader.log.log_end_offset
    produce(leader, 1, -1)
    assert leader.log.log_end_offset == end
    assert leader.released()[1].error is ErrorCode.INVALID_REQUEST
    pump(nodes)
    order = [r.request_id for r in leader.take(ReleaseProduce)]
    assert order == [1, 2]


# ------------------------------------------------------------- lazy flush


def test_lazy_flush_asks_followers_to_flush_only_on_chunks_reaching_a_waiting_acks_all():
    """Claim: a catching-up follower gets flush_after_append only on the chunk that reaches an
    offset an acks=all request waits on, never on the recovery chunks below it, and never when
    only acks=1 traffic is waiting."""
    leader = Node(1)
    leader.step(NewMetadata(partition=state(isr=(1, 2)), config=config()))
    for rid in range(1, 21):
        produce(leader, rid, 1, b"x" * 50)
    produce(leader, 99, -1, b"waited on")
    acks_all_offset = leader.log.log_end_offset - 1
    follower_offset, answers = 0, []
    while follower_offset < leader.log.log_end_offset:
        leader.step(FetchRequest(replica_id=2, fetch_offset=follower_offset, last_fetched_epoch=-1 if
                                 follower_offset == 0 else 1, current_leader_epoch=1, max_bytes=200))
        resp = [m for m in leader.sent() if isinstance(m, FetchResponse)][-1]
        ends = [h.next_offset for _, h in iter_batches(resp.records)]
        answers.append((ends[-1], resp.flush_after_append))
        follower_offset = ends[-1]
    assert len(answers) >= 4
    assert [flush for end, flush in answers] == [end > acks_all_offset for end, _ in answers]
    leader2 = Node(1)
    leader2.step(NewMetadata(partition=state(isr=(1,)), config=config()))
    produce(leader2, 1, 1, b"a")
    leader2.step(FetchRequest(replica_id=2, fetch_offset=0, current_leader_epoch=1))
    assert not [m for m in leader2.sent() if isinstance(m, FetchResponse)][-1].flush_after_append


def test_a_followers_lazy_flush_waits_the_topics_flush_debounce_and_follows_its_changes():
    """Claim: the follower's lazy flush runs the topic's flush_debounce_ms after its first
    unflushed write (the replica's own 5 ms only when the topic names none), and a changed
    value applies to the live replica. The topic's setting was described and altered but never
    read: every replica flushed after 5 ms."""
    def follower_flushes(cfg: ReplicationConfig, at_ms: int, *, change: ReplicationConfig | None = None):
        follower = Node(2, auto_flush=False)
        follower.step(NewMetadata(partition=state(isr=(1, 2)), config=cfg))
        if change is not None:
            follower.step(NewMetadata(partition=state(isr=(1, 2)), config=change))
        follower.take(Send)
        follower.step(FetchResponse(leader_id=1, leader_epoch=1, fetch_offset=0, last_fetched_epoch=-1,
                                    records=batch(b"a"), high_watermark=0, log_end_offset=1, partition=None))
        follower.step(Tick(now_ms=at_ms - 1))
        before = [a for a in follower.actions if isinstance(a, Flush)]
        follower.step(Tick(now_ms=at_ms))
        return len(before), len([a for a in follower.actions if isinstance(a, Flush)])

    assert follower_flushes(config(), 5) == (0, 1)
    assert follower_flushes(config(flush_debounce_ms=200), 200) == (0, 1)
    assert follower_flushes(config(flush_debounce_ms=200), 5) == (0, 0)
    assert follower_flushes(config(), 50, change=config(flush_debounce_ms=50)) == (0, 1)


# ----------------------------------------------------------- backpressure


def test_acks_1_waits_when_unreplicated_bytes_reach_the_bound_then_goes_on_as_the_hw_moves():
    """Claim: once bytes written but not passed by the HW reach unreplicated_bytes_max, further
    produce requests (even acks=1) are neither written nor refused: they wait in arrival order and
    are written as followers catch up; one that waits past its timeout gets REQUEST_TIMED_OUT."""
    nodes = {i: Node(i) for i in (1, 2, 3)}
    nodes[1].replica = Replica(replica_id=1, log=nodes[1].log, fetch_backoff_ms=10, unreplicated_bytes_max=500)
    for n in nodes.values():
        n.step(NewMetadata(partition=state(), config=config()))
    leader = nodes[1]
    pump(nodes)
    for rid in range(1, 11):
        produce(leader, rid, 1, b"x" * 200, timeout_ms=1000 if rid < 10 else 30)
    released = leader.released()
    # Each batch is ~270 bytes: two fill the 500-byte bound, the rest wait.
    assert sorted(released) == [1, 2] and all(r.error is ErrorCode.NONE for r in released.values())
    assert leader.replica.unreplicated_bytes() >= 500
    end = leader.log.log_end_offset
    leader.step(Tick(now_ms=40))
    assert leader.released()[10].error is ErrorCode.REQUEST_TIMED_OUT  # waited past its timeout
    assert leader.log.log_end_offset == end
    pump(nodes, now_ms=40, rounds=60)
    released = leader.released()
    assert sorted(released) == [3, 4, 5, 6, 7, 8, 9] and all(r.error is ErrorCode.NONE for r in released.values())
    offsets = [released[r].base_offset for r in sorted(released)]
    assert offsets == sorted(offsets)  # admitted in arrival order
    assert leader.replica.unreplicated_bytes() == 0


def test_waiting_produce_requests_are_released_when_leadership_is_lost():
    """Claim: requests waiting for room get NOT_LEADER_OR_FOLLOWER when the replica stops leading."""
    leader = Node(1)
    leader.replica = Replica(replica_id=1, log=leader.log, unreplicated_bytes_max=10)
    leader.step(NewMetadata(partition=state(isr=(1, 2)), config=config()))
    produce(leader, 1, 1, b"x" * 50)
    produce(leader, 2, 1, b"y")
    assert 2 not in leader.released()
    leader.step(NewMetadata(partition=state(leader=2, epoch=2), config=config()))
    assert leader.released()[2].error is ErrorCode.NOT_LEADER_OR_FOLLOWER


def test_caught_up_follower_asked_to_flush_fetches_again_only_with_its_flushed_offset():
    """Claim: under fsync, a follower that appended an answer asking flush_after_append and is
    caught up sends no fetch until its flush is done, and that fetch carries the flushed offset
    (one fetch, not a long-poll with the old flushed offset and a second one after the flush);
    under write, where nothing asks for a flush, it fetches again at once."""
    for durability in ("fsync", "write"):
        nodes = cluster(config(durability=durability))
        pump(nodes, now_ms=0)
        follower = nodes[2]
        follower.auto_flush = False
        follower.take(Send)
        produce(nodes[1], 1, -1, b"v")
        follower.step(Tick(now_ms=5000))  # past fetch_timeout_ms: it asks again
        [ask] = [m for m in follower.sent() if isinstance(m, FetchRequest)]
        nodes[1].step(ask)
        [answer] = [s.message for s in nodes[1].take(Send) if s.to_broker == 2]
        assert answer.records and answer.flush_after_append == (durability == "fsync")
        follower.step(answer)
        again = [m for m in follower.sent() if isinstance(m, FetchRequest)]
        end = follower.log.log_end_offset
        if durability == "write":
            assert [m.fetch_offset for m in again] == [end]
            continue
        assert again == []
        follower.step(FlushDone(flushed_offset=follower.log.flush()))
        [after_flush] = [m for m in follower.sent() if isinstance(m, FetchRequest)]
        assert (after_flush.fetch_offset, after_flush.flushed_offset) == (end, end)


def test_an_unanswered_fetch_is_asked_again_after_fetch_retry_ms_not_sooner():
    """Claim: a pull follower whose fetch goes unanswered (parked in a fetch session while the
    partition is quiet) asks again only once fetch_retry_ms has passed; the broker sets it long
    because its fetcher resends lost requests itself, and each early re-ask was a step for nothing."""
    for retry_ms in (None, 10_000):
        follower = Node(2)
        follower.replica = Replica(replica_id=2, log=follower.log, fetch_backoff_ms=10, fetch_timeout_ms=1000,
                                   fetch_retry_ms=retry_ms)
        follower.step(NewMetadata(partition=state(), config=config()))
        follower.step(Tick(now_ms=0))
        assert [m for m in follower.sent() if isinstance(m, FetchRequest)]
        waits = 1000 if retry_ms is None else retry_ms
        assert follower.replica.next_tick_ms() == waits
        follower.step(Tick(now_ms=waits - 1))
        assert [m for m in follower.sent() if isinstance(m, FetchRequest)] == []
        follower.step(Tick(now_ms=waits))
        assert len([m for m in follower.sent() if isinstance(m, FetchRequest)]) == 1


def test_a_fetch_the_transport_holds_is_not_asked_again_on_the_timer():
    """Claim: once the transport says it holds the fetch in flight (FetchHeld: a leader's fetch
    session keeps it and answers when something changes), the follower has no timer for it:
    no re-ask at fetch_retry_ms and no Tick due (thousands of quiet followers each stepped
    every fetch_retry_ms were most of an idle broker's steps). A FetchHeld for another
    position or another leader changes nothing, and the next request it sends is on the
    timer again until it is held too."""
    from dataplane.replica.events import FetchHeld, FetchResponse
    follower = Node(2)
    follower.replica = Replica(replica_id=2, log=follower.log, fetch_backoff_ms=10, fetch_retry_ms=10_000)
    follower.step(NewMetadata(partition=state(), config=config()))
    follower.step(Tick(now_ms=0))
    [ask] = [m for m in follower.sent() if isinstance(m, FetchRequest)]
    for other in (FetchHeld(leader_id=1, fetch_offset=ask.fetch_offset + 1, last_fetched_epoch=ask.last_fetched_epoch),
                  FetchHeld(leader_id=3, fetch_offset=ask.fetch_offset, last_fetched_epoch=ask.last_fetched_epoch)):
        follower.step(other)
        assert follower.replica.next_tick_ms() == 10_000, other
    follower.step(FetchHeld(leader_id=1, fetch_offset=ask.fetch_offset, last_fetched_epoch=ask.last_fetched_epoch))
    assert follower.replica.next_tick_ms() is None
    follower.step(Tick(now_ms=60_000))
    assert [m for m in follower.sent() if isinstance(m, FetchRequest)] == []
    # Its answer comes (a new HW alone): the next request is on the timer again.
    follower.step(FetchResponse(leader_id=1, leader_epoch=ask.current_leader_epoch, fetch_offset=ask.fetch_offset,
                                last_fetched_epoch=ask.last_fetched_epoch, high_watermark=ask.fetch_offset))
    follower.step(Tick(now_ms=60_010))   # after fetch_backoff_ms
    assert len([m for m in follower.sent() if isinstance(m, FetchRequest)]) == 1
    assert follower.replica.next_tick_ms() == 70_010
    follower.step(Tick(now_ms=70_010))
    assert len([m for m in follower.sent() if isinstance(m, FetchRequest)]) == 1


def test_a_fetch_refused_by_a_leader_behind_our_epoch_is_asked_again_after_the_backoff():
    """Claim: when our leader's broker has not yet learned the epoch we fetch at, it refuses
    with its own older epoch; that answer is to our fetch in flight, so the follower asks again
    after fetch_backoff_ms, not after fetch_retry_ms (10 s in the broker: a stall as long as
    the lag time after every leader move). A late answer to another position changes nothing."""
    from dataplane.replica.events import FetchResponse
    follower = Node(2)
    follower.replica = Replica(replica_id=2, log=follower.log, fetch_backoff_ms=10, fetch_retry_ms=10_000)
    follower.step(NewMetadata(partition=state(epoch=6), config=config()))
    follower.step(Tick(now_ms=0))
    [ask] = [m for m in follower.sent() if isinstance(m, FetchRequest)]
    late = FetchResponse(leader_id=1, leader_epoch=5, fetch_offset=ask.fetch_offset + 7,
                         last_fetched_epoch=ask.last_fetched_epoch, error=ErrorCode.UNKNOWN_LEADER_EPOCH)
    follower.step(late)
    assert follower.replica.next_tick_ms() == 10_000
    refused = FetchResponse(leader_id=1, leader_epoch=5, fetch_offset=ask.fetch_offset,
                            last_fetched_epoch=ask.last_fetched_epoch, error=ErrorCode.UNKNOWN_LEADER_EPOCH)
    follower.step(refused)
    assert follower.replica.next_tick_ms() == 10
    follower.step(Tick(now_ms=10))
    [again] = [m for m in follower.sent() if isinstance(m, FetchRequest)]
    assert again.current_leader_epoch == 6


def test_moving_the_clock_is_a_tick_that_finds_nothing_due_and_refuses_when_something_is():
    """Claim: Replica.move_clock(t) moves the clocks exactly when a Tick at t would act on no
    timed rule (next_tick_ms > t), and then the core is as a Tick would have left it; when a
    rule is due it moves nothing and says so (the driver steps a Tick). Checked at every 37 ms
    over a leader with produce waiting on a follower, a pull follower, and the ISR lag rule."""
    import copy
    nodes = cluster(config(durability="fsync"), auto_flush=False)
    pump(nodes, now_ms=0)
    produce(nodes[1], 1, -1, b"v" * 100, timeout_ms=900)
    start = max(n.replica.now_ms for n in nodes.values()) + 1
    seen = {True: 0, False: 0}
    for now in range(start, start + 12_000, 37):
        for node in nodes.values():
            r = node.replica
            ticked, moved = copy.deepcopy(r), copy.deepcopy(r)
            ready = ticked.step(Tick(now_ms=now))
            acted = bool(ready.persist or ready.send or ready.answers or ready.release or ready.notes)
            due = r.next_tick_ms()
            assert moved.move_clock(now) == (due is None or due > now)
            seen[due is None or due > now] += 1
            if due is None or due > now:
                assert not acted, f"a Tick at {now} acted though next_tick_ms said {due}"
                assert (moved.now_ms, moved.wall_ms) == (ticked.now_ms, ticked.wall_ms) == (now, ticked.wall_ms)
            else:
                assert (moved.now_ms, moved.wall_ms) == (r.now_ms, r.wall_ms)
            node.step(Tick(now_ms=now))
        if now % 5 == 0:
            pump(nodes, rounds=1)   # now and then the messages go through: replication moves on
    assert seen[True] > 100 and seen[False] > 20, seen


def _core_state(r: Replica) -> dict:
    """What a step may change in a core, comparable across deep copies (its log and producer
    table are compared through what the core says of them)."""
    kept = {k: v for k, v in vars(r).items() if k not in ("log", "producer_state")}
    kept["progress"] = {rid: tuple(getattr(p, f) for f in p.__slots__) for rid, p in r.progress.items()}
    kept["next_tick_ms"] = r.next_tick_ms()
    kept["log_end"] = r.log.log_end_offset
    return kept


def test_a_caught_up_refresh_is_a_tick_that_acts_on_its_news_alone_and_refuses_when_it_would_do_more():
    """Claim: Replica.refresh_caught_up(t, fetching) leaves the core exactly as a Tick at t
    carrying that news would, when that Tick acts on nothing else (its Ready empty): the
    broker's quiet leaders refresh their followers' caught-up clocks this way. When the Tick
    would do more (a produce's deadline, a flush, an ISR change, a join to ask about) it
    changes nothing and says so. Checked every 37 ms over a leader with produces coming and
    going, followers seen now, long ago, or at a stale position, and the lag rule."""
    import copy
    import random
    rng = random.Random(11)
    lag = 300
    nodes = cluster(config(durability="fsync", replica_lag_time_max_ms=lag), auto_flush=False)
    pump(nodes, now_ms=0)
    start = max(n.replica.now_ms for n in nodes.values()) + 1
    seen = {True: 0, False: 0}
    refreshed_news = rid = 0
    for now in range(start, start + 40_000, 37):
        leader = nodes[1].replica
        if leader.role is not Role.LEADER:
            break
        news = []
        for r in leader.caught_up_due(now):
            p = leader.progress[r]
            pick = rng.random()
            seen_ms = now if pick < 0.9 else now - lag - 50   # long unseen: the follower leaves
            offset = p.fetch_offset if pick < 0.95 else p.fetch_offset - 1
            news.append(StillFetching(replica_id=r, fetch_offset=offset, seen_ms=seen_ms))
        fetching = tuple(news)
        ticked, refreshed = copy.deepcopy(leader), copy.deepcopy(leader)
        before = _core_state(refreshed)
        done, due = refreshed.refresh_caught_up(now, None, fetching)
        ready = ticked.step(Tick(now_ms=now, fetching=fetching))
        acted = bool(ready.persist or ready.send or ready.answers or ready.release or ready.notes)
        seen[done] += 1
        refreshed_news += done and bool(fetching)
        if done:
            assert not acted, f"the Tick at {now} acted ({ready}) where the refresh said it would not"
            assert _core_state(refreshed) == _core_state(ticked)
            assert due == ticked.next_tick_ms()
        else:
            assert (done, due) == (False, None) and _core_state(refreshed) == before, "a refusal changes nothing"
        nodes[1].step(Tick(now_ms=now, fetching=fetching))
        for n in (2, 3):
            nodes[n].step(Tick(now_ms=now))
        for proposal in nodes[1].take(ProposeIsr):   # the controller accepts, and all learn it
            st = leader.state
            changed = state(isr=proposal.new_isr, epoch=st.leader_epoch, pepoch=st.partition_epoch + 1)
            nodes[1].step(IsrChangeAccepted(partition=changed))
            for n in nodes.values():
                n.step(NewMetadata(partition=changed, config=leader.config))
        if rng.random() < 0.02:
            rid += 1
            produce(nodes[1], rid, -1, b"v" * 100, timeout_ms=500)
        if rng.random() < 0.3:
            for n in nodes.values():
                for f in n.take(Flush):
                    n.step(FlushDone(flushed_offset=n.log.flush()))
        if rng.random() < 0.05:
            pump(nodes, rounds=2)   # now and then the messages go through: replication moves on
    assert seen[True] > 50 and seen[False] > 20 and refreshed_news > 25, (seen, refreshed_news)


def test_follower_behind_the_leader_fetches_at_once_even_when_asked_to_flush():
    """Claim: a follower whose answer leaves it behind the leader's log end keeps fetching at once
    (pipelined with its flush), so a follower catching up is not held to one fsync per fetch."""
    nodes = cluster(config(durability="fsync"), auto_flush=False)
    nodes[1].step(FlushDone(flushed_offset=nodes[1].log.flush()))
    pump(nodes, now_ms=0)
    follower = nodes[2]
    follower.take(Send)
    for rid in (1, 2, 3):
        produce(nodes[1], rid, -1, b"v" * 100)
    nodes[1].step(FlushDone(flushed_offset=nodes[1].log.flush()))
    follower.step(Tick(now_ms=5000))  # past fetch_timeout_ms: it asks again
    [ask] = [m for m in follower.sent() if isinstance(m, FetchRequest)]
    nodes[1].step(FetchRequest(replica_id=2, fetch_offset=ask.fetch_offset, last_fetched_epoch=ask.last_fetched_epoch,
                               flushed_offset=ask.flushed_offset, current_leader_epoch=ask.current_leader_epoch,
                               max_bytes=150))
    [answer] = [s.message for s in nodes[1].take(Send) if s.to_broker == 2]
    assert answer.flush_after_append and answer.log_end_offset > ask.fetch_offset + 1
    follower.step(answer)
    assert follower.log.log_end_offset < answer.log_end_offset
    [again] = [m for m in follower.sent() if isinstance(m, FetchRequest)]
    assert again.fetch_offset == follower.log.log_end_offset


def test_under_write_a_pull_followers_lazy_flush_sends_no_fetch_of_its_own():
    """Claim: under durability=write a follower's flush is news to nobody (the HW counts written
    offsets): its FlushDone sends no fetch; under fsync the same flush is reported at once."""
    for durability, reports in (("write", False), ("fsync", True)):
        nodes = cluster(config(durability=durability))
        pump(nodes, now_ms=0)
        follower = nodes[2]
        follower.auto_flush = False
        produce(nodes[1], 1, 1, b"v")
        pump(nodes, now_ms=100, rounds=4)
        assert follower.log.log_end_offset == nodes[1].log.log_end_offset
        assert follower.log.flushed_offset < follower.log.log_end_offset
        follower.take(Send)
        follower.step(FlushDone(flushed_offset=follower.log.flush()))
        sent = [m for m in follower.sent() if isinstance(m, FetchRequest)]
        assert bool(sent) == reports, durability


def batches_from(log: MemoryLog, offset: int) -> list[bytes]:
    found = []
    while offset < log.log_end_offset:
        records = bytes(log.read(offset, max_bytes=1 << 20).records)
        for pos, h in iter_batches(records):
            found.append(records[pos:pos + h.size_bytes])
            offset = h.next_offset
    return found


def leader_past_retention(nodes: dict[int, Node], *, follower_batches: int) -> int:
    """Follower 3 gets the epoch start and `follower_batches` batches, is cut off while the leader writes more, and the
    leader's retention then deletes segments past follower 3's log end; returns the leader's log start."""
    leader = nodes[1]
    for rid in range(follower_batches or 0):
        produce(leader, 100 + rid, 1, b"x" * 50)
    # None: follower 3 never fetched anything (its log stays empty at 0).
    pump(nodes, now_ms=0, drop=(3,) if follower_batches is None else ())
    assert nodes[3].log.log_end_offset == (0 if follower_batches is None else leader.log.log_end_offset)
    for rid in range(40):
        produce(leader, 200 + rid, 1, b"y" * 50)
    pump(nodes, now_ms=max(100, max(n.replica.now_ms for n in nodes.values())), drop=(3,))
    assert leader.log.apply_retention(now_ms=0)
    start = leader.log.log_start_offset
    assert start > nodes[3].log.log_end_offset
    return start


@pytest.mark.parametrize("follower_batches", [None, 0, 10])
def test_follower_ending_below_the_leaders_log_start_starts_over_there_and_rejoins_the_isr(follower_batches):
    """Claim: a follower whose log ends below the leader's log start (retention deleted what it
    lacks) empties its log once, starts it at the leader's log start, catches up and is proposed
    back into the ISR; from an empty log and from logs whose last epoch the leader still holds."""
    nodes = {1: Node(1, log=MemoryLog(config=LogConfig(segment_bytes=1024, retention_bytes=1024))),
             2: Node(2), 3: Node(3)}
    for n in nodes.values():
        n.step(NewMetadata(partition=state(isr=(1, 2)), config=config()))
    start = leader_past_retention(nodes, follower_batches=follower_batches)
    nodes[3].take(TruncateFully)
    nodes[1].take(ProposeIsr)
    pump(nodes, now_ms=1000, rounds=40)
    assert [a.offset for a in nodes[3].take(TruncateFully)] == [start]
    follower, leader = nodes[3].log, nodes[1].log
    assert (follower.log_start_offset, follower.log_end_offset) == (start, leader.log_end_offset)
    assert batches_from(follower, start) == batches_from(leader, start)
    assert nodes[3].replica.high_watermark == nodes[1].replica.high_watermark
    assert [p.new_isr for p in nodes[1].take(ProposeIsr)] == [(1, 2, 3)]


def test_an_overtaken_fetch_from_the_same_position_keeps_the_newest_flushed_offset():
    """Claim: a follower's fetch that a newer one from the same position overtook (its long-poll,
    after an express fetch said more) cannot lower the flushed offset the leader counts; a fetch
    from another position reports its own."""
    nodes = cluster(config(durability="fsync"), auto_flush=False)
    leader = nodes[1]
    leader.step(FlushDone(flushed_offset=leader.log.flush()))
    produce(leader, 1, -1, b"a")
    leader.step(FlushDone(flushed_offset=leader.log.flush()))
    end = leader.log.log_end_offset

    def fetch(replica_id, offset, flushed):
        leader.step(FetchRequest(replica_id=replica_id, fetch_offset=offset, last_fetched_epoch=1,
                                 flushed_offset=flushed, current_leader_epoch=1))
        return leader.replica.progress[replica_id]

    assert fetch(2, end, end).flushed_offset == end        # express: flushed up to the end
    assert fetch(2, end, 1).flushed_offset == end          # the overtaken long-poll: older news
    assert leader.replica.progress[2].fetches == 2
    assert fetch(2, 1, 1).flushed_offset == 1              # another position: its own report
    assert not leader.replica.fetched_since(2, 3, end, 1)  # nothing stepped since the third
    assert leader.replica.fetched_since(2, 2, end, 1)      # moved on from `end` since the second
    assert not leader.replica.fetched_since(2, 2, 1, 1)    # ... but not from the position it is at
    assert leader.replica.fetch_count(4) == -1


def test_a_fetch_sent_before_one_already_stepped_neither_counts_nor_holds_the_hw():
    """Claim: a follower's fetch sent before one of its fetches already stepped (by their
    order: session id, session epoch, then the session fetch before the express ones sent
    while it was out) is answered but neither recorded nor counted: the follower's progress,
    and the acks=all request it satisfied, stand. Later ones are recorded as usual; so are
    fetches of another session (a restarted follower that came back with less) and of unknown
    order, as they come. Found by a full test run: an express fetch stepped after the
    follower's newer session fetch put it back at offset 1 while that session fetch waited
    parked in a long-poll, and a new topic's first acks=all request timed out."""
    nodes = cluster(config(durability="fsync"), auto_flush=False)
    leader = nodes[1]
    leader.step(FlushDone(flushed_offset=leader.log.flush()))
    start = leader.log.log_end_offset
    produce(leader, 1, -1, b"a", timeout_ms=10_000)
    leader.step(FlushDone(flushed_offset=leader.log.flush()))
    end = leader.log.log_end_offset

    def fetch(replica_id, offset, order):
        leader.step(FetchRequest(replica_id=replica_id, fetch_offset=offset, last_fetched_epoch=1,
                                 flushed_offset=offset, current_leader_epoch=1, order=order))
        answer = [m for m in leader.sent() if isinstance(m, FetchResponse)][-1]
        p = leader.replica.progress[replica_id]
        return answer, (p.fetch_offset, p.flushed_offset, p.fetches)

    fetch(3, end, None)
    assert fetch(2, end, (7, 3, 0))[1] == (end, end, 1)       # session 7's fetch of epoch 3
    assert leader.released()[1].error is ErrorCode.NONE       # ... satisfies acks=all
    answer, progress = fetch(2, start, (7, 2, 1))             # express, sent while epoch 2's was out
    assert progress == (end, end, 1), "a fetch sent before the one stepped moved the follower back"
    assert answer.error is ErrorCode.NONE and answer.fetch_offset == start and answer.records
    assert not leader.replica.fetched_since(2, 1, end, 1), "a late fetch counted as newer"
    produce(leader, 2, -1, b"b", timeout_ms=10_000)
    leader.step(FlushDone(flushed_offset=leader.log.flush()))
    newer = leader.log.log_end_offset
    assert fetch(2, newer, (7, 3, 1))[1] == (newer, newer, 2)    # express while epoch 3's is out
    assert fetch(2, end, (7, 3, 0))[1] == (newer, newer, 2)      # epoch 3's, stepped again: older
    assert fetch(2, start, (8, 0, 0))[1] == (start, start, 3)    # a new session: as it comes
    assert fetch(2, end, None)[1] == (end, end, 4)               # unknown order: as it comes
    assert fetch(2, start, (8, 0, 1))[1] == (start, start, 5)    # after unknown: as it comes


def test_produce_admission_checks_role_then_client_epoch_then_acks_and_batch_size():
    """Claim (admission.py): a non-leader refuses NOT_LEADER_OR_FOLLOWER whatever epoch the client
    names; a leader refuses a stale client epoch FENCED_LEADER_EPOCH, bad acks INVALID_REQUIRED_ACKS
    and a batch above batch_bytes_max MESSAGE_TOO_LARGE, saying why; a good request's release
    carries its record count."""
    nodes = cluster(st=state(epoch=3))
    leader, follower = nodes[1], nodes[2]
    follower.step(ProduceRequest(request_id=1, records=batch(), acks=1, timeout_ms=1000, leader_epoch=1))
    assert follower.released()[1].error is ErrorCode.NOT_LEADER_OR_FOLLOWER
    leader.step(ProduceRequest(request_id=2, records=batch(), acks=1, timeout_ms=1000, leader_epoch=2))
    leader.step(ProduceRequest(request_id=3, records=batch(), acks=2, timeout_ms=1000, leader_epoch=3))
    big = batch(b"x" * 200)
    leader.step(ProduceRequest(request_id=4, records=big, acks=1, timeout_ms=1000, batch_bytes_max=100))
    leader.step(ProduceRequest(request_id=5, records=batch(b"a", b"b"), acks=1, timeout_ms=1000,
                               batch_bytes_max=len(big)))
    released = leader.released()
    assert released[2].error is ErrorCode.FENCED_LEADER_EPOCH
    assert released[3].error is ErrorCode.INVALID_REQUIRED_ACKS and "acks=2" in released[3].reason
    assert released[4].error is ErrorCode.MESSAGE_TOO_LARGE and "max_message_bytes=100" in released[4].reason
    assert released[5].error is ErrorCode.NONE and released[5].record_count == 2


def test_a_batch_larger_than_a_segment_is_refused_at_admission_and_the_partition_goes_on():
    """Claim (found with confluent-kafka against a topic with segment.bytes=1024): a batch the log
    cannot hold in one segment is refused RECORD_LIST_TOO_LARGE (Kafka's answer) before the core
    counts on it. Before, admission took it, the log refused the Append, and that request and every
    later one on the partition waited for a write that never happened."""
    nodes = {1: Node(1, log=MemoryLog(config=LogConfig(segment_bytes=1024))), 2: Node(2), 3: Node(3)}
    for n in nodes.values():
        n.step(NewMetadata(partition=state(), config=config()))
    pump(nodes, now_ms=0)
    leader = nodes[1]
    end = leader.log.log_end_offset
    leader.take(Append)   # the epoch's start
    leader.step(ProduceRequest(request_id=1, records=batch(b"x" * 2000), acks=1, timeout_ms=1000))
    released = leader.released()
    assert released[1].error is ErrorCode.RECORD_LIST_TOO_LARGE and "up to 1024 bytes" in released[1].reason
    assert not leader.take(Append) and leader.log.log_end_offset == end
    leader.step(ProduceRequest(request_id=2, records=batch(b"y" * 10), acks=1, timeout_ms=1000))
    assert leader.released()[2].error is ErrorCode.NONE and leader.log.log_end_offset == end + 1


def test_a_follower_stores_a_batch_larger_than_its_own_segments():
    """A follower's segments may be smaller than the leader's (the topic's segment size lowered,
    the follower reopened since): it stores what the leader took, in a segment of its own, rather
    than refusing an Append its core counted on."""
    nodes = {1: Node(1), 2: Node(2, log=MemoryLog(config=LogConfig(segment_bytes=1024))), 3: Node(3)}
    for n in nodes.values():
        n.step(NewMetadata(partition=state(), config=config()))
    pump(nodes, now_ms=0)
    nodes[1].step(ProduceRequest(request_id=1, records=batch(b"x" * 2000), acks=-1, timeout_ms=1000))
    pump(nodes, now_ms=max(n.replica.now_ms for n in nodes.values()))
    assert nodes[1].released()[1].error is ErrorCode.NONE
    assert nodes[2].log.log_end_offset == nodes[1].log.log_end_offset


def test_consumers_and_list_offsets_answer_for_the_clients_epoch_in_the_core():
    """Claim: a consumer's fetch naming an older epoch is answered FENCED_LEADER_EPOCH, a newer one
    UNKNOWN_LEADER_EPOCH with a metadata refresh (the leader keeps leading); list_offset says the
    same, and LEADER_NOT_AVAILABLE until the epoch start is flushed."""
    nodes = cluster(st=state(epoch=3), auto_flush=False)
    leader = nodes[1]
    assert leader.replica.list_offset(-1) == (ErrorCode.LEADER_NOT_AVAILABLE, -1, -1)
    leader.step(FlushDone(flushed_offset=leader.log.flush()))
    leader.step(FetchRequest(replica_id=-1, fetch_offset=0, current_leader_epoch=2))
    assert leader.sent()[-1].error is ErrorCode.FENCED_LEADER_EPOCH
    leader.step(FetchRequest(replica_id=-1, fetch_offset=0, current_leader_epoch=4))
    assert leader.sent()[-1].error is ErrorCode.UNKNOWN_LEADER_EPOCH and leader.take(RefreshMetadata)
    assert leader.replica.role is Role.LEADER
    leader.step(FetchRequest(replica_id=-1, fetch_offset=0, current_leader_epoch=3))
    assert leader.sent()[-1].error is ErrorCode.NONE
    assert leader.replica.list_offset(-1, 2) == (ErrorCode.FENCED_LEADER_EPOCH, -1, -1)
    assert leader.replica.list_offset(-1, 4) == (ErrorCode.UNKNOWN_LEADER_EPOCH, -1, -1)
    assert leader.replica.list_offset(-2, 3) == (ErrorCode.NONE, 0, -1)


def test_a_leader_holding_produce_takes_it_in_order_once_its_epoch_start_is_flushed_and_room_returns():
    """Claim (admission.py, held_produce_max > 0 as the broker runs it): requests arriving before
    the epoch start is flushed, or while the broker-wide budget (BrokerBudget) has no room, are
    held in arrival order, written nothing, then taken in that order; one held past its timeout
    is answered REQUEST_TIMED_OUT; beyond held_produce_max a request is refused."""
    from dataplane.replica.events import BrokerBudget
    node = Node(1, auto_flush=False)
    node.replica = Replica(replica_id=1, log=node.log, held_produce_max=3)
    node.step(NewMetadata(partition=state(isr=(1,), replicas=(1,)), config=config()))
    end = node.log.log_end_offset
    for rid in (1, 2, 3, 4):
        produce(node, rid, 1, b"v%d" % rid)
    assert node.released()[4].error is ErrorCode.LEADER_NOT_AVAILABLE  # only three are held
    assert node.log.log_end_offset == end
    node.step(BrokerBudget(others_bytes=100, bytes_max=100))    # the others hold it all
    node.step(FlushDone(flushed_offset=node.log.flush()))        # the epoch start is durable
    assert node.log.log_end_offset == end and not node.released()
    node.step(Tick(now_ms=999))
    node.step(BrokerBudget(others_bytes=0, bytes_max=10_000))   # room
    released = node.released()
    assert [released[r].base_offset for r in (1, 2, 3)] == [end, end + 1, end + 2]
    node.step(BrokerBudget(others_bytes=10_000, bytes_max=10_000))
    produce(node, 5, 1, timeout_ms=50)
    node.step(Tick(now_ms=1100))
    assert node.released()[5].error is ErrorCode.REQUEST_TIMED_OUT
    produce(node, 6, 1)
    node.step(NewMetadata(partition=state(leader=2, epoch=2, isr=(1, 2), replicas=(1, 2)), config=config()))
    assert node.released()[6].error is ErrorCode.NOT_LEADER_OR_FOLLOWER
