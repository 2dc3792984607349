"""Data-plane requests and responses.

Numbers and shapes follow Kafka where Kafka has the same call (so a later
Kafka listener maps them field by field); APPEND_ENTRIES is the push
replication call. Every request that names a partition carries the leader
epoch the sender believes current (-1: not known, skip the check), and every
partition-level response says which leader and epoch answered.

Record batches travel in `records` fields as opaque bytes: senders may pass
bytes, bytearray or memoryview; decoded messages hold a memoryview into the
received frame (no copy). Convert with bytes() to keep one past the frame.
"""
from __future__ import annotations

import enum
from typing import Any

from common.errors import ErrorCode, ProtocolError
from common.wire import codec
from common.wire.codec import (
    BOOL,
    BYTES,
    ERROR_CODE,
    INT8,
    INT16,
    INT32,
    INT64,
    NULLABLE_STRING,
    RECORDS,
    STRING,
    Array,
    Records,
    wire_struct,
)
from common.wire.frames import (
    BytesLike,
    RequestHeader,
    encode_frame,
    read_request_header,
    read_response_header,
    request_header_bytes,
    response_header_bytes,
)

NO_EPOCH = -1
NO_OFFSET = -1
CONSUMER_REPLICA_ID = -1
EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1


class ApiKey(enum.IntEnum):
    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    API_VERSIONS = 18
    INIT_PRODUCER_ID = 22
    # Consumer groups: Kafka's classic group protocol, field for field.
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    DELETE_GROUPS = 42
    # Outside Kafka's range: Biplane's own calls.
    APPEND_ENTRIES = 1000


class Acks(enum.IntEnum):
    NONE = 0
    LEADER = 1
    ALL = -1


# ------------------------------------------------------------------ shared parts


@wire_struct(leader_id=INT32, leader_epoch=INT32)
class LeaderIdAndEpoch:
    """Who leads a partition as far as the responder knows (-1, -1 when unknown)."""

    leader_id: int = -1
    leader_epoch: int = NO_EPOCH


NO_LEADER = LeaderIdAndEpoch()


@wire_struct(epoch=INT32, end_offset=INT64)
class EpochEndOffset:
    """Where `epoch` ended in the responder's log (-1, -1: no divergence)."""

    epoch: int = NO_EPOCH
    end_offset: int = NO_OFFSET


NO_DIVERGENCE = EpochEndOffset()


# ----------------------------------------------------------------------- PRODUCE


@wire_struct(partition=INT32, current_leader_epoch=INT32, records=RECORDS)
class ProducePartition:
    partition: int
    current_leader_epoch: int = NO_EPOCH
    records: Records | None = b""


@wire_struct(topic=STRING, partitions=Array(ProducePartition))
class ProduceTopic:
    topic: str
    partitions: tuple[ProducePartition, ...] = ()


@wire_struct(acks=INT16, timeout_ms=INT32, topics=Array(ProduceTopic))
class ProduceRequest:
    """acks: 0 none (no response is sent), 1 leader, -1 all."""

    acks: int = Acks.ALL
    timeout_ms: int = 30_000
    topics: tuple[ProduceTopic, ...] = ()


@wire_struct(partition=INT32, error_code=ERROR_CODE, base_offset=INT64, log_append_time=INT64,
             log_start_offset=INT64, current_leader=LeaderIdAndEpoch, error_message=NULLABLE_STRING)
class ProducePartitionResponse:
    partition: int
    error_code: ErrorCode = ErrorCode.NONE
    base_offset: int = NO_OFFSET
    log_append_time: int = -1
    log_start_offset: int = NO_OFFSET
    current_leader: LeaderIdAndEpoch = NO_LEADER
    error_message: str | None = None


@wire_struct(topic=STRING, partitions=Array(ProducePartitionResponse))
class ProduceTopicResponse:
    topic: str
    partitions: tuple[ProducePartitionResponse, ...] = ()


@wire_struct(topics=Array(ProduceTopicResponse), throttle_time_ms=INT32)
class ProduceResponse:
    topics: tuple[ProduceTopicResponse, ...] = ()
    throttle_time_ms: int = 0


# ------------------------------------------------------------------------- FETCH


