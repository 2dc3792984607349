"""`biplane up`: a local cluster on loopback, for trying Biplane and for tests.

    biplane up                      # 3 controllers + 3 brokers, data under ./.biplane
    biplane up --detach             # start in the background, print the endpoints, return
    biplane stop|start|restart broker|controller ID   # one child, through the supervisor
    biplane down                    # stop the supervisor, then every child process

It starts the children, waits until a controller leads and every broker is registered,
unfenced and answering METADATA, writes `<data-dir>/cluster.json` (controller URLs,
broker addresses, admin token, cluster secret, process ids and start times; the CLI and the
SDK read it when no address is given), prints the endpoints, and then supervises: a child
that dies unasked is started again after a backoff (the policy is `supervision.py`; this
module only performs it), every start and exit is a line in `logs/supervisor.log`, and a
loopback control endpoint (`control.py`) serves `biplane stop|start|restart`. In the
foreground a live status line runs until Ctrl-C, when it stops every child (brokers first,
then controllers). Running it again on the same data directory resumes the same cluster:
same ids, secret and token, the same ports when they are still free, and the data on disk.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Iterator
from typing import Any, Callable, Protocol, Sequence

from common.logs import LOG_FORMAT
from dataplane.cluster.control import KINDS, Command, ControlError, ControlServer, Reply, send_command
from dataplane.cluster.state import (CLUSTER_FILE, new_secret, pid_alive, proc_start_ticks, read_state, same_process,
                                     write_state)
from dataplane.client.discovery import CLUSTER_ENV, cluster_file_of, cluster_file_source, default_data_dir
from dataplane.cluster.supervision import (BACKOFF_INITIAL_S, BACKOFF_MAX_S, BACKOFF_STABLE_S, STOP_WAIT_S, Backoff,
                                           ChildView, CommandError, Kill, Note, Phase, Start, Supervision, Terminate)

DEFAULT_DATA_DIR = ".biplane"


class UpError(Exception):
    pass


# ------------------------------------------------------------------ ports and specs

def port_free(port: int) -> bool:
    with socket.socket() as s:
        # As the servers bind (asyncio's and aiohttp's reuse_address): a port whose last
        # connections linger in TIME_WAIT after `biplane down` is free to them, so a resumed
        # cluster keeps its ports (it moved its controllers' before, and their URLs with them).
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(taken: set[int]) -> int:
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
        if port not in taken:
            taken.add(port)
            return port


def reuse_or_new(port: int | None, taken: set[int], what: str, notes: list[str]) -> int:
    if port and port not in taken and port_free(port):
        taken.add(port)
        return port
    new = free_port(taken)
    if port:
        notes.append(f"{what}: port {port} is taken, using {new}")
    return new


def metrics_url(port: int) -> str:
    """Where Prometheus scrapes a child: every process `biplane up` starts serves /metrics."""
    return f"http://127.0.0.1:{port}/metrics"


def plan(args: argparse.Namespace, data_dir: Path, previous: dict[str, Any] | None) -> tuple[dict[str, Any], list[str]]:
    """The cluster to run: the previous one's ids, secrets and ports where possible."""
    notes: list[str] = []
    prev_controllers = (previous or {}).get("controllers", {})
    prev_brokers = (previous or {}).get("brokers", {})
    controllers = args.controllers if args.controllers is not None else (len(prev_controllers) or 3)
    brokers = args.brokers if args.brokers is not None else (len(prev_brokers) or 3)
    if controllers not in (1, 3, 5):
        raise UpError(f"--controllers {controllers}: a controller quorum has 1, 3 or 5 nodes")
    if not 1 <= brokers <= 32:
        raise UpError(f"--brokers {brokers}: give 1 to 32 brokers")
    if prev_controllers and controllers != len(prev_controllers):
        raise UpError(f"{data_dir} holds a cluster with {len(prev_controllers)} controllers; the quorum's size "
                      f"cannot change on restart (asked for {controllers}). Use another --data-dir, or remove "
                      f"{data_dir} to start afresh")
    taken: set[int] = set()
    state: dict[str, Any] = {
        "version": 1,
        "data_dir": str(data_dir),
        "admin_token": (previous or {}).get("admin_token") or new_secret(),
        "cluster_secret": (previous or {}).get("cluster_secret") or new_secret(),
        "controllers": {}, "brokers": {},
        "auto_create_topics": (args.auto_create_topics if args.auto_create_topics is not None
                               else bool((previous or {}).get("auto_create_topics", False))),
    }
    for i in range(1, controllers + 1):
        prev = prev_controllers.get(str(i), {})
        raft = reuse_or_new(prev.get("raft_port"), taken, f"controller {i} raft", notes)
        api = reuse_or_new(prev.get("api_port"), taken, f"controller {i} API", notes)
        metrics = reuse_or_new(prev.get("metrics_port"), taken, f"controller {i} metrics", notes)
        state["controllers"][str(i)] = {
            "node_id": i, "raft_port": raft, "api_port": api, "raft_address": f"127.0.0.1:{raft}",
            "api_url": f"http://127.0.0.1:{api}", "priority": controllers + 1 - i,
            "metrics_port": metrics, "metrics_url": metrics_url(metrics),
            "data_dir": str(data_dir / f"controller-{i}"), "pid": None}
    for i in range(1, brokers + 1):
        prev = prev_brokers.get(str(i), {})
        port = reuse_or_new(prev.get("port"), taken, f"broker {i}", notes)
        kafka_port = reuse_or_new(prev.get("kafka_port"), taken, f"broker {i} Kafka API", notes)
        metrics = reuse_or_new(prev.get("metrics_port"), taken, f"broker {i} metrics", notes)
        state["brokers"][str(i)] = {"broker_id": i, "port": port, "address": f"127.0.0.1:{port}",
                                    "kafka_port": kafka_port, "kafka_address": f"127.0.0.1:{kafka_port}",
                                    "metrics_port": metrics, "metrics_url": metrics_url(metrics),
                                    "data_dir": str(data_dir / f"broker-{i}"), "pid": None}
    return state, notes


# ------------------------------------------------------------------ children

class Child:
    def __init__(self, name: str, args: list[str], env: dict[str, str], log_path: Path) -> None:
        self.name = name
        self.args = args
        self.env = env
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> "Child":
        """Spawn the process (again, when it ran before); OSError when it cannot be spawned."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            # A new session: Ctrl-C in the terminal reaches `biplane up` only, which stops
            # the children in order instead of all at once.
            self.proc = subprocess.Popen(self.args, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                         env=self.env, start_new_session=True)
        return self

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def exit_code(self) -> int | None:
        return self.proc.poll() if self.proc else None

    def signal(self, signum: int) -> None:
        """Send `signum` to the process if it has not been reaped (so its pid cannot be reused yet)."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signum)
            except ProcessLookupError:
                pass

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def stop_children(children: list[Child], wait_s: float = STOP_WAIT_S) -> list[Child]:
    """SIGTERM each running child, SIGKILL those still up after `wait_s`; the ones left running."""
    alive = [c for c in children if c.exit_code() is None]
    for c in alive:
        c.signal(signal.SIGTERM)
    deadline = time.monotonic() + wait_s
    left = []
    for c in alive:
        assert c.proc is not None
        try:
            c.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            c.signal(signal.SIGKILL)
            try:
                c.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                left.append(c)
    return left


