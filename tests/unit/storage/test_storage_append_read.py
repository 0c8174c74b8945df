"""Append (leader and follower) and read, on uncompressed and compressed batches."""

from __future__ import annotations

import os

import pytest
from storage_helpers import LogFactory, make_batch, read_all

from tidelog.records import Compression, iter_batches, parse_header, validate_batch
from tidelog.storage import (
    InvalidAppendError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    UnexpectedAppendOffsetError,
)


@pytest.mark.parametrize("compression", list(Compression))
def test_append_assigns_offsets_per_batch(open_log: LogFactory, compression: Compression) -> None:
    log = open_log()
    first = make_batch([b"a", b"b", b"c"], compression=compression)
    second = make_batch([b"d", b"e"], compression=compression)
    info = log.append(first + second, leader_epoch=3)
    assert (info.first_offset, info.last_offset) == (0, 4)
    assert (info.batch_count, info.record_count) == (2, 5)
    assert info.size == len(first) + len(second)
    assert log.log_end_offset == 5
    info = log.append(make_batch([b"f"], compression=compression), leader_epoch=3)
    assert (info.first_offset, info.last_offset) == (5, 5)
    assert read_all(log) == [(i, v) for i, v in enumerate([b"a", b"b", b"c", b"d", b"e", b"f"])]
    data = log.read_bytes(0, 1 << 20)
    headers = [h for _, h in iter_batches(data)]  # CRCs still valid after the rewrite
    assert [h.base_offset for h in headers] == [0, 3, 5]
    assert {h.partition_leader_epoch for h in headers} == {3}


def test_append_rewrites_bytearray_in_place(open_log: LogFactory) -> None:
    log = open_log()
    log.append(make_batch([b"x"]))
    buf = bytearray(make_batch([b"y", b"z"]))
    log.append(buf, leader_epoch=7)
    header = parse_header(buf)
    assert (header.base_offset, header.partition_leader_epoch) == (1, 7)


def test_append_refuses_garbage_and_oversized(open_log: LogFactory) -> None:
    log = open_log({"max.message.bytes": 200})
    with pytest.raises(InvalidAppendError):
        log.append(b"")
    with pytest.raises(InvalidAppendError):
        log.append(make_batch([b"a"])[:-1])
    with pytest.raises(RecordTooLargeError):
        log.append(make_batch([b"v" * 300]))
    assert log.log_end_offset == 0
    assert log.size_in_bytes == 0


def test_log_append_time_sets_max_timestamp(open_log: LogFactory, clock: object) -> None:
    log = open_log({"message.timestamp.type": "LogAppendTime"})
    info = log.append(make_batch([b"a", b"b"], timestamp=5))
    assert info.log_append_time == log._clock()
    data = log.read_bytes(0, 1000)
    header = validate_batch(data)
    assert header.is_log_append_time and header.max_timestamp == info.log_append_time


def test_follower_append_keeps_offsets_and_refuses_going_back(open_log: LogFactory) -> None:
    log = open_log()
    batches = make_batch([b"a", b"b"], base_offset=0, epoch=1) + make_batch(
        [b"c"], base_offset=5, epoch=2
    )
    info = log.append_as_follower(batches)
    assert (info.first_offset, info.last_offset) == (0, 5)
    assert log.log_end_offset == 6
    assert log.epoch_cache.entries == [(1, 0), (2, 5)]
    with pytest.raises(UnexpectedAppendOffsetError):
        log.append_as_follower(make_batch([b"d"], base_offset=4))
    with pytest.raises(UnexpectedAppendOffsetError):
        log.append_as_follower(
            make_batch([b"d", b"e"], base_offset=8) + make_batch([b"f"], base_offset=9)
        )
    assert log.log_end_offset == 6
    assert read_all(log) == [(0, b"a"), (1, b"b"), (5, b"c")]