@wire_struct(partition=INT32, current_leader_epoch=INT32, fetch_offset=INT64, last_fetched_epoch=INT32,
             log_start_offset=INT64, partition_max_bytes=INT32, flushed_offset=INT64)
class FetchPartition:
    """`last_fetched_epoch` is the epoch of the fetcher's last batch (divergence check);
    `flushed_offset` is a follower's durable end (-1 for consumers)."""

    partition: int
    current_leader_epoch: int = NO_EPOCH
    fetch_offset: int = 0
    last_fetched_epoch: int = NO_EPOCH
    log_start_offset: int = NO_OFFSET
    partition_max_bytes: int = 1024 * 1024
    flushed_offset: int = NO_OFFSET


@wire_struct(topic=STRING, partitions=Array(FetchPartition))
class FetchTopic:
    topic: str
    partitions: tuple[FetchPartition, ...] = ()


@wire_struct(topic=STRING, partitions=Array(INT32))
class ForgottenTopic:
    """Partitions an incremental fetch session stops following."""

    topic: str
    partitions: tuple[int, ...] = ()


@wire_struct(replica_id=INT32, broker_epoch=INT64, max_wait_ms=INT32, min_bytes=INT32, max_bytes=INT32,
             isolation_level=INT8, session_id=INT32, session_epoch=INT32, topics=Array(FetchTopic),
             forgotten_topics=Array(ForgottenTopic), session_epoch_out=INT32)
class FetchRequest:
    """replica_id -1 is a consumer. Sessions as in Kafka's KIP-227: session_id 0 and
    session_epoch 0 open a session, session_epoch -1 is a sessionless (full) fetch.

    A follower's sessionless fetch (Biplane's own use) names its session in `session_id` and,
    in `session_epoch_out`, the epoch of that session's last fetch sent before it, out or
    answered already (-1: none): the leader tells by these which of the two a follower sent
    first (Replica._late_fetch). Naming no partition, it asks the leader to answer that session
    fetch now, as it stands, whether it waits there already or arrives after this
    (RequestHandler._end_long_poll); one answered already ends nothing."""

    replica_id: int = CONSUMER_REPLICA_ID
    broker_epoch: int = -1
    max_wait_ms: int = 500
    min_bytes: int = 1
    max_bytes: int = 50 * 1024 * 1024
    isolation_level: int = 0
    session_id: int = 0
    session_epoch: int = -1
    topics: tuple[FetchTopic, ...] = ()
    forgotten_topics: tuple[ForgottenTopic, ...] = ()
    session_epoch_out: int = -1


@wire_struct(partition=INT32, error_code=ERROR_CODE, high_watermark=INT64, last_stable_offset=INT64,
             log_start_offset=INT64, diverging_epoch=EpochEndOffset, current_leader=LeaderIdAndEpoch,
             log_end_offset=INT64, flush_after_append=BOOL, records=RECORDS)
class FetchPartitionResponse:
    """For a follower, `log_end_offset` is the leader's (it tells a replica that restarted
    uncleanly when it has caught up) and `flush_after_append` asks it to fsync what it
    appends at once, because acks=all produce requests wait for it. Consumers ignore both."""

    partition: int
    error_code: ErrorCode = ErrorCode.NONE
    high_watermark: int = NO_OFFSET
    last_stable_offset: int = NO_OFFSET
    log_start_offset: int = NO_OFFSET
    diverging_epoch: EpochEndOffset = NO_DIVERGENCE
    current_leader: LeaderIdAndEpoch = NO_LEADER
    log_end_offset: int = NO_OFFSET
    flush_after_append: bool = False
    records: Records | None = b""


@wire_struct(topic=STRING, partitions=Array(FetchPartitionResponse))
class FetchTopicResponse:
    topic: str
    partitions: tuple[FetchPartitionResponse, ...] = ()


@wire_struct(error_code=ERROR_CODE, session_id=INT32, topics=Array(FetchTopicResponse), throttle_time_ms=INT32)
class FetchResponse:
    error_code: ErrorCode = ErrorCode.NONE
    session_id: int = 0
    topics: tuple[FetchTopicResponse, ...] = ()
    throttle_time_ms: int = 0


# ------------------------------------------------------------------ LIST_OFFSETS


