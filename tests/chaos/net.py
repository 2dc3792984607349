"""Network namespaces for one run: a hub namespace holding a bridge (and the harness's own
workload), one namespace per controller and broker, each with a veth on the bridge and its
own address. Addresses are taken from 127.0.0.0/8 (`route_localnet` lets them travel over the
veths), so no packet of a run is ever addressed outside loopback, and nothing is added to the
namespace the harness was started in.

Faults, all in the kernel's own paths:
- `cut((src, dst), ...)`: dst's namespace drops, on input, every packet from src (a silent drop: the
  sender sees timeouts, as in a real partition, not the EPERM an output drop would give it);
- `loss(x, percent)`: every other namespace drops that share of x's packets on input
  (nftables `numgen random`);
- `duplicate(x, percent)`: x's namespace sends that share of its packets twice (nftables
  `dup`, postrouting);
- `delay(x, ms, jitter)`: tc netem on x's link when the kernel has netem; otherwise (some
  kernels are built without it) a tbf rate limit on x's link, which delays by queueing, and
  the fault's note says so.
`heal_all()` removes every rule and qdisc the faults added.
"""
from __future__ import annotations

import ctypes
import dataclasses
import os
import subprocess

CLONE_NEWNET = 0x40000000
COMMAND_TIMEOUT_S = 10.0
NFT_TABLE = "biplane_chaos"
NFT_DUP_TABLE = "biplane_chaos_dup"
THROTTLE_RATE = "256kbit"


class NetError(Exception):
    pass


