"""Produce admission: which produce requests a leader takes, refuses or holds, in one place.

Mixed into `core.Replica`. A request is checked in this order, the first failure
answering it (`_on_produce`): this replica leads (NOT_LEADER_OR_FOLLOWER); the
client's leader epoch, when it names one (`client_epoch_error`, also used for
consumers' fetches and list-offsets: older FENCED_LEADER_EPOCH; newer
UNKNOWN_LEADER_EPOCH and a metadata refresh, but we keep leading, since a
client's word is no proof we were deposed). Then, while this leader cannot take
requests at all (`_may_take_more`: its epoch-start batch unflushed, its producer
table loading, or no room in the broker-wide budget, which enters as the
BrokerBudget event), requests are held in arrival order (`held_produce_max`;
0 refuses them LEADER_NOT_AVAILABLE before the epoch start is flushed) and taken
after each event once it can (`_admit_held`). Taking one (`_take_produce`): acks
is 0, 1 or -1 (INVALID_REQUIRED_ACKS); the batches parse and pass their CRC
(CORRUPT_MESSAGE), their headers parsed here once for the whole path; no batch
above `batch_bytes_max` (MESSAGE_TOO_LARGE) or the log's segment size
(RECORD_LIST_TOO_LARGE); on a compacted topic every record has a
key (INVALID_RECORD: the records are decoded for it); the request id is new; fewer than
`pending_produce_max` requests are pending. Then backpressure: while the bytes
this leader wrote in its epoch and the HW has not passed reach
`unreplicated_bytes_max`, requests wait in arrival order in the backlog
(`_admit_backlog` admits them as the HW makes room, `_on_tick` times them out).
`_admit` applies min.insync.replicas for acks=all and the idempotent producer
rules (producer_state.py), and appends.

The broker checks none of this: its request handler finds the partition and
passes the client's epoch and the topic's max_message_bytes on; its driver keeps
no queue.
"""
from __future__ import annotations

import collections
import dataclasses
from typing import TYPE_CHECKING

from common.batch import BatchHeader, Buffer, iter_batches, read_records
from common.epochs import check_epoch, leader_epoch_error
from common.errors import CorruptBatchError, ErrorCode
from dataplane.replica.actions import NoteAction, Rejected, RefreshMetadata, ReleaseProduce
from dataplane.replica.events import BrokerBudget, ProduceRequest
from dataplane.replica.logview import LogView
from dataplane.replica.producer_state import ProducerStateTable
from dataplane.replica.state import PartitionState, ReplicationConfig, Role

VALID_ACKS = (0, 1, -1)


@dataclasses.dataclass(frozen=True, slots=True)
class PendingProduce:
    request_id: int
    acks: int
    base_offset: int
    last_offset: int
    deadline_ms: int
    record_count: int = 0


