"""The fault harness's own self-test: the history checker is right on a clean history, and
every check fires on a tampered copy of it; the fault schedule is a pure function of the seed.

No processes, no namespaces: these run in the ordinary suite in well under a second.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import os
import random

import pytest

from tests.chaos.checker import FENCE_EXPLAIN_AFTER_S, VIOLATION_KINDS, check
from tests.chaos.fences import parse_fences
from tests.chaos.history import FaultRun, Fence, History, Seen, Send, parse_value, record_value, tp_key
from tests.chaos.schedule import EXTRA_WEIGHTS, FAULT_WEIGHTS, GRAY_WEIGHTS, QUORUM_REMOVING, SCENARIOS, make_schedule

TOPIC = "pull-isr-fsync"


def clean_history(seed: int = 1, per_partition: int = 40) -> History:
    """A history as a correct cluster would leave it: two producers interleaving on two
    partitions, some sends failed (never written), consumers seeing a prefix, three replicas
    agreeing below the HW (one longer above it), an epoch-start control entry in each log."""
    rng = random.Random(seed)
    sends: list[Send] = []
    final: dict[str, list[tuple[int, str]]] = {}
    seen: list[Seen] = []
    replicas: dict[str, dict[str, list[tuple[int, str]]]] = {}
    hws: dict[str, int] = {}
    t = 0.0
    for partition in range(2):
        tp = tp_key(TOPIC, partition)
        log: list[tuple[int, str]] = []
        entries = [(0, "e1|<control>")]
        offset = 1
        seqs = {"p1": 0, "p2": 0}
        for _ in range(per_partition):
            producer = rng.choice(["p1", "p2"])
            seq = seqs[producer]
            seqs[producer] += 1
            value = record_value(producer, TOPIC, partition, seq)
            t += 0.01
            if rng.random() < 0.1:   # failed, never appended
                sends.append(Send(producer=producer, tp=tp, seq=seq, value=value, sent_s=t, done_s=t + 1,
                                  offset=None, error="DeliveryTimeoutError:REQUEST_TIMED_OUT"))
                continue
            sends.append(Send(producer=producer, tp=tp, seq=seq, value=value, sent_s=t, done_s=t + 0.05,
                              offset=offset, error=None))
            log.append((offset, value))
            entries.append((offset, f"e1|{value}"))
            offset += 1
        final[tp] = log
        hws[tp] = offset
        seen += [Seen(consumer="k1", tp=tp, offset=o, value=v, at_s=1.0) for o, v in log[: len(log) // 2]]
        replicas[tp] = {"b1": list(entries), "b2": list(entries), "b3": entries + [(offset, "e1|beyond-hw")]}
    faults = [FaultRun(index=0, kind="kill_broker", targets=("b1",), start_s=0.1, end_s=0.2, removes_quorum=False)]
    return History(seed=seed, topics={TOPIC: {}}, sends=sends, seen=seen, faults=faults, final_reads=final,
                   high_watermarks=hws, replicas=replicas, last_heal_s=0.2, end_s=t + 1)


def acked(h: History, tp: str) -> list[Send]:
    return [s for s in h.sends if s.tp == tp and s.offset is not None]


def test_clean_history_has_no_violation() -> None:
    """Claim: a history a correct cluster leaves passes every check (no false alarm)."""
    for seed in range(20):
        report = check(clean_history(seed))
        assert report.ok, f"seed={seed}: {report.counts} {report.violations}"


def test_history_round_trips_through_json() -> None:
    h = clean_history()
    again = History.from_json(json.loads(json.dumps(h.to_json())))
    assert again.to_json() == h.to_json()
    assert check(again).counts == check(h).counts


def tamper_lost(h: History) -> None:
    tp = tp_key(TOPIC, 0)
    victim = acked(h, tp)[3]
    h.final_reads[tp] = [(o, v) for o, v in h.final_reads[tp] if v != victim.value]


def tamper_duplicated(h: History) -> None:
    tp = tp_key(TOPIC, 1)
    log = h.final_reads[tp]
    log.append((log[-1][0] + 1, log[2][1]))   # an earlier record appended again (the re-stamp bug)


def tamper_misplaced(h: History) -> None:
    tp = tp_key(TOPIC, 0)
    log = h.final_reads[tp]
    log[-1] = (log[-1][0] + 5, log[-1][1])    # the last record sits elsewhere than acknowledged


def tamper_reordered(h: History) -> None:
    tp = tp_key(TOPIC, 1)
    log = h.final_reads[tp]
    # swap the values at two offsets holding the same producer's records
    by_producer: dict[str, list[int]] = {}
    for i, (_, v) in enumerate(log):
        parsed = parse_value(v)
        assert parsed is not None
        by_producer.setdefault(parsed[0], []).append(i)
    i, j = next(ix for ix in by_producer.values() if len(ix) >= 2)[:2]
    (oi, vi), (oj, vj) = log[i], log[j]
    log[i], log[j] = (oi, vj), (oj, vi)


def tamper_vanished(h: History) -> None:
    seen = h.seen[0]
    h.final_reads[seen.tp] = [(o, v) for o, v in h.final_reads[seen.tp] if o != seen.offset]


def tamper_diverged(h: History) -> None:
    tp = tp_key(TOPIC, 0)
    log = h.replicas[tp]["b2"]
    offset, _ = log[5]
    log[5] = (offset, "e2|something-else")


TAMPERS = {"lost": tamper_lost, "duplicated": tamper_duplicated, "misplaced": tamper_misplaced,
           "reordered": tamper_reordered, "vanished": tamper_vanished, "diverged": tamper_diverged}


@pytest.mark.parametrize("kind", VIOLATION_KINDS)
def test_each_check_fires_on_a_tampered_copy(kind: str) -> None:
    """Claim: each kind of violation, put into a copy of a clean history, is reported, and
    under its own name."""
    original = clean_history()
    tampered = copy.deepcopy(original)
    TAMPERS[kind](tampered)
    report = check(tampered)
    assert report.counts[kind] >= 1, f"{kind} not detected: {report.counts}"
    assert check(original).ok   # the original was not touched


def test_divergence_above_the_high_watermark_is_allowed() -> None:
    h = clean_history()
    tp = tp_key(TOPIC, 0)
    hw = h.high_watermarks[tp]
    h.replicas[tp]["b1"].append((hw, "e3|uncommitted"))
    h.replicas[tp]["b2"].append((hw, "e4|other-uncommitted"))
    assert check(h).counts["diverged"] == 0


def test_a_duplicate_is_not_also_called_a_reorder() -> None:
    h = clean_history()
    tamper_duplicated(h)
    counts = check(h).counts
    assert counts["duplicated"] == 1 and counts["reordered"] == 0, counts


def test_failed_sends_may_be_absent_or_present_once() -> None:
    """A failed send's outcome is unknown: absent is fine, once is fine (only twice is not)."""
    h = clean_history()
    failed = next(s for s in h.sends if s.offset is None)
    log = h.final_reads[failed.tp]
    # present once, at the end (its producer sent later records, so it must be its latest)
    h.sends = [s for s in h.sends if not (s.tp == failed.tp and s.producer == failed.producer and s.seq > failed.seq)]
    kept = {s.value for s in h.sends}
    h.final_reads[failed.tp] = [(o, v) for o, v in log if v in kept] + [(log[-1][0] + 1, failed.value)]
    h.seen, h.replicas = [], {}
    assert check(h).counts["duplicated"] == 0


