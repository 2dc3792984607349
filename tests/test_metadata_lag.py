from __future__ import annotations

from dataplane.broker.metadata_lag import LagReport, MetadataLag


def test_a_lag_over_both_bounds_is_reported_once_then_its_end_once():
    lag = MetadataLag(records_max=10, duration_ms_max=1000)
    assert lag.observe(now_ms=0, applied=5, committed=100) is None   # behind, not yet for long
    assert lag.observe(now_ms=999, committed=120) is None
    assert lag.observe(now_ms=1000) == LagReport(True, 115, 1000)
    assert lag.observe(now_ms=5000, applied=50) is None                 # still behind: no new line
    assert lag.records() == 70 and lag.duration_ms(5000) == 5000
    assert lag.observe(now_ms=6000, applied=115) == LagReport(False, 5, 6000)
    assert lag.observe(now_ms=7000) is None and lag.duration_ms(7000) == 0


def test_a_short_or_small_lag_is_not_an_episode():
    lag = MetadataLag(records_max=10, duration_ms_max=1000)
    assert lag.observe(now_ms=0, applied=0, committed=10) is None       # within the record bound
    assert lag.observe(now_ms=5000) is None
    assert lag.observe(now_ms=5000, committed=50) is None                # over it, only just now
    assert lag.observe(now_ms=5500, applied=50) is None                  # caught up before the time bound
    assert lag.observe(now_ms=9000, committed=100) is None
    assert lag.behind_since_ms == 9000                                   # a new start, not the old one


def test_offsets_only_move_forward():
    lag = MetadataLag(records_max=0, duration_ms_max=0)
    lag.observe(now_ms=0, applied=10, committed=10)
    lag.observe(now_ms=1, applied=3, committed=4)                        # a stale report changes nothing
    assert (lag.applied, lag.committed, lag.lagging) == (10, 10, False)


def test_a_few_records_unapplied_for_long_are_an_episode_too():
    """A stuck listener or fetch leaves a broker a handful of records behind: under the record
    bound, but no broker takes 10 s to apply one. Reported once the applied offset has not moved
    for that long while behind; it ends once caught up. A steady trickle applied as it comes
    (behind by one or two at every look, but moving) is not stuck."""
    lag = MetadataLag(records_max=100, duration_ms_max=5_000, stuck_ms_max=10_000)
    assert lag.observe(now_ms=0, applied=50, committed=53) is None
    assert lag.observe(now_ms=9_999, committed=55) is None
    assert lag.observe(now_ms=10_000) == LagReport(True, 5, 10_000)
    assert lag.observe(now_ms=20_000) is None                            # one line per episode
    assert lag.observe(now_ms=21_000, applied=55) == LagReport(False, 0, 21_000)
    moving = MetadataLag(records_max=100, duration_ms_max=5_000, stuck_ms_max=10_000)
    for t in range(0, 60_000, 500):
        assert moving.observe(now_ms=t, committed=t // 500 + 2) is None
        assert moving.observe(now_ms=t + 1, applied=t // 500) is None    # always 2 behind, always moving


def test_the_bounds_are_broker_flags():
    from dataplane.broker.main import build_parser, config_from_args
    args = build_parser("biplane broker").parse_args([
        "--broker-id", "1", "--data-dir", "/tmp/x", "--controller", "http://127.0.0.1:1",
        "--metadata-lag-records-max", "7", "--metadata-lag-ms-max", "800", "--metadata-stuck-ms-max", "2500"])
    c = config_from_args(args)
    assert (c.metadata_lag_records_max, c.metadata_lag_ms_max, c.metadata_stuck_ms_max) == (7, 800, 2500)


def test_a_zero_stuck_bound_reports_only_a_broker_behind():
    """--metadata-stuck-ms-max 0 (the flag allows it): a broker caught up is not stuck, and one
    behind without progress is an episode at once. It used to fail an assertion on the first
    applied image, which stopped the broker."""
    lag = MetadataLag(records_max=100, duration_ms_max=5_000, stuck_ms_max=0)
    assert lag.observe(now_ms=0, applied=5) is None
    assert lag.observe(now_ms=10, committed=7) == LagReport(True, 2, 0)
    assert lag.observe(now_ms=20, applied=7) == LagReport(False, 0, 10)
