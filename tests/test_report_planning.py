"""Capacity-report pieces that need no Spark: planning arithmetic, input discovery, file reading,
and the synthetic history."""
from __future__ import annotations

import random
import sqlite3

import pytest

from controller.report import planning
from controller.report.capacity import discover_inputs
from controller.report.datasource import check_file, group_files, read_file_rows
from controller.report.history import HistorySpec, expected_growth_bytes_per_day, generate_history
from controller.report.planning import BrokerSlot, PartitionPlacement


def part(topic, partition, replicas, size, leader=None, isr=None, min_isr=1, rate=0.0):
    replicas = tuple(replicas)
    return PartitionPlacement(topic=topic, partition=partition, replicas=replicas,
                              leader=replicas[0] if leader is None else leader, size_bytes=size,
                              isr=replicas if isr is None else tuple(isr), min_insync_replicas=min_isr,
                              growth_bytes_per_s=rate)


def test_loads_and_skew_by_broker_and_rack():
    """Counts, leaders and bytes per broker; max/mean skew per broker and per rack, by hand."""
    brokers = [BrokerSlot(broker_id=1, rack="a"), BrokerSlot(broker_id=2, rack="a"), BrokerSlot(broker_id=3, rack="b")]
    parts = [part("t", 0, [1, 2], 100), part("t", 1, [1, 3], 50), part("t", 2, [2, 1], 10)]
    loads = planning.broker_loads(brokers, parts)
    assert [(l.broker_id, l.replicas, l.leaders, l.replica_bytes) for l in loads] == [
        (1, 3, 2, 160), (2, 2, 1, 110), (3, 1, 0, 50)]
    skews = {(s.key, s.metric): s for s in planning.skews(loads)}
    assert skews[("broker", "leaders")].max_over_mean == pytest.approx(2 / 1)
    assert skews[("broker", "replicas")].max_over_mean == pytest.approx(3 / 2)
    assert skews[("rack", "replica_bytes")].max_over_mean == pytest.approx(270 / 160)
    assert skews[("rack", "leaders")].min == 0


def test_balance_moves_the_replica_closest_to_half_the_gap():
    """Broker 1 holds 10 + 6 + 4 bytes, broker 2 nothing: the gap is 20, so the 10-byte partition
    moves and the brokers end even at 10 each, with one move of 10 bytes."""
    brokers = [BrokerSlot(broker_id=1, rack="a"), BrokerSlot(broker_id=2, rack="b")]
    parts = [part("t", 0, [1], 10), part("t", 1, [1], 6), part("t", 2, [1], 4)]
    plan = planning.balanced_plan(brokers, parts, tolerance_ratio=0.0)
    assert [(m.topic, m.partition, m.source_broker, m.target_broker, m.size_bytes) for m in plan.moves] == [
        ("t", 0, 1, 2, 10)]
    assert plan.moved_bytes == 10
    assert plan.stopped_because == "balanced within tolerance"
    assert {p.partition: p.replicas for p in plan.partitions} == {0: (2,), 1: (1,), 2: (1,)}


def test_balance_keeps_rack_spread():
    """Broker 1 (rack a) holds t-0 (100 bytes, also on broker 2, rack b) and u-0 (60). The gap to
    empty broker 3 (rack b) is 160; t-0 and u-0 are equally close to half of it and the larger
    would win, but t-0 on brokers 2 and 3 would sit on rack b only, so u-0 moves. After that no
    move lowers the spread (t-0 is larger than the remaining gap of 40)."""
    brokers = [BrokerSlot(broker_id=1, rack="a"), BrokerSlot(broker_id=2, rack="b"), BrokerSlot(broker_id=3, rack="b")]
    parts = [part("t", 0, [1, 2], 100), part("u", 0, [1], 60)]
    plan = planning.balanced_plan(brokers, parts, tolerance_ratio=0.0)
    assert [(m.topic, m.source_broker, m.target_broker) for m in plan.moves] == [("u", 1, 3)]
    assert plan.stopped_because == "no improving move for the most loaded broker"
    unconstrained = [BrokerSlot(broker_id=1, rack="a"), BrokerSlot(broker_id=2, rack="b"), BrokerSlot(broker_id=3, rack="c")]
    plan = planning.balanced_plan(unconstrained, parts, tolerance_ratio=0.0)
    assert [(m.topic, m.source_broker, m.target_broker) for m in plan.moves][0] == ("t", 1, 3)


