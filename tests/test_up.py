"""`scripts/up` as a newcomer meets it: a fresh `git clone` of this repository in a temporary
directory, `scripts/up --detach`, the README's Python example (example.py) run, `biplane down`,
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
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# This checkout's virtualenv, or the one running the tests (a worktree that shares a venv).
VENV = REPO / ".venv" if (REPO / ".venv" / "bin" / "python").exists() else Path(sys.prefix)

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
        assert (clone / "example.py").read_text() == readme_example()
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
        assert any("Kafka API" in line for line in lines)
        # Every broker serves the Kafka API on the port cluster.json names.
        for b in state["brokers"].values():
            with socket.create_connection(("127.0.0.1", b["kafka_port"]), timeout=5) as s:
                s.sendall(struct.pack(">ihhih", 10, 18, 0, 42, -1))  # ApiVersions v0, correlation id 42
                assert struct.unpack(">ii", s.recv(8))[1] == 42
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
        # The banner names every process's metrics port; the status line counts those answering.
        banner = next(line for line in lines if line.strip().startswith("metrics"))
        for node in [*state["brokers"].values(), *state["controllers"].values()]:
            assert str(node["metrics_port"]) in banner, banner
        assert status.line(kids).startswith("controllers 1/1 | brokers 2/2 | metrics 3/3 | 2 partitions")
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


# ------------------------------------------------------------------ supervision under `biplane up --detach`

PYTHON = str(VENV / "bin" / "python")


def biplane(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
    """Runs this worktree's `biplane` (PYTHONPATH is inherited, so the children run it too)."""
    return subprocess.run([PYTHON, "-m", "common.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout_s)


def start_identity(pid: int) -> int | None:
    from dataplane.cluster.state import proc_start_ticks
    return proc_start_ticks(pid)


def wait_for(what: str, check, timeout_s: float = 30.0, every_s: float = 0.1):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError(f"not within {timeout_s} s: {what}")


class DetachedCluster:
    """A cluster under `biplane up --detach`, remembering every process it ever recorded (so the
    last test can check that `biplane down` left none of them)."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.seen: dict[int, int | None] = {}   # pid -> start time

    def state(self) -> dict:
        state = json.loads((self.data_dir / "cluster.json").read_text())
        for pid in all_pids(state):
            if alive(pid):
                self.seen.setdefault(pid, start_identity(pid))
        return state

    def node(self, kind: str, node_id: str) -> dict:
        return self.state()[kind + "s"][node_id]

    def supervisor_log(self) -> str:
        return (self.data_dir / "logs" / "supervisor.log").read_text()

    def cli(self, *args: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
        return biplane(*args, "--data-dir", str(self.data_dir), timeout_s=timeout_s)

    def serving(self) -> bool:
        """A controller leads, every broker is registered, unfenced and answers METADATA."""
        from dataplane.cluster.up import brokers_ready, leader_url
        state = self.state()
        url = leader_url(state)
        return url is not None and brokers_ready(state, url)[0]

    def wait_restarted(self, kind: str, node_id: str, old_pid: int) -> int:
        def new_pid():
            node = self.node(kind, node_id)
            return node["pid"] if node["state"] == "running" and node["pid"] not in (None, old_pid) else None
        return wait_for(f"{kind} {node_id} restarted (old pid {old_pid})", new_pid)

    def gone(self, pid: int) -> bool:
        return start_identity(pid) != self.seen.get(pid) or not alive(pid)

    def kill_seen(self) -> None:
        """SIGKILL whatever this test saw that still runs as that same process."""
        for pid, start in self.seen.items():
            if alive(pid) and start_identity(pid) == start:
                os.kill(pid, signal.SIGKILL)


def start_small_cluster(tmp_path: Path) -> DetachedCluster:
    """`biplane up --detach` of 1 controller and 1 broker under tmp_path."""
    data_dir = tmp_path / "cluster"
    r = biplane("up", "--detach", "--data-dir", str(data_dir), "--controllers", "1", "--brokers", "1",
                timeout_s=150)
    assert r.returncode == 0, r.stdout + r.stderr
    return DetachedCluster(data_dir)


@pytest.fixture(scope="module")
def detached(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("supervised") / "cluster"
    r = biplane("up", "--detach", "--data-dir", str(data_dir), "--controllers", "3", "--brokers", "2",
                "--topic", "served:2:2", "--stop-wait-s", "8", timeout_s=150)
    assert r.returncode == 0, r.stdout + r.stderr
    cluster = DetachedCluster(data_dir)
    cluster.state()
    try:
        yield cluster
    finally:
        biplane("down", "--data-dir", str(data_dir), timeout_s=90)
        cluster.kill_seen()
        up_log = (data_dir / "logs" / "up.log").read_text()
        assert "Traceback" not in up_log, up_log


def produce_one(cluster: DetachedCluster, value: bytes) -> None:
    from dataplane.client.sync import Producer
    state = cluster.state()
    bootstrap = ",".join(b["address"] for b in state["brokers"].values())
    with Producer(bootstrap=bootstrap, delivery_timeout_ms=20_000, request_timeout_ms=5_000) as producer:
        for partition in (0, 1):
            producer.send_and_wait("served", value, partition=partition)


def test_kafka_clients_reach_the_brokers_kafka_ports_from_cluster_json(detached):
    """`biplane up` opens a Kafka API port per broker and records it in cluster.json: a
    Kafka client bootstrapped from there lists the brokers by those ports and the topic."""
    kafka_admin = pytest.importorskip("confluent_kafka.admin")
    state = detached.state()
    kafka = {int(b["broker_id"]): b["kafka_port"] for b in state["brokers"].values()}
    assert all(isinstance(p, int) for p in kafka.values())
    bootstrap = ",".join(b["kafka_address"] for b in state["brokers"].values())
    admin = kafka_admin.AdminClient({"bootstrap.servers": bootstrap})
    listing = admin.list_topics(timeout=20)
    assert {b.id: b.port for b in listing.brokers.values()} == kafka
    assert len(listing.topics["served"].partitions) == 2


def test_every_process_serves_metrics_at_its_cluster_json_port(detached):
    """Metrics are on in every process `biplane up` starts: each broker's and controller's
    /metrics answers at the port cluster.json records, as that very process (its id, its
    start time), and the controller leader reports Raft lag for both of its peers."""
    from metrics_scrape import scrape
    state = detached.state()
    for b in state["brokers"].values():
        scraped = scrape(b["metrics_port"])
        assert scraped.value("biplane_broker_id") == b["broker_id"]
        assert scraped.value("biplane_broker_partitions") >= 1
        assert abs(scraped.value("process_start_time_seconds") - process_start_s(b["pid"])) < 2
    leaders = []
    for c in state["controllers"].values():
        scraped = scrape(c["metrics_port"])
        assert scraped.value("biplane_controller_node_id") == c["node_id"]
        assert scraped.value("biplane_controller_raft_term") >= 1
        assert abs(scraped.value("process_start_time_seconds") - process_start_s(c["pid"])) < 2
        if scraped.value("biplane_controller_is_leader") == 1:
            leaders.append(scraped)
    assert len(leaders) == 1
    lag = leaders[0].samples("biplane_controller_raft_follower_lag_entries")
    assert len(lag) == 2 and all(s.value >= 0 for s in lag), lag


def process_start_s(pid: int) -> float:
    """A process's start as time.time() would say (from /proc, as the process collector reads it)."""
    ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                if line.startswith("btime "))
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def test_a_broker_killed_with_sigkill_is_restarted_and_logged(detached):
    """kill -9 of a broker: the supervisor starts it again (a new pid in cluster.json, on the same
    port), logs the exit and the restart with both pids, and the cluster serves again (every broker
    unfenced and answering, acks=all produce to both partitions)."""
    before = detached.node("broker", "1")
    old_pid, port = before["pid"], before["port"]
    os.kill(old_pid, signal.SIGKILL)
    new_pid = detached.wait_restarted("broker", "1", old_pid)
    after = detached.node("broker", "1")
    assert after["port"] == port and after["restarts"] >= 1
    assert after["pid_start"] == start_identity(new_pid)
    log = detached.supervisor_log()
    assert re.search(rf'event=child_exited child="broker 1" pid={old_pid} code=-9 .*restart_in_s=', log), log
    assert re.search(rf'event=child_restarted child="broker 1" pid={new_pid} ', log), log
    wait_for("the cluster serves after the restart", detached.serving, timeout_s=30, every_s=0.3)
    produce_one(detached, b"after-kill")


def test_stop_keeps_a_broker_down_until_start(detached):
    """`biplane stop broker 2`: its process is gone, cluster.json says stopped, and the supervisor
    does not start it again (checked well past the first backoff); `biplane start` brings it back."""
    old_pid = detached.node("broker", "2")["pid"]
    t0 = time.monotonic()
    r = detached.cli("stop", "broker", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "stopped broker 2" in r.stdout and time.monotonic() - t0 < 20
    assert not alive(old_pid)
    time.sleep(3.0)   # the first backoff is 0.5 s: a respawn would have happened by now
    node = detached.node("broker", "2")
    assert node["state"] == "stopped" and node["pid"] is None
    from dataplane.cluster.up import cluster_processes
    assert "broker 2" not in cluster_processes(detached.data_dir).values()
    assert 'event=child_restarted child="broker 2"' not in detached.supervisor_log()
    r = detached.cli("start", "broker", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    new_pid = detached.node("broker", "2")["pid"]
    assert new_pid not in (None, old_pid) and alive(new_pid) and f"pid {new_pid}" in r.stdout
    wait_for("the cluster serves after start", detached.serving, timeout_s=30, every_s=0.3)


def test_restart_of_a_controller_keeps_the_quorum(detached):
    """`biplane restart controller N` of the leading controller: a new pid, and the quorum still
    leads and serves (a topic can be created) with every controller answering."""
    from dataplane.cluster.up import api_get, leader_url
    state = detached.state()
    leader = wait_for("a controller leads", lambda: leader_url(state))
    node_id = next(i for i, c in state["controllers"].items() if c["api_url"] == leader)
    old_pid = state["controllers"][node_id]["pid"]
    r = detached.cli("restart", "controller", node_id)
    assert r.returncode == 0, r.stdout + r.stderr
    new_pid = detached.node("controller", node_id)["pid"]
    assert new_pid != old_pid and alive(new_pid) and not alive(old_pid)
    assert f"pid {old_pid} -> pid {new_pid}" in r.stdout

    def all_answer() -> bool:
        try:
            return all(api_get(c["api_url"] + "/v1/health", None, 1.0) for c in state["controllers"].values())
        except OSError:
            return False
    wait_for("every controller answers", all_answer, timeout_s=30, every_s=0.3)
    from dataplane.client.admin import SyncAdminClient
    with SyncAdminClient([c["api_url"] for c in state["controllers"].values()], state["admin_token"]) as admin:
        admin.create_topic("after-restart", partitions=1, replication_factor=2, exist_ok=True)
    wait_for("the cluster serves after the controller restart", detached.serving, timeout_s=30, every_s=0.3)


def test_commands_fail_clearly_without_a_traceback(detached, tmp_path):
    """Unknown id, unknown kind, no cluster file, a cluster whose supervisor is gone: exit 1 (2 for
    a usage error) with a message naming the value and what to do, never a traceback."""
    runs = []

    def cli(*args: str, data_dir: Path | None = None) -> subprocess.CompletedProcess:
        r = biplane(*args, "--data-dir", str(data_dir or detached.data_dir))
        runs.append(r)
        return r
    r = cli("stop", "broker", "9")
    assert r.returncode == 1 and "no broker '9'" in r.stderr and "its brokers are 1, 2" in r.stderr, r.stderr
    r = cli("restart", "zookeeper", "1")
    assert r.returncode == 2 and "invalid choice: 'zookeeper'" in r.stderr, r.stderr
    r = cli("stop", "broker", "1", data_dir=tmp_path / "nothing")
    assert r.returncode == 1 and "no cluster in" in r.stderr and "biplane up --detach" in r.stderr, r.stderr
    dead = tmp_path / "dead"
    dead.mkdir()
    state = detached.state()
    state["supervisor"] = dict(state["supervisor"], pid=2 ** 22 - 1)
    (dead / "cluster.json").write_text(json.dumps(state))
    r = cli("restart", "broker", "1", data_dir=dead)
    assert r.returncode == 1 and "no cluster runs from" in r.stderr and "biplane up --detach" in r.stderr, r.stderr
    r = cli("start", "broker", "1")
    assert r.returncode == 1 and "already runs" in r.stderr, r.stderr
    assert not [r.stderr for r in runs if "Traceback" in r.stderr]


@pytest.mark.parametrize("flags, says", [
    (["--backoff-initial-s", "-1"], "--backoff-initial-s -1 must be more than 0 seconds"),
    (["--timeout-s", "-1"], "--timeout-s -1 must be more than 0 seconds"),
    (["--status-interval-s", "0"], "--status-interval-s 0 must be more than 0 seconds"),
    (["--brokers", "0"], "--brokers 0 must be 1 or more"),
    (["--topic", "bad name"], "has illegal characters"),
    (["--topic", "x:3:9", "--brokers", "3"], "replication factor 9 is more than the 3 broker(s)"),
    (["--topic", "__consumer_offsets"], "'__consumer_offsets' is internal"),
    (["--data-dir", "/dev/null/x"], "cannot use --data-dir /dev/null/x: Not a directory"),
])
def test_up_refuses_bad_flags_before_starting_anything(tmp_path, flags, says):
    """Each used to start processes first, or end in a traceback (a negative backoff, a data
    directory under a file); now one line naming the flag and its value, and nothing runs."""
    data_dir = tmp_path / "c"
    r = biplane("up", "--detach", "--data-dir", str(data_dir), *flags, timeout_s=60)
    assert r.returncode == 1 and says in r.stderr, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr
    assert not (data_dir / "cluster.json").exists()


def test_a_port_whose_connections_linger_in_time_wait_is_free_to_reuse():
    """After `biplane down` a controller's port holds connections in TIME_WAIT (the server
    closed them first); the controller binds with SO_REUSEADDR, so the port is free to it. The
    check that picks a resumed cluster's ports bound without it, took the port as taken, and
    moved the controller's URL."""
    from dataplane.cluster.up import port_free
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as the servers listen
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = listener.accept()
    accepted.close()          # the server side closes first: its end goes to TIME_WAIT
    time.sleep(0.05)
    client.close()
    listener.close()
    time.sleep(0.05)
    assert port_free(port)


def test_down_after_a_respawn_leaves_no_process(detached):
    """kill -9 of a broker, its respawn, then `biplane down`: it says stopped only when every pid
    the cluster file ever recorded (old and new, supervisor included) is gone, and cluster.json
    then records no pid."""
    old_pid = detached.node("broker", "2")["pid"]
    os.kill(old_pid, signal.SIGKILL)
    detached.wait_restarted("broker", "2", old_pid)
    assert detached.state()["supervisor"]["pid"] in detached.seen
    r = detached.cli("down", timeout_s=90)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "stopped the cluster" in r.stdout
    left = [pid for pid in detached.seen if not detached.gone(pid)]
    assert not left, f"still running after biplane down: {left}"
    final = json.loads((detached.data_dir / "cluster.json").read_text())
    assert final["supervisor"] is None and all_pids(final) == []


def test_leftovers_of_a_killed_supervisor_are_stopped_one_at_a_time_brokers_first(tmp_path):
    """`biplane up` after a kill -9 of the supervisor stopped the six children it left all at
    once: every broker shut down together, none could take the others' leaderships, and every
    partition stopped acknowledging for 9 s, with nothing said. Now it says so and stops each
    after the one before has exited, brokers first. Stand-ins record when SIGTERM came and
    take 0.3 s to exit."""
    from dataplane.cluster.up import leftovers_note, stop_recorded
    from dataplane.cluster.state import proc_start_ticks
    stand_in = ("import signal, sys, time\n"
                "def stop(*_):\n"
                "    open(sys.argv[1], 'a').write(f'{sys.argv[2]} term {time.monotonic()}\\n')\n"
                "    time.sleep(0.3)\n"
                "    open(sys.argv[1], 'a').write(f'{sys.argv[2]} exit {time.monotonic()}\\n')\n"
                "    sys.exit(0)\n"
                "signal.signal(signal.SIGTERM, stop)\n"
                "print('ready', flush=True)\n"
                "while True: time.sleep(1)\n")
    record = tmp_path / "record"
    procs = {name: subprocess.Popen([PYTHON, "-c", stand_in, str(record), name], stdout=subprocess.PIPE)
             for name in ("controller-1", "broker-1", "broker-2")}
    try:
        for proc in procs.values():
            assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        node = {name: {"pid": proc.pid, "pid_start": proc_start_ticks(proc.pid)} for name, proc in procs.items()}
        state = {"controllers": {"1": node["controller-1"]}, "brokers": {"1": node["broker-1"], "2": node["broker-2"]}}
        note = leftovers_note(state, tmp_path)
        assert note and "broker 1, broker 2, controller 1 still run" in note and "one at a time" in note, note
        from dataplane.cluster.up import _stop_leftovers; _stop_leftovers(state, tmp_path)
        events = [line.split() for line in record.read_text().splitlines()]
        order = [(name, what) for name, what, _ in events]
        assert [name for name, what in order if what == "term"][-1] == "controller-1", order
        for (name, what, _), (next_name, next_what, _) in zip(events, events[1:]):
            if what == "term":
                assert (next_name, next_what) == (name, "exit"), f"{next_name} was asked before {name} exited: {order}"
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def test_down_stops_the_children_of_a_killed_supervisor(tmp_path):
    """`biplane up --detach`, then kill -9 of the supervisor itself: its children run on,
    orphaned. `biplane down` stops each one the cluster file records and says stopped only
    once every one is gone."""
    cluster = start_small_cluster(tmp_path)
    state = cluster.state()
    children = [n["pid"] for kind in ("controllers", "brokers") for n in state[kind].values()]
    try:
        os.kill(state["supervisor"]["pid"], signal.SIGKILL)
        wait_for("the supervisor is gone", lambda: not alive(state["supervisor"]["pid"]), timeout_s=10)
        assert all(alive(pid) for pid in children), (children, cluster.supervisor_log())
        r = cluster.cli("down", timeout_s=90)
        assert r.returncode == 0 and "stopped the cluster" in r.stdout, r.stdout + r.stderr
        left = [pid for pid in cluster.seen if not cluster.gone(pid)]
        assert not left, f"still running after biplane down: {left}; {r.stdout}"
        r = cluster.cli("down", timeout_s=90)   # again: nothing runs, and it says so
        assert r.returncode == 0 and "no cluster was running" in r.stdout, r.stdout + r.stderr
    finally:
        cluster.kill_seen()


def test_down_without_a_cluster_file_stops_what_still_runs_on_the_data_dir(tmp_path):
    """The cluster file deleted under a running `biplane up --detach` (a reset with rm of the
    wrong file): `biplane down` finds the supervisor and its children by command line, stops the
    supervisor first (so nothing restarts), then the children, names them, and leaves no
    process and no error in their logs. It said "no cluster" and left all of them running."""
    cluster = start_small_cluster(tmp_path)
    data_dir = cluster.data_dir
    state = cluster.state()
    supervisor = state["supervisor"]["pid"]
    cluster.seen.setdefault(supervisor, start_identity(supervisor))
    try:
        (data_dir / "cluster.json").unlink()
        r = cluster.cli("down", timeout_s=90)
        assert r.returncode == 0 and "stopped the cluster" in r.stdout, r.stdout + r.stderr
        assert "no cluster.json" in r.stderr and f"biplane up (pid {supervisor})" in r.stderr, r.stderr
        assert "controller 1 (pid" in r.stderr and "broker 1 (pid" in r.stderr, r.stderr
        left = [pid for pid in cluster.seen if not cluster.gone(pid)]
        assert not left, f"still running after biplane down: {left}; {r.stderr}"
        assert "child_restarted" not in cluster.supervisor_log()
        for log in (data_dir / "logs").glob("*.log"):
            text = log.read_text()
            assert " ERROR " not in text and "Traceback" not in text, (log.name, text[-3000:])
        (data_dir / "cluster.json").unlink(missing_ok=True)   # the stopping supervisor wrote it again
        r = cluster.cli("down", timeout_s=90)   # again: nothing runs on it, and it says so
        assert r.returncode == 1 and "no biplane process runs on it" in r.stderr, r.stderr
    finally:
        cluster.kill_seen()
