"""The controller's HTTP admin API (`/v1`, JSON, bearer token) and the app that also serves the broker RPC.

Reads are answered from this node's committed image (every response carries
the `metadata_offset` it reflects); writes need the leader: a follower answers
307 to the same path on the leader's API URL, or 503 when no leader is known.
Errors are `{"error": {"code", "message", "field"?, "retriable"}}`, for every error
status (aiohttp's own 404/405/413 included). Guardrails (README, "Admin API limits"):
request bodies are bounded in size and nesting, writes in rate per token (429 with
Retry-After), and topics in partitions (the decisions' `PartitionLimits`).

Every route is an `Operation` (controller/openapi.py): the app mounts the declared
operations and /v1/openapi.json describes exactly them.

Hook for other parts of the controller: `app["controller"]` is the
`ControllerService` (committed image: `.committed`; latest usage per broker:
`.usage`; leader check: `.is_leader`), and `app["on_ready"]` is a list of
callables `(app) -> None` run at startup after the service started. An operation
with `writes` or `leader_only` is answered by the leader only (a follower redirects).
"""
from __future__ import annotations

import hmac
import logging
import time
from typing import Any, Awaitable, Callable, TypeVar

from aiohttp import web
from pydantic import BaseModel

from common import api_models
from common.errors import (
    BiplaneError,
    ErrorCode,
    InvalidFieldError,
    NotControllerError,
    UnknownBrokerError,
    UnknownTopicOrPartitionError,
)
from common.metadata import MetadataImage, PartitionChange, PartitionRecord, validate_topic_name
from common.metadata.config import refuse_creating_internal
from common.metrics import metrics_response
from common.requests import (
    AddPartitionsRequest,
    CancelReassignmentsRequest,
    ClusterConfigRequest,
    MaintenanceRequest,
    ReassignmentPlanRequest,
    CreateTopicRequest,
    PreferredElectionRequest,
    ReassignmentRequest,
    TopicConfigPatch,
)
from controller import core, health, openapi, rpc, snapshot_service, views
from controller.guardrails import ApiLimits, WriteBuckets, retry_after_header
from controller.http_edge import EarlyResponse, error_from_exception, error_response, json_errors, read_model
from controller.metrics import ControllerMetrics
from controller.openapi import PUBLIC_PATHS, Handler, Operation
from controller.service import ControllerService

log = logging.getLogger("biplane.controller.api")

ModelT = TypeVar("ModelT", bound=BaseModel)

API_LIMITS = web.AppKey("api_limits", ApiLimits)
WRITE_BUCKETS = web.AppKey("write_buckets", WriteBuckets)
WRITE_COST = web.RequestKey("write_cost", int)   # set by a write handler: what it cost its token


# ---------------------------------------------------------------- routes

ROUTES: list[Operation] = []


def route(method: str, path: str, *, summary: str, request: type[BaseModel] | None = None,
          response: type[BaseModel] | None = None, status: int = 200, **flags: Any):
    """Declare a handler as an operation (`flags`: Operation's writes, names_topic, text, ...)."""
    def wrap(fn: Handler) -> Handler:
        ROUTES.append(Operation(method=method, path=path, summary=summary, handler=fn, request=request,
                                response=response, status=status, **flags))
        return fn
    return wrap


async def read_body(request: web.Request, model: type[ModelT]) -> ModelT:
    limits = request.app[API_LIMITS]
    return await read_model(request, model, body_bytes_max=limits.body_bytes_max,
                            json_depth_max=limits.json_depth_max, limit_flag="--admin-max-body-bytes",
                            depth_flag="--admin-max-json-depth")


def charge(request: web.Request, partitions: int) -> None:
    """What this write costs the token's bucket: the partitions it created or deleted."""
    request[WRITE_COST] = max(1, partitions)


def svc(request: web.Request) -> ControllerService:
    return request.app["controller"]


def json_model(model: BaseModel, status: int = 200) -> web.Response:
    return web.json_response(model.model_dump(mode="json"), status=status)


def topic_name(request: web.Request) -> str:
    return validate_topic_name(request.match_info["name"])


