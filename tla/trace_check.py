"""Replay a data-plane simulation trace against DataPlane.tla's actions and invariants.

    .venv/bin/python tla/trace_check.py trace.jsonl     (scripts/sim_sweep.py --trace-out)

The abstract state is the spec's: per replica a log of epochs (one entry per
record offset), its flushed offset, epoch, role and HW; the controller's
epoch, leader and ISR; election reports; the acknowledged records. Each trace
entry is mapped to one spec action (tla/README.md, "Implementation against
spec"), whose enabling condition is checked before its effect is applied, and
the spec's invariants are checked after every entry. The first failure raises
TraceViolation naming the entry's index and the rule.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field


class TraceViolation(Exception):
    def __init__(self, index: int, rule: str, detail: str, entry: dict) -> None:
        super().__init__(f"trace entry {index} ({entry.get('action')}): {rule}: {detail}")
        self.index, self.rule, self.detail, self.entry = index, rule, detail, entry


@dataclass
class Replica:
    log: list = field(default_factory=list)   # epoch of each record offset
    flushed: int = 0
    epoch: int = 0
    role: str = "unattached"
    hw: int = 0
    down: bool = False
    incarnation: int = 0
    crash_flushed: int = 0


def _last_epoch(log: list, end: int) -> int:
    return log[end - 1] if end > 0 else -1


def _common_prefix(a: list, b: list, limit: int) -> int:
    n = 0
    for x, y in zip(a[:limit], b):
        if x != y:
            break
        n += 1
    return n


def _beats(a: tuple, b: tuple) -> bool:
    """Report order: (last epoch, end offset) as a pair (Beats in DataPlane.tla)."""
    return a >= b


class TraceChecker:
    def __init__(self) -> None:
        self.replicas: dict[int, Replica] = {}
        self.policy = "quorum"
        self.durability = "fsync"
        self.q = 0
        self.cepoch = 0
        self.pepoch = 0
        self.cleader = None
        self.cisr: set[int] = set()
        self.fenced = False
        self.reports: dict[int, dict[int, tuple]] = {}   # fenced epoch -> replica -> (le, off)
        self.leader_of: dict[int, int] = {}              # epoch -> its one leader
        self.led_in: dict[tuple, int] = {}               # (replica, epoch) -> incarnation that led it
        self.support: dict[tuple, dict[int, int]] = {}   # (leader, epoch) -> replica -> stored match
        self.leader_hw: dict[tuple, int] = {}            # (leader, epoch) -> highest HW
        self.committed: list = []                        # longest prefix any leader's HW passed
        self.acked: dict[int, tuple] = {}                # offset -> (entry epoch, acking leader epoch)
        self.index = 0
        self.entry: dict = {}
        self.sim_step = None
        self.deferred: list[tuple[int, dict]] = []

    # ------------------------------------------------------------ helpers

    def fail(self, rule: str, detail: str) -> None:
        raise TraceViolation(self.index, rule, detail, self.entry)

    def stored(self, r: Replica) -> int:
        """What counts as stored toward the HW: flushed (fsync), written (durability=write)."""
        if self.durability == "fsync" or r.down:
            return r.flushed
        return len(r.log)

    def refresh_support(self) -> None:
        # Abstraction of pstored[l][f]: the leader only learns a follower's position from a
        # consistent report, i.e. from a stored prefix that matched its log then. The most it can
        # know is the longest stored prefix matching its log seen so far in its epoch (its log only
        # grows while it leads, so a match stays a match).
        for (l, e), sup in self.support.items():
            lead = self.replicas[l]
            if lead.down or lead.role != "leader" or lead.epoch != e:
                continue
            for rid, r in self.replicas.items():
                m = _common_prefix(r.log, lead.log, self.stored(r))
                if m > sup.get(rid, 0):
                    sup[rid] = m

    def take_vars(self, r: Replica, e: dict) -> None:
        r.role, r.epoch, r.flushed, r.hw = e["role"], e["leader_epoch"], e["flushed_offset"], e["high_watermark"]
        # The core's log end is not compared here: within one step it already counts the
        # appends and truncations its Ready asks for, which the trace lists after this entry.
        if r.role == "leader":
            # Learn: a replica that crashed while leading an epoch never leads it again. The core
            # may, when nothing of that epoch survived anywhere (its epoch start was never flushed,
            # and it serves nothing before): the two incarnations are then indistinguishable
            # from one. Otherwise the second writes other entries under the same (offset, epoch).
            led = self.led_in.setdefault((e["replica"], r.epoch), r.incarnation)
            if led != r.incarnation:
                holders = sorted(rid for rid, x in self.replicas.items() if r.epoch in x.log)
                if holders:
                    self.fail("Learn", f"replica {e['replica']} leads epoch {r.epoch} again after a crash "
                                       f"while leading it, and replicas {holders} hold entries of its "
                                       f"first term")
                self.led_in[(e["replica"], r.epoch)] = r.incarnation
            first = self.leader_of.setdefault(r.epoch, e["replica"])
            if first != e["replica"]:
                self.fail("OneLeaderPerEpoch", f"replicas {first} and {e['replica']} both lead epoch {r.epoch}")
            self.support.setdefault((e["replica"], r.epoch), {})

    # ------------------------------------------------------------ actions

    def on_Config(self, e: dict) -> None:
        self.replicas = {i: Replica() for i in e["replicas"]}
        self.policy, self.durability = e["policy"], e["durability"]
        self.q = e["quorum_required_acks"] or 0
        self.cisr = set(e["replicas"])

    def on_Metadata(self, e: dict) -> None:
        # EpochsGrow
        if e["leader_epoch"] < self.cepoch or e["partition_epoch"] < self.pepoch:
            self.fail("EpochsGrow", f"epochs went from (leader {self.cepoch}, partition {self.pepoch}) "
                                    f"to ({e['leader_epoch']}, {e['partition_epoch']})")
        new_leader = e["leader"] is not None and (e["leader"], e["leader_epoch"]) != (self.cleader, self.cepoch)
        if new_leader and self.policy == "quorum" and self.fenced:
            # the fence record is at e+1; the election record names the leader at e+2
            self.check_elect_quorum(e["leader"], self.cepoch)
        if new_leader and self.policy == "isr" and e["leader_epoch"] > self.cepoch and e["leader"] not in self.cisr:
            self.fail("ElectIsr", f"replica {e['leader']} elected at epoch {e['leader_epoch']} "
                                  f"is not in the ISR {sorted(self.cisr)}")
        self.cepoch, self.pepoch, self.cleader = e["leader_epoch"], e["partition_epoch"], e["leader"]
        self.cisr, self.fenced = set(e["isr"]), e["fenced_for_election"]

    def check_elect_quorum(self, leader: int, epoch: int) -> None:
        """ElectQuorum: n - q + 1 reports for the fence at `epoch`, the winner greatest among them."""
        reports = self.reports.get(epoch, {})
        need = len(self.replicas) - self.q + 1
        if leader not in reports:
            self.fail("ElectQuorum", f"replica {leader} elected after the fence at epoch {epoch} without a report for that fence")
        mine = reports[leader]
        beaten = sum(1 for other in reports.values() if _beats(mine, other))
        if beaten < need:
            self.fail("ElectQuorum", f"replica {leader} elected after the fence at epoch {epoch} with report {mine} beats only "
                                     f"{beaten} of the reports {reports}; the controller needs {need}")

    def on_ReportElection(self, e: dict) -> None:
        r = self.replicas[e["replica"]]
        # Report(r): the replica reports its flushed log (and has learned the fence).
        end = e["end_offset"]
        if end > e["flushed_offset"]:
            self.fail("Report", f"replica {e['replica']} reports end offset {end} beyond its flushed "
                                f"offset {e['flushed_offset']}")
        if end > len(r.log) or e["last_epoch"] != _last_epoch(r.log, end):
            self.fail("Report", f"replica {e['replica']} reports (last epoch {e['last_epoch']}, end {end}) "
                                f"but its log's epoch there is {_last_epoch(r.log, min(end, len(r.log)))}")
        self.reports.setdefault(e["fenced_epoch"], {})[e["replica"]] = (e["last_epoch"], end)
        self.take_vars(r, e)

    def on_Append(self, e: dict) -> None:
        rid, r = e["replica"], self.replicas[e["replica"]]
        self.take_vars(r, e)   # before the entries land: Learn judges the log as it was
        if e["base_offset"] != len(r.log):
            self.fail("Append", f"replica {rid} appends at {e['base_offset']} but its log ends at {len(r.log)}")
        for base, nxt, epoch in e["batches"]:
            if e["as_leader"]:
                # ClientWrite / Learn's epoch-start entry: a leader writes in its own epoch only.
                if e["role"] != "leader" or epoch != e["leader_epoch"]:
                    self.fail("ClientWrite", f"replica {rid} (role {e['role']}, epoch {e['leader_epoch']}) "
                                             f"appends as leader in epoch {epoch}")
            elif epoch > e["leader_epoch"]:
                self.fail("ReceiveData", f"follower {rid} at epoch {e['leader_epoch']} accepts a batch "
                                         f"of epoch {epoch}")
            if r.log and epoch < r.log[-1]:
                self.fail("Append", f"replica {rid} appends epoch {epoch} after epoch {r.log[-1]}")
            r.log.extend([epoch] * (nxt - base))

    def on_Truncate(self, e: dict) -> None:
        rid, r = e["replica"], self.replicas[e["replica"]]
        # ReceiveDiv: only a follower truncates, and never below what its leader committed.
        if e["role"] == "leader":
            self.fail("ReceiveDiv", f"leader {rid} truncates its log to {e['offset']}")
        committed = _common_prefix(r.log, self.committed, len(self.committed))
        if e["offset"] < committed:
            self.fail("TruncateBelowHW", f"replica {rid} truncates to {e['offset']} below the committed "
                                         f"prefix it holds (up to {committed})")
        del r.log[e["offset"]:]
        self.take_vars(r, e)

    def on_Crash(self, e: dict) -> None:
        r = self.replicas[e["replica"]]
        self.take_vars(r, e)
        r.down, r.crash_flushed, r.role, r.hw = True, r.flushed, "stopped", 0
        r.incarnation += 1

    def on_Restart(self, e: dict) -> None:
        rid, r = e["replica"], self.replicas[e["replica"]]
        # Crash(r): only a prefix at least as long as the flushed one survives.
        end = e["log_end_offset"]
        if not r.crash_flushed <= end <= len(r.log):
            self.fail("Crash", f"replica {rid} restarts with log end {end}; it had flushed {r.crash_flushed} "
                               f"of {len(r.log)}")
        del r.log[end:]
        r.down = False
        self.take_vars(r, e)

    def on_Flush(self, e: dict) -> None:
        r = self.replicas[e["replica"]]
        if e["flushed_offset"] > max(len(r.log), e["log_end_offset"]):
            self.fail("Flush", f"replica {e['replica']} flushed {e['flushed_offset']} beyond its log end {len(r.log)}")
        self.take_vars(r, e)

    def on_AdvanceHighWatermark(self, e: dict) -> None:
        self.take_vars(self.replicas[e["replica"]], e)
        # The core moves its HW in the same step as the appends and truncations it asks for,
        # which the trace lists after this entry: the spec's step ends with the simulation step.
        self.deferred.append((self.index, e))

    def check_hw(self, e: dict) -> None:
        rid, r = e["replica"], self.replicas[e["replica"]]
        h = e["high_watermark"]
        if r.role != "leader":
            # A follower's HW is its leader's (not in the spec): it must be a committed prefix.
            if h > len(self.committed) or _common_prefix(r.log, self.committed, h) < min(h, len(r.log)):
                self.fail("LogMatching", f"follower {rid} moves its HW to {h}, beyond the committed prefix "
                                         f"its log holds")
            return
        key = (rid, r.epoch)
        if h < self.leader_hw.get(key, 0):
            self.fail("HWMonotonic", f"leader {rid} of epoch {r.epoch} moves its HW back from "
                                     f"{self.leader_hw[key]} to {h}")
        if h > e["previous"] and h > self.leader_hw.get(key, -1):
            self.check_commit(rid, r, h)
        self.leader_hw[key] = max(self.leader_hw.get(key, 0), h)

    def check_commit(self, rid: int, r: Replica, h: int) -> None:
        """CommitTo: the new HW ends in the leader's epoch and is stored on the required set."""
        if h > len(r.log):
            self.fail("HWBelowLogEnd", f"leader {rid} moves its HW to {h} beyond its log end {len(r.log)}")
        if r.log[h - 1] != r.epoch:
            self.fail("Committable", f"leader {rid} of epoch {r.epoch} commits to {h}, an entry of "
                                     f"older epoch {r.log[h - 1]}")
        self.refresh_support()
        sup = self.support[(rid, r.epoch)]
        sup[rid] = max(sup.get(rid, 0), min(self.stored(r), len(r.log)))
        holders = {f for f, m in sup.items() if m >= h}
        if self.policy == "quorum":
            if len(holders) < self.q:
                self.fail("Committable", f"leader {rid} of epoch {r.epoch} commits to {h} but only "
                                         f"{sorted(holders)} ever stored a matching prefix that long (q={self.q})")
        elif not self.cisr <= holders:
            self.fail("Committable", f"leader {rid} of epoch {r.epoch} commits to {h} but ISR members "
                                     f"{sorted(self.cisr - holders)} never stored a matching prefix that long")
        n = _common_prefix(r.log, self.committed, h)
        if n < min(h, len(self.committed)):
            self.fail("LogMatching", f"leader {rid} of epoch {r.epoch} commits to {h} a log that differs "
                                     f"from the committed one at offset {n}")
        if h > len(self.committed):
            self.committed = r.log[:h]

    def on_AckAll(self, e: dict) -> None:
        rid, r = e["replica"], self.replicas[e["replica"]]
        self.take_vars(r, e)
        o = e["base_offset"]
        if r.role != "leader" or o >= r.hw:
            self.fail("CommitTo", f"replica {rid} (role {r.role}, HW {r.hw}) acknowledges offset {o}")
        self.acked.setdefault(o, (r.log[o], r.epoch))

    def on_ProposeIsr(self, e: dict) -> None:
        self.take_vars(self.replicas[e["replica"]], e)

    # ------------------------------------------------------------ invariants

    def invariants(self) -> None:
        for o, (ee, ae) in self.acked.items():
            if not any(self.stored(r) > o and len(r.log) > o and r.log[o] == ee for r in self.replicas.values()):
                self.fail("NoAckedLoss", f"acknowledged offset {o} (epoch {ee}) is stored on no replica")
            for rid, r in self.replicas.items():
                if (not r.down and r.role == "leader" and r.epoch >= ae
                        and (len(r.log) <= o or r.log[o] != ee)):
                    self.fail("LeaderCompleteness", f"leader {rid} of epoch {r.epoch} lacks acknowledged "
                                                    f"offset {o} (epoch {ee}, acknowledged in epoch {ae})")
        for rid, r in self.replicas.items():
            if r.role == "leader" and not r.down and r.hw > len(r.log):
                self.fail("HWBelowLogEnd", f"leader {rid} has HW {r.hw} beyond its log end {len(r.log)}")

    def step(self, index: int, entry: dict) -> None:
        if entry.get("step") != self.sim_step:
            self.end_step()
            self.sim_step = entry.get("step")
        self.index, self.entry = index, entry
        handler = getattr(self, "on_" + entry["action"], None)
        if handler is not None:   # Partition, Heal, IsrRefused, LivenessPhase: no spec state
            handler(entry)

    def end_step(self) -> None:
        """One simulation step is one spec step: HW moves and invariants are judged after it."""
        last = (self.index, self.entry)
        self.refresh_support()
        for index, entry in self.deferred:
            self.index, self.entry = index, entry
            self.check_hw(entry)
        self.deferred.clear()
        self.index, self.entry = last
        self.invariants()


def check_trace(entries: list[dict]) -> int:
    """Raise TraceViolation at the first entry the spec does not allow; return the count checked."""
    checker = TraceChecker()
    if not entries or entries[0].get("action") != "Config":
        raise TraceViolation(0, "Config", "a trace starts with its Config entry", entries[0] if entries else {})
    for i, entry in enumerate(entries):
        checker.step(i, entry)
    checker.end_step()
    return len(entries)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: trace_check.py TRACE.jsonl", file=sys.stderr)
        return 2
    with open(argv[0], encoding="utf-8") as f:
        entries = [json.loads(line) for line in f if line.strip()]
    try:
        n = check_trace(entries)
    except TraceViolation as v:
        print(v)
        return 1
    print(f"{n} trace entries conform to DataPlane.tla")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
