"""Pull replication never leaves an acks=all produce waiting out a follower's long-poll.

Setup: 1 controller, 3 brokers whose fetch long-poll is 30 s (fetch_wait_ms_max),
topics created one after another (so each joins fetch sessions that are already
long-polling for other partitions). Claim: every sequential acks=all produce, on
both commit policies, is acknowledged within its own 5 s timeout. A produce that
waited for a long-poll to expire (a follower's flush report or a new partition
stuck behind another partition's long-poll) would time out instead.
"""
from __future__ import annotations

import asyncio

import pytest

from common.errors import ErrorCode
from common.wire import WireClient
from cluster_harness import Cluster, make_batch, produce

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def test_acks_all_never_waits_for_a_long_poll_to_expire(tmp_path):
    with Cluster(tmp_path, brokers=3, broker_args=["--fetch-wait-ms-max", "30000"]) as cluster:
        for n, policy in enumerate(("isr", "quorum", "isr", "quorum")):
            topic = f"lp{n}"
            cluster.create_topic(topic, partitions=1, replication_factor=3, config={"commit_policy": policy})
            leader = cluster.wait_leader(topic, 0)

            async def scenario() -> list[tuple[ErrorCode, str | None]]:
                async with await WireClient.connect(*cluster.address(leader)) as c:
                    codes = []
                    for i in range(15):
                        r = await produce(c, topic, 0, make_batch([b"%d" % i]), acks=-1, timeout_ms=5000)
                        codes.append((r.error_code, r.error_message))   # a timeout says what it waited for
                        await asyncio.sleep(0.01)
                    return codes
            codes = asyncio.run(scenario())
            assert codes == [(ErrorCode.NONE, None)] * 15, (topic, policy, codes)
