"""The supervision policy of `biplane up` (dataplane/cluster/supervision.py), with no process:
time is an argument, the driver's part is played by hand."""
from __future__ import annotations

import pytest

from dataplane.cluster.supervision import (Action, Backoff, CommandError, Kill, Note, Phase, Start, Supervision,
                                           Terminate)


def running(names: tuple[str, ...] = ("broker 1", "controller 1"), **kw: object) -> tuple[Supervision, dict[str, int]]:
    """A supervision whose children all run, started at t=0, with pids 100, 101, ..."""
    sup = Supervision(children=names, **kw)  # type: ignore[arg-type]
    pids = {}
    for name in names:
        sup.launch(name)
    for i, action in enumerate(a for a in sup.tick(0.0) if isinstance(a, Start)):
        pids[action.child] = 100 + i
        sup.started(action.child, pid=100 + i, now_s=0.0)
    assert all(sup.view(n).phase is Phase.RUNNING for n in names)
    # Every start is a line of supervisor.log, the first ones too (they had none).
    assert sorted(events(sup.tick(0.0))) == ["child_started"] * len(names)
    return sup, pids


def starts(actions: list[Action]) -> list[str]:
    return [a.child for a in actions if isinstance(a, Start)]


def events(actions: list[Action]) -> list[str]:
    return [a.event for a in actions if isinstance(a, Note)]


def test_backoff_doubles_from_half_a_second_to_thirty():
    """The default policy: 0.5 s, doubling per exit in a row, capped at 30 s."""
    b = Backoff()
    assert [b.delay_s(n) for n in range(1, 10)] == [0.5, 1, 2, 4, 8, 16, 30, 30, 30]
    assert b.delay_s(10_000) == 30   # no overflow for a child that crashed for days


def test_backoff_starts_afresh_after_a_stable_run():
    """An exit after `stable_s` up counts as the first; a quick one adds to the run."""
    b = Backoff(stable_s=10)
    assert b.failures_after_exit(5, up_s=10.0) == 1
    assert b.failures_after_exit(5, up_s=9.9) == 6
    assert b.failures_after_exit(0, up_s=0.1) == 1


@pytest.mark.parametrize("kw", [dict(initial_s=0), dict(initial_s=5, max_s=1), dict(factor=0.5), dict(stable_s=-1)])
def test_backoff_refuses_a_policy_that_could_spin(kw):
    with pytest.raises(ValueError):
        Backoff(**kw)


def test_a_child_that_dies_is_started_again_after_the_backoff():
    """kill -9 of a running child: logged, not restarted before 0.5 s, restarted at 0.5 s,
    counted as a restart with its new pid."""
    sup, pids = running()
    sup.exited("broker 1", code=-9, now_s=20.0)
    actions = sup.tick(20.0)
    assert starts(actions) == [] and events(actions) == ["child_exited"]
    exited = next(a for a in actions if isinstance(a, Note))
    assert exited.warning and ("code", -9) in exited.fields and ("restart_in_s", 0.5) in exited.fields
    assert sup.view("broker 1").phase is Phase.BACKOFF and sup.view("broker 1").retry_at_s == 20.5
    assert starts(sup.tick(20.49)) == []
    assert starts(sup.tick(20.5)) == ["broker 1"]
    sup.started("broker 1", pid=200, now_s=20.5)
    assert events(sup.tick(20.5)) == ["child_restarted"]
    view = sup.view("broker 1")
    assert (view.phase, view.pid, view.restarts, view.crashes) == (Phase.RUNNING, 200, 1, 1)
    assert sup.view("controller 1").restarts == 0


