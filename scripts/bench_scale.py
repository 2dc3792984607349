#!/usr/bin/env python3
"""Scale with partitions: the controller's admin API at many partitions, then 3 brokers (RF 3) at each
size: how long opening takes, whether metadata keeps flowing meanwhile, and what the brokers cost idle.

Controller (`--controller-partitions`, 0 skips it): first the leader's periodic pass (run every 75 ms)
timed in process at that many partitions with nothing to act on; then 1 controller, 3 registered
brokers that only heartbeat; topics of 100 partitions created one by one over the admin API, printing
the first and last topics' create times (a create that scanned every partition grows with the count),
then describe of each topic and the topic list at the end.

Brokers, for each of `--partitions` (comma-separated sizes, 0 skips):

Starts 1 controller and 3 broker processes on loopback (tests/cluster_harness.py), creates
`--partitions` partitions (topics of `--per-topic` partitions each, RF 3; the controller's
per-broker guardrail raised to fit), and prints:
1. opening: seconds from the first CreateTopics until every broker has opened all its replicas
   (the controller's broker list: the broker's heartbeat names an applied metadata offset past the
   last create and no replica still opening, twice in a row; checked at the end against
   `biplane_broker_partitions` on /metrics), then until no partition is under-replicated (every replica in the ISR, the
   admin API's health); each broker's CPU seconds over that time, and the fetches it refused
   because the partition was still opening there (`LEADER_NOT_AVAILABLE` on /metrics: a
   follower's ask, which then waits in its fetch session until the leader serves it); every
   10 s meanwhile, each broker's replicas still opening and CPU seconds (whether opening slows as
   replicas pile up); and, first, what creating a replica's directory and files costs on the
   disk under the cluster right then (it moves by 50x with the files deleted shortly before);
2. metadata lag while opening: right after the last create, one more topic (`late`, 1 partition)
   is created; seconds until every broker has applied the controller's offset of that moment
   (`biplane_broker_metadata_offset`) and until the new partition's leader answers list-offsets;
3. idle CPU: once all replicas are open and in the ISR, no traffic, each broker's (and the
   controller's) user+system CPU over `--idle-seconds` from /proc/PID/stat, as % of one core.
4. steady load: acks=all p50/p99 of one producer sending one 100-byte record per request at
   `--steady-rate` requests a second for `--steady-seconds` to a new 1-partition topic (RF 3)
   beside the idle partitions, and its ratio to the same load on an empty cluster (measured
   first, in this run).

Brokers log at WARNING, as `biplane up` runs them (at INFO every replica opened is a line).

    .venv/bin/python scripts/bench_scale.py [--partitions 1000,5000,10000] [--per-topic 100] [--idle-seconds 10]
        [--controller-partitions 10000] [--mode pull|push] [--steady-seconds 10] [--steady-rate 200]

"""
from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import os
import re
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from cluster_harness import SECRET, Cluster, _list_offsets_code, _run_sync, make_batch, produce  # noqa: E402
from common import fds  # noqa: E402
from common.wire import WireClient  # noqa: E402
from controller_harness import Controller, http, make_specs, register_and_unfence, wait_leader  # noqa: E402
from metrics_scrape import scrape as metrics_scrape  # noqa: E402

