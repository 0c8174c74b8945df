"""Group membership: JoinGroup, SyncGroup, Heartbeat, LeaveGroup, timeouts, static members."""

from __future__ import annotations

import pytest
from coordinator_helpers import Harness, subscription

from tidelog.coordinator import (
    GroupConfig,
    GroupState,
    JoinGroupResult,
    MemberIdentity,
    SyncGroupResult,
)
from tidelog.protocol.error_codes import ErrorCode

E = ErrorCode


def state(h: Harness, group: str = "g") -> GroupState:
    g = h.coord.group(group)
    assert g is not None
    return g.state


# -- full rebalances


@pytest.mark.parametrize("n", [1, 3, 10])
def test_full_rebalance_reaches_stable_with_everyone_assigned(n: int) -> None:
    h = Harness()
    members, gen, leader = h.form_group(n)
    assert gen == 1
    assert leader == members[0]
    assert state(h) is GroupState.STABLE
    for m in members:
        assert h.heartbeat(m, gen) is E.NONE
    g = h.coord.group("g")
    assert g is not None
    assert {mid: m.assignment for mid, m in g.members.items()} == {
        m: f"assign-{m}".encode() for m in members
    }


def test_leader_gets_all_member_metadata_and_followers_none() -> None:
    h = Harness()
    a, ta = h.join_new(client_id="a", protocols=[("range", b"meta-a")])
    b, tb = h.join_new(client_id="b", protocols=[("range", b"meta-b")])
    h.advance(3000)
    h.advance(3000)
    ra, rb = h.join_result(ta), h.join_result(tb)
    assert ra.leader == rb.leader == a
    assert [(m.member_id, m.metadata) for m in ra.members] == [(a, b"meta-a"), (b, b"meta-b")]
    assert rb.members == ()
    assert ra.protocol_type == "consumer" and ra.protocol_name == "range"
    assert state(h) is GroupState.COMPLETING_REBALANCE


def test_followers_wait_for_leader_sync_and_assignment_is_passed_through() -> None:
    h = Harness(auto_write=False)
    a, ta = h.join_new(client_id="a")
    b, _tb = h.join_new(client_id="b")
    h.advance(6000)
    gen = h.join_result(ta).generation_id
    sb = h.sync(b, gen, [(a, b"ignored")])  # a follower's assignment is ignored
    assert h.result(sb) is None
    assert h.held == []  # nothing is written for a follower
    blob = bytes(range(256))
    sa = h.sync(a, gen, [(a, b"x"), (b, blob), ("not-a-member", b"y")])
    assert h.result(sa) is None and h.result(sb) is None  # waiting for the append
    assert len(h.held) == 1
    h.release()
    assert h.sync_result(sa) == SyncGroupResult(E.NONE, b"x", "consumer", "range")
    assert h.sync_result(sb).assignment == blob
    assert state(h) is GroupState.STABLE


def test_generation_increases_with_each_rebalance() -> None:
    h = Harness()
    members, gen, leader = h.form_group(2)
    # a third member triggers a rebalance; everyone rejoins
    _c, tc = h.join_new(client_id="z")
    assert state(h) is GroupState.PREPARING_REBALANCE
    assert h.result(tc) is None
    assert h.heartbeat(members[0], gen) is E.REBALANCE_IN_PROGRESS
    t0 = h.join(members[0])
    assert h.result(t0) is None
    t1 = h.join(members[1])
    r = [h.join_result(t) for t in (t0, t1, tc)]
    assert {x.generation_id for x in r} == {gen + 1}
    assert r[0].leader == leader and len(r[0].members) == 3
    assert state(h) is GroupState.COMPLETING_REBALANCE


def test_follower_rejoin_in_stable_with_same_metadata_returns_current_generation() -> None:
    h = Harness()
    members, gen, leader = h.form_group(2)
    t = h.join(members[1])
    r = h.join_result(t)
    assert (r.error, r.generation_id, r.leader, r.members) == (E.NONE, gen, leader, ())
    assert state(h) is GroupState.STABLE
    # the leader rejoining means it wants a rebalance
    h.join(members[0])
    assert state(h) is GroupState.PREPARING_REBALANCE


