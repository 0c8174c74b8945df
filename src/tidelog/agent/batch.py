"""A RecordBatch v2 straight from stored event bodies, without decoding them first.

The sender's hot path: each body (:mod:`tidelog.agent.event`) is turned into a Kafka record
by re-framing its fields as varints (from the records package's table) — the key, value and
header bytes are sliced, never copied into Python objects — and
:func:`tidelog.records.seal_batch` writes the header and CRC once. The result is byte for
byte what
:class:`tidelog.records.BatchBuilder` produces for the same records (a test holds them
together).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from tidelog.agent.event import FIXED_SIZE
from tidelog.records import Compression, seal_batch
from tidelog.records.varint import SMALL_VARINTS, varlong_bytes

_FIXED = struct.Struct(">qiiH")
_U16 = struct.Struct(">H")
_I32 = struct.Struct(">i")
_varint = varlong_bytes


def build_batch(
    bodies: Sequence[bytes | memoryview],
    *,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    compression: Compression = Compression.NONE,
) -> bytes:
    """One batch holding ``bodies`` (checked bodies, at least one) in order."""
    if not bodies:
        raise ValueError("a record batch needs at least one record")
    small = SMALL_VARINTS
    null = b"\x01"
    parts: list[bytes | memoryview] = []
    append = parts.append
    base_ts = max_ts = _FIXED.unpack_from(bodies[0], 0)[0]
    for delta, body in enumerate(bodies):
        ts, key_len, value_len, count = _FIXED.unpack_from(body, 0)
        if ts > max_ts:
            max_ts = ts
        pos = FIXED_SIZE
        ts_delta = ts - base_ts
        head = [b"\x00", small[ts_delta] if 0 <= ts_delta < 16384 else _varint(ts_delta)]
        head.append(small[delta] if delta < 16384 else _varint(delta))
        pieces: list[bytes | memoryview] = head
        if key_len < 0:
            pieces.append(null)
        else:
            pieces.append(_varint(key_len))
            pieces.append(body[pos : pos + key_len])
            pos += key_len
        if value_len < 0:
            pieces.append(null)
        else:
            pieces.append(_varint(value_len))
            pieces.append(body[pos : pos + value_len])
            pos += value_len
        if count == 0:
            pieces.append(b"\x00")
        else:
            pieces.append(_varint(count))
            for _ in range(count):
                (name_len,) = _U16.unpack_from(body, pos)
                pos += 2
                pieces.append(_varint(name_len))
                pieces.append(body[pos : pos + name_len])
                pos += name_len
                (hlen,) = _I32.unpack_from(body, pos)
                pos += 4
                if hlen < 0:
                    pieces.append(null)
                else:
                    pieces.append(_varint(hlen))
                    pieces.append(body[pos : pos + hlen])
                    pos += hlen
        record = b"".join(pieces)
        append(_varint(len(record)))
        append(record)
    records: bytes = b"".join(parts)
    return seal_batch(
        records,
        record_count=len(bodies),
        last_offset_delta=len(bodies) - 1,
        base_timestamp=base_ts,
        max_timestamp=max_ts,
        compression=compression,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
    )