# The level `biplane up` runs brokers at: the figures are a user's cluster's, not a test's.
BROKER_ARGS = ["--log-level", "WARNING"]
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (fields 14 and 15 of /proc/PID/stat)."""
    return sum(cpu_split(pid))


def cpu_split(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a process so far: the system part is the kernel's work
    for it (file creation, fsync, thread hand-offs)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) / CLOCK_TICKS, int(fields[12]) / CLOCK_TICKS


def box_ticks() -> tuple[int, int, int]:
    """The machine's (busy, stolen, all) CPU ticks so far, from /proc/stat's first line: the
    hypervisor's steal says how much of the box another tenant took, which moves these figures
    from run to run more than most changes do."""
    with open("/proc/stat") as f:
        user, nice, system, idle, iowait, irq, softirq, steal = (int(v) for v in f.readline().split()[1:9])
    return user + nice + system + irq + softirq, steal, user + nice + system + idle + iowait + irq + softirq + steal


def scrape(port: int, name: str) -> float | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as resp:
            text = resp.read().decode()
    except OSError:
        return None
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(match.group(1)) if match else None


def session_fetches(cluster: Cluster, leader: int) -> dict[str, float]:
    """The followers' session fetches to `leader` so far, summed: full, incremental, and the
    partitions they carried."""
    totals = {"full": 0.0, "incremental": 0.0, "partitions": 0.0}
    for b, broker in cluster.brokers.items():
        if b == leader:
            continue
        s = metrics_scrape(broker.metrics_port)
        for kind in ("full", "incremental"):
            totals[kind] += s.value("biplane_broker_fetch_session_requests_total", kind=kind, leader=str(leader))
        totals["partitions"] += s.value("biplane_broker_fetch_session_partitions_sent_total", leader=str(leader))
    return totals


def fetch_traffic(cluster: Cluster) -> dict[int, tuple[float, float, float]]:
    """Per broker so far: (fetches it answered, session fetches it sent, partitions those carried)."""
    traffic = {}
    for b, broker in cluster.brokers.items():
        s = metrics_scrape(broker.metrics_port)
        traffic[b] = (s.value("biplane_broker_requests_total", request="FetchRequest"),
                      s.value("biplane_broker_fetch_session_requests_total"),
                      s.value("biplane_broker_fetch_session_partitions_sent_total"))
    return traffic


def loop_lags(cluster: Cluster) -> dict[int, tuple[float, float]]:
    """Per broker: (the event-loop watchdog's samples so far, those that ran over 5 ms late)."""
    lags = {}
    for b, broker in cluster.brokers.items():
        s = metrics_scrape(broker.metrics_port)
        total = s.value("biplane_broker_event_loop_lag_seconds_count")
        within = s.value("biplane_broker_event_loop_lag_seconds_bucket", le="0.005")
        lags[b] = (total, total - within)
    return lags


def controller_offset(cluster: Cluster) -> int:
    r = http("GET", cluster.api_url + "/rpc/v1/metadata?after_offset=-1&max_wait_ms=0", token=None, secret=SECRET)
    return int(r.body["offset"])


def brokers_opened(cluster: Cluster, offset: int) -> set[int]:
    """The brokers whose last heartbeat said they applied metadata at `offset` or past it and
    have no replica still opening (the controller's broker list: one cheap read for all three)."""
    r = http("GET", cluster.api_url + "/v1/brokers")
    if r.status != 200:
        return set()
    return {b["broker_id"] for b in r.body["brokers"]
            if (b.get("metadata_offset") or -1) >= offset and b.get("replicas_opening") == 0}


class OpeningTimeline:
    """Every broker's replicas still opening and CPU seconds, every `every_s` while they open:
    whether opening slows as replicas pile up (a cost per replica that grows with the count
    shows as a falling rate), or goes at one pace throughout."""

    def __init__(self, cluster: Cluster, start: float, every_s: float = 10.0) -> None:
        self.cluster, self.start, self.every_s = cluster, start, every_s
        self.rows: list[tuple[float, dict[int, int | None], dict[int, float]]] = []
        self._next = start

    def sample(self) -> None:
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + self.every_s
        try:   # a figure on the side: a broker or controller not answering leaves a gap, not an end
            r = http("GET", self.cluster.api_url + "/v1/brokers")
            opening = {b["broker_id"]: b.get("replicas_opening") for b in r.body["brokers"]} if r.status == 200 else {}
            cpu = {b: cpu_seconds(broker.pid) for b, broker in self.cluster.brokers.items() if broker.pid}
        except (OSError, KeyError, TypeError):
            return
        self.rows.append((now - self.start, opening, cpu))

    def print(self) -> None:
        print("opening timeline (s after the first create: replicas still opening, CPU seconds, per broker):")
        for at, opening, cpu in self.rows:
            print(f"  {at:5.1f} s: " + ", ".join(
                f"broker {b} {'?' if opening.get(b) is None else opening[b]} opening, {cpu.get(b, float('nan')):.1f} CPU s"
                for b in sorted(cpu)))


def file_creation_cost_ms(under: Path, replicas: int = 300) -> float:
    """CPU (mostly the kernel's) to create what a new replica's directory holds: the directory
    and three files (log segment, topic id, epoch checkpoint). On this box's disk (ext4, no
    journal) it ranged from about 0.07 to 3 ms from one minute to the next, with how many files
    had been deleted shortly before: at 10,000 replicas per broker that is 1 to 30 CPU seconds
    of the opening figures, which is why they move so much between runs. Measured in the
    cluster's own directory (removed with it) before its topics are created; it deletes
    nothing, which would slow the creations that follow."""
    root = Path(tempfile.mkdtemp(dir=under, prefix="fs-probe-"))
    before = resource.getrusage(resource.RUSAGE_SELF)
    for i in range(replicas):
        directory = root / f"p-{i}"
        directory.mkdir()
        for name in ("00000000000000000000.log", "topic_id", "leader-epoch-checkpoint"):
            os.close(os.open(directory / name, os.O_RDWR | os.O_CREAT, 0o644))
    after = resource.getrusage(resource.RUSAGE_SELF)
    used = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return 1000 * used / replicas


def steady_load(cluster: Cluster, seconds: float, rate: float) -> tuple[float, float, int]:
    """A small steady load: one producer, one record of 100 bytes per request, acks=all, at
    `rate` requests a second for `seconds`, to the one partition of a topic `steady` (RF 3)
    made for it. (p50 ms, p99 ms, requests) of the requests' round trips; prints the followers'
    session fetches to its leader meanwhile (a full one carries every partition followed there)."""
    cluster.create_topic("steady", partitions=1, replication_factor=3)
    leader = cluster.wait_leader("steady", 0)
    sessions_before = session_fetches(cluster, leader)
    lags_before = loop_lags(cluster)

    async def run() -> list[float]:
        took: list[float] = []
        async with await WireClient.connect(*cluster.address(leader)) as client:
            for _ in range(20):   # warm-up, not counted
                await produce(client, "steady", 0, make_batch([b"w" * 100]), acks=-1)
            start = time.monotonic()
            n = 0
            while time.monotonic() - start < seconds:
                due = start + n / rate
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                t = time.perf_counter()
                answer = await produce(client, "steady", 0, make_batch([b"s" * 100]), acks=-1)
                took.append(time.perf_counter() - t)
                assert answer.error_code == 0, answer
                n += 1
        return took

    took = sorted(asyncio.run(run()))
    sessions = {k: v - sessions_before[k] for k, v in session_fetches(cluster, leader).items()}
    lags = {b: (n - lags_before[b][0], late - lags_before[b][1]) for b, (n, late) in loop_lags(cluster).items()}
    print(f"  followers' session fetches to broker {leader} during the load ({len(took) + 20} requests): "
          f"{sessions['full']:.0f} full, {sessions['incremental']:.0f} incremental, "
          f"{sessions['partitions']:.0f} partitions carried")

    def at(q: float) -> float:
        return took[min(int(len(took) * q), len(took) - 1)] * 1000
    p50 = statistics.median(took) * 1000
    # The tail's shape, and whether the brokers' loops were late meanwhile (the watchdog's
    # samples every 20 ms that ran over 5 ms late): a tail with no late loop lies elsewhere.
    print(f"  latency ms: p90 {at(0.9):.2f}, p99 {at(0.99):.2f}, p99.9 {at(0.999):.2f}, max {took[-1] * 1000:.2f}; "
          f"over 2x p50: {sum(t * 1000 > 2 * p50 for t in took)}; loop samples over 5 ms late: "
          + ", ".join(f"broker {b} {late:.0f} of {n:.0f}" for b, (n, late) in sorted(lags.items())))
    return statistics.median(took) * 1000, took[int(len(took) * 0.99)] * 1000, len(took)


def controller_pass(partitions: int) -> None:
    """The controller leader's periodic pass (every 75 ms) in process, at `partitions`
    (RF 3, 3 brokers, nothing to act on): median and worst of 40 passes."""
    from common.metadata import MetadataImage
    from common.requests import CreateTopicRequest, HeartbeatRequest, RegisterBrokerRequest
    from controller import core
    from controller.decisions import create_topic
    from controller.decisions.limits import PartitionLimits

    c = core.ControllerCore()
    image = MetadataImage()

    def step(event: core.Event) -> None:
        for r in c.step(image, event).records:
            image.apply(r, image.offset + 1)

    def heartbeats(now_ms: int) -> None:
        for b in (1, 2, 3):
            step(core.Heartbeat(request=HeartbeatRequest(broker_id=b, incarnation_id=f"i{b}",
                                                         metadata_offset=image.offset), now_ms=now_ms))
    for b in (1, 2, 3):
        step(core.RegisterBroker(request=RegisterBrokerRequest(broker_id=b, incarnation_id=f"i{b}", host="h",
                                                               port=9000 + b), now_ms=0))
    heartbeats(10)
    step(core.Tick(now_ms=20))
    limits = PartitionLimits(max_partitions_per_broker=partitions + 100)
    for t in range(partitions // 100):
        assignment = [[(i + k) % 3 + 1 for k in range(3)] for i in range(100)]
        for r in create_topic(image, CreateTopicRequest(name=f"t{t}", replica_assignment=assignment), 30, limits):
            image.apply(r, image.offset + 1)
    took = []
    for i in range(40):
        now = 100 + 75 * i
        heartbeats(now - 5)   # every broker heartbeats: nothing to fence
        started = time.perf_counter()
        records = c.step(image, core.Tick(now_ms=now)).records
        took.append(time.perf_counter() - started)
        assert not records, f"the pass acted: {records[:3]}"
    print(f"controller periodic pass at {partitions} partitions (in process, nothing to act on): "
          f"median {statistics.median(took) * 1000:.2f} ms, worst {max(took) * 1000:.2f} ms")


def controller_scale(partitions: int) -> None:
    controller_pass(partitions)
    spec = make_specs(1)
    with tempfile.TemporaryDirectory(prefix="bench-scale-controller-") as tmp:
        controller = Controller(spec[0], spec, Path(tmp), [
            "--session-timeout-ms", "600000", "--admin-write-rate", "1e9", "--admin-write-burst", "1e9",
            "--max-partitions-per-broker", str(partitions + 100)])
        try:
            controller.start()
            wait_leader([controller], 30)
            url = spec[0].api_url
            for b in (1, 2, 3):
                register_and_unfence(url, b, secret=SECRET)
            times = []
            for i in range(partitions // 100):
                t = time.monotonic()
                r = http("POST", url + "/v1/topics", {"name": f"t{i}", "partitions": 100, "replication_factor": 3})
                assert r.status == 201, r.body
                times.append(time.monotonic() - t)
            described = time.monotonic()
            for i in range(len(times)):
                assert http("GET", url + f"/v1/topics/t{i}").status == 200
            describe_s = (time.monotonic() - described) / max(1, len(times))
            listed = time.monotonic()
            r = http("GET", url + "/v1/topics")
            list_s = time.monotonic() - listed
            assert r.status == 200, r.body
            print(f"controller, {partitions} partitions in {len(times)} topics of 100 (RF 3, admin API):\n"
                  f"  create: first topic {times[0] * 1000:.0f} ms, last {times[-1] * 1000:.0f} ms, "
                  f"median {sorted(times)[len(times) // 2] * 1000:.0f} ms, all {sum(times):.1f} s\n"
                  f"  describe one topic (mean of {len(times)}): {describe_s * 1000:.0f} ms; "
                  f"list topics: {list_s * 1000:.0f} ms")
        finally:
            controller.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--partitions", default="1000", help="comma-separated sizes for the broker part")
    parser.add_argument("--controller-partitions", type=int, default=10000)
    parser.add_argument("--per-topic", type=int, default=100)
    parser.add_argument("--mode", choices=("pull", "push"), default="pull",
                        help="the topics' replication_mode (push: idle cost of push heartbeats)")
    parser.add_argument("--idle-seconds", type=float, default=10.0)
    parser.add_argument("--steady-seconds", type=float, default=10.0,
                        help="the steady acks=all load beside the idle partitions (0: skip it)")
    parser.add_argument("--steady-rate", type=float, default=200.0, help="its requests a second")
    parser.add_argument("--open-timeout", type=float, default=900.0, help="give up on opening after this long")
    args = parser.parse_args()
    # Each replica holds two files: 10,000 partitions (RF 3 on 3 brokers) need over 20,000 per
    # broker. Brokers raise their soft limit to the hard one; as root, lift the hard one too
    # (the brokers inherit it), else say how far it goes.
    most = max(int(x) for x in args.partitions.split(",") if x.strip())
    wanted = fds.FDS_PER_REPLICA * most + 10_000
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, wanted))
        except (ValueError, OSError):
            print(f"open-file limit {hard} (hard) is below the {wanted} that {most} partitions need per broker; "
                  f"raise it (`ulimit -n`, as root) or expect replicas that cannot open", file=sys.stderr)
    if args.controller_partitions:
        controller_scale(args.controller_partitions)
    args.steady_baseline = None
    if args.steady_seconds > 0:
        with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp, Cluster(Path(tmp), brokers=3, broker_args=BROKER_ARGS) as cluster:
            p50, p99, n = steady_load(cluster, args.steady_seconds, args.steady_rate)
        args.steady_baseline = (p50, p99)
        print(f"steady acks=all load on an empty cluster (3 brokers, 1 partition, RF 3; {n} requests at "
              f"{args.steady_rate:.0f}/s): p50 {p50:.2f} ms, p99 {p99:.2f} ms")
    for size in (int(x) for x in args.partitions.split(",") if x.strip()):
        if size:
            brokers_scale(args, size)


def brokers_scale(args: argparse.Namespace, partitions: int) -> None:
    args.partitions = partitions
    replicas_per_broker = args.partitions  # RF 3 on 3 brokers: every broker holds every partition
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp, Cluster(
            Path(tmp), brokers=3, broker_args=BROKER_ARGS, controller_args=["--max-partitions-per-broker", str(replicas_per_broker + 100),
                                                   # creates go as fast as the controller takes them
                                                   "--admin-write-rate", "1e9", "--admin-write-burst", "1e9"]
    ) as cluster:
        brokers = sorted(cluster.brokers)
        ports = {b: cluster.brokers[b].metrics_port for b in brokers}
        print(f"the disk under {tmp}: a replica's directory and its three files cost "
              f"{file_creation_cost_ms(Path(tmp)):.2f} ms of CPU to create before the creates (each broker "
              "creates that per replica)")
        cpu_at_start = {b: cpu_split(cluster.brokers[b].pid) for b in brokers}
        controller_cpu_at_start = cpu_seconds(cluster.controllers[0].pid or 0) if cluster.controllers[0].pid else 0.0
        box_at_start = box_ticks()
        start = time.monotonic()
        created = 0
        topic = 0
        while created < args.partitions:
            count = min(args.per_topic, args.partitions - created)
            cluster.create_topic(f"t{topic}", partitions=count, replication_factor=3, wait=False,
                                 config={"replication_mode": args.mode})
            created += count
            topic += 1
        created_s = time.monotonic() - start
        print(f"partitions {args.partitions} in {topic} topics, RF 3, 3 brokers, {args.mode} replication; "
              f"controller committed them in {created_s:.1f} s")

        # 2. A topic created behind them all.
        cluster.create_topic("late", partitions=1, replication_factor=3, wait=False)
        late_at = time.monotonic()
        target = controller_offset(cluster)
        applied_s: dict[int, float] = {}
        produceable_s: float | None = None
        opened_s: dict[int, float] = {}
        deadline = late_at + args.open_timeout
        opened_once: dict[int, float] = {}   # seen opened by one poll; opened_s needs the next one too
        polls = 0
        timeline = OpeningTimeline(cluster, start)
        while time.monotonic() < deadline and (len(opened_s) < 3 or len(applied_s) < 3 or produceable_s is None):
            polls += 1
            timeline.sample()
            if produceable_s is None:   # 'late' every 0.1 s: its figure is about a second or two
                leader = cluster.partition("late", 0)["leader"]
                if leader is not None and _run_sync(_list_offsets_code(cluster.address(leader), "late", 0)) == 0:
                    produceable_s = time.monotonic() - late_at
            if polls % 5 and produceable_s is None:
                time.sleep(0.1)
                continue
            now = time.monotonic()
            # A heartbeat can name an applied offset before the walk of that image started the
            # new opens: a broker counts as opened when the next poll says so again.
            seen = brokers_opened(cluster, target) if len(opened_s) < 3 else set()
            for b in brokers:
                if b in seen and b not in opened_s:
                    if b in opened_once:
                        opened_s[b] = opened_once[b]
                    else:
                        opened_once[b] = now - start
                elif b not in seen:
                    opened_once.pop(b, None)
            for b in brokers:
                if b not in applied_s:
                    offset = scrape(ports[b], "biplane_broker_metadata_offset")
                    if offset is not None and offset >= target:
                        applied_s[b] = now - late_at
            time.sleep(0.1 if produceable_s is None else 0.5)
        for b in brokers:
            held = scrape(ports[b], "biplane_broker_partitions")
            print(f"broker {b}: holds {'no answer' if held is None else f'{held:.0f}'} replicas"
                  f" (/metrics; {replicas_per_broker + 1} expected), all open {opened_s.get(b, float('nan')):.1f} s from the first create;"
                  f" applied the offset of 'late' {applied_s.get(b, float('nan')):.1f} s after creating it")
        timeline.print()
        print(f"opening: every replica open {max(opened_s.values(), default=float('nan')):.1f} s after the first "
              f"create{'' if len(opened_s) == 3 else ' (NOT all opened within the timeout)'}")
        print(f"metadata lag: every broker at the controller's offset {max(applied_s.values(), default=float('nan')):.1f} s"
              f" after 'late' was created; 'late' answers list-offsets after "
              f"{produceable_s if produceable_s is not None else float('nan'):.1f} s")

        # Every replica in the ISR; then 3. idle: CPU with no traffic and no scrapes.
        def isr_full() -> bool:
            r = http("GET", cluster.api_url + "/v1/cluster/health")
            return r.status == 200 and not r.body.get("under_replicated_partitions")
        settle_deadline = time.monotonic() + 120
        whole = isr_full()
        while time.monotonic() < settle_deadline and not whole:
            time.sleep(0.5)
            whole = isr_full()
        in_isr_s = time.monotonic() - start
        busy, stolen, every = (now - then for now, then in zip(box_ticks(), box_at_start))
        spent = {b: tuple(now - then for now, then in zip(cpu_split(cluster.brokers[b].pid), cpu_at_start[b]))
                 for b in brokers}
        controller_pid = cluster.controllers[0].pid
        controller_spent = cpu_seconds(controller_pid) - controller_cpu_at_start if controller_pid else float("nan")
        refused = {b: scrape(ports[b], 'biplane_broker_errors_total{code="LEADER_NOT_AVAILABLE",request="FetchRequest"}')
                   for b in brokers}
        # ISR changes of the partitions each broker leads: a follower that opened more than a
        # lag time after its leader left the ISR and had to join it again.
        shrinks = {b: scrape(ports[b], "biplane_broker_isr_shrinks_total") for b in brokers}
        traffic = fetch_traffic(cluster)
        print(f"in the ISR: every replica {in_isr_s:.1f} s after the first create"
              f"{'' if whole else ' (NOT all in the ISR within the timeout)'}; CPU seconds per broker till then: "
              + ", ".join(f"broker {b} {sum(spent[b]):.1f} ({spent[b][1]:.1f} in the kernel)" for b in brokers)
              + f", controller {controller_spent:.1f}; fetches refused as still opening: "
              + ", ".join(f"broker {b} {refused[b] or 0:.0f}" for b in brokers)
              + "; ISR shrinks of led partitions: " + ", ".join(f"broker {b} {shrinks[b] or 0:.0f}" for b in brokers))
        print(f"the machine till then: {100 * busy / max(every, 1):.0f}% busy, {100 * stolen / max(every, 1):.0f}% "
              "stolen by the hypervisor (of both cores' time)")
        print("fetch traffic till then (fetches answered; session fetches sent, partitions they carried): "
              + ", ".join(f"broker {b} {answered:.0f}; {sent:.0f}, {carried:.0f}"
                          for b, (answered, sent, carried) in traffic.items()))
        time.sleep(2)
        pids = {f"broker {b}": cluster.brokers[b].pid for b in brokers}
        pids["controller"] = cluster.controllers[0].pid
        before = {name: cpu_seconds(pid) for name, pid in pids.items() if pid is not None}
        t0 = time.monotonic()
        time.sleep(args.idle_seconds)
        elapsed = time.monotonic() - t0
        usage = {name: 100 * (cpu_seconds(pids[name]) - cpu) / elapsed for name, cpu in before.items()}
        print(f"idle CPU (% of a core over {elapsed:.0f} s): "
              + ", ".join(f"{name} {used:.1f}%" for name, used in usage.items()))
        if args.steady_seconds > 0:
            try:
                p50, p99, n = steady_load(cluster, args.steady_seconds, args.steady_rate)
            except AssertionError as exc:   # the harness's word on a refused create or produce
                print(f"steady load not run: {exc}", file=sys.stderr)
            else:
                empty = args.steady_baseline
                print(f"steady acks=all load beside {args.partitions} idle partitions ({n} requests at "
                      f"{args.steady_rate:.0f}/s): p50 {p50:.2f} ms, p99 {p99:.2f} ms"
                      + (f"; ratio to the empty cluster: p50 {p50 / empty[0]:.2f}x, p99 {p99 / empty[1]:.2f}x"
                         if empty else ""))


if __name__ == "__main__":
    main()
