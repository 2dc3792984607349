"""The one module that talks to pysyncobj (>= 0.3.17, which persists term and vote).

`RaftNode` replicates JSON command strings through pysyncobj and applies each
committed one to a state machine (`apply_command(str) -> outcome`,
`dump() -> dict`, `load(dict)`) on pysyncobj's thread; outcomes reach asyncio
through `loop.call_soon_threadsafe`, in log order. Nothing pickled is ours:
the full dump is JSON (our serializer); pysyncobj's journal frames each
command (a JSON string) in its own pickle envelope.

Durability — what is guaranteed once a proposal's future resolves:
- with `journal_sync=True` (the default) the command is on the disk
  (fdatasync) of a majority of controllers: it survives `kill -9` of every
  controller and the loss (power, machine, disk) of any minority; losing a
  majority at once can lose it. How: a node flushes its journal (fdatasync of
  the mapped journal file) before it sends any Raft message but a leader's
  append_entries, at the end of every tick, and before it applies a committed
  entry, and fsyncs the term/vote file after each change. So a follower acks,
  and a candidate asks for votes, only with entries on its disk; a leader
  sends new entries first and flushes them at the end of that tick, before
  the next tick — the only place pysyncobj counts the leader towards a
  commit — so followers write in parallel with it. A new dump file is fsynced
  before it replaces the old one, and the directory before the journal is cut.
  A follower never drops entries it acknowledged on a re-sent append
  (`trim_overlap`). Tested: tests/test_controller_raft_node.py (acks only
  after a flush), tests/test_controller_quorum.py (kill -9 of all three, then
  restart). Machine loss itself is not tested here.
- with `journal_sync=False` the journal lives in the page cache: a command
  survives `kill -9` of every controller (the kernel still writes the pages)
  and the loss of a minority while the others stay up, not a power loss of a
  majority within the kernel's writeback delay.

Settings, measured on 2 shared cores, 3 processes on loopback, disk fsync
~4 ms: `appendEntriesUseBatch=False` (with batching a synchronous proposal
waits for the 0.1 s heartbeat; without, one commit takes ~2 ms in Raft and an
admin write ~4.5 ms p50 with the fsyncs), heartbeat 0.1 s, election timeouts
from a 1.0-1.6 s base, in disjoint bands by priority rank (highest starts
at 0.5 s), reconnects every 0.5 s so a restarted node rejoins
fast, and whole commands per message (no chunking). Leadership goes back to
the connected higher-priority node once it is caught up (pysyncobj's
TimeoutNow transfer), at most every 0.5 s and not in a new leader's first 2 s.

Leadership is not taken from pysyncobj's word ("there could be multiple
leaders"): the service commits a marker command in the current term first;
see `controller/service.py`.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import threading
import time
from collections import deque
from typing import Any, Callable, Protocol

from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated
from pysyncobj.node import TCPNode
from pysyncobj.transport import TCPTransport
from pysyncobj.version import VERSION as PYSYNCOBJ_VERSION

from common.durable import fsync_path
from controller.raft_rules import (
    decode_dump,
    election_timeouts_s,
    leader_fallback_s,
    encode_dump,
    transfer_target,
    trim_overlap,
)

log = logging.getLogger("biplane.controller.raft")

PYSYNCOBJ_VERSION_MIN = (0, 3, 17)
PEER_PING_S = 0.25


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".")[:3] if part.isdigit())


if _version_tuple(PYSYNCOBJ_VERSION) < PYSYNCOBJ_VERSION_MIN:
    # Older releases do not persist term and vote, and this adapter reaches into
    # 0.3.x internals (the journal object, its file, the poller's pipe).
    raise ImportError(f"pysyncobj {PYSYNCOBJ_VERSION} is too old: Biplane needs >= "
                      f"{'.'.join(map(str, PYSYNCOBJ_VERSION_MIN))} and < 0.4")

class StateMachine(Protocol):
    def apply_command(self, command_json: str) -> Any: ...
    def dump(self) -> dict: ...
    def load(self, data: dict) -> None: ...


class ProposalFailed(Exception):
    """A proposal did not commit in this leader's term. `reason` is pysyncobj's, as text."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"proposal not committed: {reason}")
        self.reason = reason


_FAIL_NAMES = {getattr(FAIL_REASON, n): n.lower() for n in dir(FAIL_REASON) if n.isupper()}


