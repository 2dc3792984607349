"""The HTTP edge shared by the admin API (`api.py`) and the broker RPC (`rpc.py`).

Errors cross HTTP here and only here: a `BiplaneError`'s code becomes an HTTP status
(`http_status`) and the body `{"error": {"code", "message", "field"?, "retriable"}}`;
a request body that is not the expected model becomes a 400 naming the field, and one
nested deeper than the limit a 400 before it is parsed. aiohttp's own answers (no such
route, a method the route does not take, a body over the app's size limit) get the same
body (`json_errors`). Both route modules import this one and not each other, so neither
needs the other loaded.
"""
from __future__ import annotations

import json
from typing import Any, TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from common.errors import BiplaneError, ErrorCode, InvalidFieldError
from common.validation_text import plain_issues
from controller.guardrails import JSON_DEPTH_MAX_DEFAULT, json_too_deep

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
    issues = [(where or what, text) for where, text in plain_issues(exc.errors())[:5]]
    return error_response(400, ErrorCode.INVALID_REQUEST,
                          f"invalid {what}: " + "; ".join(f"{where}: {text}" for where, text in issues),
                          field=issues[0][0])


def too_large(size: int | None, limit: int, flag: str) -> web.Response:
    got = f"{size} bytes" if size is not None else "a larger body"
    return error_response(413, "PAYLOAD_TOO_LARGE",
                          f"request body is {got}; the limit is {limit} bytes{f' ({flag})' if flag else ''}",
                          field="body")


async def read_model(request: web.Request, model: type[ModelT], *, body_bytes_max: int | None = None,
                     json_depth_max: int = JSON_DEPTH_MAX_DEFAULT, limit_flag: str = "",
                     depth_flag: str = "") -> ModelT:
    """The body as `model`; raises EarlyResponse with a ready 400 (or 413) otherwise.
    `body_bytes_max` None leaves the size to the app's own ceiling; the flags, when
    given, are named in the refusals as what raises the limit."""
    if body_bytes_max is not None and (request.content_length or 0) > body_bytes_max:
        raise EarlyResponse(too_large(request.content_length, body_bytes_max, limit_flag))
    raw = await request.read()
    if body_bytes_max is not None and len(raw) > body_bytes_max:   # a chunked body has no length up front
        raise EarlyResponse(too_large(len(raw), body_bytes_max, limit_flag))
    if json_too_deep(raw, json_depth_max):
        raise EarlyResponse(error_response(
            400, ErrorCode.INVALID_REQUEST,
            f"request body nests objects and arrays more than {json_depth_max} levels deep"
            f"{f' ({depth_flag})' if depth_flag else ''}; no request of this API needs more than 4", field="body"))
    try:
        data = json.loads(raw) if raw else {}
    except ValueError as exc:
        raise EarlyResponse(error_response(400, ErrorCode.INVALID_REQUEST,
                                           f"request body is not JSON: {exc}", field="body"))
    except RecursionError:
        # Only with a depth limit raised past what the parser can take.
        raise EarlyResponse(error_response(400, ErrorCode.INVALID_REQUEST,
                                           "request body nests too deeply to parse", field="body"))
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


# aiohttp's own refusals, as names in the error body (HTTP-only answers, not wire codes).
_HTTP_NAMES = {400: "INVALID_REQUEST", 404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED", 413: "PAYLOAD_TOO_LARGE"}


def from_http_exception(exc: web.HTTPException, method: str, path: str) -> web.Response:
    """The JSON error for an answer aiohttp decided (no route, wrong method, body too big)."""
    headers = {k: v for k, v in exc.headers.items() if k.lower() in ("allow", "location", "retry-after")}
    if exc.status == 404:
        message = f"no such path: {path} (the API is described at /v1/openapi.json)"
    elif exc.status == 405:
        allowed = ", ".join(sorted(getattr(exc, "allowed_methods", ()) or ()))
        message = f"{path} does not take {method}; it takes {allowed}"
    elif exc.status == 413:
        message = f"request body is larger than this server takes: {exc.text or exc.reason}"
    else:
        message = exc.text or exc.reason
    return error_response(exc.status, _HTTP_NAMES.get(exc.status, exc.reason.upper().replace(" ", "_")),
                          message, headers=headers)


@web.middleware
async def json_errors(request: web.Request, handler) -> web.StreamResponse:
    """Outermost: every error status leaves with a JSON error body."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return from_http_exception(exc, request.method, request.path)
