"""Kafka's classic group APIs: FindCoordinator 0–2, JoinGroup 0–5, SyncGroup 0–3,
Heartbeat 0–3, LeaveGroup 0–3, OffsetCommit 2–7, OffsetFetch 1–5, DescribeGroups 0–4,
ListGroups 0–2 and DeleteGroups 0–1.

Each becomes Biplane's own group message (common/wire/messages.py) and goes to the
broker's group coordinator (dataplane/groups/driver.py), the same one Biplane's
listener calls; the answer is translated back for the version asked. What differs
between versions is only here:
- JoinGroup v0 has no rebalance timeout (Kafka takes the session timeout), and before
  v4 a first join gets its member id at once instead of MEMBER_ID_REQUIRED (KIP-394).
- LeaveGroup before v3 names one member, and its error is the response's own.
- FindCoordinator names Kafka ports; OffsetCommit v2–4's retention_time is ignored
  (the broker's offsets retention applies, as in Kafka 2.1 and later).
"""
from __future__ import annotations

from typing import Any

from common.errors import ErrorCode
from common.wire import messages as wire
from dataplane.kafka import messages
from dataplane.kafka.registry import Answer, Context, Request, register

OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR, JOIN_GROUP, HEARTBEAT = 8, 9, 10, 11, 12
LEAVE_GROUP, SYNC_GROUP, DESCRIBE_GROUPS, LIST_GROUPS, DELETE_GROUPS = 13, 14, 15, 16, 42
_NO_AUTHORIZED_OPERATIONS = -2147483648


def _build(request: Request, values: dict[str, Any]) -> Answer:
    return messages.build(messages.response_schema(request.api_key, request.version),
                          {"throttle_time": 0, **values})


async def _ask(context: Context, message: object, *, member_id_required: bool = True, client_host: str = "") -> Any:
    groups = context.requests.groups
    assert groups is not None, "the broker sets its group coordinator before it listens"
    return await groups.handle(message, member_id_required=member_id_required, client_host=client_host)


@register(FIND_COORDINATOR, "FindCoordinator", (0, 2))
async def find_coordinator(request: Request, context: Context) -> Answer:
    body = request.body
    groups = context.requests.groups
    assert groups is not None
    done = await groups.find_coordinator(wire.FindCoordinatorRequest(
        key=body.key, key_type=messages.field(body, "key_type", wire.GROUP_KEY_TYPE)), kafka=True)
    return _build(request, {"error_code": int(done.error_code), "error_message": done.error_message,
                            "node_id": done.node_id, "host": done.host, "port": done.port})


@register(JOIN_GROUP, "JoinGroup", (0, 5))
async def join_group(request: Request, context: Context) -> Answer:
    body = request.body
    session_ms = messages.field(body, "session_timeout")
    done = await _ask(context, wire.JoinGroupRequest(
        group_id=body.group_id, session_timeout_ms=session_ms,
        rebalance_timeout_ms=messages.field(body, "rebalance_timeout", session_ms),
        member_id=body.member_id, group_instance_id=messages.field(body, "group_instance_id"),
        protocol_type=body.protocol_type,
        protocols=tuple(wire.JoinGroupProtocol(name=p.name, metadata=p.metadata) for p in body.protocols),
        client_id=request.client_id or ""), member_id_required=request.version >= 4,
        client_host=request.client_host)
    return _build(request, {
        "error_code": int(done.error_code), "generation_id": done.generation_id,
        "protocol_name": done.protocol_name or "", "leader": done.leader, "member_id": done.member_id,
        "members": [{"member_id": m.member_id, "group_instance_id": m.group_instance_id, "metadata": m.metadata}
                    for m in done.members]})


@register(SYNC_GROUP, "SyncGroup", (0, 3))
async def sync_group(request: Request, context: Context) -> Answer:
    body = request.body
    done = await _ask(context, wire.SyncGroupRequest(
        group_id=body.group_id, generation_id=body.generation_id, member_id=body.member_id,
        group_instance_id=messages.field(body, "group_instance_id"),
        assignments=tuple(wire.SyncGroupAssignment(member_id=a.member_id, assignment=a.assignment)
                          for a in body.assignments)))
    return _build(request, {"error_code": int(done.error_code), "assignment": done.assignment})


@register(HEARTBEAT, "Heartbeat", (0, 3))
async def heartbeat(request: Request, context: Context) -> Answer:
    body = request.body
    done = await _ask(context, wire.HeartbeatRequest(
        group_id=body.group_id, generation_id=body.generation_id, member_id=body.member_id,
        group_instance_id=messages.field(body, "group_instance_id")))
    return _build(request, {"error_code": int(done.error_code)})


