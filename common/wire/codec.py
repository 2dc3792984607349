"""A small declarative codec for message bodies (big-endian, Kafka-style types).

A message is a frozen, keyword-only dataclass plus a field table:

    @wire_struct(partition=INT32, error_code=ERROR_CODE, records=RECORDS)
    class PartitionData:
        partition: int
        error_code: ErrorCode = ErrorCode.NONE
        records: Records = b""

The table lists the fields in wire order, which must also be the dataclass's
field order. Types: INT8/16/32/64, BOOL, ERROR_CODE (int16), STRING and
NULLABLE_STRING (int16 length), BYTES (int32 length, -1 null), RECORDS (like
BYTES, but decoded as a zero-copy memoryview of the frame, because record
batches cross the wire path opaque), Array(item) (int32 count) and any
wire_struct class nested directly.

Decoding never trusts a length or count: each is bounded by the bytes left,
so a hostile count cannot allocate more than the frame holds. Errors are
ProtocolError naming the message, the field path and the bad value.
"""
from __future__ import annotations

import contextlib
import operator
import struct
from dataclasses import dataclass, fields as dataclass_fields
from typing import Any, Callable, Iterable, Iterator, NoReturn, TypeVar, Union, dataclass_transform

from common.errors import ErrorCode, InvalidRequestError, ProtocolError

Records = Union[bytes, bytearray, memoryview]
Parts = list[Records]  # an encoded message: bytes-like parts, joined or written as they are
T = TypeVar("T")


class _FieldError(Exception):
    """Internal: a decode failure on its way up, collecting the field path."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        self.path: list[str] = []


def _path_text(path: list[str]) -> str:
    return "".join(p if p.startswith("[") else "." + p for p in reversed(path)).lstrip(".")


class FieldType:
    """How one value is laid out. `fixed` types have a struct format code."""

    name: str = "?"
    min_size: int = 0
    fmt: str | None = None  # set for fixed-size scalars

    @property
    def fixed_fmt(self) -> str:
        """The struct format code of a fixed-size type."""
        if self.fmt is None:
            raise TypeError(f"{self.name} is not a fixed-size type")
        return self.fmt

    def encode(self, value: Any, out: Parts) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def decode(self, buf: memoryview, pos: int, end: int) -> tuple[Any, int]:  # pragma: no cover
        raise NotImplementedError

    def convert(self, raw: Any) -> Any:
        """Turn the struct-unpacked value into the field's Python value (fixed types only)."""
        return raw

    def __repr__(self) -> str:
        return self.name


class _Scalar(FieldType):
    def __init__(self, name: str, fmt: str) -> None:
        self.name = name
        self.fmt = fmt
        self._struct = struct.Struct(">" + fmt)
        self.min_size = self._struct.size

    def encode(self, value: Any, out: Parts) -> None:
        out.append(self._struct.pack(value))

    def decode(self, buf: memoryview, pos: int, end: int) -> tuple[Any, int]:
        nxt = pos + self.min_size
        if nxt > end:
            raise _FieldError(f"{self.name} needs {self.min_size} bytes, {end - pos} left")
        return self.convert(self._struct.unpack_from(buf, pos)[0]), nxt


class _Bool(_Scalar):
    def convert(self, raw: Any) -> bool:
        if raw == 0:
            return False
        if raw == 1:
            return True
        raise _FieldError(f"bool byte {raw} is neither 0 nor 1")


_ERROR_CODES = {code.value: code for code in ErrorCode}   # a lookup, not an enum call, per answer


class _ErrorCode(_Scalar):
    def convert(self, raw: Any) -> ErrorCode:
        code = _ERROR_CODES.get(raw)
        if code is None:
            raise _FieldError(f"unknown error code {raw}")
        return code


INT8 = _Scalar("int8", "b")
INT16 = _Scalar("int16", "h")
INT32 = _Scalar("int32", "i")
INT64 = _Scalar("int64", "q")
BOOL = _Bool("bool", "B")
ERROR_CODE = _ErrorCode("error_code", "h")

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")


