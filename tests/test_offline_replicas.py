"""Replicas whose log write failed (a full disk) leave leadership and the ISR at once.

The controller side (controller/decisions/offline.py, reached through a heartbeat) and the
broker side (ReplicaManager: what its heartbeats say, until the metadata shows it done). Before,
nothing told the controller: a leader whose partition went offline, or came back refusing to
lead the epoch its log holds, kept the leadership until its followers reported it silent.
"""
from __future__ import annotations

import asyncio
import os

from common.requests import HeartbeatRequest, OfflineReplica
from controller import core
from controller.core import ControllerCore
from controller.decisions import move_offline_replicas
from controller.decisions.plan import change
from dataplane.broker.config import BrokerConfig
from dataplane.broker.partition import now_ms
from dataplane.broker.replicas import ReplicaManager
from metadata_builders import add_topic, apply, cluster
from test_broker_parts import FakeControl


def image_with(policy: str = "isr", assignment=((1, 2, 3),), **config):
    image = cluster(3)
    add_topic(image, "t", [list(a) for a in assignment], commit_policy=policy, **config)
    return image


def offline(epoch: int = 0, *, online: bool = False) -> OfflineReplica:
    return OfflineReplica(topic="t", partition=0, leader_epoch=epoch, online=online)


def test_an_isr_leader_offline_hands_leadership_to_an_in_sync_follower_and_leaves_the_isr():
    image = image_with()
    records = move_offline_replicas(image, 1, [offline()])
    assert len(records) == 1 and "replica offline on broker 1" in records[0].reason
    apply(image, records)
    p = image.partition("t", 0)
    assert p.leader == 2 and p.isr == (2, 3) and p.leader_epoch == 1


def test_an_offline_follower_leaves_the_isr_only():
    image = image_with()
    apply(image, move_offline_replicas(image, 3, [offline()]))
    p = image.partition("t", 0)
    assert p.leader == 1 and p.isr == (1, 2) and p.leader_epoch == 0


def test_a_quorum_leader_offline_is_fenced_for_the_election():
    image = image_with("quorum")
    apply(image, move_offline_replicas(image, 1, [offline()]))
    p = image.partition("t", 0)
    assert p.leader is None and p.fenced_for_election and 1 not in p.isr


def test_the_only_in_sync_leader_waits_until_back_online_then_leads_a_new_epoch():
    image = image_with(assignment=((1,),), min_insync_replicas=1)
    assert move_offline_replicas(image, 1, [offline()]) == [], "no other replica may lead: nothing yet"
    apply(image, move_offline_replicas(image, 1, [offline(online=True)]))
    p = image.partition("t", 0)
    assert p.leader == 1 and p.leader_epoch == 2 and p.isr == (1,)
    assert not offline(online=True).stands(p, 1), "the report is done: the broker stops sending it"


def test_reports_the_metadata_has_moved_past_change_nothing():
    image = image_with()
    assert move_offline_replicas(image, 1, [offline(epoch=7)]) == [], "another epoch"
    apply(image, [change(image.partition("t", 0), isr=(1, 2), reason="test")])
    assert move_offline_replicas(image, 3, [offline()]) == [], "already out of the ISR"
    assert move_offline_replicas(image, 1, [OfflineReplica(topic="gone", partition=0, leader_epoch=0)]) == []


def test_the_heartbeat_carries_it_and_waits_for_the_commit():
    image = image_with()
    request = HeartbeatRequest(broker_id=1, incarnation_id=image.brokers[1].incarnation_id,
                               metadata_offset=image.offset, offline=(offline(),))
    step = ControllerCore().step(image, core.Heartbeat(request=request, now_ms=1000))
    assert step.wait_for_commit and len(step.records) == 1 and step.records[0].leader == 2
    plain = request.model_copy(update={"offline": ()})
    assert ControllerCore().step(image, core.Heartbeat(request=plain, now_ms=1000)).records == ()


# ---------------------------------------------------------------- the broker's side


def _manager(tmp_path) -> ReplicaManager:
    config = BrokerConfig(broker_id=1, data_dir=str(tmp_path / "data"), controller_urls=("http://c:1",))
    os.makedirs(config.data_dir, exist_ok=True)
    return ReplicaManager(config=config, control=FakeControl(), clean_start=True, send_fetch=lambda *a: None,
                          send_append_entries=lambda *a: None, refresh_metadata=lambda: None)


async def _with_t0_failed(tmp_path, image) -> ReplicaManager:
    """Broker 1's replicas opened from `image`, then t-0's log write failed."""
    manager = _manager(tmp_path)
    await manager.on_metadata(image)
    await manager.settled()
    assert manager.offline_latest == ()
    manager.get("t", 0)._fail("disk full: test")
    assert manager.offline_latest == (offline(),)
    return manager


