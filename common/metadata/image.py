"""The metadata image: the state that the metadata records build, applied in order.

Pure and deterministic: no clock, no I/O, no randomness. Controllers hold it as
their replicated state, brokers as learners of the log.

Rules worth knowing:
- `apply(record, offset)` needs `offset == image.offset + 1`: the caller's
  counter is off otherwise, which is a bug (assert), not bad input.
- A record that does not fit the image (unknown topic, stale partition epoch,
  a leader that is fenced or outside the ISR, ...) raises `RecordRejected`
  and leaves the image exactly as it was, offset included: a rejected record
  takes no offset, so every replica of the state machine skips it the same way
  and brokers only ever see accepted records.
- `apply` is dumb on purpose: fencing a broker only marks it fenced. The
  decisions (controller/decisions) emit the PartitionChange records that move
  its leaderships and shrink the ISRs, in the same batch, so each effect is an
  explicit, replayable record.
- Invariants every accepted record keeps: ISR non-empty and within replicas;
  a leader is in the replicas and in the ISR; a broker newly made leader or
  newly added to an ISR is registered and unfenced; epochs only grow.
- `copy()` is cheap: values are frozen and maps are copied shallowly, so the
  copy shares them until one side replaces an entry.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from types import MappingProxyType
from typing import Any, Iterator, Mapping

from pydantic import ValidationError

from common.errors import InvalidFieldError, RecordRejected, UnknownTopicOrPartitionError
from common.metadata.cluster_config import ClusterConfig, apply_cluster_config_changes
from common.metadata.config import TopicConfig, apply_config_changes, validate_topic_name
from common.metadata.records import (
    NO_CHANGE,
    NO_LEADER,
    AddPartitions,
    AlterBrokerState,
    AlterClusterConfig,
    AlterTopicConfig,
    ConfigChange,
    CreateTopic,
    DeleteTopic,
    FenceBroker,
    NoOp,
    PartitionChange,
    PartitionRecord,
    ProducerIdBlock,
    Record,
    RegisterBroker,
    UnfenceBroker,
    UnregisterBroker,
)
from common.topic_partition import TopicPartition

IMAGE_FORMAT_VERSION = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class BrokerInfo:
    broker_id: int
    incarnation_id: str
    host: str
    port: int
    rack: str | None
    priority: int
    fenced: bool
    clean_shutdown: bool  # as the broker said at its last registration
    registered_offset: int  # metadata offset of that registration
    registered_at_ms: int
    fenced_at_ms: int | None = None
    # Offset of the record that fenced it (its registration, or a FenceBroker):
    # it is unfenced only once it has applied metadata up to there.
    fenced_offset: int | None = None
    kafka_port: int | None = None  # the broker's Kafka API listener (None: it has none)
    fence_reason: str = ""
    # An operator's marks (AlterBrokerState), kept across re-registrations.
    maintenance: bool = False
    decommissioning: bool = False
    decommissioned: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class TopicInfo:
    name: str
    topic_id: str
    config: TopicConfig
    partition_count: int  # partitions created so far (== config.partitions once complete)
    created_at_ms: int = 0
    # The topic has been under durability=write at some time since its creation: its replicas
    # may have counted records before they were on disk, which a crash can take (an alter to
    # fsync brings nothing back). Set by the record that makes it so, never cleared.
    ever_under_write: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionInfo:
    topic: str
    partition: int
    replicas: tuple[int, ...]  # ordered; the first is the preferred leader
    isr: tuple[int, ...]
    leader: int | None
    leader_epoch: int
    partition_epoch: int
    adding: tuple[int, ...] = ()
    removing: tuple[int, ...] = ()
    fenced_for_election: bool = False

    @property
    def target_replicas(self) -> tuple[int, ...]:
        """Where the replicas are going: all replicas but those being removed."""
        return tuple(b for b in self.replicas if b not in self.removing)

    @property
    def reassigning(self) -> bool:
        return bool(self.adding or self.removing)

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


def _reject(record: Record, reason: str) -> RecordRejected:
    return RecordRejected(record.type, reason)


class MetadataImage:
    """Brokers, topics, partitions and producer-id blocks at one metadata offset."""

    __slots__ = ("_offset", "_brokers", "_topics", "_partitions", "_producer_id_next", "_cluster_config",
                 "_replica_counts", "_preferred_counts", "_leader_counts", "_leaderless", "_reassigning")

    def __init__(self) -> None:
        self._offset = -1
        self._cluster_config = ClusterConfig()
        self._brokers: dict[int, BrokerInfo] = {}
        self._topics: dict[str, TopicInfo] = {}
        self._partitions: dict[str, tuple[PartitionInfo, ...]] = {}
        self._producer_id_next = 0
        # Derived from _partitions and kept by every record that changes a partition, so that
        # placement and the controller's periodic pass look at what they act on rather than scan
        # every partition (not part of equality or to_dict; `_track`).
        self._replica_counts: dict[int, int] = {}
        self._preferred_counts: dict[int, int] = {}
        self._leader_counts: dict[int, int] = {}
        self._leaderless: set[tuple[str, int]] = set()
        self._reassigning: set[tuple[str, int]] = set()

    # ---- read-only views -------------------------------------------------

    @property
    def offset(self) -> int:
        """Offset of the last applied record; -1 when nothing was applied."""
        return self._offset

    @property
    def brokers(self) -> Mapping[int, BrokerInfo]:
        return MappingProxyType(self._brokers)

    @property
    def topics(self) -> Mapping[str, TopicInfo]:
        return MappingProxyType(self._topics)

    @property
    def cluster_config(self) -> ClusterConfig:
        """Dynamic cluster settings (common/metadata/cluster_config.py); unset keys are None."""
        return self._cluster_config

    @property
    def producer_id_next(self) -> int:
        return self._producer_id_next

    def partition(self, topic: str, partition: int) -> PartitionInfo:
        parts = self._partitions.get(topic)
        if parts is None or not 0 <= partition < len(parts):
            raise UnknownTopicOrPartitionError(topic, partition)
        return parts[partition]

    def get_partition(self, topic: str, partition: int) -> PartitionInfo | None:
        parts = self._partitions.get(topic)
        if parts is None or not 0 <= partition < len(parts):
            return None
        return parts[partition]

    def topic_partitions(self, topic: str) -> tuple[PartitionInfo, ...]:
        if topic not in self._partitions:
            raise UnknownTopicOrPartitionError(topic)
        return self._partitions[topic]

    def partitions(self) -> Iterator[PartitionInfo]:
        """Every partition, ordered by topic name then partition number."""
        for topic in sorted(self._partitions):
            yield from self._partitions[topic]

    def replica_count(self, broker_id: int) -> int:
        """Replicas (of every partition) this broker hosts."""
        return self._replica_counts.get(broker_id, 0)

    def replica_total(self) -> int:
        """Replicas of every partition in the cluster."""
        return sum(self._replica_counts.values())

    def preferred_leader_count(self, broker_id: int) -> int:
        """Partitions whose first replica (the preferred leader) is this broker."""
        return self._preferred_counts.get(broker_id, 0)

    def leader_count(self, broker_id: int) -> int:
        """Partitions this broker leads."""
        return self._leader_counts.get(broker_id, 0)

    def leaderless_partitions(self) -> list[PartitionInfo]:
        """Partitions without a leader, ordered as `partitions()`."""
        return [self._partitions[t][i] for t, i in sorted(self._leaderless)]

    def reassigning_partitions(self) -> list[PartitionInfo]:
        """Partitions with replicas being added or removed, ordered as `partitions()`."""
        return [self._partitions[t][i] for t, i in sorted(self._reassigning)]

    def _track(self, p: PartitionInfo, sign: int) -> None:
        """Count `p` in (+1) or out of (-1) the derived counts and sets."""
        for b in p.replicas:
            self._replica_counts[b] = self._replica_counts.get(b, 0) + sign
        if p.replicas:
            self._preferred_counts[p.replicas[0]] = self._preferred_counts.get(p.replicas[0], 0) + sign
        key = (p.topic, p.partition)
        if p.leader is None:
            (self._leaderless.add if sign > 0 else self._leaderless.discard)(key)
        else:
            self._leader_counts[p.leader] = self._leader_counts.get(p.leader, 0) + sign
        if p.reassigning:
            (self._reassigning.add if sign > 0 else self._reassigning.discard)(key)

    def is_unfenced(self, broker_id: int) -> bool:
        info = self._brokers.get(broker_id)
        return info is not None and not info.fenced

    def unfenced_broker_ids(self) -> list[int]:
        return sorted(b for b, info in self._brokers.items() if not info.fenced)

    def in_maintenance(self, broker_id: int) -> bool:
        info = self._brokers.get(broker_id)
        return info is not None and info.maintenance

    def placeable_broker_ids(self) -> list[int]:
        """Brokers new replicas may go to: unfenced and not being decommissioned."""
        return sorted(b for b, info in self._brokers.items() if not info.fenced and not info.decommissioning)

    def priority(self, broker_id: int) -> int:
        info = self._brokers.get(broker_id)
        return info.priority if info is not None else 0

    def copy(self) -> "MetadataImage":
        other = MetadataImage.__new__(MetadataImage)
        other._offset = self._offset
        other._brokers = dict(self._brokers)
        other._topics = dict(self._topics)
        other._partitions = dict(self._partitions)
        other._producer_id_next = self._producer_id_next
        other._cluster_config = self._cluster_config
        other._replica_counts = dict(self._replica_counts)
        other._preferred_counts = dict(self._preferred_counts)
        other._leader_counts = dict(self._leader_counts)
        other._leaderless = set(self._leaderless)
        other._reassigning = set(self._reassigning)
        return other

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MetadataImage):
            return NotImplemented
        return (self._offset == other._offset and self._brokers == other._brokers
                and self._topics == other._topics and self._partitions == other._partitions
                and self._producer_id_next == other._producer_id_next
                and self._cluster_config == other._cluster_config)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (f"MetadataImage(offset={self._offset}, brokers={len(self._brokers)}, "
                f"topics={len(self._topics)})")

    # ---- applying records ------------------------------------------------

    def apply(self, record: Record, offset: int) -> None:
        """Apply one record at `offset`; raise RecordRejected (image unchanged) if it does not fit."""
        assert offset == self._offset + 1, f"offset {offset} after {self._offset}"
        handler = _HANDLERS.get(type(record))
        assert handler is not None, f"no handler for {type(record).__name__}"
        handler(self, record)  # validates fully before it mutates anything
        self._offset = offset
        assert self._offset == offset

    def apply_all(self, records: list[Record], first_offset: int) -> list[RecordRejected]:
        """Apply records in order from `first_offset`, skipping rejected ones (they take
        no offset). Returns the rejections."""
        rejected = []
        next_offset = first_offset
        for record in records:
            try:
                self.apply(record, next_offset)
            except RecordRejected as exc:
                rejected.append(exc)
            else:
                next_offset += 1
        return rejected

    def _register_broker(self, r: RegisterBroker) -> None:
        old = self._brokers.get(r.broker_id)
        marks = {} if old is None else {"maintenance": old.maintenance, "decommissioning": old.decommissioning,
                                        "decommissioned": old.decommissioned}
        self._brokers[r.broker_id] = BrokerInfo(**marks,
            broker_id=r.broker_id, incarnation_id=r.incarnation_id, host=r.host, port=r.port,
            rack=r.rack, priority=r.priority, fenced=True, clean_shutdown=r.clean_shutdown,
            registered_offset=self._offset + 1, registered_at_ms=r.at_ms,
            fenced_at_ms=r.at_ms, fenced_offset=self._offset + 1, fence_reason="registered",
            kafka_port=r.kafka_port)

    def _alter_broker_state(self, r: AlterBrokerState) -> None:
        info = self._brokers.get(r.broker_id)
        if info is None:
            raise _reject(r, f"broker {r.broker_id} is not registered")
        new = replace(info,
                      maintenance=info.maintenance if r.maintenance is None else r.maintenance,
                      decommissioning=info.decommissioning if r.decommissioning is None else r.decommissioning,
                      decommissioned=info.decommissioned if r.decommissioned is None else r.decommissioned)
        if new == info:
            raise _reject(r, f"broker {r.broker_id}: change changes nothing")
        if new.decommissioned and not info.decommissioned:
            if not new.decommissioning:
                raise _reject(r, f"broker {r.broker_id} is not being decommissioned")
            if not info.fenced:
                raise _reject(r, f"broker {r.broker_id} must be fenced before it is decommissioned")
            for p in self.partitions() if self.replica_count(r.broker_id) else ():
                if r.broker_id in p.replicas:
                    raise _reject(r, f"broker {r.broker_id} still hosts {p.topic}-{p.partition}")
        if new.decommissioned and not new.decommissioning:
            raise _reject(r, f"broker {r.broker_id}: decommissioned needs decommissioning")
        self._brokers[r.broker_id] = new

    def _fence_broker(self, r: FenceBroker) -> None:
        info = self._brokers.get(r.broker_id)
        if info is None:
            raise _reject(r, f"broker {r.broker_id} is not registered")
        if info.fenced:
            raise _reject(r, f"broker {r.broker_id} is already fenced")
        if r.incarnation_id is not None and r.incarnation_id != info.incarnation_id:
            raise _reject(r, f"broker {r.broker_id} is now incarnation "
                             f"{info.incarnation_id!r}, not {r.incarnation_id!r}")
        self._brokers[r.broker_id] = replace(info, fenced=True, fenced_at_ms=r.at_ms,
                                             fenced_offset=self._offset + 1,
                                             fence_reason=r.reason)

    def _unfence_broker(self, r: UnfenceBroker) -> None:
        info = self._brokers.get(r.broker_id)
        if info is None:
            raise _reject(r, f"broker {r.broker_id} is not registered")
        if not info.fenced:
            raise _reject(r, f"broker {r.broker_id} is not fenced")
        if info.decommissioned:
            raise _reject(r, f"broker {r.broker_id} is decommissioned; recommission it first")
        if r.fenced_offset is not None and r.fenced_offset != info.fenced_offset:
            raise _reject(r, f"broker {r.broker_id} was fenced again at offset "
                             f"{info.fenced_offset}, after {r.fenced_offset}")
        self._brokers[r.broker_id] = replace(info, fenced=False, fenced_at_ms=None,
                                             fenced_offset=None, fence_reason="")

    def _unregister_broker(self, r: UnregisterBroker) -> None:
        if r.broker_id not in self._brokers:
            raise _reject(r, f"broker {r.broker_id} is not registered")
        for p in self.partitions() if self.replica_count(r.broker_id) else ():
            if r.broker_id in p.replicas:
                raise _reject(r, f"broker {r.broker_id} still hosts {p.topic}-{p.partition}; "
                                 f"reassign its replicas first")
        del self._brokers[r.broker_id]

    def _create_topic(self, r: CreateTopic) -> None:
        try:
            validate_topic_name(r.name)
        except InvalidFieldError as exc:
            raise _reject(r, str(exc)) from None
        if r.name in self._topics:
            raise _reject(r, f"topic {r.name!r} exists")
        if any(t.topic_id == r.topic_id for t in self._topics.values()):
            raise _reject(r, f"topic id {r.topic_id!r} is in use")
        self._topics[r.name] = TopicInfo(name=r.name, topic_id=r.topic_id, config=r.config,
                                         partition_count=0, created_at_ms=r.at_ms,
                                         ever_under_write=r.config.durability == "write")
        self._partitions[r.name] = ()

    def _add_partitions(self, r: AddPartitions) -> None:
        topic = self._topics.get(r.topic)
        if topic is None:
            raise _reject(r, f"unknown topic {r.topic!r}")
        if topic.topic_id != r.topic_id:
            raise _reject(r, f"topic {r.topic!r} has id {topic.topic_id!r}, not {r.topic_id!r}")
        if topic.partition_count != topic.config.partitions:
            raise _reject(r, f"topic {r.topic!r} has {topic.partition_count} of its "
                             f"{topic.config.partitions} partitions; it is still being created")
        if r.partitions <= topic.config.partitions:
            raise _reject(r, f"topic {r.topic!r} has {topic.config.partitions} partitions; "
                             f"a topic grows, it never shrinks (asked for {r.partitions})")
        config = TopicConfig.model_validate({**topic.config.model_dump(), "partitions": r.partitions})
        self._topics[r.topic] = replace(topic, config=config)

    def _partition_record(self, r: PartitionRecord) -> None:
        topic = self._topics.get(r.topic)
        if topic is None:
            raise _reject(r, f"unknown topic {r.topic!r}")
        if r.partition != topic.partition_count:
            raise _reject(r, f"partition {r.partition} of {r.topic!r} is out of order; "
                             f"next is {topic.partition_count}")
        if r.partition >= topic.config.partitions:
            raise _reject(r, f"topic {r.topic!r} has {topic.config.partitions} partitions")
        new = PartitionInfo(topic=r.topic, partition=r.partition, replicas=r.replicas,
                            isr=r.isr, leader=r.leader, leader_epoch=r.leader_epoch,
                            partition_epoch=r.partition_epoch)
        self._check_partition(r, new, old=None)
        self._partitions[r.topic] = self._partitions[r.topic] + (new,)
        self._topics[r.topic] = replace(topic, partition_count=topic.partition_count + 1)
        self._track(new, +1)

    def _partition_change(self, r: PartitionChange) -> None:
        old = self.get_partition(r.topic, r.partition)
        if old is None:
            raise _reject(r, f"unknown partition {r.topic}-{r.partition}")
        if r.expected_partition_epoch is not None \
                and r.expected_partition_epoch != old.partition_epoch:
            raise _reject(r, f"{r.topic}-{r.partition} partition_epoch is "
                             f"{old.partition_epoch}, change expected "
                             f"{r.expected_partition_epoch}")
        leader = old.leader
        fenced_for_election = old.fenced_for_election
        if r.fenced_for_election:
            leader, fenced_for_election = None, True
        elif r.leader == NO_LEADER:
            leader = None
        elif r.leader != NO_CHANGE:
            leader, fenced_for_election = r.leader, False
        leader_epoch = old.leader_epoch
        if r.fenced_for_election or leader != old.leader:
            leader_epoch += 1
        new = replace(
            old,
            replicas=old.replicas if r.replicas is None else r.replicas,
            isr=old.isr if r.isr is None else r.isr,
            adding=old.adding if r.adding is None else r.adding,
            removing=old.removing if r.removing is None else r.removing,
            leader=leader, leader_epoch=leader_epoch,
            partition_epoch=old.partition_epoch + 1,
            fenced_for_election=fenced_for_election)
        if replace(new, partition_epoch=old.partition_epoch) == old:
            raise _reject(r, f"{r.topic}-{r.partition}: change changes nothing")
        self._check_partition(r, new, old=old)
        parts = self._partitions[r.topic]
        self._partitions[r.topic] = parts[:r.partition] + (new,) + parts[r.partition + 1:]
        self._track(old, -1)
        self._track(new, +1)
        assert self._partitions[r.topic][r.partition].partition_epoch > old.partition_epoch

    def _check_partition(self, r: Record, p: PartitionInfo, old: PartitionInfo | None) -> None:
        name = f"{p.topic}-{p.partition}"
        if not p.replicas or len(set(p.replicas)) != len(p.replicas):
            raise _reject(r, f"{name}: replicas {list(p.replicas)} must be distinct, non-empty")
        if not p.isr or len(set(p.isr)) != len(p.isr) or not set(p.isr) <= set(p.replicas):
            raise _reject(r, f"{name}: isr {list(p.isr)} must be a non-empty distinct subset "
                             f"of replicas {list(p.replicas)}")
        if not set(p.adding) <= set(p.replicas) or not set(p.removing) <= set(p.replicas) \
                or set(p.adding) & set(p.removing):
            raise _reject(r, f"{name}: adding {list(p.adding)} and removing "
                             f"{list(p.removing)} must be disjoint subsets of replicas")
        old_replicas = set(old.replicas) if old else set()
        for b in p.replicas:
            if b not in old_replicas and b not in self._brokers:
                raise _reject(r, f"{name}: replica {b} is not a registered broker")
        old_isr = set(old.isr) if old else set()
        for b in p.isr:
            if b not in old_isr and old is not None and not self.is_unfenced(b):
                raise _reject(r, f"{name}: broker {b} is fenced or unknown; "
                                 f"it cannot join the ISR")
        if p.leader is not None:
            if p.leader not in p.isr:
                raise _reject(r, f"{name}: leader {p.leader} is not in isr {list(p.isr)}")
            changed = old is None or old.leader != p.leader
            if changed and not self.is_unfenced(p.leader):
                raise _reject(r, f"{name}: leader {p.leader} is fenced or unknown")
        if old is not None:
            assert p.leader_epoch >= old.leader_epoch
            assert p.partition_epoch > old.partition_epoch

    def _delete_topic(self, r: DeleteTopic) -> None:
        topic = self._topics.get(r.name)
        if topic is None:
            raise _reject(r, f"unknown topic {r.name!r}")
        if topic.topic_id != r.topic_id:
            raise _reject(r, f"topic {r.name!r} has id {topic.topic_id!r}, not {r.topic_id!r}")
        del self._topics[r.name]
        for p in self._partitions.pop(r.name):
            self._track(p, -1)

    def _config_change(self, r: ConfigChange | AlterTopicConfig) -> None:
        topic = self._topics.get(r.topic)
        if topic is None:
            raise _reject(r, f"unknown topic {r.topic!r}")
        changes = r.changes if isinstance(r, AlterTopicConfig) else {r.key: r.value}
        try:
            config = apply_config_changes(topic.config, changes)
        except InvalidFieldError as exc:
            raise _reject(r, str(exc)) from None
        self._topics[r.topic] = replace(topic, config=config,
                                        ever_under_write=topic.ever_under_write or config.durability == "write")

    def _alter_cluster_config(self, r: AlterClusterConfig) -> None:
        try:
            self._cluster_config = apply_cluster_config_changes(self._cluster_config, r.changes)
        except InvalidFieldError as exc:
            raise _reject(r, str(exc)) from None

    def _producer_id_block(self, r: ProducerIdBlock) -> None:
        if r.broker_id not in self._brokers:
            raise _reject(r, f"broker {r.broker_id} is not registered")
        if r.first_id != self._producer_id_next:
            raise _reject(r, f"block starts at {r.first_id}; next free id is "
                             f"{self._producer_id_next}")
        self._producer_id_next = r.first_id + r.size

    def _noop(self, r: NoOp) -> None:
        pass

    # ---- serialisation ---------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The whole image as plain JSON types."""
        return {**self._head_dict(),
                "topics": [_topic_to_dict(self._topics[n], self._partitions[n]) for n in sorted(self._topics)]}

    def _head_dict(self) -> dict[str, Any]:
        """`to_dict` but the topics, which come last."""
        return {
            "version": IMAGE_FORMAT_VERSION,
            "offset": self._offset,
            "producer_id_next": self._producer_id_next,
            "cluster_config": self._cluster_config.model_dump(mode="json", exclude_none=True),
            "brokers": [asdict(self._brokers[b]) for b in sorted(self._brokers)],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "MetadataImage":
        """Rebuild an image from `to_dict()` output; raises ValueError when malformed."""
        if d.get("version") != IMAGE_FORMAT_VERSION:
            raise ValueError(f"image format version {d.get('version')!r} is not "
                             f"{IMAGE_FORMAT_VERSION}")
        image = cls()
        try:
            image._offset = int(d["offset"])
            image._producer_id_next = int(d["producer_id_next"])
            image._cluster_config = ClusterConfig.model_validate(d.get("cluster_config", {}))
            for b in d["brokers"]:
                info = BrokerInfo(**b)
                image._brokers[info.broker_id] = info
            for t in d["topics"]:
                config = TopicConfig.model_validate(t["config"])
                parts = tuple(_partition_from_dict(t["name"], p) for p in t["partitions"])
                if [p.partition for p in parts] != list(range(len(parts))):
                    raise ValueError(f"topic {t['name']!r} partitions are not 0..n-1")
                image._topics[t["name"]] = TopicInfo(
                    name=t["name"], topic_id=t["topic_id"], config=config,
                    partition_count=len(parts), created_at_ms=int(t.get("created_at_ms", 0)),
                    # An image saved before the field: what the topic is now is all it can tell.
                    ever_under_write=bool(t.get("ever_under_write", config.durability == "write")))
                image._partitions[t["name"]] = parts
                for p in parts:
                    image._track(p, +1)
        except (KeyError, TypeError, ValidationError) as exc:
            raise ValueError(f"malformed image: {exc}") from exc
        return image


class ImageEncoder:
    """`json.dumps(image.to_dict())`, byte for byte, for one writer saving image after image:
    it encodes again only the topics that changed since the image it encoded last. An image
    replaces a topic's info or partitions when they change, never edits them, so an unchanged
    topic is the same objects; at 10,000 partitions a whole encoding costs 50-90 ms of CPU with
    the GIL held, and while replicas open their ISR changes come every second."""

    def __init__(self) -> None:
        self._topics: dict[str, tuple[TopicInfo, tuple[PartitionInfo, ...], str]] = {}

    def encode(self, image: "MetadataImage") -> str:
        kept: dict[str, tuple[TopicInfo, tuple[PartitionInfo, ...], str]] = {}
        for name in sorted(image._topics):
            topic, parts = image._topics[name], image._partitions[name]
            cached = self._topics.get(name)
            if cached is None or cached[0] is not topic or cached[1] is not parts:
                cached = (topic, parts, json.dumps(_topic_to_dict(topic, parts)))
            kept[name] = cached
        self._topics = kept
        head = json.dumps({**image._head_dict(), "topics": []})
        return head[:-len("[]}")] + "[" + ", ".join(c[2] for c in kept.values()) + "]}"


def _topic_to_dict(t: TopicInfo, parts: tuple[PartitionInfo, ...]) -> dict[str, Any]:
    return {
        "name": t.name,
        "topic_id": t.topic_id,
        "created_at_ms": t.created_at_ms,
        "ever_under_write": t.ever_under_write,
        "config": t.config.model_dump(mode="json"),
        "partitions": [_partition_to_dict(p) for p in parts],
    }


def _partition_to_dict(p: PartitionInfo) -> dict[str, Any]:
    return {
        "partition": p.partition,
        "replicas": list(p.replicas),
        "isr": list(p.isr),
        "leader": p.leader,
        "leader_epoch": p.leader_epoch,
        "partition_epoch": p.partition_epoch,
        "adding": list(p.adding),
        "removing": list(p.removing),
        "fenced_for_election": p.fenced_for_election,
    }


def _partition_from_dict(topic: str, p: Mapping[str, Any]) -> PartitionInfo:
    return PartitionInfo(
        topic=topic, partition=int(p["partition"]),
        replicas=tuple(int(b) for b in p["replicas"]), isr=tuple(int(b) for b in p["isr"]),
        leader=None if p["leader"] is None else int(p["leader"]),
        leader_epoch=int(p["leader_epoch"]), partition_epoch=int(p["partition_epoch"]),
        adding=tuple(int(b) for b in p.get("adding", ())),
        removing=tuple(int(b) for b in p.get("removing", ())),
        fenced_for_election=bool(p.get("fenced_for_election", False)))


_HANDLERS: dict[type, Any] = {
    RegisterBroker: MetadataImage._register_broker,
    FenceBroker: MetadataImage._fence_broker,
    UnfenceBroker: MetadataImage._unfence_broker,
    UnregisterBroker: MetadataImage._unregister_broker,
    AlterBrokerState: MetadataImage._alter_broker_state,
    CreateTopic: MetadataImage._create_topic,
    AddPartitions: MetadataImage._add_partitions,
    PartitionRecord: MetadataImage._partition_record,
    PartitionChange: MetadataImage._partition_change,
    DeleteTopic: MetadataImage._delete_topic,
    ConfigChange: MetadataImage._config_change,
    AlterTopicConfig: MetadataImage._config_change,
    AlterClusterConfig: MetadataImage._alter_cluster_config,
    ProducerIdBlock: MetadataImage._producer_id_block,
    NoOp: MetadataImage._noop,
}