class _String(FieldType):
    def __init__(self, nullable: bool) -> None:
        self.nullable = nullable
        self.name = "nullable_string" if nullable else "string"
        self.min_size = 2

    def encode(self, value: Any, out: Parts) -> None:
        if value is None:
            if not self.nullable:
                raise TypeError("string field is not nullable")
            out.append(b"\xff\xff")
            return
        raw = value.encode("utf-8")
        out.append(_INT16.pack(len(raw)))
        out.append(raw)

    def decode(self, buf: memoryview, pos: int, end: int) -> tuple[Any, int]:
        if pos + 2 > end:
            raise _FieldError(f"string length needs 2 bytes, {end - pos} left")
        n = _INT16.unpack_from(buf, pos)[0]
        pos += 2
        if n == -1 and self.nullable:
            return None, pos
        if n < 0 or n > end - pos:
            raise _FieldError(f"string length {n} invalid ({end - pos} bytes left)")
        try:
            return str(buf[pos:pos + n], "utf-8"), pos + n
        except UnicodeDecodeError:
            raise _FieldError("string is not valid UTF-8") from None


STRING = _String(nullable=False)
NULLABLE_STRING = _String(nullable=True)


class _Bytes(FieldType):
    def __init__(self, name: str, zero_copy: bool) -> None:
        self.name = name
        self.zero_copy = zero_copy
        self.min_size = 4

    def encode(self, value: Any, out: Parts) -> None:
        if value is None:
            out.append(b"\xff\xff\xff\xff")
            return
        size = value.nbytes if isinstance(value, memoryview) else len(value)
        out.append(_INT32.pack(size))
        if size:
            out.append(value)

    def decode(self, buf: memoryview, pos: int, end: int) -> tuple[Any, int]:
        if pos + 4 > end:
            raise _FieldError(f"bytes length needs 4 bytes, {end - pos} left")
        n = _INT32.unpack_from(buf, pos)[0]
        pos += 4
        if n == -1:
            return None, pos
        if n < 0 or n > end - pos:
            raise _FieldError(f"bytes length {n} invalid ({end - pos} bytes left)")
        view = buf[pos:pos + n]
        return (view if self.zero_copy else bytes(view)), pos + n


BYTES = _Bytes("bytes", zero_copy=False)
RECORDS = _Bytes("records", zero_copy=True)


class Array(FieldType):
    """int32 count then the items; decoded as a tuple. `nullable` allows count -1 (None)."""

    def __init__(self, item: FieldType | type, *, nullable: bool = False) -> None:
        self.item = codec_of(item)
        if self.item.min_size < 1:
            raise TypeError(f"array items of {self.item!r} take no bytes; a count could not be bounded")
        self.nullable = nullable
        self.name = f"array[{self.item.name}]"
        self.min_size = 4

    def encode(self, value: Any, out: Parts) -> None:
        if value is None:
            if not self.nullable:
                raise TypeError("array field is not nullable")
            out.append(b"\xff\xff\xff\xff")
            return
        out.append(_INT32.pack(len(value)))
        item = self.item
        for element in value:
            item.encode(element, out)

    def decode(self, buf: memoryview, pos: int, end: int) -> tuple[Any, int]:
        if pos + 4 > end:
            raise _FieldError(f"array count needs 4 bytes, {end - pos} left")
        count = _INT32.unpack_from(buf, pos)[0]
        pos += 4
        if count == -1 and self.nullable:
            return None, pos
        item = self.item
        if count < 0 or count * item.min_size > end - pos:
            raise _FieldError(f"array count {count} invalid ({end - pos} bytes left, "
                              f"{item.min_size} bytes per item at least)")
        values = []
        for i in range(count):
            try:
                value, pos = item.decode(buf, pos, end)
            except _FieldError as exc:
                exc.path.append(f"[{i}]")
                raise
            values.append(value)
        return tuple(values), pos


class _Fixed:
    """A run of consecutive fixed-size fields packed with one struct."""

    def __init__(self, names: list[str], types: list[FieldType]) -> None:
        self.names = names
        self.types = types
        self.struct = struct.Struct(">" + "".join(t.fixed_fmt for t in types))
        getter = operator.attrgetter(*names)
        self.get: Callable[[Any], tuple[Any, ...]] = getter if len(names) > 1 else (lambda v: (getter(v),))
        ends, total = [], 0
        for t in types:
            total += struct.calcsize(">" + t.fixed_fmt)
            ends.append(total)
        self.ends = ends
        self.converting = [(i, t) for i, t in enumerate(types) if type(t).convert is not FieldType.convert]

    def short(self, pos: int, end: int) -> NoReturn:
        """Raise for the first field of the run that does not fit in buf[pos:end]."""
        i = next(i for i, e in enumerate(self.ends) if pos + e > end)
        ftype = self.types[i]
        exc = _FieldError(f"{ftype.name} needs {ftype.min_size} bytes, "
                          f"{max(end - pos - (self.ends[i] - ftype.min_size), 0)} left")
        exc.path.append(self.names[i])
        raise exc