@wire_struct(partition=INT32, current_leader_epoch=INT32, timestamp=INT64)
class ListOffsetsPartition:
    """timestamp -2: earliest offset, -1: latest, otherwise the first offset at or after that time."""

    partition: int
    current_leader_epoch: int = NO_EPOCH
    timestamp: int = LATEST_TIMESTAMP


@wire_struct(topic=STRING, partitions=Array(ListOffsetsPartition))
class ListOffsetsTopic:
    topic: str
    partitions: tuple[ListOffsetsPartition, ...] = ()


@wire_struct(replica_id=INT32, isolation_level=INT8, topics=Array(ListOffsetsTopic))
class ListOffsetsRequest:
    replica_id: int = CONSUMER_REPLICA_ID
    isolation_level: int = 0
    topics: tuple[ListOffsetsTopic, ...] = ()


@wire_struct(partition=INT32, error_code=ERROR_CODE, timestamp=INT64, offset=INT64, leader_epoch=INT32)
class ListOffsetsPartitionResponse:
    partition: int
    error_code: ErrorCode = ErrorCode.NONE
    timestamp: int = -1
    offset: int = NO_OFFSET
    leader_epoch: int = NO_EPOCH


@wire_struct(topic=STRING, partitions=Array(ListOffsetsPartitionResponse))
class ListOffsetsTopicResponse:
    topic: str
    partitions: tuple[ListOffsetsPartitionResponse, ...] = ()


@wire_struct(topics=Array(ListOffsetsTopicResponse))
class ListOffsetsResponse:
    topics: tuple[ListOffsetsTopicResponse, ...] = ()


# ---------------------------------------------------------------------- METADATA


@wire_struct(topics=Array(STRING, nullable=True))
class MetadataRequest:
    """topics None asks for every topic."""

    topics: tuple[str, ...] | None = None


@wire_struct(node_id=INT32, host=STRING, port=INT32, rack=NULLABLE_STRING)
class MetadataBroker:
    node_id: int
    host: str
    port: int
    rack: str | None = None


@wire_struct(partition=INT32, error_code=ERROR_CODE, leader_id=INT32, leader_epoch=INT32,
             replicas=Array(INT32), isr=Array(INT32), offline_replicas=Array(INT32))
class MetadataPartition:
    partition: int
    error_code: ErrorCode = ErrorCode.NONE
    leader_id: int = -1
    leader_epoch: int = NO_EPOCH
    replicas: tuple[int, ...] = ()
    isr: tuple[int, ...] = ()
    offline_replicas: tuple[int, ...] = ()


@wire_struct(topic=STRING, error_code=ERROR_CODE, partitions=Array(MetadataPartition))
class MetadataTopic:
    topic: str
    error_code: ErrorCode = ErrorCode.NONE
    partitions: tuple[MetadataPartition, ...] = ()


@wire_struct(brokers=Array(MetadataBroker), controller_id=INT32, metadata_offset=INT64,
             topics=Array(MetadataTopic))
class MetadataResponse:
    """metadata_offset: the metadata log offset the answering broker's image reflects."""

    brokers: tuple[MetadataBroker, ...] = ()
    controller_id: int = -1
    metadata_offset: int = NO_OFFSET
    topics: tuple[MetadataTopic, ...] = ()


# ---------------------------------------------------------------- APPEND_ENTRIES


@wire_struct(leader_id=INT32, follower_id=INT32, leader_epoch=INT32, topic=STRING, partition=INT32,
             prev_log_offset=INT64, prev_log_epoch=INT32, high_watermark=INT64, log_start_offset=INT64,
             flush_after_append=BOOL, records=RECORDS, log_end_offset=INT64, truncate_epoch=INT32,
             truncate_end_offset=INT64)
class AppendEntriesRequest:
    """Push replication, leader to follower.

    `records` (possibly empty: a heartbeat carrying the HW) start right after
    `prev_log_offset`, whose batch the leader wrote in `prev_log_epoch`;
    prev_log_offset -1 means the records start the log. The follower appends
    only if its own entry at prev_log_offset has that epoch.
    `flush_after_append` asks the follower to fsync before answering.
    """

    leader_id: int
    follower_id: int
    leader_epoch: int
    topic: str
    partition: int
    prev_log_offset: int = NO_OFFSET
    prev_log_epoch: int = NO_EPOCH
    high_watermark: int = NO_OFFSET
    log_start_offset: int = NO_OFFSET
    flush_after_append: bool = False
    records: Records | None = b""
    # The leader's log end, and (records empty) where the follower's last epoch ends on the
    # leader when it diverged: truncate there, by the same rule as a diverging fetch answer.
    log_end_offset: int = NO_OFFSET
    truncate_epoch: int = NO_EPOCH
    truncate_end_offset: int = NO_OFFSET


