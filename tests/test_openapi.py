"""The OpenAPI document is complete and true: it lists exactly the routes the app mounts,
every path parameter, body and answer status with its schema, and the bodies the API
really sends (a follower's 307, an error) validate against the schemas it names."""
from __future__ import annotations

import json

import jsonschema_rs
import pytest

from controller import api
from controller.openapi import responses
from controller.service import ControllerNode
from test_controller_service import make_service

DOC = api.openapi_document()
TAKES_BODY = {(op.method.lower(), op.path) for op in api.operations() if op.request is not None}


def validator(ref: str):
    # The document is the root, so "#/components/schemas/..." resolves inside it.
    return jsonschema_rs.validator_for({**DOC, "$ref": f"#/components/schemas/{ref}"})


def test_the_document_lists_exactly_the_mounted_admin_routes():
    app = api.make_app(make_service(), admin_token="t", cluster_secret=None)
    mounted = {(r.method.lower(), r.resource.canonical) for r in app.router.routes()
               if r.resource is not None and r.method != "HEAD" and not r.resource.canonical.startswith("/rpc/")}
    documented = {(m, p) for p, ops in DOC["paths"].items() for m in ops}
    assert mounted == documented
    assert ("get", "/v1/snapshots") in documented and ("post", "/v1/snapshots") in documented


def test_every_operation_names_its_parameters_body_and_answers():
    schemas = DOC["components"]["schemas"]
    for path, ops in DOC["paths"].items():
        for method, op in ops.items():
            params = {p["name"] for p in op.get("parameters", [])}
            assert params == {w.strip("{}") for w in path.split("/") if w.startswith("{")}, (method, path)
            assert op["responses"], (method, path)
            for status, answer in op["responses"].items():
                (content,) = answer["content"].values()
                ref = content["schema"].get("$ref")
                if ref is not None:
                    assert ref.rsplit("/", 1)[1] in schemas, (method, path, status)
                if int(status) >= 400:
                    assert ref == "#/components/schemas/ErrorBody", (method, path, status)
            if (method, path) in TAKES_BODY:
                assert "requestBody" in op and {"400", "413"} <= set(op["responses"]), (method, path)
            else:   # an action with nothing to say (take a snapshot, decommission a broker)
                assert "requestBody" not in op, (method, path)
            if path != "/v1/health":
                assert "401" in op["responses"] and op["security"] == [{"bearer": []}], (method, path)


def test_writes_document_the_redirect_and_the_write_rate():
    for op in api.operations():
        codes = responses(op)
        if op.writes:
            assert codes[307] == "Redirect" and codes[429] == "ErrorBody" and 503 in codes, op.path
            doc = DOC["paths"][op.path][op.method.lower()]["responses"]
            assert "Retry-After" in doc["429"]["headers"] and "Location" in doc["307"]["headers"]


def test_the_config_patch_schema_says_a_key_is_needed():
    ref = DOC["paths"]["/v1/topics/{name}/config"]["patch"]["requestBody"]["content"]["application/json"]["schema"]
    check = jsonschema_rs.validator_for({**DOC, **ref})
    assert not check.is_valid({}) and not check.is_valid({"set": {}, "reset": []})
    assert check.is_valid({"set": {"retention_ms": 1}}) and check.is_valid({"reset": ["retention_ms"]})


def follower_service():
    service = make_service()
    leader = ControllerNode(node_id=2, raft_address="127.0.0.1:3", api_url="http://127.0.0.1:4")
    service.leader_node = lambda: leader   # type: ignore[method-assign]
    return service


def test_a_followers_307_body_is_the_documented_redirect():
    reply = api.not_leader_response(follower_service(), "/v1/topics")
    assert reply.status == 307 and reply.headers["Location"] == "http://127.0.0.1:4/v1/topics"
    body = json.loads(reply.body)
    validator("Redirect").validate(body)
    assert body["leader"] == {"node_id": 2, "api_url": "http://127.0.0.1:4"}


@pytest.mark.parametrize("status", [401, 404, 405, 413, 429])
def test_error_bodies_validate_against_error_body(status):
    from controller.http_edge import error_response
    reply = error_response(status, "NOT_FOUND", "m", field="f")
    validator("ErrorBody").validate(json.loads(reply.body))


def test_the_document_is_plain_json_and_the_same_every_time():
    assert json.loads(json.dumps(DOC)) == api.openapi_document()
