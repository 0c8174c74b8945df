"""The replica state machine's rules, one at a time, over the in-memory replica log."""

from __future__ import annotations

import pytest

from tidelog.protocol.error_codes import ErrorCode
from tidelog.records import BatchBuilder
from tidelog.replication.replica import (
    AlterPartitionIntent,
    FetchAnswer,
    FetchRequest,
    Replica,
    ReplicaConfig,
    Role,
    StaleTransitionError,
)
from tidelog.testing.sim_disk import SimReplicaLog


def batch(value: bytes = b"v") -> bytes:
    builder = BatchBuilder()
    builder.append(None, value, timestamp=0)
    return builder.close()


def log_with(epochs: list[tuple[int, int]], durable: bool = True) -> SimReplicaLog:
    """A log with ``count`` one-record batches written in each ``(epoch, count)``."""
    log = SimReplicaLog()
    for epoch, count in epochs:
        for _ in range(count):
            log.append(batch(), leader_epoch=epoch, durable=durable)
    return log


def leader(
    log: SimReplicaLog,
    *,
    isr: tuple[int, ...] = (1, 2, 3),
    min_isr: int = 2,
    fsync: bool = True,
    epoch: int = 5,
    lag_ms: int = 1000,
) -> Replica:
    replica = Replica(
        log,
        ReplicaConfig(
            broker_id=1,
            min_insync_replicas=min_isr,
            ack_after_fsync=fsync,
            replica_lag_time_max_ms=lag_ms,
        ),
    )
    replica.become_leader(epoch, 10, (1, 2, 3), isr, now_ms=0)
    return replica


def fetch(
    replica: Replica, follower: int, offset: int, last_epoch: int, now: int = 0
) -> FetchAnswer:
    return replica.on_follower_fetch(
        FetchRequest(follower, 1, replica.leader_epoch, offset, last_epoch), now
    )


# ---------------------------------------------------------------- transitions


def test_an_older_leader_or_partition_epoch_is_refused() -> None:
    replica = leader(log_with([]), epoch=5)
    with pytest.raises(StaleTransitionError):
        replica.become_leader(4, 11, (1, 2, 3), (1, 2, 3), now_ms=0)
    with pytest.raises(StaleTransitionError):
        replica.become_follower(2, 5, 9)
    assert not replica.apply_partition_state(2, 5, 10, (1, 2, 3), (1, 2, 3), now_ms=0)
    assert not replica.apply_partition_state(2, 4, 20, (1, 2, 3), (1, 2, 3), now_ms=0)
    assert replica.role is Role.LEADER and replica.leader_epoch == 5
    assert replica.apply_partition_state(2, 6, 11, (1, 2, 3), (1, 2, 3), now_ms=0)
    assert replica.role is Role.FOLLOWER and replica.leader_id == 2


def test_a_new_leader_records_its_epoch_so_a_follower_of_a_later_epoch_gets_an_answer() -> None:
    # The leader holds epochs 1 and 2; a follower led epoch 4 (which this log never saw).
    replica = leader(log_with([(1, 2), (2, 2)]), epoch=5)
    answer = fetch(replica, 2, 6, 4)
    assert answer.diverging == (2, 4)


# ---------------------------------------------------------------- leader: fetch validation


def test_diverging_epoch_follows_kafkas_rule() -> None:
    replica = leader(log_with([(1, 3), (3, 2)]))
    # Epoch 2 is not in the leader's log: its largest epoch below ends where 3 starts.
    assert fetch(replica, 2, 5, 2).diverging == (1, 3)
    # The follower holds more of epoch 3 than the leader.
    assert fetch(replica, 2, 6, 3).diverging == (3, 5)
    # Consistent: records from the fetch offset, no divergence.
    answer = fetch(replica, 2, 3, 1)
    assert answer.diverging is None and answer.error is ErrorCode.NONE
    assert answer.records.count(b"v") >= 1
    # No last fetched epoch (an empty follower): nothing to validate.
    assert fetch(replica, 3, 0, -1).diverging is None


def test_a_diverging_fetch_does_not_count_as_the_followers_position() -> None:
    replica = leader(log_with([(1, 3), (3, 2)]))
    fetch(replica, 3, 5, 3)
    fetch(replica, 2, 5, 2)  # diverges: its offset 5 says nothing about what it holds
    assert replica.high_watermark == 0
    fetch(replica, 2, 3, 1)
    assert replica.high_watermark == 3


