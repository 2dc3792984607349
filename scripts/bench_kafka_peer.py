#!/usr/bin/env python3
"""Apache Kafka 4.1 against Biplane, both driven by Kafka's own kafka-producer-perf-test.

Starts, on loopback, Apache Kafka in KRaft mode (one controller and three brokers) and a
Biplane cluster (one controller and three brokers, serving the Kafka API on their Kafka
ports): the same shape on both sides, a metadata quorum of one apart from three data
brokers. Then, for each durability pairing, creates one topic on each side (RF 3, the
same partition count) and runs org.apache.kafka.tools.ProducerPerformance against each,
alternating Kafka and Biplane round by round, with the same producer settings (acks=all,
1 KiB records, a fixed record count):

- `write`: Kafka's default flush policy (the OS writes the page cache back; no fsync per
  write) against a Biplane topic with `biplane.durability=write` (acknowledged once
  written on the in-sync replicas; each replica still fsyncs lazily, after
  `biplane.flush.debounce.ms`, 100 ms by default under write, which Kafka's default never does);
- `fsync`: Kafka with `flush.messages=1` (every append fsynced, on the leader and on each
  follower) against Biplane's default durability (`fsync`).

Both topics' `flush.messages`, as each side describes it, must agree before a pairing runs.
Before each measured round the page cache is written back (`sync`, untimed, its duration
printed): Kafka's default leaves a round's data dirty, and the kernel writing it back would
otherwise fall into the next round, the other side's.
Prints every round and a table of medians (records/s, p50/p99 ms) with Biplane/Kafka.
It asserts nothing about speed; it exits non-zero, naming the side, when a server fails,
a perf-test exits badly or reports fewer records than asked (a failed send).

    .venv/bin/python scripts/bench_kafka_peer.py [--rounds 3] [--records 200000]
        [--partitions 3] [--pairing write --pairing fsync] [--producer-prop batch.size=65536]
        [--biplane-topic-config biplane.replication.mode=push] [--kafka-topic-config KEY=VALUE]

Apache Kafka's jars come from Maven Central through scripts/kafka/jars (Maven needed once).
Every server binds 127.0.0.1 on free ports, keeps its data under one temporary directory
(--keep keeps it) and is stopped by pid when the run ends, fails or is interrupted.
"""
from __future__ import annotations

import argparse
import base64
import dataclasses
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from types import FrameType
from typing import Any, Callable, TypeVar

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
# The Biplane servers run this checkout's code, not whichever one the venv was installed from.
os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])

from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic  # noqa: E402

from cluster_harness import Cluster  # noqa: E402
from controller_harness import free_port  # noqa: E402

PERF_TEST = "org.apache.kafka.tools.ProducerPerformance"
KAFKA_MAIN = "kafka.Kafka"
STORAGE_TOOL = "kafka.tools.StorageTool"
LONG_MAX = 2**63 - 1
# kafka-run-class.sh's JVM performance options, so the brokers run as Kafka ships them.
JVM_OPTS = ["-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-XX:InitiatingHeapOccupancyPercent=35",
            "-XX:+ExplicitGCInvokesConcurrent", "-XX:MaxInlineLevel=15", "-Djava.awt.headless=true"]
BROKER_HEAP = "1g"
CONTROLLER_HEAP = "512m"
PERF_TEST_HEAP = "512m"     # kafka-producer-perf-test.sh's own
STOP_WAIT_S = 20            # a server given SIGTERM is killed after this
START_TIMEOUT_S = 90        # four JVMs starting on two shared cores are slow
TOPIC_TIMEOUT_S = 60
IDLE_S = 5                  # how long the idle servers' CPU is measured

# The perf-test's last line, e.g. "300000 records sent, 41234.5 records/sec (40.27 MB/sec),
# 712.31 ms avg latency, 1630.00 ms max latency, 690 ms 50th, 1212 ms 95th, 1455 ms 99th, 1600 ms 99.9th."
SUMMARY = re.compile(
    r"^(?P<records>\d+) records sent, (?P<records_per_s>[\d.]+) records/sec \((?P<mb_per_s>[\d.]+) MB/sec\), "
    r"(?P<avg_ms>[\d.]+) ms avg latency, (?P<max_ms>[\d.]+) ms max latency, (?P<p50_ms>\d+) ms 50th, "
    r"(?P<p95_ms>\d+) ms 95th, (?P<p99_ms>\d+) ms 99th, (?P<p999_ms>\d+) ms 99\.9th\.$")

