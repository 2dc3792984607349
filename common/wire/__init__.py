"""The data-plane wire protocol: frames, a declarative body codec, messages, asyncio drivers."""
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
    FieldType,
    Records,
    decode,
    encode,
    encode_parts,
    struct_fields,
    wire_struct,
)
from common.errors import ConnectionClosedError
from common.wire.connection import Handler, WireClient, serve_connection, start_server
from common.wire.frames import (
    DEFAULT_MAX_FRAME_BYTES,
    FrameDecoder,
    RequestHeader,
    check_frame_size,
    encode_frame,
    read_frame,
    read_request_header,
    read_response_header,
    write_frame,
)
from common.wire.messages import *  # noqa: F401,F403  (messages defines __all__)
from common.wire.messages import __all__ as _message_names

__all__ = [
    "BOOL", "BYTES", "ERROR_CODE", "INT8", "INT16", "INT32", "INT64", "NULLABLE_STRING", "RECORDS", "STRING",
    "Array", "FieldType", "Records", "decode", "encode", "encode_parts", "struct_fields", "wire_struct",
    "ConnectionClosedError", "Handler", "WireClient", "serve_connection", "start_server",
    "DEFAULT_MAX_FRAME_BYTES", "FrameDecoder", "RequestHeader", "check_frame_size", "encode_frame",
    "read_frame", "read_request_header", "read_response_header", "write_frame",
    *_message_names,
]
