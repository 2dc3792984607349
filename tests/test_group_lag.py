"""Consumer lag's pure parts and its families, without processes.

Claims: a broker's snapshot of its groups leaves out Dead groups and negative offsets and
copies the rest sorted; the usage report's group part is bounded in groups and offsets and
counts what it left out; the controller takes each partition's high watermark from the
partition leader's report (not a follower's), a group reported twice from the newer report,
and lag is never negative; a broker's group families show lag only for partitions it holds a
replica of; the controller exposes group lag only while it leads.
"""
from __future__ import annotations

import types

from common.metrics import Exposition
from common.topic_partition import TopicPartition
from common.usage import BrokerUsage, GroupOffsetUsage, GroupUsage, ReplicaUsage, lag_records
from controller import views
from controller.metrics import ControllerMetrics
from dataplane.broker.metrics import GroupCollector
from dataplane.groups import lag
from dataplane.groups.state import CommittedOffset, Group, GroupState, Member
from metadata_builders import add_topic, cluster
from metrics_scrape import Scrape
from test_metrics_exposition import render


def committed(offset: int) -> CommittedOffset:
    return CommittedOffset(offset=offset, leader_epoch=0, metadata=None, commit_ms=0)


def member(member_id: str) -> Member:
    return Member(member_id=member_id, instance_id=None, client_id="c", client_host="h", session_timeout_ms=10_000,
                  rebalance_timeout_ms=10_000, protocol_type="consumer", protocols=(("range", b""),))


def groups() -> list[Group]:
    stable = Group(group_id="orders", state=GroupState.STABLE,
                   members={"m1": member("m1"), "m2": member("m2")},
                   offsets={("t", 1): committed(40), ("t", 0): committed(10), ("t", 2): committed(-1)})
    empty = Group(group_id="audit", offsets={("t", 0): committed(99)})
    dead = Group(group_id="gone", state=GroupState.DEAD, offsets={("t", 0): committed(5)})
    return [stable, dead, empty]


def test_snapshot_copies_live_groups_sorted_without_negative_offsets():
    snaps = lag.snapshot(groups())
    assert [s.group for s in snaps] == ["audit", "orders"]
    orders = snaps[1]
    assert (orders.state, orders.members) == ("Stable", 2)
    assert orders.offsets == (("t", 0, 10), ("t", 1, 40))
    assert snaps[0].state == "Empty" and snaps[0].offsets == (("t", 0, 99),)


def test_lag_is_never_negative():
    assert lag_records(100, 60) == 40
    assert lag_records(100, 100) == 0
    assert lag_records(50, 60) == 0


def test_usage_report_is_bounded_and_counts_what_it_left_out():
    snaps = [lag.GroupSnapshot(group=f"g{i}", state="Stable", members=1,
                               offsets=tuple(("t", p, p) for p in range(3))) for i in range(4)]
    report = lag.usage_report(snaps, groups_max=3, offsets_max=7)
    assert [g.group for g in report.groups] == ["g0", "g1", "g2"]
    assert [len(g.offsets) for g in report.groups] == [3, 3, 1]
    assert report.groups_omitted == 1
    assert report.offsets_omitted == 2 + 3      # g2's last two, and all of g3's
    whole = lag.usage_report(snaps)
    assert (len(whole.groups), whole.groups_omitted, whole.offsets_omitted) == (4, 0, 0)


def usage(broker_id: int, at_ms: int, *, hws: dict[int, int], group_list: list[GroupUsage] = (),
          omitted: int = 0) -> BrokerUsage:
    return BrokerUsage(broker_id=broker_id, at_ms=at_ms, disk_total_bytes=1, disk_used_bytes=0, disk_free_bytes=1,
                       replicas=[ReplicaUsage(topic="t", partition=p, size_bytes=0, log_start_offset=0,
                                              log_end_offset=hw, high_watermark=hw) for p, hw in hws.items()],
                       groups=list(group_list), group_offsets_omitted=omitted)


def orders(state: str, offsets: dict[int, int]) -> GroupUsage:
    return GroupUsage(group="orders", state=state, members=2, offsets=[
        GroupOffsetUsage(topic="t", partition=p, committed_offset=o) for p, o in offsets.items()])


