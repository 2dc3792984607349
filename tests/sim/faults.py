"""Fault injection, kept apart from the checkers: it only decides what goes wrong.

Decisions draw from random streams seeded from the simulation's seed (one for
node faults, one for the network), so a seed replays exactly. Faults: message loss, duplication, delay (hence
reordering), crashes that drop unflushed data, restarts, network partitions, an
accepted ISR change answered as an unknown outcome with the proposer's metadata lagging
(controller leadership moving).

Tolerance (what the checkers may then demand):
- durability=fsync: any number of replicas may be down or cut off at once;
  flushed data survives a crash, so no acknowledged record may ever be lost.
- durability=write: a crash loses written-but-unflushed data, which the
  commit rule counted. The injector keeps at most ONE replica faulty at a
  time (f = 1; every sim topic has RF >= 3 and q >= 2 / ISR >= 2): a new crash
  or partition starts only when no replica is down, cut off, or restarted and
  not yet caught up to the leader's high watermark.
"""
from __future__ import annotations

import dataclasses
import random

CONTROLLER_ID = 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class FaultRates:
    loss: float = 0.05
    duplicate: float = 0.03
    delay_ms_max: int = 15
    crash_per_s: float = 4.0
    leader_crash_share: float = 0.5
    restart_after_ms_max: int = 400
    partition_per_s: float = 3.0
    partition_ms_max: int = 500
    new_leader_crash: float = 0.3   # chance a freshly elected leader crashes within new_leader_crash_ms_max
    new_leader_crash_ms_max: int = 40
    isr_answer_unknown: float = 0.2  # share of accepted ISR changes answered REQUEST_TIMED_OUT
    metadata_lag_ms_max: int = 400   # how long the proposer's metadata then lags


class FaultInjector:
    def __init__(self, rng: random.Random, *, network_rng: random.Random, nodes: tuple[int, ...], durability: str,
                 rates: FaultRates = FaultRates()) -> None:
        self.rng = rng                  # crashes, restarts, partitions
        self.network_rng = network_rng  # loss, duplication, delay
        self.nodes = nodes
        self.durability = durability
        self.rates = rates
        self.active = True
        self.groups: dict[int, int] | None = None  # node -> partition side; controller included
        self.partition_until_ms = 0
        self.down: dict[int, int] = {}  # node -> restart time
        self.doomed: tuple[int, int] | None = None  # (crash time, node): a new leader to crash soon

    # ------------------------------------------------------------ network

    def cut(self, src: int, dst: int) -> bool:
        if self.groups is None or src not in self.groups or dst not in self.groups:
            return False  # the producer client is never cut off
        return self.groups.get(src, -1) != self.groups.get(dst, -1)

    def delivery_delays(self, src: int, dst: int) -> list[int]:
        """Delays (ms) of the copies of one message that arrive; [] means lost."""
        if self.cut(src, dst):
            return []
        if not self.active:
            return [1]
        r = self.rates
        rng = self.network_rng
        if rng.random() < r.loss:
            return []
        delays = [rng.randint(1, r.delay_ms_max)]
        if rng.random() < r.duplicate:
            delays.append(rng.randint(1, r.delay_ms_max * 2))
        return delays

    # ------------------------------------------------------------- nodes

    def on_new_leader(self, leader: int, now_ms: int) -> None:
        """New leaders are where elections go wrong: sometimes crash one before it settles."""
        if self.active and self.doomed is None and self.rng.random() < self.rates.new_leader_crash:
            self.doomed = (now_ms + self.rng.randint(1, self.rates.new_leader_crash_ms_max), leader)

    def plan(self, now_ms: int, step_ms: int, *, degraded: set[int], leader: int | None,
             electing: list[int] = ()) -> list[tuple]:
        """Faults to start or end at this moment: ("crash", n), ("restart", n), ("partition", groups), ("heal",)."""
        ops: list[tuple] = []
        for node, at in sorted(self.down.items()):
            if now_ms >= at:
                del self.down[node]
                ops.append(("restart", node))
        if self.groups is not None and now_ms >= self.partition_until_ms:
            self.groups = None
            ops.append(("heal",))
        if not self.active:
            return ops
        r = self.rates
        if self.doomed is not None and now_ms >= self.doomed[0]:
            node = self.doomed[1]
            self.doomed = None
            faulty = set(self.down) | degraded
            if node not in self.down and (self.durability == "fsync" or not faulty):
                self.down[node] = now_ms + self.rng.randint(1, r.restart_after_ms_max)
                ops.append(("crash", node))
                return ops
        faulty = set(self.down) | degraded | ({n for n in self.nodes if self.cut(n, CONTROLLER_ID)}
                                              if self.groups else set())
        may_fault = self.durability == "fsync" or not faulty
        if may_fault and self.rng.random() < r.crash_per_s * step_ms / 1000:
            candidates = [n for n in self.nodes if n not in self.down]
            if candidates:
                node = self.rng.choice(candidates)
                if leader in candidates and self.rng.random() < r.leader_crash_share:
                    node = leader  # leaders crashing is where the protocol is tested hardest
                elif electing and self.rng.random() < 0.5:
                    node = self.rng.choice(electing)  # a replica that has just reported
                self.down[node] = now_ms + self.rng.randint(1, r.restart_after_ms_max)
                ops.append(("crash", node))
                return ops
        if may_fault and self.groups is None and self.rng.random() < r.partition_per_s * step_ms / 1000:
            everyone = [CONTROLLER_ID, *self.nodes]
            if self.durability == "write":
                # Cut exactly one replica off from everyone else (one faulty replica).
                alone = leader if leader is not None and self.rng.random() < 0.5 else self.rng.choice(self.nodes)
                self.groups = {n: (1 if n == alone else 0) for n in everyone}
            else:
                self.groups = {n: self.rng.randint(0, 2) for n in everyone}
            self.partition_until_ms = now_ms + self.rng.randint(50, r.partition_ms_max)
            ops.append(("partition", dict(self.groups)))
        return ops

    def heal(self, now_ms: int) -> list[tuple]:
        """Liveness phase: no new faults; restart everyone, join the network."""
        self.active = False
        ops: list[tuple] = [("restart", n) for n in sorted(self.down)]
        self.down.clear()
        if self.groups is not None:
            self.groups = None
            ops.append(("heal",))
        return ops
