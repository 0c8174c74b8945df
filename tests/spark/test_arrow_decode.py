"""decode_chunk against the reference record decoder: every field, offset window, corruption."""

from __future__ import annotations

import contextlib

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.records import BatchBuilder, Compression, RecordsError, decode_records, iter_batches
from tidelog.spark.arrow_decode import arrow_schema, decode_chunk

blobs = st.none() | st.binary(max_size=300)
header_lists = st.lists(
    st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=20)), max_size=3
)
records = st.tuples(blobs, blobs, header_lists, st.integers(-(10**6), 10**6), st.integers(1, 500))


def build_chunk(batches: list[tuple[int, bool, list[tuple]]]) -> bytes:
    """Batches of (compression, log append time, records) at consecutive offsets."""
    out = []
    base = 0
    for codec, append_time, recs in batches:
        builder = BatchBuilder(
            compression=Compression(codec),
            base_offset=base,
            log_append_time=1_700_000_999_000 if append_time else None,
        )
        delta = -1
        for key, value, headers, ts, gap in recs:
            delta += gap
            builder.append(
                key, value, headers, timestamp=1_700_000_000_000 + ts, offset_delta=delta
            )
        out.append(builder.close())
        base += delta + 1
    return b"".join(out)


def reference(data: bytes, start: int, end: int | None) -> list[tuple]:
    rows = []
    for pos, header in iter_batches(data):
        for r in decode_records(data, pos, header=header):
            if r.offset >= start and (end is None or r.offset < end):
                ts_type = 1 if header.is_log_append_time else 0
                rows.append((r.key, r.value, r.offset, r.timestamp, ts_type, list(r.headers)))
    return rows


def actual(batch: pa.RecordBatch | None, *, headers: bool = True) -> list[tuple]:
    if batch is None:
        return []
    d = batch.to_pydict()
    return [
        (
            d["key"][i],
            d["value"][i],
            d["offset"][i],
            int(d["timestamp"][i].timestamp() * 1000),
            d["timestampType"][i],
        )
        + (([(h["key"], h["value"]) for h in d["headers"][i]],) if headers else ())
        for i in range(batch.num_rows)
    ]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([0, 1, 2, 3, 4]),
            st.booleans(),
            st.lists(records, min_size=1, max_size=12),
        ),
        min_size=1,
        max_size=4,
    ),
    st.integers(0, 3000),
    st.none() | st.integers(0, 4000),
)
def test_matches_reference_decoder(batches, start, end) -> None:
    data = build_chunk(batches)
    decoded = decode_chunk(data, "t", 3, start, end, include_headers=True)
    assert actual(decoded.batch) == reference(data, start, end)
    last = max(h.next_offset for _, h in iter_batches(data))
    assert decoded.next_offset == max(start, last)
    if decoded.batch is not None:
        assert decoded.batch.schema == arrow_schema(True)
        assert set(decoded.batch.column("topic").to_pylist()) == {"t"}
        assert set(decoded.batch.column("partition").to_pylist()) == {3}


def test_cut_last_batch_is_left_for_the_next_fetch() -> None:
    data = build_chunk([(0, False, [(b"k", b"v" * 50, [], 0, 1)] * 3)] * 2)
    first_size = len(build_chunk([(0, False, [(b"k", b"v" * 50, [], 0, 1)] * 3)]))
    decoded = decode_chunk(data[: first_size + 20], "t", 0, 0, None)
    assert decoded.batch is not None
    assert decoded.batch.column("offset").to_pylist() == [0, 1, 2]
    assert decoded.next_offset == 3


def test_headers_column_absent_without_include_headers() -> None:
    data = build_chunk([(0, False, [(None, b"v", [("h", b"x")], 0, 1)])])
    decoded = decode_chunk(data, "t", 0, 0, None)
    assert decoded.batch is not None
    assert decoded.batch.schema.names == arrow_schema(False).names
    assert decoded.batch.column("value").to_pylist() == [b"v"]


@pytest.mark.parametrize(
    ("where", "structural"),
    [
        (61, True),  # first record's length
        (64, True),  # its offset delta
        (65, True),  # its key length
        (62, False),  # its attributes (unused by Kafka: only the CRC notices)
        (70, False),  # a key byte
        (-1, False),  # the last record's header count
    ],
)
def test_corrupt_records_raise_records_error(where: int, structural: bool) -> None:
    data = bytearray(build_chunk([(0, False, [(b"key", b"value" * 5, [], 5, 1)] * 4)]))
    data[where] ^= 0x5A
    with pytest.raises(RecordsError):
        decode_chunk(bytes(data), "t", 0, 0, None)
    if structural:
        with pytest.raises(RecordsError):
            decode_chunk(bytes(data), "t", 0, 0, None, verify_crc=False)


