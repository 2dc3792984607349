"""Pure placement arithmetic for capacity reports: skew, a balanced placement, what-ifs.

No Spark, no I/O: the report feeds these the latest snapshot's placement and
writes out what they return, and the tests check them on small hand-made cases.

The balancer is a deterministic greedy, documented in SCHEMA.md ("Move plan"):

1. Evacuate: every replica on a broker that is not live moves, largest
   partition first, to the live broker with the least replica bytes that
   does not hold the partition, preferring a rack the partition does not use.
2. Balance: take the live broker with the most replica bytes (src) and the
   live brokers in order of fewest bytes (dst). Among src's replicas that may
   go to dst (dst does not hold the partition, and the partition does not lose
   a distinct rack), with size s and 0 < s < gap = bytes(src) - bytes(dst),
   move the one with s closest to gap / 2 (ties: larger s, then topic, then
   partition). Each such move lowers the sum of squared broker loads by
   2·s·(gap − s) > 0, so the loop ends; it also ends when gap is within
   `tolerance_ratio` of the mean load, when src has no legal move, or after
   `moves_max` moves.
Ties between brokers always go to the lower broker id.
"""
from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Iterable, Mapping


@dataclasses.dataclass(frozen=True, kw_only=True)
class PartitionPlacement:
    topic: str
    partition: int
    replicas: tuple[int, ...]  # ordered; first is the preferred leader
    leader: int | None
    size_bytes: int  # bytes a new replica must copy (the largest replica's log)
    isr: tuple[int, ...] = ()
    min_insync_replicas: int = 1
    growth_bytes_per_s: float = 0.0  # how fast each replica grows (the produce rate)


@dataclasses.dataclass(frozen=True, kw_only=True)
class BrokerSlot:
    broker_id: int
    rack: str | None
    live: bool = True
    capacity_bytes: int | None = None
    used_bytes: int | None = None  # whole disk, as reported; replica bytes are part of it


@dataclasses.dataclass(frozen=True, kw_only=True)
class Move:
    topic: str
    partition: int
    source_broker: int
    target_broker: int
    size_bytes: int
    reason: str  # "evacuate" | "balance" | "replication_factor"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Plan:
    partitions: tuple[PartitionPlacement, ...]
    moves: tuple[Move, ...]
    stopped_because: str

    @property
    def moved_bytes(self) -> int:
        return sum(move.size_bytes for move in self.moves)


@dataclasses.dataclass(frozen=True, kw_only=True)
class BrokerLoad:
    broker_id: int
    rack: str | None
    replicas: int
    leaders: int
    replica_bytes: int


def broker_loads(brokers: Iterable[BrokerSlot], partitions: Iterable[PartitionPlacement]) -> list[BrokerLoad]:
    """Replicas, leaders and replica bytes per broker, by broker id; brokers without replicas count zero."""
    slots = {b.broker_id: b for b in brokers}
    counts = {b: [0, 0, 0] for b in slots}
    for p in partitions:
        for replica in p.replicas:
            entry = counts.setdefault(replica, [0, 0, 0])
            entry[0] += 1
            entry[2] += p.size_bytes
        if p.leader is not None:
            counts.setdefault(p.leader, [0, 0, 0])[1] += 1
    return [BrokerLoad(broker_id=b, rack=slots[b].rack if b in slots else None, replicas=c[0], leaders=c[1],
                       replica_bytes=c[2]) for b, c in sorted(counts.items())]


def growth_by_broker(partitions: Iterable[PartitionPlacement]) -> dict[int, float]:
    """Bytes per day each broker gains if every replica grows at its partition's produce rate."""
    growth: dict[int, float] = {}
    for p in partitions:
        for replica in p.replicas:
            growth[replica] = growth.get(replica, 0.0) + p.growth_bytes_per_s * 86_400
    return growth


@dataclasses.dataclass(frozen=True, kw_only=True)
class Skew:
    """How far the most loaded member is above the mean: max / mean (1.0 is perfectly even)."""

    key: str
    metric: str
    mean: float
    max: float
    min: float
    max_over_mean: float | None  # None when the mean is zero


