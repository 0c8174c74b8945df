"""Unit tests of the Raft state machine, driven by hand: messages are delivered in the order a
test chooses, and time moves only when a test says so."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable

import pytest

from tidelog.metadata.raft import (
    Effects,
    Entry,
    Envelope,
    FetchRequest,
    FetchResponse,
    OffsetAndEpoch,
    QuorumState,
    RaftConfig,
    RaftNode,
    Role,
    VoteRequest,
    VoteResponse,
)
from tidelog.protocol.error_codes import ErrorCode
from tidelog.testing.raft_mutants import CommitOldEpochNode
from tidelog.testing.sim_disk import SimQuorumStateStore, SimRaftLog

CONFIG = RaftConfig()


class Cluster:
    """Nodes on perfect links; ``deliver`` hands over queued messages until none is left."""

    def __init__(
        self,
        voters: Iterable[int],
        observers: Iterable[int] = (),
        config: RaftConfig = CONFIG,
        node_class: type[RaftNode] = RaftNode,
    ) -> None:
        self.voters = list(voters)
        self.config = config
        self.node_class = node_class
        self.rng = random.Random(0)
        self.now = 0
        self.logs = {n: SimRaftLog() for n in [*self.voters, *observers]}
        self.stores = {n: SimQuorumStateStore() for n in self.logs}
        self.nodes = {n: self._make(n) for n in self.logs}
        self.queue: list[Envelope] = []
        self.down: set[int] = set()

    def _make(self, node_id: int) -> RaftNode:
        return self.node_class(
            node_id,
            self.voters,
            self.config,
            self.logs[node_id],
            self.stores[node_id],
            self.rng,
            self.now,
        )

    def collect(self, effects: Effects) -> Effects:
        self.queue.extend(effects.messages)
        return effects

    def tick(self, node_id: int, now: int | None = None) -> Effects:
        if now is not None:
            self.now = now
        return self.collect(self.nodes[node_id].tick(self.now))

    def deliver(
        self,
        limit: int = 1000,
        until: Callable[[], bool] | None = None,
        lose: Callable[[Envelope], bool] | None = None,
    ) -> None:
        """Deliver until no message is left or ``until()`` holds; ``lose`` picks messages
        the network loses."""
        for _ in range(limit):
            if not self.queue or (until is not None and until()):
                return
            envelope = self.queue.pop(0)
            if envelope.destination in self.down or envelope.source in self.down:
                continue
            if lose is not None and lose(envelope):
                continue
            self.collect(self.nodes[envelope.destination].step(envelope, self.now))
            for node_id, node in self.nodes.items():
                deadline = node.next_deadline()
                if node_id not in self.down and deadline is not None and deadline <= self.now:
                    self.collect(node.tick(self.now))
        raise AssertionError("messages kept flowing")

    def elect(self, node_id: int) -> None:
        """Let ``node_id``'s election timer fire first, then deliver everything."""
        self.now = self.nodes[node_id].next_deadline() or self.now
        self.tick(node_id)
        self.deliver()

    def restart(self, node_id: int) -> RaftNode:
        self.logs[node_id].crash()
        self.stores[node_id].crash()
        self.nodes[node_id] = self._make(node_id)
        return self.nodes[node_id]


def test_a_single_voter_leads_at_once_and_commits_after_its_flush() -> None:
    cluster = Cluster([1])
    node = cluster.nodes[1]
    cluster.elect(1)
    assert node.role is Role.LEADER and node.epoch == 1
    assert cluster.stores[1].read() == QuorumState(1, 1, 1)
    result = node.propose([b"a", b"b"], cluster.now)
    assert (result.error, result.base_offset, result.last_offset) == (ErrorCode.NONE, 1, 2)
    assert node.high_watermark == 1  # the LeaderChange entry; a and b are not flushed yet
    assert node.next_deadline() == cluster.now
    effects = cluster.tick(1)
    assert effects.high_watermark == 3
    committed = node.read_committed(0, 10)
    # One proposal is one entry: its records commit together.
    assert [e.control for e in committed] == [True, False]
    assert committed[1].records == (b"a", b"b")
    assert (committed[1].offset, committed[1].end_offset) == (1, 3)


