"""The controller's HTTP admin API in Python, with typed (pydantic) results
(common/api_models.py: the API's JSON, the models the controller answers with).

    async with AdminClient() as admin:          # finds a `biplane up` cluster
        await admin.create_topic("events", partitions=3, replication_factor=3)
        detail = await admin.describe_topic("events")

An error answer raises AdminError carrying the API's code (e.g. TOPIC_ALREADY_EXISTS),
message, HTTP status and the request field at fault. Writes sent to a follower follow
its 307 to the leader; while the quorum elects a leader (503, retriable) or the token's
write rate is spent (429) a call is retried for up to `unavailable_wait_ms`. SyncAdminClient is the blocking twin.
"""
from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any, Coroutine, Sequence, TypeVar
from urllib.parse import quote, urljoin

import aiohttp

from common.api_models import (
    BrokerList,
    BrokerOperations,
    ClusterConfigView,
    ReassignmentProgress,
    Cluster,
    ClusterHealth,
    Done,
    ElectionResult,
    GroupList,
    Health,
    PartitionList,
    ReassignmentList,
    SnapshotInfo,
    SnapshotList,
    TopicDetail,
    TopicList,
    TopicOffsets,
)
from common.errors import AdminError, ClientClosedError, NoBrokersError

T = TypeVar("T")
REDIRECTS_MAX = 3


def _topic(name: str) -> str:
    if not isinstance(name, str) or not name:
        raise ValueError(f"topic name must be a non-empty string, not {name!r}")
    return quote(name, safe="")


def _broker(broker_id: int) -> str:
    if isinstance(broker_id, bool) or not isinstance(broker_id, int) or broker_id < 0:
        raise ValueError(f"broker id must be an int >= 0, not {broker_id!r}")
    return str(broker_id)


