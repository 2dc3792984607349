"""A Spark session set up for snapshot reports, the same way on `local[*]` and on a cluster.

The data source's module must be importable by the Python workers. On a
cluster they do not have Biplane installed, so the session ships the
`common` and `controller` packages as a zip with `addPyFile`; it does the same
locally, so both runs use the same code path. Executors still need Python
3.11+ with pyarrow and pandas < 3; point PYSPARK_PYTHON at it on a cluster
(locally it defaults to this interpreter).
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


def _quiet_log4j2(level: str) -> Path:
    """A log4j2 config that sends only `level` and worse to stderr: Spark's INFO and WARN lines
    would drown the report's own progress lines."""
    path = Path(tempfile.gettempdir()) / f"biplane-report-log4j2-{level.lower()}.properties"
    path.write_text(
        f"rootLogger.level = {level.lower()}\n"
        "rootLogger.appenderRef.stderr.ref = stderr\n"
        "appender.stderr.type = Console\n"
        "appender.stderr.name = stderr\n"
        "appender.stderr.target = SYSTEM_ERR\n"
        "appender.stderr.layout.type = PatternLayout\n"
        "appender.stderr.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n\n"
    )
    return path


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
        .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={_quiet_log4j2(log_level)}")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel(log_level)
    spark.sparkContext.addPyFile(str(package_zip(Path(tempfile.mkdtemp(prefix="biplane-report-")))))
    spark.dataSource.register(SnapshotDataSource)
    return spark