def _image(request: web.Request) -> MetadataImage:
    return svc(request).committed


@route("GET", "/v1/health", summary="liveness; no token needed", response=api_models.Health)
async def get_health(request: web.Request) -> web.Response:
    s = svc(request)
    return json_model(api_models.Health(status="ok", node_id=s.node_id,
                                        role="leader" if s.is_leader else "follower",
                                        metadata_offset=s.committed.offset))


@route("GET", "/v1/cluster", summary="controllers, leader, priorities, metadata offset",
       response=api_models.Cluster)
async def get_cluster(request: web.Request) -> web.Response:
    return json_model(api_models.Cluster.model_validate(svc(request).cluster_view()))


@route("GET", "/v1/cluster/health",
       summary="leaderless, under-min-ISR and under-replicated partitions, fenced brokers and controller "
               "quorum problems, judged by the leader (a follower redirects to it; with no leader known "
               "it answers itself, saying so)",
       response=api_models.ClusterHealth, errors=(307,))
async def get_cluster_health(request: web.Request) -> web.Response:
    s = svc(request)
    view = s.cluster_view()
    leader = s.leader_node()
    if not s.is_leader and leader is not None and leader.node_id != s.node_id and leader.api_url:
        # The leader's image and its connections are the ones that count.
        return not_leader_response(s, request.path_qs)
    quorum = health.QuorumView(node_id=s.node_id, leader_id=view["leader_id"],
                               controllers=tuple((c["node_id"], c["connected"]) for c in view["controllers"]))
    return json_model(health.cluster_health(s.committed, quorum))


@route("GET", "/v1/brokers", summary="registered brokers, fencing and last heartbeat",
       response=api_models.BrokerList)
async def get_brokers(request: web.Request) -> web.Response:
    s = svc(request)
    return json_model(views.broker_list(s.committed, s.broker_offsets, s.usage, s.broker_opening))


def broker_id_of(request: web.Request) -> int:
    text = request.match_info["broker_id"]
    if not (text.isascii() and text.isdigit()) or len(text) > 9:
        raise InvalidFieldError(f"broker id {text!r} in the path is not a broker id (a number like 2)",
                                field="broker_id", value=text)
    return int(text)


def _broker_operations(s: ControllerService, broker_id: int, image: MetadataImage) -> web.Response:
    if broker_id not in image.brokers:
        raise UnknownBrokerError(broker_id)
    return json_model(views.broker_operations(image, broker_id, s.broker_offsets.get(broker_id)))


@route("GET", "/v1/brokers/{broker_id}/operations",
       summary="a broker's maintenance and decommission state and what is left of them; answered by the "
               "leader, which hears the broker's applied metadata offset (a follower redirects)",
       response=api_models.BrokerOperations, leader_only=True)
async def get_broker_operations(request: web.Request) -> web.Response:
    s = svc(request)
    return _broker_operations(s, broker_id_of(request), s.committed)


async def _broker_write(request: web.Request, event: core.Event, broker_id: int) -> web.Response:
    s = svc(request)
    _, committed = await s.execute(event)
    assert committed is not None, "a write waits for its commit"
    return _broker_operations(s, broker_id, s.pending or s.committed)


@route("POST", "/v1/brokers/{broker_id}/maintenance",
       summary="turn maintenance mode on (drain the broker's leaderships to other in-sync replicas; it stays "
               "in every ISR) or off; idempotent",
       request=MaintenanceRequest, response=api_models.BrokerOperations, writes=True)
async def post_maintenance(request: web.Request) -> web.Response:
    broker_id = broker_id_of(request)
    body = await read_body(request, MaintenanceRequest)
    return await _broker_write(request, core.SetMaintenance(broker_id=broker_id, enabled=body.enabled), broker_id)


@route("POST", "/v1/brokers/{broker_id}/decommission",
       summary="move every replica off the broker (each to the least loaded live broker not already a "
               "replica), then fence it for good; refused when the others cannot hold the replication "
               "factor; idempotent",
       response=api_models.BrokerOperations, writes=True)
