"""Raft rules the pysyncobj adapter follows, as pure functions (no pysyncobj, no I/O).

Election timeouts by priority, the leadership-transfer target, the JSON dump
format, and the follower-side fix for pysyncobj's truncation on overlapping
appends. `controller/raft.py` applies them.
"""
from __future__ import annotations

import base64
import json
from typing import Callable

DUMP_FORMAT = 1


def election_timeouts_s(*, priority: int, priorities: list[int], base_min_s: float,
                        base_s_max: float) -> tuple[float, float]:
    """Raft election timeout range of a node: higher priority, earlier and disjoint band.

    With one priority level (all equal) every node draws from the base range,
    as in plain Raft. With n > 1 distinct levels, level r (0 = highest) gets
    the band starting at base_min * (0.5 + 0.5 r / (n - 1)) and ending where
    the next level's starts (the lowest ends one band higher): the bands do not
    overlap, so the best priority still alive times out first and no
    lower-priority node splits its vote.
    """
    if base_min_s <= 0 or base_s_max <= base_min_s:
        raise ValueError(f"election timeout range [{base_min_s}, {base_s_max}] s is not a valid range")
    levels = sorted(set(priorities) | {priority}, reverse=True)
    if len(levels) == 1:
        return base_min_s, base_s_max
    rank = levels.index(priority)
    band = 0.5 * base_min_s / (len(levels) - 1)
    low = base_min_s * 0.5 + rank * band
    return low, low + band


def leader_fallback_s(election_timeout_s_max: float) -> float:
    """How long a Raft leader that hears from no majority of its peers goes on leading
    (pysyncobj's leaderFallbackTimeout): brokers heartbeating it find the next leader only
    after that (controller/decisions/sessions.py gives them the time)."""
    return max(2.0, 2 * election_timeout_s_max)


def transfer_target(*, self_priority: int, peers: list[tuple[str, int, bool]]) -> str | None:
    """The peer leadership should move to: the highest priority above ours among connected peers.

    `peers` holds (address, priority, connected). Ties go to the lowest address
    so every leader picks the same one. pysyncobj itself refuses a target that
    is not caught up, and the leader retries later.
    """
    better = [(-prio, addr) for addr, prio, connected in peers if connected and prio > self_priority]
    return min(better)[1] if better else None


def encode_dump(*, state: dict, last_entry: tuple, prev_entry: tuple, cluster: list[str]) -> bytes:
    """The JSON dump file: our state plus the two log entries pysyncobj needs to resume."""
    def entry(e: tuple) -> list:
        command, idx, term = e
        return [base64.b64encode(bytes(command)).decode("ascii"), int(idx), int(term)]
    return json.dumps({"format": DUMP_FORMAT, "state": state, "last_entry": entry(last_entry),
                       "prev_entry": entry(prev_entry), "cluster": sorted(cluster)},
                      separators=(",", ":")).encode()


def decode_dump(data: bytes) -> tuple[dict, tuple, tuple, list[str]]:
    doc = json.loads(data)
    if doc.get("format") != DUMP_FORMAT:
        raise ValueError(f"dump format {doc.get('format')!r} is not {DUMP_FORMAT}")

    def entry(e: list) -> tuple:
        return (base64.b64decode(e[0]), int(e[1]), int(e[2]))
    return doc["state"], entry(doc["last_entry"]), entry(doc["prev_entry"]), list(doc["cluster"])


def trim_overlap(message: dict, *, term_at: Callable[[int], int | None], last_index: int) -> dict:
    """Make a follower's append_entries overlap-safe before pysyncobj sees it.

    pysyncobj 0.3.17 truncates a follower's log after `prevLogIdx` whenever the
    log is longer, even when nothing conflicts. That happens in normal running:
    a leader with several appends in flight rewinds its next index on an older
    success reply and re-sends entries the follower already holds — the
    follower then drops entries it had acknowledged (and applied: "state
    machine may have diverged"). Raft truncates only at a conflict. So:
    entries the follower holds with the same term are dropped from the message
    and `prevLogIdx` moves past them; a real conflict is left for pysyncobj to
    truncate from there. When the message is wholly contained in the log,
    `prevLogIdx` moves to the log's end only if the log's last entry is of the
    sender's term: that entry came from the sender (one leader per term), which
    never rewrites its own entries, so by Raft's log matching the whole log is
    a prefix of the sender's. Otherwise the message is passed on unchanged.
    """
    if message.get("type") != "append_entries" or "prevLogIdx" in message and "transmission" in message:
        return message
    prev = message.get("prevLogIdx")
    if prev is None or prev >= last_index or term_at(prev) != message.get("prevLogTerm"):
        return message
    entries = list(message.get("entries", []))
    verified = prev
    for i, (_command, idx, term) in enumerate(entries):
        if idx > last_index:
            return {**message, "prevLogIdx": verified, "prevLogTerm": term_at(verified), "entries": entries[i:]}
        if term_at(idx) != term:
            return {**message, "prevLogIdx": verified, "prevLogTerm": term_at(verified), "entries": entries[i:]}
        verified = idx
    if term_at(last_index) == message.get("term"):
        return {**message, "prevLogIdx": last_index, "prevLogTerm": term_at(last_index), "entries": []}
    return message
