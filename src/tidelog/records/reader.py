"""Decoding the records of one RecordBatch v2.

Layout of one record inside the (decompressed) records block; every integer is a
zigzag varint (``varlong`` for the timestamp delta), see :mod:`tidelog.records.varint`::

    length            varint   bytes of the record after this field
    attributes        int8     unused by Kafka, kept as read
    timestamp_delta   varlong  timestamp - batch base_timestamp
    offset_delta      varint   offset - batch base_offset
    key_length        varint   -1 = null key
    key               bytes
    value_length      varint   -1 = null value
    value             bytes
    header_count      varint
    headers           header_count times:
        key_length    varint   not nullable; UTF-8 string
        key           bytes
        value_length  varint   -1 = null value
        value         bytes

Invariants checked while decoding (anything else raises :class:`CorruptBatchError`):
each record's fields end exactly at ``length``; the batch holds exactly
``record_count`` records and nothing after them; offset deltas rise strictly and never
pass ``last_offset_delta`` (compaction may leave gaps and drop the last records, so
equality is not required); no length is used before it has been checked against the
bytes that remain, so a forged count or length fails without allocating.

The work is per batch: the records block is decompressed once into one ``bytes``
object and the records are cut from it by one loop with one-byte varints read inline.
For LogAppendTime batches every record's timestamp is the batch's max timestamp, as
Kafka reports it. Header keys are decoded as UTF-8 with replacement characters for
invalid bytes, as the Java client does.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import chain
from typing import Any, NamedTuple, TypeVar

from tidelog.records.batch import (
    HEADER_SIZE,
    BatchHeader,
    parse_header,
    validate_batch,
)
from tidelog.records.compression import Compression, codec_of, decompress
from tidelog.records.errors import CorruptBatchError, TruncatedBatchError
from tidelog.records.runs import MIN_RUN, find_run, run_records

# length(1) + attributes(1) + timestamp(1) + offset(1) + key(1) + value(1) + headers(1)
MIN_RECORD_SIZE = 7

Headers = tuple[tuple[str, bytes | None], ...]
Buffer = bytes | bytearray | memoryview
RowT = TypeVar("RowT", bound=tuple[Any, ...])


class TimestampDeltaBounds(NamedTuple):
    """Every record's timestamp delta in a batch lies within ``[lowest, highest]``.

    Not the exact extremes: :func:`check_records` skips the one- and two-byte deltas
    without decoding them, so the bounds are never narrower than SHORT_TIMESTAMP_DELTAS.
    """

    lowest: int
    highest: int


# The range of a one- or two-byte zigzag varlong (14 bits of payload).
SHORT_TIMESTAMP_DELTAS = TimestampDeltaBounds(-8192, 8191)


class Record(NamedTuple):
    """One record with its absolute offset and timestamp."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: Headers
    attributes: int


class RecordColumns(NamedTuple):
    """The records of a batch as parallel lists (for columnar consumers such as Arrow)."""

    offsets: list[int]
    timestamps: list[int]
    keys: list[bytes | None]
    values: list[bytes | None]
    headers: list[Headers]


_NO_HEADERS: Headers = ()


def records_block(
    buf: Buffer,
    pos: int = 0,
    header: BatchHeader | None = None,
    *,
    max_decompressed_size: int | None = None,
) -> bytes:
    """The records block of the batch at ``pos``, decompressed, as one ``bytes`` object.

    With ``header`` given (from :func:`~tidelog.records.batch.validate_batch` or
    :func:`~tidelog.records.batch.iter_batches`) the batch is taken as validated;
    only its extent is checked again against the buffer.
    """
    if header is None:
        header = parse_header(buf, pos)
    size = header.size
    if pos < 0 or len(buf) - pos < size:
        raise TruncatedBatchError(
            f"record batch at position {pos} declares {size} bytes, "
            f"only {max(len(buf) - pos, 0)} remain"
        )
    codec = codec_of(header.attributes)
    raw = memoryview(buf)[pos + HEADER_SIZE : pos + size]
    if codec is Compression.NONE:
        return bytes(raw)
    return decompress(codec, raw, max_decompressed_size)


