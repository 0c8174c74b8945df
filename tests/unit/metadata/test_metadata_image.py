"""MetadataImage replay and deltas."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidelog.metadata.errors import MetadataReplayError
from tidelog.metadata.image import MetadataDelta, MetadataImage, PartitionImage
from tidelog.metadata.records import (
    BrokerEndpoint,
    ConfigRecord,
    FeatureLevelRecord,
    MetadataRecord,
    PartitionChangeRecord,
    PartitionRecord,
    ProducerIdsRecord,
    RegisterBrokerRecord,
    RemoveTopicRecord,
    TopicRecord,
)

T1 = uuid.UUID(int=100)
T2 = uuid.UUID(int=200)


def apply(
    image: MetadataImage, records: Sequence[MetadataRecord]
) -> tuple[MetadataImage, MetadataDelta]:
    start = image.offset + 1
    return image.apply([(start + i, r) for i, r in enumerate(records)])


def create(name: str, topic_id: uuid.UUID, partitions: int) -> list[MetadataRecord]:
    out: list[MetadataRecord] = [TopicRecord(name, topic_id)]
    out += [PartitionRecord(topic_id, p, (1,), (1,), 1) for p in range(partitions)]
    return out


def test_empty_image() -> None:
    image = MetadataImage.empty("cid")
    assert image.cluster_id == "cid"
    assert image.offset == -1
    assert not image.topics_by_name and not image.brokers
    assert image.next_producer_id == 0
    assert image.topic_config("x") == {}
    assert image.broker_config("") == {}


def test_create_topic_delta_and_lookup() -> None:
    image, delta = apply(MetadataImage.empty(), create("orders", T1, 2))
    topic = image.topic("orders")
    assert topic is not None and image.topic_by_id(T1) is topic
    assert topic.num_partitions == 2 and topic.replication_factor == 1
    assert image.partition("orders", 1) == PartitionImage(1, (1,), (1,), 1, 0, 0)
    assert image.offset == 2
    assert [t.name for t in delta.created_topics] == ["orders"]
    assert delta.created_partitions == (("orders", 0), ("orders", 1))
    assert delta.changed_partitions == () and delta.deleted_topics == ()
    assert not delta.empty


def test_images_are_independent() -> None:
    base, _ = apply(MetadataImage.empty(), create("a", T1, 1))
    after, _ = apply(base, [*create("b", T2, 1), ConfigRecord(2, "a", "retention.ms", "5")])
    assert base.topic("b") is None and base.topic_config("a") == {}
    assert after.topic("b") is not None and after.topic_config("a") == {"retention.ms": "5"}
    with pytest.raises(TypeError):
        after.topic_configs["a"]["x"] = "y"  # type: ignore[index]


def test_partition_change_epochs() -> None:
    image, _ = apply(MetadataImage.empty(), create("a", T1, 1))
    image, delta = apply(image, [PartitionChangeRecord(T1, 0, isr=(1, 2))])
    assert image.partition("a", 0) == PartitionImage(0, (1,), (1, 2), 1, 0, 1)
    assert delta.changed_partitions == (("a", 0),)
    image, _ = apply(image, [PartitionChangeRecord(T1, 0, leader=2, replicas=(1, 2))])
    assert image.partition("a", 0) == PartitionImage(0, (1, 2), (1, 2), 2, 1, 2)
    image, _ = apply(image, [PartitionChangeRecord(T1, 0, leader=2)])
    part = image.partition("a", 0)
    assert part is not None and part.leader_epoch == 1 and part.partition_epoch == 3


def test_new_partitions_of_existing_topic() -> None:
    image, _ = apply(MetadataImage.empty(), create("a", T1, 1))
    image, delta = apply(image, [PartitionRecord(T1, 1, (1,), (1,), 1)])
    assert delta.created_partitions == (("a", 1),) and not delta.created_topics
    assert image.topic("a").num_partitions == 2  # type: ignore[union-attr]


def test_remove_topic_drops_partitions_and_configs() -> None:
    image, _ = apply(
        MetadataImage.empty(), [*create("a", T1, 2), ConfigRecord(2, "a", "retention.ms", "5")]
    )
    image, delta = apply(image, [RemoveTopicRecord(T1)])
    assert image.topic("a") is None and image.topic_by_id(T1) is None
    assert image.topic_config("a") == {}
    assert [t.topic_id for t in delta.deleted_topics] == [T1]
    assert delta.changed_topic_configs == frozenset()
    # The name can be used again, with a new id.
    image, delta = apply(image, create("a", T2, 1))
    assert image.topic("a").topic_id == T2  # type: ignore[union-attr]


def test_create_and_remove_in_one_delta_cancel() -> None:
    image, delta = apply(MetadataImage.empty(), [*create("a", T1, 1), RemoveTopicRecord(T1)])
    assert image.topic("a") is None
    assert delta.created_topics == () and delta.deleted_topics == ()
    assert delta.created_partitions == ()


def test_configs_set_delete() -> None:
    image, delta = apply(
        MetadataImage.empty(),
        [
            ConfigRecord(4, "", "num.partitions", "3"),
            ConfigRecord(4, "1", "num.partitions", "4"),
            *create("a", T1, 1),
            ConfigRecord(2, "a", "cleanup.policy", "compact"),
        ],
    )
    assert image.broker_config("") == {"num.partitions": "3"}
    assert image.broker_config("1") == {"num.partitions": "4"}
    assert delta.changed_broker_configs == frozenset({"", "1"})
    assert delta.changed_topic_configs == frozenset({"a"})
    image, delta = apply(image, [ConfigRecord(4, "", "num.partitions", None)])
    assert image.broker_config("") == {} and "" not in image.broker_configs
    assert delta.changed_broker_configs == frozenset({""})


def test_brokers_producer_ids_features() -> None:
    endpoint = BrokerEndpoint("PLAINTEXT", "h", 9092, "PLAINTEXT")
    incarnation = uuid.uuid4()
    image, delta = apply(
        MetadataImage.empty(),
        [
            RegisterBrokerRecord(1, incarnation, (endpoint,)),
            ProducerIdsRecord(1, 0, 1000),
            FeatureLevelRecord("metadata.version", 3),
        ],
    )
    assert image.brokers[1].epoch == 0 and image.brokers[1].endpoints == (endpoint,)
    assert image.next_producer_id == 1000
    assert image.features == {"metadata.version": 3}
    assert delta.registered_brokers == (1,) and delta.producer_ids_changed
    image, _ = apply(
        image,
        [RegisterBrokerRecord(1, uuid.uuid4(), ()), FeatureLevelRecord("metadata.version", 0)],
    )
    assert image.brokers[1].epoch == 3
    assert image.features == {}


@pytest.mark.parametrize(
    "records",
    [
        [TopicRecord("a", T1), TopicRecord("a", T2)],
        [TopicRecord("a", T1), TopicRecord("b", T1)],
        [PartitionRecord(T1, 0, (1,), (1,), 1)],
        [TopicRecord("a", T1), PartitionRecord(T1, -1, (1,), (1,), 1)],
        [TopicRecord("a", T1), PartitionRecord(T1, 0, (), (), -1)],
        [TopicRecord("a", T1), PartitionChangeRecord(T1, 0, leader=1)],
        [PartitionChangeRecord(T1, 0, leader=1)],
        [RemoveTopicRecord(T1)],
        [ConfigRecord(8, "x", "k", "v")],
        [ProducerIdsRecord(1, 0, 2000), ProducerIdsRecord(1, 0, 1000)],
    ],
)
def test_inconsistent_records_raise(records: list[MetadataRecord]) -> None:
    with pytest.raises(MetadataReplayError):
        apply(MetadataImage.empty(), records)


def test_offsets_must_increase() -> None:
    image, _ = apply(MetadataImage.empty(), [TopicRecord("a", T1)])
    with pytest.raises(MetadataReplayError, match="does not follow"):
        image.apply([(0, TopicRecord("b", T2))])


@given(st.lists(st.integers(min_value=1, max_value=4), min_size=1, max_size=6), st.integers(1, 5))
def test_replay_in_pieces_equals_replay_at_once(partitions: list[int], split: int) -> None:
    records: list[MetadataRecord] = []
    for index, count in enumerate(partitions):
        records += create(f"t{index}", uuid.UUID(int=index + 10), count)
        records.append(ConfigRecord(2, f"t{index}", "retention.ms", str(index)))
    records.append(RemoveTopicRecord(uuid.UUID(int=10)))
    entries = list(enumerate(records))
    whole, _ = MetadataImage.empty().apply(entries)
    cut = min(split, len(entries))
    first, _ = MetadataImage.empty().apply(entries[:cut])
    pieces, _ = first.apply(entries[cut:])
    assert pieces == whole


def test_a_change_copies_only_what_it_touches() -> None:
    base, _ = apply(
        MetadataImage.empty(),
        [
            *create("a", T1, 2),
            *create("b", T2, 2),
            ConfigRecord(2, "a", "retention.ms", "5"),
            ConfigRecord(2, "b", "retention.ms", "6"),
            ConfigRecord(4, "", "num.partitions", "3"),
            RegisterBrokerRecord(1, uuid.UUID(int=9), ()),
        ],
    )
    after, delta = apply(base, [PartitionChangeRecord(T1, 1, leader=-1)])
    assert delta.changed_partitions == (("a", 1),)
    # The other topic, the other partition, configs and brokers are shared, not copied.
    assert after.topic("b") is base.topic("b")
    assert after.topic("a").partitions[0] is base.topic("a").partitions[0]  # type: ignore[union-attr]
    assert after.topic_configs is base.topic_configs
    assert after.broker_configs is base.broker_configs
    assert after.brokers is base.brokers
    # A config change copies that resource's map only.
    configured, _ = apply(after, [ConfigRecord(2, "a", "retention.ms", "7")])
    assert configured.topic_config("b") is after.topic_config("b")
    assert configured.topic_config("a") == {"retention.ms": "7"}
    assert after.topic_config("a") == {"retention.ms": "5"}
    assert configured.topics_by_name is after.topics_by_name
    assert configured.broker_configs is after.broker_configs


def test_image_carries_the_epoch_of_its_last_batch() -> None:
    image, _ = MetadataImage.empty().apply([(0, TopicRecord("a", T1))], epoch=2)
    assert (image.offset, image.epoch) == (0, 2)
    same, _ = image.apply([(1, ConfigRecord(2, "a", "retention.ms", "1"))])
    assert same.epoch == 2
    with pytest.raises(MetadataReplayError):
        image.apply([(1, ConfigRecord(2, "a", "retention.ms", "1"))], epoch=1)
