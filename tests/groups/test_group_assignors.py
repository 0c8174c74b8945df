"""Client-side assignors through the broker, incremental rebalancing, static membership.

The broker only carries the assignors' metadata and the leader's assignment, so each assignor
here is the client's own; what is checked is that the group protocol lets every one of them
work: the split it makes, and for the cooperative protocol that a member joining does not make
the existing members give up the partitions they keep (KIP-429). Static members (KIP-345) that
come back within their session timeout get their partitions back without a rebalance.
"""

from __future__ import annotations

import pytest
from group_harness import (
    GroupBroker,
    Member,
    Members,
    Names,
    assert_exactly_once,
    create_topic,
    ends_of,
    java_member,
    produce,
    python_member,
    values,
    wait_assigned,
    wait_consumed,
)
from java_harness import JavaClient

PARTITIONS = 6
COUNT = 60
JAVA_ASSIGNORS = {
    "range": "org.apache.kafka.clients.consumer.RangeAssignor",
    "roundrobin": "org.apache.kafka.clients.consumer.RoundRobinAssignor",
    "sticky": "org.apache.kafka.clients.consumer.StickyAssignor",
    "cooperative-sticky": "org.apache.kafka.clients.consumer.CooperativeStickyAssignor",
}


def member(
    client: str,
    assignor: str,
    broker: GroupBroker,
    java: JavaClient,
    names: Names,
    name: str,
    instance_id: str | None = None,
    session_timeout_ms: int = 6000,
) -> Member:
    if client == "java":
        return java_member(
            java,
            names.topic,
            names.group,
            name=name,
            assignor=JAVA_ASSIGNORS[assignor],
            instance_id=instance_id,
            session_timeout_ms=session_timeout_ms,
        )
    return python_member(
        client,
        broker.bootstrap,
        names.topic,
        names.group,
        name=name,
        assignor=assignor,
        instance_id=instance_id,
        session_timeout_ms=session_timeout_ms,
    )


def callbacks_since(m: Member, count: int) -> list[dict[str, object]]:
    return m.of("assigned", "revoked", "lost")[count:]


@pytest.mark.parametrize(
    ("client", "assignor"),
    [
        ("confluent", "range"),
        ("confluent", "roundrobin"),
        ("confluent", "cooperative-sticky"),
        ("java", "range"),
        ("java", "roundrobin"),
        ("java", "sticky"),
        ("java", "cooperative-sticky"),
    ],
)
def test_a_third_member_joins(
    broker: GroupBroker,
    java: JavaClient,
    names: Names,
    members: Members,
    client: str,
    assignor: str,
) -> None:
    create_topic(broker.bootstrap, names.topic, PARTITIONS)
    first = [
        members.add(member(client, assignor, broker, java, names, f"{client}-{i}"))
        for i in range(2)
    ]
    before = wait_assigned(first, PARTITIONS, "two members to share the topic")
    assert sorted(len(p) for p in before.values()) == [3, 3]
    seen = {m.name: len(m.of("assigned", "revoked", "lost")) for m in first}

    third = members.add(member(client, assignor, broker, java, names, f"{client}-2"))
    group = [*first, third]
    after = wait_assigned(group, PARTITIONS, "the third member to get partitions")
    assert sorted(len(p) for p in after.values()) == [2, 2, 2]
    if assignor == "range":
        assert sorted(after.values(), key=min) == [{0, 1}, {2, 3}, {4, 5}]
    elif assignor == "roundrobin":
        assert sorted(after.values(), key=min) == [{0, 3}, {1, 4}, {2, 5}]
    else:
        # Sticky assignors keep what they can: each old member gives up exactly one.
        for m in first:
            assert after[m.name] < before[m.name]

    for m in first:
        revoked = {
            p
            for e in callbacks_since(m, seen[m.name])
            if e["event"] != "assigned"
            for p in e["partitions"]  # type: ignore[attr-defined]
        }
        if assignor == "cooperative-sticky":
            # Only what moved was revoked; the rest was never taken away.
            assert revoked == before[m.name] - after[m.name], m.describe()
        else:
            # The eager protocol: everything is revoked before the rejoin.
            assert revoked == before[m.name], m.describe()

    expected = values("c", COUNT)
    produce(broker.bootstrap, names.topic, expected, PARTITIONS)
    wait_consumed(group, ends_of(COUNT, PARTITIONS))
    for m in group:
        m.stop()
    assert_exactly_once(group, expected, PARTITIONS)


@pytest.mark.parametrize(
    "client",
    [
        "confluent",
        "java",
    ],
)
def test_static_member_restart_without_rebalance(
    broker: GroupBroker, java: JavaClient, names: Names, members: Members, client: str
) -> None:
    create_topic(broker.bootstrap, names.topic, PARTITIONS)
    # The static member's session outlives its restart by far; the others are dynamic.
    static_id = f"static-{names.group}"
    static = members.add(member(client, "range", broker, java, names, "static", static_id, 30000))
    # The static member joins first, alone, so that its last JoinGroup is a rejoin (with the
    # Java client its subscription then carries the generation it had, KIP-792).
    wait_assigned([static], PARTITIONS, "the static member to own the topic")
    others = [
        members.add(member(client, "range", broker, java, names, f"dynamic-{i}")) for i in range(2)
    ]
    owned = wait_assigned([static, *others], PARTITIONS, "three members to share the topic")
    first = values("a", COUNT)
    produce(broker.bootstrap, names.topic, first, PARTITIONS)
    wait_consumed([static, *others], ends_of(COUNT, PARTITIONS))
    seen = {m.name: len(m.of("assigned", "revoked", "lost")) for m in others}
    committed = static.committed()

    # A static member does not leave when it closes; its successor takes its place.
    static.stop()
    again = members.add(
        member(client, "range", broker, java, names, "static-again", static_id, 30000)
    )
    after = wait_assigned([again, *others], PARTITIONS, "the static member to be back")
    assert after["static-again"] == owned["static"]

    second = values("b", COUNT)
    produce(broker.bootstrap, names.topic, second, PARTITIONS)
    wait_consumed([again, *others], {p: 2 * n for p, n in ends_of(COUNT, PARTITIONS).items()})
    for m in others:
        # No rebalance: the dynamic members saw no callback since the first split.
        assert callbacks_since(m, seen[m.name]) == [], m.describe()
    for m in [again, *others]:
        m.stop()

    if client == "java":
        generations = {e["generation"] for e in again.of("assigned")}
        assert generations == {static.of("assigned")[-1]["generation"]}
    resumed = {r.partition: r.offset for r in reversed(again.records())}
    assert resumed == {p: committed[p] for p in owned["static"]}
    assert_exactly_once([static, again, *others], first + second, PARTITIONS)
