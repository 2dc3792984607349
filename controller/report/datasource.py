"""A PySpark Python data source over controller snapshot files.

    spark.dataSource.register(SnapshotDataSource)
    df = (spark.read.format("biplane_snapshots")
          .option("table", "broker_series").option("paths", json.dumps(paths)).option("splits", "4")
          .load())

The driver only hands over file names; `partitions()` groups them into
`splits` contiguous groups and each executor task opens its own files with
sqlite3. A file that cannot be read (not SQLite, truncated, a foreign schema)
is skipped with a warning on the executor's log and never fails the job; the
`files` and `broker_series` tables report it as a row naming the file and the
error, which is how the driver learns of skipped files.

Tables: every snapshot table (snapshot_schema.TABLES, with `file` and
`snapshot_time_ms` in front), plus `files`, `broker_series` (per snapshot
and broker: disk use, replica and leader counts, replica bytes and rates,
from the file's broker_totals, and from schema 2 on Biplane's log bytes and
the byte counters; an unreadable file yields one row
with only `file` and `error`) and `placement` (one row per replica with its
partition's leader, size, rate and min ISR). Byte counts are LongType.
Files of every version in READABLE_SCHEMA_VERSIONS are read; the columns a
file's version predates (COLUMNS_ADDED) read as NULL.

No `pushFilters`: in PySpark 4.3.0 a later unfiltered query on the same
DataFrame can reuse a filtered plan. Filter in Spark instead.
"""
from __future__ import annotations

import json
import logging
import os
import sqlite3
from collections.abc import Iterator, Mapping
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import BooleanType, DoubleType, LongType, StringType, StructField, StructType

from controller.snapshot_schema import COLUMNS_ADDED, READABLE_SCHEMA_VERSIONS, TABLES

log = logging.getLogger(__name__)

FORMAT_NAME = "biplane_snapshots"
_SQL_TYPES = {"INTEGER": LongType(), "REAL": DoubleType(), "TEXT": StringType()}

FILES_SCHEMA = StructType([
    StructField("file", StringType(), False),
    StructField("ok", BooleanType(), False),
    StructField("error", StringType(), True),
    StructField("snapshot_time_ms", LongType(), True),
    StructField("metadata_offset", LongType(), True),
    StructField("schema_version", LongType(), True),
    StructField("broker_count", LongType(), True),
    StructField("partition_count", LongType(), True),
    StructField("size_bytes", LongType(), True),
])

BROKER_SERIES_SCHEMA = StructType([
    StructField("file", StringType(), False),
    StructField("snapshot_time_ms", LongType(), True),
    StructField("metadata_offset", LongType(), True),
    StructField("broker_id", LongType(), True),
    StructField("rack", StringType(), True),
    StructField("state", StringType(), True),
    StructField("disk_total_bytes", LongType(), True),
    StructField("disk_used_bytes", LongType(), True),
    StructField("disk_free_bytes", LongType(), True),
    StructField("replica_count", LongType(), True),
    StructField("leader_count", LongType(), True),
    StructField("replica_bytes", LongType(), True),
    StructField("produce_bytes_per_s", DoubleType(), True),  # client writes to the replicas it leads
    StructField("replication_in_bytes_per_s", DoubleType(), True),  # writes to the replicas it follows
    StructField("fetch_bytes_per_s", DoubleType(), True),
    # From schema 2 on (NULL in older files): the time of the usage report, Biplane's own log
    # bytes, and the broker's byte counters (see snapshot_schema.py).
    StructField("usage_at_ms", LongType(), True),
    StructField("log_bytes", LongType(), True),
    StructField("counters_since_ms", LongType(), True),
    StructField("produce_bytes_total", LongType(), True),
    StructField("replicated_bytes_total", LongType(), True),
    StructField("fetch_bytes_total", LongType(), True),
    # Set on the one row an unreadable file yields (all else null but `file`), so a single
    # pass over the history both reads it and names what it had to skip.
    StructField("error", StringType(), True),
])

