"""A topic config altered on a running cluster applies to its live partitions at once, as in
Kafka, except how they replicate and commit, which is fixed at creation and refused.

Replicas used to keep the config of their partition's last leader or ISR change: an alter
(which changes no epoch) reached them only with the next failover."""
from __future__ import annotations

import asyncio
import time

import pytest

from common.errors import ErrorCode
from common.wire import WireClient
from cluster_harness import Cluster, make_batch, produce
from controller_harness import http, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def test_min_insync_replicas_raised_on_a_live_topic_refuses_the_next_acks_all_at_once(tmp_path):
    with Cluster(tmp_path, brokers=3) as cluster:
        r = http("POST", cluster.api_url + "/v1/topics", {"name": "t", "replica_assignment": [[1, 2, 3]],
                                                          "config": {"min_insync_replicas": 1}})
        assert r.status == 201, r.body
        assert cluster.wait_leader("t", 0) == 1

        async def produce_once(value: bytes) -> ErrorCode:
            async with await WireClient.connect(*cluster.address(1)) as c:
                answer = await asyncio.wait_for(produce(c, "t", 0, make_batch([value]), timeout_ms=3000), 10)
                return answer.error_code

        def answered_within(code: ErrorCode, seconds: float) -> list[ErrorCode]:
            """Produce until the answer is `code`; every answer before it."""
            seen: list[ErrorCode] = []
            deadline = time.monotonic() + seconds
            while (got := asyncio.run(produce_once(b"v%d" % len(seen)))) is not code:
                seen.append(got)
                assert time.monotonic() < deadline, f"still {seen[-3:]} after {seconds} s, wanted {code.name}"
                time.sleep(0.05)
            return seen

        answered_within(ErrorCode.NONE, 10)   # the followers' first fetches may still be on their way
        cluster.brokers[3].stop()
        wait_until(lambda: sorted(cluster.partition("t", 0)["isr"]) == [1, 2], 30, "broker 3 out of the ISR")
        epochs = (cluster.partition("t", 0)["leader_epoch"], cluster.partition("t", 0)["partition_epoch"])
        assert asyncio.run(produce_once(b"two in sync")) is ErrorCode.NONE

        r = http("PATCH", cluster.api_url + "/v1/topics/t/config", {"set": {"min_insync_replicas": 3}})
        assert r.status == 200, r.body
        assert set(answered_within(ErrorCode.NOT_ENOUGH_REPLICAS, 5)) <= {ErrorCode.NONE}
        r = http("PATCH", cluster.api_url + "/v1/topics/t/config", {"reset": ["min_insync_replicas"]})
        assert r.status == 200, r.body
        assert set(answered_within(ErrorCode.NONE, 5)) <= {ErrorCode.NOT_ENOUGH_REPLICAS}
        # Neither change moved the partition: the replicas took the config itself.
        p = cluster.partition("t", 0)
        assert (p["leader_epoch"], p["partition_epoch"]) == epochs

        r = http("PATCH", cluster.api_url + "/v1/topics/t/config", {"set": {"commit_policy": "quorum"}})
        assert r.status == 400 and r.error["field"] == "commit_policy", r.body
        assert "fixed at creation" in r.error["message"] and "Create a new topic" in r.error["message"]
        assert http("GET", cluster.api_url + "/v1/topics/t").body["config"]["commit_policy"] == "isr"