def test_controller_takes_the_leaders_high_watermark_and_the_newer_report():
    image = cluster(3)
    add_topic(image, "t", [[1, 2], [2, 1], [3, 1]])    # leaders 1, 2 and 3
    assert [image.get_partition("t", p).leader for p in range(3)] == [1, 2, 3]
    reports = {
        # Broker 1 leads t/0 (hw 100) and follows t/1 with a stale view (hw 20); it coordinated
        # "orders" before, and its last report of it is older than broker 2's.
        1: usage(1, 1_000, hws={0: 100, 1: 20}, group_list=[orders("PreparingRebalance", {0: 1, 1: 1})]),
        2: usage(2, 2_000, hws={1: 80, 0: 90}, group_list=[orders("Stable", {0: 60, 1: 95, 2: 5})], omitted=4),
    }
    answer = views.group_list(image, reports, now_ms=2_500)
    [g] = answer.groups
    assert (g.group, g.coordinator, g.state, g.members, g.age_ms) == ("orders", 2, "Stable", 2, 500)
    by_partition = {p.partition: p for p in g.partitions}
    assert (by_partition[0].leader, by_partition[0].high_watermark, by_partition[0].lag_records) == (1, 100, 40)
    assert by_partition[0].high_watermark_age_ms == 1_500
    assert (by_partition[1].high_watermark, by_partition[1].lag_records) == (80, 0)   # committed past the hw
    # t/2's leader (broker 3) sent no report: the committed offset is there, the lag is not.
    assert (by_partition[2].committed_offset, by_partition[2].high_watermark, by_partition[2].lag_records) == \
        (5, None, None)
    assert answer.offsets_omitted == 4


class Driver:
    def __init__(self, hw: int) -> None:
        self.closed = False
        self.replica = types.SimpleNamespace(high_watermark=hw)


def test_broker_families_show_lag_only_where_it_holds_a_replica():
    coordinator = types.SimpleNamespace(snapshot=lambda: lag.snapshot(groups()))
    source = types.SimpleNamespace(groups=coordinator,
                                   partition_drivers={TopicPartition("t", 0): Driver(100),
                                                      TopicPartition("t", 1): Driver(30)})
    exposition = Exposition()
    exposition.add(GroupCollector(source))
    scraped, _ = render(exposition)
    assert scraped.value("biplane_group_committed_offset", group="orders", topic="t", partition="1") == 40
    assert scraped.value("biplane_group_lag_records", group="orders", topic="t", partition="0") == 90
    assert scraped.value("biplane_group_lag_records", group="orders", topic="t", partition="1") == 0
    assert scraped.value("biplane_group_lag_records", group="audit", topic="t", partition="0") == 1
    assert scraped.value("biplane_group_members", group="orders") == 2
    assert scraped.value("biplane_group_state", group="orders", state="Stable") == 1
    assert scraped.value("biplane_group_state", group="orders", state="Empty") == 0
    assert not scraped.samples("biplane_group_members", group="gone")


def test_broker_families_exist_before_the_coordinator_does():
    exposition = Exposition()
    exposition.add(GroupCollector(types.SimpleNamespace(groups=None, partition_drivers={})))
    scraped, _ = render(exposition)
    assert scraped.has("biplane_group_lag_records") and not scraped.samples("biplane_group_lag_records")


class Service:
    def __init__(self, *, is_leader: bool) -> None:
        self.node_id = 1
        self.is_leader = is_leader
        self.stats: dict[str, int] = {}
        self.broker_offsets: dict[int, int] = {}
        self.broker_opening: dict[int, int] = {}
        self.committed = cluster(2)
        add_topic(self.committed, "t", [[1, 2]])
        self.usage = {1: usage(1, 1_000, hws={0: 70}, group_list=[orders("Stable", {0: 25})])}

    def clock_ms(self) -> int:
        return 1_200

    def raft_status(self):
        return None


def test_controller_exposes_group_lag_while_it_leads():
    scraped: Scrape
    scraped, _ = render(ControllerMetrics(Service(is_leader=True)).exposition)
    assert scraped.value("biplane_group_lag_records", group="orders", topic="t", partition="0") == 45
    scraped, _ = render(ControllerMetrics(Service(is_leader=False)).exposition)
    assert scraped.has("biplane_group_lag_records") and not scraped.samples("biplane_group_lag_records")