def test_gap_figures_skip_quorum_loss_and_count_a_stall_to_the_end() -> None:
    h = clean_history()
    tp = tp_key(TOPIC, 0)
    base = [s for s in h.sends if s.tp != tp]
    sends = [Send(producer="p1", tp=tp, seq=i, value=record_value("p1", TOPIC, 0, i), sent_s=float(i),
                  done_s=float(i) + 0.1, offset=i, error=None) for i in range(10)]
    # acks stop between 4.1 and 9.1 except for a quorum-removing fault covering 5..8
    sends = [dataclasses.replace(s, done_s=9.1) if 5 <= s.seq <= 8 else s for s in sends]
    h.sends = base + sends
    h.faults = [FaultRun(index=0, kind="kill_broker_pair", targets=("b1", "b2"), start_s=5.0, end_s=8.0,
                         removes_quorum=True)]
    gaps = check(h).figures["longest_ack_gap_s_by_partition"]
    assert gaps[tp] == pytest.approx(2.0, abs=0.01)   # 4.1..9.1 is 5 s, 3 s of it under quorum loss
    stalled = [dataclasses.replace(s, offset=None, error="X", done_s=None) if s.seq >= 3 else s for s in sends]
    h.sends, h.faults = base + stalled, []
    assert check(h).figures["longest_ack_gap_s_by_partition"][tp] == pytest.approx(9 - 2.1, abs=0.01)


