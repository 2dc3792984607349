"""`biplane up`: a local cluster on loopback, for trying Biplane and for tests.

    biplane up                      # 3 controllers + 3 brokers, data under ./.biplane
    biplane up --detach             # start in the background, print the endpoints, return
    biplane down                    # stop a detached cluster (every child process)

It starts the children, waits until a controller leads and every broker is registered,
unfenced and answering METADATA, writes `<data-dir>/cluster.json` (controller URLs,
broker addresses, admin token, cluster secret, process ids; the CLI and the SDK read it
when no address is given), prints the endpoints, and then shows a live status line until
Ctrl-C, when it stops every child (brokers first, then controllers). Running it again on
the same data directory resumes the same cluster: same ids, secret and token, the same
ports when they are still free, and the data on disk.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from dataplane.cluster.state import CLUSTER_FILE, child_pids, new_secret, pid_alive, read_state, write_state

DEFAULT_DATA_DIR = ".biplane"
STOP_WAIT_S = 15.0


class UpError(Exception):
    pass


# ------------------------------------------------------------------ ports and specs

def port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(taken: set[int]) -> int:
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
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
    }
    for i in range(1, controllers + 1):
        prev = prev_controllers.get(str(i), {})
        raft = reuse_or_new(prev.get("raft_port"), taken, f"controller {i} raft", notes)
        api = reuse_or_new(prev.get("api_port"), taken, f"controller {i} API", notes)
        state["controllers"][str(i)] = {
            "node_id": i, "raft_port": raft, "api_port": api, "raft_address": f"127.0.0.1:{raft}",
            "api_url": f"http://127.0.0.1:{api}", "priority": controllers + 1 - i,
            "data_dir": str(data_dir / f"controller-{i}"), "pid": None}
    for i in range(1, brokers + 1):
        prev = prev_brokers.get(str(i), {})
        port = reuse_or_new(prev.get("port"), taken, f"broker {i}", notes)
        state["brokers"][str(i)] = {"broker_id": i, "port": port, "address": f"127.0.0.1:{port}",
                                    "data_dir": str(data_dir / f"broker-{i}"), "pid": None}
    return state, notes


# ------------------------------------------------------------------ children

class Child:
    def __init__(self, name: str, args: list[str], env: dict[str, str], log_path: Path) -> None:
        self.name = name
        self.args = args
        self.env = env
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    def start(self) -> "Child":
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

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def stop_children(children: list[Child], wait_s: float = STOP_WAIT_S) -> None:
    alive = [c for c in children if c.exit_code() is None]
    for c in alive:
        try:
            os.kill(c.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + wait_s
    for c in alive:
        try:
            c.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.kill(c.pid, signal.SIGKILL)
            c.proc.wait(timeout=10)


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
            "--cluster", cluster, "--data-dir", node["data_dir"]]
    return Child(f"controller {node['node_id']}", args, child_env(state), logs / f"controller-{node['node_id']}.log")


def broker_child(state: dict[str, Any], node: dict[str, Any], logs: Path) -> Child:
    urls = ",".join(c["api_url"] for c in state["controllers"].values())
    args = [sys.executable, "-m", "common.cli", "broker", "--broker-id", str(node["broker_id"]),
            "--data-dir", node["data_dir"], "--controller", urls, "--host", "127.0.0.1", "--port", str(node["port"])]
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
                return c["api_url"]
        except (OSError, ValueError, urllib.error.URLError):
            continue
    return None


async def _broker_metadata(address: str) -> int:
    from common.wire import MetadataRequest, WireClient
    host, port = address.rsplit(":", 1)
    client = await asyncio.wait_for(WireClient.connect(host, int(port)), 2)
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


def wait_healthy(state: dict[str, Any], children: list[Child], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    reason = "no controller leads yet"
    while time.monotonic() < deadline:
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

async def _high_watermarks(addresses: dict[int, str], partitions: list[dict]) -> int:
    from common.wire import ListOffsetsPartition, ListOffsetsRequest, ListOffsetsTopic, WireClient
    total = 0
    by_leader: dict[int, dict[str, list[int]]] = {}
    for p in partitions:
        if p["leader"] is not None and p["leader"] in addresses:
            by_leader.setdefault(p["leader"], {}).setdefault(p["topic"], []).append(p["partition"])
    for leader, topics in by_leader.items():
        host, port = addresses[leader].rsplit(":", 1)
        client = await asyncio.wait_for(WireClient.connect(host, int(port)), 1)
        try:
            request = ListOffsetsRequest(topics=tuple(
                ListOffsetsTopic(topic=t, partitions=tuple(ListOffsetsPartition(partition=n) for n in ps))
                for t, ps in topics.items()))
            response = await asyncio.wait_for(client.request(request), 1)
            total += sum(max(0, q.offset) for t in response.topics for q in t.partitions)
        finally:
            await client.close()
    return total


def committed_records(state: dict[str, Any], partitions: list[dict]) -> int | None:
    """The sum of every partition's high watermark (None if a leader did not answer)."""
    addresses = {int(i): b["address"] for i, b in state["brokers"].items()}
    try:
        return asyncio.run(_high_watermarks(addresses, partitions))
    except Exception:  # noqa: BLE001 - a status line shows what it can
        return None


