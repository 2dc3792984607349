"""Kafka's admin APIs, forwarded to the controller.

CreateTopics 2-4, DeleteTopics 1-3, CreatePartitions 0-1, AlterConfigs 0-1 and
IncrementalAlterConfigs 0 become the admin API's own requests (common/requests.py)
and go to the controller through an `AdminPort` (the broker's ControlClient, over
the control RPC): the controller's decisions check them exactly as they check
`biplane topic ...`. DescribeConfigs 1-3 is answered from the broker's metadata
image. Config names and values are Kafka's, mapped by dataplane/kafka/configs.py.

Each item of a request (a topic, a resource) gets its own error code and message:
one bad topic does not fail the others. `validate_only` goes to the controller, which
decides as for the write and applies nothing. A config error of the controller's rules
is told with the Kafka names of the keys it quotes (configs.kafka_words).
"""
from __future__ import annotations

import datetime
import logging
from typing import Any, Awaitable, Callable, Protocol

from pydantic import ValidationError

from common.errors import BiplaneError, ErrorCode, UnknownTopicOrPartitionError
from common.metadata import MetadataImage
from common.metadata.config import is_internal, refuse_creating_internal
from common.requests import AddPartitionsRequest, AdminAnswer, AlterConfigRequest, CreateTopicRequest
from common.validation_text import plain_issues
from dataplane.kafka import configs, messages

from dataplane.kafka.registry import Context, Request, register

Answer = Any  # a kio response entity
log = logging.getLogger("biplane.kafka")

CREATE_TOPICS, DELETE_TOPICS, DESCRIBE_CONFIGS, ALTER_CONFIGS = 19, 20, 32, 33
CREATE_PARTITIONS, INCREMENTAL_ALTER_CONFIGS = 37, 44

# (lowest, highest) version of each admin API answered here.
SERVED: dict[int, tuple[int, int]] = {
    CREATE_TOPICS: (2, 4),
    DELETE_TOPICS: (1, 3),
    DESCRIBE_CONFIGS: (1, 3),
    ALTER_CONFIGS: (0, 1),
    INCREMENTAL_ALTER_CONFIGS: (0, 0),
    CREATE_PARTITIONS: (0, 1),
}

TOPIC_RESOURCE = 2
# DescribeConfigs' config_source: DYNAMIC_TOPIC_CONFIG and DEFAULT_CONFIG.
_SOURCE = {"TOPIC": 1, "DEFAULT": 5}


_FIELD_CODES = {"name": ErrorCode.INVALID_TOPIC,
                "partitions": ErrorCode.INVALID_PARTITIONS,
                "replication_factor": ErrorCode.INVALID_REPLICATION_FACTOR}


class AdminPort(Protocol):
    """The controller's admin writes (common/control_client.ControlClient has them); with
    validate_only the controller decides and refuses as for the write, and applies nothing."""

    async def create_topic(self, request: CreateTopicRequest, *, validate_only: bool = False) -> AdminAnswer: ...
    async def delete_topic(self, name: str, *, validate_only: bool = False) -> AdminAnswer: ...
    async def alter_config(self, name: str, change: AlterConfigRequest, *,
                           validate_only: bool = False) -> AdminAnswer: ...
    async def add_partitions(self, name: str, change: AddPartitionsRequest, *,
                             validate_only: bool = False) -> AdminAnswer: ...


class NoAdminPort:
    """The port of a listener built without a controller to forward to (some tests)."""

    def _refuse(self) -> BiplaneError:
        return BiplaneError("this Kafka listener forwards no admin calls (it was started without a controller "
                            "client); use `biplane topic ...` or the admin API", code=ErrorCode.NOT_CONTROLLER)

    async def create_topic(self, request: CreateTopicRequest, *, validate_only: bool = False) -> AdminAnswer:
        raise self._refuse()

    async def delete_topic(self, name: str, *, validate_only: bool = False) -> AdminAnswer:
        raise self._refuse()

    async def alter_config(self, name: str, change: AlterConfigRequest, *,
                           validate_only: bool = False) -> AdminAnswer:
        raise self._refuse()

    async def add_partitions(self, name: str, change: AddPartitionsRequest, *,
                             validate_only: bool = False) -> AdminAnswer:
        raise self._refuse()