def test_rejoin_in_completing_rebalance_resends_join_response() -> None:
    h = Harness()
    a, ta = h.join_new(client_id="a")
    h.advance(3000)
    first = h.join_result(ta)
    again = h.join_result(h.join(a))
    assert again == first
    assert state(h) is GroupState.COMPLETING_REBALANCE


# -- KIP-394


def test_member_id_required_then_join() -> None:
    h = Harness()
    t = h.join(version=5)
    r = h.join_result(t)
    assert r.error is E.MEMBER_ID_REQUIRED and r.member_id.startswith("c-")
    g = h.coord.group("g")
    assert g is not None and r.member_id in g.pending_members and not g.members
    t2 = h.join(r.member_id, version=5)
    h.advance(3000)
    assert h.join_result(t2).member_id == r.member_id
    assert r.member_id in g.members and not g.pending_members


def test_old_versions_join_without_member_id_round_trip() -> None:
    h = Harness()
    t = h.join(version=3)
    h.advance(3000)
    r = h.join_result(t)
    assert r.error is E.NONE and r.member_id and r.generation_id == 1


def test_pending_member_expires_after_session_timeout() -> None:
    h = Harness()
    members, gen, _ = h.form_group(1)
    r = h.join_result(h.join(session=8000))
    assert r.error is E.MEMBER_ID_REQUIRED
    g = h.coord.group("g")
    assert g is not None and r.member_id in g.pending_members
    h.heartbeat(members[0], gen)
    h.advance(7999)
    assert r.member_id in g.pending_members
    h.heartbeat(members[0], gen)
    h.advance(1)
    assert r.member_id not in g.pending_members
    t = h.join(r.member_id)
    assert h.join_result(t).error is E.UNKNOWN_MEMBER_ID


def test_pending_member_blocks_join_completion_until_it_expires() -> None:
    h = Harness()
    members, _gen, _ = h.form_group(1)
    pending = h.join_result(h.join(session=6000)).member_id
    # a rebalance starts (the leader rejoins); the pending member has not joined yet
    t = h.join(members[0])
    h.advance(5999)
    assert h.result(t) is None
    h.advance(1)  # the pending id expires; the join completes without it
    r = h.join_result(t)
    assert r.error is E.NONE and [m.member_id for m in r.members] == [members[0]]
    g = h.coord.group("g")
    assert g is not None and pending not in g.pending_members


# -- initial rebalance delay


def test_initial_delay_waits_and_extends_while_members_join() -> None:
    h = Harness(GroupConfig(group_initial_rebalance_delay_ms=3000))
    _a, ta = h.join_new(client_id="a", rebalance=10_000)
    h.advance(2000)
    _b, tb = h.join_new(client_id="b", rebalance=10_000)
    h.advance(1000)  # first delay over, but a member arrived: extended by another delay
    assert h.result(ta) is None
    h.advance(2999)
    assert h.result(ta) is None
    h.advance(1)
    assert h.join_result(ta).generation_id == 1 and len(h.join_result(ta).members) == 2
    assert h.join_result(tb).generation_id == 1


def test_initial_delay_is_bounded_by_rebalance_timeout() -> None:
    h = Harness(GroupConfig(group_initial_rebalance_delay_ms=3000))
    start = h.now
    _, ta = h.join_new(client_id="a", rebalance=7000)
    for i in range(20):  # a member arrives every second, for ever
        h.join_new(client_id=f"x{i}", rebalance=7000)
        h.advance(1000)
        if h.result(ta) is not None:
            break
    # delays of 3000 (4000 left), 3000 (1000 left), then 1000: done at the rebalance timeout
    assert h.now - start == 7000
    r = h.join_result(ta)
    assert r.error is E.NONE and len(r.members) == 8


def test_no_delay_for_a_stable_group_rebalance() -> None:
    h = Harness(GroupConfig(group_initial_rebalance_delay_ms=3000))
    members, gen, _ = h.form_group(1)
    t = h.join(members[0])  # leader rejoin: immediate, the group is not Empty
    assert h.join_result(t).generation_id == gen + 1


# -- protocols and validation


def test_protocol_selection_by_vote() -> None:
    h = Harness()
    _, ta = h.join_new(client_id="a", protocols=[("range", b""), ("rr", b""), ("sticky", b"")])
    _, _tb = h.join_new(client_id="b", protocols=[("rr", b""), ("range", b"")])
    _, tc = h.join_new(client_id="c", protocols=[("rr", b""), ("range", b"")])
    h.advance(6000)
    assert h.join_result(ta).protocol_name == "rr"  # 2 votes against 1
    assert h.join_result(tc).protocol_name == "rr"