# ------------------------------------------------------------ pysyncobj glue


class _SyncedJournal:
    """Wraps pysyncobj's FileJournal: remembers unflushed writes; `sync()` makes them durable."""

    def __init__(self, inner: Any, *, enabled: bool, directory: str | None) -> None:
        self._inner = inner
        self._enabled = enabled and hasattr(inner, "flush")
        self._directory = directory
        self._dirty = False
        self.dir_dirty = False
        self.syncs = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def __len__(self) -> int:
        return len(self._inner)

    def __getitem__(self, item: Any) -> Any:
        return self._inner[item]

    def add(self, command: bytes, idx: int, term: int) -> None:
        self._inner.add(command, idx, term)
        self._dirty = True

    def clear(self) -> None:
        self._inner.clear()
        self._dirty = True

    def deleteEntriesFrom(self, entryFrom: int) -> None:  # noqa: N802 (pysyncobj's name)
        self._inner.deleteEntriesFrom(entryFrom)
        self._dirty = True

    def deleteEntriesTo(self, entryTo: int) -> None:  # noqa: N802
        self._inner.deleteEntriesTo(entryTo)
        self._dirty = True

    def setCurrentTerm(self, term: int, votedForNodeId: Any) -> None:  # noqa: N802
        self._inner.setCurrentTerm(term, votedForNodeId)
        if self._enabled:
            meta = self._inner._FileJournal__metaStorer.getPath()
            fsync_path(meta)
            if self._directory:
                fsync_path(self._directory)

    def sync(self) -> None:
        if not self._enabled:
            return
        if self.dir_dirty and self._directory:
            # A new dump was renamed into place: make the rename durable before the
            # journal entries it replaced can be truncated on disk.
            fsync_path(self._directory)
            self.dir_dirty = False
        if self._dirty:
            self._dirty = False
            fd = self._journal_fd()
            if fd is None:
                self._inner.flush()
            else:
                # fdatasync writes back the mapped pages like msync(MS_SYNC) does on
                # Linux, but releases the GIL: the event loop keeps serving meanwhile.
                os.fdatasync(fd)
            self.syncs += 1

    def _journal_fd(self) -> int | None:
        try:
            return self._inner._FileJournal__journalFile._ResizableFile__f.fileno()
        except AttributeError:
            return None


class _SyncingTransport(TCPTransport):
    """Flushes the journal before a Raft message leaves: no ack or vote for unflushed entries.

    The one exception is a leader's append_entries: it leaves first so followers
    write in parallel with the leader, whose own flush runs at the end of the same
    tick (`RaftNode._sync_journal`) — before the next tick, the only place where
    pysyncobj counts the leader towards a commit.
    """

    def _onMessageReceived(self, node: Any, message: Any) -> None:  # noqa: N802 (pysyncobj's name)
        journal = getattr(self._syncObj, "_biplane_journal", None)
        if journal is not None and isinstance(message, dict) and message.get("type") == "append_entries":
            first = journal[0][1]
            last = journal[len(journal) - 1][1]

            def term_at(idx: int) -> int | None:
                return journal[idx - first][2] if first <= idx <= last else None
            message = trim_overlap(message, term_at=term_at, last_index=last)
        super()._onMessageReceived(node, message)

    def send(self, node: Any, message: Any) -> bool:
        journal = getattr(self._syncObj, "_biplane_journal", None)
        if journal is not None and not (isinstance(message, dict) and message.get("type") == "append_entries"):
            journal.sync()
        return super().send(node, message)