def test_saved_history_from_a_real_run_when_given() -> None:
    """With BIPLANE_CHAOS_HISTORY=path/history.json, tamper with a copy of a real run's history
    and show every check firing on it too."""
    path = os.environ.get("BIPLANE_CHAOS_HISTORY")
    if not path:
        pytest.skip("set BIPLANE_CHAOS_HISTORY to a history.json from scripts/chaos")
    original = History.load(path)
    before = check(original).counts
    for kind, tamper in (("lost", _tamper_real_lost), ("duplicated", _tamper_real_duplicated),
                         ("misplaced", _tamper_real_misplaced), ("vanished", _tamper_real_vanished),
                         ("diverged", _tamper_real_diverged)):
        h = copy.deepcopy(original)
        tamper(h)
        assert check(h).counts[kind] > before[kind], kind


def _real_tp(h: History) -> str:
    return next(tp for tp, log in h.final_reads.items() if len(log) > 5 and any(
        s.tp == tp and s.offset is not None for s in h.sends))


def _tamper_real_lost(h: History) -> None:
    tp = _real_tp(h)
    victim = next(s for s in h.sends if s.tp == tp and s.offset is not None)
    h.final_reads[tp] = [(o, v) for o, v in h.final_reads[tp] if v != victim.value]


def _tamper_real_duplicated(h: History) -> None:
    tp = _real_tp(h)
    log = h.final_reads[tp]
    log.append((log[-1][0] + 1, log[0][1]))


def _tamper_real_misplaced(h: History) -> None:
    tp = _real_tp(h)
    victim = next(s for s in h.sends if s.tp == tp and s.offset is not None)
    h.final_reads[tp] = [(o + 1000 if v == victim.value else o, v) for o, v in h.final_reads[tp]]


def _tamper_real_vanished(h: History) -> None:
    seen = h.seen[0]
    h.final_reads[seen.tp] = [(o, v) for o, v in h.final_reads[seen.tp] if o != seen.offset]


def _tamper_real_diverged(h: History) -> None:
    tp = next(tp for tp, logs in h.replicas.items() if len(logs) >= 2 and all(len(l) > 2 for l in logs.values()))
    broker = sorted(h.replicas[tp])[0]
    offset, _ = h.replicas[tp][broker][1]
    h.replicas[tp][broker][1] = (offset, "e999|tampered")
    h.high_watermarks[tp] = max(h.high_watermarks.get(tp, 0), offset + 1)


# ---------------------------------------------------------------------- the schedule

def test_schedule_is_a_pure_function_of_the_seed() -> None:
    a = make_schedule(seed=42, duration_s=600)
    b = make_schedule(seed=42, duration_s=600)
    c = make_schedule(seed=43, duration_s=600)
    assert a == b
    assert a != c


def test_short_run_has_at_least_50_faults_and_faults_do_not_overlap() -> None:
    """Claim: the CI run's length (150 s of faults) gives at least 50 faults for any seed,
    run one at a time."""
    for seed in range(200):
        faults = make_schedule(seed=seed, duration_s=150, start_s=4.0)
        assert len(faults) >= 50, f"seed={seed}: {len(faults)} faults"
        for f, g in zip(faults, faults[1:]):
            assert f.end_s < g.start_s, f"seed={seed}: {f} overlaps {g}"
        assert faults[-1].end_s <= 154.0


def test_every_kind_is_scheduled_with_valid_targets() -> None:
    faults = make_schedule(seed=5, duration_s=3600)
    kinds = {f.kind for f in faults}
    assert kinds == set(FAULT_WEIGHTS)
    names = {"b1", "b2", "b3", "c1", "c2", "c3", "leader"}
    for f in faults:
        assert f.targets and set(f.targets) <= names, f
        assert f.removes_quorum == (f.kind in QUORUM_REMOVING)
        if f.kind == "cut_one_way":
            assert f.targets[0] != f.targets[1]
        if f.kind.endswith("_pair"):
            assert len(set(f.targets)) == 2


