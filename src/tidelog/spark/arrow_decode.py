"""Record batches (RecordBatch v2 bytes from a fetch) to one ``pyarrow.RecordBatch``.

The columns are those of Spark's Kafka source: key, value (binary), topic (string),
partition (int32), offset (int64), timestamp (timestamp[us, UTC]), timestampType (int32)
and, when asked, headers (list<struct<key: string, value: binary>>).

How the work is split, per fetched chunk (many batches at once, never per record where it
can be avoided):

1. The batches are walked by their headers (length, magic, CRC checked by
   :func:`tidelog.records.iter_batches`); a last batch cut short by the fetch size is left for
   the next fetch; control batches (transaction markers) only move the position.
2. The records are read from one buffer ``buf`` with zero padding after them (so lane-wise
   reads a few bytes past a record stay in bounds): when every kept batch is uncompressed,
   the fetched bytes themselves, each batch's records block where it lies; otherwise the
   records blocks (decompressed when needed) joined. The records' positions form a chain
   through their lengths, the one sequential dependency in the format: they are guessed for
   whole batches at once (each record the size of the batch's first, up to the widths of
   its offset delta and length varints) and the guess checked for all records at once;
   batches the first guess misses are placed by a few smaller guesses, and what no guess
   places is walked record by record in Python. The chain is checked lane-wise in the end:
   every record ends where the next of its batch begins, and the last at the end of its
   block.
3. Records that come in runs of one size and one layout (a producer's records whose keys
   and values have one size each; the runs break where a delta varint widens) are read as
   the rows of a 2-D array per run: the head of every row is copied out as one or two
   words and checked against the run's first record in one pass (the length, key length
   and value length bytes equal, the delta varints of equal widths, header counts 0), the
   deltas are read from those words, and keys and values copied out run by run. When
   positions are only guessed, these checks also confirm them. Anything else leaves the
   chunk to step 4.
4. The general path reads every field for all records at once with numpy: varints are
   decoded from the 4 bytes at each lane's position, read as one little-endian word (the
   rare longer ones byte by byte); keys and values are gathered from ``buf`` by one Arrow
   ``take`` into contiguous binary columns.

Either way, per-batch values (base offset, base timestamp, timestamp type) are repeated per
record.

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

import contextlib
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from tidelog.client.aborted import AbortedTransactions
from tidelog.records import (
    BatchHeader,
    CorruptBatchError,
    TruncatedBatchError,
    decode_records,
    iter_batches,
    records_block,
)
from tidelog.records.batch import HEADER_SIZE

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


def _walk(buf: bytes, p: int, block_end: int, base_offset: int) -> list[int]:
    """Positions of the records from ``p`` to ``block_end`` by following the chain of
    lengths, one record at a time.

    Only the chain is followed here; the lengths are decoded again lane-wise and checked
    afterwards (a negative zigzag length would still move forward here, and fails that
    check).
    """
    starts: list[int] = []
    add = starts.append
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
                            f"a record of the batch at offset {base_offset} has a negative length"
                        )
                    p = q + (zz >> 1)
    except IndexError:
        raise CorruptBatchError(
            f"the records of the batch at offset {base_offset} run past its block"
        ) from None
    if p != block_end:
        raise CorruptBatchError(
            f"the records of the batch at offset {base_offset} end {p - block_end} bytes "
            "past its block"
        )
    return starts


# Guessing record positions (see _guess): fewer records than this left in a batch are
# walked; a guess that places fewer records than this is a miss, and after _GUESS_MISSES
# misses the rest of the batch is walked.
_GUESS_MIN = 32
_GUESS_MISSES = 2
# At most this many guesses per chunk, so that batches whose records differ in size cost
# a bounded amount of vectorised work before they are walked.
_GUESS_ROUNDS = 4
# Zero bytes after the joined records blocks: lane-wise reads of up to 10 bytes from any
# position inside the blocks stay inside the buffer without clamping.
_PAD = bytes(16)

Ints = npt.NDArray[np.int64]


def _varint_width(zz: Ints) -> Ints:
    """Bytes of the unsigned varints of ``zz`` (0 <= zz < 2**35)."""
    width = (zz >= 1 << 7).astype(np.int64) + 1
    for bits in (14, 21, 28):
        width += zz >= 1 << bits
    return width


def _short_ends(data: npt.NDArray[np.uint8], size: int, pos: Ints) -> Ints:
    """Lane-wise ends of records assumed at ``pos``: the position after the length varint
    plus the (zigzag) length, for length varints of up to 3 bytes; -1 for longer ones.
    Never raises: ``pos`` may be a wrong guess."""
    at = np.minimum(pos, size)
    b0 = data[at].astype(np.int64)
    b1 = data[at + 1].astype(np.int64)
    b2 = data[at + 2].astype(np.int64)
    more0 = b0 >> 7
    more1 = more0 & (b1 >> 7)
    more2 = more1 & (b2 >> 7)
    zz = (b0 & 0x7F) | (more0 * ((b1 & 0x7F) << 7)) | (more1 * ((b2 & 0x7F) << 14))
    ends: Ints = pos + 1 + more0 + more1 + ((zz >> 1) ^ -(zz & 1))
    ends[more2 == 1] = -1
    return ends


@dataclass(slots=True)
class _Stretch:
    """Records of one batch not yet placed: from ``p`` (a record's start) on, ``left`` of
    them, up to ``block_end``; ``placed`` collects the positions found. ``walk`` is set
    when the rest is to be walked; ``misses`` counts the guesses that placed few records."""

    p: int
    left: int
    block_end: int
    base_offset: int
    placed: list[Ints]
    walk: bool = False
    misses: int = 0


def _template(buf: bytes, s: _Stretch) -> tuple[int, int] | None:
    """(length, offset delta) of the record at ``s.p``, or None when no guess is to be made
    from it (a negative or tiny length or delta: the walk deals with it)."""
    where = f"batch at offset {s.base_offset}"
    zz, q = _slow_uvarint(buf, s.p, 5, where)
    if zz & 1 or zz >> 1 < 6 or q + 1 >= s.block_end:
        return None
    _, r = _slow_uvarint(buf, q + 1, 10, where)  # attributes byte, then the timestamp delta
    delta_zz, _ = _slow_uvarint(buf, r, 5, where)
    if delta_zz & 1 or delta_zz >> 31:
        return None
    return zz >> 1, delta_zz >> 1


def _predict(
    ps: Sequence[int], lefts: Ints, run_ends: Ints, templates: Sequence[tuple[int, int]]
) -> tuple[Ints, Ints]:
    """Guessed (start, end) of every record of stretches that begin at ``ps`` with
    ``lefts`` records each (``run_ends``: their cumulative sum), from the (length, offset
    delta) of each stretch's first record: every record is taken to be that size except
    for the widths of its offset delta varint (deltas taken as consecutive) and of its
    length varint."""
    firsts = run_ends - lefts
    within = np.arange(int(run_ends[-1]), dtype=np.int64) - np.repeat(firsts, lefts)
    deltas = within + np.repeat(np.array([d for _, d in templates], np.int64), lefts)
    # length of lane i = first record's length - its delta's width + lane i's delta's width
    base = [length - int(_varint_width(np.array([2 * d]))[0]) for length, d in templates]
    lengths = _varint_width(2 * deltas) + np.repeat(np.array(base, np.int64), lefts)
    sizes = lengths + _varint_width(2 * lengths)
    running = np.cumsum(sizes)
    before = np.concatenate([[0], running[run_ends[:-1] - 1]])
    ends: Ints = running + np.repeat(np.array(ps, np.int64) - before, lefts)
    return ends - sizes, ends


def _guess_whole(buf: bytes, blocks: Sequence[tuple[int, int, int, int]]) -> Ints | None:
    """Every record's position guessed at once from the first record of its batch (see
    :func:`_predict`), unchecked; None when a batch is too short or its first record gives
    no template. Most producers write batches that this places whole; the caller checks the
    guess with :func:`_frame` and places records by :func:`_record_starts` when it fails."""
    templates: list[tuple[int, int]] = []
    for start, end, count, base in blocks:
        found = _template(buf, _Stretch(start, count, end, base, [])) if count else None
        if found is None:
            return None
        templates.append(found)
    lefts = np.array([count for _, _, count, _ in blocks], np.int64)
    starts, _ = _predict([b[0] for b in blocks], lefts, np.cumsum(lefts), templates)
    return starts


def _guess(buf: bytes, data: npt.NDArray[np.uint8], size: int, stretches: list[_Stretch]) -> None:
    """One guess at the positions of the records of every stretch, checked lane-wise; each
    stretch moves past the records whose positions are confirmed.

    The guess: the records of a stretch have the size of its first record except for the
    width of their offset delta varint, which grows with the delta (taken as consecutive),
    and of their length varint. Batches from producers whose keys and values are of one
    size are placed whole, or in a few guesses when their timestamp delta varint widens.
    A record's position is confirmed when every record before it in the stretch ends where
    the guess puts the next one (and the last, at the end of the batch).
    """
    todo: list[tuple[_Stretch, int, int]] = []
    for s in stretches:
        found = _template(buf, s)
        if found is None:
            s.walk = True
        else:
            todo.append((s, *found))
    if not todo:
        return
    lefts = np.array([s.left for s, _, _ in todo], np.int64)
    run_ends = np.cumsum(lefts)
    firsts = run_ends - lefts
    starts, ends = _predict(
        [s.p for s, _, _ in todo], lefts, run_ends, [(length, d) for _, length, d in todo]
    )
    wrong = np.flatnonzero(_short_ends(data, size, starts) != ends)
    first_wrong: dict[int, int] = {}
    if wrong.size:
        stretch_of = np.searchsorted(run_ends, wrong, side="right")
        stretches_hit, first = np.unique(stretch_of, return_index=True)
        first_wrong = {
            int(i): int(wrong[f] - firsts[i]) for i, f in zip(stretches_hit, first, strict=True)
        }
    for i, (s, _, _) in enumerate(todo):
        lanes = starts[firsts[i] : run_ends[i]]
        k = first_wrong.get(i, s.left)
        if k == s.left and int(ends[run_ends[i] - 1]) == s.block_end:
            s.placed.append(lanes)
            s.p, s.left = s.block_end, 0
            continue
        # Lanes before k chain; lane k starts where guessed but ends elsewhere (or, with
        # no wrong lane, the last record does not end the batch: the walk will say so).
        k = min(k, s.left - 1)
        if k < _GUESS_MIN:
            # A short guess: the records may differ in size (walk them after another
            # miss), or only a varint widened early (the next guess goes on from there).
            s.misses += 1
            if s.misses >= _GUESS_MISSES:
                s.walk = True
                continue
            if k == 0:
                continue
        s.placed.append(lanes[:k])
        s.p = int(lanes[k])
        s.left -= k


def _record_starts(
    buf: bytes,
    data: npt.NDArray[np.uint8],
    size: int,
    blocks: Sequence[tuple[int, int, int, int]],
) -> Ints:
    """Position of every record (its length varint); blocks are (start, end, record_count,
    base_offset).

    The positions form a chain (each record's length gives the next one's position), the
    one sequential dependency of the format. The batches of a chunk are first placed by a
    few guesses checked lane-wise (:func:`_guess`), and what the guesses leave is walked
    record by record in Python.
    """
    stretches = [_Stretch(start, count, end, base, []) for start, end, count, base in blocks]
    for _ in range(_GUESS_ROUNDS):
        open_ = [s for s in stretches if not s.walk and s.left >= _GUESS_MIN]
        if not open_:
            break
        _guess(buf, data, size, open_)
    parts: list[Ints] = []
    for s, (block_start, block_end, count, base_offset) in zip(stretches, blocks, strict=True):
        parts.extend(s.placed)
        placed = count - s.left
        if s.left:
            rest = _walk(buf, s.p, block_end, base_offset)
            parts.append(np.array(rest, np.int64))
            placed += len(rest)
        if placed != count:
            raise CorruptBatchError(
                f"batch at offset {base_offset} declares {count} records in "
                f"{block_end - block_start} bytes, which hold {placed}"
            )
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _words(buf: bytes) -> npt.NDArray[np.uint32]:
    """``buf`` seen as a little-endian uint32 at every byte position, an unaligned view:
    indexing it reads the 4 bytes at any positions at once (``take`` would first copy the
    whole view)."""
    return np.ndarray((len(buf) - 3,), dtype="<u4", buffer=buf, strides=(1,))


_STOP_BITS = np.uint32(0x80808080)
_LOW_7 = np.uint32(0x7F7F7F7F)


def _varints(
    words: npt.NDArray[np.uint32],
    data: npt.NDArray[np.uint8],
    size: int,
    pos: Ints,
    max_bytes: int,
    what: str,
) -> tuple[npt.NDArray[np.uint64], Ints]:
    """Lane-wise unsigned varints at ``pos`` (positions at most ``size``, the end of the
    records; reads past it see the zero padding): (values, positions after them).

    The 4 bytes at each position are read as one word; the first byte without its
    continuation bit ends the varint, and its 7-bit groups are packed by three mask-and-shift
    steps. The rare lanes whose varint is longer than 4 bytes are read byte by byte.
    """
    if pos.size and int(pos.max()) > size:
        raise CorruptBatchError(f"{what}: a record runs past the end of its batch")
    w = words[pos]
    stop = ~w & _STOP_BITS
    lowest = stop & (~stop + np.uint32(1))  # the stop bit of the varint's last byte
    mask = (lowest << np.uint32(1)) - np.uint32(1)  # its bytes (all four when no stop bit)
    v = w & mask & _LOW_7
    v = (v & np.uint32(0x007F007F)) | ((v & np.uint32(0x7F007F00)) >> np.uint32(1))
    v = (v & np.uint32(0x00003FFF)) | ((v & np.uint32(0x3FFF0000)) >> np.uint32(2))
    value = v.astype(np.uint64)
    after: Ints = pos + (np.bitwise_count(mask) >> np.uint8(3))
    longer = np.flatnonzero(stop == 0)
    if longer.size:
        value[longer], after[longer] = _varints_bytewise(data, pos[longer], max_bytes, what)
    return value, after


def _varints_bytewise(
    data: npt.NDArray[np.uint8], pos: Ints, max_bytes: int, what: str
) -> tuple[npt.NDArray[np.uint64], Ints]:
    """:func:`_varints` a byte at a time (only the lanes still open read another byte)."""
    b = data[pos]
    value = b.astype(np.uint64)
    after = pos + 1
    more = np.flatnonzero(b >= 0x80)
    if not more.size:
        return value, after
    value[more] &= np.uint64(0x7F)
    for k in range(1, max_bytes):
        part = data[pos[more] + k].astype(np.uint64)
        value[more] |= (part & np.uint64(0x7F)) << np.uint64(7 * k)
        after[more] += 1
        more = more[part >= 0x80]
        if not more.size:
            return value, after
    raise CorruptBatchError(f"{what}: varint longer than {max_bytes} bytes")


def _zigzag(value: npt.NDArray[np.uint64]) -> Ints:
    """Zigzag-decoded int64 of unsigned lanes."""
    half = (value >> np.uint64(1)).astype(np.int64)
    sign = -(value & np.uint64(1)).astype(np.int64)
    out: Ints = half ^ sign
    return out


def _gather_binary(
    buffer: pa.Buffer, size: int, start: Ints, length: Ints, null: npt.NDArray[np.bool_] | None
) -> pa.Array:
    """Binary column of the bytes [start, start + length) of ``buffer`` per lane (null where
    ``null``).

    The ranges are ordered and disjoint, so [start0, stop0, start1, stop1, ..., size] are the
    offsets of a binary array over ``buffer`` itself whose even elements are the wanted
    values and odd ones the bytes between them; taking the even elements copies the values
    out contiguously in one kernel.
    """
    n = len(start)
    if size >= 1 << 31:
        raise CorruptBatchError(f"a chunk of {size} bytes is too large for one Arrow batch")
    bounds = np.empty(2 * n + 1, np.int32)
    bounds[0 : 2 * n : 2] = start
    bounds[1 : 2 * n : 2] = start + length
    bounds[2 * n] = size
    both = pa.Array.from_buffers(pa.binary(), 2 * n, [None, pa.py_buffer(bounds), buffer])
    values = pc.take(both, pa.array(np.arange(0, 2 * n, 2, dtype=np.int64)))
    if null is None:
        return values
    validity = pa.array(~null).buffers()[1]
    return pa.Array.from_buffers(
        pa.binary(), n, [validity, values.buffers()[1], values.buffers()[2]], offset=0
    )


def _per_record(counts: Ints, values: Sequence[int], dtype: type) -> npt.NDArray[Any]:
    return np.repeat(np.array(values, dtype), counts)


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


def _frame(
    words: npt.NDArray[np.uint32],
    data: npt.NDArray[np.uint8],
    size: int,
    starts: Ints,
    last_lanes: Ints,
    block_ends: Ints,
) -> tuple[Ints, Ints] | None:
    """For records at ``starts`` (ascending, the first of every batch at the start of its
    block): the position after each one's length varint and its end; None when the ends do
    not chain, i.e. when a record does not end where the next of its batch begins (the last
    of a batch, lane ``last_lanes[i]``, at ``block_ends[i]``).

    Records are stored back to back in their block, so this one check says that ``starts``
    are exactly the records' positions.
    """
    length_zz, after = _varints(words, data, size, starts, 5, "record length")
    length = _zigzag(length_zz)
    ends = after + length
    expected = np.empty_like(starts)
    expected[:-1] = starts[1:]
    expected[last_lanes] = block_ends
    if not np.array_equal(ends, expected):
        return None
    if int(length.min()) < 6:
        raise CorruptBatchError("a record declares a length below the smallest record")
    return after, ends


def decode_chunk(
    data: bytes,
    topic: str,
    partition: int,
    start: int,
    end: int | None,
    *,
    include_headers: bool = False,
    verify_crc: bool = True,
    aborted: Iterable[tuple[int, int]] = (),
) -> Decoded:
    """The records of ``data`` with ``start <= offset < end`` (``end`` None: no bound),
    without those of the ``aborted`` transactions (read_committed: the fetch answer's
    (producer id, first offset) list).

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
    skip = AbortedTransactions(aborted)
    for pos, header in found:
        next_offset = max(next_offset, header.next_offset)
        # Asked of every batch in order: it follows where aborted transactions end.
        skipped = skip.skips(data, pos, header)
        if skipped or header.record_count == 0 or header.last_offset < start:
            continue
        if end is not None and header.base_offset >= end:
            continue
        kept.append((pos, header))
    if not kept:
        return Decoded(None, next_offset, len(found))

    blocks: list[tuple[int, int, int, int]] = []
    if all(h.compression == 0 for _, h in kept):
        # Uncompressed blocks are read where they lie: one copy of the chunk, for padding.
        for pos, header in kept:
            blocks.append(
                (pos + HEADER_SIZE, pos + header.size, header.record_count, header.base_offset)
            )
        size = len(data)
        buf = bytes(data) + _PAD
    else:
        # One byte before the first block: every record has a byte before it (see
        # _uniform_fields, which reads each record's head from there).
        pieces: list[bytes] = [b"\x00"]
        at = 1
        for pos, header in kept:
            block = records_block(data, pos, header)
            pieces.append(block)
            blocks.append((at, at + len(block), header.record_count, header.base_offset))
            at += len(block)
        size = at
        pieces.append(_PAD)
        buf = b"".join(pieces)
    buffer = pa.py_buffer(buf)
    raw = np.frombuffer(buf, np.uint8)
    words = _words(buf)
    counts = np.array([h.record_count for _, h in kept], np.int64)
    n = int(counts.sum())
    last_lanes = np.cumsum(counts) - 1
    block_ends = np.array([b[1] for b in blocks], np.int64)

    starts = _guess_whole(buf, blocks)
    fields = None if starts is None else _uniform_fields(buf, starts, block_ends, last_lanes)
    if fields is None:
        framed = None
        if starts is not None:
            # A wrong guess may read anything: only the general placing below reports errors.
            with contextlib.suppress(CorruptBatchError):
                framed = _frame(words, raw, size, starts, last_lanes, block_ends)
        if framed is None:
            starts = _record_starts(buf, raw, size, blocks)
            framed = _frame(words, raw, size, starts, last_lanes, block_ends)
            if framed is None:
                raise CorruptBatchError("record lengths do not add up to their batch")
            # Placed where the whole-batch guess was wrong (a timestamp delta varint that
            # widens within a batch): runs of one size may still make up every batch.
            fields = _uniform_fields(buf, starts, block_ends, last_lanes)
        if fields is None:
            fields = _general_fields(words, raw, size, buffer, framed)

    deltas = fields.offset_delta
    bases = _per_record(counts, [h.base_offset for _, h in kept], np.int64)
    last_deltas = _per_record(counts, [h.last_offset_delta for _, h in kept], np.int64)
    if int(deltas.min()) < 0 or (deltas > last_deltas).any():
        raise CorruptBatchError("an offset delta lies outside its batch")
    offsets = bases + deltas
    if n > 1 and int(np.diff(offsets).min()) <= 0:
        raise CorruptBatchError("record offsets do not rise strictly")

    append_time = [h.is_log_append_time for _, h in kept]
    ts_base = _per_record(
        counts,
        [h.max_timestamp if h.is_log_append_time else h.base_timestamp for _, h in kept],
        np.int64,
    )
    if any(append_time):
        keep_delta = ~_per_record(counts, append_time, np.bool_)
        ts_ms = ts_base + np.where(keep_delta, fields.timestamp_delta, 0)
    else:
        ts_ms = ts_base + fields.timestamp_delta
    timestamps = pa.Array.from_buffers(TIMESTAMP_TYPE, n, [None, pa.py_buffer(ts_ms * 1000)])
    ts_type = pa.array(_per_record(counts, [int(a) for a in append_time], np.int32))
    keys, values, has_headers = fields.keys, fields.values, fields.has_headers

    columns = [
        keys,
        values,
        pa.repeat(pa.scalar(topic, pa.string()), n),
        pa.repeat(pa.scalar(partition, pa.int32()), n),
        pa.array(offsets),
        timestamps,
        ts_type,
    ]
    if include_headers:
        columns.append(_headers_column(data, kept, has_headers, n))
    batch = pa.RecordBatch.from_arrays(columns, schema=arrow_schema(include_headers))
    first = kept[0][1].base_offset
    last = kept[-1][1].last_offset
    if first < start or (end is not None and last >= end):
        mask = offsets >= start
        if end is not None:
            mask &= offsets < end
        batch = batch.filter(pa.array(mask))
    return Decoded(batch if batch.num_rows else None, next_offset, len(found))


