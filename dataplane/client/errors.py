"""The errors the client SDK raises, re-exported from common/errors.py (the one hierarchy).
Each carries an ErrorCode and its `retriable` / `invalid_metadata` flags, so callers can
decide without matching on classes."""
from common.errors import (
    AdminError,
    BiplaneError,
    BrokerResponseError,
    BufferFullTimeoutError,
    ClientClosedError,
    ClientError,
    DeliveryTimeoutError,
    ErrorCode,
    GroupError,
    NoBrokersError,
    NoClusterError,
    OffsetCommitError,
    OutcomeUnknownError,
    UnknownTopicError,
    error_for,
)

__all__ = [
    "AdminError", "BiplaneError", "BrokerResponseError", "BufferFullTimeoutError",
    "ClientClosedError", "ClientError", "DeliveryTimeoutError", "ErrorCode", "GroupError", "NoBrokersError",
    "NoClusterError", "OffsetCommitError", "OutcomeUnknownError", "UnknownTopicError", "error_for",
]
