"""Bringing offline partitions back: a partition whose log write failed is reopened from disk.

A write that fails under a partition's core (a full disk: dataplane/log/space.py keeps
that rare by refusing produce first) leaves the core ahead of its log, so the driver
takes the partition offline (`PartitionDriver._fail`: KAFKA_STORAGE_ERROR to clients,
waiting producers released with it). Kafka keeps such a log directory offline until the
broker restarts; here `OfflineRecovery` does what a restart would, for that partition
only: once the filesystem has room again it closes the driver and opens the partition
again (`ReplicaManager.reopen`), so its log recovers from disk as after a crash and a
fresh core starts from it and the current metadata. A partition that fails to open
(no room yet) is tried again too.

Bounded: each partition is tried with a backoff doubling from `retry_ms` to
`retry_ms_max`, at most `attempts_max` times; then one ERROR says to restart the broker.
Each attempt that fails is a WARNING only on the first failure of a run of them.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import TYPE_CHECKING, Callable

from common.errors import BiplaneError
from common.metadata.image import MetadataImage
from common.topic_partition import TopicPartition
from dataplane.log import space

if TYPE_CHECKING:
    from dataplane.broker.replicas import ReplicaManager

log = logging.getLogger("biplane.broker.offline")


@dataclasses.dataclass
class _Attempts:
    count: int = 0
    next_at: float = 0.0
    delay_s: float = 0.0
    gave_up: bool = False


class OfflineRecovery:
    def __init__(self, replicas: ReplicaManager, image: Callable[[], MetadataImage], *, data_dir: str,
                 ready: Callable[[], bool] = lambda: True, retry_ms: int = 1000, retry_ms_max: int = 30_000,
                 attempts_max: int = 100, clock: Callable[[], float] = time.monotonic) -> None:
        self.replicas = replicas
        self.image = image
        self.ready = ready  # the broker acts on metadata only once caught up with the controller
        self.data_dir = data_dir
        self.retry_s = retry_ms / 1000
        self.retry_s_max = retry_ms_max / 1000
        self.attempts_max = attempts_max
        self._clock = clock
        self._attempts: dict[TopicPartition, _Attempts] = {}
        self.reopened = 0  # partitions brought back (tests, metrics)

    def _wanted(self, image: MetadataImage) -> list[TopicPartition]:
        """Partitions assigned here that went offline, or whose open failed (a full disk when
        the metadata arrived). One the metadata listener is still opening is neither. Only
        those the replica manager was told failed are looked at (`failed`, pruned here once
        back or gone), not every partition of the image each second."""
        broker_id = self.replicas.broker_id
        failed = self.replicas.failed
        failed.update(self.replicas.open_failures)
        out = []
        for tp in sorted(failed):
            info = image.get_partition(*tp)
            driver = self.replicas.drivers.get(tp)
            if driver is None:
                still = tp in self.replicas.open_failures
            else:
                still = driver.failed is not None and not driver.closed
            if not still:
                failed.discard(tp)
            elif info is not None and broker_id in info.replicas:
                out.append(tp)
        return out

    def _has_room(self) -> bool:
        try:
            return space.for_directory(self.data_dir).has_room()
        except OSError:
            return False

    async def run(self) -> None:
        """Until cancelled."""
        while True:
            await asyncio.sleep(self.retry_s)
            try:
                await self.pass_once()
            except (BiplaneError, OSError) as exc:  # one pass failed as a whole: the next one tries
                log.warning("reopening offline partitions failed: %s", exc,
                            extra={"event": "partition.reopen_failed"})

    async def pass_once(self) -> int:
        """One pass: reopen every offline partition that is due; how many came back."""
        if not self.ready():
            return 0
        image = self.image()
        wanted = self._wanted(image)
        for tp in list(self._attempts):
            if tp not in wanted:
                del self._attempts[tp]  # back (or no longer hosted here)
        if not wanted or not self._has_room():
            return 0
        now = self._clock()
        back = 0
        for tp in wanted:
            driver = self.replicas.drivers.get(tp)
            if driver is not None and driver.failed is None:
                continue  # opened meanwhile (by the metadata listener)
            attempts = self._attempts.setdefault(tp, _Attempts())
            if attempts.gave_up or now < attempts.next_at:
                continue
            attempts.count += 1
            reason = driver.failed if driver is not None else self.replicas.open_failures.get(tp, "its open failed")
            try:
                ok = await self.replicas.reopen(tp, image)
                error = None if ok else "the open failed (logged above)"
            except (BiplaneError, OSError) as exc:
                ok, error = False, f"{type(exc).__name__}: {exc}"
            if ok:
                back += 1
                self.reopened += 1
                log.warning("%s-%d is back online: reopened from disk after %d attempt(s) (it was offline: %s)",
                         *tp, attempts.count, reason,
                         extra={"event": "partition.online", "topic": tp[0], "partition": tp[1]})
                del self._attempts[tp]
                continue
            attempts.delay_s = min(max(attempts.delay_s * 2, self.retry_s), self.retry_s_max)
            attempts.next_at = self._clock() + attempts.delay_s
            if attempts.count >= self.attempts_max:
                attempts.gave_up = True
                log.error("%s-%d stays offline: %d attempts to reopen it failed, the last with %s; check "
                          "the disk under %s and restart the broker", *tp, attempts.count, error, self.data_dir,
                          extra={"event": "partition.reopen_gave_up", "topic": tp[0], "partition": tp[1]})
            elif attempts.count == 1:
                log.warning("%s-%d: reopening it failed (%s); trying again with backoff up to %.0f s",
                            *tp, error, self.retry_s_max,
                            extra={"event": "partition.reopen_failed", "topic": tp[0], "partition": tp[1]})
        return back