def child_env(state: dict[str, Any]) -> dict[str, str]:
    env = dict(os.environ)
    # Secrets go by environment, not argv, so `ps` does not show them.
    env["BIPLANE_CLUSTER_SECRET"] = state["cluster_secret"]
    env["BIPLANE_ADMIN_TOKEN"] = state["admin_token"]
    return env


def controller_child(state: dict[str, Any], node: dict[str, Any], logs: Path) -> Child:
    cluster = ";".join(f"{c['node_id']}={c['raft_address']},127.0.0.1:{c['api_port']},{c['priority']}"
                       for c in state["controllers"].values())
    args = [sys.executable, "-m", "common.cli", "controller", "--node-id", str(node["node_id"]),
            "--cluster", cluster, "--data-dir", node["data_dir"], "--metrics-port", str(node["metrics_port"])]
    return Child(f"controller {node['node_id']}", args, child_env(state), logs / f"controller-{node['node_id']}.log")


def broker_child(state: dict[str, Any], node: dict[str, Any], logs: Path) -> Child:
    urls = ",".join(c["api_url"] for c in state["controllers"].values())
    args = [sys.executable, "-m", "common.cli", "broker", "--broker-id", str(node["broker_id"]),
            "--data-dir", node["data_dir"], "--controller", urls, "--host", "127.0.0.1", "--port", str(node["port"]),
            "--kafka-port", str(node["kafka_port"]), "--metrics-port", str(node["metrics_port"])]
    if state.get("auto_create_topics"):
        args.append("--auto-create-topics")
    return Child(f"broker {node['broker_id']}", args, child_env(state), logs / f"broker-{node['broker_id']}.log")


# ------------------------------------------------------------------ health

def api_get(url: str, token: str | None, timeout_s: float = 2.0) -> Any:
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return json.loads(resp.read())


def leader_url(state: dict[str, Any]) -> str | None:
    for c in state["controllers"].values():
        try:
            if api_get(c["api_url"] + "/v1/health", None, 1.0).get("role") == "leader":
                return str(c["api_url"])
        except (OSError, ValueError, urllib.error.URLError):
            continue
    return None


async def _broker_metadata(address: str) -> int:
    from common.wire import MetadataRequest, WireClient
    host, port = address.rsplit(":", 1)
    client = await WireClient.connect(host, int(port), timeout_s=2)
    try:
        response = await asyncio.wait_for(client.request(MetadataRequest(topics=())), 2)
        return len(response.brokers)
    finally:
        await client.close()


def brokers_ready(state: dict[str, Any], url: str) -> tuple[bool, str]:
    try:
        listed = {b["broker_id"]: b for b in api_get(url + "/v1/brokers", state["admin_token"])["brokers"]}
    except (OSError, ValueError, urllib.error.URLError) as exc:
        return False, f"controller API: {exc}"
    wanted = [int(i) for i in state["brokers"]]
    missing = [i for i in wanted if i not in listed or listed[i]["fenced"]]
    if missing:
        return False, f"brokers not registered or still fenced: {missing}"
    for node in state["brokers"].values():
        try:
            if asyncio.run(_broker_metadata(node["address"])) < len(wanted):
                return False, f"broker {node['broker_id']} does not know every broker yet"
        except Exception as exc:  # noqa: BLE001 - any failure means "not ready yet"
            return False, f"broker {node['broker_id']} at {node['address']}: {exc or type(exc).__name__}"
    return True, "ok"


def wait_healthy(state: dict[str, Any], children: list[Child], timeout_s: float,
                 interrupted: Callable[[], bool] = lambda: False) -> None:
    deadline = time.monotonic() + timeout_s
    reason = "no controller leads yet"
    while time.monotonic() < deadline:
        if interrupted():
            raise UpError("interrupted during start-up; stopped every process it had started")
        dead = [c for c in children if c.exit_code() is not None]
        if dead:
            c = dead[0]
            raise UpError(f"{c.name} exited with code {c.exit_code()} during start-up; the end of "
                          f"{c.log_path}:\n{c.log_tail()}")
        url = leader_url(state)
        if url is None:
            reason = "no controller leads yet"
        else:
            ok, reason = brokers_ready(state, url)
            if ok:
                return
        time.sleep(0.2)
    raise UpError(f"the cluster was not healthy within {timeout_s:.0f} s: {reason}. Logs are in "
                  f"{Path(state['data_dir']) / 'logs'}")


# ------------------------------------------------------------------ status line

async def _high_watermarks(addresses: dict[int, str], partitions: list[dict[str, Any]]) -> int:
    from common.wire import ListOffsetsPartition, ListOffsetsRequest, ListOffsetsTopic, WireClient
    total = 0
    by_leader: dict[int, dict[str, list[int]]] = {}
    for p in partitions:
        if p["leader"] is not None and p["leader"] in addresses:
            by_leader.setdefault(p["leader"], {}).setdefault(p["topic"], []).append(p["partition"])
    for leader, topics in by_leader.items():
        host, port = addresses[leader].rsplit(":", 1)
        client = await WireClient.connect(host, int(port), timeout_s=1)
        try:
            request = ListOffsetsRequest(topics=tuple(
                ListOffsetsTopic(topic=t, partitions=tuple(ListOffsetsPartition(partition=n) for n in ps))
                for t, ps in topics.items()))
            response = await asyncio.wait_for(client.request(request), 1)
            total += sum(max(0, q.offset) for t in response.topics for q in t.partitions)
        finally:
            await client.close()
    return total


def committed_records(state: dict[str, Any], partitions: list[dict[str, Any]]) -> int | None:
    """The sum of every partition's high watermark (None if a leader did not answer)."""
    addresses = {int(i): b["address"] for i, b in state["brokers"].items()}
    try:
        return asyncio.run(_high_watermarks(addresses, partitions))
    except Exception:  # noqa: BLE001 - a status line shows what it can
        return None


class HasExitCode(Protocol):
    name: str

    def exit_code(self) -> int | None: ...


