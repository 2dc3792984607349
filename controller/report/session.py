"""A Spark session set up for snapshot reports, the same way on `local[*]` and on a cluster.

The data source's module must be importable by the Python workers. On a
cluster they do not have Biplane installed, so the session ships the
`common` and `controller` packages as a zip with `addPyFile`; it does the same
locally, so both runs use the same code path.
"""
from __future__ import annotations

import os
import sys
import tempfile
import zipfile
from pathlib import Path

from pyspark.sql import SparkSession

from controller.report.datasource import SnapshotDataSource

PACKAGES = ("common", "controller")


def package_zip(directory: Path) -> Path:
    """Zip of the Python sources of Biplane's packages (no tests, no caches)."""
    root = Path(__file__).resolve().parents[2]
    target = directory / "biplane-packages.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for package in PACKAGES:
            for path in sorted((root / package).rglob("*.py")):
                archive.write(path, path.relative_to(root).as_posix())
    return target


def start_session(master: str = "local[*]", *, app_name: str = "biplane-capacity",
                  log_level: str = "ERROR") -> SparkSession:
    # Workers must run the same Python (and venv) as the driver unless told otherwise.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master(master).appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "8")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.driver.extraJavaOptions", "-Dlog4j.rootLogger=ERROR")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel(log_level)
    spark.sparkContext.addPyFile(str(package_zip(Path(tempfile.mkdtemp(prefix="biplane-report-")))))
    spark.dataSource.register(SnapshotDataSource)
    return spark
