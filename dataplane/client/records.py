"""Small values the SDK hands out."""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from common.topic_partition import TopicPartition as TopicPartition


class RecordMetadata(NamedTuple):
    """Where an acknowledged record landed. offset is -1 under acks=0 (nobody answers)."""

    topic: str
    partition: int
    offset: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerRecord:
    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()
