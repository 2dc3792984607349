"""The history checker: history in, violations and figures out. Pure: no clock, no I/O.

Violations (each a list of small dicts, so a report can show examples):
  lost        an acknowledged record is not in the final read of its partition
  duplicated  a value this harness wrote is in a partition's final read more than once
  misplaced   an acknowledged record is in the final read, but never at its acknowledged offset
  reordered   per producer and partition, a record sits at a lower offset than one sent before it
  vanished    a record a consumer was handed is not at that offset in the final read
  diverged    two replicas hold different entries at an offset below the high watermark
Liveness failures, reported apart: partitions that could not be read back after the heal
(their acknowledged records are then looked for on the replicas' disks), and partitions
that never acknowledged again after the last heal.
Fences (when the history has them): every broker fenced for an expired session that no fault
explains (`unexplained_fences`: a liveness failure; see `fence_explained`).
Figures: acks and failures by error, faults by kind, the longest acks=all gap per partition
outside faults that remove a quorum by schedule, and outside any time a quorum was gone in fact
(`out_of_service_windows`: two of three brokers or controllers out at once, a restarted one out
until it is back in service), and the time to the first acknowledgement after the last
heal per partition. For gray faults (a broker cut from its peers, not from the controllers;
tests/chaos/schedule.py GRAY_WEIGHTS): per kind, the longest acks=all gap inside the fault of
the partitions the cut broker led as it began and of the others, by commit policy, against
their targets (`gray_targets`).
"""
from __future__ import annotations

import collections
import dataclasses
import re
from typing import Any

from tests.chaos.history import FaultRun, Fence, History, parse_value
from tests.chaos.schedule import GRAY_KINDS

SESSION_TIMEOUT_S = 1.5   # the controllers' default session_timeout_ms, as the harness runs them
# How long after a fault ends it can still explain a fence for an expired session: a controller
# leader elected after the heal (Raft's election timeout, at most 1.6 s), a heartbeat attempt
# stuck on the old leader meanwhile (the broker's heartbeat_timeout_ms, 1 s), then a whole
# session timeout without a heartbeat.
ELECTION_TIMEOUT_MAX_S = 1.6
HEARTBEAT_ATTEMPT_S = 1.0
FENCE_EXPLAIN_AFTER_S = ELECTION_TIMEOUT_MAX_S + HEARTBEAT_ATTEMPT_S + SESSION_TIMEOUT_S
# A process found dead is noticed at the next fault's start (every 1-4 s): its death can
# precede the notice by that much.
EXIT_NOTICED_WITHIN_S = 5.0
EXPIRED = "session expired"

VIOLATION_KINDS = ("lost", "duplicated", "misplaced", "reordered", "vanished", "diverged")
EXAMPLES_MAX = 10


@dataclasses.dataclass(kw_only=True)
class Report:
    violations: dict[str, list[dict[str, Any]]]
    counts: dict[str, int]
    figures: dict[str, Any]
    # liveness failures (not safety): partitions that could not be read back after the heal,
    # partitions that never acknowledged again after the last heal, processes that died unasked
    liveness: dict[str, list[str]] = dataclasses.field(default_factory=dict)

    @property
    def safe(self) -> bool:
        return not any(self.counts.values())

    @property
    def ok(self) -> bool:
        return self.safe and not any(self.liveness.values())


