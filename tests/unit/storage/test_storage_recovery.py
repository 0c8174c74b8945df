"""Opening a log after a crash (in-process: files are damaged between close and open)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from storage_helpers import FakeClock, LogFactory, make_batch, read_all

from tidelog.records import Compression
from tidelog.storage import Log, LogConfig


def crash(log: Log) -> None:
    """Drop the log's file handles without flushing or writing anything (a kill -9)."""
    for segment in log.segments:
        log.handle_cache.retire(segment)
    log._closed = True


def _fill(log: Log, segments: int = 3, per_segment: int = 3) -> list[tuple[int, bytes]]:
    expected = []
    offset = 0
    for s in range(segments):
        for b in range(per_segment):
            value = b"s%db%d" % (s, b) * 10
            log.append(make_batch([value], compression=Compression.GZIP if b % 2 else 0))
            expected.append((offset, value))
            offset += 1
        if s < segments - 1:
            log.roll()
    return expected


def _segment_file(directory: Path, base: int, kind: str = ".log") -> Path:
    return directory / f"{base:020d}{kind}"


def test_torn_tail_is_truncated(
    open_log: LogFactory, log_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = open_log()
    expected = _fill(log)
    last_base = log.segments[-1].base_offset
    crash(log)
    path = _segment_file(log_dir, last_base)
    size = path.stat().st_size
    with open(path, "r+b") as file:
        file.truncate(size - 7)
    with caplog.at_level(logging.WARNING):
        reopened = open_log()
    report = reopened.recovery_report
    assert not report.clean_shutdown
    assert len(report.problems) == 1
    problem = report.problems[0]
    assert problem.segment == last_base and problem.bytes_dropped > 0
    assert problem.position + problem.bytes_dropped == size - 7
    assert reopened.log_end_offset == len(expected) - 1
    assert read_all(reopened) == expected[:-1]
    assert "dropped" in caplog.text
    assert reopened.append(make_batch([b"new"])).first_offset == len(expected) - 1


def test_corrupt_byte_drops_the_batch_and_every_later_segment(
    open_log: LogFactory, log_dir: Path
) -> None:
    log = open_log()
    expected = _fill(log)
    bases = [s.base_offset for s in log.segments]
    crash(log)
    path = _segment_file(log_dir, bases[1])
    data = bytearray(path.read_bytes())
    # Flip a byte inside the second batch's records (covered by its CRC).
    second = int.from_bytes(data[8:12], "big") + 12
    data[second + 70] ^= 0xFF
    path.write_bytes(bytes(data))
    reopened = open_log()
    report = reopened.recovery_report
    assert [p.segment for p in report.problems] == [bases[1], bases[2]]
    assert report.problems[0].position == second
    assert "CRC" in report.problems[0].reason
    assert not _segment_file(log_dir, bases[2]).exists()
    assert read_all(reopened) == expected[: bases[1] + 1]


def test_base_offset_going_backwards_is_corruption(open_log: LogFactory, log_dir: Path) -> None:
    log = open_log()
    for value in (b"a", b"b", b"c"):
        log.append(make_batch([value]))
    crash(log)
    path = _segment_file(log_dir, 0)
    data = bytearray(path.read_bytes())
    third = (int.from_bytes(data[8:12], "big") + 12) * 2
    data[third : third + 8] = (0).to_bytes(8, "big")  # outside the CRC
    path.write_bytes(bytes(data))
    reopened = open_log()
    assert reopened.log_end_offset == 2
    assert "below the expected" in reopened.recovery_report.problems[0].reason


def test_recovery_starts_at_the_recovery_point(open_log: LogFactory, log_dir: Path) -> None:
    log = open_log()
    expected = _fill(log)
    bases = [s.base_offset for s in log.segments]
    log.flush()
    crash(log)
    reopened = open_log(recovery_point=bases[2] + 1)
    assert reopened.recovery_report.recovered_segments == [bases[2]]
    assert read_all(reopened) == expected


@pytest.mark.parametrize("clean", [True, False])
def test_deleted_index_is_rebuilt(open_log: LogFactory, log_dir: Path, clean: bool) -> None:
    log = open_log({"index.interval.bytes": 1})
    expected = _fill(log)
    if clean:
        log.close()
    else:
        log.flush()
        crash(log)
    _segment_file(log_dir, 0, ".index").unlink()
    _segment_file(log_dir, 0, ".timeindex").unlink()
    reopened = open_log({"index.interval.bytes": 1}, clean_shutdown=clean, recovery_point=3)
    assert read_all(reopened) == expected
    assert reopened.offset_for_timestamp(1000) is not None
    assert _segment_file(log_dir, 0, ".index").stat().st_size == 2 * 8
    if not clean:
        assert [base for base, _ in reopened.recovery_report.rebuilt_indexes] == [0]


def test_garbage_index_is_rebuilt(open_log: LogFactory, log_dir: Path) -> None:
    log = open_log({"index.interval.bytes": 1})
    expected = _fill(log)
    good = _segment_file(log_dir, 0, ".index").read_bytes()
    log.flush()
    crash(log)
    # Entries that point past the end of the segment.
    _segment_file(log_dir, 0, ".index").write_bytes(b"\x00\x00\x00\x01\x7f\x00\x00\x00" * 2)
    reopened = open_log({"index.interval.bytes": 1}, recovery_point=3)
    assert reopened.recovery_report.rebuilt_indexes[0][0] == 0
    assert _segment_file(log_dir, 0, ".index").read_bytes() == good
    assert read_all(reopened) == expected


def test_non_increasing_index_is_rebuilt(open_log: LogFactory, log_dir: Path) -> None:
    log = open_log({"index.interval.bytes": 1})
    expected = _fill(log)
    good = _segment_file(log_dir, 0, ".index").read_bytes()
    log.flush()
    crash(log)
    _segment_file(log_dir, 0, ".index").write_bytes(good[8:] + good[:8])
    reopened = open_log({"index.interval.bytes": 1}, recovery_point=3)
    assert "increase" in reopened.recovery_report.rebuilt_indexes[0][1]
    assert read_all(reopened) == expected


def test_torn_index_of_active_segment_is_rebuilt(open_log: LogFactory, log_dir: Path) -> None:
    log = open_log({"index.interval.bytes": 1})
    expected = _fill(log, segments=1, per_segment=6)
    crash(log)
    path = _segment_file(log_dir, 0, ".index")
    path.write_bytes(path.read_bytes()[:-3])
    reopened = open_log({"index.interval.bytes": 1})
    assert read_all(reopened) == expected
    assert path.stat().st_size % 8 == 0


def test_clean_reopen_skips_the_scan(open_log: LogFactory) -> None:
    log = open_log()
    expected = _fill(log)
    log.close()
    reopened = open_log(clean_shutdown=True)
    assert reopened.recovery_report.recovered_segments == []
    assert reopened.recovery_point == reopened.log_end_offset == len(expected)
    assert read_all(reopened) == expected
    assert reopened.append(make_batch([b"more"])).first_offset == len(expected)


def test_leftover_files_are_cleaned_up(open_log: LogFactory, log_dir: Path) -> None:
    log = open_log()
    expected = _fill(log)
    log.close()
    (log_dir / f"{0:020d}.log.cleaned").write_bytes(b"partial")
    (log_dir / f"{0:020d}.index.deleted").write_bytes(b"old")
    (log_dir / f"{99:020d}.index").write_bytes(b"")  # orphan index
    reopened = open_log()
    assert sorted(reopened.recovery_report.removed_files) == sorted(
        [f"{0:020d}.log.cleaned", f"{0:020d}.index.deleted", f"{99:020d}.index"]
    )
    assert read_all(reopened) == expected


def test_a_swap_file_completes_the_replacement(open_log: LogFactory, log_dir: Path) -> None:
    log = open_log()
    expected = _fill(log)
    log.close()
    # A swap replacing segments 0 and 3 with the batches of segment 0 only plus 3's.
    first = _segment_file(log_dir, 0).read_bytes()
    second = _segment_file(log_dir, 3).read_bytes()
    (log_dir / f"{0:020d}.log.swap").write_bytes(first + second)
    _segment_file(log_dir, 3).unlink()  # crash midway through removing the old ones
    reopened = open_log()
    assert reopened.recovery_report.completed_swaps == [0]
    assert [s.base_offset for s in reopened.segments] == [0, 6]
    assert read_all(reopened) == expected


def test_all_data_corrupt_leaves_an_empty_log(open_log: LogFactory, log_dir: Path) -> None:
    log = open_log()
    log.append(make_batch([b"a"]))
    crash(log)
    _segment_file(log_dir, 0).write_bytes(b"\x00" * 100)
    reopened = open_log()
    assert reopened.log_end_offset == 0
    assert reopened.recovery_report.bytes_dropped == 100
    assert reopened.append(make_batch([b"b"])).first_offset == 0


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 120), min_size=1, max_size=15),
    cut=st.floats(0, 1),
    tail=st.sampled_from(["truncate", "zeros", "garbage"]),
)
def test_a_torn_active_segment_leaves_a_prefix(
    tmp_path_factory: pytest.TempPathFactory, sizes: list[int], cut: float, tail: str
) -> None:
    """A crash tears the unflushed tail (sealed segments were fsynced on roll): whatever
    follows the cut (nothing, zeros, garbage), recovery keeps exactly the whole batches
    before it."""
    directory = tmp_path_factory.mktemp("crash") / "t-0"
    config = LogConfig.from_mapping({"segment.bytes": 400, "index.interval.bytes": 64})
    log = Log.open(directory, config, topic="t", partition=0, clock=FakeClock())
    expected = []
    ends = []  # (segment base, end position) of every batch
    for index, size in enumerate(sizes):
        value = bytes([index]) * size
        log.append(make_batch([value], compression=Compression.LZ4 if size % 3 else 0))
        expected.append((index, value))
        ends.append((log.active_segment.base_offset, log.active_segment.size))
    crash(log)
    active = ends[-1][0]
    path = directory / f"{active:020d}.log"
    size = path.stat().st_size
    point = int(cut * size)
    original = path.read_bytes()
    data = original[:point]
    if tail == "zeros":
        data += bytes(size - point)
    elif tail == "garbage":
        data += bytes((i * 37 + 11) % 256 for i in range(size - point))
    path.write_bytes(data)
    reopened = Log.open(directory, config, topic="t", partition=0, clock=FakeClock())
    try:
        # Batches of sealed segments, then those of the active one whose bytes all
        # survived (a zero tail over zero bytes changes nothing).
        survivors = 0
        start = 0
        for base, end in ends:
            if base == active:
                if data[start:end] != original[start:end]:
                    break
                start = end
            survivors += 1
        assert read_all(reopened) == expected[:survivors]
        assert reopened.log_end_offset == survivors
        assert reopened.append(make_batch([b"after"])).first_offset == survivors
    finally:
        reopened.close()