# How long an admin write's answer waits for this broker's metadata to reach the write: the
# change committed already; the wait only lets the client read it back here at once.
SETTLE_MS_MAX = 2000


class SettledPort:
    """An admin port whose writes answer once this broker has applied them (read your writes:
    a DescribeConfigs after an AlterConfigs, or a Metadata after a CreateTopics, sent to the same
    broker sees the change). Past `settle_ms` the write is answered anyway: it committed."""

    def __init__(self, inner: AdminPort, applied: Callable[[int, int], Awaitable[bool]], settle_ms: int) -> None:
        self.inner = inner
        self.applied = applied
        self.settle_ms = settle_ms

    async def _settled(self, what: str, answer: AdminAnswer) -> AdminAnswer:
        offset = answer.metadata_offset
        if offset is not None and self.settle_ms > 0 and not await self.applied(offset, self.settle_ms):
            log.info("%s committed at metadata offset %d but this broker had not applied it %d ms later; "
                     "answered without it", what, offset, self.settle_ms,
                     extra={"event": "kafka.admin_unsettled", "offset": offset})
        return answer

    async def create_topic(self, request: CreateTopicRequest, *, validate_only: bool = False) -> AdminAnswer:
        return await self._settled(f"topic {request.name!r} creation",
                                   await self.inner.create_topic(request, validate_only=validate_only))

    async def delete_topic(self, name: str, *, validate_only: bool = False) -> AdminAnswer:
        return await self._settled(f"topic {name!r} deletion",
                                   await self.inner.delete_topic(name, validate_only=validate_only))

    async def alter_config(self, name: str, change: AlterConfigRequest, *,
                           validate_only: bool = False) -> AdminAnswer:
        return await self._settled(f"topic {name!r} config change",
                                   await self.inner.alter_config(name, change, validate_only=validate_only))

    async def add_partitions(self, name: str, change: AddPartitionsRequest, *,
                             validate_only: bool = False) -> AdminAnswer:
        return await self._settled(f"topic {name!r} partition count change",
                                   await self.inner.add_partitions(name, change, validate_only=validate_only))


def _response(request: Request, values: dict[str, Any]) -> Answer:
    return messages.build(messages.response_schema(request.api_key, request.version),
                          {"throttle_time": 0, **values})


def _outcome(exc: BaseException | None) -> dict[str, Any]:
    if exc is None:
        return {"error_code": 0, "error_message": None}
    if isinstance(exc, BiplaneError):
        message = configs.kafka_words(str(exc)) if exc.code == ErrorCode.INVALID_CONFIG else str(exc)
        return {"error_code": int(exc.code), "error_message": message}
    raise exc


async def _attempt(call: Callable[[], Awaitable[object]]) -> dict[str, Any]:
    """One item's error code and message: a BiplaneError is the item's answer."""
    try:
        await call()
    except BiplaneError as exc:
        return _outcome(exc)
    return _outcome(None)


# ---------------------------------------------------------------- topics


async def create_topics(request: Request, port: AdminPort, defaults: tuple[int, int] = (1, 1)) -> Answer:
    """`defaults`: the (partitions, replication factor) a -1 count asks for (CreateTopics v4)."""
    body = request.body
    results = []
    for topic in body.topics:
        async def create(topic: Any = topic) -> None:
            refuse_creating_internal(topic.name)
            config = configs.create_config({c.name: c.value for c in topic.configs})
            assignment = tuple(tuple(a.broker_ids) for a in sorted(topic.assignments,
                                                                   key=lambda a: a.partition_index))
            fields: dict[str, Any] = {"name": topic.name, "config": config}
            if assignment:
                # Kafka's rule: an assignment carries the counts, and a count given beside it
                # is refused rather than checked against it.
                if topic.replication_factor != -1:
                    raise BiplaneError(f"topic {topic.name!r}: a manual partition assignment was given, so the "
                                       f"replication factor must be -1, not {topic.replication_factor}",
                                       code=ErrorCode.INVALID_REQUEST)
                if topic.num_partitions != -1:
                    raise BiplaneError(f"topic {topic.name!r}: a manual partition assignment was given, so the "
                                       f"number of partitions must be -1, not {topic.num_partitions}",
                                       code=ErrorCode.INVALID_REQUEST)
                fields["replica_assignment"] = assignment
            else:
                fields["partitions"] = defaults[0] if topic.num_partitions == -1 else topic.num_partitions
                fields["replication_factor"] = (defaults[1] if topic.replication_factor == -1
                                                else topic.replication_factor)
            await port.create_topic(CreateTopicRequest.model_validate(fields), validate_only=body.validate_only)
        results.append({"name": topic.name, **await _attempt_model(create)})
    return _response(request, {"topics": results})


