"""The `biplane` CLI as a user meets it, in subprocesses: Ctrl-C and SIGTERM end a command
cleanly, a closed stdout ends it quietly, an unreachable controller or broker is named within
the timeout with what to do, `--data-dir` and BIPLANE_CLUSTER find a cluster outside
./.biplane (the banner's "Try it" line works as printed), `consume --max-records` stops at the
end, and example.py runs as the README shows it.

One `biplane up --detach` cluster (1 controller, 3 brokers, in a temporary directory, so never
./.biplane) serves the whole module; the unreachable cases need none."""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import threading
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable

pytestmark = pytest.mark.slow


def env_without_cluster(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("BIPLANE_CLUSTER", "BIPLANE_BOOTSTRAP", "BIPLANE_CONTROLLER", "BIPLANE_ADMIN_TOKEN")}
    env["PYTHONPATH"] = str(REPO)
    env.update(extra)
    return env


def biplane(*args: str, cwd: Path, stdin: str | None = None, timeout_s: float = 60,
            **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "common.cli", *args], cwd=cwd, input=stdin, capture_output=True,
                          text=True, timeout=timeout_s, env=env_without_cluster(**env))


def assert_clean(stderr: str) -> None:
    assert "Traceback" not in stderr and "Fatal Python error" not in stderr, stderr


class UpCluster:
    def __init__(self, data_dir: Path, banner: str, elsewhere: Path) -> None:
        self.data_dir = data_dir
        self.banner = banner
        self.elsewhere = elsewhere   # a directory without .biplane, to run commands from

    def cli(self, *args: str, stdin: str | None = None, timeout_s: float = 60) -> subprocess.CompletedProcess:
        return biplane(*args, "--data-dir", str(self.data_dir), cwd=self.elsewhere, stdin=stdin, timeout_s=timeout_s)

    def end_offset(self, topic: str, partition: int) -> int:
        from dataplane.client.records import TopicPartition
        from dataplane.client.sync import Consumer
        tp = TopicPartition(topic, partition)
        with Consumer(bootstrap=self.bootstrap()) as consumer:
            return consumer.end_offsets([tp])[tp]

    def bootstrap(self) -> str:
        state = json.loads((self.data_dir / "cluster.json").read_text())
        return ",".join(b["address"] for b in state["brokers"].values())


