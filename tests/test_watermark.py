"""High-watermark arithmetic against a naive oracle, plus the rules stated in docs/design.md#high-watermark-and-commit-rules."""
from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings, strategies as st

from dataplane.replica.watermark import (
    commit_candidate, follower_stored_offset, next_high_watermark, stored_offset,
)


def oracle_high_watermark(*, high_watermark, epoch_start_offset, leader_id, stored, commit_policy,
                          required_isr, quorum_required_acks):
    """Naive: try every offset and every subset of replicas that could form a required set."""
    replicas = sorted(set(stored) | set(required_isr) | {leader_id})
    best = high_watermark
    top = max([stored.get(r, 0) for r in replicas] + [0])
    for size in range(1, len(replicas) + 1):
        for subset in itertools.combinations(replicas, size):
            if leader_id not in subset:
                continue
            if commit_policy == "isr" and not set(required_isr) <= set(subset):
                continue
            if commit_policy == "quorum" and (
                    size < quorum_required_acks or not set(subset) <= set(stored) | {leader_id}):
                continue
            for offset in range(top + 1):
                on_all = all(stored.get(r, 0) >= offset for r in subset)
                if on_all and offset > epoch_start_offset and offset > best:
                    best = offset
    return best


@st.composite
def cases(draw):
    n = draw(st.integers(1, 5))
    replicas = list(range(n))
    leader = draw(st.sampled_from(replicas))
    stored = {r: draw(st.integers(0, 12)) for r in replicas if draw(st.booleans()) or r == leader}
    policy = draw(st.sampled_from(["isr", "quorum"]))
    isr = [r for r in replicas if draw(st.booleans())]
    q = draw(st.integers(1, n))
    return dict(high_watermark=draw(st.integers(0, 12)), epoch_start_offset=draw(st.integers(0, 12)),
                leader_id=leader, stored=stored, commit_policy=policy, required_isr=isr,
                quorum_required_acks=q)


@settings(max_examples=600, deadline=None)
@given(cases())
def test_matches_oracle(case):
    """Claim: next_high_watermark equals the naive subset search on random inputs."""
    assert next_high_watermark(**case) == oracle_high_watermark(**case)


@settings(max_examples=300, deadline=None)
@given(cases())
def test_never_moves_back(case):
    """Claim: the HW returned is never below the HW passed in."""
    assert next_high_watermark(**case) >= case["high_watermark"]


def test_epoch_start_rule_holds_hw_until_a_set_stores_past_the_start():
    """Claim: offsets up to the epoch start are not committed by counting, even if stored everywhere."""
    common = dict(leader_id=1, commit_policy="isr", required_isr=[1, 2, 3], high_watermark=4)
    assert next_high_watermark(epoch_start_offset=10, stored={1: 10, 2: 10, 3: 10}, **common) == 4
    assert next_high_watermark(epoch_start_offset=10, stored={1: 11, 2: 11, 3: 11}, **common) == 11


def test_quorum_counts_any_q_including_leader():
    """Claim: with q=2 of 3, the HW is min(leader, best follower); a lagging third replica does not hold it."""
    hw = next_high_watermark(high_watermark=0, epoch_start_offset=0, leader_id=1,
                             stored={1: 9, 2: 7, 3: 0}, commit_policy="quorum", quorum_required_acks=2)
    assert hw == 7
    hw = next_high_watermark(high_watermark=0, epoch_start_offset=0, leader_id=1,
                             stored={1: 5, 2: 7, 3: 8}, commit_policy="quorum", quorum_required_acks=2)
    assert hw == 5  # the leader must hold it too


def test_isr_needs_every_member_and_missing_progress_counts_zero():
    """Claim: isr policy takes the minimum over ISR; a member with no known progress blocks the HW."""
    assert commit_candidate(leader_id=1, stored={1: 9, 2: 7, 3: 8}, commit_policy="isr",
                            required_isr=[1, 2, 3]) == 7
    assert commit_candidate(leader_id=1, stored={1: 9, 2: 7}, commit_policy="isr",
                            required_isr=[1, 2, 3]) == 0


def test_quorum_without_enough_replicas_has_no_candidate():
    """Claim: a quorum that cannot be formed yields no candidate and the HW stays."""
    assert commit_candidate(leader_id=1, stored={1: 9}, commit_policy="quorum", quorum_required_acks=2) is None


def test_stored_follows_durability_and_match():
    """Claim: fsync counts flushed, write counts written, a follower is capped by its match offset."""
    assert stored_offset(written_offset=9, flushed_offset=4, durability="fsync") == 4
    assert stored_offset(written_offset=9, flushed_offset=4, durability="write") == 9
    assert follower_stored_offset(written_offset=9, flushed_offset=8, match_offset=6, durability="fsync") == 6
    assert follower_stored_offset(written_offset=9, flushed_offset=4, match_offset=6, durability="fsync") == 4


@pytest.mark.parametrize("bad", [dict(durability="lazy"), dict(durability="")])
def test_unknown_durability_is_refused(bad):
    """Claim: an unknown durability is a clear error naming the value."""
    with pytest.raises(ValueError, match="durability"):
        stored_offset(written_offset=1, flushed_offset=1, **bad)
