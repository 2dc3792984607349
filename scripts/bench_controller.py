#!/usr/bin/env python3
"""Controller figures on a 3-node quorum on loopback (real processes, journal fsync on).

    .venv/bin/python scripts/bench_controller.py [--runs 10] [--journal-sync fsync|none]

Prints: failover time (kill -9 of the leader -> first accepted admin write,
median of --runs), admin write latency p50/p99 (one client, sequential),
records/s the quorum commits under concurrent admin writes, and a broker's
metadata fetch latency (a fetch of committed records, and the time from
sending an admin write until a broker's waiting long-poll returns it).
"""
from __future__ import annotations

import argparse
import asyncio
import http.client as httpclient
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import aiohttp  # noqa: E402

from controller_harness import (  # noqa: E402
    SECRET,
    TOKEN,
    Controller,
    http,
    leader_of,
    make_specs,
    wait_leader,
    wait_until,
)

AUTH = {"Authorization": f"Bearer {TOKEN}"}


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


class Heartbeats(threading.Thread):
    def __init__(self, controllers: list[Controller], broker_ids: list[int]) -> None:
        super().__init__(daemon=True)
        self.controllers, self.broker_ids = controllers, broker_ids
        self.stop_event = threading.Event()

    def run(self) -> None:
        registered: dict[int, str] = {}
        while not self.stop_event.is_set():
            leader = leader_of(self.controllers)
            if leader is not None:
                url = leader.spec.api_url
                try:
                    offset = http("GET", url + "/v1/health", token=None, timeout_s=1).body["metadata_offset"]
                    for b in self.broker_ids:
                        if registered.get(b) != url:
                            http("POST", url + "/rpc/v1/register", {"broker_id": b, "incarnation_id": f"i{b}",
                                                                    "host": "127.0.0.1", "port": 9300 + b},
                                 token=None, secret=SECRET, timeout_s=2)
                            registered[b] = url
                        http("POST", url + "/rpc/v1/heartbeat", {"broker_id": b, "incarnation_id": f"i{b}",
                                                                 "metadata_offset": offset},
                             token=None, secret=SECRET, timeout_s=2)
                except OSError:
                    pass
            self.stop_event.wait(0.15)


def write_anywhere(controllers: list[Controller], name: str) -> bool:
    for c in controllers:
        if not c.alive():
            continue
        try:
            r = http("POST", c.spec.api_url + "/v1/topics", {"name": name}, timeout_s=2)
        except OSError:
            continue
        if r.status == 201:
            return True
        if r.status == 307:
            continue   # the leader is another node of this list
    return False


def failover(controllers: list[Controller], runs: int) -> list[float]:
    times = []
    for run in range(runs):
        leader = wait_until(lambda: (lambda l: l if l and l.spec.node_id == 1 else None)(leader_of(controllers)),
                            60, "leader at the priority node")
        assert write_anywhere(controllers, f"warm-{run}")
        leader.kill()
        t0 = time.monotonic()
        n = 0
        while not write_anywhere(controllers, f"failover-{run}-{n}"):
            n += 1
            time.sleep(0.01)
        times.append(time.monotonic() - t0)
        leader.start()
        wait_until(lambda: http("GET", leader.spec.api_url + "/v1/health", token=None, timeout_s=1).status == 200,
                   30, "restarted node")
    return times


def sequential_latency(url: str, count: int, path_of: Callable[[int], tuple[str, str, dict]]) -> list[float]:
    """One admin client on a kept-alive connection, one request at a time."""
    host, port = url.split("://", 1)[1].split(":")
    conn = httpclient.HTTPConnection(host, int(port), timeout=10)
    headers = {**AUTH, "Content-Type": "application/json"}
    out = []
    try:
        for i in range(count):
            method, path, body = path_of(i)
            t0 = time.perf_counter()
            conn.request(method, path, body=json.dumps(body), headers=headers)
            resp = conn.getresponse()
            resp.read()
            out.append(time.perf_counter() - t0)
            assert resp.status in (200, 201), resp.status
    finally:
        conn.close()
    return out


async def throughput(url: str, requests: int, concurrency: int, partitions: int) -> tuple[float, int, float]:
    async with aiohttp.ClientSession(headers=AUTH) as session:
        async with session.get(url + "/v1/health") as r:
            start_offset = (await r.json())["metadata_offset"]
        queue = list(range(requests))

        async def worker() -> None:
            while queue:
                i = queue.pop()
                async with session.post(url + "/v1/topics", json={"name": f"load-{partitions}-{i}",
                                                                  "partitions": partitions}) as r:
                    assert r.status == 201, await r.text()
        t0 = time.perf_counter()
        await asyncio.gather(*[worker() for _ in range(concurrency)])
        elapsed = time.perf_counter() - t0
        async with session.get(url + "/v1/health") as r:
            end_offset = (await r.json())["metadata_offset"]
    return elapsed, end_offset - start_offset, requests / elapsed


