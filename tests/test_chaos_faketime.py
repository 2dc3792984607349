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
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.chaos.cluster import (SHM_DIR, Node, faketime_env, faketime_leftovers, faketime_library,
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


def _node_under_faketime(tmp_path: Path, name: str, code: str) -> Node:
    """A harness node whose process runs `code` under the brokers' libfaketime settings, started
    without a network namespace (Node.start's `ip netns exec` is what this leaves out)."""
    library = faketime_library()
    assert library is not None
    clock = tmp_path / f"{name}.faketime"
    clock.write_text("+0\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LD_PRELOAD", "FAKETIME"))}
    env.update(faketime_env(library, clock))
    node = Node(name=name, kind="broker", node_id=1, netns="none", address="127.0.0.1", data_dir=tmp_path,
                log_path=tmp_path / f"{name}.log", args=[sys.executable, "-c", code], env=env, clock_file=clock)
    node.proc = subprocess.Popen(node.args, env=env, stdin=subprocess.DEVNULL, start_new_session=True)
    return node


def _made_files(pid: int) -> list[Path]:
    deadline = time.monotonic() + 20
    while not faketime_leftovers(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return faketime_leftovers(pid)


@pytest.mark.skipif(faketime_library() is None or not SHM_DIR.is_dir(),
                    reason="needs libfaketime (scripts/system-deps.sh) and /dev/shm")
def test_a_node_killed_stopped_or_dead_by_itself_leaves_no_libfaketime_files(tmp_path: Path) -> None:
    """Claim: libfaketime leaves two files in /dev/shm behind every process it is preloaded into
    that does not exit cleanly; a harness node removes its process's once that process has
    exited, whether killed -9, stopped, or dead by itself (removed at its next stop or start)."""
    killed = _node_under_faketime(tmp_path, "b1", WAIT)
    stopped = _node_under_faketime(tmp_path, "b2", WAIT)
    exited = _node_under_faketime(tmp_path, "b3", f"{WAIT.split(';')[0]}; import os, signal; "
                                                  "threading.Event().wait(0.5); os.kill(os.getpid(), signal.SIGKILL)")
    try:
        pids = {name: node.pid for name, node in (("killed", killed), ("stopped", stopped), ("exited", exited))}
        assert all(_made_files(pid) for pid in pids.values()), "libfaketime made no files to clean"
        exited.proc.wait(timeout=20)
        assert faketime_leftovers(pids["exited"]), "the library's files outlive a process that died"
        killed.kill9()
        stopped.stop(wait_s=20)
        exited.stop()
        assert {name: faketime_leftovers(pid) for name, pid in pids.items()} == {
            "killed": [], "stopped": [], "exited": []}
    finally:
        for node in (killed, stopped, exited):
            if node.alive():
                node.proc.kill()
                node.proc.wait()
            remove_faketime_leftovers(node.pid)
