"""The admin API's guardrails on a real controller process: partition limits, the write rate
per token, body size and nesting limits, JSON errors for every status, and an empty change
refused. Each test names the limit's flag it expects the answer to name."""
from __future__ import annotations

import json
import time

import jsonschema_rs
import pytest

from controller.api import openapi_document
from controller_harness import TOKEN, Controller, http, make_specs, register_and_unfence, run_cli, wait_leader
from dataplane.client.admin import SyncAdminClient

pytestmark = pytest.mark.slow


def start(tmp_path_factory, name: str, extra: list[str], brokers: int = 2) -> Controller:
    spec = make_specs(1)[0]
    c = Controller(spec, [spec], tmp_path_factory.mktemp(name), ["--session-timeout-ms", "600000", *extra])
    c.start()
    wait_leader([c], timeout_s=20)
    for broker_id in range(1, brokers + 1):
        register_and_unfence(spec.api_url, broker_id)
    return c


@pytest.fixture(scope="module")
def controller(tmp_path_factory):
    """Default limits."""
    c = start(tmp_path_factory, "defaults", [])
    try:
        yield c
    finally:
        c.kill()


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """Small partition limits: 8 per topic, 10 replicas per broker x 2 brokers = 20 in the cluster."""
    c = start(tmp_path_factory, "small", ["--max-partitions-per-topic", "8", "--max-partitions-per-broker", "10"])
    try:
        yield c
    finally:
        c.kill()


DOCUMENT = openapi_document()   # the schemas the answers must fit


def api(c: Controller, method: str, path: str, body=None, **kw):
    return http(method, c.spec.api_url + path, body, **kw)


def error_shape(r) -> dict:
    """The API's error body: exactly {"error": {code, message, retriable, field?}}, valid
    against the ErrorBody schema of the controller's own OpenAPI document."""
    assert isinstance(r.body, dict) and set(r.body) == {"error"}, (r.status, r.body)
    assert r.headers.get("Content-Type", "").startswith("application/json"), r.headers
    jsonschema_rs.validator_for({**DOCUMENT, "$ref": "#/components/schemas/ErrorBody"}).validate(r.body)
    err = r.body["error"]
    assert {"code", "message", "retriable"} <= set(err) <= {"code", "message", "retriable", "field"}, err
    return err


def documented(c: Controller, method: str, path: str, status: int) -> None:
    doc = api(c, "GET", "/v1/openapi.json").body
    assert str(status) in doc["paths"][path][method.lower()]["responses"], (method, path, status)


# ---- JSON error bodies for every status

def test_unknown_path_is_a_json_404(controller):
    r = api(controller, "GET", "/v1/no-such-thing")
    assert r.status == 404
    err = error_shape(r)
    assert err["code"] == "NOT_FOUND" and "/v1/no-such-thing" in err["message"]


def test_wrong_method_is_a_json_405_with_allow(controller):
    r = api(controller, "PUT", "/v1/topics", {"name": "x"})
    assert r.status == 405
    err = error_shape(r)
    assert err["code"] == "METHOD_NOT_ALLOWED" and "GET" in err["message"] and "POST" in err["message"]
    assert set(r.headers["Allow"].replace(" ", "").split(",")) >= {"GET", "POST"}


def test_body_over_the_limit_is_a_json_413_naming_the_flag(controller):
    raw = json.dumps({"name": "big", "config": {"x": "y" * (1024 * 1024)}}).encode()
    r = api(controller, "POST", "/v1/topics", raw=raw)
    assert r.status == 413
    err = error_shape(r)
    assert err["code"] == "PAYLOAD_TOO_LARGE" and err["field"] == "body"
    assert "--admin-max-body-bytes" in err["message"] and str(len(raw)) in err["message"]
    documented(controller, "POST", "/v1/topics", 413)
    assert api(controller, "GET", "/v1/topics/big").status == 404


def test_body_over_the_transport_ceiling_is_a_json_413_on_the_broker_rpc_too(controller):
    raw = b'{"host": "' + b"x" * (5 * 1024 * 1024) + b'"}'
    r = api(controller, "POST", "/rpc/v1/register", raw=raw, token=None, timeout_s=30)
    assert r.status == 413 and error_shape(r)["code"] == "PAYLOAD_TOO_LARGE", r.body


