"""What goes into `Replica.step`: requests and responses from peers, local I/O completions, time.

Offsets are exclusive ends ("every offset below") unless the name says
`last_offset`. Epoch -1 means "none known". Messages between replicas
(FetchRequest, FetchResponse, AppendEntries, AppendEntriesReply) are events
on the receiving side and the payload of a `Send` action on the sending side.
"""
from __future__ import annotations

import dataclasses
from typing import TypeVar, dataclass_transform

from common.batch import Buffer
from common.errors import ErrorCode
from dataplane.replica.state import PartitionState, ReplicationConfig

CONSUMER_REPLICA_ID = -1
NO_EPOCH = -1
NO_OFFSET = -1


_T = TypeVar("_T")


@dataclass_transform(frozen_default=True, kw_only_default=True)
def _frozen(cls: type[_T]) -> type[_T]:
    """A frozen, keyword-only, slotted dataclass (declared so type checkers see its fields)."""
    return dataclasses.dataclass(frozen=True, kw_only=True, slots=True)(cls)


@_frozen
class ProduceRequest:
    """A client's batch(es) for this partition. `leader_epoch` None: the client did not say.
    Every check of it is the core's (admission.py); a driver only translates."""

    request_id: int
    records: Buffer  # patched in place by the log when writable (see dataplane/log/interface.py)
    acks: int
    timeout_ms: int
    leader_epoch: int | None = None
    # The topic's max_message_bytes as the driver's metadata says now: no batch may be
    # larger (MESSAGE_TOO_LARGE). None: no bound.
    batch_bytes_max: int | None = None


# (the follower's fetch session id there, that session's epoch, 0 for the session fetch of
# that epoch or 1 for an express fetch sent while it was out): the fetches of one session
# compare in the order the follower sent them. A broker's fetcher sends each partition's
# requests over two connections (dataplane/broker/fetcher.py), so the leader may step a
# newer one first.
FetchOrder = tuple[int, int, int]


@_frozen
class FetchRequest:
    """From a follower (replica_id >= 0) or a consumer (replica_id -1, reads only below HW)."""

    replica_id: int
    fetch_offset: int
    last_fetched_epoch: int = NO_EPOCH
    flushed_offset: int = 0
    current_leader_epoch: int = NO_EPOCH
    max_bytes: int | None = None
    partition: object = None
    # Where it stands among the fetches its follower sent this leader's broker (Replica._late_fetch).
    order: FetchOrder | None = None


@_frozen
class FetchResponse:
    """The leader's answer. `fetch_offset`/`last_fetched_epoch` echo the request so a
    follower applies data only to the log state it asked from (duplicates and
    reordered answers are dropped). On divergence, records are empty and
    (diverging_epoch, diverging_end_offset) say where the follower's last fetched
    epoch ends on the leader: the follower truncates there and nowhere else."""

    leader_id: int
    leader_epoch: int
    fetch_offset: int
    last_fetched_epoch: int
    error: ErrorCode = ErrorCode.NONE
    records: Buffer = b""  # as the leader's log read it (a view of the frame, on the wire path)
    high_watermark: int = 0
    log_end_offset: int = 0
    diverging_epoch: int = NO_EPOCH
    diverging_end_offset: int = NO_OFFSET
    flush_after_append: bool = False
    partition: object = None

    @property
    def diverging(self) -> bool:
        return self.diverging_end_offset >= 0


@_frozen
class FetchHeld:
    """The transport holds the follower's fetch made from this log state (`fetch_offset`,
    `last_fetched_epoch`) at leader `leader_id`, and will deliver its answer or its failure:
    a leader's fetch session keeps the partition and answers when something changes there,
    and a broken session resends it. The core then does not ask again on its own timer
    (`fetch_retry_ms`), which for thousands of quiet partitions was most of an idle
    broker's steps."""

    leader_id: int
    fetch_offset: int
    last_fetched_epoch: int


@_frozen
class BrokerBudget:
    """The broker-wide bound on produce bytes its leaders hold (`bytes_max`) and what the
    other leaders hold now (`others_bytes`): this leader takes produce requests only
    while the two and its own `held_bytes()` stay below the bound."""

    others_bytes: int
    bytes_max: int


@_frozen
class WriteDone:
    """The driver wrote the appended batches up to `last_offset` (inclusive) to the OS."""

    last_offset: int


