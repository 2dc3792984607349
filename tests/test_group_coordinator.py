"""The group coordinator's core, driven by hand: each test names the rule it checks and
fails if the core stops keeping it (no sockets, no clock: time is passed in)."""
from __future__ import annotations

import itertools

import pytest

from common.errors import ErrorCode
from common.wire import messages as wire
from dataplane.groups import records
from dataplane.groups.coordinator import Coordinator
from dataplane.groups.events import GroupConfig, GroupRecord, Received, Step, Tick, TopicsDeleted, Written

CONFIG = GroupConfig(initial_rebalance_delay_ms=100, session_timeout_ms_min=10,
                     offsets_retention_ms=10_000, offsets_retention_check_interval_ms=1000)
PROTOCOLS = (wire.JoinGroupProtocol(name="range", metadata=b"m"),)


class Harness:
    """A core plus the log its writes go to; writes commit at once unless `hold` is set."""

    def __init__(self, config: GroupConfig = CONFIG, stored: tuple[GroupRecord, ...] = (), now_ms: int = 0,
                 fence: bool = True) -> None:
        self.core = Coordinator(config=config, now_ms=now_ms, stored=stored, fence_generations=fence)
        self.now = now_ms
        self.log: list[GroupRecord] = list(stored)
        self.answers: dict[int, object] = {}
        self.held: list[int] = []
        self.hold = False
        self._ids = itertools.count(1)
        self._members = itertools.count(1)

    def _take(self, step: Step) -> None:
        for a in step.answers:
            assert a.request_id not in self.answers, f"request {a.request_id} answered twice"
            self.answers[a.request_id] = a.response
        for w in step.writes:
            if self.hold:
                self.held.append(w.write_id)
                self._pending = getattr(self, "_pending", {})
                self._pending[w.write_id] = w.records
            else:
                self.log.extend(w.records)
                self._take(self.core.step(Written(write_id=w.write_id, ok=True, now_ms=self.now)))

    def release(self, ok: bool = True) -> None:
        held, self.held = self.held, []
        self.hold = False
        for write_id in held:
            if ok:
                self.log.extend(self._pending[write_id])
            self._take(self.core.step(Written(write_id=write_id, ok=ok, now_ms=self.now)))

    def send(self, request: object, *, required: bool = True) -> int:
        rid = next(self._ids)
        self._take(self.core.step(Received(request_id=rid, request=request, now_ms=self.now,
                                           fresh_member_id=f"m{next(self._members)}", member_id_required=required)))
        return rid

    def call(self, request: object, **kw: bool) -> object:
        rid = self.send(request, **kw)
        assert rid in self.answers, f"{type(request).__name__} was not answered"
        return self.answers[rid]

    def advance(self, ms: int) -> None:
        self.now += ms
        self._take(self.core.step(Tick(now_ms=self.now)))

    def join(self, group: str = "g", member_id: str = "", instance: str | None = None, session_ms: int = 1000,
             protocols: tuple[wire.JoinGroupProtocol, ...] = PROTOCOLS) -> int:
        return self.send(wire.JoinGroupRequest(group_id=group, member_id=member_id, group_instance_id=instance,
                                               session_timeout_ms=session_ms, rebalance_timeout_ms=2000,
                                               protocols=protocols), required=False)

    def stable_group(self, n: int) -> list[wire.JoinGroupResponse]:
        rids = [self.join() for _ in range(n)]
        self.advance(100)
        joined = [self.answers[r] for r in rids]
        assert all(isinstance(j, wire.JoinGroupResponse) and j.error_code is ErrorCode.NONE for j in joined)
        leader = next(j for j in joined if isinstance(j, wire.JoinGroupResponse) and j.members)
        assert isinstance(leader, wire.JoinGroupResponse)
        syncs = [self.send(wire.SyncGroupRequest(
            group_id="g", generation_id=j.generation_id, member_id=j.member_id,
            assignments=tuple(wire.SyncGroupAssignment(member_id=m.member_id, assignment=m.member_id.encode())
                              for m in j.members)))
            for j in joined if isinstance(j, wire.JoinGroupResponse)]
        assert all(self.answers[s].error_code is ErrorCode.NONE for s in syncs)  # type: ignore[attr-defined]
        return joined  # type: ignore[return-value]


def commit(group: str, generation: int, member: str, offset: int, partition: int = 0,
           instance: str | None = None) -> wire.OffsetCommitRequest:
    return wire.OffsetCommitRequest(group_id=group, generation_id=generation, member_id=member,
                                    group_instance_id=instance, topics=(wire.OffsetCommitTopic(
                                        topic="t", partitions=(wire.OffsetCommitPartition(
                                            partition=partition, committed_offset=offset),)),))