PLACEMENT_SCHEMA = StructType([
    StructField("file", StringType(), False),
    StructField("snapshot_time_ms", LongType(), False),
    StructField("topic", StringType(), False),
    StructField("partition", LongType(), False),
    StructField("broker_id", LongType(), False),
    StructField("position", LongType(), False),
    StructField("in_isr", LongType(), False),
    StructField("leader", LongType(), True),
    StructField("size_bytes", LongType(), False),
    StructField("produce_bytes_per_s", DoubleType(), False),
    StructField("min_insync_replicas", StringType(), True),  # JSON text from topic_configs
])

# One row per replica with what planning needs, joined inside SQLite.
PLACEMENT_SQL = """
SELECT r.topic, r.partition, r.broker_id, r.position, r.in_isr, p.leader,
       coalesce(u.size_bytes, 0), coalesce(u.produce_bytes_per_s, 0.0), c.value
FROM replicas r
JOIN partitions p ON p.topic = r.topic AND p.partition = r.partition
LEFT JOIN replica_usage u ON u.topic = r.topic AND u.partition = r.partition AND u.broker_id = r.broker_id
LEFT JOIN topic_configs c ON c.topic = r.topic AND c.name = 'min_insync_replicas'
ORDER BY r.topic, r.partition, r.position
"""

# Per broker in one snapshot: a few rows, since the writer already summed the replicas.
# {usage_columns} are broker_usage's columns from schema 2 on, or NULLs for older files.
BROKER_SERIES_SQL = """
SELECT b.broker_id, b.rack, b.state, bu.disk_total_bytes, bu.disk_used_bytes, bu.disk_free_bytes,
       coalesce(t.replica_count, 0), coalesce(t.leader_count, 0), coalesce(t.replica_bytes, 0),
       coalesce(t.produce_bytes_per_s, 0.0), coalesce(t.replication_in_bytes_per_s, 0.0),
       coalesce(t.fetch_bytes_per_s, 0.0), bu.at_ms, {usage_columns}
FROM brokers b
LEFT JOIN broker_usage bu ON bu.broker_id = b.broker_id
LEFT JOIN broker_totals t ON t.broker_id = b.broker_id
ORDER BY b.broker_id
"""
SERIES_USAGE_COLUMNS = ("log_bytes", "counters_since_ms", "produce_bytes_total", "replicated_bytes_total",
                        "fetch_bytes_total")


def table_schema(table: str) -> StructType:
    if table == "files":
        return FILES_SCHEMA
    if table == "broker_series":
        return BROKER_SERIES_SCHEMA
    if table == "placement":
        return PLACEMENT_SCHEMA
    if table not in TABLES:
        raise ValueError(f"unknown snapshot table {table!r}; "
                         f"one of {sorted([*TABLES, 'files', 'broker_series', 'placement'])}")
    fields = [StructField("file", StringType(), False)]
    if table != "cluster":
        fields.append(StructField("snapshot_time_ms", LongType(), False))
    fields += [StructField(name, _SQL_TYPES[sql_type], True) for name, sql_type in TABLES[table][0]]
    return StructType(fields)


class FileGroup(InputPartition):
    def __init__(self, index: int, paths: list[str]) -> None:
        super().__init__(index)
        self.paths = paths


def group_files(paths: list[str], splits: int) -> list[list[str]]:
    """`splits` contiguous, near-equal groups (fewer if there are fewer files)."""
    splits = max(1, min(splits, len(paths)))
    size, extra = divmod(len(paths), splits)
    groups, start = [], 0
    for i in range(splits):
        end = start + size + (1 if i < extra else 0)
        groups.append(paths[start:end])
        start = end
    return [g for g in groups if g]


class SnapshotDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> StructType:
        return table_schema(self.options.get("table", "cluster"))

    def reader(self, schema: StructType) -> DataSourceReader:
        return SnapshotReader(self.options)


