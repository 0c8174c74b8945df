"""One member of the metadata quorum as a sans-io state machine (KRaft: KIP-595, KIP-996).

The node never reads a clock, draws a random number, touches a file or opens a socket on its
own. Time comes in as ``now`` (milliseconds) with every call, randomness (election timeouts)
from an injected ``random.Random``-like source, the disk through :class:`RaftLog` and
:class:`QuorumStateStore`, and the messages it wants sent come back as :class:`Effects`. A
driver (a thin asyncio loop in production, the simulation in ``tidelog.testing``) delivers
messages with :meth:`RaftNode.step`, calls :meth:`RaftNode.tick` when
:meth:`RaftNode.next_deadline` is reached, and sends what the effects hold.

Roles (Kafka's): a voter is Unattached (knows no leader in its epoch), Prospective (asks for
pre-votes, KIP-996), Candidate (asks for votes in a new epoch), Leader, Follower, or Resigned (a
leader that stepped down and waits for the next epoch). A node outside the voter set is an
observer: it fetches from the leader and never votes.

Rules that keep the log safe, each asserted where the state changes:
- the quorum state (epoch, voted-for, leader) is written and flushed before a vote is granted,
  an epoch acknowledged or a Fetch sent in it; the epoch never goes down, and a node votes at
  most once per epoch;
- a follower reports (as its fetch offset) only entries it has flushed;
- the leader's high watermark is the largest offset a majority of voters holds durably (the
  leader counting its flushed end), and it moves only once an entry of the leader's own epoch
  is below it: the LeaderChange control entry every leader appends first;
- the high watermark of a node never goes down while it runs; it is not persisted (as in
  KRaft), so a restarted node knows none until its leader tells it;
- an entry is one operation's records (one record batch, one offset per record) and is
  committed whole or not at all: the high watermark, fetch offsets, truncation points,
  snapshot ids and epoch start offsets are entry boundaries.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from tidelog.metadata.raft.batches import decode_snapshot, encode_leader_change, encode_snapshot
from tidelog.metadata.raft.config import RaftConfig
from tidelog.metadata.raft.messages import (
    BeginQuorumEpochRequest,
    BeginQuorumEpochResponse,
    EndQuorumEpochRequest,
    EndQuorumEpochResponse,
    Entry,
    Envelope,
    FetchRequest,
    FetchResponse,
    FetchSnapshotRequest,
    FetchSnapshotResponse,
    Message,
    OffsetAndEpoch,
    VoteRequest,
    VoteResponse,
)
from tidelog.metadata.raft.store import QuorumState, QuorumStateStore, RaftLog
from tidelog.protocol.error_codes import ErrorCode
from tidelog.records.errors import RecordsError


class RandomSource(Protocol):
    """What the node draws from a ``random.Random``."""

    def randrange(self, start: int, stop: int) -> int: ...

    def getrandbits(self, k: int) -> int: ...


class Role(enum.Enum):
    UNATTACHED = "unattached"
    PROSPECTIVE = "prospective"
    CANDIDATE = "candidate"
    LEADER = "leader"
    FOLLOWER = "follower"
    RESIGNED = "resigned"


@dataclass(slots=True)
class Effects:
    """What a call asks the driver to do: send ``messages``; ``high_watermark`` is set when the
    call moved the node's high watermark (new committed entries to load)."""

    messages: list[Envelope] = field(default_factory=list)
    high_watermark: int | None = None


@dataclass(frozen=True, slots=True)
class ProposeResult:
    """The answer to :meth:`RaftNode.propose`: the offsets the records will have if their
    entry commits in ``epoch``, or ``NOT_LEADER_OR_FOLLOWER`` with the leader this node
    knows."""

    error: ErrorCode
    epoch: int
    leader_id: int | None
    base_offset: int = -1
    last_offset: int = -1