@wire_struct(follower_id=INT32, leader_epoch=INT32, topic=STRING, partition=INT32, error_code=ERROR_CODE,
             log_end_offset=INT64, flushed_offset=INT64, last_epoch=INT32, diverging_epoch=EpochEndOffset,
             match_offset=INT64)
class AppendEntriesResponse:
    """`leader_epoch` is the follower's current epoch (newer than the request's: the
    sender is fenced). On a mismatch at prev_log_offset, `diverging_epoch` names the
    follower's last epoch ≤ prev_log_epoch and where it ends, so the leader can
    back up in one step."""

    follower_id: int
    leader_epoch: int
    topic: str
    partition: int
    error_code: ErrorCode = ErrorCode.NONE
    log_end_offset: int = NO_OFFSET
    flushed_offset: int = NO_OFFSET
    last_epoch: int = NO_EPOCH
    diverging_epoch: EpochEndOffset = NO_DIVERGENCE
    match_offset: int = NO_OFFSET  # end of the follower's prefix verified equal to the leader's


# ------------------------------------------------------------------ API_VERSIONS


@wire_struct()
class ApiVersionsRequest:
    pass


@wire_struct(api_key=INT16, min_version=INT16, max_version=INT16)
class ApiVersion:
    api_key: int
    min_version: int = 0
    max_version: int = 0


@wire_struct(error_code=ERROR_CODE, api_keys=Array(ApiVersion))
class ApiVersionsResponse:
    error_code: ErrorCode = ErrorCode.NONE
    api_keys: tuple[ApiVersion, ...] = ()


# -------------------------------------------------------------- INIT_PRODUCER_ID


@wire_struct(producer_id=INT64, producer_epoch=INT16, transaction_timeout_ms=INT32)
class InitProducerIdRequest:
    """producer_id -1 asks for a fresh id; an id with its epoch asks to bump that epoch."""

    producer_id: int = -1
    producer_epoch: int = -1
    transaction_timeout_ms: int = 60_000


@wire_struct(error_code=ERROR_CODE, producer_id=INT64, producer_epoch=INT16)
class InitProducerIdResponse:
    error_code: ErrorCode = ErrorCode.NONE
    producer_id: int = -1
    producer_epoch: int = -1


# ------------------------------------------------------------------ consumer groups
# Kafka's classic group protocol (FindCoordinator v2, JoinGroup v5, SyncGroup v3,
# Heartbeat v3, LeaveGroup v3, OffsetCommit v7, OffsetFetch v5, DescribeGroups v4,
# ListGroups v2, DeleteGroups v1 without throttle times), so the coordinator serves
# Biplane's clients and Kafka's alike and both can share a group. Protocol metadata and
# assignments are opaque bytes here, as in Kafka (for protocol_type "consumer": Kafka's
# ConsumerProtocolSubscription and ConsumerProtocolAssignment).

GROUP_KEY_TYPE = 0   # FindCoordinator key_type: a group (1 would be a transaction)


@wire_struct(key=STRING, key_type=INT8)
class FindCoordinatorRequest:
    key: str
    key_type: int = GROUP_KEY_TYPE


@wire_struct(error_code=ERROR_CODE, error_message=NULLABLE_STRING, node_id=INT32, host=STRING, port=INT32)
class FindCoordinatorResponse:
    error_code: ErrorCode = ErrorCode.NONE
    error_message: str | None = None
    node_id: int = -1
    host: str = ""
    port: int = -1


@wire_struct(name=STRING, metadata=BYTES)
class JoinGroupProtocol:
    name: str
    metadata: bytes = b""


@wire_struct(group_id=STRING, session_timeout_ms=INT32, rebalance_timeout_ms=INT32, member_id=STRING,
             group_instance_id=NULLABLE_STRING, protocol_type=STRING, protocols=Array(JoinGroupProtocol),
             client_id=STRING)
