"""Errors the client SDK raises. Each carries an ErrorCode and its `retriable` /
`invalid_metadata` flags, so callers can decide without matching on classes."""
from __future__ import annotations

from common.errors import BiplaneError, ErrorCode


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
    no longer knows its offset, and it may not be committed: a leader change can still drop it). The producer never sends it again under new numbers (that could write it twice).
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
