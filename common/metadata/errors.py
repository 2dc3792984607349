"""Typed errors of the metadata layer and of the controller's decisions.

Blame decides the class: `InvalidFieldError` and its subclasses mean the caller
sent a bad value (the message names the field, the value and what is allowed);
`StaleEpochError` means the caller acted on an old view and should refresh;
`RecordRejected` means a record does not apply to the image it was applied to.
"""
from __future__ import annotations

from typing import Any

from common.errors import BiplaneError, ErrorCode, InvalidRequestError


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


class UnknownBrokerError(InvalidFieldError):
    """A request names a broker id that is not registered."""

    def __init__(self, broker_id: int, *, field: str = "broker_id") -> None:
        super().__init__(f"broker {broker_id} is not registered", field=field, value=broker_id)
        self.broker_id = broker_id


class StaleBrokerError(BiplaneError):
    """A broker spoke with an incarnation the controller no longer knows: it must re-register."""

    code = ErrorCode.STALE_BROKER_EPOCH

    def __init__(self, broker_id: int, *, expected: str | None, actual: str) -> None:
        super().__init__(f"broker {broker_id} incarnation {actual!r} is stale; "
                         f"current is {expected!r}: register again")
        self.broker_id = broker_id
        self.expected = expected
        self.actual = actual


class StaleEpochError(BiplaneError):
    """An epoch in a request is not the current one. Carries both values.

    `field` is "leader_epoch" (code FENCED_LEADER_EPOCH when older,
    UNKNOWN_LEADER_EPOCH when newer) or "partition_epoch" (INVALID_UPDATE_VERSION).
    """

    def __init__(self, *, field: str, expected: int, actual: int, what: str,
                 code: ErrorCode) -> None:
        super().__init__(f"{what}: {field} {actual} is not current (current is {expected}); "
                         f"refresh metadata and retry", code=code)
        self.field = field
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
    """A record does not apply to this image (unknown topic, stale epoch, ...).

    The image is left unchanged and the record takes no offset, so every
    replica of the state machine skips it the same way.
    """

    code = ErrorCode.INVALID_REQUEST

    def __init__(self, record_type: str, reason: str) -> None:
        super().__init__(f"{record_type} rejected: {reason}")
        self.record_type = record_type
        self.reason = reason
