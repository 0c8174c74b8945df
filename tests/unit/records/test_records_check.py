"""check_records accepts exactly the batches the reader can decode, building nothing."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.records import (
    BatchBuilder,
    Compression,
    CorruptBatchError,
    RecordsError,
    check_records,
    decode_records,
    iter_records,
)
from tidelog.records.batch import parse_header
from tidelog.records.reader import SHORT_TIMESTAMP_DELTAS

from .test_records_codec import batch_st, build, forged, with_crc


def _outcome(fn: object, data: bytes) -> str:
    try:
        fn(data)  # type: ignore[operator]
    except RecordsError:
        return "refused"
    return "accepted"


@given(batch_st, st.sampled_from(list(Compression)))
def test_valid_batches_pass(spec: dict, codec: Compression) -> None:  # type: ignore[type-arg]
    check_records(build(spec, codec))


@given(batch_st, st.sampled_from(list(Compression)))
def test_timestamp_bounds_hold_every_record(spec: dict, codec: Compression) -> None:  # type: ignore[type-arg]
    """The bounds returned cover every record's timestamp delta and never narrow past the
    one- and two-byte deltas the walk leaves undecoded. (CreateTime batches: a LogAppendTime
    batch reports its max timestamp for every record, whatever deltas it holds.)"""
    batch = build({**spec, "log_append_time": None}, codec)
    bounds = check_records(batch)
    base = parse_header(batch).base_timestamp
    assert bounds.lowest <= SHORT_TIMESTAMP_DELTAS.lowest
    assert bounds.highest >= SHORT_TIMESTAMP_DELTAS.highest
    for record in iter_records(batch):
        assert bounds.lowest <= record.timestamp - base <= bounds.highest


def test_long_timestamp_deltas_are_bounded_exactly() -> None:
    """Deltas of three bytes or more are decoded: the bounds are their extremes, also past
    a uniform run."""
    builder = BatchBuilder()
    deltas = [0] * 20 + [-7_200_000, 5, 60_001, -9000] + [1] * 20
    for delta in deltas:
        builder.append(b"k", b"v", timestamp=1_700_000_000_000 + delta)
    assert tuple(check_records(builder.close())) == (-7_200_000, 60_001)
    small = BatchBuilder()
    for delta in (0, -8000, 8000):
        small.append(b"k", b"v", timestamp=1_700_000_000_000 + delta)
    assert check_records(small.close()) == SHORT_TIMESTAMP_DELTAS


@settings(max_examples=300)
@given(batch_st, st.data())
def test_agrees_with_the_reader_on_damaged_records(spec: dict, data: st.DataObject) -> None:  # type: ignore[type-arg]
    """Damage inside the records block (CRC fixed up, so only the records are wrong): both
    entry points refuse or accept the same batches."""
    good = bytearray(build(spec, Compression.NONE))
    at = data.draw(st.integers(61, len(good) - 1))
    good[at] = data.draw(st.integers(0, 255))
    damaged = with_crc(good)
    assert _outcome(check_records, damaged) == _outcome(decode_records, damaged)


@pytest.mark.parametrize(
    "records, count, why",
    [
        # key length 5 in a record of 7 bytes
        (bytes([14, 0, 0, 0, 10, 0, 0, 0]), 1, "overrun|past the end"),
        # key length 2 inside the record, then the value runs past its end
        (bytes([14, 0, 0, 0, 4, 65, 65, 20]), 1, "overrun|past the end"),
        # two records, offset deltas 0 then 0
        (bytes([12, 0, 0, 0, 1, 1, 0]) * 2, 2, "offset delta"),
        # header count -1
        (bytes([12, 0, 0, 0, 1, 1, 1]), 1, "headers"),
        # declared count larger than the records present
        (bytes([12, 0, 0, 0, 1, 1, 0]), 2, "past the end|holds at most"),
    ],
)
def test_refuses_what_consumers_could_not_parse(records: bytes, count: int, why: str) -> None:
    batch = forged(records, count, last_offset_delta=count - 1)
    with pytest.raises(CorruptBatchError, match=why):
        check_records(batch)
    with pytest.raises(CorruptBatchError):
        decode_records(batch)


def test_compressed_batches_are_checked_after_decompression() -> None:
    builder = BatchBuilder(compression=Compression.ZSTD)
    for n in range(50):
        builder.append(b"k%d" % n, b"value" * n, (("h", b"x"),), timestamp=n)
    check_records(builder.close())
