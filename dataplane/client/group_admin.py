"""Consumer groups seen from outside: list them, describe them with their committed offsets and
lag, reset their offsets, delete them. Over the data-plane wire, to the brokers (each
coordinates the groups of its offsets-topic partitions), as Kafka's kafka-consumer-groups
tool does:

    async with GroupAdmin(bootstrap="127.0.0.1:9092") as admin:
        for g in await admin.list_groups():
            ...
        description = await admin.describe("billing")   # members, assignments, offsets, lag

A group's coordinator is found with FindCoordinator and found again when it answers
NOT_COORDINATOR or moves; COORDINATOR_LOAD_IN_PROGRESS is waited out, up to
request_timeout_ms. Offsets are reset (an OffsetCommit from outside the group,
generation -1) only while the group is Empty: the coordinator refuses it otherwise, and
so does `reset_offsets` first, with the members named.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from common.consumer_protocol import PROTOCOL_TYPE, ConsumerProtocolError, decode_assignment
from common.errors import BiplaneError, ErrorCode, GroupError
from common.topic_partition import TopicPartition
from common.wire import (
    DeleteGroupsRequest,
    DeleteGroupsResponse,
    DescribedGroup,
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    ListedGroup,
    ListGroupsRequest,
    ListGroupsResponse,
    OffsetCommitPartition,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetCommitTopic,
    OffsetFetchRequest,
    OffsetFetchResponse,
)
from dataplane.client.consumer import Consumer
from dataplane.client.network import Network, parse_bootstrap

RETRY_BACKOFF_MS = 100
_MOVED = frozenset({ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE})
EMPTY_STATES = frozenset({"Empty", "Dead"})   # Dead: no such group (yet), as Kafka answers


@dataclass(frozen=True, slots=True, kw_only=True)
class MemberDescription:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    assignment: tuple[TopicPartition, ...] | None   # None: not a consumer-protocol assignment
    assignment_bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionLag:
    partition: TopicPartition
    committed: int | None     # None: nothing committed
    end: int | None           # the high watermark (ListOffsets latest); None if it could not be read
    member_id: str | None     # who is assigned it now

    @property
    def lag(self) -> int | None:
        return None if self.committed is None or self.end is None else max(0, self.end - self.committed)


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupDescription:
    group_id: str
    state: str
    protocol_type: str
    protocol: str
    members: tuple[MemberDescription, ...]
    partitions: tuple[PartitionLag, ...]

    @property
    def exists(self) -> bool:
        return self.state != "Dead" or bool(self.members) or any(p.committed is not None for p in self.partitions)


class GroupAdmin:
    def __init__(self, bootstrap: str | Sequence[str] | None = None, *, request_timeout_ms: int = 30_000) -> None:
        if bootstrap is None:
            from dataplane.client.discovery import default_bootstrap
            bootstrap = default_bootstrap()
        if type(request_timeout_ms) is not int or request_timeout_ms < 1:
            raise ValueError(f"request_timeout_ms={request_timeout_ms!r} must be a positive integer")
        self.request_timeout_ms = request_timeout_ms
        self._network = Network(parse_bootstrap(bootstrap), request_timeout_ms=request_timeout_ms)
        self._reader = Consumer(bootstrap=bootstrap, request_timeout_ms=request_timeout_ms)
        self._coordinators: dict[str, tuple[str, int]] = {}

    async def __aenter__(self) -> "GroupAdmin":
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()

    async def close(self) -> None:
        await self._reader.close()
        await self._network.close()

    # ------------------------------------------------------------------ coordinators

    async def _coordinator(self, group_id: str, deadline: float) -> tuple[str, int]:
        known = self._coordinators.get(group_id)
        if known is not None:
            return known
        request = FindCoordinatorRequest(key=group_id)
        last = ""
        while True:
            if not self._network.metadata.brokers:
                await self._network.refresh_metadata()
            for broker in list(self._network.metadata.brokers) + list(self._network.bootstrap):
                try:
                    response: FindCoordinatorResponse = await self._network.request(broker, request)
                except BiplaneError as exc:
                    last = str(exc)
                    continue
                if response.error_code == ErrorCode.NONE:
                    self._coordinators[group_id] = (response.host, response.port)
                    return response.host, response.port
                last = response.error_message or response.error_code.name
                if response.error_code == ErrorCode.INVALID_GROUP_ID:
                    raise GroupError(f"group id {group_id!r} is not valid: {last}", code=response.error_code)
                break   # the brokers agree on placement: wait, then ask again
            if time.monotonic() >= deadline:
                raise GroupError(f"no coordinator for group {group_id!r} within {self.request_timeout_ms} ms: {last}",
                                 code=ErrorCode.COORDINATOR_NOT_AVAILABLE)
            await asyncio.sleep(RETRY_BACKOFF_MS / 1000)

    async def _ask_coordinator(self, group_id: str, request: object,
                               codes: Callable[[Any], list[ErrorCode]]) -> Any:
        """Send `request` to the group's coordinator; find it again when it moved, wait out a
        load; `codes` lists the answer's error codes (a moved or loading one means: again)."""
        deadline = time.monotonic() + self.request_timeout_ms / 1000
        last = ""
        while True:
            address = await self._coordinator(group_id, deadline)
            try:
                response = await self._network.request(address, request, purpose="group")
            except BiplaneError as exc:
                last = str(exc)
                self._coordinators.pop(group_id, None)
            else:
                found = codes(response)
                if not any(c in _MOVED or c == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS for c in found):
                    return response
                last = ", ".join(sorted({c.name for c in found}))
                if any(c in _MOVED for c in found):
                    self._coordinators.pop(group_id, None)
            if time.monotonic() >= deadline:
                raise GroupError(f"group {group_id!r}: its coordinator did not answer {type(request).__name__} "
                                 f"within {self.request_timeout_ms} ms: {last}", code=ErrorCode.REQUEST_TIMED_OUT)
            await asyncio.sleep(RETRY_BACKOFF_MS / 1000)

    # ------------------------------------------------------------------ the calls

    async def list_groups(self, states: Sequence[str] = ()) -> tuple[list[ListedGroup], list[str]]:
        """Every group of every broker (each lists those it coordinates), and, for brokers that
        did not answer, what went wrong: a group of a broker that is down is missing."""
        await self._network.refresh_metadata()
        groups: dict[str, ListedGroup] = {}
        failures: list[str] = []
        for broker_id in sorted(self._network.metadata.brokers):
            try:
                response: ListGroupsResponse = await self._network.request(
                    broker_id, ListGroupsRequest(states_filter=tuple(states)))
            except BiplaneError as exc:
                failures.append(f"broker {broker_id}: {exc}")
                continue
            if response.error_code != ErrorCode.NONE:
                failures.append(f"broker {broker_id}: {response.error_code.name}")
            for g in response.groups:
                groups[g.group_id] = g
        return [groups[k] for k in sorted(groups)], failures

    async def committed(self, group_id: str) -> dict[TopicPartition, int]:
        """Every offset the group has committed."""
        response: OffsetFetchResponse = await self._ask_coordinator(
            group_id, OffsetFetchRequest(group_id=group_id, topics=None),
            lambda r: [r.error_code] + [p.error_code for t in r.topics for p in t.partitions])
        if response.error_code != ErrorCode.NONE:
            raise GroupError(f"group {group_id!r}: reading its offsets failed with {response.error_code.name}",
                             code=response.error_code)
        return {TopicPartition(t.topic, p.partition): p.committed_offset for t in response.topics
                for p in t.partitions if p.error_code == ErrorCode.NONE and p.committed_offset >= 0}

    async def _described(self, group_id: str) -> DescribedGroup:
        response: DescribeGroupsResponse = await self._ask_coordinator(
            group_id, DescribeGroupsRequest(groups=(group_id,)), lambda r: [g.error_code for g in r.groups])
        for g in response.groups:
            if g.group_id == group_id or len(response.groups) == 1:
                if g.error_code not in (ErrorCode.NONE, ErrorCode.GROUP_ID_NOT_FOUND):
                    raise GroupError(f"group {group_id!r}: describe failed with {g.error_code.name}",
                                     code=g.error_code)
                return g
        raise GroupError(f"group {group_id!r}: the coordinator's answer does not describe it",
                         code=ErrorCode.UNKNOWN)

    async def describe(self, group_id: str) -> GroupDescription:
        """State, members with their assignments, and per partition the committed offset, the end
        (high watermark) and the lag between them."""
        described = await self._described(group_id)
        committed = await self.committed(group_id)
        members = []
        owner: dict[TopicPartition, str] = {}
        for m in described.members:
            partitions: tuple[TopicPartition, ...] | None = None
            if described.protocol_type == PROTOCOL_TYPE:
                try:
                    partitions = decode_assignment(m.member_assignment).partitions
                except ConsumerProtocolError:
                    partitions = None
            for tp in partitions or ():
                owner[tp] = m.member_id
            members.append(MemberDescription(member_id=m.member_id, group_instance_id=m.group_instance_id,
                                             client_id=m.client_id, client_host=m.client_host, assignment=partitions,
                                             assignment_bytes=len(m.member_assignment)))
        tps = sorted(set(committed) | set(owner))
        ends: dict[TopicPartition, int] = {}
        if tps:
            ends = await self._end_offsets(tps)
        rows = tuple(PartitionLag(partition=tp, committed=committed.get(tp), end=ends.get(tp), member_id=owner.get(tp))
                     for tp in tps)
        return GroupDescription(group_id=group_id, state=described.group_state or "Dead",
                                protocol_type=described.protocol_type, protocol=described.protocol_data,
                                members=tuple(members), partitions=rows)

    async def _end_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        """High watermarks, leaving out partitions of topics that no longer exist."""
        existing = []
        for topic in sorted({tp.topic for tp in tps}):
            await self._network.refresh_metadata({topic})
            count = self._network.metadata.partition_count(topic) or 0
            existing += [tp for tp in tps if tp.topic == topic and tp.partition < count]
        return await self._reader.end_offsets(existing) if existing else {}

    async def partitions(self, topic: str) -> list[TopicPartition]:
        return await self._reader.partitions_for(topic)

    async def offsets_for(self, tps: list[TopicPartition], how: str, value: int | None = None
                          ) -> dict[TopicPartition, int]:
        """Targets for a reset: "earliest", "latest", "offset" (value, held within each
        partition's earliest and latest) or "timestamp" (value in ms: the first record at or
        after it, else the end)."""
        if how == "earliest":
            return await self._reader.beginning_offsets(tps)
        if how == "latest":
            return await self._reader.end_offsets(tps)
        if how == "timestamp":
            assert value is not None
            return await self._reader.offsets_for_times({tp: value for tp in tps})
        if how == "offset":
            assert value is not None
            low, high = await self._reader.beginning_offsets(tps), await self._reader.end_offsets(tps)
            return {tp: min(max(value, low[tp]), high[tp]) for tp in tps}
        raise ValueError(f"unknown reset {how!r}: earliest, latest, offset or timestamp")

    async def reset_offsets(self, group_id: str, offsets: Mapping[TopicPartition, int]) -> None:
        """Commit `offsets` for a group with no members (Kafka's rule: resetting a live group's
        offsets would race its members' own commits)."""
        described = await self._described(group_id)
        if described.group_state not in EMPTY_STATES or described.members:
            raise GroupError(f"group {group_id!r} is {described.group_state} with {len(described.members)} "
                             f"member(s): offsets can be reset only while it has none; stop its consumers first",
                             code=ErrorCode.NON_EMPTY_GROUP)
        topics: dict[str, list[OffsetCommitPartition]] = {}
        for tp, offset in sorted(offsets.items()):
            topics.setdefault(tp.topic, []).append(OffsetCommitPartition(partition=tp.partition,
                                                                         committed_offset=offset))
        request = OffsetCommitRequest(group_id=group_id, topics=tuple(
            OffsetCommitTopic(topic=t, partitions=tuple(ps)) for t, ps in topics.items()))
        response: OffsetCommitResponse = await self._ask_coordinator(
            group_id, request, lambda r: [p.error_code for t in r.topics for p in t.partitions])
        refused = {TopicPartition(t.topic, p.partition): p.error_code for t in response.topics for p in t.partitions
                   if p.error_code != ErrorCode.NONE}
        if refused:
            code = next(iter(refused.values()))
            why = " (members joined meanwhile)" if code in (ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.ILLEGAL_GENERATION,
                                                             ErrorCode.REBALANCE_IN_PROGRESS) else ""
            raise GroupError(f"group {group_id!r}: the reset was refused{why}: " +
                             ", ".join(f"{tp}: {c.name}" for tp, c in sorted(refused.items())[:5]), code=code)

    async def delete(self, group_ids: Sequence[str]) -> dict[str, ErrorCode]:
        """Delete groups with no members, offsets and all; the code per group (NONE: deleted)."""
        out: dict[str, ErrorCode] = {}
        for group_id in group_ids:
            response: DeleteGroupsResponse = await self._ask_coordinator(
                group_id, DeleteGroupsRequest(groups=(group_id,)), lambda r: [x.error_code for x in r.results])
            out[group_id] = next((x.error_code for x in response.results if x.group_id == group_id), ErrorCode.UNKNOWN)
        return out


__all__ = ["GroupAdmin", "GroupDescription", "MemberDescription", "PartitionLag", "EMPTY_STATES"]
