"""The broker's group coordinator driver (dataplane/groups/driver.py) over an in-memory
log and a stand-in for the broker's request handler: it loads a partition only once the
local replica leads with its epoch committed, answers COORDINATOR_LOAD_IN_PROGRESS until
then and NOT_COORDINATOR for partitions it does not lead, releases a commit's answer only
once its write is answered, reloads after a failed write, and a second coordinator over
the same log finds what the first stored."""
from __future__ import annotations

import asyncio
import dataclasses

from common.errors import ErrorCode
from common.metadata import MetadataImage
from common.wire import messages as wire
from dataplane.groups.driver import GroupCoordinator, OffsetsTopicSettings
from dataplane.groups.events import GroupConfig
from dataplane.groups.placement import OFFSETS_TOPIC, partition_for
from dataplane.log.memory import MemoryLog
from metadata_builders import add_topic, cluster

PARTITIONS = 2
# Groups that land on each partition of a 2-partition offsets topic.
GROUP_ON = {p: next(f"g{i}" for i in range(100) if partition_for(f"g{i}", PARTITIONS) == p) for p in (0, 1)}


@dataclasses.dataclass
class FakeReplica:
    leader_epoch: int = 0
    epoch_durable: bool = False
    high_watermark: int = 0
    epoch_start_offset: int = 0


class FakeDriver:
    def __init__(self, log: MemoryLog) -> None:
        self.log = log
        self.replica = FakeReplica()
        self.closed = False
        self.is_leader = True


class FakeRequests:
    """What the driver uses of the broker's RequestHandler. Produce appends to the log at
    once; its answer waits for `release` when `hold` is set."""

    def __init__(self, image: MetadataImage, drivers: dict[int, FakeDriver]) -> None:
        self._image = image
        self.drivers = drivers
        self.replicas = self
        self.hold = False
        self.held: list[tuple[asyncio.Future, int]] = []

    def image(self) -> MetadataImage:
        return self._image

    def get(self, topic: str, partition: int) -> FakeDriver | None:
        return self.drivers.get(partition) if topic == OFFSETS_TOPIC else None

    def refresh_metadata(self) -> None:
        pass

    def start_produce(self, request: wire.ProduceRequest, *, internal: bool = False) -> asyncio.Future:
        assert internal and request.acks == -1
        p = request.topics[0].partitions[0]
        driver = self.drivers[p.partition]
        driver.log.append_as_leader(bytes(p.records), leader_epoch=driver.replica.leader_epoch)
        done: asyncio.Future = asyncio.get_running_loop().create_future()
        if self.hold:
            self.held.append((done, p.partition))
        else:
            self._answer(done, p.partition, ErrorCode.NONE)
        return done

    def _answer(self, done: asyncio.Future, partition: int, code: ErrorCode) -> None:
        if code is ErrorCode.NONE:
            self.drivers[partition].replica.high_watermark = self.drivers[partition].log.log_end_offset
        done.set_result(wire.ProduceResponse(topics=(wire.ProduceTopicResponse(topic=OFFSETS_TOPIC, partitions=(
            wire.ProducePartitionResponse(partition=partition, error_code=code),)),)))

    def release(self, code: ErrorCode = ErrorCode.NONE) -> None:
        held, self.held = self.held, []
        self.hold = False
        for done, partition in held:
            self._answer(done, partition, code)


def image_with_offsets_topic() -> MetadataImage:
    image = cluster(2)
    add_topic(image, OFFSETS_TOPIC, [[1, 2], [2, 1]])   # broker 1 leads partition 0, broker 2 partition 1
    add_topic(image, "t", [[1, 2]])                      # the topic whose offsets are committed
    return image


def coordinator(requests: FakeRequests) -> GroupCoordinator:
    return GroupCoordinator(broker_id=1, requests=requests, control=None,  # type: ignore[arg-type]
                            config=GroupConfig(initial_rebalance_delay_ms=0, session_timeout_ms_min=10),
                            settings=OffsetsTopicSettings(partitions=PARTITIONS))


def commit(group: str, offset: int, topic: str = "t") -> wire.OffsetCommitRequest:
    return wire.OffsetCommitRequest(group_id=group, topics=(wire.OffsetCommitTopic(topic=topic, partitions=(
        wire.OffsetCommitPartition(partition=0, committed_offset=offset),)),))


async def fetched(groups: GroupCoordinator, group: str) -> object:
    answer = await groups.handle(wire.OffsetFetchRequest(group_id=group))
    assert isinstance(answer, wire.OffsetFetchResponse)
    if answer.error_code is not ErrorCode.NONE:
        return answer.error_code
    return [p.committed_offset for t in answer.topics for p in t.partitions]


async def until(check, what: str) -> None:
    for _ in range(200):
        if await check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never: {what}")