def test_extra_kinds_come_only_when_asked_for() -> None:
    """Claim: a kind outside the default mix (pause_controller_leader) changes no seed's default
    schedule, and is scheduled, aimed at the leader, when --kinds names it."""
    assert not {f.kind for f in make_schedule(seed=5, duration_s=3600)} & set(EXTRA_WEIGHTS)
    faults = make_schedule(seed=5, duration_s=60, kinds=("pause_controller_leader",))
    assert faults and all(f.kind == "pause_controller_leader" and f.targets == ("leader",) for f in faults)


def test_schedule_refuses_unknown_kinds() -> None:
    with pytest.raises(ValueError, match="unknown fault kinds"):
        make_schedule(seed=1, duration_s=10, kinds=("meteor",))


def test_unreadable_partition_is_checked_on_the_replicas_disks() -> None:
    """Claim: when a partition cannot be read back, the check does not call every acknowledged
    record lost; it looks for them on the replicas' disks, and it reports the partition as a
    liveness failure."""
    h = clean_history()
    tp = tp_key(TOPIC, 0)
    del h.final_reads[tp]
    h.unreadable = [tp]
    report = check(h)
    assert report.safe, report.counts
    assert not report.ok and report.liveness["unreadable_partitions"] == [tp]
    victim = acked(h, tp)[2]
    for broker in h.replicas[tp]:
        h.replicas[tp][broker] = [(o, e) for o, e in h.replicas[tp][broker] if not e.endswith(victim.value)]
    assert check(h).counts["lost"] == 1


def test_only_replicas_in_the_final_isr_are_compared() -> None:
    h = clean_history()
    tamper_diverged(h)   # b2 differs below the HW
    tp = tp_key(TOPIC, 0)
    assert check(h).counts["diverged"] == 2   # pairs (b1, b2) and (b2, b3)
    h.isr_at_end = {tp: ["b1", "b3"]}
    assert check(h).counts["diverged"] == 0
    h.isr_at_end = {tp: ["b1", "b2", "b3"]}
    assert check(h).counts["diverged"] == 2


def test_a_process_that_exits_unasked_fails_the_run() -> None:
    """Claim: a process that died with no fault killing it makes the run fail, though the
    harness restarted it and no record was harmed."""
    h = clean_history()
    assert check(h).ok
    h.exits = ["b2 exited (code 1) at 12.0 s: OSError(28, 'No space left on device')"]
    report = check(h)
    assert report.safe and not report.ok
    assert report.liveness["processes_exited"] == h.exits


def test_liveness_advisory_gates_on_violations_and_crashes_only(capsys: pytest.CaptureFixture[str]) -> None:
    """Claim: with --liveness-advisory a run whose only failures are liveness ones exits 0, while
    a safety violation or a process that died unasked still exits 1; without it, any failure is 1."""
    from tests.chaos.main import report_and_exit_code
    h = clean_history()
    tp = tp_key(TOPIC, 0)
    del h.final_reads[tp]
    h.unreadable = [tp]                       # a liveness failure only
    report = check(h)
    assert report.safe and not report.ok
    assert report_and_exit_code(h, report, [], None) == 1
    assert report_and_exit_code(h, report, [], None, liveness_advisory=True) == 0
    h.exits = ["b1 exited (code 1) at 3.0 s: boom"]
    assert report_and_exit_code(h, check(h), [], None, liveness_advisory=True) == 1
    h.exits = []
    victim = acked(h, tp)[2]
    for broker in h.replicas[tp]:
        h.replicas[tp][broker] = [(o, e) for o, e in h.replicas[tp][broker] if not e.endswith(victim.value)]
    assert report_and_exit_code(h, check(h), [], None, liveness_advisory=True) == 1
    capsys.readouterr()


# ---------------------------------------------------------------------- gray faults

