"""What comes out of `Replica.step`: a `Ready` of actions for the driver to perform.

The driver performs them in this order (etcd-raft's Ready contract):
1. `persist` in list order — Truncate/TruncateFully, Append, Flush. Append and the
   truncations must be applied to the log (visible through the log view) before the next `step`;
   completion is reported back with WriteDone; a Flush is asynchronous and
   completes with FlushDone.
2. `send` — messages to other brokers and to the controller.
3. `answers` — the core's answers to a fetch or an append-entries it was just
   stepped with (FetchResponse, AppendEntriesReply, as a Send naming the asker;
   -1 is a consumer). A driver answering over the asker's own connection takes
   them from here; one that answers nobody (e.g. after a FlushDone) drops them.
4. `release` — answer produce requests.
5. `notes` — things the driver should know (metadata refresh, leadership lost,
   rejected input); no effect on the log.

`dataplane/replica/perform.py` performs a Ready in this order for the broker and
the simulation alike.
"""
from __future__ import annotations

import dataclasses
from typing import TypeVar, dataclass_transform

from common.batch import Buffer
from common.errors import ErrorCode
from dataplane.replica.events import AppendEntries, AppendEntriesReply, FetchRequest, FetchResponse


_T = TypeVar("_T")


@dataclass_transform(frozen_default=True, kw_only_default=True)
def _frozen(cls: type[_T]) -> type[_T]:
    """A frozen, keyword-only, slotted dataclass (declared so type checkers see its fields)."""
    return dataclasses.dataclass(frozen=True, kw_only=True, slots=True)(cls)


@_frozen
class Append:
    """Append batches. As leader the log assigns offsets from its end (== base_offset,
    the core's prediction) and stamps leader_epoch; as follower the batches keep the
    leader's offsets and epochs and start at base_offset."""

    as_leader: bool
    records: Buffer
    base_offset: int
    last_offset: int
    leader_epoch: int


@_frozen
class Truncate:
    """Remove every batch at or above `offset` (a diverging follower's tail)."""

    offset: int


@_frozen
class TruncateFully:
    """Remove every batch and start the log empty at `offset` (the log's
    `truncate_fully_and_start_at`): the leader's log starts past our end, so
    nothing we hold can be continued. Durable when applied, like Truncate."""

    offset: int


@_frozen
class Flush:
    up_to: int


@_frozen
class Send:
    to_broker: int
    message: FetchRequest | FetchResponse | AppendEntries | AppendEntriesReply


@_frozen
class ProposeIsr:
    """To the controller: change the ISR; valid only at these epochs."""

    replica_id: int
    new_isr: tuple[int, ...]
    leader_epoch: int
    partition_epoch: int


@_frozen
class ReportElection:
    """To the controller during a quorum election: (last epoch, end offset) of the FLUSHED log.

    `unclean`: its log took records under durability=write (the topic is or was under write),
    and it restarted after a crash and has not caught up with a leader since; the log may lack
    a committed record it once counted."""

    replica_id: int
    fenced_epoch: int
    last_epoch: int
    end_offset: int
    unclean: bool = False


@_frozen
class ReleaseProduce:
    """The answer to a produce request: its base offset, or an error and why (`reason`).
    `record_count`: records the request carried (for a driver's counters)."""

    request_id: int
    error: ErrorCode = ErrorCode.NONE
    base_offset: int = -1
    reason: str = ""
    record_count: int = 0


@_frozen
class RefreshMetadata:
    seen_epoch: int
    known_epoch: int
    reason: str


@_frozen
class StopLeading:
    leader_epoch: int
    reason: str


@_frozen
class Rejected:
    """An input refused for its epoch or shape; both epochs named when it is a fence."""

    event: str
    error: ErrorCode
    their_epoch: int
    our_epoch: int
    reason: str = ""


PersistAction = Append | Truncate | TruncateFully | Flush
SendAction = Send | ProposeIsr | ReportElection
NoteAction = RefreshMetadata | StopLeading | Rejected
Action = PersistAction | SendAction | ReleaseProduce | NoteAction


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Ready:
    persist: tuple[PersistAction, ...] = ()
    send: tuple[SendAction, ...] = ()
    answers: tuple[Send, ...] = ()
    release: tuple[ReleaseProduce, ...] = ()
    notes: tuple[NoteAction, ...] = ()

    @property
    def actions(self) -> tuple[Action, ...]:
        return self.persist + self.send + self.answers + self.release + self.notes

    def __bool__(self) -> bool:
        return bool(self.persist or self.send or self.answers or self.release or self.notes)
