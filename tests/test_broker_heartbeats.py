"""The broker's heartbeat thread (dataplane/broker/lifecycle.py, HeartbeatThread): heartbeats
keep their pace while the broker's event loop is stalled, and stop once the loop has made no
progress for loop_stall_ms_max. The chaos harness found brokers fenced after every event-loop
stall longer than the controller's session timeout (1.5 s) on a loaded machine."""
from __future__ import annotations

import asyncio
import logging
import threading
import time
import types

from aiohttp import web

from common.control_client import ControlClient
from dataplane.broker.lifecycle import HeartbeatPace, HeartbeatThread, Lifecycle


class FakeController:
    """Accepts registration and heartbeats; notes when each heartbeat arrived."""

    def __init__(self) -> None:
        self.beats: list[float] = []
        self.lock = threading.Lock()

    def app(self) -> web.Application:
        async def register(request: web.Request) -> web.Response:
            body = await request.json()
            return web.json_response({"broker_id": body["broker_id"], "metadata_offset": 0, "session_timeout_ms": 1500})

        async def heartbeat(request: web.Request) -> web.Response:
            body = await request.json()
            with self.lock:
                self.beats.append(time.monotonic())
            return web.json_response({"broker_id": body["broker_id"], "fenced": False, "metadata_offset": 0,
                                      "session_timeout_ms": 1500})
        app = web.Application()
        app.router.add_post("/rpc/v1/register", register)
        app.router.add_post("/rpc/v1/heartbeat", heartbeat)
        return app

    def beats_between(self, start: float, end: float) -> int:
        with self.lock:
            return sum(1 for t in self.beats if start <= t <= end)


def _serve_in_thread(app: web.Application) -> tuple[str, threading.Event]:
    """The fake controller on a loop of its own: the test blocks its own loop on purpose."""
    ready, done = threading.Event(), threading.Event()
    url: list[str] = []

    async def main() -> None:
        runner = web.AppRunner(app, shutdown_timeout=0.1)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url.append(f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}")  # type: ignore[union-attr]
        ready.set()
        while not done.is_set():
            await asyncio.sleep(0.05)
        await runner.cleanup()
    threading.Thread(target=lambda: asyncio.run(main()), daemon=True).start()
    ready.wait(10)
    return url[0], done


def test_heartbeats_keep_their_pace_while_the_event_loop_is_blocked_and_stop_when_it_is_wedged() -> None:
    """Claim: with the broker's loop blocked for 2 s (longer than a 1.5 s session), the
    controller still receives a heartbeat at least every 0.5 s; once the loop has not
    progressed for loop_stall_ms_max, heartbeats stop."""
    controller = FakeController()
    url, done = _serve_in_thread(controller.app())
    progress = [time.monotonic()]

    async def run() -> None:
        main_control = ControlClient([url], secret=None)
        lifecycle = Lifecycle(main_control, broker_id=1, host="127.0.0.1", port=1, rack=None, priority=0,
                              clean_shutdown=True, metadata_offset=lambda: 0, usage=lambda: None,
                              heartbeat_interval_ms=50)
        thread = HeartbeatThread(lifecycle, make_control=lambda: ControlClient([url], secret=None,
                                                                               heartbeat_timeout_ms=500),
                                 loop_progress_s=lambda: progress[0], loop_stall_ms_max=3000)
        thread.start()
        try:
            deadline = time.monotonic() + 5
            while not lifecycle.registered.is_set() and time.monotonic() < deadline:
                progress[0] = time.monotonic()
                await asyncio.sleep(0.02)
            assert lifecycle.registered.is_set()
            while lifecycle.leader_url is None and time.monotonic() < deadline:
                progress[0] = time.monotonic()
                await asyncio.sleep(0.02)
            assert lifecycle.leader_url == url   # the controller that answered: the learner follows it
            progress[0] = time.monotonic()
            blocked_at = time.monotonic()
            time.sleep(2.0)  # the event loop is stalled; its last progress stays at blocked_at
            for start in (blocked_at, blocked_at + 0.5, blocked_at + 1.0, blocked_at + 1.5):
                assert controller.beats_between(start, start + 0.5) >= 1, (start - blocked_at, controller.beats)
            time.sleep(1.5)  # now 3.5 s without progress: past loop_stall_ms_max
            wedged = time.monotonic()
            time.sleep(1.0)
            assert controller.beats_between(wedged, wedged + 1.0) == 0
            assert thread.skipped > 0
            progress[0] = time.monotonic()
            resumed = time.monotonic()
            time.sleep(0.5)
            assert controller.beats_between(resumed, resumed + 0.5) >= 1
        finally:
            await asyncio.to_thread(thread.stop)
            await main_control.close()
        assert not thread.alive() and thread.error is None
    try:
        asyncio.run(run())
    finally:
        done.set()


