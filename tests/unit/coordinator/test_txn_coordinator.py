"""The transaction coordinator, driven by a fake driver: every transition, fencing,
timeouts, expiration, markers and replay of __transaction_state."""

from __future__ import annotations

import pytest
from txn_helpers import TxnHarness

from tidelog.coordinator.transactions import (
    VALID_PREVIOUS_STATES,
    IllegalTransition,
    TransactionConfig,
    TransactionMetadata,
    TxnState,
    partition_for_transactional_id,
)
from tidelog.coordinator.transactions.records import decode_key, decode_value
from tidelog.protocol.error_codes import ErrorCode

E = ErrorCode
T0 = ("t", 0)
T1 = ("t", 1)


@pytest.fixture
def h() -> TxnHarness:
    return TxnHarness()


def begin(h: TxnHarness, tid: str = "tx", *tps: tuple[str, int]) -> tuple[int, int]:
    r = h.init(tid)
    assert r.error is E.NONE
    assert h.add(tid, r.producer_id, r.producer_epoch, *(tps or (T0, T1))).error is E.NONE
    return r.producer_id, r.producer_epoch


def states_written(h: TxnHarness, tid: str) -> list[str]:
    p = h.coordinator.partition_for(tid)
    return [
        TxnState(decode_value(r.value).status).kafka_name
        for r in h.log[p]
        if r.value is not None and decode_key(r.key) == tid
    ]


def test_partition_is_kafkas_hash() -> None:
    # Utils.abs("transactional-id".hashCode()) % 50, as Kafka computes it
    assert partition_for_transactional_id("", 50) == 0
    assert partition_for_transactional_id("a", 50) == 97 % 50
    # String.hashCode is s[0]*31^(n-1) + ... + s[n-1], wrapped to a signed 32-bit int
    n = sum(ord(c) * 31 ** (5 - i) for i, c in enumerate("my-txn")) % 2**32
    signed = n - 2**32 if n >= 2**31 else n
    assert partition_for_transactional_id("my-txn", 50) == abs(signed) % 50


def test_init_gives_a_new_id_epoch_0_and_writes_empty(h: TxnHarness) -> None:
    r = h.init("tx")
    assert (r.error, r.producer_epoch) == (E.NONE, 0)
    assert r.producer_id >= 1000
    assert states_written(h, "tx") == ["Empty"]
    assert h.state("tx") == "Empty"


def test_init_again_bumps_the_epoch_and_keeps_the_id(h: TxnHarness) -> None:
    first = h.init("tx")
    second = h.init("tx")
    assert second.producer_id == first.producer_id
    assert second.producer_epoch == first.producer_epoch + 1
    # the older producer is fenced
    assert h.add("tx", first.producer_id, first.producer_epoch, T0).error is E.PRODUCER_FENCED
    assert h.end("tx", first.producer_id, first.producer_epoch, True).error is E.PRODUCER_FENCED


@pytest.mark.parametrize("timeout", [0, -1, 900_001])
def test_timeouts_outside_the_bounds_are_refused(h: TxnHarness, timeout: int) -> None:
    assert h.init("tx", timeout_ms=timeout).error is E.INVALID_TRANSACTION_TIMEOUT
    assert h.coordinator.transaction("tx") is None


def test_commit_writes_prepare_markers_complete(h: TxnHarness) -> None:
    pid, epoch = begin(h)
    assert h.state("tx") == "Ongoing"
    assert h.coordinator.describe("tx").partitions == (T0, T1)
    r = h.end("tx", pid, epoch, commit=True)
    assert r.error is E.NONE
    assert states_written(h, "tx") == ["Empty", "Ongoing", "PrepareCommit", "CompleteCommit"]
    [marker] = h.markers
    assert (marker.producer_id, marker.producer_epoch, marker.commit) == (pid, epoch, True)
    assert marker.partitions == (T0, T1)
    assert h.state("tx") == "CompleteCommit"
    assert h.coordinator.describe("tx").partitions == ()


def test_abort_writes_abort_markers(h: TxnHarness) -> None:
    pid, epoch = begin(h)
    assert h.end("tx", pid, epoch, commit=False).error is E.NONE
    assert [m.commit for m in h.markers] == [False]
    assert h.state("tx") == "CompleteAbort"


