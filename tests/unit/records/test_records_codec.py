"""Building and reading record batches: pinned bytes, round trips, an independent reader."""

from __future__ import annotations

import contextlib
import struct
from typing import NamedTuple

import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.records.readers import read_batch as kio_read_batch

from tidelog.records import batch as rb
from tidelog.records.builder import BatchBuilder
from tidelog.records.compression import Compression
from tidelog.records.errors import (
    CorruptBatchError,
    RecordsError,
    TruncatedBatchError,
    UnsupportedCompressionError,
)
from tidelog.records.reader import (
    Record,
    decode_columns,
    decode_records,
    decode_rows,
    iter_records,
    records_block,
)

# Two records written field by field from the RecordBatch v2 definition.
VECTOR_FIELDS = [
    ("base_offset", "0000000000000000"),
    ("batch_length = 73", "00000049"),
    ("partition_leader_epoch = -1", "ffffffff"),
    ("magic", "02"),
    ("crc", "e36d6de4"),
    ("attributes", "0000"),
    ("last_offset_delta", "00000001"),
    ("base_timestamp = 1000", "00000000000003e8"),
    ("max_timestamp = 5000", "0000000000001388"),
    ("producer_id = -1", "ffffffffffffffff"),
    ("producer_epoch = -1", "ffff"),
    ("base_sequence = -1", "ffffffff"),
    ("record_count", "00000002"),
    # record 0: length 15, attributes 0, timestamp delta 0, offset delta 0,
    # key "k", value "v", 2 headers: ("h", "x") and ("n", null)
    ("length", "1e"),
    ("attributes", "00"),
    ("timestamp_delta", "00"),
    ("offset_delta", "00"),
    ("key", "02" + "6b"),
    ("value", "02" + "76"),
    ("header_count", "04"),
    ("header h", "02" + "68" + "02" + "78"),
    ("header n", "02" + "6e" + "01"),
    # record 1: length 7, timestamp delta 4000 (zigzag 8000 = c0 3e), offset delta 1,
    # null key, null value, no headers
    ("length", "0e"),
    ("attributes", "00"),
    ("timestamp_delta", "c03e"),
    ("offset_delta", "02"),
    ("key", "01"),
    ("value", "01"),
    ("header_count", "00"),
]
VECTOR = bytes.fromhex("".join(h for _, h in VECTOR_FIELDS))


def vector_builder() -> BatchBuilder:
    builder = BatchBuilder()
    builder.append(b"k", b"v", [("h", b"x"), ("n", None)], timestamp=1000)
    builder.append(None, None, timestamp=5000)
    return builder