def check(history: History) -> Report:
    violations: dict[str, list[dict[str, Any]]] = {k: [] for k in VIOLATION_KINDS}
    final_by_tp: dict[str, dict[int, str]] = {tp: dict(rs) for tp, rs in history.final_reads.items()}
    positions: dict[str, dict[str, list[int]]] = {}   # tp -> value -> offsets in the final read
    for tp, rs in history.final_reads.items():
        at: dict[str, list[int]] = collections.defaultdict(list)
        for offset, value in rs:
            at[value].append(offset)
        positions[tp] = at

    # lost, misplaced: acknowledged records against the final read. A partition that could
    # not be read back is checked against its replicas' disks instead: an acknowledged record
    # must be on at least one, at its offset.
    unreadable = set(history.unreadable)
    on_disk: dict[str, dict[str, set[int]]] = {}
    for tp in unreadable:
        at_disk: dict[str, set[int]] = collections.defaultdict(set)
        for entries in history.replicas.get(tp, {}).values():
            for offset, entry in entries:
                at_disk[entry.rsplit("|", 1)[-1]].add(offset)
        on_disk[tp] = at_disk
    for s in history.sends:
        if s.offset is None:
            continue
        if s.tp in unreadable:
            disk_offsets = on_disk[s.tp].get(s.value, set())
            if not disk_offsets:
                violations["lost"].append({"tp": s.tp, "value": s.value, "offset": s.offset, "acked_s": s.done_s,
                                           "checked": "replica disks (partition unreadable)"})
            elif s.offset not in disk_offsets:
                violations["misplaced"].append({"tp": s.tp, "value": s.value, "acked_offset": s.offset,
                                                "found_at": sorted(disk_offsets), "checked": "replica disks"})
            continue
        offsets = positions.get(s.tp, {}).get(s.value, [])
        if not offsets:
            violations["lost"].append({"tp": s.tp, "value": s.value, "offset": s.offset, "acked_s": s.done_s})
        elif s.offset not in offsets:
            violations["misplaced"].append({"tp": s.tp, "value": s.value, "acked_offset": s.offset,
                                            "found_at": offsets})

    # duplicated: any value of ours more than once in a partition
    for tp, at in positions.items():
        for value, offsets in at.items():
            if len(offsets) > 1 and parse_value(value) is not None:
                violations["duplicated"].append({"tp": tp, "value": value, "offsets": sorted(offsets)})

    # reordered: per producer and partition, sequence numbers rise with the offset
    for tp, rs in history.final_reads.items():
        last: dict[str, tuple[int, int]] = {}   # producer -> (seq, offset) of the last record seen
        earlier: set[str] = set()
        for offset, value in sorted(rs):
            parsed = parse_value(value)
            if parsed is None or parsed[1] != tp or value in earlier:
                continue   # not ours, or a later copy (counted as duplicated)
            earlier.add(value)
            producer, _, seq = parsed
            if producer in last and seq < last[producer][0]:
                prev_seq, prev_offset = last[producer]
                violations["reordered"].append({"tp": tp, "producer": producer, "seq": seq, "offset": offset,
                                                "after_seq": prev_seq, "after_offset": prev_offset})
            if producer not in last or seq > last[producer][0]:
                last[producer] = (seq, offset)

    # vanished: what a consumer was handed stays where it was
    for seen in history.seen:
        if seen.tp in unreadable:
            continue
        if final_by_tp.get(seen.tp, {}).get(seen.offset) != seen.value:
            violations["vanished"].append({"tp": seen.tp, "offset": seen.offset, "value": seen.value,
                                           "consumer": seen.consumer,
                                           "now": final_by_tp.get(seen.tp, {}).get(seen.offset)})

    # diverged: replicas agree below the high watermark. Only replicas in the final ISR are
    # compared when it is known: one outside it may still hold an old epoch's tail below the
    # leader's HW (its own HW is lower), which it truncates when it catches up.
    for tp, logs in history.replicas.items():
        hw = history.high_watermarks.get(tp)
        if hw is None:
            continue
        in_sync = history.isr_at_end.get(tp)
        brokers = sorted(b for b in logs if in_sync is None or b in in_sync)
        maps = {b: dict(logs[b]) for b in brokers}
        for i, a in enumerate(brokers):
            for b in brokers[i + 1:]:
                common = set(maps[a]) & set(maps[b])
                bad = sorted(o for o in common if o < hw and maps[a][o] != maps[b][o])
                if bad:
                    violations["diverged"].append({"tp": tp, "replicas": [a, b], "offsets": len(bad),
                                                   "first_offset": bad[0], "entries": [maps[a][bad[0]],
                                                                                       maps[b][bad[0]]]})

    counts = {k: len(v) for k, v in violations.items()}
    figs = figures(history)
    by_topic: dict[str, dict[str, int]] = {}
    for kind, found in violations.items():
        per = collections.Counter(str(v["tp"]).rsplit("/", 1)[0] for v in found)
        if per:
            by_topic[kind] = dict(sorted(per.items()))
    figs["violations_by_topic"] = by_topic
    # A process that dies with no fault killing it (a crash on a full disk, say) is a failure
    # even when the harness's restart hides its effect on the records.
    liveness = {"unreadable_partitions": sorted(unreadable),
                "partitions_never_reacked": list(figs["partitions_never_reacked"]),
                "processes_exited": list(history.exits)}
    if history.fences is not None:
        liveness["unexplained_fences"] = [f"{f.broker} at {f.at_s} s: {f.reason} (silent {f.silent_ms} ms, "
                                          f"decided by {f.controller})" for f in unexplained_fences(history)]
    return Report(violations={k: v[:EXAMPLES_MAX] for k, v in violations.items()}, counts=counts,
                  figures=figs, liveness=liveness)