class ProduceAdmission:
    # What the mixin uses of `core.Replica`, declared so it is type-checked against it
    # (annotations only: Replica's __init__ sets them).
    role: Role
    log: LogView
    leader_epoch: int
    epoch_durable: bool
    state: PartitionState | None
    config: ReplicationConfig
    now_ms: int
    wall_ms: int
    high_watermark: int
    pending_produce_max: int
    unreplicated_bytes_max: int
    producer_state: ProducerStateTable
    pending: dict[int, PendingProduce]
    _waiting: dict[int, collections.deque[int]]
    _backlog: dict[int, tuple[ProduceRequest, list[BatchHeader], int]]
    _backlog_bytes: int
    _append_sizes: collections.deque[tuple[int, int]]
    _appended_bytes: int
    _replicated_bytes: int
    _release: list[ReleaseProduce]
    _notes: list[NoteAction]
    held_produce_max: int
    _held: dict[int, tuple[ProduceRequest, int]]
    broker_bytes_max: int | None
    _broker_others_bytes: int

    if TYPE_CHECKING:
        def _append_as_leader(self, records: Buffer, record_count: int | None = None) -> tuple[int, int]: ...
        def _request_flush(self) -> None: ...

    def _on_produce(self, ev: ProduceRequest) -> None:
        if self.role is not Role.LEADER:
            self._refuse_produce(ev, ErrorCode.NOT_LEADER_OR_FOLLOWER)
            return
        epoch_error = self._check_client_epoch(ev.leader_epoch, "a produce request")
        if epoch_error is not ErrorCode.NONE:
            self._refuse_produce(ev, epoch_error, their_epoch=ev.leader_epoch if ev.leader_epoch is not None else -1)
            return
        if self._held or not self._may_take_more():
            if self.held_produce_max > 0:
                # Held in arrival order until this leader can take them (`_admit_held`),
                # rather than refused: a producer with several batches in flight would
                # otherwise see a refused batch overtaken by a later accepted one.
                if len(self._held) >= self.held_produce_max:
                    self._refuse_produce(ev, ErrorCode.LEADER_NOT_AVAILABLE,
                                         reason=f"held_produce_max={self.held_produce_max} reached")
                elif ev.request_id in self._held:
                    self._refuse_produce(ev, ErrorCode.INVALID_REQUEST,
                                         reason=f"request id {ev.request_id} is already waiting; ids must be unique")
                else:
                    self._held[ev.request_id] = (ev, self.now_ms + ev.timeout_ms)
                return
            if not self.epoch_durable:
                self._refuse_produce(ev, ErrorCode.LEADER_NOT_AVAILABLE, reason="epoch start not flushed yet")
                return
        self._take_produce(ev)

    def _may_take_more(self) -> bool:
        """Can this leader take a produce request now? Not before its epoch start is flushed,
        nor while its producer table is being rebuilt (a driver's table may load off the
        event loop: dataplane/broker/producer_state.py), nor while the broker's leaders
        together hold `broker_bytes_max` (the bytes the others hold come in BrokerBudget)."""
        if not self.epoch_durable or getattr(self.producer_state, "loading", False):
            return False
        return (self.broker_bytes_max is None
                or self._broker_others_bytes + self.held_bytes() < self.broker_bytes_max)

    def waiting_for_room(self) -> bool:
        """Requests are held, and only broker-wide room would let them in (a driver then asks
        its budget to call back)."""
        return bool(self._held) and self.epoch_durable and not getattr(self.producer_state, "loading", False)

    def _admit_held(self) -> None:
        """Take held requests, in arrival order, while this leader can (after every event)."""
        while self._held and self._may_take_more():
            request_id = next(iter(self._held))
            ev, deadline_ms = self._held.pop(request_id)
            self._take_produce(dataclasses.replace(ev, timeout_ms=max(1, deadline_ms - self.now_ms)))

    def _time_out_held(self) -> None:
        for request_id, (_, deadline_ms) in list(self._held.items()):
            if self.now_ms >= deadline_ms:
                del self._held[request_id]
                self._release.append(ReleaseProduce(request_id=request_id, error=ErrorCode.REQUEST_TIMED_OUT,
                                                    reason="held past its timeout"))

    def _on_broker_budget(self, ev: BrokerBudget) -> None:
        self._broker_others_bytes = ev.others_bytes
        self.broker_bytes_max = ev.bytes_max

    def _take_produce(self, ev: ProduceRequest) -> None:
        if ev.acks not in VALID_ACKS:
            self._refuse_produce(ev, ErrorCode.INVALID_REQUIRED_ACKS, reason=f"acks={ev.acks}")
            return
        try:
            headers = [h for _, h in iter_batches(ev.records)]
        except CorruptBatchError as exc:
            self._refuse_produce(ev, ErrorCode.CORRUPT_MESSAGE, reason=str(exc))
            return
        if not headers:
            self._refuse_produce(ev, ErrorCode.INVALID_REQUEST, reason="no record batch in produce request")
            return
        if ev.batch_bytes_max is not None:
            too_big = [h.size_bytes for h in headers if h.size_bytes > ev.batch_bytes_max]
            if too_big:
                self._refuse_produce(ev, ErrorCode.MESSAGE_TOO_LARGE,
                                     reason=f"batch of {too_big[0]} bytes exceeds max_message_bytes="
                                            f"{ev.batch_bytes_max}")
                return
        # The log refuses a batch larger than a segment; refused here, it never becomes an Append
        # the core counted on (which left the partition waiting on a write that never happened).
        segment_max = self.log.batch_bytes_max
        too_big = [h.size_bytes for h in headers if h.size_bytes > segment_max]
        if too_big:
            self._refuse_produce(ev, ErrorCode.RECORD_LIST_TOO_LARGE,
                                 reason=f"batch of {too_big[0]} bytes is larger than a segment of this topic "
                                        f"(segment_bytes allows batches up to {segment_max} bytes); raise the "
                                        f"topic's segment.bytes or send smaller batches")
            return
        if self.config.keys_required:
            reason = _keyless_record(ev.records)
            if reason is not None:
                self._refuse_produce(ev, ErrorCode.INVALID_RECORD if reason[0] else ErrorCode.CORRUPT_MESSAGE,
                                     reason=reason[1])
                return
        if ev.request_id in self.pending or ev.request_id in self._backlog:
            self._refuse_produce(ev, ErrorCode.INVALID_REQUEST,
                                 reason=f"request id {ev.request_id} is already waiting; ids must be unique")
            return
        if len(self.pending) + len(self._backlog) >= self.pending_produce_max:
            # The bound on requests held at all (memory); within it, requests wait for room.
            self._refuse_produce(ev, ErrorCode.REQUEST_TIMED_OUT,
                                 reason=f"pending_produce_max={self.pending_produce_max} reached")
            return
        deadline_ms = self.now_ms + ev.timeout_ms
        if self._backlog or self.unreplicated_bytes() >= self.unreplicated_bytes_max:
            # Backpressure: bytes written here but not yet on the required set are bounded;
            # the request waits (in arrival order) until the HW makes room, or its timeout.
            self._backlog[ev.request_id] = (ev, headers, deadline_ms)
            self._backlog_bytes += len(ev.records)
            return
        self._admit(ev, headers, deadline_ms)

    def client_epoch_error(self, epoch: int | None) -> ErrorCode:
        """A client's leader epoch against ours (None or -1: it named none): older is
        FENCED_LEADER_EPOCH, newer UNKNOWN_LEADER_EPOCH. A client's metadata may be ahead of
        ours (or simply wrong): unlike a replica's, its epoch is no proof that we were
        deposed, so a newer one never stops us leading; it only makes us refresh metadata."""
        if epoch is None or epoch < 0:
            return ErrorCode.NONE
        return leader_epoch_error(check_epoch(theirs=epoch, ours=self.leader_epoch))

    def _check_client_epoch(self, epoch: int | None, source: str) -> ErrorCode:
        error = self.client_epoch_error(epoch)
        if error is ErrorCode.UNKNOWN_LEADER_EPOCH:
            assert epoch is not None
            self._notes.append(RefreshMetadata(seen_epoch=epoch, known_epoch=self.leader_epoch,
                                               reason=f"newer leader epoch in {source}"))
        return error

    def _admit(self, ev: ProduceRequest, headers: list[BatchHeader], deadline_ms: int) -> None:
        if (ev.acks == -1 and self.config.commit_policy == "isr" and self.state is not None
                and len(self.state.isr) < self.config.min_insync_replicas):
            self._refuse_produce(ev, ErrorCode.NOT_ENOUGH_REPLICAS,
                                 reason=f"isr={list(self.state.isr)} < min_insync_replicas="
                                        f"{self.config.min_insync_replicas}")
            return
        error, reason, duplicate = self._check_producer_sequence(headers)
        if error is not ErrorCode.NONE:
            self._refuse_produce(ev, error, reason=reason)
            return
        count = sum(h.record_count for h in headers)
        if duplicate is not None:
            # A retry of batches already in the log: answer with their offsets once they
            # reach what this request's acks asks for; write nothing.
            base, last = duplicate
            self.pending[ev.request_id] = PendingProduce(request_id=ev.request_id, acks=ev.acks, base_offset=base, record_count=count,
                                                         last_offset=last, deadline_ms=deadline_ms)
            self._waiting[ev.acks].append(ev.request_id)
            return
        base, last = self._append_as_leader(ev.records, count)
        offset = base
        for h in headers:
            self.producer_state.record(h, base_offset=offset, seen_ms=self.wall_ms)
            offset += h.record_count
        self._appended_bytes += len(ev.records)
        self._append_sizes.append((last + 1, self._appended_bytes))
        self.pending[ev.request_id] = PendingProduce(request_id=ev.request_id, acks=ev.acks, base_offset=base, record_count=count,
                                                     last_offset=last, deadline_ms=deadline_ms)
        self._waiting[ev.acks].append(ev.request_id)
        if ev.acks == -1 and self.config.durability == "fsync":
            self._request_flush()

    def unreplicated_bytes(self) -> int:
        """Bytes of produce requests this leader wrote in its epoch that the HW has not passed."""
        sizes = self._append_sizes
        while sizes and sizes[0][0] <= self.high_watermark:
            self._replicated_bytes = sizes.popleft()[1]
        return self._appended_bytes - self._replicated_bytes if sizes else 0

    def held_bytes(self) -> int:
        """Produce bytes this leader holds in memory: written but not yet passed by the HW,
        plus requests waiting for room (what a broker-wide bound must count)."""
        return self.unreplicated_bytes() + self._backlog_bytes

    def _admit_backlog(self) -> None:
        while self._backlog and (self.unreplicated_bytes() < self.unreplicated_bytes_max):
            request_id = next(iter(self._backlog))
            ev, headers, deadline_ms = self._backlog.pop(request_id)
            self._backlog_bytes -= len(ev.records)
            self._admit(ev, headers, deadline_ms)

    def _check_producer_sequence(self, headers: list[BatchHeader]) -> tuple[ErrorCode, str, tuple[int, int] | None]:
        """(error, reason, duplicate span): a request made only of batches already written is a
        duplicate answered with their offsets; any other batch must pass the sequence rules."""
        checks = [self.producer_state.check(h) for h in headers]
        duplicates = [c.duplicate for c in checks if c.duplicate is not None]
        if len(duplicates) == len(checks):
            return ErrorCode.NONE, "", (min(d.base_offset for d in duplicates),
                                        max(d.last_offset for d in duplicates))
        # Batches of one producer later in the same request follow the earlier ones.
        previous: dict[int, tuple[int, int]] = {}
        for h, c in zip(headers, checks):
            if h.producer_id < 0 or h.is_control:
                continue
            before = previous.get(h.producer_id)
            if before is not None:
                if h.producer_epoch != before[0] or h.base_sequence != (before[1] + 1) & 0x7FFFFFFF:
                    return (ErrorCode.OUT_OF_ORDER_SEQUENCE,
                            f"producer {h.producer_id}: batches in one request are not consecutive", None)
            elif c.error is not ErrorCode.NONE:
                return c.error, c.reason, None
            elif c.duplicate is not None:
                return (ErrorCode.OUT_OF_ORDER_SEQUENCE,
                        f"producer {h.producer_id}: a request mixes written and new batches", None)
            previous[h.producer_id] = (h.producer_epoch, (h.base_sequence + h.record_count - 1) & 0x7FFFFFFF)
        return ErrorCode.NONE, "", None

    def _refuse_produce(self, ev: ProduceRequest, error: ErrorCode, *, their_epoch: int = -1,
                        reason: str = "") -> None:
        self._release.append(ReleaseProduce(request_id=ev.request_id, error=error, reason=reason))
        self._notes.append(Rejected(event="ProduceRequest", error=error, their_epoch=their_epoch,
                                    our_epoch=self.leader_epoch, reason=reason))



def _keyless_record(records: Buffer) -> tuple[bool, str] | None:
    """Why a compacted topic refuses `records` (True: a record has no key; False: they do
    not decode), or None when every record has a key."""
    try:
        for i, (position, _) in enumerate(iter_batches(records, validate=False)):
            for record in read_records(records, position):
                if record.key is None:
                    return True, (f"record at offset delta {record.offset} of batch {i} has no key; the topic is "
                                  "compacted (cleanup_policy has compact), which keeps the latest record per key: "
                                  "give every record a key")
    except CorruptBatchError as exc:
        return False, str(exc)
    return None