LOG4J2 = """<?xml version="1.0" encoding="UTF-8"?>
<!-- Warnings and errors only: the bench reads these logs when a side fails. -->
<Configuration status="warn">
  <Appenders>
    <Console name="out" target="SYSTEM_OUT"><PatternLayout pattern="[%d] %p %m (%c)%n"/></Console>
  </Appenders>
  <Loggers><Root level="warn"><AppenderRef ref="out"/></Root></Loggers>
</Configuration>
"""


class BenchError(Exception):
    """A side failed: the message names it and says what happened."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Pairing:
    name: str
    what: str
    kafka_config: dict[str, str]
    biplane_config: dict[str, str]
    flush_messages: int   # what both sides must describe the topic's flush.messages as


PAIRINGS: dict[str, Pairing] = {
    "write": Pairing(name="write", what="no fsync per write: Kafka's default flush policy, Biplane durability=write",
                     kafka_config={}, biplane_config={"biplane.durability": "write"}, flush_messages=LONG_MAX),
    "fsync": Pairing(name="fsync", what="fsync per batch: Kafka flush.messages=1, Biplane's default durability=fsync",
                     kafka_config={"flush.messages": "1"}, biplane_config={}, flush_messages=1),
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class PerfResult:
    records: int
    records_per_s: float
    mb_per_s: float
    avg_ms: float
    max_ms: float
    p50_ms: int
    p95_ms: int
    p99_ms: int
    p999_ms: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class Round:
    pairing: str
    side: str
    number: int
    result: PerfResult
    wall_s: float
    server_cpu_s: float     # CPU time of the side's server processes during the round
    load_1m: float          # the machine's load average when the round began


# ---------------------------------------------------------------- processes


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a running process (its threads included), 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no log at {path})"


class JavaProcess:
    """One JVM of Apache Kafka's, in a session of its own (a Ctrl-C reaches the bench, which
    stops it), its output in `log_path`; stop() is SIGTERM then SIGKILL, by pid, idempotent."""

    def __init__(self, name: str, argv: list[str], log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is not None:
            return
        os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


def java(libs: Path, heap: str, log4j2: Path, main_class: str, *args: str) -> list[str]:
    return ["java", f"-Xms{heap}", f"-Xmx{heap}", *JVM_OPTS, f"-Dlog4j2.configurationFile={log4j2}",
            "-cp", f"{libs}/*", main_class, *args]


T = TypeVar("T")


def wait_for(check: Callable[[], T | None], timeout_s: float, what: str, *, alive: Callable[[], None]) -> T:
    """`check()`'s first truthy answer; `alive()` raises when a server died meanwhile."""
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        alive()
        try:
            result = check()
        except Exception as exc:  # the admin client's errors while servers are starting
            last = exc
            result = None
        if result:
            return result
        time.sleep(0.2)
    raise BenchError(f"timed out after {timeout_s:.0f} s waiting for {what} (last error: {last})")


# ---------------------------------------------------------------- Apache Kafka


