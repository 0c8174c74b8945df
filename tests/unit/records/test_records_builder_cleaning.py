"""The builder features the log cleaner uses: explicit offset deltas, a kept last offset
delta, the delete horizon, and empty batches."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidelog.records import Compression, decode_records, validate_batch
from tidelog.records.batch import (
    CONTROL_MASK,
    DELETE_HORIZON_MASK,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_MASK,
)
from tidelog.records.builder import BatchBuilder, build_empty_batch


def test_explicit_offset_deltas_and_last_offset_delta() -> None:
    builder = BatchBuilder(base_offset=100, last_offset_delta=9)
    builder.append(b"a", b"1", timestamp=5, offset_delta=2)
    builder.append(b"b", None, timestamp=7, offset_delta=5)
    data = builder.close()
    header = validate_batch(data)
    assert (header.base_offset, header.last_offset_delta, header.record_count) == (100, 9, 2)
    assert (header.base_timestamp, header.max_timestamp) == (5, 7)
    assert [(r.offset, r.key, r.value, r.timestamp) for r in decode_records(data)] == [
        (102, b"a", b"1", 5),
        (105, b"b", None, 7),
    ]


def test_offset_deltas_must_rise_and_stay_within_the_last_delta() -> None:
    builder = BatchBuilder(last_offset_delta=3)
    builder.append(b"a", b"1", timestamp=1, offset_delta=1)
    with pytest.raises(ValueError, match="above the previous"):
        builder.append(b"a", b"1", timestamp=1, offset_delta=1)
    with pytest.raises(ValueError, match="last offset delta"):
        builder.append(b"a", b"1", timestamp=1, offset_delta=4)
    builder.append(b"a", b"1", timestamp=1)  # the next delta: 2
    assert [r.offset for r in decode_records(builder.close())] == [1, 2]
    with pytest.raises(ValueError):
        BatchBuilder(last_offset_delta=-1)


@pytest.mark.parametrize("codec", list(Compression))
def test_delete_horizon_replaces_base_timestamp_not_record_timestamps(codec: Compression) -> None:
    builder = BatchBuilder(compression=codec, delete_horizon_ms=9_000)
    builder.append(b"a", None, timestamp=1_000)
    builder.append(b"b", b"x", [("h", b"v")], timestamp=1_500, offset_delta=3)
    data = builder.close()
    header = validate_batch(data)
    assert header.has_delete_horizon and header.attributes & DELETE_HORIZON_MASK
    assert header.base_timestamp == 9_000
    assert header.max_timestamp == 1_500
    assert header.compression == codec
    records = decode_records(data)
    assert [(r.offset, r.timestamp, r.headers) for r in records] == [
        (0, 1_000, ()),
        (3, 1_500, (("h", b"v"),)),
    ]


def test_empty_batch_keeps_offsets_producer_and_flags() -> None:
    data = build_empty_batch(
        base_offset=40,
        last_offset_delta=4,
        timestamp=1234,
        partition_leader_epoch=3,
        producer_id=77,
        producer_epoch=2,
        base_sequence=10,
        attributes=int(Compression.ZSTD) | TIMESTAMP_TYPE_MASK | TRANSACTIONAL_MASK,
    )
    header = validate_batch(data)
    assert header.size == len(data) == 61
    assert (header.base_offset, header.last_offset, header.record_count) == (40, 44, 0)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (77, 2, 10)
    assert header.last_sequence == 14
    assert header.partition_leader_epoch == 3
    assert header.compression == 0
    assert header.is_log_append_time and header.is_transactional
    assert not header.attributes & CONTROL_MASK
    assert (header.base_timestamp, header.max_timestamp) == (1234, 1234)
    assert decode_records(data) == []


@given(
    kept=st.lists(st.booleans(), min_size=1, max_size=30).filter(any),
    codec=st.sampled_from(list(Compression)),
)
def test_any_subset_of_records_round_trips_with_its_offsets(
    kept: list[bool], codec: Compression
) -> None:
    builder = BatchBuilder(compression=codec, base_offset=1000, last_offset_delta=len(kept) - 1)
    for delta, keep in enumerate(kept):
        if keep:
            builder.append(b"k%d" % delta, b"v%d" % delta, timestamp=delta, offset_delta=delta)
    data = builder.close()
    header = validate_batch(data)
    assert header.last_offset == 1000 + len(kept) - 1
    got = [(r.offset, r.key, r.timestamp) for r in decode_records(data)]
    assert got == [(1000 + d, b"k%d" % d, d) for d, keep in enumerate(kept) if keep]
