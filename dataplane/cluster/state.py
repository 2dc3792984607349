"""The cluster file `<data-dir>/cluster.json` that `biplane up` writes and `biplane down`,
the CLI and the SDK read: controller URLs, broker addresses, the admin token, the cluster
secret and every process id. Written atomically (temp file + rename)."""
from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any

CLUSTER_FILE = "cluster.json"


def read_state(data_dir: Path) -> dict[str, Any] | None:
    path = data_dir / CLUSTER_FILE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except ValueError as exc:
        raise SystemExit(f"{path} is not valid JSON ({exc}); fix or remove it") from None


def write_state(data_dir: Path, state: dict[str, Any]) -> None:
    path = data_dir / CLUSTER_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
    os.chmod(tmp, 0o600)   # it holds the admin token and the cluster secret
    os.replace(tmp, path)


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


def child_pids(state: dict[str, Any]) -> dict[str, int]:
    out = {}
    for kind in ("controllers", "brokers"):
        for node_id, node in state.get(kind, {}).items():
            if node.get("pid"):
                out[f"{kind[:-1]} {node_id}"] = node["pid"]
    return out
