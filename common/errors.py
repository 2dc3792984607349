"""Errors shared by brokers, controllers and clients.

`ErrorCode` travels on the wire (data plane) and in JSON (admin API); each code
says whether a client may retry and whether its metadata is stale. Python
exceptions carry a code so a handler can answer any `BiplaneError` the same way.
"""
from __future__ import annotations

import enum


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
    INVALID_UPDATE_VERSION = 95  # stale partition epoch on an ISR change
    FENCED_INSTANCE = 82
    INELIGIBLE_REPLICA = 107
    UNAUTHORIZED = 401
    NOT_FOUND = 404

    @property
    def retriable(self) -> bool:
        return self in _RETRIABLE

    @property
    def invalid_metadata(self) -> bool:
        """True when the client should refresh its metadata before retrying."""
        return self in _INVALID_METADATA


_RETRIABLE = frozenset({
    ErrorCode.LEADER_NOT_AVAILABLE,
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


class InvalidRequestError(BiplaneError):
    """The caller sent something malformed or out of range; the message names the field."""

    code = ErrorCode.INVALID_REQUEST


class CorruptBatchError(BiplaneError):
    """A record batch failed validation: truncated, wrong magic, bad length or CRC mismatch."""

    code = ErrorCode.CORRUPT_MESSAGE


class ProtocolError(BiplaneError):
    """A peer broke the wire protocol (malformed frame, unknown api key, bad field)."""

    code = ErrorCode.INVALID_REQUEST


class FrameTooLargeError(ProtocolError):
    code = ErrorCode.MESSAGE_TOO_LARGE


class StorageError(BiplaneError):
    """The local log cannot serve the request (I/O error, full disk, locked log)."""

    code = ErrorCode.KAFKA_STORAGE_ERROR