def kafka_cluster_id() -> str:
    """A cluster id as Kafka's Uuid writes one: 16 random bytes, URL-safe base64, unpadded,
    never starting with '-' (its command line would read that as an option)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


class KafkaCluster:
    """Apache Kafka in KRaft mode: one controller (node 1) and `brokers` brokers (nodes 2..),
    the same shape as the Biplane cluster it is measured against: its metadata quorum apart
    from the brokers, so broker processes do data-plane work only on both sides."""

    def __init__(self, root: Path, libs: Path, *, brokers: int = 3) -> None:
        self.root = root
        self.libs = libs
        self.broker_count = brokers
        self.log4j2 = root / "log4j2.xml"
        self.controller_port = free_port()
        self.broker_ports = {node_id: free_port() for node_id in range(2, 2 + brokers)}
        self.processes: dict[str, JavaProcess] = {}

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{port}" for port in self.broker_ports.values())

    def pids(self) -> list[int]:
        return [p.proc.pid for p in self.processes.values() if p.alive()]

    def _properties(self, node_id: int) -> Path:
        voters = f"1@127.0.0.1:{self.controller_port}"
        common = {
            "node.id": str(node_id),
            "controller.quorum.voters": voters,
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(self.root / f"node-{node_id}" / "data"),
        }
        if node_id == 1:
            props = {**common, "process.roles": "controller",
                     "listeners": f"CONTROLLER://127.0.0.1:{self.controller_port}"}
        else:
            port = self.broker_ports[node_id]
            props = {**common, "process.roles": "broker",
                     "listeners": f"PLAINTEXT://127.0.0.1:{port}",
                     "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
                     "inter.broker.listener.name": "PLAINTEXT",
                     "auto.create.topics.enable": "false",
                     "offsets.topic.replication.factor": str(min(3, self.broker_count)),
                     "transaction.state.log.replication.factor": str(min(3, self.broker_count)),
                     "group.initial.rebalance.delay.ms": "0"}
        path = self.root / f"node-{node_id}.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        return path

    def __enter__(self) -> "KafkaCluster":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.log4j2.write_text(LOG4J2)
        cluster_id = kafka_cluster_id()
        nodes = [1, *self.broker_ports]
        configs = {node_id: self._properties(node_id) for node_id in nodes}
        formats = []
        for node_id in nodes:
            # A formatting JVM is short-lived and small; the four run side by side.
            argv = java(self.libs, "256m", self.log4j2, STORAGE_TOOL, "format", "-t", cluster_id,
                        "-c", str(configs[node_id]))
            log = self.root / f"format-{node_id}.log"
            with open(log, "wb") as out:
                formats.append((node_id, log, subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                                               stdin=subprocess.DEVNULL, start_new_session=True)))
        for node_id, log, proc in formats:
            try:
                code = proc.wait(timeout=START_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                for _, _, p in formats:
                    p.kill()
                raise BenchError(f"Kafka: formatting node {node_id}'s storage took over {START_TIMEOUT_S} s")
            if code != 0:
                raise BenchError(f"Kafka: StorageTool format of node {node_id} exited {code}:\n{tail(log)}")
        for node_id in nodes:
            name = "controller" if node_id == 1 else f"broker {node_id}"
            heap = CONTROLLER_HEAP if node_id == 1 else BROKER_HEAP
            self.processes[name] = JavaProcess(name, java(self.libs, heap, self.log4j2, KAFKA_MAIN,
                                                          str(configs[node_id])),
                                               self.root / f"node-{node_id}.log")
        admin = admin_client(self.bootstrap)
        wait_for(lambda: len(admin.list_topics(timeout=2).brokers) == self.broker_count, START_TIMEOUT_S,
                 f"{self.broker_count} Kafka brokers registered", alive=self.check_alive)

    def check_alive(self) -> None:
        for p in self.processes.values():
            if not p.alive():
                raise BenchError(f"Kafka {p.name} exited with {p.proc.returncode}; its log "
                                 f"({p.log_path}) ends:\n{tail(p.log_path)}")

    def stop(self) -> None:
        # Brokers first, so none waits for a controller that is gone to shut down.
        for name in sorted(self.processes, key=lambda n: n == "controller"):
            self.processes[name].stop()


# ---------------------------------------------------------------- Biplane


class BiplaneSide:
    """tests/cluster_harness.py's cluster: one controller, three brokers with Kafka ports."""

    def __init__(self, root: Path, *, brokers: int = 3) -> None:
        self.cluster = Cluster(root, brokers=brokers, broker_args=["--log-level", "WARNING"])

    @property
    def bootstrap(self) -> str:
        return self.cluster.kafka_bootstrap

    def pids(self) -> list[int]:
        procs = [b.proc for b in self.cluster.brokers.values()] + [c.proc for c in self.cluster.controllers]
        return [p.pid for p in procs if p is not None and p.poll() is None]

    def __enter__(self) -> "BiplaneSide":
        try:
            self.cluster.__enter__()  # stops what it started if it fails
        except AssertionError as exc:  # the harness's timeouts
            logs = "\n".join([*(f"controller {c.spec.node_id}: {c.log_tail(10)}" for c in self.cluster.controllers),
                              *(f"broker {b.broker_id}: {b.log_tail(10)}" for b in self.cluster.brokers.values())])
            raise BenchError(f"Biplane cluster did not start: {exc}\n{logs}") from exc
        return self

    def __exit__(self, *exc: Any) -> None:
        self.cluster.__exit__(*exc)

    def check_alive(self) -> None:
        for b in self.cluster.brokers.values():
            if not b.alive():
                raise BenchError(f"Biplane broker {b.broker_id} exited; its log ({b.log_path}) ends:\n{b.log_tail()}")
        for c in self.cluster.controllers:
            if not c.alive():
                raise BenchError(f"Biplane controller {c.spec.node_id} exited; its log ends:\n{c.log_tail()}")