class JoinGroupRequest:
    """member_id "" on a first join: the coordinator answers MEMBER_ID_REQUIRED with the id to
    join with (KIP-394). `client_id` travels in Kafka's request header; here in the body."""

    group_id: str
    session_timeout_ms: int = 45_000
    rebalance_timeout_ms: int = 300_000
    member_id: str = ""
    group_instance_id: str | None = None
    protocol_type: str = "consumer"
    protocols: tuple[JoinGroupProtocol, ...] = ()
    client_id: str = ""


@wire_struct(member_id=STRING, group_instance_id=NULLABLE_STRING, metadata=BYTES)
class JoinGroupMember:
    member_id: str
    group_instance_id: str | None = None
    metadata: bytes = b""


@wire_struct(error_code=ERROR_CODE, generation_id=INT32, protocol_name=NULLABLE_STRING, leader=STRING,
             member_id=STRING, members=Array(JoinGroupMember))
class JoinGroupResponse:
    """`members` is filled for the leader only: it computes the assignment."""

    error_code: ErrorCode = ErrorCode.NONE
    generation_id: int = -1
    protocol_name: str | None = None
    leader: str = ""
    member_id: str = ""
    members: tuple[JoinGroupMember, ...] = ()


@wire_struct(member_id=STRING, assignment=BYTES)
class SyncGroupAssignment:
    member_id: str
    assignment: bytes = b""


@wire_struct(group_id=STRING, generation_id=INT32, member_id=STRING, group_instance_id=NULLABLE_STRING,
             assignments=Array(SyncGroupAssignment))
class SyncGroupRequest:
    """The leader sends every member's assignment; the others send none."""

    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: str | None = None
    assignments: tuple[SyncGroupAssignment, ...] = ()


@wire_struct(error_code=ERROR_CODE, assignment=BYTES)
class SyncGroupResponse:
    error_code: ErrorCode = ErrorCode.NONE
    assignment: bytes = b""


@wire_struct(group_id=STRING, generation_id=INT32, member_id=STRING, group_instance_id=NULLABLE_STRING)
class HeartbeatRequest:
    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: str | None = None


@wire_struct(error_code=ERROR_CODE)
class HeartbeatResponse:
    error_code: ErrorCode = ErrorCode.NONE


@wire_struct(member_id=STRING, group_instance_id=NULLABLE_STRING)
class LeaveGroupMember:
    member_id: str
    group_instance_id: str | None = None


@wire_struct(group_id=STRING, members=Array(LeaveGroupMember))
class LeaveGroupRequest:
    group_id: str
    members: tuple[LeaveGroupMember, ...] = ()


@wire_struct(member_id=STRING, group_instance_id=NULLABLE_STRING, error_code=ERROR_CODE)
class LeaveGroupMemberResponse:
    member_id: str
    group_instance_id: str | None = None
    error_code: ErrorCode = ErrorCode.NONE


@wire_struct(error_code=ERROR_CODE, members=Array(LeaveGroupMemberResponse))
class LeaveGroupResponse:
    error_code: ErrorCode = ErrorCode.NONE
    members: tuple[LeaveGroupMemberResponse, ...] = ()


@wire_struct(partition=INT32, committed_offset=INT64, committed_leader_epoch=INT32,
             committed_metadata=NULLABLE_STRING)
class OffsetCommitPartition:
    partition: int
    committed_offset: int
    committed_leader_epoch: int = NO_EPOCH
    committed_metadata: str | None = None


@wire_struct(topic=STRING, partitions=Array(OffsetCommitPartition))
class OffsetCommitTopic:
    topic: str
    partitions: tuple[OffsetCommitPartition, ...] = ()


@wire_struct(group_id=STRING, generation_id=INT32, member_id=STRING, group_instance_id=NULLABLE_STRING,
             topics=Array(OffsetCommitTopic))
class OffsetCommitRequest:
    """generation_id -1 and member_id "": a commit from outside the group (an operator's
    reset, or a consumer with manual assignment), accepted only while the group is empty."""

    group_id: str
    generation_id: int = -1
    member_id: str = ""
    group_instance_id: str | None = None
    topics: tuple[OffsetCommitTopic, ...] = ()


