"""The admin client against real `biplane controller` processes: typed results, API errors
raised with their code, and writes sent to a follower following its redirect."""
from __future__ import annotations

import asyncio

import pytest

from controller_harness import SECRET, TOKEN, Controller, make_specs, register_and_unfence, wait_leader
from dataplane.client.admin import AdminClient, SyncAdminClient
from dataplane.client.errors import AdminError

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def quorum(tmp_path_factory):
    specs = make_specs(3, priorities=[3, 2, 1])
    root = tmp_path_factory.mktemp("admin")
    nodes = [Controller(s, specs, root / f"c{s.node_id}", []).start() for s in specs]
    try:
        leader = wait_leader(nodes)
        yield nodes, leader
    finally:
        for n in nodes:
            n.kill()


def test_topics_round_trip_with_typed_results(quorum):
    nodes, leader = quorum
    follower = next(n for n in nodes if n is not leader)

    register_and_unfence(leader.spec.api_url, 1, secret=SECRET)

    async def main():
        # A follower first: writes follow its 307 to the leader.
        async with AdminClient([follower.spec.api_url], TOKEN) as admin:
            detail = await admin.create_topic("orders", partitions=3, replication_factor=1,
                                              config={"retention_ms": 60_000})
            assert detail.name == "orders" and len(detail.partitions) == 3
            assert (await admin.alter_topic_config("orders", set={"retention_ms": 120_000})).config["retention_ms"] == 120_000
            for _ in range(50):   # the follower's image catches up
                if any(t.name == "orders" for t in (await admin.list_topics()).topics):
                    break
                await asyncio.sleep(0.1)
            assert [p.partition for p in (await admin.partitions("orders")).partitions] == [0, 1, 2]
            with pytest.raises(AdminError) as err:
                await admin.create_topic("orders", partitions=1)
            assert err.value.code_name == "TOPIC_ALREADY_EXISTS" and err.value.status == 409
            with pytest.raises(AdminError) as err:
                await admin.create_topic("bad", partitions=0)
            assert err.value.code_name == "INVALID_REQUEST" and "partitions" in (err.value.field or "")
            cluster = await admin.cluster()
            assert cluster.leader_id == leader.spec.node_id and len(cluster.controllers) == 3
            assert [b.broker_id for b in (await admin.brokers()).brokers] == [1]
            assert (await admin.reassignments()).reassignments == []
            snap = await admin.take_snapshot()
            assert snap.name in [s.name for s in (await admin.list_snapshots()).snapshots]
            assert "deleted" in (await admin.delete_topic("orders")).result
            with pytest.raises(AdminError) as err:
                await admin.describe_topic("orders-never")
            assert err.value.code_name == "UNKNOWN_TOPIC_OR_PARTITION" and err.value.status == 404
    asyncio.run(main())


def test_bad_token_and_sync_client(quorum):
    _, leader = quorum
    with SyncAdminClient(leader.spec.api_url, "wrong") as admin:
        with pytest.raises(AdminError, match="UNAUTHORIZED"):
            admin.list_topics()
    with SyncAdminClient(leader.spec.api_url, TOKEN) as admin:
        assert admin.health().role == "leader"


def test_set_maintenance_takes_a_bool_before_asking_anyone():
    """The admin API refuses anything but JSON true or false; the client says so first, naming the
    value (no controller is reached: the address answers nothing)."""
    async def run() -> None:
        async with AdminClient(urls="http://127.0.0.1:9", token=TOKEN) as admin:
            for wrong in (1, 0, "yes", None):
                with pytest.raises(ValueError, match="must be True or False"):
                    await admin.set_maintenance(1, wrong)  # type: ignore[arg-type]
    asyncio.run(run())
