"""Finding a local cluster started by `biplane up`: ./.biplane/cluster.json, then the
file (or directory holding it) named by the BIPLANE_CLUSTER environment variable."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from common.errors import NoClusterError

CLUSTER_FILE = "cluster.json"
DEFAULT_DATA_DIR = ".biplane"


def cluster_file_candidates() -> list[Path]:
    out = [Path.cwd() / DEFAULT_DATA_DIR / CLUSTER_FILE]
    env = os.environ.get("BIPLANE_CLUSTER")
    if env:
        path = Path(env)
        out.append(path / CLUSTER_FILE if path.is_dir() else path)
    return out


def load_cluster_file() -> dict[str, Any]:
    for path in cluster_file_candidates():
        if path.is_file():
            try:
                return json.loads(path.read_text())
            except ValueError as exc:
                raise NoClusterError(f"{path} is not valid JSON ({exc}); remove it or run `biplane up` again") from None
    tried = ", ".join(str(p) for p in cluster_file_candidates())
    raise NoClusterError(f"no cluster address given and no cluster file found (looked at {tried}); "
                         "start one with `scripts/up` (or `biplane up`), or pass the address explicitly")


def default_bootstrap() -> str:
    doc = load_cluster_file()
    return ",".join(doc["brokers"][k]["address"] for k in sorted(doc["brokers"], key=int))


def default_admin() -> tuple[list[str], str]:
    doc = load_cluster_file()
    return [c["api_url"] for _, c in sorted(doc["controllers"].items(), key=lambda kv: int(kv[0]))], doc["admin_token"]
