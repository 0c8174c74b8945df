"""One partition's replica on one broker: the leader and follower rules, sans-io.

The owner (the broker's partition, or the simulation) feeds events with the current time in
milliseconds and carries out what comes back; the machine keeps no clock and sends nothing.

Leader
    :meth:`Replica.become_leader` (from the metadata image: leader epoch, partition epoch,
    replicas, ISR). Every follower fetch goes through :meth:`Replica.on_follower_fetch`: a
    fetch whose ``last_fetched_epoch`` does not end where the follower thinks (Kafka's rule:
    the leader's end offset for that epoch is below the fetch offset, or the leader's largest
    epoch not above it is smaller) gets a DivergingEpoch answer and does not move that
    follower's log end offset; any other fetch returns records from the fetch offset and
    records the follower's position. The high watermark is the smallest *acknowledged
    offset* over the ISR (see below), advanced only while the ISR has at least
    ``min.insync.replicas`` members (KIP-966's strict min ISR), and never moves back.

Acknowledged offset
    With ``ack_after_fsync`` (the default, our durability promise) a replica counts only what
    it has fsynced: the leader its own ``recovery_point``, a follower its fetch offset, because
    a follower in this mode fsyncs its log when it becomes a follower and appends with
    ``durable=True`` before it fetches again, so the offset it fetches from is fsynced on its
    disk. Kafka's wire protocol has no field for a
    flushed offset; this keeps the Fetch request unchanged. Without ``ack_after_fsync``
    (Kafka's behaviour) the leader counts its log end offset and followers append without
    fsync: replicated to memory, flushed later.

ISR changes
    A follower leaves the ISR after ``replica.lag.time.max.ms`` without catching up to the
    leader's log end offset, and joins it once its log end offset reaches the high watermark
    and the start of the current leader epoch. The machine only proposes: :meth:`Replica.poll`
    returns an :class:`AlterPartitionIntent` (one in flight at a time) that the owner sends to
    the controller; the controller's answer arrives as the next partition state
    (:meth:`Replica.apply_partition_state`). While a change is in flight the high watermark uses
    the larger of the two ISRs (KIP-497's maximal ISR), so a shrink takes effect only once the
    controller has it, and an expansion makes it wait for the new member at once; only the ISR
    the controller has committed counts towards ``min.insync.replicas``.

Follower
    :meth:`Replica.become_follower`; :meth:`Replica.next_fetch` builds the next Fetch (the log end
    offset and the latest epoch); :meth:`Replica.on_fetch_answer` truncates on DivergingEpoch to
    the smaller of the leader's end offset and its own end offset for that epoch (KIP-279), or
    appends the batches as the leader wrote them and takes ``min(leader HW, own LEO)`` as its
    high watermark.

acks=all
    :meth:`Replica.append` refuses with NOT_ENOUGH_REPLICAS before appending when the ISR is
    smaller than ``min.insync.replicas``; a waiting write completes when the high watermark
    passes it, fails with NOT_ENOUGH_REPLICAS_AFTER_APPEND when the ISR shrinks below the
    minimum, NOT_LEADER_OR_FOLLOWER when leadership moves, REQUEST_TIMED_OUT at its deadline.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

from tidelog.protocol.error_codes import ErrorCode
from tidelog.replication.log import ReplicaLog

NO_LEADER = -1
UNDEFINED_EPOCH = -1
UNDEFINED_OFFSET = -1


class Role(enum.Enum):
    NONE = "none"
    LEADER = "leader"
    FOLLOWER = "follower"


class StaleTransitionError(ValueError):
    """A leader or follower transition older than the state the replica already has."""


@dataclass(frozen=True)
class ReplicaConfig:
    broker_id: int
    min_insync_replicas: int = 1
    replica_lag_time_max_ms: int = 30000
    #: Count only fsynced data towards the high watermark (see the module docstring).
    ack_after_fsync: bool = True
    replica_fetch_max_bytes: int = 1048576


@dataclass(frozen=True)
class FetchRequest:
    """A follower's fetch of one partition from its leader."""

    replica_id: int
    leader_id: int
    current_leader_epoch: int
    fetch_offset: int
    last_fetched_epoch: int


