"""Every translation between the replica core's events and wire messages, in one place.

The core speaks `dataplane/replica/events.py`; brokers speak `common/wire/messages.py`.
Each idea keeps the core's name from here inward; where the wire's name differs,
the function below is the one place that says so:

| core (events.py)                        | wire (messages.py)                         |
|-----------------------------------------|--------------------------------------------|
| FetchRequest.max_bytes                  | FetchPartition.partition_max_bytes         |
| FetchResponse.diverging_epoch/_end_offset | FetchPartitionResponse.diverging_epoch (EpochEndOffset) |
| FetchResponse.leader_id/leader_epoch    | FetchPartitionResponse.current_leader      |
| AppendEntries.prev_offset/prev_epoch    | AppendEntriesRequest.prev_log_offset/prev_log_epoch |
| AppendEntries.diverging_epoch/_end_offset | AppendEntriesRequest.truncate_epoch/truncate_end_offset |
| AppendEntriesReply.replica_id           | AppendEntriesResponse.follower_id          |

A wire fetch answer does not repeat the position it answers: the follower's side
echoes it from the request it sent (`fetch_answer_from_wire`), so the core can
drop answers to another state of its log. Used by the fetcher and pusher (sending
side), the request handler (answering side) and the simulation (tests/sim), which
carries these wire messages on its simulated network.
"""
from __future__ import annotations

from common.errors import ErrorCode
from common.topic_partition import TopicPartition
from common.wire import messages as wire
from dataplane.replica.events import AppendEntries, AppendEntriesReply, FetchOrder, FetchRequest, FetchResponse


# What a fetch asks per partition when the core names no bound (a consumer's request).
PARTITION_MAX_BYTES_DEFAULT = 1024 * 1024


# ------------------------------------------------------------------ pull: FETCH


def fetch_to_wire(partition: int, request: FetchRequest) -> wire.FetchPartition:
    """A follower core's FetchRequest as one partition of a wire FETCH."""
    return wire.FetchPartition(
        partition=partition, current_leader_epoch=request.current_leader_epoch, fetch_offset=request.fetch_offset,
        last_fetched_epoch=request.last_fetched_epoch,
        partition_max_bytes=request.max_bytes or PARTITION_MAX_BYTES_DEFAULT, flushed_offset=request.flushed_offset)


def fetch_from_wire(replica_id: int, tp: TopicPartition, p: wire.FetchPartition, *,
                    max_bytes: int, order: FetchOrder | None = None) -> FetchRequest:
    """One partition of a wire FETCH as the leader core's FetchRequest. `max_bytes`: what
    is left of the request's byte budget for this partition (the handler's share);
    `order`: where a follower's fetch stands among those it sent (FetchRequest.order)."""
    return FetchRequest(
        replica_id=replica_id, fetch_offset=p.fetch_offset, last_fetched_epoch=p.last_fetched_epoch,
        flushed_offset=max(p.flushed_offset, 0), current_leader_epoch=p.current_leader_epoch,
        max_bytes=max_bytes, partition=tp, order=order)


def fetch_answer_to_wire(partition: int, answer: FetchResponse, *, log_start_offset: int,
                         leader_if_error: wire.LeaderIdAndEpoch) -> wire.FetchPartitionResponse:
    """The leader core's answer as one partition of a wire FETCH response. On an error the
    answer names the leader as the answering broker's metadata knows it (`leader_if_error`)."""
    return wire.FetchPartitionResponse(
        partition=partition, error_code=answer.error, high_watermark=answer.high_watermark,
        last_stable_offset=answer.high_watermark, log_start_offset=log_start_offset,
        diverging_epoch=wire.EpochEndOffset(epoch=answer.diverging_epoch, end_offset=answer.diverging_end_offset),
        current_leader=(wire.LeaderIdAndEpoch(leader_id=answer.leader_id, leader_epoch=answer.leader_epoch)
                        if answer.error is ErrorCode.NONE else leader_if_error),
        log_end_offset=answer.log_end_offset, flush_after_append=answer.flush_after_append,
        records=answer.records)


def fetch_refusal(partition: int, error: ErrorCode, leader: wire.LeaderIdAndEpoch) -> wire.FetchPartitionResponse:
    """A partition the handler answers without its core (unknown, not here, offline)."""
    return wire.FetchPartitionResponse(partition=partition, error_code=error, current_leader=leader)


