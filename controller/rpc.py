"""Control RPC for brokers, on the controller's aiohttp app under `/rpc/v1/`.

Authenticated with the cluster secret in the `X-Biplane-Secret` header (a
single controller started without a secret accepts any caller). Only the
trusted leader answers; the others say 421 with `{"leader": {"node_id",
"api_url"}}` (or no leader while an election runs) so brokers retry there.

    POST /rpc/v1/register               RegisterBrokerRequest -> {"metadata_offset"}
    POST /rpc/v1/heartbeat              HeartbeatRequest -> {"fenced", "metadata_offset", ...}
    POST /rpc/v1/alter-isr              AlterIsrRequest -> {"partition": {...}}
    POST /rpc/v1/election-report        ElectionReport -> {"accepted", "metadata_offset"}
    POST /rpc/v1/allocate-producer-ids  AllocateProducerIdsRequest -> {"first_id", "size"}
    GET  /rpc/v1/metadata?after_offset=N&max_wait_ms=M
         -> {"offset", "records": [{"offset", "record"}]}  or  {"offset", "image"}
"""
from __future__ import annotations

import hmac
import logging
from typing import Awaitable, Callable

from aiohttp import web

from common.errors import BiplaneError, ErrorCode
from common.metadata import ProducerIdBlock
from common.requests import (
    AllocateProducerIdsRequest,
    AlterIsrRequest,
    ElectionReport,
    HeartbeatRequest,
    RegisterBrokerRequest,
)
from controller import decisions as d
from controller.api import EarlyResponse, error_from_exception, error_response, read_model
from controller.service import ControllerService, NotControllerError
from controller.views import partition_view

log = logging.getLogger("biplane.controller.rpc")

SECRET_HEADER = "X-Biplane-Secret"
FETCH_WAIT_MS_MAX = 30_000


def not_leader(service: ControllerService) -> web.Response:
    leader = service.leader_node()
    other = leader if leader is not None and leader.node_id != service.node_id and leader.api_url else None
    return error_response(421, ErrorCode.NOT_CONTROLLER,
                          f"controller {service.node_id} is not the leader; "
                          + (f"retry at controller {other.node_id} ({other.api_url})" if other
                             else "no leader is known yet; retry shortly"),
                          extra={"leader": {"node_id": other.node_id, "api_url": other.api_url} if other else None})