def test_fetches_in_another_leader_epoch_are_fenced() -> None:
    replica = leader(log_with([(1, 1)]), epoch=5)
    older = FetchRequest(2, 1, 4, 0, -1)
    newer = FetchRequest(2, 1, 6, 0, -1)
    assert replica.on_follower_fetch(older, 0).error is ErrorCode.FENCED_LEADER_EPOCH
    assert replica.on_follower_fetch(newer, 0).error is ErrorCode.UNKNOWN_LEADER_EPOCH
    replica.become_follower(2, 6, 11)
    current = FetchRequest(3, 1, 6, 0, -1)
    assert replica.on_follower_fetch(current, 0).error is ErrorCode.NOT_LEADER_OR_FOLLOWER


# ---------------------------------------------------------------- leader: high watermark


def test_high_watermark_is_the_smallest_position_over_the_isr() -> None:
    replica = leader(log_with([(5, 6)]))
    fetch(replica, 2, 4, 5)
    assert replica.high_watermark == 0  # replica 3 has not fetched in this epoch
    fetch(replica, 3, 2, 5)
    assert replica.high_watermark == 2
    fetch(replica, 3, 6, 5)
    assert replica.high_watermark == 4
    assert replica.log.high_watermark == 4


def test_high_watermark_waits_for_min_insync_replicas_kip_966() -> None:
    log = log_with([(5, 4)])
    replica = leader(log, isr=(1,), min_isr=2)
    fetch(replica, 2, 4, 5)  # a replica outside the ISR does not count
    assert replica.high_watermark == 0
    # The controller adds replica 2: now two in-sync replicas hold offsets 0-3.
    replica.become_leader(5, 11, (1, 2, 3), (1, 2), now_ms=0)
    assert replica.high_watermark == 4


def test_high_watermark_counts_only_fsynced_data_on_the_leader() -> None:
    log = log_with([(5, 2)])
    replica = leader(log, isr=(1, 2))
    replica.append(batch(), acks=1, now_ms=0, timeout_ms=1000)
    assert log.log_end_offset == 3 and log.recovery_point == 2
    fetch(replica, 2, 3, 5)
    assert replica.high_watermark == 2
    log.flush()
    replica.on_log_flushed()
    assert replica.high_watermark == 3


def test_kafkas_behaviour_counts_the_log_end_offset() -> None:
    log = log_with([(5, 2)])
    replica = leader(log, isr=(1, 2), fsync=False)
    replica.append(batch(), acks=-1, now_ms=0, timeout_ms=1000)
    assert log.recovery_point == 2  # acks=all does not fsync in this mode
    fetch(replica, 2, 3, 5)
    assert replica.high_watermark == 3


def test_high_watermark_never_goes_back_when_a_follower_is_behind_it() -> None:
    replica = leader(log_with([(5, 4)]), isr=(1, 2))
    fetch(replica, 2, 4, 5)
    assert replica.high_watermark == 4
    # Replica 3 joins the ISR well behind: the minimum drops, the high watermark does not.
    replica.become_leader(5, 11, (1, 2, 3), (1, 2, 3), now_ms=0)
    fetch(replica, 3, 1, 5)
    assert replica.high_watermark == 4


# ---------------------------------------------------------------- leader: ISR changes


def test_a_lagging_follower_is_proposed_out_of_the_isr_once() -> None:
    replica = leader(log_with([(5, 4)]), lag_ms=1000)
    fetch(replica, 2, 4, 5, now=900)
    fetch(replica, 3, 1, 5, now=900)
    assert replica.poll(1000).alter_partition is None
    effects = replica.poll(1001)
    assert effects.alter_partition == AlterPartitionIntent(1, 5, 10, (1, 2))
    # One change in flight at a time.
    assert replica.poll(5000).alter_partition is None
    # Until the controller answers, the shrink has not happened: replica 3 still counts.
    assert replica.high_watermark == 1
    replica.apply_partition_state(1, 5, 11, (1, 2, 3), (1, 2), now_ms=1002)
    assert replica.isr == (1, 2) and replica.alter_partition_in_flight is None
    assert replica.high_watermark == 4


