"""Persistence: the records a coordinator writes rebuild its state when replayed."""

from __future__ import annotations

from coordinator_helpers import Harness, subscription

from tidelog.coordinator import (
    GroupConfig,
    GroupCoordinator,
    GroupRecordError,
    GroupState,
    MemberIdentity,
    replay_partition,
)
from tidelog.coordinator.records import encode_group_metadata_key, encode_offset_commit_key
from tidelog.protocol.error_codes import ErrorCode
from tidelog.records import Record

E = ErrorCode


def replayed(h: Harness) -> GroupCoordinator:
    """A fresh coordinator that loaded every partition the harness wrote."""
    other = GroupCoordinator(h.config, owned_partitions=())
    for p in range(h.config.offsets_topic_num_partitions):
        h.apply(other.load_partition(p, h.records(p), h.now))
    return other


def test_round_trip_of_stable_empty_and_simple_groups() -> None:
    h = Harness()
    # a Stable group with a static member and offsets
    ta = h.join(
        group="stable", client_id="a", instance="ia", protocols=[("range", subscription(["t"]))]
    )
    h.advance(3000)
    r = h.join_result(ta)
    h.sync(r.member_id, r.generation_id, [(r.member_id, b"A")], group="stable", instance="ia")
    h.commit(
        {("t", 0): 5, ("t", 1): 6},
        group="stable",
        generation=r.generation_id,
        member_id=r.member_id,
        metadata="meta",
        leader_epoch=2,
    )
    # a consumer group that emptied
    members, gen, _ = h.form_group(2, group="emptied")
    h.commit({("u", 0): 1}, group="emptied", generation=gen, member_id=members[0])
    h.leave(MemberIdentity(members[0]), MemberIdentity(members[1]), group="emptied")
    # a group that only commits, with an offset overwritten and one deleted
    h.commit({("v", 0): 1, ("v", 1): 2}, group="simple")
    h.commit({("v", 0): 10}, group="simple")
    token = h.token()
    h.apply(h.coord.delete_offsets(token, h.now, "simple", [("v", 1)]))
    # a deleted group leaves nothing
    h.commit({("w", 0): 1}, group="deleted")
    h.apply(h.coord.delete_groups(h.token(), h.now, ["deleted"]))

    other = replayed(h)
    assert other.snapshot() == h.coord.snapshot()
    snap = other.snapshot()
    assert set(snap) == {"stable", "emptied", "simple"}
    assert snap["stable"].state == "Stable" and snap["stable"].members[0].assignment == b"A"
    assert snap["emptied"].state == "Empty" and snap["emptied"].generation == gen + 1
    assert [(t, p, o.offset) for t, p, o in snap["simple"].offsets] == [("v", 0, 10)]


def test_replayed_group_keeps_working() -> None:
    h = Harness()
    members, gen, _ = h.form_group(2, group="g")
    other = replayed(h)
    h.coord = other
    # members of the loaded Stable group heartbeat and sync as before
    assert h.heartbeat(members[0], gen) is E.NONE
    s = h.sync_result(h.sync(members[1], gen))
    assert s.assignment == f"assign-{members[1]}".encode()
    # and sessions were started on load: silence removes them
    h.advance(h.config.group_max_session_timeout_ms)
    g = other.group("g")
    assert g is not None and not g.members


def test_replay_of_a_group_mid_rebalance_gives_the_last_stable_generation() -> None:
    h = Harness()
    members, gen, _ = h.form_group(2)
    h.join(members[0])  # PreparingRebalance now; nothing written for it
    h.coord = replayed(h)
    g = h.coord.group("g")
    assert g is not None and g.state is GroupState.STABLE and g.generation == gen
    assert h.heartbeat(members[1], gen) is E.NONE
    # the leader's JoinGroup, retried at the new coordinator, starts the rebalance again
    h.join(members[0])
    assert h.coord.describe_group("g").state == "PreparingRebalance"


class _Rec:
    def __init__(self, key: bytes | None, value: bytes | None) -> None:
        self.key = key
        self.value = value


def test_replay_rules() -> None:
    key_g = encode_group_metadata_key("a")
    off = encode_offset_commit_key("a", "t", 0)
    h = Harness()
    h.commit({("t", 0): 3}, group="a")
    value = h.records(h.coord.partition_for("a"))[-1].value
    # offsets after a group tombstone make a group that only stores offsets
    groups = replay_partition([_Rec(key_g, None), _Rec(off, value)], 0)
    assert groups["a"].protocol_type is None and groups["a"].offsets[("t", 0)].offset == 3
    # an offset tombstone removes it; with nothing left there is no group
    assert replay_partition([_Rec(off, value), _Rec(off, None)], 0) == {}
    # records of other group types are skipped
    assert replay_partition([_Rec(b"\x00\x05junk", b"x")], 0) == {}
    try:
        replay_partition([_Rec(None, b"x")], 0)
    except GroupRecordError:
        pass
    else:
        raise AssertionError("a record without key must be refused")


def test_records_decode_through_the_batch_codec() -> None:
    h = Harness()
    h.commit({("t", 0): 1})
    recs = h.records(h.coord.partition_for("g"))
    assert all(isinstance(r, Record) for r in recs)
    assert recs[-1].timestamp == h.now


def test_load_answers_coordinator_load_in_progress_meanwhile() -> None:
    h = Harness(GroupConfig())
    p = h.coord.partition_for("g")
    h.coord.begin_loading(p)
    assert h.coord.fetch_offsets("g").error is E.COORDINATOR_LOAD_IN_PROGRESS
    assert h.coord.list_groups().error is E.COORDINATOR_LOAD_IN_PROGRESS
    h.apply(h.coord.load_partition(p, [], h.now))
    assert h.coord.fetch_offsets("g").error is E.NONE