def _uvarint(data: bytes, p: int, max_bytes: int) -> tuple[int, int]:
    """Multi-byte slow path: unsigned groups from ``p``; IndexError past the end."""
    result = 0
    shift = 0
    for _ in range(max_bytes):
        byte = data[p]
        p += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            if result > 0xFFFFFFFFFFFFFFFF:
                raise CorruptBatchError(f"varint at {p} in a record does not fit in 64 bits")
            return result, p
        shift += 7
    raise CorruptBatchError(f"varint longer than {max_bytes} bytes in record at {p - max_bytes}")


def _parse(
    data: bytes,
    header: BatchHeader,
    pos: int,
    row_type: type[tuple[Any, ...]] | None = None,
    topic: str = "",
    partition: int = -1,
) -> Iterator[Iterable[Any]]:
    """The records of the batch in chunks: :class:`Record` s, or with ``row_type`` rows of
    that tuple type holding (topic, partition, offset, timestamp, key, value, headers).

    Uniform runs (:mod:`tidelog.records.runs`) are decoded whole in C; elsewhere records are
    read one by one, for a stretch that doubles while no run starts, so that a batch that is
    not uniform pays little for the attempts. A corrupt record ends the iteration with
    CorruptBatchError, after a chunk holding the good records before it.
    """
    count = header.record_count
    size = len(data)
    if count > size // MIN_RECORD_SIZE:
        raise CorruptBatchError(
            f"record batch at position {pos} declares {count} records but its "
            f"{size}-byte records block holds at most {size // MIN_RECORD_SIZE}"
        )
    p = 0
    index = 0
    previous_delta = -1
    stretch = MIN_RUN
    while index < count:
        run = find_run(data, p, index, previous_delta, count, header.last_offset_delta)
        if run is not None:
            yield run_records(
                data,
                run,
                header.base_offset,
                header.base_timestamp,
                header.is_log_append_time,
                header.max_timestamp,
                Record if row_type is None else row_type,
                None if row_type is None else topic,
                partition,
            )
            p = run.end
            index += run.records
            previous_delta = index - 1
            stretch = MIN_RUN
            continue
        stop = min(count, index + stretch)
        out: list[Any] = []
        try:
            p, previous_delta = _parse_span(
                out, data, header, pos, p, index, stop, previous_delta, row_type, topic, partition
            )
        except CorruptBatchError:
            yield out
            raise
        yield out
        index = stop
        stretch *= 2
    if p != size:
        raise CorruptBatchError(
            f"record batch at position {pos} has {size - p} bytes after its {count} records"
        )


