"""Invariant checkers, kept apart from the fault injector: they only read the cluster.

Checked after EVERY simulation step (docs/design.md#testing):

1. hw_monotonic — a leader's HW never moves back within its term
   (one term = one (replica, incarnation, leader epoch)).
2. commit_agreement — every batch any leader ever counted below its HW (the
   "committed" map, offset -> batch) is the same batch: no two leaders commit
   different batches at one offset.
3. no_old_epoch_commit — once a leader of epoch e' committed a batch of its own
   epoch, no leader of an older epoch moves its HW past the start of epoch e'.
4. agree_below_hw — every live replica's log below its own HW equals the
   committed map, so any two replicas agree below the lower of their HWs.
5. commit_backed — when a leader's HW passes a batch, that batch really is
   stored (flushed under fsync, written under write: ground truth from the
   logs, not from what followers reported) on the required set: for `isr` the
   controller's ISR (while at the leader's epoch, else the leader's ISR ∪ its
   proposal), at least q replicas for `quorum`. Under
   durability=write a replica that crashed and has not caught up is excused
   (it may have lost written data; faults.py allows one such replica).
6. consumer_reads_committed — every batch a leader returns to a consumer
   (replica id -1) is a committed batch: consumers never read past the HW.
8. idempotent_once_in_order — a batch of an idempotent producer (the SDK's producer
   core: retried after errors, lost answers and client timeouts, under new epochs
   after gaps) is committed at most once, and each producer's committed batches are
   in the order it made them.
9. no_record_twice — no replica's log ever holds a batch of an idempotent producer
   twice (committed or not; a batch is known by its record bytes, which stay the same
   under any producer id, epoch and sequence it is sent with).
10. acked_at_offset — a batch the producer core acknowledged at offset o (first
   answer or a duplicate's original offset) is the committed batch at o.
7. acked_not_lost — every acks=all record released with success by a leader of
   epoch e is, at its offset, in the log of every replica acting as leader in an
   epoch >= e (leader completeness; within the faults faults.py tolerates).
"""
from __future__ import annotations

import bisect

from dataplane.replica.core import Role


class InvariantViolation(AssertionError):
    pass


