"""A broker's asyncio client for the controller's control RPC (`/rpc/v1/...`).

    async with ControlClient(["http://c1:8080", "http://c2:8080"], secret=s) as cc:
        await cc.register(RegisterBrokerRequest(...))
        beat = await cc.heartbeat(HeartbeatRequest(...))      # a HeartbeatAnswer: beat.fenced
        batch = await cc.fetch_metadata(after_offset=41, wait_ms_max=500)

Every answer is parsed into its model from `common/requests.py`, the same one the
controller answers with (`controller/rpc.py`); an answer that does not fit is a
`BiplaneError` naming the call, never a KeyError later.

Any controller may be asked: a follower answers 421 with the leader's URL and
the client retries there (or the next URL while an election runs), up to
`attempts_max` times. Each attempt has its own bound, so a controller that
accepts the connection but does not answer (stopped, cut off, starved) costs
one bound and the next URL is tried: `heartbeat_timeout_ms` for heartbeats,
which must reach the controller leader within its session timeout or the
broker is fenced, and for ISR changes and election reports, which acks=all
waits on; the long-poll's own wait plus `long_poll_slack_ms` for
metadata; `request_timeout_ms` for the rest. An error the controller reports is raised as a
`BiplaneError` with the controller's code (e.g. STALE_BROKER_EPOCH: register
again; INVALID_UPDATE_VERSION: the ISR change was decided on a stale epoch).
"""
from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, TypeVar

import aiohttp
from pydantic import BaseModel, ValidationError

from common.errors import BiplaneError, ControllerError, ErrorCode
from common.requests import (
    AddPartitionsRequest,
    AdminAnswer,
    AllocateProducerIdsRequest,
    AlterConfigRequest,
    CreateTopicRequest,
    DeleteTopicRequest,
    TopicConfigChange,
    TopicPartitionsChange,
    AlterIsrAnswer,
    AlterIsrRequest,
    ElectionReport,
    ElectionReportAnswer,
    HeartbeatAnswer,
    HeartbeatRequest,
    MetadataAnswer,
    ProducerIdsAnswer,
    RegisterBrokerAnswer,
    RegisterBrokerRequest,
)

AnswerT = TypeVar("AnswerT", bound=BaseModel)

SECRET_HEADER = "X-Biplane-Secret"


@dataclasses.dataclass(frozen=True, kw_only=True)
class MetadataBatch:
    """Committed records after the asked offset, or (when too far behind) the whole image."""

    offset: int                                  # committed offset of the controller's answer
    records: tuple[tuple[int, dict], ...] = ()   # (offset, record dict) in order
    image: dict | None = None                    # MetadataImage.to_dict() when set