class Row(NamedTuple):
    """A caller's record type for decode_rows."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


def test_vector_crc_is_the_crc32c_of_attributes_to_end() -> None:
    assert len(VECTOR) == 85
    assert crc32c(VECTOR[21:]) == 0xE36D6DE4


def test_builder_writes_the_vector() -> None:
    assert vector_builder().close() == VECTOR


def test_reader_reads_the_vector() -> None:
    assert decode_records(VECTOR) == [
        Record(0, 1000, b"k", b"v", (("h", b"x"), ("n", None)), 0),
        Record(1, 5000, None, None, (), 0),
    ]
    columns = decode_columns(VECTOR)
    assert columns.offsets == [0, 1]
    assert columns.timestamps == [1000, 5000]
    assert columns.keys == [b"k", None]
    assert columns.values == [b"v", None]
    assert columns.headers == [(("h", b"x"), ("n", None)), ()]


def test_builder_header_fields() -> None:
    builder = BatchBuilder(
        compression=Compression.GZIP,
        base_offset=0,
        transactional=True,
        log_append_time=77_000,
    )
    builder.set_producer(1234, 5, 42)
    builder.append(b"a", b"1", timestamp=10)
    builder.append(b"b", b"2", timestamp=30)
    builder.append(b"c", b"3", timestamp=20)
    assert builder.record_count == 3
    data = builder.close()
    header = rb.validate_batch(data)
    assert header.attributes == 0x01 | 0x08 | 0x10
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (1234, 5, 42)
    assert header.base_timestamp == 10
    assert header.max_timestamp == 77_000
    assert header.last_offset_delta == 2
    assert [r.timestamp for r in decode_records(data)] == [77_000] * 3
    with pytest.raises(ValueError):
        builder.append(b"late", None, timestamp=0)


def test_create_time_max_timestamp_is_the_largest() -> None:
    builder = BatchBuilder()
    for ts in (50, 10, 90, 20):
        builder.append(None, b"v", timestamp=ts)
    data = builder.close()
    header = rb.parse_header(data)
    assert (header.base_timestamp, header.max_timestamp) == (50, 90)
    assert [r.timestamp for r in decode_records(data)] == [50, 10, 90, 20]


def test_builder_refuses_bad_input() -> None:
    with pytest.raises(ValueError):
        BatchBuilder().close()
    with pytest.raises(ValueError):
        BatchBuilder(compression=9)
    with pytest.raises(TypeError):
        BatchBuilder().append(None, None, [(b"bytes-key", b"v")], timestamp=0)  # type: ignore[list-item]
    with pytest.raises(ValueError):
        BatchBuilder().append(None, None, timestamp=2**63)


def test_iter_records_is_lazy_and_reports_errors_where_they_are() -> None:
    builder = BatchBuilder()
    for i in range(3):
        builder.append(None, b"%d" % i, timestamp=0)
    data = bytearray(builder.close())
    # Make the third record's value length overrun its record, then fix the CRC.
    last = len(data) - 3  # value length varint of the last record
    assert data[last] == 0x02
    data[last] = 0x10
    struct.pack_into(">I", data, rb.CRC_OFFSET, rb.compute_crc(data, 0, len(data)))
    it = iter_records(data)
    assert next(it).value == b"0"
    assert next(it).value == b"1"
    with pytest.raises(CorruptBatchError):
        next(it)


def test_header_given_skips_validation_but_not_bounds() -> None:
    header = rb.validate_batch(VECTOR)
    assert len(decode_records(VECTOR, header=header)) == 2
    with pytest.raises(TruncatedBatchError):
        decode_records(VECTOR[:-1], header=header)
    assert records_block(VECTOR) == VECTOR[61:]


def test_reads_a_batch_in_the_middle_of_a_buffer() -> None:
    buf = VECTOR + VECTOR
    rb.set_base_offset(bytearray(buf), len(VECTOR), 2)
    assert [r.key for r in decode_records(buf, len(VECTOR))] == [b"k", None]


def with_crc(data: bytearray) -> bytes:
    struct.pack_into(">I", data, rb.CRC_OFFSET, rb.compute_crc(data, 0, len(data)))
    return bytes(data)


def forged(records: bytes, count: int, last_offset_delta: int = 0) -> bytes:
    """A valid header (right length and CRC) around arbitrary record bytes."""
    header = bytearray(VECTOR[:61])
    struct.pack_into(">i", header, 8, 49 + len(records))
    struct.pack_into(">i", header, 23, last_offset_delta)
    struct.pack_into(">i", header, 57, count)
    return with_crc(header + records)


def test_forged_counts_and_lengths_fail_fast() -> None:
    one = bytes.fromhex("0c000000010100")  # minimal record, 7 bytes
    assert decode_records(forged(one, 1))[0].value is None
    with pytest.raises(CorruptBatchError, match="2147483647 records"):
        decode_records(forged(one, 2**31 - 1))
    with pytest.raises(CorruptBatchError):
        decode_records(forged(one, 0))  # bytes after the declared records
    with pytest.raises(CorruptBatchError):
        decode_records(forged(one * 2, 3, 2))  # fewer records than declared
    # key length 2**30 (zigzag varint 80 80 80 80 08)
    huge_key = bytes.fromhex("1400000080808080080100")
    with pytest.raises(CorruptBatchError, match="key of 1073741824 bytes"):
        decode_records(forged(huge_key, 1))
    huge_headers = bytes.fromhex("1400000001018080808008")
    with pytest.raises(CorruptBatchError, match="headers"):
        decode_records(forged(huge_headers, 1))
    negative_key = bytes.fromhex("0c000000030100")  # key length -2
    with pytest.raises(CorruptBatchError, match="key length -2"):
        decode_records(forged(negative_key, 1))
    long_varint = bytes.fromhex("2000008080808080808080808001010100")
    with pytest.raises(CorruptBatchError):
        decode_records(forged(long_varint, 1))


def test_offset_deltas_must_rise_within_last_offset_delta() -> None:
    rec0 = bytes.fromhex("0c000000010100")  # offset delta 0
    rec3 = bytes.fromhex("0c000006010100")  # offset delta 3
    # Gaps are fine (compaction) and so is a last record below last_offset_delta.
    assert [r.offset for r in decode_records(forged(rec0 + rec3, 2, 5))] == [0, 3]
    with pytest.raises(CorruptBatchError, match="offset delta"):
        decode_records(forged(rec3 + rec0, 2, 5))
    with pytest.raises(CorruptBatchError, match="offset delta"):
        decode_records(forged(rec0 + rec0, 2, 5))
    with pytest.raises(CorruptBatchError, match="offset delta"):
        decode_records(forged(rec3, 1, 2))


# ---------------------------------------------------------------- property tests

headers_st = st.lists(st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=8)), max_size=3)
record_st = st.tuples(
    st.none() | st.binary(max_size=40),
    st.none() | st.binary(max_size=200),
    headers_st,
    st.integers(0, 2**42),
)
batch_st = st.fixed_dictionaries(
    {
        "records": st.lists(record_st, min_size=1, max_size=12),
        "producer_id": st.integers(-1, 2**63 - 1),
        "producer_epoch": st.integers(-1, 2**15 - 1),
        "base_sequence": st.integers(-1, 2**31 - 1),
        "base_offset": st.integers(0, 2**62),
        "transactional": st.booleans(),
        "log_append_time": st.none() | st.integers(0, 2**42),
    }
)


def build(spec: dict, codec: Compression) -> bytes:  # type: ignore[type-arg]
    builder = BatchBuilder(
        compression=codec,
        base_offset=spec["base_offset"],
        producer_id=spec["producer_id"],
        producer_epoch=spec["producer_epoch"],
        base_sequence=spec["base_sequence"],
        transactional=spec["transactional"],
        log_append_time=spec["log_append_time"],
    )
    for key, value, headers, ts in spec["records"]:
        builder.append(key, value, headers, timestamp=ts)
    return builder.close()


@settings(max_examples=60, deadline=None)
@given(batch_st, st.sampled_from(list(Compression)))
def test_round_trip(spec: dict, codec: Compression) -> None:  # type: ignore[type-arg]
    data = build(spec, codec)
    header = rb.validate_batch(data)
    assert header.compression == codec
    assert header.record_count == len(spec["records"])
    assert header.base_offset == spec["base_offset"]
    assert header.producer_id == spec["producer_id"]
    assert header.producer_epoch == spec["producer_epoch"]
    assert header.base_sequence == spec["base_sequence"]
    assert header.is_transactional == spec["transactional"]
    lat = spec["log_append_time"]
    expected = [
        Record(
            spec["base_offset"] + i,
            ts if lat is None else lat,
            key,
            value,
            tuple(headers),
            0,
        )
        for i, (key, value, headers, ts) in enumerate(spec["records"])
    ]
    assert decode_records(data) == expected
    assert list(iter_records(data)) == expected
    rows = decode_rows(data, 0, Row, "t", 3)
    assert rows == [Row("t", 3, r.offset, r.timestamp, r.key, r.value, r.headers) for r in expected]
    assert all(type(row) is Row for row in rows)


@settings(max_examples=60, deadline=None)
@given(batch_st)
def test_independent_reader_agrees(spec: dict) -> None:  # type: ignore[type-arg]
    spec = {**spec, "log_append_time": None}
    data = build(spec, Compression.NONE)
    theirs, size = kio_read_batch(data, 0)
    assert size == len(data)
    assert theirs.base_offset == spec["base_offset"]
    assert theirs.producer_id == spec["producer_id"]
    assert theirs.last_offset_delta == len(spec["records"]) - 1
    ours = decode_records(data)
    assert len(theirs.records) == len(ours)
    for mine, other in zip(ours, theirs.records, strict=True):
        assert mine.offset == other.offset
        assert mine.key == other.key
        assert mine.value == other.value
        # the other reader keeps header keys as bytes and timestamps in whole seconds
        assert [(k.encode(), v) for k, v in mine.headers] == [
            (h.key, h.value) for h in other.headers
        ]
        assert mine.timestamp // 1000 == int(other.timestamp.timestamp())


@settings(max_examples=40, deadline=None)
@given(batch_st, st.sampled_from(list(Compression)), st.data())
def test_any_flipped_byte_in_the_crc_range_is_detected(
    spec: dict,  # type: ignore[type-arg]
    codec: Compression,
    data: st.DataObject,
) -> None:
    batch = bytearray(build(spec, codec))
    where = data.draw(st.integers(rb.CRC_START, len(batch) - 1))
    xor = data.draw(st.integers(1, 255))
    batch[where] ^= xor
    # Mostly the CRC check; a flip that makes a header field illegal is caught first.
    with pytest.raises(CorruptBatchError):
        rb.validate_batch(batch)


ENTRY_POINTS = [
    lambda b: rb.parse_header(b),
    lambda b: rb.peek_batch_size(b),
    lambda b: rb.validate_batch(b),
    lambda b: list(rb.iter_batches(b)),
    lambda b: decode_records(b),
    lambda b: list(iter_records(b)),
    lambda b: decode_columns(b),
    lambda b: decode_rows(b, 0, Row, "t", 0),
    lambda b: records_block(b),
    lambda b: decode_records(b, verify_crc=False),
]


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_raise_only_records_errors(data: bytes) -> None:
    for entry in ENTRY_POINTS:
        with contextlib.suppress(RecordsError):
            entry(data)


@settings(max_examples=300, deadline=None)
@given(batch_st, st.sampled_from(list(Compression)), st.data())
def test_corrupted_batches_with_a_right_crc_raise_only_records_errors(
    spec: dict,  # type: ignore[type-arg]
    codec: Compression,
    data: st.DataObject,
) -> None:
    batch = bytearray(build(spec, codec))
    for _ in range(data.draw(st.integers(1, 4))):
        where = data.draw(st.integers(rb.ATTRIBUTES_OFFSET, len(batch) - 1))
        batch[where] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        cut = data.draw(st.integers(rb.HEADER_SIZE, len(batch)))
        del batch[cut:]
        struct.pack_into(">i", batch, 8, len(batch) - 12)
    fixed = with_crc(batch)
    for entry in ENTRY_POINTS:
        with contextlib.suppress(RecordsError):
            entry(fixed)


def test_empty_batch_left_by_compaction_decodes_to_nothing() -> None:
    # Compaction may keep a batch with no records (to retain producer state).
    assert decode_records(forged(b"", 0, 4)) == []
    assert decode_columns(forged(b"", 0, 4)).offsets == []


def test_unknown_codec_in_a_batch_is_refused() -> None:
    data = bytearray(VECTOR)
    struct.pack_into(">h", data, rb.ATTRIBUTES_OFFSET, 0x05)
    with pytest.raises(UnsupportedCompressionError):
        decode_records(with_crc(data))


def test_header_keys_with_invalid_utf8_are_replaced() -> None:
    record = bytes.fromhex("1400000001010204ff4101")
    (decoded,) = decode_records(forged(record, 1))
    assert decoded.headers == (("\ufffdA", None),)


def test_offset_deltas_of_two_and_three_bytes_decode() -> None:
    # Deltas from 64 take two varint bytes and from 8192 three: each length is read right.
    builder = BatchBuilder(base_offset=100)
    for i in range(9000):
        builder.append(None, b"%d" % i, timestamp=1)
    data = builder.close()
    records = decode_records(data)
    assert [r.offset for r in records] == list(range(100, 9100))
    assert [r.value for r in records] == [b"%d" % i for i in range(9000)]
    rows = decode_rows(data, 0, Row, "t", 0)
    assert [row.offset for row in rows] == list(range(100, 9100))
