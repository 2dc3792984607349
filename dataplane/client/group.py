"""The asyncio driver of a consumer's group membership: it runs GroupCore
(dataplane/client/group_core.py) and performs what the core asks, and nothing else.

A task of its own steps the core with ticks and with the answers of the requests it sends,
so heartbeats keep going however long the user takes between polls (until
max_poll_interval_ms, when the core leaves the group). What must happen in the user's
own time — revocations (commit, then on_revoke), assignments (start at the committed
offsets, then on_assign) — is queued here and performed by the consumer inside poll()
and close() (`take_work`, then `revocation_done`), as Kafka's consumer does: so a
commit on revoke covers only records poll() has handed out, the user's callbacks never
run in the middle of the user's processing, and the core rejoins only afterwards.

Connections to the coordinator are by its address, one per purpose: JoinGroup and
SyncGroup wait at the coordinator for the whole rebalance, so they have one of their own
("group-join"); heartbeats another ("group-heartbeat"), so neither waits behind commits
("group").
"""
from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import time
from typing import Any, Mapping

from common.errors import BiplaneError, ErrorCode, GroupError, OffsetCommitError
from common.tasks import TaskOwner, cancel_and_wait
from common.topic_partition import TopicPartition
from common.wire import (
    HeartbeatRequest,
    JoinGroupRequest,
    LeaveGroupRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    OffsetFetchTopic,
    SyncGroupRequest,
)
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
    Send,
    State,
    Subscribe,
    Tick,
    WantCoordinator,
)
from dataplane.client.network import Network

log = logging.getLogger("biplane.client.group")

JOIN_TIMEOUT_EXTRA_MS = 5_000   # a join may wait the whole rebalance timeout at the coordinator
_RETRIABLE_COMMIT = frozenset({ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE,
                               ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ErrorCode.REQUEST_TIMED_OUT,
                               ErrorCode.NETWORK_EXCEPTION})


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