def test_late_heartbeats_say_whether_the_thread_waited_or_the_call_did() -> None:
    """Claim: two answered heartbeats more than `slow_ms` apart are reported with what held them
    (the round starting late: this thread kept from running; or the call: the network or the
    controller) and the CPU the thread and the process got meanwhile; closer ones are not."""
    pace = HeartbeatPace(interval_ms=150, slow_ms=750)
    pace.sending(10.0)
    assert pace.answered(10.01, 1.0, 5.0) is None                 # the first answer: nothing to compare
    pace.sending(10.16)
    assert pace.answered(10.17, 1.001, 5.01) is None              # on time
    pace.sending(11.37)                                           # due at 10.32: 1,050 ms late
    said = pace.answered(11.40, 1.801, 6.61)
    assert said == ("1230 ms apart (round started 1050 ms late, call took 30 ms; meanwhile this thread ran "
                    "800 ms and the process 1600 ms on the CPU)")
    pace.sending(11.55)
    said = pace.answered(12.50, 1.802, 6.62)                      # the call took 950 ms
    assert said is not None and "started 0 ms late, call took 950 ms" in said


def test_a_loop_busy_for_long_has_what_it_runs_logged_once_while_it_runs(caplog) -> None:
    """Claim: the heartbeat thread names what holds the broker's loop (its stack, read while
    the loop is still held) once per stall of LOOP_STACK_AFTER_MS or more; the watchdog's
    loop_stack shows the function the loop thread is in."""
    from common.eventloop import LoopWatchdog
    from dataplane.broker.lifecycle import LOOP_STACK_AFTER_MS

    seen: list[str | None] = []

    def busy_callback_in_a_broker(watchdog: LoopWatchdog) -> None:
        reader = threading.Thread(target=lambda: seen.append(watchdog.loop_stack()))
        reader.start()
        end = time.monotonic() + 0.2
        while time.monotonic() < end:   # holds the loop (and, between switches, the GIL)
            pass
        reader.join()

    async def run() -> None:
        watchdog = LoopWatchdog(name="test")
        watchdog.start()
        busy_callback_in_a_broker(watchdog)
        watchdog.stop()
    asyncio.run(run())
    assert seen[0] is not None and "busy_callback_in_a_broker" in seen[0], seen

    progress = [time.monotonic()]
    thread = HeartbeatThread(types.SimpleNamespace(broker_id=4), make_control=lambda: None,  # type: ignore[arg-type]
                             loop_progress_s=lambda: progress[0], loop_stall_ms_max=8000,
                             loop_stack=lambda: "dataplane/log.py:12 scan_everything")
    caplog.set_level(logging.WARNING, logger="biplane.broker.lifecycle")
    assert thread._beating()
    progress[0] = time.monotonic() - LOOP_STACK_AFTER_MS / 1000 - 0.1
    assert thread._beating() and thread._beating()
    busy = [r.getMessage() for r in caplog.records if "event loop busy" in r.getMessage()]
    assert len(busy) == 1 and "broker 4" in busy[0] and "scan_everything" in busy[0], busy
    progress[0] = time.monotonic()   # the stall ended; the next one is logged again
    thread._beating()
    progress[0] = time.monotonic() - LOOP_STACK_AFTER_MS / 1000 - 0.1
    thread._beating()
    assert sum("event loop busy" in r.getMessage() for r in caplog.records) == 2