def skew(values: Mapping[object, float], *, key: str, metric: str) -> Skew:
    if not values:
        return Skew(key=key, metric=metric, mean=0.0, max=0.0, min=0.0, max_over_mean=None)
    mean = sum(values.values()) / len(values)
    top, bottom = max(values.values()), min(values.values())
    return Skew(key=key, metric=metric, mean=mean, max=top, min=bottom,
                max_over_mean=(top / mean) if mean > 0 else None)


def skews(loads: list[BrokerLoad]) -> list[Skew]:
    """Leader, replica and byte skew across brokers and across racks (racks sum their brokers)."""
    result = []
    by_rack: dict[str, list[BrokerLoad]] = {}
    for load in loads:
        by_rack.setdefault(load.rack or "(none)", []).append(load)
    for metric in ("leaders", "replicas", "replica_bytes"):
        result.append(skew({l.broker_id: getattr(l, metric) for l in loads}, key="broker", metric=metric))
        result.append(skew({r: sum(getattr(l, metric) for l in ls) for r, ls in by_rack.items()},
                           key="rack", metric=metric))
    return result


class _State:
    """Mutable working copy of a placement, private to the planning functions."""

    def __init__(self, brokers: Iterable[BrokerSlot], partitions: Iterable[PartitionPlacement]) -> None:
        self.brokers = {b.broker_id: b for b in brokers}
        self.parts = {(p.topic, p.partition): p for p in partitions}
        self.replicas = {key: list(p.replicas) for key, p in self.parts.items()}
        self.load = {b: 0 for b in self.brokers}
        self.hosted: dict[int, set[tuple[str, int]]] = {b: set() for b in self.brokers}
        for key, replicas in self.replicas.items():
            for b in replicas:
                self.load[b] = self.load.get(b, 0) + self.parts[key].size_bytes
                self.hosted.setdefault(b, set()).add(key)
        self.moves: list[Move] = []

    def rack(self, broker_id: int) -> str | None:
        slot = self.brokers.get(broker_id)
        return slot.rack if slot is not None else None

    def racks_of(self, key: tuple[str, int], without: int | None = None) -> set[str | None]:
        return {self.rack(b) for b in self.replicas[key] if b != without}

    def live(self) -> list[int]:
        return sorted(b for b, slot in self.brokers.items() if slot.live)

    def move(self, key: tuple[str, int], source: int, target: int, reason: str) -> None:
        replicas = self.replicas[key]
        replicas[replicas.index(source)] = target
        size = self.parts[key].size_bytes
        self.load[source] -= size
        self.load[target] = self.load.get(target, 0) + size
        self.hosted[source].discard(key)
        self.hosted.setdefault(target, set()).add(key)
        self.moves.append(Move(topic=key[0], partition=key[1], source_broker=source, target_broker=target,
                               size_bytes=size, reason=reason))

    def add(self, key: tuple[str, int], target: int) -> None:
        self.replicas[key].append(target)
        size = self.parts[key].size_bytes
        self.load[target] = self.load.get(target, 0) + size
        self.hosted.setdefault(target, set()).add(key)
        self.moves.append(Move(topic=key[0], partition=key[1], source_broker=-1, target_broker=target,
                               size_bytes=size, reason="replication_factor"))

    def remove(self, key: tuple[str, int], source: int) -> None:
        self.replicas[key].remove(source)
        self.load[source] -= self.parts[key].size_bytes
        self.hosted[source].discard(key)

    def best_new_home(self, key: tuple[str, int], exclude: int | None = None) -> int | None:
        """Least-loaded live broker not holding `key`, preferring a rack the partition lacks."""
        used_racks = self.racks_of(key, without=exclude)
        candidates = [b for b in self.live() if b not in self.replicas[key]]
        if not candidates:
            return None
        return min(candidates, key=lambda b: (self.rack(b) in used_racks, self.load.get(b, 0), b))

    def result(self, stopped_because: str) -> Plan:
        parts = []
        for key, p in sorted(self.parts.items()):
            replicas = tuple(self.replicas[key])
            isr = tuple(b for b in p.isr if b in replicas)
            # A leader that moved away hands over to a surviving in-sync replica, as an election would.
            leader = p.leader if p.leader in replicas else next(iter(isr or replicas), None)
            parts.append(dataclasses.replace(p, replicas=replicas, leader=leader, isr=isr))
        return Plan(partitions=tuple(parts), moves=tuple(self.moves), stopped_because=stopped_because)


