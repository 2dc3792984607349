"""The metadata image: apply, rejection without change, copy, to_dict/from_dict."""
from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.errors import UnknownTopicOrPartitionError
from common.metadata import (
    NO_LEADER,
    AddPartitions,
    ConfigChange,
    CreateTopic,
    DeleteTopic,
    FenceBroker,
    MetadataImage,
    NoOp,
    PartitionChange,
    PartitionRecord,
    ProducerIdBlock,
    RecordRejected,
    TopicConfig,
    UnfenceBroker,
    UnregisterBroker,
)
import common.metadata.image as image_module
from common.metadata.image import ImageEncoder
from metadata_builders import add_broker, add_topic, apply, cluster


def base() -> MetadataImage:
    image = cluster(3)
    add_topic(image, "t", [[1, 2, 3], [2, 3, 1]])
    return image


def test_empty_image_is_at_offset_minus_one():
    image = MetadataImage()
    assert image.offset == -1 and not image.brokers and not image.topics
    assert list(image.partitions()) == []


def test_offsets_must_follow_each_other():
    image = MetadataImage()
    with pytest.raises(AssertionError):
        image.apply(NoOp(), 1)
    image.apply(NoOp(), 0)
    assert image.offset == 0


def test_register_fences_and_unfence_lifts():
    image = MetadataImage()
    add_broker(image, 7, fenced=True, rack="r1", priority=5)
    b = image.brokers[7]
    assert b.fenced and b.rack == "r1" and b.priority == 5 and b.registered_offset == 0
    assert b.fenced_offset == 0
    apply(image, [UnfenceBroker(broker_id=7, at_ms=5)])
    assert not image.brokers[7].fenced and image.brokers[7].fenced_offset is None


def test_create_topic_and_partitions():
    image = base()
    assert image.topics["t"].partition_count == 2
    p = image.partition("t", 1)
    assert (p.replicas, p.isr, p.leader, p.leader_epoch, p.partition_epoch) == \
        ((2, 3, 1), (2, 3, 1), 2, 0, 0)
    assert [q.tp for q in image.partitions()] == [("t", 0), ("t", 1)]
    with pytest.raises(UnknownTopicOrPartitionError):
        image.partition("t", 2)


def test_isr_change_bumps_partition_epoch_only():
    image = base()
    apply(image, [PartitionChange(topic="t", partition=0, isr=(1, 2))])
    p = image.partition("t", 0)
    assert (p.isr, p.leader, p.leader_epoch, p.partition_epoch) == ((1, 2), 1, 0, 1)


def test_leader_change_bumps_both_epochs():
    image = base()
    apply(image, [PartitionChange(topic="t", partition=0, leader=2)])
    p = image.partition("t", 0)
    assert (p.leader, p.leader_epoch, p.partition_epoch) == (2, 1, 1)


def test_fence_for_election_then_elect():
    """Step one: leader none at e+1 and flagged; a leader then takes e+2 and clears the flag."""
    image = base()
    apply(image, [PartitionChange(topic="t", partition=0, fenced_for_election=True,
                                  leader=NO_LEADER)])
    p = image.partition("t", 0)
    assert (p.leader, p.leader_epoch, p.fenced_for_election) == (None, 1, True)
    apply(image, [PartitionChange(topic="t", partition=0, leader=3)])
    p = image.partition("t", 0)
    assert (p.leader, p.leader_epoch, p.partition_epoch, p.fenced_for_election) == \
        (3, 2, 2, False)


def test_producer_id_blocks_advance_the_next_id():
    image = base()
    apply(image, [ProducerIdBlock(broker_id=1, first_id=0, size=1000)])
    assert image.producer_id_next == 1000


def test_config_change_and_delete():
    image = base()
    apply(image, [ConfigChange(topic="t", key="retention_ms", value="60000")])
    assert image.topics["t"].config.retention_ms == 60000
    apply(image, [DeleteTopic(name="t", topic_id=image.topics["t"].topic_id)])
    assert "t" not in image.topics and list(image.partitions()) == []


def test_add_partitions_raises_the_count_and_partition_records_fill_it():
    image = base()
    topic_id = image.topics["t"].topic_id
    apply(image, [AddPartitions(topic="t", topic_id=topic_id, partitions=3),
                  PartitionRecord(topic="t", partition=2, replicas=(3, 1, 2), isr=(3, 1, 2), leader=3)])
    assert image.topics["t"].config.partitions == 3 and image.topics["t"].partition_count == 3
    assert image.partition("t", 2).leader == 3
    again = MetadataImage.from_dict(json.loads(json.dumps(image.to_dict())))
    assert again == image