async def post_decommission(request: web.Request) -> web.Response:
    broker_id = broker_id_of(request)
    s = svc(request)
    return await _broker_write(request, core.Decommission(broker_id=broker_id, now_ms=s.clock_ms()), broker_id)


@route("POST", "/v1/brokers/{broker_id}/recommission",
       summary="cancel a decommission: moves still running go back to their original replicas, and the "
               "broker is unfenced on its next heartbeat; idempotent",
       response=api_models.BrokerOperations, writes=True)
async def post_recommission(request: web.Request) -> web.Response:
    broker_id = broker_id_of(request)
    return await _broker_write(request, core.Recommission(broker_id=broker_id), broker_id)


@route("GET", "/v1/topics", summary="list topics", response=api_models.TopicList)
async def get_topics(request: web.Request) -> web.Response:
    return json_model(views.topic_list(_image(request)))


@route("POST", "/v1/topics", summary="create a topic", request=CreateTopicRequest,
       response=api_models.TopicDetail, writes=True, status=201)
async def post_topic(request: web.Request) -> web.Response:
    body = await read_body(request, CreateTopicRequest)
    refuse_creating_internal(body.name)
    s = svc(request)
    return await _topic_write(request, body.name, core.CreateTopic(request=body, now_ms=s.clock_ms()),
                              status=201)


async def _topic_write(request: web.Request, name: str, command: core.Event, *, status: int = 200) -> web.Response:
    """Commit a write to one topic and answer the topic as it stands after it."""
    s = svc(request)
    _, committed = await s.execute(command)
    assert committed is not None, "a write waits for its commit"
    charge(request, sum(isinstance(r, PartitionRecord) for r in committed.records))
    return json_model(views.topic_detail(s.pending or s.committed, name, metadata_offset=committed.last_offset),
                      status=status)


@route("GET", "/v1/topics/{name}", summary="describe a topic", response=api_models.TopicDetail)
async def get_topic(request: web.Request) -> web.Response:
    name = topic_name(request)
    image = _image(request)
    if name not in image.topics:
        raise UnknownTopicOrPartitionError(name)
    return json_model(views.topic_detail(image, name, metadata_offset=image.offset))


@route("DELETE", "/v1/topics/{name}", summary="delete a topic", response=api_models.Done, writes=True)
async def delete_topic(request: web.Request) -> web.Response:
    name = topic_name(request)
    s = svc(request)
    topic = (s.pending or s.committed).topics.get(name)
    charge(request, topic.config.partitions if topic is not None else 1)
    _, committed = await s.execute(core.DeleteTopic(name=name))
    assert committed is not None, "a write waits for its commit"
    return json_model(api_models.Done(result=f"topic {name} deleted", metadata_offset=committed.last_offset))


@route("PATCH", "/v1/topics/{name}/config",
       summary="set or reset topic config keys: at least one key in `set` or `reset`",
       request=TopicConfigPatch, response=api_models.TopicDetail, writes=True)
async def patch_config(request: web.Request) -> web.Response:
    name = topic_name(request)
    body = await read_body(request, TopicConfigPatch)
    return await _topic_write(request, name, core.AlterConfig(name=name, request=body))


@route("GET", "/v1/topics/{name}/partitions", summary="partition state of a topic",
       response=api_models.PartitionList)
async def get_partitions(request: web.Request) -> web.Response:
    name = topic_name(request)
    image = _image(request)
    return json_model(api_models.PartitionList(topic=name, metadata_offset=image.offset,
                                               partitions=[views.partition_view(p)
                                                           for p in image.topic_partitions(name)]))


@route("GET", "/v1/topics/{name}/offsets",
       summary="log start offset, high watermark, log end offset and size per partition, as each leader "
               "last reported them (about once a second); answered by the controller leader, which "
               "receives the reports (a follower redirects)",
       response=api_models.TopicOffsets, leader_only=True)
async def get_offsets(request: web.Request) -> web.Response:
    name = topic_name(request)
    s = svc(request)
    image = s.committed
    if name not in image.topics:
        raise UnknownTopicOrPartitionError(name)
    return json_model(views.topic_offsets(image, name, s.usage, now_ms=s.clock_ms()))


