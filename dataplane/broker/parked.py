"""Quiet leaders whose followers' caught-up clocks their fetch sessions keep (pure).

A quiet pull leader refreshes its ISR followers' caught-up clocks from their fetch sessions
once per lag time (Replica.refresh_caught_up): at 10,000 partitions that was a few hundred
refreshes a second per broker, the largest part of an idle broker's work. Yet while a
follower's session holds the partition and the follower keeps fetching in it, the follower
is caught up there at every moment: nothing about the partition changes, only the clock.

So after a refresh whose news all came from live sessions, the broker parks the replica
here, grouped by those sessions, and sets no caught-up timer for it. It watches the few
groups instead (`stale`): when a session of a group is no longer live (dropped, replaced by a
full fetch, or its follower not seen fetching for a moment) every replica of the group is
ticked, and its core judges the followers on the sessions' word as before (a dropped
session's word stands as of its last sighting: LeaderSessions.seen). A partition a
session's fetch removes leaves at once (`leave`), and so does any replica stepped for any
reason (the driver's next timer replaces the park): a step first ticks a core whose clocks
ran out, on the sessions' word, so the core never acts on a stale clock.

    parked = ParkedClocks()
    parked.park(tp, sessions=(11, 12), lag_ms=10_000)
    parked.leave(tp)                                  # True if it was parked
    parked.stale(lambda sessions, slack_ms: ...)      # the partitions to tick now
"""
from __future__ import annotations

from typing import Callable, Generic, Hashable, TypeVar

K = TypeVar("K", bound=Hashable)   # a partition


# A session counts as live while a fetch of it waits or one was answered this recently (the
# gap between a long-poll's answer and the next fetch), and at most a quarter of the lag time.
LIVE_SLACK_MS_MAX = 1000


def live_slack_ms(lag_ms: int) -> int:
    return max(1, min(LIVE_SLACK_MS_MAX, lag_ms // 4))


class ParkedClocks(Generic[K]):
    """Parked replicas by (lag time, their followers' session ids)."""

    def __init__(self) -> None:
        self._groups: dict[tuple[int, tuple[int, ...]], set[K]] = {}
        self._group_of: dict[K, tuple[int, tuple[int, ...]]] = {}

    def __len__(self) -> int:
        return len(self._group_of)

    def __contains__(self, key: object) -> bool:
        return key in self._group_of

    def park(self, key: K, *, sessions: tuple[int, ...], lag_ms: int) -> None:
        self.leave(key)
        group = (lag_ms, sessions)
        self._groups.setdefault(group, set()).add(key)
        self._group_of[key] = group

    def leave(self, key: K) -> bool:
        group = self._group_of.pop(key, None)
        if group is None:
            return False
        members = self._groups[group]
        members.discard(key)
        if not members:
            del self._groups[group]
        return True

    def stale(self, live: Callable[[tuple[int, ...], int], bool]) -> list[K]:
        """Unpark and return every member of each group whose sessions are not all live
        (`live(session ids, slack ms)`): a cost per group, not per partition, while all are."""
        out: list[K] = []
        for group in [g for g in self._groups if not live(g[1], live_slack_ms(g[0]))]:
            for key in self._groups.pop(group):
                del self._group_of[key]
                out.append(key)
        return out