def test_evacuate_dead_broker_prefers_new_rack_then_least_loaded():
    """Replicas on fenced broker 2 move first, largest first, to a live broker without the
    partition, preferring one on a rack the partition lacks."""
    brokers = [BrokerSlot(broker_id=1, rack="a"), BrokerSlot(broker_id=2, rack="b", live=False),
               BrokerSlot(broker_id=3, rack="b"), BrokerSlot(broker_id=4, rack="a")]
    parts = [part("t", 0, [1, 2], 50), part("t", 1, [2, 4], 30)]
    plan = planning.balanced_plan(brokers, parts, moves_max=2)
    assert [(m.partition, m.source_broker, m.target_broker, m.reason) for m in plan.moves] == [
        (0, 2, 3, "evacuate"), (1, 2, 3, "evacuate")]


def sum_of_squares(brokers, partitions):
    live = {b.broker_id for b in brokers if b.live}
    return sum(l.replica_bytes ** 2 for l in planning.broker_loads(brokers, partitions) if l.broker_id in live)


def test_balance_never_worsens_and_keeps_replicas_valid_on_random_cases():
    """Seeds 0..59: random clusters of 2-8 brokers on 1-3 racks. The balanced plan keeps every
    partition's replica count, never puts two replicas on one broker, never loses a rack, only
    uses live brokers when enough exist, and never raises the sum of squared loads."""
    for seed in range(60):
        rng = random.Random(seed)
        racks = [f"r{i}" for i in range(rng.randint(1, 3))]
        brokers = [BrokerSlot(broker_id=b, rack=rng.choice(racks), live=rng.random() > 0.15)
                   for b in range(1, rng.randint(2, 8) + 1)]
        if sum(b.live for b in brokers) < 2:
            continue
        ids = [b.broker_id for b in brokers]
        parts = [part("t", p, rng.sample(ids, rng.randint(1, min(3, len(ids)))), rng.randint(0, 1000))
                 for p in range(rng.randint(1, 25))]
        plan = planning.balanced_plan(brokers, parts, tolerance_ratio=0.0)
        rack = {b.broker_id: b.rack for b in brokers}
        live = {b.broker_id for b in brokers if b.live}
        for before, after in zip(parts, plan.partitions):
            assert len(after.replicas) == len(before.replicas), f"seed={seed}"
            assert len(set(after.replicas)) == len(after.replicas), f"seed={seed}"
            if len(live) >= len(before.replicas):
                assert set(after.replicas) <= live, f"seed={seed}"
        evacuated = [p for p in parts if set(p.replicas) <= live]
        kept = {(p.topic, p.partition) for p in evacuated}
        for before, after in zip(parts, plan.partitions):
            if (before.topic, before.partition) in kept:
                assert len({rack[b] for b in after.replicas}) >= len({rack[b] for b in before.replicas}), \
                    f"seed={seed}"
        if all(set(p.replicas) <= live for p in parts):
            assert sum_of_squares(brokers, plan.partitions) <= sum_of_squares(brokers, parts), f"seed={seed}"


def test_add_brokers_takes_racks_in_turn_and_median_capacity():
    brokers = [BrokerSlot(broker_id=1, rack="b", capacity_bytes=10), BrokerSlot(broker_id=4, rack="a", capacity_bytes=30),
               BrokerSlot(broker_id=2, rack="a", capacity_bytes=20)]
    grown = planning.add_brokers(brokers, 3)
    assert [(b.broker_id, b.rack, b.capacity_bytes) for b in grown[3:]] == [(5, "a", 20), (6, "b", 20), (7, "a", 20)]
    with pytest.raises(ValueError, match="cannot add -1 brokers"):
        planning.add_brokers(brokers, -1)


def test_replication_factor_grow_and_shrink():
    """Growing t from RF 1 to 2 puts each new replica on the least loaded broker of another rack;
    shrinking back keeps the leader and drops the follower on the most loaded broker."""
    brokers = [BrokerSlot(broker_id=1, rack="a"), BrokerSlot(broker_id=2, rack="a"), BrokerSlot(broker_id=3, rack="b"),
               BrokerSlot(broker_id=4, rack="b")]
    parts = [part("t", 0, [1], 10), part("t", 1, [2], 20), part("u", 0, [3], 5)]
    grown = planning.change_replication_factor(brokers, parts, "t", 2)
    assert {(p.topic, p.partition): p.replicas for p in grown.partitions} == {
        ("t", 0): (1, 4), ("t", 1): (2, 3), ("u", 0): (3,)}
    assert sum(m.size_bytes for m in grown.moves) == 30
    shrunk = planning.change_replication_factor(brokers, grown.partitions, "t", 1)
    assert {(p.topic, p.partition): p.replicas for p in shrunk.partitions if p.topic == "t"} == {
        ("t", 0): (1,), ("t", 1): (2,)}
    with pytest.raises(ValueError, match="between 1 and the 4 live brokers"):
        planning.change_replication_factor(brokers, parts, "t", 5)
    with pytest.raises(ValueError, match="topic 'nope' is not in the snapshot"):
        planning.change_replication_factor(brokers, parts, "nope", 2)