Side = KafkaCluster | BiplaneSide


# ---------------------------------------------------------------- topics


def admin_client(bootstrap: str) -> AdminClient:
    # Critical messages only: while brokers start, every refused connection would be logged.
    return AdminClient({"bootstrap.servers": bootstrap, "log_level": 2})


def create_topic(side_name: str, side: Side, topic: str, *, partitions: int, config: dict[str, str],
                 flush_messages: int) -> None:
    """Create `topic` (RF 3) with Kafka's admin API, wait until every partition has a leader and
    three in-sync replicas, and check the side describes its flush.messages as expected."""
    admin = admin_client(side.bootstrap)
    futures = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=3,
                                            config=config)], operation_timeout=30, request_timeout=30)
    try:
        futures[topic].result(timeout=TOPIC_TIMEOUT_S)
    except Exception as exc:
        raise BenchError(f"{side_name}: creating topic {topic} ({partitions} partitions, RF 3, {config}) "
                         f"failed: {exc}") from exc

    def ready() -> bool:
        meta = admin.list_topics(topic, timeout=5).topics.get(topic)
        return (meta is not None and meta.error is None and len(meta.partitions) == partitions
                and all(p.leader >= 0 and len(p.isrs) == 3 for p in meta.partitions.values()))
    wait_for(ready, TOPIC_TIMEOUT_S, f"{side_name} topic {topic}: a leader and 3 in-sync replicas per partition",
             alive=side.check_alive)
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    # The broker asked may not have applied the topic yet (Kafka's brokers lag their controller
    # the same way): ask again until it has.
    described = wait_for(lambda: admin.describe_configs([resource], request_timeout=30)[resource].result(timeout=30),
                         TOPIC_TIMEOUT_S, f"{side_name} topic {topic}: its configs described",
                         alive=side.check_alive)
    value = int(described["flush.messages"].value)
    if value != flush_messages:
        raise BenchError(f"{side_name}: topic {topic} describes flush.messages={value}, the pairing needs "
                         f"{flush_messages}; the two sides would not be at equal durability")


def delete_topic(side: Side, topic: str) -> None:
    """Best effort: frees the disk between pairings (a failure here changes no figure)."""
    admin = admin_client(side.bootstrap)
    try:
        admin.delete_topics([topic], operation_timeout=30)[topic].result(timeout=TOPIC_TIMEOUT_S)
    except Exception as exc:
        print(f"  (deleting {topic} failed: {exc})", flush=True)


# ---------------------------------------------------------------- the perf-test


def parse_summary(output: str) -> PerfResult | None:
    for line in reversed(output.splitlines()):
        m = SUMMARY.match(line.strip())
        if m:
            g = m.groupdict()
            return PerfResult(records=int(g["records"]), records_per_s=float(g["records_per_s"]),
                              mb_per_s=float(g["mb_per_s"]), avg_ms=float(g["avg_ms"]), max_ms=float(g["max_ms"]),
                              p50_ms=int(g["p50_ms"]), p95_ms=int(g["p95_ms"]), p99_ms=int(g["p99_ms"]),
                              p999_ms=int(g["p999_ms"]))
    return None