def test_endtxn_answers_before_markers_and_retries_are_idempotent(h: TxnHarness) -> None:
    pid, epoch = begin(h)
    h.hold_markers = True
    assert h.end("tx", pid, epoch, True).error is E.NONE
    assert h.state("tx") == "PrepareCommit"
    # while the markers are written: the same outcome waits, the other one is illegal
    assert h.end("tx", pid, epoch, True).error is E.CONCURRENT_TRANSACTIONS
    assert h.end("tx", pid, epoch, False).error is E.INVALID_TXN_STATE
    assert h.add("tx", pid, epoch, T0).error is E.CONCURRENT_TRANSACTIONS
    assert h.init("tx").error is E.CONCURRENT_TRANSACTIONS
    h.release_markers()
    assert h.state("tx") == "CompleteCommit"
    assert h.end("tx", pid, epoch, True).error is E.NONE  # a retry after completion
    assert h.end("tx", pid, epoch, False).error is E.INVALID_TXN_STATE
    assert len(h.markers) == 1


def test_endtxn_without_a_transaction_is_invalid(h: TxnHarness) -> None:
    r = h.init("tx")
    assert h.end("tx", r.producer_id, r.producer_epoch, True).error is E.INVALID_TXN_STATE
    assert h.end("nope", 1, 0, True).error is E.INVALID_PRODUCER_ID_MAPPING
    assert h.end("tx", r.producer_id + 1, 0, True).error is E.INVALID_PRODUCER_ID_MAPPING


def test_adding_known_partitions_writes_nothing(h: TxnHarness) -> None:
    pid, epoch = begin(h)
    before = len(h.log[h.coordinator.partition_for("tx")])
    assert h.add("tx", pid, epoch, T0).error is E.NONE
    assert len(h.log[h.coordinator.partition_for("tx")]) == before
    assert h.add("tx", pid, epoch, ("u", 3)).error is E.NONE
    assert h.coordinator.describe("tx").partitions == (T0, T1, ("u", 3))


def test_a_second_transaction_after_commit(h: TxnHarness) -> None:
    pid, epoch = begin(h)
    assert h.end("tx", pid, epoch, True).error is E.NONE
    assert h.add("tx", pid, epoch, T1).error is E.NONE
    assert h.coordinator.describe("tx").partitions == (T1,)
    assert h.end("tx", pid, epoch, False).error is E.NONE
    assert [m.commit for m in h.markers] == [True, False]
    assert h.markers[1].partitions == (T1,)


def test_reinit_during_a_transaction_aborts_it_and_fences(h: TxnHarness) -> None:
    pid, epoch = begin(h)
    h.hold_markers = True
    assert h.init("tx").error is E.CONCURRENT_TRANSACTIONS
    assert h.state("tx") == "PrepareAbort"
    # the abort is written with the bumped epoch: the old producer is fenced already
    [held] = h.held
    assert (held.commit, held.producer_epoch) == (False, epoch + 1)
    assert h.end("tx", pid, epoch, True).error is E.PRODUCER_FENCED
    assert h.init("tx").error is E.CONCURRENT_TRANSACTIONS  # still aborting
    h.release_markers()
    r = h.init("tx")
    assert (r.error, r.producer_id, r.producer_epoch) == (E.NONE, pid, epoch + 2)
    assert states_written(h, "tx")[-3:] == ["PrepareAbort", "CompleteAbort", "Empty"]


def test_kip360_producer_may_bump_only_its_current_epoch(h: TxnHarness) -> None:
    first = h.init("tx")
    bumped = h.init("tx", producer_id=first.producer_id, epoch=first.producer_epoch)
    assert bumped.producer_epoch == first.producer_epoch + 1
    # a retry of that request gets the same answer
    again = h.init("tx", producer_id=first.producer_id, epoch=first.producer_epoch)
    assert again.producer_epoch == bumped.producer_epoch
    stale = h.init("tx", producer_id=first.producer_id + 7, epoch=0)
    assert stale.error is E.PRODUCER_FENCED


def test_an_exhausted_epoch_moves_to_a_new_producer_id(h: TxnHarness) -> None:
    r = h.init("tx")
    meta = h.coordinator.transaction("tx")
    assert meta is not None
    meta.producer_epoch = 32766
    after = h.init("tx", producer_id=r.producer_id, epoch=32766)
    assert after.producer_id != r.producer_id
    assert after.producer_epoch == 0
    assert meta.previous_producer_id == r.producer_id
    # the producer did not get the answer and asks again: the same answer, no new bump
    again = h.init("tx", producer_id=r.producer_id, epoch=32766)
    assert (again.producer_id, again.producer_epoch) == (after.producer_id, 0)
    # the old id with an epoch that was not exhausted is a zombie
    assert h.init("tx", producer_id=r.producer_id, epoch=3).error is E.PRODUCER_FENCED


