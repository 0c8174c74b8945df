"""Random sequences of transaction requests, timeouts, marker failures and coordinator
reloads never break the transaction coordinator's invariants."""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from txn_helpers import TxnHarness

from tidelog.coordinator.transactions import TransactionConfig, TxnState
from tidelog.protocol.error_codes import ErrorCode

E = ErrorCode
IDS = ["a", "b", "c"]
PARTITIONS = [("t", 0), ("t", 1), ("u", 0)]
ACTIVE = {"Ongoing", "PrepareCommit", "PrepareAbort"}


class TxnMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.h = TxnHarness(
            TransactionConfig(
                transaction_state_log_num_partitions=2,
                transaction_abort_timed_out_transaction_cleanup_interval_ms=1000,
                transactional_id_expiration_ms=60_000,
                transaction_remove_expired_transaction_cleanup_interval_ms=5_000,
            )
        )
        self.h.advance(0)
        #: per id, the (producer id, epoch) the latest successful InitProducerId gave
        self.producer: dict[str, tuple[int, int]] = {}
        #: per id, every (producer id, epoch) it ever handed out, in order
        self.handed_out: dict[str, list[tuple[int, int]]] = {t: [] for t in IDS}
        #: per id, the partitions added to the transaction now open, as the client knows them
        self.added: dict[str, set[tuple[str, int]]] = {t: set() for t in IDS}
        #: per id, whether the client itself ended the transaction it opened last
        self.ended: dict[str, bool] = dict.fromkeys(IDS, True)

    @rule(tid=st.sampled_from(IDS), timeout=st.sampled_from([1500, 60_000]))
    def init(self, tid: str, timeout: int) -> None:
        r = self.h.init(tid, timeout_ms=timeout)
        if r.error is E.NONE:
            self.producer[tid] = (r.producer_id, r.producer_epoch)
            self.handed_out[tid].append((r.producer_id, r.producer_epoch))
            self.added[tid] = set()
            self.ended[tid] = True
        else:
            assert r.error in (E.CONCURRENT_TRANSACTIONS, E.COORDINATOR_LOAD_IN_PROGRESS), r

    @rule(tid=st.sampled_from(IDS), parts=st.sets(st.sampled_from(PARTITIONS), min_size=1))
    def add(self, tid: str, parts: set[tuple[str, int]]) -> None:
        if tid not in self.producer:
            return
        pid, epoch = self.producer[tid]
        r = self.h.add(tid, pid, epoch, *sorted(parts))
        if r.error is E.NONE:
            self.added[tid] |= parts
            self.ended[tid] = False
            meta = self.h.coordinator.transaction(tid)
            assert meta is not None and parts <= meta.partitions

    @rule(tid=st.sampled_from(IDS), commit=st.booleans())
    def end(self, tid: str, commit: bool) -> None:
        if tid not in self.producer:
            return
        pid, epoch = self.producer[tid]
        before = self.h.coordinator.transaction(tid)
        open_parts = set(before.partitions) if before is not None else set()
        sent = len(self.h.markers)
        r = self.h.end(tid, pid, epoch, commit)
        if r.error is E.NONE:
            self.ended[tid] = True
        refusing = self.h.hold_markers or self.h.marker_errors
        if r.error is E.NONE and open_parts and not refusing:
            # the markers of exactly this transaction were written, with its outcome
            new = [m for m in self.h.markers[sent:] if m.transactional_id == tid]
            written = {tp for m in new for tp in m.partitions}
            assert written == open_parts
            assert all(m.commit is commit and m.producer_epoch == epoch for m in new)

    @rule(tid=st.sampled_from(IDS))
    def stale_producer_is_refused(self, tid: str) -> None:
        """Any epoch handed out before the current one is fenced."""
        if len(self.handed_out[tid]) < 2:
            return
        current = self.h.coordinator.transaction(tid)
        for pid, epoch in self.handed_out[tid][:-1]:
            if current is not None and (pid, epoch) == (
                current.producer_id,
                current.producer_epoch,
            ):
                continue
            assert self.h.add(tid, pid, epoch, PARTITIONS[0]).error is not E.NONE
            assert self.h.end(tid, pid, epoch, True).error is not E.NONE

    @rule(failing=st.sampled_from(PARTITIONS))
    def a_partition_refuses_markers(self, failing: tuple[str, int]) -> None:
        self.h.marker_errors[failing] = E.NOT_LEADER_OR_FOLLOWER

    @rule()
    def partitions_take_markers_again(self) -> None:
        self.h.marker_errors.clear()

    @rule(hold=st.booleans())
    def hold_or_release_markers(self, hold: bool) -> None:
        self.h.hold_markers = hold
        if not hold:
            self.h.release_markers()

    @rule(ms=st.sampled_from([100, 1_000, 5_000, 70_000]))
    def time_passes(self, ms: int) -> None:
        self.h.advance(ms)

    @rule()
    def reload(self) -> None:
        """The coordinator moves (or the broker restarts): a new one replays the log."""
        before = {t: self.h.coordinator.describe(t) for t in IDS}
        pending = {t for t in IDS if (m := self.h.coordinator.transaction(t)) and m.pending}
        self.h.held.clear()  # markers in flight are lost with the old coordinator
        self.h.reload()
        for tid in IDS:
            if tid in pending:
                continue
            after = self.h.coordinator.describe(tid)
            b = before[tid]
            if b.state in ("PrepareCommit", "PrepareAbort"):
                # markers are written again at load; the transaction completes
                assert after.state in (b.state, b.state.replace("Prepare", "Complete"))
            else:
                assert after == b, (tid, b, after)

    @invariant()
    def states_are_consistent(self) -> None:
        for tid in IDS:
            meta = self.h.coordinator.transaction(tid)
            if meta is None:
                continue
            assert meta.state is not TxnState.DEAD
            if meta.state.kafka_name not in ACTIVE:
                assert not meta.partitions, meta
            if meta.state is TxnState.ONGOING:
                assert meta.start_timestamp >= 0

    @invariant()
    def epochs_never_go_back(self) -> None:
        for tid, handed in self.handed_out.items():
            for (pid1, e1), (pid2, e2) in itertools.pairwise(handed):
                assert pid1 != pid2 or e2 > e1, handed
            meta = self.h.coordinator.transaction(tid)
            if meta is not None and handed and meta.producer_id == handed[-1][0]:
                assert meta.producer_epoch >= handed[-1][1]

    @invariant()
    def an_abort_the_client_did_not_ask_for_fences_it(self) -> None:
        """A transaction aborted by the coordinator (timeout, re-init) bumps the epoch, so the
        producer that opened it can no longer act."""
        for tid in IDS:
            meta = self.h.coordinator.transaction(tid)
            if meta is None or tid not in self.producer or self.ended[tid]:
                continue
            if meta.state in (TxnState.PREPARE_ABORT, TxnState.COMPLETE_ABORT):
                pid, epoch = self.producer[tid]
                assert (meta.producer_id, meta.producer_epoch) != (pid, epoch), meta
                assert self.h.add(tid, pid, epoch, PARTITIONS[0]).error is E.PRODUCER_FENCED

    @invariant()
    def every_request_was_answered(self) -> None:
        assert self.h.coordinator.pending_write_count() == 0


TestTxnMachine = TxnMachine.TestCase
TestTxnMachine.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
