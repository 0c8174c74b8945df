from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidelog.records.errors import CorruptBatchError, RecordsError, TruncatedBatchError
from tidelog.records.varint import (
    decode_varint,
    decode_varlong,
    encode_varint,
    encode_varlong,
    size_of_varint,
    unzigzag,
    zigzag,
)

# Values from the protobuf / Kafka zigzag tables.
KNOWN = [
    (0, b"\x00"),
    (-1, b"\x01"),
    (1, b"\x02"),
    (-2, b"\x03"),
    (63, b"\x7e"),
    (-64, b"\x7f"),
    (64, b"\x80\x01"),
    (300, b"\xd8\x04"),
    (2**31 - 1, b"\xfe\xff\xff\xff\x0f"),
    (-(2**31), b"\xff\xff\xff\xff\x0f"),
]


@pytest.mark.parametrize(("value", "encoded"), KNOWN)
def test_known_encodings(value: int, encoded: bytes) -> None:
    assert encode_varint(value) == encoded
    assert encode_varlong(value) == encoded
    assert decode_varint(encoded) == (value, len(encoded))
    assert decode_varlong(encoded) == (value, len(encoded))
    assert size_of_varint(value) == len(encoded)


def test_varlong_extremes() -> None:
    assert encode_varlong(2**63 - 1) == b"\xfe" + b"\xff" * 8 + b"\x01"
    assert encode_varlong(-(2**63)) == b"\xff" * 9 + b"\x01"
    assert decode_varlong(b"\xff" * 9 + b"\x01") == (-(2**63), 10)


def test_range_checks() -> None:
    with pytest.raises(ValueError):
        encode_varint(2**31)
    with pytest.raises(ValueError):
        encode_varlong(-(2**63) - 1)
    with pytest.raises(CorruptBatchError):
        decode_varint(b"\xff\xff\xff\xff\x7f")  # 35 bits
    with pytest.raises(CorruptBatchError):
        decode_varint(b"\x80" * 6)
    with pytest.raises(CorruptBatchError):
        decode_varlong(b"\x80" * 11)
    with pytest.raises(TruncatedBatchError):
        decode_varint(b"\x80\x80")
    with pytest.raises(TruncatedBatchError):
        decode_varint(b"\x80\x01", 0, 1)


@given(st.integers(-(2**63), 2**63 - 1))
def test_varlong_round_trip(value: int) -> None:
    encoded = encode_varlong(value)
    assert decode_varlong(b"\xaa" + encoded + b"\xbb", 1) == (value, 1 + len(encoded))
    assert unzigzag(zigzag(value)) == value


@given(st.integers(-(2**31), 2**31 - 1))
def test_varint_round_trip(value: int) -> None:
    encoded = encode_varint(value)
    assert decode_varint(encoded) == (value, len(encoded))


@given(st.binary(max_size=12), st.integers(0, 12))
def test_decode_only_raises_records_errors(data: bytes, pos: int) -> None:
    for decode in (decode_varint, decode_varlong):
        try:
            value, nxt = decode(data, pos)
        except RecordsError:
            continue
        assert pos < nxt <= len(data)
        assert isinstance(value, int)