def commit_code(answer: object) -> ErrorCode:
    assert isinstance(answer, wire.OffsetCommitResponse)
    return answer.topics[0].partitions[0].error_code


def fetched(h: Harness, group: str = "g", partition: int = 0) -> int:
    answer = h.call(wire.OffsetFetchRequest(group_id=group, topics=(wire.OffsetFetchTopic(
        topic="t", partitions=(partition,)),)))
    assert isinstance(answer, wire.OffsetFetchResponse)
    return answer.topics[0].partitions[0].committed_offset


def test_first_join_needs_a_member_id_then_joins_after_the_initial_delay() -> None:
    """KIP-394: a join without an id gets MEMBER_ID_REQUIRED and the id; the join with it
    waits out the initial rebalance delay, then the only member leads generation 1."""
    h = Harness()
    first = h.call(wire.JoinGroupRequest(group_id="g", session_timeout_ms=1000, protocols=PROTOCOLS))
    assert isinstance(first, wire.JoinGroupResponse)
    assert first.error_code is ErrorCode.MEMBER_ID_REQUIRED and first.member_id == "m1"
    rid = h.send(wire.JoinGroupRequest(group_id="g", member_id="m1", session_timeout_ms=1000, protocols=PROTOCOLS))
    assert rid not in h.answers  # the initial delay
    h.advance(99)
    assert rid not in h.answers
    h.advance(1)
    joined = h.answers[rid]
    assert isinstance(joined, wire.JoinGroupResponse)
    assert (joined.error_code, joined.generation_id, joined.leader, joined.protocol_name) == \
        (ErrorCode.NONE, 1, "m1", "range")
    assert [m.member_id for m in joined.members] == ["m1"]


def test_unknown_member_id_on_join_is_refused() -> None:
    h = Harness()
    answer = h.call(wire.JoinGroupRequest(group_id="g", member_id="ghost", session_timeout_ms=1000,
                                          protocols=PROTOCOLS))
    assert isinstance(answer, wire.JoinGroupResponse) and answer.error_code is ErrorCode.UNKNOWN_MEMBER_ID


def test_session_timeout_bounds_are_checked() -> None:
    h = Harness(GroupConfig(session_timeout_ms_min=6000))
    answer = h.call(wire.JoinGroupRequest(group_id="g", session_timeout_ms=100, protocols=PROTOCOLS))
    assert isinstance(answer, wire.JoinGroupResponse) and answer.error_code is ErrorCode.INVALID_SESSION_TIMEOUT


def test_protocol_chosen_is_one_every_member_supports() -> None:
    h = Harness()
    a = h.join(protocols=(wire.JoinGroupProtocol(name="roundrobin"), wire.JoinGroupProtocol(name="range")))
    b = h.join(protocols=(wire.JoinGroupProtocol(name="range"), wire.JoinGroupProtocol(name="sticky")))
    h.advance(100)
    assert {h.answers[a].protocol_name, h.answers[b].protocol_name} == {"range"}  # type: ignore[attr-defined]
    c = h.call(wire.JoinGroupRequest(group_id="g", session_timeout_ms=1000,
                                     protocols=(wire.JoinGroupProtocol(name="sticky"),)), required=False)
    assert c.error_code is ErrorCode.INCONSISTENT_GROUP_PROTOCOL  # type: ignore[attr-defined]


def test_rebalance_waits_for_every_member_and_only_the_leader_gets_the_list() -> None:
    """A new member makes the group rebalance; the join answers wait until the known
    member rejoined, and only the leader's answer lists the members."""
    h = Harness()
    (a,) = h.stable_group(1)
    b = h.join()
    assert b not in h.answers
    hb = h.call(wire.HeartbeatRequest(group_id="g", generation_id=1, member_id=a.member_id))
    assert hb.error_code is ErrorCode.REBALANCE_IN_PROGRESS  # type: ignore[attr-defined]
    rejoin = h.join(member_id=a.member_id)
    leader, other = h.answers[rejoin], h.answers[b]
    assert leader.generation_id == other.generation_id == 2  # type: ignore[attr-defined]
    assert len(leader.members) == 2 and other.members == ()  # type: ignore[attr-defined]


