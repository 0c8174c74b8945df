"""The range and cooperative-sticky assignors: Kafka's layouts, stickiness, incremental moves."""

from __future__ import annotations

import struct
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.client.assignors import (
    COOPERATIVE,
    EAGER,
    CooperativeStickyAssignor,
    GroupMember,
    RangeAssignor,
    assignors_for,
    rebalance_protocol,
)
from tidelog.client.groups import Subscription
from tidelog.client.types import TopicPartition as TP


def member(
    member_id: str,
    topics: tuple[str, ...] = ("t",),
    owned: tuple[TP, ...] = (),
    generation: int = -1,
    instance: str | None = None,
) -> GroupMember:
    return GroupMember(
        member_id,
        instance,
        Subscription(3, topics, None, owned_partitions=owned, generation_id=generation),
    )


def tps(topic: str, *partitions: int) -> list[TP]:
    return [TP(topic, p) for p in partitions]


# -- range ------------------------------------------------------------------------------------


def test_range_six_partitions_three_members_two_each_in_member_order() -> None:
    members = [member("consumer-c"), member("consumer-a"), member("consumer-b")]
    plan = RangeAssignor().assign({"t": 6}, members)
    assert plan == {
        "consumer-a": tps("t", 0, 1),
        "consumer-b": tps("t", 2, 3),
        "consumer-c": tps("t", 4, 5),
    }


def test_range_first_members_take_the_remainder_per_topic() -> None:
    # Kafka's documented example: two topics of three partitions, two consumers.
    members = [member("c0", ("t0", "t1")), member("c1", ("t0", "t1"))]
    plan = RangeAssignor().assign({"t0": 3, "t1": 3}, members)
    assert plan == {
        "c0": tps("t0", 0, 1) + tps("t1", 0, 1),
        "c1": tps("t0", 2) + tps("t1", 2),
    }


def test_range_orders_static_members_by_instance_id_before_dynamic_ones() -> None:
    members = [member("a-dynamic"), member("z-1", instance="i-2"), member("y-1", instance="i-1")]
    plan = RangeAssignor().assign({"t": 5}, members)
    assert plan == {"y-1": tps("t", 0, 1), "z-1": tps("t", 2, 3), "a-dynamic": tps("t", 4)}


def test_range_only_subscribers_share_a_topic_and_unknown_topics_are_skipped() -> None:
    members = [member("a", ("x", "y")), member("b", ("y",)), member("c", ("gone",))]
    plan = RangeAssignor().assign({"x": 2, "y": 3}, members)
    assert plan == {"a": tps("x", 0, 1) + tps("y", 0, 1), "b": tps("y", 2), "c": []}


def test_range_more_members_than_partitions_leaves_the_last_ones_empty() -> None:
    members = [member(f"m{i}") for i in range(4)]
    plan = RangeAssignor().assign({"t": 2}, members)
    assert plan == {"m0": tps("t", 0), "m1": tps("t", 1), "m2": [], "m3": []}


# -- cooperative-sticky ---------------------------------------------------------------------


def test_cooperative_sticky_first_assignment_is_balanced_and_complete() -> None:
    plan = CooperativeStickyAssignor().assign({"t": 7}, [member("a"), member("b"), member("c")])
    assert sorted(len(v) for v in plan.values()) == [2, 2, 3]
    assert sorted(tp for v in plan.values() for tp in v) == tps("t", *range(7))


def test_cooperative_sticky_new_member_takes_only_moved_partitions_in_two_rounds() -> None:
    assignor = CooperativeStickyAssignor()
    a_owned, b_owned = tuple(tps("t", 0, 1, 2)), tuple(tps("t", 3, 4, 5))
    first = assignor.assign(
        {"t": 6},
        [
            member("a", owned=a_owned, generation=1),
            member("b", owned=b_owned, generation=1),
            member("c"),
        ],
    )
    # Round one: the old owners keep all but what moves; the mover gets nothing yet.
    assert set(first["a"]) <= set(a_owned) and set(first["b"]) <= set(b_owned)
    assert first["c"] == []
    revoked = (set(a_owned) - set(first["a"])) | (set(b_owned) - set(first["b"]))
    assert len(revoked) == 2 and len(first["a"]) == len(first["b"]) == 2
    # Round two: the owners report what they kept; the revoked partitions go to c.
    second = assignor.assign(
        {"t": 6},
        [
            member("a", owned=tuple(first["a"]), generation=2),
            member("b", owned=tuple(first["b"]), generation=2),
            member("c", generation=-1),
        ],
    )
    assert second["a"] == first["a"] and second["b"] == first["b"]
    assert set(second["c"]) == revoked


