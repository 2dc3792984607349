"""Controller snapshot files: one SQLite database per snapshot, written atomically.

A snapshot holds the metadata image as of one metadata offset plus the latest
usage each broker reported (bytes, offsets, rates). Spark reads the history of
these files for capacity reports (see controller/report/SCHEMA.md).

Atomicity: a file is built under a temp name (`.tmp-...`) in the same
directory, fsynced, renamed to its final name, and the directory is fsynced.
Readers only ever look at final names, so a crash at any point leaves either
no file or a complete one; leftover temp files are removed when a store opens.

Only `rows_from_image` knows the shape of the metadata image; everything else
works on `SnapshotRows`, plain tuples in the column order of snapshot_schema.
"""
from __future__ import annotations

import builtins
import dataclasses
import datetime as dt
import json
import os
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlite_utils

from common.durable import fsync_dir, fsync_path, replace_durably
from common.errors import InvalidRequestError
from common.usage import BrokerUsage
from controller.snapshot_schema import BROKER_TOTALS_SQL, FILE_NAME_RE, SCHEMA_VERSION, TABLES, TEMP_PREFIX, column_names

if TYPE_CHECKING:
    from common.metadata.image import MetadataImage


@dataclasses.dataclass(frozen=True, kw_only=True)
class SnapshotRows:
    """The content of one snapshot file, as row tuples in snapshot_schema column order."""

    snapshot_time_ms: int
    metadata_offset: int
    controller_id: int | None
    brokers: tuple[tuple, ...] = ()
    topics: tuple[tuple, ...] = ()
    topic_configs: tuple[tuple, ...] = ()
    partitions: tuple[tuple, ...] = ()
    replicas: tuple[tuple, ...] = ()
    replica_usage: tuple[tuple, ...] = ()
    broker_usage: tuple[tuple, ...] = ()

    def cluster_row(self) -> tuple:
        state_at = column_names("brokers").index("state")
        leader_at = column_names("partitions").index("leader")
        fenced = sum(1 for row in self.brokers if row[state_at] == "fenced")
        offline = sum(1 for row in self.partitions if row[leader_at] is None)
        return (
            SCHEMA_VERSION,
            self.snapshot_time_ms,
            iso_utc(self.snapshot_time_ms),
            self.metadata_offset,
            self.controller_id,
            len(self.brokers),
            fenced,
            len(self.topics),
            len(self.partitions),
            len(self.replicas),
            offline,
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class SnapshotInfo:
    name: str
    time_ms: int  # from the file name, to the second
    metadata_offset: int
    size_bytes: int
    path: str

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "time": iso_utc(self.time_ms),
            "time_ms": self.time_ms,
            "metadata_offset": self.metadata_offset,
            "size_bytes": self.size_bytes,
        }


def iso_utc(time_ms: int) -> str:
    return dt.datetime.fromtimestamp(time_ms / 1000, tz=dt.timezone.utc).isoformat(timespec="milliseconds")