def test_lose_broker_rehomes_its_replicas():
    brokers = [BrokerSlot(broker_id=1, rack="a"), BrokerSlot(broker_id=2, rack="b"), BrokerSlot(broker_id=3, rack="c")]
    parts = [part("t", 0, [1, 2], 40), part("t", 1, [2, 3], 10)]
    plan = planning.lose_broker(brokers, parts, 2)
    assert {p.partition: p.replicas for p in plan.partitions} == {0: (1, 3), 1: (1, 3)}
    assert plan.moved_bytes == 50
    assert plan.partitions[1].leader == 3  # its leader was on broker 2
    with pytest.raises(ValueError, match="broker 9 is not in the snapshot"):
        planning.lose_broker(brokers, parts, 9)


def test_balanced_leaders_spread_leadership():
    """Four partitions all led by broker 1, replicas [1, 2]: two keep 1, two move to 2."""
    parts = [part("t", p, [1, 2], 1) for p in range(4)]
    assert planning.balanced_leaders(parts) == {("t", 0): 1, ("t", 1): 2, ("t", 2): 1, ("t", 3): 2}


def test_least_squares_and_days_until_full():
    xs = [0.0, 0.5, 1.0, 1.5]
    fit = planning.least_squares(xs, [1e13 + 2e11 * x for x in xs])
    assert fit.slope_bytes_per_day == pytest.approx(2e11)
    assert fit.r2 == pytest.approx(1.0)
    assert planning.least_squares([1.0], [5.0]).slope_bytes_per_day is None
    assert planning.days_until_full(capacity_bytes=1000, used_bytes=400, slope_bytes_per_day=100) == 6
    assert planning.days_until_full(capacity_bytes=1000, used_bytes=400, slope_bytes_per_day=-1) is None


def test_discover_inputs_names_foreign_files(tmp_path):
    good = tmp_path / "snapshot-20260101T000000Z-000000000001.sqlite"
    good.write_bytes(b"")
    (tmp_path / ".tmp-abc-snapshot-20260101T000000Z-000000000002.sqlite").write_bytes(b"")
    (tmp_path / "notes.txt").write_text("x")
    paths, warnings = discover_inputs([str(tmp_path), str(tmp_path / "missing-*.sqlite")])
    assert paths == [str(good)]
    assert [w[0] for w in warnings] == [str(tmp_path / "notes.txt"), str(tmp_path / "missing-*.sqlite")]


def test_group_files_near_equal_contiguous():
    assert group_files([str(i) for i in range(7)], 3) == [["0", "1", "2"], ["3", "4"], ["5", "6"]]
    assert group_files(["a"], 4) == [["a"]]


def test_reader_flags_corrupt_and_foreign_files(tmp_path):
    """check_file says why a file is unusable; read_file_rows raises instead of returning part of it."""
    spec = HistorySpec(brokers=4, partitions=8, snapshots=4)
    good = generate_history(spec, tmp_path / "h")[0]
    truncated = tmp_path / "truncated.sqlite"
    truncated.write_bytes(good.read_bytes()[:3000])
    foreign = tmp_path / "foreign.sqlite"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE cluster (name TEXT)")
    text = tmp_path / "text.sqlite"
    text.write_text("not a database at all, just some words " * 50)
    assert check_file(str(good))[1:3] == (True, None)
    assert "lacks columns" in check_file(str(foreign))[2]
    for bad in (truncated, text):
        row = check_file(str(bad))
        assert row[1] is False and "DatabaseError" in row[2], row
        with pytest.raises(sqlite3.DatabaseError):
            read_file_rows(str(bad), "replica_usage")
    rows = read_file_rows(str(good), "broker_series")
    assert [r[3] for r in rows] == [1, 2, 3]  # the joiner, broker 4, is not there yet