def test_three_voters_elect_one_leader_through_pre_vote_and_vote() -> None:
    cluster = Cluster([1, 2, 3])
    first = cluster.nodes[1]
    cluster.now = first.next_deadline() or 0
    effects = cluster.tick(1)
    assert first.role is Role.PROSPECTIVE and first.epoch == 0
    pre_votes = [e.message for e in effects.messages]
    assert all(isinstance(m, VoteRequest) and m.pre_vote for m in pre_votes)
    assert {m.candidate_epoch for m in pre_votes if isinstance(m, VoteRequest)} == {1}
    cluster.deliver()
    assert first.role is Role.LEADER and first.epoch == 1
    for other in (2, 3):
        node = cluster.nodes[other]
        assert (node.role, node.epoch, node.leader_id) == (Role.FOLLOWER, 1, 1)
        assert cluster.stores[other].read() == QuorumState(1, 1, 1)
    # Every voter holds the LeaderChange entry, and it is committed everywhere.
    assert [n.high_watermark for n in cluster.nodes.values()] == [1, 1, 1]


def test_a_pre_vote_changes_nothing_and_is_refused_while_a_leader_is_alive() -> None:
    cluster = Cluster([1, 2, 3])
    cluster.elect(1)
    follower = cluster.nodes[2]
    request = Envelope(3, 2, 7, VoteRequest(2, 3, 2, 1, 1, pre_vote=True))
    effects = follower.step(request, cluster.now)
    (reply,) = effects.messages
    assert isinstance(reply.message, VoteResponse)
    assert not reply.message.vote_granted and reply.message.leader_id == 1
    assert (follower.epoch, follower.voted_for, follower.role) == (1, 1, Role.FOLLOWER)
    # Once the leader has been silent for the fetch timeout, the same pre-vote is granted,
    # and still nothing is written.
    later = cluster.now + CONFIG.fetch_timeout_ms
    follower_state = cluster.stores[2].read()
    effects = follower.step(request, later)
    assert isinstance(effects.messages[0].message, VoteResponse)
    assert effects.messages[0].message.vote_granted
    assert cluster.stores[2].read() == follower_state


def test_a_vote_is_flushed_before_it_is_granted_and_given_once_per_epoch() -> None:
    cluster = Cluster([1, 2, 3])
    voter = cluster.nodes[3]
    effects = voter.step(Envelope(1, 3, 1, VoteRequest(1, 1, 3, 0, 0, pre_vote=False)), 5)
    assert isinstance(effects.messages[0].message, VoteResponse)
    assert effects.messages[0].message.vote_granted
    # Durable before the answer left: a crash now still remembers the vote.
    cluster.restart(3)
    voter = cluster.nodes[3]
    assert (voter.epoch, voter.voted_for) == (1, 1)
    effects = voter.step(Envelope(2, 3, 2, VoteRequest(1, 2, 3, 0, 0, pre_vote=False)), 6)
    assert isinstance(effects.messages[0].message, VoteResponse)
    assert not effects.messages[0].message.vote_granted
    # The same candidate asking again (a duplicate) gets the same answer.
    effects = voter.step(Envelope(1, 3, 3, VoteRequest(1, 1, 3, 0, 0, pre_vote=False)), 7)
    assert isinstance(effects.messages[0].message, VoteResponse)
    assert effects.messages[0].message.vote_granted


def test_a_vote_is_refused_to_a_candidate_whose_log_is_behind() -> None:
    cluster = Cluster([1, 2, 3])
    cluster.logs[3].append([Entry(0, 1, (b"x",)), Entry(1, 1, (b"y",))])
    cluster.logs[3].flush()
    voter = cluster.nodes[3]
    behind = VoteRequest(2, 1, 3, last_offset_epoch=1, last_offset=1, pre_vote=False)
    effects = voter.step(Envelope(1, 3, 1, behind), 5)
    assert isinstance(effects.messages[0].message, VoteResponse)
    assert not effects.messages[0].message.vote_granted
    # The refusal moved it into the candidate's epoch without a vote.
    assert (voter.epoch, voter.voted_for) == (2, None)


