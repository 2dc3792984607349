"""A PartitionDriver with no broker around it, for tests: hooks that keep the fetch requests
its core sends and ignore everything else, and a follower of broker 1 set up by its first
metadata."""
from __future__ import annotations

from pathlib import Path

from dataplane.broker.partition import PartitionDriver
from dataplane.log.interface import LogConfig
from dataplane.replica.events import FetchRequest, NewMetadata
from dataplane.replica.state import PartitionState, ReplicationConfig


class FetchHooks:
    def __init__(self) -> None:
        self.fetches: list[FetchRequest] = []

    def send_fetch(self, leader_id, tp, request) -> None:
        self.fetches.append(request)

    def send_append_entries(self, *a) -> None: pass
    def propose_isr(self, *a) -> None: pass
    def report_election(self, *a) -> None: pass
    def refresh_metadata(self, *a) -> None: pass
    def partition_offline(self, *a) -> None: pass


def follower_driver(directory: str | Path, hooks: FetchHooks, *, isr: tuple[int, ...] = (1, 2)) -> PartitionDriver:
    """Broker 2's replica of t-0, following broker 1 in leader epoch 1 (call it on a running loop)."""
    driver = PartitionDriver(broker_id=2, tp=("t", 0), directory=str(directory), log_config=LogConfig(),
                             hooks=hooks, unclean_start=False)
    driver.step(NewMetadata(partition=PartitionState(replicas=(1, 2), isr=isr, leader=1, leader_epoch=1,
                                                     partition_epoch=1), config=ReplicationConfig()))
    return driver
