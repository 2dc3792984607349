"""One chaos run: namespaces and disks, the cluster, the workload, the seeded faults, the heal,
the read-back, the segment files, the check, and the teardown (always, also on failure).

Order, written down: create namespaces -> enter the hub namespace -> mount broker disks ->
start controllers and brokers -> create one topic per mode -> start the workload -> warm up
-> faults (one at a time, each healed at its end; the `*_pair` kinds remove a quorum) ->
restart whatever is down -> settle while producing -> stop producers (every outcome known
or timed out) -> stop consumers -> read back to the high watermarks -> stop every process
-> decode every replica's segment files -> check. Teardown: kill what is left by pid,
unmount, delete namespaces.
"""
from __future__ import annotations

import asyncio
import dataclasses
import gc
import json
import logging
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

from tests.chaos import replicas
from tests.chaos.checker import Report, check
from tests.chaos.cluster import Cluster, Node
from tests.chaos.fences import read_fences
from tests.chaos.history import FaultRun, History, tp_key
from tests.chaos.loopwatch import LoopWatch
from tests.chaos.net import Network
from tests.chaos.schedule import GRAY_KINDS, Fault, make_schedule
from tests.chaos.workload import Workload, read_back

TRACE = os.environ.get("BIPLANE_CHAOS_TRACE") in ("1", "debug", "metadata")
BACK_POLL_S = 0.25
BACK_WAIT_S = 60.0
# A return slower than this is noted with what it waited for, longest first.
BACK_SLOW_S = 15.0

TOPIC_MODES: list[tuple[str, dict[str, Any]]] = [
    (f"{mode}-{policy}-{durability}", {"replication_mode": mode, "commit_policy": policy, "durability": durability})
    for mode in ("pull", "push") for policy in ("isr", "quorum") for durability in ("fsync", "write")
]


