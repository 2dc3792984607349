"""`pip install biplane` is lean: brokers, controllers, the SDK and the admin CLI import none
of the reports' packages (Spark, pandas, matplotlib: about 1 GB), and `biplane report`
without them says which extra to install instead of a traceback."""
from __future__ import annotations

import subprocess
import sys
import textwrap

from controller.report.cli import REPORT_PACKAGES


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60)


def test_the_processes_and_the_sdk_import_no_report_package():
    done = run_python(f"""
        import sys
        import common.cli, controller.main, controller.admin_cli, dataplane.broker.main
        import dataplane.client, dataplane.client.cli, dataplane.cluster.up
        print(sorted(m for m in sys.modules if m.split(".")[0] in {REPORT_PACKAGES!r}))
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_report_without_its_extra_names_the_extra_to_install(tmp_path):
    done = run_python(f"""
        import sys
        sys.modules["pyspark"] = None  # as if the reports extra were not installed
        from common.cli import main
        sys.exit(main(["report", "capacity", {str(tmp_path)!r}, "--out", {str(tmp_path / "out")!r}]))
    """)
    assert done.returncode == 2
    assert "pip install 'biplane[reports]'" in done.stderr and "pyspark" in done.stderr
    assert "Traceback" not in done.stderr