def test_the_gray_scenario_schedules_only_its_kinds_long_enough_to_see_a_recovery() -> None:
    faults = make_schedule(seed=3, duration_s=600, kinds=SCENARIOS["gray"])
    assert {f.kind for f in faults} == set(GRAY_WEIGHTS)
    for f in faults:
        assert f.duration_s >= 6.0, f
        if f.kind == "cut_controller_leader":
            assert f.targets == ("leader",), f   # resolved when the fault begins
            continue
        assert set(f.targets) <= {"b1", "b2", "b3"}, f
        assert len(set(f.targets)) == (2 if f.kind == "cut_follower" else 1), f
    # The default mix is unchanged by the scenario's kinds: the same seed, the same schedule.
    assert not {f.kind for f in make_schedule(seed=3, duration_s=600)} & set(GRAY_WEIGHTS)


def test_gray_figures_group_partitions_by_their_leader_as_the_fault_began() -> None:
    """b1 is cut for [10, 17]: q/0 (b1 led it) acks again after 3 s, q/1 (b2) never stops,
    i/1 (b2) waits 2.5 s for b1 to leave its ISR; i/0 (b1) never comes back: over target."""
    topics = {"q": {"commit_policy": "quorum"}, "i": {"commit_policy": "isr", "replica_lag_time_max_ms": 2000}}
    acks = {"q/0": [9.9] + [i / 10 for i in range(130, 176)], "q/1": [i / 10 for i in range(95, 175)],
            "i/0": [9.9, 17.6], "i/1": [9.9] + [i / 10 for i in range(124, 176)]}
    sends = [Send(producer="p1", tp=tp, seq=n, value=record_value("p1", tp.split("/")[0], int(tp[-1]), n),
                  sent_s=t - 0.01, done_s=t, offset=n, error=None)
             for tp, times in acks.items() for n, t in enumerate(times)]
    fault = FaultRun(index=0, kind="cut_leader", targets=("b1",), start_s=10.0, end_s=17.0, removes_quorum=False,
                     leaders={"q/0": "b1", "q/1": "b2", "i/0": "b1", "i/1": "b2"})
    h = History(seed=1, topics=topics, sends=sends, seen=[], faults=[fault], final_reads={}, high_watermarks={},
                replicas={}, last_heal_s=17.0, end_s=18.0)
    gray = check(h).figures["gray"]
    assert gray["targets_s"] == {"others_quorum": 1.0, "others_isr": 3.0, "cut_quorum": 3.5, "cut_isr": 4.0}
    row = gray["by_kind"]["cut_leader"]
    assert row["longest_gap_s"] == {"cut_quorum": 3.0, "others_quorum": 0.1, "cut_isr": 7.0, "others_isr": 2.4}
    assert row["over_target"] == ["cut_isr"]
    assert row["worst"][0]["cut_isr"] == {"gap_s": 7.0, "partition": "i/0"}
    again = History.from_json(json.loads(json.dumps(h.to_json())))
    assert again.faults[0].leaders == fault.leaders


def _fence(broker: str, at_s: float, reason: str = "session expired") -> Fence:
    return Fence(broker=broker, at_s=at_s, reason=reason, silent_ms=1600, controller="c1")


def test_unexplained_fences_fire_on_a_tampered_history() -> None:
    """Claim: a fence for an expired session is explained only by a fault on that broker or on a
    controller, running or ended at most FENCE_EXPLAIN_AFTER_S before it, or by a process dying;
    any other is reported (count, per broker, examples) and fails the run as a liveness failure.
    Gray cuts (peers only) explain none; fences asked for (controlled shutdown) are not counted."""
    h = clean_history()
    h.end_s = 60.0
    h.faults = [FaultRun(index=0, kind="kill_broker", targets=("b1",), start_s=10.0, end_s=11.0, removes_quorum=False),
                FaultRun(index=1, kind="pause_controller", targets=("c2",), start_s=20.0, end_s=21.0,
                         removes_quorum=False),
                FaultRun(index=2, kind="cut_leader", targets=("b3",), start_s=30.0, end_s=36.0, removes_quorum=False)]
    h.exits = ["b2 exited (code 1) at 45.0 s: boom"]
    explained = [_fence("b1", 10.5), _fence("b1", 11.0 + FENCE_EXPLAIN_AFTER_S),   # its own kill, to the window's end
                 _fence("b3", 22.0),                    # a controller paused: any broker
                 _fence("b2", 43.0),                    # died unasked, noticed at 45 s
                 _fence("b2", 50.0, "controlled shutdown"), _fence("b3", -1.0), _fence("b3", 61.0)]
    h.fences = list(explained)
    report = check(h)
    assert report.figures["unexplained_fences"] == 0 and not report.liveness["unexplained_fences"]
    assert report.figures["fences"] == 5 and report.figures["fences_by_reason"] == {"controlled shutdown": 1,
                                                                                    "session expired": 4}
    h.exits = []   # the process exits fail the run on their own; only the fences are tampered below
    tampered = copy.deepcopy(h)
    tampered.fences = explained[:3] + [
        _fence("b2", 10.5),                             # another broker's kill explains nothing
        _fence("b1", 11.0 + FENCE_EXPLAIN_AFTER_S + 0.1),   # past the window
        _fence("b3", 19.9),                             # before the controller fault began
        _fence("b3", 33.0)]                             # under a gray cut of its own
    report = check(tampered)
    assert report.figures["unexplained_fences"] == 4
    assert report.figures["unexplained_fences_by_broker"] == {"b1": 1, "b2": 1, "b3": 2}
    assert [e["at_s"] for e in report.figures["unexplained_fence_examples"]] == [10.5, 15.2, 19.9, 33.0]
    assert len(report.liveness["unexplained_fences"]) == 4 and not report.ok and report.safe
    # a history recorded before fences were: nothing said either way
    tampered.fences = None
    assert "unexplained_fences" not in check(tampered).liveness


