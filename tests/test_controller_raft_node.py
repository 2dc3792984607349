"""RaftNode with real pysyncobj, in one process on loopback: flush ordering, JSON dumps, restart."""
from __future__ import annotations

import asyncio
import json

import pytest

from common.metadata import NoOp
from controller import raft as raft_module
from controller.raft import RaftNode, RaftSettings, _SyncingTransport
from controller.raft_rules import DUMP_FORMAT
from controller.replicated import MetadataStateMachine, batch_command
from controller_harness import free_port

TCPTransport = raft_module.TCPTransport   # pysyncobj's, as the adapter uses it


class SpyJournal:
    def __init__(self):
        self.syncs = 0

    def sync(self):
        self.syncs += 1


class FakeSyncObj:
    def __init__(self):
        self._biplane_journal = SpyJournal()


def transport_with_spy() -> tuple[_SyncingTransport, SpyJournal]:
    transport = object.__new__(_SyncingTransport)   # no sockets: only the flush rule is exercised
    transport._syncObj = FakeSyncObj()
    transport._connections = {}
    transport._send_random_sleep_duration = 0
    return transport, transport._syncObj._biplane_journal


@pytest.mark.parametrize("kind", ["next_node_idx", "response_vote", "request_vote", "apply_command"])
def test_every_message_but_a_leaders_append_flushes_the_journal_first(kind):
    transport, journal = transport_with_spy()
    transport.send("node", {"type": kind})
    assert journal.syncs == 1


def test_a_leaders_append_entries_leaves_before_its_flush():
    transport, journal = transport_with_spy()
    transport.send("node", {"type": "append_entries", "entries": []})
    assert journal.syncs == 0


def start_nodes(loop, tmp_path, count, *, sync=True, ranked=True):
    """`ranked`: node i has priority count - i (node 0 leads once caught up); else all equal."""
    addrs = [f"127.0.0.1:{free_port()}" for _ in range(count)]
    prio = [count - i if ranked else 1 for i in range(count)]
    nodes = []
    for i, addr in enumerate(addrs):
        peers = tuple(a for a in addrs if a != addr)
        settings = RaftSettings(self_address=addr, peer_addresses=peers, data_dir=str(tmp_path / f"n{i}"),
                                password="secret" if peers else None, priority=prio[i],
                                peer_priorities=tuple((a, prio[j]) for j, a in enumerate(addrs) if a != addr),
                                journal_sync=sync, election_timeout_ms_min=800, election_timeout_ms_max=1200)
        node = RaftNode(settings=settings, state=MetadataStateMachine(), loop=loop,
                        on_applied=lambda o: None, on_reset=lambda s: None)
        node.start()
        nodes.append(node)
    return nodes


async def leader_of(nodes, timeout_s=15):
    deadline = asyncio.get_running_loop().time() + timeout_s
    while asyncio.get_running_loop().time() < deadline:
        for n in nodes:
            if n.status().is_leader:
                return n
        await asyncio.sleep(0.02)
    raise AssertionError("no raft leader")


def test_acks_leave_only_with_a_flushed_journal_and_the_leader_flushes_before_applying(tmp_path, monkeypatch):
    """Claim: no follower sends an append_entries answer (its ack) while its journal has
    unflushed writes, and when a proposal's future resolves the leader's journal is flushed."""
    sent_dirty: list[tuple[str, bool]] = []
    real_send = TCPTransport.send

    def spying_send(self, node, message):
        journal = getattr(self._syncObj, "_biplane_journal", None)
        if journal is not None and isinstance(message, dict):
            sent_dirty.append((message.get("type"), journal._dirty))
        return real_send(self, node, message)
    monkeypatch.setattr(TCPTransport, "send", spying_send)

    async def run():
        loop = asyncio.get_running_loop()
        nodes = start_nodes(loop, tmp_path, 3, ranked=False)   # no priority handover mid-test
        try:
            leader = await leader_of(nodes)
            leader_clean = []
            for i in range(30):
                outcome = await leader.propose(batch_command(expected_offset=leader.state.image.offset,
                                                             records=[NoOp(reason=f"r{i}")]))
                assert outcome.kind == "batch"
                leader_clean.append(not leader._obj._biplane_journal._dirty)
            assert all(leader_clean)
        finally:
            for n in nodes:
                n.stop()
    asyncio.run(run())
    acks = [dirty for kind, dirty in sent_dirty if kind == "next_node_idx"]
    assert len(acks) >= 30
    assert not any(acks), f"{sum(acks)} of {len(acks)} acks left with unflushed entries"


def _listening_hosts(port: int) -> set[str]:
    """Hex local addresses of IPv4 sockets listening on `port`, from /proc/net/tcp."""
    hosts = set()
    for line in open("/proc/net/tcp").read().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        host, hex_port = local.split(":")
        if state == "0A" and int(hex_port, 16) == port:   # 0A: LISTEN
            hosts.add(host)
    return hosts