def add_rpc_routes(app: web.Application, service: ControllerService, *, cluster_secret: str | None) -> None:
    secret = cluster_secret.encode() if cluster_secret else None

    def guarded(handler: Callable[[web.Request], Awaitable[web.Response]]
                ) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def wrapper(request: web.Request) -> web.Response:
            if secret is not None:
                given = request.headers.get(SECRET_HEADER, "").encode()
                if not hmac.compare_digest(given, secret):
                    return error_response(401, ErrorCode.UNAUTHORIZED,
                                          f"missing or bad cluster secret in {SECRET_HEADER}")
            if not service.is_leader:
                return not_leader(service)
            try:
                return await handler(request)
            except EarlyResponse as reply:
                return reply.response
            except NotControllerError:
                return not_leader(service)
            except BiplaneError as exc:
                return error_from_exception(exc)
            except Exception as exc:
                log.exception("rpc %s failed", request.path)
                return error_response(500, ErrorCode.UNKNOWN, f"internal error: {type(exc).__name__}: {exc}")
        return wrapper

    async def register(request: web.Request) -> web.Response:
        body = await read_model(request, RegisterBrokerRequest)
        now_ms = service.clock_ms()
        committed = await service.decide(lambda image: d.register_broker(image, body, now_ms))
        if service.state is not None:
            service.state.sessions.heartbeat(body.broker_id, body.incarnation_id, now_ms, -1)
        return web.json_response({"broker_id": body.broker_id,
                                  "metadata_offset": committed.last_offset
                                  if committed.last_offset is not None else service.committed.offset,
                                  "session_timeout_ms": service.session_timeout_ms})

    async def heartbeat(request: web.Request) -> web.Response:
        body = await read_model(request, HeartbeatRequest)
        image, state = service.require_leader_state()
        d.check_heartbeat(image, body)
        now_ms = service.clock_ms()
        state.sessions.heartbeat(body.broker_id, body.incarnation_id, now_ms, body.metadata_offset,
                                 want_shutdown=body.want_shutdown)
        service.broker_offsets[body.broker_id] = body.metadata_offset
        if body.usage is not None:
            service.usage[body.broker_id] = body.usage
        if body.want_shutdown and not image.brokers[body.broker_id].fenced:
            # Now, not at the next periodic pass: the broker waits on this answer to stop.
            sessions = state.sessions
            await service.decide(lambda image: d.fence_shutting_down(image, sessions, now_ms))
            image = service.require_leader()
        info = image.brokers[body.broker_id]
        return web.json_response({"broker_id": body.broker_id, "fenced": info.fenced,
                                  "metadata_offset": service.committed.offset,
                                  "session_timeout_ms": service.session_timeout_ms})

    async def alter_isr(request: web.Request) -> web.Response:
        body = await read_model(request, AlterIsrRequest)
        committed = await service.decide(lambda image: d.alter_isr(image, body))
        p = (service.pending or service.committed).partition(body.topic, body.partition)
        return web.json_response({"partition": partition_view(p).model_dump(mode="json"),
                                  "metadata_offset": committed.last_offset})

    async def election_report(request: web.Request) -> web.Response:
        body = await read_model(request, ElectionReport)
        image, state = service.require_leader_state()
        why = state.tracker.add(image, body)
        if why is not None:
            return web.json_response({"accepted": False, "reason": why, "elected": False,
                                      "metadata_offset": service.committed.offset})
        tracker = state.tracker
        committed = await service.decide(lambda image: d.elect_leaders(image, tracker))
        return web.json_response({"accepted": True, "elected": bool(committed.records),
                                  "metadata_offset": committed.last_offset})

    async def allocate_producer_ids(request: web.Request) -> web.Response:
        body = await read_model(request, AllocateProducerIdsRequest)
        committed = await service.decide(lambda image: d.allocate_producer_ids(image, body))
        block = committed.records[0]
        assert isinstance(block, ProducerIdBlock), block
        return web.json_response({"broker_id": block.broker_id, "first_id": block.first_id,
                                  "size": block.size, "metadata_offset": committed.last_offset})

    async def metadata(request: web.Request) -> web.Response:
        try:
            after = int(request.query.get("after_offset", "-1"))
            wait_ms = int(request.query.get("max_wait_ms", "0"))
        except ValueError:
            return error_response(400, ErrorCode.INVALID_REQUEST,
                                  "after_offset and max_wait_ms must be integers", field="after_offset")
        if after < -1 or not 0 <= wait_ms <= FETCH_WAIT_MS_MAX:
            return error_response(400, ErrorCode.INVALID_REQUEST,
                                  f"need after_offset >= -1 and 0 <= max_wait_ms <= {FETCH_WAIT_MS_MAX}; "
                                  f"got {after} and {wait_ms}", field="max_wait_ms" if after >= -1 else "after_offset")
        result = await service.fetch_metadata(after_offset=after, wait_ms=wait_ms)
        if result.image is not None:
            return web.json_response({"offset": result.offset, "image": result.image})
        return web.json_response({"offset": result.offset,
                                  "records": [{"offset": o, "record": r} for o, r in result.records or []]})

    for path, handler in (("register", register), ("heartbeat", heartbeat), ("alter-isr", alter_isr),
                          ("election-report", election_report),
                          ("allocate-producer-ids", allocate_producer_ids)):
        app.router.add_post(f"/rpc/v1/{path}", guarded(handler))
    app.router.add_get("/rpc/v1/metadata", guarded(metadata))
