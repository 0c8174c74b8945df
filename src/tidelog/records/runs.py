"""Uniform runs: stretches of a batch whose records share one byte layout, checked and decoded
with strided slices instead of record by record.

A producer that writes values of one size without headers (the common case: fixed-size
events, benchmarks, most pipelines) fills a batch with records that differ only in their
bytes of key, value, attributes and timestamp delta, and in their offset delta, which counts
up from the run's first record. For such a run the structure of all its records is checked
at once: the j-th byte of every record is ``data[start + j :: size]``, a strided slice that C
copies, and a slice equal to one repeated byte (``lstrip``), or to the precomputed varint
encodings of consecutive offset deltas, checks that byte for every record of the run.

A run, from record ``index`` at byte ``start``: ``count`` records of ``size`` bytes each, and
in every record, at the same place,

    length prefix          the same bytes (so the same length)
    attributes             any byte
    timestamp delta        a varlong of ``ts_len`` bytes (1 or 2): continuation bits right
    offset delta           index + j, the j-th record of the run, as its varint
    key length, value length   the same bytes (keys and values of one length, or null)
    header count           0

Invariant: a record with that layout is well formed by construction. Its fields are those of
the run's first record, which :func:`find_run` parsed and checked the way the general loop
does; they fill the length exactly; the offset deltas rise by one and stop at the batch's last
offset delta. So a run passes exactly the checks the general loop would apply record by
record, and the first record that does not fit ends the run: the general loop then reads it
and reports what is wrong with it, as it always did.

Runs of fewer than :data:`MIN_RUN` records are not worth the slicing; :func:`find_run` answers
None and the caller reads records one by one.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from functools import cache
from itertools import repeat
from operator import or_
from typing import Any, NamedTuple

# Shorter stretches are cheaper to read record by record.
MIN_RUN = 16
# Offset deltas below these fit varints of 1, 2 and 3 bytes (zigzag doubles them).
_DELTA_LIMITS = (0, 64, 8192, 1 << 20)
# Bytes 0-127 -> 0, 128-255 -> 1: a continuation bit per byte, for lstrip.
_HIGH_BIT = bytes(1 if b >= 0x80 else 0 for b in range(256))
# A byte as a signed int8 (record attributes).
_SIGNED = tuple(b - 256 if b > 127 else b for b in range(256))
# One-byte and two-byte zigzag varlongs: the byte(s) to the value.
_ZIGZAG_1 = tuple((zz >> 1) ^ -(zz & 1) for zz in range(128))
_LOW_7 = tuple(b & 0x7F for b in range(256))
_HIGH_7 = tuple(b << 7 for b in range(256))


class Run(NamedTuple):
    """A uniform run (module docstring); positions inside a record are relative to its start."""

    start: int
    first: int  # index of the run's first record in the batch
    records: int
    size: int
    ts_at: int
    ts_len: int
    key_at: int
    key_len: int  # -1: null keys
    value_at: int
    value_len: int  # -1: null values

    @property
    def end(self) -> int:
        return self.start + self.records * self.size


def _varint(data: bytes, p: int, max_bytes: int = 5) -> tuple[int, int]:
    """A zigzag varint at ``p``: (value, position after it); IndexError past the end,
    ValueError when longer than ``max_bytes`` (the general loop's limits: 10 bytes for the
    timestamp varlong, 5 for the rest)."""
    zz = 0
    shift = 0
    for _ in range(max_bytes):
        byte = data[p]
        p += 1
        zz |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (zz >> 1) ^ -(zz & 1), p
        shift += 7
    raise ValueError(f"varint longer than {max_bytes} bytes")


@cache
def _delta_bytes(width: int, k: int) -> bytes:
    """Byte ``k`` of the ``width``-byte varint of offset delta d, at index d, for every d
    that takes ``width`` bytes (smaller indexes hold filler never compared)."""
    limit = _DELTA_LIMITS[width]
    # zigzag(d) = 2d; its k-th 7-bit group is (2d >> 7k) & 0x7F.
    if k == 0:
        groups = bytes(range(0, 128, 2)) * (limit // 64)
    else:
        repeat_each = 1 << (7 * k - 1)  # d values sharing one group k
        period = b"".join(bytes((v,)) * repeat_each for v in range(128))
        groups = (period * (limit // len(period) + 1))[:limit]
    if k < width - 1:
        groups = groups.translate(bytes((b | 0x80) & 0xFF for b in range(256)))
    return groups


@cache
def _zigzag_14() -> tuple[int, ...]:
    return tuple((zz >> 1) ^ -(zz & 1) for zz in range(1 << 14))


def _leading(column: bytes, byte: bytes) -> int:
    """How many bytes at the start of ``column`` equal ``byte``."""
    return len(column) - len(column.lstrip(byte))


def _common_prefix(a: bytes, b: bytes) -> int:
    """Length of the common prefix of two equally long byte strings (binary search; the
    comparisons run in C)."""
    low, high = 0, len(a)
    while low < high:
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def _verified(
    data: bytes,
    start: int,
    size: int,
    count: int,
    constant: Iterable[int],
    ts_at: int,
    ts_len: int,
    od_at: int,
    od_len: int,
    index: int,
) -> int:
    """How many records from ``start`` (at most ``count``) have the run's layout."""
    stop = start + count * size
    good = count
    for k in constant:
        column = data[start + k : stop : size]
        good = min(good, _leading(column, data[start + k : start + k + 1]))
    for k in range(ts_len):
        bits = data[start + ts_at + k : stop : size].translate(_HIGH_BIT)
        good = min(good, _leading(bits, b"\x01" if k < ts_len - 1 else b"\x00"))
    for k in range(od_len):
        column = data[start + od_at + k : stop : size]
        expected = _delta_bytes(od_len, k)[index : index + count]
        if column != expected:
            good = min(good, _common_prefix(column, expected))
    return good


