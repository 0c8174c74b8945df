"""__transaction_state keys and values in Kafka's TransactionLog schemas."""

from __future__ import annotations

import struct

import pytest

from tidelog.coordinator.errors import TransactionRecordError
from tidelog.coordinator.transactions.records import (
    TransactionLogValue,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
)


def test_key_layout() -> None:
    assert encode_key("tx") == b"\x00\x00\x00\x02tx"
    assert decode_key(b"\x00\x00\x00\x02tx") == "tx"


def test_value_v1_round_trip_with_tags() -> None:
    value = TransactionLogValue(
        producer_id=42,
        producer_epoch=3,
        timeout_ms=60_000,
        status=1,
        partitions=(("a", 0), ("a", 2), ("b", 1)),
        last_update_timestamp=1234,
        start_timestamp=1000,
        previous_producer_id=41,
    )
    data = encode_value(value)
    assert data[:2] == b"\x00\x01"
    assert decode_value(data) == value


def test_value_v1_layout_without_tags() -> None:
    value = TransactionLogValue(7, 0, 100, 0, (), 5, -1)
    expected = (
        struct.pack(">hqhib", 1, 7, 0, 100, 0)
        + b"\x01"  # compact array of 0 topics
        + struct.pack(">qq", 5, -1)
        + b"\x00"  # no tagged fields
    )
    assert encode_value(value) == expected


def test_value_v0_as_older_kafka_wrote_it() -> None:
    raw = (
        struct.pack(">hqhib", 0, 9, 2, 30_000, 2)
        + struct.pack(">i", 1)  # one topic
        + struct.pack(">h", 1)
        + b"t"
        + struct.pack(">iii", 2, 0, 3)  # partitions 0 and 3
        + struct.pack(">qq", 50, 40)
    )
    assert decode_value(raw) == TransactionLogValue(9, 2, 30_000, 2, (("t", 0), ("t", 3)), 50, 40)


def test_v0_null_partitions_is_empty() -> None:
    raw = (
        struct.pack(">hqhib", 0, 9, 2, 30_000, 0) + struct.pack(">i", -1) + struct.pack(">qq", 1, 2)
    )
    assert decode_value(raw).partitions == ()


@pytest.mark.parametrize(
    "raw",
    [b"", b"\x00\x05" + b"\x00" * 30, b"\x00\x00\x00\x00", struct.pack(">hqhib", 0, 1, 0, 1, 0)],
)
def test_malformed_values_raise(raw: bytes) -> None:
    with pytest.raises(TransactionRecordError):
        decode_value(raw)


def test_malformed_keys_raise() -> None:
    for raw in (None, b"", b"\x00\x01\x00\x01a", b"\x00\x00\x00\x09ab"):
        with pytest.raises(TransactionRecordError):
            decode_key(raw)