def test_inconsistent_protocols_are_refused() -> None:
    h = Harness()
    h.form_group(1)
    r = h.join_result(h.join(protocols=[("other", b"")]))
    assert r.error is E.INCONSISTENT_GROUP_PROTOCOL
    r = h.join_result(h.join(protocol_type="connect"))
    assert r.error is E.INCONSISTENT_GROUP_PROTOCOL
    r = h.join_result(h.join(group="fresh", protocols=[]))
    assert r.error is E.INCONSISTENT_GROUP_PROTOCOL
    assert h.coord.group("fresh") is None  # a refused first join leaves nothing behind


@pytest.mark.parametrize("session", [5999, 1_800_001])
def test_session_timeout_bounds(session: int) -> None:
    h = Harness()
    assert h.join_result(h.join(session=session)).error is E.INVALID_SESSION_TIMEOUT


def test_unknown_member_id_on_join_and_invalid_group_id() -> None:
    h = Harness()
    assert h.join_result(h.join("nobody")).error is E.UNKNOWN_MEMBER_ID
    h.form_group(1)
    assert h.join_result(h.join("nobody")).error is E.UNKNOWN_MEMBER_ID
    assert h.join_result(h.join(group="")).error is E.INVALID_GROUP_ID


def test_group_max_size() -> None:
    h = Harness(GroupConfig(group_max_size=2))
    members, _, _ = h.form_group(2)
    r = h.join_result(h.join(client_id="third"))
    assert r.error is E.GROUP_MAX_SIZE_REACHED
    # existing members still rejoin
    assert h.result(h.join(members[1])) is not None


def test_not_coordinator_for_unowned_partition() -> None:
    h = Harness()
    p = h.coord.partition_for("g")
    h.apply(h.coord.unload_partition(p))
    assert h.join_result(h.join()).error is E.NOT_COORDINATOR
    h.coord.begin_loading(p)
    assert h.join_result(h.join()).error is E.COORDINATOR_LOAD_IN_PROGRESS


# -- heartbeats


def test_heartbeat_errors() -> None:
    h = Harness()
    members, gen, _ = h.form_group(2)
    assert h.heartbeat(members[0], gen) is E.NONE
    assert h.heartbeat(members[0], gen - 1) is E.ILLEGAL_GENERATION
    assert h.heartbeat(members[0], gen + 1) is E.ILLEGAL_GENERATION
    assert h.heartbeat("ghost", gen) is E.UNKNOWN_MEMBER_ID
    assert h.heartbeat(members[0], gen, group="nope") is E.UNKNOWN_MEMBER_ID
    h.join_new(client_id="new")
    assert h.heartbeat(members[1], gen) is E.REBALANCE_IN_PROGRESS


def test_heartbeats_keep_members_alive_and_silence_expires_them() -> None:
    h = Harness()
    members, gen, _ = h.form_group(2, session=10_000)
    for _ in range(5):
        h.advance(9000)
        assert h.heartbeat(members[0], gen) is E.NONE
        assert h.heartbeat(members[1], gen) is E.NONE
    h.advance(9000)
    assert h.heartbeat(members[0], gen) is E.NONE
    h.advance(1000)  # members[1] is silent for 10 s
    g = h.coord.group("g")
    assert g is not None and members[1] not in g.members
    assert state(h) is GroupState.PREPARING_REBALANCE
    t = h.join(members[0])  # the survivor rejoins and the rebalance completes
    r = h.join_result(t)
    assert r.generation_id == gen + 1 and [m.member_id for m in r.members] == [members[0]]


# -- sync errors