def test_the_leader_commits_only_what_a_majority_flushed_and_only_from_its_epoch() -> None:
    cluster = Cluster([1, 2, 3])
    # Node 1 holds an entry of epoch 1 that nobody else has; it then leads epoch 2.
    cluster.logs[1].append([Entry(0, 1, (b"old",))])
    cluster.logs[1].flush()
    cluster.stores[1].write(QuorumState(1, 1, None))
    cluster.stores[1].flush()
    cluster.nodes[1] = cluster.restart(1)
    leader = cluster.nodes[1]
    cluster.down = {3}
    cluster.elect(1)
    assert leader.role is Role.LEADER and leader.epoch == 2
    # Node 2 fetched both entries; with the leader that is a majority of 3.
    assert cluster.logs[2].flushed_end_offset() == 2
    assert leader.high_watermark == 2
    # An entry of the old epoch alone never moves the high watermark: a fresh leader whose
    # LeaderChange entry is not yet on a majority has nothing committed.
    fresh = Cluster([1, 2, 3])
    fresh.logs[1].append([Entry(0, 1, (b"old",))])
    fresh.logs[1].flush()
    fresh.restart(1)
    fresh.down = {2, 3}
    fresh.nodes[1]._become_candidate(0, Effects())
    fresh.nodes[1]._become_leader(0, Effects())
    fresh.tick(1, 1)
    request = FetchRequest(2, fresh.nodes[1].epoch, 1, 1, 1 << 20, 0)
    fresh.nodes[1].step(Envelope(2, 1, 9, request), 2)
    # Node 2 holds offset 0 (epoch 1) like the leader: a majority, but of an older epoch.
    assert fresh.nodes[1].high_watermark == 0


def test_a_follower_with_a_diverging_log_truncates_where_the_leader_says() -> None:
    cluster = Cluster([1, 2, 3])
    cluster.elect(1)
    leader = cluster.nodes[1]
    leader.propose([b"a"], cluster.now)
    cluster.tick(1)
    cluster.deliver()
    # Node 3 is given a stray entry of an epoch that never had a leader on this log.
    stray = Entry(cluster.logs[3].end_offset(), 5, (b"stray",))
    cluster.logs[3].append([stray])
    cluster.logs[3].flush()
    node3 = cluster.restart(3)
    (fetch,) = cluster.tick(3).messages  # it follows leader 1 again at once
    assert isinstance(fetch.message, FetchRequest)
    assert (fetch.message.fetch_offset, fetch.message.last_fetched_epoch) == (3, 5)
    cluster.queue.clear()
    (answer,) = cluster.nodes[1].step(fetch, cluster.now).messages
    assert isinstance(answer.message, FetchResponse)
    assert answer.message.diverging_epoch == OffsetAndEpoch(2, 1)
    cluster.collect(node3.step(answer, cluster.now))
    assert cluster.logs[3].end_offset() == 2
    cluster.deliver()
    assert cluster.logs[3].read(0, 1 << 20) == cluster.logs[1].read(0, 1 << 20)


def test_a_follower_answers_a_proposal_with_the_leader_it_knows() -> None:
    cluster = Cluster([1, 2, 3])
    cluster.elect(1)
    result = cluster.nodes[2].propose([b"x"], cluster.now)
    assert (result.error, result.leader_id, result.epoch) == (
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        1,
        1,
    )