@dataclass(frozen=True, slots=True)
class _Fields:
    """Every record's fields but its offset's and timestamp's base (those are per batch)."""

    timestamp_delta: Ints
    offset_delta: Ints
    keys: pa.Array
    values: pa.Array
    has_headers: bool


def _length_prefixed(
    words: npt.NDArray[np.uint32],
    raw: npt.NDArray[np.uint8],
    size: int,
    pos: Ints,
    end: Ints,
    what: str,
) -> tuple[Ints, Ints, Ints]:
    """Lane-wise (start, length, end) of the byte strings at ``pos`` (a zigzag length
    varint, then the bytes; -1: null), checked to stay inside their records."""
    length_zz, start = _varints(words, raw, size, pos, 5, f"{what} length")
    _check_inside(start, end, f"{what} length")
    length = _zigzag(length_zz)
    if int(length.min()) < -1:
        raise CorruptBatchError(f"a record has a {what} length below -1")
    after: Ints = start + np.maximum(length, 0)
    _check_inside(after, end, what)
    return start, length, after


def _general_fields(
    words: npt.NDArray[np.uint32],
    raw: npt.NDArray[np.uint8],
    size: int,
    buffer: pa.Buffer,
    framed: tuple[Ints, Ints],
) -> _Fields:
    """The fields of records of any shape, read lane by lane: each varint where the one
    before it ended; keys and values gathered from ``buffer``."""
    pos_arr, end_arr = framed
    n = len(pos_arr)
    # attributes (one byte, unused) then the timestamp delta
    ts_delta, pos_arr = _varints(words, raw, size, pos_arr + 1, 10, "timestamp delta")
    _check_inside(pos_arr, end_arr, "timestamp delta")
    off_delta, pos_arr = _varints(words, raw, size, pos_arr, 5, "offset delta")
    _check_inside(pos_arr, end_arr, "offset delta")
    key_start, key_len, pos_arr = _length_prefixed(words, raw, size, pos_arr, end_arr, "key")
    val_start, val_len, pos_arr = _length_prefixed(words, raw, size, pos_arr, end_arr, "value")
    key_null, key_bytes = key_len == -1, np.maximum(key_len, 0)
    val_null, val_bytes = val_len == -1, np.maximum(val_len, 0)
    no_headers = raw[pos_arr] == 0  # the header count (pos_arr <= size: padding)
    # A record without headers ends right after its (zero) header count.
    if (no_headers & (pos_arr + 1 != end_arr)).any():
        raise CorruptBatchError("a record's fields do not add up to its length")
    if bool(key_null.all()):
        keys = pa.nulls(n, pa.binary())
    else:
        keys = _gather_binary(buffer, size, key_start, key_bytes, key_null)
    values = _gather_binary(
        buffer, size, val_start, val_bytes, val_null if bool(val_null.any()) else None
    )
    return _Fields(_zigzag(ts_delta), _zigzag(off_delta), keys, values, not bool(no_headers.all()))