@pytest.mark.parametrize("what, partitions, topic_id", [
    ("same count", 2, None), ("fewer", 1, None), ("wrong topic id", 4, "other-id")])
def test_add_partitions_that_does_not_grow_the_topic_is_rejected(what, partitions, topic_id):
    image = base()
    before = image.copy()
    record = AddPartitions.model_construct(topic="t", topic_id=topic_id or image.topics["t"].topic_id,
                                           partitions=partitions)
    with pytest.raises(RecordRejected):
        image.apply(record, image.offset + 1)
    assert image == before


def test_partition_record_beyond_the_added_count_is_rejected():
    image = base()
    apply(image, [AddPartitions(topic="t", topic_id=image.topics["t"].topic_id, partitions=3),
                  PartitionRecord(topic="t", partition=2, replicas=(1,), isr=(1,), leader=1)])
    with pytest.raises(RecordRejected, match="has 3 partitions"):
        image.apply(PartitionRecord(topic="t", partition=3, replicas=(1,), isr=(1,), leader=1), image.offset + 1)


REJECTED = [
    ("fence unknown broker", FenceBroker(broker_id=9, at_ms=0)),
    ("unfence unfenced broker", UnfenceBroker(broker_id=1, at_ms=0)),
    ("unregister a broker hosting replicas", UnregisterBroker(broker_id=1, at_ms=0)),
    ("topic exists", CreateTopic(name="t", topic_id="other", config=TopicConfig())),
    ("bad topic name", CreateTopic(name="a b", topic_id="x", config=TopicConfig())),
    ("partition out of order", PartitionRecord(topic="t", partition=5, replicas=(1,), isr=(1,),
                                               leader=1)),
    ("partition of unknown topic", PartitionRecord(topic="u", partition=0, replicas=(1,),
                                                   isr=(1,), leader=1)),
    ("stale partition epoch", PartitionChange(topic="t", partition=0, isr=(1,),
                                              expected_partition_epoch=7)),
    ("leader outside isr", PartitionChange(topic="t", partition=0, isr=(2, 3))),
    ("empty change", PartitionChange(topic="t", partition=0, isr=(1, 2, 3))),
    ("isr outside replicas", PartitionChange(topic="t", partition=0, isr=(1, 4))),
    ("unregistered replica", PartitionChange(topic="t", partition=0, replicas=(1, 2, 3, 9))),
    ("duplicate replicas", PartitionChange(topic="t", partition=0, replicas=(1, 1, 2))),
    ("unknown partition", PartitionChange(topic="t", partition=9, isr=(1,))),
    ("delete with wrong id", DeleteTopic(name="t", topic_id="nope")),
    ("bad config value", ConfigChange(topic="t", key="retention_ms", value="soon")),
    ("unknown config key", ConfigChange(topic="t", key="colour", value="red")),
    ("producer block not at next id", ProducerIdBlock(broker_id=1, first_id=5, size=10)),
]


@pytest.mark.parametrize("what,record", REJECTED, ids=[w for w, _ in REJECTED])
def test_rejected_record_leaves_image_unchanged(what, record):
    image = base()
    before = image.to_dict()
    with pytest.raises(RecordRejected) as exc:
        image.apply(record, image.offset + 1)
    assert exc.value.record_type == record.type
    assert image.to_dict() == before


def test_fenced_broker_cannot_become_leader_or_join_isr():
    image = base()
    apply(image, [PartitionChange(topic="t", partition=0, isr=(1, 2)),
                  FenceBroker(broker_id=3, at_ms=1)])
    before = image.to_dict()
    for bad in (PartitionChange(topic="t", partition=0, isr=(1, 2, 3)),
                PartitionChange(topic="t", partition=1, leader=3)):
        with pytest.raises(RecordRejected, match="fenced"):
            image.apply(bad, image.offset + 1)
    assert image.to_dict() == before


def test_copy_is_independent():
    image = base()
    other = image.copy()
    assert other == image
    apply(other, [PartitionChange(topic="t", partition=0, leader=2)])
    assert image.partition("t", 0).leader == 1 and other.partition("t", 0).leader == 2
    assert other != image


def test_to_dict_is_plain_json_and_round_trips():
    image = base()
    apply(image, [ProducerIdBlock(broker_id=2, first_id=0, size=10),
                  PartitionChange(topic="t", partition=1, replicas=(2, 3, 1), adding=(),
                                  removing=(1,))])
    d = json.loads(json.dumps(image.to_dict()))
    again = MetadataImage.from_dict(d)
    assert again == image and again.to_dict() == image.to_dict()
    assert again.offset == image.offset