class RaftNode:
    """A voter or observer of the quorum. See the module docstring."""

    # When the leader flushes what was proposed (and then offers it to followers).
    _flush_at: int | None

    def __init__(
        self,
        node_id: int,
        voters: Iterable[int],
        config: RaftConfig,
        log: RaftLog,
        store: QuorumStateStore,
        rng: RandomSource,
        now: int,
    ) -> None:
        self.node_id = node_id
        self.voters = frozenset(voters)
        if not self.voters:
            raise ValueError("the voter set is empty")
        self.config = config
        self._log = log
        self._store = store
        self._rng = rng
        self._correlation = rng.getrandbits(31)
        # Not persisted (as in KRaft), except that a snapshot holds only committed entries.
        snapshot = log.latest_snapshot_id()
        self.high_watermark = snapshot.offset if snapshot is not None else 0

        state = store.read() or QuorumState(epoch=0, voted_for=None, leader_id=None)
        self.epoch = state.epoch
        self.voted_for = state.voted_for
        self.leader_id = state.leader_id
        self._reset_role_state()
        self._failed_elections = 0
        if state.leader_id == node_id:
            # A leader that restarts does not lead again in the same epoch: it waits for the
            # next one, as KRaft's resigned state does.
            self._enter_resigned(now, Effects(), successors=())
        elif state.leader_id is not None:
            self._enter_follower(state.leader_id, now)
        else:
            self._enter_unattached(now)

    # ------------------------------------------------------------------ public API

    @property
    def is_voter(self) -> bool:
        return self.node_id in self.voters

    @property
    def role(self) -> Role:
        return self._role

    @property
    def log(self) -> RaftLog:
        return self._log

    @property
    def majority(self) -> int:
        return len(self.voters) // 2 + 1

    def next_deadline(self) -> int | None:
        """The earliest time at which :meth:`tick` has something to do."""
        deadlines = [
            self._election_deadline,
            self._fetch_deadline,
            self._fetch_request_deadline,
            self._next_fetch_at,
            self._flush_at,
            self._begin_resend_at,
            self._check_quorum_deadline,
        ]
        deadlines.extend(deadline for _, deadline in self._parked.values())
        present = [d for d in deadlines if d is not None]
        return min(present) if present else None

    def tick(self, now: int) -> Effects:
        """Act on every deadline at or before ``now``."""
        effects = Effects()
        for _ in range(64):
            if not self._tick_once(now, effects):
                break
        return effects

    def step(self, envelope: Envelope, now: int) -> Effects:
        """Handle one message addressed to this node."""
        assert envelope.destination == self.node_id, envelope
        effects = Effects()
        message = envelope.message
        if isinstance(message, VoteRequest):
            self._on_vote_request(envelope, message, now, effects)
        elif isinstance(message, VoteResponse):
            self._on_vote_response(envelope, message, now, effects)
        elif isinstance(message, BeginQuorumEpochRequest):
            self._on_begin_epoch_request(envelope, message, now, effects)
        elif isinstance(message, BeginQuorumEpochResponse):
            self._on_begin_epoch_response(envelope, message, now, effects)
        elif isinstance(message, EndQuorumEpochRequest):
            self._on_end_epoch_request(envelope, message, now, effects)
        elif isinstance(message, EndQuorumEpochResponse):
            self._maybe_higher_epoch(message.leader_epoch, message.leader_id, now, effects)
        elif isinstance(message, FetchRequest):
            self._on_fetch_request(envelope, message, now, effects)
        elif isinstance(message, FetchResponse):
            self._on_fetch_response(envelope, message, now, effects)
        elif isinstance(message, FetchSnapshotRequest):
            self._on_fetch_snapshot_request(envelope, message, now, effects)
        else:
            self._on_fetch_snapshot_response(envelope, message, now, effects)
        return effects

    def propose(self, records: Sequence[bytes], now: int) -> ProposeResult:
        """Append the records of one operation as one entry of the current epoch if this
        node leads: they commit together or not at all.

        The entry is flushed and offered to the followers on the next :meth:`tick` (which
        :meth:`next_deadline` makes due at once), so that proposals made together share one
        flush. It is committed when the high watermark passes ``last_offset``; if the leader
        loses its epoch first, it may never be.
        """
        if not records:
            raise ValueError("a proposal holds at least one record")
        if self._role is not Role.LEADER:
            return ProposeResult(ErrorCode.NOT_LEADER_OR_FOLLOWER, self.epoch, self.leader_id)
        entry = Entry(self._log.end_offset(), self.epoch, tuple(bytes(r) for r in records))
        self._log.append([entry])
        self._flush_at = now
        return ProposeResult(
            ErrorCode.NONE, self.epoch, self.node_id, entry.offset, entry.end_offset - 1
        )

    def resign(self, now: int) -> Effects:
        """Step down gracefully (shutdown): tell the voters with EndQuorumEpoch, most
        caught-up successor first, so that the next election starts without waiting for a
        fetch timeout."""
        effects = Effects()
        if self._role is Role.LEADER:
            self._resign(now, effects)
        return effects

    def create_snapshot(
        self, end_offset: int, records: Sequence[bytes], *, timestamp: int = -1
    ) -> OffsetAndEpoch:
        """Store ``records`` (the state after applying every entry below ``end_offset``) as a
        snapshot and delete the log before it. Only committed entries may be summarised, and
        only whole ones. ``timestamp`` is the append time of the last entry it contains."""
        if not self._log.start_offset() < end_offset <= self.snapshot_limit():
            raise ValueError(
                f"a snapshot must end after the log start {self._log.start_offset()} and at "
                f"or below the high watermark {self.high_watermark}, not at {end_offset}"
            )
        if not self._is_boundary(end_offset):
            raise ValueError(f"a snapshot must end at an entry boundary, not at {end_offset}")
        snapshot_id = OffsetAndEpoch(end_offset, self._log.entry_epoch(end_offset - 1))
        payload = encode_snapshot(
            snapshot_id, records, last_contained_log_timestamp=timestamp, timestamp=timestamp
        )
        self._log.write_snapshot(snapshot_id, payload)
        return snapshot_id

    def snapshot_limit(self) -> int:
        """The largest end offset a snapshot may have now: committed and flushed."""
        return min(self.high_watermark, self._log.flushed_end_offset())

    def latest_snapshot(self) -> tuple[OffsetAndEpoch, tuple[bytes, ...]] | None:
        """The latest snapshot and its records: what the loader starts from before
        :meth:`read_committed` from its end."""
        snapshot = self._log.read_snapshot()
        if snapshot is None:
            return None
        return snapshot[0], decode_snapshot(snapshot[1])

    def read_committed(self, start: int, max_entries: int) -> list[Entry]:
        """At most ``max_entries`` committed entries (below the high watermark) from the
        entry boundary ``start``, for the loader."""
        start = max(start, self._log.start_offset())
        end = min(self.high_watermark, self._log.end_offset())
        if start >= end or max_entries <= 0:
            return []
        entries: list[Entry] = []
        for entry in self._log.read(start, 1 << 62):
            if entry.offset >= end or len(entries) == max_entries:
                break
            entries.append(entry)
        return entries

    # ------------------------------------------------------------------ state changes

    def _reset_role_state(self) -> None:
        self._role = Role.UNATTACHED
        self._election_deadline: int | None = None
        # Follower: by when a successful Fetch response must arrive, the Fetch in flight, and
        # when to send the next one after a failure.
        self._fetch_deadline: int | None = None
        self._fetch_request_deadline: int | None = None
        self._fetch_correlation: int | None = None
        self._next_fetch_at: int | None = None
        # A snapshot being fetched from the leader: its id and the bytes so far.
        self._snapshot_download: tuple[OffsetAndEpoch, bytearray] | None = None
        self._last_leader_contact: int | None = None
        self._leader_resigned = False
        # Prospective and candidate: the votes of this round.
        self._vote_correlations: dict[int, int] = {}
        self._granted: set[int] = set()
        self._rejected: set[int] = set()
        # Leader.
        self._epoch_start_offset = 0
        self._replica_end: dict[int, int] = {}
        # Observers' fetch offsets: they count for nothing, DescribeQuorum will list them.
        self._observer_end: dict[int, int] = {}
        self._hw_sent: dict[int, int] = {}
        self._parked: dict[int, tuple[Envelope, int]] = {}
        self._flush_at = None
        self._begin_acked: set[int] = set()
        self._begin_resend_at: int | None = None
        self._check_quorum_deadline: int | None = None
        self._fetched_since_check: set[int] = set()

    def _persist(self, epoch: int, voted_for: int | None, leader_id: int | None) -> None:
        assert epoch >= self.epoch, f"node {self.node_id}: epoch {self.epoch} -> {epoch}"
        if epoch == self.epoch:
            assert self.voted_for in (None, voted_for), (
                f"node {self.node_id}: second vote in epoch {epoch}: {self.voted_for}, {voted_for}"
            )
            assert self.leader_id in (None, leader_id), (
                f"node {self.node_id}: second leader in epoch {epoch}: {self.leader_id}, "
                f"{leader_id}"
            )
        self._store.write(QuorumState(epoch, voted_for, leader_id))
        self._flush_quorum_state()
        self.epoch, self.voted_for, self.leader_id = epoch, voted_for, leader_id

    def _flush_quorum_state(self) -> None:
        self._store.flush()

    def _is_boundary(self, offset: int) -> bool:
        """Whether ``offset`` is where an entry starts or the log ends (every offset below
        the log start is summarised by the snapshot, which ends on a boundary)."""
        log = self._log
        if offset <= log.start_offset() or offset >= log.end_offset():
            return True
        return log.entry_start(offset) == offset

    def _random_election_timeout(self) -> int:
        timeout = self.config.election_timeout_ms
        return timeout + self._rng.randrange(0, timeout)

    def _election_backoff(self) -> int:
        """Randomised exponential back-off after ``_failed_elections`` failed elections."""
        cap = min(
            self.config.election_backoff_max_ms,
            self.config.retry_backoff_ms * (1 << min(self._failed_elections, 20)),
        )
        return self._rng.randrange(0, cap + 1)

    def _enter_unattached(self, now: int, backoff: int | None = None) -> None:
        self._reset_role_state()
        self._role = Role.UNATTACHED
        if self.is_voter:
            wait = self._random_election_timeout() if backoff is None else backoff
            self._election_deadline = now + wait
        else:
            self._next_fetch_at = now

    def _enter_follower(self, leader_id: int, now: int) -> None:
        self._reset_role_state()
        self._role = Role.FOLLOWER
        self._fetch_deadline = now + self.config.fetch_timeout_ms
        self._next_fetch_at = now

    def _become_follower(self, epoch: int, leader_id: int, now: int) -> None:
        voted_for = self.voted_for if epoch == self.epoch else None
        if (epoch, leader_id) != (self.epoch, self.leader_id):
            self._persist(epoch, voted_for, leader_id)
        self._enter_follower(leader_id, now)
        self._last_leader_contact = now

    def _become_unattached(self, epoch: int, now: int) -> None:
        if epoch != self.epoch:
            self._persist(epoch, None, None)
        self._enter_unattached(now)

    def _maybe_higher_epoch(
        self, epoch: int, leader_id: int | None, now: int, effects: Effects
    ) -> bool:
        """Move to ``epoch`` if it is newer than ours (or name the leader of ours); True if
        the node changed state."""
        if epoch > self.epoch:
            if leader_id is not None and leader_id != self.node_id:
                self._become_follower(epoch, leader_id, now)
            else:
                self._become_unattached(epoch, now)
            return True
        if (
            epoch == self.epoch
            and leader_id is not None
            and leader_id != self.node_id
            and self._role in (Role.UNATTACHED, Role.PROSPECTIVE, Role.CANDIDATE)
            # Learn a leader this node did not know; an observer that lost its leader may
            # find the same one again. A voter that gave up on its leader waits for that
            # leader's own word (a Fetch answer or BeginQuorumEpoch), not a third party's.
            and (self.leader_id is None or (not self.is_voter and self.leader_id == leader_id))
        ):
            self._become_follower(epoch, leader_id, now)
            return True
        return False

    def _enter_prospective(self, now: int, effects: Effects) -> None:
        self._reset_role_state()
        self._role = Role.PROSPECTIVE
        self._election_deadline = now + self._random_election_timeout()
        self._granted = {self.node_id}
        self._request_votes(pre_vote=True, epoch=self.epoch + 1, effects=effects)
        self._maybe_won(now, effects)

    def _become_candidate(self, now: int, effects: Effects) -> None:
        self._persist(self.epoch + 1, self.node_id, None)
        self._reset_role_state()
        self._role = Role.CANDIDATE
        self._election_deadline = now + self._random_election_timeout()
        self._granted = {self.node_id}
        self._request_votes(pre_vote=False, epoch=self.epoch, effects=effects)
        self._maybe_won(now, effects)

    def _request_votes(self, *, pre_vote: bool, epoch: int, effects: Effects) -> None:
        for voter in sorted(self.voters - {self.node_id}):
            request = VoteRequest(
                candidate_epoch=epoch,
                candidate_id=self.node_id,
                voter_id=voter,
                last_offset_epoch=self._log.last_epoch(),
                last_offset=self._log.end_offset(),
                pre_vote=pre_vote,
            )
            correlation = self._send(effects, voter, request)
            self._vote_correlations[correlation] = voter

    def _maybe_won(self, now: int, effects: Effects) -> None:
        if len(self._granted) < self.majority:
            return
        self._failed_elections = 0
        if self._role is Role.PROSPECTIVE:
            self._become_candidate(now, effects)
        elif self._role is Role.CANDIDATE:
            self._become_leader(now, effects)

    def _election_lost(self, now: int, effects: Effects) -> None:
        """A pre-vote or vote round ended without a majority."""
        self._failed_elections += 1
        if self._role is Role.PROSPECTIVE and self.leader_id not in (None, self.node_id):
            # Most voters still hear from the leader: follow it again (KIP-996).
            self._enter_follower(self.leader_id, now)
            self._last_leader_contact = None
            return
        self._enter_unattached(now, backoff=self._election_backoff())

    def _become_leader(self, now: int, effects: Effects) -> None:
        granted = set(self._granted)
        self._persist(self.epoch, self.node_id, self.node_id)
        self._reset_role_state()
        self._role = Role.LEADER
        self._epoch_start_offset = self._log.end_offset()
        self._log.append(
            [
                Entry(
                    self._epoch_start_offset,
                    self.epoch,
                    (encode_leader_change(self.node_id, self.voters, granted),),
                    control=True,
                )
            ]
        )
        self._flush_at = now
        self._replica_end = {v: 0 for v in self.voters if v != self.node_id}
        if len(self.voters) > 1:
            self._check_quorum_deadline = now + self.config.fetch_timeout_ms * 3 // 2
        self._send_begin_epoch(now, effects)

    def _send_begin_epoch(self, now: int, effects: Effects) -> None:
        for voter in sorted(self.voters - {self.node_id} - self._begin_acked):
            self._send(effects, voter, BeginQuorumEpochRequest(self.epoch, self.node_id, voter))
        self._begin_resend_at = now + self.config.request_timeout_ms

    def _resign(self, now: int, effects: Effects) -> None:
        successors = tuple(sorted(self._replica_end, key=lambda v: (-self._replica_end[v], v)))
        self._enter_resigned(now, effects, successors)

    def _enter_resigned(self, now: int, effects: Effects, successors: tuple[int, ...]) -> None:
        self._reset_role_state()
        self._role = Role.RESIGNED
        self._election_deadline = now + self._random_election_timeout()
        for voter in successors:
            self._send(effects, voter, EndQuorumEpochRequest(self.epoch, self.node_id, successors))

    def _set_high_watermark(self, hw: int, effects: Effects) -> None:
        assert hw >= self.high_watermark, (
            f"node {self.node_id}: high watermark {self.high_watermark} -> {hw}"
        )
        if hw > self.high_watermark:
            # One operation commits whole or not at all.
            assert self._is_boundary(hw), (
                f"node {self.node_id}: high watermark {hw} inside the entry from "
                f"{self._log.entry_start(hw)}"
            )
            self.high_watermark = hw
            effects.high_watermark = hw

    # ------------------------------------------------------------------ timers

    def _tick_once(self, now: int, effects: Effects) -> bool:
        role = self._role
        if self._flush_at is not None and self._flush_at <= now:
            self._flush_at = None
            self._log.flush()
            self._update_leader_high_watermark(now, effects)
            self._complete_parked(now, effects, only_ready=True)
            return True
        if self._check_quorum_deadline is not None and self._check_quorum_deadline <= now:
            # Check-quorum: no majority fetched within 1.5x the fetch timeout. This leader may
            # be cut off; stepping down lets the rest elect one they can reach.
            self._resign(now, effects)
            return True
        for replica, (_, deadline) in sorted(self._parked.items()):
            if deadline <= now:
                self._answer_parked(replica, now, effects)
                return True
        if self._begin_resend_at is not None and self._begin_resend_at <= now:
            self._send_begin_epoch(now, effects)
            return True
        if self._election_deadline is not None and self._election_deadline <= now:
            self._election_deadline = None
            if role in (Role.PROSPECTIVE, Role.CANDIDATE):
                self._election_lost(now, effects)
            else:
                self._enter_prospective(now, effects)
            return True
        if self._fetch_deadline is not None and self._fetch_deadline <= now:
            self._fetch_deadline = None
            # No word from the leader for the fetch timeout.
            if self.is_voter:
                self._enter_prospective(now, effects)
            else:
                self._become_unattached(self.epoch, now)
            return True
        if self._fetch_request_deadline is not None and self._fetch_request_deadline <= now:
            self._fetch_request_deadline = None
            self._fetch_correlation = None
            self._send_fetch(now, effects)
            return True
        if self._next_fetch_at is not None and self._next_fetch_at <= now:
            self._next_fetch_at = None
            self._send_fetch(now, effects)
            return True
        return False

    # ------------------------------------------------------------------ Vote

    def _on_vote_request(
        self, envelope: Envelope, request: VoteRequest, now: int, effects: Effects
    ) -> None:
        def answer(error: ErrorCode, granted: bool) -> None:
            response = VoteResponse(
                error, self._named_leader(), self.epoch, granted, request.pre_vote
            )
            self._reply(effects, envelope, response)

        if not self.is_voter or request.candidate_id not in self.voters:
            answer(ErrorCode.INCONSISTENT_VOTER_SET, False)
            return
        if request.candidate_epoch < self.epoch:
            answer(ErrorCode.FENCED_LEADER_EPOCH, False)
            return
        up_to_date = self._candidate_log_is_up_to_date(
            request.last_offset_epoch, request.last_offset
        )
        if request.pre_vote:
            # A pre-vote changes nothing here. It is refused while this node has a live leader
            # (or is one), so that a node cut off and back cannot disrupt a working quorum.
            answer(ErrorCode.NONE, up_to_date and not self._has_live_leader(now))
            return
        if request.candidate_epoch > self.epoch:
            self._become_unattached(request.candidate_epoch, now)
        granted = self._may_vote_for(request.candidate_id) and up_to_date
        if granted and self.voted_for is None:
            self._record_vote(request.candidate_id, now)
        answer(ErrorCode.NONE, granted)

    def _has_live_leader(self, now: int) -> bool:
        if self._role is Role.LEADER:
            return True
        return (
            self._role is Role.FOLLOWER
            and not self._leader_resigned
            and self._last_leader_contact is not None
            and now - self._last_leader_contact < self.config.fetch_timeout_ms
        )

    def _candidate_log_is_up_to_date(self, last_epoch: int, end_offset: int) -> bool:
        return (last_epoch, end_offset) >= (self._log.last_epoch(), self._log.end_offset())

    def _may_vote_for(self, candidate_id: int) -> bool:
        """One vote per epoch, and none once the epoch has a leader."""
        if self.voted_for is not None:
            return self.voted_for == candidate_id
        return self.leader_id is None and self._role in (Role.UNATTACHED, Role.PROSPECTIVE)

    def _record_vote(self, candidate_id: int, now: int) -> None:
        # Flushed before the response is built: a vote survives a crash.
        self._persist(self.epoch, candidate_id, None)
        self._election_deadline = now + self._random_election_timeout()

    def _on_vote_response(
        self, envelope: Envelope, response: VoteResponse, now: int, effects: Effects
    ) -> None:
        if self._maybe_higher_epoch(response.leader_epoch, response.leader_id, now, effects):
            return
        voter = self._vote_correlations.pop(envelope.correlation_id, None)
        if voter is None or voter != envelope.source or response.error is not ErrorCode.NONE:
            return
        if response.vote_granted:
            self._granted.add(voter)
            self._maybe_won(now, effects)
        else:
            self._rejected.add(voter)
            if len(self.voters) - len(self._rejected) < self.majority:
                self._election_lost(now, effects)

    # ------------------------------------------------------------------ Begin/EndQuorumEpoch

    def _on_begin_epoch_request(
        self, envelope: Envelope, request: BeginQuorumEpochRequest, now: int, effects: Effects
    ) -> None:
        if not self.is_voter or request.leader_id not in self.voters:
            error = ErrorCode.INCONSISTENT_VOTER_SET
        elif request.leader_epoch < self.epoch:
            error = ErrorCode.FENCED_LEADER_EPOCH
        else:
            error = ErrorCode.NONE
            if request.leader_epoch == self.epoch and self.leader_id is not None:
                assert self.leader_id == request.leader_id, (
                    f"node {self.node_id}: epoch {self.epoch} has leaders "
                    f"{self.leader_id} and {request.leader_id}"
                )
                if self._role is Role.FOLLOWER:
                    self._last_leader_contact = now
                    self._fetch_deadline = now + self.config.fetch_timeout_ms
                else:
                    self._become_follower(request.leader_epoch, request.leader_id, now)
            else:
                self._become_follower(request.leader_epoch, request.leader_id, now)
        self._reply(
            effects, envelope, BeginQuorumEpochResponse(error, self._named_leader(), self.epoch)
        )
        if self._role is Role.FOLLOWER and self._fetch_correlation is None:
            self._send_fetch(now, effects)

    def _on_begin_epoch_response(
        self, envelope: Envelope, response: BeginQuorumEpochResponse, now: int, effects: Effects
    ) -> None:
        if self._maybe_higher_epoch(response.leader_epoch, response.leader_id, now, effects):
            return
        if self._role is Role.LEADER and response.error is ErrorCode.NONE:
            self._begin_acked.add(envelope.source)

    def _on_end_epoch_request(
        self, envelope: Envelope, request: EndQuorumEpochRequest, now: int, effects: Effects
    ) -> None:
        if request.leader_epoch < self.epoch:
            error = ErrorCode.FENCED_LEADER_EPOCH
        else:
            error = ErrorCode.NONE
            if request.leader_epoch > self.epoch:
                self._become_unattached(request.leader_epoch, now)
            if (
                self.is_voter
                and self._role in (Role.FOLLOWER, Role.UNATTACHED)
                and self.leader_id in (None, request.leader_id)
            ):
                # The most caught-up successor starts its election at once, the others after a
                # back-off growing with their place in the list.
                successors = request.preferred_successors
                place = (
                    successors.index(self.node_id)
                    if self.node_id in successors
                    else len(successors)
                )
                wait = (
                    0
                    if place == 0
                    else self._rng.randrange(
                        0,
                        self.config.election_backoff_max_ms * place // max(1, len(successors)) + 1,
                    )
                )
                self._leader_resigned = True
                self._fetch_deadline = None
                self._fetch_request_deadline = None
                self._fetch_correlation = None
                self._next_fetch_at = None
                self._election_deadline = now + wait
        self._reply(
            effects, envelope, EndQuorumEpochResponse(error, self._named_leader(), self.epoch)
        )

    # ------------------------------------------------------------------ Fetch: leader side

    def _on_fetch_request(
        self, envelope: Envelope, request: FetchRequest, now: int, effects: Effects
    ) -> None:
        if request.current_leader_epoch < self.epoch:
            error: ErrorCode | None = ErrorCode.FENCED_LEADER_EPOCH
        elif request.current_leader_epoch > self.epoch:
            error = ErrorCode.UNKNOWN_LEADER_EPOCH
        elif self._role is not Role.LEADER:
            error = ErrorCode.NOT_LEADER_OR_FOLLOWER
        else:
            error = None
        if error is not None:
            self._reply(effects, envelope, self._fetch_error(error))
            return
        replica = request.replica_id
        if replica in self.voters and replica != self.node_id:
            self._fetched_since_check.add(replica)
            if len(self._fetched_since_check) + 1 >= self.majority:
                self._fetched_since_check.clear()
                self._check_quorum_deadline = now + self.config.fetch_timeout_ms * 3 // 2
        diverging, snapshot = self._check_fetch_position(
            request.fetch_offset, request.last_fetched_epoch
        )
        if diverging is not None or snapshot is not None:
            self._parked.pop(replica, None)
            self._reply(
                effects,
                envelope,
                FetchResponse(
                    ErrorCode.NONE,
                    self.node_id,
                    self.epoch,
                    self.high_watermark,
                    self._log.start_offset(),
                    diverging_epoch=diverging,
                    snapshot_id=snapshot,
                ),
            )
            return
        if not self._is_boundary(request.fetch_offset):
            # The epochs agree but the replica's log ends inside one of this log's entries:
            # its copy of that operation is partial (or was never this one). Like any other
            # divergence, it cuts its log back to where the entry starts and fetches the
            # whole entry again; an operation is never half on a replica.
            self._parked.pop(replica, None)
            start = self._log.entry_start(request.fetch_offset)
            self._reply(
                effects,
                envelope,
                FetchResponse(
                    ErrorCode.NONE,
                    self.node_id,
                    self.epoch,
                    self.high_watermark,
                    self._log.start_offset(),
                    diverging_epoch=OffsetAndEpoch(start, request.last_fetched_epoch),
                ),
            )
            return
        # The position checked out: the replica's log is a prefix of this one up to there.
        if replica in self.voters:
            self._replica_end[replica] = request.fetch_offset
            self._update_leader_high_watermark(now, effects)
        else:
            self._observer_end[replica] = request.fetch_offset
        self._parked[replica] = (envelope, now + request.max_wait_ms)
        self._complete_parked(now, effects, only_ready=True)

    def _check_fetch_position(
        self, offset: int, last_epoch: int
    ) -> tuple[OffsetAndEpoch | None, OffsetAndEpoch | None]:
        """(None, None) if ``offset`` (after an entry of ``last_epoch``) is on this leader's
        log; else the diverging epoch (where the replica's log must be cut before it fetches
        again), or the snapshot to fetch when the two logs part before this log's start."""
        start = self._log.start_offset()
        snapshot = self._log.latest_snapshot_id()
        if offset < start:
            return None, snapshot
        end_for_epoch = self._log.end_offset_for_epoch(last_epoch)
        if (
            offset > self._log.end_offset()
            or end_for_epoch.epoch != last_epoch
            or end_for_epoch.offset < offset
        ):
            if end_for_epoch.offset <= start and snapshot is not None:
                return None, snapshot
            return end_for_epoch, None
        return None, None

    def _fetch_error(self, error: ErrorCode) -> FetchResponse:
        return FetchResponse(
            error, self._named_leader(), self.epoch, self.high_watermark, self._log.start_offset()
        )

    def _named_leader(self) -> int | None:
        """The leader this node names in its answers: not itself once it no longer leads
        (after a resignation or a restart), since the next leader is not known yet."""
        if self.leader_id == self.node_id and self._role is not Role.LEADER:
            return None
        return self.leader_id

    def _complete_parked(self, now: int, effects: Effects, *, only_ready: bool) -> None:
        for replica in sorted(self._parked):
            envelope, _ = self._parked[replica]
            request = envelope.message
            assert isinstance(request, FetchRequest)
            ready = (
                request.fetch_offset < self._log.end_offset()
                or self._hw_sent.get(replica) != self.high_watermark
            )
            if ready or not only_ready:
                self._answer_parked(replica, now, effects)

    def _answer_parked(self, replica: int, now: int, effects: Effects) -> None:
        envelope, _ = self._parked.pop(replica)
        request = envelope.message
        assert isinstance(request, FetchRequest)
        if request.fetch_offset < self._log.start_offset():
            # A snapshot deleted what this request was waiting for.
            self._reply(
                effects,
                envelope,
                FetchResponse(
                    ErrorCode.NONE,
                    self.node_id,
                    self.epoch,
                    self.high_watermark,
                    self._log.start_offset(),
                    snapshot_id=self._log.latest_snapshot_id(),
                ),
            )
            return
        records = tuple(
            self._log.read(
                request.fetch_offset, min(request.max_bytes, self.config.fetch_max_bytes)
            )
        )
        self._hw_sent[replica] = self.high_watermark
        response = FetchResponse(
            ErrorCode.NONE,
            self.node_id,
            self.epoch,
            self.high_watermark,
            self._log.start_offset(),
            records=records,
        )
        self._reply(effects, envelope, response)

    def _leader_durable_end(self) -> int:
        return self._log.flushed_end_offset()

    def _may_commit_to(self, offset: int) -> bool:
        """Raft's commit rule: the leader commits by counting replicas only an entry of its own
        epoch (the rest follow it)."""
        return offset > self._epoch_start_offset

    def _update_leader_high_watermark(self, now: int, effects: Effects) -> None:
        if self._role is not Role.LEADER:
            return
        ends = sorted([self._leader_durable_end(), *self._replica_end.values()], reverse=True)
        candidate = ends[self.majority - 1]
        if candidate > self.high_watermark and self._may_commit_to(candidate):
            self._set_high_watermark(candidate, effects)

    # ------------------------------------------------------------------ Fetch: follower side

    def _fetch_position(self) -> OffsetAndEpoch:
        """The position a Fetch reports: only flushed entries count, so flush first."""
        if self._log.flushed_end_offset() < self._log.end_offset():
            self._log.flush()
        end = self._log.flushed_end_offset()
        if end > self._log.start_offset():
            return OffsetAndEpoch(end, self._log.entry_epoch(end - 1))
        snapshot = self._log.latest_snapshot_id()
        return OffsetAndEpoch(end, snapshot.epoch if snapshot is not None else 0)

    def _send_fetch(self, now: int, effects: Effects) -> None:
        if self._role is Role.FOLLOWER and self.leader_id is not None:
            destination = self.leader_id
        elif not self.is_voter and self._role is Role.UNATTACHED:
            # An observer that knows no leader asks a voter; the answer names the leader.
            voters = sorted(self.voters)
            destination = voters[self._rng.randrange(0, len(voters))]
        else:
            return
        position = self._fetch_position()
        request = FetchRequest(
            replica_id=self.node_id,
            current_leader_epoch=self.epoch,
            fetch_offset=position.offset,
            last_fetched_epoch=position.epoch,
            max_bytes=self.config.fetch_max_bytes,
            max_wait_ms=self.config.fetch_max_wait_ms,
        )
        self._fetch_correlation = self._send(effects, destination, request)
        self._fetch_request_deadline = now + self.config.request_timeout_ms
        self._next_fetch_at = None

    def _on_fetch_response(
        self, envelope: Envelope, response: FetchResponse, now: int, effects: Effects
    ) -> None:
        if envelope.correlation_id != self._fetch_correlation:
            # Late, duplicated or from an earlier role: the request it answers is not the one
            # this node waits on.
            self._maybe_higher_epoch(response.leader_epoch, response.leader_id, now, effects)
            return
        self._fetch_correlation = None
        self._fetch_request_deadline = None
        if response.error is not ErrorCode.NONE:
            if not self._maybe_higher_epoch(
                response.leader_epoch, response.leader_id, now, effects
            ):
                self._next_fetch_at = now + self.config.retry_backoff_ms
            return
        if self._role is not Role.FOLLOWER:
            # An observer that asked a voter at random has found the leader.
            self._maybe_higher_epoch(response.leader_epoch, response.leader_id, now, effects)
        if (
            self._role is not Role.FOLLOWER
            or response.leader_epoch != self.epoch
            or response.leader_id != self.leader_id
        ):
            return
        self._last_leader_contact = now
        self._fetch_deadline = now + self.config.fetch_timeout_ms
        if response.snapshot_id is not None:
            self._snapshot_download = (response.snapshot_id, bytearray())
            self._send_fetch_snapshot(now, effects)
            return
        if response.diverging_epoch is not None:
            local = self._log.end_offset_for_epoch(response.diverging_epoch.epoch)
            cut = min(response.diverging_epoch.offset, local.offset)
            if not self._is_boundary(cut):
                # The leader's boundary falls inside an entry here: an entry this log has
                # and the leader has not, so it goes whole.
                cut = self._log.entry_start(cut)
            assert cut >= self.high_watermark, (
                f"node {self.node_id}: truncation to {cut} below high watermark "
                f"{self.high_watermark}"
            )
            self._log.truncate_to(cut)
        elif response.records:
            assert response.records[0].offset == self._log.end_offset(), (
                f"node {self.node_id}: records from {response.records[0].offset}, "
                f"log ends at {self._log.end_offset()}"
            )
            self._log.append(response.records)
        if response.diverging_epoch is None:
            self._set_high_watermark(
                max(self.high_watermark, min(response.high_watermark, self._log.end_offset())),
                effects,
            )
        self._send_fetch(now, effects)

    # ------------------------------------------------------------------ FetchSnapshot

    def _on_fetch_snapshot_request(
        self, envelope: Envelope, request: FetchSnapshotRequest, now: int, effects: Effects
    ) -> None:
        def answer(error: ErrorCode, size: int = 0, chunk: bytes = b"") -> None:
            response = FetchSnapshotResponse(
                error,
                self._named_leader(),
                self.epoch,
                request.snapshot_id,
                size,
                request.position,
                chunk,
            )
            self._reply(effects, envelope, response)

        if request.current_leader_epoch < self.epoch:
            answer(ErrorCode.FENCED_LEADER_EPOCH)
        elif request.current_leader_epoch > self.epoch:
            answer(ErrorCode.UNKNOWN_LEADER_EPOCH)
        elif self._role is not Role.LEADER:
            answer(ErrorCode.NOT_LEADER_OR_FOLLOWER)
        elif (snapshot := self._log.read_snapshot()) is None or snapshot[0] != request.snapshot_id:
            answer(ErrorCode.SNAPSHOT_NOT_FOUND)
        elif not 0 <= request.position <= len(snapshot[1]):
            answer(ErrorCode.POSITION_OUT_OF_RANGE)
        else:
            payload = snapshot[1]
            end = request.position + max(1, min(request.max_bytes, self.config.fetch_max_bytes))
            answer(ErrorCode.NONE, len(payload), payload[request.position : end])

    def _send_fetch_snapshot(self, now: int, effects: Effects) -> None:
        assert self._snapshot_download is not None and self.leader_id is not None
        snapshot_id, received = self._snapshot_download
        request = FetchSnapshotRequest(
            self.node_id, self.epoch, snapshot_id, len(received), self.config.fetch_max_bytes
        )
        self._fetch_correlation = self._send(effects, self.leader_id, request)
        self._fetch_request_deadline = now + self.config.request_timeout_ms

    def _on_fetch_snapshot_response(
        self, envelope: Envelope, response: FetchSnapshotResponse, now: int, effects: Effects
    ) -> None:
        if envelope.correlation_id != self._fetch_correlation:
            self._maybe_higher_epoch(response.leader_epoch, response.leader_id, now, effects)
            return
        self._fetch_correlation = None
        self._fetch_request_deadline = None
        download = self._snapshot_download
        self._snapshot_download = None
        if response.error is not ErrorCode.NONE or download is None:
            if not self._maybe_higher_epoch(
                response.leader_epoch, response.leader_id, now, effects
            ):
                # Start over with a Fetch: the leader names the snapshot it has now.
                self._next_fetch_at = now + self.config.retry_backoff_ms
            return
        snapshot_id, received = download
        if response.snapshot_id != snapshot_id or response.position != len(received):
            self._next_fetch_at = now + self.config.retry_backoff_ms
            return
        self._last_leader_contact = now
        self._fetch_deadline = now + self.config.fetch_timeout_ms
        received += response.unaligned_records
        if len(received) < response.size:
            self._snapshot_download = (snapshot_id, received)
            self._send_fetch_snapshot(now, effects)
            return
        try:
            decode_snapshot(received)
        except RecordsError:
            # Damaged on the way (every batch is CRC checked): fetch it again from the start.
            self._next_fetch_at = now + self.config.retry_backoff_ms
            return
        # The leader sends a snapshot only when this log parts from its own before the
        # leader's log start: the snapshot replaces the whole log.
        self._log.install_snapshot(snapshot_id, bytes(received))
        self._set_high_watermark(max(self.high_watermark, snapshot_id.offset), effects)
        self._send_fetch(now, effects)

    # ------------------------------------------------------------------ sending

    def _send(self, effects: Effects, destination: int, message: Message) -> int:
        self._correlation = (self._correlation + 1) & 0x7FFFFFFF
        effects.messages.append(Envelope(self.node_id, destination, self._correlation, message))
        return self._correlation

    def _reply(self, effects: Effects, request: Envelope, message: Message) -> None:
        effects.messages.append(
            Envelope(self.node_id, request.source, request.correlation_id, message)
        )
