"""Committed offsets, group deletion, listing, describing and expiration."""

from __future__ import annotations

from coordinator_helpers import Harness, subscription

from tidelog.coordinator import (
    DeleteGroupsResult,
    FetchedOffset,
    GroupConfig,
    GroupState,
    MemberIdentity,
    OffsetDeleteResult,
    OffsetFetchGroup,
)
from tidelog.protocol.error_codes import ErrorCode

E = ErrorCode
MINUTE = 60_000


def fetched(h: Harness, group: str = "g") -> dict[tuple[str, int], int]:
    r = h.coord.fetch_offsets(group)
    assert r.error is E.NONE
    return {(p.topic, p.partition): p.offset for p in r.partitions}


def delete_offsets(
    h: Harness, parts: list[tuple[str, int]], group: str = "g"
) -> OffsetDeleteResult:
    token = h.token("odel")
    h.apply(h.coord.delete_offsets(token, h.now, group, parts))
    r = h.result(token)
    assert isinstance(r, OffsetDeleteResult)
    return r


def delete_groups(h: Harness, *groups: str) -> dict[str, ErrorCode]:
    token = h.token("gdel")
    h.apply(h.coord.delete_groups(token, h.now, list(groups)))
    r = h.result(token)
    assert isinstance(r, DeleteGroupsResult)
    return {g.group_id: g.error for g in r.groups}


# -- commit and fetch


def test_simple_commit_and_fetch() -> None:
    h = Harness()
    t = h.commit({("t", 0): 10, ("t", 1): 20}, metadata="m", leader_epoch=3)
    assert h.commit_errors(t) == [E.NONE, E.NONE]
    r = h.coord.fetch_offsets("g", [("t", 0), ("t", 1), ("t", 2), ("u", 0)])
    assert r.partitions == (
        FetchedOffset("t", 0, 10, 3, "m"),
        FetchedOffset("t", 1, 20, 3, "m"),
        FetchedOffset("t", 2, -1, -1, ""),
        FetchedOffset("u", 0, -1, -1, ""),
    )
    assert fetched(h) == {("t", 0): 10, ("t", 1): 20}
    g = h.coord.group("g")
    assert g is not None and g.protocol_type is None and g.state is GroupState.EMPTY
    assert g.offsets[("t", 0)].commit_timestamp == h.now


def test_fetch_of_several_groups() -> None:
    h = Harness()
    h.commit({("t", 0): 1}, group="a")
    h.commit({("t", 0): 2, ("t", 1): 3}, group="b")
    results = h.coord.fetch_offsets_many(
        [OffsetFetchGroup("b", None), OffsetFetchGroup("a", [("t", 0), ("t", 1)])],
        require_stable=True,
    )
    assert [r.group_id for r in results] == ["b", "a"]
    assert [p.offset for p in results[0].partitions] == [2, 3]
    assert [p.offset for p in results[1].partitions] == [1, -1]


def test_fetch_of_unknown_group() -> None:
    h = Harness()
    assert h.coord.fetch_offsets("nope").partitions == ()
    r = h.coord.fetch_offsets("nope", [("t", 0)])
    assert r.error is E.NONE and r.partitions == (FetchedOffset("t", 0, -1, -1, ""),)


def test_commit_is_visible_only_after_the_append() -> None:
    h = Harness(auto_write=False)
    t = h.commit({("t", 0): 5})
    assert h.result(t) is None and fetched(h) == {}
    h.release()
    assert h.commit_errors(t) == [E.NONE] and fetched(h) == {("t", 0): 5}


def test_failed_append_is_reported_and_not_applied() -> None:
    h = Harness(auto_write=False)
    t = h.commit({("t", 0): 5})
    h.release(E.MESSAGE_TOO_LARGE)
    assert h.commit_errors(t) == [E.INVALID_COMMIT_OFFSET_SIZE]
    assert fetched(h) == {}