def test_the_encoder_writes_what_to_dict_dumps_and_encodes_only_topics_that_changed(monkeypatch):
    """The broker saves every image with one encoder; each save must be the image's to_dict
    exactly, however the images before it differed, while a topic the image did not replace
    is not encoded again (what keeps a save cheap at thousands of partitions)."""
    encoded: list[str] = []
    real = image_module._topic_to_dict
    monkeypatch.setattr(image_module, "_topic_to_dict",
                        lambda t, parts: encoded.append(t.name) or real(t, parts))
    encoder = ImageEncoder()
    image = base()
    add_topic(image, "u", [[3, 1, 2]])
    steps: list[tuple[list, set[str]]] = [
        ([], {"t", "u"}),
        ([NoOp()], set()),
        ([PartitionChange(topic="t", partition=1, isr=(2, 3))], {"t"}),
        ([ConfigChange(topic="u", key="retention_ms", value="60000")], {"u"}),
        ([ProducerIdBlock(broker_id=2, first_id=0, size=10), FenceBroker(broker_id=3, at_ms=5)], set()),
        ([AddPartitions(topic="u", topic_id=image.topics["u"].topic_id, partitions=2),
          PartitionRecord(topic="u", partition=1, replicas=(1, 2), isr=(1, 2), leader=1)], {"u"}),
        ([DeleteTopic(name="t", topic_id=image.topics["t"].topic_id)], set()),
    ]
    for records, changed in steps:
        image = apply(image.copy(), records)   # a copy per batch, as the broker's learner makes
        encoded.clear()
        assert encoder.encode(image) == json.dumps(image.to_dict()), records
        encoded_by_encoder = set(encoded[:len(encoded) - len(image.topics)])   # then to_dict's own
        assert encoded_by_encoder == changed, records


def test_from_dict_refuses_malformed():
    with pytest.raises(ValueError, match="version"):
        MetadataImage.from_dict({"version": 99})
    d = base().to_dict()
    del d["brokers"]
    with pytest.raises(ValueError, match="malformed"):
        MetadataImage.from_dict(d)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32))
def test_random_records_keep_invariants_and_round_trip(seed):
    """Random (often invalid) partition changes: each either applies, keeping the
    invariants, or is rejected leaving the image equal; to_dict round trips throughout."""
    rnd = random.Random(seed)
    image = base()
    for _ in range(40):
        before = image.copy()
        p = image.partition("t", rnd.randrange(2))
        pick = lambda: tuple(rnd.sample([1, 2, 3, 4], rnd.randint(0, 3)))  # noqa: E731
        record = rnd.choice([
            PartitionChange(topic="t", partition=p.partition, isr=pick() or None),
            PartitionChange(topic="t", partition=p.partition, leader=rnd.choice([-2, -1, 1, 2, 3])),
            PartitionChange(topic="t", partition=p.partition, replicas=pick() or None),
            FenceBroker(broker_id=rnd.randint(1, 3), at_ms=0),
            UnfenceBroker(broker_id=rnd.randint(1, 3), at_ms=0),
        ])
        try:
            image.apply(record, image.offset + 1)
        except RecordRejected:
            assert image == before, f"seed={seed}"
            continue
        for q in image.partitions():
            assert q.isr and set(q.isr) <= set(q.replicas), f"seed={seed}"
            assert q.leader is None or q.leader in q.isr, f"seed={seed}"
            old = before.partition(q.topic, q.partition)
            assert q.leader_epoch >= old.leader_epoch, f"seed={seed}"
            assert q.partition_epoch >= old.partition_epoch, f"seed={seed}"
        assert MetadataImage.from_dict(image.to_dict()) == image, f"seed={seed}"


def _recount(image: MetadataImage) -> tuple[object, ...]:
    replicas: dict[int, int] = {}
    preferred: dict[int, int] = {}
    leaders: dict[int, int] = {}
    for p in image.partitions():
        for b in p.replicas:
            replicas[b] = replicas.get(b, 0) + 1
        preferred[p.replicas[0]] = preferred.get(p.replicas[0], 0) + 1
        if p.leader is not None:
            leaders[p.leader] = leaders.get(p.leader, 0) + 1
    return (replicas, preferred, leaders, [p for p in image.partitions() if p.leader is None],
            [p for p in image.partitions() if p.adding or p.removing])


