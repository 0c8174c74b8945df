"""Batch-level operations of tidelog.records.batch, on batches built by hand and by the builder."""

from __future__ import annotations

import struct

import pytest
from crc32c import crc32c

from tidelog.records import batch as rb
from tidelog.records.builder import BatchBuilder
from tidelog.records.errors import (
    BatchTooLargeError,
    CorruptBatchError,
    RecordsError,
    TruncatedBatchError,
)
from tidelog.records.reader import decode_records


def make_batch(count: int = 3, base_offset: int = 0, **kwargs: int) -> bytes:
    builder = BatchBuilder(base_offset=base_offset, **kwargs)
    for i in range(count):
        builder.append(b"k%d" % i, b"v%d" % i, timestamp=1_000 + i)
    return builder.close()


def test_crc32c_is_castagnoli() -> None:
    # The standard check value of CRC-32C; CRC-32 (IEEE) would give 0xCBF43926.
    assert crc32c(b"123456789") == 0xE3069283


def test_parse_header_reads_every_field() -> None:
    data = make_batch(3, base_offset=40, producer_id=7, producer_epoch=2, base_sequence=11)
    header = rb.parse_header(data)
    assert header.base_offset == 40
    assert header.batch_length == len(data) - 12
    assert header.size == len(data)
    assert header.partition_leader_epoch == -1
    assert header.magic == 2
    assert header.crc == crc32c(data[21:])
    assert header.attributes == 0
    assert header.last_offset_delta == 2
    assert header.base_timestamp == 1_000
    assert header.max_timestamp == 1_002
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (7, 2, 11)
    assert header.record_count == 3
    assert header.last_offset == 42
    assert header.next_offset == 43
    assert header.last_sequence == 13
    assert header.has_producer_id
    assert not (header.is_control or header.is_transactional or header.is_log_append_time)


def test_last_sequence_wraps_and_is_absent_without_sequence() -> None:
    data = make_batch(3, base_sequence=2**31 - 2)
    assert rb.parse_header(data).last_sequence == 0
    assert rb.parse_header(make_batch(3)).last_sequence == -1


def test_parse_header_errors() -> None:
    data = make_batch()
    with pytest.raises(TruncatedBatchError):
        rb.parse_header(data[:60])
    with pytest.raises(TruncatedBatchError):
        rb.parse_header(data, -1)
    bad_magic = bytearray(data)
    bad_magic[16] = 1
    with pytest.raises(CorruptBatchError, match="magic 1"):
        rb.parse_header(bad_magic)
    short = bytearray(data)
    short[8:12] = struct.pack(">i", 48)
    with pytest.raises(CorruptBatchError, match="length 48"):
        rb.parse_header(short)
    negative = bytearray(data)
    negative[57:61] = struct.pack(">i", -1)
    with pytest.raises(CorruptBatchError, match="negative"):
        rb.parse_header(negative)


def test_peek_batch_size() -> None:
    data = make_batch()
    assert rb.peek_batch_size(data) == len(data)
    assert rb.peek_batch_size(data[:12]) == len(data)
    with pytest.raises(TruncatedBatchError):
        rb.peek_batch_size(data[:11])
    with pytest.raises(CorruptBatchError):
        rb.peek_batch_size(b"\x00" * 8 + struct.pack(">i", -5))


def test_validate_batch() -> None:
    data = make_batch()
    assert rb.validate_batch(data) == rb.parse_header(data)
    with pytest.raises(TruncatedBatchError):
        rb.validate_batch(data[:-1])
    with pytest.raises(BatchTooLargeError):
        rb.validate_batch(data, max_size=len(data) - 1)
    rb.validate_batch(data, max_size=len(data))
    flipped = bytearray(data)
    flipped[-1] ^= 0x01
    with pytest.raises(CorruptBatchError, match="CRC"):
        rb.validate_batch(flipped)
    assert rb.validate_batch(flipped, verify_crc=False).record_count == 3


def test_validate_batch_never_allocates_from_a_huge_length() -> None:
    data = bytearray(make_batch())
    data[8:12] = struct.pack(">i", 2**31 - 1)
    with pytest.raises(TruncatedBatchError):
        rb.validate_batch(data)
    with pytest.raises(BatchTooLargeError):
        rb.validate_batch(data, max_size=1 << 20)


def test_iter_batches_yields_the_valid_prefix_then_raises() -> None:
    first = make_batch(2, base_offset=0)
    second = make_batch(3, base_offset=2)
    log = first + second
    assert [(pos, h.base_offset) for pos, h in rb.iter_batches(log)] == [
        (0, 0),
        (len(first), 2),
    ]
    seen: list[int] = []
    with pytest.raises(TruncatedBatchError):
        for pos, _ in rb.iter_batches(log + second[:30]):
            seen.append(pos)
    assert seen == [0, len(first)]
    # ``end`` limits the scan; a range holding only the first batch yields only it.
    assert [pos for pos, _ in rb.iter_batches(log, 0, len(first))] == [0]
    assert [pos for pos, _ in rb.iter_batches(log, len(first))] == [len(first)]
    with pytest.raises(TruncatedBatchError):
        list(rb.iter_batches(log, 0, len(first) + 5))


def test_rewrites_outside_the_crc_keep_the_batch_valid() -> None:
    data = bytearray(make_batch(3))
    crc = rb.parse_header(data).crc
    rb.set_base_offset(data, 0, 1_000_000)
    rb.set_partition_leader_epoch(data, 0, 17)
    header = rb.validate_batch(data)
    assert (header.base_offset, header.partition_leader_epoch, header.crc) == (1_000_000, 17, crc)
    assert [r.offset for r in decode_records(data)] == [1_000_000, 1_000_001, 1_000_002]


def test_rewrites_at_a_position_inside_a_larger_buffer() -> None:
    first = make_batch(1)
    buf = bytearray(first + make_batch(2))
    pos = len(first)
    rb.set_base_offset(buf, pos, 5)
    rb.set_max_timestamp_log_append_time(buf, pos, rb.peek_batch_size(buf, pos), 99_000)
    assert [h.base_offset for _, h in rb.iter_batches(buf)] == [0, 5]
    assert rb.parse_header(buf).max_timestamp == 1_000  # first batch untouched


def test_set_max_timestamp_log_append_time() -> None:
    data = bytearray(make_batch(3))
    rb.set_max_timestamp_log_append_time(data, 0, len(data), 123_456)
    header = rb.validate_batch(data)
    assert header.is_log_append_time
    assert header.max_timestamp == 123_456
    assert [r.timestamp for r in decode_records(data)] == [123_456] * 3


def test_every_error_is_a_records_error() -> None:
    for cls in (TruncatedBatchError, CorruptBatchError, BatchTooLargeError):
        assert issubclass(cls, RecordsError)
