"""Model checking of the TLA+ specs under tla/ through scripts/tla-check.

TLC's breadth-first search is deterministic for a given model, so the number
of distinct states of each safe model is an exact figure: a change in it
means the spec or the model changed, and this file is updated with it.
"""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
TLA = ROOT / "tla"
# scripts/tla-check runs this file with .venv's Python; the test runs it with its own.
SCRIPT = [sys.executable, str(ROOT / "scripts" / "tla_check.py")]

# Distinct states TLC finds in each safe model (symmetry reduced).
EXPECTED_STATES = {
    "DataPlane": 151_349,
    "DataPlaneNet": 42_012,
    "DataPlaneIsr": 23_682,
    "DataPlanePush": 7_753,
    "DataPlaneLive": 762,
    "DataPlaneCut": 677_055,
    "Controller": 438_523,
    "ControllerQuorum": 121_425,
    "ControllerQuorumWrite": 443_943,
    "Producer": 84_584,
    "ProducerTwo": 106_617,
    "ProducerRefused": 15_733,
}

# The invariant each broken variant must violate.
EXPECTED_BREAKS = {
    "DataPlane_elect_by_leo": "LeaderCompleteness",
    "DataPlane_no_fence": "LeaderCompleteness",
    "DataPlane_elect_unfenced": "LeaderCompleteness",
    "DataPlane_report_unflushed": "LeaderCompleteness",
    "DataPlane_flushed_beyond_match": "LeaderCompleteness",
    "DataPlane_old_epoch_commit": "LogMatching",
    "DataPlane_written_hw": "NoAckedLoss",
    "DataPlaneLive_unfair_fetch": "temporal",
    "Controller_stale_isr": "LeaderInIsr",
    "Controller_shrink_early": "IsrComplete",
    "Controller_few_reports": "LeaderComplete",
    "Controller_count_unclean": "LeaderComplete",
    "Controller_silent_unclean": "ElectionLive",
    "Controller_settle_unknown": "IsrComplete",
    "Producer_restamp_unknown": "NoDuplicate",
    "Producer_restamp_rejected": "NoDuplicate",
    "Producer_renumber_refused_dup": "NotWrittenAbsent",
    "Producer_dup_without_offset": "AckedAtOffset",
    "Producer_no_gap_check": "SendOrder",
    "Producer_no_rebuild": "AckedAtOffset",
    "Producer_dupseq_as_written": "WrittenCommitted",
}

# Broken variants with the very bounds of a safe model: only `Bug` differs, so the
# counterexample is the mistake's and not the bounds'.
SAME_BOUNDS = {
    "Producer_restamp_unknown": "Producer",
    "Producer_restamp_rejected": "ProducerRefused",
    "Producer_dup_without_offset": "Producer",
    "Producer_no_rebuild": "Producer",
    "DataPlane_elect_unfenced": "DataPlaneCut",
    "Controller_count_unclean": "ControllerQuorumWrite",
    "Controller_silent_unclean": "ControllerQuorumWrite",
    "Controller_settle_unknown": "Controller",
}


def run_check(*args: str, tmp_path: pathlib.Path) -> tuple[int, dict[str, dict]]:
    proc = subprocess.run([*SCRIPT, "--json", "--log-dir", str(tmp_path), *args],
                          capture_output=True, text=True, timeout=1700)
    results = {}
    for line in proc.stdout.splitlines():
        row = json.loads(line)
        results[row["name"]] = row
    return proc.returncode, results


def list_models() -> tuple[list[str], list[str]]:
    proc = subprocess.run([*SCRIPT, "--list"], capture_output=True, text=True,
                          check=True, timeout=60)
    safe, broken = [], []
    for line in proc.stdout.splitlines():
        name, kind = line.split(None, 1)
        (safe if kind == "safe" else broken).append(name)
    return safe, broken


def test_every_model_has_an_expectation():
    """The registry in scripts/tla-check and the figures here list the same models."""
    safe, broken = list_models()
    assert sorted(safe) == sorted(EXPECTED_STATES)
    assert sorted(broken) == sorted(EXPECTED_BREAKS)


def _cfg_without_comments(name: str) -> dict[str, str]:
    text = "\n".join(line for line in (TLA / f"{name}.cfg").read_text().splitlines()
                     if not line.lstrip().startswith("\\*"))
    return dict(re.findall(r"^\s*(\w+)\s*=\s*(.+?)\s*$", text, flags=re.M)) | {
        "_checks": " ".join(re.findall(r"^(?:INVARIANTS|PROPERTIES|SPECIFICATION).*$", text, flags=re.M))}