def test_fences_are_read_from_the_controllers_log_lines_once() -> None:
    """Claim: the harness reads each fence the committing leader logged, once, on the run's clock."""
    line = ("2026-11-25 04:00:00,000 level=WARNING logger=biplane.controller broker fenced: broker_id=2 "
            "reason='session expired' at_ms=1000012500 silent_ms=1620 controller=3")
    other = line.replace("broker_id=2", "broker_id=1").replace("'session expired'", "\"controlled shutdown\"") \
        .replace("silent_ms=1620", "silent_ms=None")
    fences = parse_fences(["noise", line, line, other], wall_t0_s=1_000_000.0)
    assert fences == [Fence(broker="b1", at_s=12.5, reason="controlled shutdown", silent_ms=None, controller="c3"),
                      Fence(broker="b2", at_s=12.5, reason="session expired", silent_ms=1620, controller="c3")]
    h = clean_history()
    h.fences = fences
    assert History.from_json(json.loads(json.dumps(h.to_json()))).fences == fences


def test_cleanup_finds_what_a_run_with_its_own_results_directory_left(tmp_path, monkeypatch) -> None:
    """`scripts/chaos --cleanup` reads manifests under the results root; a run given `--out`
    elsewhere leaves a pointer there, so a mount it left when killed is unmounted too, and a
    pointer to removed results goes."""
    from tests.chaos import main as chaos_main
    from tests.chaos import net
    root = tmp_path / "root"
    root.mkdir()
    elsewhere = tmp_path / "mine"
    elsewhere.mkdir()
    (elsewhere / "manifest.json").write_text(json.dumps({"pid": None, "pids": {}, "namespaces": [],
                                                         "mounts": [str(elsewhere / "broker-1")]}))
    (root / "elsewhere-3-4").symlink_to(tmp_path / "gone")
    calls: list[list[str]] = []

    class Done:
        returncode = 0

    monkeypatch.setattr(chaos_main, "RESULTS_ROOT", root)
    chaos_main.point_to_results(elsewhere)
    monkeypatch.setattr(net, "run", lambda argv, check=True: calls.append(argv) or Done())
    actions = chaos_main.cleanup_leftovers()
    assert calls == [["umount", "-l", str(elsewhere / "broker-1")]]
    assert actions == [f"unmounted {elsewhere / 'broker-1'}"]
    assert json.loads((elsewhere / "manifest.json").read_text())["mounts"] == []
    assert not (root / "elsewhere-3-4").is_symlink()