def run(args: list[str], *, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        done = subprocess.run(args, input=stdin, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    except FileNotFoundError as exc:
        raise NetError(f"{args[0]} is not installed ({exc}); run scripts/system-deps.sh as root") from None
    except subprocess.TimeoutExpired:
        raise NetError(f"{' '.join(args)} did not finish within {COMMAND_TIMEOUT_S:.0f} s") from None
    if check and done.returncode != 0:
        raise NetError(f"{' '.join(args)} failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}")
    return done


@dataclasses.dataclass(frozen=True, kw_only=True)
class Endpoint:
    name: str          # "c1", "b2", "hub"
    netns: str
    address: str


class Network:
    """Namespaces and links of one run. `create()` then `destroy()` (idempotent, best effort)."""

    def __init__(self, *, run_id: str, node_names: list[str], subnet_octet: int) -> None:
        if not 1 <= subnet_octet <= 254:
            raise ValueError(f"subnet_octet={subnet_octet} must be in 1..254")
        self.run_id = run_id
        self.prefix = f"127.211.{subnet_octet}"
        self.hub = Endpoint(name="hub", netns=f"bpc{run_id}-hub", address=f"{self.prefix}.1")
        self.nodes: dict[str, Endpoint] = {}
        for i, name in enumerate(node_names):
            octet = (11 if name.startswith("c") else 21) + int(name[1:]) - 1
            self.nodes[name] = Endpoint(name=name, netns=f"bpc{run_id}-{name}", address=f"{self.prefix}.{octet}")
        self.created: list[str] = []     # namespaces, in creation order
        self.dirty: set[str] = set()      # namespaces ("hub", "b1"...) holding fault rules
        self.shaped: set[str] = set()     # namespaces with a qdisc on eth0
        self.has_netem: bool | None = None

    @property
    def namespaces(self) -> list[str]:
        return [self.hub.netns, *(e.netns for e in self.nodes.values())]

    def _add_ns(self, netns: str) -> None:
        run(["ip", "netns", "add", netns])
        self.created.append(netns)
        run(["ip", "-n", netns, "link", "set", "lo", "up"])

    @staticmethod
    def _localnet(netns: str, dev: str) -> None:
        for d in ("all", dev):
            run(["ip", "netns", "exec", netns, "sysctl", "-qw", f"net.ipv4.conf.{d}.route_localnet=1"])

    def create(self) -> None:
        hub = self.hub.netns
        self._add_ns(hub)
        run(["ip", "-n", hub, "link", "add", "br0", "type", "bridge"])
        run(["ip", "-n", hub, "link", "set", "br0", "up"])
        run(["ip", "-n", hub, "addr", "add", f"{self.hub.address}/24", "dev", "br0"])
        self._localnet(hub, "br0")
        for name, ep in self.nodes.items():
            self._add_ns(ep.netns)
            # veth names are short and unique per run; both ends leave this namespace at once.
            inner, outer = f"bpc{self.run_id}{name}i", f"bpc{self.run_id}{name}o"
            run(["ip", "link", "add", inner, "netns", ep.netns, "type", "veth", "peer", "name", outer,
                 "netns", hub])
            run(["ip", "-n", ep.netns, "link", "set", inner, "name", "eth0"])
            run(["ip", "-n", ep.netns, "addr", "add", f"{ep.address}/24", "dev", "eth0"])
            run(["ip", "-n", ep.netns, "link", "set", "eth0", "up"])
            run(["ip", "-n", hub, "link", "set", outer, "master", "br0", "up"])
            self._localnet(ep.netns, "eth0")
            self._tables(ep.netns, dup=True)
        self._tables(hub, dup=False)

    @staticmethod
    def _tables(netns: str, *, dup: bool) -> None:
        rules = (f"table inet {NFT_TABLE} {{\n"
                 f"  chain input {{ type filter hook input priority 0; policy accept; }}\n"
                 f"}}\n")
        if dup:
            rules += (f"table ip {NFT_DUP_TABLE} {{\n"
                      f"  chain postrouting {{ type filter hook postrouting priority 0; policy accept; }}\n"
                      f"}}\n")
        run(["ip", "netns", "exec", netns, "nft", "-f", "-"], stdin=rules)

    def destroy(self) -> list[str]:
        """Delete every namespace this run made (their veths go with them). Returns problems."""
        problems = []
        for netns in reversed(self.created):
            done = run(["ip", "netns", "del", netns], check=False)
            if done.returncode != 0 and "No such file" not in done.stderr:
                problems.append(f"ip netns del {netns}: {done.stderr.strip()}")
        self.created.clear()
        return problems

    def enter_hub(self) -> None:
        """Move this (still single-threaded) process into the hub namespace: the workload's
        sockets then live there, next to the bridge."""
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(f"/var/run/netns/{self.hub.netns}", os.O_RDONLY)
        try:
            if libc.setns(fd, CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise NetError(f"setns into {self.hub.netns} failed: {os.strerror(err)}")
        finally:
            os.close(fd)

    # ------------------------------------------------------------------ faults

    def _endpoint(self, name: str) -> Endpoint:
        return self.hub if name == "hub" else self.nodes[name]

    def _nft(self, rules: dict[str, list[str]]) -> None:
        """Add each namespace's rules in one `nft -f -` (one transaction there): a partition of
        two processes from six is 16 rules in 6 namespaces, so 6 processes to start, not 16,
        and the fault is half in place for a shorter time."""
        for name, lines in rules.items():
            run(["ip", "netns", "exec", self._endpoint(name).netns, "nft", "-f", "-"],
                stdin="".join(f"{line}\n" for line in lines))
            self.dirty.add(name)

    def cut(self, *pairs: tuple[str, str]) -> None:
        """For each (src, dst): drop every packet src sends to dst ("hub" is the harness's clients)."""
        rules: dict[str, list[str]] = {}
        for src, dst in pairs:
            rules.setdefault(dst, []).append(
                f"add rule inet {NFT_TABLE} input ip saddr {self._endpoint(src).address} drop")
        self._nft(rules)

    def loss(self, name: str, percent: int) -> None:
        self._nft({other: [f"add rule inet {NFT_TABLE} input ip saddr {self.nodes[name].address} "
                           f"numgen random mod 100 < {percent} drop"]
                   for other in ["hub", *self.nodes] if other != name})

    def duplicate(self, name: str, percent: int) -> None:
        self._nft({name: [f"add rule ip {NFT_DUP_TABLE} postrouting ip daddr {self.prefix}.0/24 "
                          f"numgen random mod 100 < {percent} dup to ip daddr device eth0"]})

    def delay(self, name: str, delay_ms: int, jitter_ms: int) -> str:
        netns = self.nodes[name].netns
        self.shaped.add(name)
        if self.has_netem is None:
            probe = run(["tc", "-n", netns, "qdisc", "replace", "dev", "eth0", "root", "netem", "delay", "1ms"],
                        check=False)
            self.has_netem = probe.returncode == 0
        if self.has_netem:
            run(["tc", "-n", netns, "qdisc", "replace", "dev", "eth0", "root", "netem", "delay", f"{delay_ms}ms",
                 f"{jitter_ms}ms"])
            return f"netem delay {delay_ms}ms {jitter_ms}ms"
        run(["tc", "-n", netns, "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate", THROTTLE_RATE,
             "burst", "8kb", "latency", f"{max(50, 3 * delay_ms)}ms"])
        return f"no netem in this kernel: tbf rate {THROTTLE_RATE} latency {max(50, 3 * delay_ms)}ms"

    def heal_all(self) -> None:
        for name in sorted(self.dirty):
            flush = [f"flush chain inet {NFT_TABLE} input\n"]
            if name != "hub":
                flush.append(f"flush chain ip {NFT_DUP_TABLE} postrouting\n")
            run(["ip", "netns", "exec", self._endpoint(name).netns, "nft", "-f", "-"], stdin="".join(flush))
        self.dirty.clear()
        for name in sorted(self.shaped):
            run(["tc", "-n", self.nodes[name].netns, "qdisc", "del", "dev", "eth0", "root"], check=False)
        self.shaped.clear()


def leftover_namespaces(prefix: str = "bpc") -> list[str]:
    done = run(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in done.stdout.splitlines() if line.startswith(prefix)]