def _parse_span(
    out: list[Any],
    data: bytes,
    header: BatchHeader,
    pos: int,
    p: int,
    first: int,
    stop: int,
    previous_delta: int,
    row_type: type[tuple[Any, ...]] | None,
    topic: str,
    partition: int,
) -> tuple[int, int]:
    """Records ``first`` to ``stop`` (exclusive) from byte ``p``, one by one, onto ``out``;
    returns the position after them and the offset delta of the last."""
    size = len(data)
    base_offset = header.base_offset
    base_timestamp = header.base_timestamp
    last_offset_delta = header.last_offset_delta
    log_append_time = header.is_log_append_time
    max_timestamp = header.max_timestamp
    new = tuple.__new__
    record_type = Record
    uvarint = _uvarint
    parse_headers = _parse_headers
    no_headers = _NO_HEADERS
    append = out.append
    index = first
    # Varints of one and two bytes (values -8192 .. 8191) are read inline; longer ones
    # go through _uvarint. IndexError means a field ran past the block.
    try:
        for index in range(first, stop):
            # length
            zz = data[p]
            if zz < 0x80:
                p += 1
            else:
                b = data[p + 1]
                if b < 0x80:
                    zz = (zz & 0x7F) | (b << 7)
                    p += 2
                else:
                    zz, p = uvarint(data, p, 5)
            length = (zz >> 1) ^ -(zz & 1)
            end = p + length
            if length < 6 or end > size:
                raise CorruptBatchError(
                    f"record {index} of batch at position {pos} declares length {length} "
                    f"with {size - p} bytes left in the batch"
                )
            attributes = data[p]
            if attributes > 127:
                attributes -= 256
            # timestamp delta (varlong)
            zz = data[p + 1]
            if zz < 0x80:
                p += 2
            else:
                b = data[p + 2]
                if b < 0x80:
                    zz = (zz & 0x7F) | (b << 7)
                    p += 3
                else:
                    zz, p = uvarint(data, p + 1, 10)
            timestamp = max_timestamp if log_append_time else base_timestamp + (zz >> 1 ^ -(zz & 1))
            # offset delta: two bytes from the 65th record of a batch on
            zz = data[p]
            if zz < 0x80:
                p += 1
            else:
                b = data[p + 1]
                if b < 0x80:
                    zz = (zz & 0x7F) | (b << 7)
                    p += 2
                else:
                    zz, p = uvarint(data, p, 5)
            delta = (zz >> 1) ^ -(zz & 1)
            if delta <= previous_delta or delta > last_offset_delta:
                raise CorruptBatchError(
                    f"record {index} of batch at position {pos} has offset delta {delta}, "
                    f"after {previous_delta} and with last offset delta {last_offset_delta}"
                )
            previous_delta = delta
            # key
            zz = data[p]
            if zz < 0x80:
                p += 1
            else:
                b = data[p + 1]
                if b < 0x80:
                    zz = (zz & 0x7F) | (b << 7)
                    p += 2
                else:
                    zz, p = uvarint(data, p, 5)
            if zz & 1:
                if zz != 1:
                    raise CorruptBatchError(
                        f"record {index} of batch at position {pos} has key length {(zz >> 1) ^ -1}"
                    )
                key = None
            else:
                n = zz >> 1
                if n > end - p:
                    raise CorruptBatchError(
                        f"record {index} of batch at position {pos}: key of {n} bytes "
                        f"overruns the record"
                    )
                key = data[p : p + n]
                p += n
            # value
            zz = data[p]
            if zz < 0x80:
                p += 1
            else:
                b = data[p + 1]
                if b < 0x80:
                    zz = (zz & 0x7F) | (b << 7)
                    p += 2
                else:
                    zz, p = uvarint(data, p, 5)
            if zz & 1:
                if zz != 1:
                    raise CorruptBatchError(
                        f"record {index} of batch at position {pos} has value length "
                        f"{(zz >> 1) ^ -1}"
                    )
                value = None
            else:
                n = zz >> 1
                if n > end - p:
                    raise CorruptBatchError(
                        f"record {index} of batch at position {pos}: value of {n} bytes "
                        f"overruns the record"
                    )
                value = data[p : p + n]
                p += n
            # headers
            if data[p] == 0:
                headers = no_headers
                p += 1
            else:
                headers, p = parse_headers(data, p, end, index, pos)
            if p != end:
                raise CorruptBatchError(
                    f"record {index} of batch at position {pos} declares length {length} "
                    f"but its fields take {length + p - end}"
                )
            if row_type is None:
                append(
                    new(
                        record_type,
                        (base_offset + delta, timestamp, key, value, headers, attributes),
                    )
                )
            else:
                append(
                    new(
                        row_type,
                        (topic, partition, base_offset + delta, timestamp, key, value, headers),
                    )
                )
    except IndexError:
        raise CorruptBatchError(
            f"record {index} of batch at position {pos} runs past the end of the records block"
        ) from None
    return p, previous_delta


def _parse_headers(data: bytes, p: int, end: int, index: int, pos: int) -> tuple[Headers, int]:
    zz, p = _uvarint(data, p, 5)
    count = (zz >> 1) ^ -(zz & 1)
    # each header takes at least two bytes (key length and value length)
    if count < 0 or count > (end - p) // 2:
        raise CorruptBatchError(
            f"record {index} of batch at position {pos} declares {count} headers in {end - p} bytes"
        )
    headers: list[tuple[str, bytes | None]] = []
    for _ in range(count):
        zz, p = _uvarint(data, p, 5)
        n = (zz >> 1) ^ -(zz & 1)
        if n < 0 or n > end - p:
            raise CorruptBatchError(
                f"record {index} of batch at position {pos} has a header key of length {n} "
                f"with {end - p} bytes left in the record"
            )
        name = data[p : p + n].decode("utf-8", "replace")
        p += n
        zz, p = _uvarint(data, p, 5)
        n = (zz >> 1) ^ -(zz & 1)
        if n >= 0:
            if n > end - p:
                raise CorruptBatchError(
                    f"record {index} of batch at position {pos} has a header value of "
                    f"length {n} with {end - p} bytes left in the record"
                )
            hvalue: bytes | None = data[p : p + n]
            p += n
        elif n == -1:
            hvalue = None
        else:
            raise CorruptBatchError(
                f"record {index} of batch at position {pos} has header value length {n}"
            )
        headers.append((name, hvalue))
    return tuple(headers), p


