"""The HTTP edge shared by the admin API (`api.py`) and the broker RPC (`rpc.py`).

Errors cross HTTP here and only here: a `BiplaneError`'s code becomes an HTTP status
(`http_status`) and the body `{"error": {"code", "message", "field"?, "retriable"}}`;
a request body that is not the expected model becomes a 400 naming the field. Both
route modules import this one and not each other, so neither needs the other loaded.
"""
from __future__ import annotations

import json
from typing import Any, TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from common.errors import BiplaneError, ErrorCode, InvalidFieldError

ModelT = TypeVar("ModelT", bound=BaseModel)

_STATUS = {
    ErrorCode.TOPIC_ALREADY_EXISTS: 409,
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: 404,
    ErrorCode.NOT_CONTROLLER: 503,
    ErrorCode.REQUEST_TIMED_OUT: 504,
    ErrorCode.STALE_BROKER_EPOCH: 409,
    ErrorCode.FENCED_LEADER_EPOCH: 409,
    ErrorCode.UNKNOWN_LEADER_EPOCH: 409,
    ErrorCode.INVALID_UPDATE_VERSION: 409,
    ErrorCode.NOT_LEADER_OR_FOLLOWER: 409,
    ErrorCode.INELIGIBLE_REPLICA: 409,
    ErrorCode.UNKNOWN: 500,
    ErrorCode.KAFKA_STORAGE_ERROR: 500,
}


def http_status(code: ErrorCode) -> int:
    return _STATUS.get(code, 400)


class EarlyResponse(Exception):
    """A handler's answer decided before it reached the core (a malformed body)."""

    def __init__(self, response: web.Response) -> None:
        super().__init__(response.status)
        self.response = response


def error_response(status: int, code: ErrorCode | str, message: str, *, field: str | None = None,
                   headers: dict | None = None, extra: dict | None = None) -> web.Response:
    """An error answer. `code` is an ErrorCode, or the plain name of an answer that only HTTP
    gives ("UNAUTHORIZED", "NOT_FOUND"): those are not wire codes and never retriable."""
    name = code.name if isinstance(code, ErrorCode) else code
    body: dict[str, Any] = {"code": name, "message": message,
                            "retriable": code.retriable if isinstance(code, ErrorCode) else False}
    if field is not None:
        body["field"] = field
    doc: dict[str, Any] = {"error": body}
    if extra:
        doc.update(extra)
    return web.json_response(doc, status=status, headers=headers)


def error_from_exception(exc: BiplaneError) -> web.Response:
    field = getattr(exc, "field", None) if isinstance(exc, InvalidFieldError) else None
    return error_response(http_status(exc.code), exc.code, str(exc), field=field)


def validation_error(exc: ValidationError, what: str) -> web.Response:
    errors = exc.errors()
    first = errors[0]
    field = ".".join(str(p) for p in first.get("loc", ())) or what
    parts = []
    for e in errors[:5]:
        loc = ".".join(str(p) for p in e.get("loc", ())) or what
        msg = e.get("msg", "invalid")
        if e.get("type") == "extra_forbidden":
            msg = "unknown field"
        elif "input" in e and e.get("type") != "missing":
            msg = f"{msg} (got {e['input']!r})"
        parts.append(f"{loc}: {msg}")
    return error_response(400, ErrorCode.INVALID_REQUEST, f"invalid {what}: " + "; ".join(parts), field=field)


async def read_model(request: web.Request, model: type[ModelT]) -> ModelT:
    """The body as `model`; raises EarlyResponse with a ready 400 otherwise."""
    raw = await request.read()
    try:
        data = json.loads(raw) if raw else {}
    except ValueError as exc:
        raise EarlyResponse(error_response(400, ErrorCode.INVALID_REQUEST,
                                           f"request body is not JSON: {exc}", field="body"))
    if not isinstance(data, dict):
        raise EarlyResponse(error_response(400, ErrorCode.INVALID_REQUEST,
                                           f"request body must be a JSON object, got {type(data).__name__}",
                                           field="body"))
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise EarlyResponse(validation_error(exc, model.__name__))


def answer(model: BaseModel, status: int = 200) -> web.Response:
    """A typed answer as JSON, with only the fields the handler set (see common/requests.py)."""
    return web.Response(text=model.model_dump_json(exclude_unset=True), status=status,
                        content_type="application/json")