def supervision_parts(views: list[ChildView], now_s: float) -> list[str]:
    """The status line's word on children that restarted, wait to be restarted, or were stopped."""
    parts = []
    restarts = " ".join(f"{short_name(v.child)}:{v.restarts}" for v in views if v.restarts)
    if restarts:
        parts.append(f"restarts {restarts}")
    for v in views:
        if v.phase is Phase.BACKOFF and v.retry_at_s is not None:
            parts.append(f"DOWN {v.child} (exit {v.last_exit_code}, retry in {max(0.0, v.retry_at_s - now_s):.1f} s)")
        elif v.phase is Phase.STOPPED:
            parts.append(f"STOPPED {v.child}")
        elif v.phase is Phase.STOPPING:
            parts.append(f"stopping {v.child}")
    return parts


def short_name(child: str) -> str:
    kind, node_id = child.split(" ", 1)
    return f"{kind[0]}{node_id}"


class Status:
    def __init__(self, state: dict[str, Any]) -> None:
        self.state = state
        self.last_committed: tuple[float, int] | None = None

    def line(self, children: Sequence[HasExitCode], views: list[ChildView] | None = None) -> str:
        return " | ".join(self.local_parts(children, views) + self.cluster_parts())

    def local_parts(self, children: Sequence[HasExitCode], views: list[ChildView] | None = None) -> list[str]:
        c_up = sum(1 for c in children if c.name.startswith("controller") and c.exit_code() is None)
        b_up = sum(1 for c in children if c.name.startswith("broker") and c.exit_code() is None)
        parts = [f"controllers {c_up}/{len(self.state['controllers'])}", f"brokers {b_up}/{len(self.state['brokers'])}"]
        if views is not None:
            parts += supervision_parts(views, time.monotonic())
        else:
            dead = [c.name for c in children if c.exit_code() is not None]
            if dead:
                parts.append("EXITED: " + ", ".join(dead))
        return parts

    def cluster_parts(self) -> list[str]:
        """What the controllers and brokers say (network calls: seconds when a process is down)."""
        up, total = metrics_answering(self.state)
        return [f"metrics {up}/{total}"] + self._api_parts()

    def _api_parts(self) -> list[str]:
        token = self.state["admin_token"]
        url = leader_url(self.state)
        if url is None:
            return ["no controller leader"]
        try:
            brokers = api_get(url + "/v1/brokers", token)["brokers"]
            topics = api_get(url + "/v1/topics", token)["topics"][:50]
            partitions = [p for t in topics
                          for p in api_get(url + f"/v1/topics/{t['name']}/partitions", token)["partitions"]]
        except (OSError, ValueError, urllib.error.URLError) as exc:
            return [f"controller API: {exc}"]
        parts = []
        leaders = " ".join(f"b{b['broker_id']}:{b['leaders']}" for b in brokers)
        under = sum(1 for p in partitions if len(p["isr"]) < len(p["replicas"]))
        offline = sum(1 for p in partitions if p["leader"] is None)
        isr_sizes = sorted({len(p["isr"]) for p in partitions})
        parts.append(f"{len(partitions)} partitions, leaders {leaders or '-'}")
        parts.append(f"ISR sizes {','.join(map(str, isr_sizes)) or '-'}, under-replicated {under}, offline {offline}")
        committed = committed_records(self.state, partitions)
        now = time.monotonic()
        if committed is not None:
            if self.last_committed is not None and now > self.last_committed[0]:
                rate = max(0, committed - self.last_committed[1]) / (now - self.last_committed[0])
                parts.append(f"{rate:,.0f} records/s committed")
            self.last_committed = (now, committed)
        return parts


def metrics_answering(state: dict[str, Any], timeout_s: float = 1.0) -> tuple[int, int]:
    """(processes whose /metrics answered, processes that should serve one)."""
    urls = [n["metrics_url"] for kind in ("controllers", "brokers") for n in state[kind].values()
            if n.get("metrics_url")]
    answering = 0
    for url in urls:
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as resp:
                answering += resp.status == 200
        except (OSError, ValueError, urllib.error.URLError):
            continue
    return answering, len(urls)


class StatusPoller:
    """Refreshes `Status.cluster_parts()` on its own thread, so a controller that does not answer
    never delays the supervisor's loop (which restarts children)."""

    def __init__(self, status: Status, interval_s: float) -> None:
        self.status = status
        self.interval_s = interval_s
        self.latest: list[str] = ["waiting for the first reading"]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="biplane-up-status", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.latest = self.status.cluster_parts()
            except Exception as exc:  # noqa: BLE001 - a status line shows what it can
                self.latest = [f"status: {exc or type(exc).__name__}"]
            self._stop.wait(self.interval_s)

    def close(self) -> None:
        self._stop.set()


# ------------------------------------------------------------------ banner

def biplane_command() -> str:
    """How to run `biplane` from here: bare if it is on PATH, else the venv's script."""
    import shutil
    script = Path(sys.executable).parent / "biplane"
    on_path = shutil.which("biplane")
    if on_path and Path(on_path).resolve() == script.resolve():
        return "biplane"
    if script.exists():
        rel = os.path.relpath(script)
        return rel if not rel.startswith("..") else str(script)
    return "biplane"


def data_dir_flag(data_dir: Path) -> str:
    """` --data-dir DIR` for the commands we print, unless the CLI finds this cluster without it
    (DIR is ./.biplane, or what BIPLANE_CLUSTER names): a printed command must work as printed,
    from any directory (so DIR is absolute)."""
    import shlex
    if cluster_file_source()[0].parent.resolve() == data_dir.resolve():
        return ""
    return f" --data-dir {shlex.quote(str(data_dir.resolve()))}"


def shown_path(data_dir: Path) -> str:
    rel = os.path.relpath(data_dir)
    return str(data_dir) if rel.startswith("..") else rel


def metrics_ports(nodes: dict[str, Any]) -> str:
    return ",".join(str(n["metrics_port"]) for n in nodes.values())


def banner(state: dict[str, Any], data_dir: Path) -> str:
    cmd = biplane_command()
    flag = data_dir_flag(data_dir)
    # Found on its own (./.biplane, or what BIPLANE_CLUSTER names): the short path reads well.
    # Anywhere else every command needs the path, so it is shown whole, as those take it.
    shown = str(data_dir.resolve()) if flag else shown_path(data_dir)
    brokers = ",".join(b["address"] for b in state["brokers"].values())
    lines = [f"Biplane is up: {len(state['controllers'])} controller(s), {len(state['brokers'])} broker(s); "
             f"data in {shown}",
             f"  controllers  {', '.join(c['api_url'] for c in state['controllers'].values())}",
             f"  brokers      {brokers}",
             f"  Kafka API    {','.join(b['kafka_address'] for b in state['brokers'].values())} "
             "(bootstrap.servers for Kafka clients)",
             f"  metrics      brokers {metrics_ports(state['brokers'])}; controllers "
             f"{metrics_ports(state['controllers'])} (Prometheus: http://127.0.0.1:PORT/metrics)",
             f"  admin token  {state['admin_token']}",
             f"  cluster file {os.path.join(shown, CLUSTER_FILE)} "
             + (f"(the CLI finds it only when given --data-dir {shown}, or with {CLUSTER_ENV}={shown} exported)"
                if flag else "(the CLI and SDK use it when no address is given)"),
             "Try it:",
             f"  {cmd} topic create events --partitions 3 --replication-factor "
             f"{min(3, len(state['brokers']))} --if-not-exists{flag} && echo hello | {cmd} produce events{flag} "
             f"&& {cmd} consume events --from-beginning --max-records 1{flag}"]
    return "\n".join(lines)