@_frozen
class FlushDone:
    """A flush completed; `flushed_offset` is the log's flushed offset at that moment."""

    flushed_offset: int


@_frozen
class StillFetching:
    """A pull follower's fetch session holds this partition at `fetch_offset`, and the follower
    was last seen fetching in that session at `seen_ms` (the core's clock): a session fetch that
    omits a partition fetches it again at its kept position, as in Kafka's KIP-227."""

    replica_id: int
    fetch_offset: int
    seen_ms: int


@_frozen
class Tick:
    """`now_ms` times every wait of the core and never goes back (a driver reads a monotonic
    clock); `wall_ms` is the wall clock, for what is compared with record timestamps (the
    epoch-start batch's stamp, producer expiry). None: it moves as far as now_ms did.

    `fetching`: what the driver's fetch sessions know of followers a leader has not stepped a
    fetch from lately (Replica.caught_up_due): a quiet partition's follower stays caught up on
    that evidence, with no fetch stepped through the core every few seconds to say so."""

    now_ms: int
    wall_ms: int | None = None
    fetching: tuple[StillFetching, ...] = ()


@_frozen
class NewMetadata:
    """`fenced_replicas`: brokers the metadata image shows fenced, when the driver knows;
    the leader never proposes one of them into the ISR (the controller would refuse)."""

    partition: PartitionState
    config: ReplicationConfig
    fenced_replicas: frozenset[int] = frozenset()


@_frozen
class IsrChangeAccepted:
    """The controller wrote this leader's ISR proposal and answered with the partition as it now
    is. The leader counts its HW over the new ISR at once, rather than once its metadata brings
    the change (a long-poll that may be stuck on a controller cut off or stopped); Kafka's
    leader takes AlterPartition's answer the same way. Applied only when `partition` is the
    state held with the proposed ISR at the next partition epoch (nothing else changed);
    anything else waits for the metadata."""

    partition: PartitionState


@_frozen
class IsrChangeRefused:
    """The controller answered this leader's ISR proposal with `error` instead of accepting it.

    Only a refusal the controller judged at the proposal's own epochs (INELIGIBLE_REPLICA
    for a fenced broker, INVALID_REQUEST, UNKNOWN_TOPIC_OR_PARTITION) clears the matching
    pending proposal, so the HW is counted over the real ISR again. Any other error is
    ignored: a stale-epoch refusal may follow an earlier copy that was accepted, and an
    unknown outcome (REQUEST_TIMED_OUT from a controller that lost its leadership, NOT_CONTROLLER,
    UNKNOWN) may still commit; only new metadata can settle those."""

    leader_epoch: int
    partition_epoch: int
    new_isr: tuple[int, ...]
    error: ErrorCode
    reason: str = ""


@_frozen
class AppendEntries:
    """Push mode: the leader sends batches after (prev_offset, prev_epoch) — the epoch of the
    batch ending at prev_offset (-1 at the log start). Empty records: a heartbeat (HW)."""

    leader_id: int
    leader_epoch: int
    prev_offset: int
    prev_epoch: int
    records: Buffer  # as the leader's log read it (a view of the frame, on the wire path)
    high_watermark: int
    log_end_offset: int = 0
    flush_after_append: bool = False
    # Set (records empty) when the follower's last epoch diverges from the leader's log:
    # truncate there by the same rule as a diverging fetch answer.
    diverging_epoch: int = NO_EPOCH
    diverging_end_offset: int = NO_OFFSET
    partition: object = None


@_frozen
class AppendEntriesReply:
    """Push mode: the follower's written and flushed offsets and how far it matches the leader.
    error OFFSET_OUT_OF_RANGE: (prev_offset, prev_epoch) is not in its log (a gap or another
    epoch); log_end_offset and last_epoch then say where it stands, like a fetch.

    Feeds the same per-follower progress as a fetch: match_offset plays the
    role of a verified fetch_offset."""

    replica_id: int
    leader_epoch: int
    error: ErrorCode = ErrorCode.NONE
    log_end_offset: int = 0
    flushed_offset: int = 0
    match_offset: int = 0
    last_epoch: int = NO_EPOCH
    partition: object = None


Event = (ProduceRequest | BrokerBudget | FetchRequest | FetchResponse | FetchHeld | WriteDone | FlushDone | Tick
         | NewMetadata | AppendEntries | AppendEntriesReply | IsrChangeRefused)
