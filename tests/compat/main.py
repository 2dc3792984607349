"""`scripts/compat`: Apache Kafka's own tools and the franz-go client against a local Biplane cluster.

    scripts/compat                 # the whole run: one PASS/FAIL line per case, exit 1 on any failure
    scripts/compat --keep          # keep the run's directory (cluster data, logs, tool output) on success too

It starts a cluster with `biplane up --detach` (1 controller, 3 brokers, each with a Kafka port),
runs kafka-topics, kafka-console-producer/-consumer (also as a group member), kafka-consumer-groups
and kafka-producer-perf-test (Kafka 4.1.1, the jars of scripts/kafka/pom.xml) and a franz-go
program (scripts/kafka/franz), checks what each did against Biplane's own admin view and against
what was written, then stops the cluster with
`biplane down` (also on failure or Ctrl-C) and checks the cluster's logs: an ERROR line, a
traceback or a restarted process fails the run.

Exit codes: 0 every case passed; 1 a case failed; 2 the run could not start (a missing tool, a
cluster that did not come up). A failure shows the tool's output and the tail of the broker logs.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from types import FrameType
from typing import Any, Callable, Sequence

from common.errors import BiplaneError
from tests.log_check import ErrorEntry, error_entries

REPO_ROOT = Path(__file__).resolve().parents[2]
FRANZ_DIR = REPO_ROOT / "scripts" / "kafka" / "franz"
KAFKA_VERSION = "4.1.1"          # scripts/kafka/pom.xml
CONTROLLERS = 1                   # 2 shared cores: the quorum's size is not what this run is about
BROKERS = 3

UP_TIMEOUT_S = 90.0
DOWN_TIMEOUT_S = 60.0
TOOL_TIMEOUT_S = 60.0             # one kafka-topics or console tool run
PERF_TIMEOUT_S = 180.0
GO_BUILD_TIMEOUT_S = 300.0        # the first build downloads franz-go from the Go proxy
FRANZ_TIMEOUT_S = 120.0
SETTLE_TIMEOUT_S = 15.0           # a new topic's or partition's leaders, a deletion
OUTPUT_TAIL_LINES = 40
LOG_TAIL_LINES = 25

CONSOLE_RECORDS = 1000
PERF_RECORDS = 50_000
PERF_RECORD_BYTES = 1024
FRANZ_PARTITIONS = 4
FRANZ_RECORDS = 20_000
# The franz-go program's checks, in the order it makes them (it prints "ok <check>: ...").
FRANZ_CHECKS = ("kadm-create", "kadm-metadata", "produce", "kadm-list-offsets", "consume", "kadm-delete")

# Kafka's tools log through log4j2: warnings and errors only, to stderr, where a failure shows them.
LOG4J2_CONFIG = """\
status = error
appender.err.type = Console
appender.err.name = STDERR
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = %d{HH:mm:ss,SSS} %p %c{1}: %m%n
rootLogger.level = warn
rootLogger.appenderRef.err.ref = STDERR
"""


class SetupError(Exception):
    """The run cannot start or go on (exit 2): a missing tool, a cluster that did not come up."""


class Interrupted(Exception):
    pass


class CaseFailed(Exception):
    """A case's check failed; `run` is the tool run whose output explains it, if any."""

    def __init__(self, message: str, run: "ToolRun | None" = None) -> None:
        super().__init__(message)
        self.run = run


# ------------------------------------------------------------------ tool runs


@dataclasses.dataclass(frozen=True, kw_only=True)
class ToolRun:
    name: str
    argv: list[str]
    returncode: int | None        # None: killed at its timeout
    stdout: str
    stderr: str
    elapsed_s: float

    def lines(self) -> list[str]:
        return self.stdout.splitlines()

    def describe(self) -> str:
        status = "timed out" if self.returncode is None else f"exit {self.returncode}"
        parts = [f"$ {' '.join(self.argv)}   ({status} after {self.elapsed_s:.1f}s)"]
        for label, text in (("stdout", self.stdout), ("stderr", self.stderr)):
            lines = text.splitlines()
            if lines:
                cut = lines[-OUTPUT_TAIL_LINES:]
                more = f" (last {len(cut)} of {len(lines)} lines)" if len(lines) > len(cut) else ""
                parts.append(f"{label}{more}:")
                parts.extend("  " + line for line in cut)
        return "\n".join(parts)

    def check_exit(self) -> None:
        if self.returncode is None:
            raise CaseFailed(f"{self.name} did not finish in time", self)
        if self.returncode != 0:
            raise CaseFailed(f"{self.name} exited with {self.returncode}", self)


