"""How many partitions a topic and the cluster may hold (`biplane controller` flags).

Every partition replica costs its broker files, memory and a replication task, and every
partition costs the controller records it keeps and sends. Without a bound, a script or a
fuzzer that creates topics in a loop grows the metadata until the controller misses its
Raft heartbeats and the brokers miss their sessions. The bounds:

- per topic: `max_partitions_per_topic` partitions (Kafka has no such limit; Redpanda
  bounds a topic by its cores);
- cluster-wide: `max_partitions_per_broker` partition replicas for each registered
  broker, as Kafka's KIP-578 `max.broker.partitions` and Redpanda's
  `topic_partitions_per_shard` bound them. Fenced brokers count: one that restarts does
  not shrink the room.

Refusals are `InvalidPartitionsError` (INVALID_PARTITIONS on the Kafka wire, 400 over
HTTP) naming the limit, the value asked and the flag that raises it.
"""
from __future__ import annotations

from dataclasses import dataclass

from common.errors import InvalidPartitionsError
from common.metadata.config import PARTITIONS_MAX
from common.metadata.image import MetadataImage

MAX_PARTITIONS_PER_TOPIC = 1000
MAX_PARTITIONS_PER_BROKER = 1000


@dataclass(frozen=True, kw_only=True)
class PartitionLimits:
    max_partitions_per_topic: int = MAX_PARTITIONS_PER_TOPIC
    max_partitions_per_broker: int = MAX_PARTITIONS_PER_BROKER

    def __post_init__(self) -> None:
        if not 1 <= self.max_partitions_per_topic <= PARTITIONS_MAX:
            raise ValueError(f"max_partitions_per_topic must be in 1..{PARTITIONS_MAX}, "
                             f"got {self.max_partitions_per_topic}")
        if self.max_partitions_per_broker < 1:
            raise ValueError(f"max_partitions_per_broker must be >= 1, got {self.max_partitions_per_broker}")

    def cluster_replicas_max(self, image: MetadataImage) -> int:
        return self.max_partitions_per_broker * max(1, len(image.brokers))


def check_partitions(image: MetadataImage, limits: PartitionLimits, *, topic: str, total: int,
                     added: int, replication_factor: int, current: int = 0) -> None:
    """Refuse a topic of `total` partitions, `added` of them new (`current` there already),
    each `replication_factor` replicas, when it breaks a limit."""
    per_topic = limits.max_partitions_per_topic
    if total > per_topic:
        if not current:
            ask = f"ask for at most {per_topic}"
        elif current < per_topic:
            ask = f"ask for {current + 1}..{per_topic}"
        else:
            ask = f"it has {current} already, so none can be added"
        raise InvalidPartitionsError(
            f"partitions {total} for topic '{topic}' is above the limit of {per_topic} partitions per "
            f"topic: {ask}, or start the controllers with a larger --max-partitions-per-topic "
            f"(at most {PARTITIONS_MAX})", field="partitions", value=total)
    held = image.replica_total()  # kept by the image: no scan of every partition per create
    wanted = added * replication_factor
    ceiling = limits.cluster_replicas_max(image)
    if held + wanted > ceiling:
        brokers = max(1, len(image.brokers))
        room = max(0, ceiling - held) // max(1, replication_factor)
        raise InvalidPartitionsError(
            f"adding {added} partitions x replication factor {replication_factor} to topic '{topic}' "
            f"would bring the cluster to {held + wanted} partition replicas, above its limit of "
            f"{ceiling} ({limits.max_partitions_per_broker} per broker x {brokers} registered "
            f"broker{'s' if brokers != 1 else ''}, --max-partitions-per-broker): it holds {held}, so "
            f"at most {room} more partitions of this replication factor fit; delete topics, add "
            f"brokers, or start the controllers with a larger --max-partitions-per-broker",
            field="partitions", value=total)
