"""Plain values the core is configured with: the partition's state and its replication config.

The core takes these rather than the metadata image's types so it depends on
nothing but numbers; `from_info` / `from_topic_config` convert from the image.
"""
from __future__ import annotations

import dataclasses

from dataplane.replica.watermark import COMMIT_POLICIES, DURABILITIES

REPLICATION_MODES = ("pull", "push")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class PartitionState:
    """One partition as the controller last decided it (DESIGN.md §1 field names)."""

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
    def from_info(cls, info: object) -> "PartitionState":
        """From anything with the image's partition fields (common.metadata.image.PartitionInfo)."""
        return cls(replicas=tuple(info.replicas), isr=tuple(info.isr), leader=info.leader,  # type: ignore[attr-defined]
                   leader_epoch=info.leader_epoch, partition_epoch=info.partition_epoch,  # type: ignore[attr-defined]
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
    def from_topic_config(cls, config: object) -> "ReplicationConfig":
        """From common.metadata.config.TopicConfig (quorum_required_acks already resolved)."""
        return cls(commit_policy=config.commit_policy,  # type: ignore[attr-defined]
                   quorum_required_acks=int(config.quorum_required_acks),  # type: ignore[attr-defined]
                   min_insync_replicas=config.min_insync_replicas,  # type: ignore[attr-defined]
                   durability=config.durability,  # type: ignore[attr-defined]
                   replica_lag_time_max_ms=config.replica_lag_time_max_ms,  # type: ignore[attr-defined]
                   replication_mode=config.replication_mode)  # type: ignore[attr-defined]
