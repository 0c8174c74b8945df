"""The sender's batch encoder agrees byte for byte with the records package's BatchBuilder."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.agent.batch import build_batch
from tidelog.agent.event import encode_body
from tidelog.records import BatchBuilder, Compression, decode_records, validate_batch

events = st.lists(
    st.tuples(
        st.none() | st.binary(max_size=40),
        st.none() | st.binary(max_size=300),
        st.lists(st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=20)), max_size=3),
        st.integers(min_value=0, max_value=2**45),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=80, deadline=None)
@given(events, st.sampled_from([Compression.NONE, Compression.LZ4, Compression.ZSTD]))
def test_same_bytes_as_batch_builder(
    items: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int]],
    compression: Compression,
) -> None:
    bodies = [encode_body(k, v, h, ts) for k, v, h, ts in items]
    ours = build_batch(
        bodies, producer_id=7, producer_epoch=0, base_sequence=99, compression=compression
    )
    builder = BatchBuilder(compression=compression)
    builder.set_producer(7, 0, 99)
    for k, v, h, ts in items:
        builder.append(k, v, h, timestamp=ts)
    assert ours == builder.close()
    validate_batch(ours)
    records = decode_records(ours)
    assert [(r.key, r.value) for r in records] == [(k, v) for k, v, _, _ in items]