@pytest.fixture(scope="module")
def up(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    data_dir, elsewhere = root / "cluster", root / "elsewhere"
    elsewhere.mkdir()
    r = biplane("up", "--detach", "--data-dir", str(data_dir), "--controllers", "1", "--brokers", "3",
                cwd=REPO, timeout_s=150)
    assert r.returncode == 0, r.stdout + r.stderr
    try:
        yield UpCluster(data_dir, r.stdout, elsewhere)
    finally:
        down = biplane("down", "--data-dir", str(data_dir), cwd=REPO, timeout_s=90)
        assert down.returncode == 0, down.stdout + down.stderr


def create_topic(up: UpCluster, name: str, partitions: int = 1) -> None:
    r = up.cli("topic", "create", name, "--partitions", str(partitions), "--replication-factor", "3")
    assert r.returncode == 0, r.stderr


# ---------------------------------------------------------------- discovery

def test_the_banners_try_it_line_works_as_printed(up):
    """`biplane up --data-dir DIR` prints "Try it" commands carrying `--data-dir DIR`; run as
    printed from the checkout (which has no such cluster in ./.biplane) they create, produce and
    read back a record."""
    line = next(l for l in up.banner.splitlines() if "topic create events" in l).strip()
    assert line.count("--data-dir") == 3, line
    r = subprocess.run(line, shell=True, cwd=REPO, capture_output=True, text=True, timeout=90,
                       env=env_without_cluster())
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines()[-1] == "hello", r.stdout + r.stderr
    assert "stop it with" in up.banner and f"down --data-dir {up.data_dir}" in up.banner
    # Again, with the topic there (a resumed cluster, or `--topic events`).
    r = subprocess.run(line, shell=True, cwd=REPO, capture_output=True, text=True, timeout=90,
                       env=env_without_cluster())
    assert r.returncode == 0 and "exists already" in r.stdout, r.stdout + r.stderr


def test_broker_help_shows_both_forms_first():
    """`biplane broker --help` opens with both uses: running a broker, and the operator actions on
    a running one (they were named only in the last lines, after every server flag)."""
    r = subprocess.run([sys.executable, "-m", "common.cli", "broker", "--help"], capture_output=True, text=True,
                       timeout=60)
    head = "\n".join(r.stdout.splitlines()[:3])
    assert r.returncode == 0 and "--broker-id N" in head and "maintenance|decommission|recommission|operations" in head


def test_banner_names_the_data_dir_only_where_the_cli_would_not_find_it(tmp_path, monkeypatch):
    from dataplane.cluster.up import banner
    state = {"controllers": {"1": {"api_url": "http://127.0.0.1:1", "metrics_port": 4}},
             "brokers": {"1": {"address": "127.0.0.1:2", "kafka_address": "127.0.0.1:3", "metrics_port": 5}},
             "admin_token": "t"}
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("BIPLANE_CLUSTER", raising=False)
    assert "--data-dir" not in banner(state, tmp_path / ".biplane")
    assert f"produce events --data-dir {tmp_path.resolve() / 'other'}" in banner(state, tmp_path / "other")
    # The found-on-its-own wording only where it is true, and the whole path where a command needs it.
    assert "use it when no address is given" in banner(state, tmp_path / ".biplane")
    other = banner(state, tmp_path / "other")
    assert "use it when no address is given" not in other and f"data in {tmp_path.resolve() / 'other'}" in other
    assert f"finds it only when given --data-dir {tmp_path.resolve() / 'other'}" in other
    monkeypatch.setenv("BIPLANE_CLUSTER", str(tmp_path / "other"))
    assert "--data-dir" not in banner(state, tmp_path / "other")
    assert f"--data-dir {tmp_path.resolve() / '.biplane'}" in banner(state, tmp_path / ".biplane")


def test_admin_and_data_commands_follow_data_dir_and_biplane_cluster(up):
    """The same cluster through --data-dir and through BIPLANE_CLUSTER (its directory or its
    cluster.json), from a directory without ./.biplane; with neither, the error names where it
    looked and what to do."""
    create_topic(up, "found")
    r = up.cli("produce", "found", stdin="x\n")
    assert r.returncode == 0 and "sent 1 record(s)" in r.stderr, r.stderr
    for where in (str(up.data_dir), str(up.data_dir / "cluster.json")):
        r = biplane("topic", "list", cwd=up.elsewhere, BIPLANE_CLUSTER=where)
        assert r.returncode == 0 and "found" in r.stdout, r.stderr
        r = biplane("consume", "found", "--from-beginning", "--max-records", "1", cwd=up.elsewhere,
                    BIPLANE_CLUSTER=where)
        assert r.returncode == 0 and r.stdout == "x\n", r.stderr
    r = biplane("topic", "list", cwd=up.elsewhere)
    assert r.returncode == 1 and ".biplane/cluster.json" in r.stderr and "--data-dir" in r.stderr, r.stderr
    r = biplane("consume", "found", cwd=up.elsewhere, BIPLANE_CLUSTER=str(up.elsewhere / "nothing"))
    assert r.returncode == 1 and "BIPLANE_CLUSTER=" in r.stderr and "biplane up --data-dir" in r.stderr, r.stderr
    assert_clean(r.stderr)


# ---------------------------------------------------------------- consume

def test_consume_max_records_stops_at_the_end_and_says_where_it_starts(up):
    """--max-records N with fewer records: it stops once at the end and idle for
    --idle-timeout-ms, saying how many it read; a start at or past the end is said on stderr;
    offset 0 of a new partition is the leader's control record, so the first record is at 1."""
    create_topic(up, "few")
    r = up.cli("produce", "few", stdin="a\nb\nc\n")
    assert r.returncode == 0, r.stderr
    t0 = time.monotonic()
    r = up.cli("consume", "few", "--from-beginning", "--max-records", "10", "--idle-timeout-ms", "500",
               "--format", "json")
    assert r.returncode == 0, r.stderr
    docs = [json.loads(line) for line in r.stdout.splitlines()]
    assert [(d["offset"], d["value"]) for d in docs] == [(1, "a"), (2, "b"), (3, "c")]
    assert "read 3 of --max-records 10" in r.stderr and time.monotonic() - t0 < 15, r.stderr
    r = up.cli("consume", "few", "--offset", "4", "--max-records", "1", "--idle-timeout-ms", "0")
    assert r.returncode == 0 and r.stdout == "", r.stderr
    assert "partition few/0 has no records from offset 4 (end offset 4)" in r.stderr, r.stderr
    r = up.cli("consume", "few", "--offset", "9", "--idle-timeout-ms", "0")
    assert r.returncode == 0 and "offset 9 is past its end offset 4" in r.stderr, r.stderr
    help_text = up.cli("consume", "--help").stdout
    assert "control record" in help_text and "--idle-timeout-ms" in help_text


# ---------------------------------------------------------------- signals and pipes

def _signals_as_in_a_terminal() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


def test_ctrl_c_and_sigterm_end_produce_and_consume_cleanly(up, silent_port):
    """SIGINT or SIGTERM to a produce reading an open stdin, to a following consume, or to an
    admin command waiting on a controller: exit 130 or 143, no traceback and no 'Fatal Python
    error'; the produce first delivers what it read."""
    create_topic(up, "signals")
    runs = []
    for command, signum in (("produce", signal.SIGINT), ("produce", signal.SIGTERM),
                            ("consume", signal.SIGINT), ("consume", signal.SIGTERM),
                            ("topic", signal.SIGINT), ("topic", signal.SIGTERM)):
        args = ["list", "--controller", f"127.0.0.1:{silent_port}"] if command == "topic" else \
            ["signals", "--data-dir", str(up.data_dir)]
        # SIGINT and SIGQUIT at their defaults, as in a terminal: a suite started as a background
        # job of a script inherits them ignored, and so would every command it starts.
        proc = subprocess.Popen([PYTHON, "-m", "common.cli", command, *args],
                                cwd=up.elsewhere, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env_without_cluster(), preexec_fn=_signals_as_in_a_terminal)
        if command == "produce":
            assert proc.stdin is not None
            proc.stdin.write(b"one\ntwo\n")
            proc.stdin.flush()   # and left open: an interactive user who has not pressed Ctrl-D
        runs.append((command, signum, proc))
    deadline = time.monotonic() + 30
    while up.end_offset("signals", 0) < 1 + 4 and time.monotonic() < deadline:
        time.sleep(0.2)   # both producers' records are in: they are running and waiting on stdin
    time.sleep(1.0)       # the consumers are past their start-up too
    for _, signum, proc in runs:
        proc.send_signal(signum)
    for command, signum, proc in runs:
        # Ended before communicate closes its stdin: that EOF would end a produce that had not
        # yet seen its signal as a plain success.
        proc.wait(timeout=30)
        _, err = proc.communicate(timeout=30)
        text = err.decode()
        assert proc.returncode == 128 + signum, (command, signum, proc.returncode, text)
        assert_clean(text)
        if command == "produce":
            assert "sent 2 record(s) to signals (interrupted)" in text, text


def test_an_interrupted_produce_counts_as_sent_what_the_cluster_acknowledged(up):
    """SIGTERM to a produce with thousands of records in flight: it reported records the
    cluster committed as failed (the wait on them cancelled their futures). What it says it
    sent is now what the partition holds, and nothing is counted failed."""
    create_topic(up, "interrupted")
    proc = subprocess.Popen([PYTHON, "-m", "common.cli", "produce", "interrupted", "--data-dir", str(up.data_dir)],
                            cwd=up.elsewhere, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env_without_cluster(), preexec_fn=_signals_as_in_a_terminal)
    assert proc.stdin is not None
    feed = threading.Thread(target=_feed_lines, args=(proc.stdin,), daemon=True)
    feed.start()
    deadline = time.monotonic() + 30
    while up.end_offset("interrupted", 0) < 20_000 and time.monotonic() < deadline:
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    _, err = proc.communicate(timeout=30)
    text = err.decode()
    assert proc.returncode == 128 + signal.SIGTERM, (proc.returncode, text)
    assert_clean(text)
    match = re.search(r"sent (\d+) record\(s\) to interrupted(.*)\(interrupted\)", text)
    assert match, text
    assert "failed" not in match.group(2), text
    assert int(match.group(1)) == up.end_offset("interrupted", 0) - 1, (text, up.end_offset("interrupted", 0))


def _feed_lines(stdin) -> None:
    try:
        for i in range(0, 2_000_000, 1000):
            stdin.write(b"".join(b"%d\n" % n for n in range(i, i + 1000)))
        stdin.close()
    except (BrokenPipeError, OSError):
        pass   # the produce was stopped: the test is over


def test_a_closed_stdout_ends_a_command_quietly(up):
    """`consume | head -1` following a topic, whose next write after head is gone fails, and
    `topic list` into a reader that is gone: exit 141 (a shell's code for SIGPIPE), nothing on
    stderr. `topic list | head -1` (which may or may not outlive head) prints no error either."""
    create_topic(up, "piped")
    r = up.cli("produce", "piped", stdin="first\nsecond\n")
    assert r.returncode == 0, r.stderr
    base = [PYTHON, "-m", "common.cli"]
    consume = " ".join(base + ["consume", "piped", "--from-beginning", "--data-dir", str(up.data_dir)])
    pipeline = subprocess.Popen(f"{consume} | head -1; echo \"rc=${{PIPESTATUS[0]}}\"", shell=True,
                                executable="/bin/bash", cwd=up.elsewhere, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env_without_cluster())
    assert pipeline.stdout is not None
    assert pipeline.stdout.readline() == "first\n"   # head printed it and is gone
    r = up.cli("produce", "piped", stdin="third\n")  # the consumer's next write finds no reader
    assert r.returncode == 0, r.stderr
    out, err = pipeline.communicate(timeout=30)
    assert out.strip() == "rc=141" and err == "", (out, err)
    for reader, codes in (("true", {"141"}), ("head -1", {"0", "141"})):
        cmd = " ".join(base + ["topic", "list", "--data-dir", str(up.data_dir)])
        r = subprocess.run(f"{cmd} | {reader}; echo \"rc=${{PIPESTATUS[0]}}\"", shell=True, executable="/bin/bash",
                           cwd=up.elsewhere, capture_output=True, text=True, timeout=60, env=env_without_cluster())
        assert r.stdout.strip().splitlines()[-1][3:] in codes and r.stderr == "", (reader, r.stdout, r.stderr)


# ---------------------------------------------------------------- unreachable peers

@pytest.fixture
def silent_port():
    """A port that accepts connections (the kernel's backlog does) and never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        yield s.getsockname()[1]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_controller_and_brokers_are_named_within_the_timeout(silent_port, tmp_path):
    """A controller or broker that does not answer (--timeout-ms 1000) or refuses: exit 1 with
    one line naming the address and what to do, within the timeout plus start-up, never a long
    silence; no traceback."""
    cases = [
        (["topic", "list", "--controller", f"127.0.0.1:{silent_port}"], "no answer within 1000 ms"),
        (["produce", "t", "--bootstrap", f"127.0.0.1:{silent_port}"], "timed out after 1000 ms"),
        (["consume", "t", "--bootstrap", f"127.0.0.1:{silent_port}"], "timed out after 1000 ms"),
        (["cluster", "status", "--controller", f"127.0.0.1:{closed_port()}"], "connection refused"),
        (["produce", "t", "--bootstrap", f"127.0.0.1:{closed_port()}"], "connection refused"),
    ]
    started = []
    for args, _ in cases:
        proc = subprocess.Popen([PYTHON, "-m", "common.cli", *args, "--timeout-ms", "1000"], cwd=tmp_path,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=env_without_cluster())
        started.append((time.monotonic(), proc))
    for (args, expected), (t0, proc) in zip(cases, started):
        _, err = proc.communicate("x\n", timeout=30)
        elapsed_s = time.monotonic() - t0
        port = re.search(r"127\.0\.0\.1:(\d+)", " ".join(args))
        assert port is not None
        assert proc.returncode == 1, (args, err)
        assert f"127.0.0.1:{port.group(1)}" in err and expected in err and "biplane up" in err, (args, err)
        assert len(err.strip().splitlines()) == 1, (args, err)
        assert elapsed_s < 10, (args, elapsed_s)   # 1 s timeout; the rest is a loaded machine's start-up
        assert_clean(err)


def test_an_empty_token_and_a_wait_timeout_below_one_are_refused_before_anything_is_asked(silent_port, tmp_path):
    """`--token ""` used to fall back to the cluster's own token without a word, and
    `--wait-timeout-ms -5` put a broker in maintenance, then gave up at once. Each is refused
    with exit 1 and one line naming the flag, before the controller is asked (the silent port
    would take the whole --timeout-ms)."""
    cases = [(["topic", "list", "--token", ""], "--token is empty"),
             (["broker", "maintenance", "on", "1", "--wait-timeout-ms", "-5"], "--wait-timeout-ms -5 must be at least 1")]
    for args, expected in cases:
        t0 = time.monotonic()
        proc = subprocess.run([PYTHON, "-m", "common.cli", *args, "--controller", f"127.0.0.1:{silent_port}",
                               "--timeout-ms", "20000"], cwd=tmp_path, capture_output=True, text=True,
                              env=env_without_cluster(), timeout=60)
        assert proc.returncode == 1 and expected in proc.stderr, (args, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1 and time.monotonic() - t0 < 15, (args, proc.stderr)
        assert_clean(proc.stderr)


# ---------------------------------------------------------------- help and the example

def _parsers(main, prog: str, argv: list[str], monkeypatch) -> list[argparse.ArgumentParser]:
    """The parser a command's main builds, and its subcommands' parsers."""
    seen: list[argparse.ArgumentParser] = []

    def capture(self, args=None, namespace=None):
        seen.append(self)
        raise SystemExit(0)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", capture)
    with pytest.raises(SystemExit):
        main(argv, prog)
    monkeypatch.undo()
    out = list(seen)
    for parser in seen:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                out += list(action.choices.values())
    return out


def test_every_flag_of_the_user_commands_has_help(monkeypatch):
    from common.cli import COMMANDS
    import importlib
    users = ["topic", "cluster", "reassign", "elect", "snapshot", "produce", "consume", "bench", "down", "stop",
             "start", "restart", "up"]
    missing = []
    for name in users:
        module_name, function_name = COMMANDS[name][0].split(":")
        main = getattr(importlib.import_module(module_name), function_name)
        for parser in _parsers(main, f"biplane {name}", ["x"], monkeypatch):
            for action in parser._actions:
                if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                    continue
                if not action.help:
                    missing.append(f"{parser.prog} {'/'.join(action.option_strings) or action.dest}")
    assert not missing, missing


def test_topic_create_takes_its_shape_from_flags_config_or_assignment_and_refuses_two_that_disagree():
    """`--config partitions=4` (the help's key list names it) was refused as "set 'partitions'
    with the request field"; `--partitions 2 --replica-assignment 1,2` dropped the 2 silently;
    a key given twice kept the last value silently."""
    import argparse as ap
    from controller.admin_cli import CliError, _topic_shape

    def shape(partitions=None, rf=None, config=(), assignment=None):
        return _topic_shape(ap.Namespace(partitions=partitions, replication_factor=rf, config=list(config),
                                         replica_assignment=assignment))
    assert shape() == {"partitions": 1, "replication_factor": 1, "config": {}}
    got = shape(config=["partitions=4", "replication.factor=2", "retention_ms=5"])
    assert got == {"partitions": 4, "replication_factor": 2, "config": {"retention_ms": 5}}
    assert shape(partitions=4, config=["partitions=4"])["partitions"] == 4
    with pytest.raises(CliError, match="--partitions 3 and --config partitions 4"):
        shape(partitions=3, config=["partitions=4"])
    assert shape(assignment="1,2:2,3")["partitions"] == 2
    with pytest.raises(CliError, match="--partitions 3 disagrees with --replica-assignment"):
        shape(partitions=3, assignment="1,2:2,3")
    with pytest.raises(CliError, match="durability is given twice"):
        shape(config=["durability=fsync", "durability=write"])
    with pytest.raises(CliError, match="min_insync_replicas is given twice"):
        shape(config=["min.insync.replicas=2", "min_insync_replicas=3"])
    with pytest.raises(CliError, match="is not a whole number"):
        shape(config=["partitions=true"])


@pytest.mark.parametrize("flags, says", [
    (["--partition", "-2"], "argument --partition: -2 is not a partition number (0 or more)"),
    (["--key-separator", ""], "argument --key-separator: must not be empty"),
])
def test_produce_names_a_bad_flag_in_the_users_words(flags, says):
    """`--partition -2` said "a non-negative integer or None" (Python's None); an empty
    separator said only "empty separator"."""
    r = subprocess.run([PYTHON, "-m", "common.cli", "produce", "t", *flags], cwd=REPO, capture_output=True,
                       text=True, timeout=60, stdin=subprocess.DEVNULL, env=env_without_cluster())
    assert r.returncode == 2 and says in r.stderr, r.stderr
    assert "None" not in r.stderr and "Traceback" not in r.stderr


def test_tables_show_settings_as_a_user_types_them_back():
    from common.tables import table
    assert table([["unclean_leader_election", True], ["compacted", False], ["x", None]], ["KEY", "VALUE"]) \
        .splitlines()[1:] == ["unclean_leader_election  true", "compacted                false", "x                        -"]


def test_a_partition_electing_its_leader_says_so_instead_of_showing_no_leader():
    """A quorum topic's preferred election fences the partition first: `biplane elect` and
    `topic describe` showed its leader as '-', which reads as a partition without a leader."""
    from controller.admin_cli import partition_rows
    base = {"topic": "t", "partition": 0, "replicas": [1, 2, 3], "isr": [1, 2, 3], "leader_epoch": 4,
            "partition_epoch": 9}
    rows = partition_rows([{**base, "leader": None, "fenced_for_election": True},
                           {**base, "leader": None, "fenced_for_election": False},
                           {**base, "leader": 2, "fenced_for_election": False}])
    assert [row[2] for row in rows] == ["electing", None, 2]


def test_topic_create_help_lists_every_config_key(capsys):
    from common.metadata.config import VALID_KEYS
    from controller.admin_cli import topic_main
    with pytest.raises(SystemExit):
        topic_main(["create", "--help"], "biplane topic")
    text = capsys.readouterr().out
    missing = [key for key in VALID_KEYS if not re.search(rf"^  {key}\s+default [^:]*: \S", text, re.M)]
    assert not missing, text


def test_the_readme_shows_example_py_as_it_is():
    text = (REPO / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks and blocks[0] == (REPO / "example.py").read_text()


def test_example_py_runs_against_the_cluster_biplane_cluster_names(up):
    """example.py (created topic, acks=all send, read back from its offset), finding the cluster
    through BIPLANE_CLUSTER from another directory, as a user of a non-default --data-dir would."""
    r = subprocess.run([PYTHON, str(REPO / "example.py")], cwd=up.elsewhere, capture_output=True, text=True,
                       timeout=60, env=env_without_cluster(BIPLANE_CLUSTER=str(up.data_dir)))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "RecordMetadata(topic='events'" in r.stdout and "[b'hello']" in r.stdout, r.stdout + r.stderr