def test_unknown_topics_by_hook_and_oversized_metadata() -> None:
    h = Harness(topic_exists=lambda topic, partition: topic == "t" and partition < 2)
    t = h.commit({("t", 0): 1, ("t", 5): 1, ("nope", 0): 1})
    assert h.commit_errors(t) == [
        E.NONE,
        E.UNKNOWN_TOPIC_OR_PARTITION,
        E.UNKNOWN_TOPIC_OR_PARTITION,
    ]
    assert fetched(h) == {("t", 0): 1}
    t = h.commit({("t", 1): 1}, metadata="x" * 4097)
    assert h.commit_errors(t) == [E.OFFSET_METADATA_TOO_LARGE]
    t = h.commit({("t", 1): 1}, metadata="x" * 4096)
    assert h.commit_errors(t) == [E.NONE]
    # Java counts UTF-16 units: 2048 emoji are 4096 units, one more is too many
    assert h.commit_errors(h.commit({("t", 1): 2}, metadata="😀" * 2048)) == [E.NONE]
    assert h.commit_errors(h.commit({("t", 1): 3}, metadata="😀" * 2049)) == [
        E.OFFSET_METADATA_TOO_LARGE
    ]
    assert fetched(h)[("t", 1)] == 2


def test_null_metadata_is_stored_as_empty() -> None:
    h = Harness()
    h.commit({("t", 0): 1}, metadata=None)
    assert h.coord.fetch_offsets("g").partitions[0].metadata == ""


def test_member_commit_checks_generation_and_member() -> None:
    h = Harness()
    members, gen, _ = h.form_group(2)
    ok = h.commit({("t", 0): 7}, generation=gen, member_id=members[0])
    assert h.commit_errors(ok) == [E.NONE]
    bad_gen = h.commit({("t", 0): 8}, generation=gen - 1, member_id=members[0])
    assert h.commit_errors(bad_gen) == [E.ILLEGAL_GENERATION]
    ghost = h.commit({("t", 0): 8}, generation=gen, member_id="ghost")
    assert h.commit_errors(ghost) == [E.UNKNOWN_MEMBER_ID]
    simple = h.commit({("t", 0): 8})  # generation -1 into a group with members
    assert h.commit_errors(simple) == [E.UNKNOWN_MEMBER_ID]
    assert fetched(h) == {("t", 0): 7}
    # during PreparingRebalance the old generation may still commit
    h.join_new(client_id="z")
    t = h.commit({("t", 0): 9}, generation=gen, member_id=members[0])
    assert h.commit_errors(t) == [E.NONE]


def test_commit_during_completing_rebalance() -> None:
    h = Harness()
    a, ta = h.join_new(client_id="a")
    h.advance(3000)
    gen = h.join_result(ta).generation_id
    t = h.commit({("t", 0): 1}, generation=gen, member_id=a)
    assert h.commit_errors(t) == [E.REBALANCE_IN_PROGRESS]


def test_commit_with_generation_for_unknown_group() -> None:
    h = Harness()
    t = h.commit({("t", 0): 1}, generation=3, member_id="m", version=8)
    assert h.commit_errors(t) == [E.ILLEGAL_GENERATION]
    t = h.commit({("t", 0): 1}, generation=3, member_id="m", version=9)
    assert h.commit_errors(t) == [E.GROUP_ID_NOT_FOUND]
    assert h.coord.group("g") is None


def test_simple_commit_into_empty_consumer_group() -> None:
    h = Harness()
    members, _, _ = h.form_group(1)
    h.leave(MemberIdentity(members[0]))
    t = h.commit({("t", 0): 4})
    assert h.commit_errors(t) == [E.NONE] and fetched(h) == {("t", 0): 4}


# -- OffsetDelete


def test_offset_delete() -> None:
    h = Harness()
    h.commit({("t", 0): 1, ("t", 1): 2, ("u", 0): 3})
    r = delete_offsets(h, [("t", 0), ("x", 9)])
    assert r.error is E.NONE and [p.error for p in r.partitions] == [E.NONE, E.NONE]
    assert fetched(h) == {("t", 1): 2, ("u", 0): 3}
    assert delete_offsets(h, [("t", 0)], group="nope").error is E.GROUP_ID_NOT_FOUND