def perf_test(libs: Path, log4j2: Path, log_dir: Path, label: str, *, bootstrap: str, topic: str, records: int,
              record_bytes: int, producer_props: list[str], timeout_s: float, check_alive: Callable[[], None]
              ) -> PerfResult:
    """One run of kafka-producer-perf-test; its output goes to `<label>.log` under `log_dir`."""
    log_path = log_dir / f"{label}.log"
    argv = java(libs, PERF_TEST_HEAP, log4j2, PERF_TEST, "--topic", topic, "--num-records", str(records),
                "--record-size", str(record_bytes), "--throughput", "-1",
                "--producer-props", f"bootstrap.servers={bootstrap}", *producer_props)
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
    output = log_path.read_text(errors="replace")
    check_alive()
    if code is None:
        raise BenchError(f"{label}: the perf-test did not finish within {timeout_s:.0f} s; its output "
                         f"({log_path}) ends:\n{tail(log_path)}")
    if code != 0:
        raise BenchError(f"{label}: the perf-test exited {code}; its output ({log_path}) ends:\n{tail(log_path)}")
    # A failed send prints its exception and is left out of the summary's count.
    errors = [line for line in output.splitlines() if "Exception" in line or "ERROR" in line]
    if errors:
        first = "\n".join(errors[:3])
        raise BenchError(f"{label}: the perf-test reported {len(errors)} errors ({log_path}); the first:\n{first}")
    result = parse_summary(output)
    if result is None:
        raise BenchError(f"{label}: no summary line in the perf-test's output ({log_path}):\n{tail(log_path)}")
    if result.records != records:
        raise BenchError(f"{label}: {result.records:,} of {records:,} records acknowledged ({log_path})")
    return result


# ---------------------------------------------------------------- the run