def test_a_follower_that_reaches_the_high_watermark_is_proposed_into_the_isr() -> None:
    replica = leader(log_with([(5, 4)]), isr=(1, 2))
    fetch(replica, 2, 4, 5, now=10)
    fetch(replica, 3, 2, 5, now=10)
    assert replica.poll(10).alter_partition is None  # below the high watermark (4)
    fetch(replica, 3, 4, 5, now=20)
    effects = replica.poll(20)
    assert effects.alter_partition == AlterPartitionIntent(1, 5, 10, (1, 2, 3))
    # A refusal of an earlier change is not about this one.
    stale = AlterPartitionIntent(1, 5, 9, (1, 2, 3))
    replica.on_alter_partition_error(stale, ErrorCode.INELIGIBLE_REPLICA)
    assert replica.alter_partition_in_flight == effects.alter_partition
    # A change the controller says it did not apply is dropped; the next poll proposes again.
    replica.on_alter_partition_error(effects.alter_partition, ErrorCode.INELIGIBLE_REPLICA)
    assert replica.poll(30).alter_partition == AlterPartitionIntent(1, 5, 10, (1, 2, 3))


def test_a_follower_must_reach_the_start_of_the_current_epoch_to_join() -> None:
    # Epoch 5 starts at offset 4; the high watermark is still 0 (nobody fetched yet).
    replica = leader(log_with([(3, 4)]), isr=(1, 2))
    fetch(replica, 3, 2, 3, now=10)
    assert replica.poll(10).alter_partition is None
    fetch(replica, 3, 4, 3, now=20)
    assert replica.poll(20).alter_partition == AlterPartitionIntent(1, 5, 10, (1, 2, 3))


# ---------------------------------------------------------------- leader: acks=all


def test_acks_all_is_refused_before_appending_when_the_isr_is_too_small() -> None:
    log = log_with([(5, 1)])
    replica = leader(log, isr=(1,), min_isr=2)
    outcome = replica.append(batch(), acks=-1, now_ms=0, timeout_ms=1000)
    assert outcome.error is ErrorCode.NOT_ENOUGH_REPLICAS and log.log_end_offset == 1
    # acks=1 is still accepted.
    assert replica.append(batch(), acks=1, now_ms=0, timeout_ms=1000).error is ErrorCode.NONE


def test_acks_all_completes_when_the_high_watermark_passes_it() -> None:
    replica = leader(log_with([]), isr=(1, 2))
    first = replica.append(batch(b"a"), acks=-1, now_ms=0, timeout_ms=1000)
    second = replica.append(batch(b"b"), acks=-1, now_ms=0, timeout_ms=1000)
    assert (first.end_offset, second.end_offset) == (1, 2)
    fetch(replica, 2, 1, 5)
    assert [(c.token, c.error) for c in replica.poll(1).completions] == [
        (first.token, ErrorCode.NONE)
    ]
    fetch(replica, 2, 2, 5)
    assert [(c.token, c.error) for c in replica.poll(2).completions] == [
        (second.token, ErrorCode.NONE)
    ]


def test_acks_all_fails_after_append_when_the_isr_shrinks_below_the_minimum() -> None:
    replica = leader(log_with([]), isr=(1, 2))
    waiting = replica.append(batch(), acks=-1, now_ms=0, timeout_ms=1000)
    replica.apply_partition_state(1, 5, 11, (1, 2, 3), (1,), now_ms=1)
    assert [(c.token, c.error) for c in replica.poll(1).completions] == [
        (waiting.token, ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND)
    ]


def test_acks_all_times_out_and_fails_when_leadership_moves() -> None:
    replica = leader(log_with([]), isr=(1, 2))
    early = replica.append(batch(), acks=-1, now_ms=0, timeout_ms=100)
    late = replica.append(batch(), acks=-1, now_ms=50, timeout_ms=1000)
    assert [c.error for c in replica.poll(100).completions] == [ErrorCode.REQUEST_TIMED_OUT]
    replica.apply_partition_state(2, 6, 11, (1, 2, 3), (1, 2), now_ms=200)
    assert [(c.token, c.error) for c in replica.poll(200).completions] == [
        (late.token, ErrorCode.NOT_LEADER_OR_FOLLOWER)
    ]
    assert early.token != late.token
    assert replica.append(batch(), -1, 300, 100).error is ErrorCode.NOT_LEADER_OR_FOLLOWER


# ---------------------------------------------------------------- follower


def follower(log: SimReplicaLog, fsync: bool = True) -> Replica:
    replica = Replica(log, ReplicaConfig(broker_id=2, ack_after_fsync=fsync))
    replica.become_follower(1, 5, 10, (1, 2, 3), (1, 2, 3))
    return replica


def test_the_next_fetch_asks_from_the_log_end_with_the_latest_epoch() -> None:
    replica = follower(log_with([(1, 2), (3, 1)]))
    assert replica.next_fetch() == FetchRequest(2, 1, 5, 3, 3)


