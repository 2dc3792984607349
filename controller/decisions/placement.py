"""Replica placement for new topics and new partitions: even, rack-aware, deterministic.

Greedy over the unfenced brokers that are not being decommissioned, counting the load already in the image so
several topics together stay balanced:
- each replica goes to a rack not used yet by that partition when there is
  one, then to the broker holding the fewest replicas (then leading fewest);
- of the chosen brokers, the one leading the fewest partitions is put first
  (the preferred leader);
- remaining ties rotate from a start derived from a stable hash of the topic
  name plus the partition number, so equal clusters spread topics differently
  but the same image and name always give the same answer (no seed, no clock).
A broker without a rack counts as a rack of its own.
"""
from __future__ import annotations

import hashlib
from collections import Counter

from common.errors import InvalidReplicationFactorError
from common.metadata.image import MetadataImage


def stable_hash(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def place_replicas(image: MetadataImage, *, topic: str, partitions: int,
                   replication_factor: int, first_partition: int = 0) -> list[tuple[int, ...]]:
    """One replica list per partition, the preferred leader first. Partitions added to an
    existing topic pass `first_partition` (its current count), so the rotation goes on
    from where the topic's first partitions left it."""
    brokers = image.placeable_broker_ids()
    if replication_factor > len(brokers):
        raise InvalidReplicationFactorError(
            f"replication_factor {replication_factor} is larger than the {len(brokers)} "
            f"available (unfenced, not decommissioning) brokers", field="replication_factor",
            value=replication_factor)
    n = len(brokers)
    position = {b: i for i, b in enumerate(brokers)}

    def rack(b: int) -> str:
        r = image.brokers[b].rack
        return r if r is not None else f"\0{b}"

    # The image keeps these counts as records apply: no scan of every partition per create.
    leaders: Counter[int] = Counter({b: image.preferred_leader_count(b) for b in brokers})
    replicas_load: Counter[int] = Counter({b: image.replica_count(b) for b in brokers})

    start = stable_hash(topic) % n
    assignment: list[tuple[int, ...]] = []
    for partition in range(partitions):
        shift = (start + first_partition + partition) % n

        def turn(b: int) -> int:
            return (position[b] - shift) % n

        chosen: list[int] = []
        racks_used: set[str] = set()
        while len(chosen) < replication_factor:
            pick = min((b for b in brokers if b not in chosen),
                       key=lambda b: (rack(b) in racks_used, replicas_load[b], leaders[b],
                                      turn(b)))
            chosen.append(pick)
            racks_used.add(rack(pick))
        leader = min(chosen, key=lambda b: (leaders[b], turn(b)))
        chosen.remove(leader)
        chosen.insert(0, leader)
        leaders[leader] += 1
        replicas_load.update(chosen)
        assignment.append(tuple(chosen))
    return _even_out_leaders(assignment, leaders, passes_max=partitions * n + 1)


def _even_out_leaders(assignment: list[tuple[int, ...]], leaders: Counter[int], *,
                      passes_max: int) -> list[tuple[int, ...]]:
    """Move preferred leaderships along chains (a leads a partition that b hosts,
    b leads one that c hosts, ...) from a busiest broker to one leading at least
    two fewer, until no chain exists: then leader counts are as even as these
    replica sets allow. Each pass is a breadth-first search in broker order."""
    for _ in range(passes_max):
        busiest = max(leaders[r[0]] for r in assignment)
        starts = sorted({r[0] for r in assignment if leaders[r[0]] == busiest})
        path = _find_chain(assignment, leaders, starts, busiest)
        if path is None:
            break
        for i, new_leader in path:
            replicas = assignment[i]
            leaders[replicas[0]] -= 1
            leaders[new_leader] += 1
            assignment[i] = (new_leader,) + tuple(b for b in replicas if b != new_leader)
    return assignment


def _find_chain(assignment: list[tuple[int, ...]], leaders: Counter[int], starts: list[int],
                busiest: int) -> list[tuple[int, int]] | None:
    led_by: dict[int, list[int]] = {}
    for i, replicas in enumerate(assignment):
        led_by.setdefault(replicas[0], []).append(i)
    came_from: dict[int, tuple[int, int] | None] = {b: None for b in starts}
    queue = list(starts)
    while queue:
        a = queue.pop(0)
        for i in led_by.get(a, ()):
            for b in assignment[i][1:]:
                if b in came_from:
                    continue
                came_from[b] = (a, i)
                if leaders[b] <= busiest - 2:
                    path = []
                    node: int = b
                    step = came_from[node]
                    while step is not None:
                        prev, part = step
                        path.append((part, node))
                        node = prev
                        step = came_from[node]
                    return list(reversed(path))
                queue.append(b)
    return None