class _ReplicatedObject(SyncObj):
    def __init__(self, self_address: str, peers: list[str], conf: SyncObjConf,
                 on_apply: Callable[[str], Any]) -> None:
        self._biplane_journal: _SyncedJournal | None = None  # set by RaftNode.start
        self._biplane_on_apply = on_apply
        super().__init__(self_address, peers, conf, transportClass=_SyncingTransport)

    @replicated
    def apply_json(self, command_json: str) -> Any:
        return self._biplane_on_apply(command_json)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RaftSettings:
    self_address: str                   # host:port this node binds for Raft
    peer_addresses: tuple[str, ...]     # the other nodes
    data_dir: str
    password: str | None = None
    priority: int = 1
    peer_priorities: tuple[tuple[str, int], ...] = ()
    election_timeout_ms_min: int = 1000
    election_timeout_ms_max: int = 1600
    heartbeat_ms: int = 100
    journal_sync: bool = True
    compaction_entries_min: int = 2000
    compaction_interval_s: int = 300
    transfer_check_ms: int = 500
    transfer_holddown_ms: int = 2000

    @property
    def leader_fallback_ms_max(self) -> int:
        """The longest any controller of this cluster leads without a majority (its election
        timeouts reach at most 1.5x the base minimum with priorities, else the base maximum)."""
        hi = max(self.election_timeout_ms_max, 1.5 * self.election_timeout_ms_min) / 1000
        return int(leader_fallback_s(hi) * 1000)

    def validate(self) -> None:
        if not self.election_timeout_ms_max > self.election_timeout_ms_min:
            raise ValueError(f"election timeout max {self.election_timeout_ms_max} ms must be above "
                             f"the min {self.election_timeout_ms_min} ms")
        if self.election_timeout_ms_min / 2 <= 3 * self.heartbeat_ms:
            raise ValueError(f"election timeout min {self.election_timeout_ms_min} ms must exceed 6 Raft "
                             f"heartbeats ({6 * self.heartbeat_ms} ms): the highest priority halves it, "
                             "and a follower must miss 3 heartbeats before it stands")
        if self.peer_addresses and not self.password:
            raise ValueError("a quorum of more than one controller needs a cluster secret "
                             "(--cluster-secret or BIPLANE_CLUSTER_SECRET): pysyncobj's transport "
                             "unpickles what it receives, so it must be authenticated")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RaftStatus:
    self_address: str
    is_leader: bool
    leader_address: str | None
    term: int
    commit_index: int
    last_applied: int
    connected_peers: tuple[str, ...]
    last_log_index: int = 0
    # On the leader: each peer's Raft address and match index (the end of its log known to
    # equal the leader's); empty on a follower.
    match_index: tuple[tuple[str, int], ...] = ()