def _counts(image: MetadataImage) -> tuple[object, ...]:
    brokers = range(1, 6)
    return ({b: image.replica_count(b) for b in brokers if image.replica_count(b)},
            {b: image.preferred_leader_count(b) for b in brokers if image.preferred_leader_count(b)},
            {b: image.leader_count(b) for b in brokers if image.leader_count(b)},
            image.leaderless_partitions(), image.reassigning_partitions())


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32))
def test_per_broker_counts_equal_a_full_recount(seed):
    """Placement reads per-broker replica and preferred-leader counts the image keeps as
    records apply, and the controller's periodic pass its leader counts and its leaderless
    and reassigning partitions; after any sequence of topic creates, deletes, growths,
    replica, leader and reassignment changes (applied or rejected) they equal a recount, in
    copies and rebuilt images too."""
    rnd = random.Random(seed)
    image = cluster(5)
    names = ["a", "b", "c"]
    for step in range(40):
        pick = lambda: [rnd.sample(range(1, 6), 3) for _ in range(rnd.randint(1, 3))]  # noqa: E731
        name = rnd.choice(names)
        kind = rnd.randrange(6)
        try:
            if kind == 0 and name not in image.topics:
                add_topic(image, name, pick())
            elif kind == 1 and name in image.topics:
                apply(image, [DeleteTopic(name=name, topic_id=image.topics[name].topic_id)])
            elif kind == 2 and name in image.topics:
                t = image.topics[name]
                apply(image, [AddPartitions(topic=name, topic_id=t.topic_id,
                                            partitions=t.partition_count + 1)])
                b = rnd.randint(1, 5)
                apply(image, [PartitionRecord(topic=name, partition=t.partition_count,
                                              replicas=(b,), isr=(b,), leader=b)])
            elif kind == 3 and name in image.topics:
                p = image.partition(name, rnd.randrange(image.topics[name].partition_count))
                others = rnd.sample([b for b in range(1, 7) if b not in p.isr], rnd.randint(0, 2))
                order = list(p.isr) + others
                rnd.shuffle(order)  # moves the preferred leader too; broker 6 is unknown: rejected
                apply(image, [PartitionChange(topic=name, partition=p.partition,
                                              replicas=tuple(order))])
            elif kind == 4 and name in image.topics:
                p = image.partition(name, rnd.randrange(image.topics[name].partition_count))
                # A leader from the ISR, none, or one outside it (rejected).
                leader = rnd.choice([NO_LEADER, *p.isr, *(b for b in range(1, 6) if b not in p.isr)])
                apply(image, [PartitionChange(topic=name, partition=p.partition, leader=leader)])
            elif kind == 5 and name in image.topics:
                p = image.partition(name, rnd.randrange(image.topics[name].partition_count))
                marked = rnd.sample(p.replicas, rnd.randint(0, min(2, len(p.replicas))))
                apply(image, [PartitionChange(topic=name, partition=p.partition,
                                              adding=tuple(marked[:1]), removing=tuple(marked[1:]))])
        except RecordRejected:
            pass  # a rejected record must leave the counts alone too
        assert _counts(image) == _recount(image), f"seed={seed} step={step}"
        assert image.replica_total() == sum(_recount(image)[0].values()), f"seed={seed}"
        assert _counts(image.copy()) == _recount(image), f"seed={seed} step={step}"
    assert _counts(MetadataImage.from_dict(image.to_dict())) == _recount(image), f"seed={seed}"


def test_broker_list_shows_each_brokers_metadata_lag_behind_the_committed_offset():
    """`biplane cluster brokers` METADATA_LAG: the committed offset minus the offset each broker
    last reported applying; unknown (None) for a broker that has not reported one."""
    from controller.views import broker_list
    image = base()
    view = broker_list(image, {1: image.offset, 2: image.offset - 5}, {})
    assert [(b.broker_id, b.metadata_lag) for b in view.brokers] == [(1, 0), (2, 5), (3, None)]


def test_broker_list_shows_the_replicas_each_broker_said_are_still_opening():
    """`biplane cluster brokers` OPENING: what each broker's last heartbeat said it cannot serve
    yet (a restart with many partitions); unknown (None) before a heartbeat said."""
    from controller.views import broker_list
    image = base()
    view = broker_list(image, {}, {}, {1: 0, 2: 1_200})
    assert [(b.broker_id, b.replicas_opening) for b in view.brokers] == [(1, 0), (2, 1_200), (3, None)]