_EXIT = re.compile(r"^(?P<node>[bc]\d+) exited .* at (?P<at>[\d.]+) s")


def fence_explained(history: History, broker: str, at_s: float) -> bool:
    """A fence of `broker` at `at_s` is explained by a fault running then (or ended at most
    FENCE_EXPLAIN_AFTER_S before) that touched that broker or any controller (the controller
    leader, its quorum, or a broker's link to them: the history does not say which controller
    led, so a fault on any counts), or by the broker or a controller dying unasked. Gray
    faults (a broker cut from its peers only) leave the controllers' links whole and explain
    none."""
    def touches(targets: tuple[str, ...] | list[str]) -> bool:
        return any(t == broker or t.startswith("c") for t in targets)

    for f in history.faults:
        if f.kind in GRAY_KINDS or not touches(f.targets):
            continue
        if f.start_s <= at_s <= f.end_s + FENCE_EXPLAIN_AFTER_S:
            return True
    for line in history.exits:
        m = _EXIT.match(line)
        if m and touches([m["node"]]) and \
                float(m["at"]) - EXIT_NOTICED_WITHIN_S <= at_s <= float(m["at"]) + FENCE_EXPLAIN_AFTER_S:
            return True
    return False


def unexplained_fences(history: History) -> list[Fence]:
    """Fences for an expired session during the workload that no fault explains. Fences for
    other reasons (a controlled shutdown) are asked for; those before the workload or after
    the end of the read-back (the harness stopping the cluster) are not the run's."""
    return [f for f in history.fences or [] if f.reason == EXPIRED and 0.0 <= f.at_s <= history.end_s
            and not fence_explained(history, f.broker, f.at_s)]


def fence_figures(history: History) -> dict[str, Any]:
    if history.fences is None:
        return {}
    during = [f for f in history.fences if 0.0 <= f.at_s <= history.end_s]
    lone = unexplained_fences(history)
    return {"fences": len(during),
            "fences_by_reason": dict(sorted(collections.Counter(f.reason for f in during).items())),
            "unexplained_fences": len(lone),
            "unexplained_fences_by_broker": dict(sorted(collections.Counter(f.broker for f in lone).items())),
            "unexplained_fence_examples": [dataclasses.asdict(f) for f in lone[:EXAMPLES_MAX]]}


def _quorum_windows(history: History) -> list[tuple[float, float]]:
    return sorted((f.start_s, f.end_s) for f in history.faults if f.removes_quorum)


# Faults that take their targets out of service while they last: the process is dead, stopped
# or unreachable. A killed process stays out until it is back in service (FaultRun.back_s).
OUT_OF_SERVICE_KINDS = frozenset({
    "kill_broker", "kill_controller", "kill_controller_leader", "kill_broker_pair",
    "pause_broker", "pause_controller", "pause_controller_leader", "pause_controller_pair",
    "isolate", "partition"})


