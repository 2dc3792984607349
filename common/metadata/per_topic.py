"""What a reader of successive metadata images worked out per topic, kept while the topic is
unchanged. Pure.

The image replaces, never edits, a topic's partition tuple and its TopicInfo when a record
touches them (image.py, `copy`), so a topic whose two are the same objects as when a value was
recorded has not changed since: the value stands. A broker applies images many times a second
while thousands of replicas open; working out only the topics that changed keeps each image's
cost to what it changed.
"""
from __future__ import annotations

from typing import Generic, TypeVar

from common.metadata.image import MetadataImage, PartitionInfo, TopicInfo

V = TypeVar("V")


class PerTopic(Generic[V]):
    def __init__(self) -> None:
        self._recorded: dict[str, tuple[tuple[PartitionInfo, ...], TopicInfo, V]] = {}

    def current(self, image: MetadataImage, topic: str) -> V | None:
        """The value recorded for `topic` if the topic is unchanged in `image` since; else None."""
        recorded = self._recorded.get(topic)
        if recorded is None or recorded[0] is not image.topic_partitions(topic) or recorded[1] is not image.topics[topic]:
            return None
        return recorded[2]

    def last(self, topic: str) -> V | None:
        """The value last recorded for `topic`, changed since or not."""
        recorded = self._recorded.get(topic)
        return recorded[2] if recorded is not None else None

    def record(self, image: MetadataImage, topic: str, value: V) -> None:
        self._recorded[topic] = (image.topic_partitions(topic), image.topics[topic], value)

    def drop_gone(self, image: MetadataImage) -> list[V]:
        """Forget the topics `image` no longer has; their last values."""
        gone = [name for name in self._recorded if name not in image.topics]
        return [self._recorded.pop(name)[2] for name in gone]

    def values(self) -> list[V]:
        return [v for _, _, v in self._recorded.values()]
