"""Broker fences as the controllers logged them: the committing leader writes one WARNING line
per fence (controller/service.py, event `controller.broker_fenced`), so the harness learns of
every fence from the logs after the run, adding no load to the run it watches.

    broker fenced: broker_id=2 reason='session expired' at_ms=1764043200123 silent_ms=1620 controller=1

`at_ms` is the deciding controller's wall clock (controllers run without libfaketime, so it is
the machine's), turned into the run's clock with the wall time the workload started at.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.chaos.history import Fence

LINE = re.compile(r"broker fenced: broker_id=(?P<broker>\d+) reason=(?P<reason>'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\") "
                  r"at_ms=(?P<at_ms>\d+) silent_ms=(?P<silent>-?\d+|None) controller=(?P<controller>\d+)")


def parse_fences(lines: list[str], wall_t0_s: float) -> list[Fence]:
    """Every fence line, once (a line is written by the leader that committed it; the same
    broker and `at_ms` twice would be one fence read twice), in time order."""
    seen: set[tuple[str, int]] = set()
    out: list[Fence] = []
    for line in lines:
        m = LINE.search(line)
        if m is None:
            continue
        broker, at_ms = f"b{m['broker']}", int(m["at_ms"])
        if (broker, at_ms) in seen:
            continue
        seen.add((broker, at_ms))
        out.append(Fence(broker=broker, at_s=round(at_ms / 1000 - wall_t0_s, 3), reason=ast.literal_eval(m["reason"]),
                         silent_ms=None if m["silent"] == "None" else int(m["silent"]),
                         controller=f"c{m['controller']}"))
    return sorted(out, key=lambda f: (f.at_s, f.broker))


def read_fences(log_paths: list[Path], wall_t0_s: float) -> list[Fence]:
    lines: list[str] = []
    for path in log_paths:
        try:
            lines += path.read_text(errors="replace").splitlines()
        except OSError:
            continue
    return parse_fences(lines, wall_t0_s)