@route("POST", "/v1/topics/{name}/partitions",
       summary="add partitions to a topic: `partitions` is the new total, larger than today's",
       request=AddPartitionsRequest, response=api_models.TopicDetail, writes=True)
async def post_partitions(request: web.Request) -> web.Response:
    name = topic_name(request)
    body = await read_body(request, AddPartitionsRequest)
    return await _topic_write(request, name, core.AddPartitions(name=name, request=body))


@route("POST", "/v1/reassignments", summary="move a partition to target replicas",
       request=ReassignmentRequest, response=api_models.PartitionList, writes=True, status=202, names_topic=True)
async def post_reassignment(request: web.Request) -> web.Response:
    body = await read_body(request, ReassignmentRequest)
    s = svc(request)
    _, committed = await s.execute(core.StartReassignment(request=body))
    assert committed is not None, "a write waits for its commit"
    image = s.pending or s.committed
    return json_model(api_models.PartitionList(topic=body.topic, metadata_offset=committed.last_offset,
                                               partitions=[views.partition_view(
                                                   image.partition(body.topic, body.partition))]), status=202)


@route("GET", "/v1/reassignments", summary="partitions being reassigned",
       response=api_models.ReassignmentList)
async def get_reassignments(request: web.Request) -> web.Response:
    image = _image(request)
    return json_model(api_models.ReassignmentList(
        metadata_offset=image.offset,
        reassignments=[views.partition_view(p) for p in image.reassigning_partitions()]))


async def _move(request: web.Request, event: core.Event) -> web.Response:
    """Commit a reassignment write; answer with the partitions its records changed."""
    s = svc(request)
    _, committed = await s.execute(event)
    assert committed is not None, "a write waits for its commit"
    image = s.pending or s.committed
    changed = sorted({(r.topic, r.partition) for r in committed.records if isinstance(r, PartitionChange)})
    return json_model(api_models.ReassignmentList(
        metadata_offset=committed.last_offset if committed.last_offset is not None else image.offset,
        reassignments=[views.partition_view(image.partition(t, p)) for t, p in changed]), status=202)


@route("POST", "/v1/reassignments/plan",
       summary="move many partitions at once, all or none (Kafka's reassignment JSON: version, partitions "
               "[{topic, partition, replicas}]), with an optional replication throttle in bytes/s for the "
               "catch-up (it becomes the cluster's reassignment_throttle_bytes_per_s)",
       request=ReassignmentPlanRequest, response=api_models.ReassignmentList, writes=True, status=202,
       errors=(404,))
async def post_reassignment_plan(request: web.Request) -> web.Response:
    return await _move(request, core.StartPlan(request=await read_body(request, ReassignmentPlanRequest)))


@route("POST", "/v1/reassignments/cancel",
       summary="cancel reassignments (the named partitions, or every running one): each goes back to its "
               "original replica set, all or none",
       request=CancelReassignmentsRequest, response=api_models.ReassignmentList, writes=True, status=202,
       errors=(404,))
async def post_reassignment_cancel(request: web.Request) -> web.Response:
    return await _move(request, core.CancelReassignments(request=await read_body(request, CancelReassignmentsRequest)))


@route("GET", "/v1/reassignments/progress",
       summary="every running reassignment with each added replica's log end offset and size against the "
               "leader's, from the brokers' latest usage reports (the leader answers; a follower redirects)",
       response=api_models.ReassignmentProgress, leader_only=True)
async def get_reassignment_progress(request: web.Request) -> web.Response:
    s = svc(request)
    return json_model(views.reassignment_progress(s.committed, s.usage, now_ms=s.clock_ms()))


@route("GET", "/v1/groups",
       summary="consumer groups as their coordinators last reported them (about once a second): state, "
               "members, and per partition the committed offset, the partition leader's high watermark and "
               "the lag between them (the leader answers, which receives the reports; a follower redirects)",
       response=api_models.GroupList, leader_only=True)
async def get_groups(request: web.Request) -> web.Response:
    s = svc(request)
    return json_model(views.group_list(s.committed, s.usage, now_ms=s.clock_ms()))


