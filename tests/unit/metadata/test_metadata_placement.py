"""Replica placement (metadata/controller/placement.py) and its use by CreateTopics,
CreatePartitions and the internal topics, with the quorum's replication switch off
(any factor up to the active brokers) and on (one replica)."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from metadata_helpers import Cluster

from tidelog.metadata.controller import OFFSETS_TOPIC, NewPartitions, NewTopic, topics
from tidelog.metadata.controller.core import QUORUM_MAX_REPLICATION_FACTOR
from tidelog.metadata.controller.placement import assign_replicas, rack_alternated
from tidelog.protocol import ErrorCode


def test_plain_placement_stripes_leaders_and_followers() -> None:
    brokers = [1, 2, 3, 4]
    assignment = assign_replicas(brokers, {}, 8, 3, rng=random.Random(1))
    for replicas in assignment:
        assert len(set(replicas)) == 3 and set(replicas) <= set(brokers)
    leaders = Counter(replicas[0] for replicas in assignment)
    assert leaders == {1: 2, 2: 2, 3: 2, 4: 2}
    # Every broker holds the same number of replicas: followers are striped too.
    assert Counter(b for replicas in assignment for b in replicas) == {b: 6 for b in brokers}


def test_start_broker_continues_the_stripe() -> None:
    # Partition 0 led by broker 3: partitions 4.. continue at broker 3's position.
    assert assign_replicas([1, 2, 3], {}, 3, 1, start_broker=3, first_partition=3) == [
        [3],
        [1],
        [2],
    ]
    whole = assign_replicas([1, 2, 3], {}, 6, 2, start_broker=2)
    assert assign_replicas([1, 2, 3], {}, 3, 2, start_broker=2, first_partition=3) == whole[3:]


def test_one_broker_draws_nothing_from_the_random_source() -> None:
    rng = random.Random(5)
    state = rng.getstate()
    assert assign_replicas([1], {}, 3, 1, rng=rng) == [[1], [1], [1]]
    assert rng.getstate() == state


@pytest.mark.parametrize("factor", [0, 4])
def test_impossible_factor_is_refused(factor: int) -> None:
    with pytest.raises(ValueError):
        assign_replicas([1, 2, 3], {}, 1, factor)


def test_rack_alternated_order() -> None:
    racks = {1: "a", 2: "a", 3: "b", 4: "b", 5: "c", 6: None}
    assert rack_alternated([1, 2, 3, 4, 5, 6], racks) == [1, 3, 5, 6, 2, 4]


@pytest.mark.parametrize("seed", range(20))
def test_rack_aware_placement_spreads_each_partition_over_racks(seed: int) -> None:
    racks = {1: "a", 2: "a", 3: "b", 4: "b", 5: "c", 6: "c"}
    assignment = assign_replicas(list(racks), racks, 12, 3, rng=random.Random(seed))
    for replicas in assignment:
        assert len(set(replicas)) == 3
        assert {racks[b] for b in replicas} == {"a", "b", "c"}
    assert Counter(replicas[0] for replicas in assignment) == {b: 2 for b in racks}


def test_more_replicas_than_racks_uses_every_rack_then_doubles_up() -> None:
    racks = {1: "a", 2: "a", 3: "a", 4: "b"}
    for replicas in assign_replicas(list(racks), racks, 8, 3, rng=random.Random(3)):
        assert len(set(replicas)) == 3
        assert 4 in replicas  # the only broker of rack b is always used


def test_broker_without_rack_counts_as_its_own_rack() -> None:
    racks: dict[int, str | None] = {1: "a", 2: "a", 3: None}
    for replicas in assign_replicas([1, 2, 3], racks, 6, 2, rng=random.Random(2)):
        assert 3 in replicas


# -- through the controller's operations ---------------------------------------------------


def test_create_topics_places_replicas_rack_aware() -> None:
    cluster = Cluster({1: "a", 2: "a", 3: "b", 4: "b"})
    (result,) = cluster.commit(topics.create_topics(cluster.view(), [NewTopic("t", 8, 2)]))
    assert result.error.ok and result.replication_factor == 2
    parts = cluster.image.topics_by_name["t"].partitions.values()
    for part in parts:
        assert {cluster.image.brokers[b].rack for b in part.replicas} == {"a", "b"}
        assert part.isr == part.replicas and part.leader == part.replicas[0]
    assert Counter(p.leader for p in parts) == {1: 2, 2: 2, 3: 2, 4: 2}


def test_create_topics_uses_only_active_brokers() -> None:
    cluster = Cluster(3)
    cluster.set_fenced(2)
    (result,) = cluster.commit(topics.create_topics(cluster.view(), [NewTopic("t", 4, 2)]))
    assert result.error.ok
    for part in cluster.image.topics_by_name["t"].partitions.values():
        assert set(part.replicas) == {1, 3}
    (too_many,) = cluster.commit(topics.create_topics(cluster.view(), [NewTopic("u", 1, 3)]))
    assert too_many.error.code is ErrorCode.INVALID_REPLICATION_FACTOR


def test_create_partitions_continues_the_topic_stripe() -> None:
    cluster = Cluster(3)
    cluster.commit(topics.create_topics(cluster.view(), [NewTopic("t", 2, 2)]))
    (result,) = cluster.commit(topics.create_partitions(cluster.view(), [NewPartitions("t", 6)]))
    assert result.error.ok
    parts = cluster.image.topics_by_name["t"].partitions
    assert len(parts) == 6
    assert Counter(p.leader for p in parts.values()) == {1: 2, 2: 2, 3: 2}
    assert all(len(set(p.replicas)) == 2 for p in parts.values())


def test_internal_topic_takes_its_configured_factor_up_to_the_brokers() -> None:
    cluster = Cluster(2, config={"offsets.topic.replication.factor": "3"})
    result = cluster.commit(topics.auto_create_topic(cluster.view(), OFFSETS_TOPIC))
    assert result.error.ok and result.replication_factor == 2
    parts = cluster.image.topics_by_name[OFFSETS_TOPIC].partitions.values()
    assert Counter(p.leader for p in parts) == {1: 25, 2: 25}


def test_quorum_switch_keeps_one_replica_per_partition() -> None:
    # The switch stays on until brokers replicate: RF>1 is refused, internal topics get 1.
    assert QUORUM_MAX_REPLICATION_FACTOR == 1
    cluster = Cluster(3, max_replication_factor=QUORUM_MAX_REPLICATION_FACTOR)
    (refused,) = cluster.commit(topics.create_topics(cluster.view(), [NewTopic("t", 1, 2)]))
    assert refused.error.code is ErrorCode.INVALID_REPLICATION_FACTOR
    created = cluster.commit(topics.auto_create_topic(cluster.view(), OFFSETS_TOPIC))
    assert created.error.ok and created.replication_factor == 1