def test_raft_port_listens_on_the_nodes_own_address_only(tmp_path):
    """Claim: the Raft port is bound to the node's address (127.0.0.1 here), not 0.0.0.0."""
    async def run():
        loop = asyncio.get_running_loop()
        port = free_port()
        settings = RaftSettings(self_address=f"127.0.0.1:{port}", peer_addresses=(),
                                data_dir=str(tmp_path / "solo"))
        node = RaftNode(settings=settings, state=MetadataStateMachine(), loop=loop,
                        on_applied=lambda o: None, on_reset=lambda s: None)
        node.start()
        try:
            await leader_of([node])
            return _listening_hosts(port)
        finally:
            node.stop()
    assert asyncio.run(run()) == {"0100007F"}   # 127.0.0.1, little-endian hex; 0.0.0.0 is 00000000


def test_dump_is_json_and_a_restarted_node_restores_dump_plus_journal(tmp_path):
    """Claim: the full dump pysyncobj writes is our JSON, and a node restarted on the same
    data dir rebuilds the same image from dump + journal."""
    async def run():
        loop = asyncio.get_running_loop()
        settings = RaftSettings(self_address=f"127.0.0.1:{free_port()}", peer_addresses=(),
                                data_dir=str(tmp_path / "solo"), compaction_entries_min=5)
        node = RaftNode(settings=settings, state=MetadataStateMachine(), loop=loop,
                        on_applied=lambda o: None, on_reset=lambda s: None)
        node.start()
        try:
            await leader_of([node])
            for i in range(40):
                await node.propose(batch_command(expected_offset=node.state.image.offset,
                                                 records=[NoOp(reason=f"r{i}")]))
            for _ in range(100):   # compaction runs from the tick thread once enough entries exist
                if (tmp_path / "solo" / "raft.dump.json").exists():
                    break
                await asyncio.sleep(0.05)
            expected = node.state.image.to_dict()
        finally:
            node.stop()
        dump = json.loads((tmp_path / "solo" / "raft.dump.json").read_bytes())
        assert dump["format"] == DUMP_FORMAT and dump["state"]["offset"] >= 4

        resets = []
        again = RaftNode(settings=settings, state=MetadataStateMachine(), loop=loop,
                         on_applied=lambda o: None, on_reset=resets.append)
        again.start()
        try:
            await leader_of([again])
            for _ in range(100):
                if again.state.image.offset == expected["offset"]:
                    break
                await asyncio.sleep(0.05)
            assert again.state.image.to_dict() == expected
            assert resets, "the dump was loaded through on_reset"
        finally:
            again.stop()
    asyncio.run(run())


def test_more_than_one_node_without_a_secret_is_refused(tmp_path):
    settings = RaftSettings(self_address="127.0.0.1:1", peer_addresses=("127.0.0.1:2",), data_dir=str(tmp_path))
    with pytest.raises(ValueError, match="cluster secret"):
        RaftNode(settings=settings, state=MetadataStateMachine(), loop=asyncio.new_event_loop(),
                 on_applied=lambda o: None, on_reset=lambda s: None)


@pytest.mark.parametrize("low, high", [(500, 900), (1000, 1000)])
def test_election_timeouts_pysyncobj_would_reject_are_refused_clearly(tmp_path, low, high):
    settings = RaftSettings(self_address="127.0.0.1:1", peer_addresses=(), data_dir=str(tmp_path),
                            election_timeout_ms_min=low, election_timeout_ms_max=high)
    with pytest.raises(ValueError, match="election timeout"):
        settings.validate()


def test_after_an_idle_spell_the_next_leader_wins_in_one_round(tmp_path):
    """Claim: followers keep their link alive, so when the leader stops after a quiet spell
    longer than pysyncobj's connection timeout, the next-priority node wins the very next
    term (its vote request reaches the other follower) instead of needing a second round."""
    async def run():
        loop = asyncio.get_running_loop()
        nodes = start_nodes(loop, tmp_path, 3)
        try:
            await leader_of(nodes)
            for _ in range(200):   # let priority hand leadership to the top node first
                if nodes[0].status().is_leader:
                    break
                await asyncio.sleep(0.05)
            leader = await leader_of(nodes)
            await asyncio.sleep(2.5)      # quiet: no client traffic, longer than the connection timeout
            term = leader.status().term
            leader.stop()
            survivors = [n for n in nodes if n is not leader]
            successor = await leader_of(survivors)
            assert successor.status().term == term + 1, (term, successor.status().term)
        finally:
            for n in nodes:
                n.stop()
    asyncio.run(run())
