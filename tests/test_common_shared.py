"""The pieces every process shares: one epoch comparison, one TopicPartition, one atomic
write, one way to stop tasks, one error hierarchy."""
from common.epochs import EpochCheck, check_epoch, leader_epoch_error
from common.errors import ErrorCode


def test_leader_epoch_error_answers_each_comparison():
    """Claim: a requester's older leader epoch is fenced, a newer one unknown, the same one fine."""
    assert leader_epoch_error(check_epoch(theirs=3, ours=4)) is ErrorCode.FENCED_LEADER_EPOCH
    assert leader_epoch_error(check_epoch(theirs=4, ours=4)) is ErrorCode.NONE
    assert leader_epoch_error(check_epoch(theirs=5, ours=4)) is ErrorCode.UNKNOWN_LEADER_EPOCH


def test_the_epoch_comparison_has_one_module():
    """Claim: the replica core fences with common.epochs, and the old re-export is gone,
    so there is one enum."""
    import importlib.util

    from dataplane.replica import admission, core, push
    assert core.EpochCheck is EpochCheck and core.check_epoch is check_epoch
    assert push.check_epoch is check_epoch and admission.check_epoch is check_epoch
    assert importlib.util.find_spec("dataplane.replica.fencing") is None


def test_topic_partition_is_one_class_and_equals_the_plain_pair():
    """Claim: the SDK's TopicPartition is common's, and it keys a dict like ("t", 0)."""
    from common.topic_partition import TopicPartition
    from dataplane.client import TopicPartition as ClientTopicPartition
    assert ClientTopicPartition is TopicPartition
    assert {("t", 0): 1}[TopicPartition("t", 0)] == 1 and str(TopicPartition("t", 0)) == "t[0]"


def test_write_atomically_replaces_whole_and_keeps_a_secret_private(tmp_path):
    """Claim: the atomic write leaves the new content, no temporary file, and a mode of
    0o600 even over a leftover world-readable temporary file."""
    import os
    import stat

    from common.durable import temp_path, write_atomically
    path = tmp_path / "state.json"
    write_atomically(path, b"old")
    with open(temp_path(path), "wb") as leftover:
        leftover.write(b"half")
    os.chmod(temp_path(path), 0o644)
    write_atomically(path, b"new", mode=0o600)
    assert path.read_bytes() == b"new" and not os.path.exists(temp_path(path))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_write_atomically_leaves_the_old_file_when_the_write_fails(tmp_path):
    """Claim: an I/O error removes the temporary file and leaves the old content."""
    import os

    import pytest

    from common import durable
    path = tmp_path / "f"
    durable.write_atomically(path, b"old")

    def broken(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")
    original = durable.replace_durably
    durable.replace_durably = broken
    try:
        with pytest.raises(OSError):
            durable.write_atomically(path, b"new")
    finally:
        durable.replace_durably = original
    assert path.read_bytes() == b"old" and not os.path.exists(durable.temp_path(path))


def test_cancel_and_wait_returns_after_every_finally_ran():
    """Claim: cancel_and_wait returns only once each task has ended (its finally ran), skips
    None and finished tasks, and returns the exceptions tasks ended with, cancellation aside."""
    import asyncio

    from common.tasks import TaskOwner, cancel_and_wait
    cleaned = []

    async def slow_cleanup(name: str) -> None:
        try:
            await asyncio.sleep(60)
        finally:
            await asyncio.sleep(0.01)
            cleaned.append(name)

    async def fails() -> None:
        raise ValueError("boom")

    async def main() -> None:
        owner = TaskOwner()
        a = owner.spawn(slow_cleanup("a"))
        b = asyncio.get_running_loop().create_task(slow_cleanup("b"))
        bad = owner.spawn(fails())
        await asyncio.sleep(0)
        errors = await cancel_and_wait(a, b, None, bad)
        assert sorted(cleaned) == ["a", "b"] and [type(e) for e in errors] == [ValueError]
        assert len(owner) == 0   # ended tasks leave the owner
        owner.spawn(slow_cleanup("c"))
        await asyncio.sleep(0)
        assert await owner.cancel_and_wait() == [] and cleaned[-1] == "c"

    asyncio.run(main())


def test_task_owner_wait_lets_tasks_finish():
    """Claim: TaskOwner.wait cancels nothing: a task spawned just before still runs its whole
    body, and the exceptions tasks ended with are returned."""
    import asyncio

    from common.tasks import TaskOwner
    closed = []

    async def close(name: str) -> None:
        await asyncio.sleep(0.01)
        closed.append(name)

    async def fails() -> None:
        raise ValueError("boom")

    async def main() -> None:
        owner = TaskOwner()
        owner.spawn(close("x"))
        owner.spawn(fails())
        errors = await owner.wait()
        assert closed == ["x"] and [type(e) for e in errors] == [ValueError] and len(owner) == 0

    asyncio.run(main())


def test_one_error_hierarchy_that_every_old_module_names():
    """Claim: each error class is defined once, in common.errors; the log, wire, SDK, control
    client and controller modules name the same classes, and there is one StaleEpochError."""
    import importlib.util

    import common.control_client as control_client
    import common.errors as errors
    import common.wire as wire
    import controller.service as controller_service
    import controller.snapshot_service as snapshot_service
    import dataplane.client as client
    import dataplane.client.errors as client_errors
    import dataplane.log as log
    for module in (client_errors, log, wire, client):
        for name in dir(module):
            thing = getattr(module, name)
            if isinstance(thing, type) and issubclass(thing, BaseException) and name.endswith("Error"):
                assert thing.__module__ == "common.errors" and getattr(errors, name) is thing, name
    for module in (control_client, controller_service, snapshot_service):  # these also name pydantic's
        for name in dir(module):
            thing = getattr(module, name)
            if isinstance(thing, type) and issubclass(thing, errors.BiplaneError):
                assert thing.__module__ == "common.errors" and getattr(errors, name) is thing, name
    assert log.StaleEpochError is errors.StaleEpochError
    assert importlib.util.find_spec("common.metadata.errors") is None  # the old look-alike module is gone


def test_stale_epoch_error_names_both_epochs_for_the_controller_and_the_log():
    """Claim: the one StaleEpochError carries field, ours and theirs; made without a message it
    says what to do; the log's is still an InvalidRequestError (a refused append)."""
    from common.errors import ErrorCode, InvalidRequestError, StaleEpochError
    from dataplane.log.epoch_cache import EpochCache

    exc = StaleEpochError(field="partition_epoch", expected=4, actual=3, what="ISR change for t-0",
                          code=ErrorCode.INVALID_UPDATE_VERSION)
    assert str(exc) == ("ISR change for t-0: partition_epoch 3 is not current (current is 4); "
                        "refresh metadata and retry")
    assert exc.code is ErrorCode.INVALID_UPDATE_VERSION and (exc.expected, exc.actual) == (4, 3)
    cache = EpochCache()
    cache.assign(5, 0)
    try:
        cache.check_epoch(4)
    except StaleEpochError as refused:
        assert isinstance(refused, InvalidRequestError)
        assert (refused.field, refused.expected, refused.actual) == ("leader_epoch", 5, 4)
        assert refused.code is ErrorCode.FENCED_LEADER_EPOCH
    else:
        raise AssertionError("an older epoch was not refused")
