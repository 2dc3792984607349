"""Incremental usage reports (common/usage.py): what the controller keeps is what the broker
last reported complete, whatever is lost, unanswered or forgotten on the way."""
from __future__ import annotations

from hypothesis import given, settings, strategies as st

from common.usage import BrokerUsage, ReplicaUsage, UsageReports, merge_report


def usage(replicas: dict[tuple[str, int], int]) -> BrokerUsage:
    return BrokerUsage(broker_id=1, at_ms=1, disk_total_bytes=10, disk_used_bytes=5, disk_free_bytes=5,
                       replicas=[ReplicaUsage(topic=t, partition=p, size_bytes=size, log_start_offset=0,
                                              log_end_offset=size, high_watermark=size)
                                 for (t, p), size in sorted(replicas.items())])


def test_an_idle_broker_reports_no_replica_after_its_first_complete_report():
    reports = UsageReports()
    state = usage({("t", 0): 5, ("t", 1): 7})
    first = reports.report(state)
    assert first.base_seq is None and len(first.replicas) == 2
    reports.answered(resend=False)
    second = reports.report(state)
    assert second.base_seq == first.report_seq and second.replicas == [] and second.replicas_removed == []
    assert merge_report(merge_report(None, first), second).replicas == state.replicas


def test_a_report_on_a_base_the_controller_does_not_have_is_refused_and_the_next_is_complete():
    reports = UsageReports()
    state = usage({("t", 0): 5})
    reports.report(state)
    reports.answered(resend=False)
    delta = reports.report(usage({("t", 0): 6}))
    assert merge_report(None, delta) is None            # a new controller leader: no base
    reports.answered(resend=True)
    assert reports.report(usage({("t", 0): 6})).base_seq is None


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["change", "drop", "same"]), st.integers(0, 4), st.integers(0, 3),
                          st.sampled_from(["taken", "lost", "unanswered", "forgot"])), max_size=40))
def test_the_controller_keeps_what_the_broker_has_whatever_happens_on_the_way(steps):
    """Each round: the broker's replicas change (or not), it reports, and the report is taken,
    lost on the way (never reached), taken with its answer lost, or reached a controller that
    forgot its base (a new leader). After every taken report the controller's copy is the
    broker's."""
    reports = UsageReports()
    replicas: dict[tuple[str, int], int] = {}
    kept: BrokerUsage | None = None
    objects: dict[tuple[str, int], ReplicaUsage] = {}
    for change, partition, size, fate in steps:
        if change == "change":
            replicas[("t", partition)] = size
        elif change == "drop":
            replicas.pop(("t", partition), None)
        complete = usage(replicas)
        # ReplicaManager keeps unchanged figures' objects; so does this stand-in.
        same = [objects[(r.topic, r.partition)] if objects.get((r.topic, r.partition)) == r else r
                for r in complete.replicas]
        objects = {(r.topic, r.partition): r for r in same}
        report = reports.report(complete.model_copy(update={"replicas": same}))
        if fate == "lost":
            reports.unanswered()
            continue
        if fate == "forgot":
            kept = None
        merged = merge_report(kept, report)
        if merged is not None:
            kept = merged
            assert merged.replicas == complete.replicas
        if fate == "unanswered":
            reports.unanswered()
        else:
            reports.answered(resend=merged is None)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "change", "drop", "same"]), st.integers(0, 6), st.integers(0, 3)),
                max_size=40))
def test_rows_kept_in_arrival_order_report_what_changed_and_what_is_new(steps):
    """The broker's rows in the order its replicas arrived (new ones at the end, as
    ReplicaManager.usage_report keeps them), not sorted: each report, merged onto the last
    taken, gives the broker's replicas, and a list that only grew reports its changed and new
    rows and no removal."""
    reports = UsageReports()
    rows: dict[tuple[str, int], ReplicaUsage] = {}   # insertion order
    kept: BrokerUsage | None = None
    for change, partition, size in steps:
        key = ("t", partition)
        grew_only = False
        if change == "add" and key not in rows:
            rows[key] = ReplicaUsage(topic="t", partition=partition, size_bytes=size, log_start_offset=0,
                                     log_end_offset=size, high_watermark=size)
            grew_only = True
        elif change == "change" and key in rows and rows[key].size_bytes != size:
            rows[key] = rows[key].model_copy(update={"size_bytes": size})
        elif change == "drop" and key in rows:
            rows = {k: v for k, v in rows.items() if k != key}
        before = list(kept.replicas) if kept is not None else None
        report = reports.report(usage({}).model_copy(update={"replicas": list(rows.values())}))
        if grew_only and report.base_seq is not None:
            assert report.replicas_removed == [] and report.replicas[-1] is rows[key], report
        kept = merge_report(kept, report)
        reports.answered(resend=kept is None)
        assert kept is not None and kept.replicas == sorted(rows.values(), key=lambda r: (r.topic, r.partition)), \
            (before, report)