def test_a_restarted_node_loses_its_unflushed_tail_and_a_restarted_leader_resigns() -> None:
    cluster = Cluster([1])
    cluster.elect(1)
    node = cluster.nodes[1]
    node.propose([b"lost"], cluster.now)  # not flushed: no tick ran
    node = cluster.restart(1)
    assert cluster.logs[1].end_offset() == 1  # only the flushed LeaderChange entry
    assert node.role is Role.RESIGNED and node.epoch == 1 and node.high_watermark == 0
    cluster.elect(1)
    assert node.role is Role.LEADER and node.epoch == 2


def test_a_leader_cut_off_from_the_majority_resigns_after_the_check_quorum_time() -> None:
    cluster = Cluster([1, 2, 3])
    cluster.elect(1)
    leader = cluster.nodes[1]
    cluster.down = {2, 3}
    cluster.queue.clear()
    effects = cluster.tick(1, cluster.now + CONFIG.fetch_timeout_ms * 3 // 2)
    assert leader.role is Role.RESIGNED
    assert leader.propose([b"x"], cluster.now).error is ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert {e.destination for e in effects.messages} == {2, 3}


def test_a_response_to_another_request_is_ignored() -> None:
    cluster = Cluster([1, 2, 3])
    cluster.elect(1)
    follower = cluster.nodes[2]
    end = cluster.logs[2].end_offset()
    stale = FetchResponse(ErrorCode.NONE, 1, 1, 0, 0, records=(Entry(end, 1, (b"from-nowhere",)),))
    follower.step(Envelope(1, 2, 123456789, stale), cluster.now)
    assert cluster.logs[2].end_offset() == end


def test_an_observer_finds_the_leader_and_replicates_without_voting() -> None:
    cluster = Cluster([1, 2, 3], observers=[9])
    cluster.elect(1)
    observer = cluster.nodes[9]
    for _ in range(5):
        cluster.tick(9, cluster.now + CONFIG.retry_backoff_ms)
        cluster.deliver()
    assert (observer.role, observer.leader_id) == (Role.FOLLOWER, 1)
    cluster.nodes[1].propose([b"seen"], cluster.now)
    cluster.tick(1)
    cluster.deliver()
    assert [r for e in observer.read_committed(1, 10) for r in e.records] == [b"seen"]
    vote = observer.step(Envelope(2, 9, 1, VoteRequest(2, 2, 9, 1, 9, pre_vote=False)), 0)
    assert isinstance(vote.messages[0].message, VoteResponse)
    assert vote.messages[0].message.error is ErrorCode.INCONSISTENT_VOTER_SET


def test_the_config_refuses_a_fetch_wait_longer_than_the_request_timeout() -> None:
    with pytest.raises(ValueError, match="fetch_max_wait_ms"):
        RaftConfig(fetch_max_wait_ms=3000, request_timeout_ms=2000)
    with pytest.raises(ValueError, match="election_timeout_ms"):
        RaftConfig(election_timeout_ms=0)


def test_a_graceful_resignation_hands_over_to_the_most_caught_up_voter_at_once() -> None:
    cluster = Cluster([1, 2, 3])
    cluster.elect(1)
    leader = cluster.nodes[1]
    leader.propose([b"a"], cluster.now)
    cluster.tick(1)
    cluster.deliver()
    cluster.down = {3}  # node 3 misses what comes next, so node 2 is the most caught up
    leader.propose([b"b"], cluster.now)
    cluster.tick(1)
    cluster.deliver()
    cluster.down = set()
    effects = cluster.collect(leader.resign(cluster.now))
    assert leader.role is Role.RESIGNED
    (successors,) = {getattr(e.message, "preferred_successors", None) for e in effects.messages}
    assert successors == (2, 3)
    resigned_at = cluster.now
    cluster.deliver()
    # Node 2 ran its pre-vote and vote at once: no time has passed, no fetch timeout waited.
    assert cluster.now == resigned_at
    assert cluster.nodes[2].role is Role.LEADER and cluster.nodes[2].epoch == 2
    assert cluster.nodes[3].leader_id == 2
    assert [r for e in cluster.nodes[2].read_committed(1, 2) for r in e.records] == [b"a", b"b"]


def test_a_follower_behind_the_leaders_snapshot_fetches_it_in_chunks_then_the_log() -> None:
    cluster = Cluster([1, 2, 3], config=RaftConfig(fetch_max_bytes=16))
    cluster.elect(1)
    leader = cluster.nodes[1]
    cluster.down = {3}
    for payload in (b"a", b"b", b"c"):
        leader.propose([payload], cluster.now)
        cluster.tick(1)
        cluster.deliver()
    assert leader.high_watermark == 4 and cluster.logs[3].end_offset() == 1
    with pytest.raises(ValueError, match="high watermark"):
        leader.create_snapshot(5, [b"too far"])
    state = bytes(range(40))  # the snapshot's batches go in chunks of at most 16 bytes
    assert leader.create_snapshot(3, [state]) == OffsetAndEpoch(3, 1)
    assert cluster.logs[1].start_offset() == 3
    leader.propose([b"d"], cluster.now)
    cluster.tick(1)
    cluster.down = set()
    # Node 3's last Fetch was lost; it sends another when that one times out.
    cluster.tick(3, cluster.nodes[3].next_deadline())
    cluster.deliver()
    assert cluster.logs[3].read_snapshot() == cluster.logs[1].read_snapshot()
    assert cluster.nodes[3].latest_snapshot() == (OffsetAndEpoch(3, 1), (state,))
    assert [r for e in cluster.logs[3].read(3, 1 << 20) for r in e.records] == [b"c", b"d"]
    assert cluster.nodes[3].high_watermark == 5
    assert [r for e in cluster.nodes[3].read_committed(0, 10) for r in e.records] == [b"c", b"d"]


@pytest.mark.parametrize("node_class", [RaftNode, CommitOldEpochNode])
def test_an_entry_of_an_older_epoch_is_not_committed_by_counting_replicas(
    node_class: type[RaftNode],
) -> None:
    """Raft's figure 8, scripted: the production node does not commit x; the mutant does,
    and then loses it.

    Entry x (epoch 2) is on nodes 1 and 2; node 5 holds y (epoch 3) at the same offset. Node 1
    leads epoch 4 with nodes 3 and 4 while 2 and 5 are down, and (one entry per Fetch) they
    copy x before its LeaderChange entry: x is then on a majority. Counting it committed
    is wrong: node 1 fails, and node 5, whose last epoch 3 beats theirs, is elected by nodes
    3 and 4 and replaces x by y.
    """
    cluster = Cluster(range(1, 6), config=RaftConfig(fetch_max_bytes=1), node_class=node_class)
    a, x, y = Entry(0, 1, (b"a",)), Entry(1, 2, (b"x",)), Entry(1, 3, (b"y",))
    for node_id, entries in {1: [a, x], 2: [a, x], 3: [a], 4: [a], 5: [a, y]}.items():
        cluster.logs[node_id].append(entries)
        cluster.logs[node_id].flush()
        cluster.stores[node_id].write(QuorumState(3, None, None))
        cluster.stores[node_id].flush()
        cluster.restart(node_id)
    cluster.down = {2, 5}
    leader = cluster.nodes[1]
    cluster.tick(1, leader.next_deadline())

    # Node 1 is elected; nodes 3 and 4 copy x and report it, and the answers carrying the
    # LeaderChange entry are lost.
    def carries_leader_change(envelope: Envelope) -> bool:
        message = envelope.message
        return isinstance(message, FetchResponse) and any(r.control for r in message.records)

    cluster.deliver(
        until=lambda: min(leader._replica_end.get(3, 0), leader._replica_end.get(4, 0)) >= 2,
        lose=carries_leader_change,
    )
    assert leader.epoch == 4
    assert [cluster.logs[n].end_offset() for n in (3, 4)] == [2, 2]
    if node_class is RaftNode:
        assert leader.high_watermark == 0  # x is on a majority, but not of this epoch
    else:
        assert leader.high_watermark == 2  # the mutant counts x committed
    committed_by_leader = leader.read_committed(0, 10)
    # Node 1 fails before the LeaderChange entry spreads; node 5 comes back.
    cluster.queue.clear()
    cluster.down = {1, 2}
    cluster.now += CONFIG.fetch_timeout_ms * 2
    cluster.restart(5)
    for _ in range(100):
        if cluster.nodes[5].role is Role.LEADER:
            break
        up = [cluster.nodes[n] for n in (3, 4, 5)]
        cluster.now = min(d for node in up if (d := node.next_deadline()) is not None)
        for node in up:
            cluster.collect(node.tick(cluster.now))
        cluster.deliver()
    assert cluster.nodes[5].role is Role.LEADER
    assert cluster.logs[3].entry(1) == y  # x was replaced on node 3
    # Only the mutant had reported x committed: a committed entry was lost.
    assert (x in committed_by_leader) == (node_class is CommitOldEpochNode)


def test_a_proposal_is_one_entry_and_snapshots_end_only_between_entries() -> None:
    cluster = Cluster([1])
    cluster.elect(1)
    node = cluster.nodes[1]
    with pytest.raises(ValueError, match="at least one record"):
        node.propose([], cluster.now)
    result = node.propose([b"a", b"b", b"c"], cluster.now)
    cluster.tick(1)
    assert (result.base_offset, result.last_offset, node.high_watermark) == (1, 3, 4)
    assert cluster.logs[1].entry(2) == Entry(1, 1, (b"a", b"b", b"c"))
    with pytest.raises(ValueError, match="entry boundary"):
        node.create_snapshot(2, [b"half an operation"])
    assert node.create_snapshot(4, [b"state"]) == OffsetAndEpoch(4, 1)


def test_a_diverging_epoch_inside_an_entry_truncates_the_whole_entry() -> None:
    cluster = Cluster([1, 2, 3])
    log = cluster.logs[2]
    log.append([Entry(0, 1, (b"a",)), Entry(1, 2, (b"x", b"y", b"z"))])
    log.flush()
    cluster.stores[2].write(QuorumState(3, None, 1))
    cluster.stores[2].flush()
    follower = cluster.restart(2)
    (fetch,) = follower.tick(cluster.now).messages
    assert isinstance(fetch.message, FetchRequest)
    assert (fetch.message.fetch_offset, fetch.message.last_fetched_epoch) == (4, 2)
    # The leader's epoch 2 ended at offset 2, inside this log's entry [1, 4).
    answer = FetchResponse(ErrorCode.NONE, 1, 3, 0, 0, diverging_epoch=OffsetAndEpoch(2, 2))
    follower.step(Envelope(1, 2, fetch.correlation_id, answer), cluster.now)
    assert log.entries() == [Entry(0, 1, (b"a",))]


def test_a_fetch_from_inside_an_entry_is_told_to_cut_back_to_the_entry_start() -> None:
    cluster = Cluster([1, 2, 3])
    cluster.elect(1)
    leader = cluster.nodes[1]
    result = leader.propose([b"x", b"y", b"z"], cluster.now)
    cluster.tick(1)
    cluster.deliver()
    entry_start = result.base_offset
    assert leader.log.entry_start(entry_start + 1) == entry_start
    # A replica whose log ends in the middle of that entry (a torn or foreign copy).
    inside = FetchRequest(2, leader.epoch, entry_start + 1, leader.epoch, 1 << 20, 0)
    (answer,) = leader.step(Envelope(2, 1, 77, inside), cluster.now).messages
    assert isinstance(answer.message, FetchResponse)
    assert answer.message.error is ErrorCode.NONE
    assert answer.message.records == ()
    assert answer.message.diverging_epoch == OffsetAndEpoch(entry_start, leader.epoch)
    # The leader is unchanged: still leading, the entry committed and whole.
    assert leader.role is Role.LEADER
    assert leader.high_watermark == result.last_offset + 1
    assert cluster.logs[1].entry_start(result.last_offset) == entry_start
