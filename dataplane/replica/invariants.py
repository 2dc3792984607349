"""The replica core's own invariants, checked after every step in debug and test runs.

Each check is paired: it compares what the core holds after a step with what it
held before, or one offset with the offset it must never pass, and names both
values when it fails. They cost O(replicas) per step, but production runs without
them: `BIPLANE_CORE_ASSERTIONS=1` (tests/conftest.py sets it, and the simulation
turns them on for its cores) or `Replica(check_invariants=True)` switches them on.

What the simulation's checkers (tests/sim/checkers.py) verify across replicas —
no acknowledged record lost, logs equal below the HW — stays there; these are
the rules one core can check about itself.
"""
from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING

from dataplane.replica.state import Role

if TYPE_CHECKING:
    from dataplane.replica.core import Replica

ENV_VAR = "BIPLANE_CORE_ASSERTIONS"


def enabled_by_default() -> bool:
    return os.environ.get(ENV_VAR, "") not in ("", "0")


class InvariantBroken(AssertionError):
    """The core broke one of its own rules: our bug, never a peer's."""


@dataclasses.dataclass(frozen=True, slots=True)
class Before:
    role: object
    leader_epoch: int
    partition_epoch: int
    high_watermark: int
    written_offset: int
    log_end_offset: int


def before(r: Replica) -> Before:
    return Before(role=r.role, leader_epoch=r.leader_epoch, partition_epoch=r.partition_epoch,
                  high_watermark=r.high_watermark, written_offset=r.written_offset,
                  log_end_offset=r.log_end_offset)


def check(r: Replica, was: Before, event: object) -> None:
    """Raise InvariantBroken, naming the event, if the step that just ran broke a rule."""
    def fail(what: str) -> None:
        raise InvariantBroken(f"replica {r.replica_id} after {type(event).__name__}: {what}")

    # Offsets within the log, in their order: flushed <= written <= log end, HW <= log end.
    if not r.flushed_offset <= r.written_offset:
        fail(f"flushed_offset {r.flushed_offset} > written_offset {r.written_offset}")
    if not r.written_offset <= r.log_end_offset:
        fail(f"written_offset {r.written_offset} > log_end_offset {r.log_end_offset}")
    if not r.high_watermark <= r.log_end_offset:
        fail(f"high_watermark {r.high_watermark} > log_end_offset {r.log_end_offset}")
    # Epochs only move forward.
    if r.leader_epoch < was.leader_epoch:
        fail(f"leader_epoch went back from {was.leader_epoch} to {r.leader_epoch}")
    if r.leader_epoch == was.leader_epoch and r.partition_epoch < was.partition_epoch:
        fail(f"partition_epoch went back from {was.partition_epoch} to {r.partition_epoch}")
    if r.role is Role.LEADER:
        # A leader never truncates, so its HW and written offset only grow within its epoch.
        if was.role is Role.LEADER and was.leader_epoch == r.leader_epoch:
            if r.high_watermark < was.high_watermark:
                fail(f"high_watermark went back from {was.high_watermark} to {r.high_watermark} "
                     f"within leader epoch {r.leader_epoch}")
            if r.log_end_offset < was.log_end_offset:
                fail(f"leader's log_end_offset went back from {was.log_end_offset} to {r.log_end_offset}")
        if not r.epoch_start_offset < r.log_end_offset:
            fail(f"epoch_start_offset {r.epoch_start_offset} not below log_end_offset {r.log_end_offset} "
                 "(the epoch-start batch is missing)")
        if r.last_epoch != r.leader_epoch:
            fail(f"leader's last batch is of epoch {r.last_epoch}, not its own {r.leader_epoch}")
        state = r.state
        if state is None:
            fail("a leader without partition state")
            return
        replicas = set(state.replicas)
        if not set(state.isr) <= replicas:
            fail(f"ISR {list(state.isr)} not within replicas {list(state.replicas)}")
        if r.pending_isr is not None and not set(r.pending_isr) <= replicas:
            fail(f"proposed ISR {list(r.pending_isr)} not within replicas {list(state.replicas)}")
        if not set(r.progress) <= replicas - {r.replica_id}:
            fail(f"progress kept for {sorted(r.progress)}, replicas are {list(state.replicas)}")
        for replica_id, p in r.progress.items():
            if not p.flushed_offset <= p.fetch_offset:
                fail(f"follower {replica_id}: flushed_offset {p.flushed_offset} > its log end {p.fetch_offset}")