def _evacuate(state: _State) -> None:
    live = set(state.live())
    stranded = [(key, b) for key, replicas in state.replicas.items() for b in replicas if b not in live]
    for key, source in sorted(stranded, key=lambda kb: (-state.parts[kb[0]].size_bytes, kb[0], kb[1])):
        target = state.best_new_home(key, exclude=source)
        if target is not None:
            state.move(key, source, target, "evacuate")


def _balance(state: _State, *, tolerance_ratio: float, moves_max: int) -> str:
    live = state.live()
    if len(live) < 2:
        return "fewer than two live brokers"
    mean = sum(state.load[b] for b in live) / len(live)  # moves keep the total
    # Each broker's replicas sorted by (size, key), to find sizes near gap / 2 by bisection.
    by_size = {b: sorted((state.parts[key].size_bytes, key) for key in state.hosted.get(b, ())) for b in live}
    while True:
        if len(state.moves) >= moves_max:
            return f"reached moves_max={moves_max}"
        source = max(live, key=lambda b: (state.load[b], -b))
        targets = sorted(live, key=lambda b: (state.load[b], b))
        if state.load[source] - state.load[targets[0]] <= tolerance_ratio * mean:
            return "balanced within tolerance"
        choice = None
        for target in targets:
            gap = state.load[source] - state.load[target]
            if gap <= tolerance_ratio * mean:
                break
            choice = _closest_legal(state, by_size[source], source, target, gap)
            if choice is not None:
                break
        if choice is None:
            return "no improving move for the most loaded broker"
        key, target = choice
        entry = (state.parts[key].size_bytes, key)
        del by_size[source][bisect.bisect_left(by_size[source], entry)]
        bisect.insort(by_size[target], entry)
        state.move(key, source, target, "balance")


def _keeps_racks(state: _State, key: tuple[str, int], source: int, target: int) -> bool:
    """Whether moving `key`'s replica from source to target keeps its number of distinct racks."""
    source_rack, target_rack = state.rack(source), state.rack(target)
    if source_rack == target_rack:
        return True
    others = [state.rack(b) for b in state.replicas[key] if b != source]
    return source_rack in others or target_rack not in others


def _closest_legal(state: _State, sizes: list[tuple[int, tuple[str, int]]], source: int, target: int,
                   gap: int) -> tuple[tuple[str, int], int] | None:
    """The replica on `source` that `target` may take with 0 < size < gap and size closest to
    gap / 2 (ties: larger size, then smaller key). Walks outward from gap / 2 and stops once
    nothing closer can follow."""
    half = gap / 2
    lo = bisect.bisect_left(sizes, (half,)) - 1
    hi = lo + 1
    best = None
    while lo >= 0 or hi < len(sizes):
        lo_distance = half - sizes[lo][0] if lo >= 0 else float("inf")
        hi_distance = sizes[hi][0] - half if hi < len(sizes) else float("inf")
        if hi_distance <= lo_distance:
            size, key = sizes[hi]
            distance = hi_distance
            hi += 1
        else:
            size, key = sizes[lo]
            distance = lo_distance
            lo -= 1
        if best is not None and distance > best[0][0]:
            break
        if not 0 < size < gap or key in state.hosted[target] or not _keeps_racks(state, key, source, target):
            continue
        rank = (distance, -size, key)
        if best is None or rank < best[0]:
            best = (rank, key)
    return None if best is None else (best[1], target)


def balanced_plan(brokers: Iterable[BrokerSlot], partitions: Iterable[PartitionPlacement], *,
                  tolerance_ratio: float = 0.05, moves_max: int = 100_000) -> Plan:
    """A balanced placement by the deterministic greedy above, and the moves that reach it."""
    state = _State(brokers, partitions)
    _evacuate(state)
    return state.result(_balance(state, tolerance_ratio=tolerance_ratio, moves_max=moves_max))


