"""The replication throttle: how fast replicas being added by a reassignment are copied
(Kafka's follower and leader replication throttles).

The rate is the cluster's `reassignment_throttle_bytes_per_s` (dynamic config, applied as
the broker learns it). Two users, each with its own throttle and keys:
- pull: the follower's fetcher; keys are the partitions whose `adding` lists this broker.
  It asks `wait_s(now_s)` before it puts such a partition in a fetch, and records the bytes
  of records they received.
- push: the leader's pusher; keys are (follower id, partition) for partitions this broker
  leads whose `adding` lists that follower. A send that finds the throttle waiting is not
  made: the core's push window times out and its recovery loop sends again later.
Over any stretch the bytes stay within rate × time, plus at most one message (a fetch answer
or an append is sent whole). Idle time is banked for at most `burst_s`, so a pause is not
followed by a flood.

Pure: time comes in as an argument; no sleeping, no clock.
"""
from __future__ import annotations

from typing import Hashable

PARTITION_FETCH_BYTES_MIN = 1024


class ReplicationThrottle:
    def __init__(self, *, burst_s: float = 1.0) -> None:
        if burst_s <= 0:
            raise ValueError(f"burst_s={burst_s} must be > 0")
        self.burst_s = burst_s
        self.rate_bytes_per_s: int | None = None     # None: unthrottled
        self.keys: frozenset[Hashable] = frozenset()
        self._start_s: float | None = None
        self._bytes = 0
        self.throttled_bytes = 0                      # every byte counted, for /metrics and tests

    def configure(self, rate_bytes_per_s: int | None, keys: frozenset[Hashable]) -> None:
        if rate_bytes_per_s is not None and rate_bytes_per_s < 1:
            raise ValueError(f"rate_bytes_per_s={rate_bytes_per_s} must be >= 1 or None")
        if rate_bytes_per_s != self.rate_bytes_per_s:
            self._start_s, self._bytes = None, 0      # a new rate starts a new account
        self.rate_bytes_per_s = rate_bytes_per_s
        self.keys = keys

    def applies(self, key: Hashable) -> bool:
        return self.active and key in self.keys

    @property
    def active(self) -> bool:
        """Whether it applies to any key (a caller may skip asking of each one)."""
        return self.rate_bytes_per_s is not None and bool(self.keys)

    def _ahead_s(self, now_s: float) -> float:
        assert self.rate_bytes_per_s is not None
        if self._start_s is None:
            self._start_s, self._bytes = now_s, 0
        ahead = self._bytes / self.rate_bytes_per_s - (now_s - self._start_s)
        if ahead < -self.burst_s:
            self._start_s, self._bytes = now_s - self.burst_s, 0
            ahead = -self.burst_s
        return ahead

    def wait_s(self, now_s: float) -> float:
        """How long throttled partitions must wait before they are fetched again (0: now)."""
        if self.rate_bytes_per_s is None:
            return 0.0
        return max(0.0, self._ahead_s(now_s))

    def record(self, now_s: float, nbytes: int) -> None:
        if nbytes < 0:
            raise ValueError(f"nbytes={nbytes} must be >= 0")
        self.throttled_bytes += nbytes
        if self.rate_bytes_per_s is None:
            return
        self._ahead_s(now_s)
        self._bytes += nbytes

    def partition_fetch_bytes(self, default: int) -> int:
        """A throttled partition's fetch size: a quarter second of the rate at most, so one
        answer does not overshoot the rate by seconds."""
        if self.rate_bytes_per_s is None:
            return default
        return max(PARTITION_FETCH_BYTES_MIN, min(default, self.rate_bytes_per_s // 4))