@pytest.mark.parametrize("broken,safe", sorted(SAME_BOUNDS.items()))
def test_broken_variant_differs_from_its_safe_model_only_by_bug(broken, safe):
    """The variant switches its mistake on and changes nothing else: same constants,
    same invariants and properties checked."""
    b, s = _cfg_without_comments(broken), _cfg_without_comments(safe)
    assert s.pop("Bug") == '"none"'
    assert b.pop("Bug") != '"none"'
    assert b == s


def test_renumbering_refused_batches_differs_from_its_models_only_where_named():
    """ProducerRefused is Producer with the SDK's renumbering rule over a transport that
    delivers each attempt at most once; Producer_renumber_refused_dup puts duplicated delivery
    back and changes nothing else."""
    good, dup, base = (_cfg_without_comments(n) for n in
                       ("ProducerRefused", "Producer_renumber_refused_dup", "Producer"))
    assert (good.pop("MaxDups"), good.pop("RenumberRefused")) == ("0", "TRUE")
    assert (dup.pop("MaxDups"), dup.pop("RenumberRefused")) == ("1", "TRUE")
    assert (base.pop("MaxDups"), base.pop("RenumberRefused")) == ("1", "FALSE")
    assert good == dup == base


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_renumbering_a_batch_every_attempt_of_which_was_refused_is_safe_only_over_tcp(tmp_path):
    """Issue 12's second disagreement, decided by TLC: the SDK renumbers under a new epoch a
    sent batch whose every attempt was refused before any append. With each attempt delivered
    at most once (TCP) that passes every invariant; renumbering once the last attempt was
    refused while an earlier one went unanswered writes a record twice (the simulation's
    mutant producer_renumbers_unknown_refused); and over a network that duplicates requests
    the rule itself fails (a refused copy does not cover the other copy)."""
    code, results = run_check("--model", "ProducerRefused", "--model", "Producer_restamp_rejected",
                              "--model", "Producer_renumber_refused_dup", tmp_path=tmp_path)
    good = results["ProducerRefused"]
    assert good["completed"] and good["violation"] is None, f"TLC output in {tmp_path}"
    assert good["distinct_states"] == EXPECTED_STATES["ProducerRefused"]
    bad = results["Producer_restamp_rejected"]
    assert bad["violation"] == "NoDuplicate", f"TLC output in {tmp_path}"
    trace = (tmp_path / "Producer_restamp_rejected.out").read_text()
    assert "BumpEpoch" in trace and "Timeout" in trace, "an unanswered attempt, then a renumbering"
    assert results["Producer_renumber_refused_dup"]["violation"] == "NotWrittenAbsent"
    assert code == 0


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_producer_restamp_yields_a_duplicate_and_the_correct_producer_does_not(tmp_path):
    """The bug of issue 12: re-stamping a batch whose outcome is unknown under a new
    producer epoch appends a record twice (NoDuplicate); the producer that keeps a
    batch's numbers and bumps only with nothing unresolved passes every invariant."""
    code, results = run_check("--model", "Producer", "--model", "Producer_restamp_unknown",
                              tmp_path=tmp_path)
    bad = results["Producer_restamp_unknown"]
    assert bad["violation"] == "NoDuplicate", f"TLC output in {tmp_path}"
    assert bad["trace_length"] >= 5
    trace = (tmp_path / "Producer_restamp_unknown.out").read_text()
    assert "BumpEpoch" in trace, "the counterexample goes through an epoch bump"
    good = results["Producer"]
    assert good["completed"] and good["violation"] is None, f"TLC output in {tmp_path}"
    assert good["distinct_states"] == EXPECTED_STATES["Producer"]
    assert code == 0


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_safe_models_pass_with_expected_state_counts(tmp_path):
    """Every safe model passes TLC with no violation, exploring exactly the
    distinct states recorded above."""
    code, results = run_check(tmp_path=tmp_path)
    assert code == 0, f"tla-check failed; TLC output in {tmp_path}"
    assert {name: row["distinct_states"] for name, row in results.items()} == EXPECTED_STATES
    for name, row in results.items():
        assert row["completed"], name
        assert row["violation"] is None, name


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_broken_variants_each_yield_their_counterexample(tmp_path):
    """Each broken variant makes one known mistake; TLC must find a
    counterexample of the invariant that mistake breaks."""
    code, results = run_check("--broken", tmp_path=tmp_path)
    assert code == 0, f"a broken variant did not fail as expected; TLC output in {tmp_path}"
    assert {name: row["violation"] for name, row in results.items()} == EXPECTED_BREAKS
    for name, row in results.items():
        assert row["trace_length"] >= 2, name


def test_check_refuses_an_unknown_model(tmp_path):
    """Asking for a model that does not exist is an error naming the known ones."""
    proc = subprocess.run([*SCRIPT, "--model", "NoSuchModel"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2
    assert "NoSuchModel" in proc.stderr and "DataPlane" in proc.stderr