@settings(max_examples=200, deadline=None)
@given(st.integers(61, 400), st.integers(1, 255))
def test_any_flipped_byte_raises_records_error_or_decodes(where: int, mask: int) -> None:
    data = bytearray(build_chunk([(0, False, [(b"key", b"value" * 5, [("a", b"b")], 5, 1)] * 6)]))
    if where >= len(data):
        return
    data[where] ^= mask
    with contextlib.suppress(RecordsError):
        decode_chunk(bytes(data), "t", 0, 0, None, verify_crc=False, include_headers=True)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([0, 1, 4]),
            st.integers(33, 400),  # records in the batch
            st.integers(0, 140),  # value size: the length varint widens at 64 bytes
            st.booleans(),  # keys of one size, or of growing size
            st.integers(0, 90),  # timestamp step (ms): the delta varint widens on the way
            st.sets(st.integers(0, 399), max_size=3),  # records after an offset gap
            st.sets(st.integers(0, 399), max_size=2),  # records with a longer value
        ),
        min_size=1,
        max_size=3,
    ),
    st.integers(0, 500),
)
def test_long_batches_of_similar_records_match_reference(batches, start) -> None:
    """Batches long enough for the lane-wise placing of records, with every way records of
    one batch can differ in size: delta varint widths, gaps, odd records."""
    shaped = []
    for codec, count, size, same_keys, ts_step, gaps, odd in batches:
        recs = [
            (
                b"k" * (3 if same_keys else 1 + i % 70),
                b"v" * (size + (37 if i in odd else 0)),
                [],
                i * ts_step,
                2 if i in gaps else 1,
            )
            for i in range(count)
        ]
        shaped.append((codec, False, recs))
    data = build_chunk(shaped)
    decoded = decode_chunk(data, "t", 0, start, None)
    assert actual(decoded.batch, headers=False) == [r[:5] for r in reference(data, start, None)]


def test_varints_longer_than_four_bytes_decode_as_the_reference() -> None:
    """Timestamp deltas of 5 to 10 bytes (days apart, either way) and a 1 MiB value, whose
    length varint takes 4 bytes, beside records of one-byte fields."""
    far = [10**9, -(10**9), 2**40, -(2**45), 3, 2**27, -(2**27)]
    recs: list[tuple[bytes | None, bytes, list[tuple[str, bytes]], int, int]] = [
        (b"k", b"v" * (i % 3), [], ts, 1) for i, ts in enumerate(far)
    ]
    recs.append((None, b"x" * (1 << 20), [], 2**33, 1))
    data = build_chunk([(0, False, list(recs)), (0, True, list(recs[:2]))])
    decoded = decode_chunk(data, "t", 0, 0, None)
    assert actual(decoded.batch, headers=False) == [r[:5] for r in reference(data, 0, None)]


@pytest.mark.parametrize("count", [40, 5000])
def test_guess_that_fails_late_falls_back_to_the_walk(count: int) -> None:
    """Records of one size except the last: the whole-batch guess places all but that one
    and its check fails; the records are placed again one by one, and decoded correctly."""
    recs: list[tuple[bytes, bytes, list[tuple[str, bytes]], int, int]] = [
        (b"key", b"v" * 20, [], i, 1) for i in range(count)
    ]
    recs[-1] = (b"key", b"v" * 90, [], count, 1)
    data = build_chunk([(0, False, list(recs)), (0, False, list(recs))])
    decoded = decode_chunk(data, "t", 0, 0, None)
    assert actual(decoded.batch, headers=False) == [r[:5] for r in reference(data, 0, None)]


