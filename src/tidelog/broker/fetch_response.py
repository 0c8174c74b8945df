"""Fetch responses laid out by hand around file regions, for zero-copy sending.

A Fetch response is mostly record batches. Encoding it with kio would copy every batch
into Python memory; instead :func:`encode_fetch_response` writes every other field exactly
as kio's writer would (same field order, same tagged fields, same omission of tagged
fields at their default) and leaves each partition's records as the
:class:`~tidelog.storage.FileSlice` that :meth:`~tidelog.storage.Log.read` returned. The
connection sends the slices with ``os.sendfile``.

Layout per version (``FetchResponse`` v4-v18)::

    throttle_time_ms int32
    error_code int16, session_id int32                      v7+
    responses: array of
        topic: string (v4-v12) | topic_id: uuid (v13+)
        partitions: array of
            partition_index int32, error_code int16
            high_watermark int64, last_stable_offset int64
            log_start_offset int64                           v5+
            aborted_transactions: nullable array of (producer_id int64, first_offset int64)
            preferred_read_replica int32                     v11+
            records: nullable bytes                          <- the file region
            tagged: 0 diverging_epoch, 1 current_leader      v12+
        tagged (none)                                        v12+
    tagged: 0 node_endpoints                                 v16+

Versions 12 and up are flexible: arrays and strings carry an unsigned varint of
length + 1, and every struct ends with its tagged fields (a count, then tag, size, value
per field present). Before v12, arrays and bytes have an int32 length and strings an
int16 one. Records are never null here: an empty region is written as zero bytes, as
Kafka does.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from tidelog.broker.reply import EncodedResponse
from tidelog.storage import FileSlice

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_INT64_PAIR = struct.Struct(">qq")
_PARTITION_HEAD = struct.Struct(">ihqq")  # index, error, high watermark, last stable offset
_INT64 = struct.Struct(">q")
_EPOCH_END_OFFSET = struct.Struct(">iqB")  # epoch, end offset, no tagged fields
_LEADER_AND_EPOCH = struct.Struct(">iiB")  # leader id, leader epoch, no tagged fields
_NO_TAGS = b"\x00"
_ZERO_UUID = bytes(16)

FIRST_FLEXIBLE = 12
FIRST_WITH_TOPIC_IDS = 13
FIRST_WITH_NODE_ENDPOINTS = 16


def uvarint(value: int) -> bytes:
    """Unsigned varint (7 bits per byte, low first), as flexible versions use for lengths."""
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


@dataclass(slots=True)
class PartitionResult:
    """One partition of a Fetch response. ``records`` is owned by the response once encoded."""

    partition_index: int
    error_code: int = 0
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    #: None is Kafka's "not read committed" (null array); read committed sends a list.
    aborted_transactions: Sequence[tuple[int, int]] | None = None
    preferred_read_replica: int = -1
    records: FileSlice | None = None
    #: (epoch, end offset) when the fetcher's log diverged from ours (v12+).
    diverging_epoch: tuple[int, int] | None = None
    #: (leader id, leader epoch), sent with leadership errors (v12+).
    current_leader: tuple[int, int] | None = None

    @property
    def records_size(self) -> int:
        return 0 if self.records is None else self.records.length


@dataclass(slots=True)
class TopicResult:
    """The partitions of one topic, named by ``name`` (v4-v12) or ``topic_id`` (v13+)."""

    name: str
    topic_id: uuid.UUID | None
    partitions: list[PartitionResult] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class NodeEndpoint:
    node_id: int
    host: str
    port: int
    rack: str | None = None


class _Parts:
    """Bytes accumulated into one buffer between file regions."""

    __slots__ = ("buf", "parts")

    def __init__(self) -> None:
        self.parts: list[bytes | FileSlice] = []
        self.buf = bytearray()

    def region(self, piece: FileSlice) -> None:
        if self.buf:
            self.parts.append(bytes(self.buf))
            self.buf = bytearray()
        self.parts.append(piece)

    def finish(self) -> list[bytes | FileSlice]:
        if self.buf:
            self.parts.append(bytes(self.buf))
        return self.parts


def _array_length(count: int, flexible: bool) -> bytes:
    return uvarint(count + 1) if flexible else _INT32.pack(count)


def _string(value: str, flexible: bool) -> bytes:
    data = value.encode("utf-8")
    if flexible:
        return uvarint(len(data) + 1) + data
    return _INT16.pack(len(data)) + data


def _nullable_compact_string(value: str | None) -> bytes:
    if value is None:
        return b"\x00"
    data = value.encode("utf-8")
    return uvarint(len(data) + 1) + data


def _tagged(fields: list[tuple[int, bytes]]) -> bytes:
    out = bytearray(uvarint(len(fields)))
    for tag, value in fields:
        out += uvarint(tag)
        out += uvarint(len(value))
        out += value
    return bytes(out)


def _partition(out: _Parts, version: int, p: PartitionResult) -> None:
    flexible = version >= FIRST_FLEXIBLE
    buf = out.buf
    buf += _PARTITION_HEAD.pack(
        p.partition_index, p.error_code, p.high_watermark, p.last_stable_offset
    )
    if version >= 5:
        buf += _INT64.pack(p.log_start_offset)
    aborted = p.aborted_transactions
    if aborted is None:
        buf += b"\x00" if flexible else b"\xff\xff\xff\xff"
    else:
        buf += _array_length(len(aborted), flexible)
        for producer_id, first_offset in aborted:
            buf += _INT64_PAIR.pack(producer_id, first_offset)
            if flexible:
                buf += _NO_TAGS
    if version >= 11:
        buf += _INT32.pack(p.preferred_read_replica)
    size = p.records_size
    buf += uvarint(size + 1) if flexible else _INT32.pack(size)
    if p.records is not None:
        if size:
            out.region(p.records)
        else:
            p.records.close()  # nothing to send, and the response would not own it
    if flexible:
        tags: list[tuple[int, bytes]] = []
        # kio leaves a tagged struct out when it equals its default (all fields -1).
        if p.diverging_epoch is not None and p.diverging_epoch != (-1, -1):
            tags.append((0, _EPOCH_END_OFFSET.pack(*p.diverging_epoch, 0)))
        if p.current_leader is not None and p.current_leader != (-1, -1):
            tags.append((1, _LEADER_AND_EPOCH.pack(*p.current_leader, 0)))
        out.buf += _tagged(tags) if tags else _NO_TAGS


def encode_fetch_response(
    version: int,
    topics: Sequence[TopicResult],
    *,
    error_code: int = 0,
    session_id: int = 0,
    throttle_time_ms: int = 0,
    node_endpoints: Sequence[NodeEndpoint] = (),
) -> EncodedResponse:
    """The body of a FetchResponse ``version`` (4-18), records left as file regions.

    The parts take ownership of the slices in ``topics``: closing the returned
    :class:`EncodedResponse` (the connection does, after sending) closes them.
    """
    flexible = version >= FIRST_FLEXIBLE
    out = _Parts()
    out.buf += _INT32.pack(throttle_time_ms)
    if version >= 7:
        out.buf += _INT16.pack(error_code)
        out.buf += _INT32.pack(session_id)
    out.buf += _array_length(len(topics), flexible)
    errors = [error_code] if error_code else []
    for topic in topics:
        if version >= FIRST_WITH_TOPIC_IDS:
            out.buf += topic.topic_id.bytes if topic.topic_id is not None else _ZERO_UUID
        else:
            out.buf += _string(topic.name, flexible)
        out.buf += _array_length(len(topic.partitions), flexible)
        for partition in topic.partitions:
            _partition(out, version, partition)
            if partition.error_code:
                errors.append(partition.error_code)
        if flexible:
            out.buf += _NO_TAGS
    if flexible:
        if version >= FIRST_WITH_NODE_ENDPOINTS and node_endpoints:
            body = bytearray(uvarint(len(node_endpoints) + 1))
            for node in node_endpoints:
                body += _INT32.pack(node.node_id)
                body += _string(node.host, True)
                body += _INT32.pack(node.port)
                body += _nullable_compact_string(node.rack)
                body += _NO_TAGS
            out.buf += _tagged([(0, bytes(body))])
        else:
            out.buf += _NO_TAGS
    return EncodedResponse(out.finish(), errors)
