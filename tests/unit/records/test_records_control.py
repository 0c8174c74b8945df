from __future__ import annotations

import pytest

from tidelog.records import batch as rb
from tidelog.records.control import (
    ControlRecordType,
    EndTransactionMarker,
    build_end_txn_marker_batch,
    encode_control_key,
    encode_end_txn_marker_value,
    parse_control_key,
    parse_end_txn_marker,
)
from tidelog.records.errors import CorruptBatchError
from tidelog.records.reader import decode_records


def test_layout() -> None:
    assert encode_control_key(ControlRecordType.ABORT) == bytes.fromhex("00000000")
    assert encode_control_key(ControlRecordType.COMMIT) == bytes.fromhex("00000001")
    assert encode_end_txn_marker_value(7) == bytes.fromhex("000000000007")


@pytest.mark.parametrize("commit", [True, False])
def test_marker_batch(commit: bool) -> None:
    data = build_end_txn_marker_batch(
        commit=commit, producer_id=99, producer_epoch=3, coordinator_epoch=12, timestamp=555
    )
    header = rb.validate_batch(data)
    assert header.is_control and header.is_transactional
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (99, 3, -1)
    assert header.record_count == 1
    (record,) = decode_records(data)
    assert record.timestamp == 555
    assert record.key == bytes.fromhex("0000") + (b"\x00\x01" if commit else b"\x00\x00")
    assert parse_end_txn_marker(record.key, record.value) == EndTransactionMarker(commit, 12, 0)


def test_parse_errors() -> None:
    with pytest.raises(CorruptBatchError):
        parse_control_key(None)
    with pytest.raises(CorruptBatchError):
        parse_control_key(b"\x00\x00\x00")
    with pytest.raises(CorruptBatchError):
        parse_control_key(b"\xff\xff\x00\x00")
    leader_change = encode_control_key(ControlRecordType.LEADER_CHANGE)
    assert not parse_control_key(leader_change).is_transaction_marker
    with pytest.raises(CorruptBatchError):
        parse_end_txn_marker(leader_change, encode_end_txn_marker_value(1))
    commit = encode_control_key(ControlRecordType.COMMIT)
    with pytest.raises(CorruptBatchError):
        parse_end_txn_marker(commit, None)
    with pytest.raises(CorruptBatchError):
        parse_end_txn_marker(commit, b"\x00\x00\x00")
    # a later value version with more fields: the known prefix is read
    assert parse_end_txn_marker(commit, b"\x00\x01\x00\x00\x00\x05extra").coordinator_epoch == 5
