"""The cluster file `<data-dir>/cluster.json` that `biplane up` writes and `biplane down`,
the CLI and the SDK read: controller URLs, broker addresses, the admin token, the cluster
secret and every process id. Written atomically (temp file + rename)."""
from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any

from common.durable import write_atomically

CLUSTER_FILE = "cluster.json"


def read_state(data_dir: Path) -> dict[str, Any] | None:
    path = data_dir / CLUSTER_FILE
    if not path.is_file():
        return None
    try:
        state = json.loads(path.read_text())
    except ValueError as exc:
        raise SystemExit(f"{path} is not valid JSON ({exc}); fix or remove it") from None
    if not isinstance(state, dict):
        raise SystemExit(f"{path} does not hold a JSON object; fix or remove it")
    return state


def write_state(data_dir: Path, state: dict[str, Any]) -> None:
    path = data_dir / CLUSTER_FILE
    # 0o600: it holds the admin token and the cluster secret.
    write_atomically(path, (json.dumps(state, indent=2, sort_keys=True) + "\n").encode(), mode=0o600)


def new_secret() -> str:
    return secrets.token_urlsafe(24)


def pid_alive(pid: int | None, marker: str | None = None) -> bool:
    """True if `pid` runs and (when given) its command line contains `marker`: a recycled pid
    belonging to some other program is not ours to signal."""
    if not pid or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().split(")")[-1].split()[0] == "Z":
                return False   # a zombie has exited; only its parent has not reaped it yet
        if marker is not None:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                return marker.encode() in f.read()
    except OSError:
        pass
    return True


def proc_start_ticks(pid: int | None) -> int | None:
    """When `pid` started, in clock ticks since boot (/proc/PID/stat field 22), or None if it does
    not run. With the pid it names one process: a pid reused later has another start time."""
    if not pid or pid <= 0:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[-1].split()
    except OSError:
        return None
    # fields[0] is field 3 (state), so field 22 (starttime) is fields[19]
    if len(fields) < 20 or fields[0] == "Z":
        return None
    return int(fields[19])


def same_process(pid: int | None, start_ticks: int | None, marker: str | None = None) -> bool:
    """True if the process `pid` recorded with `start_ticks` still runs (and is not a zombie).
    Without a recorded start time, falls back to the command-line `marker` check."""
    if start_ticks is None:
        return pid_alive(pid, marker)
    return proc_start_ticks(pid) == start_ticks


def child_pids(state: dict[str, Any]) -> dict[str, int]:
    out = {}
    for kind in ("controllers", "brokers"):
        for node_id, node in state.get(kind, {}).items():
            if node.get("pid"):
                out[f"{kind[:-1]} {node_id}"] = node["pid"]
    return out
