"""Three members of one group share a 6-partition topic, for every client.

With the range assignor each member owns two adjacent partitions; records produced once the
group is stable are consumed exactly once across the members (each commits after processing),
and the group's committed offsets end at the end of every partition.
"""

from __future__ import annotations

import pytest
from group_harness import (
    GroupBroker,
    Member,
    Members,
    Names,
    assert_exactly_once,
    committed_offsets,
    create_topic,
    ends_of,
    java_member,
    kcat_member,
    produce,
    python_member,
    stop_kcat,
    values,
    wait_assigned,
    wait_consumed,
    wait_until,
)
from java_harness import JavaClient

PARTITIONS = 6
COUNT = 300
RANGE_SPLIT = [{0, 1}, {2, 3}, {4, 5}]


def start(kind: str, broker: GroupBroker, java: JavaClient, names: Names, name: str) -> Member:
    if kind == "java":
        return java_member(java, names.topic, names.group, name=name, assignor=RANGE_JAVA)
    return python_member(
        kind, broker.bootstrap, names.topic, names.group, name=name, assignor="range"
    )


RANGE_JAVA = "org.apache.kafka.clients.consumer.RangeAssignor"


@pytest.mark.parametrize(
    "kinds",
    [
        ("confluent", "confluent", "confluent"),
        ("java", "java", "java"),
        ("kafka-python", "kafka-python", "kafka-python"),
        ("aiokafka", "aiokafka", "aiokafka"),
        ("confluent", "java", "aiokafka"),
    ],
    ids=["confluent", "java", "kafka-python", "aiokafka", "mixed"],
)
def test_three_members_range_exactly_once(
    broker: GroupBroker,
    java: JavaClient,
    names: Names,
    members: Members,
    kinds: tuple[str, str, str],
) -> None:
    create_topic(broker.bootstrap, names.topic, PARTITIONS)
    group = [
        members.add(start(kind, broker, java, names, f"{kind}-{i}")) for i, kind in enumerate(kinds)
    ]
    owned = wait_assigned(group, PARTITIONS, "three members to share the topic")
    assert sorted(owned.values(), key=min) == RANGE_SPLIT

    expected = values("v", COUNT)
    produce(broker.bootstrap, names.topic, expected, PARTITIONS)
    wait_consumed(group, ends_of(COUNT, PARTITIONS))
    for member in group:
        member.stop()

    assert_exactly_once(group, expected, PARTITIONS)
    for member in group:
        # Nobody consumed outside what it owned, and no rebalance happened after the split.
        assert {r.partition for r in member.records()} <= owned[member.name]
        assert not member.of("commit_failed"), member.describe()
    assert committed_offsets(broker.bootstrap, names.group, names.topic, PARTITIONS) == ends_of(
        COUNT, PARTITIONS
    )


def test_three_kcat_balanced_consumers(broker: GroupBroker, names: Names, members: Members) -> None:
    create_topic(broker.bootstrap, names.topic, PARTITIONS)
    group = [
        members.add(kcat_member(broker.bootstrap, names.topic, names.group, name=f"kcat-{i}"))
        for i in range(3)
    ]
    owned = wait_assigned(group, PARTITIONS, "three kcat members to share the topic")
    assert sorted(owned.values(), key=min) == RANGE_SPLIT

    expected = values("k", COUNT)
    produce(broker.bootstrap, names.topic, expected, PARTITIONS)
    wait_until(
        lambda: sum(len(m.records()) for m in group) >= COUNT,
        "kcat members to print every record",
    )
    for member in group:
        stop_kcat(member)

    assert_exactly_once(group, expected, PARTITIONS)
    for member in group:
        assert {r.partition for r in member.records()} <= owned[member.name]
    # kcat commits what it printed (auto-commit, and on close).
    assert committed_offsets(broker.bootstrap, names.group, names.topic, PARTITIONS) == ends_of(
        COUNT, PARTITIONS
    )
