"""The controller's state machine and the pure parts of the pysyncobj adapter, without Raft."""
from __future__ import annotations

import json

import pytest

from common.metadata import FenceBroker, MetadataImage, RegisterBroker, dump_record
from controller.raft import (
    _SyncedJournal,
    decode_dump,
    election_timeouts_s,
    encode_dump,
    transfer_target,
)
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


def test_higher_priority_gets_shorter_election_timeouts():
    top = election_timeouts_s(priority=9, priorities=[1, 5, 9], base_min_s=1.0, base_max_s=1.6)
    mid = election_timeouts_s(priority=5, priorities=[1, 5, 9], base_min_s=1.0, base_max_s=1.6)
    low = election_timeouts_s(priority=1, priorities=[1, 5, 9], base_min_s=1.0, base_max_s=1.6)
    assert top == (0.5, 0.8) and low == (1.0, 1.6)
    assert top[1] < low[1] and top[0] < mid[0] < low[0]
    same = election_timeouts_s(priority=3, priorities=[3, 3], base_min_s=1.0, base_max_s=1.6)
    assert same == (1.0, 1.6)


def test_bad_timeout_range_is_refused():
    with pytest.raises(ValueError, match="election timeout"):
        election_timeouts_s(priority=1, priorities=[1], base_min_s=2.0, base_max_s=1.0)


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
