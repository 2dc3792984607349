"""When a broker's metadata lags the controller's: pure, the learner feeds it offsets and times.

The broker has applied offset `applied` (the image its listeners have acted on) while the
controller has committed `committed`. A lag over `records_max` records that has lasted over
`duration_ms_max` is an episode: it is reported once as it starts (WARNING) and once as it ends
(INFO), so a broker slowed by per-partition work says so without a line per fetch. The duration
bound keeps a broker that is merely one long-poll behind from reporting; Kafka's brokers have a
similar fetch lag for their metadata log. A lag of any size during which the applied offset
has not moved for `stuck_ms_max` is an episode too: a broker applies records within
milliseconds, so no progress for that long while behind means its application (or its fetch)
is stuck (a broker that never learns of an election never reports for it, and the partition
waits without a leader).
"""
from __future__ import annotations

from dataclasses import dataclass

RECORDS_MAX = 100
DURATION_MS_MAX = 5_000
STUCK_MS_MAX = 10_000


@dataclass(frozen=True)
class LagReport:
    started: bool          # True: the episode starts (warn); False: it ends (info)
    records: int           # the lag when reported
    duration_ms: int       # how long the broker has been behind


class MetadataLag:
    def __init__(self, *, records_max: int = RECORDS_MAX, duration_ms_max: int = DURATION_MS_MAX,
                 stuck_ms_max: int = STUCK_MS_MAX) -> None:
        self.records_max = records_max
        self.duration_ms_max = duration_ms_max
        self.stuck_ms_max = stuck_ms_max
        self.applied = -1
        self.committed = -1
        self.behind_since_ms: int | None = None  # when applied last fell more than records_max behind
        self.still_since_ms: int | None = None   # behind, and the applied offset unmoved since then
        self.lagging = False                     # an episode has been reported and not yet ended

    def records(self) -> int:
        return max(0, self.committed - self.applied)

    def duration_ms(self, now_ms: int) -> int:
        return 0 if self.behind_since_ms is None else now_ms - self.behind_since_ms

    def observe(self, *, now_ms: int, applied: int | None = None,
                committed: int | None = None) -> LagReport | None:
        if applied is not None and applied > self.applied:
            self.applied = applied
            self.still_since_ms = None   # progress: not stuck, whatever the lag
        if committed is not None:
            self.committed = max(self.committed, committed)
        lag = self.records()
        if lag == 0:
            self.still_since_ms = None
        elif self.still_since_ms is None:
            self.still_since_ms = now_ms
        # a broker not behind is never stuck, whatever the bound (0 included)
        stuck = self.still_since_ms is not None and now_ms - self.still_since_ms >= self.stuck_ms_max
        if lag <= self.records_max and not stuck:
            since, self.behind_since_ms = self.behind_since_ms, None
            if self.lagging:
                self.lagging = False
                return LagReport(False, lag, 0 if since is None else now_ms - since)
            return None
        if self.behind_since_ms is None:
            self.behind_since_ms = self.still_since_ms if lag <= self.records_max else now_ms
        assert self.behind_since_ms is not None
        duration = now_ms - self.behind_since_ms
        if not self.lagging and (duration >= self.duration_ms_max or stuck):
            self.lagging = True
            return LagReport(True, lag, duration)
        return None