async def fetch_latency(url: str, count: int) -> tuple[list[float], list[float]]:
    headers = {"X-Biplane-Secret": SECRET}
    fetch, wake = [], []
    async with aiohttp.ClientSession() as session:
        for i in range(count):
            async with session.get(url + "/v1/health") as r:
                offset = (await r.json())["metadata_offset"]
            t0 = time.perf_counter()
            async with session.get(url + f"/rpc/v1/metadata?after_offset={max(-1, offset - 50)}&max_wait_ms=0",
                                   headers=headers) as r:
                await r.json()
            fetch.append(time.perf_counter() - t0)

            async def poll():
                async with session.get(url + f"/rpc/v1/metadata?after_offset={offset}&max_wait_ms=5000",
                                       headers=headers) as r:
                    body = await r.json()
                    return time.perf_counter(), body
            task = asyncio.create_task(poll())
            await asyncio.sleep(0.02)
            sent_at = time.perf_counter()
            async with session.post(url + "/v1/topics", json={"name": f"fetch-{i}"}, headers=AUTH) as r:
                assert r.status == 201
            woke_at, body = await task
            assert body.get("records"), body
            wake.append(woke_at - sent_at)
    return fetch, wake


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--journal-sync", choices=("fsync", "none"), default="fsync")
    args = parser.parse_args()
    specs = make_specs(3, priorities=[3, 2, 1])
    tmp = Path(tempfile.mkdtemp(prefix="bench-controller-"))
    # The bench measures the controller's own write throughput, so the admin API's guardrails
    # (write rate per token, partition replicas per broker) are lifted out of its way.
    unlimited = ["--admin-write-rate", "1e9", "--admin-write-burst", "1e9", "--max-partitions-per-broker", "1000000"]
    controllers = [Controller(s, specs, tmp / f"c{s.node_id}",
                              ["--session-timeout-ms", "600000", "--journal-sync", args.journal_sync, *unlimited])
                   for s in specs]
    hb = Heartbeats(controllers, [1, 2, 3])
    try:
        for c in controllers:
            c.start()
        wait_leader(controllers, 30)
        hb.start()
        leader = wait_until(lambda: (lambda l: l if l and l.spec.node_id == 1 else None)(leader_of(controllers)),
                            60, "leader at the priority node")
        wait_until(lambda: all(not b["fenced"] for b in http("GET", leader.spec.api_url + "/v1/brokers").body[
            "brokers"]) and len(http("GET", leader.spec.api_url + "/v1/brokers").body["brokers"]) == 3, 20,
            "brokers")
        print(f"3-node quorum on loopback, journal sync: {args.journal_sync}")

        lat = sequential_latency(leader.spec.api_url, 200, lambda i: ("POST", "/v1/topics", {"name": f"seq-{i}"}))
        print(f"admin write latency, create topic (2 records): p50 {pct(lat, .5) * 1000:.2f} ms, "
              f"p99 {pct(lat, .99) * 1000:.2f} ms  (n={len(lat)}, one client, sequential)")
        lat = sequential_latency(leader.spec.api_url, 200, lambda i: (
            "PATCH", "/v1/topics/seq-0/config", {"set": {"retention_ms": 60_000 + i}}))
        print(f"admin write latency, alter config (1 record): p50 {pct(lat, .5) * 1000:.2f} ms, "
              f"p99 {pct(lat, .99) * 1000:.2f} ms")

        fetch, wake = asyncio.run(fetch_latency(leader.spec.api_url, 100))
        print(f"broker metadata fetch (50 records behind): p50 {pct(fetch, .5) * 1000:.2f} ms, "
              f"p99 {pct(fetch, .99) * 1000:.2f} ms")
        print(f"admin write sent -> broker long-poll returns it: p50 {pct(wake, .5) * 1000:.2f} ms, "
              f"p99 {pct(wake, .99) * 1000:.2f} ms")

        for partitions, concurrency, n in ((1, 32, 600), (200, 8, 40)):
            elapsed, records, rps = asyncio.run(throughput(leader.spec.api_url, n, concurrency, partitions))
            print(f"concurrent creates ({partitions} partitions each, {concurrency} clients): "
                  f"{rps:.0f} requests/s, {records / elapsed:.0f} records/s committed "
                  f"({records} records in {elapsed:.2f} s)")

        times = failover(controllers, args.runs)
        print(f"failover (kill -9 leader -> first accepted admin write), {len(times)} runs: "
              f"median {statistics.median(times):.2f} s, min {min(times):.2f} s, max {max(times):.2f} s")
    finally:
        hb.stop_event.set()
        for c in controllers:
            c.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