@register(LEAVE_GROUP, "LeaveGroup", (0, 3))
async def leave_group(request: Request, context: Context) -> Answer:
    body = request.body
    if request.version < 3:
        members: tuple[wire.LeaveGroupMember, ...] = (wire.LeaveGroupMember(member_id=body.member_id),)
    else:
        members = tuple(wire.LeaveGroupMember(member_id=m.member_id, group_instance_id=m.group_instance_id)
                        for m in body.members)
    done = await _ask(context, wire.LeaveGroupRequest(group_id=body.group_id, members=members))
    error = done.error_code
    if request.version < 3 and error is ErrorCode.NONE and done.members:
        error = done.members[0].error_code
    return _build(request, {"error_code": int(error), "members": [
        {"member_id": m.member_id, "group_instance_id": m.group_instance_id, "error_code": int(m.error_code)}
        for m in done.members]})


@register(OFFSET_COMMIT, "OffsetCommit", (2, 7))
async def offset_commit(request: Request, context: Context) -> Answer:
    body = request.body
    done = await _ask(context, wire.OffsetCommitRequest(
        group_id=body.group_id, generation_id=body.generation_id_or_member_epoch, member_id=body.member_id,
        group_instance_id=messages.field(body, "group_instance_id"),
        topics=tuple(wire.OffsetCommitTopic(topic=t.name, partitions=tuple(
            wire.OffsetCommitPartition(partition=p.partition_index, committed_offset=p.committed_offset,
                                       committed_leader_epoch=messages.field(p, "committed_leader_epoch", -1),
                                       committed_metadata=p.committed_metadata)
            for p in t.partitions)) for t in body.topics)))
    return _build(request, {"topics": [
        {"name": t.topic, "partitions": [{"partition_index": p.partition, "error_code": int(p.error_code)}
                                         for p in t.partitions]} for t in done.topics]})


@register(OFFSET_FETCH, "OffsetFetch", (1, 5))
async def offset_fetch(request: Request, context: Context) -> Answer:
    body = request.body
    topics = None if body.topics is None else tuple(
        wire.OffsetFetchTopic(topic=t.name, partitions=tuple(t.partition_indexes)) for t in body.topics)
    done = await _ask(context, wire.OffsetFetchRequest(group_id=body.group_id, topics=topics))
    error = int(done.error_code)
    answered = done.topics
    if request.version < 2 and error and topics is not None:
        # Before v2 the error is per partition only.
        answered = tuple(wire.OffsetFetchTopicResponse(topic=t.topic, partitions=tuple(
            wire.OffsetFetchPartitionResponse(partition=p, error_code=done.error_code) for p in t.partitions))
            for t in topics)
    return _build(request, {"error_code": error, "topics": [
        {"name": t.topic, "partitions": [
            {"partition_index": p.partition, "committed_offset": p.committed_offset,
             "committed_leader_epoch": p.committed_leader_epoch, "metadata": p.metadata,
             "error_code": int(p.error_code)} for p in t.partitions]} for t in answered]})


@register(DESCRIBE_GROUPS, "DescribeGroups", (0, 4))
async def describe_groups(request: Request, context: Context) -> Answer:
    done = await _ask(context, wire.DescribeGroupsRequest(groups=tuple(request.body.groups)))
    return _build(request, {"groups": [
        {"error_code": int(g.error_code), "group_id": g.group_id, "group_state": g.group_state,
         "protocol_type": g.protocol_type, "protocol_data": g.protocol_data,
         "authorized_operations": _NO_AUTHORIZED_OPERATIONS,
         "members": [{"member_id": m.member_id, "group_instance_id": m.group_instance_id, "client_id": m.client_id,
                      "client_host": m.client_host, "member_metadata": m.member_metadata,
                      "member_assignment": m.member_assignment} for m in g.members]}
        for g in done.groups]})


@register(LIST_GROUPS, "ListGroups", (0, 4))
async def list_groups(request: Request, context: Context) -> Answer:
    # v4 (KIP-518): a filter by state, and each group's state (clients show UNKNOWN without).
    states = tuple(messages.field(request.body, "states_filter", ()) or ())
    done = await _ask(context, wire.ListGroupsRequest(states_filter=states))
    return _build(request, {"error_code": int(done.error_code), "groups": [
        {"group_id": g.group_id, "protocol_type": g.protocol_type, "group_state": g.group_state}
        for g in done.groups]})


@register(DELETE_GROUPS, "DeleteGroups", (0, 1))
async def delete_groups(request: Request, context: Context) -> Answer:
    done = await _ask(context, wire.DeleteGroupsRequest(groups=tuple(request.body.groups_names)))
    return _build(request, {"results": [{"group_id": r.group_id, "error_code": int(r.error_code)}
                                        for r in done.results]})
