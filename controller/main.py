"""`biplane controller`: run one controller node of the quorum.

    biplane controller --node-id 1 --data-dir /var/lib/biplane/c1 \\
        --cluster "1=10.0.0.1:7001,10.0.0.1:8001,3;2=10.0.0.2:7001,10.0.0.2:8001,2;3=..." \\
        --cluster-secret ... --admin-token ...

`--cluster` lists every node as ID=RAFT_HOST:PORT,API_HOST:PORT[,PRIORITY]; a
single node may instead give --raft-address and --api-address. The node
restores its metadata from the dump and journal in --data-dir.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import signal
import sys

from aiohttp import web

from common.eventloop import LoopWatchdog
from common.logs import configure_logging
from common.metadata.config import PARTITIONS_MAX
from controller.decisions.limits import MAX_PARTITIONS_PER_BROKER, MAX_PARTITIONS_PER_TOPIC, PartitionLimits
from controller.guardrails import (
    BODY_BYTES_MAX_DEFAULT,
    JSON_DEPTH_MAX_DEFAULT,
    WRITE_BURST_DEFAULT,
    WRITE_RATE_PER_S_DEFAULT,
    ApiLimits,
)
from common.metrics import MetricsServer
from controller.service import ControllerNode


class UsageError(ValueError):
    pass


def parse_host_port(text: str, what: str) -> tuple[str, int]:
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"{what} {text!r} is not HOST:PORT")
    return host, int(port)


def parse_cluster(spec: str) -> list[ControllerNode]:
    nodes = []
    for part in filter(None, (p.strip() for p in spec.split(";"))):
        ident, sep, rest = part.partition("=")
        fields = [f.strip() for f in rest.split(",")]
        if not sep or not ident.strip().isdigit() or len(fields) not in (2, 3):
            raise UsageError(f"--cluster entry {part!r} is not ID=RAFT_HOST:PORT,API_HOST:PORT[,PRIORITY]")
        raft_host, raft_port = parse_host_port(fields[0], "raft address")
        api = fields[1] if "://" in fields[1] else "http://" + fields[1]
        parse_host_port(api.split("://", 1)[1], "api address")
        priority = int(fields[2]) if len(fields) == 3 and fields[2].lstrip("-").isdigit() else 1
        if len(fields) == 3 and not fields[2].lstrip("-").isdigit():
            raise UsageError(f"priority {fields[2]!r} in --cluster entry {part!r} is not an integer")
        nodes.append(ControllerNode(node_id=int(ident), raft_address=f"{raft_host}:{raft_port}",
                                    api_url=api.rstrip("/"), priority=priority))
    ids = [n.node_id for n in nodes]
    if len(set(ids)) != len(ids):
        raise UsageError(f"--cluster lists a node id twice: {ids}")
    if len(nodes) not in (1, 3, 5):
        raise UsageError(f"a controller quorum has 1, 3 or 5 nodes; --cluster lists {len(nodes)}")
    return nodes


def build_parser(prog: str) -> argparse.ArgumentParser:
    env = os.environ.get
    p = argparse.ArgumentParser(prog=prog, description="Run one controller node of the Biplane quorum.")
    p.add_argument("--node-id", type=int, required=True, help="this node's id (in --cluster)")
    p.add_argument("--cluster", help="every node: ID=RAFT_HOST:PORT,API_HOST:PORT[,PRIORITY];...")
    p.add_argument("--raft-address", help="HOST:PORT for Raft (single node, or override)")
    p.add_argument("--api-address", help="HOST:PORT for the admin API and broker RPC")
    p.add_argument("--peers", default="", help="other nodes' Raft addresses, comma-separated "
                   "(without --cluster; followers then cannot redirect to the leader's API)")
    p.add_argument("--priority", type=int, help="this node's priority (higher leads; default from --cluster or 1)")
    p.add_argument("--data-dir", required=True, help="journal, dump and snapshots live here")
    p.add_argument("--cluster-secret", default=env("BIPLANE_CLUSTER_SECRET"),
                   help="shared secret of the quorum and its brokers (env BIPLANE_CLUSTER_SECRET); "
                        "required with more than one node")
    p.add_argument("--admin-token", default=env("BIPLANE_ADMIN_TOKEN"),
                   help="bearer token of the admin API (env BIPLANE_ADMIN_TOKEN)")
    p.add_argument("--session-timeout-ms", type=int, default=1500)
    p.add_argument("--election-timeout-ms-min", type=int, default=1000)
    p.add_argument("--election-timeout-ms-max", type=int, default=1600)
    p.add_argument("--raft-heartbeat-ms", type=int, default=100)
    p.add_argument("--journal-sync", choices=("fsync", "none"), default="fsync",
                   help="fsync: flush the journal before acknowledging entries (survives machine loss "
                        "of a minority); none: page cache only (survives kill -9)")
    p.add_argument("--metadata-window-records", type=int, default=20_000,
                   help="recent records kept for brokers' fetches; further behind gets the whole image")
    p.add_argument("--rebalance-interval-ms", type=int, default=300_000,
                   help="how often every partition's leadership moves back to its preferred replica "
                        "(default 300000)")
    p.add_argument("--leader-imbalance-check-interval-ms", type=int, default=5_000,
                   help="how often the leader-imbalance check runs (Kafka's "
                        "leader.imbalance.check.interval.seconds; default 5000, 0 turns it off)")
    p.add_argument("--leader-imbalance-per-broker-percentage", type=int, default=10,
                   help="a broker that does not lead more than this share of the partitions it "
                        "prefers gets them back at the next check (Kafka's "
                        "leader.imbalance.per.broker.percentage; default 10)")
    limits = p.add_argument_group("guardrails", "limits that keep a script or a fuzzer from overloading "
                                                 "the cluster (README: 'Admin API limits')")
    limits.add_argument("--max-partitions-per-topic", type=int, default=MAX_PARTITIONS_PER_TOPIC,
                        help="a topic may have at most this many partitions, at creation and after "
                             f"adding partitions (default {MAX_PARTITIONS_PER_TOPIC}, at most {PARTITIONS_MAX})")
    limits.add_argument("--max-partitions-per-broker", type=int, default=MAX_PARTITIONS_PER_BROKER,
                        help="the cluster holds at most this many partition replicas per registered broker "
                             f"(default {MAX_PARTITIONS_PER_BROKER}; a topic of 10 partitions with replication "
                             "factor 3 holds 30)")
    limits.add_argument("--admin-write-rate", type=float, default=WRITE_RATE_PER_S_DEFAULT,
                        help="admin API writes refill at this many units a second per token; a write costs "
                             "one unit per partition it creates or deletes, at least one; beyond it the "
                             f"API answers 429 with Retry-After (default {WRITE_RATE_PER_S_DEFAULT:g})")
    limits.add_argument("--admin-write-burst", type=float, default=WRITE_BURST_DEFAULT,
                        help="units a token may spend at once before the rate applies "
                             f"(default {WRITE_BURST_DEFAULT:g})")
    limits.add_argument("--admin-max-body-bytes", type=int, default=BODY_BYTES_MAX_DEFAULT,
                        help=f"largest admin request body; larger is 413 (default {BODY_BYTES_MAX_DEFAULT})")
    limits.add_argument("--admin-max-json-depth", type=int, default=JSON_DEPTH_MAX_DEFAULT,
                        help="deepest nesting of objects and arrays in an admin request body; deeper is 400 "
                             f"(default {JSON_DEPTH_MAX_DEFAULT})")
    p.add_argument("--snapshot-dir", help="default: DATA_DIR/snapshots")
    p.add_argument("--snapshot-interval-ms", type=int, default=60_000)
    p.add_argument("--metrics-port", type=int,
                   help="serve Prometheus /metrics here, without a token, on the API address's host "
                        "(0: a free port; default: only the admin API's GET /metrics, with the token)")
    p.add_argument("--log-level", default="WARNING", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    return p


def resolve_nodes(args: argparse.Namespace) -> tuple[list[ControllerNode], ControllerNode]:
    if args.cluster:
        nodes = parse_cluster(args.cluster)
    else:
        if not args.raft_address or not args.api_address:
            raise UsageError("give --cluster, or --raft-address and --api-address")
        peers = [a.strip() for a in args.peers.split(",") if a.strip()]
        nodes = [ControllerNode(node_id=args.node_id, raft_address=args.raft_address,
                                api_url="http://" + args.api_address, priority=args.priority or 1)]
        for i, addr in enumerate(peers):
            parse_host_port(addr, "peer")
            nodes.append(ControllerNode(node_id=100_000 + i, raft_address=addr, api_url="", priority=1))
    by_id = {n.node_id: n for n in nodes}
    if args.node_id not in by_id:
        raise UsageError(f"--node-id {args.node_id} is not in --cluster {sorted(by_id)}")
    me = by_id[args.node_id]
    if args.raft_address:
        parse_host_port(args.raft_address, "--raft-address")
        me = ControllerNode(node_id=me.node_id, raft_address=args.raft_address, api_url=me.api_url,
                            priority=me.priority)
    if args.api_address:
        parse_host_port(args.api_address, "--api-address")
        me = ControllerNode(node_id=me.node_id, raft_address=me.raft_address,
                            api_url="http://" + args.api_address, priority=me.priority)
    if args.priority is not None:
        me = ControllerNode(node_id=me.node_id, raft_address=me.raft_address, api_url=me.api_url,
                            priority=args.priority)
    nodes = [me if n.node_id == me.node_id else n for n in nodes]
    return nodes, me


# A settings field whose flag is not the field's name with dashes.
_FLAG_OF_FIELD = {"write_rate_per_s": "--admin-write-rate", "write_burst": "--admin-write-burst",
                  "body_bytes_max": "--admin-max-body-bytes", "json_depth_max": "--admin-max-json-depth"}


def _flag_names(message: str) -> str:
    from controller.decisions import LeaderSettings
    fields = [f.name for f in dataclasses.fields(LeaderSettings)] + \
        [f.name for f in dataclasses.fields(PartitionLimits)]
    for name, flag in _FLAG_OF_FIELD.items():
        message = message.replace(name, flag)
    for name in fields:
        message = message.replace(name, "--" + name.replace("_", "-"))
    return message


async def serve(args: argparse.Namespace) -> int:
    from controller.api import make_app
    from controller.decisions import LeaderSettings
    from controller.metrics import ControllerMetrics
    from controller.raft import RaftNode, RaftSettings
    from controller.replicated import MetadataStateMachine
    from controller.service import ControllerService
    from controller.snapshot_service import Snapshotter
    from controller.snapshots import SnapshotStore

    nodes, me = resolve_nodes(args)
    peers = [n for n in nodes if n.node_id != me.node_id]
    if peers and not args.cluster_secret:
        raise UsageError("a quorum of more than one controller needs --cluster-secret "
                         "(or BIPLANE_CLUSTER_SECRET)")
    if not args.admin_token:
        raise UsageError("--admin-token (or BIPLANE_ADMIN_TOKEN) is required")
    if args.metrics_port is not None and not 0 <= args.metrics_port <= 65535:
        raise UsageError(f"--metrics-port {args.metrics_port} is not a port (0 to 65535; 0 picks a free one)")
    settings = RaftSettings(
        self_address=me.raft_address, peer_addresses=tuple(n.raft_address for n in peers),
        data_dir=os.path.join(args.data_dir, "raft"), password=args.cluster_secret,
        priority=me.priority, peer_priorities=tuple((n.raft_address, n.priority) for n in peers),
        election_timeout_ms_min=args.election_timeout_ms_min,
        election_timeout_ms_max=args.election_timeout_ms_max,
        heartbeat_ms=args.raft_heartbeat_ms, journal_sync=args.journal_sync == "fsync")
    settings.validate()

    def raft_factory(*, loop, on_applied, on_reset, on_role_change):
        return RaftNode(settings=settings, state=MetadataStateMachine(), loop=loop,
                        on_applied=on_applied, on_reset=on_reset, on_role_change=on_role_change)

    try:
        leader_settings = LeaderSettings(
            session_timeout_ms=args.session_timeout_ms, rebalance_interval_ms=args.rebalance_interval_ms,
            leader_imbalance_check_interval_ms=args.leader_imbalance_check_interval_ms,
            leader_imbalance_per_broker_percentage=args.leader_imbalance_per_broker_percentage,
            new_leader_grace_ms=settings.leader_fallback_ms_max if peers else 0,
            partition_limits=PartitionLimits(max_partitions_per_topic=args.max_partitions_per_topic,
                                             max_partitions_per_broker=args.max_partitions_per_broker))
        api_limits = ApiLimits(write_rate_per_s=args.admin_write_rate, write_burst=args.admin_write_burst,
                               body_bytes_max=args.admin_max_body_bytes, json_depth_max=args.admin_max_json_depth)
    except ValueError as exc:
        # The settings name their fields; the user typed flags.
        raise UsageError(_flag_names(str(exc))) from None
    service = ControllerService(node_id=me.node_id, nodes=nodes, raft_factory=raft_factory,
                                leader_settings=leader_settings,
                                metadata_window_records=args.metadata_window_records)
    snapshotter = Snapshotter(store=SnapshotStore(args.snapshot_dir or os.path.join(args.data_dir, "snapshots")),
                              image_getter=lambda: service.committed, usage_getter=lambda: service.usage,
                              controller_id=me.node_id, is_leader=lambda: service.is_leader,
                              snapshot_interval_ms=args.snapshot_interval_ms)
    app = make_app(service, admin_token=args.admin_token, cluster_secret=args.cluster_secret, limits=api_limits,
                   snapshotter=lambda: snapshotter)
    app["on_ready"].append(lambda app: snapshotter.start())

    async def stop_snapshots(app: web.Application) -> None:
        await snapshotter.stop()
    app.on_shutdown.append(stop_snapshots)

    host, port = parse_host_port(me.api_url.split("://", 1)[1], "api address")
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True)
    await site.start()
    logging.getLogger("biplane.controller").info(
        "controller %d serving API %s, raft %s, %d peer(s)", me.node_id, me.api_url, me.raft_address, len(peers))
    # A stalled loop answers heartbeats late and decides fencing late: worth a log line.
    watchdog = LoopWatchdog(name=f"controller {me.node_id}")
    watchdog.start()
    metrics: ControllerMetrics = app["metrics"]
    metrics.watch_loop(watchdog.stalls)
    metrics_server = None
    if args.metrics_port is not None:
        try:
            metrics_server = await MetricsServer.start(metrics.exposition, host=host, port=args.metrics_port)
        except OSError as exc:
            await runner.cleanup()
            raise OSError(f"cannot serve metrics on {host}:{args.metrics_port}: {exc}") from None
        logging.getLogger("biplane.controller").info("controller %d serving metrics on %s:%d", me.node_id, host,
                                                     metrics_server.port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    # Hand leadership over while the API still answers: brokers keep heartbeating to the
    # successor, and this node fences nobody it can no longer hear.
    await service.resign()
    watchdog.stop()
    if metrics_server is not None:
        await metrics_server.close()
    await runner.cleanup()
    metrics.exposition.close()
    return 0


def main(argv: list[str], prog: str) -> int:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    configure_logging(args.log_level)
    if args.log_level != "DEBUG":
        logging.getLogger("pysyncobj").setLevel(max(logging.WARNING, getattr(logging, args.log_level)))
    try:
        return asyncio.run(serve(args))
    except UsageError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], "biplane controller"))