class StructCodec(FieldType):
    def __init__(self, cls: type, table: dict[str, FieldType | type]) -> None:
        self.cls = cls
        self.name = cls.__name__
        self.fields = [(n, codec_of(t)) for n, t in table.items()]
        self.min_size = sum(t.min_size for _, t in self.fields)
        # Group consecutive fixed-size fields so each run is one pack/unpack call.
        steps: list[Any] = []
        run_names: list[str] = []
        run_types: list[FieldType] = []
        for name, ftype in self.fields:
            if ftype.fmt is not None:
                run_names.append(name)
                run_types.append(ftype)
                continue
            if run_names:
                steps.append(_Fixed(run_names, run_types))
                run_names, run_types = [], []
            steps.append((name, ftype))
        if run_names:
            steps.append(_Fixed(run_names, run_types))
        self.steps = steps
        # The instance's own decode shadows the method: the same steps, compiled.
        self.decode = self._compiled_decode()  # type: ignore[method-assign,assignment]

    def _compiled_decode(self) -> Callable[[memoryview, int, int], tuple[Any, int]]:
        """`decode` as straight-line code for this struct's layout (as dataclasses builds
        __init__): decoding was most of a follower's cost of reading a fetch answer, in the
        loop over steps, the keyword dict and its updates. It raises what the general `decode`
        raises, at the same field, with the same path."""
        env: dict[str, Any] = {"cls": self.cls, "FieldError": _FieldError}
        body: list[str] = []
        assigned: list[str] = []

        def guarded(name: str, line: str) -> list[str]:
            return ["try:", f"    {line}", "except FieldError as exc:", f"    exc.path.append({name!r})", "    raise"]
        for n, step in enumerate(self.steps):
            if type(step) is _Fixed:
                env[f"unpack_{n}"] = step.struct.unpack_from
                env[f"short_{n}"] = step.short
                names = [f"f_{name}" for name in step.names]
                body += [f"if pos + {step.struct.size} > end: short_{n}(pos, end)",
                         f"{', '.join(names)}{',' if len(names) == 1 else ''} = unpack_{n}(buf, pos)",
                         f"pos += {step.struct.size}"]
                for i, ftype in step.converting:
                    name = step.names[i]
                    env[f"convert_{name}"] = ftype.convert
                    body += guarded(name, f"f_{name} = convert_{name}(f_{name})")
                assigned += step.names
            else:
                name, ftype = step
                env[f"decode_{name}"] = ftype.decode
                body += guarded(name, f"f_{name}, pos = decode_{name}(buf, pos, end)")
                assigned.append(name)
        slots = [self.cls.__dict__.get(name) for name in assigned]
        if hasattr(self.cls, "__post_init__") or not all(type(s).__name__ == "member_descriptor" for s in slots):
            body.append(f"value = cls({', '.join(f'{name}=f_{name}' for name in assigned)})")
        else:
            # Every field is a slot and nothing checks them: filled in place, as the frozen
            # dataclass's __init__ would through object.__setattr__, at less than half its cost.
            env["new"] = object.__new__
            body.append("value = new(cls)")
            for name, slot in zip(assigned, slots):
                env[f"set_{name}"] = slot.__set__  # type: ignore[union-attr]
                body.append(f"set_{name}(value, f_{name})")
        source = "\n".join(["def decode(buf, pos, end):"] + [f"    {line}" for line in body] + ["    return value, pos"])
        exec(compile(source, f"<decode {self.name}>", "exec"), env)
        decode: Callable[[memoryview, int, int], tuple[Any, int]] = env["decode"]
        return decode

    def encode(self, value: Any, out: Parts) -> None:
        if type(value) is not self.cls:
            raise InvalidRequestError(f"expected {self.name}, got {type(value).__name__}")
        for step in self.steps:
            if type(step) is _Fixed:
                values = step.get(value)
                try:
                    out.append(step.struct.pack(*values))
                except struct.error:
                    self._explain_pack_failure(step, values)
            else:
                name, ftype = step
                try:
                    ftype.encode(getattr(value, name), out)
                except (TypeError, AttributeError, struct.error, UnicodeEncodeError) as exc:
                    raise InvalidRequestError(f"{self.name}.{name}: cannot encode "
                                              f"{getattr(value, name)!r} as {ftype.name}: {exc}") from None

    def _explain_pack_failure(self, step: _Fixed, values: tuple[Any, ...]) -> None:
        for name, ftype, v in zip(step.names, step.types, values):
            try:
                struct.pack(">" + ftype.fixed_fmt, v)
            except struct.error:
                raise InvalidRequestError(f"{self.name}.{name}: value {v!r} does not fit {ftype.name}") from None
        raise AssertionError(f"{self.name}: struct pack failed but no single field does")

    def decode(self, buf: memoryview, pos: int, end: int) -> tuple[Any, int]:
        kwargs: dict[str, Any] = {}
        for step in self.steps:
            if type(step) is _Fixed:
                st = step.struct
                if pos + st.size > end:
                    step.short(pos, end)
                values = st.unpack_from(buf, pos)
                pos += st.size
                kwargs.update(zip(step.names, values))
                for i, ftype in step.converting:
                    name = step.names[i]
                    try:
                        kwargs[name] = ftype.convert(kwargs[name])
                    except _FieldError as exc:
                        exc.path.append(name)
                        raise
            else:
                name, ftype = step
                try:
                    kwargs[name], pos = ftype.decode(buf, pos, end)
                except _FieldError as exc:
                    exc.path.append(name)
                    raise
        return self.cls(**kwargs), pos