@route("GET", "/v1/cluster/config", summary="the dynamic cluster config: every key, set or not",
       response=api_models.ClusterConfigView)
async def get_cluster_config(request: web.Request) -> web.Response:
    image = _image(request)
    return json_model(views.cluster_config_view(image, metadata_offset=image.offset))


@route("PATCH", "/v1/cluster/config",
       summary="set or unset dynamic cluster config keys, checked as a whole and committed through Raft; "
               "brokers apply them live as they learn the record",
       request=ClusterConfigRequest, response=api_models.ClusterConfigView, writes=True)
async def patch_cluster_config(request: web.Request) -> web.Response:
    body = await read_body(request, ClusterConfigRequest)
    s = svc(request)
    _, committed = await s.execute(core.AlterClusterConfig(request=body))
    assert committed is not None, "a write waits for its commit"
    return json_model(views.cluster_config_view(s.pending or s.committed, metadata_offset=committed.last_offset))


@route("POST", "/v1/elections/preferred", summary="move leadership to preferred replicas",
       request=PreferredElectionRequest, response=api_models.ElectionResult, writes=True, names_topic=True)
async def post_preferred_election(request: web.Request) -> web.Response:
    body = await read_body(request, PreferredElectionRequest)
    s = svc(request)
    wanted = None if body.partitions is None else tuple((ref.topic, ref.partition) for ref in body.partitions)
    _, committed = await s.execute(core.ElectPreferred(partitions=wanted))
    assert committed is not None, "a write waits for its commit"
    image = s.pending or s.committed
    changed = sorted({(r.topic, r.partition) for r in committed.records if isinstance(r, PartitionChange)})
    return json_model(api_models.ElectionResult(
        metadata_offset=committed.last_offset,
        elected=[views.partition_view(image.partition(t, p)) for t, p in changed]))


@route("GET", "/v1/openapi.json", summary="this description")
async def get_openapi(request: web.Request) -> web.Response:
    return web.json_response(openapi_document())


@route("GET", "/metrics", summary="Prometheus metrics (text format)", text=True)
async def get_metrics(request: web.Request) -> web.Response:
    return await metrics_response(request.app["metrics"].exposition)


# ---------------------------------------------------------------- middleware

def _bearer(request: web.Request) -> str | None:
    header = request.headers.get("Authorization", "")
    if header[:7].lower() == "bearer ":
        return header[7:].strip()
    return None


def make_middleware(admin_token: str):
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        path = request.path
        if path.startswith("/rpc/"):
            return await handler(request)  # the RPC checks the cluster secret itself
        token: str | None = None
        writes = False
        try:
            if path not in PUBLIC_PATHS:
                token = _bearer(request)
                if token is None:
                    return error_response(401, "UNAUTHORIZED",
                                          "missing bearer token: send 'Authorization: Bearer <admin token>'",
                                          headers={"WWW-Authenticate": "Bearer"})
                if not hmac.compare_digest(token.encode(), admin_token.encode()):
                    return error_response(401, "UNAUTHORIZED",
                                          "bad bearer token: use the controllers' --admin-token (a `biplane up` "
                                          "cluster's is admin_token in its cluster.json)",
                                          headers={"WWW-Authenticate": "Bearer"})
            handler_of_route = request.match_info.route.handler
            op = openapi.operation_of(handler_of_route)
            # A handler mounted without an operation may still say what it is (undocumented,
            # which tests/test_openapi.py reports).
            writes = op.writes if op is not None else getattr(handler_of_route, "writes", False)
            leader_only = writes or (op.leader_only if op is not None else getattr(handler_of_route, "leader_only",
                                                                                     False))
            s = svc(request)
            if leader_only and not s.is_leader:
                writes = False
                return not_leader_response(s, request.path_qs)
            writes = writes and token is not None
            if writes:
                refused = _throttled(request, token or "")
                if refused is not None:
                    writes = False   # refused before it ran: nothing to charge
                    return refused
            return await handler(request)
        except EarlyResponse as reply:
            return reply.response
        except web.HTTPException:
            raise
        except NotControllerError:
            return not_leader_response(svc(request), request.path_qs)
        except BiplaneError as exc:
            return error_from_exception(exc)
        except Exception as exc:
            log.exception("admin request %s %s failed", request.method, path)
            return error_response(500, ErrorCode.UNKNOWN, f"internal error: {type(exc).__name__}: {exc}")
        finally:
            if writes:
                request.app[WRITE_BUCKETS].charge(token or "", request.get(WRITE_COST, 1), time.monotonic())
    return middleware


