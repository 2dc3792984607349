"""A topic that has been under durability=write keeps saying so (TopicInfo.ever_under_write):
its replicas may have counted records before they were on disk, and after a crash they must not
vouch for their logs in a quorum election even when the topic is under fsync now. A stop that
leaves such a replica (or an offline one) cannot count as clean."""
from __future__ import annotations

import asyncio
import os

from common.metadata import AlterTopicConfig, MetadataImage
from metadata_builders import add_topic, apply, cluster
from test_replica_manager_opening import _manager, hold_open


def test_the_image_remembers_a_topic_was_under_write_through_alters_and_saves():
    image = cluster(1)
    add_topic(image, "w", [[1]], durability="write")
    add_topic(image, "f", [[1]], durability="fsync")
    add_topic(image, "g", [[1]], durability="fsync")
    assert image.topics["w"].ever_under_write and not image.topics["f"].ever_under_write
    apply(image, [AlterTopicConfig(topic="w", changes={"durability": "fsync"})])
    apply(image, [AlterTopicConfig(topic="g", changes={"durability": "write"})])
    apply(image, [AlterTopicConfig(topic="g", changes={"durability": None})])   # back to the default, fsync
    assert image.topics["w"].config.durability == "fsync" and image.topics["w"].ever_under_write
    assert image.topics["g"].config.durability == "fsync" and image.topics["g"].ever_under_write
    assert not image.topics["f"].ever_under_write
    again = MetadataImage.from_dict(image.to_dict())
    assert {n: t.ever_under_write for n, t in again.topics.items()} == {"w": True, "f": False, "g": True}
    # An image saved before the field: a topic under write now is marked, the others cannot be.
    old = image.to_dict()
    for t in old["topics"]:
        del t["ever_under_write"]
    apply(image, [AlterTopicConfig(topic="f", changes={"durability": "write"})])
    old_f_write = image.to_dict()
    for t in old_f_write["topics"]:
        del t["ever_under_write"]
    assert not MetadataImage.from_dict(old).topics["w"].ever_under_write
    assert MetadataImage.from_dict(old_f_write).topics["f"].ever_under_write


def test_after_a_crash_a_replica_of_a_topic_once_under_write_cannot_vouch_for_its_log(tmp_path, monkeypatch):
    """Topic w (quorum, durability=write, broker 1 follows broker 2) is altered to fsync, and
    broker 1 restarts after a crash: its replica of w starts unclean and knows its log took
    records under write, so its election reports would say `unclean`; f, never under write, is
    unclean but vouches for its flushed log. A stop while w's replica has not caught up does not
    count as clean. w's directory was on disk (its entry synced in the data directory) before
    its replica counted anything: a crash cannot make it a new, clean replica."""
    from dataplane.broker.partition import PartitionDriver
    image = cluster(2)
    add_topic(image, "w", [[2, 1]], commit_policy="quorum", quorum_required_acks=2, durability="write")
    add_topic(image, "f", [[2, 1]], commit_policy="quorum", quorum_required_acks=2, durability="fsync")
    apply(image, [AlterTopicConfig(topic="w", changes={"durability": "fsync"})])
    started: dict[str, tuple[bool, bool]] = {}
    real_init = PartitionDriver.__init__
    from dataplane.broker import replicas as replicas_module
    synced: list[str] = []
    real_fsync_dir = replicas_module.fsync_dir

    def fsync_dir(path):
        synced.append(os.path.basename(os.path.abspath(path)))
        real_fsync_dir(path)
    monkeypatch.setattr(replicas_module, "fsync_dir", fsync_dir)

    def init(self, **kw):
        started[kw["tp"][0]] = (kw["unclean_start"], kw["written_under_write"])
        real_init(self, **kw)
    monkeypatch.setattr(PartitionDriver, "__init__", init)

    async def run(clean_start: bool):
        manager = _manager(tmp_path, clean_start=clean_start)
        try:
            await asyncio.wait_for(manager.on_metadata(image), 5)
            await asyncio.wait_for(manager.settled(), 10)
            may_lack = {t: manager.get(t, 0).replica.may_lack_counted_records() for t in ("w", "f")}
        finally:
            unclean = await manager.close()
        return may_lack, unclean

    may_lack, unclean = asyncio.run(run(clean_start=True))   # the first start: both new
    assert started == {"w": (False, True), "f": (False, False)} and may_lack == {"w": False, "f": False}
    assert unclean == []
    assert synced == ["w-0", "data"]   # w's new directory and its entry; f's wait for its first flush

    may_lack, unclean = asyncio.run(run(clean_start=False))   # after a crash
    assert started == {"w": (True, True), "f": (True, False)}
    assert may_lack == {"w": True, "f": False}
    assert unclean == ["w-0 not caught up since the last crash"]


def test_a_stop_after_a_crash_before_every_replica_opened_is_not_clean(tmp_path, monkeypatch):
    """After a crash, a replica whose log was not opened in this run is still as the crash left
    it (a torn tail, records it may lack): a stop before it opened cannot count as clean. (a,
    opened while the broker was stopping, is closed unfed, with nothing known of it: counted too.)"""
    import threading

    from dataplane.broker.replicas import NewestFirst
    image = cluster(1)
    add_topic(image, "a", [[1]])
    add_topic(image, "b", [[1]])
    gate = hold_open(monkeypatch, "a-0")

    async def scenario(clean_start: bool, *, blocked: bool):
        manager = _manager(tmp_path, clean_start=clean_start)
        manager._open_slots = NewestFirst(1)   # a holds the only slot; b waits behind it
        if not blocked:
            gate.set()
        await asyncio.wait_for(manager.on_metadata(image), 5)
        if blocked:
            threading.Timer(0.2, gate.set).start()
        else:
            await asyncio.wait_for(manager.settled(), 10)
        return await asyncio.wait_for(manager.close(), 10)
    try:
        # A brand-new data directory starts without the marker too, but holds no log to vouch for.
        assert asyncio.run(scenario(False, blocked=True)) == []
        assert asyncio.run(scenario(False, blocked=False)) == []   # both open and close
        gate.clear()
        assert asyncio.run(scenario(False, blocked=True)) == ["a-0 not opened since the crash",
                                                               "b-0 not opened since the crash"]

        async def stop_before_metadata():
            return await _manager(tmp_path, clean_start=False).close()
        assert asyncio.run(stop_before_metadata()) == ["no metadata applied since the crash"]
    finally:
        gate.set()
