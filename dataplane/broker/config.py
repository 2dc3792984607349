"""BrokerConfig: everything a broker process is started with. Limits carry their units."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator


class BrokerConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    broker_id: int = Field(ge=0)
    data_dir: str = Field(min_length=1)
    controller_urls: tuple[str, ...] = Field(min_length=1)
    host: str = "127.0.0.1"
    port: int = Field(default=0, ge=0, le=65535)  # 0: pick a free port and report it
    advertised_host: str | None = None  # what clients are told; default: host
    metrics_port: int | None = Field(default=None, ge=0, le=65535)  # None: no /metrics listener
    kafka_port: int | None = Field(default=None, ge=0, le=65535)  # None: no Kafka API listener; 0: a free port
    # Kafka's auto.create.topics.enable, num.partitions and default.replication.factor, for
    # the Kafka API (None: min(3, live brokers)).
    auto_create_topics: bool = False
    default_partitions: int = Field(default=1, ge=1, le=10_000)
    default_replication_factor: int | None = Field(default=None, ge=1, le=100)
    cluster_secret: str | None = None
    rack: str | None = None
    priority: int = Field(default=0, ge=0, le=1000)

    heartbeat_interval_ms: int = Field(default=150, ge=10, le=60_000)
    # One heartbeat attempt's bound before the next controller is tried: below the
    # controller's session timeout (1.5 s), so a stopped or cut-off controller leader does
    # not hold heartbeats until the next leader fences this broker. ISR changes and election
    # reports have the same bound: acks=all waits on them.
    heartbeat_timeout_ms: int = Field(default=1000, ge=10, le=60_000)
    # Heartbeats run on a thread of their own and keep going through event-loop stalls up
    # to this long; past it the loop counts as wedged and heartbeats stop (the broker is
    # fenced a session timeout later).
    heartbeat_loop_stall_ms_max: int = Field(default=8000, ge=100, le=600_000)
    usage_interval_ms: int = Field(default=1000, ge=100, le=600_000)
    metadata_wait_ms_max: int = Field(default=5000, ge=0, le=30_000)
    fetch_wait_ms_max: int = Field(default=500, ge=0, le=30_000)
    fetch_max_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    partition_fetch_max_bytes: int = Field(default=1024 * 1024, ge=1024)
    # Produce bytes all leader partitions together may hold unreplicated (or waiting in a
    # core's backlog); beyond it produce requests wait, in order, until their timeout.
    unreplicated_bytes_max: int = Field(default=64 * 1024 * 1024, ge=1)
    tick_interval_ms: int = Field(default=10, ge=1, le=1000)
    # A push follower with news to hear (a new HW, a flush to report, an ISR to join) hears
    # from its leader this often, and each follower broker from each leader broker (the pair's
    # heartbeat); a quiet partition only every quarter of its topic's replica lag time.
    push_heartbeat_ms: int = Field(default=100, ge=1, le=60_000)
    # A replication link (leader and follower of a partition) silent this long is named in
    # the heartbeats, so the controller can move a leadership its followers cannot reach
    # (for isr topics at most half the topic's replica_lag_time_max_ms, so the report comes
    # before the leader shrinks its ISR to itself).
    peer_unreachable_ms: int = Field(default=1500, ge=100, le=600_000)
    # A sleep before each fsync run; 0: group commit only (waiters arriving during an fsync
    # share the next one), which costs a lone acks=all producer no timer.
    flush_debounce_ms: int = Field(default=0, ge=0, le=1000)
    fetch_error_backoff_ms: int = Field(default=50, ge=0, le=10_000)
    reconnect_backoff_ms_max: int = Field(default=1000, ge=1, le=60_000)
    request_timeout_ms: int = Field(default=10_000, ge=100)
    # A replication connection (pull fetches, push append-entries) whose request went unanswered
    # this long (a fetch: past its long-poll wait) is closed and opened afresh. After a network
    # cut heals, TCP resends what the cut dropped only when its backed-off retransmission timer
    # fires, seconds later; a new connection does not wait for that.
    replica_request_timeout_ms: int = Field(default=2000, ge=100, le=600_000)
    # When the broker says its metadata lags the controller's (dataplane/broker/metadata_lag.py):
    # more than this many records for this long, or any lag at all for the stuck bound.
    metadata_lag_records_max: int = Field(default=100, ge=0)
    metadata_lag_ms_max: int = Field(default=5_000, ge=0)
    metadata_stuck_ms_max: int = Field(default=10_000, ge=0)
    max_frame_bytes: int = Field(default=64 * 1024 * 1024, ge=1024, le=2**31 - 1)
    producer_id_block_size: int = Field(default=1000, ge=1, le=1_000_000)
    retention_check_interval_ms: int = Field(default=60_000, ge=100)
    # Compacted topics: how often each partition is offered to the cleaner (one partition at
    # a time, in a worker thread of its own), and the bytes a second it may read and write
    # together, so produce traffic keeps the disk.
    log_cleaner_interval_ms: int = Field(default=15_000, ge=100)
    log_cleaner_io_bytes_per_second: int = Field(default=32 * 1024 * 1024, ge=1024)
    # Consumer groups (Kafka's names): the offsets topic's partitions and replication
    # factor when this broker creates it (None: min(3, live brokers)), the wait for more
    # members before a new group's first rebalance, the session timeouts members may ask
    # for, and how long an empty group's offsets are kept.
    group_offsets_partitions: int = Field(default=16, ge=1, le=1000)
    group_offsets_replication_factor: int | None = Field(default=None, ge=1, le=100)
    group_initial_rebalance_delay_ms: int = Field(default=3000, ge=0, le=300_000)
    group_min_session_timeout_ms: int = Field(default=6000, ge=1, le=3_600_000)
    group_max_session_timeout_ms: int = Field(default=1_800_000, ge=1, le=3_600_000)
    offsets_retention_minutes: int = Field(default=7 * 24 * 60, ge=1)

    @field_validator("controller_urls")
    @classmethod
    def _check_urls(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for url in v:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"controller URL {url!r} must start with http:// or https://")
        return tuple(u.rstrip("/") for u in v)

    @property
    def client_host(self) -> str:
        return self.advertised_host or self.host