def test_offset_delete_refused_for_subscribed_topics() -> None:
    h = Harness()
    for v in (0, 1, 2, 3):  # every ConsumerProtocolSubscription version is understood
        h = Harness()
        members, gen, _ = h.form_group(
            2, protocols=[("range", subscription(["t", "u"], version=v))]
        )
        h.commit({("t", 0): 1, ("other", 0): 2}, generation=gen, member_id=members[0])
        r = delete_offsets(h, [("t", 0), ("other", 0)])
        assert [p.error for p in r.partitions] == [E.GROUP_SUBSCRIBED_TO_TOPIC, E.NONE]
        assert fetched(h) == {("t", 0): 1}


def test_offset_delete_with_unreadable_subscription_assumes_subscribed() -> None:
    h = Harness()
    members, gen, _ = h.form_group(1, protocols=[("range", b"\x00")])
    h.commit({("t", 0): 1}, generation=gen, member_id=members[0])
    r = delete_offsets(h, [("t", 0)])
    assert [p.error for p in r.partitions] == [E.GROUP_SUBSCRIBED_TO_TOPIC]


def test_offset_delete_of_non_consumer_group_with_members() -> None:
    h = Harness()
    h.form_group(1, protocol_type="connect")
    assert delete_offsets(h, [("t", 0)]).error is E.NON_EMPTY_GROUP


# -- DeleteGroups


def test_delete_groups() -> None:
    h = Harness()
    h.commit({("t", 0): 1}, group="simple")
    h.form_group(1, group="busy")
    errors = delete_groups(h, "simple", "busy", "missing")
    assert errors == {
        "simple": E.NONE,
        "busy": E.NON_EMPTY_GROUP,
        "missing": E.GROUP_ID_NOT_FOUND,
    }
    assert h.coord.group("simple") is None
    assert fetched(h, "simple") == {}
    assert delete_groups(h, "simple") == {"simple": E.GROUP_ID_NOT_FOUND}
    recs = h.records(h.coord.partition_for("simple"))
    assert [r.value for r in recs[-2:]] == [None, None]  # offset and group tombstones


def test_delete_group_waits_for_its_tombstones() -> None:
    h = Harness(auto_write=False)
    h.commit({("t", 0): 1}, group="a")
    h.release()
    token = h.token()
    h.apply(h.coord.delete_groups(token, h.now, ["a"]))
    assert h.result(token) is None
    h.release()
    assert isinstance(h.result(token), DeleteGroupsResult)


def test_delete_group_tombstones_commits_in_flight() -> None:
    h = Harness(auto_write=False)
    t = h.commit({("t", 0): 1}, group="a")
    token = h.token()
    h.apply(h.coord.delete_groups(token, h.now, ["a"]))
    h.release()
    assert h.commit_errors(t) == [E.NONE]
    assert h.coord.group("a") is None
    recs = h.records(h.coord.partition_for("a"))
    assert [r.value is None for r in recs] == [False, True, True]


# -- ListGroups and DescribeGroups


def test_list_groups_with_filters() -> None:
    h = Harness()
    h.form_group(1, group="stable")
    h.commit({("t", 0): 1}, group="simple")
    h.join_new(group="joining", client_id="j")
    everything = h.coord.list_groups()
    assert [(g.group_id, g.protocol_type, g.state) for g in everything.groups] == [
        ("joining", "consumer", "PreparingRebalance"),
        ("simple", "", "Empty"),
        ("stable", "consumer", "Stable"),
    ]
    assert [g.group_id for g in h.coord.list_groups(["stable", "EMPTY"]).groups] == [
        "simple",
        "stable",
    ]
    assert h.coord.list_groups(types_filter=["consumer"]).groups == ()
    assert len(h.coord.list_groups(types_filter=["Classic"]).groups) == 3
    assert all(g.group_type == "classic" for g in everything.groups)


