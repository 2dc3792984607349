"""The controller as the simulation sees it: the real metadata image and decisions
(controller/decisions), driven by messages and a clock, without pysyncobj or HTTP.

It keeps broker sessions from heartbeats, fences brokers that miss the session
timeout, registers restarted incarnations (as unclean shutdowns), accepts or
refuses ISR proposals, collects quorum-election reports and elects leaders. Heartbeats carry
the replication links a broker has not heard on (dataplane/broker/contact.py), and the
controller moves leaderships those links cannot commit (controller/decisions/reachability.py),
as the real controller leader does on each periodic pass.
"""
from __future__ import annotations

from common.errors import BiplaneError
from common.metadata.config import TopicConfig
from common.metadata.image import MetadataImage
from common.metadata.records import CreateTopic, PartitionRecord, RegisterBroker, UnfenceBroker
from common.requests import AllocateProducerIdsRequest, AlterIsrRequest, ElectionReport, RegisterBrokerRequest
from controller import decisions
from controller.decisions import (
    Link, QuorumElectionTracker, ReachabilityReports, alter_isr, allocate_producer_ids, elect_leaders, fence_broker,
    register_broker,
)
from dataplane.replica.actions import ProposeIsr, ReportElection
from dataplane.replica.state import PartitionState, ReplicationConfig

TOPIC = "t"


class SimController:
    def __init__(self, *, replicas: tuple[int, ...], topic_config: TopicConfig, now_ms: int,
                 session_timeout_ms: int, unreachable_decision_interval_ms: int) -> None:
        self.image = MetadataImage()
        self.session_timeout_ms = session_timeout_ms
        self.tracker = QuorumElectionTracker()
        self.reachability = ReachabilityReports(fresh_ms=session_timeout_ms,
                                                interval_ms=unreachable_decision_interval_ms)
        self.moves: list[tuple[int, str]] = []  # (time, reason) of every move on link reports
        self.lonely_shrinks: list[int] = []  # when an accepted shrink left the ISR below min_insync
        self.changes = 0  # bumps on every applied record; the sim resends metadata then
        self._state_at = -1
        self.last_seen_ms: dict[int, int] = {}
        self.incarnation: dict[int, str] = {}
        records: list = []
        for b in replicas:
            self.incarnation[b] = f"{b}-0"
            self.last_seen_ms[b] = now_ms
            records.append(RegisterBroker(broker_id=b, incarnation_id=f"{b}-0", host="sim", port=9000 + b,
                                          at_ms=now_ms))
            records.append(UnfenceBroker(broker_id=b, at_ms=now_ms))
        records.append(CreateTopic(name=TOPIC, topic_id="sim", config=topic_config, at_ms=now_ms))
        records.append(PartitionRecord(topic=TOPIC, partition=0, replicas=replicas, isr=replicas,
                                       leader=replicas[0], leader_epoch=0, partition_epoch=0))
        self._apply(records)
        self.config = ReplicationConfig.from_topic_config(topic_config)

    def allocate_producer_id(self) -> int:
        """One producer id from the metadata log (the decision brokers ask for in blocks)."""
        broker = min(self.image.brokers)
        (record,) = allocate_producer_ids(self.image, AllocateProducerIdsRequest(broker_id=broker, count=1))
        self._apply([record])
        return record.first_id

    def _apply(self, records: list) -> None:
        for r in records:
            self.image.apply(r, self.image.offset + 1)
            self.changes += 1

    @property
    def partition(self):
        return self.image.partition(TOPIC, 0)

    def partition_state(self) -> PartitionState:
        if self._state_at != self.changes:
            self._state = PartitionState.from_info(self.partition)
            self._state_at = self.changes
        return self._state

    def leader(self) -> int | None:
        return self.partition.leader

    # ------------------------------------------------------------- inputs

    def heartbeat(self, broker_id: int, incarnation_id: str, now_ms: int, unreachable: tuple[Link, ...] = ()) -> None:
        if self.incarnation.get(broker_id) != incarnation_id:
            self.incarnation[broker_id] = incarnation_id
            request = RegisterBrokerRequest(broker_id=broker_id, incarnation_id=incarnation_id, host="sim",
                                            port=9000 + broker_id, clean_shutdown=False)
            self._apply(register_broker(self.image, request, now_ms))
            self.reachability.forget_broker(broker_id)
        self.last_seen_ms[broker_id] = now_ms
        self.reachability.note(broker_id, list(unreachable), now_ms)

    def fenced_brokers(self) -> frozenset:
        return frozenset(b for b, info in self.image.brokers.items() if info.fenced)

    def propose_isr(self, proposal: ProposeIsr, now_ms: int) -> tuple | None:
        """Apply an accepted ISR change; return (error code, why) if refused, else None."""
        request = AlterIsrRequest(broker_id=proposal.replica_id, topic=TOPIC, partition=0,
                                  leader_epoch=proposal.leader_epoch, partition_epoch=proposal.partition_epoch,
                                  new_isr=proposal.new_isr)
        try:
            decisions.refuse_lonely_shrink(self.image, request, self.reachability, now_ms)
            before = self.partition
            self._apply(alter_isr(self.image, request))
            if len(self.partition.isr) < self.config.min_insync_replicas <= len(before.isr):
                self.lonely_shrinks.append(now_ms)   # the leader alone below min_insync_replicas
        except BiplaneError as exc:
            return exc.code, str(exc)
        return None

    def report(self, report: ReportElection, now_ms: int) -> str | None:
        why = self.tracker.add(self.image, ElectionReport(
            broker_id=report.replica_id, topic=TOPIC, partition=0, fenced_epoch=report.fenced_epoch,
            last_epoch=report.last_epoch, end_offset=report.end_offset,
            unclean=report.unclean), now_ms)
        self._elect()
        return why

    def tick(self, now_ms: int) -> None:
        for b in self.image.unfenced_broker_ids():
            if now_ms - self.last_seen_ms.get(b, now_ms) > self.session_timeout_ms:
                self._apply(fence_broker(self.image, b, now_ms, reason="session expired"))
        for b, info in sorted(self.image.brokers.items()):
            if info.fenced and now_ms - self.last_seen_ms.get(b, -10**9) <= self.session_timeout_ms \
                    and info.incarnation_id == self.incarnation.get(b):
                self._apply([UnfenceBroker(broker_id=b, at_ms=now_ms, reason="heartbeating")])
        moved, exclusions = decisions.move_unreachable_leaders(self.image, self.reachability, now_ms)
        self.moves += [(now_ms, getattr(r, "reason", "")) for r in moved]
        self._apply(moved)
        for e in exclusions:
            self.tracker.exclude(e.topic, e.partition, e.fenced_epoch, e.leader, until_ms=e.until_ms)
        self._elect()

    def _elect(self) -> None:
        self.tracker.forget_stale(self.image)
        self._apply(elect_leaders(self.image, self.tracker))
