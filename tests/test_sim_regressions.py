"""Simulation seeds that found a bug, kept with the mutant that reintroduces it.

Each test runs its seed twice: with the bug put back (tests/sim/mutants.py) the
checkers must catch it, and with today's core the seed must pass. The first
half proves the seed still drives the scenario; if a change to the simulation's
random draws breaks it, find a new seed with the mutant and update the test.
"""
from __future__ import annotations

import pytest

from sim.cluster import run_simulation
from sim import mutants


def _problem(seed: int, policy: str, durability: str, mode: str) -> str | None:
    result = run_simulation(seed=seed, policy=policy, durability=durability, mode=mode)
    return result.violation or result.liveness_error


def _check_regression(seed: int, policy: str, durability: str, mutant: str) -> None:
    # Replication mode pinned: push for the push mutants, pull for the rest (found in pull mode).
    mode = "push" if mutant.startswith("push_") else "pull"
    with mutants.MUTANTS[mutant]():
        caught = _problem(seed, policy, durability, mode)
    assert caught, f"seed={seed} policy={policy} durability={durability} no longer finds {mutant}"
    problem = _problem(seed, policy, durability, mode)
    assert problem is None, f"seed={seed} policy={policy} durability={durability}: {problem}"


@pytest.mark.parametrize("seed,policy,durability", [(74, "isr", "write"), (125, "quorum", "fsync")])
def test_restarted_leader_must_not_reuse_its_epoch(seed, policy, durability):
    """Found as seed=32 quorum/fsync (earlier fault model; seeds 74 isr/write and 166 quorum/fsync
    drive it now in pull mode; 125 quorum/fsync since the producers run on the producer core): a leader crashed before flushing its epoch-start batch, restarted within the
    session timeout and got metadata, still current, naming it leader of the same epoch. It led
    that epoch again and wrote a different batch at an offset where a follower already held the
    first incarnation's batch of the same epoch; the divergence check cannot see that
    (agree_below_hw, commit_backed). Fixed: a leader serves nothing until its epoch start is
    flushed, and refuses an epoch its log already holds."""
    _check_regression(seed, policy, durability, "serve_before_epoch_durable")


@pytest.mark.parametrize("mutant,seed,policy,durability", [
    ("count_written_under_fsync", 0, "isr", "fsync"),
    ("count_written_under_fsync", 0, "quorum", "fsync"),
    ("no_divergence_check", 0, "isr", "write"),
    ("no_divergence_check", 0, "quorum", "fsync"),
    ("consumers_read_past_hw", 0, "isr", "fsync"),
    ("ignore_proposed_isr", 15, "isr", "write"),  # 7 until the retry fix re-rolled its draws
    ("no_duplicate_detection", 0, "isr", "fsync"),
    ("accept_sequence_gaps", 2, "isr", "fsync"),
    ("push_stale_divergence", 103, "quorum", "write"),  # 112 until unclean replicas reported
])
def test_checkers_catch_a_broken_core(mutant, seed, policy, durability):
    """Claim: the checkers are not vacuous: with a commit or divergence rule removed, the named
    seed fails (and passes with the real core)."""
    _check_regression(seed, policy, durability, mutant)


@pytest.mark.parametrize("seed,policy,durability", [(10, "isr", "fsync"), (1, "quorum", "write")])
def test_a_sent_batch_is_never_renumbered(seed, policy, durability):
    """Issue 12's duplicates (seen by a fault run against real processes; the mutant puts the
    bug back and seeds 10 isr/fsync and 1 quorum/write catch it): after a batch failed (a delivery timeout) the
    producer took a new epoch as soon as no request was in flight and renumbered every batch it
    still held, including batches sent and appended whose answer was lost (a client request
    timeout shorter than replication); the leader appended the renumbered copy as new
    (no_record_twice). Fixed in the producer core: a batch that may be in the log keeps its
    numbers until its outcome is known, and a new epoch waits for every numbered batch."""
    _check_regression(seed, policy, durability, "producer_renumbers_sent_batches")