def check_records(
    buf: Buffer,
    pos: int = 0,
    *,
    header: BatchHeader | None = None,
    max_decompressed_size: int | None = None,
) -> TimestampDeltaBounds:
    """Check that every record of the batch at ``pos`` is well formed, building nothing.

    The broker runs this on every produced batch, as Kafka validates every record: a
    batch whose CRC is right but whose records do not parse would otherwise be stored
    and stop every consumer at its offset. It checks exactly what :func:`iter_records`
    checks (lengths against what remains, record count, rising offset deltas, the
    layout of headers) for about half the cost, because it slices and allocates nothing
    per record. ``header`` skips re-validating the batch, as in :func:`iter_records`.

    Returns bounds on the records' timestamp deltas (:class:`TimestampDeltaBounds`), so
    that the broker decodes the records to check their timestamps only when a batch comes
    within those bounds of the topic's timestamp window.
    """
    if header is None:
        header = validate_batch(buf, pos)
    data = records_block(buf, pos, header, max_decompressed_size=max_decompressed_size)
    count = header.record_count
    size = len(data)
    if count > size // MIN_RECORD_SIZE:
        raise CorruptBatchError(
            f"record batch at position {pos} declares {count} records but its "
            f"{size}-byte records block holds at most {size // MIN_RECORD_SIZE}"
        )
    p = 0
    index = 0
    previous = -1
    stretch = MIN_RUN
    bounds = SHORT_TIMESTAMP_DELTAS
    try:
        # As in _parse: uniform runs at once, record by record elsewhere. A run's timestamp
        # deltas are one or two bytes long (runs.py), within SHORT_TIMESTAMP_DELTAS.
        while index < count:
            run = find_run(data, p, index, previous, count, header.last_offset_delta)
            if run is not None:
                p = run.end
                index += run.records
                previous = index - 1
                stretch = MIN_RUN
                continue
            stop = min(count, index + stretch)
            p, previous, bounds = _check_span(
                data, pos, p, index, stop, previous, header.last_offset_delta, bounds
            )
            index = stop
            stretch *= 2
    except CorruptBatchError as exc:
        raise CorruptBatchError(f"record batch at position {pos}: {exc}") from None
    if p != size:
        raise CorruptBatchError(
            f"record batch at position {pos} has {size - p} bytes after its {count} records"
        )
    return bounds


def _check_span(
    data: bytes,
    pos: int,
    p: int,
    first: int,
    stop: int,
    previous: int,
    last_offset_delta: int,
    bounds: TimestampDeltaBounds,
) -> tuple[int, int, TimestampDeltaBounds]:
    """Checks records ``first`` to ``stop`` (exclusive) from byte ``p`` one by one; returns
    the position after them, the offset delta of the last, and ``bounds`` widened to every
    timestamp delta longer than two bytes among them (shorter ones are within
    SHORT_TIMESTAMP_DELTAS, which ``bounds`` always covers)."""
    size = len(data)
    uvarint = _uvarint
    lowest, highest = bounds
    index = first
    try:
        for index in range(first, stop):
            zz = data[p]
            if zz < 0x80:
                p += 1
            elif data[p + 1] < 0x80:
                zz = (zz & 0x7F) | (data[p + 1] << 7)
                p += 2
            else:
                zz, p = uvarint(data, p, 5)
            end = p + ((zz >> 1) ^ -(zz & 1))
            if end - p < 6 or end > size:
                raise CorruptBatchError(f"record {index} has an impossible length")
            # attributes (one byte), then the timestamp delta: any varlong will do
            if data[p + 1] < 0x80:
                p += 2
            elif data[p + 2] < 0x80:
                p += 3
            else:
                zz, p = uvarint(data, p + 1, 10)
                delta = (zz >> 1) ^ -(zz & 1)
                if delta < lowest:
                    lowest = delta
                elif delta > highest:
                    highest = delta
            zz = data[p]
            if zz < 0x80:
                p += 1
            elif data[p + 1] < 0x80:
                zz = (zz & 0x7F) | (data[p + 1] << 7)
                p += 2
            else:
                zz, p = uvarint(data, p, 5)
            delta = (zz >> 1) ^ -(zz & 1)
            if delta <= previous or delta > last_offset_delta:
                raise CorruptBatchError(
                    f"record {index} has offset delta {delta} after {previous} "
                    f"(last offset delta {last_offset_delta})"
                )
            previous = delta
            # key, then value: -1 (zigzag 1) is null, other negatives are corrupt
            zz = data[p]
            if zz < 0x80:
                p += 1
            elif data[p + 1] < 0x80:
                zz = (zz & 0x7F) | (data[p + 1] << 7)
                p += 2
            else:
                zz, p = uvarint(data, p, 5)
            if zz & 1:
                if zz != 1:
                    raise CorruptBatchError(f"record {index} has a negative key length")
            else:
                p += zz >> 1
            zz = data[p]
            if zz < 0x80:
                p += 1
            elif data[p + 1] < 0x80:
                zz = (zz & 0x7F) | (data[p + 1] << 7)
                p += 2
            else:
                zz, p = uvarint(data, p, 5)
            if zz & 1:
                if zz != 1:
                    raise CorruptBatchError(f"record {index} has a negative value length")
            else:
                p += zz >> 1
            if p >= end:
                raise CorruptBatchError(f"record {index}: key and value overrun the record")
            if data[p] == 0:
                p += 1
            else:
                _, p = _parse_headers(data, p, end, index, pos)
            if p != end:
                raise CorruptBatchError(f"record {index}: fields do not fill its length")
    except IndexError:
        raise CorruptBatchError(f"record {index} runs past the end of the records block") from None
    return p, previous, TimestampDeltaBounds(lowest, highest)