@dataclass(frozen=True)
class FetchAnswer:
    """The leader's answer to one follower fetch."""

    error: ErrorCode
    leader_epoch: int
    high_watermark: int = UNDEFINED_OFFSET
    log_end_offset: int = UNDEFINED_OFFSET
    #: DivergingEpoch (epoch, end offset) when the follower's log diverges.
    diverging: tuple[int, int] | None = None
    records: bytes = b""
    fetch_offset: int = UNDEFINED_OFFSET


@dataclass(frozen=True)
class AlterPartitionIntent:
    """An AlterPartition the owner sends to the controller for this partition."""

    broker_id: int
    leader_epoch: int
    partition_epoch: int
    new_isr: tuple[int, ...]


@dataclass(frozen=True)
class Completion:
    """The outcome of a waiting acks=all write."""

    token: int
    error: ErrorCode


@dataclass(frozen=True)
class AppendOutcome:
    error: ErrorCode
    #: The offset after the write (what the high watermark must reach); -1 when refused.
    end_offset: int = UNDEFINED_OFFSET
    #: The waiting write's token (acks=all), None when it is already answered.
    token: int | None = None


@dataclass
class Effects:
    completions: list[Completion] = field(default_factory=list)
    alter_partition: AlterPartitionIntent | None = None


@dataclass
class _FollowerState:
    log_end_offset: int = UNDEFINED_OFFSET
    last_caught_up_ms: int = 0
    last_fetch_ms: int = 0
    leader_end_at_last_fetch: int = UNDEFINED_OFFSET


@dataclass
class _Pending:
    token: int
    end_offset: int
    deadline_ms: int


