"""The cluster's processes: 3 controllers and 3 brokers, each started inside its own network
namespace (`ip netns exec`, which execs, so the pid we hold is the process's own), bound to
its namespace's address only. Each broker's data directory is a size-limited tmpfs of its own
(so the harness can fill it), and each broker's wall clock reads through libfaketime from a
timestamp file the harness rewrites (its monotonic clock stays true).
"""
from __future__ import annotations

import dataclasses
import glob
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.chaos.net import Network, run

RAFT_PORT = 7001
API_PORT = 7002
BROKER_PORT = 9092
STOP_WAIT_S = 8.0
FILL_NAME = "chaos-disk-fill"


class ClusterError(Exception):
    pass


def faketime_library() -> str | None:
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1")) + sorted(glob.glob("/usr/lib/faketime/libfaketime.so.1"))
    return found[0] if found else None


SHM_DIR = Path("/dev/shm")


def faketime_leftovers(pid: int) -> list[Path]:
    """The files libfaketime made for process `pid` in /dev/shm: a shared-memory segment and a
    semaphore, shared segment first. Debian's 0.9.10 does not reliably remove them: a killed
    process never does, and a broker (started through `ip netns exec`, itself preloaded, which
    execs it) leaves them even when it exits cleanly. So every broker start of every run left
    two files in a tmpfs, for good."""
    # Removed in this order: a process that finds the segment without its semaphore exits.
    return [path for path in (SHM_DIR / f"faketime_shm_{pid}", SHM_DIR / f"sem.faketime_sem_{pid}")
            if path.exists()]


def process_exited(pid: int) -> bool:
    """True once `pid` has exited, reaped or not: a killed run's processes are left to an init
    that need not reap them (this machine's does not), and a zombie holds nothing."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def remove_faketime_leftovers(pid: int) -> None:
    """Remove `pid`'s libfaketime files once it has exited (a pid the kernel may give again)."""
    for path in faketime_leftovers(pid):
        path.unlink(missing_ok=True)


