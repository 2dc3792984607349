"""Plain values the core is configured with: the partition's state and its replication config.

The core takes these rather than the metadata image's types so it depends on
nothing but numbers; `from_info` / `from_topic_config` convert from the image.
"""
from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable
from typing import Protocol

from dataplane.replica.watermark import COMMIT_POLICIES, DURABILITIES

REPLICATION_MODES = ("pull", "push")
# A quiet replica link (nothing new either way) still carries the lag rule's evidence once per
# this share of the topic's replica_lag_time_max_ms: a push leader sends an empty append-entries
# (push.py); a pull fetch session steps a quiet partition again on a grid of this share
# (dataplane/broker/server.py, _quiet_until_s). The follower's caught-up clock must never run
# out while nothing happens.
QUIET_REFRESH = 0.25


class PartitionInfoView(Protocol):
    """The image's partition fields the core takes (common.metadata.image.PartitionInfo)."""

    @property
    def replicas(self) -> Iterable[int]: ...
    @property
    def isr(self) -> Iterable[int]: ...
    @property
    def leader(self) -> int | None: ...
    @property
    def leader_epoch(self) -> int: ...
    @property
    def partition_epoch(self) -> int: ...


class TopicConfigView(Protocol):
    """The topic settings the core takes (common.metadata.config.TopicConfig)."""

    @property
    def commit_policy(self) -> str: ...
    @property
    def quorum_required_acks(self) -> int | None: ...
    @property
    def min_insync_replicas(self) -> int: ...
    @property
    def durability(self) -> str: ...
    @property
    def replica_lag_time_max_ms(self) -> int: ...
    @property
    def replication_mode(self) -> str: ...
    @property
    def effective_flush_debounce_ms(self) -> int: ...
    @property
    def compacted(self) -> bool: ...


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class PartitionState:
    """One partition as the controller last decided it (docs/design.md#metadata-records-and-image)."""

    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader: int | None
    leader_epoch: int
    partition_epoch: int
    # A quorum election in progress: no leader, epoch already bumped; replicas
    # stop serving older epochs, flush and report their flushed log.
    fenced_for_election: bool = False

    def __post_init__(self) -> None:
        if not self.replicas:
            raise ValueError("PartitionState.replicas is empty; a partition needs at least one replica")
        stray = set(self.isr) - set(self.replicas)
        if stray:
            raise ValueError(f"PartitionState.isr has {sorted(stray)} which are not in replicas {self.replicas}")
        if self.leader is not None and self.leader not in self.replicas:
            raise ValueError(f"PartitionState.leader {self.leader} is not in replicas {self.replicas}")
        if self.leader_epoch < 0 or self.partition_epoch < 0:
            raise ValueError(f"epochs must be >= 0, got leader_epoch={self.leader_epoch} "
                             f"partition_epoch={self.partition_epoch}")

    @classmethod
    def from_info(cls, info: PartitionInfoView) -> "PartitionState":
        """From anything with the image's partition fields (common.metadata.image.PartitionInfo)."""
        return cls(replicas=tuple(info.replicas), isr=tuple(info.isr), leader=info.leader,
                   leader_epoch=info.leader_epoch, partition_epoch=info.partition_epoch,
                   fenced_for_election=bool(getattr(info, "fenced_for_election", False)))


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ReplicationConfig:
    """The topic settings that decide when a record counts as committed."""

    commit_policy: str = "isr"
    quorum_required_acks: int = 2
    min_insync_replicas: int = 1
    durability: str = "fsync"
    replica_lag_time_max_ms: int = 10_000
    replication_mode: str = "pull"
    # A compacted topic (cleanup_policy has compact): compaction keeps the latest record per
    # key, so a record without one is refused at produce (INVALID_RECORD), as Kafka does.
    keys_required: bool = False
    # How long a replica gathers writes before one fsync (lazy flush); None: the replica's own
    # default (its constructor's flush_debounce_ms).
    flush_debounce_ms: int | None = None

    def __post_init__(self) -> None:
        if self.commit_policy not in COMMIT_POLICIES:
            raise ValueError(f"commit_policy {self.commit_policy!r} is not one of {COMMIT_POLICIES}")
        if self.durability not in DURABILITIES:
            raise ValueError(f"durability {self.durability!r} is not one of {DURABILITIES}")
        if self.replication_mode not in REPLICATION_MODES:
            raise ValueError(f"replication_mode {self.replication_mode!r} is not one of {REPLICATION_MODES}")
        if self.quorum_required_acks < 1 or self.min_insync_replicas < 1:
            raise ValueError(f"quorum_required_acks={self.quorum_required_acks} and "
                             f"min_insync_replicas={self.min_insync_replicas} must be >= 1")
        if self.replica_lag_time_max_ms < 1:
            raise ValueError(f"replica_lag_time_max_ms must be >= 1, got {self.replica_lag_time_max_ms}")

    @classmethod
    def from_topic_config(cls, config: TopicConfigView) -> "ReplicationConfig":
        """From common.metadata.config.TopicConfig (quorum_required_acks already resolved)."""
        quorum_required_acks = config.quorum_required_acks
        if quorum_required_acks is None:
            raise ValueError("quorum_required_acks is unresolved; a validated TopicConfig always sets it")
        return cls(commit_policy=config.commit_policy,
                   quorum_required_acks=int(quorum_required_acks),
                   min_insync_replicas=config.min_insync_replicas,
                   durability=config.durability,
                   replica_lag_time_max_ms=config.replica_lag_time_max_ms,
                   replication_mode=config.replication_mode,
                   keys_required=config.compacted,
                   flush_debounce_ms=config.effective_flush_debounce_ms)


class Role(enum.Enum):
    UNATTACHED = "unattached"
    LEADER = "leader"
    FOLLOWER = "follower"
    ELECTION = "election"
    STOPPED = "stopped"
