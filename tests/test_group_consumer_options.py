"""The group options of Consumer are checked where they are given, with the field, the value
and what is allowed; group calls on a consumer without a group say what to do instead."""
from __future__ import annotations

import asyncio

import pytest

from dataplane.client import Consumer

BOOT = "127.0.0.1:9"   # never contacted: every check below fails before any request


@pytest.mark.parametrize("options, message", [
    ({"group_id": ""}, "group_id='' must be a non-empty string"),
    ({"group_instance_id": "host-1"}, "group_instance_id needs a group_id"),
    ({"group_id": "g", "group_instance_id": ""}, "group_instance_id='' must be a non-empty string"),
    ({"group_id": "g", "session_timeout_ms": 0}, "session_timeout_ms=0 must be a positive integer"),
    ({"group_id": "g", "heartbeat_interval_ms": 45_000}, "must be below session_timeout_ms=45000"),
    ({"group_id": "g", "max_poll_interval_ms": "5"}, "max_poll_interval_ms='5' must be a positive integer"),
    ({"group_id": "g", "partition_assignment_strategy": "sticky"}, "unknown assignor"),
    ({"group_id": "g", "partition_assignment_strategy": []}, "is empty"),
    ({"group_id": "g", "enable_auto_commit": "yes"}, "enable_auto_commit='yes' must be True or False"),
    ({"group_id": "g", "auto_commit_interval_ms": 0}, "auto_commit_interval_ms=0 must be a positive integer"),
])
def test_bad_group_options_are_refused(options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        Consumer(bootstrap=BOOT, **options)


def test_group_calls_need_a_group() -> None:
    async def run() -> None:
        consumer = Consumer(bootstrap=BOOT)
        for call, name in ((lambda: consumer.subscribe("t"), "subscribe()"), (lambda: consumer.commit(), "commit()"),
                           (lambda: consumer.committed(), "committed()")):
            with pytest.raises(ValueError, match=rf"{name.replace('(', '[(]').replace(')', '[)]')} needs a group"):
                await call()
        with pytest.raises(ValueError, match="needs a group"):
            consumer.commit_async()
        await consumer.close()
    asyncio.run(run())


def test_subscribe_checks_its_arguments_before_any_request() -> None:
    async def run() -> None:
        consumer = Consumer(bootstrap=BOOT, group_id="g")
        for topics in ([], [""], [3]):
            with pytest.raises(ValueError, match="one or more topic names"):
                await consumer.subscribe(topics)
        with pytest.raises(ValueError, match="on_assign=.* is not callable"):
            await consumer.subscribe("t", on_assign="print")
        await consumer.close()
    asyncio.run(run())