def add_brokers(brokers: list[BrokerSlot], count: int) -> list[BrokerSlot]:
    """`count` new empty brokers: ids after the largest, racks taken in turn from the existing
    racks (sorted), capacity the median of the existing capacities."""
    if count < 0:
        raise ValueError(f"cannot add {count} brokers; give a count >= 0")
    racks = sorted({b.rack for b in brokers if b.rack is not None})
    capacities = sorted(b.capacity_bytes for b in brokers if b.capacity_bytes is not None)
    capacity = capacities[len(capacities) // 2] if capacities else None
    first = max((b.broker_id for b in brokers), default=0) + 1
    return list(brokers) + [
        BrokerSlot(broker_id=first + i, rack=racks[i % len(racks)] if racks else None, live=True,
                   capacity_bytes=capacity, used_bytes=0)
        for i in range(count)
    ]


def change_replication_factor(brokers: Iterable[BrokerSlot], partitions: Iterable[PartitionPlacement],
                              topic: str, replication_factor: int) -> Plan:
    """Grow or shrink every partition of `topic` to `replication_factor` replicas.

    Growing adds each new replica on the least-loaded live broker (preferring a new
    rack); shrinking drops, from the end of the replica list, replicas other than the
    leader on the most loaded brokers. Moves list the added replicas (source -1).
    """
    state = _State(brokers, partitions)
    keys = sorted(key for key in state.parts if key[0] == topic)
    if not keys:
        raise ValueError(f"topic {topic!r} is not in the snapshot; pick one of {sorted({k[0] for k in state.parts})}")
    if not 1 <= replication_factor <= len(state.live()):
        raise ValueError(f"replication factor {replication_factor} for {topic!r} must be between 1 and "
                         f"the {len(state.live())} live brokers")
    for key in keys:
        while len(state.replicas[key]) < replication_factor:
            target = state.best_new_home(key)
            assert target is not None, key  # checked above: enough live brokers
            state.add(key, target)
        leader = state.parts[key].leader
        while len(state.replicas[key]) > replication_factor:
            victims = [b for b in state.replicas[key] if b != leader]
            state.remove(key, max(victims, key=lambda b: (state.load.get(b, 0), b)))
    return state.result("replication factor changed")


def lose_broker(brokers: Iterable[BrokerSlot], partitions: Iterable[PartitionPlacement], broker_id: int) -> Plan:
    """Re-home every replica of `broker_id` as if it were gone for good (evacuation only)."""
    slots = list(brokers)
    if broker_id not in {b.broker_id for b in slots}:
        raise ValueError(f"broker {broker_id} is not in the snapshot; pick one of {sorted(b.broker_id for b in slots)}")
    slots = [dataclasses.replace(b, live=False) if b.broker_id == broker_id else b for b in slots]
    state = _State(slots, partitions)
    _evacuate(state)
    return state.result(f"broker {broker_id} evacuated")


def balanced_leaders(partitions: Iterable[PartitionPlacement]) -> dict[tuple[str, int], int]:
    """A leader per partition that spreads leadership evenly: partitions in (topic, partition)
    order each pick the in-sync replica (all replicas if the ISR is empty) that leads the
    fewest partitions so far, ties to the current leader, then to replica order."""
    counts: dict[int, int] = {}
    chosen = {}
    for p in sorted(partitions, key=lambda p: (p.topic, p.partition)):
        eligible = [b for b in p.replicas if b in p.isr] or list(p.replicas)
        if not eligible:
            continue
        best = min(eligible, key=lambda b: (counts.get(b, 0), b != p.leader, p.replicas.index(b)))
        counts[best] = counts.get(best, 0) + 1
        chosen[(p.topic, p.partition)] = best
    return chosen


@dataclasses.dataclass(frozen=True, kw_only=True)
class Fit:
    """A least-squares line y = intercept + slope·x, with x in days and y in bytes."""

    points: int
    span_days: float
    slope_bytes_per_day: float | None
    intercept_bytes: float | None
    r2: float | None


def least_squares(xs: list[float], ys: list[float]) -> Fit:
    """Ordinary least squares, centred for numerical stability (y can be ~1e13)."""
    n = len(xs)
    span = (max(xs) - min(xs)) if xs else 0.0
    if n < 2 or span == 0:
        return Fit(points=n, span_days=span, slope_bytes_per_day=None, intercept_bytes=None, r2=None)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    syy = sum((y - my) ** 2 for y in ys)
    slope = sxy / sxx
    r2 = 1.0 if syy == 0 else (sxy * sxy) / (sxx * syy)
    return Fit(points=n, span_days=span, slope_bytes_per_day=slope, intercept_bytes=my - slope * mx, r2=r2)


def days_until_full(*, capacity_bytes: int | None, used_bytes: int | None,
                    slope_bytes_per_day: float | None) -> float | None:
    """Days until `used` reaches `capacity` at the fitted rate; None if unknown or not growing."""
    if capacity_bytes is None or used_bytes is None or slope_bytes_per_day is None or slope_bytes_per_day <= 0:
        return None
    return max(0.0, (capacity_bytes - used_bytes) / slope_bytes_per_day)


PLAN_FORMAT_VERSION = 1


def reassignment_plan(before: Iterable[PartitionPlacement], plan: Plan, *,
                      throttle_bytes_per_s: int) -> dict[str, object]:
    """The plan as `biplane reassign --plan FILE` takes it: every partition the plan changes,
    with its whole new replica list (first is the preferred leader), and the throttle. Each
    entry also says the bytes its new replicas copy (`bytes_to_move`, which reassign ignores)."""
    old = {(p.topic, p.partition): p.replicas for p in before}
    entries = []
    for p in sorted(plan.partitions, key=lambda p: (p.topic, p.partition)):
        previous = old.get((p.topic, p.partition))
        if previous == p.replicas:
            continue
        added = [b for b in p.replicas if previous is None or b not in previous]
        entries.append({"topic": p.topic, "partition": p.partition, "replicas": list(p.replicas),
                        "bytes_to_move": p.size_bytes * len(added)})
    return {"version": PLAN_FORMAT_VERSION, "partitions": entries, "throttle_bytes_per_s": throttle_bytes_per_s}


@dataclasses.dataclass(frozen=True, kw_only=True)
class TransferEstimate:
    """How long copying a plan's new replicas takes when each broker fetches at most
    `throttle_bytes_per_s` for the replicas it is adding (the cluster's
    reassignment_throttle_bytes_per_s applies per receiving broker, so brokers copy in
    parallel and the one receiving the most sets the time)."""

    bytes_to_move: int
    throttle_bytes_per_s: int
    busiest_broker: int | None  # the broker receiving the most
    busiest_broker_bytes: int
    seconds: float
    bytes_in_by_broker: dict[int, int]  # new replicas it receives
    bytes_out_by_broker: dict[int, int]  # new replicas it serves as the partition's leader


def transfer_estimate(before: Iterable[PartitionPlacement], plan: Plan, *,
                      throttle_bytes_per_s: int, lost: Iterable[int] = ()) -> TransferEstimate:
    """What executing the plan copies: for each partition, every broker in its new replica
    list that is not in its old one receives the partition's size from the leader that serves
    it (the current leader, which leads until the new replicas catch up; the plan's leader if
    the current one is lost). A replica the balancer moved twice (A to B, then B to C) is
    copied once, to C."""
    if throttle_bytes_per_s <= 0:
        raise ValueError(f"the throttle must be > 0 bytes/s, got {throttle_bytes_per_s}")
    gone = set(lost)
    old = {(p.topic, p.partition): p for p in before}
    bytes_in: dict[int, int] = {}
    bytes_out: dict[int, int] = {}
    for after in plan.partitions:
        previous = old.get((after.topic, after.partition))
        added = [b for b in after.replicas if previous is None or b not in previous.replicas]
        if not added:
            continue
        source = previous.leader if previous is not None else None
        if source is None or source in gone:
            source = after.leader
        for target in added:
            bytes_in[target] = bytes_in.get(target, 0) + after.size_bytes
            if source is not None:
                bytes_out[source] = bytes_out.get(source, 0) + after.size_bytes
    busiest = min(bytes_in, key=lambda b: (-bytes_in[b], b)) if bytes_in else None
    busiest_bytes = bytes_in[busiest] if busiest is not None else 0
    return TransferEstimate(bytes_to_move=sum(bytes_in.values()), throttle_bytes_per_s=throttle_bytes_per_s,
                            busiest_broker=busiest, busiest_broker_bytes=busiest_bytes,
                            seconds=busiest_bytes / throttle_bytes_per_s,
                            bytes_in_by_broker=dict(sorted(bytes_in.items())),
                            bytes_out_by_broker=dict(sorted(bytes_out.items())))
