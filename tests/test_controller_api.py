"""The admin API of a real single-node controller process: every endpoint, good and bad input."""
from __future__ import annotations

import json

import pytest

from controller_harness import Controller, http, make_specs, register_and_unfence, wait_leader
from metrics_scrape import Scrape


@pytest.fixture(scope="module")
def controller(tmp_path_factory):
    spec = make_specs(1)[0]
    c = Controller(spec, [spec], tmp_path_factory.mktemp("api"), ["--session-timeout-ms", "600000"])
    try:
        c.start()
        wait_leader([c], timeout_s=20)
        for broker_id in (1, 2, 3):
            register_and_unfence(spec.api_url, broker_id)
        yield c
    finally:
        c.kill()


def api(c: Controller, method: str, path: str, body=None, **kw):
    return http(method, c.spec.api_url + path, body, **kw)


def test_health_needs_no_token_and_reports_leader(controller):
    r = api(controller, "GET", "/v1/health", token=None)
    assert r.status == 200 and r.body["role"] == "leader" and r.body["node_id"] == 1


@pytest.mark.parametrize("path", ["/v1/cluster", "/v1/brokers", "/v1/topics", "/v1/reassignments",
                                  "/metrics", "/v1/openapi.json", "/v1/topics/x/partitions"])
@pytest.mark.parametrize("token", [None, "wrong-token"])
def test_every_other_endpoint_needs_the_token(controller, path, token):
    r = api(controller, "GET", path, token=token)
    assert r.status == 401
    assert r.error["code"] == "UNAUTHORIZED"
    assert ("missing" if token is None else "bad") in r.error["message"]


def test_write_without_token_is_refused_and_changes_nothing(controller):
    r = api(controller, "POST", "/v1/topics", {"name": "no-token"}, token=None)
    assert r.status == 401
    assert api(controller, "GET", "/v1/topics/no-token").status == 404


def test_cluster_lists_the_controller_as_leader(controller):
    r = api(controller, "GET", "/v1/cluster")
    assert r.status == 200
    assert r.body["leader_id"] == 1 and r.body["controllers"][0]["is_leader"] is True
    assert r.body["controllers"][0]["priority"] == 1 and r.body["metadata_offset"] >= 0


def test_brokers_show_registration_and_fencing(controller):
    r = api(controller, "GET", "/v1/brokers")
    assert r.status == 200
    brokers = {b["broker_id"]: b for b in r.body["brokers"]}
    assert sorted(brokers) == [1, 2, 3]
    assert all(not b["fenced"] for b in brokers.values())
    assert brokers[2]["port"] == 9092 and brokers[2]["metadata_offset"] is not None


def test_create_describe_list_and_delete_a_topic(controller):
    r = api(controller, "POST", "/v1/topics", {"name": "orders", "partitions": 3, "replication_factor": 2,
                                               "config": {"retention_ms": 60000}})
    assert r.status == 201, r.body
    assert r.body["name"] == "orders" and len(r.body["partitions"]) == 3
    assert r.body["config"]["retention_ms"] == 60000
    assert all(len(p["replicas"]) == 2 and p["leader"] in p["replicas"] for p in r.body["partitions"])

    listed = api(controller, "GET", "/v1/topics").body["topics"]
    assert [t["name"] for t in listed if t["name"] == "orders"] == ["orders"]
    described = api(controller, "GET", "/v1/topics/orders")
    assert described.status == 200 and described.body["topic_id"] == r.body["topic_id"]
    parts = api(controller, "GET", "/v1/topics/orders/partitions")
    assert parts.status == 200 and [p["partition"] for p in parts.body["partitions"]] == [0, 1, 2]

    again = api(controller, "POST", "/v1/topics", {"name": "orders"})
    assert again.status == 409 and again.error["code"] == "TOPIC_ALREADY_EXISTS"

    gone = api(controller, "DELETE", "/v1/topics/orders")
    assert gone.status == 200 and gone.body["metadata_offset"] > r.body["metadata_offset"]
    assert api(controller, "GET", "/v1/topics/orders").status == 404


