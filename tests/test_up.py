"""`scripts/up` as a newcomer meets it: a fresh `git clone` of this repository in a temporary
directory, `scripts/up --detach`, the README's Python example run verbatim, `biplane down`,
and then no process of the cluster is left. A second `scripts/up` on the same directory must
resume the same cluster (same token and secret, the topic and its record still there).

To keep the run short the clone reuses this checkout's virtualenv through BIPLANE_VENV (a
documented option of scripts/up; PYTHONPATH points at the clone so the clone's code runs);
creating a fresh .venv would add a minute-long pip install and needs the network.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
VENV = REPO / ".venv"

pytestmark = pytest.mark.slow


def readme_example() -> str:
    text = (REPO / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks, "README.md has no ```python block"
    return blocks[0]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def all_pids(state: dict) -> list[int]:
    pids = [n["pid"] for kind in ("controllers", "brokers") for n in state[kind].values() if n.get("pid")]
    if state.get("supervisor"):
        pids.append(state["supervisor"]["pid"])
    return pids


def test_scripts_up_from_a_clean_clone(tmp_path):
    clone = tmp_path / "biplane"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True, timeout=60)
    env = dict(os.environ, BIPLANE_VENV=str(VENV), PYTHONPATH=str(clone))
    env.pop("BIPLANE_CLUSTER", None)
    python = str(VENV / "bin" / "python")
    started: list[int] = []

    def up() -> dict:
        r = subprocess.run([str(clone / "scripts" / "up"), "--detach"], cwd=clone, env=env, capture_output=True,
                           text=True, timeout=150)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "admin token" in r.stdout and "biplane down" in r.stdout
        state = json.loads((clone / ".biplane" / "cluster.json").read_text())
        started.extend(all_pids(state))
        assert len(state["controllers"]) == 3 and len(state["brokers"]) == 3
        assert all(alive(p) for p in all_pids(state))
        return state

    def down() -> None:
        r = subprocess.run([python, "-m", "common.cli", "down"], cwd=clone, env=env, capture_output=True, text=True,
                           timeout=90)
        assert r.returncode == 0, r.stdout + r.stderr

    try:
        which = subprocess.run([python, "-c", "import dataplane; print(dataplane.__file__)"], cwd=clone, env=env,
                               capture_output=True, text=True, timeout=30).stdout
        assert which.startswith(str(clone)), which
        first = up()
        (clone / "example.py").write_text(readme_example())
        r = subprocess.run([python, "example.py"], cwd=clone, env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "RecordMetadata(topic='events'" in r.stdout and "b'hello'" in r.stdout, r.stdout + r.stderr
        down()
        for pid in all_pids(first):
            deadline = time.monotonic() + 10
            while alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not alive(pid), f"pid {pid} still runs after biplane down"

        second = up()   # resumes: same identity, same data
        assert second["admin_token"] == first["admin_token"]
        assert second["cluster_secret"] == first["cluster_secret"]
        r = subprocess.run([python, "-m", "common.cli", "consume", "events", "--from-beginning", "--max-records", "1",
                            "--format", "json"], cwd=clone, env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout.splitlines()[0])["value"] == "hello"
        down()
        for pid in all_pids(second):
            deadline = time.monotonic() + 10
            while alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not alive(pid), f"pid {pid} still runs after biplane down"
    finally:
        for pid in started:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_foreground_up_stops_every_child_on_ctrl_c(tmp_path):
    """`biplane up` in the foreground: healthy, cluster.json written, the asked-for topic created,
    and SIGINT (Ctrl-C) stops every child it started before it exits 0."""
    data_dir = tmp_path / "cluster"
    proc = subprocess.Popen([str(VENV / "bin" / "python"), "-m", "common.cli", "up", "--data-dir", str(data_dir),
                             "--controllers", "1", "--brokers", "2", "--topic", "made:2"], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    pids: list[int] = []
    try:
        lines = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "Press Ctrl-C" in line:
                break
        assert any("Press Ctrl-C" in line for line in lines), "".join(lines)
        assert any("admin token" in line for line in lines)
        state = json.loads((data_dir / "cluster.json").read_text())
        assert state["status"] == "running" and state["supervisor"]["pid"] == proc.pid
        pids = all_pids(state)
        assert len(pids) == 4 and all(alive(p) for p in pids)
        from dataplane.cluster.up import Status

        class Running:
            def __init__(self, name: str) -> None:
                self.name = name

            def exit_code(self) -> None:
                return None
        status = Status(state)
        kids = [Running("controller 1"), Running("broker 1"), Running("broker 2")]
        assert status.line(kids).startswith("controllers 1/1 | brokers 2/2 | 2 partitions")
        # Nothing is produced, so the rate settles at 0 once each new leader's epoch-start
        # batch has committed (one of those between two readings shows as a small rate).
        readings = []
        for _ in range(30):
            readings.append(status.line(kids))
            if readings[-1].endswith(" 0 records/s committed"):
                break
            time.sleep(0.1)
        assert readings[-1].endswith(" 0 records/s committed"), readings
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, out
        assert "stopped." in out
        for pid in pids:
            assert not alive(pid), f"pid {pid} still runs after Ctrl-C"
        final = json.loads((data_dir / "cluster.json").read_text())
        assert final["status"] == "stopped" and final["supervisor"] is None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