def test_load_waits_for_the_replica_then_serves_and_commits_wait_for_their_writes() -> None:
    async def run() -> None:
        log = MemoryLog()
        requests = FakeRequests(image_with_offsets_topic(), {0: FakeDriver(log)})
        groups = coordinator(requests)
        await groups.on_metadata(requests.image())
        mine, theirs = GROUP_ON[0], GROUP_ON[1]
        assert await fetched(groups, theirs) is ErrorCode.NOT_COORDINATOR
        await asyncio.sleep(0.1)
        assert await fetched(groups, mine) is ErrorCode.COORDINATOR_LOAD_IN_PROGRESS  # epoch not durable yet
        requests.drivers[0].replica.epoch_durable = True

        async def loaded() -> bool:
            return await fetched(groups, mine) == []
        await until(loaded, "partition 0 loaded")

        unknown = await groups.handle(commit(mine, 5, topic="no-such-topic"))
        assert unknown.topics[0].partitions[0].error_code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION

        requests.hold = True
        answer = asyncio.ensure_future(groups.handle(commit(mine, 5)))
        await asyncio.sleep(0.05)
        assert not answer.done(), "a commit is answered only once its write is"
        assert await fetched(groups, mine) == []   # not committed: not shown
        requests.release()
        done = await answer
        assert done.topics[0].partitions[0].error_code is ErrorCode.NONE
        assert await fetched(groups, mine) == [5]

        requests.hold = True
        failing = asyncio.ensure_future(groups.handle(commit(mine, 9)))
        await asyncio.sleep(0.05)
        requests.release(ErrorCode.NOT_ENOUGH_REPLICAS)
        assert (await failing).topics[0].partitions[0].error_code is ErrorCode.NOT_COORDINATOR
        # The failed write's records are in the log, not committed: they may commit later,
        # so the partition reloads only once the high watermark passes them.
        await asyncio.sleep(0.1)
        assert await fetched(groups, mine) is ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        requests.drivers[0].replica.high_watermark = log.log_end_offset   # they did commit after all

        async def reloaded() -> bool:
            return await fetched(groups, mine) == [9]
        await until(reloaded, "partition 0 reloaded after the failed write")
        await groups.close()
    asyncio.run(run())


def test_a_new_coordinator_loads_what_the_old_one_stored_and_losing_leadership_refuses() -> None:
    async def run() -> None:
        log = MemoryLog()
        requests = FakeRequests(image_with_offsets_topic(), {0: FakeDriver(log)})
        requests.drivers[0].replica.epoch_durable = True
        first = coordinator(requests)
        await first.on_metadata(requests.image())
        group = GROUP_ON[0]

        async def committed() -> bool:
            answer = await first.handle(commit(group, 42))
            return answer.topics[0].partitions[0].error_code is ErrorCode.NONE
        await until(committed, "the first coordinator accepts a commit")

        requests.hold = True
        pending = asyncio.ensure_future(first.handle(commit(group, 50)))
        await asyncio.sleep(0.05)
        # Leadership of partition 0 moves to broker 2: the waiting commit is refused.
        moved = cluster(2)
        add_topic(moved, OFFSETS_TOPIC, [[2, 1], [2, 1]])
        add_topic(moved, "t", [[1, 2]])
        requests._image = moved
        await first.on_metadata(moved)
        assert (await pending).topics[0].partitions[0].error_code is ErrorCode.NOT_COORDINATOR
        assert await fetched(first, group) is ErrorCode.NOT_COORDINATOR
        await first.close()

        # A fresh coordinator over the same log (records below the high watermark only).
        requests.hold = False
        requests.held.clear()
        requests._image = image_with_offsets_topic()
        second = coordinator(requests)
        await second.on_metadata(requests.image())

        async def loaded() -> bool:
            return await fetched(second, group) == [42]
        await until(loaded, "the second coordinator finds the acknowledged commit")
        await second.close()
    asyncio.run(run())


def test_the_coordinators_clock_does_not_follow_a_wall_clock_step(monkeypatch) -> None:
    """Claim: a wall clock stepped forward an hour and set right again moves the coordinators'
    clock by neither. Held at its last reading, it kept every session and rebalance deadline
    still for that hour (a dead member never left its group)."""
    import time as real_time

    from dataplane.groups import driver as driver_module
    from stepped_clock import SteppedClock

    clock = SteppedClock()
    monkeypatch.setattr(driver_module, "time", clock)
    coord = GroupCoordinator(broker_id=1, requests=None, control=None,  # type: ignore[arg-type]
                             config=GroupConfig(), settings=OffsetsTopicSettings(partitions=PARTITIONS))
    start = coord.now_ms()
    assert abs(start - real_time.time_ns() // 1_000_000) < 1000   # wall-clock time as of its start
    clock.step_s = 3600.0
    stepped = coord.now_ms()
    assert stepped - start < 1000
    clock.step_s = 0.0
    real_time.sleep(0.05)
    assert coord.now_ms() - stepped >= 50   # still moving after the clock was set right


def test_a_deleted_topic_drops_its_offsets_but_an_empty_or_older_image_deletes_nothing() -> None:
    """The driver tells its cores of a topic whose name left the metadata or came back with a new
    id. The empty image a broker's learner starts over from after a drift, and an image older than
    one already seen, delete nothing: taken as deletions they tombstoned every group's offsets."""
    from common.metadata import DeleteTopic
    from metadata_builders import apply

    async def run() -> None:
        log = MemoryLog()
        requests = FakeRequests(image_with_offsets_topic(), {0: FakeDriver(log)})
        requests.drivers[0].replica.epoch_durable = True
        groups = coordinator(requests)
        await groups.on_metadata(requests.image())
        mine = GROUP_ON[0]

        async def loaded() -> bool:
            return await fetched(groups, mine) == []
        await until(loaded, "partition 0 loaded")
        assert (await groups.handle(commit(mine, 5))).topics[0].partitions[0].error_code is ErrorCode.NONE
        before = requests.image()
        await groups.on_metadata(MetadataImage())   # a learner starting over (the partition unloads)
        await groups.on_metadata(before)

        async def kept() -> bool:
            return await fetched(groups, mine) == [5]
        await until(kept, "partition 0 loaded again, its offsets kept")
        newer = apply(before.copy(), [DeleteTopic(name="t", topic_id=before.topics["t"].topic_id)])
        await groups.on_metadata(newer)
        await groups.on_metadata(before)             # older than one seen: ignored
        assert await fetched(groups, mine) == []
        await groups.close()
    asyncio.run(run())
