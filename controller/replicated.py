"""The controller's replicated state machine: commands in, outcomes out, no I/O.

Every controller applies the same committed commands in the same order, so
everything here is deterministic: no clock, no randomness, no exceptions that
escape. Two kinds of command travel through the Raft log (as JSON):

- a batch `{"expected_offset": X, "records": [...]}` computed by a leader
  against its view of the image at offset X. If the image is no longer at X
  (the leader's view went stale: it lost leadership, or an earlier proposal of
  its own failed) the whole batch is skipped and the outcome says so — the
  caller may recompute and retry. Otherwise the records are applied in order;
  a record the image rejects is skipped (it takes no offset) and reported.
- a marker `{"marker": {"node": ..., "term": ...}}` that a new leader commits
  before it trusts its own view: once its marker is applied, every command of
  earlier terms has been applied too.

The pysyncobj adapter (`controller/raft.py`) stores the outcome-free state via
`dump()`/`load()` as JSON; nothing here knows about Raft.
"""
from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any

from common.errors import RecordRejected
from common.metadata import MetadataImage, dump_record, parse_record

log = logging.getLogger("biplane.controller.state")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Rejection:
    index: int           # position of the record in its batch
    record_type: str
    message: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class Outcome:
    """What applying one command did. `applied` holds (offset, record) pairs."""

    kind: str                      # "batch" | "stale" | "marker" | "malformed"
    offset: int                    # image offset after the command
    applied: tuple[tuple[int, Any], ...] = ()
    rejected: tuple[Rejection, ...] = ()
    expected_offset: int | None = None
    marker: dict | None = None
    message: str = ""

    @property
    def first_offset(self) -> int | None:
        return self.applied[0][0] if self.applied else None


def batch_command(*, expected_offset: int, records: list) -> str:
    """The JSON text of a batch command (records are pydantic records)."""
    return json.dumps({"expected_offset": expected_offset,
                       "records": [dump_record(r) for r in records]},
                      separators=(",", ":"))


def marker_command(*, node: str, term: int, nonce: int) -> str:
    return json.dumps({"marker": {"node": node, "term": term, "nonce": nonce}},
                      separators=(",", ":"))


class MetadataStateMachine:
    """Owns the committed `MetadataImage` on the Raft thread."""

    def __init__(self, image: MetadataImage | None = None) -> None:
        self.image = image if image is not None else MetadataImage()

    def apply_command(self, command_json: str) -> Outcome:
        try:
            command = json.loads(command_json)
        except (TypeError, ValueError) as exc:
            return Outcome(kind="malformed", offset=self.image.offset,
                           message=f"command is not JSON: {exc}")
        if not isinstance(command, dict):
            return Outcome(kind="malformed", offset=self.image.offset,
                           message="command is not a JSON object")
        if "marker" in command:
            return Outcome(kind="marker", offset=self.image.offset, marker=command["marker"])
        expected = command.get("expected_offset")
        records = command.get("records")
        if not isinstance(expected, int) or not isinstance(records, list):
            return Outcome(kind="malformed", offset=self.image.offset,
                           message="a batch needs an integer expected_offset and a records list")
        if expected != self.image.offset:
            return Outcome(kind="stale", offset=self.image.offset, expected_offset=expected,
                           message=f"batch computed at offset {expected}, image is at {self.image.offset}")
        applied: list[tuple[int, Any]] = []
        rejected: list[Rejection] = []
        for index, raw in enumerate(records):
            try:
                record = parse_record(raw)
            except Exception as exc:  # a malformed record is skipped by every replica alike
                rejected.append(Rejection(index=index, record_type=str(_type_of(raw)),
                                          message=f"unparseable record: {exc}"))
                continue
            offset = self.image.offset + 1
            try:
                self.image.apply(record, offset)
            except RecordRejected as exc:
                rejected.append(Rejection(index=index, record_type=exc.record_type, message=str(exc)))
                continue
            except Exception as exc:
                # A bug in applying this record. Every replica hits it the same way, so
                # skipping it keeps them equal; wedging the whole quorum on it would not.
                log.critical("applying record %d of a batch at offset %d failed: %r (record %r)",
                             index, offset, exc, raw)
                rejected.append(Rejection(index=index, record_type=str(_type_of(raw)),
                                          message=f"internal error applying the record: {exc!r}"))
                continue
            applied.append((offset, record))
        return Outcome(kind="batch", offset=self.image.offset, applied=tuple(applied),
                       rejected=tuple(rejected), expected_offset=expected)

    def dump(self) -> dict:
        return self.image.to_dict()

    def load(self, data: dict) -> None:
        self.image = MetadataImage.from_dict(data)


def _type_of(raw: Any) -> Any:
    return raw.get("type", "?") if isinstance(raw, dict) else type(raw).__name__
