"""Group state and committed offsets as records of the internal offsets topic.

Keys name what a record is about, so compaction keeps the latest record per group and
per (group, topic, partition); a tombstone (value None) removes it. Both are JSON with a
version field, Biplane's own encoding (Kafka's tools do not read this topic's records):

    key   ["group", group_id]                     value {"v": 1, generation, members, ...}
    key   ["offset", group_id, topic, partition]  value {"v": 1, offset, leader_epoch, ...}

`load` rebuilds the core's groups from a partition's records in log order: what a new
coordinator does after a leader change.
"""
from __future__ import annotations

import base64
import json
from typing import Any, Iterable

from dataplane.groups.events import GroupRecord
from dataplane.groups.state import CommittedOffset, Group, GroupState, Member

VERSION = 1


class BadGroupRecord(ValueError):
    """A record of the offsets topic this version cannot read."""


def _key(*parts: object) -> bytes:
    return json.dumps(parts, separators=(",", ":")).encode()


def group_key(group_id: str) -> bytes:
    return _key("group", group_id)


def offset_key(group_id: str, topic: str, partition: int) -> bytes:
    return _key("offset", group_id, topic, partition)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def group_record(group: Group) -> GroupRecord:
    """The group's stored state: generation, protocol, members and their assignments."""
    value = {"v": VERSION, "protocol_type": group.protocol_type, "generation": group.generation,
             "protocol": group.protocol, "leader": group.leader, "state_since_ms": group.state_since_ms,
             "members": [{"member_id": m.member_id, "instance_id": m.instance_id, "client_id": m.client_id,
                          "client_host": m.client_host, "session_timeout_ms": m.session_timeout_ms,
                          "rebalance_timeout_ms": m.rebalance_timeout_ms,
                          "protocols": [[name, _b64(meta)] for name, meta in m.protocols],
                          "assignment": _b64(m.assignment)} for m in group.members.values()]}
    return GroupRecord(key=group_key(group.group_id), value=json.dumps(value, separators=(",", ":")).encode())


def group_tombstone(group_id: str) -> GroupRecord:
    return GroupRecord(key=group_key(group_id), value=None)


def offset_record(group_id: str, topic: str, partition: int, committed: CommittedOffset) -> GroupRecord:
    value = {"v": VERSION, "offset": committed.offset, "leader_epoch": committed.leader_epoch,
             "metadata": committed.metadata, "commit_ms": committed.commit_ms}
    return GroupRecord(key=offset_key(group_id, topic, partition),
                       value=json.dumps(value, separators=(",", ":")).encode())


def offset_tombstone(group_id: str, topic: str, partition: int) -> GroupRecord:
    return GroupRecord(key=offset_key(group_id, topic, partition), value=None)


def _json(data: bytes, what: str) -> Any:
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadGroupRecord(f"{what} is not JSON: {exc}") from None


def load(records: Iterable[GroupRecord], now_ms: int) -> dict[str, Group]:
    """The groups the records describe, in log order. A group with members is Stable (its
    members' sessions start now: they have a session timeout to show up); without, Empty."""
    groups: dict[str, Group] = {}

    def group_of(group_id: str) -> Group:
        if group_id not in groups:
            groups[group_id] = Group(group_id=group_id, state_since_ms=now_ms)
        return groups[group_id]

    for record in records:
        key = _json(record.key, "a record key")
        if not isinstance(key, list) or not key or key[0] not in ("group", "offset"):
            raise BadGroupRecord(f"unknown record key {record.key!r}")
        value = None if record.value is None else _json(record.value, f"the value of {record.key!r}")
        if value is not None and value.get("v") != VERSION:
            raise BadGroupRecord(f"record {record.key!r} has version {value.get('v')!r}; this broker reads "
                                 f"version {VERSION}: upgrade it")
        if key[0] == "offset":
            _, group_id, topic, partition = key
            if value is None:
                if group_id in groups:
                    groups[group_id].offsets.pop((topic, partition), None)
                continue
            group_of(group_id).offsets[(topic, partition)] = CommittedOffset(
                offset=value["offset"], leader_epoch=value["leader_epoch"], metadata=value["metadata"],
                commit_ms=value["commit_ms"])
            continue
        group_id = key[1]
        if value is None:
            groups.pop(group_id, None)
            continue
        group = group_of(group_id)
        group.generation = value["generation"]
        group.protocol_type = value["protocol_type"]
        group.protocol = value["protocol"]
        group.leader = value["leader"]
        group.members = {}
        group.static = {}
        for m in value["members"]:
            member = Member(member_id=m["member_id"], instance_id=m["instance_id"], client_id=m["client_id"],
                            client_host=m["client_host"], session_timeout_ms=m["session_timeout_ms"],
                            rebalance_timeout_ms=m["rebalance_timeout_ms"], protocol_type=value["protocol_type"],
                            protocols=tuple((name, base64.b64decode(meta)) for name, meta in m["protocols"]),
                            assignment=base64.b64decode(m["assignment"]), last_heard_ms=now_ms)
            group.members[member.member_id] = member
            if member.instance_id is not None:
                group.static[member.instance_id] = member.member_id
        if group.members:
            group.transition(GroupState.STABLE, now_ms)
        else:
            group.state = GroupState.EMPTY
            group.state_since_ms = value["state_since_ms"]
    return groups
