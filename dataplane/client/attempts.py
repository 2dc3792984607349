"""Produce attempts awaiting an answer, and when to stop waiting for one because its leader
was replaced. Pure: no sockets, no clock (times come in as `now_ms`).

A leader cut off from its followers, or paused, holds a produce request until the client's
request timeout (30 s by default) even after the controller has moved its partitions to
another broker within a couple of seconds. Kafka's producer waits that long. This producer
does not: while an attempt has waited more than `probe_after_ms` it asks for metadata (at
most once per `probe_interval_ms`, from brokers holding no such attempt first), and an
attempt whose partition now has a newer leader epoch on another broker is given up: to the
producer core it is an attempt that went unanswered, so the batch is retried *as it is*
(same producer id, epoch and sequence) on the new leader, which either appends it or
recognises it as a duplicate of the copy it already holds (DESIGN.md §3). The old leader's
late answer, if one ever comes, belongs to an attempt that no longer exists and is dropped:
`finish` says so.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

PROBE_AFTER_MS = 1_000
PROBE_INTERVAL_MS = 500

B = TypeVar("B", bound=Hashable)


@dataclasses.dataclass(eq=False, slots=True, frozen=True)
class Attempt:
    broker: int
    leader_epoch: int      # the epoch the producer knew for the partition when it sent
    sent_ms: int


def deposed(attempt: Attempt, *, leader_id: int, leader_epoch: int) -> bool:
    """Was the leader `attempt` went to replaced? Only a newer epoch on another live leader says
    so: the same broker re-elected answers the attempt itself (or refuses it as fenced), and an
    unknown leader (-1) gives nowhere to retry."""
    return leader_id >= 0 and leader_id != attempt.broker and leader_epoch > attempt.leader_epoch


class Attempts(Generic[B]):
    def __init__(self, *, probe_after_ms: int = PROBE_AFTER_MS, probe_interval_ms: int = PROBE_INTERVAL_MS) -> None:
        self.probe_after_ms = probe_after_ms
        self.probe_interval_ms = probe_interval_ms
        self._open: dict[B, Attempt] = {}     # insertion order: oldest first
        self._probed_ms: int | None = None
        self.given_up = 0

    def __len__(self) -> int:
        return len(self._open)

    def start(self, batch: B, *, broker: int, leader_epoch: int, now_ms: int) -> Attempt:
        self._open.pop(batch, None)   # a batch has one attempt out at a time; re-insert at the end
        attempt = self._open[batch] = Attempt(broker=broker, leader_epoch=leader_epoch, sent_ms=now_ms)
        return attempt

    def finish(self, batch: B, attempt: Attempt) -> bool:
        """The request carrying `attempt` ended: True if its end is the batch's news, False if
        the attempt was given up already (its answer comes from a replaced leader: drop it)."""
        if self._open.get(batch) is not attempt:
            return False
        del self._open[batch]
        return True

    def probe_due(self, now_ms: int) -> bool:
        """Should the producer ask for metadata now, to learn whether a slow attempt's leader moved?"""
        if not self._open:
            return False
        oldest = next(iter(self._open.values()))
        if now_ms - oldest.sent_ms < self.probe_after_ms:
            return False
        return self._probed_ms is None or now_ms - self._probed_ms >= self.probe_interval_ms

    def probed(self, now_ms: int) -> None:
        self._probed_ms = now_ms

    def next_probe_ms(self) -> int | None:
        """When probe_due may next turn true (None: nothing is waiting)."""
        if not self._open:
            return None
        due = next(iter(self._open.values())).sent_ms + self.probe_after_ms
        if self._probed_ms is not None:
            due = max(due, self._probed_ms + self.probe_interval_ms)
        return due

    def slow_brokers(self, now_ms: int) -> set[int]:
        """Brokers holding an attempt past probe_after_ms: asked for metadata last."""
        return {a.broker for a in self._open.values() if now_ms - a.sent_ms >= self.probe_after_ms}

    def give_up_deposed(self, leader_of: Callable[[B], tuple[int, int] | None]) -> list[B]:
        """Forget every attempt whose leader was replaced (`leader_of(batch)`: the partition's
        known (leader id, leader epoch), or None) and return their batches, oldest first: the
        caller tells the producer core each went unanswered."""
        out: list[B] = []
        for batch, attempt in list(self._open.items()):
            known = leader_of(batch)
            if known is not None and deposed(attempt, leader_id=known[0], leader_epoch=known[1]):
                del self._open[batch]
                out.append(batch)
        self.given_up += len(out)
        return out
