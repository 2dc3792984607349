"""A controller's Prometheus metrics (docs/metrics.md lists every family).

`ControllerMetrics` owns the controller's registry: the admin API's request counts and
latency per route (updated by `middleware`), and `ControllerCollector`, which reads Raft's
state, the committed image and the service's counters when Prometheus scrapes. They are
served on the controller's own metrics port (`--metrics-port`, unauthenticated) and on
the admin API's `GET /metrics` (bearer token).
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Awaitable, Callable, Protocol

from aiohttp import web
from prometheus_client import Counter, Histogram
from prometheus_client.metrics_core import Metric

from common.eventloop import LoopStalls
from common.usage import BrokerUsage
from controller import views
from common.metadata import MetadataImage
from common.metrics import (
    LATENCY_BUCKETS_S, Exposition, Families, LoopStallsSource, PartitionHealth, gauge, labelled_counter,
    labelled_gauge,
)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# Methods counted under their own name; anything else a client sends is "other", so a
# fuzzer cannot grow the label set.
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


class RaftStatusSource(Protocol):
    """What the collector reads of Raft's status (controller.raft.RaftStatus)."""

    @property
    def is_leader(self) -> bool: ...
    @property
    def term(self) -> int: ...
    @property
    def commit_index(self) -> int: ...
    @property
    def last_applied(self) -> int: ...
    @property
    def last_log_index(self) -> int: ...
    @property
    def match_index(self) -> tuple[tuple[str, int], ...]: ...
    @property
    def connected_peers(self) -> tuple[str, ...]: ...


class ControllerSource(Protocol):
    """What the collector reads of the service (controller.service.ControllerService)."""

    @property
    def node_id(self) -> int: ...
    @property
    def is_leader(self) -> bool: ...
    @property
    def committed(self) -> MetadataImage: ...
    @property
    def stats(self) -> dict[str, int]: ...
    @property
    def broker_offsets(self) -> dict[int, int]: ...
    @property
    def broker_opening(self) -> dict[int, int]: ...
    @property
    def usage(self) -> dict[int, BrokerUsage]: ...
    def clock_ms(self) -> int: ...
    def raft_status(self) -> RaftStatusSource | None: ...


class ControllerMetrics:
    def __init__(self, service: ControllerSource) -> None:
        self.exposition = Exposition()
        self.registry = self.exposition.registry
        self._latency = Histogram("biplane_api_request_seconds", "admin API requests, arrival to answer, by route",
                                  ["method", "path"], buckets=LATENCY_BUCKETS_S, registry=self.registry)
        self._requests = Counter("biplane_api_requests", "admin API requests by route and HTTP status",
                                 ["method", "path", "status"], registry=self.registry)
        self.exposition.add(ControllerCollector(service))

    def watch_loop(self, stalls: LoopStalls) -> None:
        """Export the event loop's stalls (biplane_controller_event_loop_*)."""
        self.exposition.add(LoopStallsSource(stalls, prefix="biplane_controller"))

    def observe_request(self, method: str, path: str, status: int, seconds: float) -> None:
        method = method if method in _METHODS else "other"
        self._latency.labels(method, path).observe(seconds)
        self._requests.labels(method, path, str(status)).inc()

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Times every admin API request (the broker RPC under /rpc/ is not the admin API).
        The path label is the route's pattern ("/v1/topics/{name}"), so it stays bounded."""
        if request.path.startswith("/rpc/"):
            return await handler(request)
        started = time.perf_counter()
        status = 500
        try:
            response = await handler(request)
            status = response.status
            return response
        except web.HTTPException as exc:
            status = exc.status
            raise
        finally:
            resource = request.match_info.route.resource
            path = resource.canonical if resource is not None else "unmatched"
            self.observe_request(request.method, path, status, time.perf_counter() - started)


