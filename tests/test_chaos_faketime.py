"""The harness's libfaketime settings leave CPython's GIL handoffs alone.

Brokers in the fault harness run under libfaketime (tests/chaos/cluster.py `faketime_env`).
Debian's 0.9.10, by default, rewrites the deadline of a pthread_cond_timedwait on a
CLOCK_MONOTONIC condition variable as if it were faked wall-clock time; CPython's GIL waits on
one, so a thread waiting for the GIL spun on the CPU instead of sleeping, and a broker with its
heartbeat thread beside its event loop did a fraction of its work.
"""
from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.chaos import main as chaos_main
from tests.chaos.cluster import (SHM_DIR, Node, faketime_env, faketime_leftovers, faketime_library, process_exited,
                                 remove_faketime_leftovers)

# Thread B wants the GIL for the whole time the main thread holds it in one long C call (sum
# over a range evaluates no bytecode, so it never hands the GIL over). Meanwhile B can only wait
# for the GIL: asleep, it uses no CPU; spinning, it uses as much as it is given. B is parked on
# events before and after, so its CPU counter is read while it is asleep: reading /proc releases
# the GIL, and a B still running then would charge its own work to the wait (under load, enough
# to look like a spin).
PROBE = r"""
import json, threading, time
tid, stop, go, parked = [], False, threading.Event(), threading.Event()
def b():
    tid.append(threading.get_native_id())
    go.wait()
    x = 0
    while not stop:
        x += 1
    parked.wait()
t = threading.Thread(target=b); t.start()
nap = threading.Event().wait    # not time.sleep: see faketime_env
while not tid:
    nap(0.001)
nap(0.05)
def cpu_s(tid):
    with open(f"/proc/self/task/{tid}/schedstat") as f:
        return int(f.read().split()[0]) / 1e9
b0 = cpu_s(tid[0])
w0 = time.monotonic()
go.set()
sum(range(40_000_000))
held_s = time.monotonic() - w0
stop = True
nap(0.05)
waited_cpu_s = cpu_s(tid[0]) - b0
parked.set(); t.join()
print(json.dumps({"held_s": held_s, "waiter_cpu_s": waited_cpu_s}))
"""


def _probe(env: dict[str, str]) -> dict[str, float]:
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(faketime_library() is None or not Path("/proc/self/task").exists(),
                    reason="needs libfaketime (scripts/system-deps.sh) and /proc")
def test_a_thread_waiting_for_the_gil_sleeps_under_the_harness_faketime_settings(tmp_path: Path) -> None:
    """Claim: under the broker's libfaketime settings a thread waiting for the GIL uses almost no
    CPU while another thread holds it; with libfaketime's default monotonic "fix" (the setting
    removed) it spins."""
    library = faketime_library()
    assert library is not None
    clock = tmp_path / "clock"
    clock.write_text("+0\n")
    base = {k: v for k, v in os.environ.items() if not k.startswith(("LD_PRELOAD", "FAKETIME"))}
    ours = _probe({**base, **faketime_env(library, clock)})
    assert ours["waiter_cpu_s"] < 0.25 * ours["held_s"], ours
    default = {k: v for k, v in faketime_env(library, clock).items() if k != "FAKETIME_FORCE_MONOTONIC_FIX"}
    spun = _probe({**base, **default})
    # Only a finding about the library as installed: a fixed libfaketime would not spin.
    if spun["waiter_cpu_s"] < 0.25 * spun["held_s"]:
        pytest.skip(f"this libfaketime does not spin on GIL waits even by default ({spun}); nothing to guard")



WAIT = "import threading; threading.Event().wait(60)"   # not time.sleep: see faketime_env
KILL_SELF = "import os, signal, threading; threading.Event().wait(0.5); os.kill(os.getpid(), signal.SIGKILL)"


def _faketime_process_env(tmp_path: Path) -> dict[str, str]:
    library = faketime_library()
    assert library is not None
    clock = tmp_path / "clock.faketime"
    clock.write_text("+0\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LD_PRELOAD", "FAKETIME"))}
    return env | faketime_env(library, clock)


def _node(tmp_path: Path, name: str, argv: list[str]) -> Node:
    """A harness node whose process runs `argv` under the brokers' libfaketime settings, started
    without a network namespace (what Node.start adds is `ip netns exec`, which execs `argv`)."""
    env = _faketime_process_env(tmp_path)
    node = Node(name=name, kind="broker", node_id=1, netns="none", address="127.0.0.1", data_dir=tmp_path,
                log_path=tmp_path / f"{name}.log", args=argv, env=env, clock_file=tmp_path / "clock.faketime")
    node.proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, start_new_session=True)
    return node


