"""Fault injection, kept apart from the checkers: it only decides what goes wrong.

Decisions draw from random streams seeded from the simulation's seed (one for
node faults, one for the network), so a seed replays exactly. Faults: message loss, duplication, delay (hence
reordering), crashes that drop unflushed data, restarts, network partitions, an
accepted ISR change answered as an unknown outcome with the proposer's metadata lagging
(controller leadership moving).

Gray runs (`gray_rng` given) add directed cuts between brokers, never between a broker and
the controller: the leader cut from its followers both ways, only its packets to them
dropped, only theirs to it dropped, or one follower and the leader cut from each other
(issue 19's gray failures). They draw from a stream of their own, so runs without them
replay as before, and while one lasts no other node fault starts: the cut is what the run
tests (`Cut` records it for the liveness check).

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
CUT_KINDS = ("leader_both", "leader_out", "leader_in", "follower")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Cut:
    """A directed cut between brokers: packets from a to b are dropped for each (a, b), from
    start_ms until end_ms (or the liveness phase, if that comes first)."""

    kind: str
    leader: int
    edges: frozenset[tuple[int, int]]
    start_ms: int
    end_ms: int


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
    cut_per_s: float = 1.5           # gray runs: directed cuts between brokers
    cut_ms_min: int = 100
    cut_ms_max: int = 1200


# Gray runs: fewer crashes and partitions, so the cuts often meet a healthy partition, and
# cuts long enough for the controller to act within them.
GRAY_RATES = FaultRates(crash_per_s=1.0, partition_per_s=0.5, cut_per_s=3.0, cut_ms_min=200, cut_ms_max=1600)


class FaultInjector:
    def __init__(self, rng: random.Random, *, network_rng: random.Random, nodes: tuple[int, ...], durability: str,
                 rates: FaultRates = FaultRates(), gray_rng: random.Random | None = None) -> None:
        self.rng = rng                  # crashes, restarts, partitions
        self.gray_rng = gray_rng        # directed cuts (gray runs only)
        self.cut_now: Cut | None = None
        self.cuts: list[Cut] = []       # every directed cut, for the liveness check
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
        if self.cut_now is not None and (src, dst) in self.cut_now.edges:
            return True
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
        if self.cut_now is not None and now_ms >= self.cut_now.end_ms:
            ops.append(("uncut", self.cut_now, now_ms))
            self.cut_now = None
        if not self.active or self.cut_now is not None:
            return ops
        r = self.rates
        if self.gray_rng is not None and leader is not None and not self.down and self.groups is None \
                and not degraded and self.gray_rng.random() < r.cut_per_s * step_ms / 1000:
            ops.append(("cut", self._start_cut(now_ms, leader)))
            return ops
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

    def _start_cut(self, now_ms: int, leader: int) -> Cut:
        rng = self.gray_rng
        assert rng is not None
        followers = [n for n in self.nodes if n != leader]
        kind = rng.choice(CUT_KINDS)
        if kind == "leader_both":
            edges = {(leader, f) for f in followers} | {(f, leader) for f in followers}
        elif kind == "leader_out":
            edges = {(leader, f) for f in followers}
        elif kind == "leader_in":
            edges = {(f, leader) for f in followers}
        else:
            f = rng.choice(followers)
            edges = {(leader, f), (f, leader)}
        self.cut_now = Cut(kind=kind, leader=leader, edges=frozenset(edges), start_ms=now_ms,
                           end_ms=now_ms + rng.randint(self.rates.cut_ms_min, self.rates.cut_ms_max))
        self.cuts.append(self.cut_now)
        return self.cut_now

    def heal(self, now_ms: int) -> list[tuple]:
        """Liveness phase: no new faults; restart everyone, join the network."""
        self.active = False
        if self.cut_now is not None:
            ops0: list[tuple] = [("uncut", self.cut_now, now_ms)]
            self.cut_now = None
        else:
            ops0 = []
        ops: list[tuple] = ops0 + [("restart", n) for n in sorted(self.down)]
        self.down.clear()
        if self.groups is not None:
            self.groups = None
            ops.append(("heal",))
        return ops
