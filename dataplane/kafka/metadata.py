"""ApiVersions (0–3) and Metadata (0–8): what is served, and who leads what.

Brokers are named by their Kafka port. The controller named is this broker, a live
one (Biplane's controllers are not brokers; clients take -1 for "no controller",
and some wait for one): admin requests sent to it are forwarded to the controller.
With auto.create.topics.enable (the broker's --auto-create-topics), a topic a client
names that does not exist is created with the broker's defaults and answered
LEADER_NOT_AVAILABLE until its leaders are known.
"""
from __future__ import annotations

from common.errors import ErrorCode, InvalidTopicError
from common.metadata.config import validate_topic_name
from common.wire import messages as wire
from dataplane.groups.placement import is_internal
from dataplane.kafka import admin, messages
from dataplane.kafka.protocol import API_VERSIONS
from dataplane.kafka.registry import APIS, Answer, Context, Request, register

METADATA = 3
UNSUPPORTED_VERSION = 35
_NO_AUTHORIZED_OPERATIONS = -2147483648  # Kafka's "not asked for"


def api_versions_body(version: int, *, error_code: int = 0) -> Answer:
    return messages.build(messages.response_schema(API_VERSIONS, version), {
        "error_code": error_code,
        "api_keys": [{"api_key": api.key, "min_version": api.advertised_from, "max_version": api.versions[1]}
                     for api in sorted(APIS.values(), key=lambda a: a.key)],
        "throttle_time": 0,
    })


@register(API_VERSIONS, "ApiVersions", (0, 3))
async def api_versions(request: Request, context: Context) -> Answer:
    if not request.served:
        # Kafka's answer to a version it does not know: v0, error 35, and the list, so
        # the client retries with a version from it.
        return api_versions_body(0, error_code=UNSUPPORTED_VERSION)
    return api_versions_body(request.version)


@register(METADATA, "Metadata", (0, 8))
async def metadata(request: Request, context: Context) -> Answer:
    topics = request.body.topics
    # v0: an empty list means all topics; from v1 that is None, and [] means none.
    names = None if topics is None or (request.version == 0 and not topics) else tuple(t.name for t in topics)
    done = context.requests.metadata(wire.MetadataRequest(topics=names))
    codes = {t.topic: int(t.error_code) for t in done.topics}
    for name, code in codes.items():
        if code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION and not _legal_name(name):
            codes[name] = int(ErrorCode.INVALID_TOPIC)   # Kafka's answer: no such topic could exist
    # Before v4 a client could not say no; from v4 it says whether it wants topics created.
    if context.effective_topic_defaults().auto_create and messages.field(request.body, "allow_auto_topic_creation", True):
        unknown = [t.topic for t in done.topics if codes[t.topic] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION]
        if unknown:
            port, shape = admin.port_of(context), context.default_topic_shape()
            for name in unknown:
                codes[name] = int(await admin.auto_create(name, port, shape))
    image = context.requests.image()
    brokers = [{"node_id": b.broker_id, "host": b.host, "port": b.kafka_port, "rack": b.rack}
               for b in sorted(image.brokers.values(), key=lambda b: b.broker_id)
               if not b.fenced and b.kafka_port is not None]
    return messages.build(messages.response_schema(METADATA, request.version), {
        "throttle_time": 0, "brokers": brokers, "cluster_id": context.cluster_id,
        "controller_id": context.broker_id,
        "topics": [{"error_code": codes[t.topic], "name": t.topic, "is_internal": is_internal(t.topic),
                    "partitions": [{"error_code": int(p.error_code), "partition_index": p.partition,
                                    "leader_id": p.leader_id, "leader_epoch": p.leader_epoch,
                                    "replica_nodes": p.replicas, "isr_nodes": p.isr,
                                    "offline_replicas": p.offline_replicas} for p in t.partitions],
                    "topic_authorized_operations": _NO_AUTHORIZED_OPERATIONS}
                   for t in done.topics],
        "cluster_authorized_operations": _NO_AUTHORIZED_OPERATIONS})


def _legal_name(name: str) -> bool:
    try:
        validate_topic_name(name)
    except InvalidTopicError:
        return False
    return True