@wire_struct(partition=INT32, error_code=ERROR_CODE)
class OffsetCommitPartitionResponse:
    partition: int
    error_code: ErrorCode = ErrorCode.NONE


@wire_struct(topic=STRING, partitions=Array(OffsetCommitPartitionResponse))
class OffsetCommitTopicResponse:
    topic: str
    partitions: tuple[OffsetCommitPartitionResponse, ...] = ()


@wire_struct(topics=Array(OffsetCommitTopicResponse))
class OffsetCommitResponse:
    topics: tuple[OffsetCommitTopicResponse, ...] = ()


@wire_struct(topic=STRING, partitions=Array(INT32))
class OffsetFetchTopic:
    topic: str
    partitions: tuple[int, ...] = ()


@wire_struct(group_id=STRING, topics=Array(OffsetFetchTopic, nullable=True))
class OffsetFetchRequest:
    """topics None: every partition the group has an offset for."""

    group_id: str
    topics: tuple[OffsetFetchTopic, ...] | None = None


@wire_struct(partition=INT32, committed_offset=INT64, committed_leader_epoch=INT32, metadata=NULLABLE_STRING,
             error_code=ERROR_CODE)
class OffsetFetchPartitionResponse:
    """committed_offset -1: nothing committed for this partition."""

    partition: int
    committed_offset: int = NO_OFFSET
    committed_leader_epoch: int = NO_EPOCH
    metadata: str | None = None
    error_code: ErrorCode = ErrorCode.NONE


@wire_struct(topic=STRING, partitions=Array(OffsetFetchPartitionResponse))
class OffsetFetchTopicResponse:
    topic: str
    partitions: tuple[OffsetFetchPartitionResponse, ...] = ()


@wire_struct(error_code=ERROR_CODE, topics=Array(OffsetFetchTopicResponse))
class OffsetFetchResponse:
    error_code: ErrorCode = ErrorCode.NONE
    topics: tuple[OffsetFetchTopicResponse, ...] = ()


@wire_struct(member_id=STRING, group_instance_id=NULLABLE_STRING, client_id=STRING, client_host=STRING,
             member_metadata=BYTES, member_assignment=BYTES)
class DescribedGroupMember:
    member_id: str
    group_instance_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    member_metadata: bytes = b""
    member_assignment: bytes = b""


@wire_struct(error_code=ERROR_CODE, group_id=STRING, group_state=STRING, protocol_type=STRING,
             protocol_data=STRING, members=Array(DescribedGroupMember))
class DescribedGroup:
    """group_state: Kafka's names (Empty, PreparingRebalance, CompletingRebalance, Stable,
    Dead); protocol_data: the chosen assignor's name."""

    error_code: ErrorCode = ErrorCode.NONE
    group_id: str = ""
    group_state: str = ""
    protocol_type: str = ""
    protocol_data: str = ""
    members: tuple[DescribedGroupMember, ...] = ()


@wire_struct(groups=Array(STRING))
class DescribeGroupsRequest:
    groups: tuple[str, ...] = ()


@wire_struct(groups=Array(DescribedGroup))
class DescribeGroupsResponse:
    groups: tuple[DescribedGroup, ...] = ()


@wire_struct(states_filter=Array(STRING))
class ListGroupsRequest:
    """Asked of every broker: each lists the groups it coordinates. Empty filter: all states."""

    states_filter: tuple[str, ...] = ()


@wire_struct(group_id=STRING, protocol_type=STRING, group_state=STRING)
class ListedGroup:
    group_id: str
    protocol_type: str = ""
    group_state: str = ""


@wire_struct(error_code=ERROR_CODE, groups=Array(ListedGroup))
class ListGroupsResponse:
    error_code: ErrorCode = ErrorCode.NONE
    groups: tuple[ListedGroup, ...] = ()


@wire_struct(groups=Array(STRING))
class DeleteGroupsRequest:
    """Only empty groups are deleted (NON_EMPTY_GROUP otherwise), offsets and all."""

    groups: tuple[str, ...] = ()


@wire_struct(group_id=STRING, error_code=ERROR_CODE)
class DeleteGroupsResult:
    group_id: str
    error_code: ErrorCode = ErrorCode.NONE


