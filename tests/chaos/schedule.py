"""The fault schedule: a pure function of (seed, duration, cluster shape). No clock, no I/O.

Faults run one at a time (a gap between them), except the `*_pair` kinds, which hit two
brokers or two controllers at once and so remove a quorum on purpose. Each entry says when it
starts, how long it lasts, whom it hits and with what parameters; the runner performs it and
heals it at `start_s + duration_s`.
"""
from __future__ import annotations

import dataclasses
import random
from typing import Any

# kind -> weight. Names say what the runner does.
FAULT_WEIGHTS: dict[str, int] = {
    "kill_broker": 10,            # kill -9, restart at the heal
    "kill_controller": 5,         # kill -9 of a follower controller, restart at the heal
    "kill_controller_leader": 6,  # kill -9 of the controller the admin API names leader
    "pause_broker": 8,            # SIGSTOP, SIGCONT at the heal
    "pause_controller": 4,
    "isolate": 8,                 # drop all traffic between one process and every other
    "partition": 5,               # split the six processes in two groups (each side keeps some)
    "cut_one_way": 6,             # drop packets from one process to another, not back
    "delay": 5,                   # netem delay (with jitter) on one process's link (tbf when no netem)
    "loss": 5,                    # netem loss on one process's link
    "duplicate": 4,               # netem duplication on one process's link
    "disk_full": 5,               # fill the broker's own filesystem, free it at the heal
    "clock_jump": 5,              # move a broker's wall clock forward or back, then back to true
    "kill_broker_pair": 2,        # two brokers at once: no quorum for any partition
    "pause_controller_pair": 2,   # two controllers at once: no metadata quorum
}
QUORUM_REMOVING = frozenset({"kill_broker_pair", "pause_controller_pair"})

# Gray failures (issue 19), a named scenario of their own (`scripts/chaos --scenario gray`),
# not in the default mix, so the default schedules of a seed stay what they were. The cut
# broker still reaches the controllers and the clients; only replication paths are cut. The cut
# controller leader still reaches the brokers and the clients; only its Raft peers are cut.
GRAY_WEIGHTS: dict[str, int] = {
    "cut_leader": 3,        # one broker cut both ways from the other brokers
    "cut_leader_out": 2,    # its packets to the other brokers dropped, theirs to it delivered
    "cut_leader_in": 2,     # the other brokers' packets to it dropped, its own delivered
    "cut_follower": 2,      # two brokers cut both ways from each other only (each a follower of the other's)
    "cut_controller_leader": 2,  # the controller leader cut both ways from the other controllers only
}
GRAY_KINDS = frozenset(GRAY_WEIGHTS)
# Long enough to see the cut leader's partitions come back under the cut: session timeout
# (1.5 s) + 2 s for quorum, replica_lag_time_max_ms (2 s) + 2 s for isr.
GRAY_DURATION_S_MIN = 6.0
GRAY_DURATION_S_MAX = 7.5
# ... and far enough apart that each begins on a settled cluster (followers back in the ISR,
# leaderships handed back), so its figures are its own, not the last one's aftermath.
GRAY_GAP_S_MIN = 4.0
GRAY_GAP_S_MAX = 5.0
SCENARIOS: dict[str, tuple[str, ...]] = {"gray": tuple(GRAY_WEIGHTS)}
# Only with --kinds, not in the default mix (a seed's default schedule stays what it was).
EXTRA_WEIGHTS: dict[str, int] = {
    "pause_controller_leader": 4,   # SIGSTOP of the controller the admin API names leader
}

FAULT_DURATION_S_MIN = 0.8
FAULT_DURATION_S_MAX = 2.5
GAP_S_MIN = 0.3
GAP_S_MAX = 1.2
FAULTS_MAX = 100_000


@dataclasses.dataclass(frozen=True, kw_only=True)
class Fault:
    index: int
    kind: str
    start_s: float
    duration_s: float
    targets: tuple[str, ...]   # "b1".."bN", "c1".."cN"; "leader" for the controller leader
    params: tuple[tuple[str, Any], ...] = ()

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s

    @property
    def removes_quorum(self) -> bool:
        return self.kind in QUORUM_REMOVING

    def param(self, name: str) -> Any:
        return dict(self.params)[name]