def kafka_libs() -> Path:
    done = subprocess.run([str(ROOT / "scripts" / "kafka" / "jars")], capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise BenchError(f"scripts/kafka/jars exited {done.returncode}:\n{done.stderr.strip()}")
    libs = Path(done.stdout.strip().splitlines()[-1])
    if not any(libs.glob("kafka_2.13-*.jar")) or not any(libs.glob("kafka-tools-*.jar")):
        raise BenchError(f"{libs} holds no kafka_2.13 or kafka-tools jar; remove .kafka and run again")
    return libs


@dataclasses.dataclass(frozen=True, kw_only=True)
class Bench:
    args: argparse.Namespace
    sides: dict[str, Side]
    libs: Path
    log4j2: Path
    log_dir: Path

    def measure(self, name: str, *, topic: str, label: str, pairing: str, number: int, records: int) -> Round:
        """One perf-test run against side `name`, with the CPU its servers used meanwhile."""
        side, args = self.sides[name], self.args
        # What the previous round left in the page cache goes to disk first, untimed: Kafka's
        # default flush policy leaves a round's data dirty, and the kernel's writeback of it
        # (its flusher threads, no server's CPU) would otherwise land in the next round, the
        # other side's.
        synced = time.monotonic()
        os.sync()
        sync_s = time.monotonic() - synced
        load_1m = os.getloadavg()[0]
        pids = side.pids()
        cpu_before = sum(cpu_seconds(pid) for pid in pids)
        began = time.monotonic()
        result = perf_test(self.libs, self.log4j2, self.log_dir, label, bootstrap=side.bootstrap, topic=topic,
                           records=records, record_bytes=args.record_bytes, producer_props=args.producer_props,
                           timeout_s=args.round_timeout_s * max(1.0, records / args.records),
                           check_alive=side.check_alive)
        wall_s = time.monotonic() - began
        cpu_s = sum(cpu_seconds(pid) for pid in pids) - cpu_before
        print(f"  {label:<22} {result.records_per_s:>10,.0f} rec/s {result.mb_per_s:>7.2f} MB/s  "
              f"p50 {result.p50_ms:>5} p99 {result.p99_ms:>5} p99.9 {result.p999_ms:>5} "
              f"max {result.max_ms:>7.0f} ms  servers {cpu_s:5.1f} CPU s in {wall_s:4.1f} s  load {load_1m:.1f}  "
              f"(sync before {sync_s:.1f} s)",
              flush=True)
        return Round(pairing=pairing, side=name, number=number, result=result, wall_s=wall_s, server_cpu_s=cpu_s,
                     load_1m=load_1m)

    def report_idle(self, seconds: float) -> None:
        """What each side's servers take while nobody produces: each side idles through the
        other's rounds, on the same cores."""
        def cpu_s() -> dict[str, float]:
            return {name: sum(cpu_seconds(pid) for pid in side.pids()) for name, side in self.sides.items()}
        before = cpu_s()
        time.sleep(seconds)
        after = cpu_s()
        print("idle servers: " + ", ".join(f"{name} {100 * (after[name] - before[name]) / seconds:.0f}% of a core"
                                           for name in self.sides), flush=True)

    def run_pairing(self, pairing: Pairing, *, warmup_records: int) -> list[Round]:
        args = self.args
        print(f"pairing {pairing.name}: {pairing.what}", flush=True)
        topic = f"peer-{pairing.name}"
        configs = {"kafka": {**pairing.kafka_config, **args.kafka_topic_config},
                   "biplane": {**pairing.biplane_config, **args.biplane_topic_config}}
        for name, side in self.sides.items():
            create_topic(name, side, topic, partitions=args.partitions, config=configs[name],
                         flush_messages=pairing.flush_messages)
        rounds: list[Round] = []
        if warmup_records:
            for name in self.sides:
                # Kafka's brokers run interpreted until the JIT has compiled their hot paths:
                # their CPU per record still halves over the first ~400,000 records. Not counted.
                self.measure(name, topic=topic, label=f"{pairing.name}-{name}-warmup", pairing=pairing.name,
                             number=0, records=warmup_records)
        for number in range(1, args.rounds + 1):
            for name in self.sides:
                rounds.append(self.measure(name, topic=topic, label=f"{pairing.name}-{name}-{number}",
                                           pairing=pairing.name, number=number, records=args.records))
        # After a failure the clusters go anyway; after success the disk is wanted for the next pairing.
        for side in self.sides.values():
            delete_topic(side, topic)
        return rounds


def report(args: argparse.Namespace, rounds: list[Round]) -> None:
    print()
    print(f"{args.rounds} rounds per side and pairing, alternating; {args.records:,} records of {args.record_bytes} B; "
          f"RF 3, {args.partitions} partitions; producer: {' '.join(args.producer_props)}")
    for name in ("kafka", "biplane"):
        extra = getattr(args, f"{name}_topic_config")
        if extra:
            print(f"{name} topics also: {' '.join(f'{k}={v}' for k, v in extra.items())}")
    print()
    print("| pairing | round | side | records/s | MB/s | p50 ms | p99 ms | p99.9 ms | max ms | server CPU s | load |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rounds:
        x = r.result
        print(f"| {r.pairing} | {r.number} | {r.side} | {x.records_per_s:,.0f} | {x.mb_per_s:.1f} | {x.p50_ms} | "
              f"{x.p99_ms} | {x.p999_ms} | {x.max_ms:.0f} | {r.server_cpu_s:.1f} | {r.load_1m:.1f} |")
    print()
    print("Medians (server CPU: the side's brokers and controller, CPU ms per MB produced):")
    print()
    print("| pairing | Kafka records/s | Kafka p50 / p99 ms | Biplane records/s | Biplane p50 / p99 ms "
          "| Biplane/Kafka records/s | server CPU ms/MB Kafka / Biplane |")
    print("|---|---|---|---|---|---|---|")
    for pairing in dict.fromkeys(r.pairing for r in rounds):
        med: dict[str, tuple[float, float, float, float]] = {}
        for side in ("kafka", "biplane"):
            mine = [r for r in rounds if r.pairing == pairing and r.side == side]
            med[side] = (statistics.median(r.result.records_per_s for r in mine),
                         statistics.median(r.result.p50_ms for r in mine),
                         statistics.median(r.result.p99_ms for r in mine),
                         statistics.median(r.server_cpu_s * 1000 / (args.records * args.record_bytes / 2**20)
                                           for r in mine))
        k, b = med["kafka"], med["biplane"]
        print(f"| {pairing} | {k[0]:,.0f} | {k[1]:.0f} / {k[2]:.0f} | {b[0]:,.0f} | {b[1]:.0f} / {b[2]:.0f} "
              f"| {b[0] / k[0]:.2f} | {k[3]:.0f} / {b[3]:.0f} |")


class Interrupted(BaseException):
    pass


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise Interrupted(f"signal {signum}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3, help="measured rounds per side and pairing (default 3)")
    p.add_argument("--records", type=int, default=200_000, help="records per round (default 200,000)")
    p.add_argument("--warmup-records", type=int, default=400_000,
                   help="records of one unmeasured round per side before the first pairing's rounds (0: none)")
    p.add_argument("--record-bytes", type=int, default=1024)
    p.add_argument("--partitions", type=int, default=3)
    p.add_argument("--pairing", action="append", choices=sorted(PAIRINGS),
                   help="durability pairings to run, in order (default: write, then fsync)")
    p.add_argument("--producer-prop", action="append", default=[], metavar="KEY=VALUE",
                   help="a producer setting for both sides, after acks=all (repeatable)")
    p.add_argument("--kafka-topic-config", action="append", default=[], metavar="KEY=VALUE",
                   help="a further config of Kafka's topics (repeatable)")
    p.add_argument("--biplane-topic-config", action="append", default=[], metavar="KEY=VALUE",
                   help="a further config of Biplane's topics, e.g. biplane.replication.mode=push (repeatable)")
    p.add_argument("--round-timeout-s", type=float, default=180,
                   help="a perf-test of --records running longer fails the bench (a warm-up gets more)")
    p.add_argument("--keep", action="store_true", help="keep the data and logs directory")
    args = p.parse_args()
    if args.rounds < 1 or args.records < 1 or args.partitions < 1:
        p.error("--rounds, --records and --partitions must be at least 1")
    for flag in ("producer_prop", "kafka_topic_config", "biplane_topic_config"):
        for item in getattr(args, flag):
            if "=" not in item:
                p.error(f"--{flag.replace('_', '-')} {item!r}: give KEY=VALUE")
    args.kafka_topic_config = dict(item.split("=", 1) for item in args.kafka_topic_config)
    args.biplane_topic_config = dict(item.split("=", 1) for item in args.biplane_topic_config)
    args.producer_props = ["acks=all", *args.producer_prop]
    pairings = [PAIRINGS[name] for name in (args.pairing or ["write", "fsync"])]

    signal.signal(signal.SIGTERM, _on_sigterm)
    tmp = Path(tempfile.mkdtemp(prefix="bench-kafka-peer-"))
    print(f"data and logs under {tmp}; load {os.getloadavg()[0]:.1f}, {os.cpu_count()} cores", flush=True)
    failed = True
    try:
        libs = kafka_libs()
        log_dir = tmp / "perf-test"
        log_dir.mkdir()
        with KafkaCluster(tmp / "kafka", libs) as kafka, BiplaneSide(tmp / "biplane") as biplane:
            bench = Bench(args=args, sides={"kafka": kafka, "biplane": biplane}, libs=libs, log4j2=kafka.log4j2,
                          log_dir=log_dir)
            bench.report_idle(IDLE_S)
            rounds: list[Round] = []
            for i, pairing in enumerate(pairings):
                rounds += bench.run_pairing(pairing, warmup_records=args.warmup_records if i == 0 else 0)
        report(args, rounds)
        failed = False
        return 0
    except BenchError as exc:
        print(f"bench_kafka_peer: FAILED: {exc}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, Interrupted):
        print("bench_kafka_peer: interrupted; servers stopped", file=sys.stderr)
        return 130
    finally:
        if args.keep or failed:
            print(f"data and logs kept under {tmp}", file=sys.stderr if failed else sys.stdout)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
