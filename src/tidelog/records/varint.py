"""Kafka's variable-length integers: zigzag, then base-128 little-endian groups.

A signed value ``n`` is first mapped to an unsigned one by zigzag
(``(n << 1) ^ (n >> 63)``: 0, -1, 1, -2, ... become 0, 1, 2, 3, ...), then written
seven bits at a time, least significant group first, with the high bit of each byte
set while more bytes follow. A ``varint`` carries an int32 (at most 5 bytes), a
``varlong`` an int64 (at most 10 bytes). Record batch v2 uses them for every
per-record field; the batch header uses fixed-width big-endian integers instead.

Encoding serves builders (one call per field, with a table for the common one-byte
case); decoding here is the careful general form used by tests and by the control
and record readers' slow paths — the record reader inlines its own one-byte fast path.
"""

from __future__ import annotations

from tidelog.records.errors import CorruptBatchError, TruncatedBatchError

INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
MAX_VARINT_BYTES = 5
MAX_VARLONG_BYTES = 10

# Encoded form of every value whose zigzag fits one byte (-64 .. 63), indexed by zigzag.
_ONE_BYTE: tuple[bytes, ...] = tuple(bytes((i,)) for i in range(128))


def zigzag(value: int) -> int:
    """Map a signed int64 to the unsigned value Kafka's varints carry."""
    return ((value << 1) ^ (value >> 63)) & 0xFFFFFFFFFFFFFFFF


def unzigzag(value: int) -> int:
    """Inverse of :func:`zigzag`."""
    return (value >> 1) ^ -(value & 1)


def _encode_unsigned(zz: int) -> bytes:
    if zz < 0x80:
        return _ONE_BYTE[zz]
    out = bytearray()
    while zz >= 0x80:
        out.append((zz & 0x7F) | 0x80)
        zz >>= 7
    out.append(zz)
    return bytes(out)


#: Zigzag varints of 0 .. 2**14 - 1 (one or two bytes). Record lengths, offset deltas,
#: timestamp deltas and key/value lengths of a batch nearly always fall here, so encoders on
#: hot paths index this table instead of calling a function: ``SMALL_VARINTS[n]``.
SMALL_VARINT_LIMIT = 1 << 14
SMALL_VARINTS: tuple[bytes, ...] = tuple(
    _encode_unsigned((n << 1) & 0xFFFFFFFF) for n in range(SMALL_VARINT_LIMIT)
)


def varlong_bytes(value: int) -> bytes:
    """Zigzag varlong of ``value``, from the table when it is small and not negative.

    For encoders that already know their values fit (lengths and deltas they computed)."""
    if 0 <= value < SMALL_VARINT_LIMIT:
        return SMALL_VARINTS[value]
    return _encode_unsigned(((value << 1) ^ (value >> 63)) & 0xFFFFFFFFFFFFFFFF)


def encode_varint(value: int) -> bytes:
    """Zigzag varint of an int32 (1 to 5 bytes)."""
    if not INT32_MIN <= value <= INT32_MAX:
        raise ValueError(f"varint value {value} is outside the int32 range")
    return _encode_unsigned(((value << 1) ^ (value >> 31)) & 0xFFFFFFFF)


def encode_varlong(value: int) -> bytes:
    """Zigzag varlong of an int64 (1 to 10 bytes)."""
    if not INT64_MIN <= value <= INT64_MAX:
        raise ValueError(f"varlong value {value} is outside the int64 range")
    return _encode_unsigned(((value << 1) ^ (value >> 63)) & 0xFFFFFFFFFFFFFFFF)


def size_of_varint(value: int) -> int:
    """Bytes :func:`encode_varint` / :func:`encode_varlong` would produce for ``value``."""
    zz = ((value << 1) ^ (value >> 63)) & 0xFFFFFFFFFFFFFFFF
    size = 1
    while zz >= 0x80:
        zz >>= 7
        size += 1
    return size


def read_unsigned(
    buf: bytes | bytearray | memoryview, pos: int, end: int, max_bytes: int
) -> tuple[int, int]:
    """Read the unsigned base-128 groups at ``pos`` (before un-zigzag); returns (value, next).

    ``end`` bounds the read (the end of the enclosing field or batch), ``max_bytes`` is
    5 for a varint and 10 for a varlong.
    """
    result = 0
    shift = 0
    for i in range(max_bytes):
        if pos + i >= end:
            raise TruncatedBatchError(f"varint at position {pos} runs past the end ({end})")
        byte = buf[pos + i]
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos + i + 1
        shift += 7
    raise CorruptBatchError(f"varint at position {pos} is longer than {max_bytes} bytes")


def decode_varint(
    buf: bytes | bytearray | memoryview, pos: int = 0, end: int | None = None
) -> tuple[int, int]:
    """Read a zigzag varint (int32) at ``pos``; returns ``(value, next_position)``."""
    zz, nxt = read_unsigned(buf, pos, len(buf) if end is None else end, MAX_VARINT_BYTES)
    if zz > 0xFFFFFFFF:
        raise CorruptBatchError(f"varint at position {pos} does not fit in 32 bits")
    return (zz >> 1) ^ -(zz & 1), nxt


def decode_varlong(
    buf: bytes | bytearray | memoryview, pos: int = 0, end: int | None = None
) -> tuple[int, int]:
    """Read a zigzag varlong (int64) at ``pos``; returns ``(value, next_position)``."""
    zz, nxt = read_unsigned(buf, pos, len(buf) if end is None else end, MAX_VARLONG_BYTES)
    if zz > 0xFFFFFFFFFFFFFFFF:
        raise CorruptBatchError(f"varlong at position {pos} does not fit in 64 bits")
    return (zz >> 1) ^ -(zz & 1), nxt