def test_sync_errors() -> None:
    h = Harness()
    members, gen, _ = h.form_group(2)
    assert h.sync_result(h.sync("ghost", gen)).error is E.UNKNOWN_MEMBER_ID
    assert h.sync_result(h.sync(members[0], gen, group="nope")).error is E.UNKNOWN_MEMBER_ID
    assert h.sync_result(h.sync(members[0], gen + 1)).error is E.ILLEGAL_GENERATION
    r = h.sync_result(h.sync(members[0], gen, protocol_type="connect"))
    assert r.error is E.INCONSISTENT_GROUP_PROTOCOL
    r = h.sync_result(h.sync(members[0], gen, protocol_name="rr"))
    assert r.error is E.INCONSISTENT_GROUP_PROTOCOL
    # Stable: a repeated sync returns the assignment at once
    r = h.sync_result(h.sync(members[1], gen, protocol_type="consumer", protocol_name="range"))
    assert r.error is E.NONE and r.assignment == f"assign-{members[1]}".encode()
    h.join_new(client_id="new")
    assert h.sync_result(h.sync(members[0], gen)).error is E.REBALANCE_IN_PROGRESS


def test_rebalance_during_completing_fails_waiting_syncs() -> None:
    h = Harness()
    a, ta = h.join_new(client_id="a")
    b, tb = h.join_new(client_id="b")
    h.advance(6000)
    gen = h.join_result(ta).generation_id
    sb = h.sync(b, gen)
    h.join_new(client_id="c")  # a new member during CompletingRebalance
    assert h.sync_result(sb).error is E.REBALANCE_IN_PROGRESS
    assert state(h) is GroupState.PREPARING_REBALANCE
    del a, tb


def test_sync_timeout_removes_members_that_never_synced() -> None:
    h = Harness()
    a, ta = h.join_new(client_id="a", rebalance=20_000, session=30_000)
    b, _tb = h.join_new(client_id="b", rebalance=20_000, session=30_000)
    h.advance(6000)
    gen = h.join_result(ta).generation_id
    sb = h.sync(b, gen)  # the leader never syncs
    h.advance(20_000)
    g = h.coord.group("g")
    assert g is not None and a not in g.members
    assert h.sync_result(sb).error is E.REBALANCE_IN_PROGRESS
    assert state(h) is GroupState.PREPARING_REBALANCE


def test_failed_assignment_write_fails_syncs_and_rebalances() -> None:
    h = Harness(auto_write=False)
    a, ta = h.join_new(client_id="a")
    h.advance(3000)
    gen = h.join_result(ta).generation_id
    sa = h.sync(a, gen, [(a, b"x")])
    h.release(E.NOT_LEADER_OR_FOLLOWER)
    assert h.sync_result(sa).error is E.NOT_COORDINATOR
    assert state(h) is GroupState.PREPARING_REBALANCE


# -- leaving


def test_leave_hands_over_at_once() -> None:
    h = Harness()
    members, gen, leader = h.form_group(3)
    r = h.leave(MemberIdentity(leader))
    assert r.error is E.NONE and r.legacy_error is E.NONE
    assert state(h) is GroupState.PREPARING_REBALANCE
    t1 = h.join(members[1])
    t2 = h.join(members[2])
    r1, r2 = h.join_result(t1), h.join_result(t2)
    assert r1.generation_id == gen + 1 and r1.leader == members[1] == r2.leader
    assert len(r1.members) == 2


def test_last_member_leaving_empties_the_group_and_writes_it() -> None:
    h = Harness()
    members, gen, _ = h.form_group(1)
    p = h.coord.partition_for("g")
    before = len(h.log[p])
    h.leave(MemberIdentity(members[0]))
    g = h.coord.group("g")
    assert g is not None and g.state is GroupState.EMPTY and g.generation == gen + 1
    assert len(h.log[p]) == before + 1


def test_leave_batch_with_per_member_errors() -> None:
    h = Harness()
    members, _, _ = h.form_group(2, instance=None)
    r = h.leave(
        MemberIdentity(members[0]),
        MemberIdentity("ghost"),
        MemberIdentity(members[1], "not-its-instance"),
        MemberIdentity("", "no-such-instance"),
    )
    assert [m.error for m in r.members] == [
        E.NONE,
        E.UNKNOWN_MEMBER_ID,
        E.UNKNOWN_MEMBER_ID,
        E.UNKNOWN_MEMBER_ID,
    ]
    assert r.legacy_error is E.UNKNOWN_MEMBER_ID
    r = h.leave(MemberIdentity("x"), group="nope")
    assert r.error is E.NONE and r.members[0].error is E.UNKNOWN_MEMBER_ID


