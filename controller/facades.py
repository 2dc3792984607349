"""Typed seams of the controller: what the service and its HTTP handlers may call.

`ControllerService.decisions` is the decisions facade (`controller.commands.Decisions`,
or a test double). Typed as this Protocol instead of `Any`, a handler that calls a
method the facade lacks is a type error in CI, not an AttributeError in production
(issue 12: the heartbeat handler called `fence_shutting_down`, which the facade did
not have, on every controlled shutdown).
"""
from __future__ import annotations

from typing import Protocol

from common.metadata.image import MetadataImage
from common.metadata.records import Record
from common.requests import (
    AllocateProducerIdsRequest,
    AlterConfigRequest,
    AlterIsrRequest,
    CreateTopicRequest,
    HeartbeatRequest,
    PreferredElectionRequest,
    ReassignmentRequest,
    RegisterBrokerRequest,
)
from controller.decisions import BrokerSessions, ControllerState


class DecisionsFacade(Protocol):
    """Each method is pure over its arguments and returns the records to append (in order),
    or raises a typed BiplaneError for bad input; the service decides when they run."""

    # -- leader state

    def new_state(self, *, session_timeout_ms: int) -> ControllerState: ...

    def periodic(self, image: MetadataImage, state: ControllerState, now_ms: int) -> list[Record]: ...

    # -- admin API

    def create_topic(self, image: MetadataImage, request: CreateTopicRequest, *, now_ms: int) -> list[Record]: ...

    def delete_topic(self, image: MetadataImage, name: str) -> list[Record]: ...

    def alter_config(self, image: MetadataImage, name: str, request: AlterConfigRequest) -> list[Record]: ...

    def start_reassignment(self, image: MetadataImage, request: ReassignmentRequest) -> list[Record]: ...

    def elect_preferred(self, image: MetadataImage, request: PreferredElectionRequest) -> list[Record]: ...

    # -- broker RPC

    def register_broker(self, image: MetadataImage, request: RegisterBrokerRequest, *,
                        now_ms: int) -> list[Record]: ...

    def check_heartbeat(self, image: MetadataImage, request: HeartbeatRequest) -> None: ...

    def fence_shutting_down(self, image: MetadataImage, sessions: BrokerSessions, now_ms: int) -> list[Record]: ...

    def alter_isr(self, image: MetadataImage, request: AlterIsrRequest) -> list[Record]: ...

    def elect_leaders(self, image: MetadataImage, state: ControllerState) -> list[Record]: ...

    def allocate_producer_ids(self, image: MetadataImage, request: AllocateProducerIdsRequest) -> list[Record]: ...
