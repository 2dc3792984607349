"""The replica core's own invariants (dataplane/replica/invariants.py), checked after each step."""
from __future__ import annotations

import pytest

from dataplane.log.memory import MemoryLog
from dataplane.replica import invariants
from dataplane.replica.core import Replica, Role
from dataplane.replica.events import FlushDone, NewMetadata, Tick
from test_replica_core import Node, cluster, config, pump, produce, state


def test_the_suite_runs_with_core_assertions_and_production_does_not(monkeypatch):
    """Claim: tests/conftest.py switches the checks on; without the variable a core runs without them."""
    assert Replica(replica_id=1, log=MemoryLog()).check_invariants
    monkeypatch.delenv(invariants.ENV_VAR)
    assert not Replica(replica_id=1, log=MemoryLog()).check_invariants
    monkeypatch.setenv(invariants.ENV_VAR, "0")
    assert not invariants.enabled_by_default()


def test_a_healthy_run_keeps_every_invariant():
    """Claim: produce, replicate and commit on three cores with the checks on raises nothing."""
    nodes = cluster()
    for rid in range(1, 6):
        produce(nodes[1], rid, -1, b"v")
    pump(nodes, now_ms=0, rounds=30)
    assert nodes[1].replica.high_watermark == nodes[1].log.log_end_offset


def test_a_high_watermark_past_the_log_end_is_caught():
    """Claim: a step that leaves HW above the log end fails, naming both offsets."""
    node = Node(1)
    node.step(NewMetadata(partition=state(isr=(1,), replicas=(1,)), config=config(min_insync_replicas=1)))
    node.replica.high_watermark = node.replica.log_end_offset + 5
    with pytest.raises(invariants.InvariantBroken, match="high_watermark .* > log_end_offset"):
        node.replica.step(Tick(now_ms=1))


def test_a_leader_high_watermark_moving_back_within_its_epoch_is_caught():
    """Claim: a leader whose HW goes back within one epoch fails (paired with its value before the step)."""
    nodes = cluster()
    produce(nodes[1], 1, -1, b"v")
    pump(nodes, now_ms=0, rounds=10)
    leader = nodes[1].replica
    assert leader.role is Role.LEADER and leader.high_watermark > 0

    def shrink(self):
        self.high_watermark -= 1
    original = Replica._advance_high_watermark
    Replica._advance_high_watermark = shrink
    try:
        with pytest.raises(invariants.InvariantBroken, match="high_watermark went back"):
            leader.step(Tick(now_ms=1000))
    finally:
        Replica._advance_high_watermark = original


def test_flushed_past_written_is_caught():
    """Claim: a flushed offset above the written offset fails."""
    node = Node(1, auto_flush=False)
    node.step(NewMetadata(partition=state(isr=(1,), replicas=(1,)), config=config(min_insync_replicas=1)))
    node.replica.written_offset = 0
    with pytest.raises(invariants.InvariantBroken, match="flushed_offset .* > written_offset"):
        node.replica.step(FlushDone(flushed_offset=node.log.log_end_offset))


def test_a_leader_epoch_going_back_is_caught():
    """Claim: a step that lowers the leader epoch fails."""
    node = Node(1)
    node.step(NewMetadata(partition=state(epoch=3), config=config()))

    def older(self, ev):
        self.leader_epoch = 2
    from dataplane.replica import core
    original = core._HANDLERS[Tick]
    core._HANDLERS[Tick] = older
    try:
        with pytest.raises(invariants.InvariantBroken, match="leader_epoch went back from 3 to 2"):
            node.replica.step(Tick(now_ms=1))
    finally:
        core._HANDLERS[Tick] = original
