"""Finding a local cluster started by `biplane up` through its cluster.json.

Where to look, first match wins: a data directory the caller names (the CLI's --data-dir);
else the file, or the directory holding it, named by the BIPLANE_CLUSTER environment variable;
else ./.biplane/cluster.json. A place named explicitly that holds no cluster is an error, not a
reason to fall back to ./.biplane: that would talk to another cluster than the one asked for."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from common.errors import NoClusterError

CLUSTER_FILE = "cluster.json"
DEFAULT_DATA_DIR = ".biplane"
CLUSTER_ENV = "BIPLANE_CLUSTER"


def cluster_file_of(path: str | Path) -> Path:
    """cluster.json inside a data directory, or the path itself when it names a .json file."""
    path = Path(path)
    return path if path.suffix == ".json" and not path.is_dir() else path / CLUSTER_FILE


def cluster_file_source(data_dir: str | Path | None = None) -> tuple[Path, str]:
    """The cluster file to read and how it was chosen (for messages)."""
    if data_dir is not None:
        return cluster_file_of(data_dir), f"--data-dir {data_dir}"
    env = os.environ.get(CLUSTER_ENV)
    if env:
        return cluster_file_of(env), f"{CLUSTER_ENV}={env}"
    return Path.cwd() / DEFAULT_DATA_DIR / CLUSTER_FILE, f"./{DEFAULT_DATA_DIR}"


def default_data_dir() -> Path:
    """The data directory `biplane up`/`down`/`stop` use without --data-dir: BIPLANE_CLUSTER's,
    else ./.biplane."""
    return cluster_file_source()[0].parent


def cluster_file_candidates(data_dir: str | Path | None = None) -> list[Path]:
    return [cluster_file_source(data_dir)[0]]


def load_cluster_file(data_dir: str | Path | None = None) -> dict[str, Any]:
    path, source = cluster_file_source(data_dir)
    if not path.is_file():
        if data_dir is None and not os.environ.get(CLUSTER_ENV):
            raise NoClusterError(
                f"no cluster address given and no {DEFAULT_DATA_DIR}/{CLUSTER_FILE} here ({path}); start a cluster "
                f"with `scripts/up` or `biplane up`, or name a running one with --data-dir DIR or {CLUSTER_ENV}=DIR")
        raise NoClusterError(
            f"no cluster file at {path} (from {source}); is that the --data-dir `biplane up` was given? "
            f"Start a cluster there with `biplane up --data-dir {path.parent}`")
    try:
        doc = json.loads(path.read_text())
    except ValueError as exc:
        raise NoClusterError(f"{path} is not valid JSON ({exc}); remove it or run `biplane up` again") from None
    except OSError as exc:
        raise NoClusterError(f"cannot read {path}: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("brokers"), dict) \
            or not isinstance(doc.get("controllers"), dict):
        raise NoClusterError(f"{path} is not a cluster file of `biplane up` (no brokers and controllers in it)")
    return doc


def default_bootstrap(data_dir: str | Path | None = None) -> str:
    doc = load_cluster_file(data_dir)
    return ",".join(doc["brokers"][k]["address"] for k in sorted(doc["brokers"], key=int))


def default_admin(data_dir: str | Path | None = None) -> tuple[list[str], str]:
    doc = load_cluster_file(data_dir)
    return [c["api_url"] for _, c in sorted(doc["controllers"].items(), key=lambda kv: int(kv[0]))], doc["admin_token"]


def not_answering_hint(data_dir: str | Path | None, kind: str) -> str:
    """What to say when no `kind` ("brokers" or "controllers") of the cluster file found from
    `data_dir` (the CLI's --data-dir, or None) answered: which of them an operator stopped, or
    whether the cluster runs at all (its supervisor records itself while it runs, and a file
    left by one killed or a reboot names a process that is gone), so the hint never says to
    start what runs. The commands it names carry --data-dir unless ./.biplane finds it."""
    from dataplane.cluster.up import supervisor_alive   # here: the CLI's other paths need none of it
    where = cluster_file_source(data_dir)[0].parent
    flag = "" if data_dir is None and not os.environ.get("BIPLANE_CLUSTER") else f" --data-dir {where}"
    try:
        doc = load_cluster_file(data_dir)
        running = doc.get("status") == "running" and supervisor_alive(doc) is not None
        stopped = sorted((int(i) for i, n in doc.get(kind, {}).items() if n.get("state") == "stopped"))
    except (NoClusterError, AttributeError, TypeError, ValueError):
        running, stopped = False, []
    if not running:
        return f"; is the cluster in {where} running? Start it with `biplane up{flag} --detach`"
    one = kind.rstrip("s")
    if stopped:
        which = f"{one} {stopped[0]} was" if len(stopped) == 1 else f"{kind} {', '.join(map(str, stopped))} were"
        return (f"; the cluster in {where} runs, but {which} stopped: "
                f"`biplane start {one} {stopped[0]}{flag}` starts it again")
    return (f"; the cluster in {where} runs: `biplane cluster status{flag}` shows whether its {kind} are up "
            "(a restarted one takes a few seconds)")