# ------------------------------------------------------------------ commands

def resolve_data_dir(given: str | None) -> Path:
    return Path(given).resolve() if given else default_data_dir().resolve()


def build_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Start a local Biplane cluster on loopback.")
    p.add_argument("--controllers", type=int, help="controller quorum size: 1, 3 or 5 (default 3, or as before)")
    p.add_argument("--brokers", type=int, help="number of brokers (default 3, or as before)")
    p.add_argument("--data-dir", help="where data, logs and cluster.json live (default: the directory "
                   f"${CLUSTER_ENV} names if set, else ./.biplane)")
    p.add_argument("--detach", action="store_true", help="run in the background; stop it with `biplane down`")
    p.add_argument("--auto-create-topics", action=argparse.BooleanOptionalAction, default=None,
                   help="brokers create a topic a Kafka client asks for by name when it does not exist "
                        "(Kafka's auto.create.topics.enable; default: off, or as before)")
    p.add_argument("--timeout-s", type=float, default=90.0, help="how long to wait for a healthy cluster")
    p.add_argument("--status-interval-s", type=float, default=2.0, help="status line refresh period")
    p.add_argument("--topic", action="append", default=[], metavar="NAME[:PARTITIONS[:RF]]",
                   help="create this topic once healthy, if missing (repeatable; default 3 partitions, "
                        "replication factor min(3, brokers)); nothing is created otherwise")
    p.add_argument("--stop-wait-s", type=float, default=STOP_WAIT_S,
                   help="how long `biplane stop|restart` waits after SIGTERM before SIGKILL (default %(default)s)")
    p.add_argument("--backoff-initial-s", type=float, default=BACKOFF_INITIAL_S,
                   help="wait before restarting a child that died; doubles per exit in a row (default %(default)s)")
    p.add_argument("--backoff-max-s", type=float, default=BACKOFF_MAX_S,
                   help="the longest wait before a restart (default %(default)s)")
    p.add_argument("--backoff-stable-s", type=float, default=BACKOFF_STABLE_S,
                   help="a child up this long starts its backoff afresh when it dies (default %(default)s)")
    p.add_argument("--supervise", action="store_true", help=argparse.SUPPRESS)
    return p


def supervisor_alive(state: dict[str, Any] | None) -> int | None:
    """The pid of the supervisor (`biplane up`) the cluster file names, if that very process runs."""
    if not state:
        return None
    sup = state.get("supervisor") or {}
    pid = sup.get("pid")
    if not isinstance(pid, int) or not pid_alive(pid) or not pid_matches_cmdline(pid, sup.get("marker", "")):
        return None
    if sup.get("pid_start") is not None and proc_start_ticks(pid) != sup["pid_start"]:
        return None
    return pid



def cluster_processes(data_dir: Path) -> dict[int, str]:
    """Every broker or controller process running on a data directory under `data_dir` (found
    in /proc by its command line), pid -> name: a child the cluster file may not list yet."""
    found: dict[int, str] = {}
    prefix = str(data_dir).rstrip("/") + "/"
    for pid, argv in _running_argvs():
        if "common.cli" not in argv or "--data-dir" not in argv:
            continue
        i = argv.index("common.cli")
        kind = argv[i + 1] if i + 1 < len(argv) else ""
        where = argv[argv.index("--data-dir") + 1] if argv.index("--data-dir") + 1 < len(argv) else ""
        if kind in KINDS and where.startswith(prefix + f"{kind}-") and proc_start_ticks(pid) is not None:
            found[pid] = f"{kind} {where[len(prefix) + len(kind) + 1:]}"
    return found