async def _attempt_model(call: Callable[[], Awaitable[object]]) -> dict[str, Any]:
    """As _attempt, with a request model's own check (pydantic) answered with Kafka's code for
    the field (a count of 0 partitions is INVALID_PARTITIONS, as Kafka answers it)."""
    try:
        return await _attempt(call)
    except ValidationError as exc:
        where, text = plain_issues(exc.errors())[0]
        code = _FIELD_CODES.get(where.split(".")[0], ErrorCode.INVALID_REQUEST)
        return {"error_code": int(code), "error_message": f"{where}: {text}"}


async def auto_create(name: str, port: AdminPort, shape: tuple[int, int]) -> ErrorCode:
    """Create a topic a client asked for by name (auto.create.topics.enable): the code its
    metadata answer carries. LEADER_NOT_AVAILABLE (retriable) once the controller has it, or
    had it already (another request created it first): its leaders are not known yet."""
    partitions, replication_factor = shape
    if is_internal(name):
        # The brokers create it, compacted and sized for groups, when a group first needs it; a
        # metadata request is no reason to make it with a user topic's shape and retention.
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION

    async def create() -> None:
        await port.create_topic(CreateTopicRequest.model_validate(
            {"name": name, "partitions": partitions, "replication_factor": replication_factor}))
    code = ErrorCode((await _attempt_model(create))["error_code"])
    if code in (ErrorCode.NONE, ErrorCode.TOPIC_ALREADY_EXISTS):
        if code is ErrorCode.NONE:
            log.info("auto-created topic %r (%d partitions, replication factor %d) for a Kafka client",
                     name, partitions, replication_factor)
        return ErrorCode.LEADER_NOT_AVAILABLE
    log.warning("could not auto-create topic %r for a Kafka client: %s", name, code.name)
    return code


async def delete_topics(request: Request, port: AdminPort) -> Answer:
    results = []
    for name in request.body.topic_names:
        async def delete(name: str = name) -> None:
            await port.delete_topic(name)
        outcome = await _attempt(delete)
        results.append({"name": name, "error_code": outcome["error_code"]})
    return _response(request, {"responses": results})


async def create_partitions(request: Request, port: AdminPort) -> Answer:
    body = request.body
    results = []
    for topic in body.topics:
        async def grow(topic: Any = topic) -> None:
            assignment = None if topic.assignments is None else tuple(tuple(a.broker_ids) for a in topic.assignments)
            await port.add_partitions(topic.name, AddPartitionsRequest(partitions=topic.count,
                                                                       replica_assignment=assignment),
                                      validate_only=body.validate_only)
        results.append({"name": topic.name, **await _attempt_model(grow)})
    return _response(request, {"results": results})


# ---------------------------------------------------------------- configs


def _resource_error(resource: Any) -> BiplaneError | None:
    if resource.resource_type != TOPIC_RESOURCE:
        return BiplaneError(f"resource type {resource.resource_type} ({resource.resource_name!r}) is not served: "
                            f"only topic configs (resource type {TOPIC_RESOURCE}) are", code=ErrorCode.INVALID_REQUEST)
    return None