def test_a_broker_killed_while_the_last_one_killed_is_still_coming_back_counts_as_quorum_loss() -> None:
    """Faults run one at a time, but b1, restarted at 3 s, is back in service (replicas open,
    in the ISR again) only at 6 s; b2 killed from 4 to 5 s leaves two of three brokers out from
    4 to 5.5 s (b2 back at 5.5). The in-service figure skips that; the scheduled one does not.
    A broker and a controller out at once are not two of a kind."""
    h = clean_history()
    tp = tp_key(TOPIC, 0)
    base = [s for s in h.sends if s.tp != tp]
    # acks at 0.1, 1.1, ... 3.1, then none until 6.6
    h.sends = base + [Send(producer="p1", tp=tp, seq=i, value=record_value("p1", TOPIC, 0, i), sent_s=float(i),
                           done_s=(float(i) + 0.1) if i <= 3 else 6.6, offset=i, error=None) for i in range(7)]
    kill_b1 = FaultRun(index=0, kind="kill_broker", targets=("b1",), start_s=2.0, end_s=3.0, removes_quorum=False,
                       back_s={"b1": 6.0})
    kill_b2 = FaultRun(index=1, kind="kill_broker", targets=("b2",), start_s=4.0, end_s=5.0, removes_quorum=False,
                       back_s={"b2": 5.5})
    h.faults = [kill_b1, kill_b2]
    figs = check(h).figures
    assert figs["longest_ack_gap_s_by_partition"][tp] == pytest.approx(3.5, abs=0.01)       # 3.1..6.6
    assert figs["longest_ack_gap_s_in_service_by_partition"][tp] == pytest.approx(2.0, abs=0.01)
    assert (figs["quorum_out_windows"], figs["quorum_out_s"]) == (1, pytest.approx(1.5))
    # not seen back: each counts out only while its fault lasts, and they never overlap
    h.faults = [dataclasses.replace(kill_b1, back_s={}), dataclasses.replace(kill_b2, back_s={})]
    assert check(h).figures["longest_ack_gap_s_in_service_by_partition"][tp] == pytest.approx(3.5, abs=0.01)
    h.faults = [kill_b1, dataclasses.replace(kill_b2, kind="kill_controller", targets=("c2",), back_s={"c2": 5.5})]
    assert check(h).figures["quorum_out_windows"] == 0
    # the back times survive a saved history
    assert History.from_json(json.loads(json.dumps(h.to_json()))).faults[0].back_s == {"b1": 6.0}


def test_a_slow_return_is_noted_with_what_held_it_longest_first() -> None:
    from tests.chaos.runner import BACK_WAIT_S, slow_return_note
    waits = [(100.0, "not registered since the kill"), (104.0, "fenced"),
             (105.0, "not in the ISR of push-isr-fsync/0 (ISR [3], leader 3)")]
    note = slow_return_note("b1", 7, 99.5, 150.0, waits)
    assert note.startswith("b1 (fault 7, killed at 99.5 s) back 50.5 s after its kill: ")
    # longest first: the ISR wait (45 s), then registering (4 s), then fenced (1 s)
    parts = note.split(": ", 1)[1].split("; ")
    assert parts[0] == "not in the ISR of push-isr-fsync/0 (ISR [3], leader 3) for 45.0 s from 105.0 s"
    assert parts[1] == "not registered since the kill for 4.0 s from 100.0 s"
    assert parts[2] == "fenced for 1.0 s from 104.0 s"
    never = slow_return_note("b2", 8, 10.0, None, [(11.0, "fenced")])
    assert f"not back within {BACK_WAIT_S:.0f} s of its kill: fenced for {10.0 + BACK_WAIT_S - 11.0:.1f} s" in never


def test_a_signal_stops_the_run_whichever_task_is_running() -> None:
    """Claim: SIGINT cancels the run itself. Raised from a plain signal handler, the interrupt
    landed in a producer's sender task, which took it for its own failure; the run went on."""
    import asyncio
    import signal

    from tests.chaos.runner import Interrupted, drive_until_signalled

    class Busy:
        """A run whose tasks keep running and swallow what is raised in them."""
        async def drive(self):
            async def sender() -> None:
                while True:
                    try:
                        await asyncio.sleep(0.001)
                    except Exception:  # noqa: BLE001 - what the SDK's sender does with a failure
                        pass
            asyncio.get_running_loop().call_later(0.05, os.kill, os.getpid(), signal.SIGINT)
            await asyncio.gather(*(sender() for _ in range(3)))

    previous = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(Interrupted, match="signal 2"):
            asyncio.run(drive_until_signalled(Busy(), 5.0))  # type: ignore[arg-type]
    finally:
        signal.signal(signal.SIGINT, previous)