class Checker:
    def __init__(self, *, policy: str, durability: str, quorum_required_acks: int) -> None:
        self.policy, self.durability, self.q = policy, durability, quorum_required_acks
        self.committed: dict[int, tuple[int, bytes]] = {}   # base offset -> (next offset, ident)
        self.epoch_commit_start: dict[int, int] = {}        # epoch -> its start offset, once it committed
        self.hw_by_term: dict[tuple, int] = {}
        self.acked: list[tuple[int, int, bytes, int]] = []  # (base offset, next offset, ident, epoch)
        self.acked_checked: dict[tuple, int] = {}           # leader term -> index in acked checked
        self.verified: dict[tuple, int] = {}                # (node, incarnation) -> shadow entries verified
        self.checks = 0
        self.idem_seq: dict[bytes, tuple[str, int]] = {}   # idempotent batch ident -> (producer, send order)
        self.idem_bases: dict[str, list[int]] = {}          # per producer: committed batches, by offset
        self.idem_seq_at: dict[int, int] = {}               # their base offset -> send order
        self.idem_base_of: dict[bytes, int] = {}
        self.producer_acks: list[tuple[str, int, int, int, bytes]] = []  # (producer, index, base, next, ident)
        self.producer_acks_checked = 0

    def fail(self, what: str) -> None:
        raise InvariantViolation(what)

    # Called by the simulation when a leader releases an acks=all produce with success.
    def record_ack(self, *, base_offset: int, next_offset: int, ident: bytes, epoch: int) -> None:
        self.acked.append((base_offset, next_offset, ident, epoch))

    # Called by the simulation when a producer core acknowledges a batch at base_offset.
    def record_producer_ack(self, *, producer: str, index: int, base_offset: int, next_offset: int,
                            ident: bytes) -> None:
        self.producer_acks.append((producer, index, base_offset, next_offset, ident))

    def _check_idempotent(self, base: int, ident: bytes) -> None:
        producer, seq = self.idem_seq[ident]
        other = self.idem_base_of.get(ident)
        if other is not None and other != base:
            self.fail(f"idempotent_once_in_order: producer {producer} batch {seq} committed twice, "
                      f"at {other} and {base}")
        self.idem_base_of[ident] = base
        bases = self.idem_bases.setdefault(producer, [])
        i = bisect.bisect_left(bases, base)
        if i > 0 and self.idem_seq_at[bases[i - 1]] >= seq:
            self.fail(f"idempotent_once_in_order: producer {producer} batch {seq} at {base} after its batch "
                      f"{self.idem_seq_at[bases[i - 1]]} at {bases[i - 1]}")
        if i < len(bases) and self.idem_seq_at[bases[i]] <= seq:
            self.fail(f"idempotent_once_in_order: producer {producer} batch {seq} at {base} before its batch "
                      f"{self.idem_seq_at[bases[i]]} at {bases[i]}")
        bases.insert(i, base)
        self.idem_seq_at[base] = seq

    def _check_producer_acks(self) -> None:
        for producer, index, base, nxt, ident in self.producer_acks[self.producer_acks_checked:]:
            if self.committed.get(base) != (nxt, ident):
                self.fail(f"acked_at_offset: producer {producer} batch {index} was acknowledged at offset {base}, "
                          f"where the committed batch is another one (or none)")
        self.producer_acks_checked = len(self.producer_acks)

    def _check_no_record_twice(self, node) -> None:
        doubled = [ident for ident in node.doubled if ident in self.idem_seq]
        if doubled:
            producer, index = self.idem_seq[doubled[0]]
            self.fail(f"no_record_twice: replica {node.node_id} holds producer {producer} batch {index} twice")

    def committed_end(self) -> int:
        return max((nxt for nxt, _ in self.committed.values()), default=0)

    def check_consumed(self, leader_id: int, batches) -> None:
        for base, nxt, ident in batches:
            if self.committed.get(base) != (nxt, ident):
                self.fail(f"consumer_reads_committed: leader {leader_id} returned to a consumer the batch at "
                          f"offset {base}, which is not committed")

    def on_truncate(self, node) -> None:
        key = (node.node_id, node.incarnation)
        self.verified[key] = min(self.verified.get(key, 0), len(node.shadow))

    def check(self, nodes, controller_state) -> None:
        self.checks += 1
        self.nodes = nodes
        self.controller_state = controller_state
        for node in nodes:
            if node.replica is None:
                continue
            r = node.replica
            if r.role is Role.LEADER:
                self._check_leader(node)
            self._check_below_hw(node)
        for node in nodes:   # crashed replicas' logs count too
            self._check_no_record_twice(node)
        self._check_producer_acks()

    def _check_leader(self, node) -> None:
        r = node.replica
        term = (node.node_id, node.incarnation, r.leader_epoch)
        old = self.hw_by_term.get(term)
        hw = r.high_watermark
        if old is not None and hw < old:
            self.fail(f"hw_monotonic: leader {node.node_id} epoch {r.leader_epoch} HW {old} -> {hw}")
        if old is None or hw > old:
            self.hw_by_term[term] = hw
            start = r.epoch_start_offset
            if hw > start and r.leader_epoch not in self.epoch_commit_start:
                self.epoch_commit_start[r.leader_epoch] = start
            for epoch, newer_start in self.epoch_commit_start.items():
                if epoch > r.leader_epoch and hw > newer_start:
                    self.fail(f"no_old_epoch_commit: leader {node.node_id} epoch {r.leader_epoch} HW {hw} "
                              f"passes start {newer_start} of epoch {epoch}, which has committed")
            lo = 0 if old is None else old
            for base, nxt, _epoch, ident in node.shadow_range(lo, hw):
                if old is not None:
                    self._check_backed(node, base, nxt, ident)
                seen = self.committed.get(base)
                if seen is None:
                    self.committed[base] = (nxt, ident)
                    if ident in self.idem_seq:
                        self._check_idempotent(base, ident)
                elif seen != (nxt, ident):
                    self.fail(f"commit_agreement: offset {base} committed as two different batches "
                              f"(leader {node.node_id} epoch {r.leader_epoch})")
        done = self.acked_checked.get(term, 0)
        for base, nxt, ident, epoch in self.acked[done:]:
            if epoch > r.leader_epoch:
                continue
            have = node.by_base.get(base)
            if have is None or have[1] != ident or have[0] != nxt:
                self.fail(f"acked_not_lost: record at offset {base} acknowledged in epoch {epoch} is "
                          f"missing from leader {node.node_id} of epoch {r.leader_epoch}")
        self.acked_checked[term] = len(self.acked)

    def _check_backed(self, leader, base: int, nxt: int, ident: bytes) -> None:
        holders, excused = set(), set()
        for node in self.nodes:
            if node.by_base.get(base) == (nxt, ident) and (self.durability == "write"
                                                            or nxt <= node.log.flushed_offset):
                holders.add(node.node_id)
            elif self.durability == "write" and (node.replica is None or node.replica.unclean_start):
                excused.add(node.node_id)
        r = leader.replica
        if self.policy == "isr":
            # Judged independently of the leader's own bookkeeping: the controller's ISR
            # while it is at this leader's epoch, else the leader's ISR ∪ its proposal.
            st = self.controller_state
            if st.leader_epoch == r.leader_epoch:
                required = set(st.isr)
            else:
                required = set(r.state.isr) | set(r.pending_isr or ())
            missing = (required | {leader.node_id}) - holders - excused
            if missing:
                self.fail(f"commit_backed: leader {leader.node_id} epoch {r.leader_epoch} committed offset {base} "
                          f"but required replicas {sorted(missing)} do not store it")
        elif len(holders) + len(excused) < self.q or (leader.node_id not in holders
                                                       and leader.node_id not in excused):
            self.fail(f"commit_backed: leader {leader.node_id} epoch {r.leader_epoch} committed offset {base} "
                      f"stored on {sorted(holders)} only (q={self.q})")

    def _check_below_hw(self, node) -> None:
        key = (node.node_id, node.incarnation)
        i = self.verified.get(key, 0)
        hw = node.replica.high_watermark
        shadow = node.shadow
        while i < len(shadow) and shadow[i][1] <= hw:
            base, nxt, _epoch, ident = shadow[i]
            if self.committed.get(base) != (nxt, ident):
                self.fail(f"agree_below_hw: replica {node.node_id} holds at offset {base} (below its HW {hw}) "
                          f"a batch that is not the committed one")
            i += 1
        self.verified[key] = i