# ---- nesting

@pytest.mark.parametrize("path, method", [("/v1/topics", "POST"), ("/v1/topics/t/config", "PATCH"),
                                          ("/v1/elections/preferred", "POST")])
def test_deeply_nested_body_is_400_not_a_recursion_error(controller, path, method):
    depth = 100_000
    raw = b'{"name": ' + b"[" * depth + b"]" * depth + b"}"
    r = api(controller, method, path, raw=raw)
    assert r.status == 400, r.body
    err = error_shape(r)
    assert err["field"] == "body" and "--admin-max-json-depth" in err["message"]
    assert "Recursion" not in err["message"]


def test_the_broker_rpc_refuses_a_deeply_nested_body_too(controller):
    depth = 100_000
    raw = b'{"broker_id": ' + b"[" * depth + b"]" * depth + b"}"
    r = api(controller, "POST", "/rpc/v1/heartbeat", raw=raw, token=None)
    assert r.status == 400 and error_shape(r)["field"] == "body", r.body


def test_nesting_within_the_limit_is_judged_by_the_model(controller):
    raw = b'{"name": "n", "config": {"retention_ms": ' + b"[" * 20 + b"]" * 20 + b"}}"
    r = api(controller, "POST", "/v1/topics", raw=raw)
    assert r.status == 400 and error_shape(r)["field"].startswith("config"), r.body


def test_brackets_inside_strings_do_not_count_as_nesting(controller):
    r = api(controller, "POST", "/v1/topics", {"name": "brackets", "config": {"compression_type": "[" * 100}})
    assert r.status == 400 and error_shape(r)["field"] != "body", r.body


# ---- an empty change

@pytest.mark.parametrize("body", [{}, {"set": {}}, {"reset": []}, {"set": {}, "reset": []}])
def test_an_empty_config_patch_is_400_naming_what_is_missing(controller, body):
    assert api(controller, "POST", "/v1/topics", {"name": "patched"}).status in (201, 409)
    before = api(controller, "GET", "/v1/topics/patched").body["metadata_offset"]
    r = api(controller, "PATCH", "/v1/topics/patched/config", body)
    assert r.status == 400, r.body
    err = error_shape(r)
    assert err["field"] == "set" and "'set'" in err["message"] and "'reset'" in err["message"]
    assert api(controller, "GET", "/v1/topics/patched").body["metadata_offset"] == before


def test_the_cli_says_what_to_give_for_an_empty_alter(controller):
    out = run_cli("topic", "alter", "patched", "--controller", controller.spec.api_url, "--token", TOKEN)
    assert out.returncode == 1 and "give --set KEY=VALUE or --reset KEY" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


# ---- partition limits

def test_default_per_topic_limit_names_the_flag(controller):
    r = api(controller, "POST", "/v1/topics", {"name": "wide", "partitions": 1001})
    assert r.status == 400
    err = error_shape(r)
    assert err["code"] == "INVALID_PARTITIONS" and err["field"] == "partitions"
    for words in ("1001", "limit of 1000 partitions per topic", "--max-partitions-per-topic"):
        assert words in err["message"], err
    assert api(controller, "GET", "/v1/topics/wide").status == 404


def test_per_topic_limit_on_create_and_on_add_partitions(small):
    r = api(small, "POST", "/v1/topics", {"name": "nine", "partitions": 9})
    assert r.status == 400 and "limit of 8 partitions per topic" in error_shape(r)["message"]
    assert api(small, "POST", "/v1/topics", {"name": "eight", "partitions": 8}).status == 201
    r = api(small, "POST", "/v1/topics/eight/partitions", {"partitions": 9})
    err = error_shape(r)
    assert r.status == 400 and err["field"] == "partitions" and "--max-partitions-per-topic" in err["message"]
    assert len(api(small, "GET", "/v1/topics/eight/partitions").body["partitions"]) == 8
    assert api(small, "DELETE", "/v1/topics/eight").status == 200