def test_history_is_deterministic_by_seed(tmp_path):
    """Same seed, same rows; another seed, other rows; rates known per broker."""
    spec = HistorySpec(brokers=4, partitions=10, snapshots=3, seed=7)
    first = generate_history(spec, tmp_path / "a")
    again = generate_history(spec, tmp_path / "b", jobs=2)
    other = generate_history(HistorySpec(brokers=4, partitions=10, snapshots=3, seed=8), tmp_path / "c")
    dump = lambda p: sorted(read_file_rows(str(p), "replica_usage"), key=repr)  # noqa: E731
    assert [p.name for p in first] == [p.name for p in again]
    for a, b in zip(first, again):
        assert [r[1:] for r in dump(a)] == [r[1:] for r in dump(b)]
    assert [r[1:] for r in dump(first[-1])] != [r[1:] for r in dump(other[-1])]
    growth = expected_growth_bytes_per_day(spec)
    assert set(growth) == {1, 2, 3, 4} and expected_growth_bytes_per_day(spec, at_index=0).keys() == {1, 2, 3}
    with pytest.raises(ValueError, match="--brokers must be at least 4"):
        HistorySpec(brokers=3)


def test_generate_history_command(tmp_path, capsys):
    """`biplane report generate-history` writes the files and prints each broker's known growth;
    bad parameters are refused with exit status 2 and a message naming the option."""
    from controller.report.cli import main

    out = tmp_path / "snaps"
    assert main(["generate-history", "--out", str(out), "--brokers", "4", "--partitions", "8",
                 "--snapshots", "5", "--interval", "60", "--seed", "9"], "biplane report") == 0
    assert len(list(out.glob("snapshot-*.sqlite"))) == 5
    printed = capsys.readouterr().out
    assert "broker 4 joins at snapshot 2" in printed and "broker 1: Biplane's bytes grow" in printed
    assert main(["generate-history", "--out", str(out), "--brokers", "2"], "biplane report") == 2
    assert "--brokers must be at least 4" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["capacity", str(out), "--out", str(tmp_path / "r"), "--replication-factor", "orders"],
             "biplane report")
    assert "expected TOPIC=REPLICATION_FACTOR" in capsys.readouterr().err


def test_plan_reports_on_a_hand_checked_cluster():
    """Brokers 1 (rack a), 2 (b), 3 (c); t-0 on [1, 2], 40 bytes, min ISR 2; t-1 on [2, 3], 10 bytes,
    led by 2. Losing broker 2: 50 bytes to copy, one leadership lost, t-0 under min ISR.
    RF 3 for t adds 50 bytes. Adding broker 4 (rack a): only t-1 may move to it (t-0 would
    leave rack b), so one move of 10 bytes."""
    from controller.report.capacity import ReportOptions, plan_reports

    brokers = [BrokerSlot(broker_id=1, rack="a", capacity_bytes=100, used_bytes=45),
               BrokerSlot(broker_id=2, rack="b", capacity_bytes=100, used_bytes=55),
               BrokerSlot(broker_id=3, rack="c", capacity_bytes=100, used_bytes=12)]
    one_byte_a_day = 1 / 86_400
    parts = [part("t", 0, [1, 2], 40, min_isr=2, rate=one_byte_a_day), part("t", 1, [2, 3], 10, rate=one_byte_a_day)]
    options = ReportOptions(add_brokers=1, replication_factor_change=("t", 3), lose_broker=2)
    tables, summary, plans = plan_reports(brokers, parts, options)
    lost = summary["lose_broker"]
    assert (lost["bytes_to_move"], lost["leaderships_lost"],
            lost["partitions_under_min_isr_until_rereplicated"], lost["replicas_without_a_home"]) == (50, 1, 1, 0)
    assert summary["replication_factor"]["bytes_added"] == 50
    assert summary["add_brokers"]["new_broker_ids"] == [4]
    assert (summary["add_brokers"]["moves"], summary["add_brokers"]["bytes_to_move"]) == (1, 10)
    moves = tables["whatif_add_brokers_moves"]
    assert list(moves[["topic", "partition", "source_broker", "target_broker"]].itertuples(index=False, name=None)) \
        == [("t", 1, 2, 4)]
    after = tables["whatif_add_brokers"].set_index("broker_id")
    assert after.loc[2, "disk_used_after_bytes"] == 45  # 55 used, 10 bytes moved away
    assert after.loc[2, "days_until_full_after"] == pytest.approx(55)  # 55 bytes free, t-0 grows 1 byte a day
    skew = tables["broker_skew"].set_index("broker_id")
    assert list(skew["replicas"]) == [1, 2, 1] and list(skew["leaders"]) == [1, 1, 0]