class GroupDriver:
    def __init__(self, network: Network, settings: GroupSettings, *, request_timeout_ms: int,
                 metadata_max_age_ms: int) -> None:
        self.network = network
        self.settings = settings
        self.request_timeout_ms = request_timeout_ms
        self.metadata_max_age_ms = metadata_max_age_ms
        self.core = GroupCore(settings, now_ms=_now_ms())
        self.work: collections.deque[Ready] = collections.deque()   # for the consumer, in order
        self.fatal: GroupError | None = None
        self.changed = asyncio.Event()       # work or a fatal error for the consumer
        self._found = asyncio.Event()        # a coordinator is known
        self._kick = asyncio.Event()         # the core has something new: recompute the wake time
        self._left = asyncio.Event()
        self._tasks = TaskOwner()
        self._runner: asyncio.Task[None] | None = None
        self._broker_turn = itertools.count()
        self._commit_seq = itertools.count(1)
        self._commit_latest: dict[TopicPartition, int] = {}   # partition -> the newest commit asking for it
        self._counts_checked_ms = 0

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        if self._runner is None:
            self._runner = asyncio.get_running_loop().create_task(self._run(), name="group-member")

    def subscribe(self, topics: tuple[str, ...]) -> None:
        self.start()
        self.step(Subscribe(topics=topics, now_ms=_now_ms()))

    def polled(self) -> None:
        self.step(Polled(now_ms=_now_ms()))

    def close(self) -> None:
        """Start leaving the group: the consumer performs the revocation this asks for (take_work)
        in its own close, then the core sends LeaveGroup (wait_left)."""
        if self._runner is not None:
            self.step(Close(now_ms=_now_ms()))
        else:
            self._left.set()

    async def wait_left(self, timeout_ms: int) -> None:
        try:
            await asyncio.wait_for(self._left.wait(), timeout_ms / 1000)
        except asyncio.TimeoutError:
            log.warning("group %r: no answer to leaving the group within %d ms; the coordinator will drop this "
                        "member after its session timeout", self.settings.group_id, timeout_ms)

    async def stop(self) -> None:
        await cancel_and_wait(self._runner)
        await self._tasks.cancel_and_wait()

    # ------------------------------------------------------------------ stepping the core

    def step(self, event: Any) -> None:
        if self.core.state is State.CLOSED and not isinstance(event, (Answered, Failed, CommitAnswered)):
            return
        before = self.core.wake_at_ms()
        self._perform(self.core.step(event))
        after = self.core.wake_at_ms()
        # Wake the runner only when its next deadline came nearer (or it must stop): a poll moves
        # the max-poll deadline later at every call, which needs no wake-up (a runner waking
        # early just sleeps again).
        if (after is None) != (before is None) or (after is not None and before is not None and after < before):
            self._kick.set()

    def _perform(self, ready: Ready) -> None:
        if ready.fatal is not None:
            self.fatal = GroupError(ready.fatal.message, code=ready.fatal.code)
            self.changed.set()
            self._left.set()
        if ready.revoke or ready.lost or ready.assign:
            self.work.append(Ready(revoke=ready.revoke, lost=ready.lost, assign=ready.assign))
            self.changed.set()
        for send in ready.send:
            self._tasks.spawn(self._send(send), name=f"group-{type(send.request).__name__}")
        if ready.need_partition_counts:
            self._tasks.spawn(self._counts(ready.need_partition_counts), name="group-partition-counts")
        if ready.left and not any(isinstance(s.request, LeaveGroupRequest) for s in ready.send):
            self._left.set()   # (else once the LeaveGroup is answered or failed: _send)
        if self.core.coordinator is not None:
            self._found.set()

    async def _run(self) -> None:
        while self.core.state is not State.CLOSED:
            self._kick.clear()
            wake = self.core.wake_at_ms()
            if self._leader_should_check_counts():
                self._counts_checked_ms = _now_ms()
                self._tasks.spawn(self._counts(tuple(sorted(self.core.group_topics))), name="group-counts-check")
            timeout = None if wake is None else max(0, wake - _now_ms()) / 1000
            if timeout is None or timeout > 0:
                try:
                    await asyncio.wait_for(self._kick.wait(), timeout)
                except asyncio.TimeoutError:
                    pass
            self.step(Tick(now_ms=_now_ms()))

    def _leader_should_check_counts(self) -> bool:
        """Kafka's leader notices partitions added to a topic the group reads through its metadata
        refreshes (metadata.max.age.ms): so does ours."""
        core = self.core
        return core.state is State.STABLE and core.is_leader and bool(core.group_topics) and \
            _now_ms() - self._counts_checked_ms >= self.metadata_max_age_ms

    async def _counts(self, topics: tuple[str, ...]) -> None:
        try:
            await self.network.refresh_metadata(set(topics))
        except BiplaneError as exc:
            log.debug("group %r: metadata for the assignment: %s", self.settings.group_id, exc)
        meta = self.network.metadata
        self.step(PartitionCounts(counts={t: meta.partition_count(t) or 0 for t in topics}, now_ms=_now_ms()))

    async def _send(self, send: Send) -> None:
        request = send.request
        try:
            if send.to is None:
                response = await self._any_broker(request)
            else:
                response = await self.network.request((send.to.host, send.to.port), request,
                                                      purpose=_purpose(request), timeout_ms=self._timeout_ms(request))
        except BiplaneError as exc:
            log.debug("group %r: %s failed: %s", self.settings.group_id, type(request).__name__, exc)
            self.step(Failed(request=request, reason=str(exc), now_ms=_now_ms()))
        else:
            self.step(Answered(request=request, response=response, now_ms=_now_ms()))
        if isinstance(request, LeaveGroupRequest):
            self._left.set()

    def _timeout_ms(self, request: object) -> int:
        if isinstance(request, (JoinGroupRequest, SyncGroupRequest)):
            return self.settings.max_poll_interval_ms + JOIN_TIMEOUT_EXTRA_MS
        return self.request_timeout_ms

    async def _any_broker(self, request: object) -> Any:
        """Ask the known brokers in turn (a different one first each time), then the bootstrap list."""
        known: list[int | tuple[str, int]] = list(self.network.metadata.brokers)
        if known:
            turn = next(self._broker_turn) % len(known)
            known = known[turn:] + known[:turn]
        errors = []
        for broker in known + list(self.network.bootstrap):
            try:
                return await self.network.request(broker, request, timeout_ms=min(self.request_timeout_ms, 5_000))
            except BiplaneError as exc:
                errors.append(str(exc))
        raise GroupError("no broker answered FindCoordinator: " + "; ".join(errors[-3:]),
                         code=ErrorCode.COORDINATOR_NOT_AVAILABLE)

    # ------------------------------------------------------------------ the consumer's side

    def take_work(self) -> Ready | None:
        if not self.work:
            self.changed.clear()
            return None
        return self.work.popleft()

    def revocation_done(self) -> None:
        self.step(RevocationDone(now_ms=_now_ms()))

    async def _coordinator(self, deadline_ms: int) -> tuple[str, int]:
        self.start()
        while True:
            coordinator = self.core.coordinator
            if coordinator is not None:
                return coordinator.host, coordinator.port
            if self.fatal is not None:
                raise self.fatal
            if self.core.state is State.CLOSED:
                raise GroupError(f"group {self.settings.group_id!r}: the consumer has left the group",
                                 code=ErrorCode.UNKNOWN_MEMBER_ID)
            if _now_ms() >= deadline_ms:
                raise GroupError(f"group {self.settings.group_id!r}: its coordinator was not found within "
                                 f"{self.request_timeout_ms} ms (request_timeout_ms); are the brokers up?",
                                 code=ErrorCode.COORDINATOR_NOT_AVAILABLE)
            self.step(WantCoordinator(now_ms=_now_ms()))
            self._found.clear()
            try:
                await asyncio.wait_for(self._found.wait(), max(0.01, min(0.2, (deadline_ms - _now_ms()) / 1000)))
            except asyncio.TimeoutError:
                pass

    async def commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        """Commit `offsets` (the next offset to read, per partition); retries a coordinator that
        moves or loads until request_timeout_ms, raises OffsetCommitError on a refusal.

        The newest commit of a partition wins: before each attempt, partitions that a later
        commit() has asked for since are left out (that commit carries them). Without this a
        retry, say an auto-commit waiting for a new coordinator, could land after a newer
        commit and move the group's offset back."""
        if not offsets:
            return
        seq = next(self._commit_seq)
        for tp in offsets:
            self._commit_latest[tp] = seq
        deadline_ms = _now_ms() + self.request_timeout_ms
        last = ""
        while True:
            address = await self._coordinator(deadline_ms)
            offsets = {tp: o for tp, o in offsets.items() if self._commit_latest.get(tp) == seq}
            if not offsets:
                return   # superseded, partition by partition, by newer commits
            request = self.core.commit_request(offsets)
            try:
                response: OffsetCommitResponse = await self.network.request(address, request, purpose="group")
            except BiplaneError as exc:
                last = str(exc)
                self.step(Failed(request=request, reason=last, now_ms=_now_ms()))
            else:
                self.step(CommitAnswered(request=request, response=response, now_ms=_now_ms()))
                errors = {TopicPartition(t.topic, p.partition): p.error_code for t in response.topics
                          for p in t.partitions if p.error_code != ErrorCode.NONE}
                if not errors:
                    return
                code = next(iter(errors.values()))
                if code not in _RETRIABLE_COMMIT:
                    raise OffsetCommitError(_commit_refusal(self.settings.group_id, errors), code=code)
                last = code.name
            if _now_ms() >= deadline_ms:
                raise OffsetCommitError(f"group {self.settings.group_id!r}: commit of "
                                        f"{_offsets_text(offsets)} not acknowledged within request_timeout_ms="
                                        f"{self.request_timeout_ms}: {last}", code=ErrorCode.REQUEST_TIMED_OUT)
            await asyncio.sleep(self.settings.retry_backoff_ms / 1000)

    async def committed(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int | None]:
        """The group's committed offsets (None: nothing committed), asked of the coordinator."""
        deadline_ms = _now_ms() + self.request_timeout_ms
        topics: dict[str, list[int]] = {}
        for tp in partitions:
            topics.setdefault(tp.topic, []).append(tp.partition)
        request = OffsetFetchRequest(group_id=self.settings.group_id, topics=tuple(
            OffsetFetchTopic(topic=t, partitions=tuple(ps)) for t, ps in topics.items()))
        last = ""
        while True:
            address = await self._coordinator(deadline_ms)
            response: OffsetFetchResponse | None = None
            try:
                response = await self.network.request(address, request, purpose="group")
            except BiplaneError as exc:
                last = str(exc)
                self.step(Failed(request=request, reason=last, now_ms=_now_ms()))
            if response is not None:
                codes = [response.error_code] + [p.error_code for t in response.topics for p in t.partitions]
                bad = [c for c in codes if c != ErrorCode.NONE]
                if not bad:
                    out: dict[TopicPartition, int | None] = {tp: None for tp in partitions}
                    for t in response.topics:
                        for p in t.partitions:
                            tp = TopicPartition(t.topic, p.partition)
                            if tp in out and p.committed_offset >= 0:
                                out[tp] = p.committed_offset
                    return out
                if bad[0] in (ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE):
                    self.step(Failed(request=request, reason=bad[0].name, now_ms=_now_ms()))
                elif bad[0] != ErrorCode.COORDINATOR_LOAD_IN_PROGRESS:
                    raise GroupError(f"group {self.settings.group_id!r}: reading committed offsets failed with "
                                     f"{bad[0].name}", code=bad[0])
                last = bad[0].name
            if _now_ms() >= deadline_ms:
                raise GroupError(f"group {self.settings.group_id!r}: committed offsets not read within "
                                 f"request_timeout_ms={self.request_timeout_ms}: {last}",
                                 code=ErrorCode.REQUEST_TIMED_OUT)
            await asyncio.sleep(self.settings.retry_backoff_ms / 1000)


