"""Random sequences of group operations never break the coordinator's invariants."""

from __future__ import annotations

from dataclasses import dataclass

from coordinator_helpers import Harness, subscription
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from tidelog.coordinator import (
    GroupConfig,
    GroupState,
    JoinGroupResult,
    MemberIdentity,
)
from tidelog.coordinator.group import Group
from tidelog.protocol.error_codes import ErrorCode

E = ErrorCode
CLIENTS = 5
STATE_NAMES = {"Empty", "PreparingRebalance", "CompletingRebalance", "Stable", "Dead"}
PROTOCOLS = [
    [("range", subscription(["t"]))],
    [("range", subscription(["t", "u"]))],
    [("rr", subscription(["t"])), ("range", subscription(["t"]))],
]


@dataclass
class Client:
    """What one consumer knows: its member id, generation, and the last join response."""

    instance: str | None
    member_id: str = ""
    generation: int = -1
    last_join: JoinGroupResult | None = None
    join_token: str | None = None
    sync_token: str | None = None
    synced_generation: int = -1


class GroupMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        cfg = GroupConfig(
            group_initial_rebalance_delay_ms=1000,
            group_min_session_timeout_ms=1000,
            group_max_size=4,
        )
        self.h = Harness(cfg, auto_write=False)
        # clients 0 and 1 are static members
        self.clients = [Client(f"inst-{i}" if i < 2 else None) for i in range(CLIENTS)]
        # the group object last seen and its generation (a group that expires comes back as
        # a new object, from generation 0)
        self.last_seen: tuple[Group, int] | None = None
        self.leader_of_generation: dict[tuple[int, int], str] = {}
        self.keep_alive: list[Group] = []
        self.instance_of: dict[str, str] = {}

    # -- plumbing

    def group(self) -> Group | None:
        return self.h.coord.group("g")

    def absorb(self) -> None:
        """Let clients learn from the responses they got."""
        for c in self.clients:
            if c.join_token is not None and self.h.responses.get(c.join_token):
                r = self.h.join_result(c.join_token)
                c.join_token = None
                if r.error is E.MEMBER_ID_REQUIRED or (r.error is E.NONE and r.member_id):
                    c.member_id = r.member_id
                if r.error is E.NONE:
                    c.generation = r.generation_id
                    c.last_join = r
                    g = self.group()
                    if c.instance is not None:
                        self.instance_of[r.member_id] = c.instance
                    if g is not None:  # (it may have expired since, within one tick)
                        self.keep_alive.append(g)  # so that id() is not reused
                        previous = self.leader_of_generation.setdefault(
                            (id(g), r.generation_id), r.leader
                        )
                        # one leader per generation; only a static leader that restarted
                        # may appear under a new member id
                        same_instance = self.instance_of.get(previous) is not None and (
                            self.instance_of.get(previous) == self.instance_of.get(r.leader)
                        )
                        assert previous == r.leader or same_instance, (previous, r.leader)
                        self.leader_of_generation[(id(g), r.generation_id)] = r.leader
                elif r.error in (E.UNKNOWN_MEMBER_ID, E.FENCED_INSTANCE_ID):
                    c.member_id, c.generation = "", -1
            if c.sync_token is not None and self.h.responses.get(c.sync_token):
                s = self.h.sync_result(c.sync_token)
                c.sync_token = None
                if s.error is E.NONE:
                    c.synced_generation = c.generation
                if s.error in (E.UNKNOWN_MEMBER_ID, E.FENCED_INSTANCE_ID):
                    c.member_id, c.generation = "", -1

    # -- rules

    @rule(i=st.integers(0, CLIENTS - 1), proto=st.integers(0, len(PROTOCOLS) - 1))
    def join(self, i: int, proto: int) -> None:
        c = self.clients[i]
        if c.join_token is not None:
            return  # a client has one JoinGroup in flight at a time
        c.join_token = self.h.join(
            c.member_id,
            client_id=f"c{i}",
            instance=c.instance,
            protocols=PROTOCOLS[proto],
            session=5000,
            rebalance=8000,
        )
        self.absorb()

    @rule(i=st.integers(0, CLIENTS - 1))
    def sync(self, i: int) -> None:
        c = self.clients[i]
        if not c.member_id or c.sync_token is not None:
            return
        assignments: list[tuple[str, bytes]] = []
        j = c.last_join
        if j is not None and j.leader == c.member_id and j.generation_id == c.generation:
            assignments = [(m.member_id, f"gen{c.generation}".encode()) for m in j.members]
        c.sync_token = self.h.sync(c.member_id, c.generation, assignments, instance=c.instance)
        self.absorb()

    @rule(i=st.integers(0, CLIENTS - 1))
    def heartbeat(self, i: int) -> None:
        c = self.clients[i]
        if c.member_id:
            err = self.h.heartbeat(c.member_id, c.generation, instance=c.instance)
            assert err in {
                E.NONE,
                E.REBALANCE_IN_PROGRESS,
                E.ILLEGAL_GENERATION,
                E.UNKNOWN_MEMBER_ID,
                E.FENCED_INSTANCE_ID,
            }

    @rule(i=st.integers(0, CLIENTS - 1), by_instance=st.booleans())
    def leave(self, i: int, by_instance: bool) -> None:
        c = self.clients[i]
        if by_instance and c.instance is not None:
            self.h.leave(MemberIdentity("", c.instance))
        elif c.member_id:
            self.h.leave(MemberIdentity(c.member_id, c.instance))
        else:
            return
        c.member_id, c.generation = "", -1
        self.absorb()

    @rule(i=st.integers(0, CLIENTS - 1), offset=st.integers(0, 100))
    def commit(self, i: int, offset: int) -> None:
        c = self.clients[i]
        self.h.commit({("t", 0): offset}, generation=c.generation, member_id=c.member_id)
        self.absorb()

    @rule(ms=st.sampled_from([0, 100, 999, 1000, 3000, 5000, 8000, 60_000]))
    def tick(self, ms: int) -> None:
        self.h.advance(ms)
        self.absorb()

    @rule(fail=st.booleans())
    def release_writes(self, fail: bool) -> None:
        self.h.release(E.NOT_ENOUGH_REPLICAS if fail else E.NONE)
        self.absorb()

    @rule(who=st.integers(1, 2**CLIENTS - 1), proto=st.integers(0, len(PROTOCOLS) - 1))
    def play_along(self, who: int, proto: int) -> None:
        """The chosen clients behave like real consumers for one round, which is what it
        takes to reach Stable: rejoin when told to, sync after joining, then time passes
        and the writes land."""
        for i, c in enumerate(self.clients):
            if not who & (1 << i) or c.join_token is not None or c.sync_token is not None:
                continue
            if c.member_id and c.generation >= 0:
                err = self.h.heartbeat(c.member_id, c.generation, instance=c.instance)
                if err is E.NONE and c.synced_generation != c.generation:
                    self.sync(i)
                    continue
                if err is E.NONE:
                    continue
            self.join(i, proto)
        self.h.release()
        self.absorb()
        self.h.advance(1000)
        self.absorb()

    @rule()
    def everything_waiting_is_answered_eventually(self) -> None:
        for _ in range(3):
            self.h.release()
            self.absorb()
            self.h.advance(3_600_000)
            self.absorb()
        self.h.release()
        self.absorb()
        for c in self.clients:
            assert c.join_token is None and c.sync_token is None
        assert self.h.coord.pending_write_count() == 0

    # -- invariants

    @invariant()
    def no_token_answered_twice(self) -> None:
        for token, responses in self.h.responses.items():
            assert len(responses) == 1, (token, responses)

    @invariant()
    def group_is_consistent(self) -> None:
        g = self.group()
        if g is None:
            return
        assert g.state.value in STATE_NAMES
        assert self.h.coord.describe_group("g").state == g.state.value
        # generation never decreases (for one group incarnation)
        if self.last_seen is not None and self.last_seen[0] is g:
            assert g.generation >= self.last_seen[1]
        self.last_seen = (g, g.generation)
        # at most one leader, and it is a member
        if g.members:
            assert g.leader_id in g.members
        else:
            assert g.state in (GroupState.EMPTY, GroupState.PREPARING_REBALANCE)
        assert not (g.pending_members & set(g.members))
        for instance, member_id in g.static_members.items():
            assert g.members[member_id].group_instance_id == instance
        for m in g.members.values():
            if m.join_token is not None:
                assert g.state is GroupState.PREPARING_REBALANCE
            if m.sync_token is not None:
                assert g.state is GroupState.COMPLETING_REBALANCE
        event(f"state {g.state.value}")
        if g.state is GroupState.STABLE:
            # every member holds the slot the leader assigned for this generation
            assert g.protocol_name is not None
            for m in g.members.values():
                assert m.assignment == f"gen{g.generation}".encode(), (m, g.generation)
        if g.state is GroupState.EMPTY:
            assert not g.members


TestGroupMachine = GroupMachine.TestCase
TestGroupMachine.settings = settings(
    max_examples=100,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
