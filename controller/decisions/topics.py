"""Topic creation, deletion and config changes."""
from __future__ import annotations

import hashlib
import uuid
from typing import Any

from common.metadata.config import (
    IMMUTABLE_KEYS,
    apply_config_changes,
    make_topic_config,
    normalize_key,
    validate_topic_name,
)
from common.errors import (
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidReplicationFactorError,
    TopicExistsError,
    UnknownBrokerError,
    UnknownTopicOrPartitionError,
)
from common.metadata.image import MetadataImage, PartitionInfo
from common.metadata.records import (
    AlterTopicConfig,
    ConfigChange,
    CreateTopic,
    DeleteTopic,
    PartitionRecord,
    Record,
)
from common.requests import AlterConfigRequest, CreateTopicRequest
from controller.decisions.placement import place_replicas
from controller.decisions.plan import choose_leader


def topic_id_for(name: str, now_ms: int, offset: int) -> str:
    """A UUID-shaped id, derived (not random) so the decision stays deterministic."""
    digest = hashlib.sha256(f"{name}\0{now_ms}\0{offset}".encode()).digest()
    return str(uuid.UUID(bytes=digest[:16]))


def _assignment(image: MetadataImage, request: CreateTopicRequest) -> list[tuple[int, ...]]:
    given = request.replica_assignment
    if given is None:
        return place_replicas(image, topic=request.name, partitions=request.partitions,
                              replication_factor=request.replication_factor)
    if "partitions" in request.model_fields_set and request.partitions != len(given):
        raise InvalidPartitionsError(
            f"partitions {request.partitions} disagrees with replica_assignment, which "
            f"lists {len(given)}", field="partitions", value=request.partitions)
    sizes = {len(r) for r in given}
    if len(sizes) != 1:
        raise InvalidReplicationFactorError(
            f"replica_assignment lists {sorted(sizes)} replicas per partition; all must be "
            f"equal", field="replica_assignment", value=given)
    (rf,) = sizes
    if "replication_factor" in request.model_fields_set and request.replication_factor != rf:
        raise InvalidReplicationFactorError(
            f"replication_factor {request.replication_factor} disagrees with "
            f"replica_assignment ({rf} per partition)", field="replication_factor",
            value=request.replication_factor)
    for replicas in given:
        for b in replicas:
            if b not in image.brokers:
                raise UnknownBrokerError(b, field="replica_assignment")
    return [tuple(r) for r in given]


def create_topic(image: MetadataImage, request: CreateTopicRequest,
                 now_ms: int) -> list[Record]:
    """CreateTopic then one PartitionRecord per partition; raises a typed error naming
    the field when the request cannot be satisfied."""
    validate_topic_name(request.name)
    if request.name in image.topics:
        raise TopicExistsError(request.name)
    for key in request.config:
        if normalize_key(key) in IMMUTABLE_KEYS:
            raise InvalidConfigError(
                f"set '{normalize_key(key)}' with the request field, not in config",
                field=normalize_key(key), value=request.config[key])
    assignment = _assignment(image, request)
    config = make_topic_config({**request.config, "partitions": len(assignment),
                                "replication_factor": len(assignment[0])})
    records: list[Record] = [CreateTopic(name=request.name,
                                         topic_id=topic_id_for(request.name, now_ms,
                                                               image.offset),
                                         config=config, at_ms=now_ms)]
    for index, replicas in enumerate(assignment):
        live = tuple(b for b in replicas if image.is_unfenced(b))
        probe = PartitionInfo(topic=request.name, partition=index, replicas=replicas,
                              isr=replicas, leader=None, leader_epoch=0, partition_epoch=0)
        leader = choose_leader(image, probe, live)
        records.append(PartitionRecord(topic=request.name, partition=index, replicas=replicas,
                                       isr=live or replicas, leader=leader,
                                       leader_epoch=0, partition_epoch=0))
    return records


def delete_topic(image: MetadataImage, name: str) -> list[Record]:
    topic = image.topics.get(name)
    if topic is None:
        raise UnknownTopicOrPartitionError(name)
    return [DeleteTopic(name=name, topic_id=topic.topic_id)]


def alter_config(image: MetadataImage, topic: str, request: AlterConfigRequest) -> list[Record]:
    """One record for the whole change (checked as a whole); [] when nothing changes."""
    info = image.topics.get(topic)
    if info is None:
        raise UnknownTopicOrPartitionError(topic)
    changes: dict[str, Any] = {normalize_key(k): v for k, v in request.set.items()}
    for key in request.reset:
        k = normalize_key(key)
        if k in changes:
            raise InvalidConfigError(f"topic config '{k}' is both set and reset", field=k,
                                     value=changes[k])
        changes[k] = None
    if not changes:
        return []
    new_config = apply_config_changes(info.config, changes)
    if new_config == info.config:
        return []
    if len(changes) == 1:
        ((key, value),) = changes.items()
        return [ConfigChange(topic=topic, key=key, value=value)]
    return [AlterTopicConfig(topic=topic, changes=changes)]