def _spy_uniform(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Record whether each chunk was read by the uniform path."""
    from tidelog.spark import arrow_decode

    taken: list[bool] = []
    real = arrow_decode._uniform_fields

    def spy(*args: object) -> object:
        fields = real(*args)  # type: ignore[arg-type]
        taken.append(fields is not None)
        return fields

    monkeypatch.setattr(arrow_decode, "_uniform_fields", spy)
    return taken


@pytest.mark.parametrize("key", [None, b"user-0042"])
@pytest.mark.parametrize(("ts_step", "attempts"), [(0, [True]), (3, [False, True])])
def test_records_of_one_size_are_read_as_rows(
    monkeypatch: pytest.MonkeyPatch, key: bytes | None, ts_step: int, attempts: list[bool]
) -> None:
    """A producer's records with keys and values of one size, over offset deltas whose
    varints widen (at 64 and 8192) and timestamps that stay or move: read by the uniform
    path, and equal to the reference decoder. Moving timestamps widen their delta varints
    too, which the whole-batch guess does not foresee: the records are then placed by the
    general placing and the runs read as rows after all."""
    taken = _spy_uniform(monkeypatch)
    recs = [(key, b"%099d" % i, [], i * ts_step, 1) for i in range(9000)]
    data = build_chunk([(0, False, recs[:8500]), (0, True, recs[:200]), (1, False, recs[:300])])
    decoded = decode_chunk(data, "t", 0, 0, None, include_headers=True)
    assert taken == attempts
    assert actual(decoded.batch) == reference(data, 0, None)


@pytest.mark.parametrize(
    "odd",
    [
        (b"key4", b"v" * 11, []),  # the key one byte longer, the value one byte shorter
        (None, b"v" * 12, [("a", b"")]),  # no key, but a header
    ],
)
def test_a_record_of_the_same_size_but_another_layout_is_read_right(
    monkeypatch: pytest.MonkeyPatch, odd: tuple[bytes | None, bytes, list[tuple[str, bytes]]]
) -> None:
    """A record as long as the rest of its run whose fields lie elsewhere: the uniform path
    must notice it and leave the chunk to the general path."""
    from tidelog.records.batch import HEADER_SIZE
    from tidelog.spark.arrow_decode import _walk

    taken = _spy_uniform(monkeypatch)
    recs = [(b"key", b"v" * 12, [], i, 1) for i in range(200)]
    recs[150] = (*odd, 150, 1)
    data = build_chunk([(0, False, recs)])
    starts = _walk(data, HEADER_SIZE, len(data), 0)
    assert starts[151] - starts[150] == starts[150] - starts[149]  # the same size
    decoded = decode_chunk(data, "t", 0, 0, None, include_headers=True)
    assert taken and not any(taken)
    assert actual(decoded.batch) == reference(data, 0, None)


def test_a_nonzero_header_count_in_a_run_is_not_read_as_zero() -> None:
    """The header count of a record in the middle of a uniform run, corrupted (no CRC
    check): not read as a record without headers, so its (missing) header is refused."""
    recs = [(None, b"v" * 30, [], i, 1) for i in range(300)]
    data = bytearray(build_chunk([(0, False, recs)]))
    # length, attributes, timestamp and offset deltas (2 bytes each from 64 on), key length,
    # value length, value, header count
    record_size = 1 + 1 + 2 + 2 + 1 + 1 + 30 + 1
    # The last byte of the last record is the header count; the one before it ends the
    # value; go back to a record in the middle.
    where = len(data) - 1 - 100 * record_size
    assert data[where] == 0 and data[where - 1] == ord("v")
    data[where] = 1
    with pytest.raises(RecordsError):
        decode_chunk(bytes(data), "t", 0, 0, None, verify_crc=False, include_headers=True)


def test_batches_of_aborted_transactions_are_left_out() -> None:
    """read_committed: producer 7's first transaction aborted (at offset 2), its second
    committed (at 4); with the fetch answer's aborted list only its committed batch and the
    plain one are rows."""
    from tidelog.records.control import build_end_txn_marker_batch

    def txn(offset: int, value: bytes) -> bytes:
        builder = BatchBuilder(base_offset=offset, transactional=True)
        builder.set_producer(7, 0, offset)
        builder.append(None, value, timestamp=1_700_000_000_000)
        return builder.close()

    def marker(offset: int, commit: bool) -> bytes:
        return build_end_txn_marker_batch(
            commit=commit, producer_id=7, producer_epoch=0, coordinator_epoch=0,
            timestamp=1_700_000_000_000, base_offset=offset,
        )  # fmt: skip

    plain = BatchBuilder(base_offset=0)
    plain.append(None, b"plain", timestamp=1_700_000_000_000)
    data = b"".join(
        [plain.close(), txn(1, b"aborted"), marker(2, False), txn(3, b"kept"), marker(4, True)]
    )
    committed = decode_chunk(data, "t", 0, 0, None, aborted=[(7, 1)])
    assert committed.batch is not None and committed.next_offset == 5
    assert committed.batch.column("value").to_pylist() == [b"plain", b"kept"]
    everything = decode_chunk(data, "t", 0, 0, None)
    assert everything.batch is not None
    assert everything.batch.column("value").to_pylist() == [b"plain", b"aborted", b"kept"]
