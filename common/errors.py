"""Every error Biplane raises on purpose, for brokers, controllers and clients alike.

`ErrorCode` travels on the wire (data plane) and in JSON (admin API); each code
says whether a client may retry and whether its metadata is stale. Every
exception is a `BiplaneError` carrying a code, so a handler answers any of them
the same way. The classes live here, in one hierarchy, and nowhere else: the
SDK re-exports its part (`dataplane/client/errors.py`), the log and the wire
re-export theirs. How an error looks over HTTP is the HTTP edge's business
(`controller/http_edge.py`, `http_status`), not the code's.

Blame decides the class (docs/style.md#blame-decides-the-error): the caller's
input (`InvalidRequestError`, `InvalidFieldError` naming the field), a stale
view (`StaleEpochError`, `StaleBrokerError`, naming both values), our storage
(`StorageError`), the network (`ConnectionClosedError`).
"""
from __future__ import annotations

import enum
from typing import Any


class ErrorCode(enum.IntEnum):
    # Numbers follow Kafka's where Kafka has the same error, so a later
    # Kafka-protocol listener can map them one to one.
    NONE = 0
    UNKNOWN = -1
    OFFSET_OUT_OF_RANGE = 1
    CORRUPT_MESSAGE = 2
    UNKNOWN_TOPIC_OR_PARTITION = 3
    LEADER_NOT_AVAILABLE = 5
    NOT_LEADER_OR_FOLLOWER = 6
    REQUEST_TIMED_OUT = 7
    MESSAGE_TOO_LARGE = 10
    NETWORK_EXCEPTION = 13
    NOT_CONTROLLER = 41
    INVALID_REQUEST = 42
    UNSUPPORTED_VERSION = 35
    INVALID_TOPIC = 17
    RECORD_LIST_TOO_LARGE = 18
    NOT_ENOUGH_REPLICAS = 19
    NOT_ENOUGH_REPLICAS_AFTER_APPEND = 20
    INVALID_REQUIRED_ACKS = 21
    TOPIC_ALREADY_EXISTS = 36
    INVALID_PARTITIONS = 37
    INVALID_REPLICATION_FACTOR = 38
    INVALID_CONFIG = 40
    OUT_OF_ORDER_SEQUENCE = 45
    DUPLICATE_SEQUENCE = 46
    INVALID_PRODUCER_EPOCH = 47
    KAFKA_STORAGE_ERROR = 56
    FENCED_LEADER_EPOCH = 74
    UNKNOWN_LEADER_EPOCH = 75
    UNKNOWN_PRODUCER_ID = 59
    STALE_BROKER_EPOCH = 77
    OFFSET_NOT_AVAILABLE = 78  # a new leader's HW is still below its epoch start (KIP-207)
    INVALID_RECORD = 87  # e.g. a record without a key for a compacted topic
    INVALID_UPDATE_VERSION = 95  # stale partition epoch on an ISR change
    THROTTLING_QUOTA_EXCEEDED = 89  # a write rate (Kafka's controller mutation quota) is spent
    FENCED_INSTANCE_ID = 82  # a newer member took this group.instance.id
    # Consumer groups (Kafka's numbers).
    OFFSET_METADATA_TOO_LARGE = 12
    COORDINATOR_LOAD_IN_PROGRESS = 14
    COORDINATOR_NOT_AVAILABLE = 15
    NOT_COORDINATOR = 16
    ILLEGAL_GENERATION = 22
    INCONSISTENT_GROUP_PROTOCOL = 23
    INVALID_GROUP_ID = 24
    UNKNOWN_MEMBER_ID = 25
    INVALID_SESSION_TIMEOUT = 26
    REBALANCE_IN_PROGRESS = 27
    NON_EMPTY_GROUP = 68
    GROUP_ID_NOT_FOUND = 69
    MEMBER_ID_REQUIRED = 79
    GROUP_MAX_SIZE_REACHED = 81
    # Kafka clients treat it as fatal when looking for a transaction coordinator: how Biplane,
    # which serves no transactions, stops a transactional producer at once (not a retry loop).
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
    INELIGIBLE_REPLICA = 107
    # Incremental follower fetch sessions (Kafka's KIP-227 numbers): the follower starts over
    # with a full fetch (dataplane/broker/fetch_sessions.py).
    FETCH_SESSION_ID_NOT_FOUND = 70
    INVALID_FETCH_SESSION_EPOCH = 71
    # HTTP-only answers of the admin API and the broker RPC ("UNAUTHORIZED", "NOT_FOUND")
    # are not codes: the HTTP edge sends them as plain names (controller/http_edge.py).

    @property
    def retriable(self) -> bool:
        return self in _RETRIABLE

    @property
    def invalid_metadata(self) -> bool:
        """True when the client should refresh its metadata before retrying."""
        return self in _INVALID_METADATA