def both_ways(pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Each (a, b) and its (b, a): a cut in both directions."""
    return [*pairs, *((b, a) for a, b in pairs)]


def slow_return_note(name: str, fault_index: int, killed_at: float, back_at: float | None,
                     waits: list[tuple[float, str]]) -> str:
    """What a slow return waited for: each reason the check gave, longest first."""
    last = back_at if back_at is not None else killed_at + BACK_WAIT_S
    ends = [since for since, _ in waits[1:]] + [last]
    spans = sorted(((end - since, since, reason) for (since, reason), end in zip(waits, ends)), reverse=True)
    came = f"back {back_at - killed_at:.1f} s after its kill" if back_at is not None else \
        f"not back within {BACK_WAIT_S:.0f} s of its kill"
    what = "; ".join(f"{reason} for {span:.1f} s from {since:.1f} s" for span, since, reason in spans[:3])
    return f"{name} (fault {fault_index}, killed at {killed_at:.1f} s) {came}: {what or 'no check answered'}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunOptions:
    seed: int
    duration_s: float
    work_dir: Path
    repo_root: Path
    partitions: int = 2
    producers: int = 2
    consumers: int = 2
    interval_s: float = 0.1
    warmup_s: float = 4.0
    settle_s: float = 10.0
    start_timeout_s: float = 90.0
    broker_disk_mb: int = 256
    replica_lag_time_max_ms: int = 2_000
    request_timeout_ms: int = 3_000
    delivery_timeout_ms: int = 10_000
    kinds: tuple[str, ...] | None = None
    keep_data: bool = False


def last_error(node: Node) -> str:
    """The first ERROR line of the process's latest start in its log (what a reader wants
    next to "it exited"; later ones are usually the shutdown's echoes)."""
    try:
        lines = node.log_path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    starts = [i for i, line in enumerate(lines) if line.startswith("==== chaos: start")]
    lines = lines[starts[-1] if starts else 0:]
    errors = [line for line in lines if " level=ERROR " in line or line.startswith("biplane ")]
    return (errors[0] if errors else "(no error line)")[:300]


def _log(message: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {message}", flush=True)


class Run:
    def __init__(self, options: RunOptions) -> None:
        self.o = options
        run_id = f"{os.getpid() % 10000:04d}"
        self.network = Network(run_id=run_id, node_names=["c1", "c2", "c3", "b1", "b2", "b3"],
                               subnet_octet=os.getpid() % 250 + 2)
        self.cluster = Cluster(network=self.network, work_dir=options.work_dir, repo_root=options.repo_root,
                               broker_disk_mb=options.broker_disk_mb)
        self.t0 = time.monotonic()
        self.wall_t0 = time.time()
        self.faults: list[FaultRun] = []
        self.notes: list[str] = []
        self.exits: list[str] = []     # processes found dead that no fault killed
        self.expected_down: set[str] = set()
        self.back: dict[int, dict[str, float]] = {}   # fault index -> node -> back in service at (run s)

    def now(self) -> float:
        return time.monotonic() - self.t0

    def write_manifest(self) -> None:
        manifest = {"pid": os.getpid(), "namespaces": self.network.created,
                    "mounts": [str(n.data_dir) for n in self.cluster.brokers() if n.mounted],
                    "pids": {n.name: n.pid for n in self.cluster.nodes.values() if n.pid}}
        (self.o.work_dir / "manifest.json").write_text(json.dumps(manifest, indent=1))

    # ------------------------------------------------------------------ faults

    def _node(self, name: str) -> Node:
        return self.cluster.nodes[name]

    async def inject(self, fault: Fault) -> tuple[list[Node], str]:
        """Perform the fault; returns the nodes it touched and a note."""
        kind, c, net = fault.kind, self.cluster, self.network
        if kind in ("kill_broker", "kill_controller", "kill_broker_pair"):
            nodes = [self._node(t) for t in fault.targets]
            for n in nodes:
                n.kill9()
                self.expected_down.add(n.name)
            return nodes, ""
        if kind in ("kill_controller_leader", "pause_controller_leader"):
            leader = await asyncio.to_thread(c.controller_leader)
            note = ""
            verb = "killed" if kind == "kill_controller_leader" else "paused"
            if leader is None:
                leader, note = self._node("c1"), f"no controller named itself leader; {verb} c1"
            if kind == "kill_controller_leader":
                leader.kill9()
                self.expected_down.add(leader.name)
            else:
                leader.pause()
            return [leader], note or f"leader was {leader.name}"
        if kind == "cut_controller_leader":
            leader = await asyncio.to_thread(c.controller_leader)
            note = "" if leader is not None else "no controller named itself leader; cut c1"
            leader = leader or self._node("c1")
            peers = [n.name for n in c.nodes.values() if n.kind == "controller" and n.name != leader.name]
            await asyncio.to_thread(net.cut, *both_ways([(leader.name, o) for o in peers]))
            return [leader], note or f"{leader.name} <-> {','.join(peers)} dropped; brokers and clients reach it"
        if kind in ("pause_broker", "pause_controller", "pause_controller_pair"):
            nodes = [self._node(t) for t in fault.targets]
            for n in nodes:
                n.pause()
            return nodes, ""
        if kind == "isolate":
            x = fault.targets[0]
            others = [o for o in [*net.nodes, "hub"] if o != x]
            await asyncio.to_thread(net.cut, *both_ways([(x, o) for o in others]))
            return [self._node(x)], "cut from every process and the clients"
        if kind == "partition":
            minority = set(fault.targets)
            across = [(a, b) for a in sorted(minority) for b in net.nodes if b not in minority]
            await asyncio.to_thread(net.cut, *both_ways(across))
            return [self._node(t) for t in fault.targets], f"{sorted(minority)} | the rest"
        if kind in ("cut_leader", "cut_leader_out", "cut_leader_in"):
            x = fault.targets[0]
            peers = [b.name for b in c.brokers() if b.name != x]
            out = [(x, o) for o in peers] if kind != "cut_leader_in" else []
            into = [(o, x) for o in peers] if kind != "cut_leader_out" else []
            await asyncio.to_thread(net.cut, *out, *into)
            way = {"cut_leader": "<->", "cut_leader_out": "->", "cut_leader_in": "<-"}[kind]
            return [self._node(x)], f"{x} {way} {','.join(peers)} dropped; controllers and clients reach it"
        if kind == "cut_follower":
            a, b = fault.targets
            await asyncio.to_thread(net.cut, *both_ways([(a, b)]))
            return [self._node(a), self._node(b)], f"{a} <-> {b} dropped, each reaches everyone else"
        if kind == "cut_one_way":
            await asyncio.to_thread(net.cut, (fault.targets[0], fault.targets[1]))
            return [self._node(fault.targets[0])], f"{fault.targets[0]} -> {fault.targets[1]} dropped"
        if kind == "delay":
            note = await asyncio.to_thread(net.delay, fault.targets[0], int(fault.param("delay_ms")),
                                           int(fault.param("jitter_ms")))
            return [self._node(fault.targets[0])], note
        if kind == "loss":
            await asyncio.to_thread(net.loss, fault.targets[0], int(fault.param("percent")))
            return [self._node(fault.targets[0])], f"{fault.param('percent')}% of its packets lost"
        if kind == "duplicate":
            await asyncio.to_thread(net.duplicate, fault.targets[0], int(fault.param("percent")))
            return [self._node(fault.targets[0])], f"{fault.param('percent')}% of its packets sent twice"
        if kind == "disk_full":
            n = self._node(fault.targets[0])
            taken = await asyncio.to_thread(c.fill_disk, n)
            return [n], f"filled {taken // (1 << 20)} MiB"
        if kind == "clock_jump":
            n = self._node(fault.targets[0])
            c.set_clock(n, int(fault.param("offset_s")))
            return [n], f"wall clock {int(fault.param('offset_s')):+d} s"
        raise AssertionError(f"no injector for {kind}")

    async def heal(self, fault: Fault, nodes: list[Node]) -> None:
        kind = fault.kind
        if kind.startswith("kill_"):
            for n in nodes:
                n.start()
                self.expected_down.discard(n.name)
            self.write_manifest()
        elif kind.startswith("pause_"):
            for n in nodes:
                n.resume()
        elif kind in ("isolate", "partition", "cut_one_way", "delay", "loss", "duplicate") or kind in GRAY_KINDS:
            await asyncio.to_thread(self.network.heal_all)
        elif kind == "disk_full":
            self.cluster.free_disk(nodes[0])
        elif kind == "clock_jump":
            self.cluster.set_clock(nodes[0], 0)

    def restart_unexpectedly_dead(self) -> None:
        for n in self.cluster.nodes.values():
            if n.name not in self.expected_down and not n.alive():
                code = n.proc.returncode if n.proc else None
                self.exits.append(f"{n.name} exited (code {code}) at {self.now():.1f} s: {last_error(n)}")
                _log(f"{n.name} exited on its own (code {code}); restarting it")
                n.start()
        self.write_manifest()

    async def watch_back(self, fault_index: int, node: Node, topics: list[str]) -> None:
        """Note when a killed process is back in service after its restart
        (Cluster.waiting_for says nothing is missing), polled every BACK_POLL_S. Started at the kill: the metadata
        committed then comes before its registration after the restart. Each note is the time a
        successful check began, so the moment it came back lies between the previous check and
        that one: a window it closes may be short by a poll and a check, never long, and the gap
        figure is if anything too large. A watcher that fails says so in the notes."""
        def committed_now() -> int | None:
            answers = [self.cluster.health(c) for c in self.cluster.controllers() if c.alive() and not c.paused]
            offsets = [int(a.get("metadata_offset", -1)) for a in answers if a is not None]
            return max(offsets) if offsets else None

        killed_at = self.now()
        waits: list[tuple[float, str]] = []  # (since, what it waited for), each change of reason
        try:
            committed = None
            deadline = self.now() + BACK_WAIT_S
            while self.now() < deadline:
                at = self.now()
                if committed is None:
                    committed = await asyncio.to_thread(committed_now)
                else:
                    reason = await asyncio.to_thread(self.cluster.waiting_for, node, topics, committed)
                    if reason is None:
                        self.back.setdefault(fault_index, {})[node.name] = round(at, 3)
                        if at - killed_at > BACK_SLOW_S:
                            self.notes.append(slow_return_note(node.name, fault_index, killed_at, at, waits))
                        return
                    if not waits or waits[-1][1] != reason:
                        waits.append((at, reason))
                await asyncio.sleep(BACK_POLL_S)
            self.notes.append(slow_return_note(node.name, fault_index, killed_at, None, waits))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a harness problem, reported, not a run failure
            self.notes.append(f"watching {node.name} come back after fault {fault_index} failed: {exc!r}")

    async def sleep_until(self, at_s: float) -> None:
        delay = at_s - self.now()
        if delay > 0:
            await asyncio.sleep(delay)

    # ------------------------------------------------------------------ the run

    async def create_topics(self) -> dict[str, dict[str, Any]]:
        from dataplane.client.admin import AdminClient
        topics: dict[str, dict[str, Any]] = {}
        async with AdminClient(self.cluster.controller_urls, self.cluster.admin_token) as admin:
            for name, mode in TOPIC_MODES:
                config = {**mode, "replica_lag_time_max_ms": self.o.replica_lag_time_max_ms}
                if mode["commit_policy"] == "isr":
                    config["min_insync_replicas"] = 2
                await admin.create_topic(name, partitions=self.o.partitions, replication_factor=3, config=config)
                topics[name] = config
        return topics

    async def wait_leaders(self, topics: list[str], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        reason = "not asked yet"
        while time.monotonic() < deadline:
            try:
                leaderless = [f"{t}/{p['partition']}" for t in topics
                              for p in (await asyncio.to_thread(self.cluster.api_get,
                                                                f"/v1/topics/{t}/partitions"))["partitions"]
                              if p["leader"] is None]
                reason = f"no leader for {leaderless}"
            except Exception as exc:  # noqa: BLE001 - not ready yet
                leaderless, reason = ["?"], f"{type(exc).__name__}: {exc}"
            if not leaderless:
                return
            await asyncio.sleep(0.3)
        raise RuntimeError(f"partitions had no leader within {timeout_s:.0f} s: {reason}")

    async def drive(self) -> History:
        o = self.o
        _log(f"seed {o.seed}: starting 3 controllers and 3 brokers in namespaces {self.network.namespaces[0]}..")
        self.cluster.start_all()
        self.write_manifest()
        await asyncio.to_thread(self.cluster.wait_healthy, o.start_timeout_s)
        topics = await self.create_topics()
        await self.wait_leaders(list(topics), 30)
        _log(f"cluster healthy; {len(topics)} topics x {o.partitions} partitions; workload starting")
        self.t0, self.wall_t0 = time.monotonic(), time.time()
        workload = Workload(bootstrap=self.cluster.bootstrap, topics=list(topics), partitions=o.partitions,
                            producers=o.producers, consumers=o.consumers, interval_s=o.interval_s, t0=self.t0,
                            request_timeout_ms=o.request_timeout_ms, delivery_timeout_ms=o.delivery_timeout_ms)
        watch = LoopWatch(now=self.now)
        watch.start()
        await workload.start()
        tracer = None
        if TRACE:
            tracer = asyncio.create_task(self._trace_metadata(list(topics)))
        if TRACE and os.environ.get("BIPLANE_CHAOS_TRACE") != "metadata":
            handler = logging.FileHandler(self.o.work_dir / "logs" / "clients.log")
            t0 = self.t0
            handler.setFormatter(logging.Formatter("%(run_s).3f %(name)s %(message)s"))
            handler.addFilter(lambda r: setattr(r, "run_s", r.created - time.time() + time.monotonic() - t0) or True)
            client_log = logging.getLogger("biplane.client")
            client_log.setLevel(logging.DEBUG)
            client_log.addHandler(handler)
        # faults start a warm-up after the workload runs (its consumers may take a while to start)
        schedule = make_schedule(seed=o.seed, duration_s=o.duration_s, start_s=round(self.now() + o.warmup_s, 3),
                                 kinds=o.kinds)
        _log(f"{len(schedule)} faults over {o.duration_s:.0f} s")
        watchers: list[asyncio.Task[None]] = []
        for fault in schedule:
            await self.sleep_until(fault.start_s)
            self.restart_unexpectedly_dead()
            leaders = await asyncio.to_thread(self.leaders_now, list(topics)) if fault.kind in GRAY_KINDS else {}
            start = self.now()
            nodes, note = await self.inject(fault)
            if fault.kind.startswith("kill_"):
                watchers += [asyncio.create_task(self.watch_back(fault.index, n, list(topics))) for n in nodes]
            await self.sleep_until(max(fault.end_s, start + fault.duration_s))
            await self.heal(fault, nodes)
            end = self.now()
            self.faults.append(FaultRun(index=fault.index, kind=fault.kind, targets=tuple(n.name for n in nodes),
                                        start_s=round(start, 3), end_s=round(end, 3),
                                        removes_quorum=fault.removes_quorum, note=note, leaders=leaders))
            if fault.index % 10 == 9:
                acked = sum(1 for s in workload.sends if s.offset is not None)
                _log(f"{fault.index + 1}/{len(schedule)} faults; {acked}/{len(workload.sends)} records acknowledged")
        last_heal_s = self.now()
        self.restart_unexpectedly_dead()
        _log(f"last fault healed at {last_heal_s:.1f} s; settling {o.settle_s:.0f} s")
        await asyncio.sleep(o.settle_s)
        for watcher in watchers:
            watcher.cancel()
        await asyncio.gather(*watchers, return_exceptions=True)
        self.faults = [dataclasses.replace(f, back_s=self.back.get(f.index, {})) for f in self.faults]
        await workload.stop_sending()
        if tracer is not None:
            tracer.cancel()
        await workload.stop_consuming()
        await watch.stop()
        self.notes += workload.errors[:50]
        self.notes.append(f"harness: {watch.freezes} freezes of its heap; {watch.unreachable_at_stop} objects "
                          f"unreachable at the end (at most that many were kept frozen as garbage)")
        _log("reading every partition back to its high watermark")
        reads, hws, unreadable, notes = await read_back(bootstrap=self.cluster.bootstrap, topics=list(topics),
                                                        partitions=o.partitions,
                                                        request_timeout_ms=o.request_timeout_ms)
        self.notes += notes
        end_s = self.now()
        state_notes, isr_at_end = await asyncio.to_thread(self.partition_states, list(topics))
        self.notes += state_notes
        _log("stopping every process; decoding segment files")
        await asyncio.to_thread(self.cluster.stop_all)
        fences = read_fences([n.log_path for n in self.cluster.controllers()], self.wall_t0)
        replica_logs: dict[str, dict[str, list[tuple[int, str]]]] = {}
        for b in self.cluster.brokers():
            logs, more = replicas.read_broker(b.data_dir, set(topics))
            self.notes += more
            for tp, entries in logs.items():
                replica_logs.setdefault(tp, {})[b.name] = entries
        return History(seed=o.seed, topics=topics, sends=workload.sends, seen=workload.seen, faults=self.faults,
                       final_reads=reads, high_watermarks=hws, replicas=replica_logs, last_heal_s=last_heal_s,
                       end_s=end_s, notes=self.notes, exits=self.exits, unreadable=unreadable,
                       producer_restarts=workload.producer_restarts,
                       isr_at_end=isr_at_end, fences=fences, harness_stalls=watch.stalls)

    async def _trace_metadata(self, topics: list[str]) -> None:
        """Diagnostics (BIPLANE_CHAOS_TRACE=1, =debug or =metadata): every change of a partition's leader, epochs, ISR
        or election fencing, and of the brokers' fencing, as the controllers' admin API shows it,
        with the run's clock, in trace-metadata.jsonl."""
        last: dict[str, Any] = {}
        with open(self.o.work_dir / "trace-metadata.jsonl", "w") as out:
            while True:
                for path in [f"/v1/topics/{t}/partitions" for t in topics] + ["/v1/brokers"]:
                    try:
                        got = await asyncio.to_thread(self.cluster.api_get, path)
                    except Exception as exc:  # noqa: BLE001 - diagnostics only
                        got = {"error": str(exc)[:80]}
                    if got != last.get(path):
                        last[path] = got
                        out.write(json.dumps({"at_s": round(self.now(), 3), "path": path, "got": got}) + "\n")
                        out.flush()
                await asyncio.sleep(0.2)

    def leaders_now(self, topics: list[str]) -> dict[str, str]:
        """Each partition's leader as the admin API says now ("b1"...); partitions without one
        (or when the API does not answer) are left out."""
        out: dict[str, str] = {}
        for t in topics:
            try:
                parts = self.cluster.api_get(f"/v1/topics/{t}/partitions")["partitions"]
            except Exception:   # noqa: BLE001 - a figure's input, not the run's
                continue
            for p in parts:
                if p.get("leader") is not None:
                    out[tp_key(t, p["partition"])] = f"b{p['leader']}"
        return out

    def partition_states(self, topics: list[str]) -> tuple[list[str], dict[str, list[str]]]:
        """The ISR of every partition at the end ("b1"...), and one note per partition whose
        state is not whole: leader and ISR."""
        notes = []
        isr: dict[str, list[str]] = {}
        for t in topics:
            try:
                parts = self.cluster.api_get(f"/v1/topics/{t}/partitions")["partitions"]
            except Exception as exc:  # noqa: BLE001 - a note, not a verdict
                return [f"partition states: {exc}"], isr
            for p in parts:
                isr[f"{t}/{p['partition']}"] = [f"b{b}" for b in p["isr"]]
                if p["leader"] is None or len(p["isr"]) < len(p["replicas"]):
                    notes.append(f"at the end {t}/{p['partition']}: leader {p['leader']}, isr {p['isr']}, "
                                 f"replicas {p['replicas']}, leader epoch {p.get('leader_epoch')}, "
                                 f"partition epoch {p.get('partition_epoch')}, "
                                 f"fenced for election {p.get('fenced_for_election')}")
        return notes, isr

    def setup(self) -> None:
        self.o.work_dir.mkdir(parents=True, exist_ok=True)
        try:
            self.network.create()
        finally:
            self.write_manifest()
        self.network.enter_hub()
        self.cluster.prepare()
        self.write_manifest()

    def teardown(self) -> list[str]:
        problems: list[str] = []
        self.cluster.kill_all()
        if self.o.keep_data:
            for b in self.cluster.brokers():
                if b.mounted:
                    target = self.o.work_dir / f"{b.name}-data"
                    shutil.copytree(b.data_dir, target, dirs_exist_ok=True,
                                    ignore=shutil.ignore_patterns("chaos-disk-fill"))
        problems += self.cluster.unmount_all()
        problems += self.network.destroy()
        self.write_manifest()
        return problems


class Interrupted(Exception):
    """SIGINT or SIGTERM stopped the run (teardown still ran)."""


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


async def drive_until_signalled(run: "Run", deadline_s: float) -> History:
    """The run, cancelled by SIGINT or SIGTERM. Raised from a plain signal handler, the
    interrupt landed in whichever task ran at that moment: a producer's sender took it for its
    own failure, and the run went on."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    got: list[int] = []

    def stop(signum: int) -> None:
        got.append(signum)
        task.cancel()

    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop, sig)
    try:
        return await asyncio.wait_for(run.drive(), deadline_s)
    except asyncio.CancelledError:
        if got:
            raise Interrupted(f"signal {got[0]}") from None
        raise


def execute(options: RunOptions, deadline_s: float) -> tuple[History | None, Report | None, list[str]]:
    """Run once, bounded by deadline_s; teardown always. Returns history, report, problems."""
    run = Run(options)
    history: History | None = None
    problems: list[str] = []
    handlers = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    try:
        run.setup()
        history = asyncio.run(drive_until_signalled(run, deadline_s))
    except asyncio.TimeoutError:
        problems.append(f"the run did not finish within its bound of {deadline_s:.0f} s")
    finally:
        # Teardown runs to its end: a second Ctrl-C would leave mounts and namespaces behind.
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        try:
            problems += run.teardown()
        finally:
            for sig, handler in handlers.items():  # a closed loop leaves the default ones behind
                signal.signal(sig, handler)
            gc.unfreeze()   # a run that failed midway left its heap frozen (tests/chaos/loopwatch.py)
    if history is None:
        return None, None, problems
    history.dump(str(options.work_dir / "history.json"))
    return history, check(history), problems
