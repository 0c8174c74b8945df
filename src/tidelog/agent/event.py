"""One event as the agent stores it: the record body shared by the socket protocol and the queue.

Record body (big-endian)::

    timestamp     int64   epoch milliseconds (CreateTime of the Kafka record)
    key_len       int32   -1 for a null key
    value_len     int32   -1 for a null value
    header_count  uint16
    key           key_len bytes
    value         value_len bytes
    header_count times:
        name_len  uint16
        name      name_len bytes, UTF-8
        value_len int32   -1 for a null header value
        value     value_len bytes

The socket client encodes this body once; the daemon checks it (:func:`check_body`), reads the
key from it and stores it unchanged behind the entry header of :mod:`tidelog.agent.queue`, so
an event is never re-encoded between the application and the disk queue.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Sequence

from tidelog.agent.errors import EventFormatError

_FIXED = struct.Struct(">qiiH")
FIXED_SIZE = _FIXED.size
_NAME_LEN = struct.Struct(">H")
_HVALUE_LEN = struct.Struct(">i")

Headers = Sequence[tuple[str, bytes | None]]


def event_timestamp(timestamp: object) -> int:
    """The CreateTime of an event: ``timestamp`` (epoch milliseconds, from 0 as Kafka's
    producer demands) or, for None, now."""
    if timestamp is None:
        return int(time.time() * 1000)
    if type(timestamp) is not int or not 0 <= timestamp < 1 << 63:
        raise EventFormatError(
            f"timestamp must be epoch milliseconds from 0, got {timestamp!r:.40}"
        )
    return timestamp


def encode_body(
    key: bytes | None, value: bytes | None, headers: Headers | None, timestamp: int
) -> bytes:
    """The body of one event.

    :raises EventFormatError: an argument of the wrong type or out of range.
    """
    try:
        parts = [
            _FIXED.pack(
                timestamp,
                -1 if key is None else len(key),
                -1 if value is None else len(value),
                len(headers) if headers else 0,
            )
        ]
        if key is not None:
            parts.append(key)
        if value is not None:
            parts.append(value)
        if headers:
            for name, hvalue in headers:
                raw = name.encode("utf-8")
                parts.append(_NAME_LEN.pack(len(raw)))
                parts.append(raw)
                parts.append(_HVALUE_LEN.pack(-1 if hvalue is None else len(hvalue)))
                if hvalue is not None:
                    parts.append(hvalue)
        return b"".join(parts)
    except (TypeError, ValueError, AttributeError, struct.error):
        raise EventFormatError(_what_is_wrong(key, value, headers, timestamp)) from None


def encode_bodies(
    events: Sequence[tuple[bytes | None, bytes | None]], timestamp: int
) -> list[bytes]:
    """``encode_body(key, value, None, timestamp)`` of each (key, value), in one pass."""
    pack = _FIXED.pack
    try:
        return [
            b"".join(
                (
                    pack(
                        timestamp,
                        -1 if key is None else len(key),
                        -1 if value is None else len(value),
                        0,
                    ),
                    key or b"",
                    value or b"",
                )
            )
            for key, value in events
        ]
    except (TypeError, ValueError, struct.error):
        for index, event in enumerate(events):
            try:
                key, value = event
                encode_body(key, value, None, timestamp)
            except (TypeError, ValueError):
                raise EventFormatError(
                    f"event {index}: expected a (key, value) pair, got {event!r:.80}"
                ) from None
            except EventFormatError as exc:
                raise EventFormatError(f"event {index}: {exc}") from None
        raise


def _what_is_wrong(key: object, value: object, headers: object, timestamp: object) -> str:
    """Why :func:`encode_body` could not encode these arguments, in one line."""
    for name, field in (("key", key), ("value", value)):
        if field is not None and not isinstance(field, (bytes, bytearray, memoryview)):
            return f"{name} must be bytes or None, not {type(field).__name__}"
    if type(timestamp) is not int or not 0 <= timestamp < 1 << 63:
        return f"timestamp must be epoch milliseconds from 0, got {timestamp!r:.40}"
    if not isinstance(headers, (list, tuple)):
        return f"headers must be a list of (name, value) pairs, not {type(headers).__name__}"
    for header in headers:
        if not isinstance(header, tuple | list) or len(header) != 2:
            return f"a header must be a (name, value) pair, got {header!r:.80}"
        name, hvalue = header
        if not isinstance(name, str):
            return f"a header name must be a str, not {type(name).__name__}"
        if len(name.encode("utf-8", "surrogatepass")) > 0xFFFF:
            return "a header name is longer than 65535 bytes"
        if hvalue is not None and not isinstance(hvalue, (bytes, bytearray, memoryview)):
            return (
                f"header {name!r:.40} must have a bytes value or None, not {type(hvalue).__name__}"
            )
    return "the event cannot be encoded (a key, value or header larger than 2 GiB?)"


def check_body(body: bytes | memoryview) -> bytes | None:
    """Check that ``body`` is one well-formed record body; return its key.

    :raises EventFormatError: lengths that do not add up to the body's size.
    """
    return check_body_at(body, 0, len(body))


def check_body_at(data: bytes | bytearray | memoryview, start: int, end: int) -> bytes | None:
    """:func:`check_body` of ``data[start:end]``, without slicing it out first."""
    size = end - start
    if size < FIXED_SIZE:
        raise EventFormatError(f"event body of {size} bytes is shorter than its fixed part")
    timestamp, key_len, value_len, count = _FIXED.unpack_from(data, start)
    if timestamp < 0:
        # As event_timestamp() refuses; a parked queue also tells its entries apart by it.
        raise EventFormatError(f"timestamp must be epoch milliseconds from 0, got {timestamp}")
    if key_len < -1 or value_len < -1:
        raise EventFormatError("negative key or value length")
    pos = start + FIXED_SIZE + (key_len if key_len > 0 else 0) + (value_len if value_len > 0 else 0)
    if pos > end:
        raise EventFormatError("key and value run past the end of the event")
    key = None if key_len < 0 else bytes(data[start + FIXED_SIZE : start + FIXED_SIZE + key_len])
    for _ in range(count):
        if pos + 2 > end:
            raise EventFormatError("header name length runs past the end of the event")
        (name_len,) = _NAME_LEN.unpack_from(data, pos)
        pos += 2 + name_len
        if pos + 4 > end:
            raise EventFormatError("header runs past the end of the event")
        try:
            bytes(data[pos - name_len : pos]).decode("utf-8")
        except UnicodeDecodeError:
            raise EventFormatError("header name is not UTF-8") from None
        (hlen,) = _HVALUE_LEN.unpack_from(data, pos)
        if hlen < -1:
            raise EventFormatError("negative header value length")
        pos += 4 + max(hlen, 0)
        if pos > end:
            raise EventFormatError("header value runs past the end of the event")
    if pos != end:
        raise EventFormatError(f"{end - pos} stray bytes after the event")
    return key


def decode_body(
    body: bytes | memoryview,
) -> tuple[int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]:
    """(timestamp, key, value, headers) of a body already checked by :func:`check_body`."""
    timestamp, key_len, value_len, count = _FIXED.unpack_from(body, 0)
    pos = FIXED_SIZE
    key = None
    if key_len >= 0:
        key = bytes(body[pos : pos + key_len])
        pos += key_len
    value = None
    if value_len >= 0:
        value = bytes(body[pos : pos + value_len])
        pos += value_len
    headers: list[tuple[str, bytes | None]] = []
    for _ in range(count):
        (name_len,) = _NAME_LEN.unpack_from(body, pos)
        pos += 2
        name = bytes(body[pos : pos + name_len]).decode("utf-8")
        pos += name_len
        (hlen,) = _HVALUE_LEN.unpack_from(body, pos)
        pos += 4
        hvalue = None
        if hlen >= 0:
            hvalue = bytes(body[pos : pos + hlen])
            pos += hlen
        headers.append((name, hvalue))
    return timestamp, key, value, headers
