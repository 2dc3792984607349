"""Pieces of `biplane up` and the data CLI that need no cluster: finding cluster.json, planning
a (resumed) cluster, formatting records, percentiles."""
from __future__ import annotations

import argparse
import json
import socket

import pytest

from dataplane.client import discovery
from dataplane.client.cli import format_record, percentile
from dataplane.client.errors import NoClusterError
from dataplane.client.records import ConsumerRecord
from dataplane.cluster.state import child_pids, pid_alive, read_state, write_state
from dataplane.cluster.up import UpError, broker_child, parse_topics, plan


def args(**kw) -> argparse.Namespace:
    return argparse.Namespace(controllers=kw.get("controllers"), brokers=kw.get("brokers"),
                              auto_create_topics=kw.get("auto_create_topics"))


def test_cluster_file_is_found_by_data_dir_then_the_env_then_dot_biplane(tmp_path, monkeypatch):
    """--data-dir (the `data_dir` argument) beats BIPLANE_CLUSTER, which beats ./.biplane; a place
    named explicitly that holds no cluster is an error naming it, never a fall back to ./.biplane."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("BIPLANE_CLUSTER", raising=False)
    with pytest.raises(NoClusterError, match="scripts/up"):
        discovery.load_cluster_file()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    doc = {"brokers": {"2": {"address": "127.0.0.1:2"}, "1": {"address": "127.0.0.1:1"}},
           "controllers": {"1": {"api_url": "http://127.0.0.1:9"}}, "admin_token": "t"}
    (elsewhere / "cluster.json").write_text(json.dumps(doc))
    monkeypatch.setenv("BIPLANE_CLUSTER", str(elsewhere))          # a directory
    assert discovery.default_bootstrap() == "127.0.0.1:1,127.0.0.1:2"
    assert discovery.default_data_dir() == elsewhere
    monkeypatch.setenv("BIPLANE_CLUSTER", str(elsewhere / "cluster.json"))  # or the file
    assert discovery.default_admin() == (["http://127.0.0.1:9"], "t")
    local = dict(doc, admin_token="local")
    (tmp_path / ".biplane").mkdir()
    (tmp_path / ".biplane" / "cluster.json").write_text(json.dumps(local))
    assert discovery.default_admin()[1] == "t"                      # the env comes before ./.biplane
    assert discovery.default_admin(tmp_path / ".biplane")[1] == "local"   # and --data-dir before both
    monkeypatch.setenv("BIPLANE_CLUSTER", str(tmp_path / "gone"))
    with pytest.raises(NoClusterError, match=r"BIPLANE_CLUSTER=.*gone.*biplane up --data-dir"):
        discovery.load_cluster_file()
    monkeypatch.delenv("BIPLANE_CLUSTER")
    assert discovery.default_admin()[1] == "local"
    (tmp_path / ".biplane" / "cluster.json").write_text("{broken")
    with pytest.raises(NoClusterError, match="not valid JSON"):
        discovery.load_cluster_file()


def test_the_hint_after_no_answer_says_what_is_stopped_and_never_to_start_what_runs(tmp_path, monkeypatch):
    """After `biplane stop broker 1..3` the CLI said 'is the cluster running? Start it with biplane
    up', which then failed: a cluster already runs. The hint reads the cluster file's states."""
    import dataplane.cluster.up as up
    monkeypatch.delenv("BIPLANE_CLUSTER", raising=False)
    monkeypatch.setattr(up, "supervisor_alive", lambda doc: 4242 if doc.get("supervisor") else None)
    doc = {"status": "running", "supervisor": {"pid": 4242}, "brokers": {"1": {"state": "stopped"}, "2": {"state": "running"},
                                            "3": {"state": "stopped"}},
           "controllers": {"1": {"state": "running"}}}
    (tmp_path / "cluster.json").write_text(json.dumps(doc))
    hint = discovery.not_answering_hint(tmp_path, "brokers")
    assert "brokers 1, 3 were stopped" in hint and f"`biplane start broker 1 --data-dir {tmp_path}`" in hint
    assert "biplane up" not in hint
    hint = discovery.not_answering_hint(tmp_path, "controllers")
    assert "runs" in hint and "biplane cluster status" in hint and "biplane up" not in hint
    (tmp_path / "cluster.json").write_text(json.dumps({**doc, "status": "stopped"}))
    assert f"Start it with `biplane up --data-dir {tmp_path} --detach`" in discovery.not_answering_hint(tmp_path, "brokers")
    # Left 'running' by a supervisor killed with SIGKILL, or by a reboot: nothing runs.
    (tmp_path / "cluster.json").write_text(json.dumps({**doc, "supervisor": None}))
    assert f"Start it with `biplane up --data-dir {tmp_path} --detach`" in discovery.not_answering_hint(tmp_path, "brokers")
    (tmp_path / "cluster.json").write_text(json.dumps({**doc, "brokers": {"2": {"state": "stopped"}}}))
    assert "but broker 2 was stopped" in discovery.not_answering_hint(tmp_path, "brokers")
    assert "Start it with `biplane up" in discovery.not_answering_hint(tmp_path / "none", "brokers")


def test_plan_defaults_and_resume_keeps_identity_and_free_ports(tmp_path):
    first, notes = plan(args(), tmp_path, None)
    assert (len(first["controllers"]), len(first["brokers"])) == (3, 3) and notes == []
    assert [c["priority"] for c in first["controllers"].values()] == [3, 2, 1]
    ports = [c["api_port"] for c in first["controllers"].values()] + [b["port"] for b in first["brokers"].values()]
    assert len(set(ports)) == len(ports)
    again, notes = plan(args(), tmp_path, first)
    assert again["admin_token"] == first["admin_token"] and again["cluster_secret"] == first["cluster_secret"]
    assert again["brokers"] == first["brokers"] and notes == []
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", first["brokers"]["1"]["port"]))
        moved, notes = plan(args(), tmp_path, first)
    assert moved["brokers"]["1"]["port"] != first["brokers"]["1"]["port"]
    assert "broker 1: port" in notes[0]
    more, _ = plan(args(brokers=4), tmp_path, first)
    assert list(more["brokers"]) == ["1", "2", "3", "4"]


def test_plan_keeps_auto_create_topics_as_before_unless_told(tmp_path):
    first, _ = plan(args(auto_create_topics=True), tmp_path, None)
    assert first["auto_create_topics"] is True
    assert "--auto-create-topics" in broker_child(first, first["brokers"]["1"], tmp_path).args
    again, _ = plan(args(), tmp_path, first)
    assert again["auto_create_topics"] is True
    off, _ = plan(args(auto_create_topics=False), tmp_path, again)
    assert off["auto_create_topics"] is False
    assert "--auto-create-topics" not in broker_child(off, off["brokers"]["1"], tmp_path).args


def test_plan_rejects_bad_sizes_and_a_changed_quorum(tmp_path):
    with pytest.raises(UpError, match="1, 3 or 5"):
        plan(args(controllers=2), tmp_path, None)
    with pytest.raises(UpError, match="--brokers 0"):
        plan(args(brokers=0), tmp_path, None)
    first, _ = plan(args(controllers=1), tmp_path, None)
    with pytest.raises(UpError, match="cannot change on restart"):
        plan(args(controllers=3), tmp_path, first)


def test_state_file_round_trips_privately_and_lists_children(tmp_path):
    state = {"controllers": {"1": {"pid": 11}}, "brokers": {"1": {"pid": 21}, "2": {"pid": None}}}
    write_state(tmp_path, state)
    assert read_state(tmp_path) == state
    assert (tmp_path / "cluster.json").stat().st_mode & 0o077 == 0
    assert child_pids(state) == {"controller 1": 11, "broker 1": 21}


def test_pid_alive_checks_the_command_line_marker():
    import os
    assert pid_alive(os.getpid())
    assert not pid_alive(os.getpid(), "no-such-marker-in-my-cmdline")
    assert not pid_alive(None) and not pid_alive(0)


def test_record_formats_and_percentiles():
    r = ConsumerRecord(topic="t", partition=1, offset=7, timestamp_ms=5, key=b"k", value=b"v\xff",
                       headers=(("h", b"x"),))
    assert format_record(r, "text", False) == "v\\xff"
    assert format_record(r, "text", True) == "k\tv\\xff"
    assert json.loads(format_record(r, "json", False)) == {
        "topic": "t", "partition": 1, "offset": 7, "timestamp_ms": 5, "key": "k", "value": "v\\xff",
        "headers": {"h": "x"}}
    values = [float(i) for i in range(1, 1001)]
    assert (percentile(values, 0.5), percentile(values, 0.99), percentile(values, 0.999)) == (500.0, 990.0, 999.0)


def test_topic_specs_for_up():
    assert parse_topics(["a", "b:6", "c:2:1"], brokers=2) == [("a", 3, 2), ("b", 6, 2), ("c", 2, 1)]
    for bad in ("", "x:0", "x:1:2:3", "x:y"):
        with pytest.raises(UpError, match="NAME"):
            parse_topics([bad], brokers=3)
