"""The records of ``__transaction_state``, in Kafka's own key and value schemas.

Key (``TransactionLogKey``, version 0 only): ``int16 version, transactionalId: string``.

Value (``TransactionLogValue``; a null value is a tombstone: the transactional id expired):

- version 0: ``producerId: int64, producerEpoch: int16, transactionTimeoutMs: int32,
  transactionStatus: int8, transactionPartitions: nullable [topic: string, partitionIds:
  [int32]], transactionLastUpdateTimestampMs: int64, transactionStartTimestampMs: int64``;
- version 1 (flexible): the same fields with compact strings and arrays, a tagged-field
  section after each partition entry and one at the end carrying ``previousProducerId``
  (tag 0), ``nextProducerId`` (tag 1) and ``clientTransactionVersion`` (tag 2).

Tidelog writes version 1, with the previous and next producer ids as tags only when they are
set (Kafka leaves defaults out of a tagged section), so Kafka's tools read the log as their own.
``transactionStatus`` is :class:`~tidelog.coordinator.transactions.state.TxnState`'s number.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from tidelog.coordinator.errors import GroupRecordError, TransactionRecordError
from tidelog.coordinator.records import _Reader
from tidelog.protocol.validate import encode_uvarint

KEY_VERSION = 0
VALUE_VERSION = 1

_TAG_PREVIOUS_PRODUCER_ID = 0
_TAG_NEXT_PRODUCER_ID = 1
_TAG_CLIENT_TRANSACTION_VERSION = 2


@dataclass(frozen=True, slots=True)
class TransactionLogValue:
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    #: the state's number (Kafka's TransactionState id)
    status: int
    #: sorted ``(topic, partition)`` pairs
    partitions: tuple[tuple[str, int], ...]
    last_update_timestamp: int
    start_timestamp: int
    previous_producer_id: int = -1
    next_producer_id: int = -1
    client_transaction_version: int = 0


# -- writing


def _compact_string(text: str) -> bytes:
    data = text.encode("utf-8")
    if len(data) > 0x7FFF:
        raise ValueError(f"a string field is at most 32767 bytes, got {len(data)}")
    return encode_uvarint(len(data) + 1) + data


def encode_key(transactional_id: str) -> bytes:
    data = transactional_id.encode("utf-8")
    if len(data) > 0x7FFF:
        raise ValueError(f"a transactional id is at most 32767 bytes, got {len(data)}")
    return struct.pack(">hh", KEY_VERSION, len(data)) + data


def encode_value(value: TransactionLogValue) -> bytes:
    """Version 1 (flexible)."""
    by_topic: dict[str, list[int]] = {}
    for topic, partition in value.partitions:
        by_topic.setdefault(topic, []).append(partition)
    out = bytearray(
        struct.pack(
            ">hqhib",
            VALUE_VERSION,
            value.producer_id,
            value.producer_epoch,
            value.timeout_ms,
            value.status,
        )
    )
    out += encode_uvarint(len(by_topic) + 1)
    for topic in sorted(by_topic):
        ids = sorted(by_topic[topic])
        out += _compact_string(topic)
        out += encode_uvarint(len(ids) + 1)
        for p in ids:
            out += struct.pack(">i", p)
        out += b"\x00"  # the entry's tagged fields: none
    out += struct.pack(">qq", value.last_update_timestamp, value.start_timestamp)
    tags: list[tuple[int, bytes]] = []
    if value.previous_producer_id != -1:
        tags.append((_TAG_PREVIOUS_PRODUCER_ID, struct.pack(">q", value.previous_producer_id)))
    if value.next_producer_id != -1:
        tags.append((_TAG_NEXT_PRODUCER_ID, struct.pack(">q", value.next_producer_id)))
    if value.client_transaction_version != 0:
        tags.append(
            (_TAG_CLIENT_TRANSACTION_VERSION, struct.pack(">h", value.client_transaction_version))
        )
    out += encode_uvarint(len(tags))
    for tag, data in tags:
        out += encode_uvarint(tag) + encode_uvarint(len(data)) + data
    return bytes(out)


# -- reading


def decode_key(key: bytes | None) -> str:
    """The transactional id of a ``__transaction_state`` key."""
    if key is None:
        raise TransactionRecordError("a __transaction_state record has no key")
    try:
        r = _Reader(bytes(key), "TransactionLogKey")
        version = r.i16()
        if version != KEY_VERSION:
            raise TransactionRecordError(f"TransactionLogKey version {version} is not 0")
        return r.string()
    except GroupRecordError as exc:
        raise TransactionRecordError(str(exc)) from exc


def decode_value(value: bytes) -> TransactionLogValue:
    try:
        return _decode_value(_Reader(bytes(value), "TransactionLogValue"))
    except GroupRecordError as exc:
        raise TransactionRecordError(str(exc)) from exc


def _decode_value(r: _Reader) -> TransactionLogValue:
    version = r.i16()
    if version not in (0, 1):
        raise TransactionRecordError(f"TransactionLogValue version {version} is not 0 or 1")
    r.flexible = version >= 1
    producer_id = r.i64()
    epoch = r.i16()
    timeout_ms = r.i32()
    status = struct.unpack(">b", r._take(1))[0]
    partitions: list[tuple[str, int]] = []
    n = r._length(wide=True)  # null (-1) is an empty list
    for _ in range(max(n, 0)):
        topic = r.string()
        count = r.array_length(min_item_size=4)
        partitions.extend((topic, r.i32()) for _ in range(count))
        r.tagged_fields()
    last_update = r.i64()
    start = r.i64()
    previous_id = next_id = -1
    client_version = 0
    if r.flexible:
        for _ in range(r.uvarint()):
            tag = r.uvarint()
            data = r._take(r.uvarint())
            if tag == _TAG_PREVIOUS_PRODUCER_ID and len(data) == 8:
                previous_id = struct.unpack(">q", data)[0]
            elif tag == _TAG_NEXT_PRODUCER_ID and len(data) == 8:
                next_id = struct.unpack(">q", data)[0]
            elif tag == _TAG_CLIENT_TRANSACTION_VERSION and len(data) == 2:
                client_version = struct.unpack(">h", data)[0]
    return TransactionLogValue(
        producer_id,
        epoch,
        timeout_ms,
        status,
        tuple(sorted(partitions)),
        last_update,
        start,
        previous_id,
        next_id,
        client_version,
    )