def test_a_follower_truncates_to_the_smaller_end_of_the_common_epoch() -> None:
    # Own: epoch 1 at 0-2, epoch 3 at 3-5. The leader says epoch 1 ends at 4 there.
    log = log_with([(1, 3), (3, 3)])
    replica = follower(log)
    request = replica.next_fetch()
    assert request is not None
    answer = FetchAnswer(ErrorCode.NONE, 5, 0, 8, diverging=(1, 4), fetch_offset=6)
    assert replica.on_fetch_answer(request, answer)
    # KIP-279: its own epoch 1 ends at 3, not 4 (offset 3 is epoch 3 here).
    assert log.log_end_offset == 3 and log.latest_epoch == 1


def test_a_follower_without_the_leaders_epoch_keeps_only_its_earlier_epochs() -> None:
    # Own epochs 1 and 4; the leader answers with epoch 2, which this log never had.
    log = log_with([(1, 2), (4, 2)])
    replica = follower(log)
    request = replica.next_fetch()
    assert request is not None
    replica.on_fetch_answer(
        request, FetchAnswer(ErrorCode.NONE, 5, 0, 9, diverging=(2, 7), fetch_offset=4)
    )
    assert log.log_end_offset == 2
    # The next fetch asks again with the epoch it now ends in.
    assert replica.next_fetch() == FetchRequest(2, 1, 5, 2, 1)


def test_a_follower_appends_fsynced_and_takes_the_leaders_high_watermark_up_to_its_end() -> None:
    source = log_with([(5, 3)])
    log = SimReplicaLog()
    replica = follower(log)
    request = replica.next_fetch()
    assert request is not None
    records = source.read_bytes(0, 1 << 20)
    answer = FetchAnswer(ErrorCode.NONE, 5, 10, 3, records=records, fetch_offset=0)
    assert replica.on_fetch_answer(request, answer)
    assert log.log_end_offset == 3 and log.recovery_point == 3 and log.latest_epoch == 5
    assert replica.high_watermark == 3 == log.high_watermark
    # An answer to an older request (the log has moved on) is ignored.
    assert not replica.on_fetch_answer(request, answer)
    assert log.log_end_offset == 3


def test_in_kafkas_mode_a_follower_does_not_fsync() -> None:
    source = log_with([(5, 3)])
    log = SimReplicaLog()
    replica = follower(log, fsync=False)
    request = replica.next_fetch()
    assert request is not None
    answer = FetchAnswer(
        ErrorCode.NONE, 5, 1, 3, records=source.read_bytes(0, 1 << 20), fetch_offset=0
    )
    replica.on_fetch_answer(request, answer)
    assert log.log_end_offset == 3 and log.recovery_point == 0
    assert replica.high_watermark == 1


def test_an_answer_from_another_epoch_is_ignored() -> None:
    log = log_with([(1, 2)])
    replica = follower(log)
    request = replica.next_fetch()
    assert request is not None
    replica.become_follower(3, 6, 11)
    answer = FetchAnswer(ErrorCode.NONE, 5, 0, 9, diverging=(0, 0), fetch_offset=2)
    assert not replica.on_fetch_answer(request, answer)
    assert log.log_end_offset == 2


def test_a_proposed_expansion_does_not_count_towards_min_insync_replicas() -> None:
    # A leader alone in its committed ISR proposes adding replica 3; until the controller
    # accepts, it may be a zombie that was replaced, so nothing commits.
    replica = leader(log_with([(5, 2)]), isr=(1,), min_isr=2)
    fetch(replica, 3, 2, 5, now=10)
    assert replica.poll(10).alter_partition == AlterPartitionIntent(1, 5, 10, (1, 3))
    fetch(replica, 3, 2, 5, now=20)
    assert replica.high_watermark == 0
    replica.apply_partition_state(1, 5, 11, (1, 2, 3), (1, 3), now_ms=30)
    assert replica.high_watermark == 2


def test_a_former_leader_that_wrote_nothing_in_its_epoch_converges() -> None:
    # Broker 2 led epoch 4 without appending; the epoch it recorded at its end holds nothing.
    source = log_with([(1, 3)])
    primary = leader(source, epoch=5)
    log = log_with([(1, 3)])
    log.epoch_cache.assign(4, 3)
    replica = follower(log)
    request = replica.next_fetch()
    assert request == FetchRequest(2, 1, 5, 3, 4)
    answer = primary.on_follower_fetch(request, 0)
    assert answer.diverging == (1, 3)
    replica.on_fetch_answer(request, answer)
    # Nothing to cut, but the empty epoch goes, so the next fetch is consistent.
    assert log.log_end_offset == 3
    again = replica.next_fetch()
    assert again == FetchRequest(2, 1, 5, 3, 1)
    assert primary.on_follower_fetch(again, 0).diverging is None


