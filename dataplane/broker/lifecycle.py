"""Registration and heartbeats: how the controller learns this broker is alive and caught up.

A fresh incarnation id per start; `clean_shutdown` comes from a marker file
that a clean stop writes and a start removes (so a crash leaves none, and the
controller takes this broker out of every ISR until it catches up: KIP-966).
Heartbeats carry the applied metadata offset and, every usage interval, usage
stats. A heartbeat answered STALE_BROKER_EPOCH (or unknown broker) registers again.

A clean stop is a controlled shutdown first (Kafka's): heartbeats ask for it,
the controller fences this broker at once (its leaderships move to other
replicas, it leaves every ISR), and the broker stops once it has applied that
metadata, so clients and followers find the new leaders without waiting a
session timeout. With no controller answering, it gives up at the timeout and
stops all the same (the session timeout then does the moving).
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from typing import Callable

from common.control_client import ControlClient
from common.durable import fsync_dir
from common.errors import BiplaneError, ErrorCode
from common.requests import HeartbeatRequest, RegisterBrokerRequest
from common.usage import BrokerUsage

log = logging.getLogger("biplane.broker.lifecycle")

CLEAN_SHUTDOWN_MARKER = "clean_shutdown"


def take_clean_shutdown_marker(data_dir: str) -> bool:
    """True if the last stop was clean; removes the marker so a crash from now on shows."""
    path = os.path.join(data_dir, CLEAN_SHUTDOWN_MARKER)
    try:
        os.remove(path)
    except FileNotFoundError:
        return False
    fsync_dir(data_dir)
    return True


def write_clean_shutdown_marker(data_dir: str) -> bool:
    """Write the marker; False (and a warning) if the disk refuses it (a full disk): the next
    start is then treated as unclean, which is only more careful."""
    path = os.path.join(data_dir, CLEAN_SHUTDOWN_MARKER)
    try:
        with open(path, "w") as f:
            f.write(f"{int(time.time() * 1000)}\n")
            f.flush()
            os.fsync(f.fileno())
        fsync_dir(data_dir)
    except OSError as exc:
        try:
            os.unlink(path)
        except OSError:
            pass
        log.warning("cannot write the clean-shutdown marker %s (%s); the next start is treated as "
                    "unclean (this broker leaves every ISR until it catches up)", path, exc,
                    extra={"event": "broker.clean_marker_failed"})
        return False
    return True



class Lifecycle:
    def __init__(self, control: ControlClient, *, broker_id: int, host: str, port: int, rack: str | None,
                 priority: int, clean_shutdown: bool, metadata_offset: Callable[[], int],
                 kafka_port: int | None = None,
                 usage: Callable[[], BrokerUsage], heartbeat_interval_ms: int = 150,
                 usage_interval_ms: int = 1000, retry_backoff_ms: int = 200) -> None:
        self.control = control
        self.broker_id = broker_id
        self.incarnation_id = uuid.uuid4().hex
        self.host, self.port, self.rack, self.priority = host, port, rack, priority
        self.clean_shutdown = clean_shutdown
        self.metadata_offset = metadata_offset
        self.kafka_port = kafka_port
        self.usage = usage
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.usage_interval_ms = usage_interval_ms
        self.retry_backoff_ms = retry_backoff_ms
        self.registered = asyncio.Event()
        self.fenced = True
        self.want_shutdown = False
        self._last_usage_ms = 0.0

    async def register(self) -> None:
        """Register until a controller accepts (retrying while none answers)."""
        request = RegisterBrokerRequest(broker_id=self.broker_id, incarnation_id=self.incarnation_id,
                                        host=self.host, port=self.port, rack=self.rack, priority=self.priority,
                                        clean_shutdown=self.clean_shutdown, kafka_port=self.kafka_port)
        while True:
            try:
                await self.control.register(request)
            except BiplaneError as exc:
                log.info("registration failed: %s", exc, extra={"event": "broker.register_failed"})
                await asyncio.sleep(self.retry_backoff_ms / 1000)
                continue
            log.info("registered broker %d incarnation %s (clean_shutdown=%s)", self.broker_id,
                     self.incarnation_id, self.clean_shutdown, extra={"event": "broker.registered"})
            self.registered.set()
            return

    async def run(self) -> None:
        """Register, then heartbeat until cancelled."""
        await self.register()
        while True:
            started = time.monotonic()
            try:
                answer = await self.control.heartbeat(self._heartbeat())
                fenced = answer.fenced
                if fenced != self.fenced:
                    log.info("broker %d %s", self.broker_id, "fenced" if fenced else "unfenced",
                             extra={"event": "broker.fencing", "fenced": fenced})
                self.fenced = fenced
            except BiplaneError as exc:
                if _must_register_again(exc):
                    log.warning("heartbeat refused (%s); registering again", exc,
                                extra={"event": "broker.reregister"})
                    await self.register()
                else:
                    log.info("heartbeat failed: %s", exc, extra={"event": "broker.heartbeat_failed"})
            elapsed = time.monotonic() - started
            await asyncio.sleep(max(0.0, self.heartbeat_interval_ms / 1000 - elapsed))

    async def controlled_shutdown(self, *, timeout_ms: int = 5000, poll_ms: int = 50) -> bool:
        """Ask the controller to move everything off this broker and wait until it has and
        this broker applied it; False when that did not happen within `timeout_ms`."""
        if not self.registered.is_set():
            return False
        self.want_shutdown = True
        started = time.monotonic()
        deadline = started + timeout_ms / 1000
        while time.monotonic() < deadline:
            try:
                answer = await asyncio.wait_for(self.control.heartbeat(self._heartbeat()),
                                                max(0.001, deadline - time.monotonic()))
            except (BiplaneError, asyncio.TimeoutError) as exc:
                log.warning("controlled shutdown not acknowledged (%s); stopping without it", exc,
                            extra={"event": "broker.controlled_shutdown_failed"})
                return False
            if answer.fenced and self.metadata_offset() >= answer.metadata_offset:
                took_ms = int((time.monotonic() - started) * 1000)
                log.info("controlled shutdown: leaderships moved off broker %d in %d ms", self.broker_id,
                         took_ms, extra={"event": "broker.controlled_shutdown", "took_ms": took_ms})
                return True
            await asyncio.sleep(poll_ms / 1000)
        log.warning("controlled shutdown did not complete within %d ms; stopping without it", timeout_ms,
                    extra={"event": "broker.controlled_shutdown_failed"})
        return False

    def _heartbeat(self) -> HeartbeatRequest:
        now = time.monotonic() * 1000
        usage = None
        if now - self._last_usage_ms >= self.usage_interval_ms:
            self._last_usage_ms = now
            usage = self.usage()
        return HeartbeatRequest(broker_id=self.broker_id, incarnation_id=self.incarnation_id,
                                metadata_offset=self.metadata_offset(), usage=usage,
                                want_shutdown=self.want_shutdown)


def _must_register_again(exc: BiplaneError) -> bool:
    """Another incarnation is registered under our id, or the controller does not know us."""
    if exc.code is ErrorCode.STALE_BROKER_EPOCH:
        return True
    return exc.code is ErrorCode.INVALID_REQUEST and getattr(exc, "field", None) == "broker_id"