class ControllerCollector:
    """The service's loop-owned state as metric families (common.metrics.LoopSource)."""

    def __init__(self, service: ControllerSource) -> None:
        self.service = service

    def snapshot(self) -> Families:
        s = self.service
        image = s.committed
        brokers = list(image.brokers.values())
        health = PartitionHealth()
        for p in image.partitions():
            topic = image.topics.get(p.topic)
            if topic is not None:
                health.add(replicas=len(p.replicas), isr=len(p.isr), has_leader=p.leader is not None,
                           policy=topic.config)
        scalars = [
            ("biplane_controller_node_id", "this controller's node id", s.node_id),
            ("biplane_controller_is_leader",
             "1 when this controller is the trusted leader (its marker committed in its Raft term)", int(s.is_leader)),
            ("biplane_controller_metadata_offset", "offset of the committed metadata image", image.offset),
            ("biplane_controller_topics", "topics", len(image.topics)),
            ("biplane_controller_partitions", "partitions", health.partitions),
            ("biplane_controller_offline_partitions", "partitions without a leader", health.leaderless),
            ("biplane_controller_under_replicated_partitions", "partitions whose ISR is smaller than their replicas",
             health.under_replicated),
            ("biplane_controller_under_min_isr_partitions", "partitions whose ISR is below min_insync_replicas "
             "(isr topics) or quorum_required_acks (quorum topics)", health.under_min_isr),
        ]
        status = s.raft_status()
        if status is not None:
            scalars += [
                ("biplane_controller_raft_term", "this node's Raft term", status.term),
                ("biplane_controller_raft_leader", "1 while Raft says this node leads (before it is trusted)",
                 int(status.is_leader)),
                ("biplane_controller_raft_commit_index", "Raft commit index on this node", status.commit_index),
                ("biplane_controller_raft_last_applied", "last Raft entry applied on this node", status.last_applied),
                ("biplane_controller_raft_last_log_index", "last Raft entry in this node's log",
                 status.last_log_index),
                ("biplane_controller_raft_connected_peers", "other controllers this node is connected to",
                 len(status.connected_peers)),
            ]
        peer_lag = [([peer], max(0, status.last_log_index - index)) for peer, index in status.match_index] \
            if status is not None else []
        states = [(["fenced"], sum(b.fenced for b in brokers)), (["unfenced"], sum(not b.fenced for b in brokers))]
        metadata_lag = [([str(b)], max(0, image.offset - offset)) for b, offset in sorted(s.broker_offsets.items())]
        opening = [([str(b)], count) for b, count in sorted(s.broker_opening.items())]
        counts = [(key, help_text, s.stats.get(key, 0)) for key, help_text in (
            ("records_committed", "metadata records committed (observed on this node)"),
            ("batches_committed", "Raft commands committed by this node as leader"),
            ("batches_failed", "Raft commands that failed or diverged"),
            ("leader_elections_won", "times this node became the trusted leader"))]
        # Usage reports reach the leader only (a follower's copy is whatever it last led with):
        # group lag comes from the leader. The reports are frozen models, so the dict's copy
        # is all the loop pays; the view is built in the renderer thread.
        usage = dict(s.usage) if s.is_leader else {}
        now_ms = s.clock_ms()

        def families() -> Iterator[Metric]:
            for name, help_text, value in scalars:
                yield gauge(name, help_text, value)
            if status is not None:
                yield labelled_gauge("biplane_controller_raft_follower_lag_entries",
                                     "on the Raft leader: its last log index minus each peer's match index",
                                     ["peer"], peer_lag)
            yield labelled_gauge("biplane_controller_brokers", "registered brokers by state (unfenced: live)",
                                 ["state"], states)
            yield labelled_gauge("biplane_controller_broker_metadata_lag_records",
                                 "committed metadata offset minus the offset each broker's last heartbeat applied",
                                 ["broker"], metadata_lag)
            yield labelled_gauge("biplane_controller_broker_replicas_opening",
                                 "replicas each broker's last heartbeat said were still opening", ["broker"], opening)
            for key, help_text, value in counts:
                yield labelled_counter(f"biplane_controller_{key}", help_text, [], [([], value)])
            groups = views.group_list(image, usage, now_ms=now_ms).groups
            yield labelled_gauge("biplane_group_lag_records",
                                 "on the controller leader: each group's lag per partition, the partition "
                                 "leader's reported high watermark minus the coordinator's reported committed "
                                 "offset (GET /v1/groups has the same)", ["group", "topic", "partition"],
                                 (([g.group, p.topic, str(p.partition)], p.lag_records) for g in groups
                                  for p in g.partitions if p.lag_records is not None))
        return families
