"""Truncation (to an offset, fully) and the leader epoch cache."""

from __future__ import annotations

from pathlib import Path

from storage_helpers import FakeClock, LogFactory, make_batch, read_all

from tidelog.storage import Log
from tidelog.storage.epoch import UNDEFINED_EPOCH, LeaderEpochCache


def _fill(log: Log) -> None:
    # Offsets 0-1 (epoch 1), 2-3 (epoch 1), roll, 4-5 (epoch 2), roll, 6-7 (epoch 3).
    log.append(make_batch([b"a", b"b"]), leader_epoch=1)
    log.append(make_batch([b"c", b"d"]), leader_epoch=1)
    log.roll()
    log.append(make_batch([b"e", b"f"]), leader_epoch=2)
    log.roll()
    log.append(make_batch([b"g", b"h"]), leader_epoch=3)


def test_truncate_to_batch_boundary_across_segments(open_log: LogFactory) -> None:
    log = open_log()
    _fill(log)
    calls: list[int] = []
    log.on_checkpoint = lambda: calls.append(log.log_end_offset)
    assert log.truncate_to(4)
    assert log.log_end_offset == 4
    assert [s.base_offset for s in log.segments] == [0, 4]
    assert log.active_segment.size == 0
    assert log.epoch_cache.entries == [(1, 0)]
    assert calls == [4]
    assert read_all(log) == [(0, b"a"), (1, b"b"), (2, b"c"), (3, b"d")]
    assert not log.truncate_to(4)
    # Appending after truncation continues from the new end.
    info = log.append(make_batch([b"x"]), leader_epoch=5)
    assert info.first_offset == 4
    assert log.epoch_cache.entries == [(1, 0), (5, 4)]


def test_truncate_inside_a_batch_removes_the_whole_batch(open_log: LogFactory) -> None:
    log = open_log({"index.interval.bytes": 1})
    _fill(log)
    assert log.truncate_to(3)
    assert log.log_end_offset == 2
    assert [s.base_offset for s in log.segments] == [0]
    assert read_all(log) == [(0, b"a"), (1, b"b")]
    segment = log.active_segment
    assert all(
        segment.offset_index.entry_at(i)[1] < segment.size
        for i in range(segment.offset_index.entry_count)
    )
    log.append(make_batch([b"y"]))
    assert read_all(log)[-1] == (2, b"y")


def test_truncate_keeps_max_timestamp_consistent(open_log: LogFactory) -> None:
    log = open_log({"index.interval.bytes": 1})
    for ts in (10, 50, 20, 90):
        log.append(make_batch([b"v"], timestamp=ts))
    log.truncate_to(3)
    assert log.active_segment.max_timestamp() == (50, 1)
    assert log.offset_for_timestamp(-3) == (1, 50, -1)
    assert log.offset_for_timestamp(60) is None


def test_truncate_below_first_segment_restarts(open_log: LogFactory) -> None:
    log = open_log()
    log.append_as_follower(make_batch([b"a"], base_offset=10))
    log.roll()
    log.append(make_batch([b"b"]))
    log.truncate_fully_and_start_at(10)
    assert log.log_start_offset == log.log_end_offset == 10
    log.append_as_follower(make_batch([b"c"], base_offset=10))
    assert log.truncate_to(5)
    assert (log.log_start_offset, log.log_end_offset) == (5, 5)
    assert [s.base_offset for s in log.segments] == [5]


def test_truncate_fully_and_start_at(open_log: LogFactory) -> None:
    log = open_log()
    _fill(log)
    log.truncate_fully_and_start_at(100)
    assert (log.log_start_offset, log.log_end_offset, log.recovery_point) == (100, 100, 100)
    assert [s.base_offset for s in log.segments] == [100]
    assert sorted(p.name for p in log.directory.glob("*.log")) == [f"{100:020d}.log"]
    assert log.epoch_cache.entries == []
    log.append(make_batch([b"z"]), leader_epoch=9)
    assert read_all(log) == [(100, b"z")]


def test_truncation_survives_reopen(open_log: LogFactory) -> None:
    log = open_log()
    _fill(log)
    log.truncate_to(6)
    log.close()
    reopened = open_log(clean_shutdown=True)
    assert reopened.log_end_offset == 6
    assert reopened.epoch_cache.entries == [(1, 0), (2, 4)]
    assert [o for o, _ in read_all(reopened)] == list(range(6))


def test_epoch_cache_lookup_matches_offset_for_leader_epoch(open_log: LogFactory) -> None:
    log = open_log()
    _fill(log)
    assert log.epoch_cache.entries == [(1, 0), (2, 4), (3, 6)]
    assert log.end_offset_for_epoch(3) == (3, 8)  # latest epoch: the LEO
    assert log.end_offset_for_epoch(2) == (2, 6)
    assert log.end_offset_for_epoch(1) == (1, 4)
    assert log.end_offset_for_epoch(0) == (0, 0)  # below every epoch
    assert log.end_offset_for_epoch(4) == (UNDEFINED_EPOCH, -1)  # above every epoch
    assert log.end_offset_for_epoch(UNDEFINED_EPOCH) == (UNDEFINED_EPOCH, -1)


def test_epoch_cache_gaps_answer_with_floor_epoch(tmp_path: Path) -> None:
    cache = LeaderEpochCache(tmp_path / "leader-epoch-checkpoint")
    cache.assign(1, 0)
    cache.assign(4, 10)
    assert cache.end_offset_for(2, 20) == (1, 10)
    assert not cache.assign(3, 15)  # older epochs are ignored
    assert cache.epoch_for_offset(9) == 1 and cache.epoch_for_offset(10) == 4


def test_epoch_cache_persists_and_trims(open_log: LogFactory, log_dir: Path) -> None:
    log = open_log()
    _fill(log)
    text = (log_dir / "leader-epoch-checkpoint").read_text()
    assert text == "0\n3\n1 0\n2 4\n3 6\n"
    log.delete_records(5)
    assert log.epoch_cache.entries == [(2, 5), (3, 6)]
    assert (log_dir / "leader-epoch-checkpoint").read_text() == "0\n2\n2 5\n3 6\n"
    reloaded = LeaderEpochCache(log_dir / "leader-epoch-checkpoint")
    assert reloaded.entries == [(2, 5), (3, 6)]


def test_corrupt_epoch_checkpoint_is_ignored(tmp_path: Path, clock: FakeClock) -> None:
    path = tmp_path / "leader-epoch-checkpoint"
    path.write_text("0\n2\n1 0\n")
    assert LeaderEpochCache(path).entries == []
    path.write_text("0\n2\n3 0\n2 5\n")  # out of order: the bad entry goes
    assert LeaderEpochCache(path).entries == [(3, 0)]


def test_truncating_at_the_end_drops_an_epoch_that_holds_nothing(
    open_log: LogFactory, log_dir: Path
) -> None:
    # A leader elected for epoch 4 records it at its end, then loses leadership before
    # appending anything; as a follower it truncates to its end (Kafka's rule).
    log = open_log()
    _fill(log)
    log.epoch_cache.assign(4, log.log_end_offset)
    assert not log.truncate_to(log.log_end_offset)
    assert log.epoch_cache.entries == [(1, 0), (2, 4), (3, 6)]
    assert log.end_offset_for_epoch(4) == (UNDEFINED_EPOCH, -1)
    # The change is in the checkpoint too.
    assert LeaderEpochCache(log_dir / "leader-epoch-checkpoint").entries == [
        (1, 0),
        (2, 4),
        (3, 6),
    ]
