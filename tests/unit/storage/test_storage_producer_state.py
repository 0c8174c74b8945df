"""Producer state: sequence rules, snapshot format, loading, retention and expiry."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidelog.records import BatchBuilder
from tidelog.storage import Log
from tidelog.storage.producer_state import (
    DEFAULT_PRODUCER_ID_EXPIRATION_MS,
    INT32_MAX,
    BatchMetadata,
    CorruptSnapshotError,
    InvalidProducerEpochError,
    OutOfOrderSequenceError,
    ProducerEntry,
    ProducerStateManager,
    decode_snapshot,
    encode_snapshot,
    list_snapshots,
    snapshot_path,
)

from .storage_helpers import FakeClock


def producer_batch(pid: int, epoch: int, seq: int, n: int = 2, ts: int = 1000) -> bytes:
    builder = BatchBuilder(producer_id=pid, producer_epoch=epoch, base_sequence=seq)
    for i in range(n):
        builder.append(b"k", b"v%d" % i, timestamp=ts)
    return builder.close()


def open_log(directory: Path, clock: FakeClock, clean: bool = False) -> Log:
    return Log.open(directory, topic="t", partition=0, clock=clock, clean_shutdown=clean)


def test_check_rules(tmp_path: Path) -> None:
    state = ProducerStateManager(tmp_path)
    assert state.check(1, 0, 17, 18) is None  # unknown producer: any sequence
    state.record(1, 0, 0, 1, 0, 1, 1000, 5)
    assert state.check(1, 0, 2, 3) is None
    assert state.check(1, 0, 0, 1) == BatchMetadata(0, 1, 0, 1, 1000)
    with pytest.raises(OutOfOrderSequenceError):
        state.check(1, 0, 3, 4)
    with pytest.raises(OutOfOrderSequenceError):
        state.check(1, 1, 2, 3)
    assert state.check(1, 1, 0, 0) is None
    state.record(1, 2, 0, 0, 2, 2, 1000, 5)
    with pytest.raises(InvalidProducerEpochError):
        state.check(1, 1, 1, 1)
    assert state.check(1, 2, 0, 0) is not None  # duplicate in the new epoch


def test_wrap(tmp_path: Path) -> None:
    state = ProducerStateManager(tmp_path)
    state.record(1, 0, INT32_MAX - 1, INT32_MAX, 0, 1, 1000, 5)
    assert state.check(1, 0, 0, 0) is None
    with pytest.raises(OutOfOrderSequenceError):
        state.check(1, 0, INT32_MAX, 0)


entries = st.builds(
    lambda pid, epoch, batches, ts: _entry(pid, epoch, batches, ts),
    st.integers(0, 2**63 - 1),
    st.integers(0, 2**15 - 1),
    st.lists(
        st.tuples(
            st.integers(0, INT32_MAX),
            st.integers(0, INT32_MAX),
            st.integers(0, 2**62),
            st.integers(0, 2**62),
            st.integers(-1, 2**62),
        ),
        max_size=5,
    ),
    st.integers(-1, 2**62),
)


def _entry(
    pid: int, epoch: int, batches: list[tuple[int, int, int, int, int]], ts: int
) -> ProducerEntry:
    entry = ProducerEntry(pid, epoch)
    for batch in batches:
        entry.batches.append(BatchMetadata(*batch))
    entry.last_timestamp = ts
    entry.last_update_ms = ts
    return entry


@given(st.integers(0, 2**62), st.lists(entries, max_size=8))
def test_snapshot_roundtrip(offset: int, producers: list[ProducerEntry]) -> None:
    data = encode_snapshot(offset, producers)
    got_offset, got = decode_snapshot(data)
    assert got_offset == offset
    assert [(e.producer_id, e.epoch, list(e.batches), e.last_timestamp) for e in got] == [
        (e.producer_id, e.epoch, list(e.batches), e.last_timestamp) for e in producers
    ]


@given(st.binary(max_size=200), st.integers(0, 300))
def test_snapshot_garbage_never_crashes(data: bytes, cut: int) -> None:
    good = encode_snapshot(5, [_entry(1, 0, [(0, 1, 0, 1, 9)], 9)])
    for candidate in (data, good[:cut], good[:cut] + data):
        if candidate == good:
            continue
        with pytest.raises(CorruptSnapshotError):
            decode_snapshot(candidate)


def test_load_rebuilds_from_headers_and_skips_bad_snapshots(tmp_path: Path) -> None:
    clock = FakeClock()
    directory = tmp_path / "t-0"
    log = open_log(directory, clock)
    log.append(producer_batch(1, 0, 0))
    state = ProducerStateManager.load(log, now_ms=clock.now)
    state.take_snapshot()  # at offset 2
    log.append(producer_batch(1, 0, 2))
    log.append(producer_batch(2, 3, 0, n=1))
    # A corrupt newer snapshot (at the LEO) and one above the LEO are dropped.
    snapshot_path(directory, 5).write_bytes(b"junk")
    snapshot_path(directory, 99).write_bytes(encode_snapshot(99, []))
    loaded = ProducerStateManager.load(log, now_ms=clock.now)
    assert [o for o, _ in list_snapshots(directory)] == [2]
    assert loaded.end_offset == 5
    assert loaded.producers[1].last_seq == 3
    assert loaded.producers[1].last_offset == 3
    assert (loaded.producers[2].epoch, loaded.producers[2].last_seq) == (3, 0)
    assert loaded.check(1, 0, 2, 3) == BatchMetadata(2, 3, 2, 3, 1000)
    log.close()


def test_recovery_keeps_snapshots(tmp_path: Path) -> None:
    clock = FakeClock()
    directory = tmp_path / "t-0"
    log = open_log(directory, clock)
    log.append(producer_batch(1, 0, 0), durable=True)
    ProducerStateManager.load(log, now_ms=clock.now).take_snapshot()
    log.close()
    (directory / "00000000000000000002.snapshot.tmp").write_bytes(b"half written")
    reopened = open_log(directory, clock, clean=False)
    assert [o for o, _ in list_snapshots(directory)] == [2]
    assert not (directory / "00000000000000000002.snapshot.tmp").exists()
    assert ProducerStateManager.load(reopened, now_ms=clock.now).producers[1].last_seq == 1
    reopened.close()


def test_log_start_offset_and_expiry(tmp_path: Path) -> None:
    clock = FakeClock()
    log = open_log(tmp_path / "t-0", clock)
    log.append(producer_batch(1, 0, 0, ts=clock.now))
    log.append(producer_batch(2, 0, 0, ts=clock.now))
    state = ProducerStateManager.load(log, now_ms=clock.now, producer_id_expiration_ms=1000)
    assert state.on_log_start_offset(2) == 1
    assert set(state.producers) == {2}
    assert state.expire(clock.now + 999) == 0
    assert state.expire(clock.now + 1000) == 1
    assert state.producers == {}
    log.close()


def test_snapshots_are_pruned(tmp_path: Path) -> None:
    state = ProducerStateManager(tmp_path)
    for offset in (1, 2, 3, 4):
        state.take_snapshot(offset)
    assert [o for o, _ in list_snapshots(tmp_path)] == [3, 4]


TWO_DAYS_MS = 2 * 86_400_000


def test_producer_rebuilt_from_log_after_crash_counts_as_updated_at_load(tmp_path: Path) -> None:
    # A producer whose batch carries a CreateTime older than producer.id.expiration.ms is
    # kept alive by the broker's append time. After a crash (no shutdown snapshot) its
    # state is rebuilt from the log, which keeps no append time: it must count as updated
    # at the load, or the first expiry check forgets it and a retry of its in-doubt batch
    # is appended a second time.
    clock = FakeClock()
    directory = tmp_path / "t-0"
    log = open_log(directory, clock)
    batch = producer_batch(7, 0, 0, ts=clock.now - TWO_DAYS_MS)
    state = ProducerStateManager.load(log, now_ms=clock.now)
    assert state.check(7, 0, 0, 1) is None
    info = log.append(batch, durable=True)
    state.record(
        7, 0, 0, 1, info.first_offset, info.last_offset, clock.now - TWO_DAYS_MS, clock.now
    )
    assert state.check(7, 0, 0, 1) == BatchMetadata(0, 1, 0, 1, clock.now - TWO_DAYS_MS)
    log.close()  # and no snapshot: the broker was killed

    clock.advance(5_000)
    reopened = open_log(directory, clock, clean=False)
    assert list_snapshots(directory) == []
    loaded = ProducerStateManager.load(reopened, now_ms=clock.now)
    assert loaded.producers[7].last_update_ms == clock.now
    assert loaded.expire(clock.now) == 0
    # The identical retry is a duplicate, answered with the original offsets.
    assert loaded.check(7, 0, 0, 1) == BatchMetadata(0, 1, 0, 1, clock.now - 5_000 - TWO_DAYS_MS)
    assert set(loaded.producers) == {7}
    # It expires a full producer.id.expiration.ms after the load, not before.
    assert loaded.expire(clock.now + DEFAULT_PRODUCER_ID_EXPIRATION_MS - 1) == 0
    assert loaded.expire(clock.now + DEFAULT_PRODUCER_ID_EXPIRATION_MS) == 1
    reopened.close()


def test_replayed_batch_does_not_lower_snapshot_update_time(tmp_path: Path) -> None:
    # The snapshot holds the append time of the producer's first batch; replaying the
    # batches after the snapshot never moves it back, even when the load time is earlier
    # (the wall clock stepped back across the restart).
    clock = FakeClock()
    directory = tmp_path / "t-0"
    log = open_log(directory, clock)
    log.append(producer_batch(1, 0, 0, ts=clock.now - TWO_DAYS_MS))
    state = ProducerStateManager.load(log, now_ms=clock.now)
    state.producers[1].last_update_ms = clock.now + 60_000  # appended before the step
    state.take_snapshot()
    log.append(producer_batch(1, 0, 2, ts=clock.now - TWO_DAYS_MS))
    loaded = ProducerStateManager.load(log, now_ms=clock.now)
    assert loaded.producers[1].last_seq == 3
    assert loaded.producers[1].last_update_ms == clock.now + 60_000
    log.close()


def test_snapshot_entry_without_update_time_counts_as_updated_at_load(tmp_path: Path) -> None:
    clock = FakeClock()
    directory = tmp_path / "t-0"
    log = open_log(directory, clock)
    log.append(producer_batch(1, 0, 0, ts=clock.now - TWO_DAYS_MS))
    entry = _entry(1, 0, [(0, 1, 0, 1, clock.now - TWO_DAYS_MS)], clock.now - TWO_DAYS_MS)
    entry.last_update_ms = -1  # written by a broker that did not know it
    snapshot_path(directory, 2).write_bytes(encode_snapshot(2, [entry]))
    loaded = ProducerStateManager.load(log, now_ms=clock.now)
    assert loaded.producers[1].last_update_ms == clock.now
    assert loaded.expire(clock.now) == 0
    log.close()


def test_an_append_dates_the_producer_at_its_own_broker_time() -> None:
    # The broker's clock stepped forward and back: the latest append's time counts, or
    # one append during the step would keep the producer a year past its expiry.
    entry = ProducerEntry(1, 0)
    entry.add(0, BatchMetadata(0, 0, 0, 0, 10), 365 * 86_400_000)
    entry.add(0, BatchMetadata(1, 1, 1, 1, 11), 5_000)
    assert (entry.last_update_ms, entry.last_timestamp) == (5_000, 11)
    entry.add(1, BatchMetadata(0, 0, 2, 2, 12), 6_000)  # a new epoch
    assert entry.last_update_ms == 6_000