class ToolLog:
    """Every tool run's command and whole output, one file each under the run's folder (a failure
    shows only the tail)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.count = 0

    def keep(self, run: ToolRun) -> Path:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.count += 1
        path = self.folder / f"{self.count:02d}-{re.sub(r'[^A-Za-z0-9]+', '-', run.name).strip('-')}.txt"
        status = "timed out" if run.returncode is None else f"exit {run.returncode}"
        path.write_text(f"$ {' '.join(run.argv)}\n({status} after {run.elapsed_s:.1f}s)\n--- stdout\n{run.stdout}"
                        f"--- stderr\n{run.stderr}")
        return path


TOOL_LOG: ToolLog | None = None


def run_tool(name: str, argv: list[str], *, timeout_s: float, cwd: Path | None = None, stdin: str | None = None,
             env: dict[str, str] | None = None) -> ToolRun:
    started = time.monotonic()
    try:
        done = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout_s, cwd=cwd,
                              env=env, stdin=None if stdin is not None else subprocess.DEVNULL)
        run = ToolRun(name=name, argv=argv, returncode=done.returncode, stdout=done.stdout, stderr=done.stderr,
                      elapsed_s=time.monotonic() - started)
    except subprocess.TimeoutExpired as exc:
        def text(value: Any) -> str:
            return value.decode(errors="replace") if isinstance(value, bytes) else (value or "")
        run = ToolRun(name=name, argv=argv, returncode=None, stdout=text(exc.stdout), stderr=text(exc.stderr),
                      elapsed_s=time.monotonic() - started)
    if TOOL_LOG is not None:
        TOOL_LOG.keep(run)
    return run


class KafkaTools:
    """Apache Kafka's command-line tools, run from the jars (`java -cp LIBS/* MainClass`)."""

    TOPICS = "org.apache.kafka.tools.TopicCommand"
    CONSOLE_PRODUCER = "org.apache.kafka.tools.ConsoleProducer"
    CONSOLE_CONSUMER = "org.apache.kafka.tools.consumer.ConsoleConsumer"
    PRODUCER_PERF = "org.apache.kafka.tools.ProducerPerformance"
    CONSUMER_GROUPS = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"

    def __init__(self, libs: Path, work_dir: Path, bootstrap: str) -> None:
        self.libs = libs
        self.bootstrap = bootstrap
        self.log4j2 = work_dir / "log4j2.properties"
        self.log4j2.write_text(LOG4J2_CONFIG)

    def run(self, name: str, main_class: str, args: Sequence[str], *, stdin: str | None = None,
            timeout_s: float = TOOL_TIMEOUT_S) -> ToolRun:
        argv = ["java", "-Xmx512m", f"-Dlog4j2.configurationFile={self.log4j2}", "-cp", f"{self.libs}/*",
                main_class, *args]
        return run_tool(name, argv, timeout_s=timeout_s, stdin=stdin)

    def topics(self, *args: str) -> ToolRun:
        return self.run(f"kafka-topics {args[0]}", self.TOPICS, ["--bootstrap-server", self.bootstrap, *args])


# ------------------------------------------------------------------ the cluster