def codec_of(t: FieldType | type) -> FieldType:
    if isinstance(t, FieldType):
        return t
    codec = getattr(t, "__wire_codec__", None)
    if not isinstance(codec, FieldType):
        raise TypeError(f"{t!r} is neither a field type nor a wire_struct class")
    return codec


@dataclass_transform(frozen_default=True, kw_only_default=True)
def wire_struct(**table: FieldType | type) -> Callable[[type[T]], type[T]]:
    """Make `cls` a frozen keyword-only slotted dataclass with a wire layout."""

    def wrap(cls: type[T]) -> type[T]:
        # Any: a class being made into a dataclass and given a codec attribute, which no
        # static type describes; the caller sees the type[T] it passed in.
        made: Any = dataclass(frozen=True, kw_only=True, slots=True)(cls)
        names = [f.name for f in dataclass_fields(made)]
        if names != list(table):
            raise TypeError(f"{cls.__name__}: wire table {list(table)} must list the dataclass fields "
                            f"{names} in the same order")
        made.__wire_codec__ = StructCodec(made, table)
        new_cls: type[T] = made
        return new_cls

    return wrap


def encode_parts(value: Any, out: Parts | None = None) -> Parts:
    """Encode a wire_struct value into a list of bytes-like parts (record blobs are not copied)."""
    parts: Parts = [] if out is None else out
    codec_of(type(value)).encode(value, parts)
    return parts


def encode(value: Any) -> bytes:
    return b"".join(encode_parts(value))


@contextlib.contextmanager
def general_decoding(cls: type) -> Iterator[None]:
    """While the block runs, `cls` and every struct nested in it decode with the general loop
    over their steps, not their compiled code: the reference that code is checked and measured
    against (tests/test_wire.py, scripts/bench_codec.py). Not for serving: it changes the codecs
    for every caller."""
    swapped: dict[StructCodec, Any] = {}

    def swap(c: FieldType) -> None:
        if isinstance(c, StructCodec) and c not in swapped:
            swapped[c] = c.decode
            c.decode = StructCodec.decode.__get__(c)  # type: ignore[method-assign]
            for _, f in c.fields:
                swap(f.item if isinstance(f, Array) else f)
    try:
        swap(codec_of(cls))
        yield
    finally:
        for c, compiled in swapped.items():
            c.decode = compiled  # type: ignore[method-assign]


def decode(cls: type[T], buf: bytes | bytearray | memoryview, pos: int = 0, *, context: str | None = None) -> T:
    """Decode exactly one `cls` from buf[pos:]; trailing bytes are an error."""
    codec = codec_of(cls)
    view = buf if isinstance(buf, memoryview) else memoryview(buf)
    end = len(view)
    where = context or codec.name
    value: T  # the codec of cls decodes a cls
    try:
        value, pos = codec.decode(view, pos, end)
    except _FieldError as exc:
        path = _path_text(exc.path)
        raise ProtocolError(f"{where}: field {path or '?'}: {exc.message}") from None
    except RecursionError:  # pragma: no cover - schemas are static and shallow
        raise ProtocolError(f"{where}: nesting too deep") from None
    if pos != end:
        raise ProtocolError(f"{where}: {end - pos} trailing bytes after the body")
    return value


def struct_fields(cls: type) -> Iterable[tuple[str, FieldType]]:
    """The (name, field type) table of a wire_struct class, for tools and tests."""
    codec = codec_of(cls)
    if not isinstance(codec, StructCodec):
        raise TypeError(f"{cls!r} is not a wire_struct class")
    return tuple(codec.fields)