class SnapshotReader(DataSourceReader):
    def __init__(self, options: Mapping[str, str]) -> None:
        self.table = options.get("table", "cluster")
        table_schema(self.table)  # fail on the driver for an unknown table
        self.paths: list[str] = json.loads(options.get("paths", "[]"))
        self.splits = int(options.get("splits", "4"))

    def partitions(self) -> list[FileGroup]:
        return [FileGroup(i, group) for i, group in enumerate(group_files(self.paths, self.splits))]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        if not isinstance(partition, FileGroup):  # Spark hands back what partitions() made
            raise TypeError(f"expected a FileGroup from partitions(), got {type(partition).__name__}")
        for path in partition.paths:
            if self.table == "files":
                yield check_file(path)
                continue
            try:
                rows = read_file_rows(path, self.table)
            except (sqlite3.Error, OSError, ValueError) as exc:
                log.warning("skipping snapshot file %s: %s", path, exc)
                if self.table == "broker_series":
                    yield (path, *([None] * (len(BROKER_SERIES_SCHEMA) - 2)), f"{type(exc).__name__}: {exc}")
                continue
            yield from rows


def _connect(path: str) -> sqlite3.Connection:
    # Read-only and immutable: no locks and no journal files next to the snapshots.
    return sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)


def _cluster(conn: sqlite3.Connection) -> tuple[int, int, int, int, int]:
    row = conn.execute(
        "SELECT schema_version, snapshot_time_ms, metadata_offset, broker_count, partition_count FROM cluster"
    ).fetchone()
    if row is None:
        raise ValueError("the cluster table is empty")
    if row[0] not in READABLE_SCHEMA_VERSIONS:
        raise ValueError(f"schema version {row[0]}, this reader knows {', '.join(map(str, READABLE_SCHEMA_VERSIONS))}")
    return row


def _present_columns(conn: sqlite3.Connection) -> dict[str, set[str]]:
    return {name: {col[1] for col in conn.execute(f"PRAGMA table_info([{name}])")} for name in TABLES}


def _check_columns(present: dict[str, set[str]], version: int) -> None:
    """Every column of TABLES is there, except those added after the file's schema version."""
    for table, (columns, _) in TABLES.items():
        if not present[table]:
            raise ValueError(f"no table {table}")
        missing = [name for name, _ in columns if name not in present[table]
                   and COLUMNS_ADDED.get((table, name), 0) <= version]
        if missing:
            raise ValueError(f"table {table} lacks columns {', '.join(missing)}")


def _column_or_null(present: set[str], name: str, alias: str = "") -> str:
    return f"{alias}[{name}]" if name in present else "NULL"


def check_file(path: str) -> tuple:
    """One `files` row: whether the file is a readable snapshot of our schema, and why not."""
    size = os.path.getsize(path) if os.path.exists(path) else None
    try:
        conn = _connect(path)
        try:
            present = _present_columns(conn)
            _check_columns(present, READABLE_SCHEMA_VERSIONS[0])  # what every version has
            version, time_ms, offset, brokers, partitions = _cluster(conn)
            _check_columns(present, version)
        finally:
            conn.close()
    except (sqlite3.Error, OSError, ValueError) as exc:
        log.warning("skipping snapshot file %s: %s", path, exc)
        return (path, False, f"{type(exc).__name__}: {exc}", None, None, None, None, None, size)
    return (path, True, None, time_ms, offset, version, brokers, partitions, size)


def read_file_rows(path: str, table: str) -> list[tuple]:
    """All rows of `table` from one file, read fully before any is returned, so a file
    that fails halfway contributes nothing. Columns the file's schema version predates are NULL."""
    conn = _connect(path)
    try:
        version, time_ms, offset, _, _ = _cluster(conn)
        present = _present_columns(conn)
        _check_columns(present, version)
        if table == "broker_series":
            usage_columns = ", ".join(_column_or_null(present["broker_usage"], name, "bu.")
                                      for name in SERIES_USAGE_COLUMNS)
            sql = BROKER_SERIES_SQL.format(usage_columns=usage_columns)
            return [(path, time_ms, offset, *row, None) for row in conn.execute(sql)]
        if table == "placement":
            return [(path, time_ms, *row) for row in conn.execute(PLACEMENT_SQL)]
        columns = ", ".join(_column_or_null(present[table], name) for name, _ in TABLES[table][0])
        rows = conn.execute(f"SELECT {columns} FROM [{table}]").fetchall()
        if table == "cluster":
            return [(path, *row) for row in rows]
        return [(path, time_ms, *row) for row in rows]
    finally:
        conn.close()