class Cluster:
    """A `biplane up --detach` cluster in `data_dir`, stopped with `biplane down` (by the pids it recorded)."""

    def __init__(self, python: str, data_dir: Path) -> None:
        self.python = python
        self.data_dir = data_dir
        self.state: dict[str, Any] = {}
        self.started = False
        self._admin: Any = None

    def _cli(self, *args: str, timeout_s: float) -> ToolRun:
        env = dict(os.environ)
        env["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        # The replica cores check their invariants after every step, as in the test suite.
        env.setdefault("BIPLANE_CORE_ASSERTIONS", "1")
        return run_tool(f"biplane {args[0]}", [self.python, "-m", "common.cli", *args], timeout_s=timeout_s,
                        cwd=REPO_ROOT, env=env)

    def start(self) -> ToolRun:
        self.started = True   # from here on, stop() runs: `up` may have started children before failing
        done = self._cli("up", "--detach", "--controllers", str(CONTROLLERS), "--brokers", str(BROKERS),
                         "--data-dir", str(self.data_dir), "--timeout-s", str(UP_TIMEOUT_S - 10),
                         timeout_s=UP_TIMEOUT_S)
        if done.returncode != 0:
            raise SetupError(f"`biplane up` failed to start a cluster in {self.data_dir}\n{done.describe()}")
        self.state = json.loads((self.data_dir / "cluster.json").read_text())
        return done

    @property
    def bootstrap(self) -> str:
        return ",".join(b["kafka_address"] for b in self.state["brokers"].values())

    @property
    def controller_urls(self) -> list[str]:
        return [c["api_url"] for c in self.state["controllers"].values()]

    def admin(self) -> Any:
        """Biplane's own admin view (the SDK's blocking client)."""
        if self._admin is None:
            from dataplane.client.admin import SyncAdminClient
            self._admin = SyncAdminClient(self.controller_urls, self.state["admin_token"])
        return self._admin

    def restarted(self) -> list[str]:
        """Children the supervisor had to start again (each a crash) or that are not running."""
        state = json.loads((self.data_dir / "cluster.json").read_text())
        found = []
        for kind in ("controllers", "brokers"):
            for node_id, node in state.get(kind, {}).items():
                if node.get("restarts"):
                    found.append(f"{kind[:-1]} {node_id} restarted {node['restarts']} time(s)")
                elif node.get("state") not in (None, "running"):
                    found.append(f"{kind[:-1]} {node_id} is {node.get('state')}")
        return found

    def stop(self) -> ToolRun | None:
        if self._admin is not None:
            self._admin.close()
            self._admin = None
        if not self.started or not (self.data_dir / "cluster.json").exists():
            return None
        self.started = False
        return self._cli("down", "--data-dir", str(self.data_dir), timeout_s=DOWN_TIMEOUT_S)

    def log_files(self) -> list[Path]:
        # Every process log, not the partitions' segment files (<digits>.log).
        return sorted(p for p in self.data_dir.rglob("*.log") if p.is_file() and not p.stem.isdigit())

    def log_errors(self) -> list[ErrorEntry]:
        entries: list[ErrorEntry] = []
        for path in self.log_files():
            entries.extend(error_entries(path.read_text(errors="replace"), path=path))
        return entries

    def logs_tail(self) -> str:
        parts = []
        for path in self.log_files():
            if path.name.startswith("broker-"):
                lines = path.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
                parts.append(f"--- {path} (last {len(lines)} lines)")
                parts.extend("  " + line for line in lines)
        return "\n".join(parts)


# ------------------------------------------------------------------ cases


@dataclasses.dataclass(frozen=True, kw_only=True)
class Outcome:
    case: str
    passed: bool
    detail: str
    output: str = ""


def where(exc: BaseException) -> str:
    """An exception of this script's own as one line: its type, message and innermost frame."""
    frame = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ is not None else None
    at = f" (at {Path(frame.filename).name}:{frame.lineno}, a bug in scripts/compat)" if frame is not None else ""
    return f"{type(exc).__name__}: {exc}{at}"


def wait_for(what: str, probe: Callable[[], str | None], *, timeout_s: float = SETTLE_TIMEOUT_S) -> None:
    """Polls `probe` (None: done; otherwise what is still missing) until done or CaseFailed."""
    deadline = time.monotonic() + timeout_s
    while True:
        missing = probe()
        if missing is None:
            return
        if time.monotonic() > deadline:
            raise CaseFailed(f"{what}: still {missing} after {timeout_s:.0f}s")
        time.sleep(0.2)


_DESCRIBE_TOPIC = re.compile(r"^Topic: (?P<topic>\S+)\t.*PartitionCount: (?P<partitions>\d+)\t"
                             r"ReplicationFactor: (?P<rf>\d+)\tConfigs: ?(?P<configs>.*)$")
_DESCRIBE_PARTITION = re.compile(r"^\s+Topic: (?P<topic>\S+)\tPartition: (?P<partition>\d+)\t"
                                 r"Leader: (?P<leader>\S+)\tReplicas: (?P<replicas>[\d,]*)\tIsr: (?P<isr>[\d,]*)")


def _ids(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def parse_describe(run: ToolRun) -> dict[str, Any]:
    """kafka-topics --describe of one topic: its header and, per partition, leader, replicas and ISR."""
    header = None
    partitions: dict[int, dict[str, Any]] = {}
    for line in run.lines():
        if (m := _DESCRIBE_TOPIC.match(line)) is not None:
            header = m
        elif (m := _DESCRIBE_PARTITION.match(line)) is not None:
            leader = None if m["leader"] == "none" else int(m["leader"])
            partitions[int(m["partition"])] = {"leader": leader, "replicas": _ids(m["replicas"]),
                                               "isr": _ids(m["isr"])}
    if header is None:
        raise CaseFailed("kafka-topics --describe printed no 'Topic: ... PartitionCount: ...' line", run)
    configs = dict(item.split("=", 1) for item in header["configs"].split(",") if "=" in item)
    return {"topic": header["topic"], "partitions": int(header["partitions"]), "replication_factor": int(header["rf"]),
            "configs": configs, "by_partition": partitions}


class Compat:
    def __init__(self, *, cluster: Cluster, tools: KafkaTools, work_dir: Path) -> None:
        self.cluster = cluster
        self.tools = tools
        self.work_dir = work_dir
        self.outcomes: list[Outcome] = []

    def case(self, name: str, check: Callable[[], str], *, requires: Sequence[str] = ()) -> bool:
        """Runs one case and prints its PASS or FAIL line; a case whose prerequisite failed is not run."""
        failed = [r for r in requires if not any(o.case == r and o.passed for o in self.outcomes)]
        if failed:
            return self._record(Outcome(case=name, passed=False, detail=f"not run: {', '.join(failed)} failed"))
        try:
            detail = check()
        except CaseFailed as exc:
            return self._record(Outcome(case=name, passed=False, detail=str(exc),
                                        output=exc.run.describe() if exc.run is not None else ""))
        except (BiplaneError, OSError) as exc:
            # Biplane's admin API (the view the tools are compared with) failed or did not answer.
            return self._record(Outcome(case=name, passed=False,
                                        detail=f"Biplane's admin API: {type(exc).__name__}: {exc}"))
        except Exception as exc:
            return self._record(Outcome(case=name, passed=False, detail=f"the check itself failed: {where(exc)}"))
        return self._record(Outcome(case=name, passed=True, detail=detail))

    def _record(self, outcome: Outcome) -> bool:
        self.outcomes.append(outcome)
        print(f"{'PASS' if outcome.passed else 'FAIL'} {outcome.case}: {outcome.detail}", flush=True)
        if outcome.output:
            print("\n".join("    " + line for line in outcome.output.splitlines()), flush=True)
        return outcome.passed

    # ---------------------------------------------------------------- helpers

    def admin_topic(self, name: str) -> Any:
        from common.errors import AdminError
        try:
            return self.cluster.admin().describe_topic(name)
        except AdminError as exc:
            raise CaseFailed(f"Biplane's admin API cannot describe topic {name!r}: {exc}") from exc

    def wait_led(self, name: str, partitions: int) -> Any:
        """Biplane's view of the topic once it has `partitions` partitions, each with a leader."""
        seen: dict[str, Any] = {}

        def probe() -> str | None:
            detail = seen["detail"] = self.admin_topic(name)
            if len(detail.partitions) != partitions:
                return f"{len(detail.partitions)} partitions, not {partitions}"
            leaderless = [p.partition for p in detail.partitions if p.leader is None]
            return f"without a leader: partitions {leaderless}" if leaderless else None
        wait_for(f"topic {name}", probe)
        self.wait_brokers_applied()
        return seen["detail"]

    def wait_brokers_applied(self) -> None:
        """Until every broker has applied the metadata the controller has now. A Kafka tool started next
        may ask any broker, and brokers learn a write a moment after the controller commits it (as
        Kafka's do); the next case is about that tool, not about that moment."""
        target = self.cluster.admin().brokers().metadata_offset

        def probe() -> str | None:
            behind = [f"broker {b.broker_id} at {b.metadata_offset}" for b in self.cluster.admin().brokers().brokers
                      if not b.fenced and (b.metadata_offset is None or b.metadata_offset < target)]
            return f"behind metadata offset {target}: {', '.join(behind)}" if behind else None
        wait_for("brokers' metadata", probe)

    def create_topic(self, name: str, *, partitions: int) -> None:
        """A topic for a case that is not about creating one: made with Biplane's own admin API."""
        from common.errors import AdminError
        try:
            self.cluster.admin().create_topic(name, partitions=partitions, replication_factor=BROKERS)
        except AdminError as exc:
            raise CaseFailed(f"creating topic {name} with Biplane's admin API failed: {exc}") from exc
        self.wait_led(name, partitions)

    def describe_matches_admin(self, name: str, partitions: int) -> str:
        """kafka-topics --describe agrees with Biplane's admin view (leaders, replicas, ISR); the two are
        read one after the other, so a difference is looked at again before it counts."""
        mismatch = ""
        for _ in range(3):
            run = self.tools.topics("--describe", "--topic", name)
            run.check_exit()
            shown = parse_describe(run)
            view = self.wait_led(name, partitions)
            mismatch = ""
            if shown["partitions"] != partitions or len(shown["by_partition"]) != partitions:
                mismatch = (f"PartitionCount {shown['partitions']} and {len(shown['by_partition'])} partition "
                            f"lines, want {partitions}")
            for p in view.partitions:
                got = shown["by_partition"].get(p.partition)
                want = {"leader": p.leader, "replicas": list(p.replicas), "isr": list(p.isr)}
                if got is None or got["leader"] != want["leader"] or got["replicas"] != want["replicas"] \
                        or sorted(got["isr"]) != sorted(want["isr"]):
                    mismatch = f"partition {p.partition}: kafka-topics shows {got}, Biplane's admin view {want}"
                    break
            if not mismatch:
                return f"{partitions} partitions: leader, replicas and ISR as Biplane's admin view has them"
            time.sleep(1)
        raise CaseFailed(f"kafka-topics --describe {name}: {mismatch}", run)

    # ---------------------------------------------------------------- kafka-topics

    TOPIC = "compat-topics"
    RETENTION_MS = 3_600_000

    def topics_create(self) -> str:
        run = self.tools.topics("--create", "--topic", self.TOPIC, "--partitions", "3", "--replication-factor",
                                str(BROKERS), "--config", f"retention.ms={self.RETENTION_MS}")
        run.check_exit()
        if f"Created topic {self.TOPIC}." not in run.stdout:
            raise CaseFailed(f"kafka-topics --create did not print 'Created topic {self.TOPIC}.'", run)
        view = self.wait_led(self.TOPIC, 3)
        sizes = sorted({len(p.replicas) for p in view.partitions})
        if sizes != [BROKERS]:
            raise CaseFailed(f"Biplane's admin view of {self.TOPIC}: replica counts {sizes}, want [{BROKERS}]", run)
        if view.config.get("retention_ms") != self.RETENTION_MS:
            raise CaseFailed(f"Biplane's admin view of {self.TOPIC}: retention_ms={view.config.get('retention_ms')}, "
                             f"want {self.RETENTION_MS} (from --config retention.ms)", run)
        return (f"{self.TOPIC}: 3 partitions, replication factor {BROKERS}, retention.ms={self.RETENTION_MS} "
                "(Biplane's admin view agrees)")

    def topics_list(self) -> str:
        run = self.tools.topics("--list")
        run.check_exit()
        listed = set(run.lines())
        known = {t.name for t in self.cluster.admin().list_topics().topics}
        if self.TOPIC not in listed or listed != known:
            raise CaseFailed(f"kafka-topics --list shows {sorted(listed)}, Biplane's admin view {sorted(known)}",
                             run)
        return f"{len(listed)} topic(s), as Biplane's admin view lists them"

    def topics_describe(self) -> str:
        detail = self.describe_matches_admin(self.TOPIC, 3)
        run = self.tools.topics("--describe", "--topic", self.TOPIC)
        configs = parse_describe(run)["configs"]
        if configs.get("retention.ms") != str(self.RETENTION_MS):
            raise CaseFailed(f"kafka-topics --describe shows Configs {configs}, want retention.ms={self.RETENTION_MS}",
                             run)
        return f"{detail}; Configs: retention.ms={self.RETENTION_MS}"

    def topics_alter(self) -> str:
        run = self.tools.topics("--alter", "--topic", self.TOPIC, "--partitions", "5")
        run.check_exit()
        self.wait_led(self.TOPIC, 5)
        return "3 -> 5 partitions; " + self.describe_matches_admin(self.TOPIC, 5)

    def topics_delete(self) -> str:
        run = self.tools.topics("--delete", "--topic", self.TOPIC)
        run.check_exit()

        def probe() -> str | None:
            names = {t.name for t in self.cluster.admin().list_topics().topics}
            return f"listed by Biplane's admin API" if self.TOPIC in names else None
        wait_for(f"deleted topic {self.TOPIC}", probe)
        self.wait_brokers_applied()
        listed = self.tools.topics("--list")
        listed.check_exit()
        if self.TOPIC in listed.lines():
            raise CaseFailed(f"kafka-topics --list still shows {self.TOPIC} after --delete", listed)
        return f"{self.TOPIC} gone from Biplane's admin view and from kafka-topics --list"

    ASSIGNED_TOPIC = "compat-assigned"
    ASSIGNMENT = ((3, 1, 2), (1, 2, 3))
    ADDED = (2, 3, 1)

    def topics_assign(self) -> str:
        """--replica-assignment: the client sends the replica lists and no counts (-1), on create and on
        adding partitions; Biplane must place the replicas exactly so."""
        def listed(assignment: Sequence[Sequence[int]]) -> str:
            return ",".join(":".join(str(b) for b in replicas) for replicas in assignment)

        run = self.tools.topics("--create", "--topic", self.ASSIGNED_TOPIC, "--replica-assignment",
                                listed(self.ASSIGNMENT))
        run.check_exit()
        view = self.wait_led(self.ASSIGNED_TOPIC, len(self.ASSIGNMENT))
        placed = tuple(tuple(p.replicas) for p in sorted(view.partitions, key=lambda p: p.partition))
        if placed != self.ASSIGNMENT:
            raise CaseFailed(f"replicas of {self.ASSIGNED_TOPIC} are {placed}, asked for {self.ASSIGNMENT}", run)
        grown = (*self.ASSIGNMENT, self.ADDED)
        run = self.tools.topics("--alter", "--topic", self.ASSIGNED_TOPIC, "--partitions", str(len(grown)),
                                "--replica-assignment", listed(grown))
        run.check_exit()
        view = self.wait_led(self.ASSIGNED_TOPIC, len(grown))
        placed = tuple(tuple(p.replicas) for p in sorted(view.partitions, key=lambda p: p.partition))
        if placed != grown:
            raise CaseFailed(f"replicas of {self.ASSIGNED_TOPIC} after --alter are {placed}, asked for {grown}", run)
        return (f"{self.ASSIGNED_TOPIC} created as {listed(self.ASSIGNMENT)}, grown with {listed([self.ADDED])}: "
                "Biplane's admin view has exactly those replicas")

    # ---------------------------------------------------------------- console producer / consumer

    CONSOLE_TOPIC = "compat-console"

    def console_lines(self) -> list[str]:
        # headers <TAB> key <TAB> value, the console tools' default layout with headers and keys on.
        return [f"seq:{i},tool:console\tkey-{i % 97}\tline {i} of {CONSOLE_RECORDS}: {'x' * (i % 50)}"
                for i in range(CONSOLE_RECORDS)]

    def console_produce(self) -> str:
        self.create_topic(self.CONSOLE_TOPIC, partitions=1)
        run = self.tools.run("kafka-console-producer", KafkaTools.CONSOLE_PRODUCER, [
            "--bootstrap-server", self.tools.bootstrap, "--topic", self.CONSOLE_TOPIC,
            "--producer-property", "acks=all", "--producer-property", "enable.idempotence=true",
            "--property", "parse.key=true", "--property", "parse.headers=true"],
            stdin="\n".join(self.console_lines()) + "\n")
        run.check_exit()
        if "ERROR" in run.stderr or "Exception" in run.stderr:
            raise CaseFailed("kafka-console-producer logged an error", run)
        return f"{CONSOLE_RECORDS} lines with keys and headers to {self.CONSOLE_TOPIC}-0, acks=all, idempotent"

    def console_consume(self) -> str:
        run = self.tools.run("kafka-console-consumer", KafkaTools.CONSOLE_CONSUMER, [
            "--bootstrap-server", self.tools.bootstrap, "--topic", self.CONSOLE_TOPIC, "--partition", "0",
            "--offset", "earliest", "--max-messages", str(CONSOLE_RECORDS), "--timeout-ms", "30000",
            "--property", "print.key=true", "--property", "print.headers=true"])
        run.check_exit()
        got, want = run.lines(), self.console_lines()
        if got != want:
            first = next((i for i, (g, w) in enumerate(zip(got, want)) if g != w), min(len(got), len(want)))
            raise CaseFailed(f"read {len(got)} records, wrote {len(want)}; first difference at record {first}: "
                             f"read {got[first] if first < len(got) else None!r}, wrote "
                             f"{want[first] if first < len(want) else None!r}", run)
        return f"{CONSOLE_RECORDS} records read back from offset earliest: keys, headers and values exactly as written"

    GROUP = "compat-group"

    def group_consume(self) -> str:
        """The console consumer as a member of a group (FindCoordinator, JoinGroup, SyncGroup,
        Heartbeat, OffsetCommit, LeaveGroup with Kafka 4.1's classic consumer)."""
        run = self.tools.run("kafka-console-consumer --group", KafkaTools.CONSOLE_CONSUMER, [
            "--bootstrap-server", self.tools.bootstrap, "--topic", self.CONSOLE_TOPIC, "--group", self.GROUP,
            "--from-beginning", "--max-messages", str(CONSOLE_RECORDS), "--timeout-ms", "30000"])
        run.check_exit()
        if len(run.lines()) != CONSOLE_RECORDS:
            raise CaseFailed(f"read {len(run.lines())} records as group {self.GROUP}, wrote {CONSOLE_RECORDS}", run)
        return f"{CONSOLE_RECORDS} records read as a member of {self.GROUP}, its offsets committed on close"

    def consumer_groups(self) -> str:
        """kafka-consumer-groups --list, --describe (the committed offset is the log end: no lag),
        --reset-offsets --to-earliest and --delete against the coordinator."""
        def tool(*args: str) -> ToolRun:
            run = self.tools.run(f"kafka-consumer-groups {args[0]}", KafkaTools.CONSUMER_GROUPS,
                                 ["--bootstrap-server", self.tools.bootstrap, *args])
            run.check_exit()
            return run
        listed = tool("--list")
        if self.GROUP not in listed.lines():
            raise CaseFailed(f"--list shows {listed.lines()}, not {self.GROUP}", listed)
        described = tool("--describe", "--group", self.GROUP)
        rows = [line.split() for line in described.lines() if line.startswith(self.GROUP)]
        if len(rows) != 1 or rows[0][1:6] != [self.CONSOLE_TOPIC, "0", str(CONSOLE_RECORDS + 1),
                                               str(CONSOLE_RECORDS + 1), "0"]:
            raise CaseFailed(f"--describe shows {rows}; want {self.CONSOLE_TOPIC} 0 at offset "
                             f"{CONSOLE_RECORDS + 1} (the log end, after the epoch-start record) with lag 0",
                             described)
        reset = tool("--reset-offsets", "--group", self.GROUP, "--topic", self.CONSOLE_TOPIC, "--to-earliest",
                     "--execute")
        rows = [line.split() for line in reset.lines() if line.startswith(self.GROUP)]
        if rows != [[self.GROUP, self.CONSOLE_TOPIC, "0", "0"]]:
            raise CaseFailed(f"--reset-offsets --to-earliest shows {rows}, want offset 0", reset)
        deleted = tool("--delete", "--group", self.GROUP)
        if "successful" not in deleted.stdout:
            raise CaseFailed("--delete did not report success", deleted)
        after = tool("--list")
        if self.GROUP in after.lines():
            raise CaseFailed(f"{self.GROUP} still listed after --delete", after)
        return "listed, described at the log end with lag 0, reset to earliest, deleted"

    # ---------------------------------------------------------------- producer perf test

    PERF_TOPIC = "compat-perf"

    def producer_perf(self) -> str:
        self.create_topic(self.PERF_TOPIC, partitions=3)
        run = self.tools.run("kafka-producer-perf-test", KafkaTools.PRODUCER_PERF, [
            "--topic", self.PERF_TOPIC, "--num-records", str(PERF_RECORDS), "--record-size", str(PERF_RECORD_BYTES),
            "--throughput", "-1", "--producer-props", f"bootstrap.servers={self.tools.bootstrap}", "acks=all"],
            timeout_s=PERF_TIMEOUT_S)
        run.check_exit()
        summary = next((line for line in reversed(run.lines()) if "records sent" in line), None)
        if summary is None or not summary.startswith(f"{PERF_RECORDS} records sent"):
            raise CaseFailed(f"no summary line '{PERF_RECORDS} records sent, ...'", run)
        if "Exception" in run.stdout + run.stderr or "ERROR" in run.stderr:
            raise CaseFailed("kafka-producer-perf-test reported errors", run)
        return summary

    # ---------------------------------------------------------------- franz-go

    def franz_build(self) -> str:
        # No VCS stamp: a checkout owned by another user (git's safe.directory) would fail the build.
        run = run_tool("go build", ["go", "build", "-buildvcs=false", "-o", str(self.work_dir / "franz-compat"),
                                    "."], cwd=FRANZ_DIR, timeout_s=GO_BUILD_TIMEOUT_S)
        run.check_exit()
        versions = run_tool("go list", ["go", "list", "-m", "github.com/twmb/franz-go",
                                        "github.com/twmb/franz-go/pkg/kadm"], cwd=FRANZ_DIR, timeout_s=60)
        return f"{' '.join(versions.stdout.split()) or 'franz-go'} built in {run.elapsed_s:.1f}s"

    def franz(self) -> None:
        """The franz-go program's checks, one case each (it stops at its first failure)."""
        run = run_tool("franz-compat", [str(self.work_dir / "franz-compat"), "-brokers", self.tools.bootstrap,
                                        "-topic", "compat-franz", "-partitions", str(FRANZ_PARTITIONS),
                                        "-records", str(FRANZ_RECORDS), "-timeout", f"{FRANZ_TIMEOUT_S - 10:.0f}s"],
                       timeout_s=FRANZ_TIMEOUT_S)
        passed = {}
        for line in run.lines():
            check, _, detail = line.removeprefix("ok ").partition(": ")
            if line.startswith("ok ") and check in FRANZ_CHECKS:
                passed[check] = detail
        failure_shown = False
        for check in FRANZ_CHECKS:
            def outcome(check: str = check) -> str:
                nonlocal failure_shown
                if check in passed:
                    return passed[check]
                if failure_shown:
                    raise CaseFailed("not reached")
                failure_shown = True
                raise CaseFailed(run.stderr.strip().splitlines()[-1] if run.stderr.strip()
                                 else "no result (see the output)", run)
            self.case(f"franz-go {check}", outcome)
        if run.returncode != 0 and not failure_shown:
            def exited() -> str:
                raise CaseFailed("every check passed, but the program failed", run)
            self.case("franz-go exit", exited)

    # ---------------------------------------------------------------- the cluster's own health

    def cluster_healthy(self) -> str:
        restarted = self.cluster.restarted()
        if restarted:
            raise CaseFailed("; ".join(restarted))
        return f"{CONTROLLERS} controller(s) and {BROKERS} brokers running, none restarted"

    def cluster_logs(self) -> str:
        entries = self.cluster.log_errors()
        if entries:
            shown = "\n".join(e.describe() for e in entries[:5])
            more = f"\n... and {len(entries) - 5} more" if len(entries) > 5 else ""
            raise CaseFailed(f"{len(entries)} ERROR line(s) or traceback(s) in the cluster's logs:\n{shown}{more}")
        return f"no ERROR line and no traceback in {len(self.cluster.log_files())} log file(s)"

    def run_all(self) -> None:
        self.case("kafka-topics --create", self.topics_create)
        after_create = ("kafka-topics --create",)
        self.case("kafka-topics --list", self.topics_list, requires=after_create)
        self.case("kafka-topics --describe", self.topics_describe, requires=after_create)
        self.case("kafka-topics --alter --partitions", self.topics_alter, requires=after_create)
        self.case("kafka-topics --delete", self.topics_delete, requires=after_create)
        self.case("kafka-topics --replica-assignment", self.topics_assign)
        self.case("kafka-console-producer", self.console_produce)
        self.case("kafka-console-consumer", self.console_consume, requires=("kafka-console-producer",))
        self.case("kafka-console-consumer --group", self.group_consume, requires=("kafka-console-producer",))
        self.case("kafka-consumer-groups", self.consumer_groups, requires=("kafka-console-consumer --group",))
        self.case("kafka-producer-perf-test", self.producer_perf)
        if self.case("franz-go build", self.franz_build):
            self.franz()
        self.case("cluster health", self.cluster_healthy)


# ------------------------------------------------------------------ main


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise Interrupted(signal.Signals(signum).name)


def tool_problems() -> list[str]:
    problems = []
    java = shutil.which("java")
    if java is None:
        problems.append("java is missing: Kafka's tools need Java 17+ (Debian: apt-get install -y "
                        "openjdk-17-jre-headless)")
    if shutil.which("go") is None:
        problems.append("go is missing: the franz-go client is built with it (https://go.dev/dl/, or Debian's "
                        "golang-go if recent enough for scripts/kafka/franz/go.mod)")
    return problems


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/compat", description=__doc__.split("\n\n")[0])
    p.add_argument("--kafka-libs", type=Path, required=True, help="the folder of Kafka's jars (scripts/kafka/jars)")
    p.add_argument("--python", default=sys.executable, help="the Python that runs Biplane (default: this one)")
    p.add_argument("--work-dir", type=Path, help="where the cluster and tool files go (default: a new folder "
                   "under /tmp)")
    p.add_argument("--keep", action="store_true", help="keep the work folder after a passing run")
    args = p.parse_args(argv)

    problems = tool_problems()
    if not (args.kafka_libs / f"kafka-tools-{KAFKA_VERSION}.jar").exists():
        problems.append(f"{args.kafka_libs} has no kafka-tools-{KAFKA_VERSION}.jar: run scripts/kafka/jars")
    if problems:
        for problem in problems:
            print(f"scripts/compat: {problem}", file=sys.stderr)
        return 2
    if args.work_dir is not None:
        args.work_dir.mkdir(parents=True, exist_ok=True)
        work_dir = args.work_dir.resolve()
    else:
        work_dir = Path(tempfile.mkdtemp(prefix="biplane-compat-"))
    global TOOL_LOG
    TOOL_LOG = ToolLog(work_dir / "tools")
    cluster = Cluster(args.python, work_dir / "cluster")
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    started = time.monotonic()
    compat: Compat | None = None
    status = 0
    try:
        cluster.start()
        print(f"compat: Biplane cluster up ({CONTROLLERS} controller, {BROKERS} brokers) in "
              f"{time.monotonic() - started:.1f}s; Kafka API at {cluster.bootstrap}; Kafka tools {KAFKA_VERSION}; "
              f"files in {work_dir}", flush=True)
        compat = Compat(cluster=cluster, tools=KafkaTools(args.kafka_libs, work_dir, cluster.bootstrap),
                        work_dir=work_dir)
        compat.run_all()
    except SetupError as exc:
        print(f"scripts/compat: {exc}", file=sys.stderr)
        if cluster.data_dir.exists():
            print(cluster.logs_tail(), file=sys.stderr)
        status = 2
    except Exception as exc:
        print(f"scripts/compat: the run stopped: {where(exc)}", file=sys.stderr)
        status = 2
    except Interrupted as exc:
        print(f"scripts/compat: interrupted ({exc}); stopping the cluster", file=sys.stderr)
        status = 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        down = cluster.stop()
    if down is not None and down.returncode != 0:
        print(f"scripts/compat: `biplane down` could not stop the cluster in {cluster.data_dir}\n{down.describe()}",
              file=sys.stderr)
        status = status or 1
    if compat is not None:
        # After `down`: errors while stopping count too.
        compat.case("cluster logs", compat.cluster_logs)
        failed = [o for o in compat.outcomes if not o.passed]
        if failed:
            status = status or 1
            print("\ncompat: tail of the broker logs:\n" + cluster.logs_tail(), flush=True)
        print(f"compat: {len(compat.outcomes) - len(failed)} passed, {len(failed)} failed in "
              f"{time.monotonic() - started:.0f}s", flush=True)
    if status == 0 and not args.keep and args.work_dir is None:
        shutil.rmtree(work_dir, ignore_errors=True)
    elif status != 0 or args.keep:
        print(f"compat: the run's files (cluster data and logs) are in {work_dir}", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