# Records read as rows of a 2-D array (see _uniform_fields) only when the runs of records of
# one size are at least this long on average; shorter runs cost more per run than they save.
_RUN_MIN = 16
# The smallest record: length, attributes, timestamp delta, offset delta, key length, value
# length and header count varints of one byte each.
_SMALLEST_RECORD = 7


@dataclass(frozen=True, slots=True)
class _Layout:
    """Where the fields of a record without headers lie, from its first byte: the timestamp
    and offset delta varints (position, width), where the value's bytes begin, the key's
    bytes (position, length; -1 for null) and the value's length (-1 for null). The header
    count, 0, is the record's last byte."""

    timestamp: tuple[int, int]
    offset: tuple[int, int]
    value_at: int
    key: tuple[int, int]
    value_length: int


def _layout(buf: bytes, p: int, size: int) -> _Layout | None:
    """The layout of the record of ``size`` bytes at ``p`` if it has no headers and its
    fields fill it exactly; None otherwise (the general path decides what is wrong)."""
    end = p + size
    try:
        _, q = _slow_uvarint(buf, p, 5, "record length")
        t = q + 1  # after the attributes byte
        _, o = _slow_uvarint(buf, t, 10, "timestamp delta")
        _, k = _slow_uvarint(buf, o, 5, "offset delta")
        key_zz, kd = _slow_uvarint(buf, k, 5, "key length")
        key_len = (key_zz >> 1) ^ -(key_zz & 1)
        value_zz, vd = _slow_uvarint(buf, kd + max(key_len, 0), 5, "value length")
        value_len = (value_zz >> 1) ^ -(value_zz & 1)
    except CorruptBatchError:
        return None
    h = vd + max(value_len, 0)
    if key_len < -1 or value_len < -1 or h + 1 != end or buf[h] != 0:
        return None
    return _Layout((t - p, o - t), (o - p, k - o), vd - p, (kd - p, key_len), value_len)


