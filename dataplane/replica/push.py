"""Push replication (`replication_mode=push`), the part of the replica core that sends
append-entries as leader and applies them as follower. Mixed into `core.Replica`.

Leader, per follower (FollowerProgress.push_*):
- normal path: right after a local write shows in the log view (the step after the
  Append, e.g. WriteDone, while the leader's own flush runs), send the new batches
  after (prev offset, prev epoch), pipelined: at most `push_inflight_max` requests
  out, each at most `fetch_max_bytes`;
- recovery: a follower that answered a mismatch or a gap, or whose window timed out,
  gets one chunk at a time read from the log from its verified offset (no flush is
  asked for a chunk below any waiting acks=all); when a chunk reaches the log end it
  is back on the normal path from exactly there, so nothing in flight is resent and
  nothing overtakes it;
- divergence: the follower's (log end, last epoch) go through the same rule as a
  fetch (`_divergence`); the leader sends where that epoch ends here and the follower
  truncates with `_truncate_diverging`, as in pull mode (a follower ending below our
  log start empties its log and starts it there);
- idle followers get an empty append-entries (the HW, and the lag rule's evidence): every
  `push_heartbeat_ms` while there is news for it (a HW it was not sent, a flush it has not
  reported under durability=fsync, a log end it has not reached, an ISR it is not in or a
  change of ours it has not answered since), else only every QUIET_REFRESH of the topic's
  replica_lag_time_max_ms, as a quiet partition of a pull fetch session is stepped: sent
  every 100 ms per partition and follower, they were all an idle broker with push topics
  did. The broker pair's own heartbeat (pusher.py) keeps the link check fed meanwhile.
  A new HW rides on the next append-entries, as Raft's commit index does: an empty one
  sent at every HW move would cost every acks=all request a second round to each follower.
Replies feed the same progress tracking (`_record_progress`) and HW as fetches.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from common.batch import Buffer, iter_batches
from common.errors import CorruptBatchError, ErrorCode
from dataplane.replica.actions import NoteAction, Rejected, Send, SendAction
from dataplane.replica.events import AppendEntries, AppendEntriesReply
from common.epochs import EpochCheck, check_epoch
from dataplane.replica.logview import LogView
from dataplane.replica.state import QUIET_REFRESH, PartitionState, ReplicationConfig

if TYPE_CHECKING:
    from dataplane.replica.core import FollowerProgress

# A follower's answer when (prev offset, prev epoch) is not in its log: a gap or another epoch.
MISMATCH = ErrorCode.OFFSET_OUT_OF_RANGE


class PushMixin:
    # What the mixin uses of `core.Replica`, declared so it is type-checked against it
    # (annotations only: Replica's __init__ sets them).
    replica_id: int
    partition: object
    log: LogView
    config: ReplicationConfig
    state: PartitionState | None
    _isr_generation: int
    now_ms: int
    leader_epoch: int
    high_watermark: int
    log_end_offset: int
    last_epoch: int
    flushed_offset: int
    unclean_start: bool
    epoch_durable: bool
    epoch_start_offset: int
    progress: dict[int, FollowerProgress]
    fetch_max_bytes: int
    fetch_timeout_ms: int
    push_inflight_max: int
    push_heartbeat_ms: int
    _push_match: int
    _send: list[SendAction]
    _answers: list[Send]
    _notes: list[NoteAction]

    if TYPE_CHECKING:
        def _divergence(self, fetch_offset: int, last_fetched_epoch: int) -> tuple[int, int] | None: ...
        def _acks_all_waiting_in(self, lo: int, hi: int) -> bool: ...
        def _record_progress(self, replica_id: int, *, log_end_offset: int, match_offset: int,
                             flushed_offset: int) -> None: ...
        def _saw_newer_epoch(self, epoch: int, source: str) -> None: ...
        def _following(self, leader_id: int) -> bool: ...
        def _truncate_diverging(self, leader_epoch: int, leader_end: int) -> None: ...
        def _cut_to(self, offset: int) -> None: ...
        def _append_as_follower(self, records: Buffer) -> bool: ...
        def _request_flush(self) -> None: ...

    # ------------------------------------------------------------ leader

    def _push_all(self) -> None:
        if not self.epoch_durable:
            return  # serve nothing of this epoch before its start is durable (see _become_leader)
        chunks: dict[int, tuple[bytes | memoryview, int]] = {}  # followers at the same offset get the same read
        for replica_id in self.progress:
            self._push_to(replica_id, chunks)

    def _push_to(self, replica_id: int, chunks: dict[int, tuple[bytes | memoryview, int]]) -> None:
        p = self.progress[replica_id]
        end = self.log.log_end_offset  # what is in the log now, not what this step appends
        if p.push_next < 0:
            # New in this epoch: probe from our epoch start; the reply says where it stands.
            p.push_next = self.epoch_start_offset
            p.push_recovering = True
        if p.push_next < self.log.log_start_offset:
            # Retention deleted what it was to get next: probe from our log start; a follower
            # that ends below it is told to start over there (_divergence).
            p.push_inflight.clear()
            p.push_next = self.log.log_start_offset
            p.push_recovering = True
        window = 1 if p.push_recovering else self.push_inflight_max
        sent = False
        while len(p.push_inflight) < window and p.push_next < end:
            chunk = chunks.get(p.push_next)
            if chunk is None:
                records = self.log.read(p.push_next, max_bytes=self.fetch_max_bytes).records
                chunk_end = p.push_next
                for _, h in iter_batches(records, validate=False):
                    chunk_end = h.next_offset
                chunk = chunks[p.push_next] = (records, chunk_end)
            records, chunk_end = chunk
            if chunk_end <= p.push_next:
                break
            # Under durability=write the commit rule counts written offsets: a flush asked for
            # here would only hold the follower's answer for an fsync nobody counts.
            flush = self.config.durability == "fsync" and self._acks_all_waiting_in(p.flushed_offset, chunk_end)
            self._send_append_entries(replica_id, prev_offset=p.push_next, records=records, end=chunk_end,
                                      flush=flush)
            p.push_next = chunk_end
            sent = True
            if p.push_recovering and chunk_end >= end:
                p.push_recovering = False  # caught up: the normal path goes on from here
                window = self.push_inflight_max
        if not sent and not p.push_inflight and \
                self.now_ms - p.push_last_sent_ms >= self._push_heartbeat_interval_ms(replica_id):
            self._send_append_entries(replica_id, prev_offset=p.push_next, records=b"", end=p.push_next,
                                      flush=False)

    def _push_heartbeat_interval_ms(self, replica_id: int) -> int:
        """How long an idle follower may go without an append-entries: push_heartbeat_ms while
        we have news for it, else a share of the lag time (its caught-up clock must never run
        out on a quiet partition)."""
        p = self.progress[replica_id]
        news = (p.push_hw_sent < self.high_watermark
                or p.match_offset < self.log.log_end_offset
                or (self.config.durability == "fsync" and p.flushed_offset < p.match_offset)
                or p.fetch_generation != self._isr_generation
                or self.state is None or replica_id not in self.state.isr)
        if news:
            return self.push_heartbeat_ms
        return max(self.push_heartbeat_ms, int(self.config.replica_lag_time_max_ms * QUIET_REFRESH))

    def _send_append_entries(self, replica_id: int, *, prev_offset: int, records: bytes | memoryview, end: int,
                             flush: bool, diverging: tuple[int, int] = (-1, -1), prev_epoch: int | None = None) -> None:
        p = self.progress[replica_id]
        p.push_inflight.append((end, self.now_ms))
        p.push_last_sent_ms = self.now_ms
        p.push_hw_sent = self.high_watermark
        self._send.append(Send(to_broker=replica_id, message=AppendEntries(
            leader_id=self.replica_id, leader_epoch=self.leader_epoch, prev_offset=prev_offset,
            prev_epoch=self.log.epoch_before(prev_offset) if prev_epoch is None else prev_epoch, records=records, high_watermark=self.high_watermark,
            log_end_offset=self.log_end_offset, flush_after_append=flush, diverging_epoch=diverging[0],
            diverging_end_offset=diverging[1], partition=self.partition)))

    def _on_push_reply(self, ev: AppendEntriesReply) -> None:
        p = self.progress[ev.replica_id]
        if ev.error is MISMATCH:
            # Back to recovery from what the follower really holds; what was in flight is void.
            p.push_inflight.clear()
            p.push_recovering = True
            diverging = self._divergence(ev.log_end_offset, ev.last_epoch)
            if diverging is not None:
                p.push_next = diverging[1]
                # prev_* name the follower's log state this answers, so a late or
                # duplicated copy cannot cut a log that has moved on (as a fetch answer echoes).
                self._send_append_entries(ev.replica_id, prev_offset=ev.log_end_offset, records=b"",
                                          end=-1, flush=False, diverging=diverging, prev_epoch=ev.last_epoch)
                return
            p.push_next = min(ev.log_end_offset, self.log.log_end_offset)
            self._record_progress(ev.replica_id, log_end_offset=ev.log_end_offset,
                                  match_offset=ev.log_end_offset, flushed_offset=ev.flushed_offset)
            return
        if ev.error is not ErrorCode.NONE:
            return
        while p.push_inflight and 0 <= p.push_inflight[0][0] <= ev.match_offset:
            p.push_inflight.popleft()
        self._record_progress(ev.replica_id, log_end_offset=ev.log_end_offset, match_offset=ev.match_offset,
                              flushed_offset=ev.flushed_offset)

    def _push_timeouts(self) -> None:
        for p in self.progress.values():
            if p.push_inflight and self.now_ms - p.push_inflight[0][1] >= self.fetch_timeout_ms:
                # The window was lost (or the follower is gone): recover from what it verified.
                p.push_inflight.clear()
                p.push_hw_sent = -1   # and the HW it carried may not have arrived
                p.push_recovering = True
                p.push_next = min(max(p.match_offset, self.log.log_start_offset), self.log.log_end_offset)

    # ---------------------------------------------------------- follower

    def _on_append_entries(self, ev: AppendEntries) -> None:
        check = check_epoch(theirs=ev.leader_epoch, ours=self.leader_epoch)
        if check is EpochCheck.STALE:
            self._notes.append(Rejected(event="AppendEntries", error=ErrorCode.FENCED_LEADER_EPOCH,
                                        their_epoch=ev.leader_epoch, our_epoch=self.leader_epoch))
            self._reply_append_entries(ev.leader_id, error=ErrorCode.FENCED_LEADER_EPOCH)
            return
        if check is EpochCheck.NEWER:
            self._saw_newer_epoch(ev.leader_epoch, f"append-entries from replica {ev.leader_id}")
            self._reply_append_entries(ev.leader_id, error=ErrorCode.UNKNOWN_LEADER_EPOCH)
            return
        if not self._following(ev.leader_id):
            self._reply_append_entries(ev.leader_id, error=ErrorCode.NOT_LEADER_OR_FOLLOWER)
            return
        if ev.diverging_end_offset >= 0:
            if not self._answers_our_log(ev):
                return  # computed from another state of our log: late or duplicated
            self._truncate_diverging(ev.diverging_epoch, ev.diverging_end_offset)
            self._push_match = min(self._push_match, self.log_end_offset)
            self._reply_append_entries(ev.leader_id, error=MISMATCH)
            return
        # At our log start nothing before it is here to compare: an empty log matches any
        # prev_epoch there (it was started at that offset of the leader's log, see _start_at).
        prev_ok = ev.prev_offset <= self.log_end_offset and (
            (ev.prev_offset == self.log.log_start_offset
             and (ev.prev_epoch < 0 or self.log_end_offset == self.log.log_start_offset))
            or self.log.epoch_before(ev.prev_offset) == ev.prev_epoch)
        if not prev_ok:
            self._reply_append_entries(ev.leader_id, error=MISMATCH)
            return
        matched = self._apply_pushed(ev.prev_offset, ev.records)
        if matched is None:
            return
        self._push_match = matched
        self.high_watermark = max(min(ev.high_watermark, matched), min(self.high_watermark, matched))
        if self.unclean_start and self.log_end_offset >= ev.log_end_offset:
            self.unclean_start = False
        if ev.flush_after_append:
            self._request_flush()
        self._reply_append_entries(ev.leader_id)

    def _answers_our_log(self, ev: AppendEntries) -> bool:
        return (ev.prev_offset, ev.prev_epoch) == (self.log_end_offset, self.last_epoch)

    def _apply_pushed(self, prev_offset: int, records: Buffer) -> int | None:
        """Append what we lack after prev_offset; batches we already hold in the same epoch
        are the same batches (one leader per epoch) and stay; the first batch of another
        epoch and everything after it is cut. Returns the end of the verified prefix."""
        try:
            # Headers only: what is appended is CRC-checked by _append_as_follower, and a
            # batch we already hold is not stored again.
            found = list(iter_batches(records, validate=False))
        except CorruptBatchError as exc:
            self._notes.append(Rejected(event="AppendEntries", error=ErrorCode.CORRUPT_MESSAGE,
                                        their_epoch=self.leader_epoch, our_epoch=self.leader_epoch, reason=str(exc)))
            return None
        offset = prev_offset
        for i, (pos, h) in enumerate(found):
            if h.base_offset < offset:  # a gap is what compaction leaves; an overlap is an error
                self._notes.append(Rejected(event="AppendEntries", error=ErrorCode.INVALID_REQUEST,
                                            their_epoch=h.leader_epoch, our_epoch=self.leader_epoch,
                                            reason=f"batch at {h.base_offset}, expected {offset} or above"))
                return None
            if h.next_offset <= self.log_end_offset and self.log.epoch_before(h.next_offset) == h.leader_epoch \
                    and self._batch_epoch_at(h.base_offset) == h.leader_epoch:
                offset = h.next_offset
                continue
            if offset < self.log_end_offset:
                self._cut_to(offset)
            if not self._append_as_follower(records[pos:]):
                return None
            return self.log_end_offset
        return offset

    def _batch_epoch_at(self, offset: int) -> int:
        return self.log.epoch_before(offset + 1)

    def _reply_append_entries(self, leader_id: int, *, error: ErrorCode = ErrorCode.NONE) -> None:
        self._answers.append(Send(to_broker=leader_id, message=AppendEntriesReply(
            replica_id=self.replica_id, leader_epoch=self.leader_epoch, error=error,
            log_end_offset=self.log_end_offset, flushed_offset=self.flushed_offset,
            match_offset=min(self._push_match, self.log_end_offset), last_epoch=self.last_epoch,
            partition=self.partition)))