def test_cooperative_sticky_member_leaving_keeps_everyone_elses_partitions() -> None:
    assignor = CooperativeStickyAssignor()
    plan = assignor.assign(
        {"t": 6},
        [
            member("a", owned=tuple(tps("t", 0, 1)), generation=4),
            member("c", owned=tuple(tps("t", 4, 5)), generation=4),
        ],
    )
    assert set(plan["a"]) >= set(tps("t", 0, 1)) and set(plan["c"]) >= set(tps("t", 4, 5))
    assert sorted(plan["a"] + plan["c"]) == tps("t", *range(6))
    assert len(plan["a"]) == len(plan["c"]) == 3


def test_cooperative_sticky_stale_and_conflicting_claims() -> None:
    assignor = CooperativeStickyAssignor()
    # b claims partition 0 from an older generation: a's newer claim wins and b gets other work.
    plan = assignor.assign(
        {"t": 2},
        [
            member("a", owned=(TP("t", 0),), generation=5),
            member("b", owned=(TP("t", 0),), generation=3),
        ],
    )
    assert plan == {"a": [TP("t", 0)], "b": [TP("t", 1)]}
    # Two claims in the same generation: neither counts, so the partition is free to go.
    plan = assignor.assign(
        {"t": 2},
        [
            member("a", owned=(TP("t", 0),), generation=5),
            member("b", owned=(TP("t", 0),), generation=5),
        ],
    )
    assert sorted(plan["a"] + plan["b"]) == tps("t", 0, 1) and len(plan["a"]) == 1


def test_cooperative_sticky_reads_the_generation_from_user_data_of_old_subscriptions() -> None:
    assignor = CooperativeStickyAssignor()
    old = GroupMember(
        "b", None, Subscription(1, ("t",), struct.pack(">i", 7), owned_partitions=(TP("t", 0),))
    )
    plan = assignor.assign({"t": 2}, [member("a", owned=(TP("t", 0),), generation=6), old])
    assert plan == {"a": [TP("t", 1)], "b": [TP("t", 0)]}
    assert assignor.user_data(9, []) == struct.pack(">i", 9)


def test_rebalance_protocol_is_cooperative_only_when_every_assignor_is() -> None:
    assert rebalance_protocol(assignors_for(["cooperative-sticky"])) == COOPERATIVE
    assert rebalance_protocol(assignors_for(["range", "cooperative-sticky"])) == EAGER
    assert rebalance_protocol(assignors_for(["range"])) == EAGER


@st.composite
def groups(draw: st.DrawFn) -> tuple[dict[str, int], list[GroupMember]]:
    counts = {t: draw(st.integers(1, 6)) for t in ("x", "y")}
    every = [TP(t, p) for t, n in counts.items() for p in range(n)]
    count = draw(st.integers(1, 5))
    members = []
    free = list(every)
    for i in range(count):
        mine = draw(st.lists(st.sampled_from(free), unique=True)) if free else []
        free = [tp for tp in free if tp not in mine]
        members.append(member(f"m{i}", ("x", "y"), tuple(mine), generation=3))
    return counts, members


@settings(max_examples=150, deadline=None)
@given(groups())
def test_cooperative_sticky_converges_without_taking_owned_partitions(
    group: tuple[dict[str, int], list[GroupMember]],
) -> None:
    counts, members = group
    assignor = CooperativeStickyAssignor()
    every = {TP(t, p) for t, n in counts.items() for p in range(n)}
    owners = {tp: m.member_id for m in members for tp in m.subscription.owned_partitions}
    plan = assignor.assign(counts, members)
    given_out = Counter(tp for v in plan.values() for tp in v)
    assert all(n == 1 for n in given_out.values())
    for member_id, assigned in plan.items():
        # Never a partition another member still owns; owned ones are only ever kept or revoked.
        assert all(owners.get(tp, member_id) == member_id for tp in assigned)
    # The next round, with revocations done, assigns everything, balanced within one.
    again = [
        GroupMember(
            m.member_id, None, Subscription(3, ("x", "y"), None, tuple(plan[m.member_id]), 4)
        )
        for m in members
    ]
    final = assignor.assign(counts, again)
    assert sorted(tp for v in final.values() for tp in v) == sorted(every)
    sizes = [len(v) for v in final.values()]
    assert max(sizes) - min(sizes) <= 1
    for m in again:
        # Sticky: a member that held no more than the smallest share keeps all it held.
        if len(m.subscription.owned_partitions) <= min(sizes):
            assert set(m.subscription.owned_partitions) <= set(final[m.member_id])
