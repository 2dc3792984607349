"""The group member core's rules, one at a time, with time and answers moved by hand."""
from __future__ import annotations

from typing import TypeVar

import pytest

from common.consumer_protocol import Assignment, decode_assignment, decode_subscription, encode_assignment
from common.errors import ErrorCode
from common.topic_partition import TopicPartition
from common.wire import (
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupMember,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    OffsetCommitPartitionResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetCommitTopicResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)
from dataplane.client.assignors import assignors_for
from dataplane.client.group_core import (
    Answered,
    Close,
    CommitAnswered,
    Failed,
    GroupCore,
    GroupSettings,
    PartitionCounts,
    Polled,
    Ready,
    RevocationDone,
    State,
    Subscribe,
    Tick,
)

T = [TopicPartition("t", p) for p in range(4)]
R = TypeVar("R")


def make(strategy: str = "range", instance: str | None = None) -> GroupCore:
    return GroupCore(GroupSettings(group_id="g", group_instance_id=instance, client_id="c",
                                   assignors=tuple(assignors_for(strategy)), session_timeout_ms=10_000,
                                   heartbeat_interval_ms=3_000, max_poll_interval_ms=60_000), now_ms=0)


def only(ready: Ready, kind: type[R]) -> R:
    found = [s.request for s in ready.send if isinstance(s.request, kind)]
    assert len(found) == 1, f"expected one {kind.__name__} in {ready.send}"
    return found[0]


def answer(core: GroupCore, request: object, response: object, now_ms: int | None = None) -> Ready:
    return core.step(Answered(request=request, response=response, now_ms=core.now_ms if now_ms is None else now_ms))


def join_stable(core: GroupCore, given: list[TopicPartition], *, generation: int = 1,
                members: tuple[JoinGroupMember, ...] = ()) -> Ready:
    """Drive a core from its subscription to Stable with `given` as its assignment (not leader)."""
    ready = core.step(Subscribe(topics=("t",), now_ms=core.now_ms))
    if core.coordinator is None:
        find = only(ready, FindCoordinatorRequest)
        ready = answer(core, find, FindCoordinatorResponse(node_id=1, host="h", port=9))
    join = only(ready, JoinGroupRequest)
    ready = answer(core, join, JoinGroupResponse(generation_id=generation, leader="other", member_id="me",
                                                 protocol_name=core.settings.assignors[0].name, members=members))
    sync = only(ready, SyncGroupRequest)
    return answer(core, sync, SyncGroupResponse(assignment=encode_assignment(Assignment(partitions=tuple(given)))))


def test_first_join_asks_for_a_member_id_then_joins_with_it_at_once() -> None:
    core = make()
    ready = core.step(Subscribe(topics=("t",), now_ms=0))
    find = only(ready, FindCoordinatorRequest)
    assert ready.send[0].to is None   # any broker
    ready = answer(core, find, FindCoordinatorResponse(node_id=1, host="h", port=9))
    join = only(ready, JoinGroupRequest)
    assert join.member_id == "" and join.protocol_type == "consumer" and [p.name for p in join.protocols] == ["range"]
    ready = answer(core, join, JoinGroupResponse(error_code=ErrorCode.MEMBER_ID_REQUIRED, member_id="m-1"))
    assert only(ready, JoinGroupRequest).member_id == "m-1"


def test_leader_assigns_with_the_chosen_assignor_once_it_has_partition_counts() -> None:
    core = make("roundrobin")
    ready = core.step(Subscribe(topics=("t",), now_ms=0))
    ready = answer(core, only(ready, FindCoordinatorRequest), FindCoordinatorResponse(node_id=1, host="h", port=9))
    join = only(ready, JoinGroupRequest)
    metadata = join.protocols[0].metadata
    ready = answer(core, join, JoinGroupResponse(generation_id=3, protocol_name="roundrobin", leader="a", member_id="a",
                                                 members=(JoinGroupMember(member_id="a", metadata=metadata),
                                                          JoinGroupMember(member_id="b", metadata=metadata))))
    assert ready.need_partition_counts == ("t",) and not ready.send   # nothing sent before the counts
    ready = core.step(PartitionCounts(counts={"t": 4}, now_ms=0))
    sync = only(ready, SyncGroupRequest)
    given = {a.member_id: decode_assignment(a.assignment).partitions for a in sync.assignments}
    assert given == {"a": (T[0], T[2]), "b": (T[1], T[3])}


def test_eager_revokes_everything_before_it_rejoins() -> None:
    core = make("range")
    ready = join_stable(core, T[:2])
    assert ready.assign == (T[0], T[1])
    ready = core.step(Tick(now_ms=3_000))
    beat = only(ready, HeartbeatRequest)
    ready = answer(core, beat, HeartbeatResponse(error_code=ErrorCode.REBALANCE_IN_PROGRESS))
    assert ready.revoke == (T[0], T[1]) and not ready.send, "joined before the partitions were revoked"
    # A commit of the revoked positions still carries the generation they were read in.
    assert core.commit_request({T[0]: 5}).generation_id == 1
    ready = core.step(RevocationDone(now_ms=3_001))
    join = only(ready, JoinGroupRequest)
    subscription, _ = decode_subscription(join.protocols[0].metadata)
    assert subscription.owned_partitions == ()