def test_a_crash_looping_child_backs_off_and_never_spins():
    """A child that dies 0.1 s after every start is started at most once per backoff delay:
    the gaps between starts double up to 30 s, and over 10 simulated minutes it is started
    about 25 times (a spinning supervisor would start it thousands of times)."""
    sup, _ = running(("broker 1",))
    now, pid, start_times = 20.0, 100, []
    sup.exited("broker 1", code=1, now_s=now)
    while now < 620.0:
        now = round(now + 0.1, 1)
        for action in sup.tick(now):
            if isinstance(action, Start):
                pid += 1
                sup.started("broker 1", pid=pid, now_s=now)
                start_times.append(now)
                sup.exited("broker 1", code=1, now_s=round(now + 0.1, 1))
    gaps = [round(b - a, 1) for a, b in zip(start_times, start_times[1:])]
    assert gaps[:7] == [1.1, 2.1, 4.1, 8.1, 16.1, 30.1, 30.1], gaps
    assert all(g >= 30 for g in gaps[6:])
    assert len(start_times) < 30
    assert sup.view("broker 1").failures_in_a_row == len(start_times) + 1


def test_a_stop_sends_sigterm_then_sigkill_after_the_wait_and_the_child_stays_down():
    sup, pids = running(stop_wait_s=5.0)
    sup.stop("broker 1", now_s=30.0)
    actions = sup.tick(30.0)
    assert [a for a in actions if isinstance(a, Terminate)] == [Terminate(child="broker 1", pid=pids["broker 1"])]
    assert sup.view("broker 1").phase is Phase.STOPPING
    assert not [a for a in sup.tick(34.9) if isinstance(a, Kill)]
    assert [a for a in sup.tick(35.0) if isinstance(a, Kill)] == [Kill(child="broker 1", pid=pids["broker 1"])]
    assert not [a for a in sup.tick(40.0) if isinstance(a, Kill)]   # once
    sup.exited("broker 1", code=-9, now_s=35.1)
    assert sup.view("broker 1").phase is Phase.STOPPED
    assert starts(sup.tick(1000.0)) == []   # not restarted, however long
    assert sup.view("broker 1").crashes == 0


def test_start_brings_a_stopped_child_back():
    sup, _ = running()
    sup.stop("broker 1", now_s=1.0)
    sup.tick(1.0)
    sup.exited("broker 1", code=0, now_s=1.5)
    sup.start("broker 1", now_s=2.0)
    assert starts(sup.tick(2.0)) == ["broker 1"]
    sup.started("broker 1", pid=300, now_s=2.0)
    assert sup.view("broker 1").phase is Phase.RUNNING and sup.view("broker 1").restarts == 1
    with pytest.raises(CommandError, match="already runs"):
        sup.start("broker 1", now_s=3.0)


def test_restart_stops_then_starts_at_once_without_backoff():
    sup, pids = running()
    sup.restart("controller 1", now_s=50.0)
    assert [a for a in sup.tick(50.0) if isinstance(a, Terminate)] == [Terminate(child="controller 1",
                                                                                 pid=pids["controller 1"])]
    sup.exited("controller 1", code=0, now_s=50.3)
    assert starts(sup.tick(50.3)) == ["controller 1"]
    sup.started("controller 1", pid=400, now_s=50.3)
    view = sup.view("controller 1")
    assert (view.phase, view.pid, view.crashes, view.failures_in_a_row) == (Phase.RUNNING, 400, 0, 0)


def test_start_or_restart_of_a_child_in_backoff_starts_it_now():
    sup, _ = running()
    now = 0.1
    for _ in range(5):   # five crashes 0.1 s after each start: the next try is 16 s away
        sup.exited("broker 1", code=1, now_s=now)
        retry = sup.view("broker 1").retry_at_s
        assert retry is not None
        assert starts(sup.tick(retry)) == ["broker 1"]
        sup.started("broker 1", pid=500, now_s=retry)
        now = retry + 0.1
    sup.exited("broker 1", code=1, now_s=now)
    assert sup.view("broker 1").retry_at_s == pytest.approx(now + 16)
    sup.restart("broker 1", now_s=now + 1)
    assert starts(sup.tick(now + 1)) == ["broker 1"]
    sup.started("broker 1", pid=501, now_s=now + 1)
    assert sup.view("broker 1").failures_in_a_row == 0