class RaftNode:
    """One pysyncobj node driven by its own tick thread.

    `on_applied(outcome)` and `on_reset(state_dict)` run on the asyncio loop,
    in log order. `propose(json)` is called on the loop and returns a future
    with the outcome of applying that command (on this node, in this term).
    """

    def __init__(self, *, settings: RaftSettings, state: StateMachine,
                 loop: asyncio.AbstractEventLoop,
                 on_applied: Callable[[Any], None],
                 on_reset: Callable[[dict], None],
                 on_role_change: Callable[[], None] | None = None) -> None:
        settings.validate()
        self.settings = settings
        self.state = state
        self._loop = loop
        self._on_applied = on_applied
        self._on_reset = on_reset
        self._on_role_change = on_role_change
        self._calls: deque[Callable[[], None]] = deque()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._obj: _ReplicatedObject | None = None
        self._priorities = dict(settings.peer_priorities)
        self._leader_since = 0.0
        self._last_transfer_check = 0.0
        self._resigning = False   # set by hand_over: no transfer by priority after it
        self._last_ping = 0.0
        self._peer_nodes = [TCPNode(a) for a in settings.peer_addresses]
        os.makedirs(settings.data_dir, exist_ok=True)
        self.journal_path = os.path.join(settings.data_dir, "raft.journal")
        self.dump_path = os.path.join(settings.data_dir, "raft.dump.json")

    # -- lifecycle

    def start(self) -> None:
        s = self.settings
        lo, hi = election_timeouts_s(priority=s.priority,
                                     priorities=list(self._priorities.values()) + [s.priority],
                                     base_min_s=s.election_timeout_ms_min / 1000,
                                     base_s_max=s.election_timeout_ms_max / 1000)
        if not s.peer_addresses:
            # Nobody to compete with: become leader as soon as pysyncobj allows.
            lo, hi = 4 * s.heartbeat_ms / 1000, 5 * s.heartbeat_ms / 1000
        conf = SyncObjConf(
            password=s.password,
            autoTick=False,
            # pysyncobj binds 0.0.0.0 unless told: the Raft port belongs on the node's own address only.
            bindAddress=s.self_address,
            journalFile=self.journal_path,
            fullDumpFile=self.dump_path,
            serializer=self._serialize,
            deserializer=self._deserialize,
            # A synchronous caller must not wait for the next heartbeat to be sent.
            appendEntriesUseBatch=False,
            appendEntriesPeriod=s.heartbeat_ms / 1000,
            # Whole commands per message: pysyncobj's chunked path for larger entries
            # is bypassed (the service keeps each command far below this).
            appendEntriesBatchSizeBytes=2 ** 23,
            raftMinTimeout=lo,
            raftMaxTimeout=hi,
            connectionRetryTime=0.5,
            connectionTimeout=max(1.0, hi),
            leaderFallbackTimeout=leader_fallback_s(hi),
            logCompactionMinEntries=s.compaction_entries_min,
            logCompactionMinTime=s.compaction_interval_s,
            bindRetryTime=0.25,
            maxBindRetries=40,
            dynamicMembershipChange=False,
            commandsWaitLeader=True,
            onStateChanged=self._state_changed,
        )
        try:
            obj = _ReplicatedObject(s.self_address, list(s.peer_addresses), conf, self._apply)
        except Exception as exc:   # pysyncobj gives up binding with SyncObjException('BindError')
            raise OSError(f"cannot bind the Raft address {s.self_address}: {exc}") from exc
        journal = _SyncedJournal(obj._SyncObj__raftLog, enabled=s.journal_sync,
                                 directory=s.data_dir)
        obj._SyncObj__raftLog = journal
        obj._biplane_journal = journal
        self._obj = obj
        obj.addOnTickCallback(self._sync_journal)
        if not s.peer_addresses:
            obj.addOnTickCallback(self._wake_lone_node)
        self._thread = threading.Thread(target=self._run, name="raft-tick", daemon=True)
        self._thread.start()

    def _started(self) -> tuple[_ReplicatedObject, _SyncedJournal]:
        """The node and its journal; only after start()."""
        obj = self._obj
        if obj is None or obj._biplane_journal is None:
            raise RuntimeError("RaftNode is not started")
        return obj, obj._biplane_journal

    def hand_over(self) -> None:
        """Ask the tick thread to hand leadership to the most caught-up connected peer (Raft's
        TimeoutNow), so that a stopping leader's successor takes over now, not after an
        election timeout; no priority transfer is made after it. Nothing on a follower, a
        lone node, or when no peer is caught up (ask again)."""
        self._resigning = True
        self._calls.append(self._hand_over)

    def _hand_over(self) -> None:
        obj = self._started()[0]
        if obj._isLeader() and self._peer_nodes:
            log.info("stopping: handing leadership to a caught-up peer")
            obj.transferLeadership(None)

    def stop(self) -> None:
        """Idempotent. Stops the tick thread and closes the journal (flushed)."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _run(self) -> None:
        obj, journal = self._started()
        while not self._stopping.is_set():
            try:
                while self._calls:
                    self._calls.popleft()()
                obj.doTick(0.02)
                self._maybe_transfer()
                self._maybe_ping()
            except Exception:
                log.exception("raft tick failed; retrying")
                time.sleep(0.05)
        try:
            journal.sync()
            obj.destroy()
        except Exception:
            log.exception("raft shutdown failed")

    def _state_changed(self, old: int, new: int) -> None:
        names = {0: "follower", 1: "candidate", 2: "leader"}
        log.info("raft %s -> %s in term %d", names.get(old, old), names.get(new, new),
                 self._obj.raftCurrentTerm if self._obj is not None else -1)
        if self._on_role_change is not None:
            self._loop.call_soon_threadsafe(self._on_role_change)

    def _sync_journal(self) -> None:
        self._started()[1].sync()

    def _wake_lone_node(self) -> None:
        # Runs at the end of each tick, just before pysyncobj polls its sockets. A lone
        # node commits what it appended only in the next tick, and no socket will wake
        # that poll: wake it through pysyncobj's own pipe instead of sleeping 20 ms.
        obj = self._started()[0]
        if obj.raftCommitIndex < obj._SyncObj__getCurrentLogIndex():
            obj._SyncObj__pipeNotifier.notify()

    def _maybe_ping(self) -> None:
        # pysyncobj drops a connection that has read nothing for connectionTimeout, and
        # checks only when it sends: two followers never talk while a leader lives, so
        # the first vote request after a leader dies went down a link that then closed,
        # and the election took a second round. A small message keeps every link read.
        now = time.monotonic()
        if now - self._last_ping < PEER_PING_S:
            return
        self._last_ping = now
        transport = self._started()[0]._SyncObj__transport
        for node in self._peer_nodes:
            transport.send(node, {"type": "biplane_ping"})

    # -- state machine hooks (Raft thread)

    def _apply(self, command_json: str) -> Any:
        journal = self._obj._biplane_journal if self._obj is not None else None
        if journal is not None:
            journal.sync()      # a single node acknowledges only what it flushed
        outcome = self.state.apply_command(command_json)
        self._loop.call_soon_threadsafe(self._on_applied, outcome)
        return outcome

    def _serialize(self, path: str, data: tuple) -> None:
        last_entry, prev_entry, cluster = data
        blob = encode_dump(state=self.state.dump(), last_entry=last_entry, prev_entry=prev_entry,
                           cluster=[getattr(n, "address", str(n)) for n in cluster])
        with open(path, "wb") as f:
            f.write(blob)
            f.flush()
            if self.settings.journal_sync:
                os.fsync(f.fileno())
        if self._obj is not None and self._obj._biplane_journal is not None:
            self._obj._biplane_journal.dir_dirty = True

    def _deserialize(self, path: str) -> tuple:
        with open(path, "rb") as f:
            state, last_entry, prev_entry, cluster = decode_dump(f.read())
        self.state.load(state)
        self._loop.call_soon_threadsafe(self._on_reset, state)
        return last_entry, prev_entry, cluster

    # -- leadership transfer (Raft thread)

    def _maybe_transfer(self) -> None:
        obj = self._started()[0]
        now = time.monotonic()
        if self._resigning:
            # Handed leadership back while still stopping (a successor's priority transfer to
            # it): pass it on again rather than lead without deciding until the exit.
            if obj._isLeader() and now - self._last_transfer_check >= self.settings.transfer_check_ms / 1000:
                self._last_transfer_check = now
                self._hand_over()
            return
        if not obj._isLeader():
            self._leader_since = 0.0
            return
        if self._leader_since == 0.0:
            self._leader_since = now
        s = self.settings
        if (now - self._leader_since < s.transfer_holddown_ms / 1000
                or now - self._last_transfer_check < s.transfer_check_ms / 1000):
            return
        self._last_transfer_check = now
        peers = [(addr, prio, obj.isNodeConnected(TCPNode(addr))) for addr, prio in self._priorities.items()]
        target = transfer_target(self_priority=s.priority, peers=peers)
        if target is not None:
            log.info("handing leadership to higher-priority controller %s", target)
            obj.transferLeadership(target)

    # -- asyncio side

    def propose(self, command_json: str) -> asyncio.Future:
        fut = self._loop.create_future()
        loop = self._loop

        def done(result: Any, error: int) -> None:
            loop.call_soon_threadsafe(_resolve, fut, result, error)

        self._started()[0].apply_json(command_json, callback=done)
        return fut

    def status(self) -> RaftStatus:
        obj, journal = self._started()
        leader = obj._getLeader()
        is_leader = obj._isLeader()
        # pysyncobj keeps match indexes in a private dict its tick thread updates: copied whole
        # (one C-level call under the GIL) before reading.
        match = dict(obj._SyncObj__raftMatchIndex) if is_leader else {}
        return RaftStatus(
            self_address=self.settings.self_address,
            is_leader=is_leader,
            leader_address=getattr(leader, "address", None),
            term=obj.raftCurrentTerm,
            commit_index=obj.raftCommitIndex,
            last_applied=obj.raftLastApplied,
            connected_peers=tuple(a for a in self.settings.peer_addresses
                                  if obj.isNodeConnected(TCPNode(a))),
            last_log_index=_last_index(journal),
            match_index=tuple(sorted((str(getattr(node, "address", node)), int(index))
                                     for node, index in match.items())),
        )

    def journal_syncs(self) -> int:
        return self._obj._biplane_journal.syncs if self._obj and self._obj._biplane_journal else 0


def _last_index(journal: _SyncedJournal) -> int:
    try:
        return int(journal[-1][1])
    except IndexError:  # compacted to nothing, or not loaded yet
        return 0


def _resolve(fut: asyncio.Future, result: Any, error: int) -> None:
    if fut.done():
        return
    if error == FAIL_REASON.SUCCESS:
        fut.set_result(result)
    else:
        fut.set_exception(ProposalFailed(_FAIL_NAMES.get(error, str(error))))
