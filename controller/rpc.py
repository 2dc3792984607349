"""Control RPC for brokers, on the controller's aiohttp app under `/rpc/v1/`.

Authenticated with the cluster secret in the `X-Biplane-Secret` header (a
single controller started without a secret accepts any caller). Only the
trusted leader answers; the others say 421 with `{"leader": {"node_id",
"api_url"}}` (or no leader while an election runs) so brokers retry there.

    POST /rpc/v1/register               RegisterBrokerRequest -> RegisterBrokerAnswer
    POST /rpc/v1/heartbeat              HeartbeatRequest -> HeartbeatAnswer
    POST /rpc/v1/alter-isr              AlterIsrRequest -> AlterIsrAnswer
    POST /rpc/v1/election-report        ElectionReport -> ElectionReportAnswer
    POST /rpc/v1/allocate-producer-ids  AllocateProducerIdsRequest -> ProducerIdsAnswer
    GET  /rpc/v1/metadata?after_offset=N&max_wait_ms=M -> MetadataAnswer
    POST /rpc/v1/admin/create-topic     CreateTopicRequest -> AdminAnswer
    POST /rpc/v1/admin/delete-topic     DeleteTopicRequest -> AdminAnswer
    POST /rpc/v1/admin/alter-config     TopicConfigChange -> AdminAnswer
    POST /rpc/v1/admin/add-partitions   TopicPartitionsChange -> AdminAnswer

The admin calls are the admin API's writes for brokers forwarding a Kafka client's
admin request (dataplane/kafka/admin.py): the same core events, behind the cluster
secret instead of the admin token. With `?validate_only=1` the event is decided and
nothing is staged (Kafka's validate_only): the answer is the refusal, or no offset.

The models are in `common/requests.py`, shared with the broker's `ControlClient`.
Each handler parses, steps the leader's core (`ControllerService.execute`,
`controller/core.py`) and answers; the rules are all in the core.
"""
from __future__ import annotations

import hmac
import logging
from typing import Awaitable, Callable

from aiohttp import web

