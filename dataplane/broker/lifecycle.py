"""Registration and heartbeats: how the controller learns this broker is alive and caught up.

A fresh incarnation id per start; `clean_shutdown` comes from a marker file
that a clean stop writes and a start removes (so a crash leaves none, and the
controller takes this broker out of every ISR until it catches up: KIP-966).
Heartbeats carry the applied metadata offset, the replication links this broker has not
used for a bound (dataplane/broker/contact.py) and, every usage interval, usage stats. A heartbeat answered STALE_BROKER_EPOCH (or unknown broker) registers again.

A liveness-only heartbeat also goes every other round's time, apart from the rounds and
unawaited, to every controller but the one answering as leader (`FollowerBeats`): a follower
keeps who it heard, and when it leads next it times each broker from the last heartbeat it
heard rather than granting every one a grace, so a broker cut off together with the old
leader is fenced a session timeout after it went quiet.

Heartbeats go from a thread of their own (`HeartbeatThread`, with its own event loop and
controller client), as Kafka's broker sends them from its lifecycle manager's thread, not
its request handlers': on a loaded machine the broker's event loop was seen kept off the
CPU for 1.5-5 s at a time, longer than the controller's 1.5 s session timeout; such a
stall fenced the broker (its leaderships moved, its ISR places given up) and the
imbalance check moved the leaderships back seconds later. A thread needs the CPU too,
but only for a moment per heartbeat. The thread still stops heartbeating when
the event loop made no progress for `loop_stall_ms_max`: a broker whose loop is wedged
is fenced, only later.

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
import threading
import time
import uuid
from typing import Callable

from common.control_client import ControlClient
from common.durable import fsync_dir
from common.errors import BiplaneError, ErrorCode
from common.requests import HeartbeatRequest, OfflineReplica, RegisterBrokerRequest, UnreachablePeer
from common.usage import BrokerUsage, UsageReports

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
                 usage: Callable[[], BrokerUsage | None], heartbeat_interval_ms: int = 150,
                 usage_interval_ms: int = 1000, retry_backoff_ms: int = 200,
                 unreachable: Callable[[], tuple[UnreachablePeer, ...]] = tuple,
                 replicas_opening: Callable[[], int] = lambda: 0,
                 offline: Callable[[], tuple[OfflineReplica, ...]] = tuple) -> None:
        self.control = control
        self.broker_id = broker_id
        self.incarnation_id = uuid.uuid4().hex
        self.host, self.port, self.rack, self.priority = host, port, rack, priority
        self.clean_shutdown = clean_shutdown
        self.metadata_offset = metadata_offset
        self.kafka_port = kafka_port
        self.usage = usage
        self.unreachable = unreachable
        self.replicas_opening = replicas_opening
        self.offline = offline
        # The controller's committed metadata offset as its last heartbeat answer said (written by
        # the heartbeat thread): the lag rule sees it even while the metadata fetch is stuck.
        self.committed_offset = -1
        self.leader_url: str | None = None   # the controller that answered the last heartbeat
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.usage_interval_ms = usage_interval_ms
        self.retry_backoff_ms = retry_backoff_ms
        # Set from the heartbeat thread, read on the event loop: a flag, not an asyncio.Event.
        self.registered = threading.Event()
        self.fenced = True
        self.want_shutdown = False
        self._last_usage_ms = 0.0
        self._usage_reports = UsageReports()   # the heartbeat thread's alone

    async def register(self, control: ControlClient | None = None) -> None:
        """Register until a controller accepts (retrying while none answers)."""
        control = control or self.control
        request = RegisterBrokerRequest(broker_id=self.broker_id, incarnation_id=self.incarnation_id,
                                        host=self.host, port=self.port, rack=self.rack, priority=self.priority,
                                        clean_shutdown=self.clean_shutdown, kafka_port=self.kafka_port)
        while True:
            try:
                await control.register(request)
            except BiplaneError as exc:
                log.info("registration failed: %s", exc, extra={"event": "broker.register_failed"})
                await asyncio.sleep(self.retry_backoff_ms / 1000)
                continue
            log.info("registered broker %d incarnation %s (clean_shutdown=%s)", self.broker_id,
                     self.incarnation_id, self.clean_shutdown, extra={"event": "broker.registered"})
            self.registered.set()
            return

    async def run(self, *, control: ControlClient | None = None,
                  beating: Callable[[], bool] = lambda: True) -> None:
        """Register, then heartbeat until cancelled (through `control`, default the broker's
        client); a round is skipped while `beating()` is false (the broker's loop is wedged)."""
        control = control or self.control
        await self.register(control)
        pace = HeartbeatPace(interval_ms=self.heartbeat_interval_ms)
        followers = FollowerBeats()
        # Apart from the rounds: a call to a controller leader that stopped answering holds a
        # round for up to a bound per controller tried, and the followers must go on hearing us.
        beats = asyncio.create_task(self._beat_followers(control, beating, followers),
                                    name=f"heartbeat-followers-{self.broker_id}")
        try:
            await self._beat(control, beating, pace)
        finally:
            beats.cancel()
            await asyncio.gather(beats, return_exceptions=True)
            await followers.close()

    async def _beat_followers(self, control: ControlClient, beating: Callable[[], bool],
                              followers: "FollowerBeats") -> None:
        # Every other round's time: a follower needs only to tell a broker heard lately from one
        # gone for a session timeout, and each beat costs it an HTTP request (every round from
        # three brokers took 1.3-1.7 points of a core on each follower, idle; this about 0.5).
        failed = False
        while True:
            try:
                if beating():
                    followers.send(control, HeartbeatRequest(
                        broker_id=self.broker_id, incarnation_id=self.incarnation_id,
                        metadata_offset=self.metadata_offset(), liveness_only=True))
                failed = False
            except Exception:
                # Never the end of the beats: a follower that stops hearing us would fence us at
                # the start of its leadership. Said once per run of failures.
                if not failed:
                    log.exception("broker %d: a follower heartbeat could not be sent", self.broker_id,
                                  extra={"event": "broker.follower_heartbeat_failed"})
                failed = True
            await asyncio.sleep(2 * self.heartbeat_interval_ms / 1000)

    async def _beat(self, control: ControlClient, beating: Callable[[], bool], pace: "HeartbeatPace") -> None:
        while True:
            started = time.monotonic()
            if not beating():
                await asyncio.sleep(self.heartbeat_interval_ms / 1000)
                continue
            pace.sending(started)
            request = self._heartbeat(with_usage=True)
            try:
                try:
                    answer = await control.heartbeat(request)
                except BaseException:
                    self._usage_reports.unanswered()
                    raise
                self._usage_reports.answered(resend=answer.usage_resend)
                slow = pace.answered(time.monotonic(), time.thread_time(), time.process_time())
                if slow is not None:
                    log.warning("broker %d: heartbeats answered %s", self.broker_id, slow,
                                extra={"event": "broker.heartbeat_slow"})
                self.committed_offset = max(self.committed_offset, answer.metadata_offset)
                self.leader_url = control.leader_url
                fenced = answer.fenced
                if fenced != self.fenced:
                    log.info("broker %d %s", self.broker_id, "fenced" if fenced else "unfenced",
                             extra={"event": "broker.fencing", "fenced": fenced})
                self.fenced = fenced
            except BiplaneError as exc:
                if _must_register_again(exc):
                    log.warning("heartbeat refused (%s); registering again", exc,
                                extra={"event": "broker.reregister"})
                    await self.register(control)
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
                answer = await asyncio.wait_for(self.control.heartbeat(self._heartbeat(with_usage=False)),
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

    def _heartbeat(self, *, with_usage: bool) -> HeartbeatRequest:
        """`with_usage`: the heartbeat thread's rounds, which alone keep the usage reports'
        state (a controlled shutdown's heartbeats come from the broker's own loop)."""
        now = time.monotonic() * 1000
        usage = None
        if with_usage and now - self._last_usage_ms >= self.usage_interval_ms:
            self._last_usage_ms = now
            complete = self.usage()
            usage = self._usage_reports.report(complete) if complete is not None else None
        request = HeartbeatRequest(broker_id=self.broker_id, incarnation_id=self.incarnation_id,
                                   metadata_offset=self.metadata_offset(), usage=usage,
                                   want_shutdown=self.want_shutdown)
        # The newer fields go only when they say something (the client sends the fields set):
        # a controller older than a field refuses a heartbeat naming it, and so only then.
        newer = {"unreachable": self.unreachable(), "replicas_opening": self.replicas_opening(),
                 "offline": self.offline()}
        said = {name: value for name, value in newer.items() if value}
        return request.model_copy(update=said) if said else request


class FollowerBeats:
    """A liveness-only heartbeat to every controller but the one that answered the last round as
    leader (to all while none did), without waiting for them: a follower keeps who it heard, so
    when it leads next it times each broker from its last heartbeat rather than giving all a
    grace (controller/decisions/sessions.py); a leader that gets one refreshes the session
    with it, and nothing else. One at a time per controller: a controller down or cut off
    holds one beat for its bound."""

    def __init__(self) -> None:
        self._inflight: dict[str, asyncio.Task[bool]] = {}

    def send(self, control: ControlClient, request: HeartbeatRequest) -> None:
        for url in control.urls:
            task = self._inflight.get(url)
            if url == control.leader_url or (task is not None and not task.done()):
                continue
            task = asyncio.create_task(control.heartbeat_follower(url, request), name=f"heartbeat-follower {url}")
            task.add_done_callback(_said_nothing)
            self._inflight[url] = task

    async def close(self) -> None:
        tasks = [t for t in self._inflight.values() if not t.done()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._inflight.clear()


class HeartbeatPace:
    """Why heartbeats came late (pure: handed clock readings). Between two answered heartbeats
    more than `slow_ms` apart it says how long the round's start waited past its due time
    (the thread kept from running: the machine or the GIL), how long the call took (the
    network or the controller), and the CPU this thread and the whole process got meanwhile."""

    def __init__(self, *, interval_ms: int, slow_ms: int = 750) -> None:
        self.interval_ms, self.slow_ms = interval_ms, slow_ms
        self._answered: tuple[float, float, float] | None = None   # monotonic, thread CPU, process CPU
        self._sent = 0.0

    def sending(self, now_s: float) -> None:
        self._sent = now_s

    def answered(self, now_s: float, thread_cpu_s: float, process_cpu_s: float) -> str | None:
        last, self._answered = self._answered, (now_s, thread_cpu_s, process_cpu_s)
        if last is None:
            return None
        gap_ms = (now_s - last[0]) * 1000
        if gap_ms < self.slow_ms:
            return None
        start_late_ms = max(0.0, (self._sent - last[0]) * 1000 - self.interval_ms)
        return (f"{gap_ms:.0f} ms apart (round started {start_late_ms:.0f} ms late, call took "
                f"{(now_s - self._sent) * 1000:.0f} ms; meanwhile this thread ran {(thread_cpu_s - last[1]) * 1000:.0f} ms "
                f"and the process {(process_cpu_s - last[2]) * 1000:.0f} ms on the CPU)")


# A loop this long without progress has its running stack logged once (by the heartbeat
# thread): long enough to be no ordinary hiccup, well before heartbeats stop.
LOOP_STACK_AFTER_MS = 2_000


class HeartbeatThread:
    """Runs `Lifecycle.run` on a thread with its own event loop and its own controller client
    (`make_control`, built on that loop), so heartbeats keep their pace while the broker's
    event loop is stalled. `loop_progress_s()` is the time.monotonic() at which the broker's
    loop last ran a callback (its LoopWatchdog); heartbeats stop once that is more than
    `loop_stall_ms_max` ago, so a wedged loop still gets the broker fenced.

    What the thread shares with the loop: `Lifecycle.fenced` and `registered` (written
    here), `want_shutdown` (written there), and the callables `metadata_offset`, `usage`,
    `unreachable`, `replicas_opening` and `offline`, which must only read values the loop keeps
    current."""

    def __init__(self, lifecycle: Lifecycle, *, make_control: Callable[[], ControlClient],
                 loop_progress_s: Callable[[], float], loop_stall_ms_max: int,
                 loop_stack: Callable[[], str | None] | None = None) -> None:
        if loop_stall_ms_max < 1:
            raise ValueError(f"loop_stall_ms_max={loop_stall_ms_max} must be >= 1")
        self.lifecycle = lifecycle
        self.make_control = make_control
        self.loop_progress_s = loop_progress_s
        self.loop_stall_ms_max = loop_stall_ms_max
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._main, name=f"heartbeat-{lifecycle.broker_id}", daemon=True)
        self.error: BaseException | None = None   # why the thread ended, when not stopped
        self.skipped = 0                          # rounds not sent: the loop was wedged
        self._warned = False
        self.loop_stack = loop_stack
        self._stack_logged = False

    def start(self) -> None:
        self._thread.start()
        self._started.wait()

    def _beating(self) -> bool:
        stalled_ms = (time.monotonic() - self.loop_progress_s()) * 1000
        if stalled_ms < LOOP_STACK_AFTER_MS:
            self._stack_logged = False
        elif not self._stack_logged and self.loop_stack is not None:
            # Name what holds the loop while it still does: once it returns, the stack is gone
            # and the watchdog can only say how long it took.
            self._stack_logged = True
            log.warning("broker %d: event loop busy for %.0f ms, running: %s", self.lifecycle.broker_id,
                        stalled_ms, self.loop_stack(), extra={"event": "broker.loop_busy"})
        if stalled_ms <= self.loop_stall_ms_max:
            self._warned = False
            return True
        self.skipped += 1
        if not self._warned:
            self._warned = True
            log.warning("broker %d: event loop made no progress for %.0f ms (loop_stall_ms_max=%d); "
                        "heartbeats stop until it does", self.lifecycle.broker_id, stalled_ms,
                        self.loop_stall_ms_max, extra={"event": "broker.heartbeat_paused"})
        return False

    def _main(self) -> None:
        asyncio.run(self._run())

    async def _run(self) -> None:
        self._loop = asyncio.get_running_loop()
        control = self.make_control()
        self._task = asyncio.current_task()
        self._started.set()
        try:
            await self.lifecycle.run(control=control, beating=self._beating)
        except asyncio.CancelledError:
            pass
        except BaseException as exc:  # noqa: BLE001 - handed to whoever stops the thread
            self.error = exc
            log.error("heartbeat thread of broker %d ended: %r", self.lifecycle.broker_id, exc, exc_info=exc)
        finally:
            await control.close()

    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Idempotent; waits up to timeout_s for the thread to end."""
        loop, task = self._loop, self._task
        if loop is not None and task is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(task.cancel)
            except RuntimeError:
                pass  # its loop just closed
        if self._thread.is_alive():
            self._thread.join(timeout_s)


def _said_nothing(task: "asyncio.Task[bool]") -> None:
    # heartbeat_follower swallows a controller's failures; anything else (a client closed under
    # it at a stop) is retrieved here rather than reported at garbage collection.
    if not task.cancelled() and task.exception() is not None:
        log.debug("follower heartbeat failed: %r", task.exception())


def _must_register_again(exc: BiplaneError) -> bool:
    """Another incarnation is registered under our id, or the controller does not know us."""
    if exc.code is ErrorCode.STALE_BROKER_EPOCH:
        return True
    return exc.code is ErrorCode.INVALID_REQUEST and getattr(exc, "field", None) == "broker_id"
