"""The tables of a controller snapshot file, in one place.

The writer creates exactly these tables with these column types, and the
Spark reader derives its schemas from them, so the two cannot drift apart.
Byte counts and offsets are SQLite INTEGER, which holds 64 bits; readers must
map them to 64-bit types (Spark `LongType`), never to 32-bit ones.

Plain data, no imports beyond the standard library: Spark's Python workers
import this module.
"""
from __future__ import annotations

import re

SCHEMA_VERSION = 2
# Version 2 added the columns in COLUMNS_ADDED; readers take both and read an absent column as NULL.
READABLE_SCHEMA_VERSIONS = (1, 2)

# Every final snapshot file matches this; nothing else in a snapshot directory
# is ever listed or read (temp files start with ".tmp-").
FILE_NAME_RE = re.compile(r"^snapshot-(\d{8}T\d{6}Z)-(\d{12})\.sqlite$")
TEMP_PREFIX = ".tmp-"

# table -> (columns as (name, SQLite type), primary key columns)
TABLES: dict[str, tuple[tuple[tuple[str, str], ...], tuple[str, ...]]] = {
    "cluster": (
        (
            ("schema_version", "INTEGER"),
            ("snapshot_time_ms", "INTEGER"),
            ("snapshot_time", "TEXT"),  # ISO 8601 UTC, for people
            ("metadata_offset", "INTEGER"),
            ("controller_id", "INTEGER"),  # the leader that wrote the file
            ("broker_count", "INTEGER"),
            ("fenced_broker_count", "INTEGER"),
            ("topic_count", "INTEGER"),
            ("partition_count", "INTEGER"),
            ("replica_count", "INTEGER"),
            ("offline_partition_count", "INTEGER"),  # no leader
        ),
        ("snapshot_time_ms",),
    ),
    "brokers": (
        (
            ("broker_id", "INTEGER"),
            ("host", "TEXT"),
            ("port", "INTEGER"),
            ("rack", "TEXT"),  # NULL when the broker has none
            ("priority", "INTEGER"),
            ("state", "TEXT"),  # "fenced" | "unfenced"
            ("disk_capacity_bytes", "INTEGER"),  # from the latest usage report; NULL if none
        ),
        ("broker_id",),
    ),
    "topics": (
        (
            ("topic", "TEXT"),
            ("partition_count", "INTEGER"),
            ("replication_factor", "INTEGER"),
        ),
        ("topic",),
    ),
    "topic_configs": (
        (
            ("topic", "TEXT"),
            ("name", "TEXT"),
            ("value", "TEXT"),  # as text; numbers and booleans as JSON text
        ),
        ("topic", "name"),
    ),
    "partitions": (
        (
            ("topic", "TEXT"),
            ("partition", "INTEGER"),
            ("leader", "INTEGER"),  # NULL when offline
            ("leader_epoch", "INTEGER"),
            ("partition_epoch", "INTEGER"),
            ("replica_count", "INTEGER"),
            ("isr_count", "INTEGER"),
            ("reassigning", "INTEGER"),  # 1 while adding or removing is non-empty
        ),
        ("topic", "partition"),
    ),
    "replicas": (
        (
            ("topic", "TEXT"),
            ("partition", "INTEGER"),
            ("broker_id", "INTEGER"),
            ("position", "INTEGER"),  # order in `replicas`; 0 is the preferred leader
            ("is_leader", "INTEGER"),
            ("in_isr", "INTEGER"),
            ("is_adding", "INTEGER"),
            ("is_removing", "INTEGER"),
        ),
        ("topic", "partition", "broker_id"),
    ),
    "replica_usage": (
        (
            ("topic", "TEXT"),
            ("partition", "INTEGER"),
            ("broker_id", "INTEGER"),
            ("at_ms", "INTEGER"),  # when the broker measured it
            ("size_bytes", "INTEGER"),
            ("log_start_offset", "INTEGER"),
            ("log_end_offset", "INTEGER"),
            ("high_watermark", "INTEGER"),
            ("produce_bytes_per_s", "REAL"),
            ("produce_records_per_s", "REAL"),
            ("fetch_bytes_per_s", "REAL"),
        ),
        ("topic", "partition", "broker_id"),
    ),
    "broker_usage": (
        (
            ("broker_id", "INTEGER"),
            ("at_ms", "INTEGER"),
            ("disk_total_bytes", "INTEGER"),
            ("disk_used_bytes", "INTEGER"),
            ("disk_free_bytes", "INTEGER"),
            ("log_bytes", "INTEGER"),  # Biplane's own: its partition logs (disk_* is the whole filesystem)
            # Byte counters since counters_since_ms (the broker process's start, Unix ms):
            # difference two snapshots for a rate; a new counters_since_ms means they restarted.
            ("counters_since_ms", "INTEGER"),
            ("produce_bytes_total", "INTEGER"),
            ("replicated_bytes_total", "INTEGER"),
            ("fetch_bytes_total", "INTEGER"),
        ),
        ("broker_id",),
    ),
    # Derived when the file is written (BROKER_TOTALS_SQL), so a reader of a long history
    # gets per-broker load from a few rows instead of aggregating every replica of every file.
    "broker_totals": (
        (
            ("broker_id", "INTEGER"),
            ("replica_count", "INTEGER"),
            ("leader_count", "INTEGER"),
            ("replica_bytes", "INTEGER"),  # sum of its replicas' size_bytes
            ("produce_bytes_per_s", "REAL"),  # client writes: replicas it leads
            ("replication_in_bytes_per_s", "REAL"),  # replicated writes: replicas it follows
            ("fetch_bytes_per_s", "REAL"),
        ),
        ("broker_id",),
    ),
}

# Fills broker_totals from the other tables; one row per registered broker.
BROKER_TOTALS_SQL = """
INSERT INTO broker_totals
WITH counts AS (
    SELECT broker_id, count(*) AS replica_count, sum(is_leader) AS leader_count
    FROM replicas GROUP BY broker_id),
usage_sums AS (
    SELECT broker_id, sum(size_bytes) AS replica_bytes, sum(produce_bytes_per_s) AS produce_all,
           sum(fetch_bytes_per_s) AS fetch
    FROM replica_usage GROUP BY broker_id),
led AS (
    SELECT u.broker_id, sum(u.produce_bytes_per_s) AS produce
    FROM partitions p JOIN replica_usage u
      ON u.topic = p.topic AND u.partition = p.partition AND u.broker_id = p.leader
    GROUP BY u.broker_id)
SELECT b.broker_id, coalesce(c.replica_count, 0), coalesce(c.leader_count, 0),
       coalesce(usage_sums.replica_bytes, 0), coalesce(led.produce, 0.0),
       coalesce(usage_sums.produce_all, 0.0) - coalesce(led.produce, 0.0), coalesce(usage_sums.fetch, 0.0)
FROM brokers b
LEFT JOIN counts c ON c.broker_id = b.broker_id
LEFT JOIN usage_sums ON usage_sums.broker_id = b.broker_id
LEFT JOIN led ON led.broker_id = b.broker_id
"""


# (table, column) -> the schema version that added it; files of an older version lack it.
COLUMNS_ADDED: dict[tuple[str, str], int] = {
    ("broker_usage", name): 2
    for name in ("log_bytes", "counters_since_ms", "produce_bytes_total", "replicated_bytes_total",
                 "fetch_bytes_total")
}


def column_names(table: str) -> tuple[str, ...]:
    return tuple(name for name, _ in TABLES[table][0])
