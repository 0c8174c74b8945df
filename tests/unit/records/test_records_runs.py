"""Uniform runs (tidelog.records.runs) against the record-by-record loop.

Batches of records sharing one layout are decoded and checked by strided slices; these tests
hold that path to the general loop, which they reach by disabling runs: the same records for
good batches, of every layout the fast path knows (null, empty and sized keys and values;
timestamp deltas of one and two bytes, crossing sizes inside a batch; offset deltas of one to
three bytes; LogAppendTime), and the same verdict for batches with any byte changed (the CRC
made right again, so that the records themselves are judged).
"""

from __future__ import annotations

import struct
from typing import Any, NamedTuple

import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.records import batch as rb
from tidelog.records import reader
from tidelog.records.builder import BatchBuilder
from tidelog.records.errors import CorruptBatchError
from tidelog.records.reader import check_records, decode_records, decode_rows, iter_records
from tidelog.records.runs import MIN_RUN, find_run


class Row(NamedTuple):
    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


def uniform_batch(
    count: int,
    key_len: int | None,
    value_len: int | None,
    ms_per_64: int,
    base_offset: int = 0,
    log_append_time: int | None = None,
) -> bytes:
    builder = BatchBuilder(base_offset=base_offset, log_append_time=log_append_time)
    timestamp = 1_700_000_000_000
    for i in range(count):
        key = None if key_len is None else bytes((i + j) % 256 for j in range(key_len))
        value = None if value_len is None else bytes((i * 7 + j) % 256 for j in range(value_len))
        # rising timestamps: their deltas cross from one varint byte to two in longer batches
        builder.append(key, value, timestamp=timestamp + i * ms_per_64 // 64)
    return builder.close()


def all_ways(data: bytes) -> list[Any]:
    """What each entry point makes of ``data`` (an exception's type when it raises)."""
    out: list[Any] = []
    for entry in (
        lambda: decode_records(data, verify_crc=False),
        lambda: list(iter_records(data, verify_crc=False)),
        lambda: decode_rows(data, 0, Row, "t", 1, verify_crc=False),
        lambda: check_records(data),
    ):
        try:
            out.append(entry())
        except CorruptBatchError:
            out.append(CorruptBatchError)
    return out


layouts = st.tuples(
    st.integers(1, 400),  # records
    st.one_of(st.none(), st.integers(0, 140)),  # key length
    st.one_of(st.none(), st.integers(0, 200)),  # value length
    st.integers(0, 60),  # milliseconds per 64 records
    st.integers(0, 1 << 40),  # base offset
    st.booleans(),  # LogAppendTime
)


@settings(max_examples=150, deadline=None)
@given(layouts)
def test_uniform_batches_decode_as_the_general_loop_reads_them(layout: tuple[Any, ...]) -> None:
    count, key_len, value_len, ms, base, append_time = layout
    data = uniform_batch(count, key_len, value_len, ms, base, 1_800_000 if append_time else None)
    fast = all_ways(data)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(reader, "find_run", lambda *args: None)
        slow = all_ways(data)
    assert fast == slow
    records = fast[0]
    assert [r.offset for r in records] == list(range(base, base + count))
    if count >= MIN_RUN:  # the fast path was taken, not only agreed with
        header = rb.validate_batch(data)
        block = reader.records_block(data, 0, header)
        assert find_run(block, 0, 0, -1, count, count - 1) is not None
    assert all(r.headers == () for r in records)


def with_byte(data: bytes, where: int, value: int) -> bytes:
    changed = bytearray(data)
    changed[where] = value
    struct.pack_into(">I", changed, rb.CRC_OFFSET, crc32c(bytes(changed[rb.CRC_START :])))
    return bytes(changed)


@settings(max_examples=300, deadline=None)
@given(layouts, st.data())
def test_a_changed_byte_gets_the_general_loops_verdict(
    layout: tuple[Any, ...], draw: st.DataObject
) -> None:
    count, key_len, value_len, ms, base, _ = layout
    data = uniform_batch(max(count, MIN_RUN * 3), key_len, value_len, ms, base)
    where = draw.draw(st.integers(rb.HEADER_SIZE, len(data) - 1))
    value = draw.draw(st.integers(0, 255))
    changed = with_byte(data, where, value)
    fast = all_ways(changed)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(reader, "find_run", lambda *args: None)
        slow = all_ways(changed)
    assert fast == slow


def test_runs_cover_a_uniform_batch_across_every_varint_size() -> None:
    # 9,000 records: offset deltas of one, two and three bytes, timestamp deltas of one and
    # two bytes, so the batch is several runs, each found.
    data = uniform_batch(9000, 8, 100, 1)  # timestamp deltas reach 140 ms
    header = rb.validate_batch(data)
    block = reader.records_block(data, 0, header)
    p, index, runs = 0, 0, 0
    while index < header.record_count:
        run = find_run(block, p, index, index - 1, header.record_count, header.last_offset_delta)
        assert run is not None, f"no run at record {index}"
        p, index, runs = run.end, index + run.records, runs + 1
    assert p == len(block) and runs >= 4
    assert [r.offset for r in decode_records(data)] == list(range(9000))


def test_a_bad_record_inside_a_run_ends_it_and_is_reported_with_its_index() -> None:
    data = uniform_batch(200, None, 10, 0)
    header = rb.validate_batch(data)
    # Record 120's offset delta (the byte after its length, attributes and timestamp) is
    # made to repeat record 119's: the run must stop at 120, and the loop must name it.
    record_size = 1 + 1 + 1 + 2 + 1 + 1 + 10 + 1  # length .. header count (delta 2 bytes)
    start_of_64 = 64 * (1 + 1 + 1 + 1 + 1 + 1 + 10 + 1)
    where = rb.HEADER_SIZE + start_of_64 + (120 - 64) * record_size + 3
    assert data[where] == ((2 * 120) & 0x7F) | 0x80
    changed = with_byte(data, where, ((2 * 119) & 0x7F) | 0x80)
    with pytest.raises(CorruptBatchError, match="record 120"):
        decode_records(changed)
    with pytest.raises(CorruptBatchError, match="record 120"):
        check_records(changed)
    good = []
    with pytest.raises(CorruptBatchError):
        for record in iter_records(changed):
            good.append(record.offset)
    assert good == list(range(120))  # every good record before the bad one
    assert header.record_count == 200


def test_mixed_batches_use_runs_where_they_are_uniform() -> None:
    builder = BatchBuilder()
    for i in range(500):
        headers = [("h", b"x")] if i in (100, 101) else []
        builder.append(None, b"v" * 20, headers, timestamp=5)
    data = builder.close()
    records = decode_records(data)
    assert [r.headers for r in records[99:103]] == [(), (("h", b"x"),), (("h", b"x"),), ()]
    assert [r.offset for r in records] == list(range(500))
    check_records(data)