def test_cooperative_keeps_what_stays_and_revokes_only_what_moves() -> None:
    core = make("cooperative-sticky")
    join_stable(core, T[:3])
    ready = core.step(Tick(now_ms=3_000))
    ready = answer(core, only(ready, HeartbeatRequest), HeartbeatResponse(error_code=ErrorCode.REBALANCE_IN_PROGRESS))
    assert not ready.revoke, "cooperative revoked before it knew what moves"
    join = only(ready, JoinGroupRequest)
    subscription, _ = decode_subscription(join.protocols[0].metadata)
    assert subscription.owned_partitions == tuple(T[:3]) and subscription.generation_id == 1
    ready = answer(core, join, JoinGroupResponse(generation_id=2, protocol_name="cooperative-sticky", leader="x",
                                                 member_id="me"))
    ready = answer(core, only(ready, SyncGroupRequest),
                   SyncGroupResponse(assignment=encode_assignment(Assignment(partitions=(T[0], T[1])))))
    assert ready.revoke == (T[2],) and ready.assign == ()
    assert not any(isinstance(s.request, JoinGroupRequest) for s in ready.send)
    ready = core.step(RevocationDone(now_ms=3_000))
    join = only(ready, JoinGroupRequest)   # once more, so T[2] can reach its new owner
    assert decode_subscription(join.protocols[0].metadata)[0].owned_partitions == (T[0], T[1])


def test_generation_lost_means_partitions_lost_not_revoked() -> None:
    core = make("cooperative-sticky")
    join_stable(core, T[:2])
    ready = core.step(Tick(now_ms=3_000))
    ready = answer(core, only(ready, HeartbeatRequest), HeartbeatResponse(error_code=ErrorCode.UNKNOWN_MEMBER_ID))
    assert ready.lost == (T[0], T[1]) and ready.revoke == ()
    assert core.member_id == "" and not core.in_generation
    join = only(core.step(RevocationDone(now_ms=3_000)), JoinGroupRequest)
    assert join.member_id == ""


def test_a_heartbeat_answer_for_an_older_generation_is_ignored() -> None:
    core = make("range")
    join_stable(core, T[:1], generation=4)
    stale = HeartbeatRequest(group_id="g", generation_id=3, member_id="me")
    ready = answer(core, stale, HeartbeatResponse(error_code=ErrorCode.ILLEGAL_GENERATION))
    assert core.state is State.STABLE and core.generation_id == 4 and not ready.lost


def test_a_stale_commit_error_does_not_undo_a_newer_generation() -> None:
    core = make("range")
    join_stable(core, T[:1], generation=4)
    old = OffsetCommitRequest(group_id="g", generation_id=3, member_id="me")   # sent before generation 4
    refused = OffsetCommitResponse(topics=(OffsetCommitTopicResponse(topic="t", partitions=(
        OffsetCommitPartitionResponse(partition=0, error_code=ErrorCode.ILLEGAL_GENERATION),)),))
    ready = core.step(CommitAnswered(request=old, response=refused, now_ms=1))
    assert ready.commit_error is ErrorCode.ILLEGAL_GENERATION and core.generation_id == 4 and not ready.lost


def test_coordinator_errors_find_it_again_after_the_backoff() -> None:
    core = make("range")
    join_stable(core, T[:1])
    ready = core.step(Tick(now_ms=3_000))
    ready = answer(core, only(ready, HeartbeatRequest), HeartbeatResponse(error_code=ErrorCode.NOT_COORDINATOR))
    assert core.coordinator is None and not ready.send
    assert core.wake_at_ms() == 3_100
    only(core.step(Tick(now_ms=3_100)), FindCoordinatorRequest)


def test_load_in_progress_retries_the_same_coordinator() -> None:
    core = make("range")
    ready = core.step(Subscribe(topics=("t",), now_ms=0))
    ready = answer(core, only(ready, FindCoordinatorRequest), FindCoordinatorResponse(node_id=1, host="h", port=9))
    ready = answer(core, only(ready, JoinGroupRequest),
                   JoinGroupResponse(error_code=ErrorCode.COORDINATOR_LOAD_IN_PROGRESS))
    assert not ready.send and core.coordinator is not None
    assert only(core.step(Tick(now_ms=100)), JoinGroupRequest)


def test_a_failed_request_forgets_the_coordinator() -> None:
    core = make("range")
    ready = core.step(Subscribe(topics=("t",), now_ms=0))
    ready = answer(core, only(ready, FindCoordinatorRequest), FindCoordinatorResponse(node_id=1, host="h", port=9))
    join = only(ready, JoinGroupRequest)
    core.step(Failed(request=join, reason="connection reset", now_ms=10))
    assert core.coordinator is None and core.state is State.REJOIN
    only(core.step(Tick(now_ms=110)), FindCoordinatorRequest)


