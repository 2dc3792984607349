"""Kafka API requests answered by the broker's own request handler.

Each handler turns a Kafka request (a kio entity of the version the client chose)
into the broker's internal request (`common/wire/messages.py`, whose fields follow
Kafka's), asks `dataplane/broker/server.RequestHandler` — the same admission path,
cores and error codes as Biplane's own protocol — and describes the answer as plain
values that `messages.build` fits to the response schema of that version.

Produce requests reach the partitions' cores before `start` returns, so that one
connection's requests are appended in the order they came (as Kafka promises with
max.in.flight > 1 and idempotence).
"""
from __future__ import annotations

from typing import Any, Awaitable, Callable

from common.errors import ErrorCode
from common.wire import messages as wire
from dataplane.broker.server import RequestHandler
from dataplane.kafka import admin, messages, protocol
from dataplane.kafka.protocol import Request

Answer = Any  # a kio response entity, or None (acks=0 produce: no answer at all)


class KafkaRequests:
    def __init__(self, handler: RequestHandler, *, admin_port: admin.AdminPort | None = None,
                 cluster_id: str = "biplane") -> None:
        self.handler = handler
        self.cluster_id = cluster_id
        self._handlers: dict[int, Callable[[Request], Awaitable[Answer]]] = {
            protocol.FETCH: self._fetch,
            protocol.LIST_OFFSETS: self._list_offsets,
            protocol.METADATA: self._metadata,
            protocol.API_VERSIONS: self._api_versions,
            protocol.INIT_PRODUCER_ID: self._init_producer_id,
            admin.DESCRIBE_CONFIGS: self._describe_configs,
        }
        port: admin.AdminPort = admin_port if admin_port is not None else admin.NoAdminPort()
        self._handlers.update({
            admin.CREATE_TOPICS: lambda r: admin.create_topics(r, port),
            admin.DELETE_TOPICS: lambda r: admin.delete_topics(r, port),
            admin.CREATE_PARTITIONS: lambda r: admin.create_partitions(r, port),
            admin.ALTER_CONFIGS: lambda r: admin.alter_configs(r, port),
            admin.INCREMENTAL_ALTER_CONFIGS: lambda r: admin.incremental_alter_configs(r, port),
        })

    def start(self, request: Request) -> Awaitable[Answer]:
        """Begin handling now (produce: the cores have it on return); await the answer."""
        if request.api_key == protocol.PRODUCE:
            return self._start_produce(request)
        return self._handlers[request.api_key](request)

    def _response(self, request: Request, values: dict[str, Any]) -> Answer:
        return messages.build(messages.response_schema(request.api_key, request.version), values)

    # ------------------------------------------------------------ api versions

    async def _api_versions(self, request: Request) -> Answer:
        if not request.served:
            return protocol.api_versions_body(0, error_code=protocol.UNSUPPORTED_VERSION)
        return protocol.api_versions_body(request.version)

    # ------------------------------------------------------------ produce

    def _start_produce(self, request: Request) -> Awaitable[Answer]:
        body = request.body
        acks = int(body.acks)
        if body.transactional_id is not None:
            why = f"transactional id {body.transactional_id!r}: transactions are not supported"

            async def refused() -> Answer:
                if acks == 0:
                    return None
                return self._response(request, {"responses": [
                    {"name": t.name, "partition_responses": [
                        {"index": p.index, "error_code": int(ErrorCode.INVALID_REQUEST), "base_offset": -1,
                         "log_append_time": -1, "log_start_offset": -1, "error_message": why}
                        for p in t.partition_data]}
                    for t in body.topic_data]})
            return refused()
        internal = wire.ProduceRequest(acks=acks, timeout_ms=messages.field(body, "timeout"), topics=tuple(
            wire.ProduceTopic(topic=t.name, partitions=tuple(
                wire.ProducePartition(partition=p.index, records=p.records) for p in t.partition_data))
            for t in body.topic_data))
        pending = self.handler.start_produce(internal)

        async def answer() -> Answer:
            done = await pending
            if done is None:
                return None
            return self._response(request, {"responses": [
                {"name": t.topic, "partition_responses": [
                    {"index": p.partition, "error_code": int(p.error_code), "base_offset": p.base_offset,
                     "log_append_time": -1, "log_start_offset": p.log_start_offset,
                     "error_message": p.error_message} for p in t.partitions]}
                for t in done.topics], "throttle_time": 0})
        return answer()

    # ------------------------------------------------------------ fetch

    async def _fetch(self, request: Request) -> Answer:
        body = request.body
        internal = wire.FetchRequest(
            replica_id=wire.CONSUMER_REPLICA_ID,  # a Kafka client is never a replica here
            max_wait_ms=messages.field(body, "max_wait"), min_bytes=body.min_bytes,
            max_bytes=messages.field(body, "max_bytes", 50 * 1024 * 1024),
            isolation_level=messages.field(body, "isolation_level", 0),
            topics=tuple(wire.FetchTopic(topic=t.topic, partitions=tuple(
                wire.FetchPartition(partition=p.partition,
                                    current_leader_epoch=messages.field(p, "current_leader_epoch", -1),
                                    fetch_offset=p.fetch_offset,
                                    partition_max_bytes=p.partition_max_bytes)
                for p in t.partitions)) for t in body.topics))
        done = await self.handler.fetch(internal)
        return self._response(request, {
            "throttle_time": 0, "error_code": 0, "session_id": 0,
            "responses": [{"topic": t.topic, "partitions": [
                {"partition_index": p.partition, "error_code": int(p.error_code),
                 "high_watermark": p.high_watermark,
                 # No transactions: everything below the HW is stable.
                 "last_stable_offset": p.high_watermark, "log_start_offset": p.log_start_offset,
                 "aborted_transactions": [], "preferred_read_replica": -1, "records": p.records or b""}
                for p in t.partitions]} for t in done.topics]})

    # ------------------------------------------------------------ list offsets

    async def _list_offsets(self, request: Request) -> Answer:
        body = request.body
        internal = wire.ListOffsetsRequest(topics=tuple(
            wire.ListOffsetsTopic(topic=t.name, partitions=tuple(
                wire.ListOffsetsPartition(partition=p.partition_index, timestamp=p.timestamp,
                                          current_leader_epoch=messages.field(p, "current_leader_epoch", -1))
                for p in t.partitions)) for t in body.topics))
        done = self.handler.list_offsets(internal)
        return self._response(request, {"throttle_time": 0, "topics": [
            {"name": t.topic, "partitions": [
                {"partition_index": p.partition, "error_code": int(p.error_code), "timestamp": p.timestamp,
                 "offset": p.offset, "leader_epoch": p.leader_epoch} for p in t.partitions]}
            for t in done.topics]})

    # ------------------------------------------------------------ metadata

    async def _metadata(self, request: Request) -> Answer:
        body = request.body
        topics = body.topics
        names = None if topics is None or (request.version == 0 and not topics) else tuple(t.name for t in topics)
        done = self.handler.metadata(wire.MetadataRequest(topics=names))
        image = self.handler.image()
        brokers = [{"node_id": b.broker_id, "host": b.host, "port": b.kafka_port, "rack": b.rack}
                   for b in sorted(image.brokers.values(), key=lambda b: b.broker_id)
                   if not b.fenced and b.kafka_port is not None]
        return self._response(request, {
            "throttle_time": 0, "brokers": brokers, "cluster_id": self.cluster_id,
            # A live broker, never -1 (clients take -1 for "no controller" and some wait).
            "controller_id": self.handler.broker_id,
            "topics": [{"error_code": int(t.error_code), "name": t.topic, "is_internal": False,
                        "partitions": [{"error_code": int(p.error_code), "partition_index": p.partition,
                                        "leader_id": p.leader_id, "leader_epoch": p.leader_epoch,
                                        "replica_nodes": p.replicas, "isr_nodes": p.isr,
                                        "offline_replicas": p.offline_replicas} for p in t.partitions],
                        "topic_authorized_operations": -2147483648}
                       for t in done.topics],
            "cluster_authorized_operations": -2147483648})

    async def _describe_configs(self, request: Request) -> Answer:
        return admin.describe_configs(request, self.handler.image())

    # ------------------------------------------------------------ producer ids

    async def _init_producer_id(self, request: Request) -> Answer:
        body = request.body
        if body.transactional_id is not None:
            return self._response(request, {"throttle_time": 0, "error_code": int(ErrorCode.INVALID_REQUEST),
                                            "producer_id": -1, "producer_epoch": -1})
        done = await self.handler.init_producer_id(wire.InitProducerIdRequest(
            producer_id=messages.field(body, "producer_id", -1),
            producer_epoch=messages.field(body, "producer_epoch", -1)))
        return self._response(request, {"throttle_time": 0, "error_code": int(done.error_code),
                                        "producer_id": done.producer_id, "producer_epoch": done.producer_epoch})