@wire_struct(results=Array(DeleteGroupsResult))
class DeleteGroupsResponse:
    results: tuple[DeleteGroupsResult, ...] = ()


# ---------------------------------------------------------------------- registry


REQUEST_TYPES: dict[ApiKey, type[object]] = {
    ApiKey.PRODUCE: ProduceRequest,
    ApiKey.FETCH: FetchRequest,
    ApiKey.LIST_OFFSETS: ListOffsetsRequest,
    ApiKey.METADATA: MetadataRequest,
    ApiKey.API_VERSIONS: ApiVersionsRequest,
    ApiKey.APPEND_ENTRIES: AppendEntriesRequest,
    ApiKey.INIT_PRODUCER_ID: InitProducerIdRequest,
    ApiKey.FIND_COORDINATOR: FindCoordinatorRequest,
    ApiKey.JOIN_GROUP: JoinGroupRequest,
    ApiKey.SYNC_GROUP: SyncGroupRequest,
    ApiKey.HEARTBEAT: HeartbeatRequest,
    ApiKey.LEAVE_GROUP: LeaveGroupRequest,
    ApiKey.OFFSET_COMMIT: OffsetCommitRequest,
    ApiKey.OFFSET_FETCH: OffsetFetchRequest,
    ApiKey.DESCRIBE_GROUPS: DescribeGroupsRequest,
    ApiKey.LIST_GROUPS: ListGroupsRequest,
    ApiKey.DELETE_GROUPS: DeleteGroupsRequest,
}
RESPONSE_TYPES: dict[ApiKey, type[object]] = {
    ApiKey.PRODUCE: ProduceResponse,
    ApiKey.FETCH: FetchResponse,
    ApiKey.LIST_OFFSETS: ListOffsetsResponse,
    ApiKey.METADATA: MetadataResponse,
    ApiKey.API_VERSIONS: ApiVersionsResponse,
    ApiKey.APPEND_ENTRIES: AppendEntriesResponse,
    ApiKey.INIT_PRODUCER_ID: InitProducerIdResponse,
    ApiKey.FIND_COORDINATOR: FindCoordinatorResponse,
    ApiKey.JOIN_GROUP: JoinGroupResponse,
    ApiKey.SYNC_GROUP: SyncGroupResponse,
    ApiKey.HEARTBEAT: HeartbeatResponse,
    ApiKey.LEAVE_GROUP: LeaveGroupResponse,
    ApiKey.OFFSET_COMMIT: OffsetCommitResponse,
    ApiKey.OFFSET_FETCH: OffsetFetchResponse,
    ApiKey.DESCRIBE_GROUPS: DescribeGroupsResponse,
    ApiKey.LIST_GROUPS: ListGroupsResponse,
    ApiKey.DELETE_GROUPS: DeleteGroupsResponse,
}
API_KEY_OF: dict[type, ApiKey] = {cls: key for key, cls in REQUEST_TYPES.items()}
API_KEY_OF.update({cls: key for key, cls in RESPONSE_TYPES.items()})
# Every api is at version 0 so far; a new version adds a row here and a branch
# in the codec table, never a silent reinterpretation.
SUPPORTED_VERSIONS: dict[ApiKey, tuple[int, int]] = {key: (0, 0) for key in ApiKey}


def api_versions_response() -> ApiVersionsResponse:
    return ApiVersionsResponse(api_keys=tuple(
        ApiVersion(api_key=int(key), min_version=lo, max_version=hi)
        for key, (lo, hi) in sorted(SUPPORTED_VERSIONS.items())))


def api_key_of(message: Any) -> ApiKey:
    try:
        return API_KEY_OF[type(message)]
    except KeyError:
        raise TypeError(f"{type(message).__name__} is not a wire request or response") from None


def _api(api_key: int, api_version: int, what: str) -> ApiKey:
    try:
        key = ApiKey(api_key)
    except ValueError:
        raise ProtocolError(f"{what}: unknown api_key {api_key}") from None
    low, high = SUPPORTED_VERSIONS[key]
    if not low <= api_version <= high:
        raise ProtocolError(f"{what}: {key.name} version {api_version} is not supported "
                            f"(supported {low}..{high})")
    return key