@pytest.mark.parametrize("body, field", [
    ({"name": "t", "partitions": "three"}, "partitions"),
    ({"name": "t", "partitions": 0}, "partitions"),
    ({"name": "t", "colour": "red"}, "colour"),
    ({"partitions": 1}, "name"),
    ({"name": 7}, "name"),
    ({"name": "bad/name"}, "name"),
    ({"name": ".."}, "name"),
    ({"name": "x" * 250}, "name"),
    ({"name": "t", "replication_factor": 9}, "replication_factor"),
    ({"name": "t", "config": {"no_such_key": 1}}, "no_such_key"),
    ({"name": "t", "config": {"retention_ms": "soon"}}, "retention_ms"),
    ({"name": "t", "replication_factor": 3, "config": {"commit_policy": "quorum", "quorum_required_acks": 1}},
     "quorum_required_acks"),
])
def test_bad_create_requests_are_400_naming_the_field(controller, body, field):
    r = api(controller, "POST", "/v1/topics", body)
    assert r.status == 400, r.body
    assert r.error["field"] == field, r.body
    assert r.error["message"]


@pytest.mark.parametrize("enabled", ["yes", "false", 1, 0, None])
def test_maintenance_takes_only_json_true_or_false(controller, enabled):
    """`{"enabled": "yes"}` turned maintenance on and `"false"` off: a string or a number is
    refused 400 naming the field, and nothing changes."""
    r = api(controller, "POST", "/v1/brokers/1/maintenance", {"enabled": enabled})
    assert r.status == 400 and r.error["field"] == "enabled", r.body
    state = api(controller, "GET", "/v1/brokers/1/operations")
    assert state.status == 200 and not state.body["maintenance"], state.body


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b'"text"'])
def test_body_that_is_not_a_json_object_is_400(controller, raw):
    r = api(controller, "POST", "/v1/topics", raw=raw)
    assert r.status == 400 and r.error["field"] == "body"


@pytest.mark.parametrize("path", ["/v1/topics/no-such-topic", "/v1/topics/no-such-topic/partitions"])
def test_unknown_topic_is_404(controller, path):
    r = api(controller, "GET", path)
    assert r.status == 404 and r.error["code"] == "UNKNOWN_TOPIC_OR_PARTITION"


def test_bad_topic_name_in_path_is_400(controller):
    r = api(controller, "GET", "/v1/topics/bad%21name")
    assert r.status == 400 and r.error["code"] == "INVALID_TOPIC"


def test_delete_unknown_topic_is_404(controller):
    assert api(controller, "DELETE", "/v1/topics/never-was").status == 404


def test_alter_config_sets_and_resets_keys(controller):
    assert api(controller, "POST", "/v1/topics", {"name": "cfg"}).status == 201
    r = api(controller, "PATCH", "/v1/topics/cfg/config", {"set": {"retention_ms": 1234}})
    assert r.status == 200 and r.body["config"]["retention_ms"] == 1234
    r = api(controller, "PATCH", "/v1/topics/cfg/config", {"reset": ["retention_ms"]})
    assert r.status == 200 and r.body["config"]["retention_ms"] != 1234


@pytest.mark.parametrize("body, status, field", [
    ({"set": {"retention_ms": "x"}}, 400, "retention_ms"),
    ({"set": {"nope": 1}}, 400, "nope"),
    ({"sett": {}}, 400, "sett"),
    ({"set": []}, 400, "set"),
])
def test_bad_config_changes_are_refused(controller, body, status, field):
    api(controller, "POST", "/v1/topics", {"name": "cfg2"})
    r = api(controller, "PATCH", "/v1/topics/cfg2/config", body)
    assert r.status == status and r.error["field"] == field, r.body


def test_alter_config_of_unknown_topic_is_404(controller):
    assert api(controller, "PATCH", "/v1/topics/ghost/config", {"set": {"retention_ms": 5}}).status == 404