def test_in_a_stable_group_only_the_leaders_unchanged_rejoin_starts_a_rebalance() -> None:
    """Kafka's rule: a follower rejoining with the same metadata gets its generation back
    at once (a join answer it lost), while the leader's JoinGroup starts a rebalance (how
    a leader asks to reassign, e.g. for a topic's new partitions). A client that drops a
    finished join round and joins again therefore rebalances the group when it leads."""
    h = Harness()
    a, b = h.stable_group(2)
    leader, follower = (a, b) if a.members else (b, a)
    again = h.call(wire.JoinGroupRequest(group_id="g", member_id=follower.member_id, session_timeout_ms=1000,
                                         rebalance_timeout_ms=2000, protocols=PROTOCOLS), required=False)
    assert isinstance(again, wire.JoinGroupResponse)
    assert (again.error_code, again.generation_id, again.leader) == (ErrorCode.NONE, 1, leader.member_id)
    assert h.core.groups["g"].state.value == "Stable"
    rid = h.join(member_id=leader.member_id)
    assert rid not in h.answers and h.core.groups["g"].state.value == "PreparingRebalance"
    hb = h.call(wire.HeartbeatRequest(group_id="g", generation_id=1, member_id=follower.member_id))
    assert hb.error_code is ErrorCode.REBALANCE_IN_PROGRESS  # type: ignore[attr-defined]
    h.join(member_id=follower.member_id)
    assert h.answers[rid].generation_id == 2  # type: ignore[attr-defined]


def test_rebalance_timeout_removes_members_that_did_not_rejoin() -> None:
    h = Harness()
    a, b = h.stable_group(2)
    rid = h.join(member_id=a.member_id)  # the leader rejoins: a rebalance starts
    for _ in range(4):
        h.advance(499)
        # b keeps its session alive by heartbeats but never rejoins.
        hb = h.call(wire.HeartbeatRequest(group_id="g", generation_id=1, member_id=b.member_id))
        assert hb.error_code is ErrorCode.REBALANCE_IN_PROGRESS  # type: ignore[attr-defined]
    assert rid not in h.answers
    h.advance(4)
    joined = h.answers[rid]
    assert joined.generation_id == 2 and [m.member_id for m in joined.members] == [a.member_id]  # type: ignore


def test_session_timeout_expires_a_silent_member() -> None:
    h = Harness()
    a, b = h.stable_group(2)
    for _ in range(5):
        h.advance(400)
        h.call(wire.HeartbeatRequest(group_id="g", generation_id=1, member_id=a.member_id))
    hb = h.call(wire.HeartbeatRequest(group_id="g", generation_id=1, member_id=b.member_id))
    assert hb.error_code is ErrorCode.UNKNOWN_MEMBER_ID  # type: ignore[attr-defined]
    assert h.core.groups["g"].state.value == "PreparingRebalance"


def test_generation_fencing_on_heartbeat_sync_and_commit() -> None:
    h = Harness()
    (a,) = h.stable_group(1)
    old = a.generation_id
    h.join(member_id=a.member_id)  # the leader's rejoin starts generation 2
    h.advance(1)
    assert h.core.groups["g"].generation == old + 1
    for request in (wire.HeartbeatRequest(group_id="g", generation_id=old, member_id=a.member_id),
                    wire.SyncGroupRequest(group_id="g", generation_id=old, member_id=a.member_id)):
        assert h.call(request).error_code is ErrorCode.ILLEGAL_GENERATION  # type: ignore[attr-defined]
    assert commit_code(h.call(commit("g", old, a.member_id, 5))) is ErrorCode.REBALANCE_IN_PROGRESS
    h.call(wire.SyncGroupRequest(group_id="g", generation_id=old + 1, member_id=a.member_id))
    assert commit_code(h.call(commit("g", old, a.member_id, 5))) is ErrorCode.ILLEGAL_GENERATION
    assert commit_code(h.call(commit("g", old + 1, "nobody", 5))) is ErrorCode.UNKNOWN_MEMBER_ID
    assert fetched(h) == -1


def test_commit_answer_waits_for_its_write_and_a_failed_write_changes_nothing() -> None:
    h = Harness()
    (a,) = h.stable_group(1)
    h.hold = True
    rid = h.send(commit("g", 1, a.member_id, 7))
    assert rid not in h.answers and fetched(h) == -1
    h.release(ok=True)
    assert commit_code(h.answers[rid]) is ErrorCode.NONE and fetched(h) == 7
    h.hold = True
    rid = h.send(commit("g", 1, a.member_id, 9))
    h.release(ok=False)
    assert commit_code(h.answers[rid]) is ErrorCode.NOT_COORDINATOR and fetched(h) == 7


