"""Usage statistics that brokers report in heartbeats and controllers keep for snapshots.

Usage is not metadata: it is not in the replicated log. The controller leader keeps
the latest report per broker in memory and writes it into snapshot files.
"""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ReplicaUsage(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    topic: str
    partition: int = Field(ge=0)
    size_bytes: int = Field(ge=0)
    log_start_offset: int = Field(ge=0)
    log_end_offset: int = Field(ge=0)
    high_watermark: int = Field(ge=0)
    produce_bytes_per_s: float = Field(default=0.0, ge=0)
    produce_records_per_s: float = Field(default=0.0, ge=0)
    fetch_bytes_per_s: float = Field(default=0.0, ge=0)


# Bounds on the group part of one report (a heartbeat must stay small whatever the groups):
# groups in id order, each with its offsets in (topic, partition) order, until either bound
# is reached; what does not fit is left out of the report and counted in
# `BrokerUsage.groups_omitted` / `group_offsets_omitted` (the coordinator's /metrics still
# shows every group: the bound is only on what reaches the controller).
GROUPS_REPORTED_MAX = 200
GROUP_OFFSETS_REPORTED_MAX = 2000


def lag_records(high_watermark: int, committed_offset: int) -> int:
    """Records a group has still to consume: never negative (a commit past the high watermark,
    or a high watermark seen late, shows as no lag rather than a negative one)."""
    return max(0, high_watermark - committed_offset)


class GroupOffsetUsage(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    topic: str
    partition: int = Field(ge=0)
    committed_offset: int = Field(ge=0)


class GroupUsage(BaseModel):
    """A group as its coordinator knows it: the state, the member count and the committed
    offsets (only committed ones: an offset a failover could lose is never reported)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    group: str
    state: str
    members: int = Field(ge=0)
    offsets: list[GroupOffsetUsage] = Field(default_factory=list)


class BrokerUsage(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    broker_id: int = Field(ge=0)
    at_ms: int = Field(ge=0)
    disk_total_bytes: int = Field(ge=0)
    disk_used_bytes: int = Field(ge=0)
    disk_free_bytes: int = Field(ge=0)
    replicas: list[ReplicaUsage] = Field(default_factory=list)
    # Biplane's own bytes: the partition logs in the data directory. The disk_* fields are the
    # whole filesystem's, which other programs share. None from brokers that predate it.
    log_bytes: int | None = Field(default=None, ge=0)
    # Byte counters since `counters_since_ms` (the broker process's start, wall clock): they only
    # grow within one process, so a reader differences two reports to get a rate over any
    # interval, and a changed `counters_since_ms` says the counters restarted from zero.
    # None from brokers that predate them (readers fall back to the per-second rates above).
    counters_since_ms: int | None = Field(default=None, ge=0)
    produce_bytes_total: int | None = Field(default=None, ge=0)  # client writes to replicas it led
    replicated_bytes_total: int | None = Field(default=None, ge=0)  # written to replicas it followed
    fetch_bytes_total: int | None = Field(default=None, ge=0)  # served to followers and consumers
    # The groups this broker coordinates (the offsets-topic partitions it leads, loaded),
    # bounded by GROUPS_REPORTED_MAX and GROUP_OFFSETS_REPORTED_MAX; empty from brokers
    # that predate them.
    groups: list[GroupUsage] = Field(default_factory=list)
    groups_omitted: int = Field(default=0, ge=0)
    group_offsets_omitted: int = Field(default=0, ge=0)
    # Incremental reports (as Kafka's incremental fetch sessions do for fetches): with
    # thousands of idle partitions, sending every replica each second was most of the report's
    # cost on both ends. `report_seq` numbers a broker process's reports; a report with
    # `base_seq` set carries in `replicas` only the replicas that differ from the report
    # numbered `base_seq`, and names in `replicas_removed` those gone since. None: `replicas`
    # is complete (and always from brokers that predate this). See `merge_report`.
    report_seq: int | None = Field(default=None, ge=0)
    base_seq: int | None = Field(default=None, ge=0)
    replicas_removed: list[tuple[str, int]] = Field(default_factory=list)


def merge_report(stored: BrokerUsage | None, report: BrokerUsage) -> BrokerUsage | None:
    """The broker's complete usage after `report`, given the complete one kept from its
    previous reports (of the same broker process); None when `report` is incremental and
    `stored` is not the report it builds on (the caller asks for a complete one)."""
    if report.base_seq is None:
        return report
    if stored is None or stored.report_seq is None or stored.report_seq != report.base_seq:
        return None
    if not report.replicas and not report.replicas_removed:
        replicas = stored.replicas
    else:
        by_key = {(r.topic, r.partition): r for r in stored.replicas}
        for key in report.replicas_removed:
            by_key.pop(key, None)
        for r in report.replicas:
            by_key[(r.topic, r.partition)] = r
        replicas = [by_key[key] for key in sorted(by_key)]
    return report.model_copy(update={"replicas": replicas, "base_seq": None, "replicas_removed": []})


class UsageReports:
    """The broker's side of incremental usage reports (pure). `report` turns a complete usage
    into what to send; `answered` says the controller took it (or, `resend`, had no base for
    it); a report with no answer is as if not sent: the next one builds on the last taken.
    ReplicaUsage objects that did not change are expected to be the same objects
    (ReplicaManager.usage keeps them), so an idle replica costs an identity check."""

    def __init__(self) -> None:
        self._seq = 0
        self._taken: tuple[int, list[ReplicaUsage]] | None = None
        self._sent: tuple[int, list[ReplicaUsage]] | None = None

    def report(self, usage: BrokerUsage) -> BrokerUsage:
        self._seq += 1
        self._sent = (self._seq, usage.replicas)
        if self._taken is None:
            return usage.model_copy(update={"report_seq": self._seq, "base_seq": None, "replicas_removed": []})
        base_seq, base = self._taken
        changed, removed = _differences(base, usage.replicas)
        return usage.model_copy(update={"replicas": changed, "report_seq": self._seq, "base_seq": base_seq,
                                        "replicas_removed": removed})

    def answered(self, *, resend: bool) -> None:
        """The controller answered a heartbeat: it took the report that heartbeat carried, if
        any, or (`resend`) it has no base for reports from this process."""
        if resend:
            self._taken = None
        elif self._sent is not None:
            self._taken = self._sent
        self._sent = None

    def unanswered(self) -> None:
        """The heartbeat got no answer: whether its report was taken is unknown."""
        self._sent = None


def _differences(base: list[ReplicaUsage], current: list[ReplicaUsage]
                 ) -> tuple[list[ReplicaUsage], list[tuple[str, int]]]:
    """(replicas of `current` that differ from `base`, keys of `base` gone from `current`).
    While the broker's replicas stay the same, the two lists hold them in the same order and
    mostly the same objects: compared pair by pair, with no map built; the very same list
    (the broker's replicas all kept their rows) not at all. New replicas' rows come at the end
    (ReplicaManager.usage_report): a list that only grew is compared so too."""
    if base is current:
        return [], []
    if len(base) <= len(current):
        changed = []
        for b, r in zip(base, current):
            if b is r:
                continue
            if b.topic != r.topic or b.partition != r.partition:
                break
            if b != r:
                changed.append(r)
        else:
            return changed + current[len(base):], []
    by_key = {(b.topic, b.partition): b for b in base}
    keys = set()
    changed = []
    for r in current:
        key = (r.topic, r.partition)
        keys.add(key)
        known = by_key.get(key)
        if known is not r and known != r:
            changed.append(r)
    return changed, [key for key in by_key if key not in keys]
