"""Kafka's framing and headers, and which APIs and versions this listener serves.

A frame is a big-endian int32 size and that many bytes: a request header (v1, or v2
for an API's flexible versions: api key, version, correlation id, client id, tagged
fields) and the request body. Answers carry the correlation id in a response header
(v0, or v1 with tagged fields; ApiVersions always v0, so that a client that asked with
a version we do not serve can still read the answer).
"""
from __future__ import annotations

import dataclasses
import struct
from typing import Any

from dataplane.kafka import admin, messages

# Kafka API keys served here.
PRODUCE, FETCH, LIST_OFFSETS, METADATA = 0, 1, 2, 3
API_VERSIONS, INIT_PRODUCER_ID = 18, 22

# (lowest, highest) version answered. Produce is advertised from 0 (old librdkafka
# enables idempotence only when it sees version 0 offered); a request below 3 (message
# formats v0/v1, which Biplane does not store) closes its connection with a WARNING.
SERVED: dict[int, tuple[int, int]] = {
    PRODUCE: (3, 8),
    FETCH: (4, 11),
    LIST_OFFSETS: (1, 5),
    METADATA: (0, 8),
    API_VERSIONS: (0, 3),
    INIT_PRODUCER_ID: (0, 1),
    **admin.SERVED,  # forwarded to the controller (dataplane/kafka/admin.py)
}
ADVERTISED: dict[int, tuple[int, int]] = {**SERVED, PRODUCE: (0, 8)}

UNSUPPORTED_VERSION = 35
_PREFIX = struct.Struct(">hhi")  # api key, api version, correlation id


class FrameError(ValueError):
    """The frame cannot be answered (too short, an unknown API, a header or body that does
    not parse): the connection is closed, as Kafka's broker does."""


@dataclasses.dataclass(frozen=True, slots=True)
class Request:
    api_key: int
    version: int
    correlation_id: int
    client_id: str | None
    body: Any          # the kio request entity; None when the version is not served
    served: bool


def peek(frame: bytes | bytearray | memoryview) -> tuple[int, int, int]:
    """(api key, version, correlation id) of a frame, FrameError if it is too short."""
    if len(frame) < _PREFIX.size:
        raise FrameError(f"a request of {len(frame)} bytes is shorter than a request header")
    api_key, version, correlation_id = _PREFIX.unpack_from(frame, 0)
    return api_key, version, correlation_id


def decode_request(frame: bytes | bytearray | memoryview) -> Request:
    api_key, version, correlation_id = peek(frame)
    if api_key not in ADVERTISED:
        raise FrameError(f"API key {api_key} (version {version}) is not served here; "
                         f"served: {sorted(ADVERTISED)}")
    low, high = ADVERTISED[api_key]
    if not low <= version <= high or not SERVED[api_key][0] <= version:
        if api_key == API_VERSIONS:
            # Kafka's rule: answer at v0 with UNSUPPORTED_VERSION and the list, never hang up.
            return Request(api_key, version, correlation_id, None, None, served=False)
        served_low = SERVED[api_key][0]
        raise FrameError(f"API key {api_key} version {version} is not served; versions {served_low}..{high} are")
    body, client_id = _decode(api_key, version, frame)
    return Request(api_key, version, correlation_id, client_id, body, served=True)


def _decode(api_key: int, version: int, frame: bytes | bytearray | memoryview) -> tuple[Any, str | None]:
    frame = memoryview(frame).toreadonly()  # kio's reader takes read-only buffers (no copy)
    try:
        schema = messages.request_schema(api_key, version)
        header, used = messages.decode(schema.__header_schema__, frame, 0)
        body, size = messages.decode(schema, frame, used)
    except Exception as exc:  # kio's native reader raises several kinds for bad bytes
        raise FrameError(f"API key {api_key} version {version}: the request does not parse "
                         f"({type(exc).__name__}: {exc})") from exc
    if used + size != len(frame):
        raise FrameError(f"API key {api_key} version {version}: {len(frame) - used - size} bytes "
                         "after the request")
    return body, header.client_id


def encode_response(api_key: int, version: int, correlation_id: int, body: Any) -> bytes:
    """The whole frame (size prefix included) answering one request."""
    schema = messages.response_schema(api_key, version)
    header = messages.build(schema.__header_schema__, {"correlation_id": correlation_id})
    payload = messages.encode(header) + messages.encode(body)
    return struct.pack(">i", len(payload)) + payload


def api_versions_body(version: int, *, error_code: int = 0) -> Any:
    schema = messages.response_schema(API_VERSIONS, version)
    return messages.build(schema, {
        "error_code": error_code,
        "api_keys": [{"api_key": k, "min_version": low, "max_version": high}
                     for k, (low, high) in sorted(ADVERTISED.items())],
        "throttle_time": 0,
    })