def test_stop_of_a_child_in_backoff_cancels_its_restart():
    sup, _ = running()
    sup.exited("broker 1", code=-9, now_s=1.0)
    sup.stop("broker 1", now_s=1.1)
    assert sup.view("broker 1").phase is Phase.STOPPED
    assert starts(sup.tick(100.0)) == []


def test_after_shutdown_nothing_is_started_again():
    """`biplane down` / Ctrl-C: a child that dies during the shutdown stays down."""
    sup, _ = running()
    sup.exited("broker 1", code=-9, now_s=1.0)      # waiting for its restart
    sup.shutdown()
    sup.exited("controller 1", code=0, now_s=1.2)
    assert starts(sup.tick(100.0)) == []
    assert {v.phase for v in sup.views()} == {Phase.STOPPED}
    with pytest.raises(CommandError, match="shutting down"):
        sup.restart("broker 1", now_s=101.0)


def test_an_unknown_child_is_a_clear_error():
    sup, _ = running()
    with pytest.raises(CommandError, match="no child named 'broker 9'; the children are broker 1, controller 1"):
        sup.stop("broker 9", now_s=0.0)


def test_a_child_that_cannot_be_spawned_backs_off_like_a_crash():
    sup, _ = running()
    sup.exited("broker 1", code=1, now_s=1.0)
    assert starts(sup.tick(1.5)) == ["broker 1"]
    sup.start_failed("broker 1", reason="No such file", now_s=1.5)
    assert events(sup.tick(1.5)) == ["child_start_failed", "child_exited"]
    assert sup.view("broker 1").phase is Phase.BACKOFF and sup.view("broker 1").retry_at_s == 2.5


def test_the_status_line_shows_restarts_a_child_waiting_to_restart_and_a_stopped_one():
    from dataplane.cluster.up import supervision_parts
    sup, _ = running(("broker 1", "broker 2", "controller 1"))
    sup.exited("broker 1", code=-9, now_s=20.0)
    sup.tick(20.5)
    sup.started("broker 1", pid=300, now_s=20.5)
    sup.exited("broker 1", code=-9, now_s=21.0)      # again, quickly: 1 s backoff
    sup.stop("controller 1", now_s=21.0)
    sup.tick(21.0)
    sup.exited("controller 1", code=0, now_s=21.2)
    assert supervision_parts(sup.views(), now_s=21.6) == [
        "restarts b1:1", "DOWN broker 1 (exit -9, retry in 0.4 s)", "STOPPED controller 1"]
    sup.stop("broker 2", now_s=22.0)
    assert "stopping broker 2" in supervision_parts(sup.views(), now_s=22.0)


def test_the_control_channel_refuses_a_wrong_token_and_passes_commands_to_the_loop():
    """The HTTP thread answers 401 without the admin token, and otherwise hands the command to
    the supervisor's loop (played here by a thread) and returns the loop's reply."""
    import threading

    from dataplane.cluster.control import ControlServer, Reply, send_command
    server = ControlServer(token="s3cret", children=lambda: [], reply_wait_s=5)
    try:
        r = send_command(server.url, "wrong", kind="broker", node_id="1", verb="stop", timeout_s=5)
        assert (r.ok, r.status) == (False, 401)
        assert server.commands.empty()

        def loop() -> None:
            command = server.commands.get(timeout=5)
            command.reply.put(Reply(ok=True, message=f"did {command.verb} of {command.child}", pid=7))
        t = threading.Thread(target=loop)
        t.start()
        r = send_command(server.url, "s3cret", kind="broker", node_id="1", verb="restart", timeout_s=5)
        t.join()
        assert (r.ok, r.message, r.pid) == (True, "did restart of broker 1", 7)
    finally:
        server.close()