def _word_varint(words: npt.NDArray[np.uint64], at: int, width: int) -> Ints:
    """Zigzag-decoded varints of ``width`` bytes from byte ``at`` of each row of
    little-endian ``words`` (rows of one or two words)."""
    value = np.zeros(len(words), np.uint64)
    for i in range(width):
        byte = (words[:, (at + i) // 8] >> np.uint64(8 * ((at + i) % 8))) & np.uint64(0x7F)
        value |= byte << np.uint64(7 * i)
    return _zigzag(value)


def _byte_mask(width: int, spans: Sequence[tuple[int, int, int]]) -> npt.NDArray[np.uint64]:
    """Little-endian words of ``width`` bytes with (first byte, bytes, bits of each byte)
    spans set."""
    mask = np.zeros(width, np.uint8)
    for at, count, bits in spans:
        mask[at : at + count] = bits
    return mask.view("<u8")


def _binary_column(parts: list[tuple[npt.NDArray[Any], int, int]], n: int) -> pa.Array:
    """A binary column of ``n`` rows from runs of (each row's bytes as one item, rows,
    length), in order; a length of -1 stands for nulls."""
    lengths = np.array([max(length, 0) for _, _, length in parts], np.int64)
    rows = np.array([m for _, m, _ in parts], np.int64)
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(np.repeat(lengths.astype(np.int32), rows), out=offsets[1:])
    total = int((lengths * rows).sum())
    if total >= 1 << 31:
        raise CorruptBatchError(f"a chunk of {total} value bytes is too large for one column")
    data = np.empty(total, np.uint8)
    at = 0
    for items, m, length in parts:
        if length > 0:
            data[at : at + m * length].view(items.dtype)[...] = items
            at += m * length
    validity = None
    if any(length == -1 for _, _, length in parts):
        valid = np.repeat(np.array([length != -1 for _, _, length in parts]), rows)
        validity = pa.array(valid).buffers()[1]
    return pa.Array.from_buffers(
        pa.binary(), n, [validity, pa.py_buffer(offsets), pa.py_buffer(data)]
    )


def _items(buf: bytes, at: int, rows: int, width: int, stride: int) -> npt.NDArray[Any]:
    """``rows`` items of ``width`` bytes at ``at``, ``at + stride``, ... of ``buf``, each
    one opaque item (numpy copies such an item as one block)."""
    return np.ndarray((rows,), f"V{width}", buffer=buf, offset=at, strides=(stride,))


def _uniform_fields(buf: bytes, starts: Ints, block_ends: Ints, last_lanes: Ints) -> _Fields | None:
    """The fields of records at the guessed ``starts`` if they come in runs of one size and
    one layout (a producer's records with keys and values of one size each), read run by run
    as the rows of a 2-D array; None when the records are not like that (or the guess is
    wrong), for the general path to place and read them.

    A run is a stretch of the records of one batch whose guessed sizes are equal. The first
    record of a run gives the layout (where each field lies, filling the record exactly);
    every row of the run is checked to have it: its length, key length and value length
    varints are byte for byte the first record's, the previous record's header count is 0,
    and its timestamp and offset delta varints have the first record's widths. A row whose
    length is the run's then ends where the next row begins, and the last record of every
    batch ends its block: the guessed positions are the records' positions.
    Two words of every row are copied out (its head and its value length), and keys and
    values run by run, each row's as one block.
    """
    n = len(starts)
    sizes = np.empty(n, np.int64)
    sizes[:-1] = starts[1:] - starts[:-1]
    sizes[last_lanes] = block_ends - starts[last_lanes]
    cut = np.empty(n, np.bool_)
    cut[0] = True
    cut[1:] = sizes[1:] != sizes[:-1]
    cut[last_lanes[:-1] + 1] = True
    firsts = np.flatnonzero(cut)
    if len(firsts) * _RUN_MIN > n:
        return None
    bounds = [*firsts.tolist(), n]
    timestamp: list[Ints] = []
    offset: list[Ints] = []
    keys: list[tuple[npt.NDArray[Any], int, int]] = []
    values: list[tuple[npt.NDArray[Any], int, int]] = []
    for a, b in itertools.pairwise(bounds):
        p, size, m = int(starts[a]), int(sizes[a]), b - a
        if size < _SMALLEST_RECORD or p < 1:
            return None
        layout = _layout(buf, p, size)
        if layout is None:
            return None
        # Of every row: its head, from the byte before it (the previous record's header
        # count) to the key length varint, in one or two 8-byte words, and the value length
        # varint in one. Longer heads are left to the general path.
        key_at, key_len = layout.key
        value_length_at = key_at + max(key_len, 0)
        if key_at > 15:
            return None
        head_width = 8 if key_at <= 7 else 16
        head = _items(buf, p - 1, m, head_width, size).copy().view("<u8").reshape(m, -1)
        tail = _items(buf, p + value_length_at, m, 8, size).copy().view("<u8").reshape(m, 1)
        ts_at, ts_width = layout.timestamp
        od_at, od_width = layout.offset
        head_mask = _byte_mask(
            head_width,
            [
                (1, ts_at - 1, 0xFF),  # record length
                (1 + ts_at, ts_width, 0x80),  # same widths, any value
                (1 + od_at, od_width, 0x80),
                (1 + od_at + od_width, key_at - od_at - od_width, 0xFF),  # key length
            ],
        )
        tail_mask = _byte_mask(8, [(0, layout.value_at - value_length_at, 0xFF)])
        if (
            bool(((head ^ head[0]) & head_mask).any())
            or bool(((tail ^ tail[0]) & tail_mask).any())
            or bool((head[1:, 0] & np.uint64(0xFF)).any())  # header counts
            or buf[p + m * size - 1] != 0  # the last row's
        ):
            return None
        timestamp.append(_word_varint(head, 1 + ts_at, ts_width))
        offset.append(_word_varint(head, 1 + od_at, od_width))
        keys.append((_items(buf, p + key_at, m, max(key_len, 1), size), m, key_len))
        value_len = layout.value_length
        values.append((_items(buf, p + layout.value_at, m, max(value_len, 1), size), m, value_len))
    key_column = (
        pa.nulls(n, pa.binary())
        if all(length == -1 for _, _, length in keys)
        else _binary_column(keys, n)
    )
    return _Fields(
        np.concatenate(timestamp),
        np.concatenate(offset),
        key_column,
        _binary_column(values, n),
        False,
    )


def _check_inside(pos: Ints, end: Ints, what: str) -> None:
    if (pos > end).any():
        raise CorruptBatchError(f"a record's {what} runs past the end of the record")
