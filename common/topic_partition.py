"""`TopicPartition`, the one name for "partition P of topic T" in every process.

A NamedTuple, so it equals and hashes like the plain `(topic, partition)` tuple:
a dict keyed by one is found by the other, and code that still builds plain
tuples keeps working while it moves over.
"""
from __future__ import annotations

from typing import NamedTuple


class TopicPartition(NamedTuple):
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}[{self.partition}]"
