"""The one Ready executor: `perform(ready, log, effects)`, shared by the broker's
`PartitionDriver` and the simulation (tests/sim/cluster.py), so both persist, send,
answer and release through the same code.

It keeps the order `actions.py` states: persist (Append and the truncations applied
to the log at once, each Append checked against the offsets the core predicted;
Flush handed to the driver, which completes it later with FlushDone), then send,
answers, release, notes, and last WriteDone for the appends just written. What
leaves the process (a socket, a simulated network, a future) is the driver's,
behind `Effects`; deciding is the core's. A message the core sends that has no
transport here is our own bug and fails loudly.
"""
from __future__ import annotations

from typing import Protocol

from common.batch import Buffer
from dataplane.log.interface import AppendInfo
from dataplane.replica.actions import (
    Append, Flush, NoteAction, PersistAction, ProposeIsr, Ready, ReleaseProduce, ReportElection, Send, Truncate,
    TruncateFully,
)
from dataplane.replica.events import AppendEntries, FetchRequest, WriteDone
from dataplane.replica.logview import LogView


class WritableLog(LogView, Protocol):
    """The writing part of the log contract (dataplane/log/interface.py) that persist uses."""

    def append_as_leader(self, batches: Buffer, *, leader_epoch: int, now_ms: int | None = None,
                         crc_checked: bool = False) -> AppendInfo: ...
    def append_as_follower(self, batches: Buffer, *, now_ms: int | None = None,
                           crc_checked: bool = False) -> AppendInfo: ...
    def truncate_to(self, offset: int) -> int: ...
    def truncate_fully_and_start_at(self, offset: int) -> None: ...


class Effects(Protocol):
    """What a driver does with the parts of a Ready that leave the core."""

    def persisted(self, action: PersistAction, previous_end: int) -> None:
        """An Append or truncation is in the log (which ended at `previous_end` before)."""
    def flush(self, up_to: int) -> None:
        """Start a flush of the log up to `up_to`; step FlushDone when it completes."""
    def send_fetch(self, leader_id: int, request: FetchRequest) -> None: ...
    def send_append_entries(self, follower_id: int, message: AppendEntries) -> None: ...
    def propose_isr(self, proposal: ProposeIsr) -> None: ...
    def report_election(self, report: ReportElection) -> None: ...
    def answer(self, answer: Send) -> None:
        """A FetchResponse or AppendEntriesReply for the fetch or append-entries being stepped."""
    def release(self, release: ReleaseProduce) -> None: ...
    def note(self, note: NoteAction) -> None: ...
    def written(self, done: WriteDone) -> None:
        """Step `done` into the core (and perform what it returns)."""


def perform(ready: Ready, log: WritableLog, effects: Effects) -> None:
    last_written: int | None = None
    for action in ready.persist:
        previous_end = log.log_end_offset
        if isinstance(action, Append):
            _append(log, action)
            last_written = action.last_offset
        elif isinstance(action, Truncate):
            log.truncate_to(action.offset)
            if log.log_end_offset != action.offset:
                raise AssertionError(f"truncate_to({action.offset}) left log end {log.log_end_offset}")
        elif isinstance(action, TruncateFully):
            log.truncate_fully_and_start_at(action.offset)
        elif isinstance(action, Flush):
            effects.flush(action.up_to)
            continue
        else:
            raise AssertionError(f"unknown persist action {action!r}")
        effects.persisted(action, previous_end)
    for sent in ready.send:
        if isinstance(sent, Send):
            message = sent.message
            if isinstance(message, FetchRequest):
                effects.send_fetch(sent.to_broker, message)
            elif isinstance(message, AppendEntries):
                effects.send_append_entries(sent.to_broker, message)
            else:
                raise AssertionError(f"core sent {type(message).__name__}: no transport for it")
        elif isinstance(sent, ProposeIsr):
            effects.propose_isr(sent)
        else:
            effects.report_election(sent)
    for answer in ready.answers:
        effects.answer(answer)
    for release in ready.release:
        effects.release(release)
    for note in ready.notes:
        effects.note(note)
    if last_written is not None:
        effects.written(WriteDone(last_offset=last_written))


def _append(log: WritableLog, action: Append) -> None:
    # crc_checked: the core validated these very bytes (CRC included) before it asked for
    # the Append, on every path (produce, fetch answer, append-entries).
    if action.as_leader:
        # The log patches a bytearray or writable view (the request's frame) in place, copies the rest.
        info = log.append_as_leader(action.records, leader_epoch=action.leader_epoch, crc_checked=True)
    else:
        info = log.append_as_follower(action.records, crc_checked=True)
    if (info.base_offset, info.last_offset) != (action.base_offset, action.last_offset):
        raise AssertionError(f"log stored {info.base_offset}..{info.last_offset}, "
                             f"core expected {action.base_offset}..{action.last_offset}")
