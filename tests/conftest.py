"""Suite-wide checks.

After every test, the logs of the processes it started (those the harnesses
registered, and every `*.log` under its `tmp_path`) must hold no ERROR or
CRITICAL line and no traceback, except the entries the test names:

    @pytest.mark.expected_log_errors(r"broker task .* ended", ...)   # regex, re.search

A failure names each file, line and entry (tests/log_check.py).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import pytest

import log_check

# The replica cores check their own invariants after every step in the whole suite,
# including the brokers it starts (dataplane/replica/invariants.py).
os.environ.setdefault("BIPLANE_CORE_ASSERTIONS", "1")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "expected_log_errors(*patterns): error entries (regexes) this test expects in the logs "
                   "of the processes it starts; any other ERROR line or traceback fails it")


def _allowed(item: pytest.Item) -> list[str]:
    return [p for mark in item.iter_markers("expected_log_errors") for p in mark.args]


@pytest.fixture(autouse=True)
def process_logs_are_clean(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fails the test (at teardown) on an unexpected error entry in a process log."""
    yield
    tmp_path = request.node.funcargs.get("tmp_path") if hasattr(request.node, "funcargs") else None
    if isinstance(tmp_path, Path):
        log_check.WATCH.watch_tree(tmp_path)
    found = log_check.unexpected(log_check.WATCH.read_new(), _allowed(request.node))
    if found:
        pytest.fail(log_check.failure_message(found), pytrace=False)
