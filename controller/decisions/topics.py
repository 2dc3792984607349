"""Topic creation, deletion, config changes and added partitions."""
from __future__ import annotations

import hashlib
import uuid
from typing import Any

from common.metadata.config import (
    IMMUTABLE_KEYS,
    apply_config_changes,
    is_internal,
    make_topic_config,
    normalize_key,
    refuse_internal,
    refuse_protocol_change,
    validate_topic_name,
)
from common.errors import (
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidReplicationFactorError,
    InvalidTopicError,
    TopicExistsError,
    UnknownBrokerError,
    UnknownTopicOrPartitionError,
)
from common.metadata.image import MetadataImage, PartitionInfo
from common.metadata.records import (
    AddPartitions,
    AlterTopicConfig,
    ConfigChange,
    CreateTopic,
    DeleteTopic,
    PartitionRecord,
    Record,
)
from common.requests import AddPartitionsRequest, AlterConfigRequest, CreateTopicRequest
from controller.decisions.limits import PartitionLimits, check_partitions
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
    _check_registered(image, given)
    return [tuple(r) for r in given]


def _check_registered(image: MetadataImage, assignment: tuple[tuple[int, ...], ...]) -> None:
    for replicas in assignment:
        for b in replicas:
            if b not in image.brokers:
                raise UnknownBrokerError(b, field="replica_assignment")


def _partition_records(image: MetadataImage, topic: str, first: int,
                       assignment: list[tuple[int, ...]]) -> list[Record]:
    """New partitions `first`, `first + 1`, ...: ISR the live replicas, leader the best of them."""
    records: list[Record] = []
    for index, replicas in enumerate(assignment, start=first):
        live = tuple(b for b in replicas if image.is_unfenced(b))
        probe = PartitionInfo(topic=topic, partition=index, replicas=replicas,
                              isr=replicas, leader=None, leader_epoch=0, partition_epoch=0)
        leader = choose_leader(image, probe, live)
        records.append(PartitionRecord(topic=topic, partition=index, replicas=replicas,
                                       isr=live or replicas, leader=leader,
                                       leader_epoch=0, partition_epoch=0))
    return records


def create_topic(image: MetadataImage, request: CreateTopicRequest,
                 now_ms: int, limits: PartitionLimits = PartitionLimits()) -> list[Record]:
    """CreateTopic then one PartitionRecord per partition; raises a typed error naming
    the field when the request cannot be satisfied or breaks a partition limit."""
    validate_topic_name(request.name)
    if request.name in image.topics:
        raise TopicExistsError(request.name)
    # Kafka's rule: '.' and '_' are one character in metric names, so 'a.b' and 'a_b' would
    # report as one topic there; Kafka clients and tools expect the second create refused.
    folded = request.name.replace(".", "_")
    collides = sorted(name for name in image.topics if name.replace(".", "_") == folded)
    if collides:
        raise InvalidTopicError(f"topic name '{request.name}' collides with existing topic {', '.join(collides)}: "
                                "names that differ only in '.' and '_' are the same name in metrics; choose "
                                "another name", field="name", value=request.name)
    for key in request.config:
        if normalize_key(key) in IMMUTABLE_KEYS:
            raise InvalidConfigError(
                f"set '{normalize_key(key)}' with the request field, not in config",
                field=normalize_key(key), value=request.config[key])
    given = request.replica_assignment
    # Checked before placement, which would otherwise do the work of a refused request.
    check_partitions(image, limits, topic=request.name,
                     total=len(given) if given else request.partitions,
                     added=len(given) if given else request.partitions,
                     replication_factor=len(given[0]) if given else request.replication_factor)
    assignment = _assignment(image, request)
    config = make_topic_config({**request.config, "partitions": len(assignment),
                                "replication_factor": len(assignment[0])})
    created = CreateTopic(name=request.name,
                          topic_id=topic_id_for(request.name, now_ms, image.offset),
                          config=config, at_ms=now_ms)
    return [created, *_partition_records(image, request.name, 0, assignment)]


def add_partitions(image: MetadataImage, topic: str, request: AddPartitionsRequest,
                   limits: PartitionLimits = PartitionLimits()) -> list[Record]:
    """AddPartitions then one PartitionRecord per new partition, placed like a new topic's
    (rack-aware, counting the cluster's load, preferred leaders evened out) and numbered on
    from the topic's last. A topic only grows: its keyed records would move partition if it
    shrank, and a removed partition's records would be lost."""
    info = image.topics.get(topic)
    if info is None:
        raise UnknownTopicOrPartitionError(topic)
    refuse_internal(topic, "more partitions would move groups away from their committed offsets")
    current = info.config.partitions
    wanted = request.partitions
    if wanted <= current:
        raise InvalidPartitionsError(
            f"topic '{topic}' already has {current} partitions; partitions {wanted} must be larger "
            f"(a topic's partitions can be added, never removed): ask for {current + 1} or more",
            field="partitions", value=wanted)
    added = wanted - current
    rf = info.config.replication_factor
    check_partitions(image, limits, topic=topic, total=wanted, added=added, replication_factor=rf,
                     current=current)
    given = request.replica_assignment
    if given is None:
        assignment = place_replicas(image, topic=topic, partitions=added, replication_factor=rf,
                                    first_partition=current)
    else:
        if len(given) != added:
            raise InvalidPartitionsError(
                f"replica_assignment lists {len(given)} partitions but going from {current} to "
                f"{wanted} adds {added}: give one replica list per new partition",
                field="replica_assignment", value=given)
        for i, replicas in enumerate(given):
            if len(replicas) != rf:
                raise InvalidReplicationFactorError(
                    f"replica_assignment[{i}] lists {len(replicas)} replicas; topic '{topic}' has "
                    f"replication_factor {rf}, so every new partition needs {rf}",
                    field="replica_assignment", value=given)
        _check_registered(image, given)
        assignment = [tuple(r) for r in given]
    grown = AddPartitions(topic=topic, topic_id=info.topic_id, partitions=wanted)
    return [grown, *_partition_records(image, topic, current, assignment)]


def delete_topic(image: MetadataImage, name: str) -> list[Record]:
    topic = image.topics.get(name)
    if topic is None:
        raise UnknownTopicOrPartitionError(name)
    refuse_internal(name, "deleting it would lose every group's committed offsets")
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
    refuse_protocol_change(topic, info.config, new_config)
    if is_internal(topic) and "cleanup_policy" in changes and new_config.cleanup_policy != "compact":
        # Retention would delete groups' last commits; only compaction keeps each key's latest.
        raise InvalidConfigError(
            f"topic '{topic}' holds every consumer group's committed offsets and must stay "
            f"cleanup_policy=compact (asked: {new_config.cleanup_policy}); its other settings may change",
            field="cleanup_policy", value=new_config.cleanup_policy)
    if len(changes) == 1:
        ((key, value),) = changes.items()
        return [ConfigChange(topic=topic, key=key, value=value)]
    return [AlterTopicConfig(topic=topic, changes=changes)]
