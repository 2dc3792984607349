"""The process-log check (tests/log_check.py, run after every test by conftest.py) finds what it
claims: ERROR lines and tracebacks, nothing else; it reads each file once; and it fails a test
whose process log holds an unexpected one, unless the test names it."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from log_check import LogWatch, error_entries, unexpected

HERE = Path(__file__).resolve().parent

CLEAN = """\
broker 1 listening on 127.0.0.1:9092
2026-11-24 13:31:36,100 level=INFO logger=biplane.broker registered
2026-11-24 13:31:36,200 level=WARNING logger=biplane.broker.lifecycle heartbeat failed: timeout
"""

WITH_ERRORS = """\
2026-11-24 13:31:36,100 level=INFO logger=biplane.broker registered
2026-11-24 13:31:36,434 level=ERROR logger=biplane.controller.rpc rpc /rpc/v1/heartbeat failed
Traceback (most recent call last):
  File "controller/rpc.py", line 104, in heartbeat
AttributeError: 'Decisions' object has no attribute 'fence_shutting_down'
2026-11-24 13:31:36,500 level=WARNING logger=biplane.x retrying
Traceback (most recent call last):
  File "x.py", line 1, in f
ValueError: boom
2026-11-24 13:31:36,600 level=INFO logger=biplane.x fine again
2026-11-24 13:31:36,700 level=CRITICAL logger=biplane.x disk gone
"""


def test_a_clean_log_has_no_error_entries():
    assert error_entries(CLEAN) == []


def test_error_lines_and_tracebacks_are_entries_with_their_lines():
    entries = error_entries(WITH_ERRORS, path=Path("c.log"))
    assert [e.line_number for e in entries] == [2, 6, 11]
    assert "AttributeError: 'Decisions' object has no attribute" in entries[0].text
    assert entries[1].text.startswith("2026-11-24 13:31:36,500 level=WARNING") and "ValueError: boom" in entries[1].text
    assert "fine again" not in entries[1].text
    assert "disk gone" in entries[2].text


def test_a_traceback_on_stderr_alone_is_an_entry():
    text = "Exception in thread Thread-1:\nTraceback (most recent call last):\nRuntimeError: x\n"
    assert [e.text for e in error_entries(text)] == [text.rstrip("\n")]


def test_named_entries_are_allowed_and_others_are_not():
    entries = error_entries(WITH_ERRORS)
    left = unexpected(entries, [r"no attribute 'fence_shutting_down'", r"disk gone"])
    assert [e.line_number for e in left] == [6]


# These two write error logs under their tmp_path on purpose: the suite's check sees them too.
@pytest.mark.expected_log_errors(r"biplane\.controller\.rpc|biplane\.x")
def test_the_watch_reads_each_line_once_and_waits_for_a_whole_line(tmp_path):
    log = tmp_path / "b.log"
    log.write_text(CLEAN)
    watch = LogWatch()
    watch.watch(log)
    assert watch.read_new() == []
    with open(log, "a") as f:
        f.write(WITH_ERRORS + "2026-11-24 13:31:37,000 level=ERROR logger=biplane.x half a li")
    first = watch.read_new()
    assert [e.line_number for e in first] == [5, 9, 14]
    assert watch.read_new() == []
    with open(log, "a") as f:
        f.write("ne\n")
    again = watch.read_new()
    assert [(e.line_number, e.text.endswith("half a line")) for e in again] == [(15, True)]


@pytest.mark.expected_log_errors(r"biplane\.controller\.rpc|biplane\.x")
def test_watch_tree_finds_every_log_under_a_directory(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "broker-1.log").write_text(WITH_ERRORS)
    (tmp_path / "notes.txt").write_text(WITH_ERRORS)
    (tmp_path / "a" / "00000000000000000000.log").write_text(WITH_ERRORS)   # a partition segment
    watch = LogWatch()
    watch.watch_tree(tmp_path)
    assert len(watch) == 1 and len(watch.read_new()) == 3


INNER = '''
import pytest

LINES = "2026-11-24 13:31:36,434 level=ERROR logger=biplane.controller.rpc rpc failed\\n" \\
        "Traceback (most recent call last):\\nAttributeError: nope\\n"

def test_writes_an_unexpected_traceback(tmp_path):
    (tmp_path / "controller-1.log").write_text(LINES)

@pytest.mark.expected_log_errors(r"AttributeError: nope")
def test_writes_an_expected_traceback(tmp_path):
    (tmp_path / "controller-1.log").write_text(LINES)

def test_writes_a_clean_log(tmp_path):
    (tmp_path / "controller-1.log").write_text("2026-11-24 13:31:36,434 level=INFO logger=x fine\\n")
'''


@pytest.mark.timeout(60)
def test_the_suite_check_fails_a_test_whose_process_log_has_an_unexpected_traceback(tmp_path):
    """Runs a small suite with this directory's conftest.py in a fresh interpreter: the test
    that leaves a traceback in a log under its tmp_path errors at teardown, naming the file and
    the entry; the one that names it and the clean one pass."""
    (tmp_path / "conftest.py").write_text((HERE / "conftest.py").read_text())
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(INNER))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                        "--rootdir", str(tmp_path), str(tmp_path / "test_inner.py")],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=50)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "3 passed, 1 error" in out, out
    assert "ERROR at teardown of test_writes_an_unexpected_traceback" in out, out
    assert "controller-1.log:1:" in out and "AttributeError: nope" in out, out