def _throttled(request: web.Request, token: str) -> web.Response | None:
    """A 429 when the token's write bucket is spent, else None."""
    wait_s = request.app[WRITE_BUCKETS].admit(token, time.monotonic())
    if wait_s is None:
        return None
    limits = request.app[API_LIMITS]
    return error_response(
        429, ErrorCode.THROTTLING_QUOTA_EXCEEDED,
        f"this token's write rate is spent: writes refill at {limits.write_rate_per_s:g} units a second up to "
        f"{limits.write_burst:g} (a write costs one unit per partition it creates or deletes, at least one; "
        f"--admin-write-rate, --admin-write-burst); retry in {wait_s:.1f} s",
        headers={"Retry-After": retry_after_header(wait_s)})


def not_leader_response(s: ControllerService, path_qs: str) -> web.Response:
    leader = s.leader_node()
    if leader is not None and leader.node_id != s.node_id and not leader.api_url:
        return error_response(503, ErrorCode.NOT_CONTROLLER,
                              f"controller {s.node_id} is not the leader; the leader is the controller at "
                              f"Raft address {leader.raft_address}, whose API URL this node does not know "
                              "(start controllers with --cluster to get redirects)")
    if leader is not None and leader.node_id != s.node_id:
        location = leader.api_url.rstrip("/") + path_qs
        return error_response(307, ErrorCode.NOT_CONTROLLER,
                              f"controller {s.node_id} is not the leader; "
                              f"retry at controller {leader.node_id}: {location}",
                              headers={"Location": location},
                              extra={"leader": {"node_id": leader.node_id, "api_url": leader.api_url}})
    return error_response(503, ErrorCode.NOT_CONTROLLER,
                          f"controller {s.node_id} is not the leader and no leader is known yet "
                          "(election in progress); retry shortly",
                          headers={"Retry-After": "1"})


# ---------------------------------------------------------------- app

def make_app(service: ControllerService, *, admin_token: str, cluster_secret: str | None,
             limits: ApiLimits = ApiLimits(),
             snapshotter: Callable[[], snapshot_service.Snapshotter | None] = lambda: None) -> web.Application:
    """The aiohttp app: admin API, broker RPC, and the hooks described in the module doc.
    `snapshotter` returns the node's Snapshotter (None: snapshots answer 503)."""
    if not admin_token:
        raise ValueError("an admin token is required (--admin-token or BIPLANE_ADMIN_TOKEN)")
    # The transport's ceiling stays above the admin limit so the broker RPC keeps its room;
    # the admin handlers refuse a body over `limits.body_bytes_max` themselves.
    metrics = ControllerMetrics(service)
    app = web.Application(middlewares=[metrics.middleware, json_errors, make_middleware(admin_token)],
                          client_max_size=max(4 * 1024 * 1024, limits.body_bytes_max))
    app["controller"] = service
    app["metrics"] = metrics   # its registry is served here and on --metrics-port
    app[API_LIMITS] = limits
    app[WRITE_BUCKETS] = WriteBuckets(rate_per_s=limits.write_rate_per_s, burst=limits.write_burst)
    app["on_ready"] = []
    openapi.mount(app, ROUTES)
    snapshot_service.add_snapshot_routes(app, snapshotter)
    rpc.add_rpc_routes(app, service, cluster_secret=cluster_secret)

    async def lifecycle(app: web.Application):
        await service.start()
        for hook in list(app["on_ready"]):
            hook(app)
        yield
        await service.stop()

    app.cleanup_ctx.append(lifecycle)
    return app


def operations() -> list[Operation]:
    """Every admin operation the app mounts."""
    return [*ROUTES, *snapshot_service.OPERATIONS]


def openapi_document() -> dict:
    return openapi.openapi_document(operations())