def test_add_partitions_grows_the_topic_and_shows_them(controller):
    assert api(controller, "POST", "/v1/topics", {"name": "growing", "partitions": 2,
                                                  "replication_factor": 2}).status == 201
    r = api(controller, "POST", "/v1/topics/growing/partitions", {"partitions": 5})
    assert r.status == 200, r.body
    assert [p["partition"] for p in r.body["partitions"]] == [0, 1, 2, 3, 4]
    assert r.body["config"]["partitions"] == 5
    assert all(len(p["replicas"]) == 2 and p["leader"] == p["replicas"][0] for p in r.body["partitions"])
    parts = api(controller, "GET", "/v1/topics/growing/partitions").body["partitions"]
    assert len(parts) == 5
    r = api(controller, "POST", "/v1/topics/growing/partitions", {"partitions": 6, "replica_assignment": [[3, 1]]})
    assert r.status == 200 and r.body["partitions"][5]["replicas"] == [3, 1]


@pytest.mark.parametrize("body, field, words", [
    ({"partitions": 2}, "partitions", ["already has 2 partitions", "partitions 2 must be larger", "ask for 3"]),
    ({"partitions": 1}, "partitions", ["already has 2 partitions", "never removed"]),
    ({"partitions": 20_000}, "partitions", ["partitions 20000", "limit of 1000 partitions per topic",
                                            "--max-partitions-per-topic"]),
    ({"partitions": 0}, "partitions", ["must be at least 1", "got 0"]),
    ({"partitions": 4, "replica_assignment": [[1, 2]]}, "replica_assignment", ["adds 2"]),
    ({"partitions": 3, "replica_assignment": [[1, 2, 3]]}, "replica_assignment",
     ["lists 3 replicas", "replication_factor 2"]),
    ({"partitions": 3, "replica_assignment": [[1, 9]]}, "replica_assignment", ["9"]),
    ({"count": 3}, "partitions", ["partitions: is required", "count: unknown field"]),
])
def test_bad_add_partitions_requests_are_400_naming_field_and_value(controller, body, field, words):
    api(controller, "POST", "/v1/topics", {"name": "fixed", "partitions": 2, "replication_factor": 2})
    r = api(controller, "POST", "/v1/topics/fixed/partitions", body)
    assert r.status == 400 and r.error["field"] == field, r.body
    for word in words:
        assert word in r.error["message"], r.error
    assert len(api(controller, "GET", "/v1/topics/fixed/partitions").body["partitions"]) == 2


@pytest.mark.parametrize("body, words", [
    ({"partitions": True}, ["partitions: must be a whole number", "got True"]),
    ({"partitions": "3"}, ["partitions: must be a whole number", "got '3'"]),
    ({"config": {"retention_ms": 10**23}}, ["retention_ms", "must be at most 9223372036854775807"]),
    # One line for the value, not one per type a config value may have ("config.retention_ms.str: ...").
    ({"config": {"retention_ms": None}}, ["config.retention_ms: must be a string, a whole number, true/false "
                                          "or a number (got None)"]),
])
def test_a_count_or_setting_of_the_wrong_type_or_size_is_refused_not_guessed(controller, body, words):
    """JSON's true made a 1-partition topic, "3" a 3-partition one, and a retention of 10^23 ms
    (no Kafka client can read it back: configs are Java longs) was stored."""
    r = api(controller, "POST", "/v1/topics", {"name": "typed", **body})
    assert r.status == 400, r.body
    for word in words:
        assert word in r.error["message"], r.error
    assert api(controller, "GET", "/v1/topics/typed").status == 404


def test_the_offsets_topic_is_not_created_by_hand(controller):
    """A user created __consumer_offsets with 1 partition, RF 1 and cleanup_policy=delete, and
    groups then kept their offsets there; the brokers create it, compacted, on first use."""
    r = api(controller, "POST", "/v1/topics", {"name": "__consumer_offsets", "partitions": 1})
    assert r.status == 400 and r.error["code"] == "INVALID_TOPIC" and "when a group first needs it" in r.error["message"], r.body
    assert api(controller, "GET", "/v1/topics/__consumer_offsets").status == 404


def test_add_partitions_to_an_unknown_topic_is_404(controller):
    assert api(controller, "POST", "/v1/topics/ghost/partitions", {"partitions": 3}).status == 404


def test_reassignment_grows_the_replica_set_and_is_listed(controller):
    r = api(controller, "POST", "/v1/topics", {"name": "moving", "replica_assignment": [[1]]})
    assert r.status == 201, r.body
    r = api(controller, "POST", "/v1/reassignments", {"topic": "moving", "partition": 0, "target_replicas": [2, 3]})
    assert r.status == 202, r.body
    p = r.body["partitions"][0]
    assert set(p["replicas"]) == {1, 2, 3} and p["adding"] and p["removing"] == [1]
    listed = api(controller, "GET", "/v1/reassignments").body["reassignments"]
    assert any(x["topic"] == "moving" for x in listed)