def test_leave_of_a_member_waiting_in_join_answers_its_join() -> None:
    h = Harness()
    members, _, _ = h.form_group(2)
    t = h.join(members[0])  # leader rejoin: waits for members[1]
    h.leave(MemberIdentity(members[0]))
    assert h.join_result(t).error is E.UNKNOWN_MEMBER_ID


# -- rebalance timeout


def test_rebalance_timeout_removes_members_that_do_not_rejoin() -> None:
    h = Harness()
    members, gen, _ = h.form_group(3, rebalance=15_000, session=30_000)
    t0 = h.join(members[0], rebalance=15_000, session=30_000)
    t1 = h.join(members[1], rebalance=15_000, session=30_000)
    h.advance(14_999)
    assert h.result(t0) is None
    h.advance(1)
    r0 = h.join_result(t0)
    assert r0.generation_id == gen + 1
    assert {m.member_id for m in r0.members} == {members[0], members[1]}
    assert h.join_result(t1).error is E.NONE
    g = h.coord.group("g")
    assert g is not None and members[2] not in g.members


def test_new_member_that_never_completes_expires_by_join_timeout() -> None:
    cfg = GroupConfig(group_initial_rebalance_delay_ms=0, new_member_join_timeout_ms=50_000)
    h = Harness(cfg)
    members, gen, _ = h.form_group(1, rebalance=100_000, session=30_000)
    _, t_new = h.join_new(client_id="slow", rebalance=100_000)
    # members[0] keeps heartbeating but never rejoins; the new member is dropped at 50 s
    for _ in range(5):
        h.advance(10_000)
        h.heartbeat(members[0], gen)
    assert h.join_result(t_new).error is E.UNKNOWN_MEMBER_ID


# -- static membership


def test_static_member_restart_gets_assignment_back_without_rebalance() -> None:
    h2 = Harness()
    a, ta = h2.join_new(client_id="a")
    tb = h2.join(client_id="b", instance="inst-b")
    h2.advance(6000)
    gen = h2.join_result(ta).generation_id
    b = h2.join_result(tb).member_id
    sa = h2.sync(a, gen, [(a, b"A"), (b, b"B")])
    sb = h2.sync(b, gen, instance="inst-b")
    assert h2.sync_result(sa).assignment == b"A" and h2.sync_result(sb).assignment == b"B"
    p = h2.coord.partition_for("g")
    writes_before = len(h2.log[p])
    # b restarts: no member id, same instance, same metadata
    t = h2.join(client_id="b", instance="inst-b")
    r = h2.join_result(t)
    assert r.error is E.NONE and r.generation_id == gen and r.member_id != b
    assert r.leader == a and r.members == ()
    assert state(h2) is GroupState.STABLE
    assert len(h2.log[p]) == writes_before + 1  # the new member id is written
    s = h2.sync_result(h2.sync(r.member_id, gen, instance="inst-b"))
    assert s.error is E.NONE and s.assignment == b"B"
    # the old incarnation is fenced
    assert h2.heartbeat(b, gen, instance="inst-b") is E.FENCED_INSTANCE_ID
    assert h2.sync_result(h2.sync(b, gen, instance="inst-b")).error is E.FENCED_INSTANCE_ID
    assert h2.join_result(h2.join(b, instance="inst-b")).error is E.FENCED_INSTANCE_ID
    assert h2.heartbeat(a, gen) is E.NONE


def test_static_leader_restart_skips_assignment_on_v9_and_hides_leadership_before() -> None:
    for version in (9, 5):
        h = Harness()
        ta = h.join(client_id="a", instance="inst-a", version=version)
        h.advance(3000)
        r = h.join_result(ta)
        a, gen = r.member_id, r.generation_id
        h.sync_result(h.sync(a, gen, [(a, b"A")], instance="inst-a"))
        r2 = h.join_result(h.join(client_id="a", instance="inst-a", version=version))
        assert r2.generation_id == gen and state(h) is GroupState.STABLE
        if version >= 9:
            assert r2.skip_assignment and r2.leader == r2.member_id and len(r2.members) == 1
        else:
            assert not r2.skip_assignment and r2.leader == a and r2.members == ()
        s = h.sync_result(h.sync(r2.member_id, gen, instance="inst-a"))
        assert s.assignment == b"A"


