"""`biplane broker`: run one data-plane broker until SIGTERM or SIGINT (a clean stop)."""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys

from pydantic import ValidationError

from common import eventloop, fds, heap
from common.durable import write_atomically
from common.errors import StorageError
from common.logs import configure_logging
from dataplane.broker.broker import Broker
from dataplane.broker.config import BrokerConfig


def build_parser(prog: str) -> argparse.ArgumentParser:
    env = os.environ.get
    p = argparse.ArgumentParser(prog=prog, description="Run a Biplane data-plane broker.",
                                usage=f"{prog} --broker-id N --data-dir DIR [options]   (run a broker)\n"
                                      f"       {prog} maintenance|decommission|recommission|operations ...   "
                                      "(operate on a running one)",
                                epilog="To operate on a running broker: `biplane broker maintenance|decommission|"
                                       "recommission|operations ... --help`.")
    p.add_argument("--broker-id", type=int, required=True)
    p.add_argument("--data-dir", required=True, help="partition logs, metadata and the clean-shutdown marker")
    p.add_argument("--controller", action="append", default=[],
                   help="controller API URL (repeat or comma-separate; any one of the quorum will do)")
    p.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=0, help="listen port (0: a free one, reported)")
    p.add_argument("--advertised-host", help="address clients and peers are told (default --host)")
    p.add_argument("--metrics-port", type=int, help="serve /metrics here (0: a free port)")
    p.add_argument("--kafka-port", type=int,
                   help="serve the Kafka API here, for Kafka clients (0: a free port; default: not served)")
    p.add_argument("--auto-create-topics", action="store_true",
                   help="create a topic a Kafka client asks metadata for when it does not exist, with "
                        "--default-partitions and --default-replication-factor (Kafka's "
                        "auto.create.topics.enable; default: off)")
    p.add_argument("--default-partitions", type=int, default=1,
                   help="partitions of a topic a Kafka client leaves to the broker (CreateTopics with -1, "
                        "auto-creation; Kafka's num.partitions; default 1)")
    p.add_argument("--default-replication-factor", type=int,
                   help="replication factor of a topic a Kafka client leaves to the broker "
                        "(default: 3, or the number of live brokers if fewer)")
    p.add_argument("--cluster-secret", default=env("BIPLANE_CLUSTER_SECRET"))
    p.add_argument("--rack")
    p.add_argument("--priority", type=int, default=0)
    p.add_argument("--heartbeat-interval-ms", type=int, default=150)
    p.add_argument("--fetch-wait-ms-max", type=int, default=500)
    p.add_argument("--peer-unreachable-ms", type=int, default=1500,
                   help="report a replication link silent this long to the controller (default 1500)")
    p.add_argument("--replica-request-timeout-ms", type=int, default=2000,
                   help="reopen a replication connection whose request went unanswered this long (a fetch: "
                        "beyond its long-poll wait; default 2000; Kafka's replica.socket.timeout.ms)")
    p.add_argument("--metadata-lag-records-max", type=int, default=100,
                   help="warn (metadata.lagging) when this many metadata records are unapplied for "
                        "--metadata-lag-ms-max (default 100)")
    p.add_argument("--metadata-lag-ms-max", type=int, default=5000, help="default 5000")
    p.add_argument("--metadata-stuck-ms-max", type=int, default=10000,
                   help="warn when any metadata record stays unapplied this long (default 10000)")
    p.add_argument("--max-frame-bytes", type=int, default=64 * 1024 * 1024)
    p.add_argument("--flush-debounce-ms", type=int, default=0,
                   help="sleep before each fsync run; 0 (default): group commit only")
    p.add_argument("--unreplicated-bytes-max", type=int, default=64 * 1024 * 1024,
                   help="produce bytes this broker's leaders may hold before their followers have them "
                        "(sum over partitions; beyond it produce requests wait; default 64 MiB)")
    p.add_argument("--retention-check-interval-ms", type=int, default=60_000,
                   help="how often segments past their topic's retention are deleted (default 60000)")
    p.add_argument("--log-cleaner-interval-ms", type=int, default=15_000,
                   help="how often compacted topics' partitions are offered to the cleaner (default 15000)")
    p.add_argument("--log-cleaner-io-bytes-per-second", type=int, default=32 * 1024 * 1024,
                   help="bytes a second the cleaner may read and write together (default 32 MiB)")
    p.add_argument("--group-offsets-partitions", type=int, default=16,
                   help="partitions of the consumer groups' offsets topic (__consumer_offsets) when this broker "
                        "creates it; fixed afterwards (Kafka's offsets.topic.num.partitions; default 16)")
    p.add_argument("--group-offsets-replication-factor", type=int,
                   help="its replication factor (default: 3, or the number of live brokers if fewer)")
    p.add_argument("--group-initial-rebalance-delay-ms", type=int, default=3000,
                   help="how long a new group waits for more members before its first rebalance "
                        "(Kafka's group.initial.rebalance.delay.ms; default 3000)")
    p.add_argument("--group-min-session-timeout-ms", type=int, default=6000,
                   help="the shortest session timeout a group member may ask for (default 6000)")
    p.add_argument("--group-max-session-timeout-ms", type=int, default=1_800_000,
                   help="the longest session timeout a group member may ask for (default 1800000)")
    p.add_argument("--offsets-retention-minutes", type=int, default=7 * 24 * 60,
                   help="how long an empty group's committed offsets are kept (default 7 days)")
    p.add_argument("--ports-file", help="write {\"port\", \"metrics_port\", \"kafka_port\", \"pid\"} as JSON here once listening")
    p.add_argument("--log-level", default="WARNING", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    return p


def config_from_args(args: argparse.Namespace) -> BrokerConfig:
    urls = tuple(u.strip() for arg in args.controller for u in arg.split(",") if u.strip())
    return BrokerConfig(broker_id=args.broker_id, data_dir=args.data_dir, controller_urls=urls, host=args.host,
                        port=args.port, advertised_host=args.advertised_host, metrics_port=args.metrics_port,
                        kafka_port=args.kafka_port, auto_create_topics=args.auto_create_topics,
                        default_partitions=args.default_partitions,
                        default_replication_factor=args.default_replication_factor,
                        cluster_secret=args.cluster_secret, rack=args.rack, priority=args.priority,
                        heartbeat_interval_ms=args.heartbeat_interval_ms, fetch_wait_ms_max=args.fetch_wait_ms_max,
                        peer_unreachable_ms=args.peer_unreachable_ms,
                        replica_request_timeout_ms=args.replica_request_timeout_ms,
                        metadata_lag_records_max=args.metadata_lag_records_max,
                        metadata_lag_ms_max=args.metadata_lag_ms_max,
                        metadata_stuck_ms_max=args.metadata_stuck_ms_max,
                        max_frame_bytes=args.max_frame_bytes, flush_debounce_ms=args.flush_debounce_ms,
                        unreplicated_bytes_max=args.unreplicated_bytes_max,
                        retention_check_interval_ms=args.retention_check_interval_ms,
                        log_cleaner_interval_ms=args.log_cleaner_interval_ms,
                        log_cleaner_io_bytes_per_second=args.log_cleaner_io_bytes_per_second,
                        group_offsets_partitions=args.group_offsets_partitions,
                        group_offsets_replication_factor=args.group_offsets_replication_factor,
                        group_initial_rebalance_delay_ms=args.group_initial_rebalance_delay_ms,
                        group_min_session_timeout_ms=args.group_min_session_timeout_ms,
                        group_max_session_timeout_ms=args.group_max_session_timeout_ms,
                        offsets_retention_minutes=args.offsets_retention_minutes)


async def serve(config: BrokerConfig, ports_file: str | None) -> int:
    broker = Broker(config, heap=heap.LongLivedFreezer())
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, broker.request_stop)
    try:
        await broker.start()
        heap.freeze_startup_objects()
        if ports_file:
            ports = {"port": broker.port, "metrics_port": broker.metrics_port, "kafka_port": broker.kafka_port,
                     "pid": os.getpid()}
            write_atomically(ports_file, json.dumps(ports).encode())
        print(f"broker {config.broker_id} listening on {config.host}:{broker.port}"
              + (f" (Kafka API on port {broker.kafka_port})" if broker.kafka_port else ""), flush=True)
        await broker.wait_stopped()
    finally:
        await broker.stop()
    return 0


def main(argv: list[str], prog: str) -> int:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    configure_logging(args.log_level)
    try:
        config = config_from_args(args)
    except ValidationError as exc:
        print(f"{prog}: invalid configuration:\n{exc}", file=sys.stderr)
        return 2
    heap.keep_freed_memory()  # frames and batches recycle freed memory instead of faulting in new pages
    fds.raise_soft_limit()    # two files per replica: thousands of partitions need thousands
    try:
        return eventloop.run(serve(config, args.ports_file))
    except StorageError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], "biplane broker"))
