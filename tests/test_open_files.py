"""The open-file limit: a broker raises its soft limit to the hard one at start (two files per
replica: the soft default of 1,024 would stop it at about 500), and a replica that cannot be
opened for want of file descriptors says so with the numbers and what to do."""
from __future__ import annotations

import asyncio
import errno
import logging
import resource
import subprocess
import sys

from common import fds
from dataplane.broker import replicas as replicas_module
from metadata_builders import add_topic, cluster
from test_replica_manager_opening import _manager


def test_the_soft_limit_is_raised_to_the_hard_one():
    code = ("import resource; from common import fds\n"
            "resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))\n"
            "print(*fds.raise_soft_limit(), resource.getrlimit(resource.RLIMIT_NOFILE)[1])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    soft, hard, real_hard = map(int, out)
    assert soft == hard == real_hard and soft > 256


def test_an_open_that_runs_out_of_file_descriptors_says_what_to_do(tmp_path, monkeypatch, caplog):
    def no_descriptors(directory, topic_id, *rest):
        raise OSError(errno.EMFILE, "Too many open files")
    monkeypatch.setattr(replicas_module, "_prepare_dir", no_descriptors)
    image = cluster(1)
    add_topic(image, "t", [[1]], min_insync_replicas=1)

    async def scenario():
        manager = _manager(tmp_path)
        try:
            await manager.on_metadata(image)
            await manager.settled()
            return dict(manager.open_failures)
        finally:
            await manager.close()

    with caplog.at_level(logging.ERROR, logger="biplane.broker.replicas"):
        failures = asyncio.run(scenario())
    assert ("t", 0) in failures, "the open is tried again later (offline recovery)"
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    message = " ".join(r.getMessage() for r in caplog.records)
    assert "Too many open files" in message and f"may hold {soft} open files" in message
    assert "ulimit -n" in message and "LimitNOFILE=" in message, message


def test_an_emfile_raised_under_a_storage_error_is_told_apart():
    from common.errors import StorageError
    try:
        try:
            raise OSError(errno.EMFILE, "Too many open files")
        except OSError as inner:
            raise StorageError("cannot open the segment") from inner
    except StorageError as outer:
        assert fds.too_many_open_files(outer)
    assert not fds.too_many_open_files(OSError(errno.ENOSPC, "No space left on device"))
