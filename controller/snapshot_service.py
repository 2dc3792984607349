"""Snapshots for the controller leader: a periodic writer and the HTTP routes.

`Snapshotter` owns the when (every `snapshot_interval_ms`, and on demand) and
hands the what to `SnapshotStore`. The image is flattened to rows on the
event loop (where the controller changes it); the blocking file write runs in
a worker thread.
Only the leader writes: a follower's image may lag, and two writers would
double the history.

    snapshotter = Snapshotter(store=SnapshotStore(dir), image_getter=lambda: image,
                              usage_getter=lambda: usage, controller_id=1,
                              is_leader=lambda: node.is_leader)
    add_snapshot_routes(app, lambda: snapshotter)   # POST/GET /v1/snapshots (make_app does this)
    snapshotter.start()  ...  await snapshotter.stop()
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web

from common import api_models
from common.errors import ErrorCode, InvalidRequestError, NotSnapshotLeaderError
from common.tasks import cancel_and_wait
from common.usage import BrokerUsage
from controller.http_edge import error_response
from controller.openapi import Operation, mount
from controller.snapshots import SnapshotInfo, SnapshotStore, rows_from_image

log = logging.getLogger(__name__)

SNAPSHOT_INTERVAL_MS_DEFAULT = 60_000


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


def next_snapshot_due_ms(last_taken_ms: int | None, started_ms: int, snapshot_interval_ms: int) -> int:
    """When the next periodic snapshot is due: one interval after the last one taken
    (periodic or on demand), or after start when none was taken yet."""
    return (started_ms if last_taken_ms is None else last_taken_ms) + snapshot_interval_ms


class Snapshotter:
    def __init__(
        self,
        *,
        store: SnapshotStore,
        image_getter: Callable[[], Any],
        usage_getter: Callable[[], Mapping[int, BrokerUsage]],
        controller_id: int | None,
        is_leader: Callable[[], bool] = lambda: True,
        snapshot_interval_ms: int = SNAPSHOT_INTERVAL_MS_DEFAULT,
        clock_ms: Callable[[], int] = wall_clock_ms,
        wake_ms_max: int = 1000,
    ) -> None:
        if snapshot_interval_ms < 1:
            raise InvalidRequestError(f"snapshot_interval_ms must be >= 1, got {snapshot_interval_ms}")
        self.store = store
        self._image_getter = image_getter
        self._usage_getter = usage_getter
        self._controller_id = controller_id
        self._is_leader = is_leader
        self.snapshot_interval_ms = snapshot_interval_ms
        self._clock_ms = clock_ms
        # The loop re-reads the clock at least this often, so a clock that jumps
        # (or a test's manual clock) is noticed without waiting a whole interval.
        self.wake_ms_max = wake_ms_max
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._last_taken_ms: int | None = None

    async def take(self) -> SnapshotInfo:
        """Write one snapshot now. Raises NotSnapshotLeaderError on a follower."""
        if not self._is_leader():
            raise NotSnapshotLeaderError("only the controller leader writes snapshots; ask the leader")
        async with self._lock:
            now_ms = self._clock_ms()
            # Flatten here, on the loop that owns the image, so a record applied
            # meanwhile cannot tear the snapshot; only plain rows cross to the thread.
            rows = rows_from_image(self._image_getter(), dict(self._usage_getter()), now_ms, self._controller_id)
            info = await asyncio.to_thread(self.store.write_rows, rows, now_ms=now_ms)
            self._last_taken_ms = now_ms
            return info

    def list(self) -> list[SnapshotInfo]:
        return self.store.list()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="snapshotter")

    async def stop(self) -> None:
        task, self._task = self._task, None
        errors = await cancel_and_wait(task)
        if errors:
            raise errors[0]  # the snapshot loop had failed

    async def _run(self) -> None:
        started_ms = self._clock_ms()
        while True:
            due_ms = next_snapshot_due_ms(self._last_taken_ms, started_ms, self.snapshot_interval_ms)
            wait_ms = due_ms - self._clock_ms()
            if wait_ms > 0:
                await asyncio.sleep(min(wait_ms, self.wake_ms_max) / 1000)
                continue  # an on-demand snapshot may have moved the due time meanwhile
            if not self._is_leader():
                # Followers keep the cadence without writing, so a new leader starts on time.
                self._last_taken_ms = self._clock_ms()
                continue
            try:
                await self.take()
            except NotSnapshotLeaderError:
                continue
            except Exception:
                # A full disk or a bad image must not stop the controller; try next interval.
                log.exception("periodic snapshot failed; retrying in %d ms", self.snapshot_interval_ms)
                self._last_taken_ms = self._clock_ms()


SnapshotterGetter = Callable[[], "Snapshotter | None"]
SNAPSHOTTER_KEY: web.AppKey[SnapshotterGetter] = web.AppKey("snapshotter")


def _snapshotter(request: web.Request) -> Snapshotter | None:
    getter = request.app.get(SNAPSHOTTER_KEY)
    return getter() if getter is not None else None


def _not_configured() -> web.Response:
    return error_response(503, ErrorCode.NOT_CONTROLLER, "snapshots are not configured on this controller")


async def post_snapshot(request: web.Request) -> web.Response:
    snapshotter = _snapshotter(request)
    if snapshotter is None:
        return _not_configured()
    try:
        info = await snapshotter.take()
    except NotSnapshotLeaderError as exc:
        return error_response(503, exc.code, str(exc))
    except OSError as exc:
        return error_response(500, ErrorCode.KAFKA_STORAGE_ERROR, f"could not write the snapshot file: {exc}")
    return web.json_response(info.to_json(), status=201)


async def get_snapshots(request: web.Request) -> web.Response:
    snapshotter = _snapshotter(request)
    if snapshotter is None:
        return _not_configured()
    infos = await asyncio.to_thread(snapshotter.list)
    return web.json_response({"snapshots": [info.to_json() for info in infos]})


# A write on a follower is redirected to the leader by the admin API's middleware; the
# list too, since the files live on the leader that wrote them.
OPERATIONS = [
    Operation(method="POST", path="/v1/snapshots", summary="take a metadata snapshot now", handler=post_snapshot,
              response=api_models.SnapshotInfo, status=201, writes=True, commits=False, unavailable=True,
              storage_error=True),
    Operation(method="GET", path="/v1/snapshots", summary="the snapshots this leader has written",
              handler=get_snapshots, response=api_models.SnapshotList, leader_only=True, unavailable=True),
]


def add_snapshot_routes(app: web.Application, snapshotter_getter: Callable[[], Snapshotter | None]) -> None:
    """Register POST /v1/snapshots (take one now) and GET /v1/snapshots (list) on `app`.

    `snapshotter_getter` returns the node's Snapshotter, or None while it has none.
    """
    app[SNAPSHOTTER_KEY] = snapshotter_getter
    mount(app, OPERATIONS)
