"""The open-file limit: a broker holds a descriptor per replica (its active segment), so
thousands of partitions need thousands of descriptors.

`raise_soft_limit` lifts the soft RLIMIT_NOFILE to the hard one at start (as Go programs do
by default): the soft default of many systems, 1,024, would stop a broker at about 1,000
replicas, while the hard limit is the operator's word. `too_many_open_files` turns EMFILE into
an error message a user can act on."""
from __future__ import annotations

import errno
import resource

# Descriptors one open replica holds: its active segment (a broker's replicas lock their
# directories in-process, under the data directory's lock: dataplane/log/lock.py).
FDS_PER_REPLICA = 1


def raise_soft_limit() -> tuple[int, int]:
    """Set the soft open-file limit to the hard one; returns (soft, hard) as they are now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            pass   # left as it was: the hint below says what to do
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft, hard


def too_many_open_files(exc: BaseException | None) -> bool:
    """Whether `exc`, or an error it was raised from, is EMFILE or ENFILE."""
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def open_files_hint(replicas_open: int) -> str:
    """What to do when opening a file failed with EMFILE, with the numbers that matter."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return (f"the process may hold {soft} open files (hard limit {hard}) and {replicas_open} replicas are "
            f"open here, {FDS_PER_REPLICA} files each, besides its connections: raise the limit "
            f"(`ulimit -n` before starting the broker, LimitNOFILE= in a systemd unit) to at least "
            f"{FDS_PER_REPLICA * (replicas_open + 1000)}, or host fewer partitions on this broker")
