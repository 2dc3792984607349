"""The controller's state machine and the pure parts of the pysyncobj adapter, without Raft."""
from __future__ import annotations

import json

import pytest

from common.metadata import FenceBroker, MetadataImage, RegisterBroker, dump_record
from controller.raft import _SyncedJournal
from controller.raft_rules import decode_dump, election_timeouts_s, encode_dump, transfer_target
from controller.replicated import MetadataStateMachine, batch_command, marker_command


def register(broker_id: int) -> RegisterBroker:
    return RegisterBroker(broker_id=broker_id, incarnation_id=f"inc-{broker_id}", host="127.0.0.1",
                          port=9000 + broker_id, at_ms=1)


def test_batch_applies_records_in_order_with_consecutive_offsets():
    sm = MetadataStateMachine()
    out = sm.apply_command(batch_command(expected_offset=-1, records=[register(1), register(2)]))
    assert out.kind == "batch"
    assert [off for off, _ in out.applied] == [0, 1]
    assert sm.image.offset == 1 and sorted(sm.image.brokers) == [1, 2]


def test_batch_computed_at_another_offset_is_skipped_whole():
    sm = MetadataStateMachine()
    sm.apply_command(batch_command(expected_offset=-1, records=[register(1)]))
    before = sm.image.copy()
    out = sm.apply_command(batch_command(expected_offset=-1, records=[register(2)]))
    assert out.kind == "stale" and out.expected_offset == -1 and out.offset == 0
    assert sm.image == before


def test_rejected_record_is_skipped_takes_no_offset_and_is_reported():
    sm = MetadataStateMachine()
    fence_unknown = FenceBroker(broker_id=7, at_ms=1)
    out = sm.apply_command(batch_command(expected_offset=-1,
                                         records=[register(1), fence_unknown, register(2)]))
    assert [off for off, _ in out.applied] == [0, 1]
    assert len(out.rejected) == 1 and out.rejected[0].index == 1
    assert out.rejected[0].record_type == "fence_broker"


def test_unparseable_record_is_skipped_alike_on_every_replica():
    command = json.dumps({"expected_offset": -1,
                          "records": [{"type": "no_such_record"}, dump_record(register(1))]})
    a, b = MetadataStateMachine(), MetadataStateMachine()
    out_a, out_b = a.apply_command(command), b.apply_command(command)
    assert out_a == out_b
    assert out_a.rejected[0].index == 0 and a.image == b.image and a.image.offset == 0


@pytest.mark.parametrize("command", ["not json", "[1, 2]", '{"records": []}',
                                     '{"expected_offset": "0", "records": []}'])
def test_malformed_command_changes_nothing(command):
    sm = MetadataStateMachine()
    out = sm.apply_command(command)
    assert out.kind == "malformed" and sm.image == MetadataImage()


def test_marker_takes_no_offset():
    sm = MetadataStateMachine()
    out = sm.apply_command(marker_command(node="a:1", term=3, nonce=9))
    assert out.kind == "marker" and out.marker == {"node": "a:1", "term": 3, "nonce": 9}
    assert sm.image.offset == -1


def test_state_dump_round_trips_through_json():
    sm = MetadataStateMachine()
    sm.apply_command(batch_command(expected_offset=-1, records=[register(1), register(3)]))
    blob = encode_dump(state=sm.dump(), last_entry=(b"\x01\x80cmd", 12, 3),
                       prev_entry=(b"\x00", 11, 3), cluster=["b:2", "a:1"])
    json.loads(blob)  # plain JSON: no pickle anywhere in the dump
    state, last, prev, cluster = decode_dump(blob)
    other = MetadataStateMachine()
    other.load(state)
    assert other.image == sm.image
    assert last == (b"\x01\x80cmd", 12, 3) and prev == (b"\x00", 11, 3)
    assert cluster == ["a:1", "b:2"]


def test_dump_of_unknown_format_is_refused():
    with pytest.raises(ValueError, match="format"):
        decode_dump(b'{"format": 99}')