class AdminClient:
    def __init__(self, urls: str | Sequence[str] | None = None, token: str | None = None, *,
                 request_timeout_ms: int = 15_000, unavailable_wait_ms: int = 10_000) -> None:
        if urls is None:
            from dataplane.client.discovery import default_admin
            found_urls, found_token = default_admin()
            urls, token = found_urls, token or found_token
        items = urls.split(",") if isinstance(urls, str) else list(urls)
        self.urls = [(u if "://" in u else "http://" + u).rstrip("/") for u in (i.strip() for i in items) if u]
        if not self.urls:
            raise ValueError("no controller URL given (e.g. 'http://127.0.0.1:8080')")
        self.token = token
        self.request_timeout_ms = request_timeout_ms
        self.unavailable_wait_ms = unavailable_wait_ms
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> "AdminClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
            self._session = aiohttp.ClientSession(
                headers=headers, timeout=aiohttp.ClientTimeout(total=self.request_timeout_ms / 1000))
        return self._session

    # ------------------------------------------------------------ transport

    async def call(self, method: str, path: str, body: Any = None) -> Any:
        """One API call: JSON in and out. Returns the decoded body; raises AdminError."""
        deadline = time.monotonic() + self.unavailable_wait_ms / 1000
        while True:
            status, doc = await self._call_any(method, path, body)
            err = doc.get("error") if isinstance(doc, dict) else None
            if status == 503 and isinstance(err, dict) and err.get("retriable") and time.monotonic() < deadline:
                await asyncio.sleep(0.25)   # no leader yet: nothing was done, so try again
                continue
            if status == 429 and time.monotonic() < deadline:
                await asyncio.sleep(0.5)    # the token's write rate is spent: refused before it ran
                continue
            if status >= 400:
                err = err if isinstance(err, dict) else {}
                raise AdminError(err.get("message") or (doc if isinstance(doc, str) and doc else f"HTTP {status}"),
                                 code_name=err.get("code", f"HTTP_{status}"), status=status,
                                 field=err.get("field"), api_retriable=bool(err.get("retriable")))
            return doc

    async def _call_any(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        errors = []
        for base in self.urls:
            try:
                return await self._call_one(method, base + path, body)
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                errors.append(f"{base}: {exc or type(exc).__name__}")
        raise NoBrokersError("cannot reach any controller: " + "; ".join(errors))

    async def _call_one(self, method: str, url: str, body: Any) -> tuple[int, Any]:
        data = json.dumps(body) if body is not None else None
        headers = {"Content-Type": "application/json"} if data is not None else {}
        for _ in range(REDIRECTS_MAX + 1):
            async with self._http().request(method, url, data=data, headers=headers,
                                            allow_redirects=False) as resp:
                if resp.status in (307, 308) and resp.headers.get("Location"):
                    url = urljoin(url, resp.headers["Location"])
                    continue
                raw = await resp.read()
                try:
                    return resp.status, json.loads(raw) if raw else {}
                except ValueError:
                    return resp.status, raw.decode(errors="replace")
        raise AdminError(f"more than {REDIRECTS_MAX} redirects starting at {url}", code_name="INVALID_REQUEST",
                         status=310)

    # ------------------------------------------------------------ the API

    async def health(self) -> Health:
        return Health.model_validate(await self.call("GET", "/v1/health"))

    async def cluster(self) -> Cluster:
        return Cluster.model_validate(await self.call("GET", "/v1/cluster"))

    async def cluster_health(self) -> ClusterHealth:
        """Leaderless, under-min-ISR and under-replicated partitions, fenced brokers, quorum problems."""
        return ClusterHealth.model_validate(await self.call("GET", "/v1/cluster/health"))

    async def brokers(self) -> BrokerList:
        return BrokerList.model_validate(await self.call("GET", "/v1/brokers"))

    async def broker_operations(self, broker_id: int) -> BrokerOperations:
        """A broker's maintenance and decommission state and what is left of them."""
        return BrokerOperations.model_validate(await self.call("GET", f"/v1/brokers/{_broker(broker_id)}/operations"))

    async def set_maintenance(self, broker_id: int, enabled: bool) -> BrokerOperations:
        """Maintenance on: the broker's leaderships move to other in-sync replicas (it stays in
        every ISR); off: it may lead again. Returns at once; `broker_operations` shows progress."""
        if not isinstance(enabled, bool):
            raise ValueError(f"enabled={enabled!r} must be True or False")
        return BrokerOperations.model_validate(await self.call(
            "POST", f"/v1/brokers/{_broker(broker_id)}/maintenance", {"enabled": enabled}))

    async def decommission(self, broker_id: int) -> BrokerOperations:
        """Move every replica off the broker, then fence it for good. Returns once started."""
        return BrokerOperations.model_validate(await self.call(
            "POST", f"/v1/brokers/{_broker(broker_id)}/decommission"))

    async def recommission(self, broker_id: int) -> BrokerOperations:
        """Cancel a decommission (moves still running go back)."""
        return BrokerOperations.model_validate(await self.call(
            "POST", f"/v1/brokers/{_broker(broker_id)}/recommission"))

    async def list_topics(self) -> TopicList:
        return TopicList.model_validate(await self.call("GET", "/v1/topics"))

    async def create_topic(self, name: str, *, partitions: int = 1, replication_factor: int = 1,
                           config: dict[str, Any] | None = None,
                           replica_assignment: Sequence[Sequence[int]] | None = None,
                           exist_ok: bool = False) -> TopicDetail:
        """Create a topic; with exist_ok=True an existing topic of that name is described instead."""
        body: dict[str, Any] = {"name": name, "partitions": partitions, "replication_factor": replication_factor,
                                "config": dict(config or {})}
        if replica_assignment is not None:
            body["replica_assignment"] = [list(r) for r in replica_assignment]
        try:
            return TopicDetail.model_validate(await self.call("POST", "/v1/topics", body))
        except AdminError as exc:
            if exist_ok and exc.code_name == "TOPIC_ALREADY_EXISTS":
                return await self.describe_topic(name)
            raise

    async def describe_topic(self, name: str) -> TopicDetail:
        return TopicDetail.model_validate(await self.call("GET", f"/v1/topics/{_topic(name)}"))

    async def topic_offsets(self, name: str) -> TopicOffsets:
        """Log start offset, high watermark, log end offset and size per partition, as each
        leader last reported them (about once a second; `age_ms` says how long ago)."""
        return TopicOffsets.model_validate(await self.call("GET", f"/v1/topics/{_topic(name)}/offsets"))

    async def partitions(self, name: str) -> PartitionList:
        return PartitionList.model_validate(await self.call("GET", f"/v1/topics/{_topic(name)}/partitions"))

    async def delete_topic(self, name: str) -> Done:
        return Done.model_validate(await self.call("DELETE", f"/v1/topics/{_topic(name)}"))

    async def alter_topic_config(self, name: str, *, set: dict[str, Any] | None = None,
                                 reset: Sequence[str] = ()) -> TopicDetail:
        return TopicDetail.model_validate(await self.call(
            "PATCH", f"/v1/topics/{_topic(name)}/config", {"set": dict(set or {}), "reset": list(reset)}))

    async def add_partitions(self, name: str, partitions: int, *,
                             replica_assignment: Sequence[Sequence[int]] | None = None) -> TopicDetail:
        """Grow topic `name` to `partitions` partitions in all (more than it has; never fewer).
        `replica_assignment`, when given, lists the replicas of each new partition."""
        body: dict[str, Any] = {"partitions": partitions}
        if replica_assignment is not None:
            body["replica_assignment"] = [list(r) for r in replica_assignment]
        return TopicDetail.model_validate(await self.call("POST", f"/v1/topics/{_topic(name)}/partitions", body))

    async def reassign(self, topic: str, partition: int, target_replicas: Sequence[int]) -> PartitionList:
        return PartitionList.model_validate(await self.call(
            "POST", "/v1/reassignments",
            {"topic": topic, "partition": partition, "target_replicas": list(target_replicas)}))

    async def reassign_plan(self, moves: Sequence[tuple[str, int, Sequence[int]]], *,
                            throttle_bytes_per_s: int | None = None) -> ReassignmentList:
        """Move many partitions at once, all or none: (topic, partition, target replicas) each.
        A throttle paces the new replicas' catch-up (the cluster's reassignment_throttle_bytes_per_s)."""
        body: dict[str, Any] = {"version": 1, "partitions": [
            {"topic": t, "partition": p, "replicas": list(r)} for t, p, r in moves]}
        if throttle_bytes_per_s is not None:
            body["throttle_bytes_per_s"] = throttle_bytes_per_s
        return ReassignmentList.model_validate(await self.call("POST", "/v1/reassignments/plan", body))

    async def cancel_reassignments(self, partitions: Sequence[tuple[str, int]] | None = None) -> ReassignmentList:
        """Send the named reassignments (None: every running one) back to their original replicas."""
        body = {"partitions": None if partitions is None
                else [{"topic": t, "partition": p} for t, p in partitions]}
        return ReassignmentList.model_validate(await self.call("POST", "/v1/reassignments/cancel", body))

    async def reassignment_progress(self) -> ReassignmentProgress:
        """Each running reassignment's added replicas: log end offset and bytes behind the leader."""
        return ReassignmentProgress.model_validate(await self.call("GET", "/v1/reassignments/progress"))

    async def groups(self) -> GroupList:
        """Consumer groups as their coordinators last reported them: state, members, and per
        partition the committed offset, the leader's high watermark and the lag."""
        return GroupList.model_validate(await self.call("GET", "/v1/groups"))

    async def cluster_config(self) -> ClusterConfigView:
        return ClusterConfigView.model_validate(await self.call("GET", "/v1/cluster/config"))

    async def alter_cluster_config(self, *, set: dict[str, Any] | None = None,
                                   reset: Sequence[str] = ()) -> ClusterConfigView:
        """Set or unset dynamic cluster config keys (common/metadata/cluster_config.py); brokers
        apply them live."""
        return ClusterConfigView.model_validate(await self.call(
            "PATCH", "/v1/cluster/config", {"set": dict(set or {}), "reset": list(reset)}))

    async def reassignments(self) -> ReassignmentList:
        return ReassignmentList.model_validate(await self.call("GET", "/v1/reassignments"))

    async def elect_preferred(self, partitions: Sequence[tuple[str, int]] | None = None) -> ElectionResult:
        body = {"partitions": None if partitions is None
                else [{"topic": t, "partition": p} for t, p in partitions]}
        return ElectionResult.model_validate(await self.call("POST", "/v1/elections/preferred", body))

    async def take_snapshot(self) -> SnapshotInfo:
        return SnapshotInfo.model_validate(await self.call("POST", "/v1/snapshots"))

    async def list_snapshots(self) -> SnapshotList:
        return SnapshotList.model_validate(await self.call("GET", "/v1/snapshots"))


class SyncAdminClient:
    """Blocking AdminClient: the same methods, returning results instead of coroutines."""

    def __init__(self, urls: str | Sequence[str] | None = None, token: str | None = None, **options: Any) -> None:
        self._inner = AdminClient(urls, token, **options)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="biplane-admin", daemon=True)
        self._thread.start()

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._loop.is_closed():
            coro.close()   # never to run: no "never awaited" warning
            raise ClientClosedError("this admin client is closed")

        async def once() -> T:
            try:
                return await coro
            finally:
                # One HTTP session per call: a client nobody closes leaks nothing.
                await self._inner.close()
        return asyncio.run_coroutine_threadsafe(once(), self._loop).result()

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._inner, name)
        if not callable(method):
            return method
        return lambda *args, **kwargs: self._run(method(*args, **kwargs))

    def close(self) -> None:
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop.close()

    def __enter__(self) -> "SyncAdminClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