def snapshot_file_name(snapshot_time_ms: int, metadata_offset: int) -> str:
    if snapshot_time_ms < 0 or metadata_offset < 0:
        raise InvalidRequestError(
            f"snapshot time {snapshot_time_ms} ms and metadata offset {metadata_offset} must both be >= 0"
        )
    stamp = dt.datetime.fromtimestamp(snapshot_time_ms // 1000, tz=dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"snapshot-{stamp}-{metadata_offset:012d}.sqlite"


def parse_snapshot_file_name(name: str) -> tuple[int, int] | None:
    """(time_ms, metadata_offset) for a final snapshot name, else None."""
    match = FILE_NAME_RE.match(name)
    if match is None:
        return None
    stamp = dt.datetime.strptime(match.group(1), "%Y%m%dT%H%M%SZ").replace(tzinfo=dt.timezone.utc)
    return int(stamp.timestamp()) * 1000, int(match.group(2))


# --- the one place that knows the image's shape -------------------------------------------


def rows_from_image(
    image: MetadataImage, usage_by_broker: Mapping[int, BrokerUsage], now_ms: int, controller_id: int | None
) -> SnapshotRows:
    """Flatten a metadata image and the latest usage reports into snapshot rows.

    Call it where the image is not being changed (the controller's event loop);
    the rows it returns are plain values that any thread may write.
    """
    brokers = []
    for broker_id, broker in sorted(image.brokers.items()):
        usage = usage_by_broker.get(broker_id)
        brokers.append((
            broker_id, broker.host, broker.port, broker.rack, broker.priority,
            "fenced" if broker.fenced else "unfenced",
            usage.disk_total_bytes if usage is not None else None,
        ))
    topics, topic_configs, partitions, replicas = [], [], [], []
    for topic_name, topic in sorted(image.topics.items()):
        config = topic.config.in_force()
        topics.append((topic_name, topic.partition_count, topic.config.replication_factor))
        for key, value in sorted(config.items()):
            topic_configs.append((topic_name, key, value if isinstance(value, str) else json.dumps(value)))
        for part in image.topic_partitions(topic_name):
            isr, adding, removing = set(part.isr), set(part.adding), set(part.removing)
            partitions.append((
                topic_name, part.partition, part.leader, part.leader_epoch, part.partition_epoch,
                len(part.replicas), len(isr), int(bool(adding or removing)),
            ))
            for position, replica in enumerate(part.replicas):
                replicas.append((
                    topic_name, part.partition, replica, position, int(replica == part.leader),
                    int(replica in isr), int(replica in adding), int(replica in removing),
                ))
    return SnapshotRows(
        snapshot_time_ms=now_ms,
        metadata_offset=image.offset,
        controller_id=controller_id,
        brokers=tuple(brokers),
        topics=tuple(topics),
        topic_configs=tuple(topic_configs),
        partitions=tuple(partitions),
        replicas=tuple(replicas),
        **usage_rows(usage_by_broker),
    )


def usage_rows(usage_by_broker: Mapping[int, BrokerUsage]) -> dict[str, tuple[tuple, ...]]:
    broker_usage, replica_usage = [], []
    for broker_id in sorted(usage_by_broker):
        usage = usage_by_broker[broker_id]
        broker_usage.append((
            usage.broker_id, usage.at_ms, usage.disk_total_bytes, usage.disk_used_bytes, usage.disk_free_bytes,
            usage.log_bytes, usage.counters_since_ms, usage.produce_bytes_total, usage.replicated_bytes_total,
            usage.fetch_bytes_total,
        ))
        for replica in usage.replicas:
            replica_usage.append((
                replica.topic, replica.partition, usage.broker_id, usage.at_ms, replica.size_bytes,
                replica.log_start_offset, replica.log_end_offset, replica.high_watermark,
                replica.produce_bytes_per_s, replica.produce_records_per_s, replica.fetch_bytes_per_s,
            ))
    return {"broker_usage": tuple(broker_usage), "replica_usage": tuple(replica_usage)}


# --- files ----------------------------------------------------------------------------------


def write_snapshot_file(directory: Path, rows: SnapshotRows) -> Path:
    """Write `rows` as a complete snapshot file in `directory`; returns its final path.

    The file is durable and visible under its final name when this returns. On any
    error the temp file is removed and no final file appears.
    """
    name = snapshot_file_name(rows.snapshot_time_ms, rows.metadata_offset)
    final = directory / name
    temp = directory / f"{TEMP_PREFIX}{uuid.uuid4().hex}-{name}"
    try:
        db = sqlite_utils.Database(temp)
        try:
            # The temp file is not visible to anyone until renamed, so SQLite's own
            # journal buys nothing here; durability comes from the fsync below.
            db.execute("PRAGMA journal_mode=OFF")
            db.execute("PRAGMA synchronous=OFF")
            with db.conn:
                for table, (columns, pk) in TABLES.items():
                    db.table(table).create(dict(columns), pk=pk if len(pk) > 1 else pk[0])
                    if table == "broker_totals":
                        db.conn.execute(BROKER_TOTALS_SQL)
                        continue
                    data = (rows.cluster_row(),) if table == "cluster" else getattr(rows, table)
                    if data:
                        marks = ", ".join("?" for _ in columns)
                        db.conn.executemany(f"INSERT INTO [{table}] VALUES ({marks})", data)
        finally:
            db.close()
        fsync_path(temp)
        replace_durably(temp, final)  # renamed, then the directory fsynced
    except BaseException:
        temp.unlink(missing_ok=True)  # gone already once renamed
        raise
    return final




class SnapshotStore:
    """A directory of snapshot files with retention by count and by age.

    Retention never removes the newest file. Leftover temp files (from a crash
    mid-write) are removed when the store opens. The defaults keep a week at the
    default 60 s interval, the window the capacity report fits growth over.
    """

    def __init__(self, directory: str | os.PathLike[str], *, keep_count: int = 10_080,
                 keep_age_ms: int = 7 * 24 * 3600 * 1000) -> None:
        if keep_count < 1:
            raise InvalidRequestError(f"snapshot keep_count must be >= 1, got {keep_count}")
        if keep_age_ms < 1:
            raise InvalidRequestError(f"snapshot keep_age_ms must be >= 1, got {keep_age_ms}")
        self.directory = Path(directory)
        self.keep_count = keep_count
        self.keep_age_ms = keep_age_ms
        self.directory.mkdir(parents=True, exist_ok=True)
        for entry in self.directory.iterdir():
            if entry.name.startswith(TEMP_PREFIX):
                entry.unlink(missing_ok=True)

    def write(self, image: MetadataImage, usage_by_broker: Mapping[int, BrokerUsage], now_ms: int,
              controller_id: int | None) -> SnapshotInfo:
        return self.write_rows(rows_from_image(image, usage_by_broker, now_ms, controller_id), now_ms=now_ms)

    def write_rows(self, rows: SnapshotRows, *, now_ms: int) -> SnapshotInfo:
        path = write_snapshot_file(self.directory, rows)
        self.prune(now_ms)
        return self._info(path.name)

    def list(self) -> list[SnapshotInfo]:
        """Complete snapshot files, oldest first."""
        infos = []
        for entry in self.directory.iterdir():
            if parse_snapshot_file_name(entry.name) is not None:
                try:
                    infos.append(self._info(entry.name))
                except FileNotFoundError:  # pruned by another writer meanwhile
                    continue
        return sorted(infos, key=lambda info: (info.time_ms, info.metadata_offset, info.name))

    def prune(self, now_ms: int) -> builtins.list[str]:  # `list` here is the method above
        """Remove files beyond keep_count or older than keep_age_ms; returns removed names."""
        infos = self.list()
        newest = infos[-1:] if infos else []
        keep = {info.name for info in infos[-self.keep_count:] if now_ms - info.time_ms <= self.keep_age_ms}
        keep.update(info.name for info in newest)
        removed = []
        for info in infos:
            if info.name not in keep:
                Path(info.path).unlink(missing_ok=True)
                removed.append(info.name)
        if removed:
            fsync_dir(self.directory)
        return removed

    def _info(self, name: str) -> SnapshotInfo:
        parsed = parse_snapshot_file_name(name)
        assert parsed is not None, name
        path = self.directory / name
        return SnapshotInfo(name=name, time_ms=parsed[0], metadata_offset=parsed[1],
                            size_bytes=path.stat().st_size, path=str(path))