from common.errors import BiplaneError, ErrorCode, NotControllerError
from common.metadata import ProducerIdBlock
from common.requests import (
    AdminAnswer,
    AllocateProducerIdsRequest,
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
    MetadataEntry,
    ProducerIdsAnswer,
    RegisterBrokerAnswer,
    RegisterBrokerRequest,
)
from controller import core
from controller.http_edge import EarlyResponse, answer, error_from_exception, error_response, read_model
from controller.service import ControllerService
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

    def guarded(handler: Callable[[web.Request], Awaitable[web.Response]],
                refused: Callable[[web.Request], Awaitable[None]] | None = None,
                ) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def wrapper(request: web.Request) -> web.Response:
            if secret is not None:
                given = request.headers.get(SECRET_HEADER, "").encode()
                if not hmac.compare_digest(given, secret):
                    return error_response(401, "UNAUTHORIZED",
                                          f"missing or bad cluster secret in {SECRET_HEADER}")
            if not service.is_leader:
                if refused is not None:
                    try:
                        await refused(request)
                    except (EarlyResponse, web.HTTPException, ConnectionError):
                        pass   # an unreadable body is not heard; the answer is still 421
                return not_leader(service)
            try:
                return await handler(request)
            except EarlyResponse as reply:
                return reply.response
            except web.HTTPException:
                raise   # aiohttp's own answer (a body over the size limit): JSON by the app's json_errors
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
        _, committed = await service.execute(core.RegisterBroker(request=body, now_ms=service.clock_ms()))
        assert committed is not None, "a registration waits for its commit"
        return answer(RegisterBrokerAnswer(
            broker_id=body.broker_id,
            metadata_offset=committed.last_offset if committed.last_offset is not None else service.committed.offset,
            session_timeout_ms=service.session_timeout_ms))

    async def heartbeat(request: web.Request) -> web.Response:
        body = await read_model(request, HeartbeatRequest)
        await service.execute(core.Heartbeat(request=body, now_ms=service.clock_ms()))
        usage_taken = body.liveness_only or service.note_heartbeat(
            body.broker_id, body.metadata_offset, body.usage, body.replicas_opening, body.incarnation_id)
        return answer(HeartbeatAnswer(broker_id=body.broker_id,
                                      fenced=service.require_leader().brokers[body.broker_id].fenced,
                                      metadata_offset=service.committed.offset,
                                      session_timeout_ms=service.session_timeout_ms, usage_resend=not usage_taken))

    async def heartbeat_refused(request: web.Request) -> None:
        # A follower keeps who it heard for its next leadership (sessions.Hearing).
        body = await read_model(request, HeartbeatRequest)
        service.note_heartbeat_refused(body.broker_id, body.incarnation_id)

    async def alter_isr(request: web.Request) -> web.Response:
        body = await read_model(request, AlterIsrRequest)
        _, committed = await service.execute(core.AlterIsr(request=body, now_ms=service.clock_ms()))
        assert committed is not None, "an ISR change waits for its commit"
        p = (service.pending or service.committed).partition(body.topic, body.partition)
        return answer(AlterIsrAnswer(partition=partition_view(p), metadata_offset=committed.last_offset))

    async def election_report(request: web.Request) -> web.Response:
        body = await read_model(request, ElectionReport)
        step, committed = await service.execute(core.ReportElection(report=body, now_ms=service.clock_ms()))
        if step.refused is not None or committed is None:
            return answer(ElectionReportAnswer(accepted=False, reason=step.refused, elected=False,
                                               metadata_offset=service.committed.offset))
        return answer(ElectionReportAnswer(accepted=True, elected=bool(committed.records),
                                           metadata_offset=committed.last_offset))

    async def allocate_producer_ids(request: web.Request) -> web.Response:
        body = await read_model(request, AllocateProducerIdsRequest)
        _, committed = await service.execute(core.AllocateProducerIds(request=body))
        assert committed is not None, "an allocation waits for its commit"
        block = committed.records[0]
        assert isinstance(block, ProducerIdBlock), block
        return answer(ProducerIdsAnswer(broker_id=block.broker_id, first_id=block.first_id,
                                        size=block.size, metadata_offset=committed.last_offset))

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
            return answer(MetadataAnswer(offset=result.offset, image=result.image))
        return answer(MetadataAnswer(offset=result.offset,
                                     records=[MetadataEntry(offset=o, record=r) for o, r in result.records or []]))

    async def admin_write(event: core.Event, request: web.Request) -> web.Response:
        if request.query.get("validate_only") == "1":
            service.check(event)   # raises what the write would: nothing is staged
            return answer(AdminAnswer(metadata_offset=None))
        _, committed = await service.execute(event)
        assert committed is not None, "an admin write waits for its commit"
        return answer(AdminAnswer(metadata_offset=committed.last_offset))

    async def create_topic(request: web.Request) -> web.Response:
        body = await read_model(request, CreateTopicRequest)
        return await admin_write(core.CreateTopic(request=body, now_ms=service.clock_ms()), request)

    async def delete_topic(request: web.Request) -> web.Response:
        body = await read_model(request, DeleteTopicRequest)
        return await admin_write(core.DeleteTopic(name=body.name), request)

    async def alter_config(request: web.Request) -> web.Response:
        body = await read_model(request, TopicConfigChange)
        return await admin_write(core.AlterConfig(name=body.name, request=body.change), request)

    async def add_partitions(request: web.Request) -> web.Response:
        body = await read_model(request, TopicPartitionsChange)
        return await admin_write(core.AddPartitions(name=body.name, request=body.change), request)

    for path, handler in (("register", register), ("heartbeat", heartbeat), ("alter-isr", alter_isr),
                          ("election-report", election_report),
                          ("allocate-producer-ids", allocate_producer_ids),
                          ("admin/create-topic", create_topic), ("admin/delete-topic", delete_topic),
                          ("admin/alter-config", alter_config), ("admin/add-partitions", add_partitions)):
        app.router.add_post(f"/rpc/v1/{path}", guarded(handler, heartbeat_refused if handler is heartbeat else None))
    app.router.add_get("/rpc/v1/metadata", guarded(metadata))
