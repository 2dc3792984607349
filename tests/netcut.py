"""Directed network cuts between the processes of a process test, on loopback, in a network
namespace of the test's own.

`private_netns()` moves the calling thread (and so every process it then starts) into a new
network namespace with only `lo`, and back at its end: the nftables rules a test adds live and
die there, out of every other process's way. Every process started through `launch_prefix(name)`
joins a cgroup (v2) of its own before it runs, so its sockets carry the cgroup; `Cuts` then
drops packets by (sending process, receiving process), which ports alone cannot tell apart on
one address (a broker's connection to a peer and a client's connection to that peer share the
peer's port):

- on output, a packet from a socket of process i is marked i;
- on input, a packet marked i is dropped when the receiving socket is process j's (`cut(i, j)`):
  a silent drop, so the sender sees a timeout, as in a real partition.

Needs root, cgroup v2 (`/sys/fs/cgroup` or its hybrid `unified` mount) and nft; `available()`
says why not, for a skip.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Iterator

CLONE_NEWNET = 0x40000000
TABLE = "biplane_netcut"


def _cgroup2_root() -> tuple[Path, str] | None:
    """The cgroup v2 mount and its path relative to /sys/fs/cgroup (what nft names paths by)."""
    for root, relative in ((Path("/sys/fs/cgroup"), ""), (Path("/sys/fs/cgroup/unified"), "unified/")):
        if (root / "cgroup.procs").exists() and (root / "cgroup.subtree_control").exists():
            return root, relative
    return None


def available() -> str | None:
    """None when cuts can be made here; otherwise why not."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, cgroups, nftables)"
    if shutil.which("nft") is None or shutil.which("ip") is None:
        return "needs nft and ip (scripts/system-deps.sh)"
    if _cgroup2_root() is None:
        return "needs a cgroup v2 mount at /sys/fs/cgroup or /sys/fs/cgroup/unified"
    return None


def _run(args: list[str], stdin: str | None = None) -> None:
    done = subprocess.run(args, input=stdin, capture_output=True, text=True, timeout=10)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")


@contextlib.contextmanager
def private_netns() -> Iterator[None]:
    """The calling thread in a fresh network namespace (loopback up) until the block ends."""
    libc = ctypes.CDLL(None, use_errno=True)
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        if libc.unshare(CLONE_NEWNET) != 0:
            raise RuntimeError(f"unshare(CLONE_NEWNET) failed: {os.strerror(ctypes.get_errno())}")
        try:
            _run(["ip", "link", "set", "lo", "up"])
            yield
        finally:
            if libc.setns(home, CLONE_NEWNET) != 0:
                raise RuntimeError(f"setns back failed: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(home)


class Cuts:
    """cgroups for named processes and the nftables table that cuts paths between them."""

    def __init__(self, names: list[str]) -> None:
        found = _cgroup2_root()
        assert found is not None, available()
        self.root, self.relative = found
        self.tag = f"biplane-netcut-{os.getpid()}"
        self.marks = {name: i + 1 for i, name in enumerate(names)}
        self.cut_pairs: set[tuple[str, str]] = set()
        for name in names:
            (self.root / self._group(name)).mkdir(exist_ok=True)
        self._load()

    def _group(self, name: str) -> str:
        return f"{self.tag}-{name}"

    def launch_prefix(self, name: str) -> list[str]:
        """Prepend to a command: it joins `name`'s cgroup, then execs (the pid stays the same)."""
        procs = self.root / self._group(name) / "cgroup.procs"
        return ["sh", "-c", f'echo $$ > {procs} && exec "$@"', "sh"]

    def _load(self) -> None:
        lines = [f"table inet {TABLE} {{",
                 "  chain output { type filter hook output priority 0; policy accept;"]
        for name, mark in self.marks.items():
            lines.append(f'    socket cgroupv2 level 1 "{self.relative}{self._group(name)}" meta mark set {mark}')
        lines += ["  }", "  chain input { type filter hook input priority 0; policy accept;"]
        for src, dst in sorted(self.cut_pairs):
            lines.append(f'    meta mark {self.marks[src]} socket cgroupv2 level 1 '
                         f'"{self.relative}{self._group(dst)}" drop')
        lines += ["  }", "}"]
        _run(["nft", "-f", "-"], stdin=f"table inet {TABLE}\ndelete table inet {TABLE}\n" + "\n".join(lines) + "\n")

    def cut(self, src: str, dst: str) -> None:
        """Drop every packet src's sockets send to dst's sockets (one way)."""
        self.cut_pairs.add((src, dst))
        self._load()

    def cut_both(self, a: str, b: str) -> None:
        self.cut_pairs |= {(a, b), (b, a)}
        self._load()

    def heal(self) -> None:
        self.cut_pairs.clear()
        self._load()

    def close(self) -> None:
        """Remove the table and the cgroups (once the processes in them are gone)."""
        subprocess.run(["nft", "delete", "table", "inet", TABLE], capture_output=True, timeout=10)
        for name in self.marks:
            path = self.root / self._group(name)
            for _ in range(50):
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)   # a killed process leaves its cgroup a moment later