def _prepare(
    buf: Buffer,
    pos: int,
    header: BatchHeader | None,
    verify_crc: bool,
    max_size: int | None,
    max_decompressed_size: int | None,
) -> tuple[BatchHeader, bytes]:
    if header is None:
        header = validate_batch(buf, pos, max_size=max_size, verify_crc=verify_crc)
    data = records_block(buf, pos, header, max_decompressed_size=max_decompressed_size)
    return header, data


def iter_records(
    buf: Buffer,
    pos: int = 0,
    *,
    header: BatchHeader | None = None,
    verify_crc: bool = True,
    max_size: int | None = None,
    max_decompressed_size: int | None = None,
) -> Iterator[Record]:
    """Yield the records of the batch at ``pos`` one by one.

    The batch is validated (length, magic, CRC) and decompressed before the first record
    is yielded unless ``header`` is given, in which case the caller vouches that it came
    from validating this batch. Errors inside the records surface when the iteration
    reaches them, after the good records before them.
    """
    header, data = _prepare(buf, pos, header, verify_crc, max_size, max_decompressed_size)
    return chain.from_iterable(_parse(data, header, pos))


def decode_records(
    buf: Buffer,
    pos: int = 0,
    *,
    header: BatchHeader | None = None,
    verify_crc: bool = True,
    max_size: int | None = None,
    max_decompressed_size: int | None = None,
) -> list[Record]:
    """Every record of the batch at ``pos``; all or nothing (see :func:`iter_records`)."""
    header, data = _prepare(buf, pos, header, verify_crc, max_size, max_decompressed_size)
    return list(chain.from_iterable(_parse(data, header, pos)))


def decode_rows(
    buf: Buffer,
    pos: int,
    row_type: type[RowT],
    topic: str,
    partition: int,
    *,
    header: BatchHeader | None = None,
    verify_crc: bool = True,
    max_decompressed_size: int | None = None,
) -> list[RowT]:
    """Every record of the batch at ``pos`` as a ``row_type`` tuple of (topic, partition,
    offset, timestamp, key, value, headers), built directly: a consumer's record type costs
    no intermediate :class:`Record` per record. All or nothing, as :func:`decode_records`."""
    header, data = _prepare(buf, pos, header, verify_crc, None, max_decompressed_size)
    return list(chain.from_iterable(_parse(data, header, pos, row_type, topic, partition)))


def decode_columns(
    buf: Buffer,
    pos: int = 0,
    *,
    header: BatchHeader | None = None,
    verify_crc: bool = True,
    max_size: int | None = None,
    max_decompressed_size: int | None = None,
) -> RecordColumns:
    """The records of the batch at ``pos`` as parallel lists (offsets, timestamps, ...)."""
    records = decode_records(
        buf,
        pos,
        header=header,
        verify_crc=verify_crc,
        max_size=max_size,
        max_decompressed_size=max_decompressed_size,
    )
    if not records:
        return RecordColumns([], [], [], [], [])
    offsets, timestamps, keys, values, headers, _ = zip(*records, strict=True)
    return RecordColumns(list(offsets), list(timestamps), list(keys), list(values), list(headers))