def make_schedule(*, seed: int, duration_s: float, brokers: int = 3, controllers: int = 3,
                  start_s: float = 0.0, kinds: tuple[str, ...] | None = None) -> list[Fault]:
    """Faults from start_s until start_s + duration_s, the same list for the same arguments."""
    if duration_s <= 0:
        raise ValueError(f"duration_s={duration_s} must be positive")
    rng = random.Random(seed)
    allowed = kinds or tuple(FAULT_WEIGHTS)
    every = {**FAULT_WEIGHTS, **GRAY_WEIGHTS, **EXTRA_WEIGHTS}
    unknown = [k for k in allowed if k not in every]
    if unknown:
        raise ValueError(f"unknown fault kinds {unknown}; known: {', '.join(every)}")
    names = sorted(allowed)
    weights = [every[k] for k in names]
    bs = [f"b{i}" for i in range(1, brokers + 1)]
    cs = [f"c{i}" for i in range(1, controllers + 1)]
    everyone = bs + cs
    out: list[Fault] = []
    t = start_s + rng.uniform(GAP_S_MIN, GAP_S_MAX)
    end = start_s + duration_s
    while len(out) < FAULTS_MAX:
        kind = rng.choices(names, weights)[0]
        if kind in GRAY_KINDS:
            duration = round(rng.uniform(GRAY_DURATION_S_MIN, GRAY_DURATION_S_MAX), 3)
        else:
            duration = round(rng.uniform(FAULT_DURATION_S_MIN, FAULT_DURATION_S_MAX), 3)
        if t + duration > end:
            break
        params: dict[str, Any] = {}
        if kind in ("kill_broker", "pause_broker", "disk_full", "clock_jump"):
            targets: tuple[str, ...] = (rng.choice(bs),)
        elif kind in ("kill_controller", "pause_controller"):
            targets = (rng.choice(cs),)
        elif kind in ("kill_controller_leader", "pause_controller_leader", "cut_controller_leader"):
            targets = ("leader",)
        elif kind == "isolate":
            targets = (rng.choice(everyone),)
        elif kind == "partition":
            # one broker and one controller on the minority side
            targets = (rng.choice(bs), rng.choice(cs))
        elif kind == "cut_one_way":
            src = rng.choice(everyone)
            dst = rng.choice([n for n in everyone if n != src])
            targets = (src, dst)
        elif kind in ("delay", "loss", "duplicate"):
            targets = (rng.choice(everyone),)
            if kind == "delay":
                params = {"delay_ms": rng.choice((50, 100, 200, 400)), "jitter_ms": rng.choice((10, 50))}
            elif kind == "loss":
                params = {"percent": rng.choice((5, 20, 50))}
            else:
                params = {"percent": rng.choice((10, 30, 60))}
        elif kind in ("cut_leader", "cut_leader_out", "cut_leader_in"):
            targets = (rng.choice(bs),)
        elif kind == "cut_follower":
            targets = tuple(rng.sample(bs, 2))
        elif kind == "kill_broker_pair":
            targets = tuple(sorted(rng.sample(bs, 2)))
        elif kind == "pause_controller_pair":
            targets = tuple(sorted(rng.sample(cs, 2)))
        else:   # pragma: no cover - FAULT_WEIGHTS and this chain are kept in step by a test
            raise AssertionError(f"no targets rule for {kind}")
        if kind == "clock_jump":
            params = {"offset_s": rng.choice((-3600, -60, -5, 5, 60, 3600, 86400))}
        out.append(Fault(index=len(out), kind=kind, start_s=round(t, 3), duration_s=duration, targets=targets,
                         params=tuple(sorted(params.items()))))
        if kind in GRAY_KINDS:
            t += duration + rng.uniform(GRAY_GAP_S_MIN, GRAY_GAP_S_MAX)
        else:
            t += duration + rng.uniform(GAP_S_MIN, GAP_S_MAX)
    return out