def encode_request(request: Any, *, correlation_id: int, api_version: int = 0) -> list[BytesLike]:
    """Frame parts (size prefix included) for one request; pass to writer.writelines()."""
    key = api_key_of(request)
    if type(request) is not REQUEST_TYPES[key]:
        raise TypeError(f"{type(request).__name__} is a response, not a request")
    parts: list[BytesLike] = [request_header_bytes(key, api_version, correlation_id)]
    return encode_frame(codec.encode_parts(request, parts))


def encode_response(response: Any, *, correlation_id: int) -> list[BytesLike]:
    """Frame parts (size prefix included) for one response."""
    key = api_key_of(response)
    if type(response) is not RESPONSE_TYPES[key]:
        raise TypeError(f"{type(response).__name__} is a request, not a response")
    parts: list[BytesLike] = [response_header_bytes(correlation_id)]
    return encode_frame(codec.encode_parts(response, parts))


def decode_request(payload: BytesLike) -> tuple[RequestHeader, object]:
    """Decode a request frame payload (without its size prefix)."""
    header, pos = read_request_header(payload)
    key = _api(header.api_key, header.api_version, f"request {header.correlation_id}")
    request: object = codec.decode(REQUEST_TYPES[key], payload, pos,
                           context=f"{key.name} v{header.api_version} request")
    return header, request


def decode_response(payload: BytesLike, api_key: int, api_version: int = 0) -> tuple[int, object]:
    """Decode a response payload; the caller knows the api from the correlation id."""
    correlation_id, pos = read_response_header(payload)
    key = _api(api_key, api_version, f"response {correlation_id}")
    response: object = codec.decode(RESPONSE_TYPES[key], payload, pos, context=f"{key.name} v{api_version} response")
    return correlation_id, response


__all__ = [
    "NO_EPOCH", "NO_OFFSET", "CONSUMER_REPLICA_ID", "EARLIEST_TIMESTAMP", "LATEST_TIMESTAMP",
    "ApiKey", "Acks", "LeaderIdAndEpoch", "NO_LEADER", "EpochEndOffset", "NO_DIVERGENCE",
    "ProducePartition", "ProduceTopic", "ProduceRequest",
    "ProducePartitionResponse", "ProduceTopicResponse", "ProduceResponse",
    "FetchPartition", "FetchTopic", "ForgottenTopic", "FetchRequest",
    "FetchPartitionResponse", "FetchTopicResponse", "FetchResponse",
    "ListOffsetsPartition", "ListOffsetsTopic", "ListOffsetsRequest",
    "ListOffsetsPartitionResponse", "ListOffsetsTopicResponse", "ListOffsetsResponse",
    "MetadataRequest", "MetadataBroker", "MetadataPartition", "MetadataTopic", "MetadataResponse",
    "AppendEntriesRequest", "AppendEntriesResponse",
    "ApiVersionsRequest", "ApiVersion", "ApiVersionsResponse",
    "InitProducerIdRequest", "InitProducerIdResponse",
    "GROUP_KEY_TYPE", "FindCoordinatorRequest", "FindCoordinatorResponse",
    "JoinGroupProtocol", "JoinGroupRequest", "JoinGroupMember", "JoinGroupResponse",
    "SyncGroupAssignment", "SyncGroupRequest", "SyncGroupResponse", "HeartbeatRequest", "HeartbeatResponse",
    "LeaveGroupMember", "LeaveGroupRequest", "LeaveGroupMemberResponse", "LeaveGroupResponse",
    "OffsetCommitPartition", "OffsetCommitTopic", "OffsetCommitRequest",
    "OffsetCommitPartitionResponse", "OffsetCommitTopicResponse", "OffsetCommitResponse",
    "OffsetFetchTopic", "OffsetFetchRequest", "OffsetFetchPartitionResponse", "OffsetFetchTopicResponse",
    "OffsetFetchResponse", "DescribedGroupMember", "DescribedGroup", "DescribeGroupsRequest",
    "DescribeGroupsResponse", "ListGroupsRequest", "ListedGroup", "ListGroupsResponse",
    "DeleteGroupsRequest", "DeleteGroupsResult", "DeleteGroupsResponse",
    "REQUEST_TYPES", "RESPONSE_TYPES", "SUPPORTED_VERSIONS", "api_versions_response", "api_key_of",
    "encode_request", "encode_response", "decode_request", "decode_response",
]
