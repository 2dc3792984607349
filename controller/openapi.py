"""The admin API's operations and the OpenAPI document built from them.

Every admin route is declared once, as an `Operation`, and the app mounts exactly the
declared operations (`controller/api.py`, `controller/snapshot_service.py`), so the
document at /v1/openapi.json lists every route there is. The answers an operation can
give follow from what it is (`responses`): a body can be malformed (400) or too large
(413), a named topic can be unknown (404), a write can be redirected to the leader (307),
throttled (429), conflict (409), find no leader (503) or time out waiting for its commit
(504). A test compares the document with the mounted routes and a fuzzer
(tests/test_api_fuzz.py) checks every answer against it.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Awaitable, Callable, Iterable, Literal

from aiohttp import web
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from common import api_models
from common.metadata.config import TOPIC_NAME_PATTERN

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

PUBLIC_PATHS = frozenset({"/v1/health"})
_PATH_PARAMS = {"name": {"type": "string", "pattern": TOPIC_NAME_PATTERN},   # {name}: a topic
                "broker_id": {"type": "string", "pattern": "^[0-9]{1,9}$"}}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Operation:
    method: str
    path: str
    summary: str
    handler: Handler
    request: type[BaseModel] | None = None
    response: type[BaseModel] | None = None   # None: `text` (a plain-text answer) or any JSON object
    text: bool = False
    status: int = 200
    writes: bool = False          # answered by the leader only, charged to the write rate
    commits: bool = True          # a write that commits through Raft (may conflict or time out)
    leader_only: bool = False     # a read only the leader can answer (a follower redirects)
    names_topic: bool = False     # the body names a topic that may be unknown (404)
    unavailable: bool = False     # may answer 503 for a reason of its own
    storage_error: bool = False   # may answer 500: its own disk write failed
    errors: tuple[int, ...] = ()  # further statuses the handler answers itself

    @property
    def public(self) -> bool:
        return self.path in PUBLIC_PATHS

    @property
    def path_params(self) -> list[str]:
        return re.findall(r"{(\w+)}", self.path)


def operation_id(op: Operation) -> str:
    words = re.findall(r"[A-Za-z0-9]+", op.path.replace("/v1/", "/"))
    return "_".join([op.method.lower(), *words])


def responses(op: Operation) -> dict[int, str]:
    """Every status `op` can answer, with the component schema of its body."""
    out: dict[int, str] = {op.status: op.response.__name__ if op.response else ""}
    error = "ErrorBody"
    if op.request is not None or op.path_params:
        out[400] = error
    if not op.public:
        out[401] = error
    if op.path_params or op.names_topic:
        out[404] = error
    if op.request is not None:
        out[413] = error
    if op.writes or op.leader_only:
        out[307] = "Redirect"
        out[503] = error
    if op.writes:
        out[429] = error
    if op.writes and op.commits:
        out.update({409: error, 504: error})
    if op.unavailable:
        out[503] = error
    if op.storage_error:
        out[500] = error
    for status in op.errors:
        out[status] = "Redirect" if status == 307 else error
    return dict(sorted(out.items()))


_HEADERS = {
    307: {"Location": "the same path on the leader's API URL"},
    401: {"WWW-Authenticate": "Bearer"},
    429: {"Retry-After": "seconds until a write is let in again"},
}

_DESCRIPTIONS = {
    307: "not the leader: repeat the request at Location (the leader's API URL)",
    400: "the request is malformed or breaks a limit; `error.field` names the field",
    401: "missing or wrong bearer token",
    404: "the topic, partition or broker named is unknown",
    409: "conflicts with the metadata (the topic exists, a stale epoch)",
    413: "the body is larger than --admin-max-body-bytes",
    429: "the token's write rate (--admin-write-rate, --admin-write-burst) is spent; retry after Retry-After",
    500: "the controller could not write its file",
    503: "no leader is known yet (an election is running), or the feature is not configured here",
    504: "the write was proposed but not committed in time; its outcome is unknown",
}


def _model_schemas(operations: Iterable[Operation]) -> dict[str, Any]:
    ops = list(operations)
    requests = {op.request for op in ops if op.request is not None}
    answers: set[type[BaseModel]] = {op.response for op in ops if op.response is not None}
    answers |= {api_models.ErrorBody, api_models.Redirect}
    modes: list[tuple[type[BaseModel], Literal["validation", "serialization"]]] = []
    modes += [(m, "validation") for m in sorted(requests, key=lambda m: m.__name__)]
    modes += [(m, "serialization") for m in sorted(answers - requests, key=lambda m: m.__name__)]
    _, schema = models_json_schema(modes, ref_template="#/components/schemas/{model}")
    return schema.get("$defs", {})


def _json(ref: str) -> dict[str, Any]:
    return {"application/json": {"schema": {"$ref": f"#/components/schemas/{ref}"}}}


def _operation(op: Operation) -> dict[str, Any]:
    doc: dict[str, Any] = {"summary": op.summary, "operationId": operation_id(op), "responses": {}}
    if not op.public:
        doc["security"] = [{"bearer": []}]
    if op.path_params:
        doc["parameters"] = [{"name": name, "in": "path", "required": True,
                              "schema": _PATH_PARAMS.get(name, {"type": "string"})} for name in op.path_params]
    if op.request is not None:
        doc["requestBody"] = {"required": True, "content": _json(op.request.__name__)}
    for status, ref in responses(op).items():
        answer: dict[str, Any] = {"description": _DESCRIPTIONS.get(status, "success")}
        if status == op.status and op.text:
            answer["content"] = {"text/plain": {"schema": {"type": "string"}}}
        elif status == op.status and not ref:
            answer["content"] = {"application/json": {"schema": {"type": "object"}}}
        else:
            answer["content"] = _json(ref)
        if status in _HEADERS:
            answer["headers"] = {name: {"description": text, "required": True, "schema": {"type": "string"}}
                                 for name, text in _HEADERS[status].items()}
        doc["responses"][str(status)] = answer
    return doc


def openapi_document(operations: Iterable[Operation]) -> dict[str, Any]:
    ops = list(operations)
    paths: dict[str, dict[str, Any]] = {}
    for op in ops:
        paths.setdefault(op.path, {})[op.method.lower()] = _operation(op)
    return {
        "openapi": "3.1.0",
        "info": {"title": "Biplane controller admin API", "version": "1",
                 "description": "Errors are {\"error\": {\"code\", \"message\", \"field\"?, \"retriable\"}} "
                                "for every status; unknown paths answer 404 and unknown methods 405 in the "
                                "same shape. Limits: README, 'Admin API limits'."},
        "paths": paths,
        "components": {"schemas": _model_schemas(ops),
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    }


def mount(app: web.Application, operations: Iterable[Operation]) -> None:
    """Add each operation's route; the handler carries its operation for the middleware."""
    for op in operations:
        setattr(op.handler, "operation", op)
        app.router.add_route(op.method, op.path, op.handler)


def operation_of(handler: Any) -> Operation | None:
    op = getattr(handler, "operation", None)
    return op if isinstance(op, Operation) else None