def test_lose_broker_shows_it_lost_and_plans_an_executable_timed_move():
    """The hand-checked cluster above in KiB, losing broker 2: its row says lost (not live) and
    has no days until full; the plan file re-homes t-0 on [1, 3] and t-1 on [1, 3] in
    `reassign --plan` form. Broker 3 receives t-0's 40 KiB, broker 1 t-1's 10 KiB: at 20 KiB/s
    per receiving broker that takes 2 s."""
    from controller.report.capacity import ReportOptions, lose_broker_plan_file, plan_reports

    kib = 1024
    brokers = [BrokerSlot(broker_id=1, rack="a", capacity_bytes=100 * kib, used_bytes=45 * kib),
               BrokerSlot(broker_id=2, rack="b", capacity_bytes=100 * kib, used_bytes=55 * kib),
               BrokerSlot(broker_id=3, rack="c", capacity_bytes=100 * kib, used_bytes=12 * kib)]
    parts = [part("t", 0, [1, 2], 40 * kib, min_isr=2, rate=1.0), part("t", 1, [2, 3], 10 * kib, rate=1.0)]
    tables, summary, plans = plan_reports(brokers, parts,
                                          ReportOptions(lose_broker=2, throttle_bytes_per_s=20 * kib))
    frame = tables["whatif_lose_broker"]
    states = dict(zip(frame["broker_id"], frame["state"]))
    assert states == {1: "live", 2: "lost", 3: "live"}
    assert frame.set_index("broker_id")["days_until_full_after"].isna()[2]
    assert list(frame["broker_id"])[-1] == 2  # a lost broker never fills: last in urgency order
    assert plans[lose_broker_plan_file(2)] == {
        "version": 1, "throttle_bytes_per_s": 20 * kib,
        "partitions": [{"topic": "t", "partition": 0, "replicas": [1, 3], "bytes_to_move": 40 * kib},
                       {"topic": "t", "partition": 1, "replicas": [1, 3], "bytes_to_move": 10 * kib}]}
    lost = summary["lose_broker"]
    assert (lost["plan_file"], lost["partitions_changed"], lost["bytes_to_move"]) == (
        "reassign_lose_broker_2.json", 2, 50 * kib)
    assert (lost["busiest_broker"], lost["busiest_broker_bytes"], lost["estimated_seconds"]) == (3, 40 * kib, 2.0)


def test_transfer_estimate_counts_each_new_replica_once_at_the_per_broker_throttle():
    """Replicas moved twice by the balancer (4 -> 2 -> 3) are copied once, to 3; the broker
    receiving the most (3, 100 bytes) sets the time at 40 bytes/s; leader 1 serves both."""
    before = [part("a", 0, [1, 4], 100), part("b", 0, [1, 5], 60)]
    after = planning.Plan(
        partitions=(part("a", 0, [1, 3], 100), part("b", 0, [1, 2], 60)),
        moves=(planning.Move(topic="a", partition=0, source_broker=4, target_broker=2, size_bytes=100, reason="balance"),
               planning.Move(topic="a", partition=0, source_broker=2, target_broker=3, size_bytes=100, reason="balance"),
               planning.Move(topic="b", partition=0, source_broker=5, target_broker=2, size_bytes=60, reason="balance")),
        stopped_because="test")
    estimate = planning.transfer_estimate(before, after, throttle_bytes_per_s=40)
    assert estimate.bytes_to_move == 160 and after.moved_bytes == 260
    assert estimate.bytes_in_by_broker == {2: 60, 3: 100} and estimate.bytes_out_by_broker == {1: 160}
    assert (estimate.busiest_broker, estimate.seconds) == (3, 2.5)
    with pytest.raises(ValueError, match="throttle must be > 0"):
        planning.transfer_estimate(before, after, throttle_bytes_per_s=0)


def test_throttle_flag_is_mib_per_second_and_refuses_what_a_cluster_would(capsys):
    """--throttle-mb-s 25 is 25 MiB/s in the options (and so in the plan files); below
    1024 bytes/s it is refused with exit status 2 and the smallest allowed value."""
    from controller.report.cli import _parser, main, options_from_args

    args = _parser("biplane report").parse_args(["capacity", "d", "--out", "o", "--throttle-mb-s", "25"])
    assert options_from_args(args).throttle_bytes_per_s == 25 * 2**20
    assert options_from_args(_parser("biplane report").parse_args(
        ["capacity", "d", "--out", "o"])).throttle_bytes_per_s == 50 * 2**20
    assert main(["capacity", "d", "--out", "o", "--throttle-mb-s", "0.0001"], "biplane report") == 2
    assert "--throttle-mb-s must be at least 0.000976562 (1024 bytes/s" in capsys.readouterr().err
