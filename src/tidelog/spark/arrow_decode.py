"""Record batches (RecordBatch v2 bytes from a fetch) to one ``pyarrow.RecordBatch``.

The columns are those of Spark's Kafka source: key, value (binary), topic (string),
partition (int32), offset (int64), timestamp (timestamp[us, UTC]), timestampType (int32)
and, when asked, headers (list<struct<key: string, value: binary>>).

How the work is split, per fetched chunk (many batches at once, never per record where it
can be avoided):

1. The batches are walked by their headers (length, magic, CRC checked by
   :func:`tidelog.records.iter_batches`); a last batch cut short by the fetch size is left for
   the next fetch; control batches (transaction markers) only move the position.
2. The records blocks of the kept batches (decompressed when needed) are joined into one
   buffer ``buf``. One Python loop walks the record *lengths* only, which is the one
   sequential dependency in the format, and checks that the records of each batch fill its
   block exactly.
3. Every other field is read for all records at once with Arrow compute kernels: varints are
   decoded lane-wise (one ``take`` per byte of the longest varint), keys and values are
   gathered from ``buf`` by a list-view flatten into contiguous Arrow binary columns.
   Per-batch values (base offset, base timestamp, timestamp type) are expanded with
   run-end decoding.

Invariants checked (anything else raises :class:`~tidelog.records.CorruptBatchError`):
the record lengths of a batch add up to its block and the count matches ``record_count``;
every varint ends within 5 (10 for the timestamp) bytes; key and value lengths are -1 or
non-negative and end inside their record; a record without headers ends right after its
header count; offsets rise strictly; offset deltas stay within ``last_offset_delta``.
Records with headers are decoded by :func:`tidelog.records.decode_records` (headers need
per-record Python objects anyway) when ``include_headers`` is set; otherwise their header
bytes are skipped unparsed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from tidelog.records import (
    BatchHeader,
    CorruptBatchError,
    TruncatedBatchError,
    decode_records,
    iter_batches,
    records_block,
)

HEADER_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
TIMESTAMP_TYPE = pa.timestamp("us", tz="UTC")


def arrow_schema(include_headers: bool) -> pa.Schema:
    fields = [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", TIMESTAMP_TYPE),
        pa.field("timestampType", pa.int32()),
    ]
    if include_headers:
        fields.append(pa.field("headers", HEADER_TYPE))
    return pa.schema(fields)


@dataclass(frozen=True, slots=True)
class Decoded:
    """What one chunk gave: the rows in [start, end) (None if none) and where to go on."""

    batch: pa.RecordBatch | None
    next_offset: int
    complete_batches: int


def _slow_uvarint(buf: bytes, p: int, max_bytes: int, what: str) -> tuple[int, int]:
    result = 0
    shift = 0
    size = len(buf)
    for _ in range(max_bytes):
        if p >= size:
            raise CorruptBatchError(f"{what}: varint runs past the end of the records block")
        byte = buf[p]
        p += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, p
        shift += 7
    raise CorruptBatchError(f"{what}: varint longer than {max_bytes} bytes")


def _record_starts(buf: bytes, blocks: Sequence[tuple[int, int, int, int]]) -> list[int]:
    """Position of every record (its length varint); blocks are (start, end, record_count,
    base_offset).

    Only the chain of lengths is followed here; the lengths are decoded again lane-wise and
    checked afterwards (a negative zigzag length would still move forward here, and fails
    that check).
    """
    starts: list[int] = []
    add = starts.append
    for block_start, block_end, count, base_offset in blocks:
        before = len(starts)
        p = block_start
        try:
            while p < block_end:
                add(p)
                zz = buf[p]
                if zz < 0x80:
                    p += 1 + (zz >> 1)
                else:
                    b = buf[p + 1]
                    if b < 0x80:
                        p += 2 + ((b << 6) | ((zz & 0x7F) >> 1))
                    else:
                        zz, q = _slow_uvarint(buf, p, 5, f"batch at offset {base_offset}")
                        if zz & 1:
                            raise CorruptBatchError(
                                f"a record of the batch at offset {base_offset} has a "
                                "negative length"
                            )
                        p = q + (zz >> 1)
        except IndexError:
            raise CorruptBatchError(
                f"the records of the batch at offset {base_offset} run past its block"
            ) from None
        if p != block_end or len(starts) - before != count:
            raise CorruptBatchError(
                f"batch at offset {base_offset} declares {count} records in "
                f"{block_end - block_start} bytes, which hold {len(starts) - before} records "
                f"and {p - block_end} bytes more"
            )
    return starts


def _varints(data: pa.Array, pos: pa.Array, max_bytes: int, what: str) -> tuple[pa.Array, pa.Array]:
    """Lane-wise unsigned varints at ``pos`` (int64 positions, all inside ``data``):
    (values as uint64, positions after them)."""
    last = len(data) - 1
    b = pc.take(data, pc.min_element_wise(pos, last)).cast(pa.uint64())
    more = pc.greater_equal(b, 0x80)
    if not pc.any(more).as_py():
        return b, pc.add(pos, 1)
    value = pc.bit_wise_and(b, 0x7F)
    size = pc.add(pos, 1)
    for k in range(1, max_bytes):
        at = pc.min_element_wise(pc.add(pos, k), last)
        b = pc.take(data, at).cast(pa.uint64())
        part = pc.shift_left(pc.bit_wise_and(b, 0x7F), pa.scalar(7 * k, pa.uint64()))
        value = pc.if_else(more, pc.bit_wise_or(value, part), value)
        size = pc.if_else(more, pc.add(size, 1), size)
        more = pc.and_(more, pc.greater_equal(b, 0x80))
        if not pc.any(more).as_py():
            return value, size
    raise CorruptBatchError(f"{what}: varint longer than {max_bytes} bytes")


def _zigzag(value: pa.Array) -> pa.Array:
    """Zigzag-decoded int64 of uint64 lanes."""
    half = pc.shift_right(value, pa.scalar(1, pa.uint64())).cast(pa.int64(), safe=False)
    sign = pc.negate(pc.bit_wise_and(value, 1).cast(pa.int64()))
    return pc.bit_wise_xor(half, sign)


def _arange(n: int, step: int = 1) -> pa.Array:
    ones = pa.repeat(pa.scalar(step, pa.int64()), n)
    return pc.subtract(pc.cumulative_sum(ones), step)


def _gather_binary(
    data: pa.Buffer, size: int, start: pa.Array, stop: pa.Array, null: pa.Array | None
) -> pa.Array:
    """Binary column of data[start:stop] per lane (null where ``null``).

    The ranges are ordered and disjoint, so [start0, stop0, start1, stop1, ...] are the
    offsets of a binary array over ``data`` itself whose even elements are the wanted values
    and odd ones the bytes between them; taking the even elements copies the values out
    contiguously in one kernel.
    """
    n = len(start)
    lane = _arange(2 * n)
    pick = pc.add(pc.shift_right(lane, 1), pc.multiply(pc.bit_wise_and(lane, 1), n))
    bounds = pc.take(pa.concat_arrays([start, stop]), pick)
    offsets = pa.concat_arrays([bounds, pa.array([size], pa.int64())]).cast(pa.int32())
    both = pa.Array.from_buffers(pa.binary(), 2 * n, [None, offsets.buffers()[1], data])
    values = pc.take(both, _arange(n, 2))
    if null is None:
        return values
    validity = pc.invert(null).buffers()[1]
    return pa.Array.from_buffers(
        pa.binary(), n, [validity, values.buffers()[1], values.buffers()[2]], offset=0
    )


def _expand(run_ends: list[int], values: Sequence[int], type_: pa.DataType) -> pa.Array:
    if len(values) == 1:
        return pa.repeat(pa.scalar(values[0], type_), run_ends[0])
    ree = pa.RunEndEncodedArray.from_arrays(pa.array(run_ends, pa.int32()), pa.array(values, type_))
    return pc.run_end_decode(ree)


def _headers_column(
    data: bytes, kept: Sequence[tuple[int, BatchHeader]], has_headers: bool, n: int
) -> pa.Array:
    if not has_headers:
        offsets = pa.repeat(pa.scalar(0, pa.int32()), n + 1)
        empty = pa.array([], HEADER_TYPE.value_type)
        return pa.ListArray.from_arrays(offsets, empty, type=HEADER_TYPE)
    rows: list[list[dict[str, object]]] = []
    for pos, header in kept:
        for r in decode_records(data, pos, header=header):
            rows.append([{"key": k, "value": v} for k, v in r.headers])
    return pa.array(rows, HEADER_TYPE)


def decode_chunk(
    data: bytes,
    topic: str,
    partition: int,
    start: int,
    end: int | None,
    *,
    include_headers: bool = False,
    verify_crc: bool = True,
) -> Decoded:
    """The records of ``data`` with ``start <= offset < end`` (``end`` None: no bound).

    ``next_offset`` is the offset after the last whole batch in ``data`` (``start`` when
    there is none); ``complete_batches`` counts the whole batches seen.
    """
    found: list[tuple[int, BatchHeader]] = []
    try:
        for pos, header in iter_batches(data, verify_crc=verify_crc):
            found.append((pos, header))
    except TruncatedBatchError:
        pass  # a batch cut by the fetch size: the next fetch starts at it
    next_offset = start
    kept: list[tuple[int, BatchHeader]] = []
    for pos, header in found:
        next_offset = max(next_offset, header.next_offset)
        if header.is_control or header.record_count == 0 or header.last_offset < start:
            continue
        if end is not None and header.base_offset >= end:
            continue
        kept.append((pos, header))
    if not kept:
        return Decoded(None, next_offset, len(found))

    pieces: list[bytes] = []
    blocks: list[tuple[int, int, int, int]] = []
    at = 0
    for pos, header in kept:
        block = records_block(data, pos, header)
        pieces.append(block)
        blocks.append((at, at + len(block), header.record_count, header.base_offset))
        at += len(block)
    buf = pieces[0] if len(pieces) == 1 else b"".join(pieces)
    starts = _record_starts(buf, blocks)
    n = len(starts)

    run_ends: list[int] = []
    total = 0
    for _, header in kept:
        total += header.record_count
        run_ends.append(total)

    buffer = pa.py_buffer(buf)
    data_arr = pa.Array.from_buffers(pa.uint8(), len(buf), [None, buffer])
    length_zz, pos_arr = _varints(data_arr, pa.array(starts, pa.int64()), 5, "record length")
    length = _zigzag(length_zz)
    if pc.min(length).as_py() < 6:
        raise CorruptBatchError("a record declares a length below the smallest record")
    end_arr = pc.add(pos_arr, length)
    # attributes (one byte, unused) then the timestamp delta
    pos_arr = pc.add(pos_arr, 1)
    ts_delta, pos_arr = _varints(data_arr, pos_arr, 10, "timestamp delta")
    _check_inside(pos_arr, end_arr, "timestamp delta")
    off_delta, pos_arr = _varints(data_arr, pos_arr, 5, "offset delta")
    _check_inside(pos_arr, end_arr, "offset delta")
    key_zz, pos_arr = _varints(data_arr, pos_arr, 5, "key length")
    _check_inside(pos_arr, end_arr, "key length")
    key_len = _zigzag(key_zz)
    key_start = pos_arr
    key_null = pc.equal(key_len, -1)
    key_bytes = pc.max_element_wise(key_len, 0)
    pos_arr = pc.add(pos_arr, key_bytes)
    _check_inside(pos_arr, end_arr, "key")
    val_zz, pos_arr = _varints(data_arr, pos_arr, 5, "value length")
    _check_inside(pos_arr, end_arr, "value length")
    val_len = _zigzag(val_zz)
    val_start = pos_arr
    val_null = pc.equal(val_len, -1)
    val_bytes = pc.max_element_wise(val_len, 0)
    pos_arr = pc.add(pos_arr, val_bytes)
    _check_inside(pos_arr, end_arr, "value")
    if pc.min(key_len).as_py() < -1 or pc.min(val_len).as_py() < -1:
        raise CorruptBatchError("a record has a key or value length below -1")
    header_count = pc.take(data_arr, pc.min_element_wise(pos_arr, len(buf) - 1))
    no_headers = pc.equal(header_count, 0)
    after = pc.add(pos_arr, 1)
    # A record without headers ends right after its (zero) header count.
    bad = pc.and_(no_headers, pc.not_equal(after, end_arr))
    if pc.any(bad).as_py():
        raise CorruptBatchError("a record's fields do not add up to its length")
    has_headers = not pc.all(no_headers).as_py()

    deltas = _zigzag(off_delta)
    bases = _expand(run_ends, [h.base_offset for _, h in kept], pa.int64())
    last_deltas = _expand(run_ends, [h.last_offset_delta for _, h in kept], pa.int64())
    if pc.min(deltas).as_py() < 0 or pc.any(pc.greater(deltas, last_deltas)).as_py():
        raise CorruptBatchError("an offset delta lies outside its batch")
    offsets = pc.add(bases, deltas)
    if n > 1 and pc.min(pc.pairwise_diff(offsets)).as_py() <= 0:
        raise CorruptBatchError("record offsets do not rise strictly")

    append_time = [h.is_log_append_time for _, h in kept]
    ts_base = _expand(
        run_ends,
        [h.max_timestamp if h.is_log_append_time else h.base_timestamp for _, h in kept],
        pa.int64(),
    )
    if any(append_time):
        keep_delta = pc.invert(_expand(run_ends, append_time, pa.bool_()))
        ts_ms = pc.add(ts_base, pc.if_else(keep_delta, _zigzag(ts_delta), 0))
    else:
        ts_ms = pc.add(ts_base, _zigzag(ts_delta))
    timestamps = pc.multiply(ts_ms, 1000).cast(TIMESTAMP_TYPE)
    ts_type = _expand(run_ends, [int(a) for a in append_time], pa.int32())

    if pc.all(key_null).as_py():
        keys = pa.nulls(n, pa.binary())
    else:
        keys = _gather_binary(buffer, len(buf), key_start, pc.add(key_start, key_bytes), key_null)
    values = _gather_binary(
        buffer,
        len(buf),
        val_start,
        pc.add(val_start, val_bytes),
        val_null if pc.any(val_null).as_py() else None,
    )
    columns = [
        keys,
        values,
        pa.repeat(pa.scalar(topic, pa.string()), n),
        pa.repeat(pa.scalar(partition, pa.int32()), n),
        offsets,
        timestamps,
        ts_type,
    ]
    if include_headers:
        columns.append(_headers_column(data, kept, has_headers, n))
    batch = pa.RecordBatch.from_arrays(columns, schema=arrow_schema(include_headers))
    first = kept[0][1].base_offset
    last = kept[-1][1].last_offset
    if first < start or (end is not None and last >= end):
        upper = pc.less(offsets, end) if end is not None else None
        lower = pc.greater_equal(offsets, start)
        mask = lower if upper is None else pc.and_(lower, upper)
        batch = batch.filter(mask)
    return Decoded(batch if batch.num_rows else None, next_offset, len(found))


def _check_inside(pos: pa.Array, end: pa.Array, what: str) -> None:
    if pc.any(pc.greater(pos, end)).as_py():
        raise CorruptBatchError(f"a record's {what} runs past the end of the record")