def test_a_producer_whose_id_expired_gets_a_new_one(h: TxnHarness) -> None:
    """KIP-360: the transactional id was forgotten; the producer names its old id and epoch
    and is given the new id rather than being fenced."""
    r = h.init("tx", producer_id=4242, epoch=7)
    assert (r.error, r.producer_epoch) == (E.NONE, 0)
    assert r.producer_id != 4242


def test_timed_out_transaction_is_aborted_and_its_producer_fenced() -> None:
    h = TxnHarness(
        TransactionConfig(
            transaction_state_log_num_partitions=4,
            transaction_abort_timed_out_transaction_cleanup_interval_ms=1000,
        )
    )
    h.advance(0)
    r = h.init("tx", timeout_ms=5000)
    pid, epoch = r.producer_id, r.producer_epoch
    assert h.add("tx", pid, epoch, T0).error is E.NONE
    h.advance(4000)
    assert h.state("tx") == "Ongoing"
    h.advance(2500)
    assert h.state("tx") == "CompleteAbort"
    [marker] = h.markers
    assert (marker.commit, marker.producer_epoch, marker.partitions) == (False, epoch + 1, (T0,))
    assert h.add("tx", pid, epoch, T0).error is E.PRODUCER_FENCED
    assert h.end("tx", pid, epoch, True).error is E.PRODUCER_FENCED
    again = h.init("tx", timeout_ms=5000)
    assert (again.error, again.producer_epoch) == (E.NONE, epoch + 2)


def test_idle_transactional_ids_expire_with_a_tombstone() -> None:
    h = TxnHarness(
        TransactionConfig(
            transaction_state_log_num_partitions=4,
            transactional_id_expiration_ms=10_000,
            transaction_remove_expired_transaction_cleanup_interval_ms=1000,
        )
    )
    h.advance(0)
    pid, epoch = begin(h, "old")
    assert h.end("old", pid, epoch, True).error is E.NONE
    begin(h, "busy")
    h.advance(11_000)
    assert h.coordinator.transaction("old") is None
    assert h.coordinator.transaction("busy") is not None  # an ongoing transaction stays
    p = h.coordinator.partition_for("old")
    assert h.log[p][-1].value is None and decode_key(h.log[p][-1].key) == "old"
    h.reload()
    assert h.coordinator.transaction("old") is None
    assert h.coordinator.transaction("busy") is not None


def test_failed_markers_are_written_again(h: TxnHarness) -> None:
    pid, epoch = begin(h)
    h.marker_errors[T1] = E.NOT_LEADER_OR_FOLLOWER
    assert h.end("tx", pid, epoch, True).error is E.NONE
    assert h.state("tx") == "PrepareCommit"
    del h.marker_errors[T1]
    h.advance(100)
    assert h.state("tx") == "CompleteCommit"
    assert h.markers[-1].partitions == (T1,)


def test_a_failed_write_changes_nothing(h: TxnHarness) -> None:
    r = h.init("tx")
    h.fail_writes = E.NOT_LEADER_OR_FOLLOWER
    assert h.add("tx", r.producer_id, r.producer_epoch, T0).error is E.NOT_COORDINATOR
    assert h.state("tx") == "Empty"
    assert h.init("new").error is E.NOT_COORDINATOR
    assert h.coordinator.transaction("new") is None
    h.fail_writes = None
    assert h.add("tx", r.producer_id, r.producer_epoch, T0).error is E.NONE


def test_verify_admits_only_partitions_of_the_ongoing_transaction(h: TxnHarness) -> None:
    pid, epoch = begin(h, "tx", T0)
    c = h.coordinator
    assert c.verify("tx", pid, epoch, *T0) is E.NONE
    assert c.verify("tx", pid, epoch, *T1) is E.INVALID_TXN_STATE
    assert c.verify("tx", pid, epoch - 1, *T0) is E.INVALID_PRODUCER_EPOCH
    assert c.verify("tx", pid + 1, epoch, *T0) is E.INVALID_PRODUCER_ID_MAPPING
    h.hold_markers = True
    assert h.end("tx", pid, epoch, True).error is E.NONE
    assert c.verify("tx", pid, epoch, *T0) is E.INVALID_TXN_STATE  # ending
    h.release_markers()
    # KAFKA-17754: a late batch of the committed transaction cannot join the next one
    assert h.add("tx", pid, epoch, T1).error is E.NONE
    assert c.verify("tx", pid, epoch, *T0) is E.INVALID_TXN_STATE
    assert c.verify_partitions("tx", pid, epoch, [T0, T1]) == {
        T0: E.INVALID_TXN_STATE,
        T1: E.NONE,
    }