def _made_files(pid: int) -> list[Path]:
    deadline = time.monotonic() + 10
    while not faketime_leftovers(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return faketime_leftovers(pid)


needs_faketime = pytest.mark.skipif(faketime_library() is None or not SHM_DIR.is_dir(),
                                    reason="needs libfaketime (scripts/system-deps.sh) and /dev/shm")


@needs_faketime
def test_a_node_killed_stopped_or_dead_by_itself_leaves_no_libfaketime_files(tmp_path: Path) -> None:
    """Claim: libfaketime leaves two files in /dev/shm behind a process that was killed, and
    behind one started the way brokers are (execed by a preloaded parent) even when it exits
    cleanly; a harness node removes its process's once that process has exited: killed -9,
    stopped, or dead by itself (removed at its next stop or start)."""
    nodes: dict[str, Node] = {}
    try:
        nodes["killed"] = _node(tmp_path, "b1", [sys.executable, "-c", WAIT])
        nodes["stopped"] = _node(tmp_path, "b2", [sys.executable, "-c", WAIT])
        nodes["killed itself"] = _node(tmp_path, "b3", [sys.executable, "-c", KILL_SELF])
        nodes["exited cleanly"] = _node(tmp_path, "b4", ["sh", "-c", f'exec "{sys.executable}" -c pass'])
        pids = {what: node.pid for what, node in nodes.items()}
        if not all(pid is not None and _made_files(pid) for pid in pids.values()):
            pytest.skip("this libfaketime makes no files in /dev/shm; nothing to clean")
        for what in ("killed itself", "exited cleanly"):
            proc = nodes[what].proc
            assert proc is not None
            proc.wait(timeout=20)
            assert faketime_leftovers(proc.pid), f"the library's files outlive a process that {what}"
        nodes["killed"].kill9()
        nodes["stopped"].stop(wait_s=20)
        nodes["killed itself"].stop()
        nodes["exited cleanly"].stop()
        assert {what: faketime_leftovers(pid) for what, pid in pids.items() if pid is not None} == {
            what: [] for what in pids}
    finally:
        for node in nodes.values():
            if node.proc is not None:
                if node.proc.poll() is None:
                    node.proc.kill()
                    node.proc.wait()
                remove_faketime_leftovers(node.proc.pid)


@needs_faketime
def test_cleanup_kills_a_dead_runs_broker_and_removes_its_libfaketime_files(tmp_path: Path, monkeypatch) -> None:
    """Claim: `scripts/chaos --cleanup` kills a process a killed run left (by its manifest), waits
    until it has exited (its parent gone, it is nobody's child to reap: here it stays a zombie),
    and removes the files libfaketime left of it."""
    monkeypatch.setattr(chaos_main, "RESULTS_ROOT", tmp_path)
    # Started in the background by a shell that exits: an orphan, as a dead run's brokers are.
    # The shell itself runs without libfaketime: the library names its files after the first
    # process it was preloaded into, and `env` execs the broker's stand-in under that same pid.
    settings = {k: v for k, v in _faketime_process_env(tmp_path).items() if k.startswith(("LD_PRELOAD", "FAKETIME"))}
    command = shlex.join(["env", *(f"{k}={v}" for k, v in settings.items()), sys.executable, "-c", WAIT, "common.cli"])
    plain = {k: v for k, v in os.environ.items() if not k.startswith(("LD_PRELOAD", "FAKETIME"))}
    started = subprocess.run(["sh", "-c", f"{command} >/dev/null 2>&1 & echo $!"], env=plain,
                             capture_output=True, text=True, timeout=20)
    pid = int(started.stdout.strip())
    try:
        if not _made_files(pid):
            pytest.skip("this libfaketime makes no files in /dev/shm; nothing to clean")
        run = tmp_path / "seed-1-dead"
        run.mkdir()
        (run / "manifest.json").write_text(json.dumps({"pids": {"b1": pid}, "mounts": [], "namespaces": []}))
        actions = chaos_main.cleanup_leftovers()
        assert f"killed b1 (pid {pid})" in actions
        assert f"removed libfaketime's files of b1 (pid {pid})" in actions
        assert faketime_leftovers(pid) == []
    finally:
        if not process_exited(pid):
            os.kill(pid, signal.SIGKILL)
        remove_faketime_leftovers(pid)
