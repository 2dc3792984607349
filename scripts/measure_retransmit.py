#!/usr/bin/env python3
"""How long after a network cut heals a connection with a request out is answered, with the
kernel's retransmission cap and with the one every wire connection sets
(common/wire/stream.cap_retransmit_interval, TCP_RTO_MAX_MS: Linux 6.15+).

Needs root (or CAP_NET_ADMIN), `unshare` and `nft`. Each measurement runs in a network
namespace of its own (`unshare -n`), so nothing outside it is touched: a client and a server
on its loopback exchange a byte, nftables drops the connection's packets, the client sends a
byte, and after `--cuts` seconds the rule goes. Prints one line per cut and cap, alternating
the two, and the medians.

    sudo .venv/bin/python scripts/measure_retransmit.py --cuts 2,4,8 --rounds 3
"""
from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _one(cut_s: float, capped: bool) -> float:
    """Inside the namespace: seconds from the heal to the answer."""
    sys.path.insert(0, REPO)
    from common.wire.stream import cap_retransmit_interval

    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def serve() -> None:
        conn, _ = server.accept()
        if capped:
            cap_retransmit_interval(conn)
        while data := conn.recv(64):
            conn.sendall(data)
    threading.Thread(target=serve, daemon=True).start()
    client = socket.create_connection(("127.0.0.1", port))
    if capped and not cap_retransmit_interval(client):
        raise SystemExit("this kernel has no TCP_RTO_MAX_MS (Linux 6.15+): nothing to compare")
    client.sendall(b"a")
    client.recv(1)
    rules = (f"add table inet cut; add chain inet cut in {{ type filter hook input priority 0; }}; "
             f"add rule inet cut in tcp dport {port} drop; add rule inet cut in tcp sport {port} drop")
    subprocess.run(["nft", rules], check=True)
    client.sendall(b"b")
    time.sleep(cut_s)
    subprocess.run(["nft", "delete table inet cut"], check=True)
    healed = time.monotonic()
    client.settimeout(cut_s + 130)
    client.recv(1)
    return time.monotonic() - healed


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cuts", default="2,4,8", help="cut lengths in seconds, comma-separated (default 2,4,8)")
    p.add_argument("--rounds", type=int, default=3, help="measurements per cut and cap (default 3)")
    p.add_argument("--inside", nargs=2, metavar=("CUT_S", "CAPPED"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.inside:
        print(f"{_one(float(args.inside[0]), args.inside[1] == '1'):.3f}")
        return 0
    missing = [tool for tool in ("unshare", "nft", "ip") if shutil.which(tool) is None]
    if missing:
        print(f"measure_retransmit: missing {', '.join(missing)} (Debian: apt-get install util-linux nftables "
              "iproute2)", file=sys.stderr)
        return 2
    try:
        cuts = [float(c) for c in args.cuts.split(",")]
    except ValueError:
        print(f"measure_retransmit: --cuts takes seconds separated by commas, got {args.cuts!r}", file=sys.stderr)
        return 2
    if args.rounds < 1 or any(c <= 0 for c in cuts):
        print("measure_retransmit: --rounds and every cut must be positive", file=sys.stderr)
        return 2
    results: dict[tuple[float, bool], list[float]] = {}
    for cut in cuts:
        for r in range(args.rounds):
            for capped in (False, True):
                try:
                    run = subprocess.run(["unshare", "-n", sys.executable, os.path.abspath(__file__),
                                          "--inside", str(cut), "1" if capped else "0"],
                                         capture_output=True, text=True, timeout=cut + 180)
                except subprocess.TimeoutExpired:
                    print(f"measure_retransmit: no answer within {cut + 180:g} s of a {cut:g} s cut; "
                          "is nftables dropping more than this run's rule?", file=sys.stderr)
                    return 1
                if run.returncode != 0:
                    print(f"measure_retransmit: a measurement failed: {run.stderr.strip() or run.stdout.strip()}",
                          file=sys.stderr)
                    return 1
                took = float(run.stdout.strip())
                results.setdefault((cut, capped), []).append(took)
                print(f"cut {cut:g} s, round {r + 1}, {'capped at 1 s' if capped else 'kernel default'}: "
                      f"answered {took:.3f} s after the heal", flush=True)
    print("\nmedians (s after the heal): cut | kernel default | capped | ratio")
    for cut in cuts:
        plain, capped = statistics.median(results[(cut, False)]), statistics.median(results[(cut, True)])
        print(f"{cut:g} s | {plain:.3f} | {capped:.3f} | {plain / capped if capped else float('inf'):.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
