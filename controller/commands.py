"""The decisions the controller service calls, in one place, with the leader's in-memory state.

Each method is pure over its arguments (the pending image, the request, `now_ms`)
and returns records, or raises a typed BiplaneError for bad input. The service
owns when they run; the decisions package owns what they decide.
"""
from __future__ import annotations

from common.metadata import MetadataImage
from common.metadata.errors import UnknownTopicOrPartitionError
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
from controller import decisions as d


class Decisions:
    def __init__(self, *, rebalance_interval_ms: int = 300_000) -> None:
        self.rebalance_interval_ms = rebalance_interval_ms

    # -- leader state

    def new_state(self, *, session_timeout_ms: int) -> d.ControllerState:
        return d.ControllerState(session_timeout_ms=session_timeout_ms,
                                 rebalance_interval_ms=self.rebalance_interval_ms)

    def periodic(self, image: MetadataImage, state: d.ControllerState, now_ms: int) -> list:
        return state.periodic(image, now_ms)

    # -- admin

    def create_topic(self, image: MetadataImage, request: CreateTopicRequest, *, now_ms: int) -> list:
        return d.create_topic(image, request, now_ms)

    def delete_topic(self, image: MetadataImage, name: str) -> list:
        if name not in image.topics:
            raise UnknownTopicOrPartitionError(name)
        return d.delete_topic(image, name)

    def alter_config(self, image: MetadataImage, name: str, request: AlterConfigRequest) -> list:
        if name not in image.topics:
            raise UnknownTopicOrPartitionError(name)
        return d.alter_config(image, name, request)

    def start_reassignment(self, image: MetadataImage, request: ReassignmentRequest) -> list:
        image.partition(request.topic, request.partition)   # 404 before anything else
        return d.start_reassignment(image, request)

    def elect_preferred(self, image: MetadataImage, request: PreferredElectionRequest) -> list:
        if request.partitions is None:
            return d.elect_preferred(image)
        wanted = []
        for ref in request.partitions:
            image.partition(ref.topic, ref.partition)
            wanted.append((ref.topic, ref.partition))
        return d.elect_preferred(image, wanted)

    # -- brokers

    def register_broker(self, image: MetadataImage, request: RegisterBrokerRequest, *, now_ms: int) -> list:
        return d.register_broker(image, request, now_ms)

    def check_heartbeat(self, image: MetadataImage, request: HeartbeatRequest) -> None:
        d.check_heartbeat(image, request)

    def alter_isr(self, image: MetadataImage, request: AlterIsrRequest) -> list:
        return d.alter_isr(image, request)

    def elect_leaders(self, image: MetadataImage, state: d.ControllerState) -> list:
        return d.elect_leaders(image, state.tracker)

    def allocate_producer_ids(self, image: MetadataImage, request: AllocateProducerIdsRequest) -> list:
        return d.allocate_producer_ids(image, request)
