"""ISR changes requested by a partition leader.

Checked in this order, stale before anything else: the partition exists; the
leader epoch is current (older: FENCED_LEADER_EPOCH, newer: UNKNOWN_LEADER_EPOCH);
the requester is the leader; the partition epoch is current
(INVALID_UPDATE_VERSION); then the new ISR itself. Quorum topics take ISR
changes too: there the ISR is for monitoring (and names the reporters' peers).
"""
from __future__ import annotations

from common.epochs import EpochCheck, check_epoch, leader_epoch_error
from common.errors import (
    ErrorCode,
    IneligibleReplicaError,
    InvalidFieldError,
    NotLeaderError,
    StaleEpochError,
)
from common.metadata.image import MetadataImage
from common.metadata.records import Record
from common.requests import AlterIsrRequest
from controller.decisions.plan import change


def alter_isr(image: MetadataImage, request: AlterIsrRequest) -> list[Record]:
    """The record for an accepted ISR change ([] if the ISR is already that); raises otherwise."""
    p = image.partition(request.topic, request.partition)
    what = f"ISR change for {p.topic}-{p.partition}"
    check = check_epoch(theirs=request.leader_epoch, ours=p.leader_epoch)
    if check is not EpochCheck.CURRENT:
        raise StaleEpochError(field="leader_epoch", expected=p.leader_epoch,
                              actual=request.leader_epoch, what=what, code=leader_epoch_error(check))
    if p.leader != request.broker_id:
        raise NotLeaderError(what=what, expected=p.leader, actual=request.broker_id)
    if check_epoch(theirs=request.partition_epoch, ours=p.partition_epoch) is not EpochCheck.CURRENT:
        raise StaleEpochError(field="partition_epoch", expected=p.partition_epoch,
                              actual=request.partition_epoch, what=what,
                              code=ErrorCode.INVALID_UPDATE_VERSION)
    new_isr = tuple(request.new_isr)
    outside = [b for b in new_isr if b not in p.replicas]
    if outside:
        raise InvalidFieldError(f"{what}: new_isr {list(new_isr)} names {outside}, not "
                                f"replicas {list(p.replicas)}", field="new_isr", value=new_isr)
    if p.leader not in new_isr:
        raise InvalidFieldError(f"{what}: new_isr {list(new_isr)} must contain the leader "
                                f"{p.leader}", field="new_isr", value=new_isr)
    for b in new_isr:
        if b not in p.isr and not image.is_unfenced(b):
            raise IneligibleReplicaError(f"{what}: broker {b} is fenced and cannot join "
                                         f"the ISR", broker_id=b)
    if set(new_isr) == set(p.isr):
        return []
    # Keep replica order, so equal sets compare equal and output is canonical.
    ordered = tuple(b for b in p.replicas if b in new_isr)
    return [change(p, isr=ordered, reason=f"requested by leader {request.broker_id}")]