class Status:
    def __init__(self, state: dict[str, Any]) -> None:
        self.state = state
        self.last_committed: tuple[float, int] | None = None

    def line(self, children: list[Child]) -> str:
        token = self.state["admin_token"]
        c_up = sum(1 for c in children if c.name.startswith("controller") and c.exit_code() is None)
        b_up = sum(1 for c in children if c.name.startswith("broker") and c.exit_code() is None)
        parts = [f"controllers {c_up}/{len(self.state['controllers'])}", f"brokers {b_up}/{len(self.state['brokers'])}"]
        url = leader_url(self.state)
        if url is None:
            return " | ".join(parts + ["no controller leader"])
        try:
            brokers = api_get(url + "/v1/brokers", token)["brokers"]
            topics = api_get(url + "/v1/topics", token)["topics"][:50]
            partitions = [p for t in topics
                          for p in api_get(url + f"/v1/topics/{t['name']}/partitions", token)["partitions"]]
        except (OSError, ValueError, urllib.error.URLError) as exc:
            return " | ".join(parts + [f"controller API: {exc}"])
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
        dead = [c.name for c in children if c.exit_code() is not None]
        if dead:
            parts.append("EXITED: " + ", ".join(dead))
        return " | ".join(parts)


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


def banner(state: dict[str, Any], data_dir: Path) -> str:
    shown = os.path.relpath(data_dir) if not os.path.relpath(data_dir).startswith("..") else str(data_dir)
    brokers = ",".join(b["address"] for b in state["brokers"].values())
    cmd = biplane_command()
    lines = [f"Biplane is up: {len(state['controllers'])} controller(s), {len(state['brokers'])} broker(s); "
             f"data in {shown}",
             f"  controllers  {', '.join(c['api_url'] for c in state['controllers'].values())}",
             f"  brokers      {brokers}",
             f"  admin token  {state['admin_token']}",
             f"  cluster file {os.path.join(shown, CLUSTER_FILE)} (the CLI and SDK use it when no address is given)",
             "Try it:",
             f"  {cmd} topic create events --partitions 3 --replication-factor "
             f"{min(3, len(state['brokers']))} && echo hello | {cmd} produce events "
             f"&& {cmd} consume events --from-beginning --max-records 1"]
    return "\n".join(lines)


# ------------------------------------------------------------------ commands

def build_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Start a local Biplane cluster on loopback.")
    p.add_argument("--controllers", type=int, help="controller quorum size: 1, 3 or 5 (default 3, or as before)")
    p.add_argument("--brokers", type=int, help="number of brokers (default 3, or as before)")
    p.add_argument("--data-dir", default=DEFAULT_DATA_DIR, help="where data, logs and cluster.json live (default ./.biplane)")
    p.add_argument("--detach", action="store_true", help="run in the background; stop it with `biplane down`")
    p.add_argument("--timeout-s", type=float, default=90.0, help="how long to wait for a healthy cluster")
    p.add_argument("--status-interval-s", type=float, default=2.0, help="status line refresh period")
    p.add_argument("--topic", action="append", default=[], metavar="NAME[:PARTITIONS[:RF]]",
                   help="create this topic once healthy, if missing (repeatable; default 3 partitions, "
                        "replication factor min(3, brokers)); nothing is created otherwise")
    p.add_argument("--supervise", action="store_true", help=argparse.SUPPRESS)
    return p


def _already_running(state: dict[str, Any] | None) -> int | None:
    if not state:
        return None
    sup = state.get("supervisor") or {}
    if pid_alive(sup.get("pid")) and pid_matches_cmdline(sup["pid"], sup.get("marker", "")):
        return sup["pid"]
    return None