def describe_configs(request: Request, image: MetadataImage) -> Answer:
    results = []
    for resource in request.body.resources:
        entries: list[dict[str, Any]] = []
        error = _resource_error(resource)
        if error is None:
            topic = image.topics.get(resource.resource_name)
            try:
                if topic is None:
                    raise UnknownTopicOrPartitionError(resource.resource_name)
                entries = [{"name": e.name, "value": e.value, "read_only": e.read_only,
                            "config_source": _SOURCE[e.source], "is_sensitive": e.sensitive,
                            "synonyms": [], "config_type": e.config_type, "documentation": None}
                           for e in configs.describe(topic.config, resource.configuration_keys)]
            except BiplaneError as exc:
                error = exc
        results.append({"resource_type": resource.resource_type, "resource_name": resource.resource_name,
                        "configs": entries, **_outcome(error)})
    return _response(request, {"results": results})


async def _alter(request: Request, port: AdminPort, entries_of: Callable[[Any], dict[str, str | None]], *,
                 replace_all: bool) -> Answer:
    body = request.body
    results = []
    for resource in body.resources:
        async def alter(resource: Any = resource) -> None:
            error = _resource_error(resource)
            if error is not None:
                raise error
            change = configs.alter_request(entries_of(resource), replace_all=replace_all)
            await port.alter_config(resource.resource_name, change, validate_only=body.validate_only)
        results.append({"resource_type": resource.resource_type, "resource_name": resource.resource_name,
                        **await _attempt(alter)})
    return _response(request, {"responses": results})


async def alter_configs(request: Request, port: AdminPort) -> Answer:
    """Kafka's AlterConfigs: the given configs replace the topic's; the rest go back to defaults."""
    return await _alter(request, port, lambda r: {c.name: c.value for c in r.configs}, replace_all=True)


async def incremental_alter_configs(request: Request, port: AdminPort) -> Answer:
    return await _alter(request, port, lambda r: configs.incremental_entries(
        (c.name, c.config_operation, c.value) for c in r.configs), replace_all=False)


# ------------------------------------------------------------------ registration

def port_of(context: Context, request: Request | None = None) -> AdminPort:
    """The controller's admin port, its writes answered once this broker has them, within the
    request's own timeout_ms where it has one (CreateTopics, DeleteTopics, CreatePartitions)."""
    if context.control is None:
        return NoAdminPort()
    if context.applied is None:
        return context.control
    timeout = getattr(request.body, "timeout", None) if request is not None else None
    settle_ms = SETTLE_MS_MAX
    if isinstance(timeout, datetime.timedelta):
        settle_ms = max(0, min(SETTLE_MS_MAX, int(timeout.total_seconds() * 1000)))
    return SettledPort(context.control, context.applied, settle_ms)


@register(CREATE_TOPICS, "CreateTopics", SERVED[CREATE_TOPICS])
async def _create_topics(request: Request, context: Context) -> Answer:
    return await create_topics(request, port_of(context, request), context.default_topic_shape())


@register(DELETE_TOPICS, "DeleteTopics", SERVED[DELETE_TOPICS])
async def _delete_topics(request: Request, context: Context) -> Answer:
    return await delete_topics(request, port_of(context, request))


@register(CREATE_PARTITIONS, "CreatePartitions", SERVED[CREATE_PARTITIONS])
async def _create_partitions(request: Request, context: Context) -> Answer:
    return await create_partitions(request, port_of(context, request))


@register(ALTER_CONFIGS, "AlterConfigs", SERVED[ALTER_CONFIGS])
async def _alter_configs(request: Request, context: Context) -> Answer:
    return await alter_configs(request, port_of(context, request))


@register(INCREMENTAL_ALTER_CONFIGS, "IncrementalAlterConfigs", SERVED[INCREMENTAL_ALTER_CONFIGS])
async def _incremental_alter_configs(request: Request, context: Context) -> Answer:
    return await incremental_alter_configs(request, port_of(context, request))


@register(DESCRIBE_CONFIGS, "DescribeConfigs", SERVED[DESCRIBE_CONFIGS])
async def _describe_configs(request: Request, context: Context) -> Answer:
    return describe_configs(request, context.requests.image())