def test_higher_priority_gets_an_earlier_disjoint_election_timeout_band():
    bands = [election_timeouts_s(priority=p, priorities=[1, 5, 9], base_min_s=1.0, base_s_max=1.6)
             for p in (9, 5, 1)]
    assert bands == [(0.5, 0.75), (0.75, 1.0), (1.0, 1.25)]
    for (lo_hi, hi_hi), (lo_lo, _) in zip(bands, bands[1:]):
        assert lo_hi < hi_hi <= lo_lo
    assert election_timeouts_s(priority=3, priorities=[3, 3], base_min_s=1.0, base_s_max=1.6) == (1.0, 1.6)
    five = [election_timeouts_s(priority=p, priorities=[1, 2, 3, 4, 5], base_min_s=1.0, base_s_max=1.6)
            for p in (5, 4, 3, 2, 1)]
    assert all(a[1] <= b[0] for a, b in zip(five, five[1:])) and all(lo < hi for lo, hi in five)


def test_bad_timeout_range_is_refused():
    with pytest.raises(ValueError, match="election timeout"):
        election_timeouts_s(priority=1, priorities=[1], base_min_s=2.0, base_s_max=1.0)


def test_transfer_goes_to_highest_connected_priority_above_ours():
    peers = [("a:1", 5, True), ("b:2", 9, False), ("c:3", 7, True), ("d:4", 7, True)]
    assert transfer_target(self_priority=4, peers=peers) == "c:3"
    assert transfer_target(self_priority=7, peers=peers) is None
    assert transfer_target(self_priority=9, peers=[]) is None


class FakeJournal:
    def __init__(self):
        self.entries, self.flushes = [], 0

    def add(self, command, idx, term):
        self.entries.append((command, idx, term))

    def flush(self):
        self.flushes += 1

    def __len__(self):
        return len(self.entries)


def test_journal_is_flushed_once_per_sync_and_only_when_written():
    journal = _SyncedJournal(FakeJournal(), enabled=True, directory=None)
    journal.sync()
    assert journal._inner.flushes == 0
    journal.add(b"x", 1, 1)
    journal.add(b"y", 2, 1)
    journal.sync()
    journal.sync()
    assert journal._inner.flushes == 1 and len(journal) == 2


def test_disabled_journal_sync_never_flushes():
    journal = _SyncedJournal(FakeJournal(), enabled=False, directory=None)
    journal.add(b"x", 1, 1)
    journal.sync()
    assert journal._inner.flushes == 0


# ---- trim_overlap: pysyncobj's follower truncates on any overlap; Raft only on a conflict

from hypothesis import given, settings, strategies as st  # noqa: E402

from controller.raft_rules import trim_overlap  # noqa: E402


def log_of(terms: list[int], first: int = 1) -> list[tuple[bytes, int, int]]:
    return [(b"c%d" % (first + i), first + i, t) for i, t in enumerate(terms)]


def ae(log, prev: int, upto: int, term: int) -> dict:
    """append_entries carrying the sender's entries prev+1..upto."""
    by_idx = {e[1]: e for e in log}
    return {"type": "append_entries", "term": term, "commit_index": 0, "prevLogIdx": prev,
            "prevLogTerm": by_idx[prev][2], "entries": [by_idx[i] for i in range(prev + 1, upto + 1)]}


def follower_apply(local: list, message: dict) -> list:
    """What pysyncobj 0.3.17 does with an append_entries whose prev entry matches."""
    prev = message["prevLogIdx"]
    kept = [e for e in local if e[1] <= prev]
    return kept + list(message.get("entries", []))


def raft_apply(local: list, message: dict) -> list:
    """Raft's rule: truncate only at the first conflicting entry; keep everything else."""
    out = list(local)
    for e in message.get("entries", []):
        pos = e[1] - out[0][1]
        if pos < len(out):
            if out[pos][2] != e[2]:
                out = out[:pos] + [e]
        else:
            out.append(e)
    return out


def trimmed(local: list, message: dict) -> dict:
    terms = {e[1]: e[2] for e in local}
    return trim_overlap(message, term_at=terms.get, last_index=local[-1][1])


def test_resent_entries_no_longer_truncate_what_the_follower_acknowledged():
    leader = log_of([1, 2, 2, 2, 2, 2])
    follower = list(leader)                       # it already holds all six
    message = ae(leader, 2, 4, term=2)            # a rewound resend of 3..4
    assert follower_apply(follower, message) == leader[:4]            # pysyncobj alone: drops 5, 6
    assert follower_apply(follower, trimmed(follower, message)) == leader