def _stop_leftovers(state: dict[str, Any] | None) -> None:
    """Children of a supervisor that died without stopping them (kill -9): stop them now."""
    if not state:
        return
    marker = state.get("data_dir")
    for name, pid in child_pids(state).items():
        if pid_alive(pid, marker):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_WAIT_S
    for pid in child_pids(state).values():
        while pid_alive(pid, marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        if pid_alive(pid, marker):
            os.kill(pid, signal.SIGKILL)


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
    from dataplane.client.errors import AdminError
    with SyncAdminClient([c["api_url"] for c in state["controllers"].values()], state["admin_token"]) as admin:
        for name, partitions, rf in topics:
            try:
                admin.create_topic(name, partitions=partitions, replication_factor=rf, exist_ok=True)
            except AdminError as exc:
                raise UpError(f"--topic {name}: {exc}") from None


def main(argv: list[str], prog: str) -> int:
    args = build_parser(prog).parse_args(argv)
    data_dir = Path(args.data_dir).resolve()
    try:
        if args.detach:
            return detach(args, argv, data_dir)
        return run(args, data_dir)
    except UpError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1


def detach(args: argparse.Namespace, argv: list[str], data_dir: Path) -> int:
    previous = read_state(data_dir) if data_dir.exists() else None
    running = _already_running(previous)
    if running:
        raise UpError(f"a cluster already runs from {data_dir} (supervisor pid {running}); "
                      f"stop it with `biplane down --data-dir {data_dir}`")
    data_dir.mkdir(parents=True, exist_ok=True)
    rest = [a for a in argv if a != "--detach"]
    rest = [a for i, a in enumerate(rest)
            if a != "--data-dir" and not (i > 0 and rest[i - 1] == "--data-dir") and not a.startswith("--data-dir=")]
    log_path = data_dir / "logs" / "up.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.time()
    with open(log_path, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "common.cli", "up", "--data-dir", str(data_dir), "--supervise",
                                 *rest], stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    deadline = time.monotonic() + args.timeout_s + 30
    while time.monotonic() < deadline:
        code = proc.poll()
        if code is not None:
            tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-15:])
            raise UpError(f"the cluster did not start (exit code {code}); the end of {log_path}:\n{tail}")
        state = read_state(data_dir)
        if (state and state.get("status") == "running" and (state.get("supervisor") or {}).get("pid") == proc.pid
                and state.get("started_at", 0) >= started - 1):
            print(banner(state, data_dir))
            print(f"Running in the background (pid {proc.pid}); stop it with `{biplane_command()} down"
                  f"{'' if args.data_dir == DEFAULT_DATA_DIR else ' --data-dir ' + args.data_dir}`.")
            return 0
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGTERM)
    raise UpError(f"the cluster did not report healthy in time; see {log_path}")


def run(args: argparse.Namespace, data_dir: Path) -> int:
    previous = read_state(data_dir) if data_dir.exists() else None
    running = _already_running(previous)
    if running:
        raise UpError(f"a cluster already runs from {data_dir} (supervisor pid {running}); "
                      f"stop it with `biplane down --data-dir {data_dir}`")
    _stop_leftovers(previous)
    state, notes = plan(args, data_dir, previous)
    topics = parse_topics(args.topic, len(state["brokers"]))
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    data_dir.mkdir(parents=True, exist_ok=True)
    logs = data_dir / "logs"
    state["status"] = "starting"
    state["started_at"] = time.time()
    state["supervisor"] = {"pid": os.getpid(), "marker": _own_marker()}
    children: list[Child] = []
    stopping = {"flag": False}

    def on_signal(signum: int, frame: Any) -> None:
        stopping["flag"] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        for node in state["controllers"].values():
            child = controller_child(state, node, logs).start()
            node["pid"] = child.pid
            children.append(child)
        brokers = []
        for node in state["brokers"].values():
            child = broker_child(state, node, logs).start()
            node["pid"] = child.pid
            brokers.append(child)
        children += brokers
        write_state(data_dir, state)
        wait_healthy(state, children, args.timeout_s)
        create_topics(state, topics)
        state["status"] = "running"
        write_state(data_dir, state)
        if not args.supervise:
            print(banner(state, data_dir))
            print("Press Ctrl-C to stop the cluster.", flush=True)
        status = Status(state)
        tty = sys.stdout.isatty() and not args.supervise
        next_status = 0.0
        while not stopping["flag"]:
            if tty and time.monotonic() >= next_status:
                line = status.line(children)
                width = 200
                sys.stdout.write("\r\x1b[2K" + line[:width])
                sys.stdout.flush()
                next_status = time.monotonic() + args.status_interval_s
            time.sleep(0.1)
        if tty:
            sys.stdout.write("\n")
    finally:
        if not args.supervise:
            print("stopping brokers, then controllers...", flush=True)
        stop_children([c for c in children if c.name.startswith("broker")])
        stop_children([c for c in children if c.name.startswith("controller")])
        for kind in ("controllers", "brokers"):
            for node in state[kind].values():
                node["pid"] = None
        state["status"] = "stopped"
        state["supervisor"] = None
        write_state(data_dir, state)
    if not args.supervise:
        print("stopped.")
    return 0


# ------------------------------------------------------------------ biplane down

def down_main(argv: list[str], prog: str) -> int:
    p = argparse.ArgumentParser(prog=prog, description="Stop a local cluster started by `biplane up`.")
    p.add_argument("--data-dir", default=DEFAULT_DATA_DIR, help="the cluster's data directory (default ./.biplane)")
    args = p.parse_args(argv)
    data_dir = Path(args.data_dir).resolve()
    state = read_state(data_dir) if data_dir.exists() else None
    if state is None:
        print(f"{prog}: no cluster in {data_dir} (no {CLUSTER_FILE})", file=sys.stderr)
        return 1
    sup = state.get("supervisor") or {}
    pid = sup.get("pid")
    if pid and pid_alive(pid) and pid_matches_cmdline(pid, sup.get("marker", "")):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 2 * STOP_WAIT_S + 5
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
    state = read_state(data_dir) or state
    _stop_leftovers(state)
    left = [name for name, p in child_pids(state).items() if pid_alive(p, state.get("data_dir"))]
    if left:
        print(f"{prog}: still running: {', '.join(left)}", file=sys.stderr)
        return 1
    print(f"stopped the cluster in {data_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], "biplane up"))
