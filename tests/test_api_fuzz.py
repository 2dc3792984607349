"""Fuzz the admin API against its own OpenAPI document (schemathesis), on a real cluster.

Three controllers and two brokers. Every operation of /v1/openapi.json gets schema-valid
and schema-invalid requests, with the token and without it, on the leader, and the writes
also on a follower, whose 307 is checked without following it. Every answer must be
documented: no 5xx, the status listed for the operation, the body valid against that
status's schema, the content type and the required headers as documented, an answered
request refused when repeated without the token, and an invalid request refused with a 4xx.

Then a script's loop (topics of 150 partitions until refused), and
the mechanism the guardrails exist for: the cluster is as healthy as before (no broker
fenced, no partition without a leader, the controllers' Raft term where it was), where a
7-minute fuzz without them left 14,060 partitions, the term at 17 and half the brokers
fenced.

Bounded: `EXAMPLES` per operation and generation mode, derandomized (the same requests
every run) and without shrinking, so the test takes about a minute and at most a few on
a loaded 2-core machine.
"""
from __future__ import annotations

import time
from typing import Any, Callable

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    ignored_auth,
    negative_data_rejection,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from cluster_harness import Cluster
from controller_harness import TOKEN, http, leader_of, wait_until

pytestmark = pytest.mark.slow

EXAMPLES = 40            # per operation and mode: 16 operations x 2 modes x 40 ~ 1,300 requests
FOLLOWER_EXAMPLES = 10   # per write operation, positive only: each is a 307
# ignored_auth repeats an answered request without the token and wants it refused.
CHECKS = [not_a_server_error, response_schema_conformance, status_code_conformance, content_type_conformance,
          response_headers_conformance, ignored_auth]
AUTH = {"Authorization": f"Bearer {TOKEN}"}
# The cluster's limit is a fifth of the default, so the flood's brokers create hundreds of
# partitions rather than thousands and the test stays within its time on a loaded machine.
PER_BROKER = 200
FLOOD_PARTITIONS = 150
TOPICS = ("0", "A", "orders")   # made before the fuzz; a valid request names one of them at times


# Config changes that exist: random keys alone would meet only "unknown config key".
CHANGES = ({"set": {"retention_ms": 3_600_000}}, {"reset": ["retention_ms"]},
           {"set": {"segment_bytes": 1 << 20, "cleanup.policy": "compact"}}, {"set": {"min_insync_replicas": 3}})


def toward_real_topics(strategy: Any, op: Any) -> Any:
    """A valid request for a topic path names an existing topic at times, and a config
    change names real keys at times: random values alone would meet only 404s and unknown
    keys, never the writes behind them."""
    def steer(choice: tuple[Any, str | None, dict | None]) -> Any:
        case, topic, change = choice
        if topic is not None:
            case.path_parameters["name"] = topic
        if change is not None:
            case.body = change
        return case
    changes = [None, *CHANGES] if op.path.endswith("/config") else [None]
    return st.tuples(strategy, st.sampled_from([None, None, None, *TOPICS]), st.sampled_from(changes)).map(steer)