def test_describe_groups() -> None:
    h = Harness()
    members, _, leader = h.form_group(2, protocols=[("range", b"sub")])
    d = h.coord.describe_group("g")
    assert (d.error, d.state, d.protocol_type, d.protocol_data) == (
        E.NONE,
        "Stable",
        "consumer",
        "range",
    )
    assert [
        (m.member_id, m.client_id, m.client_host, m.metadata, m.assignment) for m in d.members
    ] == [
        (mid, f"c{i}", "/127.0.0.1", b"sub", f"assign-{mid}".encode())
        for i, mid in enumerate(members)
    ]
    h.join(leader)  # now PreparingRebalance: no protocol, no metadata (as Kafka shows it)
    d = h.coord.describe_group("g")
    assert d.state == "PreparingRebalance" and d.protocol_data == ""
    assert all(m.metadata == b"" and m.assignment == b"" for m in d.members)
    old = h.coord.describe_group("missing", api_version=5)
    assert (old.error, old.state) == (E.NONE, "Dead")
    new = h.coord.describe_group("missing", api_version=6)
    assert (new.error, new.state) == (E.GROUP_ID_NOT_FOUND, "Dead")


# -- expiration


def test_offsets_of_empty_group_expire_after_retention_since_it_became_empty() -> None:
    cfg = GroupConfig(offsets_retention_ms=10 * MINUTE, offsets_retention_check_interval_ms=MINUTE)
    h = Harness(cfg)
    members, gen, _ = h.form_group(1, protocols=[("range", subscription(["t"]))])
    h.commit({("t", 0): 1}, generation=gen, member_id=members[0])
    for _ in range(200):  # 30 minutes of heartbeats
        assert h.heartbeat(members[0], gen) is E.NONE
        h.advance(9000)
    # Stable and subscribed to t: the old commit is kept
    assert fetched(h) == {("t", 0): 1}
    h.leave(MemberIdentity(members[0]))
    empty_since = h.now
    while h.now - empty_since < 9 * MINUTE:
        h.advance(MINUTE)
    assert fetched(h) == {("t", 0): 1}
    while h.now - empty_since <= 11 * MINUTE:
        h.advance(MINUTE)
    assert fetched(h) == {}
    assert h.coord.group("g") is None  # no members, no offsets: Dead and gone
    recs = h.records(h.coord.partition_for("g"))
    assert [r.value is None for r in recs[-2:]] == [True, True]


def test_simple_group_offsets_expire_by_commit_time() -> None:
    h = Harness(GroupConfig(offsets_retention_ms=10 * MINUTE))
    h.commit({("t", 0): 1})
    h.advance(5 * MINUTE)
    h.commit({("t", 1): 1})
    h.apply(h.coord.expire_offsets(h.now + 10 * MINUTE - 1))
    assert fetched(h) == {("t", 1): 1}
    h.apply(h.coord.expire_offsets(h.now + 10 * MINUTE))
    assert h.coord.group("g") is None


def test_explicit_retention_of_old_commit_versions() -> None:
    h = Harness(GroupConfig(offsets_retention_ms=10 * MINUTE))
    h.commit({("t", 0): 1}, retention=MINUTE)
    h.commit({("t", 1): 1})
    h.apply(h.coord.expire_offsets(h.now + MINUTE))
    assert fetched(h) == {("t", 1): 1}


def test_stable_group_expires_offsets_of_unsubscribed_topics() -> None:
    h = Harness(GroupConfig(offsets_retention_ms=10 * MINUTE))
    members, gen, _ = h.form_group(1, protocols=[("range", subscription(["t"]))])
    h.commit({("t", 0): 1, ("gone", 0): 2}, generation=gen, member_id=members[0])
    h.apply(h.coord.expire_offsets(h.now + 10 * MINUTE))
    assert fetched(h) == {("t", 0): 1}
