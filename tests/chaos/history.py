"""The history of one run: what producers sent and were told, what consumers saw, what the
cluster holds at the end, and which faults ran when. Pure data; JSON in and out.

Times are seconds on the harness's monotonic clock, counted from the start of the workload.
A record's value is `"<producer>/<topic>/<partition>/<seq>"`: `seq` counts that producer's
sends to that partition from 0, in send order.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any

TopicPartitionKey = str   # "<topic>/<partition>"


def tp_key(topic: str, partition: int) -> TopicPartitionKey:
    return f"{topic}/{partition}"


def record_value(producer: str, topic: str, partition: int, seq: int) -> str:
    return f"{producer}/{topic}/{partition}/{seq}"


def parse_value(value: str) -> tuple[str, TopicPartitionKey, int] | None:
    """(producer, tp key, seq) of a value this harness wrote, else None."""
    parts = value.split("/")
    if len(parts) != 4 or not parts[2].isdigit() or not parts[3].isdigit():
        return None
    return parts[0], f"{parts[1]}/{parts[2]}", int(parts[3])


@dataclasses.dataclass(frozen=True, kw_only=True)
class Send:
    """One record sent by an idempotent acks=all producer, and its outcome."""

    producer: str
    tp: TopicPartitionKey
    seq: int
    value: str
    sent_s: float
    done_s: float | None        # None: no outcome by the end of the run
    offset: int | None          # the acknowledged offset, None unless acknowledged
    error: str | None           # the error's class name (and code) when it failed


@dataclasses.dataclass(frozen=True, kw_only=True)
class Seen:
    """A record a tailing consumer was handed (first time only)."""

    consumer: str
    tp: TopicPartitionKey
    offset: int
    value: str
    at_s: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class FaultRun:
    """A fault as it ran: the schedule's entry plus the real times and what it touched."""

    index: int
    kind: str
    targets: tuple[str, ...]
    start_s: float
    end_s: float
    removes_quorum: bool
    note: str = ""
    # gray faults: each partition's leader ("b1"...) as the fault began (absent: none known)
    leaders: dict[str, str] = dataclasses.field(default_factory=dict)
    # killed processes: when each was back in service after its restart (a broker registered,
    # unfenced, every replica open and in its ISR; a controller answering with a leader known);
    # absent: not seen back (the heal time stands for it)
    back_s: dict[str, float] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Fence:
    """A broker fenced by the controller leader (tests/chaos/fences.py reads them from its log)."""

    broker: str                 # "b1"...
    at_s: float                 # on the run's clock
    reason: str                 # "session expired", "controlled shutdown"...
    silent_ms: int | None       # how long the leader had not heard the broker's heartbeat
    controller: str             # the controller that decided it ("c1"...)


@dataclasses.dataclass(kw_only=True)
class History:
    seed: int
    topics: dict[str, dict[str, Any]]               # name -> config the harness created it with
    sends: list[Send]
    seen: list[Seen]
    faults: list[FaultRun]
    final_reads: dict[TopicPartitionKey, list[tuple[int, str]]]   # offset, value; read to the HW
    high_watermarks: dict[TopicPartitionKey, int]                 # at the final read
    replicas: dict[TopicPartitionKey, dict[str, list[tuple[int, str]]]]   # broker -> its log on disk
    last_heal_s: float | None = None
    end_s: float = 0.0
    notes: list[str] = dataclasses.field(default_factory=list)
    exits: list[str] = dataclasses.field(default_factory=list)   # processes that died with no fault killing them
    unreadable: list[TopicPartitionKey] = dataclasses.field(default_factory=list)   # no read-back possible
    producer_restarts: list[str] = dataclasses.field(default_factory=list)   # SDK producers that stopped (send() raised ClientClosedError); not replaced
    # the controller's ISR of each partition after the read-back ("b1"...); absent: unknown
    isr_at_end: dict[TopicPartitionKey, list[str]] = dataclasses.field(default_factory=dict)
    # every broker fence the controllers logged; None: not recorded (a history from before)
    fences: list[Fence] | None = None
    # the harness's own event loop standing still (run time it began, seconds): nothing was
    # sent or answered meanwhile, so an acks=all gap that spans one is partly the harness's;
    # None: not recorded (a history from before)
    harness_stalls: list[tuple[float, float]] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed, "topics": self.topics,
            "sends": [dataclasses.asdict(s) for s in self.sends],
            "seen": [dataclasses.asdict(s) for s in self.seen],
            "faults": [dataclasses.asdict(f) for f in self.faults],
            "final_reads": {k: [list(r) for r in v] for k, v in self.final_reads.items()},
            "high_watermarks": self.high_watermarks,
            "replicas": {k: {b: [list(r) for r in log] for b, log in v.items()} for k, v in self.replicas.items()},
            "last_heal_s": self.last_heal_s, "end_s": self.end_s, "notes": self.notes,
            "exits": self.exits, "unreadable": self.unreadable,
            "producer_restarts": self.producer_restarts,
            "isr_at_end": self.isr_at_end,
            "fences": None if self.fences is None else [dataclasses.asdict(f) for f in self.fences],
            "harness_stalls": None if self.harness_stalls is None else [list(s) for s in self.harness_stalls],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "History":
        return cls(
            seed=int(data["seed"]), topics=dict(data["topics"]),
            sends=[Send(**s) for s in data["sends"]],
            seen=[Seen(**s) for s in data["seen"]],
            faults=[FaultRun(**{**f, "targets": tuple(f["targets"])}) for f in data["faults"]],
            final_reads={k: [(int(o), str(v)) for o, v in rs] for k, rs in data["final_reads"].items()},
            high_watermarks={k: int(v) for k, v in data["high_watermarks"].items()},
            replicas={k: {b: [(int(o), str(v)) for o, v in log] for b, log in bs.items()}
                      for k, bs in data["replicas"].items()},
            last_heal_s=data.get("last_heal_s"), end_s=float(data.get("end_s", 0.0)),
            notes=list(data.get("notes", [])), exits=list(data.get("exits", [])),
            unreadable=list(data.get("unreadable", [])),
            producer_restarts=list(data.get("producer_restarts", [])),
            isr_at_end={k: list(v) for k, v in data.get("isr_at_end", {}).items()},
            fences=None if data.get("fences") is None else [Fence(**f) for f in data["fences"]],
            harness_stalls=(None if data.get("harness_stalls") is None
                            else [(float(a), float(b)) for a, b in data["harness_stalls"]]),
        )

    def dump(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(self.to_json(), f)

    @classmethod
    def load(cls, path: str) -> "History":
        with open(path) as f:
            return cls.from_json(json.load(f))
