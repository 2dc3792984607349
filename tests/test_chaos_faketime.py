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
from pathlib import Path

import pytest

from tests.chaos.cluster import faketime_env, faketime_library

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