def _recording_app(bodies: list[dict], *, status: int, hang_s: float = 0.0) -> web.Application:
    """A controller that notes each heartbeat's body and arrival, then answers `status`
    (200 as the leader, 421 as a follower) after `hang_s`."""
    async def register(request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response({"broker_id": body["broker_id"], "metadata_offset": 0, "session_timeout_ms": 1500})

    async def heartbeat(request: web.Request) -> web.Response:
        body = await request.json()
        body["_at"] = time.monotonic()
        bodies.append(body)
        await asyncio.sleep(hang_s)
        if status == 200:
            return web.json_response({"broker_id": body["broker_id"], "fenced": False, "metadata_offset": 0,
                                      "session_timeout_ms": 1500})
        return web.json_response({"error": {"code": "NOT_CONTROLLER", "message": "not the leader"},
                                  "leader": None}, status=status)
    app = web.Application()
    app.router.add_post("/rpc/v1/register", register)
    app.router.add_post("/rpc/v1/heartbeat", heartbeat)
    return app


def _run_lifecycle(urls: list[str], seconds: float) -> None:
    from common.usage import BrokerUsage

    async def run() -> None:
        control = ControlClient(urls, secret=None, heartbeat_timeout_ms=1000)
        lifecycle = Lifecycle(control, broker_id=1, host="127.0.0.1", port=1, rack=None, priority=0,
                              clean_shutdown=True, metadata_offset=lambda: 0, heartbeat_interval_ms=50,
                              usage_interval_ms=100, usage=lambda: BrokerUsage(
                                  broker_id=1, at_ms=0, disk_total_bytes=1, disk_used_bytes=0, disk_free_bytes=1))
        task = asyncio.create_task(lifecycle.run())
        await asyncio.sleep(seconds)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await control.close()
    asyncio.run(run())


def test_the_followers_get_a_liveness_only_heartbeat_every_other_round_without_waiting_for_them() -> None:
    """Claim: a liveness-only heartbeat (no usage report, nothing but the session's fields) goes
    every two rounds' time to each controller but the leader (a follower keeps who it heard for
    its next leadership: controller/decisions/sessions.py); the leader gets the rounds' full
    heartbeats; a follower that never answers holds one beat at a time and slows nothing."""
    leader: list[dict] = []
    follower: list[dict] = []
    hung: list[dict] = []
    servers = [_serve_in_thread(_recording_app(leader, status=200)),
               _serve_in_thread(_recording_app(follower, status=421)),
               _serve_in_thread(_recording_app(hung, status=421, hang_s=30))]
    try:
        _run_lifecycle([url for url, _ in servers], 2.0)
    finally:
        for _, done in servers:
            done.set()
    rounds = [b for b in leader if not b.get("liveness_only")]
    assert len(rounds) >= 25, len(rounds)                            # ~40 at 50 ms a round
    assert any(b.get("usage") for b in rounds), "the rounds carry the usage reports"
    # Before the first answer no leader is known, and the first liveness beat goes to all.
    assert sum(1 for b in leader if b.get("liveness_only")) <= 1, leader
    assert all(b.get("liveness_only") for b in follower), follower
    assert not any("usage" in b or "unreachable" in b or "offline" in b for b in follower), follower[:2]
    assert 12 <= len(follower) <= 23, len(follower)                  # ~20: every 100 ms for 2 s
    # The hanging follower gets one beat per 1 s bound, however many rounds pass meanwhile.
    assert 1 <= len(hung) <= 3, len(hung)


def test_the_followers_go_on_hearing_a_broker_whose_round_waits_on_a_silent_leader() -> None:
    """Claim: a round held by a controller leader that stopped answering (each attempt costs the
    1 s bound) does not hold the followers' heartbeats: they keep their own pace, so the
    controller that leads next has heard this broker lately."""
    silent: list[dict] = []
    follower: list[dict] = []
    servers = [_serve_in_thread(_recording_app(silent, status=200, hang_s=30)),
               _serve_in_thread(_recording_app(follower, status=421))]
    try:
        _run_lifecycle([url for url, _ in servers], 2.5)
    finally:
        for _, done in servers:
            done.set()
    liveness = [b["_at"] for b in follower if b.get("liveness_only")]
    assert len(liveness) >= 15, len(liveness)                        # ~25: every 100 ms for 2.5 s
    assert max(b - a for a, b in zip(liveness, liveness[1:])) < 0.5, liveness


def test_a_follower_heartbeat_that_fails_to_be_sent_is_logged_once_and_the_beats_go_on(monkeypatch, caplog) -> None:
    """Claim: the follower heartbeats' task outlives an error of its own (said once in the log),
    rather than ending quietly and leaving the followers to fence this broker when they lead."""
    from dataplane.broker import lifecycle as lc

    sent = lc.FollowerBeats.send
    calls = {"n": 0}

    def flaky(self, control, request) -> None:
        calls["n"] += 1
        if calls["n"] <= 3:
            raise RuntimeError("boom")
        sent(self, control, request)
    monkeypatch.setattr(lc.FollowerBeats, "send", flaky)
    follower: list[dict] = []
    leader: list[dict] = []
    servers = [_serve_in_thread(_recording_app(leader, status=200)),
               _serve_in_thread(_recording_app(follower, status=421))]
    try:
        with caplog.at_level("ERROR", logger=lc.log.name):
            _run_lifecycle([url for url, _ in servers], 1.5)
    finally:
        for _, done in servers:
            done.set()
    assert len([b for b in follower if b.get("liveness_only")]) >= 5, follower
    said = [r for r in caplog.records if "follower heartbeat could not be sent" in r.getMessage()]
    assert len(said) == 1, said