def _merged(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def out_of_service_windows(history: History) -> list[tuple[float, float]]:
    """When a quorum was gone in fact, not only by schedule: two brokers, or two controllers,
    out of service at once (of three), a restarted process counting as out until it was back
    in service. Faults run one at a time, but a broker killed while the last one killed is still
    opening its replicas or catching up leaves its partitions one in-sync replica, as a pair
    kill would. Also every scheduled quorum-removing fault."""
    spans: dict[str, list[tuple[float, float]]] = collections.defaultdict(list)
    for f in history.faults:
        if f.kind in OUT_OF_SERVICE_KINDS:
            for node in f.targets:
                spans[node].append((f.start_s, max(f.end_s, f.back_s.get(node, f.end_s))))
    windows = list(_quorum_windows(history))
    for prefix in ("b", "c"):
        edges: list[tuple[float, int]] = []
        for node, node_spans in spans.items():
            if node.startswith(prefix):
                for start, end in _merged(node_spans):
                    edges += [(start, 1), (end, -1)]
        out, opened = 0, 0.0
        for at, step in sorted(edges, key=lambda e: (e[0], e[1])):   # an end before a start at one instant
            if step > 0 and out == 1:
                opened = at
            if step < 0 and out == 2:
                windows.append((opened, at))
            out += step
    return _merged(windows)


def _outside(windows: list[tuple[float, float]], start: float, end: float) -> float:
    """Length of [start, end] not covered by any window."""
    covered = 0.0
    cursor = start
    for w_start, w_end in windows:
        lo, hi = max(w_start, cursor), min(w_end, end)
        if hi > lo:
            covered += hi - lo
            cursor = hi
    return max(0.0, (end - start) - covered)


def figures(history: History) -> dict[str, Any]:
    acked = [s for s in history.sends if s.offset is not None]
    failures = collections.Counter(s.error for s in history.sends if s.error is not None)
    pending = sum(1 for s in history.sends if s.done_s is None)
    faults = collections.Counter(f.kind for f in history.faults)

    windows = _quorum_windows(history)
    ack_times: dict[str, list[float]] = collections.defaultdict(list)
    for s in acked:
        assert s.done_s is not None
        ack_times[s.tp].append(s.done_s)
    first_send_s = min((s.sent_s for s in history.sends), default=0.0)
    last_send_s = max((s.sent_s for s in history.sends), default=0.0)
    in_service = out_of_service_windows(history)
    gap_by_tp: dict[str, float] = {}
    gap_in_service_by_tp: dict[str, float] = {}
    for tp in sorted({s.tp for s in history.sends}):
        times = sorted(ack_times.get(tp, []))
        # from the first send to the last: a partition that stops acknowledging has its gap counted
        edges = [first_send_s, *times, max(last_send_s, *times) if times else last_send_s]
        longest = longest_in_service = 0.0
        for a, b in zip(edges, edges[1:]):
            longest = max(longest, _outside(windows, a, b))
            longest_in_service = max(longest_in_service, _outside(in_service, a, b))
        gap_by_tp[tp] = round(longest, 3)
        gap_in_service_by_tp[tp] = round(longest_in_service, 3)

    reack_by_tp: dict[str, float | None] = {}
    if history.last_heal_s is not None:
        for tp in sorted({s.tp for s in history.sends}):
            after = [t for t in ack_times.get(tp, []) if t >= history.last_heal_s]
            reack_by_tp[tp] = round(min(after) - history.last_heal_s, 3) if after else None

    return {
        "gray": gray_figures(history, ack_times),
        **fence_figures(history),
        "sends": len(history.sends), "acked": len(acked), "failed": sum(failures.values()), "no_outcome": pending,
        "failures_by_error": dict(sorted(failures.items())),
        "faults": len(history.faults), "faults_by_kind": dict(sorted(faults.items())),
        "faults_removing_quorum": sum(1 for f in history.faults if f.removes_quorum),
        "seen_by_consumers": len(history.seen),
        "process_exits": len(history.exits),
        "producer_restarts": len(history.producer_restarts),
        "longest_ack_gap_s": max(gap_by_tp.values(), default=0.0),
        "longest_ack_gap_s_by_partition": gap_by_tp,
        # the same outside out_of_service_windows: what the gap target is judged on
        "longest_ack_gap_s_in_service": max(gap_in_service_by_tp.values(), default=0.0),
        "longest_ack_gap_s_in_service_by_partition": gap_in_service_by_tp,
        "quorum_out_windows": len(in_service),
        "quorum_out_s": round(sum(b - a for a, b in in_service), 3),
        "reack_after_last_heal_s": (max((v for v in reack_by_tp.values() if v is not None), default=None)
                                    if reack_by_tp else None),
        "reack_after_last_heal_s_by_partition": reack_by_tp,
        "partitions_never_reacked": sorted(tp for tp, v in reack_by_tp.items() if v is None),
        "harness_stalls": None if history.harness_stalls is None else len(history.harness_stalls),
        "harness_stall_longest_s": (None if history.harness_stalls is None
                                    else max((d for _, d in history.harness_stalls), default=0.0)),
    }


def gray_targets(history: History) -> dict[str, float]:
    """Issue 19's targets: partitions the cut broker does not lead never stop acknowledging
    (quorum: 1 s; isr: a follower behind the cut is in their ISR until the leader shrinks it,
    replica_lag_time_max_ms, as Kafka's), its own come back within session timeout + 2 s
    (quorum) and replica_lag_time_max_ms + 2 s (isr)."""
    lags = [int(c.get("replica_lag_time_max_ms", 10_000)) / 1000 for c in history.topics.values()
            if c.get("commit_policy", "isr") == "isr"]
    lag_s = max(lags, default=10.0)
    return {"others_quorum": 1.0, "others_isr": lag_s + 1.0,
            "cut_quorum": SESSION_TIMEOUT_S + 2.0, "cut_isr": lag_s + 2.0}


def _gap_within(times: list[float], start: float, end: float) -> float:
    edges = [start, *(t for t in times if start < t < end), end]
    return max(b - a for a, b in zip(edges, edges[1:]))


def gray_figures(history: History, ack_times: dict[str, list[float]]) -> dict[str, Any]:
    """Per gray fault kind: the longest gap inside any such fault, by group
    ("cut_quorum": partitions the cut broker led as the fault began, quorum topics...), the
    targets, and each fault's worst partition per group."""
    policy = {t: c.get("commit_policy", "isr") for t, c in history.topics.items()}
    by_kind: dict[str, dict[str, Any]] = {}
    for f in history.faults:
        if f.kind not in GRAY_KINDS or not f.leaders:
            continue
        cut = _cut_broker(f)
        row = by_kind.setdefault(f.kind, {"faults": 0, "longest_gap_s": {}, "worst": []})
        row["faults"] += 1
        worst: dict[str, tuple[float, str]] = {}
        for tp, leader in f.leaders.items():
            group = ("cut_" if leader == cut else "others_") + policy.get(tp.split("/")[0], "isr")
            gap = round(_gap_within(sorted(ack_times.get(tp, [])), f.start_s, f.end_s), 3)
            if gap > worst.get(group, (-1.0, ""))[0]:
                worst[group] = (gap, tp)
            row["longest_gap_s"][group] = max(row["longest_gap_s"].get(group, 0.0), gap)
        row["worst"].append({"index": f.index, "targets": list(f.targets),
                             **{g: {"gap_s": v[0], "partition": v[1]} for g, v in sorted(worst.items())}})
    targets = gray_targets(history)
    for row in by_kind.values():
        row["over_target"] = sorted(g for g, v in row["longest_gap_s"].items() if v > targets[g])
    return {"targets_s": targets, "by_kind": by_kind} if by_kind else {}


def _cut_broker(f: FaultRun) -> str | None:
    """The broker cut from its peers; a cut between two followers (cut_follower) or of the
    controller leader from its peers (cut_controller_leader) has none."""
    return f.targets[0] if f.kind not in ("cut_follower", "cut_controller_leader") else None
