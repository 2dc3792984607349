"""The group driver's commits over a scripted network: the newest commit of a partition wins,
so a commit waiting for a coordinator (an auto-commit, say) cannot land after a newer one and
move the group's offset back — what a process test saw when the coordinator was killed."""
from __future__ import annotations

import asyncio
from typing import Any

from common.errors import ConnectionClosedError, ErrorCode
from common.topic_partition import TopicPartition
from common.wire import (
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    OffsetCommitPartitionResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetCommitTopicResponse,
)
from dataplane.client.assignors import assignors_for
from dataplane.client.group import GroupDriver
from dataplane.client.group_core import GroupSettings
from dataplane.client.metadata import ClusterMetadata

P0, P1 = TopicPartition("t", 0), TopicPartition("t", 1)


class ScriptedNetwork:
    """Answers FindCoordinator only once `coordinator_up` is set; records every commit sent."""

    def __init__(self) -> None:
        self.metadata = ClusterMetadata()
        self.bootstrap = [("127.0.0.1", 1)]
        self.coordinator_up = asyncio.Event()
        self.commits: list[dict[TopicPartition, int]] = []

    async def request(self, broker: Any, message: Any, **_: Any) -> Any:
        if isinstance(message, FindCoordinatorRequest):
            if not self.coordinator_up.is_set():
                raise ConnectionClosedError("no broker yet")
            return FindCoordinatorResponse(node_id=1, host="127.0.0.1", port=2)
        if isinstance(message, OffsetCommitRequest):
            sent = {TopicPartition(t.topic, p.partition): p.committed_offset for t in message.topics
                    for p in t.partitions}
            self.commits.append(sent)
            return OffsetCommitResponse(topics=tuple(OffsetCommitTopicResponse(topic=t.topic, partitions=tuple(
                OffsetCommitPartitionResponse(partition=p.partition, error_code=ErrorCode.NONE)
                for p in t.partitions)) for t in message.topics))
        raise AssertionError(f"unexpected {type(message).__name__}")


def test_an_older_commit_waiting_for_the_coordinator_is_superseded() -> None:
    async def run() -> None:
        network = ScriptedNetwork()
        driver = GroupDriver(network, GroupSettings(  # type: ignore[arg-type]
            group_id="g", group_instance_id=None, client_id="c", assignors=tuple(assignors_for("range")),
            session_timeout_ms=10_000, heartbeat_interval_ms=1_000, max_poll_interval_ms=60_000),
            request_timeout_ms=5_000, metadata_max_age_ms=300_000)
        try:
            older = asyncio.create_task(driver.commit({P0: 51, P1: 7}))
            await asyncio.sleep(0.05)
            newer = asyncio.create_task(driver.commit({P0: 101}))
            await asyncio.sleep(0.05)
            assert not network.commits, "committed before any coordinator was known"
            network.coordinator_up.set()
            await asyncio.wait_for(asyncio.gather(older, newer), 5)
            p0 = [c[P0] for c in network.commits if P0 in c]
            assert p0 == [101], f"partition 0 committed as {p0}: the older commit was sent too"
            assert [c[P1] for c in network.commits if P1 in c] == [7], "the older commit's other partition was lost"
        finally:
            await driver.stop()
    asyncio.run(run())