@pytest.mark.parametrize("body, status, field", [
    ({"topic": "ghost", "partition": 0, "target_replicas": [1]}, 404, None),
    ({"topic": "moving2", "partition": 0, "target_replicas": [1, 1]}, 400, "target_replicas"),
    ({"topic": "moving2", "partition": "zero", "target_replicas": [1]}, 400, "partition"),
    ({"topic": "moving2", "partition": 0, "target_replicas": []}, 400, "target_replicas"),
])
def test_bad_reassignments_are_refused(controller, body, status, field):
    api(controller, "POST", "/v1/topics", {"name": "moving2"})
    r = api(controller, "POST", "/v1/reassignments", body)
    assert r.status == status, r.body
    if field:
        assert r.error["field"] == field


def test_preferred_election_for_all_and_for_named_partitions(controller):
    api(controller, "POST", "/v1/topics", {"name": "elect", "partitions": 2, "replication_factor": 2})
    r = api(controller, "POST", "/v1/elections/preferred", {})
    assert r.status == 200 and isinstance(r.body["elected"], list)
    r = api(controller, "POST", "/v1/elections/preferred", {"partitions": [{"topic": "elect", "partition": 1}]})
    assert r.status == 200
    r = api(controller, "POST", "/v1/elections/preferred", {"partitions": [{"topic": "ghost", "partition": 0}]})
    assert r.status == 404
    r = api(controller, "POST", "/v1/elections/preferred", {"partitions": "all"})
    assert r.status == 400 and r.error["field"] == "partitions"


def test_metrics_are_prometheus_text(controller):
    assert api(controller, "GET", "/v1/cluster").status == 200   # one request timed before the scrape
    r = api(controller, "GET", "/metrics")
    assert r.status == 200 and isinstance(r.body, str)
    scraped = Scrape(r.body)
    assert scraped.type_of("biplane_controller_metadata_offset") == "gauge"
    assert scraped.value("biplane_controller_is_leader") == 1
    assert scraped.value("biplane_api_request_seconds_count", method="GET", path="/v1/cluster") >= 1


def test_openapi_describes_every_route_with_schemas(controller):
    r = api(controller, "GET", "/v1/openapi.json")
    assert r.status == 200
    doc = json.loads(json.dumps(r.body))
    assert doc["openapi"].startswith("3.")
    paths = doc["paths"]
    for path, method in [("/v1/health", "get"), ("/v1/cluster", "get"), ("/v1/brokers", "get"),
                         ("/v1/topics", "get"), ("/v1/topics", "post"), ("/v1/topics/{name}", "get"),
                         ("/v1/topics/{name}", "delete"), ("/v1/topics/{name}/config", "patch"),
                         ("/v1/topics/{name}/partitions", "get"), ("/v1/topics/{name}/partitions", "post"),
                         ("/v1/reassignments", "post"),
                         ("/v1/reassignments", "get"), ("/v1/elections/preferred", "post"), ("/metrics", "get"),
                         ("/v1/snapshots", "get"), ("/v1/snapshots", "post")]:
        assert method in paths[path], (path, method)
    schemas = doc["components"]["schemas"]
    ref = paths["/v1/topics"]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    create = schemas[ref.rsplit("/", 1)[1]]
    assert "name" in create["properties"] and create.get("additionalProperties") is False
    assert "ErrorBody" in schemas
    for op in (m for p in paths.values() for m in p.values()):
        for response in op["responses"].values():
            for content in response.get("content", {}).values():
                ref = content["schema"].get("$ref")   # /metrics is text, /v1/openapi.json any object
                assert ref is None or ref.rsplit("/", 1)[1] in schemas


def test_snapshot_routes_are_mounted_behind_the_token(controller):
    assert api(controller, "GET", "/v1/snapshots", token=None).status == 401
    r = api(controller, "GET", "/v1/snapshots")
    assert r.status == 200 and isinstance(r.body["snapshots"], list)
