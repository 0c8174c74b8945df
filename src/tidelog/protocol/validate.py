"""Structural pre-validation of a message body, run before kio reads it.

kio's reader (native code) is fast but trusts the lengths it reads: it reserves memory for an
array from the declared element count before reading any element, so a count of four billion in
a 20-byte request aborts the whole process with an allocation failure. It also fails on tagged
fields it does not know, which Kafka's specs require readers to skip, and on error codes newer
than its enum.

So before kio sees a body, :func:`check_body` walks it once with the same layout kio will use
(derived from the same kio schema classes), reading only lengths and markers:

- every string, bytes and array length is checked against the bytes left in the enclosing
  frame or tagged field (an array of ``n`` elements needs at least ``n`` times the smallest
  possible element; Kafka's own readers make the same check) -- so kio never allocates more
  than the frame's size;
- varints are at most 5 bytes, length prefixes are -1 (null) or non-negative, nullable-struct
  markers are -1 or 1, a known tagged field's value fills its declared size exactly;
- the body must end exactly at the end of the frame.

When the body holds unknown tagged fields or error codes kio does not know, the walk returns a
rewritten copy without the unknown tags and with such codes replaced by UNKNOWN_SERVER_ERROR
(-1, what Kafka's clients make of a code they do not know). Well-formed, ordinary messages are
passed to kio unchanged and uncopied.

The walk costs Python work per array element and per field, not per byte: ``records`` and
``bytes`` fields are skipped by length.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import Field, fields
from typing import Final

from kio.schema.errors import ErrorCode as KioErrorCode
from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    get_schema_field_type,
    is_optional,
)

from tidelog.protocol.errors import MalformedError, TrailingBytesError, TruncatedError

Edit = tuple[int, int, bytes]
"""Replace buffer[start:end] with the bytes."""
Step = Callable[[memoryview, int, int, list[Edit]], int]
"""Check one value starting at ``pos`` that must end by ``end``; return the position after it."""

_INT16: Final = struct.Struct(">h")
_INT32: Final = struct.Struct(">i")
_UNKNOWN_SERVER_ERROR: Final = _INT16.pack(-1)
_KNOWN_ERROR_CODES: Final = frozenset(int(code) for code in KioErrorCode)

_FIXED_SIZES: Final = {
    "bool": 1,
    "int8": 1,
    "uint8": 1,
    "int16": 2,
    "uint16": 2,
    "int32": 4,
    "uint32": 4,
    "timedelta_i32": 4,
    "int64": 8,
    "uint64": 8,
    "float64": 8,
    "timedelta_i64": 8,
    "datetime_i64": 8,
    "uuid": 16,
}


def read_uvarint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    """An unsigned varint of at most 5 bytes (Kafka's limit for lengths and counts)."""
    result = 0
    for shift in (0, 7, 14, 21, 28):
        if pos >= end:
            raise TruncatedError("varint runs past the end of the data")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
    raise MalformedError("varint longer than 5 bytes")


def encode_uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _truncated(what: str, need: int, have: int) -> TruncatedError:
    return TruncatedError(f"{what} needs {need} bytes but only {have} remain")


# -- primitive steps -------------------------------------------------------------------------


def _fixed(size: int) -> Step:
    def step(buf: memoryview, pos: int, end: int, edits: list[Edit]) -> int:
        if pos + size > end:
            raise _truncated("field", size, end - pos)
        return pos + size

    return step


def _error_code(buf: memoryview, pos: int, end: int, edits: list[Edit]) -> int:
    if pos + 2 > end:
        raise _truncated("error code", 2, end - pos)
    if _INT16.unpack_from(buf, pos)[0] not in _KNOWN_ERROR_CODES:
        edits.append((pos, pos + 2, _UNKNOWN_SERVER_ERROR))
    return pos + 2


def _compact_bytes(buf: memoryview, pos: int, end: int, edits: list[Edit]) -> int:
    length_plus_one, pos = read_uvarint(buf, pos, end)
    if length_plus_one == 0:
        return pos  # null
    length = length_plus_one - 1
    if length > end - pos:
        raise _truncated("compact string", length, end - pos)
    return pos + length


def _legacy_string(buf: memoryview, pos: int, end: int, edits: list[Edit]) -> int:
    if pos + 2 > end:
        raise _truncated("string length", 2, end - pos)
    length: int = _INT16.unpack_from(buf, pos)[0]
    pos += 2
    if length < 0:
        if length == -1:
            return pos  # null
        raise MalformedError(f"negative string length {length}")
    if length > end - pos:
        raise _truncated("string", length, end - pos)
    return pos + length


def _legacy_bytes(buf: memoryview, pos: int, end: int, edits: list[Edit]) -> int:
    if pos + 4 > end:
        raise _truncated("bytes length", 4, end - pos)
    length: int = _INT32.unpack_from(buf, pos)[0]
    pos += 4
    if length < 0:
        if length == -1:
            return pos  # null
        raise MalformedError(f"negative bytes length {length}")
    if length > end - pos:
        raise _truncated("bytes", length, end - pos)
    return pos + length


def _refusing_null(step: Step, what: str, flexible: bool, width: int) -> Step:
    """``step`` for a field the schema does not let be null: a null marker is malformed.

    Kafka refuses such a message ("non-nullable field ... was serialized as null"); letting
    it through would hand the broker a None where every handler expects a value.
    """
    legacy = _INT16 if width == 2 else _INT32

    def checked(buf: memoryview, pos: int, end: int, edits: list[Edit]) -> int:
        if flexible:
            # compact length + 1 == 0; a varint may spell 0 in several bytes (80 00)
            is_null = pos < end and read_uvarint(buf, pos, end)[0] == 0
        else:
            is_null = pos + width <= end and legacy.unpack_from(buf, pos)[0] == -1
        if is_null:
            raise MalformedError(f"non-nullable {what} is null")
        return step(buf, pos, end, edits)

    return checked


# -- composite steps -------------------------------------------------------------------------


def _array(element: Step, element_min_size: int, element_fixed: bool, flexible: bool) -> Step:
    # Any element takes at least one byte in practice; max() guards the bound if it did not.
    unit = max(element_min_size, 1)

    def step(buf: memoryview, pos: int, end: int, edits: list[Edit]) -> int:
        count: int
        if flexible:
            count_plus_one, pos = read_uvarint(buf, pos, end)
            if count_plus_one == 0:
                return pos  # null
            count = count_plus_one - 1
        else:
            if pos + 4 > end:
                raise _truncated("array length", 4, end - pos)
            count = _INT32.unpack_from(buf, pos)[0]
            pos += 4
            if count < 0:
                if count == -1:
                    return pos  # null
                raise MalformedError(f"negative array length {count}")
        if count * unit > end - pos:
            raise TruncatedError(
                f"array of {count} elements cannot fit in the {end - pos} bytes that remain"
            )
        if element_fixed:
            return pos + count * element_min_size
        for _ in range(count):
            pos = element(buf, pos, end, edits)
        return pos

    return step


def _nullable_struct(inner: Step) -> Step:
    def step(buf: memoryview, pos: int, end: int, edits: list[Edit]) -> int:
        if pos >= end:
            raise _truncated("struct marker", 1, 0)
        marker = buf[pos]
        if marker == 0xFF:  # -1 as int8: null
            return pos + 1
        if marker != 1:
            raise MalformedError(f"nullable struct marker {marker} is neither -1 nor 1")
        return inner(buf, pos + 1, end, edits)

    return step


def _apply_edits(buf: memoryview, start: int, end: int, edits: list[Edit]) -> bytes:
    parts: list[bytes | memoryview] = []
    last = start
    for edit_start, edit_end, replacement in sorted(edits):
        parts.append(buf[last:edit_start])
        parts.append(replacement)
        last = edit_end
    parts.append(buf[last:end])
    return b"".join(parts)


def _tagged_fields(known: dict[int, Step]) -> Step:
    def step(buf: memoryview, pos: int, end: int, edits: list[Edit]) -> int:
        section_start = pos
        count, pos = read_uvarint(buf, pos, end)
        # Each tagged field takes at least two bytes (tag and size varints).
        if count * 2 > end - pos:
            raise TruncatedError(f"{count} tagged fields cannot fit in {end - pos} bytes")
        kept: list[bytes | tuple[int, int]] = []
        changed = False
        for _ in range(count):
            entry_start = pos
            tag, pos = read_uvarint(buf, pos, end)
            size, pos = read_uvarint(buf, pos, end)
            if size > end - pos:
                raise _truncated(f"tagged field {tag}", size, end - pos)
            value_end = pos + size
            value_step = known.get(tag)
            if value_step is None:
                changed = True  # unknown tag: skipped, as Kafka's readers do
            else:
                mark = len(edits)
                after = value_step(buf, pos, value_end, edits)
                if after != value_end:
                    raise MalformedError(
                        f"tagged field {tag} declares {size} bytes but its value takes "
                        f"{after - pos}"
                    )
                if len(edits) > mark:
                    # Something inside the value changed size or content: re-encode the entry
                    # (its size prefix may change) and fold the inner edits into it.
                    value = _apply_edits(buf, pos, value_end, edits[mark:])
                    del edits[mark:]
                    kept.append(encode_uvarint(tag) + encode_uvarint(len(value)) + value)
                    changed = True
                else:
                    kept.append((entry_start, value_end))
            pos = value_end
        if changed:
            entries = [
                entry if isinstance(entry, bytes) else bytes(buf[entry[0] : entry[1]])
                for entry in kept
            ]
            edits.append((section_start, pos, encode_uvarint(len(entries)) + b"".join(entries)))
        return pos

    return step


def _sequence(steps: list[Step]) -> Step:
    def step(buf: memoryview, pos: int, end: int, edits: list[Edit]) -> int:
        for field_step in steps:
            pos = field_step(buf, pos, end, edits)
        return pos

    return step


# -- compiling a kio class into steps --------------------------------------------------------


class _Compiled:
    __slots__ = ("fixed", "min_size", "step")

    def __init__(self, step: Step, min_size: int, fixed: bool) -> None:
        self.step = step
        self.min_size = min_size
        # Every value takes exactly min_size bytes: arrays of it are checked by arithmetic alone.
        self.fixed = fixed


_compiled: dict[type, _Compiled] = {}


def _primitive(kafka_type: str, flexible: bool, nullable: bool = True) -> tuple[Step, int, bool]:
    """(step, minimum size, whether the size is fixed) of a primitive kafka type."""
    if kafka_type == "error_code":
        return _error_code, 2, False  # not "fixed": arrays must visit each code
    size = _FIXED_SIZES.get(kafka_type)
    if size is not None:
        return _fixed(size), size, True
    if kafka_type in ("string", "bytes", "records"):
        step: Step
        if flexible:
            step, width = _compact_bytes, 1
        elif kafka_type == "string":
            step, width = _legacy_string, 2
        else:
            step, width = _legacy_bytes, 4
        if not nullable:
            step = _refusing_null(step, kafka_type, flexible, width)
        return step, width, False
    raise NotImplementedError(f"no wire layout known for kafka type {kafka_type!r}")


def _compile_field(field_type: Field[object], flexible: bool) -> tuple[Step, int, bool]:
    """(step, minimum size, whether the size is fixed) of one dataclass field of a kio entity."""
    kind = classify_field(field_type)
    optional = is_optional(field_type)
    is_tagged = get_field_tag(field_type) is not None
    if isinstance(kind, PrimitiveField):
        return _primitive(get_schema_field_type(field_type), flexible, optional)
    if isinstance(kind, PrimitiveTupleField):
        element, element_size, fixed = _primitive(get_schema_field_type(field_type), flexible)
        return _array_field(_array(element, element_size, fixed, flexible), flexible, optional)
    if isinstance(kind, EntityField):
        inner = compile_entity(kind.type_)
        # Tagged struct fields are written without a null marker.
        if optional and not is_tagged:
            return _nullable_struct(inner.step), 1, False
        return inner.step, inner.min_size, inner.fixed
    if isinstance(kind, EntityTupleField):
        inner = compile_entity(kind.type_)
        return _array_field(
            _array(inner.step, inner.min_size, inner.fixed, flexible), flexible, optional
        )
    raise NotImplementedError(f"unclassified field {field_type!r}")


def _array_field(step: Step, flexible: bool, nullable: bool) -> tuple[Step, int, bool]:
    if not nullable:
        step = _refusing_null(step, "array", flexible, 4)
    return step, 1 if flexible else 4, False


def compile_entity(entity_type: type) -> _Compiled:
    """The validation step of a kio entity class (cached)."""
    compiled = _compiled.get(entity_type)
    if compiled is not None:
        return compiled
    flexible = bool(getattr(entity_type, "__flexible__"))  # noqa: B009 -- kio class attribute
    steps: list[Step] = []
    known_tags: dict[int, Step] = {}
    min_size = 0
    fixed = not flexible
    for entity_field in fields(entity_type):
        step, field_min, field_fixed = _compile_field(entity_field, flexible)
        tag = get_field_tag(entity_field)
        if tag is None:
            steps.append(step)
            min_size += field_min
            fixed = fixed and field_fixed
        else:
            known_tags[int(tag)] = step
    if flexible:
        steps.append(_tagged_fields(known_tags))
        min_size += 1
    compiled = _Compiled(steps[0] if len(steps) == 1 else _sequence(steps), min_size, fixed)
    _compiled[entity_type] = compiled
    return compiled


def check_body(
    entity_type: type, buf: memoryview, start: int, *, ignore_trailing: bool = False
) -> tuple[memoryview, int]:
    """Check that ``buf[start:]`` is exactly one well-formed ``entity_type``.

    Returns the buffer and offset kio should read from: ``(buf, start)`` unchanged (cut
    at the end of the message), or a rewritten copy (unknown tags dropped, unknown error
    codes replaced) and 0. With ``ignore_trailing`` bytes after the message are dropped
    instead of refused: Kafka's brokers ignore them in requests, and librdkafka sends
    some (three stray bytes after an all-topics Metadata v12/v13 request).

    :raises TruncatedError, MalformedError, TrailingBytesError: the body is not well formed.
    """
    end = len(buf)
    edits: list[Edit] = []
    after = compile_entity(entity_type).step(buf, start, end, edits)
    if after != end:
        if not ignore_trailing:
            raise TrailingBytesError(f"{end - after} bytes follow the end of the message")
        buf, end = buf[:after], after
    if not edits:
        return buf, start
    return memoryview(_apply_edits(buf, start, end, edits)), 0
