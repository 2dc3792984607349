"""A group and its members as the coordinator core keeps them (mutable, the core's own).

States are Kafka's: Empty (no members; offsets may remain), PreparingRebalance (members
are rejoining), CompletingRebalance (joined; waiting for the leader's assignment),
Stable, Dead (being deleted).
"""
from __future__ import annotations

import dataclasses
import enum


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclasses.dataclass(kw_only=True, slots=True)
class Member:
    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: tuple[tuple[str, bytes], ...]   # (name, metadata), the member's preference order
    assignment: bytes = b""
    last_heard_ms: int = 0
    join_request: int | None = None   # a JoinGroup waiting for the rebalance to complete
    sync_request: int | None = None   # a SyncGroup waiting for the leader's assignment

    def metadata_for(self, protocol: str) -> bytes:
        for name, metadata in self.protocols:
            if name == protocol:
                return metadata
        raise KeyError(f"member {self.member_id} does not support protocol {protocol!r}")

    def supports(self, names: set[str]) -> bool:
        return any(name in names for name, _ in self.protocols)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class CommittedOffset:
    offset: int
    leader_epoch: int
    metadata: str | None
    commit_ms: int


@dataclasses.dataclass(kw_only=True, slots=True)
class Group:
    group_id: str
    state: GroupState = GroupState.EMPTY
    state_since_ms: int = 0
    generation: int = 0
    protocol_type: str = ""
    protocol: str | None = None
    leader: str | None = None
    members: dict[str, Member] = dataclasses.field(default_factory=dict)
    static: dict[str, str] = dataclasses.field(default_factory=dict)      # instance id -> member id
    pending: dict[str, int] = dataclasses.field(default_factory=dict)     # KIP-394 ids -> deadline
    offsets: dict[tuple[str, int], CommittedOffset] = dataclasses.field(default_factory=dict)
    join_deadline_ms: int = 0
    initial_join: bool = False       # the first rebalance out of Empty waits out the initial delay
    rebalance_started_ms: int = 0

    def transition(self, state: GroupState, now_ms: int) -> None:
        self.state = state
        self.state_since_ms = now_ms

    def candidate_protocols(self) -> set[str]:
        """Protocols every member supports."""
        sets = [{name for name, _ in m.protocols} for m in self.members.values()]
        return set.intersection(*sets) if sets else set()

    def select_protocol(self) -> str:
        """Kafka's rule: each member votes for its most preferred candidate; most votes win
        (ties: the name first in order, so the choice is deterministic)."""
        candidates = self.candidate_protocols()
        votes: dict[str, int] = {}
        for m in self.members.values():
            choice = next(name for name, _ in m.protocols if name in candidates)
            votes[choice] = votes.get(choice, 0) + 1
        return min(votes, key=lambda name: (-votes[name], name))

    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def all_joined(self) -> bool:
        return not self.pending and all(m.join_request is not None for m in self.members.values())
