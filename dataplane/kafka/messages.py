"""Kafka messages as the `kio` library generates them from Kafka's own JSON schemas.

One schema class per API, version and direction; their fields differ between
versions (Metadata v0 has no `controller_id`, Produce v8 adds `record_errors`).
The handlers describe an answer once, as plain values (`build`), and this module
fits it to the version asked for: fields the version lacks are dropped, fields it
has but the answer does not name take the schema's default, nested entities are
built from the schema's own nested classes, and plain ints become the schema's
types (durations, error codes). Reading is the mirror (`field`).
"""
from __future__ import annotations

import dataclasses
import datetime
import functools
import io
import typing
from typing import Any, Mapping

from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode as KioErrorCode
from kio.serial import entity_reader, entity_writer
from kio.static import primitive

# Schema classes are looked up by API key and version at run time: to the type checker
# they are Any (the one edge of this package where it is).
Schema = Any

_DURATIONS = (primitive.i32Timedelta, primitive.i64Timedelta)


class SchemaMismatch(ValueError):
    """An answer names a value the schema cannot hold (a bug here, not the client's)."""


@functools.cache
def request_schema(api_key: int, version: int) -> Any:
    return load_request_schema(api_key, version)


@functools.cache
def response_schema(api_key: int, version: int) -> Any:
    return load_response_schema(api_key, version)


@functools.cache
def _hints(cls: Schema) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _convert(hint: Any, value: Any) -> Any:
    args = typing.get_args(hint)
    origin = typing.get_origin(hint)
    if origin is typing.Union or (args and type(None) in args and origin is not tuple):
        if value is None:
            return None
        inner = [a for a in args if a is not type(None)]
        return _convert(inner[0], value)
    if origin is tuple:
        item = args[0]
        return tuple(_convert(item, v) for v in (value or ()))
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return value if isinstance(value, hint) else build(hint, value)
    if hint in _DURATIONS:
        return hint(value if isinstance(value, datetime.timedelta) else datetime.timedelta(milliseconds=value))
    if hint is primitive.TZAware:
        if value is None or value == -1:
            return None
        aware: Any = primitive.TZAware
        return aware(datetime.datetime.fromtimestamp(value / 1000, tz=datetime.timezone.utc))
    if hint is KioErrorCode:
        try:
            return KioErrorCode(int(value))
        except ValueError:
            return KioErrorCode(-1)  # a code Kafka does not know: UNKNOWN_SERVER_ERROR
    if hint is primitive.Records:
        return None if value is None else bytes(value)
    if isinstance(hint, type) and hasattr(hint, "__mro__") and type(hint).__name__ == "PhantomMeta":
        return hint(value)
    return value


def build(cls: Schema, values: Mapping[str, Any]) -> Any:
    """An instance of schema class `cls` from plain values (see the module docstring)."""
    hints = _hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name in values:
            try:
                kwargs[f.name] = _convert(hints[f.name], values[f.name])
            except (TypeError, ValueError) as exc:
                raise SchemaMismatch(f"{cls.__qualname__}.{f.name}={values[f.name]!r}: {exc}") from exc
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            kwargs[f.name] = _empty(hints[f.name])
    return cls(**kwargs)


def _empty(hint: Any) -> Any:
    """A value for a field the answer does not name and the schema gives no default."""
    if typing.get_origin(hint) is tuple:
        return ()
    args = typing.get_args(hint)
    if type(None) in args:
        return None
    if hint is KioErrorCode:
        return KioErrorCode(0)
    if hint in _DURATIONS:
        return hint(datetime.timedelta(0))
    if hint is bool:
        return False
    if hint is str:
        return ""
    return _convert(hint, -1 if "Id" in getattr(hint, "__name__", "") else 0)


def field(obj: Any, name: str, default: Any = None) -> Any:
    """A request field as a plain value (durations in ms), or `default` when the version lacks it."""
    value = getattr(obj, name, default)
    if isinstance(value, datetime.timedelta):
        return int(value.total_seconds() * 1000)
    return value


def encode(obj: Any) -> bytes:
    out = io.BytesIO()
    entity_writer(type(obj))(out, obj)
    return out.getvalue()


def decode(cls: Schema, data: bytes | memoryview, offset: int = 0) -> tuple[Any, int]:
    """(entity, bytes used) read from data at offset."""
    value, size = entity_reader(cls)(data, offset)
    return value, size