def find_run(
    data: bytes, start: int, index: int, previous_delta: int, count: int, last_offset_delta: int
) -> Run | None:
    """The run of records beginning with record ``index`` at ``start`` (of ``count`` in the
    batch, the record before it with offset delta ``previous_delta``), or None when fewer
    than :data:`MIN_RUN` records from there share a layout."""
    limit = min(count - index, last_offset_delta - index + 1)
    # A run's deltas count up from its index: they rise past the record before only if that
    # one's delta was index - 1 (deltas rise strictly from 0, so it is never less).
    if limit < MIN_RUN or previous_delta != index - 1:
        return None
    try:
        length, q = _varint(data, start)
        prefix = q - start
        size = prefix + length
        if length < 6 or start + size > len(data):
            return None
        ts_at = prefix + 1
        _, q = _varint(data, start + ts_at, 10)
        ts_len = q - start - ts_at
        od_at = q - start
        delta, q = _varint(data, q)
        od_len = q - start - od_at
        if delta != index or od_len > 3 or ts_len > 2:
            return None
        key_header = q - start
        key_len, q = _varint(data, q)
        key_at = q - start
        q += max(key_len, 0)
        value_header = q - start
        value_len, q = _varint(data, q)
        value_at = q - start
        q += max(value_len, 0)
        if key_len < -1 or value_len < -1 or q - start != size - 1 or data[q] != 0:
            return None
    except (IndexError, ValueError):
        return None
    limit = min(limit, _DELTA_LIMITS[od_len] - index, (len(data) - start) // size)
    if limit < MIN_RUN:
        return None
    constant = [
        *range(prefix),
        *range(key_header, key_at),
        *range(value_header, value_at),
        size - 1,
    ]
    layout = (constant, ts_at, ts_len, od_at, od_len, index)
    # A short probe first: a batch that is not uniform costs little.
    if _verified(data, start, size, MIN_RUN, *layout) < MIN_RUN:
        return None
    found = _verified(data, start, size, limit, *layout)
    return Run(start, index, found, size, ts_at, ts_len, key_at, key_len, value_at, value_len)


def _column(data: bytes, run: Run, at: int) -> bytes:
    return data[run.start + at : run.end : run.size]


def _fields(data: bytes, run: Run, at: int, length: int) -> Iterator[bytes | None]:
    if length < 0:
        return repeat(None, run.records)
    if length == 0:
        return repeat(b"", run.records)
    first = run.start + at
    starts = range(first, first + run.records * run.size, run.size)
    ends = range(first + length, first + length + run.records * run.size, run.size)
    return map(data.__getitem__, map(slice, starts, ends))


def _timestamps(
    data: bytes, run: Run, base_timestamp: int, log_append_time: bool, max_timestamp: int
) -> Iterator[int]:
    if log_append_time:
        return repeat(max_timestamp, run.records)
    first = _column(data, run, run.ts_at)
    if run.ts_len == 1:
        deltas: Iterator[int] = map(_ZIGZAG_1.__getitem__, first)
    else:
        second = _column(data, run, run.ts_at + 1)
        zigzags = map(or_, map(_LOW_7.__getitem__, first), map(_HIGH_7.__getitem__, second))
        deltas = map(_zigzag_14().__getitem__, zigzags)
    return map(base_timestamp.__add__, deltas)


def run_records(
    data: bytes,
    run: Run,
    base_offset: int,
    base_timestamp: int,
    log_append_time: bool,
    max_timestamp: int,
    row_type: type[tuple[Any, ...]],
    topic: str | None,
    partition: int,
) -> Iterator[Any]:
    """The run's records as ``row_type`` tuples built in C: with ``topic`` None the fields of
    :class:`~tidelog.records.reader.Record` (offset, timestamp, key, value, headers,
    attributes), otherwise (topic, partition, offset, timestamp, key, value, headers)."""
    first = base_offset + run.first
    offsets = range(first, first + run.records)
    timestamps = _timestamps(data, run, base_timestamp, log_append_time, max_timestamp)
    keys = _fields(data, run, run.key_at, run.key_len)
    values = _fields(data, run, run.value_at, run.value_len)
    no_headers = repeat((), run.records)
    if topic is None:
        # attributes sit right after the length prefix, one byte before the timestamp
        attributes = map(_SIGNED.__getitem__, _column(data, run, run.ts_at - 1))
        fields: Iterator[tuple[Any, ...]] = zip(
            offsets, timestamps, keys, values, no_headers, attributes, strict=True
        )
    else:
        n = run.records
        fields = zip(
            repeat(topic, n),
            repeat(partition, n),
            offsets,
            timestamps,
            keys,
            values,
            no_headers,
            strict=True,
        )
    return map(tuple.__new__, repeat(row_type), fields)
