"""Rolling segments (size, time, index, offset overflow) and retention."""

from __future__ import annotations

import pytest
from storage_helpers import FakeClock, LogFactory, make_batch, read_all

from tidelog.storage import OffsetOutOfRangeError


def test_roll_on_segment_bytes(open_log: LogFactory) -> None:
    log = open_log({"segment.bytes": 300})
    batch = make_batch([b"v" * 50])
    for _ in range(10):
        log.append(batch)
    bases = [s.base_offset for s in log.segments]
    assert len(bases) > 3
    assert all(s.size <= 300 for s in log.segments)
    assert bases == sorted(bases) and bases[0] == 0
    assert read_all(log) == [(i, b"v" * 50) for i in range(10)]
    assert sorted(p.name for p in log.directory.glob("*.log")) == [f"{b:020d}.log" for b in bases]


def test_a_batch_bigger_than_a_segment_goes_alone(open_log: LogFactory) -> None:
    log = open_log({"segment.bytes": 100})
    log.append(make_batch([b"v" * 300]))
    log.append(make_batch([b"v" * 300]))
    assert [s.base_offset for s in log.segments] == [0, 1]


def test_roll_on_segment_ms_uses_batch_timestamps(open_log: LogFactory) -> None:
    log = open_log({"segment.ms": 1000})
    log.append(make_batch([b"a"], timestamp=10_000))
    log.append(make_batch([b"b"], timestamp=10_900))
    assert len(log.segments) == 1
    log.append(make_batch([b"c"], timestamp=11_001))
    assert [s.base_offset for s in log.segments] == [0, 2]


def test_roll_on_segment_ms_uses_clock_without_timestamps(
    open_log: LogFactory, clock: FakeClock
) -> None:
    log = open_log({"segment.ms": 1000})
    log.append(make_batch([b"a"], timestamp=-1))
    clock.advance(999)
    log.append(make_batch([b"b"], timestamp=-1))
    assert len(log.segments) == 1
    clock.advance(2)
    log.append(make_batch([b"c"], timestamp=-1))
    assert [s.base_offset for s in log.segments] == [0, 2]


def test_roll_on_full_index(open_log: LogFactory) -> None:
    # Room for two offset index entries; one entry per batch.
    log = open_log({"segment.index.bytes": 16, "index.interval.bytes": 1})
    for index in range(8):
        log.append(make_batch([b"x" * 20], timestamp=index))
    assert len(log.segments) >= 2
    assert all(s.offset_index.entry_count <= 3 for s in log.segments if s.is_open)
    assert [o for o, _ in read_all(log)] == list(range(8))


def test_roll_on_relative_offset_overflow(open_log: LogFactory) -> None:
    log = open_log()
    log.append_as_follower(make_batch([b"a"], base_offset=0))
    log.append_as_follower(make_batch([b"b"], base_offset=2**31 + 5))
    assert [s.base_offset for s in log.segments] == [0, 2**31 + 5]
    assert read_all(log) == [(0, b"a"), (2**31 + 5, b"b")]


def test_explicit_roll_and_empty_roll_is_noop(open_log: LogFactory) -> None:
    log = open_log()
    log.roll()
    assert len(log.segments) == 1
    log.append(make_batch([b"a"]))
    log.roll()
    log.roll()
    assert [s.base_offset for s in log.segments] == [0, 1]


def test_retention_ms_deletes_old_segments_only(open_log: LogFactory) -> None:
    log = open_log({"retention.ms": 1500})
    for ts in (1000, 2000, 3000):
        log.append(make_batch([b"v" * 100], timestamp=ts))
        log.roll()
    assert len(log.segments) == 4  # three sealed + empty active
    assert log.delete_old_segments(now_ms=3600) == 2  # 1000 and 2000 < 3600 - 1500
    assert log.log_start_offset == 2
    assert [s.base_offset for s in log.segments] == [2, 3]
    assert not (log.directory / f"{0:020d}.log").exists()
    assert read_all(log) == [(2, b"v" * 100)]
    with pytest.raises(OffsetOutOfRangeError):
        log.read(1, 100)


def test_retention_never_deletes_the_active_segment(open_log: LogFactory) -> None:
    log = open_log({"retention.ms": 10, "retention.bytes": 0})
    log.append(make_batch([b"a"], timestamp=1))
    log.append(make_batch([b"b"], timestamp=2))
    assert log.delete_old_segments(now_ms=10**12) == 0
    assert log.log_start_offset == 0
    assert read_all(log) == [(0, b"a"), (1, b"b")]


def test_retention_bytes(open_log: LogFactory) -> None:
    log = open_log({"retention.bytes": 0, "retention.ms": -1})
    sizes = []
    for _ in range(3):
        log.append(make_batch([b"v" * 100]))
        sizes.append(log.active_segment.size)
        log.roll()
    log.append(make_batch([b"w"]))
    total = log.size_in_bytes
    log.update_config(log.config.__class__.from_mapping({"retention.bytes": total - sizes[0]}))
    assert log.delete_old_segments(now_ms=0) == 1
    assert log.log_start_offset == 1
    log.update_config(log.config.__class__.from_mapping({"retention.bytes": 0}))
    assert log.delete_old_segments(now_ms=0) == 2
    assert [s.base_offset for s in log.segments] == [3]
    assert read_all(log) == [(3, b"w")]


def test_retention_stops_at_high_watermark(open_log: LogFactory) -> None:
    log = open_log({"retention.ms": 0})
    for ts in (1, 2, 3):
        log.append(make_batch([b"v"], timestamp=ts))
        log.roll()
    log.update_high_watermark(1)
    assert log.delete_old_segments(now_ms=10**9) == 1
    assert log.log_start_offset == 1


def test_compact_only_policy_skips_time_retention(open_log: LogFactory) -> None:
    log = open_log({"retention.ms": 0, "cleanup.policy": "compact"})
    log.append(make_batch([b"v"], timestamp=1, keys=[b"k"]))
    log.roll()
    log.append(make_batch([b"v"], timestamp=1, keys=[b"k"]))
    assert log.delete_old_segments(now_ms=10**9) == 0


def test_delete_records(open_log: LogFactory) -> None:
    log = open_log()
    calls: list[int] = []
    log.on_checkpoint = lambda: calls.append(log.log_start_offset)
    for index in range(3):
        log.append(make_batch([b"%d" % index, b"%d" % index]))
        log.roll()
    log.append(make_batch([b"last"]))
    assert log.delete_records(3) == 3  # inside the second segment
    assert [s.base_offset for s in log.segments] == [2, 4, 6]
    assert calls == [3]
    assert read_all(log) == [(3, b"1"), (4, b"2"), (5, b"2"), (6, b"last")]
    assert log.delete_records(1) == 3  # never moves back
    with pytest.raises(OffsetOutOfRangeError):
        log.delete_records(8)
    assert log.delete_records(7) == 7  # up to the LEO; the active segment stays
    assert [s.base_offset for s in log.segments] == [6]
    assert log.read(7, 100) is None