def faketime_env(library: str, clock_file: Path) -> dict[str, str]:
    """A broker's libfaketime settings: its wall clock reads the offset in `clock_file`, its
    monotonic clock stays true.

    FAKETIME_FORCE_MONOTONIC_FIX=0: by default (Debian's 0.9.10) libfaketime rewrites the
    deadline of every pthread_cond_timedwait as if it were a faked wall-clock time, even on a
    condition variable timed by CLOCK_MONOTONIC, as CPython's GIL is. The deadline lands in the
    past, so a thread waiting for the GIL spins instead of sleeping: with the heartbeat thread
    or a worker thread runnable beside the event loop, a broker burned CPU in GIL handoffs and
    did a third of the work (measured: two threads contending for the GIL, 2.4 M loop
    iterations in 2 s against 6.0 M without libfaketime, 5.7 M with this setting), which showed
    as event-loop stalls "kept off the CPU" and heartbeats late enough to fence the broker.

    Under these settings time.sleep raises OSError(EINVAL) on Python 3.11+ (it sleeps with
    clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME), whose deadline 0.9.10 rewrites into a
    negative time); threading.Event.wait is unaffected, and the broker waits only that way."""
    return {"LD_PRELOAD": library, "FAKETIME_TIMESTAMP_FILE": str(clock_file), "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            "FAKETIME_CACHE_DURATION": "1", "FAKETIME_DONT_RESET": "1", "FAKETIME_FORCE_MONOTONIC_FIX": "0"}


@dataclasses.dataclass(kw_only=True)
class Node:
    name: str            # c1.. / b1..
    kind: str            # "controller" | "broker"
    node_id: int
    netns: str
    address: str
    data_dir: Path
    log_path: Path
    args: list[str]
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    paused: bool = False
    mounted: bool = False
    clock_file: Path | None = None
    starts: int = 0

    def start(self) -> None:
        self._remove_faketime_files()   # the process before, if it died by itself
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"\n==== chaos: start #{self.starts + 1} at {time.time():.3f}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(["ip", "netns", "exec", self.netns, *self.args], stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=log, env=self.env, start_new_session=True)
        self.starts += 1
        self.paused = False

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        if self.alive():
            assert self.proc is not None
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        self._remove_faketime_files()
        self.paused = False

    def pause(self) -> None:
        if self.alive():
            assert self.proc is not None
            os.kill(self.proc.pid, signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        if self.proc is not None and self.paused:
            try:
                os.kill(self.proc.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        self.paused = False

    def stop(self, wait_s: float = STOP_WAIT_S) -> None:
        """SIGCONT (if paused), SIGTERM, then SIGKILL after wait_s. Idempotent."""
        if not self.alive():
            self._remove_faketime_files()
            return
        assert self.proc is not None
        self.resume()
        os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        self._remove_faketime_files()

    def _remove_faketime_files(self) -> None:
        """After the process exited and was waited for: drop what libfaketime left of it. A
        process found dead by `alive()` keeps its files until the next stop or start; its pid
        could be given to another process meanwhile, which would lose its files, harmlessly
        (a running process keeps its mapping)."""
        if self.proc is not None and self.clock_file is not None and self.proc.poll() is not None:
            remove_faketime_leftovers(self.proc.pid)


# Diagnostics: processes log at INFO with BIPLANE_CHAOS_TRACE=1, at DEBUG (every fetch round
# a follower sends, each partition's refusals) with BIPLANE_CHAOS_TRACE=debug; at their default
# level with BIPLANE_CHAOS_TRACE=metadata (only the runner's metadata trace: a run timed as an
# untraced one).
_LOG_LEVEL = {"1": ["--log-level", "INFO"], "debug": ["--log-level", "DEBUG"]}.get(
    os.environ.get("BIPLANE_CHAOS_TRACE", ""), [])


class Cluster:
    def __init__(self, *, network: Network, work_dir: Path, repo_root: Path, broker_disk_mb: int,
                 python: str = sys.executable) -> None:
        self.network = network
        self.work_dir = work_dir
        self.admin_token = secrets.token_urlsafe(16)
        self.cluster_secret = secrets.token_urlsafe(16)
        self.broker_disk_mb = broker_disk_mb
        base_env = {k: v for k, v in os.environ.items() if not k.startswith(("BIPLANE_", "LD_PRELOAD", "FAKETIME"))}
        base_env.update({"PYTHONPATH": str(repo_root), "BIPLANE_CLUSTER_SECRET": self.cluster_secret,
                         "BIPLANE_ADMIN_TOKEN": self.admin_token, "PYTHONUNBUFFERED": "1"})
        controllers = sorted(n for n in network.nodes if n.startswith("c"))
        brokers = sorted(n for n in network.nodes if n.startswith("b"))
        self.controller_urls = [f"http://{network.nodes[c].address}:{API_PORT}" for c in controllers]
        spec = ";".join(f"{c[1:]}={network.nodes[c].address}:{RAFT_PORT},{network.nodes[c].address}:{API_PORT},"
                        f"{len(controllers) + 1 - int(c[1:])}" for c in controllers)
        faketime = faketime_library()
        if faketime is None:
            raise ClusterError("libfaketime is not installed; run scripts/system-deps.sh as root")
        self.nodes: dict[str, Node] = {}
        for c in controllers:
            ep = network.nodes[c]
            data = work_dir / f"controller-{c[1:]}"
            self.nodes[c] = Node(name=c, kind="controller", node_id=int(c[1:]), netns=ep.netns, address=ep.address,
                                 data_dir=data, log_path=work_dir / "logs" / f"controller-{c[1:]}.log",
                                 args=[python, "-m", "common.cli", "controller", "--node-id", c[1:],
                                       "--cluster", spec, "--data-dir", str(data)] + _LOG_LEVEL, env=dict(base_env))
        for b in brokers:
            ep = network.nodes[b]
            data = work_dir / f"broker-{b[1:]}"
            clock = work_dir / f"broker-{b[1:]}.faketime"
            env = dict(base_env)
            env.update(faketime_env(faketime, clock))
            self.nodes[b] = Node(name=b, kind="broker", node_id=int(b[1:]), netns=ep.netns, address=ep.address,
                                 data_dir=data, log_path=work_dir / "logs" / f"broker-{b[1:]}.log",
                                 args=[python, "-m", "common.cli", "broker", "--broker-id", b[1:],
                                       "--data-dir", str(data), "--controller", ",".join(self.controller_urls),
                                       "--host", ep.address, "--port", str(BROKER_PORT)] + _LOG_LEVEL,
                                 env=env, clock_file=clock)

    @property
    def bootstrap(self) -> str:
        return ",".join(f"{n.address}:{BROKER_PORT}" for n in self.nodes.values() if n.kind == "broker")

    def brokers(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.kind == "broker"]

    def controllers(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.kind == "controller"]

    # ------------------------------------------------------------------ disks and clocks

    def prepare(self) -> None:
        for node in self.nodes.values():
            node.data_dir.mkdir(parents=True, exist_ok=True)
        for node in self.brokers():
            run(["mount", "-t", "tmpfs", "-o", f"size={self.broker_disk_mb}m,mode=0755",
                 f"biplane-chaos-{node.name}", str(node.data_dir)])
            node.mounted = True
            self.set_clock(node, 0)

    def set_clock(self, node: Node, offset_s: int) -> None:
        assert node.clock_file is not None
        tmp = node.clock_file.with_suffix(".tmp")
        tmp.write_text(f"{offset_s:+d}s\n" if offset_s else "+0\n")
        os.replace(tmp, node.clock_file)

    def fill_disk(self, node: Node) -> int:
        """Take every free byte of the broker's filesystem; returns how many."""
        path = node.data_dir / FILL_NAME
        st = os.statvfs(node.data_dir)
        free = st.f_bavail * st.f_frsize
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            if free > 0:
                try:
                    os.posix_fallocate(fd, 0, free)
                except OSError:
                    pass
            chunk = b"\0" * (1 << 20)
            try:   # whatever fallocate left (metadata rounding): write until ENOSPC, bounded
                for _ in range(64):
                    os.write(fd, chunk)
            except OSError:
                pass
        finally:
            os.close(fd)
        return free

    def free_disk(self, node: Node) -> None:
        try:
            os.unlink(node.data_dir / FILL_NAME)
        except FileNotFoundError:
            pass

    # ------------------------------------------------------------------ control plane

    def controller_leader(self) -> Node | None:
        for node in self.controllers():
            if not node.alive() or node.paused:
                continue
            answer = self.health(node)
            if answer is not None and answer.get("role") == "leader":
                return node
        return None

    def health(self, node: Node) -> dict[str, Any] | None:
        """One controller's own /v1/health answer; None when it does not answer."""
        try:
            with urllib.request.urlopen(f"http://{node.address}:{API_PORT}/v1/health", timeout=1.0) as resp:
                answer = json.loads(resp.read())
                return answer if isinstance(answer, dict) else None
        except (OSError, ValueError, urllib.error.URLError):
            return None

    def waiting_for(self, node: Node, topics: list[str], committed: int) -> str | None:
        """What a restarted process still lacks to be back in service (None: nothing). A
        broker: registered again (after `committed`, the metadata offset the controllers had
        when it was killed: the controller may not have noticed it was gone), unfenced, no
        replica still opening, and in the ISR of every partition it replicates. A controller:
        answering, with the metadata committed when it was killed."""
        if not node.alive():
            return "not running"
        if node.paused:
            return "paused"
        if node.kind == "controller":
            answer = self.health(node)
            if answer is None:
                return "not answering"
            offset = int(answer.get("metadata_offset", -1))
            return None if offset >= committed else f"metadata at {offset}, {committed} committed at the kill"
        try:
            listed = {b["broker_id"]: b for b in self.api_get("/v1/brokers")["brokers"]}
            me = listed.get(node.node_id)
            if me is None or me["registered_offset"] <= committed:
                return "not registered since the kill"
            if me["fenced"]:
                return "fenced"
            if (me.get("replicas_opening") or 0) > 0:
                return f"{me['replicas_opening']} replicas opening"
            for topic in topics:
                for p in self.api_get(f"/v1/topics/{topic}/partitions")["partitions"]:
                    if node.node_id in p["replicas"] and node.node_id not in p["isr"]:
                        return f"not in the ISR of {topic}/{p['partition']} (ISR {p['isr']}, leader {p['leader']})"
        except ClusterError as exc:
            return f"no answer: {exc}"
        return None

    def api_get(self, path: str) -> Any:
        last: Exception | None = None
        for url in self.controller_urls:
            req = urllib.request.Request(url + path)
            req.add_header("Authorization", f"Bearer {self.admin_token}")
            try:
                with urllib.request.urlopen(req, timeout=2.0) as resp:
                    return json.loads(resp.read())
            except (OSError, ValueError, urllib.error.URLError) as exc:
                last = exc
        raise ClusterError(f"no controller answered {path}: {last}")

    def healthy(self) -> tuple[bool, str]:
        if self.controller_leader() is None:
            return False, "no controller leads"
        try:
            listed = {b["broker_id"]: b for b in self.api_get("/v1/brokers")["brokers"]}
        except ClusterError as exc:
            return False, str(exc)
        missing = [b.node_id for b in self.brokers() if b.node_id not in listed or listed[b.node_id]["fenced"]]
        if missing:
            return False, f"brokers not registered or fenced: {missing}"
        return True, "ok"

    def start_all(self) -> None:
        for node in self.controllers():
            node.start()
        for node in self.brokers():
            node.start()

    def wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        reason = "not checked"
        while time.monotonic() < deadline:
            dead = [n for n in self.nodes.values() if not n.alive()]
            if dead:
                tail = "\n".join(dead[0].log_path.read_text(errors="replace").splitlines()[-15:])
                raise ClusterError(f"{dead[0].kind} {dead[0].name} exited during start-up; the end of "
                                   f"{dead[0].log_path}:\n{tail}")
            ok, reason = self.healthy()
            if ok:
                return
            time.sleep(0.3)
        raise ClusterError(f"the cluster was not healthy within {timeout_s:.0f} s: {reason}")

    def ensure_running(self) -> list[str]:
        """Resume paused and restart dead processes; returns which were restarted."""
        restarted = []
        for node in self.nodes.values():
            node.resume()
            if not node.alive():
                node.start()
                restarted.append(node.name)
        return restarted

    def stop_all(self) -> None:
        for node in self.brokers():
            node.stop()
        for node in self.controllers():
            node.stop()

    def kill_all(self) -> None:
        for node in self.nodes.values():
            try:
                node.resume()
                node.kill9()
            except (OSError, subprocess.TimeoutExpired):
                pass

    def unmount_all(self) -> list[str]:
        problems = []
        for node in self.brokers():
            if node.mounted:
                done = run(["umount", str(node.data_dir)], check=False)
                if done.returncode != 0:
                    done = run(["umount", "-l", str(node.data_dir)], check=False)
                if done.returncode != 0:
                    problems.append(f"umount {node.data_dir}: {done.stderr.strip()}")
                else:
                    node.mounted = False
        return problems