def test_a_driver_going_offline_is_reported_until_the_metadata_moves_past_it(tmp_path):
    image = image_with()

    async def scenario():
        manager = await _with_t0_failed(tmp_path, image)
        # Unrelated metadata (a follower's ISR change at the same leader epoch) keeps it.
        apply(image, [change(image.partition("t", 0), isr=(1, 2), reason="test")])
        await manager.on_metadata(image)
        assert manager.offline_latest == (offline(),)
        # The controller's move: another leader, out of the ISR; reported no more.
        apply(image, move_offline_replicas(image, 1, manager.offline_latest))
        assert image.partition("t", 0).leader == 2
        await manager.on_metadata(image)
        assert manager.offline_latest == ()
        await manager.close()

    asyncio.run(scenario())


def test_an_epoch_changed_for_another_reason_does_not_end_the_report(tmp_path):
    """Brokers 1 (a follower) and 2 (the leader) both lose a write at epoch 0. The controller
    handles 2's report first and elects 1, still in the ISR, at epoch 1. Broker 1's report goes
    on at epoch 1 (it may lack what it lost) and the controller then moves the leadership to
    3. Before, the report ended with epoch 0 and broker 1 led epoch 1 from a failed log."""
    image = image_with(assignment=((2, 1, 3),))

    async def scenario():
        manager = await _with_t0_failed(tmp_path, image)
        apply(image, move_offline_replicas(image, 2, [offline()]))
        assert image.partition("t", 0).leader == 1 and image.partition("t", 0).leader_epoch == 1
        await manager.on_metadata(image)
        assert manager.offline_latest == (offline(epoch=1),)
        apply(image, move_offline_replicas(image, 1, manager.offline_latest))
        p = image.partition("t", 0)
        assert p.leader == 3 and p.isr == (3,)
        await manager.on_metadata(image)
        assert manager.offline_latest == ()
        await manager.close()

    asyncio.run(scenario())


def test_a_second_failure_after_the_reopen_is_reported_offline_again(tmp_path):
    image = image_with(assignment=((1,),), min_insync_replicas=1)

    async def scenario():
        manager = await _with_t0_failed(tmp_path, image)
        assert await manager.reopen(("t", 0), image)
        assert manager.offline_latest == (offline(online=True),)
        manager.get("t", 0)._fail("disk full: again")
        assert manager.offline_latest == (offline(),), "not online any more: no new epoch for it yet"
        await manager.close()

    asyncio.run(scenario())


def test_an_older_image_is_not_applied_over_a_newer_one(tmp_path):
    """A reopen hands over the image it took before awaiting other reopens: the replicas must
    keep the newest one (else they are fed metadata they have moved past)."""
    old = image_with()
    new = old.copy()
    apply(new, [change(new.partition("t", 0), isr=(1, 2), reason="test")])

    async def scenario():
        manager = _manager(tmp_path)
        await manager.on_metadata(new)
        await manager.settled()
        await manager.on_metadata(old)
        assert manager._image is new
        await manager.close()

    asyncio.run(scenario())


def test_a_reopened_lone_leader_says_it_is_online_and_leads_the_new_epoch_it_is_given(tmp_path):
    image = image_with(assignment=((1,),), min_insync_replicas=1)

    async def scenario():
        manager = await _with_t0_failed(tmp_path, image)
        assert await manager.reopen(("t", 0), image)
        assert manager.offline_latest == (offline(online=True),)
        reopened = manager.get("t", 0)
        assert not reopened.is_leader, "the log holds epoch 0: it waits for a new one"
        apply(image, move_offline_replicas(image, 1, manager.offline_latest))
        await manager.on_metadata(image)
        assert manager.offline_latest == ()
        assert image.partition("t", 0).leader_epoch == 2
        for _ in range(200):
            if reopened.is_leader:
                break
            reopened.tick(now_ms())
            await asyncio.sleep(0.01)
        assert reopened.is_leader
        await manager.close()

    asyncio.run(scenario())


def test_the_heartbeat_request_names_the_newer_fields_only_when_they_say_something():
    """Offline replicas, silent links, replicas still opening: each field is sent only when
    it has something, since a controller older than it refuses a heartbeat naming it."""
    from dataplane.broker.lifecycle import Lifecycle
    from common.requests import UnreachablePeer
    reports: tuple[OfflineReplica, ...] = (offline(),)
    silent = (UnreachablePeer(topic="t", partition=0, leader_epoch=1, peer=2),)
    opening = 3
    life = Lifecycle(FakeControl(), broker_id=1, host="h", port=1, rack=None, priority=0, clean_shutdown=True,
                     metadata_offset=lambda: 5, usage=lambda: None, offline=lambda: reports,
                     unreachable=lambda: silent, replicas_opening=lambda: opening)
    sent = life._heartbeat(with_usage=False)
    assert (sent.offline, sent.unreachable, sent.replicas_opening) == ((offline(),), silent, 3)
    assert {"offline", "unreachable", "replicas_opening"} <= set(sent.model_dump(mode="json", exclude_unset=True))
    reports, silent, opening = (), (), 0
    body = life._heartbeat(with_usage=False).model_dump(mode="json", exclude_unset=True)
    assert not {"offline", "unreachable", "replicas_opening"} & set(body), body
