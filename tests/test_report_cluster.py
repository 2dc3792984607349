"""`biplane report capacity` on a Spark standalone cluster: a master and two workers started from
the PySpark installation, bound to 127.0.0.1 on free ports, stopped by pid at the end.

Claims: the report run with `--master spark://127.0.0.1:PORT` has its executors on both
workers (each worker's work directory holds the application's executor), and gives the same
figures as the same report on `local[2]`: every CSV equal (floats to 1e-9 relative: sums may
be added in another order) and the same move plan files. The same split count is given to
both runs, so they read the same groups of files.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pandas as pd
import pytest

from controller.report.history import HistorySpec, generate_history
from controller_harness import free_port, run_cli, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

SPEC = HistorySpec(brokers=5, partitions=20, snapshots=24, interval_ms=30 * 60_000, seed=5, legacy_snapshots=4)
REPORT_TIMEOUT_S = 600  # JVMs on a loaded 2-core machine: one report took ~2 min at load 14
WORKER_MEMORY = "1g"


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


class SparkDaemon:
    """One Spark master or worker JVM in the foreground of its own process (spark-class execs
    java), logging to `log_path`."""

    def __init__(self, name: str, args: list[str], log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        env = dict(os.environ, SPARK_HOME=str(spark_home()), SPARK_LOCAL_IP="127.0.0.1",
                   SPARK_NO_DAEMONIZE="1", PYSPARK_PYTHON=sys.executable)
        self.log = open(log_path, "wb")
        self.process = subprocess.Popen([str(spark_home() / "bin" / "spark-class"), *args], stdout=self.log,
                                        stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.log.close()

    def errors(self) -> list[str]:
        """Log lines at level ERROR (Spark's pattern: `yy/MM/dd HH:mm:ss LEVEL logger: message`)."""
        return [line for line in self.log_path.read_text(errors="replace").splitlines() if " ERROR " in line]


def master_state(ui_port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=5) as answer:
        return json.loads(answer.read())


@pytest.fixture(scope="module")
def standalone(tmp_path_factory):
    root = tmp_path_factory.mktemp("spark-standalone")
    port, ui_port = free_port(), free_port()
    master_url = f"spark://127.0.0.1:{port}"
    daemons = [SparkDaemon("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                      "--port", str(port), "--webui-port", str(ui_port)], root / "master.out")]
    work_dirs = []
    try:
        wait_until(lambda: _answers(ui_port), 120, "the Spark master's web UI", interval_s=1)
        for i in (1, 2):
            work_dir = root / f"worker-{i}-work"
            work_dirs.append(work_dir)
            daemons.append(SparkDaemon(f"worker-{i}", [
                "org.apache.spark.deploy.worker.Worker", master_url, "--host", "127.0.0.1",
                "--port", str(free_port()), "--webui-port", str(free_port()), "--cores", "1",
                "--memory", WORKER_MEMORY, "--work-dir", str(work_dir)], root / f"worker-{i}.out"))
        wait_until(lambda: len([w for w in master_state(ui_port)["workers"] if w["state"] == "ALIVE"]) == 2, 180,
                   "two workers registered with the master", interval_s=1)
        yield master_url, work_dirs, daemons
    finally:
        for daemon in reversed(daemons):
            daemon.stop()


def _answers(ui_port: int) -> bool:
    try:
        master_state(ui_port)
    except OSError:
        return False
    return True


def run_report(history: Path, out: Path, master: str) -> None:
    started = time.monotonic()
    done = run_cli("report", "capacity", str(history), "--out", str(out), "--master", master, "--splits", "4",
                   "--fit-days", "0.3", "--lose-broker", "1",
                   env_extra={"PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"},
                   timeout_s=REPORT_TIMEOUT_S)
    assert done.returncode == 0, f"{master} after {time.monotonic() - started:.0f}s:\n{done.stdout}\n{done.stderr}"
    assert "Traceback" not in done.stderr, done.stderr
    assert "nearest to full:" in done.stdout


def test_report_on_a_standalone_cluster_matches_local(standalone, tmp_path):
    master_url, work_dirs, daemons = standalone
    history = tmp_path / "history"
    generate_history(SPEC, history)
    run_report(history, tmp_path / "cluster", master_url)
    for work_dir in work_dirs:  # each worker ran an executor of the report's application
        executors = list(work_dir.glob("app-*/*/stderr"))
        assert executors, f"no executor ran in {work_dir}"
    run_report(history, tmp_path / "local", "local[2]")

    names = sorted(p.name for p in (tmp_path / "local").iterdir() if p.suffix in (".csv", ".json"))
    assert names == sorted(p.name for p in (tmp_path / "cluster").iterdir() if p.suffix in (".csv", ".json"))
    assert {"forecast.csv", "broker_timeseries.csv", "reassign_balance.json", "reassign_lose_broker_1.json"} <= set(names)
    for name in names:
        local, cluster = tmp_path / "local" / name, tmp_path / "cluster" / name
        if name.endswith(".json"):
            assert json.loads(local.read_text()) == json.loads(cluster.read_text()), name
            continue
        if local.read_text().strip() == "":
            assert cluster.read_text().strip() == "", name
            continue
        left, right = pd.read_csv(local), pd.read_csv(cluster)
        assert list(left.columns) == list(right.columns) and len(left) == len(right), name
        for column in left.columns:
            if pd.api.types.is_float_dtype(left[column]):
                assert left[column].to_numpy() == pytest.approx(right[column].to_numpy(), rel=1e-9, nan_ok=True), \
                    (name, column)
            else:
                assert left[column].fillna("").astype(str).tolist() == right[column].fillna("").astype(str).tolist(), \
                    (name, column)
    for daemon in daemons:
        assert daemon.errors() == [], (daemon.name, daemon.errors())