class Replica:
    """The replica of one partition on broker ``config.broker_id``."""

    def __init__(self, log: ReplicaLog, config: ReplicaConfig) -> None:
        self.log = log
        self.config = config
        self.role = Role.NONE
        self.leader_id = NO_LEADER
        self.leader_epoch = UNDEFINED_EPOCH
        self.partition_epoch = UNDEFINED_EPOCH
        self.replicas: tuple[int, ...] = ()
        self.isr: tuple[int, ...] = ()
        self._followers: dict[int, _FollowerState] = {}
        self._leader_epoch_start = 0
        self._inflight: AlterPartitionIntent | None = None
        self._pending: list[_Pending] = []
        self._next_token = 0
        self._completions: list[Completion] = []
        self._high_watermark = min(log.high_watermark, log.log_end_offset)

    # ------------------------------------------------------------------ transitions

    @property
    def high_watermark(self) -> int:
        return self._high_watermark

    def _check_newer(self, leader_epoch: int, partition_epoch: int) -> None:
        if leader_epoch < self.leader_epoch or (
            leader_epoch == self.leader_epoch and partition_epoch < self.partition_epoch
        ):
            raise StaleTransitionError(
                f"transition to leader epoch {leader_epoch} / partition epoch "
                f"{partition_epoch} is older than the replica's "
                f"{self.leader_epoch} / {self.partition_epoch}"
            )

    def become_leader(
        self,
        leader_epoch: int,
        partition_epoch: int,
        replicas: Sequence[int],
        isr: Sequence[int],
        now_ms: int,
    ) -> None:
        """Lead from ``leader_epoch``; the same epoch again only updates replicas and ISR."""
        self._check_newer(leader_epoch, partition_epoch)
        if self.role is Role.LEADER and leader_epoch == self.leader_epoch:
            self._apply_isr(partition_epoch, replicas, isr, now_ms)
            return
        self._fail_pending(ErrorCode.NOT_LEADER_OR_FOLLOWER)
        self.role = Role.LEADER
        self.leader_id = self.config.broker_id
        self.leader_epoch = leader_epoch
        self.partition_epoch = partition_epoch
        self.replicas = tuple(replicas)
        self.isr = tuple(isr)
        self._inflight = None
        self._leader_epoch_start = self.log.log_end_offset
        # Recorded now, not at the first append, so a follower that led a later epoch
        # than any this log holds still gets an end offset for its epoch.
        self.log.epoch_cache.assign(leader_epoch, self._leader_epoch_start)
        # Followers' positions from an earlier term mean nothing in this one: each counts
        # again from its first fetch of this epoch. Everyone in the ISR was caught up.
        self._followers = {
            r: _FollowerState(last_caught_up_ms=now_ms, last_fetch_ms=now_ms)
            for r in self.replicas
            if r != self.config.broker_id
        }
        self._high_watermark = min(self.log.high_watermark, self.log.log_end_offset)
        self._maybe_advance_high_watermark()

    def become_follower(
        self,
        leader_id: int,
        leader_epoch: int,
        partition_epoch: int,
        replicas: Sequence[int] = (),
        isr: Sequence[int] = (),
    ) -> None:
        self._check_newer(leader_epoch, partition_epoch)
        self._fail_pending(ErrorCode.NOT_LEADER_OR_FOLLOWER)
        self.role = Role.FOLLOWER
        self.leader_id = leader_id
        self.leader_epoch = leader_epoch
        self.partition_epoch = partition_epoch
        self.replicas = tuple(replicas)
        self.isr = tuple(isr)
        self._followers = {}
        self._inflight = None
        self._high_watermark = min(self.log.high_watermark, self.log.log_end_offset)
        if self.config.ack_after_fsync:
            # The offset a follower fetches from is what the leader counts as fsynced here;
            # what it wrote as a leader (acks=1 appends) may not be yet.
            self.log.sync()

    def apply_partition_state(
        self,
        leader_id: int,
        leader_epoch: int,
        partition_epoch: int,
        replicas: Sequence[int],
        isr: Sequence[int],
        now_ms: int,
    ) -> bool:
        """Apply a partition state from the metadata image or an AlterPartition answer.

        Returns False (and changes nothing) when it is older than what the replica has.
        """
        if leader_epoch < self.leader_epoch or (
            leader_epoch == self.leader_epoch and partition_epoch <= self.partition_epoch
        ):
            return False
        if leader_id == self.config.broker_id:
            self.become_leader(leader_epoch, partition_epoch, replicas, isr, now_ms)
        elif self.config.broker_id in replicas and leader_id != NO_LEADER:
            if self.role is Role.FOLLOWER and leader_epoch == self.leader_epoch:
                self.partition_epoch = partition_epoch
                self.replicas, self.isr = tuple(replicas), tuple(isr)
            else:
                self.become_follower(leader_id, leader_epoch, partition_epoch, replicas, isr)
        else:
            self._fail_pending(ErrorCode.NOT_LEADER_OR_FOLLOWER)
            self.role = Role.NONE
            self.leader_id = leader_id
            self.leader_epoch = leader_epoch
            self.partition_epoch = partition_epoch
            self.replicas, self.isr = tuple(replicas), tuple(isr)
        return True

    def on_alter_partition_error(self, intent: AlterPartitionIntent, error: ErrorCode) -> None:
        """The controller refused ``intent``.

        Only INELIGIBLE_REPLICA (and OPERATION_NOT_ATTEMPTED) say for certain that the change
        was not applied and the partition epoch is current: then it is dropped and the next
        poll decides again. Any other error (a stale partition or leader epoch) may answer a
        retry of a change the controller already applied, so the change stays pending, and
        the high watermark keeps waiting for the larger ISR, until the next partition state
        arrives (Kafka's rule; the simulation found a zombie leader committing without a
        replica the controller had added at its own request). An answer to an earlier
        intent changes nothing.
        """
        if intent == self._inflight and error in (
            ErrorCode.INELIGIBLE_REPLICA,
            ErrorCode.OPERATION_NOT_ATTEMPTED,
        ):
            self._inflight = None

    def _apply_isr(
        self, partition_epoch: int, replicas: Sequence[int], isr: Sequence[int], now_ms: int
    ) -> None:
        self.partition_epoch = partition_epoch
        self.replicas = tuple(replicas)
        self.isr = tuple(isr)
        if self._inflight is not None and partition_epoch > self._inflight.partition_epoch:
            self._inflight = None
        # A replica new to the partition gets the lag time to show it keeps up.
        for r in self.replicas:
            if r != self.config.broker_id:
                self._followers.setdefault(
                    r, _FollowerState(last_caught_up_ms=now_ms, last_fetch_ms=now_ms)
                )
        self._maybe_advance_high_watermark()
        if len(self.isr) < self.config.min_insync_replicas:
            self._fail_pending(ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND)

    # ------------------------------------------------------------------ leader

    def _own_acknowledged_offset(self) -> int:
        if self.config.ack_after_fsync:
            return min(self.log.recovery_point, self.log.log_end_offset)
        return self.log.log_end_offset

    def _maximal_isr(self) -> tuple[int, ...]:
        if self._inflight is None:
            return self.isr
        return tuple(sorted(set(self.isr) | set(self._inflight.new_isr)))

    def _high_watermark_candidate(self) -> int | None:
        """The offset every ISR member acknowledged, or None while the ISR is too small."""
        # The minimum counts the ISR the controller has committed: a leader whose expansion is
        # still in flight may be a zombie whose controller never accepts it.
        if not self._may_advance(self.isr):
            return None
        isr = self._maximal_isr()
        candidate = self._own_acknowledged_offset()
        for r in isr:
            if r == self.config.broker_id:
                continue
            acknowledged = self._acknowledged_by(r)
            if acknowledged is None:
                return None
            candidate = min(candidate, acknowledged)
        return candidate

    def _acknowledged_by(self, replica_id: int) -> int | None:
        """A follower's log end offset as of its last fetch in this epoch (fsynced when
        ``ack_after_fsync``), None before its first one."""
        state = self._followers.get(replica_id)
        if state is None or state.log_end_offset < 0:
            return None
        return state.log_end_offset

    def _may_advance(self, isr: Sequence[int]) -> bool:
        # KIP-966: with fewer in-sync replicas than the minimum nothing becomes committed,
        # so a lone leader that loses its disk cannot take committed data with it.
        return len(isr) >= self.config.min_insync_replicas

    def _maybe_advance_high_watermark(self) -> None:
        if self.role is not Role.LEADER:
            return
        candidate = self._high_watermark_candidate()
        if candidate is None or candidate <= self._high_watermark:
            return
        self._high_watermark = candidate
        stored = self.log.update_high_watermark(candidate)
        assert stored == candidate, (stored, candidate)
        self._complete_reached()

    def _complete_reached(self) -> None:
        done = [p for p in self._pending if p.end_offset <= self._high_watermark]
        if not done:
            return
        self._pending = [p for p in self._pending if p.end_offset > self._high_watermark]
        self._completions.extend(Completion(p.token, ErrorCode.NONE) for p in done)

    def _fail_pending(self, error: ErrorCode) -> None:
        self._completions.extend(Completion(p.token, error) for p in self._pending)
        self._pending = []

    def append(
        self, batches: bytes | bytearray | memoryview, acks: int, now_ms: int, timeout_ms: int
    ) -> AppendOutcome:
        """Append a produce request's batches as the leader.

        acks=0/1 are answered at once; acks=-1 waits (a token, completed through
        :meth:`poll`) until the high watermark passes the write.
        """
        if self.role is not Role.LEADER:
            return AppendOutcome(ErrorCode.NOT_LEADER_OR_FOLLOWER)
        if acks == -1 and len(self.isr) < self.config.min_insync_replicas:
            return AppendOutcome(ErrorCode.NOT_ENOUGH_REPLICAS)
        durable = acks == -1 and self.config.ack_after_fsync
        self.log.append(batches, leader_epoch=self.leader_epoch, durable=durable)
        end = self.log.log_end_offset
        if acks != -1:
            # An ISR of the leader alone (min.insync.replicas=1) commits at once.
            self._maybe_advance_high_watermark()
            return AppendOutcome(ErrorCode.NONE, end)
        self._next_token += 1
        self._pending.append(_Pending(self._next_token, end, now_ms + timeout_ms))
        self._maybe_advance_high_watermark()
        return AppendOutcome(ErrorCode.NONE, end, self._next_token)

    def on_log_flushed(self) -> None:
        """The leader's log was fsynced further (its recovery point moved)."""
        self._maybe_advance_high_watermark()

    def _check_leader_epoch(self, current_leader_epoch: int) -> ErrorCode:
        if self.role is not Role.LEADER:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        if current_leader_epoch < self.leader_epoch:
            return ErrorCode.FENCED_LEADER_EPOCH
        if current_leader_epoch > self.leader_epoch:
            return ErrorCode.UNKNOWN_LEADER_EPOCH
        return ErrorCode.NONE

    def diverging_epoch(self, fetch_offset: int, last_fetched_epoch: int) -> tuple[int, int] | None:
        """Kafka's fetch validation: the (epoch, end offset) the follower must truncate to,
        or None when its log is consistent with this one at ``fetch_offset``."""
        if last_fetched_epoch < 0:
            return None
        epoch, end = self.log.end_offset_for_epoch(last_fetched_epoch)
        if epoch < last_fetched_epoch or end < fetch_offset:
            return epoch, end
        return None

    def on_follower_fetch(self, request: FetchRequest, now_ms: int) -> FetchAnswer:
        error = self._check_leader_epoch(request.current_leader_epoch)
        if error is not ErrorCode.NONE:
            return FetchAnswer(error, self.leader_epoch)
        state = self._followers.get(request.replica_id)
        if state is None:
            return FetchAnswer(ErrorCode.NOT_LEADER_OR_FOLLOWER, self.leader_epoch)
        leader_end = self.log.log_end_offset
        diverging = self.diverging_epoch(request.fetch_offset, request.last_fetched_epoch)
        records = b""
        if diverging is None:
            if not self.log.log_start_offset <= request.fetch_offset <= leader_end:
                return FetchAnswer(ErrorCode.OFFSET_OUT_OF_RANGE, self.leader_epoch)
            self._record_follower_position(state, request.fetch_offset, leader_end, now_ms)
            records = self.log.read_bytes(request.fetch_offset, self.config.replica_fetch_max_bytes)
        return FetchAnswer(
            ErrorCode.NONE,
            self.leader_epoch,
            self._high_watermark,
            leader_end,
            diverging=diverging,
            records=records,
            fetch_offset=request.fetch_offset,
        )

    def _record_follower_position(
        self, state: _FollowerState, fetch_offset: int, leader_end: int, now_ms: int
    ) -> None:
        # Kafka's lastCaughtUpTime: caught up now when it asks from the leader's end, or
        # at its previous fetch when it asks from where the leader ended back then.
        if fetch_offset >= leader_end:
            state.last_caught_up_ms = now_ms
        elif fetch_offset >= state.leader_end_at_last_fetch >= 0:
            state.last_caught_up_ms = max(state.last_caught_up_ms, state.last_fetch_ms)
        state.log_end_offset = fetch_offset
        state.last_fetch_ms = now_ms
        state.leader_end_at_last_fetch = leader_end
        self._maybe_advance_high_watermark()

    def _isr_change(self, now_ms: int) -> tuple[int, ...] | None:
        current = set(self.isr)
        lagging = {
            r
            for r in current
            if r != self.config.broker_id
            and now_ms - self._followers.get(r, _FollowerState()).last_caught_up_ms
            > self.config.replica_lag_time_max_ms
        }
        caught_up = {
            r
            for r, state in self._followers.items()
            if r not in current
            and r in self.replicas
            and state.log_end_offset >= max(self._high_watermark, self._leader_epoch_start)
            and now_ms - state.last_caught_up_ms <= self.config.replica_lag_time_max_ms
        }
        if not lagging and not caught_up:
            return None
        return tuple(sorted((current - lagging) | caught_up))

    def poll(self, now_ms: int) -> Effects:
        """Timeouts, ISR proposals and the completions gathered since the last poll."""
        effects = Effects()
        if self.role is Role.LEADER:
            self._maybe_advance_high_watermark()
            expired = [p for p in self._pending if p.deadline_ms <= now_ms]
            if expired:
                self._pending = [p for p in self._pending if p.deadline_ms > now_ms]
                self._completions.extend(
                    Completion(p.token, ErrorCode.REQUEST_TIMED_OUT) for p in expired
                )
            if self._inflight is None:
                new_isr = self._isr_change(now_ms)
                if new_isr is not None:
                    self._inflight = AlterPartitionIntent(
                        self.config.broker_id, self.leader_epoch, self.partition_epoch, new_isr
                    )
                    effects.alter_partition = self._inflight
                    # An expansion counts the new member at once (maximal ISR).
                    self._maybe_advance_high_watermark()
        effects.completions, self._completions = self._completions, []
        return effects

    @property
    def alter_partition_in_flight(self) -> AlterPartitionIntent | None:
        return self._inflight

    # ------------------------------------------------------------------ follower

    def next_fetch(self) -> FetchRequest | None:
        if self.role is not Role.FOLLOWER:
            return None
        return FetchRequest(
            self.config.broker_id,
            self.leader_id,
            self.leader_epoch,
            self.log.log_end_offset,
            self.last_fetched_epoch(),
        )

    def last_fetched_epoch(self) -> int:
        return self.log.latest_epoch

    def _follower_fsyncs(self) -> bool:
        # What this follower fetches from next is what the leader counts for it.
        return self.config.ack_after_fsync

    def truncation_offset(self, diverging: tuple[int, int]) -> int:
        """Where a DivergingEpoch answer truncates this log (KIP-279).

        The leader's ``(epoch, end)`` is the largest epoch it has not above ours and where it
        ends. When this log has that epoch, the two agree up to the smaller end; when it does
        not, it keeps only what precedes its own largest epoch below, and the next fetch asks
        again with that epoch.
        """
        epoch, end = diverging
        if epoch < 0 or end < 0:
            # The leader knows none of our epochs: keep only what it has committed.
            return min(self._high_watermark, self.log.log_end_offset)
        own_epoch, own_end = self.log.end_offset_for_epoch(epoch)
        if own_epoch == epoch:
            return min(end, own_end)
        return own_end if own_end >= 0 else self.log.log_start_offset

    def on_fetch_answer(self, request: FetchRequest, answer: FetchAnswer) -> bool:
        """Apply the leader's answer to ``request``; False when it is stale and ignored."""
        if (
            self.role is not Role.FOLLOWER
            or request.current_leader_epoch != self.leader_epoch
            or request.leader_id != self.leader_id
            or answer.error is not ErrorCode.NONE
            or request.fetch_offset != self.log.log_end_offset
            or request.last_fetched_epoch != self.last_fetched_epoch()
        ):
            return False
        if answer.diverging is not None:
            self.log.truncate_to(self.truncation_offset(answer.diverging))
            self._high_watermark = min(self._high_watermark, self.log.log_end_offset)
            return True
        if answer.records:
            self.log.append_as_follower(answer.records, durable=self._follower_fsyncs())
        hw = min(answer.high_watermark, self.log.log_end_offset)
        if hw > self._high_watermark:
            self._high_watermark = self.log.update_high_watermark(hw)
        return True
