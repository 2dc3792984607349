"""Simulation seeds that once found a bug, kept so the bug stays fixed (see tests/sim/README.md)."""
from __future__ import annotations

from sim.cluster import run_simulation


def _check(seed: int, policy: str, durability: str) -> None:
    result = run_simulation(seed=seed, policy=policy, durability=durability)
    problem = result.violation or result.liveness_error
    assert problem is None, f"seed={seed} policy={policy} durability={durability}: {problem}"


def test_seed_32_quorum_fsync_restarted_leader_reuses_its_epoch():
    """seed=32 policy=quorum durability=fsync: a leader crashed before flushing its epoch-start
    batch, restarted within the session timeout, and got the still-current metadata naming it
    leader of the same epoch. It led that epoch again and wrote a different batch at an offset
    where a follower already held the first incarnation's batch of the same epoch, so the
    divergence check could not see the difference (agree_below_hw). Fixed: a leader serves
    nothing until its epoch start is flushed, and refuses an epoch its log already holds."""
    _check(32, "quorum", "fsync")