def _purpose(request: object) -> str:
    if isinstance(request, (JoinGroupRequest, SyncGroupRequest)):
        return "group-join"
    if isinstance(request, HeartbeatRequest):
        return "group-heartbeat"
    return "group"


def _offsets_text(offsets: Mapping[TopicPartition, int]) -> str:
    shown = ", ".join(f"{tp}={o}" for tp, o in sorted(offsets.items())[:4])
    return shown + (f" and {len(offsets) - 4} more" if len(offsets) > 4 else "")


def _commit_refusal(group_id: str, errors: Mapping[TopicPartition, ErrorCode]) -> str:
    code = next(iter(errors.values()))
    where = ", ".join(f"{tp}: {c.name}" for tp, c in sorted(errors.items())[:4])
    if code in (ErrorCode.REBALANCE_IN_PROGRESS, ErrorCode.ILLEGAL_GENERATION, ErrorCode.UNKNOWN_MEMBER_ID):
        why = ("the group is rebalancing or has moved on without this consumer, so its partitions may belong to "
               "another member now; poll() again and commit what the new assignment holds")
    elif code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
        why = "no such topic or partition"
    elif code == ErrorCode.OFFSET_METADATA_TOO_LARGE:
        why = "the commit's metadata is larger than the brokers allow"
    else:
        why = "the coordinator refused it"
    return f"group {group_id!r}: commit refused ({where}): {why}"


__all__ = ["GroupDriver"]
