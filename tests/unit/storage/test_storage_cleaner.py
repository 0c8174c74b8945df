"""Log compaction: what the cleaner keeps, drops, rewrites and records."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from storage_helpers import FakeClock, LogFactory

from tidelog.records import BatchBuilder, Compression, iter_batches, iter_records
from tidelog.records.batch import BatchHeader
from tidelog.records.control import build_end_txn_marker_batch
from tidelog.storage import (
    CLEANER_OFFSET_CHECKPOINT,
    Cleaner,
    CorruptSegmentError,
    InvalidRecordError,
    Log,
    LogConfig,
    LogManager,
)
from tidelog.storage import log as log_module

Rec = tuple[bytes | None, bytes | None]
COMPACT: dict[str, str | int] = {
    "cleanup.policy": "compact",
    "min.cleanable.dirty.ratio": "0.0",
    "segment.bytes": 1 << 20,
}


def batch(
    records: Sequence[Rec],
    *,
    timestamp: int = 1000,
    compression: Compression = Compression.NONE,
    headers: Sequence[tuple[str, bytes | None]] = (),
    producer: tuple[int, int, int] | None = None,
    transactional: bool = False,
    log_append_time: int | None = None,
) -> bytes:
    builder = BatchBuilder(
        compression=compression, transactional=transactional, log_append_time=log_append_time
    )
    if producer is not None:
        builder.set_producer(*producer)
    for index, (key, value) in enumerate(records):
        builder.append(key, value, headers, timestamp=timestamp + index)
    return builder.close()


def batches_of(log: Log) -> list[tuple[BatchHeader, bytes]]:
    """Every batch of the log from its first segment: (header, raw bytes)."""
    out: list[tuple[BatchHeader, bytes]] = []
    for segment in log.segments:
        with log.handle_cache.use(segment):
            data = segment.read_batch(0, segment.size)
        for position, header in iter_batches(data):
            out.append((header, data[position : position + header.size]))
    return out


def records_of(log: Log) -> list[tuple[int, bytes | None, bytes | None]]:
    """(offset, key, value) of every record from the log start, through Log.read."""
    out: list[tuple[int, bytes | None, bytes | None]] = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        data = log.read_bytes(offset, 1 << 20, whole_batches=True)
        assert data
        for position, header in iter_batches(data):
            for record in iter_records(data, position, header=header):
                if record.offset >= offset:
                    out.append((record.offset, record.key, record.value))
            offset = header.next_offset
    return out


def latest(records: Sequence[tuple[int, bytes | None, bytes | None]]) -> dict[bytes, bytes | None]:
    out: dict[bytes, bytes | None] = {}
    for _, key, value in records:
        assert key is not None
        out[key] = value
    return out


@pytest.fixture
def compact_log(open_log: LogFactory) -> Log:
    return open_log(COMPACT)


def fill(log: Log, rows: Sequence[Sequence[Rec]], **kwargs: object) -> None:
    for records in rows:
        log.append(batch(records, **kwargs))  # type: ignore[arg-type]


def test_newest_per_key_kept_and_offsets_preserved(compact_log: Log, clock: FakeClock) -> None:
    log = compact_log
    fill(log, [[(b"a", b"1"), (b"b", b"1")], [(b"a", b"2")], [(b"c", b"1"), (b"b", b"2")]])
    log.roll()
    log.append(batch([(b"a", b"3")]))  # active segment: not cleaned
    before = records_of(log)
    result = Cleaner().clean_log(log, clock())
    assert result.cleaned
    assert result.records_removed == 2
    assert result.end_offset == 5
    after = records_of(log)
    assert after == [(2, b"a", b"2"), (3, b"c", b"1"), (4, b"b", b"2"), (5, b"a", b"3")]
    assert latest(after) == latest(before)
    assert log.log_end_offset == 6
    # A read inside the gap answers with the next batch that holds data.
    data = log.read_bytes(1, 1 << 20)
    first = next(iter_batches(data))[1]
    assert first.base_offset == 2
    # The first batch lost every record but is not the last of the segment: gone.
    assert [h.base_offset for h, _ in batches_of(log)] == [2, 3, 5]


def test_a_fully_kept_batch_is_copied_byte_for_byte(compact_log: Log, clock: FakeClock) -> None:
    log = compact_log
    fill(log, [[(b"a", b"1")], [(b"x", b"1"), (b"y", b"1")], [(b"a", b"2"), (b"z", b"1")]])
    log.roll()
    raw_before = {h.base_offset: raw for h, raw in batches_of(log)}
    Cleaner().clean_log(log, clock())
    raw_after = {h.base_offset: raw for h, raw in batches_of(log)}
    assert raw_after[1] == raw_before[1]
    assert raw_after[3] == raw_before[3]
    assert 0 not in raw_after


def test_partially_kept_batch_keeps_its_offset_range(compact_log: Log, clock: FakeClock) -> None:
    log = compact_log
    fill(log, [[(b"a", b"1"), (b"b", b"1"), (b"c", b"1")], [(b"b", b"2"), (b"c", b"2")]])
    fill(log, [[(b"d", b"1")]])
    log.roll()
    Cleaner().clean_log(log, clock())
    headers = [h for h, _ in batches_of(log)]
    assert [(h.base_offset, h.last_offset_delta, h.record_count) for h in headers] == [
        (0, 2, 1),
        (3, 1, 2),
        (5, 0, 1),
    ]
    assert records_of(log)[0] == (0, b"a", b"1")


def test_tombstones_kept_for_delete_retention_then_removed(
    open_log: LogFactory, clock: FakeClock
) -> None:
    log = open_log({**COMPACT, "delete.retention.ms": 1000})
    fill(log, [[(b"a", b"1"), (b"b", b"1")], [(b"a", None)], [(b"c", b"1")]])
    log.roll()
    cleaner = Cleaner()
    now = clock()
    first = cleaner.clean_log(log, now)
    assert first.next_delete_horizon == now + 1000
    assert records_of(log) == [(1, b"b", b"1"), (2, b"a", None), (3, b"c", b"1")]
    tombstone = next(h for h, _ in batches_of(log) if h.base_offset == 2)
    assert tombstone.has_delete_horizon and tombstone.base_timestamp == now + 1000
    # The horizon replaced base_timestamp, yet the record keeps its own timestamp.
    data = log.read_bytes(2, 1 << 20)
    assert next(iter_records(data)).timestamp == 1000
    assert not cleaner.needs_cleaning(log, now + 999)[0]
    cleaner.clean_log(log, now + 999, force=True)
    assert (2, b"a", None) in records_of(log)
    assert cleaner.needs_cleaning(log, now + 1000)[0]  # the horizon alone makes it due
    cleaner.clean_log(log, now + 1000)
    assert records_of(log) == [(1, b"b", b"1"), (3, b"c", b"1")]


def test_a_tombstone_superseded_by_a_value_is_dropped_at_once(
    compact_log: Log, clock: FakeClock
) -> None:
    log = compact_log
    fill(log, [[(b"a", b"1")], [(b"a", None)], [(b"a", b"2")], [(b"b", b"1")]])
    log.roll()
    Cleaner().clean_log(log, clock())
    assert records_of(log) == [(2, b"a", b"2"), (3, b"b", b"1")]


def test_active_segment_is_never_touched(compact_log: Log, clock: FakeClock) -> None:
    log = compact_log
    fill(log, [[(b"a", b"1")], [(b"a", b"2")]])
    log.roll()
    fill(log, [[(b"a", b"3")], [(b"a", b"4")], [(b"a", None)]])
    active = log.active_segment
    raw = active.log_path.read_bytes()
    result = Cleaner().clean_log(log, clock())
    assert result.end_offset == 2
    assert log.active_segment is active
    assert active.log_path.read_bytes() == raw
    assert records_of(log) == [(1, b"a", b"2"), (2, b"a", b"3"), (3, b"a", b"4"), (4, b"a", None)]


def test_nothing_cleanable_without_sealed_segments(compact_log: Log, clock: FakeClock) -> None:
    fill(compact_log, [[(b"a", b"1")], [(b"a", b"2")]])
    result = Cleaner().clean_log(compact_log, clock(), force=True)
    assert not result.cleaned
    assert len(records_of(compact_log)) == 2


def test_dirty_ratio_threshold(open_log: LogFactory, clock: FakeClock, tmp_path: Path) -> None:
    log = open_log({**COMPACT, "min.cleanable.dirty.ratio": "0.5"})
    for round_ in range(3):
        fill(log, [[(b"k%d" % i, b"v%d" % round_)] for i in range(10)])
        log.roll()
    cleaner = Cleaner()
    due, ranges = cleaner.needs_cleaning(log, clock())
    assert due and ranges.dirty_ratio == 1.0 and ranges.clean_bytes == 0
    cleaner.clean_log(log, clock())
    assert cleaner.checkpointed_offset(log) == 30
    # One new segment of 10 rewrites against a cleaned segment of the same size: 0.5,
    # which is not above the threshold.
    fill(log, [[(b"k%d" % i, b"v9")] for i in range(10)])
    log.roll()
    due, ranges = cleaner.needs_cleaning(log, clock())
    assert ranges.first_dirty_offset == 30
    assert ranges.dirty_ratio == pytest.approx(0.5)
    assert not due
    result = cleaner.clean_log(log, clock())
    assert not result.cleaned and "ratio" in result.reason
    assert len(records_of(log)) == 20
    fill(log, [[(b"k%d" % i, b"v10")] for i in range(10)])
    log.roll()
    due, ranges = cleaner.needs_cleaning(log, clock())
    assert due and ranges.dirty_ratio > 0.5
    assert cleaner.clean_log(log, clock()).cleaned
    assert [v for _, _, v in records_of(log)] == [b"v10"] * 10


def test_min_compaction_lag(open_log: LogFactory, clock: FakeClock) -> None:
    log = open_log({**COMPACT, "min.compaction.lag.ms": 5000})
    fill(log, [[(b"a", b"1")], [(b"a", b"2")]], timestamp=10_000)
    log.roll()
    fill(log, [[(b"a", b"3")], [(b"a", b"4")]], timestamp=20_000)
    log.roll()
    log.append(batch([(b"b", b"1")], timestamp=20_000))
    cleaner = Cleaner()
    # At 22_000 the second segment (largest timestamp 20_000) is too recent.
    result = cleaner.clean_log(log, 22_000)
    assert result.cleaned and result.end_offset == 2
    assert [o for o, _, _ in records_of(log)] == [1, 2, 3, 4]
    result = cleaner.clean_log(log, 25_000)
    assert result.cleaned and result.end_offset == 4
    assert [o for o, _, _ in records_of(log)] == [3, 4]


@pytest.mark.parametrize("codec", list(Compression))
def test_compressed_batches_are_rewritten_with_their_codec(
    compact_log: Log, clock: FakeClock, codec: Compression
) -> None:
    log = compact_log
    fill(log, [[(b"a", b"1" * 50), (b"b", b"1" * 50), (b"c", b"1")]], compression=codec)
    fill(log, [[(b"b", b"2")]], compression=codec)
    log.roll()
    Cleaner().clean_log(log, clock())
    headers = [h for h, _ in batches_of(log)]
    assert [h.compression for h in headers] == [int(codec), int(codec)]
    assert records_of(log) == [(0, b"a", b"1" * 50), (2, b"c", b"1"), (3, b"b", b"2")]


def test_headers_timestamps_and_log_append_time_preserved(
    compact_log: Log, clock: FakeClock
) -> None:
    log = compact_log
    hdrs = [("trace", b"x"), ("none", None)]
    fill(log, [[(b"a", b"1"), (b"b", b"1")]], headers=hdrs, timestamp=5000)
    fill(log, [[(b"a", b"2"), (b"c", b"1")]], log_append_time=7777)
    fill(log, [[(b"c", b"2")]])
    log.roll()
    Cleaner().clean_log(log, clock())
    data = b"".join(raw for _, raw in batches_of(log))
    got = [
        (r.offset, r.key, r.timestamp, r.headers)
        for position, header in iter_batches(data)
        for r in iter_records(data, position, header=header)
    ]
    assert got == [
        (1, b"b", 5001, tuple(hdrs)),
        (2, b"a", 7777, ()),
        (4, b"c", 1000, ()),
    ]
    rewritten = [h for h, _ in batches_of(log)][1]
    assert rewritten.is_log_append_time and rewritten.max_timestamp == 7777


def test_producer_batches_keep_their_fields_and_the_last_one_stays(
    compact_log: Log, clock: FakeClock
) -> None:
    log = compact_log
    fill(log, [[(b"a", b"1"), (b"b", b"1")]], producer=(7, 3, 0))  # offsets 0-1, seq 0-1
    fill(log, [[(b"c", b"1"), (b"d", b"1")]], producer=(7, 3, 2))  # offsets 2-3, seq 2-3
    fill(log, [[(b"x", b"1")]], producer=(9, 0, 0))  # offset 4: producer 9's last batch
    fill(log, [[(b"a", b"2"), (b"b", b"2"), (b"c", b"2"), (b"d", b"2"), (b"x", b"2")]])
    fill(log, [[(b"z", b"1")]])
    log.roll()
    Cleaner().clean_log(log, clock())
    headers = {h.base_offset: h for h, _ in batches_of(log)}
    # Producer 7's first batch is emptied and not its last: dropped. Its last batch is
    # emptied but stays as a bare header with the producer's fields.
    assert 0 not in headers
    last7 = headers[2]
    assert (last7.record_count, last7.last_offset_delta) == (0, 1)
    assert (last7.producer_id, last7.producer_epoch, last7.base_sequence) == (7, 3, 2)
    assert last7.last_sequence == 3
    assert headers[4].producer_id == 9 and headers[4].record_count == 0
    assert [o for o, _, _ in records_of(log)] == [5, 6, 7, 8, 9, 10]
    # Once producer 7 writes again, its emptied batch is no longer needed.
    fill(log, [[(b"p", b"1")]], producer=(7, 3, 4))
    log.roll()
    Cleaner().clean_log(log, clock(), force=True)
    headers = {h.base_offset: h for h, _ in batches_of(log)}
    assert 2 not in headers and 4 in headers


def test_control_and_transactional_batches_are_kept(compact_log: Log, clock: FakeClock) -> None:
    log = compact_log
    fill(log, [[(b"a", b"t1")]], producer=(5, 0, 0), transactional=True)
    log.append(
        build_end_txn_marker_batch(
            commit=True, producer_id=5, producer_epoch=0, coordinator_epoch=1, timestamp=1
        )
    )
    fill(log, [[(b"a", b"2")], [(b"b", b"1")]])
    log.roll()
    Cleaner().clean_log(log, clock())
    headers = [h for h, _ in batches_of(log)]
    assert [h.base_offset for h in headers] == [0, 1, 2, 3]
    assert headers[1].is_control and headers[0].is_transactional


def test_compact_delete_also_applies_retention(open_log: LogFactory, clock: FakeClock) -> None:
    log = open_log({**COMPACT, "cleanup.policy": "compact,delete", "retention.ms": 10_000})
    now = clock()
    fill(log, [[(b"a", b"1")], [(b"b", b"1")]], timestamp=now - 20_000)
    log.roll()
    fill(log, [[(b"a", b"2")], [(b"a", b"3")]], timestamp=now)
    log.roll()
    log.append(batch([(b"c", b"1")], timestamp=now))
    assert log.delete_old_segments(now) == 1
    assert log.log_start_offset == 2
    Cleaner().clean_log(log, now)
    assert records_of(log) == [(3, b"a", b"3"), (4, b"c", b"1")]


def test_keyless_record_refused_and_nothing_written(open_log: LogFactory) -> None:
    log = open_log(COMPACT)
    log.append(batch([(b"a", b"1")]))
    size, leo = log.size_in_bytes, log.log_end_offset
    mixed = batch([(b"a", b"1")]) + batch([(b"b", b"1"), (None, b"2")])
    with pytest.raises(InvalidRecordError, match="compacted topic requires a key"):
        log.append(mixed)
    assert (log.size_in_bytes, log.log_end_offset) == (size, leo)
    # Control batches carry their own keys and pass; a delete topic takes keyless records.
    log.append(
        build_end_txn_marker_batch(
            commit=False, producer_id=1, producer_epoch=0, coordinator_epoch=0, timestamp=1
        )
    )


def test_keys_checked_by_the_caller_are_not_decoded_again(
    open_log: LogFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = open_log(COMPACT)
    decoded: list[int] = []
    real = log_module.iter_records

    def counting(*args: Any, **kwargs: Any) -> Any:
        decoded.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(log_module, "iter_records", counting)
    log.append(batch([(b"a", b"1")]), keys_checked=True)
    assert decoded == []
    log.append(batch([(b"a", b"2")]))
    assert decoded == [1]
    assert records_of(log) == [(0, b"a", b"1"), (1, b"a", b"2")]


def test_keyless_records_accepted_on_delete_topics(open_log: LogFactory) -> None:
    log = open_log({})
    log.append(batch([(None, b"1")]))
    assert log.log_end_offset == 1


def test_reopen_after_clean(open_log: LogFactory, clock: FakeClock) -> None:
    log = open_log(COMPACT)
    fill(log, [[(b"k%d" % (i % 3), b"v%d" % i)] for i in range(12)])
    log.roll()
    fill(log, [[(b"k0", b"last")]])
    Cleaner().clean_log(log, clock())
    expected = records_of(log)
    log.close()
    reopened = open_log(COMPACT, clean_shutdown=True)
    assert records_of(reopened) == expected
    reopened.close()
    recovered = open_log(COMPACT, clean_shutdown=False)
    assert records_of(recovered) == expected
    assert recovered.recovery_report.problems == []


def test_cleaner_checkpoint_persisted(
    open_log: LogFactory, clock: FakeClock, tmp_path: Path
) -> None:
    log = open_log(COMPACT)
    fill(log, [[(b"a", b"1")], [(b"a", b"2")], [(b"b", b"1")]])
    log.roll()
    Cleaner().clean_log(log, clock())
    path = tmp_path / CLEANER_OFFSET_CHECKPOINT
    assert path.read_text() == "0\n1\ntopic 0 3\n"
    fresh = Cleaner()
    assert fresh.checkpointed_offset(log) == 3
    _, ranges = fresh.needs_cleaning(log, clock())
    assert ranges.first_dirty_offset == 3 and ranges.dirty_bytes == 0


def test_truncation_lowers_the_checkpoint(open_log: LogFactory, clock: FakeClock) -> None:
    log = open_log({**COMPACT, "delete.retention.ms": 100})
    cleaner = Cleaner()
    cleaner.attach(log)
    fill(log, [[(b"a", b"1")], [(b"b", b"1")], [(b"c", b"1")]])
    log.roll()
    cleaner.clean_log(log, clock())
    assert cleaner.checkpointed_offset(log) == 3
    log.truncate_to(1)
    assert cleaner.checkpointed_offset(log) == 1
    # New data below the old first dirty offset must count as dirty: were it taken as
    # clean, the tombstone would outlive the value it deletes and, once expired, let
    # that value reappear.
    fill(log, [[(b"a", b"2")], [(b"a", None)], [(b"b", b"2")]])
    log.roll()
    now = clock()
    cleaner.clean_log(log, now)
    assert records_of(log) == [(2, b"a", None), (3, b"b", b"2")]
    cleaner.clean_log(log, now + 100)
    assert records_of(log) == [(3, b"b", b"2")]


def test_small_segments_are_grouped(open_log: LogFactory, clock: FakeClock) -> None:
    log = open_log({**COMPACT, "segment.bytes": 1000})
    for i in range(8):
        fill(log, [[(b"k%d" % i, b"v" * 40)]])
        log.roll()
    fill(log, [[(b"z", b"1")]])
    before = len(log.segments)
    result = Cleaner().clean_log(log, clock(), force=True)
    assert result.segments_before == 8
    assert result.segments_after < before - 1
    for segment in log.segments[:-1]:
        assert segment.size <= 1000
    assert [k for _, k, _ in records_of(log)] == [b"k%d" % i for i in range(8)] + [b"z"]


def test_offset_map_budget_cleans_in_several_passes(open_log: LogFactory, clock: FakeClock) -> None:
    log = open_log(COMPACT)
    for round_ in range(3):
        fill(log, [[(b"key-%03d" % i, b"r%d" % round_)] for i in range(50)])
        log.roll()
    fill(log, [[(b"tail", b"1")]])
    before = latest(records_of(log))
    # A map entry of a 7-byte key is charged 7 + 112 bytes: 22 fit.
    cleaner = Cleaner(dedupe_buffer_size=22 * 119)
    passes = 0
    while True:
        result = cleaner.clean_log(log, clock())
        if not result.cleaned:
            break
        passes += 1
        assert result.keys_mapped <= 22
        assert latest(records_of(log)) == before
    assert passes > 3
    assert len(records_of(log)) == 51


def test_corrupt_sealed_segment_raises_and_swaps_nothing(
    compact_log: Log, clock: FakeClock
) -> None:
    log = compact_log
    fill(log, [[(b"a", b"1")], [(b"a", b"2")]])
    log.roll()
    fill(log, [[(b"b", b"1")]])
    path = log.segments[0].log_path
    raw = bytearray(path.read_bytes())
    raw[-3] ^= 0xFF  # inside the CRC range of the last batch
    path.write_bytes(bytes(raw))
    with pytest.raises(CorruptSegmentError):
        Cleaner().clean_log(log, clock())
    assert not list(path.parent.glob("*.cleaned"))
    assert path.read_bytes() == bytes(raw)


def test_manager_cleans_the_dirtiest_log(tmp_path: Path, clock: FakeClock) -> None:
    config = LogConfig.from_mapping(COMPACT)
    manager = LogManager([tmp_path], clock=clock, default_config=config)
    manager.open()
    busy = manager.get_or_create_log("busy", 0)
    calm = manager.get_or_create_log("calm", 0)
    plain = manager.get_or_create_log("plain", 0, LogConfig())
    for i in range(10):
        busy.append(batch([(b"a", b"%d" % i)]))
    busy.roll()
    calm.append(batch([(b"a", b"1")]))
    calm.roll()
    plain.append(batch([(None, b"1")]))
    plain.roll()
    result = manager.clean_dirtiest(clock())
    assert result is not None and (result.topic, result.records_removed) == ("busy", 9)
    result = manager.clean_dirtiest(clock())
    assert result is not None and result.topic == "calm"
    assert manager.clean_dirtiest(clock()) is None
    # Truncation through the manager's logs lowers the checkpoint; deletion forgets it.
    busy.truncate_to(0)
    assert manager.cleaner.checkpointed_offset(busy) == 0
    manager.delete_log("busy", 0)
    assert "busy" not in (tmp_path / CLEANER_OFFSET_CHECKPOINT).read_text()
    manager.close()
    reopened = LogManager([tmp_path], clock=clock, default_config=config)
    reopened.open()
    log = reopened.get_log("calm", 0)
    assert log is not None and reopened.cleaner.checkpointed_offset(log) == 1
    reopened.close()