def test_static_member_with_new_metadata_keeps_the_generation_if_the_protocol_stays() -> None:
    """Kafka rebalances a Stable group on a static rejoin only when the protocol it would
    select changes; new subscription bytes alone (the Java client's carry its last
    generation) do not. The client itself rejoins if its subscription really changed."""
    h = Harness()
    ta = h.join(client_id="a", instance="ia", protocols=[("range", subscription(["t1"]))])
    h.advance(3000)
    r = h.join_result(ta)
    h.sync(r.member_id, r.generation_id, [(r.member_id, b"A")], instance="ia")
    t = h.join(client_id="a", instance="ia", protocols=[("range", subscription(["t1", "t2"]))])
    r2 = h.join_result(t)
    assert r2.error is E.NONE and r2.generation_id == r.generation_id


def test_static_member_whose_protocol_changes_triggers_a_rebalance() -> None:
    h = Harness()
    ta = h.join(client_id="a", instance="ia", protocols=[("range", subscription(["t1"]))])
    h.advance(3000)
    r = h.join_result(ta)
    h.sync(r.member_id, r.generation_id, [(r.member_id, b"A")], instance="ia")
    # Still supports the group's protocol, but now prefers another: the vote changes.
    sub = subscription(["t1"])
    t = h.join(client_id="a", instance="ia", protocols=[("roundrobin", sub), ("range", sub)])
    r2 = h.join_result(t)
    assert r2.error is E.NONE and r2.generation_id == r.generation_id + 1
    assert r2.protocol_name == "roundrobin"


def test_static_member_replaced_while_waiting_is_fenced() -> None:
    h = Harness()
    t_old = h.join(client_id="a", instance="ia", rebalance=60_000)
    h.join_new(client_id="b", rebalance=60_000)  # keeps the initial delay going
    t_new = h.join(client_id="a", instance="ia", rebalance=60_000)
    assert h.join_result(t_old).error is E.FENCED_INSTANCE_ID
    h.advance(6000)
    assert h.join_result(t_new).error is E.NONE


def test_static_member_survives_session_but_leaves_by_instance_id() -> None:
    h = Harness()
    ta = h.join(client_id="a", instance="ia", session=10_000)
    h.advance(3000)
    r = h.join_result(ta)
    h.sync(r.member_id, r.generation_id, [(r.member_id, b"A")], instance="ia")
    # A static member is not removed by a leave naming a different instance
    lr = h.leave(MemberIdentity(r.member_id, "ib"))
    assert lr.members[0].error is E.UNKNOWN_MEMBER_ID
    lr = h.leave(MemberIdentity("", "ia"))
    assert lr.members[0].error is E.NONE
    assert state(h) is GroupState.EMPTY


def test_static_restart_write_failure_reverts_the_replacement() -> None:
    h = Harness(auto_write=False)
    ta = h.join(client_id="a", instance="ia")
    h.advance(3000)
    r = h.join_result(ta)
    h.sync(r.member_id, r.generation_id, [(r.member_id, b"A")], instance="ia")
    h.release()
    t = h.join(client_id="a", instance="ia")
    h.release(E.REQUEST_TIMED_OUT)
    res = h.result(t)
    assert isinstance(res, JoinGroupResult) and res.error is E.COORDINATOR_NOT_AVAILABLE
    assert h.heartbeat(r.member_id, r.generation_id, instance="ia") is E.NONE


def test_every_waiting_request_is_answered_on_unload() -> None:
    h = Harness()
    members, _, _ = h.form_group(2)
    t = h.join(members[0])
    h.apply(h.coord.unload_partition(h.coord.partition_for("g")))
    assert h.join_result(t).error is E.NOT_COORDINATOR
    assert h.coord.group("g") is None


def test_leave_of_a_pending_member_and_of_a_static_member_by_member_id() -> None:
    h = Harness()
    pending = h.join_result(h.join()).member_id
    assert h.leave(MemberIdentity(pending)).members[0].error is E.NONE
    g = h.coord.group("g")
    assert g is None or pending not in g.pending_members
    ta = h.join(client_id="a", instance="ia")
    h.advance(3000)
    a = h.join_result(ta).member_id
    assert h.leave(MemberIdentity(a)).members[0].error is E.NONE
    assert state(h) is GroupState.EMPTY