def test_replay_restores_every_state() -> None:
    h = TxnHarness()
    pid, epoch = begin(h, "committed")
    h.end("committed", pid, epoch, True)
    pid, epoch = begin(h, "ongoing")
    h.init("empty")
    h.hold_markers = True
    pid_a, epoch_a = begin(h, "aborting")
    h.end("aborting", pid_a, epoch_a, False)
    before = {t: h.coordinator.describe(t) for t in h.coordinator.transactional_ids()}
    h.hold_markers = False
    h.held.clear()
    h.reload()
    after = {t: h.coordinator.describe(t) for t in h.coordinator.transactional_ids()}
    # the Prepare state was completed at load: its markers written again
    assert after.pop("aborting").state == "CompleteAbort"
    assert before.pop("aborting").state == "PrepareAbort"
    assert after == before
    assert [(m.transactional_id, m.commit, m.coordinator_epoch) for m in h.markers[-1:]] == [
        ("aborting", False, 1)
    ]
    # the ongoing one goes on with its epoch
    assert h.end("ongoing", pid, epoch, True).error is E.NONE


def test_requests_while_loading_and_for_other_partitions() -> None:
    h = TxnHarness()
    c = h.coordinator
    p = c.partition_for("tx")
    c.begin_loading(p)
    assert h.init("tx").error is E.COORDINATOR_LOAD_IN_PROGRESS
    c.unload_partition(p)
    assert h.init("tx").error is E.NOT_COORDINATOR
    assert c.describe("tx").error is E.NOT_COORDINATOR


def test_list_and_describe(h: TxnHarness) -> None:
    begin(h, "a")
    r = h.init("b")
    error, listed, unknown = h.coordinator.list_transactions(h.now, states=["Ongoing", "Bogus"])
    assert (error, unknown) == (E.NONE, ["Bogus"])
    assert [(t.transactional_id, t.state) for t in listed] == [("a", "Ongoing")]
    _, listed, _ = h.coordinator.list_transactions(h.now, producer_ids=[r.producer_id])
    assert [t.transactional_id for t in listed] == ["b"]
    _, listed, _ = h.coordinator.list_transactions(h.now, transactional_id_pattern="[ab]")
    assert [t.transactional_id for t in listed] == ["a", "b"]
    error, _, _ = h.coordinator.list_transactions(h.now, transactional_id_pattern="(")
    assert error is E.INVALID_REGULAR_EXPRESSION
    _, listed, _ = h.coordinator.list_transactions(h.now + 10, duration_filter_ms=5)
    assert [t.transactional_id for t in listed] == ["a"]
    assert h.coordinator.describe("zzz").error is E.TRANSACTIONAL_ID_NOT_FOUND
    d = h.coordinator.describe("a")
    assert (d.state, d.timeout_ms, d.start_timestamp) == ("Ongoing", 60_000, h.now)


@pytest.mark.parametrize("target", list(TxnState))
def test_only_kafkas_transitions_are_legal(target: TxnState) -> None:
    for current in TxnState:
        meta = TransactionMetadata("x", 0, producer_id=1, producer_epoch=0, timeout_ms=1,
                                   state=current)  # fmt: skip
        if current in VALID_PREVIOUS_STATES[target]:
            assert meta.transit(target, 0).state is target
        else:
            with pytest.raises(IllegalTransition):
                meta.transit(target, 0)


def test_counts_of_completed_and_timed_out_transactions() -> None:
    """What the broker's metrics report: commits, aborts and timeouts completed here, and
    the ids by state."""
    h = TxnHarness(
        TransactionConfig(
            transaction_state_log_num_partitions=4,
            transaction_abort_timed_out_transaction_cleanup_interval_ms=1000,
        )
    )
    h.advance(0)
    committed = begin(h, "committed")
    assert h.end("committed", *committed, commit=True).error is E.NONE
    aborted = begin(h, "aborted")
    assert h.end("aborted", *aborted, commit=False).error is E.NONE
    begin(h, "open")
    c = h.coordinator
    assert (c.committed_count, c.aborted_count, c.timed_out_count) == (1, 1, 0)
    assert c.state_counts() == {"CompleteCommit": 1, "CompleteAbort": 1, "Ongoing": 1}
    # "open" passes its transaction timeout: aborted by the coordinator, counted once.
    h.advance(62_000)  # past the default 60 s timeout of begin()
    assert h.state("open") == "CompleteAbort"
    assert (c.committed_count, c.aborted_count, c.timed_out_count) == (1, 2, 1)
    assert c.state_counts() == {"CompleteCommit": 1, "CompleteAbort": 2}
