"""PerTopic (common/metadata/per_topic.py): a value recorded for a topic stands while the
image's partition tuple and topic info for it are the same objects; a record that touches the
topic (an ISR change, a config change) makes it stale, and a deleted topic is dropped."""
from __future__ import annotations

from common.metadata.per_topic import PerTopic
from common.metadata.records import ConfigChange, DeleteTopic, PartitionChange
from metadata_builders import add_broker, add_topic, apply, cluster


def test_a_value_stands_until_its_topic_changes_and_goes_with_the_topic():
    image = cluster(1)
    add_broker(image, 2)
    add_topic(image, "a", [[1, 2]], min_insync_replicas=1)
    add_topic(image, "b", [[1, 2]], min_insync_replicas=1)
    memo: PerTopic[str] = PerTopic()
    memo.record(image, "a", "a@1")
    memo.record(image, "b", "b@1")
    isr = apply(image.copy(), [PartitionChange(topic="a", partition=0, isr=(1,))])
    assert memo.current(isr, "a") is None and memo.last("a") == "a@1", "an ISR change makes a's value stale"
    assert memo.current(isr, "b") == "b@1", "b is the same objects in the copy: its value stands"
    config = apply(isr.copy(), [ConfigChange(topic="b", key="retention_ms", value=1000)])
    assert memo.current(config, "b") is None, "a config change makes b's value stale"
    gone = apply(config.copy(), [DeleteTopic(name="a", topic_id=config.topics["a"].topic_id)])
    assert memo.drop_gone(gone) == ["a@1"] and memo.last("a") is None and memo.values() == ["b@1"]
