"""Start a whole cluster on loopback — controller(s) plus N `biplane broker` processes — for tests and benchmarks.

    with Cluster(tmp_path, brokers=3) as cluster:          # starts, waits healthy; stops by pid
        cluster.create_topic("t", partitions=1, replication_factor=3, config={"commit_policy": "quorum"})
        leader = cluster.wait_leader("t", 0)                 # broker id, once it accepts produce
        host, port = cluster.address(leader)
        cluster.brokers[leader].kill()                       # kill -9; .start() restarts on the same port
        cluster.brokers[2].pause() / .resume()              # SIGSTOP / SIGCONT

Plus small asyncio helpers over the wire protocol: `make_batch`, `produce`,
`fetch_all` (read a partition from its leader up to the HW), `metadata`.
Everything binds 127.0.0.1 on free ports; every process is stopped by pid.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import log_check
from common.batch import build_batch, iter_batches, read_records
from common.wire import WireClient
from common.wire import messages as wire
from controller_harness import (
    BIPLANE, REPO, SECRET, Controller, http, log_lines, make_specs, wait_leader, wait_until, free_port,
)


class BrokerProcess:
    """One broker process. kill() is kill -9, stop() is SIGTERM (clean), both by pid and idempotent."""

    def __init__(self, broker_id: int, data_dir: Path, controller_urls: list[str], extra: list[str]) -> None:
        self.broker_id = broker_id
        self.data_dir = data_dir
        self.controller_urls = controller_urls
        self.extra = extra
        self.port = free_port()
        self.kafka_port = free_port()  # every broker also serves the Kafka API
        self.proc: subprocess.Popen | None = None
        self.log_path = data_dir.parent / f"broker-{broker_id}.log"
        self.ports_path = data_dir.parent / "ports.json"
        self.paused = False
        self.sigterm_at_s: float | None = None
        self.exited_at_s: float | None = None
        self.launch_prefix: list[str] = []   # run before the command (it must exec it: same pid)

    def start(self) -> "BrokerProcess":
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = [BIPLANE, "broker", "--broker-id", str(self.broker_id), "--data-dir", str(self.data_dir),
                "--port", str(self.port), "--metrics-port", "0", "--ports-file", str(self.ports_path),
                "--kafka-port", str(self.kafka_port),
                "--log-level", "INFO"]
        for url in self.controller_urls:
            args += ["--controller", url]
        log = open(self.log_path, "ab")
        log_check.watch(self.log_path)   # checked for errors after every test (conftest.py)
        self.proc = subprocess.Popen(self.launch_prefix + args + self.extra, stdout=log, stderr=log, cwd=str(REPO))
        log.close()
        self.paused = False
        return self

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def metrics_port(self) -> int:
        """The /metrics port of the running process (waits until it has written it)."""
        def read() -> int | None:
            try:
                ports = json.loads(self.ports_path.read_text())
            except (OSError, ValueError):
                return None
            return ports["metrics_port"] if ports.get("pid") == self.pid else None
        return wait_until(read, 15, f"broker {self.broker_id} ports file")

    def kill(self) -> None:
        if self.alive():
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.paused = False

    def stop(self) -> None:
        """SIGTERM and wait for the exit; `sigterm_at_s` and `exited_at_s` (time.time()) say when."""
        if self.alive():
            self.resume()
            self.sigterm_at_s = time.time()
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
            self.exited_at_s = time.time()

    def pause(self) -> None:
        if self.alive():
            os.kill(self.proc.pid, signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        if self.alive() and self.paused:
            os.kill(self.proc.pid, signal.SIGCONT)
        self.paused = False

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def log_lines(self, text: str) -> list[tuple[float, str]]:
        """(time.time() it was written, line) of every log line containing `text`."""
        return log_lines(self.log_path, text)


class Cluster:
    def __init__(self, root: Path, *, brokers: int = 3, controllers: int = 1,
                 controller_args: list[str] | None = None, broker_args: list[str] | None = None) -> None:
        self.root = Path(root)
        self.specs = make_specs(controllers)
        self.controllers = [Controller(s, self.specs, self.root / f"controller-{s.node_id}",
                                       list(controller_args or [])) for s in self.specs]
        urls = [s.api_url for s in self.specs]
        # A quorum's controllers check the cluster secret (controller_harness starts them with it).
        broker_args = (["--cluster-secret", SECRET] if controllers > 1 else []) + list(broker_args or [])
        self.brokers = {i: BrokerProcess(i, self.root / f"broker-{i}" / "data", urls, broker_args)
                        for i in range(1, brokers + 1)}

    # ---- lifecycle

    def __enter__(self) -> "Cluster":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self, timeout_s: float = 30) -> None:
        for c in self.controllers:
            c.start()
        wait_leader(self.controllers, timeout_s)
        for b in self.brokers.values():
            b.start()
        self.wait_unfenced(list(self.brokers), timeout_s)

    def stop(self) -> None:
        for b in self.brokers.values():
            b.resume()
            b.kill()
        for c in self.controllers:
            c.kill()

    @property
    def api_url(self) -> str:
        leader = wait_leader(self.controllers, 20)
        return leader.spec.api_url

    def wait_unfenced(self, broker_ids: list[int], timeout_s: float = 30) -> None:
        def check() -> bool:
            r = http("GET", self.api_url + "/v1/brokers")
            unfenced = {b["broker_id"] for b in r.body["brokers"] if not b["fenced"]}
            return r.status == 200 and set(broker_ids) <= unfenced
        wait_until(check, timeout_s, f"brokers {broker_ids} registered and unfenced", interval_s=0.1)

    def metadata_records(self, after_offset: int = -1) -> list[dict]:
        """Committed metadata records after `after_offset`, as brokers fetch them (leader's window)."""
        r = http("GET", self.api_url + f"/rpc/v1/metadata?after_offset={after_offset}&max_wait_ms=0",
                 token=None, secret=SECRET)
        assert r.status == 200 and "records" in r.body, r.body
        return [entry["record"] for entry in r.body["records"]]

    def broker_info(self, broker_id: int) -> dict | None:
        """The controller's view of a broker (GET /v1/brokers), None if not registered."""
        r = http("GET", self.api_url + "/v1/brokers")
        return next((b for b in r.body["brokers"] if b["broker_id"] == broker_id), None)

    def restart(self, broker_id: int, *, kill: bool = False, timeout_s: float = 30) -> dict:
        """Stop (SIGTERM, or kill -9) and start a broker; wait until its new incarnation is unfenced."""
        before = (self.broker_info(broker_id) or {}).get("incarnation_id")
        broker = self.brokers[broker_id]
        broker.kill() if kill else broker.stop()
        broker.start()

        def check() -> dict | None:
            info = self.broker_info(broker_id)
            return info if info and info["incarnation_id"] != before and not info["fenced"] else None
        return wait_until(check, timeout_s, f"broker {broker_id} re-registered and unfenced", interval_s=0.1)

    # ---- admin

    def create_topic(self, name: str, *, partitions: int = 1, replication_factor: int = 3,
                     config: dict | None = None, wait: bool = True) -> dict:
        r = http("POST", self.api_url + "/v1/topics", {"name": name, "partitions": partitions,
                                                     "replication_factor": replication_factor,
                                                     "config": config or {}})
        assert r.status == 201, r.body
        if wait:
            for p in range(partitions):
                self.wait_leader(name, p)
        return r.body

    def partition(self, topic: str, partition: int) -> dict:
        r = http("GET", self.api_url + f"/v1/topics/{topic}/partitions")
        assert r.status == 200, r.body
        return r.body["partitions"][partition]

    def address(self, broker_id: int) -> tuple[str, int]:
        return ("127.0.0.1", self.brokers[broker_id].port)

    @property
    def kafka_bootstrap(self) -> str:
        """Kafka clients' bootstrap.servers: every broker's Kafka API listener."""
        return ",".join(f"127.0.0.1:{b.kafka_port}" for b in self.brokers.values())

    def wait_leader(self, topic: str, partition: int, timeout_s: float = 30, *,
                    not_broker: int | None = None) -> int:
        """The leader's broker id, once it answers a produce-ready metadata and a list-offsets."""
        def check() -> int | None:
            p = self.partition(topic, partition)
            leader = p["leader"]
            if leader is None or leader == not_broker or not self.brokers[leader].alive():
                return None
            code = _run_sync(_list_offsets_code(self.address(leader), topic, partition))
            return leader if code == 0 else None
        return wait_until(check, timeout_s, f"a serving leader for {topic}-{partition}", interval_s=0.05)

    def wait_not_leading(self, topic: str, partition: int, broker_id: int, timeout_s: float = 30) -> None:
        """Until `broker_id` has learned it no longer leads the partition (its list-offsets
        answers an error): the controller commits an election before the brokers apply it."""
        def check() -> bool:
            return _run_sync(_list_offsets_code(self.address(broker_id), topic, partition)) != 0
        wait_until(check, timeout_s, f"broker {broker_id} to step down from {topic}-{partition}", interval_s=0.05)


def _run_sync(coro) -> Any:
    """asyncio.run, also from inside a running loop (in a helper thread then)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


async def _list_offsets_code(address: tuple[str, int], topic: str, partition: int) -> int:
    try:
        client = await asyncio.wait_for(WireClient.connect(*address), 2)
    except (OSError, asyncio.TimeoutError):
        return -1
    try:
        r = await asyncio.wait_for(client.request(wire.ListOffsetsRequest(topics=(wire.ListOffsetsTopic(
            topic=topic, partitions=(wire.ListOffsetsPartition(partition=partition),)),))), 2)
        return int(r.topics[0].partitions[0].error_code)
    except Exception:
        return -1
    finally:
        await client.close()


# ---------------------------------------------------------------- wire helpers


def make_batch(values: list[bytes], *, timestamp_ms: int | None = None) -> bytes:
    return build_batch(values, timestamp_ms=int(time.time() * 1000) if timestamp_ms is None else timestamp_ms)


def produce_request(topic: str, partition: int, records: bytes, *, acks: int = -1, epoch: int = -1,
                    timeout_ms: int = 10_000) -> wire.ProduceRequest:
    return wire.ProduceRequest(acks=acks, timeout_ms=timeout_ms, topics=(wire.ProduceTopic(
        topic=topic, partitions=(wire.ProducePartition(partition=partition, current_leader_epoch=epoch,
                                                       records=records),)),))


async def produce(client: WireClient, topic: str, partition: int, records: bytes, *, acks: int = -1,
                  epoch: int = -1, timeout_ms: int = 10_000) -> wire.ProducePartitionResponse:
    r = await client.request(produce_request(topic, partition, records, acks=acks, epoch=epoch,
                                             timeout_ms=timeout_ms))
    return r.topics[0].partitions[0]


async def fetch_values(client: WireClient, topic: str, partition: int, *, offset: int = 0,
                       max_wait_ms: int = 0) -> tuple[list[tuple[int, bytes]], int]:
    """Every (offset, value) from `offset` up to the HW, as a consumer sees it; and the HW."""
    out: list[tuple[int, bytes]] = []
    while True:
        r = await client.request(wire.FetchRequest(max_wait_ms=max_wait_ms, topics=(wire.FetchTopic(
            topic=topic, partitions=(wire.FetchPartition(partition=partition, fetch_offset=offset),)),)))
        p = r.topics[0].partitions[0]
        if p.error_code != 0:
            raise AssertionError(f"fetch {topic}-{partition}@{offset}: {p.error_code.name}")
        records = bytes(p.records or b"")
        if not records:
            return out, p.high_watermark
        for pos, header in iter_batches(records):
            if not header.is_control:
                for rec in read_records(records, pos):
                    if rec.offset >= offset:
                        out.append((rec.offset, rec.value))
            offset = header.next_offset
        if offset >= p.high_watermark:
            return out, p.high_watermark


