"""Idempotent produce: sequence rules, duplicates, epochs, and state across restarts."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tidelog.broker.broker import Broker
from tidelog.broker.handlers.produce import handle_produce
from tidelog.broker.partitions import Partitions
from tidelog.broker.reply import Deferred
from tidelog.protocol import ApiKey, ErrorCode
from tidelog.storage import LogConfig, LogManager
from tidelog.storage.producer_state import INT32_MAX, list_snapshots

from .conftest import add_topic, context, make_batch, produce_request, run, stored_batches

PID = 4000


def send(broker: Any, epoch: int, seq: int, n: int = 3, acks: int = 1) -> Any:
    batch = make_batch([b"v%d" % i for i in range(n)], producer=(PID, epoch, seq))

    async def go() -> Any:
        reply = await handle_produce(
            context(broker, ApiKey.PRODUCE, 9), produce_request(9, {"t": {0: batch}}, acks=acks)
        )
        if isinstance(reply, Deferred):
            return await reply.waiter
        return reply

    return run(go()).responses[0].partition_responses[0]


def offsets(broker: Any) -> list[tuple[int, int, int]]:
    return [(h.base_offset, h.base_sequence, h.producer_epoch) for h in stored_batches(broker, "t")]


def test_in_order_batches_are_appended(broker: Any) -> None:
    add_topic(broker, "t")
    assert send(broker, 0, 0).base_offset == 0
    assert send(broker, 0, 3).base_offset == 3
    assert send(broker, 0, 6, n=1).base_offset == 6
    assert offsets(broker) == [(0, 0, 0), (3, 3, 0), (6, 6, 0)]


def test_duplicate_is_answered_with_original_offset_and_stored_once(broker: Any) -> None:
    add_topic(broker, "t")
    send(broker, 0, 0)
    send(broker, 0, 3)
    again = send(broker, 0, 0)
    assert again.error_code == ErrorCode.NONE
    assert again.base_offset == 0
    assert send(broker, 0, 3, acks=-1).base_offset == 3
    assert offsets(broker) == [(0, 0, 0), (3, 3, 0)]


def test_only_last_five_batches_are_remembered(broker: Any) -> None:
    add_topic(broker, "t")
    for i in range(6):
        send(broker, 0, i, n=1)
    assert send(broker, 0, 1, n=1).base_offset == 1  # one of the last five
    old = send(broker, 0, 0, n=1)  # fell out of the window: out of order now
    assert old.error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert len(offsets(broker)) == 6


def test_out_of_order_sequence(broker: Any) -> None:
    add_topic(broker, "t")
    send(broker, 0, 0)
    gap = send(broker, 0, 5)
    assert gap.error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert gap.error_message
    overlap = send(broker, 0, 1)  # overlaps a stored batch without repeating it
    assert overlap.error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert offsets(broker) == [(0, 0, 0)]


def test_epoch_bump_must_start_at_zero(broker: Any) -> None:
    add_topic(broker, "t")
    send(broker, 0, 0)
    assert send(broker, 1, 3).error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    bumped = send(broker, 1, 0)
    assert bumped.error_code == ErrorCode.NONE
    assert bumped.base_offset == 3
    assert offsets(broker) == [(0, 0, 0), (3, 0, 1)]


def test_fenced_epoch(broker: Any) -> None:
    add_topic(broker, "t")
    send(broker, 2, 0)
    old = send(broker, 1, 3)
    assert old.error_code == ErrorCode.INVALID_PRODUCER_EPOCH
    assert old.base_offset == -1
    assert offsets(broker) == [(0, 0, 2)]


def test_unknown_producer_accepted_at_any_sequence(broker: Any) -> None:
    # KIP-360 (Kafka >= 2.5): a producer the partition has no state for (new, expired,
    # or removed by retention) is accepted at any sequence.
    add_topic(broker, "t")
    first = send(broker, 0, 42)
    assert first.error_code == ErrorCode.NONE
    assert send(broker, 0, 45).error_code == ErrorCode.NONE
    assert send(broker, 0, 47).error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER


def test_sequence_wraps_at_int32_max(broker: Any) -> None:
    add_topic(broker, "t")
    send(broker, 0, INT32_MAX - 1, n=2)  # sequences MAX-1, MAX
    after = send(broker, 0, 0, n=2)
    assert after.error_code == ErrorCode.NONE
    assert after.base_offset == 2
    straddling = send(broker, 0, INT32_MAX - 1, n=2)
    assert straddling.base_offset == 0  # still a duplicate after the wrap


def test_producers_expire_after_expiration_ms(broker: Any, clock: Any) -> None:
    add_topic(broker, "t")
    send(broker, 0, 0)
    clock.advance(86_400_000 + 1)
    # State expired: any sequence is accepted again, and the old batch is no duplicate.
    again = send(broker, 0, 0)
    assert again.base_offset == 3


def test_truncation_rebuilds_producer_state(broker: Any) -> None:
    add_topic(broker, "t")
    send(broker, 0, 0)
    send(broker, 0, 3)
    partition = broker.partitions.get("t", 0)
    partition.truncate_to(3)
    # The batch at sequence 3 is gone: re-sending it appends it again at offset 3.
    assert send(broker, 0, 3).base_offset == 3
    assert send(broker, 0, 3).base_offset == 3
    assert offsets(broker) == [(0, 0, 0), (3, 3, 0)]


def test_truncation_behind_the_partitions_back_is_noticed(broker: Any) -> None:
    add_topic(broker, "t")
    send(broker, 0, 0)
    send(broker, 0, 3)
    broker.partitions.get("t", 0).log.truncate_to(3)
    assert send(broker, 0, 3).base_offset == 3
    assert len(offsets(broker)) == 2


def _restart(
    broker: Broker, tmp_path: Path, clock: Any, *, clean: bool, keep_snapshots: bool = False
) -> Broker:
    """A clean restart, or a crash: no shutdown snapshot, and (unless ``keep_snapshots``)
    none of the earlier ones either, so the state is rebuilt from the log."""
    if clean:
        broker.partitions.close()
    broker.partitions.logs.close()
    if not clean:
        if not keep_snapshots:
            for path in (tmp_path / "data" / "t-0").glob("*.snapshot"):
                path.unlink()
        (tmp_path / "data" / ".clean-shutdown").unlink(missing_ok=True)
    logs = LogManager([tmp_path / "data"], clock=clock)
    logs.open()
    new = Broker(node_id=1, partitions=Partitions(logs), clock=clock)
    new.partitions.ensure("t", 0, config=LogConfig(), topic_id=None, leader_epoch=0)
    return new


@pytest.mark.parametrize("clean", [True, False], ids=["clean", "unclean"])
def test_duplicate_detected_after_restart(
    broker: Broker, tmp_path: Path, clock: Any, clean: bool
) -> None:
    add_topic(broker, "t")
    send(broker, 0, 0)
    send(broker, 0, 3)
    if clean:
        broker.partitions.close()
        assert [o for o, _ in list_snapshots(tmp_path / "data" / "t-0")] == [6]
    restarted = _restart(broker, tmp_path, clock, clean=clean)
    try:
        assert send(restarted, 0, 3).base_offset == 3
        assert send(restarted, 0, 0).base_offset == 0
        assert send(restarted, 0, 7).error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
        assert send(restarted, 0, 6).base_offset == 6
        assert len(offsets(restarted)) == 3
    finally:
        restarted.partitions.logs.close()


def test_snapshot_plus_header_scan_after_unclean_restart(
    broker: Broker, tmp_path: Path, clock: Any
) -> None:
    add_topic(broker, "t")
    send(broker, 0, 0)
    broker.partitions.get("t", 0).producers.take_snapshot()  # covers offsets 0-2 only
    send(broker, 0, 3)
    broker.partitions.logs.close()
    (tmp_path / "data" / ".clean-shutdown").unlink(missing_ok=True)
    logs = LogManager([tmp_path / "data"], clock=clock)
    logs.open()
    restarted = Broker(node_id=1, partitions=Partitions(logs), clock=clock)
    restarted.partitions.ensure("t", 0, config=LogConfig(), topic_id=None, leader_epoch=0)
    try:
        assert (tmp_path / "data" / "t-0" / f"{3:020d}.snapshot").exists()  # kept by recovery
        assert send(restarted, 0, 3).base_offset == 3
        assert send(restarted, 0, 0).base_offset == 0
    finally:
        logs.close()


def test_snapshot_on_segment_roll(broker: Broker, tmp_path: Path) -> None:
    add_topic(broker, "t", config=LogConfig(segment_bytes=150))
    send(broker, 0, 0)
    send(broker, 0, 3)  # rolls: the new segment starts at 3
    directory = tmp_path / "data" / "t-0"
    assert 3 in [o for o, _ in list_snapshots(directory)]
    assert os.path.exists(directory / f"{3:020d}.log")


def test_old_create_time_producer_survives_unclean_restart(
    broker: Broker, tmp_path: Path, clock: Any
) -> None:
    # Records whose CreateTime is older than producer.id.expiration.ms: the broker's
    # append time keeps the producer alive while it runs, and after a crash (state rebuilt
    # from the log, no snapshot) the load time must do the same, or the first expiry
    # check forgets the producer and the retry of its in-doubt batch is stored twice.
    add_topic(broker, "t")
    old = clock() - 2 * 86_400_000
    batch = make_batch([b"a", b"b"], producer=(PID, 0, 0), timestamp=old)

    def produce(target: Broker) -> Any:
        request = produce_request(9, {"t": {0: batch}}, acks=1)
        reply = run(handle_produce(context(target, ApiKey.PRODUCE, 9), request))
        return reply.responses[0].partition_responses[0]

    assert produce(broker).base_offset == 0
    assert produce(broker).base_offset == 0
    clock.advance(3_000)
    restarted = _restart(broker, tmp_path, clock, clean=False)
    try:
        partition = restarted.partitions.get("t", 0)
        assert partition is not None
        retry = produce(restarted)
        assert (retry.error_code, retry.base_offset) == (ErrorCode.NONE, 0)
        assert offsets(restarted) == [(0, 0, 0)]
        assert [p.producer_id for p in partition.active_producers(clock())] == [PID]
    finally:
        restarted.partitions.logs.close()


def test_a_producer_read_back_after_a_crash_expires_on_time_however_often_it_crashes(
    broker: Broker, tmp_path: Path, clock: Any
) -> None:
    # A producer rebuilt from the log is dated at the load; that date must survive later
    # crashes (a snapshot keeps it), or a broker crashing more often than
    # producer.id.expiration.ms would date it again each time and never let it expire.
    add_topic(broker, "t")
    batch = make_batch([b"a"], producer=(PID, 0, 0), timestamp=clock() - 2 * 86_400_000)
    request = produce_request(9, {"t": {0: batch}}, acks=1)
    run(handle_produce(context(broker, ApiKey.PRODUCE, 9), request))
    restarted = _restart(broker, tmp_path, clock, clean=False)
    loaded_at = clock()
    alive = []
    for _ in range(6):
        clock.advance(10 * 3_600_000)
        restarted = _restart(restarted, tmp_path, clock, clean=False, keep_snapshots=True)
        partition = restarted.partitions.get("t", 0)
        assert partition is not None
        alive.append(
            (clock() - loaded_at, [p.producer_id for p in partition.active_producers(clock())])
        )
    restarted.partitions.logs.close()
    hour = 3_600_000
    assert alive == [(h * hour, [PID] if h < 24 else []) for h in range(10, 70, 10)]
