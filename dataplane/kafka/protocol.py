"""Kafka's framing and headers.

A frame is a big-endian int32 size and that many bytes: a request header (v1, or v2
for an API's flexible versions: api key, version, correlation id, client id, tagged
fields) and the request body. Answers carry the correlation id in a response header
(v0, or v1 with tagged fields; ApiVersions always v0, so that a client that asked with
a version we do not serve can still read the answer). Which APIs and versions are
served is the registry's (registry.py).
"""
from __future__ import annotations

import functools
import struct
from typing import Any

from kio.schema.response_header.v0.header import ResponseHeader as ResponseHeaderV0
from kio.schema.response_header.v1.header import ResponseHeader as ResponseHeaderV1

from common.wire.frames import BytesLike
from dataplane.kafka import messages
from dataplane.kafka.registry import APIS, Encoded, Request

API_VERSIONS = 18
_PREFIX = struct.Struct(">hhi")  # api key, api version, correlation id
_I32 = struct.Struct(">i")


class FrameError(ValueError):
    """The frame cannot be answered (too short, an unknown API or version, a header or
    body that does not parse): the connection is closed, as Kafka's broker does."""


def peek(frame: bytes | bytearray | memoryview) -> tuple[int, int, int]:
    """(api key, version, correlation id) of a frame, FrameError if it is too short."""
    if len(frame) < _PREFIX.size:
        raise FrameError(f"a request of {len(frame)} bytes is shorter than a request header")
    api_key, version, correlation_id = _PREFIX.unpack_from(frame, 0)
    return api_key, version, correlation_id


def decode_request(frame: bytearray, client_host: str = "") -> Request:
    api_key, version, correlation_id = peek(frame)
    api = APIS.get(api_key)
    if api is None:
        raise FrameError(f"API key {api_key} (version {version}) is not served here; "
                         f"served: {sorted(APIS)}")
    low, high = api.versions
    if low <= version <= high:
        body, client_id = _decode(api_key, version, frame)
        return Request(api_key, version, correlation_id, client_id, body, served=True, client_host=client_host)
    if api_key == API_VERSIONS:
        # Kafka's rule: answer at v0 with UNSUPPORTED_VERSION and the list, never hang up.
        return Request(api_key, version, correlation_id, None, None, served=False)
    if api.advertised_from <= version < low:
        body, client_id = _decode(api_key, version, frame)
        return Request(api_key, version, correlation_id, client_id, body, served=False)
    raise FrameError(f"API key {api_key} ({api.name}) version {version} is not served; "
                     f"versions {api.advertised_from}..{high} are")


def _decode(api_key: int, version: int, frame: bytearray) -> tuple[Any, str | None]:
    read_body = APIS[api_key].read_body
    view = memoryview(frame).toreadonly()  # kio's reader takes read-only buffers (no copy)
    try:
        header, used = messages.decode(messages.request_header_schema(api_key, version), view, 0)
        if read_body is not None:
            return read_body(frame, used, version), header.client_id
        body, size = messages.decode(messages.request_schema(api_key, version), view, used)
    except Exception as exc:  # kio's native reader raises several kinds for bad bytes
        raise FrameError(f"API key {api_key} version {version}: the request does not parse "
                         f"({type(exc).__name__}: {exc})") from exc
    if used + size != len(frame):
        raise FrameError(f"API key {api_key} version {version}: {len(frame) - used - size} bytes "
                         "after the request")
    return body, header.client_id


@functools.cache
def _flexible_header(api_key: int, version: int) -> bool:
    schema = messages.response_header_schema(api_key, version)
    if schema not in (ResponseHeaderV0, ResponseHeaderV1):
        raise AssertionError(f"API key {api_key} version {version}: response header {schema} is neither v0 nor v1")
    return schema is ResponseHeaderV1


def encode_response(api_key: int, version: int, correlation_id: int, body: Any) -> list[BytesLike]:
    """The frame parts (size prefix first) answering one request."""
    # Header v0 is the correlation id, v1 adds tagged fields (none): written here, as
    # building and encoding a kio entity for it cost as much as a produce answer's body.
    header = _I32.pack(correlation_id) + (b"\0" if _flexible_header(api_key, version) else b"")
    parts = body.parts if isinstance(body, Encoded) else [messages.encode(body)]
    size = len(header) + sum(len(p) for p in parts)
    return [_I32.pack(size) + header, *parts]