def test_a_former_leader_fsyncs_what_it_holds_before_it_fetches_as_a_follower() -> None:
    log = log_with([(5, 2)])
    replica = leader(log, isr=(1, 2))
    replica.append(batch(), acks=1, now_ms=0, timeout_ms=1000)  # not fsynced
    assert log.recovery_point == 2
    replica.become_follower(2, 6, 11)
    # Its next fetch offset (3) is what the new leader will count as fsynced.
    assert log.recovery_point == 3
    assert replica.next_fetch() == FetchRequest(1, 2, 6, 3, 5)


def test_a_replica_new_to_the_partition_gets_the_lag_time_to_catch_up() -> None:
    replica = leader(log_with([(5, 2)]), isr=(1, 2), lag_ms=1000)
    fetch(replica, 2, 2, 5, now=5000)
    # Replica 4 is added (a reassignment) straight into the ISR at 5000.
    replica.become_leader(5, 11, (1, 2, 3, 4), (1, 2, 4), now_ms=5000)
    assert replica.poll(5500).alter_partition is None
    fetch(replica, 2, 2, 5, now=6000)
    assert replica.poll(6001).alter_partition == AlterPartitionIntent(1, 5, 11, (1, 2))


def acknowledged_write_after_power_loss(fsync: bool) -> tuple[bool, bool]:
    """A two-replica partition takes one acks=all write, then both brokers lose power.
    Returns (acknowledged, still on a disk)."""
    primary_log, secondary_log = SimReplicaLog(), SimReplicaLog()
    primary = Replica(primary_log, ReplicaConfig(1, min_insync_replicas=2, ack_after_fsync=fsync))
    primary.become_leader(1, 1, (1, 2), (1, 2), now_ms=0)
    secondary = Replica(secondary_log, ReplicaConfig(2, ack_after_fsync=fsync))
    secondary.become_follower(1, 1, 1, (1, 2), (1, 2))
    write = primary.append(batch(b"kept?"), acks=-1, now_ms=0, timeout_ms=1000)
    for _ in range(2):  # the copy, then the fetch that reports it
        request = secondary.next_fetch()
        assert request is not None
        secondary.on_fetch_answer(request, primary.on_follower_fetch(request, 1))
    acknowledged = [c.token for c in primary.poll(1).completions if c.error is ErrorCode.NONE]
    primary_log.crash()
    secondary_log.crash()
    kept = primary_log.log_end_offset > 0 or secondary_log.log_end_offset > 0
    return acknowledged == [write.token], kept


def test_by_default_an_acknowledged_write_survives_power_loss_of_every_replica() -> None:
    assert acknowledged_write_after_power_loss(fsync=True) == (True, True)


def test_kafkas_acknowledgement_loses_it() -> None:
    assert acknowledged_write_after_power_loss(fsync=False) == (True, False)


def test_a_leader_alone_with_min_insync_replicas_one_commits_on_append() -> None:
    replica = leader(log_with([]), isr=(1,), min_isr=1, fsync=False)
    replica.append(batch(), acks=1, now_ms=0, timeout_ms=1000)
    assert replica.high_watermark == 1


def test_a_stale_epoch_answer_keeps_the_change_pending_until_the_next_state() -> None:
    # The leader proposed adding replica 3; the controller applied it, the answer got lost,
    # and the retry is refused as stale. The controller may elect replica 3 now, so the high
    # watermark must keep waiting for it until the new partition state arrives.
    replica = leader(log_with([(5, 4)]), isr=(1, 2))
    fetch(replica, 2, 4, 5, now=10)
    fetch(replica, 3, 4, 5, now=10)
    assert replica.high_watermark == 4
    intent = replica.poll(10).alter_partition
    assert intent == AlterPartitionIntent(1, 5, 10, (1, 2, 3))
    replica.append(batch(), acks=-1, now_ms=20, timeout_ms=1000)
    replica.on_alter_partition_error(intent, ErrorCode.INVALID_UPDATE_VERSION)
    assert replica.alter_partition_in_flight == intent
    fetch(replica, 2, 5, 5, now=30)
    assert replica.high_watermark == 4  # replica 3 has not got offset 4 yet
    replica.apply_partition_state(1, 5, 11, (1, 2, 3), (1, 2, 3), now_ms=40)
    assert replica.alter_partition_in_flight is None
    fetch(replica, 3, 5, 5, now=50)
    assert replica.high_watermark == 5