def fuzz(schema: Any, base_url: str, *, examples: int, modes: tuple[GenerationMode, ...],
         writes_only: bool = False, follow_redirects: bool = True,
         prepare: Callable[[], None] = lambda: None) -> tuple[list[str], dict[tuple[str, int], int]]:
    """Run every operation (`prepare` before each); return the failures and the count of each status."""
    failures: list[str] = []
    statuses: dict[tuple[str, int], int] = {}
    for result in schema.get_all_operations():
        op = result.ok()
        if writes_only and op.method.upper() == "GET":
            continue
        for mode in modes:
            prepare()
            checks = CHECKS + ([negative_data_rejection] if mode == GenerationMode.NEGATIVE else [])

            strategy = op.as_strategy(generation_mode=mode)
            if mode == GenerationMode.POSITIVE and "{name}" in op.path:
                strategy = toward_real_topics(strategy, op)

            @given(strategy)
            @settings(max_examples=examples, derandomize=True, deadline=None, database=None,
                      phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
            def run(case: Any) -> None:
                response = case.call_and_validate(base_url=base_url, headers=AUTH, checks=checks,
                                                  allow_redirects=follow_redirects, timeout=30)
                key = (op.label, response.status_code)
                statuses[key] = statuses.get(key, 0) + 1
            try:
                run()
            except Unsatisfiable:
                # Nothing to get wrong: an operation without parameters or body has no
                # schema-invalid request (the token's absence is tried in positive mode).
                assert mode == GenerationMode.NEGATIVE, op.label
            except BaseException as exc:   # schemathesis raises its findings as an exception group
                if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    raise
                failures.append(f"{op.label} ({mode.value}): {exc}")
    return failures, statuses


def flood(url: str, attempts: int = 12) -> str:
    """Create topics of FLOOD_PARTITIONS until refused for a limit; return the refusal."""
    for i in range(attempts):
        r = http("POST", url + "/v1/topics", {"name": f"flood-{i}", "partitions": FLOOD_PARTITIONS}, timeout_s=60)
        if r.status == 429:
            time.sleep(min(15, int(r.headers["Retry-After"])))
        elif r.status != 201:
            assert r.status == 400 and r.error["code"] == "INVALID_PARTITIONS", (r.status, r.body)
            return r.error["message"]
    raise AssertionError(f"{attempts} topics of {FLOOD_PARTITIONS} partitions and no partition limit met")


def health(cluster: Cluster) -> dict:
    url = cluster.api_url
    brokers = http("GET", url + "/v1/brokers").body["brokers"]
    topics = [t["name"] for t in http("GET", url + "/v1/topics").body["topics"]]
    leaderless = [(p["topic"], p["partition"]) for name in topics
                  for p in http("GET", url + f"/v1/topics/{name}/partitions").body["partitions"]
                  if p["leader"] is None]
    return {"term": http("GET", url + "/v1/cluster").body["term"],
            "fenced": sorted(b["broker_id"] for b in brokers if b["fenced"]), "leaderless": leaderless}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with Cluster(tmp_path_factory.mktemp("fuzz"), brokers=2, controllers=3,
                 controller_args=["--max-partitions-per-broker", str(PER_BROKER)]) as c:
        yield c


def test_the_admin_api_answers_every_fuzzed_request_as_documented_and_the_cluster_stays_healthy(cluster):
    leader = leader_of(cluster.controllers)
    assert leader is not None
    before = health(cluster)
    assert before["fenced"] == [] and before["term"] is not None

    def make_topics() -> None:
        """The fuzz deletes topics too: each operation starts with all of them there."""
        for name in TOPICS:
            r = http("POST", leader.spec.api_url + "/v1/topics",
                     {"name": name, "partitions": 2, "replication_factor": 2})
            assert r.status in (201, 409), r.body

    schema = schemathesis.openapi.from_url(leader.spec.api_url + "/v1/openapi.json", headers=AUTH)
    failures, statuses = fuzz(schema, leader.spec.api_url, examples=EXAMPLES,
                              modes=(GenerationMode.POSITIVE, GenerationMode.NEGATIVE), prepare=make_topics)
    follower = next(c for c in cluster.controllers if c is not leader)
    more, redirected = fuzz(schema, follower.spec.api_url, examples=FOLLOWER_EXAMPLES,
                            modes=(GenerationMode.POSITIVE,), writes_only=True, follow_redirects=False)
    failures += more
    assert failures == [], "\n\n".join(failures)

    # The fuzz reached the API's answers, not only its refusals.
    answered = {status for (_, status) in statuses}
    assert {200, 201, 400, 401, 404} <= answered, sorted(statuses.items())
    for label in ("POST /v1/topics", "PATCH /v1/topics/{name}/config", "POST /v1/topics/{name}/partitions",
                  "DELETE /v1/topics/{name}", "POST /v1/elections/preferred"):
        assert any(key[0] == label and key[1] < 300 for key in statuses), (label, sorted(statuses.items()))
    assert any(status == 307 for (_, status) in redirected), redirected

    # A script in a loop: topics until the controller refuses at the cluster's limit,
    # waiting out every 429 as told.
    limited = flood(leader.spec.api_url)
    assert "--max-partitions-per-broker" in limited, limited
    replicas = sum(b["replicas"] for b in http("GET", leader.spec.api_url + "/v1/brokers").body["brokers"])
    assert PER_BROKER * len(cluster.brokers) - FLOOD_PARTITIONS < replicas <= PER_BROKER * len(cluster.brokers)

    # The mechanism: the cluster is as healthy as before.
    def healthy() -> dict | None:
        now = health(cluster)
        return now if not now["fenced"] and not now["leaderless"] else None
    after = wait_until(healthy, 90, "no fenced broker and no leaderless partition after the fuzz", interval_s=0.5)
    assert after["term"] == before["term"], (before, after)
    assert leader_of(cluster.controllers) is leader