def _running_argvs() -> Iterator[tuple[int, list[str]]]:
    """(pid, command line) of every process this user may read in /proc, this one excepted."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return
    for entry in entries:
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                yield int(entry), f.read().decode(errors="replace").split("\0")
        except OSError:
            continue


def supervisor_processes(data_dir: Path) -> list[int]:
    """The pids of `biplane up` processes (in the foreground or detached) running on `data_dir`,
    found in /proc by command line, working directory and environment: for `biplane down` when
    the cluster file is gone (a data directory deleted under a running cluster)."""
    found: list[int] = []
    for pid, argv in _running_argvs():
        at = next((i for i, a in enumerate(argv[1:], 1) if a == "up"
                   and (argv[i - 1] == "common.cli" or os.path.basename(argv[i - 1]) == "biplane")), None)
        if at is None:
            continue
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd").removesuffix(" (deleted)")
        except OSError:
            continue
        rest = argv[at + 1:]
        given = next((a.split("=", 1)[1] for a in rest if a.startswith("--data-dir=")), None)
        if given is None and "--data-dir" in rest and rest.index("--data-dir") + 1 < len(rest):
            given = rest[rest.index("--data-dir") + 1]
        if given is None:
            given = _environ_of(pid).get(CLUSTER_ENV)
            where = cluster_file_of(Path(cwd, given)).parent if given else Path(cwd, DEFAULT_DATA_DIR)
        else:
            where = Path(cwd, given)
        if Path(os.path.normpath(where)) == data_dir:
            found.append(pid)
    return found


def _environ_of(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            pairs = f.read().decode(errors="replace").split("\0")
    except OSError:
        return {}
    return dict(p.split("=", 1) for p in pairs if "=" in p)


def recorded_targets(state: dict[str, Any], data_dir: Path) -> dict[int, tuple[str, int | None]]:
    """pid -> (name, start time) of every child the cluster file records that still runs, and
    any other broker or controller process on this data directory."""
    targets: dict[int, tuple[str, int | None]] = {}
    for kind in ("controllers", "brokers"):
        for node_id, node in state.get(kind, {}).items():
            pid, start = node.get("pid"), node.get("pid_start")
            if pid and same_process(pid, start, state.get("data_dir")):
                targets[int(pid)] = (f"{kind[:-1]} {node_id}", start if start is not None else proc_start_ticks(pid))
    for pid, name in cluster_processes(data_dir).items():
        targets.setdefault(pid, (name, proc_start_ticks(pid)))
    return targets


def stop_recorded(state: dict[str, Any], data_dir: Path, wait_s: float = STOP_WAIT_S, *,
                  one_at_a_time: bool = False) -> list[str]:
    """Stop every process `recorded_targets` names; wait for each by pid, SIGKILL after
    `wait_s`. Returns the ones still running, as "broker 2 (pid 123)". `one_at_a_time`: each
    stops before the next is asked, so a broker's controlled shutdown can move its
    leaderships to the others, and a controller leader can hand over to a peer."""
    targets = recorded_targets(state, data_dir)

    def running(pid: int) -> bool:
        return same_process(pid, targets[pid][1])

    def stop(pids: list[int]) -> None:
        for pid in pids:
            if running(pid):
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + wait_s
        while any(running(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        for pid in pids:
            if running(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 5
        while any(running(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)

    # Brokers first, while the controllers still run to take their leaderships (controlled shutdown).
    brokers = [pid for pid in targets if targets[pid][0].startswith("broker")]
    controllers = [pid for pid in targets if not targets[pid][0].startswith("broker")]
    for group in ([[pid] for pid in brokers + controllers] if one_at_a_time else [brokers, controllers]):
        stop(group)
    return [f"{targets[pid][0]} (pid {pid})" for pid in targets if running(pid)]


def leftovers_note(state: dict[str, Any] | None, data_dir: Path) -> str | None:
    """What `biplane up` will do about children of a supervisor that died (kill -9) and still
    run: said before it does it, on the terminal the operator typed the command in."""
    targets = recorded_targets(state or {}, data_dir)
    if not targets:
        return None
    names = ", ".join(sorted(name for name, _ in targets.values()))
    return (f"the previous biplane up on {data_dir} is gone but its {names} still run: stopping them one "
            "at a time (brokers first, each with its controlled shutdown), then starting the cluster again")


def _stop_leftovers(state: dict[str, Any] | None, data_dir: Path) -> None:
    """Children of a supervisor that died without stopping them (kill -9): stop them now, one
    at a time (all at once, the brokers had nobody to hand their leaderships to: every
    partition stopped acknowledging for 9 s)."""
    left = stop_recorded(state or {}, data_dir, one_at_a_time=True)
    if left:
        raise UpError(f"could not stop processes of the previous run: {', '.join(left)}; stop them by hand")


def _own_marker() -> str:
    try:
        with open("/proc/self/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def pid_matches_cmdline(pid: int, marker: str) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip() == marker
    except OSError:
        return False


def parse_topics(specs: list[str], brokers: int) -> list[tuple[str, int, int]]:
    out = []
    for spec in specs:
        name, *numbers = spec.split(":")
        if not name or len(numbers) > 2 or not all(n.isdigit() and int(n) > 0 for n in numbers):
            raise UpError(f"--topic {spec!r} is not NAME[:PARTITIONS[:REPLICATION_FACTOR]] (e.g. events:3:3)")
        partitions = int(numbers[0]) if numbers else 3
        rf = int(numbers[1]) if len(numbers) > 1 else min(3, brokers)
        out.append((name, partitions, rf))
    return out


def create_topics(state: dict[str, Any], topics: list[tuple[str, int, int]]) -> None:
    from dataplane.client.admin import SyncAdminClient
    from common.errors import AdminError
    with SyncAdminClient([c["api_url"] for c in state["controllers"].values()], state["admin_token"]) as admin:
        for name, partitions, rf in topics:
            try:
                admin.create_topic(name, partitions=partitions, replication_factor=rf, exist_ok=True)
            except AdminError as exc:
                raise UpError(f"--topic {name}: {exc}") from None


def check_args(args: argparse.Namespace) -> None:
    """Refuse what cannot work before anything starts (a cluster of six processes started and
    then told it was 'not healthy within -1 s' is no way to learn a flag was wrong)."""
    for flag, value in (("--timeout-s", args.timeout_s), ("--status-interval-s", args.status_interval_s),
                        ("--stop-wait-s", args.stop_wait_s), ("--backoff-initial-s", args.backoff_initial_s),
                        ("--backoff-max-s", args.backoff_max_s)):
        if not value > 0:
            raise UpError(f"{flag} {value:g} must be more than 0 seconds")
    if args.backoff_stable_s < 0:
        raise UpError(f"--backoff-stable-s {args.backoff_stable_s:g} must be 0 or more seconds")
    if args.backoff_initial_s > args.backoff_max_s:
        raise UpError(f"--backoff-initial-s {args.backoff_initial_s:g} must not exceed --backoff-max-s "
                      f"{args.backoff_max_s:g}")
    if args.brokers is not None and args.brokers < 1:
        raise UpError(f"--brokers {args.brokers} must be 1 or more")
    if args.controllers is not None and args.controllers not in (1, 3, 5):
        raise UpError(f"--controllers {args.controllers} must be 1, 3 or 5 (a Raft quorum)")
    from common.errors import InvalidTopicError
    from common.metadata.config import refuse_creating_internal, validate_topic_name
    brokers = args.brokers if args.brokers is not None else 3
    for name, _, rf in parse_topics(args.topic, brokers):
        try:
            validate_topic_name(name)
            refuse_creating_internal(name)
        except InvalidTopicError as exc:
            raise UpError(f"--topic {name!r}: {exc}") from None
        if args.brokers is not None and rf > args.brokers:
            raise UpError(f"--topic {name!r}: replication factor {rf} is more than the {args.brokers} broker(s)")


def main(argv: list[str], prog: str) -> int:
    args = build_parser(prog).parse_args(argv)
    data_dir = resolve_data_dir(args.data_dir)
    try:
        check_args(args)
        check_data_dir(data_dir)
        if args.detach:
            return detach(args, argv, data_dir)
        return run(args, data_dir)
    except UpError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1


def check_data_dir(data_dir: Path) -> None:
    """The data directory and its logs directory exist and take files, or an UpError says so
    (it was a traceback: a path under a file, or under /proc)."""
    try:
        (data_dir / "logs").mkdir(parents=True, exist_ok=True)
        probe = data_dir / "logs" / ".write-check"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename else ""
        raise UpError(f"cannot use --data-dir {data_dir}: {exc.strerror or exc}{where}; "
                      "choose a directory you can write") from None


def detach(args: argparse.Namespace, argv: list[str], data_dir: Path) -> int:
    previous = read_state(data_dir) if data_dir.exists() else None
    running = supervisor_alive(previous)
    if running:
        raise UpError(f"a cluster already runs from {data_dir} (supervisor pid {running}); "
                      f"stop it with `biplane down --data-dir {data_dir}`")
    note = leftovers_note(previous, data_dir)
    if note:
        print(f"note: {note}", file=sys.stderr)   # the background run does it, out of sight
    data_dir.mkdir(parents=True, exist_ok=True)
    rest = [a for a in argv if a != "--detach"]
    rest = [a for i, a in enumerate(rest)
            if a != "--data-dir" and not (i > 0 and rest[i - 1] == "--data-dir") and not a.startswith("--data-dir=")]
    log_path = data_dir / "logs" / "up.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.time()
    earlier_bytes = log_path.stat().st_size if log_path.exists() else 0   # earlier runs' lines: not this one's
    with open(log_path, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "common.cli", "up", "--data-dir", str(data_dir), "--supervise",
                                 *rest], stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    deadline = time.monotonic() + args.timeout_s + 30
    while time.monotonic() < deadline:
        code = proc.poll()
        if code is not None:
            with open(log_path, "rb") as f:
                f.seek(earlier_bytes)
                tail = "\n".join(f.read().decode(errors="replace").splitlines()[-15:])
            raise UpError(f"the cluster did not start (exit code {code}); the end of {log_path}:\n{tail}")
        state = read_state(data_dir)
        if (state and state.get("status") == "running" and (state.get("supervisor") or {}).get("pid") == proc.pid
                and state.get("started_at", 0) >= started - 1):
            print(banner(state, data_dir))
            print(f"Running in the background (pid {proc.pid}); stop it with `{biplane_command()} down"
                  f"{data_dir_flag(data_dir)}`.")
            return 0
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGTERM)
    raise UpError(f"the cluster did not report healthy in time; see {log_path}")


# ------------------------------------------------------------------ the supervisor's driver

SUPERVISOR_LOG = "supervisor.log"
LOOP_INTERVAL_S = 0.1
COMMAND_REPLY_EXTRA_S = 20.0   # a restart's reply may wait for a stop (SIGTERM, then SIGKILL) and a start


def supervisor_logger(data_dir: Path) -> logging.Logger:
    """`<data-dir>/logs/supervisor.log`: one `key=value` line per child start, exit, stop, restart."""
    log = logging.getLogger("biplane.up")
    log.setLevel(logging.INFO)
    log.propagate = False
    path = data_dir / "logs" / SUPERVISOR_LOG
    path.parent.mkdir(parents=True, exist_ok=True)
    if not any(isinstance(h, logging.FileHandler) and h.baseFilename == str(path) for h in log.handlers):
        for h in list(log.handlers):
            log.removeHandler(h)
            h.close()
        handler = logging.FileHandler(path)
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        log.addHandler(handler)
    return log


def format_fields(fields: Sequence[tuple[str, str | int | float | None]]) -> str:
    out = []
    for key, value in fields:
        text = "-" if value is None else str(value)
        out.append(f"{key}={json.dumps(text) if (' ' in text or not text) else text}")
    return " ".join(out)


@dataclass(frozen=True, kw_only=True)
class PendingReply:
    command: Command
    old_pid: int | None
    deadline_s: float


class Driver:
    """Performs what the supervision core decides on real processes, answers the control
    channel's commands, and keeps the cluster file's pids and states current."""

    def __init__(self, *, state: dict[str, Any], data_dir: Path, children: dict[str, Child],
                 supervision: Supervision, log: logging.Logger, echo_warnings: bool) -> None:
        self.state = state
        self.data_dir = data_dir
        self.children = children
        self.supervision = supervision
        self.log = log
        self.echo_warnings = echo_warnings
        self.pending: list[PendingReply] = []

    def node(self, child: str) -> dict[str, Any]:
        kind, node_id = child.split(" ", 1)
        node: dict[str, Any] = self.state[kind + "s"][node_id]
        return node

    def step(self, now_s: float) -> None:
        """Report exits to the core, perform the actions it returns, record the result."""
        changed = False
        for name, child in self.children.items():
            view = self.supervision.view(name)
            if view.phase in (Phase.RUNNING, Phase.STOPPING) and view.pid is not None and child.pid == view.pid:
                code = child.exit_code()
                if code is not None:
                    self.supervision.exited(name, code=code, now_s=now_s)
                    changed = True
        for _ in range(3):   # a Start reports `started`, whose note comes out of the next tick
            actions = self.supervision.tick(now_s)
            if not actions:
                break
            changed = True
            for action in actions:
                self.perform(action, now_s)
        if changed:
            self.record()

    def perform(self, action: Start | Terminate | Kill | Note, now_s: float) -> None:
        if isinstance(action, Start):
            child = self.children[action.child]
            try:
                child.start()
            except OSError as exc:
                self.supervision.start_failed(action.child, reason=str(exc), now_s=now_s)
                return
            assert child.pid is not None
            self.supervision.started(action.child, pid=child.pid, now_s=now_s)
        elif isinstance(action, Terminate):
            if self.children[action.child].pid == action.pid:
                self.children[action.child].signal(signal.SIGTERM)
        elif isinstance(action, Kill):
            if self.children[action.child].pid == action.pid:
                self.children[action.child].signal(signal.SIGKILL)
        else:
            line = f"event={action.event} {format_fields((('child', action.child), *action.fields))}"
            self.log.log(logging.WARNING if action.warning else logging.INFO, "%s", line)
            if action.warning and self.echo_warnings:
                sys.stdout.write("\r\x1b[2K" + line + "\n")
                sys.stdout.flush()

    def record(self) -> None:
        for view in self.supervision.views():
            node = self.node(view.child)
            node["pid"] = view.pid
            node["pid_start"] = proc_start_ticks(view.pid) if view.pid else None
            node["state"] = view.phase.value
            node["restarts"] = view.restarts
        write_state(self.data_dir, self.state)

    def children_summary(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        return [{"child": v.child, "state": v.phase.value, "pid": v.pid, "restarts": v.restarts,
                 "crashes": v.crashes, "last_exit_code": v.last_exit_code,
                 "retry_in_s": None if v.retry_at_s is None else round(max(0.0, v.retry_at_s - now), 3)}
                for v in self.supervision.views()]

    # ---------------------------------------------------------- commands

    def command(self, command: Command, now_s: float) -> None:
        if command.child not in self.children:
            kind = command.child.split(" ", 1)[0]
            ids = ", ".join(self.state[kind + "s"])
            command.reply.put(Reply(ok=False, status=404, message=f"no {command.child} in this cluster; "
                                    f"its {kind}s are {ids}"))
            return
        old_pid = self.supervision.view(command.child).pid
        try:
            if command.verb == "stop":
                self.supervision.stop(command.child, now_s=now_s)
            elif command.verb == "start":
                self.supervision.start(command.child, now_s=now_s)
            else:
                self.supervision.restart(command.child, now_s=now_s)
        except CommandError as exc:
            command.reply.put(Reply(ok=False, status=409, message=str(exc), pid=old_pid))
            return
        self.perform(Note(event="command", child=command.child, fields=(("verb", command.verb),)), now_s)
        self.pending.append(PendingReply(command=command, old_pid=old_pid,
                                         deadline_s=now_s + self.supervision.stop_wait_s + COMMAND_REPLY_EXTRA_S - 5))

    def answer(self, now_s: float) -> None:
        """Answer each command whose outcome is there (or whose time ran out)."""
        waiting = []
        for p in self.pending:
            view = self.supervision.view(p.command.child)
            reply = None
            if p.command.verb == "stop" and view.phase is Phase.STOPPED:
                how = (f"pid {p.old_pid}, exit code {view.last_exit_code}" if p.old_pid else "it was not running")
                reply = Reply(ok=True, message=f"stopped {p.command.child} ({how}); it stays down until "
                              f"`biplane start {p.command.child}`")
            elif p.command.verb != "stop" and view.phase is Phase.RUNNING and view.pid != p.old_pid:
                verb = "restarted" if p.command.verb == "restart" else "started"
                before = f"pid {p.old_pid} -> " if p.old_pid else ""
                reply = Reply(ok=True, pid=view.pid, message=f"{verb} {p.command.child} ({before}pid {view.pid})")
            elif now_s >= p.deadline_s:
                reply = Reply(ok=False, status=504, pid=view.pid,
                              message=f"{p.command.verb} of {p.command.child} did not finish in time: it is "
                                      f"{view.phase.value}; see {self.data_dir / 'logs' / SUPERVISOR_LOG}")
            if reply is None:
                waiting.append(p)
            else:
                p.command.reply.put(reply)
        self.pending = waiting


def run(args: argparse.Namespace, data_dir: Path) -> int:
    previous = read_state(data_dir) if data_dir.exists() else None
    running = supervisor_alive(previous)
    if running:
        raise UpError(f"a cluster already runs from {data_dir} (supervisor pid {running}); "
                      f"stop it with `biplane down --data-dir {data_dir}`")
    note = None if args.supervise else leftovers_note(previous, data_dir)   # a detached run's was said
    if note:                                                                 # by the command that started it
        print(f"note: {note}", file=sys.stderr)
    _stop_leftovers(previous, data_dir)
    state, notes = plan(args, data_dir, previous)
    topics = parse_topics(args.topic, len(state["brokers"]))
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    data_dir.mkdir(parents=True, exist_ok=True)
    logs = data_dir / "logs"
    log = supervisor_logger(data_dir)
    state["status"] = "starting"
    state["started_at"] = time.time()
    state["supervisor"] = {"pid": os.getpid(), "pid_start": proc_start_ticks(os.getpid()), "marker": _own_marker(),
                           "control_url": None, "stop_wait_s": args.stop_wait_s, "log": str(logs / SUPERVISOR_LOG)}
    children: dict[str, Child] = {}
    for node in state["controllers"].values():
        child = controller_child(state, node, logs)
        children[child.name] = child
    for node in state["brokers"].values():
        child = broker_child(state, node, logs)
        children[child.name] = child
    supervision = Supervision(children=tuple(children), stop_wait_s=args.stop_wait_s,
                              backoff=Backoff(initial_s=args.backoff_initial_s, max_s=args.backoff_max_s,
                                              stable_s=args.backoff_stable_s))
    tty = sys.stdout.isatty() and not args.supervise
    driver = Driver(state=state, data_dir=data_dir, children=children, supervision=supervision, log=log,
                    echo_warnings=tty)
    stopping = {"flag": False}

    def on_signal(signum: int, frame: Any) -> None:
        stopping["flag"] = True

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):   # SIGHUP: its terminal closed
        signal.signal(signum, on_signal)
    control: ControlServer | None = None
    poller: StatusPoller | None = None
    left: list[Child] = []
    try:
        for name in children:
            supervision.launch(name)
        driver.step(time.monotonic())
        wait_healthy(state, list(children.values()), args.timeout_s, lambda: stopping["flag"])
        create_topics(state, topics)
        control = ControlServer(token=state["admin_token"], children=driver.children_summary,
                                reply_wait_s=args.stop_wait_s + COMMAND_REPLY_EXTRA_S)
        state["supervisor"]["control_url"] = control.url
        state["status"] = "running"
        driver.record()
        log.info("event=cluster_running %s", format_fields((("control_url", control.url),)))
        if not args.supervise:
            print(banner(state, data_dir))
            print("Press Ctrl-C to stop the cluster.", flush=True)
        status = Status(state)
        if tty:
            poller = StatusPoller(status, args.status_interval_s)
        next_status = 0.0
        while not stopping["flag"]:
            now = time.monotonic()
            driver.step(now)
            for _ in range(COMMANDS_PER_LOOP_MAX):
                try:
                    command = control.commands.get_nowait()
                except queue.Empty:
                    break
                driver.command(command, now)
            driver.step(now)
            driver.answer(now)
            if poller is not None and now >= next_status:
                line = " | ".join(status.local_parts(list(children.values()), supervision.views()) + poller.latest)
                sys.stdout.write("\r\x1b[2K" + line[:200])
                sys.stdout.flush()
                next_status = now + min(1.0, args.status_interval_s)
            time.sleep(LOOP_INTERVAL_S)
        if tty:
            sys.stdout.write("\n")
    finally:
        supervision.shutdown()   # from here on nothing is started again
        if poller is not None:
            poller.close()
        if control is not None:
            control.close()
        for pending in driver.pending:
            pending.command.reply.put(Reply(ok=False, status=409, message="the cluster is shutting down"))
        if not args.supervise:
            say("stopping brokers, then controllers...")
        log.info("event=cluster_stopping")
        left = stop_children([c for c in children.values() if c.name.startswith("broker")], args.stop_wait_s)
        left += stop_children([c for c in children.values() if c.name.startswith("controller")], args.stop_wait_s)
        for name, child in children.items():
            node = driver.node(name)
            still = child in left
            node["pid"] = child.pid if still else None
            node["pid_start"] = proc_start_ticks(child.pid) if still else None
            node["state"] = "running" if still else "stopped"
        state["status"] = "stopped"
        state["supervisor"] = None
        write_state(data_dir, state)
        log.info("event=cluster_stopped %s", format_fields((("left", ",".join(c.name for c in left) or None),)))
    if left:
        say(f"biplane up: could not stop {', '.join(f'{c.name} (pid {c.pid})' for c in left)}; stop it by pid",
            error=True)
        return 1
    if not args.supervise:
        say("stopped.")
    return 0


def say(text: str, error: bool = False) -> None:
    """Print, unless the terminal is gone (a closed window must not stop the shutdown)."""
    try:
        print(text, file=sys.stderr if error else sys.stdout, flush=True)
    except OSError:
        pass


COMMANDS_PER_LOOP_MAX = 8


# ------------------------------------------------------------------ biplane down

SUPERVISOR_STOP_EXTRA_S = 15.0   # beyond its two stop waits (brokers, then controllers) and their SIGKILLs


def down_main(argv: list[str], prog: str) -> int:
    p = argparse.ArgumentParser(prog=prog, description="Stop a local cluster started by `biplane up`: its "
                                "supervisor first (so nothing is restarted), then every broker and controller "
                                "the cluster file records.")
    p.add_argument("--data-dir", help="the cluster's data directory (default: the directory "
                   f"${CLUSTER_ENV} names if set, else ./.biplane)")
    args = p.parse_args(argv)
    data_dir = resolve_data_dir(args.data_dir)
    state = read_state(data_dir) if data_dir.exists() else None
    if state is None:
        return _down_without_cluster_file(data_dir, prog)
    problems = []
    pid = supervisor_alive(state)
    was_running = bool(pid) or bool(recorded_targets(state, data_dir))
    if pid:
        stop_wait_s = float((state.get("supervisor") or {}).get("stop_wait_s") or STOP_WAIT_S)
        if _stop_supervisors([pid], stop_wait_s):
            problems.append(f"supervisor (pid {pid})")
    state = read_state(data_dir) or state
    left = stop_recorded(state, data_dir)
    if not problems:
        for kind in ("controllers", "brokers"):
            for node_id, node in state.get(kind, {}).items():
                if not any(x.startswith(f"{kind[:-1]} {node_id} (") for x in left):
                    node["pid"], node["pid_start"] = None, None
                    if "state" in node:
                        node["state"] = "stopped"
        state["status"] = "stopped"
        state["supervisor"] = None
        write_state(data_dir, state)
    problems += left
    if problems:
        print(f"{prog}: could not stop {', '.join(problems)}; stop it by pid (kill -9), then run "
              f"`{prog}` again", file=sys.stderr)
        return 1
    print(f"stopped the cluster in {data_dir}" if was_running
          else f"no cluster was running in {data_dir}; nothing to stop")
    return 0


def _stop_supervisors(pids: list[int], stop_wait_s: float) -> list[int]:
    """SIGTERM each `biplane up` (it stops its children: brokers, then controllers, each within
    `stop_wait_s`), SIGKILL any still running after that; returns those still running."""
    starts = {pid: proc_start_ticks(pid) for pid in pids}

    def running() -> list[int]:
        return [pid for pid in pids if same_process(pid, starts[pid])]

    def signal_all(sig: signal.Signals, wait_s: float, every_s: float) -> None:
        for pid in running():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:   # it just exited
                pass
        deadline = time.monotonic() + wait_s
        while running() and time.monotonic() < deadline:
            time.sleep(every_s)

    signal_all(signal.SIGTERM, 2 * stop_wait_s + SUPERVISOR_STOP_EXTRA_S, 0.1)
    if running():
        signal_all(signal.SIGKILL, 5, 0.05)
    return running()


def _down_without_cluster_file(data_dir: Path, prog: str) -> int:
    """No cluster file (never started here, or the directory was deleted under a running
    cluster): stop whatever still runs on `data_dir`, found by command line, supervisors first so
    that nothing is restarted, rather than say there is nothing while it runs on."""
    supervisors = supervisor_processes(data_dir)
    children = cluster_processes(data_dir)
    if not supervisors and not children:
        print(f"{prog}: no cluster in {data_dir} (no {CLUSTER_FILE}) and no biplane process runs on it; "
              "give the cluster's --data-dir", file=sys.stderr)
        return 1
    names = [f"biplane up (pid {pid})" for pid in supervisors] + [f"{name} (pid {pid})" for pid, name in
                                                                    sorted(children.items())]
    print(f"{prog}: no {CLUSTER_FILE} in {data_dir}, but these still run on it: {', '.join(names)}; stopping them",
          file=sys.stderr)
    still = _stop_supervisors(supervisors, STOP_WAIT_S)
    left = stop_recorded({}, data_dir) + [f"biplane up (pid {pid})" for pid in still]
    if left:
        print(f"{prog}: could not stop {', '.join(left)}; stop it by pid (kill -9)", file=sys.stderr)
        return 1
    print(f"stopped the cluster in {data_dir}")
    return 0


# ------------------------------------------------------------------ biplane stop|start|restart

def child_command(verb: str, argv: list[str], prog: str) -> int:
    what = {"stop": "Stop one broker or controller of a cluster started by `biplane up`; it stays down "
                    "(not restarted) until `biplane start`. SIGTERM first (a broker's controlled shutdown), "
                    "SIGKILL if it has not exited in time.",
            "start": "Start a broker or controller that `biplane stop` stopped (or that waits to be restarted).",
            "restart": "Restart one broker or controller of a cluster started by `biplane up`: stop (SIGTERM, "
                       "then SIGKILL if it has not exited in time), then start it on the same port."}[verb]
    p = argparse.ArgumentParser(prog=prog, description=what)
    p.add_argument("kind", choices=KINDS, help="broker or controller")
    p.add_argument("node_id", metavar="ID", help="the broker id or controller node id")
    p.add_argument("--data-dir", help="the cluster's data directory (default: the directory "
                   f"${CLUSTER_ENV} names if set, else ./.biplane)")
    args = p.parse_args(argv)
    data_dir = resolve_data_dir(args.data_dir)
    try:
        reply = _send_child_command(verb, args.kind, args.node_id, data_dir)
    except UpError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    if not reply.ok:
        print(f"{prog}: {reply.message}", file=sys.stderr)
        return 1
    print(reply.message)
    return 0


def _send_child_command(verb: str, kind: str, node_id: str, data_dir: Path) -> Reply:
    state = read_state(data_dir) if data_dir.exists() else None
    if state is None:
        raise UpError(f"no cluster in {data_dir} (no {CLUSTER_FILE}); give the cluster's --data-dir, or start "
                      f"one with `biplane up --detach`")
    nodes = state.get(kind + "s", {})
    if node_id not in nodes:
        raise UpError(f"no {kind} {node_id!r} in the cluster in {data_dir}; its {kind}s are "
                      f"{', '.join(nodes) or 'none'}")
    if not supervisor_alive(state):
        raise UpError(f"no cluster runs from {data_dir} (its `biplane up` is not running); start it with "
                      f"`biplane up --detach --data-dir {data_dir}`")
    sup = state.get("supervisor") or {}
    url = sup.get("control_url")
    stop_wait_s = float(sup.get("stop_wait_s") or STOP_WAIT_S)
    if not url:
        raise UpError(f"the cluster in {data_dir} is still starting; try again once `biplane up` reports it up")
    try:
        return send_command(url, state["admin_token"], kind=kind, node_id=node_id, verb=verb,
                            timeout_s=stop_wait_s + COMMAND_REPLY_EXTRA_S + 10)
    except ControlError as exc:
        raise UpError(str(exc)) from None


def stop_main(argv: list[str], prog: str) -> int:
    return child_command("stop", argv, prog)


def start_main(argv: list[str], prog: str) -> int:
    return child_command("start", argv, prog)


def restart_main(argv: list[str], prog: str) -> int:
    return child_command("restart", argv, prog)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], "biplane up"))