def test_commits_from_outside_only_while_empty() -> None:
    h = Harness()
    assert commit_code(h.call(commit("g", -1, "", 3))) is ErrorCode.NONE  # creates an Empty group
    (a,) = h.stable_group(1)
    assert commit_code(h.call(commit("g", -1, "", 1))) is ErrorCode.UNKNOWN_MEMBER_ID
    h.call(wire.LeaveGroupRequest(group_id="g", members=(wire.LeaveGroupMember(member_id=a.member_id),)))
    assert h.core.groups["g"].state.value == "Empty"
    assert commit_code(h.call(commit("g", -1, "", 1))) is ErrorCode.NONE
    assert fetched(h) == 1


def test_static_member_rejoin_takes_over_without_a_rebalance_and_fences_the_old_id() -> None:
    h = Harness()
    rid = h.join(instance="i1")
    h.advance(100)
    first = h.answers[rid]
    h.call(wire.SyncGroupRequest(group_id="g", generation_id=1, member_id=first.member_id,  # type: ignore
                                 group_instance_id="i1", assignments=(wire.SyncGroupAssignment(
                                     member_id=first.member_id, assignment=b"p0"),)))  # type: ignore
    again = h.call(wire.JoinGroupRequest(group_id="g", group_instance_id="i1", session_timeout_ms=1000,
                                         protocols=PROTOCOLS))
    assert again.error_code is ErrorCode.NONE and again.generation_id == 1  # type: ignore[attr-defined]
    assert again.member_id != first.member_id  # type: ignore[attr-defined]
    assert h.core.groups["g"].state.value == "Stable"
    sync = h.call(wire.SyncGroupRequest(group_id="g", generation_id=1, member_id=again.member_id,  # type: ignore
                                        group_instance_id="i1"))
    assert sync.assignment == b"p0"  # type: ignore[attr-defined]
    hb = h.call(wire.HeartbeatRequest(group_id="g", generation_id=1, member_id=first.member_id,  # type: ignore
                                      group_instance_id="i1"))
    assert hb.error_code is ErrorCode.FENCED_INSTANCE_ID  # type: ignore[attr-defined]
    assert commit_code(h.call(commit("g", 1, first.member_id, 4, instance="i1"))) is \
        ErrorCode.FENCED_INSTANCE_ID  # type: ignore[attr-defined]
    # The replacement is stored: a new coordinator knows the new id, not the old.
    reloaded = Harness(stored=tuple(h.log), now_ms=h.now)
    assert list(reloaded.core.groups["g"].members) == [again.member_id]  # type: ignore[attr-defined]


def test_failover_rebuilds_groups_and_offsets_from_the_records() -> None:
    h = Harness()
    a, b = h.stable_group(2)
    assert commit_code(h.call(commit("g", 2 - 1, a.member_id, 11, partition=0))) is ErrorCode.NONE
    assert commit_code(h.call(commit("g", 1, b.member_id, 12, partition=1))) is ErrorCode.NONE
    fresh = Harness(stored=tuple(h.log), now_ms=h.now + 5)
    group = fresh.core.groups["g"]
    assert group.state.value == "Stable" and group.generation == 1 and len(group.members) == 2
    assert fetched(fresh, partition=0) == 11 and fetched(fresh, partition=1) == 12
    # Its members carry on in their generation.
    hb = fresh.call(wire.HeartbeatRequest(group_id="g", generation_id=1, member_id=a.member_id))
    assert hb.error_code is ErrorCode.NONE  # type: ignore[attr-defined]


def test_delete_only_empty_groups_and_tombstones_reach_the_log() -> None:
    h = Harness()
    (a,) = h.stable_group(1)
    h.call(commit("g", 1, a.member_id, 3))
    done = h.call(wire.DeleteGroupsRequest(groups=("g", "nope")))
    assert [r.error_code for r in done.results] == [ErrorCode.NON_EMPTY_GROUP,  # type: ignore[attr-defined]
                                                    ErrorCode.GROUP_ID_NOT_FOUND]
    h.call(wire.LeaveGroupRequest(group_id="g", members=(wire.LeaveGroupMember(member_id=a.member_id),)))
    done = h.call(wire.DeleteGroupsRequest(groups=("g",)))
    assert done.results[0].error_code is ErrorCode.NONE  # type: ignore[attr-defined]
    assert "g" not in h.core.groups
    assert records.load(h.log, h.now) == {}