def test_partly_new_entries_are_appended_after_the_held_ones():
    leader = log_of([1, 1, 2, 2, 2])
    follower = leader[:3]
    out = trimmed(follower, ae(leader, 1, 5, term=2))
    assert out["prevLogIdx"] == 3 and [e[1] for e in out["entries"]] == [4, 5]
    assert follower_apply(follower, out) == leader


def test_a_real_conflict_still_truncates_from_the_conflict():
    follower = log_of([1, 1, 1, 1])
    leader = log_of([1, 1, 2, 2])
    out = trimmed(follower, ae(leader, 1, 4, term=2))
    assert out["prevLogIdx"] == 2 and [e[1] for e in out["entries"]] == [3, 4]
    assert follower_apply(follower, out) == leader


def test_trailing_entries_of_another_term_are_left_to_pysyncobj():
    follower = log_of([1, 1, 1, 1])
    leader = log_of([1, 1, 3])
    message = ae(leader, 1, 2, term=3)            # follower's 3 and 4 are of term 1, not the sender's
    assert trimmed(follower, message) is message


def test_mismatched_prev_or_no_overlap_is_passed_through():
    follower = log_of([1, 1, 1])
    leader = log_of([1, 2, 2, 2])
    mismatch = ae(leader, 2, 3, term=2)
    assert trimmed(follower, mismatch) is mismatch
    tail = ae(log_of([1, 1, 1, 2]), 3, 4, term=2)
    assert trimmed(follower, tail) is tail


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=12).map(sorted), st.data())
def test_trimmed_append_is_raft_safe(follower_terms, data):
    """Claim: after a trimmed append the follower holds every entry of the message, keeps a
    prefix of what Raft would keep, and never loses an entry of the sender's term that Raft keeps.
    Senders are either the leader that wrote the follower's last term (its log extends the
    follower's) or a leader of a newer term sharing a prefix."""
    follower = log_of(follower_terms)
    extra = data.draw(st.integers(0, 4), label="leader's extra entries")
    if data.draw(st.booleans(), label="same leader"):
        sender_term = follower_terms[-1]
        leader = follower + log_of([sender_term] * extra, first=len(follower) + 1)
    else:
        sender_term = follower_terms[-1] + 1
        cut = data.draw(st.integers(1, len(follower)), label="shared prefix")
        leader = follower[:cut] + log_of([sender_term] * extra, first=cut + 1)
    prev = data.draw(st.integers(1, len(leader)), label="prev")
    # pysyncobj sends at least one entry whenever the receiver's next index is in the log
    upto = data.draw(st.integers(min(prev + 1, len(leader)), len(leader)), label="upto")
    if prev > len(follower) or leader[prev - 1] != follower[prev - 1]:
        return  # prev does not match: pysyncobj answers with a reset, nothing is appended
    message = ae(leader, prev, upto, term=sender_term)
    after = follower_apply(follower, trimmed(follower, message))
    raft = raft_apply(follower, message)
    assert after == raft[:len(after)]
    assert all(e in after for e in message["entries"])
    assert all(e in after for e in raft if e[2] == sender_term)


def test_pysyncobj_versions_compare_numerically():
    from controller.raft import PYSYNCOBJ_VERSION_MIN, _version_tuple
    assert _version_tuple("0.3.17") >= PYSYNCOBJ_VERSION_MIN
    assert _version_tuple("0.3.9") < PYSYNCOBJ_VERSION_MIN
    assert _version_tuple("0.3.16") < PYSYNCOBJ_VERSION_MIN


def test_a_record_whose_apply_crashes_is_skipped_alike_everywhere(monkeypatch):
    """A bug in the image must not wedge the quorum: the record is skipped the same way on
    every replica and reported."""
    original = MetadataImage.apply

    def crash_on_broker_2(self, record, offset):
        if getattr(record, "broker_id", None) == 2:
            raise KeyError("boom")
        return original(self, record, offset)
    monkeypatch.setattr(MetadataImage, "apply", crash_on_broker_2)
    a, b = MetadataStateMachine(), MetadataStateMachine()
    command = batch_command(expected_offset=-1, records=[register(1), register(2), register(3)])
    out = a.apply_command(command)
    assert out == b.apply_command(command)
    assert [off for off, _ in out.applied] == [0, 1] and out.rejected[0].index == 1
    assert "internal error" in out.rejected[0].message and sorted(a.image.brokers) == [1, 3]
