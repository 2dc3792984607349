"""The supervision policy of `biplane up`, with no processes in it: per child, what the
operator wants (running or stopped), what the process is doing, and when a child that died
is started again.

The driver (`dataplane/cluster/up.py`) owns the processes and the clock. It tells the core
what happened (`started`, `start_failed`, `exited`) and what an operator asked (`stop`,
`start`, `restart`), then calls `tick(now_s)` and performs the actions it gets back, in
order: `Start` (spawn the child, then report `started` or `start_failed`), `Terminate`
(SIGTERM), `Kill` (SIGKILL), `Note` (write one log line).

Rules:
- A child that exits while the operator wants it running is started again after a backoff:
  `Backoff.delay_s(failures)`, 0.5 s doubling to 30 s. `failures` counts exits in a row; an
  exit after the child stayed up `stable_s` or longer counts as the first again. A child that
  crashes at start therefore waits 0.5, 1, 2, 4 ... 30 s between tries: it never spins.
- `stop` sends SIGTERM and, when the child has not exited within `stop_wait_s`, SIGKILL.
  A stopped child stays down until `start` or `restart`.
- `restart` is `stop` then an immediate start (no backoff: the exit was asked for).
- `start` of a child waiting out its backoff starts it now.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Union

BACKOFF_INITIAL_S = 0.5
BACKOFF_MAX_S = 30.0
BACKOFF_STABLE_S = 10.0
STOP_WAIT_S = 10.0


@dataclass(frozen=True, kw_only=True)
class Backoff:
    """How long to wait before starting a child that died, after `failures` exits in a row."""
    initial_s: float = BACKOFF_INITIAL_S
    factor: float = 2.0
    max_s: float = BACKOFF_MAX_S
    stable_s: float = BACKOFF_STABLE_S   # up this long, and the next exit counts as the first

    def __post_init__(self) -> None:
        if not 0 < self.initial_s <= self.max_s:
            raise ValueError(f"backoff initial_s={self.initial_s} must be > 0 and <= max_s={self.max_s}")
        if self.factor < 1:
            raise ValueError(f"backoff factor={self.factor} must be >= 1")
        if self.stable_s < 0:
            raise ValueError(f"backoff stable_s={self.stable_s} must be >= 0")

    def delay_s(self, failures: int) -> float:
        """The wait before the next start; `failures` >= 1 is the number of exits in a row."""
        assert failures >= 1, failures
        exponent = min(failures - 1, 64)   # bounded: 2**64 * 0.5 s is past any max_s
        return min(self.max_s, self.initial_s * self.factor ** exponent)

    def failures_after_exit(self, failures_before: int, up_s: float) -> int:
        """Exits in a row once a child that ran `up_s` seconds has exited."""
        return 1 if up_s >= self.stable_s else failures_before + 1


class Phase(enum.Enum):
    RUNNING = "running"      # a process runs
    STOPPING = "stopping"    # SIGTERM sent (SIGKILL at kill_at_s), waiting for the exit
    BACKOFF = "backoff"      # died unasked; started again at retry_at_s
    STOPPED = "stopped"      # down because the operator (or shutdown) asked
    STARTING = "starting"    # a Start action is out; the driver reports started/start_failed


# ------------------------------------------------------------------ actions

@dataclass(frozen=True, kw_only=True)
class Start:
    child: str


@dataclass(frozen=True, kw_only=True)
class Terminate:
    child: str
    pid: int


@dataclass(frozen=True, kw_only=True)
class Kill:
    child: str
    pid: int


@dataclass(frozen=True, kw_only=True)
class Note:
    """One log line: `event` and its fields; `warning` for what an operator should look at."""
    event: str
    child: str
    fields: tuple[tuple[str, str | int | float | None], ...] = ()
    warning: bool = False


Action = Union[Start, Terminate, Kill, Note]


@dataclass(frozen=True, kw_only=True)
class ChildView:
    """What the status line and the cluster file show of one child."""
    child: str
    phase: Phase
    wanted_running: bool
    pid: int | None
    restarts: int               # starts after the first one, asked for or not
    crashes: int                # exits nobody asked for
    failures_in_a_row: int
    retry_at_s: float | None    # in BACKOFF: when the next start is due
    last_exit_code: int | None


class CommandError(Exception):
    """An operator's command that does not fit the child's state (e.g. start of a running child)."""


@dataclass
class _Child:
    name: str
    phase: Phase = Phase.STOPPED
    wanted_running: bool = False
    pid: int | None = None
    started_at_s: float = 0.0
    kill_at_s: float | None = None
    killed: bool = False
    retry_at_s: float | None = None
    failures: int = 0
    restarts: int = 0
    crashes: int = 0
    starts: int = 0
    last_exit_code: int | None = None


@dataclass
class Supervision:
    """Desired state and backoff for every child, driven by events and `tick(now_s)`."""
    children: tuple[str, ...]
    backoff: Backoff = field(default_factory=Backoff)
    stop_wait_s: float = STOP_WAIT_S

    def __post_init__(self) -> None:
        if len(set(self.children)) != len(self.children):
            raise ValueError(f"child names repeat: {self.children}")
        self._state: dict[str, _Child] = {name: _Child(name) for name in self.children}
        self._pending: list[Action] = []
        self._shutting_down = False

    # ---------------------------------------------------------- views

    def view(self, child: str) -> ChildView:
        c = self._child(child)
        return ChildView(child=c.name, phase=c.phase, wanted_running=c.wanted_running, pid=c.pid,
                         restarts=c.restarts, crashes=c.crashes, failures_in_a_row=c.failures,
                         retry_at_s=c.retry_at_s if c.phase is Phase.BACKOFF else None,
                         last_exit_code=c.last_exit_code)

    def views(self) -> list[ChildView]:
        return [self.view(name) for name in self.children]

    def _child(self, child: str) -> _Child:
        try:
            return self._state[child]
        except KeyError:
            raise CommandError(f"no child named {child!r}; the children are {', '.join(self.children)}") from None

    # ---------------------------------------------------------- what the driver saw

    def launch(self, child: str) -> None:
        """The first start of a child (cluster start-up): want it running, start it now."""
        c = self._child(child)
        c.wanted_running = True
        self._begin_start(c)

    def started(self, child: str, *, pid: int, now_s: float) -> None:
        c = self._child(child)
        assert c.phase is Phase.STARTING, (child, c.phase)
        c.phase, c.pid, c.started_at_s = Phase.RUNNING, pid, now_s
        c.starts += 1
        if c.starts > 1:
            c.restarts += 1
            self._pending.append(Note(event="child_restarted", child=child,
                                      fields=(("pid", pid), ("restarts", c.restarts))))
        else:
            self._pending.append(Note(event="child_started", child=child, fields=(("pid", pid),)))

    def start_failed(self, child: str, *, reason: str, now_s: float) -> None:
        """The driver could not spawn the child at all: treated as an exit at once."""
        c = self._child(child)
        assert c.phase is Phase.STARTING, (child, c.phase)
        c.phase, c.started_at_s = Phase.RUNNING, now_s
        self._pending.append(Note(event="child_start_failed", child=child, fields=(("reason", reason),),
                                  warning=True))
        self.exited(child, code=None, now_s=now_s)

    def exited(self, child: str, *, code: int | None, now_s: float) -> None:
        c = self._child(child)
        assert c.phase in (Phase.RUNNING, Phase.STOPPING), (child, c.phase)
        pid, was = c.pid, c.phase
        c.pid, c.last_exit_code, c.kill_at_s, c.killed = None, code, None, False
        if was is Phase.STOPPING or not c.wanted_running or self._shutting_down:
            self._pending.append(Note(event="child_stopped", child=child, fields=(("pid", pid), ("code", code))))
            if c.wanted_running and not self._shutting_down:   # a restart: start again at once
                c.failures = 0
                self._begin_start(c)
            else:
                c.phase = Phase.STOPPED
            return
        c.crashes += 1
        c.failures = self.backoff.failures_after_exit(c.failures, now_s - c.started_at_s)
        delay_s = self.backoff.delay_s(c.failures)
        c.phase, c.retry_at_s = Phase.BACKOFF, now_s + delay_s
        self._pending.append(Note(event="child_exited", child=child, warning=True,
                                  fields=(("pid", pid), ("code", code), ("up_s", round(now_s - c.started_at_s, 3)),
                                          ("failures_in_a_row", c.failures), ("restart_in_s", delay_s))))

    # ---------------------------------------------------------- what an operator asked

    def stop(self, child: str, *, now_s: float) -> None:
        c = self._child(child)
        c.wanted_running = False
        if c.phase is Phase.RUNNING:
            self._terminate(c, now_s)
        elif c.phase is Phase.BACKOFF:
            c.phase, c.retry_at_s = Phase.STOPPED, None
            self._pending.append(Note(event="child_stopped", child=child, fields=(("pid", None), ("code", None))))
        # STOPPING: already on its way down; STOPPED: nothing to do.

    def start(self, child: str, *, now_s: float) -> None:
        c = self._child(child)
        if self._shutting_down:
            raise CommandError("the cluster is shutting down")
        if c.phase is Phase.RUNNING:
            raise CommandError(f"{child} already runs (pid {c.pid}); use restart to replace it")
        c.wanted_running = True
        c.failures = 0
        if c.phase in (Phase.STOPPED, Phase.BACKOFF):
            self._begin_start(c)
        # STOPPING: `exited` starts it once it is down.

    def restart(self, child: str, *, now_s: float) -> None:
        c = self._child(child)
        if self._shutting_down:
            raise CommandError("the cluster is shutting down")
        c.wanted_running = True
        c.failures = 0
        if c.phase is Phase.RUNNING:
            self._terminate(c, now_s)
        elif c.phase in (Phase.STOPPED, Phase.BACKOFF):
            self._begin_start(c)

    def shutdown(self) -> None:
        """No child is started again from now on, whatever exits."""
        self._shutting_down = True
        for c in self._state.values():
            c.wanted_running = False
            if c.phase is Phase.BACKOFF:
                c.phase, c.retry_at_s = Phase.STOPPED, None

    # ---------------------------------------------------------- time

    def tick(self, now_s: float) -> list[Action]:
        """The actions due at `now_s`, in the order to perform them."""
        for c in self._state.values():
            if c.phase is Phase.BACKOFF and c.retry_at_s is not None and now_s >= c.retry_at_s:
                self._pending.append(Note(event="child_restarting", child=c.name,
                                          fields=(("failures_in_a_row", c.failures),)))
                self._begin_start(c)
            elif (c.phase is Phase.STOPPING and not c.killed and c.kill_at_s is not None
                  and now_s >= c.kill_at_s and c.pid is not None):
                c.killed = True
                self._pending.append(Note(event="child_kill", child=c.name, warning=True,
                                          fields=(("pid", c.pid), ("after_s", self.stop_wait_s))))
                self._pending.append(Kill(child=c.name, pid=c.pid))
        actions, self._pending = self._pending, []
        return actions

    # ---------------------------------------------------------- internals

    def _begin_start(self, c: _Child) -> None:
        c.phase, c.retry_at_s = Phase.STARTING, None
        self._pending.append(Start(child=c.name))

    def _terminate(self, c: _Child, now_s: float) -> None:
        assert c.pid is not None, c.name
        c.phase, c.kill_at_s, c.killed = Phase.STOPPING, now_s + self.stop_wait_s, False
        self._pending.append(Note(event="child_stopping", child=c.name, fields=(("pid", c.pid),)))
        self._pending.append(Terminate(child=c.name, pid=c.pid))