def fetch_answer_from_wire(leader_id: int, request: FetchRequest, p: wire.FetchPartitionResponse,
                           tp: TopicPartition) -> FetchResponse:
    """A wire answer as the follower core's FetchResponse, echoing the position of the
    `request` it answers. An answer naming no leader epoch carries the request's."""
    epoch = p.current_leader.leader_epoch
    if epoch < 0:
        epoch = request.current_leader_epoch
    return FetchResponse(
        leader_id=leader_id, leader_epoch=epoch, fetch_offset=request.fetch_offset,
        last_fetched_epoch=request.last_fetched_epoch, error=p.error_code,
        records=p.records if p.records is not None else b"",
        high_watermark=max(p.high_watermark, 0), log_end_offset=max(p.log_end_offset, 0),
        diverging_epoch=p.diverging_epoch.epoch, diverging_end_offset=p.diverging_epoch.end_offset,
        flush_after_append=p.flush_after_append, partition=tp)


def fetch_failed(leader_id: int, request: FetchRequest, error: ErrorCode, tp: TopicPartition) -> FetchResponse:
    """The follower core's answer to a fetch the transport lost (no wire answer came)."""
    return FetchResponse(leader_id=leader_id, leader_epoch=request.current_leader_epoch,
                         fetch_offset=request.fetch_offset, last_fetched_epoch=request.last_fetched_epoch,
                         error=error, partition=tp)


# ------------------------------------------------------------------ push: APPEND_ENTRIES


def append_entries_to_wire(tp: TopicPartition, follower_id: int, ev: AppendEntries) -> wire.AppendEntriesRequest:
    return wire.AppendEntriesRequest(
        leader_id=ev.leader_id, follower_id=follower_id, leader_epoch=ev.leader_epoch, topic=tp[0],
        partition=tp[1], prev_log_offset=ev.prev_offset, prev_log_epoch=ev.prev_epoch,
        high_watermark=ev.high_watermark, flush_after_append=ev.flush_after_append, records=ev.records,
        log_end_offset=ev.log_end_offset, truncate_epoch=ev.diverging_epoch,
        truncate_end_offset=ev.diverging_end_offset)


def append_entries_from_wire(req: wire.AppendEntriesRequest) -> AppendEntries:
    return AppendEntries(leader_id=req.leader_id, leader_epoch=req.leader_epoch, prev_offset=req.prev_log_offset,
                         prev_epoch=req.prev_log_epoch,
                         records=memoryview(req.records).toreadonly() if req.records else b"",
                         high_watermark=req.high_watermark, log_end_offset=req.log_end_offset,
                         flush_after_append=req.flush_after_append, diverging_epoch=req.truncate_epoch,
                         diverging_end_offset=req.truncate_end_offset, partition=(req.topic, req.partition))


def append_reply_to_wire(tp: TopicPartition, reply: AppendEntriesReply) -> wire.AppendEntriesResponse:
    return wire.AppendEntriesResponse(
        follower_id=reply.replica_id, leader_epoch=reply.leader_epoch, topic=tp[0], partition=tp[1],
        error_code=reply.error, log_end_offset=reply.log_end_offset, flushed_offset=reply.flushed_offset,
        last_epoch=reply.last_epoch, match_offset=reply.match_offset)


def append_reply_from_wire(resp: wire.AppendEntriesResponse) -> AppendEntriesReply:
    return AppendEntriesReply(replica_id=resp.follower_id, leader_epoch=resp.leader_epoch, error=resp.error_code,
                              log_end_offset=resp.log_end_offset, flushed_offset=resp.flushed_offset,
                              match_offset=max(resp.match_offset, 0), last_epoch=resp.last_epoch,
                              partition=(resp.topic, resp.partition))


def append_refusal(req: wire.AppendEntriesRequest, error: ErrorCode, *, replica_id: int,
                   leader_epoch: int) -> wire.AppendEntriesResponse:
    """An append-entries answered without a reply of its core (not here, offline, ignored)."""
    return wire.AppendEntriesResponse(follower_id=replica_id, leader_epoch=leader_epoch, topic=req.topic,
                                      partition=req.partition, error_code=error)