def test_offsets_expire_after_retention_counted_from_when_the_group_became_empty() -> None:
    h = Harness()
    (a,) = h.stable_group(1)
    h.call(commit("g", 1, a.member_id, 3))
    h.advance(20_000)   # longer than retention, but the group is not empty: kept
    h.call(wire.HeartbeatRequest(group_id="g", generation_id=1, member_id=a.member_id))
    assert fetched(h) == 3
    h.call(wire.LeaveGroupRequest(group_id="g", members=(wire.LeaveGroupMember(member_id=a.member_id),)))
    h.advance(9_000)
    assert fetched(h) == 3
    h.advance(2_000)
    assert fetched(h) == -1 and "g" not in h.core.groups
    assert records.load(h.log, h.now) == {}


def test_a_deleted_topics_offsets_go_from_every_group() -> None:
    """Kafka's rule (found with confluent-kafka: a topic deleted and created again was read from
    the old topic's committed offset, skipping records): deleting a topic drops its offsets in
    every group, with tombstones; an Empty group left with none is removed; other topics' stay."""
    h = Harness()
    (a,) = h.stable_group(1)
    h.call(commit("g", 1, a.member_id, 3))
    h.call(commit("g", 1, a.member_id, 4, partition=1))
    h.call(commit("e", -1, "", 7))   # an Empty group's commit from outside
    h._take(h.core.step(TopicsDeleted(topics=frozenset({"other"}), now_ms=h.now)))
    assert fetched(h) == 3 and fetched(h, "e") == 7
    h._take(h.core.step(TopicsDeleted(topics=frozenset({"t"}), now_ms=h.now)))
    assert fetched(h) == -1 and fetched(h, partition=1) == -1 and fetched(h, "e") == -1
    assert "g" in h.core.groups and "e" not in h.core.groups   # g has a member; e had only offsets
    loaded = records.load(h.log, h.now)
    assert loaded["g"].offsets == {} and "e" not in loaded


def test_a_commit_in_flight_when_its_topic_is_deleted_does_not_bring_its_offsets_back() -> None:
    """A commit accepted before its topic's deletion and stored after it: the offsets are dropped
    again (with tombstones), and its Empty group is not removed under it meanwhile (its offset
    record would then come before the group's tombstone, and the acknowledged commit be lost)."""
    h = Harness()
    h.call(commit("e", -1, "", 7))
    h.hold = True
    rid = h.send(commit("e", -1, "", 9))
    h._take(h.core.step(TopicsDeleted(topics=frozenset({"t"}), now_ms=h.now)))
    assert "e" in h.core.groups   # its commit is in flight
    h.release()
    assert commit_code(h.answers[rid]) is ErrorCode.NONE
    assert fetched(h, "e") == -1 and "e" not in h.core.groups
    assert records.load(h.log, h.now) == {}
    h.call(commit("f", -1, "", 3))   # a later commit of a topic deleted long ago stays
    assert fetched(h, "f") == 3


def test_describe_and_list() -> None:
    h = Harness()
    h.stable_group(2)
    described = h.core.describe("g")
    assert described.group_state == "Stable" and described.protocol_data == "range"
    assert sorted(m.member_assignment for m in described.members) == sorted(
        m.member_id.encode() for m in described.members)
    assert [g.group_id for g in h.core.listed(("stable",))] == ["g"]
    assert h.core.listed(("empty",)) == []
    assert h.core.describe("other").group_state == "Dead"


def test_time_going_back_is_refused() -> None:
    h = Harness(now_ms=100)
    with pytest.raises(ValueError, match="went back in time"):
        h.core.step(Tick(now_ms=99))


def test_commits_to_unknown_partitions_and_oversized_metadata_are_refused_one_by_one() -> None:
    h = Harness()
    rid = next(h._ids)
    request = wire.OffsetCommitRequest(group_id="g", topics=(wire.OffsetCommitTopic(topic="t", partitions=(
        wire.OffsetCommitPartition(partition=0, committed_offset=4),
        wire.OffsetCommitPartition(partition=9, committed_offset=4),
        wire.OffsetCommitPartition(partition=1, committed_offset=4, committed_metadata="x" * 5000))),))
    h._take(h.core.step(Received(request_id=rid, request=request, now_ms=h.now,
                                 missing_partitions=frozenset({("t", 9)}))))
    answer = h.answers[rid]
    assert isinstance(answer, wire.OffsetCommitResponse)
    assert [p.error_code for p in answer.topics[0].partitions] == [
        ErrorCode.NONE, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.OFFSET_METADATA_TOO_LARGE]
    assert fetched(h, partition=0) == 4 and fetched(h, partition=9) == -1 and fetched(h, partition=1) == -1
