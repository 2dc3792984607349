"""Connections to brokers: one WireClient per (broker, purpose), opened lazily, plus metadata
refreshes from whichever broker answers. Long-poll fetches use their own purpose so they
never queue behind, or in front of, produce requests on the same connection."""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from common.errors import BiplaneError, ErrorCode
from common.wire import ConnectionClosedError, MetadataRequest, WireClient
from dataplane.client.errors import NoBrokersError
from dataplane.client.metadata import ClusterMetadata

log = logging.getLogger("biplane.client")


def parse_bootstrap(bootstrap: str | list[str] | tuple[str, ...]) -> list[tuple[str, int]]:
    items = bootstrap.split(",") if isinstance(bootstrap, str) else list(bootstrap)
    out = []
    for item in (i.strip() for i in items):
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"bootstrap address {item!r} is not HOST:PORT (e.g. 127.0.0.1:9092)")
        out.append((host, int(port)))
    if not out:
        raise ValueError("no bootstrap address given: pass bootstrap='HOST:PORT[,HOST:PORT...]' "
                         "or start a local cluster with `biplane up`")
    return out


class Network:
    def __init__(self, bootstrap: list[tuple[str, int]], *, connect_timeout_ms: int = 5_000,
                 request_timeout_ms: int = 30_000, metadata_min_interval_ms: int = 50) -> None:
        self.bootstrap = bootstrap
        self.connect_timeout_ms = connect_timeout_ms
        self.request_timeout_ms = request_timeout_ms
        self.metadata_min_interval_ms = metadata_min_interval_ms
        self.metadata = ClusterMetadata()
        self._clients: dict[tuple[Any, str], WireClient] = {}
        self._connecting: dict[tuple[Any, str], asyncio.Future] = {}
        self._refresh_task: asyncio.Task | None = None
        self._last_refresh = 0.0
        self._topics: set[str] = set()

    def address(self, broker_id: int) -> tuple[str, int] | None:
        return self.metadata.brokers.get(broker_id)

    async def client(self, broker: int | tuple[str, int], purpose: str = "main") -> WireClient:
        key = (broker, purpose)
        existing = self._clients.get(key)
        if existing is not None and not existing.closed:
            return existing
        pending = self._connecting.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        address = broker if isinstance(broker, tuple) else self.address(broker)
        if address is None:
            raise ConnectionClosedError(f"broker {broker} has no known address")
        fut = asyncio.get_running_loop().create_future()
        self._connecting[key] = fut
        try:
            client = await asyncio.wait_for(WireClient.connect(*address), self.connect_timeout_ms / 1000)
            self._clients[key] = client
            fut.set_result(client)
            return client
        except (OSError, asyncio.TimeoutError) as exc:
            err = ConnectionClosedError(f"cannot connect to broker {broker} at {address[0]}:{address[1]}: "
                                        f"{exc or type(exc).__name__}")
            fut.set_exception(err)
            fut.exception()  # retrieved: waiters get it through shield
            raise err from None
        finally:
            self._connecting.pop(key, None)

    async def request(self, broker: int | tuple[str, int], message: Any, *, purpose: str = "main",
                      timeout_ms: int | None = None) -> Any:
        """One request; a timeout closes the connection (its answers would come out of order)."""
        client = self._clients.get((broker, purpose))
        if client is None or client.closed:
            client = await self.client(broker, purpose)
        try:
            async with asyncio.timeout((timeout_ms or self.request_timeout_ms) / 1000):  # no extra task
                return await client.request(message)
        except TimeoutError:
            await self.drop(broker, purpose)
            raise ConnectionClosedError(f"request to broker {broker} timed out after "
                                        f"{timeout_ms or self.request_timeout_ms} ms", code=ErrorCode.REQUEST_TIMED_OUT)

    async def send_only(self, broker: int, message: Any, *, purpose: str = "main") -> None:
        client = await self.client(broker, purpose)
        await client.send(message)

    async def drop(self, broker: int | tuple[str, int], purpose: str) -> None:
        client = self._clients.pop((broker, purpose), None)
        if client is not None:
            await client.close()

    # ------------------------------------------------------------ metadata

    def want_topic(self, topic: str) -> None:
        self._topics.add(topic)

    async def refresh_metadata(self, topics: set[str] | None = None) -> None:
        """Fetch metadata for the wanted topics (coalesced: callers share one request in flight)."""
        if topics:
            self._topics |= topics
        if self._refresh_task is None or self._refresh_task.done():
            wait = self.metadata_min_interval_ms / 1000 - (time.monotonic() - self._last_refresh)
            self._refresh_task = asyncio.get_running_loop().create_task(self._refresh(max(0.0, wait)))
        await asyncio.shield(self._refresh_task)

    async def _refresh(self, delay_s: float) -> None:
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        self._last_refresh = time.monotonic()
        candidates: list[int | tuple[str, int]] = list(self.metadata.brokers) + list(self.bootstrap)
        errors = []
        for broker in candidates:
            try:
                response = await self.request(broker, MetadataRequest(topics=tuple(sorted(self._topics))),
                                              purpose="main", timeout_ms=min(self.request_timeout_ms, 5_000))
            except BiplaneError as exc:
                errors.append(str(exc))
                continue
            self.metadata.update(response)
            return
        raise NoBrokersError("no broker answered a metadata request: " + "; ".join(errors[-3:]))

    async def close(self) -> None:
        if self._refresh_task is not None and not self._refresh_task.done():
            self._refresh_task.cancel()
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await client.close()