def test_a_member_not_polled_for_max_poll_interval_leaves_and_rejoins_at_the_next_poll() -> None:
    core = make("range")
    join_stable(core, T[:2])
    for now in range(3_000, 60_001, 3_000):   # heartbeats keep the session, but nobody polls
        ready = core.step(Tick(now_ms=now))
        for s in ready.send:
            answer(core, s.request, HeartbeatResponse())
    ready = core.step(Tick(now_ms=60_001))
    assert only(ready, LeaveGroupRequest).members[0].member_id == "me"
    assert ready.lost == (T[0], T[1]) and not core.in_generation
    core.step(RevocationDone(now_ms=60_002))
    assert not core.step(Tick(now_ms=70_000)).send, "rejoined without a poll"
    only(core.step(Polled(now_ms=70_001)), JoinGroupRequest)


def test_close_commits_then_leaves_and_a_static_member_does_not_leave() -> None:
    for instance, leaves in ((None, True), ("host-1", False)):
        core = make("range", instance)
        join_stable(core, T[:2])
        ready = core.step(Close(now_ms=10))
        assert ready.revoke == (T[0], T[1]) and not ready.send   # commit first
        ready = core.step(RevocationDone(now_ms=11))
        assert ready.left
        assert any(isinstance(s.request, LeaveGroupRequest) for s in ready.send) is leaves


def test_close_during_a_cooperative_revocation_revokes_the_rest_before_leaving() -> None:
    core = make("cooperative-sticky")
    join_stable(core, T[:3])
    ready = core.step(Tick(now_ms=3_000))
    ready = answer(core, only(ready, HeartbeatRequest), HeartbeatResponse(error_code=ErrorCode.REBALANCE_IN_PROGRESS))
    join = only(ready, JoinGroupRequest)
    ready = answer(core, join, JoinGroupResponse(generation_id=2, protocol_name="cooperative-sticky", leader="x",
                                                 member_id="me"))
    ready = answer(core, only(ready, SyncGroupRequest),
                   SyncGroupResponse(assignment=encode_assignment(Assignment(partitions=(T[0], T[1])))))
    assert ready.revoke == (T[2],)
    ready = core.step(Close(now_ms=3_001))   # before the consumer performed that revocation
    assert not ready.revoke and not ready.send
    ready = core.step(RevocationDone(now_ms=3_002))
    assert ready.revoke == (T[0], T[1]) and not ready.left, "closed without committing what it still owned"
    assert core.commit_request({T[0]: 1}).generation_id == 2
    ready = core.step(RevocationDone(now_ms=3_003))
    assert ready.left and only(ready, LeaveGroupRequest)


def test_fenced_static_member_is_fatal() -> None:
    core = make("range", "host-1")
    join_stable(core, T[:1])
    ready = core.step(Tick(now_ms=3_000))
    ready = answer(core, only(ready, HeartbeatRequest), HeartbeatResponse(error_code=ErrorCode.FENCED_INSTANCE_ID))
    assert ready.fatal is not None and ready.fatal.code is ErrorCode.FENCED_INSTANCE_ID
    assert "group_instance_id" in ready.fatal.message


def test_the_leader_rejoins_when_a_partition_count_changes() -> None:
    core = make("range")
    ready = core.step(Subscribe(topics=("t",), now_ms=0))
    ready = answer(core, only(ready, FindCoordinatorRequest), FindCoordinatorResponse(node_id=1, host="h", port=9))
    join = only(ready, JoinGroupRequest)
    ready = answer(core, join, JoinGroupResponse(generation_id=1, protocol_name="range", leader="me", member_id="me",
                                                 members=(JoinGroupMember(member_id="me",
                                                                          metadata=join.protocols[0].metadata),)))
    sync = only(core.step(PartitionCounts(counts={"t": 4}, now_ms=0)), SyncGroupRequest)
    answer(core, sync, SyncGroupResponse(assignment=encode_assignment(Assignment(partitions=tuple(T)))))
    core.step(PartitionCounts(counts={"t": 4, "other": 9}, now_ms=1))
    assert core.state is State.STABLE
    ready = core.step(PartitionCounts(counts={"t": 6}, now_ms=2))
    assert core.state is State.REJOIN and ready.revoke == tuple(T)


def test_a_follower_leaves_partition_counts_to_the_leader() -> None:
    core = make("range")
    join_stable(core, T[:1])
    core.step(PartitionCounts(counts={"t": 6}, now_ms=1))
    assert core.state is State.STABLE


def test_time_never_goes_back() -> None:
    core = make()
    core.step(Tick(now_ms=5))
    with pytest.raises(ValueError, match="back in time"):
        core.step(Tick(now_ms=4))
