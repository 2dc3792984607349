"""Start real `biplane controller` processes on loopback and talk HTTP to them (tests, benchmarks)."""
from __future__ import annotations

import dataclasses
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable

import log_check

REPO = Path(__file__).resolve().parent.parent
BIPLANE = str(REPO / ".venv" / "bin" / "biplane")
TOKEN = "test-admin-token"
SECRET = "test-cluster-secret"


_handed_out: set[int] = set()


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A port free now and below the kernel's ephemeral range. A port the kernel handed out
    (bind to 0) lies inside that range, where any process's outgoing connection may take it
    before the server the test starts later binds it ("address already in use", seen in a full
    run); below the range only an explicit bind can."""
    low = min(_ephemeral_low(), 65536)
    if low > 12000:
        for _ in range(200):
            port = random.randint(10000, low - 1)
            if port in _handed_out:
                continue
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
            _handed_out.add(port)
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclasses.dataclass
class NodeSpec:
    node_id: int
    raft_port: int
    api_port: int
    priority: int = 1
    metrics_port: int = 0   # --metrics-port (0: none asked for; make_specs gives every node one)

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    @property
    def raft_address(self) -> str:
        return f"127.0.0.1:{self.raft_port}"


def make_specs(count: int, priorities: list[int] | None = None) -> list[NodeSpec]:
    return [NodeSpec(i + 1, free_port(), free_port(), (priorities or [1] * count)[i], free_port())
            for i in range(count)]


def cluster_arg(specs: list[NodeSpec]) -> str:
    return ";".join(f"{s.node_id}={s.raft_address},127.0.0.1:{s.api_port},{s.priority}" for s in specs)


class Controller:
    """One controller process. `kill()` is kill -9; `stop()` is SIGTERM; both by pid, idempotent."""

    def __init__(self, spec: NodeSpec, specs: list[NodeSpec], data_dir: Path, extra: list[str]) -> None:
        self.spec = spec
        self.specs = specs
        self.data_dir = data_dir
        self.extra = extra
        self.proc: subprocess.Popen | None = None
        self.launch_prefix: list[str] = []   # run before the command (it must exec it: same pid)
        self.log_path = data_dir / f"controller-{spec.node_id}.log"

    def start(self) -> "Controller":
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = [BIPLANE, "controller", "--node-id", str(self.spec.node_id), "--data-dir", str(self.data_dir),
                "--admin-token", TOKEN]
        if len(self.specs) > 1:
            args += ["--cluster", cluster_arg(self.specs), "--cluster-secret", SECRET]
        else:
            args += ["--raft-address", self.spec.raft_address, "--api-address", f"127.0.0.1:{self.spec.api_port}",
                     "--priority", str(self.spec.priority)]
        if self.spec.metrics_port:
            args += ["--metrics-port", str(self.spec.metrics_port)]
        log = open(self.log_path, "ab")
        log_check.watch(self.log_path)   # checked for errors after every test (conftest.py)
        self.proc = subprocess.Popen(self.launch_prefix + args + self.extra, stdout=log, stderr=log, cwd=str(REPO))
        log.close()
        return self

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        if self.alive():
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.alive():
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def log_lines(self, text: str) -> list[tuple[float, str]]:
        """(time.time() it was written, line) of every log line containing `text`."""
        return log_lines(self.log_path, text)


LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) ")


def log_line_time_s(line: str) -> float:
    """The time a server log line was written (its local-time stamp) as time.time() would say."""
    m = LOG_TIME.match(line)
    assert m is not None, line
    return time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")) + int(m.group(2)) / 1000


def log_lines(path: Path, text: str) -> list[tuple[float, str]]:
    """(time.time() it was written, line) of every line of the server log at `path` containing `text`."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    return [(log_line_time_s(line), line) for line in lines if text in line and LOG_TIME.match(line)]


@dataclasses.dataclass
class Reply:
    status: int
    body: Any
    headers: dict

    @property
    def error(self) -> dict:
        return self.body.get("error", {}) if isinstance(self.body, dict) else {}


def http(method: str, url: str, body: Any = None, *, token: str | None = TOKEN, secret: str | None = None,
         raw: bytes | None = None, timeout_s: float = 10.0, headers: dict | None = None) -> Reply:
    """One request, no redirect following; JSON bodies decoded."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    if secret is not None:
        req.add_header("X-Biplane-Secret", secret)
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(req, timeout=timeout_s) as resp:
            status, payload, hdrs = resp.status, resp.read(), dict(resp.headers)
    except urllib.error.HTTPError as exc:
        status, payload, hdrs = exc.code, exc.read(), dict(exc.headers)
    try:
        decoded = json.loads(payload) if payload else None
    except ValueError:
        decoded = payload.decode(errors="replace")
    return Reply(status, decoded, hdrs)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def wait_until(check: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout_s
    last_exc: Exception | None = None
    while time.monotonic() < deadline:
        try:
            result = check()
            if result:
                return result
        except (OSError, urllib.error.URLError) as exc:
            last_exc = exc
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what} (last error: {last_exc})")


def leader_of(controllers: list[Controller]) -> Controller | None:
    for c in controllers:
        if not c.alive():
            continue
        try:
            r = http("GET", c.spec.api_url + "/v1/health", token=None, timeout_s=1)
        except (OSError, urllib.error.URLError):
            continue
        if r.status == 200 and r.body.get("role") == "leader":
            return c
    return None


def wait_caught_up(controllers: list[Controller], leader: Controller, *, settle_s: float = 0.5) -> None:
    """Until every controller has applied what `leader` had committed, then `settle_s` more (a
    few follower heartbeats): a test of what followers heard must not rest on a slow start."""
    offset = http("GET", leader.spec.api_url + "/v1/health", token=None).body["metadata_offset"]
    wait_until(lambda: all(http("GET", c.spec.api_url + "/v1/health", token=None).body["metadata_offset"]
                           >= offset for c in controllers), 20, "every controller caught up")
    time.sleep(settle_s)


def wait_leader(controllers: list[Controller], timeout_s: float = 20) -> Controller:
    return wait_until(lambda: leader_of(controllers), timeout_s, "a controller leader")


def run_cli(*args: str, env_extra: dict | None = None, timeout_s: float = 30) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.update(env_extra or {})
    return subprocess.run([BIPLANE, *args], capture_output=True, text=True, env=env, timeout=timeout_s,
                          cwd=str(REPO))


def python() -> str:
    return sys.executable


def register_and_unfence(url: str, broker_id: int, *, secret: str | None = None) -> None:
    """Register a broker and heartbeat it (caught up) until the controller unfences it."""
    r = http("POST", url + "/rpc/v1/register", {"broker_id": broker_id, "incarnation_id": f"inc-{broker_id}",
                                                 "host": "127.0.0.1", "port": 9090 + broker_id},
             token=None, secret=secret)
    assert r.status == 200, r.body

    def unfenced():
        offset = http("GET", url + "/v1/health", token=None).body["metadata_offset"]
        hb = http("POST", url + "/rpc/v1/heartbeat", {"broker_id": broker_id, "incarnation_id": f"inc-{broker_id}",
                                                      "metadata_offset": offset}, token=None, secret=secret)
        assert hb.status == 200, hb.body
        return not hb.body["fenced"]
    wait_until(unfenced, 10, f"broker {broker_id} unfenced")
