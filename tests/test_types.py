"""The static type check: mypy over common/, controller/ and dataplane/ with the settings in
pyproject.toml ([tool.mypy]: strict on the cores, untyped bodies checked everywhere).

Claim: the code type-checks, so a call to a method that does not exist (issue 12: the RPC
handler called `fence_shutting_down` on an object without it) fails the suite, not production.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parent.parent


def _mypy(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    # The incremental cache (.mypy_cache, ignored by git) makes a rerun take seconds.
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=280,
    )


def test_packages_type_check() -> None:
    """mypy finds no error in common/, controller/ and dataplane/."""
    run = _mypy()
    assert run.returncode == 0, (
        f"mypy found errors (exit {run.returncode}); reproduce with `python -m mypy` "
        "(it is in the test extra: pip install -e '.[test]'):\n"
        f"{run.stdout}{run.stderr}"
    )


def _check_snippet(tmp_path: Path, source: str) -> subprocess.CompletedProcess[str]:
    """mypy with the project's settings over one snippet that imports the packages."""
    snippet = tmp_path / "snippet.py"
    snippet.write_text(source)
    return _mypy(str(snippet))


def test_missing_method_is_caught(tmp_path: Path) -> None:
    """The check would have caught issue 12's bug: calling a method a typed object lacks."""
    run = _check_snippet(tmp_path, (
        "from dataplane.replica.core import Replica\n"
        "def stop(replica: Replica) -> None:\n"
        "    replica.fence_shutting_down(7)\n"
    ))
    assert run.returncode == 1, run.stdout + run.stderr
    assert '"Replica" has no attribute "fence_shutting_down"' in run.stdout, run.stdout


def test_missing_decision_is_caught(tmp_path: Path) -> None:
    """The controller's handlers call the decisions package directly, so a decision that does not
    exist (issue 12's `fence_shutting_down` on a facade that lacked it) is a type error."""
    run = _check_snippet(tmp_path, (
        "from controller import decisions as d\n"
        "from common.metadata.image import MetadataImage\n"
        "def fence(image: MetadataImage) -> None:\n"
        "    d.fence_shutting_downs(image)\n"
    ))
    assert run.returncode == 1, run.stdout + run.stderr
    assert 'Module has no attribute "fence_shutting_downs"' in run.stdout, run.stdout
