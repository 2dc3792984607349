"""The metadata learner: long-polls a controller and applies records in order to a local image.

Brokers pull (docs/design.md#processes-and-what-travels-between-them): records after our offset, or the whole image when
we are too far behind. The image is saved to `metadata.json` in the data dir
(atomically, by a task of its own, at most once per `save_interval_ms`, the newest
image each time) so a restarted broker fetches from about where it was; it still
catches up with the controller before it acts on anything (`caught_up` is set once a
fetch of this process has brought the image to the committed offset its answer reflects), so
a file a little behind costs nothing.

Listeners (the replica manager, which opens and feeds partitions) run in a task of
their own and are always handed the newest image: fetching and applying records
never waits for them. A broker opening many partitions after a restart thus still
learns the record that registered it, its heartbeats say so, and it is unfenced;
before, it stayed fenced for as long as the opening took (minutes under load).

A save that fails (a full disk) changes nothing in memory: the learner goes on
applying records and tries the save again every `save_retry_ms`, logging the failure once (WARNING, event
`metadata.save_failed`) and the recovery once (WARNING too, `metadata.saved`). Only a
restart meanwhile would start from the older file, and it catches up anyway.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from typing import Awaitable, Callable

from common.control_client import ControlClient
from common.durable import write_atomically
from common.errors import BiplaneError, RecordRejected
from common.metadata.image import ImageEncoder, MetadataImage
from common.metadata.records import parse_record
from common.tasks import cancel_and_wait
from dataplane.broker.metadata_lag import LagReport, MetadataLag
from dataplane.log import space

log = logging.getLogger("biplane.broker.metadata")

Listener = Callable[[MetadataImage], Awaitable[None] | None]


class MetadataLearner:
    def __init__(self, control: ControlClient, *, data_dir: str, wait_ms_max: int = 5000,
                 error_backoff_ms: int = 200, save_retry_ms: int = 1000, save_interval_ms: int = 1000,
                 lag: MetadataLag | None = None) -> None:
        self.control = control
        self.path = os.path.join(data_dir, "metadata.json")
        self.wait_ms_max = wait_ms_max
        self.error_backoff_ms = error_backoff_ms
        self.save_retry_ms = save_retry_ms
        # The image is saved at most once per this: each save writes the whole image, and while
        # thousands of replicas open, their ISR changes come as many batches a second. The
        # file only tells a restarted broker where to fetch from (nothing acts on it before the
        # controller answered), so a save that lags the image by this much costs nothing.
        self.save_interval_ms = save_interval_ms
        self._save_wanted = asyncio.Event()
        self._encoder = ImageEncoder()   # one save at a time uses it (_save_newest)
        self.save_failed: str | None = None  # why the newest image is not on disk yet
        self.save_failures = 0
        self.image = self._load()
        self.caught_up = asyncio.Event()
        self.changed = asyncio.Event()  # set after every applied batch; waiters clear it
        self._listeners: list[Listener] = []
        self._wake = asyncio.Event()
        self._unheard = asyncio.Event()  # the image changed since listeners last heard of it
        self.lag = lag or MetadataLag()  # applied = the offset listeners have acted on
        self._offset_waiters: list[tuple[int, asyncio.Future[None]]] = []

    @property
    def offset(self) -> int:
        return self.image.offset

    def add_listener(self, listener: Listener) -> None:
        """Called with the new image after every applied batch, once caught up."""
        self._listeners.append(listener)

    async def wait_applied(self, offset: int, timeout_ms: int) -> bool:
        """True once the image is at `offset` or past it, False after `timeout_ms`. An admin write
        a Kafka client made through this broker answers once it is here, so the client reads
        its change back from this broker (Redpanda's CreateTopics waits likewise)."""
        if self.image.offset >= offset:
            return True
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiter = (offset, future)
        self._offset_waiters.append(waiter)
        try:
            await asyncio.wait_for(future, timeout_ms / 1000)
            return True
        except asyncio.TimeoutError:
            return False
        finally:
            if waiter in self._offset_waiters:
                self._offset_waiters.remove(waiter)

    def _release_offset_waiters(self) -> None:
        """Wake the waiters the image has reached; each removes itself (wait_applied)."""
        reached = self.image.offset
        for offset, future in self._offset_waiters:
            if offset <= reached and not future.done():
                future.set_result(None)

    def refresh_soon(self) -> None:
        """Cut the current long-poll short (someone saw a newer epoch than we know)."""
        self._wake.set()

    def _load(self) -> MetadataImage:
        try:
            with open(self.path) as f:
                return MetadataImage.from_dict(json.load(f))
        except FileNotFoundError:
            return MetadataImage()
        except (OSError, ValueError) as exc:
            log.warning("ignoring unreadable metadata file %s (%s); fetching from the controller",
                        self.path, exc, extra={"event": "metadata.load_failed"})
            return MetadataImage()

    def _save(self) -> None:
        write_atomically(self.path, self._encoder.encode(self.image).encode())

    def _save_or_report(self) -> bool:
        """Save the image; on an I/O error report it (once per condition) and return False."""
        try:
            self._save()
        except OSError as exc:
            self.save_failures += 1  # write_atomically removed its temporary file
            if space.is_disk_full(exc):
                space.note_full_at(os.path.dirname(self.path) or ".", f"saving {self.path}")
            if self.save_failed is None:
                log.warning("cannot save the metadata image to %s (%s); the broker keeps applying metadata in "
                            "memory and saves again every %d ms. %s", self.path, exc, self.save_retry_ms,
                            "Free space on that disk." if space.is_disk_full(exc)
                            else "Check the data directory's disk and permissions.",
                            extra={"event": "metadata.save_failed", "path": self.path,
                                   "offset": self.image.offset})
            self.save_failed = str(exc)
            return False
        if self.save_failed is not None:
            log.warning("metadata image saved to %s again at offset %d (after %d failed saves)", self.path,
                     self.image.offset, self.save_failures,
                     extra={"event": "metadata.saved", "path": self.path, "offset": self.image.offset})
            self.save_failed = None
        return True

    async def run(self) -> None:
        """Until cancelled."""
        learning = asyncio.ensure_future(self._learn())
        telling = asyncio.ensure_future(self._tell_listeners())
        saving = asyncio.ensure_future(self._save_newest())
        try:
            done, _ = await asyncio.wait({learning, telling, saving}, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()  # none ends unless it failed: the broker hears of it
        finally:
            await cancel_and_wait(learning, telling, saving)

    async def _learn(self) -> None:
        while True:
            wait_ms = self.wait_ms_max if self.caught_up.is_set() else 0
            try:
                batch = await self._fetch(wait_ms)
            except BiplaneError as exc:
                log.info("metadata fetch failed: %s", exc, extra={"event": "metadata.fetch_failed"})
                await asyncio.sleep(self.error_backoff_ms / 1000)
                continue
            if batch is None:
                continue
            changed = self._apply(batch)
            if self._offset_waiters:
                self._release_offset_waiters()
            self._report_lag(self.lag.observe(now_ms=_now_ms(), committed=batch.offset))
            first = not self.caught_up.is_set()
            if first and self.image.offset < batch.offset:
                # An answer holds at most a window of records: the rest comes at once (no wait).
                # Replicas open only on the controller's whole committed metadata, so a fact
                # a later record states (a topic once under durability=write) is never missed
                # by the first ones to open.
                if changed:
                    self._save_wanted.set()
                continue
            self.caught_up.set()
            if changed or first:
                self._save_wanted.set()
                self._unheard.set()

    async def _save_newest(self) -> None:
        """Save the newest image whenever it changed, at most once per save_interval_ms; after a
        failed save, again every save_retry_ms until one succeeds."""
        loop = asyncio.get_running_loop()
        while True:
            await self._save_wanted.wait()
            self._save_wanted.clear()
            if await loop.run_in_executor(None, self._save_or_report):
                await asyncio.sleep(self.save_interval_ms / 1000)
            else:
                self._save_wanted.set()
                await asyncio.sleep(self.save_retry_ms / 1000)

    async def _tell_listeners(self) -> None:
        told: MetadataImage | None = None
        while True:
            await self._unheard.wait()
            self._unheard.clear()
            if self.image is told:
                continue  # already handed over (it was learned while the last call ran)
            told = self.image
            await self._notify()  # with the newest image: images learned meanwhile coalesce
            self._report_lag(self.lag.observe(now_ms=_now_ms(), applied=told.offset))

    def follow_leader(self, url: str | None, committed: int) -> None:
        """The heartbeats were last answered by the controller leader at `url`, which had committed
        `committed`. A long-poll asking another controller while this learner is behind that is
        held by a controller cut off or stopped (or one that lost its leadership), for up to
        its bound (the wait plus the slack, 7 s): it asks `url` now. New leaders and ISRs meanwhile
        reached the broker only after that bound."""
        if url is None or url == self.control.leader_url or committed <= self.image.offset:
            return
        log.info("metadata long-poll moves to the controller leader at %s (applied offset %d, committed %d)",
                 url, self.image.offset, committed, extra={"event": "metadata.follow_leader"})
        self.control.leader_url = url
        self.refresh_soon()

    def note_committed(self, offset: int) -> None:
        """The controller's committed offset learned elsewhere (heartbeat answers), so a lag
        shows while the metadata fetch itself is stuck."""
        if offset >= 0:
            self._report_lag(self.lag.observe(now_ms=_now_ms(), committed=offset))

    def _report_lag(self, report: LagReport | None) -> None:
        if report is None:
            return
        fields = {"applied": self.lag.applied, "committed": self.lag.committed, "records": report.records,
                  "duration_ms": report.duration_ms}
        if report.started:
            log.warning("metadata lags the controller: applied offset %d, committed %d (%d records behind for "
                        "%.1f s); per-partition work is holding it up", self.lag.applied, self.lag.committed,
                        report.records, report.duration_ms / 1000, extra={"event": "metadata.lagging", **fields})
        else:
            log.info("metadata caught up with the controller at offset %d after %.1f s behind", self.lag.applied,
                     report.duration_ms / 1000, extra={"event": "metadata.caught_up", **fields})

    async def _fetch(self, wait_ms: int):
        """One long-poll, cut short by refresh_soon(); None when cut short."""
        self._wake.clear()
        fetch = asyncio.ensure_future(self.control.fetch_metadata(after_offset=self.image.offset,
                                                                   wait_ms_max=wait_ms))
        if fetch.done() or wait_ms == 0:
            return await fetch
        woke = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait({fetch, woke}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            await cancel_and_wait(fetch, woke)  # run() stopped mid-poll: neither outlives it
            raise
        await cancel_and_wait(woke)
        if fetch.done():
            return fetch.result()
        for error in await cancel_and_wait(fetch):  # cut short by refresh_soon()
            if not isinstance(error, BiplaneError):
                raise error
        return None

    def _apply(self, batch) -> bool:
        if batch.image is not None:
            self.image = MetadataImage.from_dict(batch.image)
            log.info("metadata image replaced at offset %d", self.image.offset,
                     extra={"event": "metadata.image", "offset": self.image.offset})
            return True
        changed = False
        fresh = [(offset, record) for offset, record in batch.records if offset > self.image.offset]
        if not fresh:
            # An empty long-poll answer or a retried poll: the image object stays the same
            # (a new one would be a whole copy, and tell every cache keyed on it to rebuild).
            return False
        image = self.image.copy()
        for offset, record in fresh:
            if offset <= image.offset:
                continue  # repeated within the batch
            try:
                image.apply(parse_record(record), offset)
            except (RecordRejected, ValueError, AssertionError) as exc:
                # The controller only sends accepted records in order: our image has
                # drifted. Start over from the controller's whole image.
                log.warning("metadata record %d does not apply (%s); refetching everything", offset, exc,
                            extra={"event": "metadata.drift", "offset": offset})
                self.image = MetadataImage()
                return True
            changed = True
        self.image = image
        if changed:
            self.changed.set()
        return changed

    async def _notify(self) -> None:
        for listener in self._listeners:
            try:
                result = listener(self.image)
                if asyncio.iscoroutine(result):
                    await result
            except (OSError, BiplaneError) as exc:
                # A disk error while acting on metadata (opening a partition on a full disk):
                # not a reason to stop learning. The next image tries again.
                log.warning("acting on metadata at offset %d failed: %s", self.image.offset, exc,
                            extra={"event": "metadata.listener_failed", "offset": self.image.offset})


def _now_ms() -> int:
    return int(time.monotonic() * 1000)
