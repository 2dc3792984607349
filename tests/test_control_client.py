"""ControlClient against controllers that accept a request and never answer (stopped with
SIGSTOP, cut off, starved): each attempt is bounded, so the next controller is asked in
time. The chaos harness found heartbeats held for request_timeout_ms (10 s) by a stopped
controller leader while the next leader fenced every broker after its 1.5 s session timeout.
"""
from __future__ import annotations

import asyncio
import time

import pytest
from aiohttp import web

from common.control_client import ControlClient
from common.errors import ControllerError, ErrorCode
from common.requests import AlterIsrRequest, ElectionReport, HeartbeatRequest


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


def _silent() -> web.Application:
    async def hang(request: web.Request) -> web.Response:
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")
    app = web.Application()
    app.router.add_route("*", "/rpc/v1/{tail:.*}", hang)
    return app


def _leader() -> web.Application:
    async def heartbeat(request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response({"broker_id": body["broker_id"], "fenced": False, "metadata_offset": 7,
                                  "session_timeout_ms": 1500})

    async def metadata(request: web.Request) -> web.Response:
        return web.json_response({"offset": 7, "records": []})
    async def alter_isr(request: web.Request) -> web.Response:
        return web.json_response({"error": {"code": "INVALID_UPDATE_VERSION", "message": "stale partition epoch"}},
                                 status=409)

    async def election_report(request: web.Request) -> web.Response:
        return web.json_response({"accepted": True})
    app = web.Application()
    app.router.add_post("/rpc/v1/heartbeat", heartbeat)
    app.router.add_post("/rpc/v1/alter-isr", alter_isr)
    app.router.add_post("/rpc/v1/election-report", election_report)
    app.router.add_get("/rpc/v1/metadata", metadata)
    return app


def test_heartbeat_and_long_poll_move_past_a_controller_that_never_answers() -> None:
    """Claim: with the first controller silent, a heartbeat is answered by the second within
    about heartbeat_timeout_ms, and a metadata long-poll within its wait plus
    long_poll_slack_ms, not after request_timeout_ms."""
    async def run() -> None:
        silent, silent_url = await _serve(_silent())
        leader, leader_url = await _serve(_leader())
        try:
            async with ControlClient([silent_url, leader_url], secret=None, request_timeout_ms=10_000,
                                     heartbeat_timeout_ms=300, long_poll_slack_ms=300,
                                     retry_backoff_ms=10) as cc:
                started = time.monotonic()
                beat = await asyncio.wait_for(
                    cc.heartbeat(HeartbeatRequest(broker_id=1, incarnation_id="i", metadata_offset=0)), 5)
                took_s = time.monotonic() - started
                assert beat.fenced is False and took_s < 2.0, took_s
                cc.leader_url, cc._rotation = None, 0  # ask the silent one first again
                started = time.monotonic()
                batch = await asyncio.wait_for(cc.fetch_metadata(after_offset=7, wait_ms_max=200), 5)
                took_s = time.monotonic() - started
                assert batch.offset == 7 and took_s < 2.0, took_s
        finally:
            await silent.cleanup()
            await leader.cleanup()
    asyncio.run(run())


def test_isr_changes_and_election_reports_move_past_a_controller_that_never_answers() -> None:
    """Claim: acks=all waits on an ISR change or a quorum election, so their attempts are bounded
    like a heartbeat's: with the controller leader silent (cut off with a follower broker, or
    stopped), the next controller answers within about heartbeat_timeout_ms. Before, each
    attempt waited request_timeout_ms (10 s) or until the cut healed: the fault harness saw
    acks=all on isr partitions held 5-7 s by an ISR shrink sent to a cut-off controller leader."""
    async def run() -> None:
        silent, silent_url = await _serve(_silent())
        leader, leader_url = await _serve(_leader())
        try:
            async with ControlClient([silent_url, leader_url], secret=None, request_timeout_ms=10_000,
                                     heartbeat_timeout_ms=300, retry_backoff_ms=10) as cc:
                cc.leader_url = silent_url
                started = time.monotonic()
                with pytest.raises(ControllerError) as refused:
                    await asyncio.wait_for(cc.alter_isr(AlterIsrRequest(
                        broker_id=1, topic="t", partition=0, leader_epoch=1, partition_epoch=1, new_isr=(1,))), 5)
                assert refused.value.code is ErrorCode.INVALID_UPDATE_VERSION
                assert time.monotonic() - started < 2.0
                cc.leader_url = silent_url
                started = time.monotonic()
                answer = await asyncio.wait_for(cc.election_report(ElectionReport(
                    broker_id=1, topic="t", partition=0, fenced_epoch=2, last_epoch=1, end_offset=5)), 5)
                assert answer.accepted and time.monotonic() - started < 2.0
        finally:
            await silent.cleanup()
            await leader.cleanup()
    asyncio.run(run())


def _counting_silent(hits: list[str]) -> web.Application:
    async def hang(request: web.Request) -> web.Response:
        hits.append(request.path)
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")
    app = web.Application()
    app.router.add_route("*", "/rpc/v1/{tail:.*}", hang)
    return app


def _follower(leader_url: list[str]) -> web.Application:
    async def not_leader(request: web.Request) -> web.Response:
        return web.json_response({"error": {"code": "NOT_CONTROLLER", "message": "not the leader"},
                                  "leader": {"api_url": leader_url[0]}}, status=421)
    app = web.Application()
    app.router.add_route("*", "/rpc/v1/{tail:.*}", not_leader)
    return app


def test_a_controller_that_did_not_answer_is_not_asked_again_within_the_call() -> None:
    """Claim: once the leader stops answering, a heartbeat asks each other controller before it
    again, even when a follower still names the silent one as leader (it has not noticed yet). Before, the next URL was picked by attempt number (the
    stopped leader, second in the list, was asked again at once) and a follower's stale hint
    sent the client back to it: each costs a heartbeat attempt's bound, and a broker whose
    heartbeats spend 2 s on a stopped controller is fenced by the next leader."""
    async def run() -> None:
        hits: list[str] = []
        silent, silent_url = await _serve(_counting_silent(hits))
        named: list[str] = [silent_url]
        follower, follower_url = await _serve(_follower(named))
        leader, leader_url = await _serve(_leader())
        try:
            async with ControlClient([follower_url, silent_url, leader_url], secret=None,
                                     heartbeat_timeout_ms=300, retry_backoff_ms=10) as cc:
                cc.leader_url = silent_url   # the leader it knew
                beat = await asyncio.wait_for(
                    cc.heartbeat(HeartbeatRequest(broker_id=1, incarnation_id="i", metadata_offset=0)), 10)
                assert beat.fenced is False and cc.leader_url == leader_url
                assert len(hits) == 1, hits
        finally:
            for r in (silent, follower, leader):
                await r.cleanup()
    asyncio.run(run())


def test_limits_are_checked() -> None:
    """A zero or negative bound is refused with its name, not turned into "no timeout"."""
    for name in ("request_timeout_ms", "heartbeat_timeout_ms", "long_poll_slack_ms"):
        try:
            ControlClient(["http://127.0.0.1:1"], secret=None, **{name: 0})
        except ValueError as exc:
            assert name in str(exc)
        else:
            raise AssertionError(f"{name}=0 accepted")