def test_cluster_limit_is_proportional_to_brokers_and_names_what_fits(small):
    # 2 brokers x 10 = 20 partition replicas in the cluster.
    assert api(small, "POST", "/v1/topics", {"name": "c1", "partitions": 8, "replication_factor": 2}).status == 201
    r = api(small, "POST", "/v1/topics", {"name": "c2", "partitions": 3, "replication_factor": 2})
    assert r.status == 400
    err = error_shape(r)
    assert err["code"] == "INVALID_PARTITIONS" and err["field"] == "partitions"
    for words in ("22 partition replicas", "limit of 20", "10 per broker x 2 registered brokers",
                  "--max-partitions-per-broker", "at most 2 more partitions"):
        assert words in err["message"], err
    assert api(small, "POST", "/v1/topics", {"name": "c2", "partitions": 2, "replication_factor": 2}).status == 201
    r = api(small, "POST", "/v1/topics/c2/partitions", {"partitions": 3})
    assert r.status == 400 and "--max-partitions-per-broker" in error_shape(r)["message"]
    # A third broker makes room for 10 more.
    register_and_unfence(small.spec.api_url, 3)
    assert api(small, "POST", "/v1/topics/c2/partitions", {"partitions": 7}).status == 200


# ---- the write rate per token

def test_write_rate_answers_429_with_retry_after_and_lets_in_after_it(tmp_path_factory):
    c = start(tmp_path_factory, "rate", ["--admin-write-rate", "1", "--admin-write-burst", "3"], brokers=1)
    try:
        # The burst lets 3 writes in at once (a few more if the machine is slow enough for the
        # rate to refill meanwhile), then a write is refused.
        statuses = []
        for i in range(10):
            r = api(c, "POST", "/v1/topics", {"name": f"r{i}"})
            statuses.append(r.status)
            if r.status != 201:
                break
        assert statuses[:3] == [201, 201, 201] and statuses[-1] == 429, statuses
        refused = f"r{len(statuses) - 1}"
        err = error_shape(r)
        assert err["code"] == "THROTTLING_QUOTA_EXCEEDED" and err["retriable"] is True
        assert "--admin-write-rate" in err["message"] and "--admin-write-burst" in err["message"]
        documented(c, "POST", "/v1/topics", 429)
        wait_s = int(r.headers["Retry-After"])
        assert 1 <= wait_s <= 2
        assert api(c, "GET", f"/v1/topics/{refused}").status == 404     # refused before it ran
        assert api(c, "GET", "/v1/topics").status == 200               # reads are not limited
        time.sleep(wait_s)
        assert api(c, "POST", "/v1/topics", {"name": refused}).status == 201
        # A write that creates 6 partitions costs 6: the bucket goes below zero and the next
        # write waits about 3 s, not 1.
        time.sleep(3)
        assert api(c, "POST", "/v1/topics", {"name": "wide", "partitions": 6}).status == 201
        r = api(c, "DELETE", "/v1/topics/r0")
        assert r.status == 429 and int(r.headers["Retry-After"]) >= 2, (r.status, r.headers)
        # The admin client and the CLI wait a 429 out (within their 10 s) instead of failing.
        admin = SyncAdminClient(c.spec.api_url, TOKEN)
        assert admin.create_topic("by-client").name == "by-client"
        assert api(c, "POST", "/v1/topics", {"name": "spend", "partitions": 6}).status in (201, 429)
        out = run_cli("topic", "create", "by-cli", "--controller", c.spec.api_url, "--token", TOKEN)
        assert out.returncode == 0, out.stderr
        assert api(c, "GET", "/v1/topics/by-cli").status == 200
    finally:
        c.kill()


def test_bad_limit_flags_are_refused_by_name(tmp_path):
    out = run_cli("controller", "--node-id", "1", "--data-dir", str(tmp_path), "--admin-token", "t",
                  "--raft-address", "127.0.0.1:1", "--api-address", "127.0.0.1:2", "--max-partitions-per-topic", "0")
    assert out.returncode == 2 and "--max-partitions-per-topic must be in 1..10000, got 0" in out.stderr, out.stderr
    out = run_cli("controller", "--node-id", "1", "--data-dir", str(tmp_path), "--admin-token", "t",
                  "--raft-address", "127.0.0.1:1", "--api-address", "127.0.0.1:2", "--admin-write-rate", "0")
    assert out.returncode == 2 and "--admin-write-rate must be a finite number > 0" in out.stderr, out.stderr