def test_read_from_inside_a_batch_returns_the_whole_batch(open_log: LogFactory) -> None:
    log = open_log()
    log.append(make_batch([b"a", b"b", b"c"]))
    log.append(make_batch([b"d", b"e"]))
    with log.read(4, 1 << 20) as piece:  # type: ignore[union-attr]
        assert piece.first_offset == 3
        data = piece.read()
    assert [h.base_offset for _, h in iter_batches(data)] == [3]
    data = log.read_bytes(1, 1 << 20)
    assert [h.base_offset for _, h in iter_batches(data)] == [0, 3]


def test_read_slice_is_usable_with_sendfile(open_log: LogFactory, tmp_path: object) -> None:
    log = open_log()
    log.append(make_batch([b"a"]))
    piece = log.read(0, 1 << 20)
    assert piece is not None
    read_fd, write_fd = os.pipe()
    try:
        sent = os.sendfile(write_fd, piece.fd, piece.position, piece.length)
        assert sent == piece.length
        assert os.read(read_fd, 1 << 16) == log.read_bytes(0, 1 << 20)
    finally:
        piece.close()
        os.close(read_fd)
        os.close(write_fd)


def test_min_one_batch_returns_a_big_first_batch_whole(open_log: LogFactory) -> None:
    log = open_log()
    big = make_batch([b"x" * 500])
    log.append(big)
    log.append(make_batch([b"y"]))
    assert log.read_bytes(0, 10) == log.read_bytes(0, len(big), whole_batches=True)
    assert len(log.read_bytes(0, 10)) == len(big)
    # Without min_one_batch Kafka returns max_bytes (a partial batch) ...
    assert len(log.read_bytes(0, 10, min_one_batch=False)) == 10
    # ... and whole_batches trims that to nothing.
    assert log.read_bytes(0, 10, min_one_batch=False, whole_batches=True) == b""
    # max_bytes may cut the second batch; whole_batches keeps only whole ones.
    assert len(log.read_bytes(0, len(big) + 20)) == len(big) + 20
    assert len(log.read_bytes(0, len(big) + 20, whole_batches=True)) == len(big)


def test_read_respects_max_offset(open_log: LogFactory) -> None:
    log = open_log()
    for value in (b"a", b"b", b"c"):
        log.append(make_batch([value, value]))
    data = log.read_bytes(0, 1 << 20, max_offset=4)
    assert [h.base_offset for _, h in iter_batches(data)] == [0, 2]
    # A batch straddling max_offset is not returned.
    assert [h.base_offset for _, h in iter_batches(log.read_bytes(0, 1 << 20, max_offset=3))] == [0]
    assert log.read(4, 1 << 20, max_offset=4) is None


def test_read_out_of_range(open_log: LogFactory) -> None:
    log = open_log()
    log.append(make_batch([b"a"]))
    assert log.read(1, 100) is None  # the LEO: nothing yet
    with pytest.raises(OffsetOutOfRangeError):
        log.read(2, 100)
    log.append(make_batch([b"b"]))
    log.roll()
    log.append(make_batch([b"c"]))
    log.delete_records(1)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(0, 100)
    assert read_all(log) == [(1, b"b"), (2, b"c")]


def test_reads_cross_many_segments_with_few_handles(open_log: LogFactory) -> None:
    log = open_log({"segment.bytes": 200})
    log.handle_cache.max_idle_open = 2
    for index in range(60):
        log.append(make_batch([b"%03d" % index * 20]))
    assert len(log.segments) > 20
    assert read_all(log) == [(i, b"%03d" % i * 20) for i in range(60)]
    open_segments = [s for s in log.segments if s.is_open]
    assert len(open_segments) <= 3  # the active one plus the idle cap


def test_index_entries_every_interval(open_log: LogFactory) -> None:
    log = open_log({"index.interval.bytes": 100})
    for index in range(50):
        log.append(make_batch([b"v" * 40], timestamp=index))
    segment = log.active_segment
    entries = segment.offset_index.entry_count
    assert 10 <= entries < 50  # sparse: well below one per batch
    # Every offset is still found through the index.
    for offset in range(50):
        found = segment.find_batch(offset)
        assert found is not None and found.header.base_offset == offset