_RETRIABLE = frozenset({
    ErrorCode.LEADER_NOT_AVAILABLE,
    ErrorCode.OFFSET_NOT_AVAILABLE,
    ErrorCode.NOT_LEADER_OR_FOLLOWER,
    ErrorCode.REQUEST_TIMED_OUT,
    ErrorCode.NETWORK_EXCEPTION,
    ErrorCode.NOT_CONTROLLER,
    ErrorCode.NOT_ENOUGH_REPLICAS,
    ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    ErrorCode.CORRUPT_MESSAGE,
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    ErrorCode.KAFKA_STORAGE_ERROR,
    ErrorCode.FENCED_LEADER_EPOCH,
    ErrorCode.UNKNOWN_LEADER_EPOCH,
    ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_COORDINATOR,
    ErrorCode.THROTTLING_QUOTA_EXCEEDED,
})
_INVALID_METADATA = frozenset({
    ErrorCode.LEADER_NOT_AVAILABLE,
    ErrorCode.NOT_LEADER_OR_FOLLOWER,
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    ErrorCode.FENCED_LEADER_EPOCH,
    ErrorCode.UNKNOWN_LEADER_EPOCH,
    ErrorCode.NOT_CONTROLLER,
})


class BiplaneError(Exception):
    """Base of every error Biplane raises on purpose. `code` is what goes on the wire."""

    code: ErrorCode = ErrorCode.UNKNOWN

    def __init__(self, message: str, *, code: ErrorCode | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code

    @property
    def retriable(self) -> bool:
        return self.code.retriable


# ------------------------------------------------------------- the caller's input


class InvalidRequestError(BiplaneError):
    """The caller sent something malformed or out of range; the message names the field."""

    code = ErrorCode.INVALID_REQUEST


class InvalidFieldError(InvalidRequestError):
    """A request or config field has a bad value. `field` names it, `value` holds it."""

    def __init__(self, message: str, *, field: str, value: Any = None,
                 code: ErrorCode | None = None) -> None:
        super().__init__(message, code=code)
        self.field = field
        self.value = value


class InvalidTopicError(InvalidFieldError):
    code = ErrorCode.INVALID_TOPIC


class InvalidConfigError(InvalidFieldError):
    code = ErrorCode.INVALID_CONFIG


class InvalidPartitionsError(InvalidFieldError):
    code = ErrorCode.INVALID_PARTITIONS


class InvalidReplicationFactorError(InvalidFieldError):
    code = ErrorCode.INVALID_REPLICATION_FACTOR


class UnknownBrokerError(InvalidFieldError):
    """A request names a broker id that is not registered."""

    def __init__(self, broker_id: int, *, field: str = "broker_id") -> None:
        super().__init__(f"broker {broker_id} is not registered", field=field, value=broker_id)
        self.broker_id = broker_id


class TopicExistsError(BiplaneError):
    code = ErrorCode.TOPIC_ALREADY_EXISTS

    def __init__(self, name: str) -> None:
        super().__init__(f"topic {name!r} already exists")
        self.name = name


class UnknownTopicOrPartitionError(BiplaneError):
    code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION

    def __init__(self, topic: str, partition: int | None = None) -> None:
        where = f"topic {topic!r}" if partition is None else f"partition {topic}-{partition}"
        super().__init__(f"unknown {where}")
        self.topic = topic
        self.partition = partition


# ------------------------------------------------------------------ a stale view


class StaleEpochError(InvalidRequestError):
    """An epoch is not the current one: the sender acted on another view. Names both values.

    `field` is the epoch compared: "leader_epoch" (FENCED_LEADER_EPOCH when older than
    `expected`, UNKNOWN_LEADER_EPOCH when newer) or "partition_epoch"
    (INVALID_UPDATE_VERSION). `expected` is ours, `actual` the sender's. Without a
    message, one is made from `what`. An InvalidRequestError, so that a log append
    refused for its epoch is handled like any other refused append.
    """

    code = ErrorCode.FENCED_LEADER_EPOCH

    def __init__(self, message: str | None = None, *, field: str, expected: int, actual: int,
                 what: str = "request", code: ErrorCode | None = None) -> None:
        if message is None:
            message = (f"{what}: {field} {actual} is not current (current is {expected}); "
                       f"refresh metadata and retry")
        super().__init__(message, code=code)
        self.field = field
        self.expected = expected
        self.actual = actual


class StaleBrokerError(BiplaneError):
    """A broker spoke with an incarnation the controller no longer knows: it must re-register."""

    code = ErrorCode.STALE_BROKER_EPOCH

    def __init__(self, broker_id: int, *, expected: str | None, actual: str) -> None:
        super().__init__(f"broker {broker_id} incarnation {actual!r} is stale; "
                         f"current is {expected!r}: register again")
        self.broker_id = broker_id
        self.expected = expected
        self.actual = actual


class NotLeaderError(BiplaneError):
    code = ErrorCode.NOT_LEADER_OR_FOLLOWER

    def __init__(self, *, what: str, expected: int | None, actual: int) -> None:
        super().__init__(f"{what}: broker {actual} is not the leader (leader is {expected})")
        self.expected = expected
        self.actual = actual


class IneligibleReplicaError(BiplaneError):
    code = ErrorCode.INELIGIBLE_REPLICA

    def __init__(self, message: str, *, broker_id: int) -> None:
        super().__init__(message)
        self.broker_id = broker_id


class RecordRejected(BiplaneError):
    """A metadata record does not apply to this image (unknown topic, stale epoch, ...).

    The image is left unchanged and the record takes no offset, so every
    replica of the state machine skips it the same way.
    """

    code = ErrorCode.INVALID_REQUEST

    def __init__(self, record_type: str, reason: str) -> None:
        super().__init__(f"{record_type} rejected: {reason}")
        self.record_type = record_type
        self.reason = reason


# ------------------------------------------------------- batches and the wire


class CorruptBatchError(BiplaneError):
    """A record batch failed validation: truncated, wrong magic, bad length or CRC mismatch."""

    code = ErrorCode.CORRUPT_MESSAGE


class ProtocolError(BiplaneError):
    """A peer broke the wire protocol (malformed frame, unknown api key, bad field)."""

    code = ErrorCode.INVALID_REQUEST


class FrameTooLargeError(ProtocolError):
    code = ErrorCode.MESSAGE_TOO_LARGE


class BatchFullError(BiplaneError):
    """The record does not fit in the batch under its `max_batch_bytes`."""

    code = ErrorCode.MESSAGE_TOO_LARGE


class ConnectionClosedError(BiplaneError):
    """The connection went away before the response arrived."""

    code = ErrorCode.NETWORK_EXCEPTION


class ConnectFailedError(ConnectionClosedError):
    """No connection could be made (refused, unreachable, timed out): nothing was sent on it."""


# ------------------------------------------------------------------- the log


class StorageError(BiplaneError):
    """The local log cannot serve the request (I/O error, full disk, locked log)."""

    code = ErrorCode.KAFKA_STORAGE_ERROR


class LogTruncatedError(StorageError):
    """The offset a waiter wanted flushed was truncated away before it became durable."""


class PartitionOfflineError(StorageError):
    """The partition's log failed (disk error); it serves nothing until the broker restarts."""


class OffsetOutOfRangeError(BiplaneError):
    """A read asked for an offset below log_start_offset or above log_end_offset."""

    code = ErrorCode.OFFSET_OUT_OF_RANGE

    def __init__(self, message: str, *, offset: int, log_start_offset: int, log_end_offset: int) -> None:
        super().__init__(message)
        self.offset = offset
        self.log_start_offset = log_start_offset
        self.log_end_offset = log_end_offset


class OffsetMismatchError(InvalidRequestError):
    """A follower append does not start at log_end_offset, or its batches are not contiguous."""

    def __init__(self, message: str, *, expected_offset: int, actual_offset: int) -> None:
        super().__init__(message)
        self.expected_offset = expected_offset
        self.actual_offset = actual_offset


# ------------------------------------------------------------ the controller


class NotControllerError(BiplaneError):
    """This node cannot decide now: it is not the trusted leader. Retry at `leader`."""

    code = ErrorCode.NOT_CONTROLLER
    leader: object | None = None  # the leader's ControllerNode (controller/service.py) when known


class CommitFailedError(BiplaneError):
    """A proposal did not commit here; it may or may not take effect under the next leader.

    The outcome is unknown, like a timeout: the caller should check, then retry."""

    code = ErrorCode.REQUEST_TIMED_OUT


class NotSnapshotLeaderError(BiplaneError):
    code = ErrorCode.NOT_CONTROLLER


class ControllerError(BiplaneError):
    """The controller refused a request; `field` names the request field it blames, if any.

    `code_name` is the code as the controller named it: an ErrorCode's name, or an answer
    only HTTP gives (e.g. UNAUTHORIZED), for which `code` is UNKNOWN."""

    def __init__(self, message: str, *, code: ErrorCode | None = None, field: str | None = None,
                 code_name: str | None = None) -> None:
        super().__init__(message, code=code)
        self.field = field
        self.code_name = code_name if code_name is not None else self.code.name


# ---------------------------------------------------------------- the client SDK


class ClientError(BiplaneError):
    """Base of the SDK's errors."""

    @property
    def invalid_metadata(self) -> bool:
        return self.code.invalid_metadata


class BrokerResponseError(ClientError):
    """A broker answered a partition with an error code; the message names the partition."""

    def __init__(self, message: str, *, code: ErrorCode, topic: str | None = None,
                 partition: int | None = None) -> None:
        super().__init__(message, code=code)
        self.topic = topic
        self.partition = partition


class UnknownTopicError(ClientError):
    """The cluster does not know this topic (create it first: `biplane topic create NAME`)."""

    code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION

    @property
    def retriable(self) -> bool:
        # The SDK already waited for the topic to appear; retrying the same call will not help.
        return False


class BufferFullTimeoutError(ClientError):
    """send() waited `max_block_ms` for buffer memory that in-flight records still held."""

    code = ErrorCode.REQUEST_TIMED_OUT


class DeliveryTimeoutError(ClientError):
    """A record was not acknowledged within `delivery_timeout_ms` (retries included)."""

    code = ErrorCode.REQUEST_TIMED_OUT


class OutcomeUnknownError(DeliveryTimeoutError):
    """A record was not acknowledged, and it MAY be in the log: a request carrying it went
    unanswered (request timeout, connection lost), so the producer cannot tell whether a leader
    appended it; or the leader answered DUPLICATE_SEQUENCE (it appended the record earlier but
    no longer knows its offset, and it may not be committed: a leader change can still drop it).
    The producer never sends it again under new numbers (that could write it twice).
    Read the partition to find out, or send it again yourself if a duplicate is acceptable."""

    code = ErrorCode.REQUEST_TIMED_OUT

    def __init__(self, message: str, *, code: ErrorCode = ErrorCode.REQUEST_TIMED_OUT) -> None:
        super().__init__(message, code=code)

    @property
    def outcome_unknown(self) -> bool:
        return True

    @property
    def retriable(self) -> bool:
        # Sending it again may write it twice: that is the caller's call, not a retry.
        return False


class NoBrokersError(ClientError):
    """None of the bootstrap or known brokers answered."""

    code = ErrorCode.NETWORK_EXCEPTION


class ClientClosedError(ClientError):
    """The producer or consumer was closed."""

    code = ErrorCode.INVALID_REQUEST


class GroupError(ClientError):
    """The group refused this consumer for good (another consumer took its group_instance_id,
    no assignor in common with the group, ...): `code` says which; the consumer is closed."""


class OffsetCommitError(ClientError):
    """A commit of offsets was refused. `code` says why: REBALANCE_IN_PROGRESS,
    ILLEGAL_GENERATION or UNKNOWN_MEMBER_ID mean the consumer's partitions were (or are
    being) reassigned; poll() again and commit what the new assignment holds."""

    def __init__(self, message: str, *, code: ErrorCode) -> None:
        super().__init__(message, code=code)


class NoClusterError(ClientError):
    """No address was given and no cluster.json was found."""

    code = ErrorCode.INVALID_REQUEST


class AdminError(ClientError):
    """The admin API answered an error: `code_name` is the API's code (e.g. TOPIC_ALREADY_EXISTS),
    `status` the HTTP status, `field` the request field at fault, if any."""

    def __init__(self, message: str, *, code_name: str, status: int, field: str | None = None,
                 api_retriable: bool = False) -> None:
        try:
            code = ErrorCode[code_name]
        except KeyError:
            code = ErrorCode.UNKNOWN
        super().__init__(message, code=code)
        self.code_name = code_name
        self.status = status
        self.field = field
        self.api_retriable = api_retriable

    @property
    def retriable(self) -> bool:
        return self.api_retriable

    def __str__(self) -> str:
        field = f" (field: {self.field})" if self.field else ""
        return f"{self.code_name}: {self.args[0]}{field}"


def error_for(code: ErrorCode, *, topic: str, partition: int, message: str | None = None,
              what: str = "request") -> BrokerResponseError:
    detail = f": {message}" if message else ""
    return BrokerResponseError(f"{what} for {topic}[{partition}] failed with {code.name}{detail}",
                               code=code, topic=topic, partition=partition)