class ControlClient:
    def __init__(self, urls: list[str], *, secret: str | None, request_timeout_ms: int = 10_000,
                 heartbeat_timeout_ms: int = 1_000, long_poll_slack_ms: int = 2_000,
                 attempts_max: int = 20, retry_backoff_ms: int = 100) -> None:
        if not urls:
            raise ValueError("ControlClient needs at least one controller URL")
        for name, value in (("request_timeout_ms", request_timeout_ms), ("heartbeat_timeout_ms", heartbeat_timeout_ms),
                            ("long_poll_slack_ms", long_poll_slack_ms)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive integer (ms)")
        self.heartbeat_timeout_ms = heartbeat_timeout_ms
        self.long_poll_slack_ms = long_poll_slack_ms
        self.urls = [u.rstrip("/") for u in urls]
        self.secret = secret
        self.request_timeout_ms = request_timeout_ms
        self.attempts_max = attempts_max
        self.retry_backoff_ms = retry_backoff_ms
        self.leader_url: str | None = None
        self._rotation = 0   # index in urls of the next controller to ask when no leader is known
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> "ControlClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def close(self) -> None:
        """Idempotent."""
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    # ---- calls

    async def register(self, request: RegisterBrokerRequest) -> RegisterBrokerAnswer:
        return _parse(RegisterBrokerAnswer, "register", await self._call("POST", "register", request))

    async def heartbeat(self, request: HeartbeatRequest) -> HeartbeatAnswer:
        # Bounded well below the session timeout: one heartbeat stuck on a stopped or cut-off
        # controller leader for request_timeout_ms got every broker fenced by the next leader.
        return _parse(HeartbeatAnswer, "heartbeat", await self._call("POST", "heartbeat", request,
                                                                     attempt_timeout_ms=self.heartbeat_timeout_ms))

    async def heartbeat_follower(self, url: str, request: HeartbeatRequest) -> bool:
        """One heartbeat to the controller at `url`, once, bounded like a heartbeat, whatever it
        answers: a follower keeps who it heard for when it leads (controller/decisions/sessions.py,
        `Hearing`). True when it answered at all; never raises for a controller down or cut off."""
        session = self._open_session()
        try:
            async with session.post(f"{url}/rpc/v1/heartbeat", json=_payload(request), headers=self._headers(),
                                    timeout=aiohttp.ClientTimeout(total=self.heartbeat_timeout_ms / 1000)) as resp:
                await resp.read()
                return True
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            return False

    # An ISR change and an election report are bounded like a heartbeat: acks=all waits on them
    # (a follower that stopped stays in the ISR until the shrink is written; a quorum partition
    # has no leader until the election is), and one sent to a cut-off controller leader waited
    # request_timeout_ms or the cut's end while the next leader could have written it.

    async def alter_isr(self, request: AlterIsrRequest) -> AlterIsrAnswer:
        """The partition as the controller now has it; raises when the change is refused."""
        return _parse(AlterIsrAnswer, "alter-isr", await self._call("POST", "alter-isr", request,
                                                                    attempt_timeout_ms=self.heartbeat_timeout_ms))

    async def election_report(self, report: ElectionReport) -> ElectionReportAnswer:
        return _parse(ElectionReportAnswer, "election-report", await self._call(
            "POST", "election-report", report, attempt_timeout_ms=self.heartbeat_timeout_ms))

    async def allocate_producer_ids(self, request: AllocateProducerIdsRequest) -> ProducerIdsAnswer:
        """A block of producer ids now owned by the broker: `first_id` .. `first_id + size`."""
        return _parse(ProducerIdsAnswer, "allocate-producer-ids",
                      await self._call("POST", "allocate-producer-ids", request))

    # ---- admin writes a broker forwards for a Kafka client (dataplane/kafka/admin.py)

    async def create_topic(self, request: CreateTopicRequest, *, validate_only: bool = False) -> AdminAnswer:
        return await self._admin("create-topic", request, validate_only)

    async def delete_topic(self, name: str, *, validate_only: bool = False) -> AdminAnswer:
        return await self._admin("delete-topic", DeleteTopicRequest(name=name), validate_only)

    async def alter_config(self, name: str, change: AlterConfigRequest, *,
                           validate_only: bool = False) -> AdminAnswer:
        return await self._admin("alter-config", TopicConfigChange(name=name, change=change), validate_only)

    async def add_partitions(self, name: str, change: AddPartitionsRequest, *,
                             validate_only: bool = False) -> AdminAnswer:
        return await self._admin("add-partitions", TopicPartitionsChange(name=name, change=change), validate_only)

    async def _admin(self, call: str, body: BaseModel, validate_only: bool) -> AdminAnswer:
        """validate_only: the controller decides and refuses as for the write, and stages nothing."""
        path = f"admin/{call}" + ("?validate_only=1" if validate_only else "")
        return _parse(AdminAnswer, call, await self._call("POST", path, body))

    async def fetch_metadata(self, *, after_offset: int, wait_ms_max: int) -> MetadataBatch:
        # The query parameter keeps its wire name, max_wait_ms.
        # The controller answers by the end of the wait; past that, little slack: a long-poll
        # stuck on a stopped controller kept the broker from learning new leaders meanwhile.
        doc = await self._call("GET", f"metadata?after_offset={after_offset}&max_wait_ms={wait_ms_max}", None,
                               attempt_timeout_ms=wait_ms_max + self.long_poll_slack_ms)
        answer = _parse(MetadataAnswer, "metadata", doc)
        if answer.image is not None:
            return MetadataBatch(offset=answer.offset, image=answer.image)
        return MetadataBatch(offset=answer.offset,
                             records=tuple((r.offset, r.record) for r in answer.records or ()))

    # ---- transport

    async def _call(self, method: str, path: str, body: BaseModel | None, *,
                    attempt_timeout_ms: int | None = None) -> dict:
        session = self._open_session()
        headers = self._headers()
        payload = _payload(body) if body is not None else None
        timeout = aiohttp.ClientTimeout(total=(attempt_timeout_ms or self.request_timeout_ms) / 1000)
        last_error = "no attempt made"
        failed: set[str] = set()   # URLs that did not answer in this call
        for _ in range(self.attempts_max):
            url = self.leader_url or self._next_url()
            try:
                async with session.request(method, f"{url}/rpc/v1/{path}", json=payload, headers=headers,
                                                 timeout=timeout) as resp:
                    doc = await resp.json(content_type=None)
                    if resp.status == 200:
                        self.leader_url = url
                        return doc
                    error = (doc or {}).get("error", {}) if isinstance(doc, dict) else {}
                    if resp.status == 421:
                        leader = (doc or {}).get("leader") or {}
                        hint = leader.get("api_url")
                        hint = hint.rstrip("/") if isinstance(hint, str) else None
                        # A follower names the leader it last heard of: one that just stopped
                        # answering us, until the followers elect another. Asking it again would
                        # cost another attempt's bound; ask the next controller instead.
                        self.leader_url = hint if hint not in failed else None
                        self._skip(url)
                        last_error = error.get("message", "not the leader")
                        if self.leader_url is None:
                            await asyncio.sleep(self.retry_backoff_ms / 1000)
                        continue
                    raise _error_of(error, resp.status)
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
                last_error = f"{url}: {type(exc).__name__}: {exc}"
                failed.add(url)
                self.leader_url = None
                self._skip(url)
                await asyncio.sleep(self.retry_backoff_ms / 1000)
        raise BiplaneError(f"no controller leader answered after {self.attempts_max} attempts "
                           f"({last_error})", code=ErrorCode.NOT_CONTROLLER)

    def _open_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        return self._session

    def _headers(self) -> dict[str, str]:
        return {SECRET_HEADER: self.secret} if self.secret else {}

    def _next_url(self) -> str:
        return self.urls[self._rotation % len(self.urls)]

    def _skip(self, url: str) -> None:
        """The next URL to try without a leader is the one after `url`, across calls too: a
        stopped controller is tried once per round, not at every attempt whose number
        happens to point at it."""
        self._rotation = self.urls.index(url) + 1 if url in self.urls else self._rotation + 1


def _payload(body: BaseModel) -> dict:
    # Only the fields the caller set, as the controller answers: a forwarded admin request
    # must mean what its client sent, and the controller's rules tell an omitted field from
    # one given (a Kafka CreateTopics with a replica assignment gives no partition count).
    return body.model_dump(mode="json", exclude_unset=True)


def _error_of(error: dict[str, Any], status: int) -> ControllerError:
    name = error.get("code", "UNKNOWN")
    code = ErrorCode.__members__.get(name, ErrorCode.UNKNOWN)
    return ControllerError(error.get("message", f"controller answered HTTP {status}"), code=code,
                           field=error.get("field"), code_name=name)


def _parse(model: type[AnswerT], call: str, doc: Any) -> AnswerT:
    try:
        return model.model_validate(doc)
    except ValidationError as exc:
        # A controller of another version, or a proxy in between: say which call and field.
        fields = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'answer'}: {e['msg']}" for e in exc.errors()[:5])
        raise BiplaneError(f"the controller's answer to {call} is not a {model.__name__} ({fields}); "
                           "is the controller of another version?", code=ErrorCode.UNKNOWN) from exc
