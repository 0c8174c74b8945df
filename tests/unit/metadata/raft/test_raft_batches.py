"""Raft entries and snapshots as Kafka record batches (tidelog.metadata.raft.batches)."""

from __future__ import annotations

import pytest

from tidelog.metadata.raft import Entry, OffsetAndEpoch
from tidelog.metadata.raft.batches import (
    decode_entries,
    decode_leader_change,
    decode_snapshot,
    encode_entries,
    encode_leader_change,
    encode_snapshot,
)
from tidelog.records.batch import NO_PRODUCER_ID, iter_batches
from tidelog.records.compression import Compression
from tidelog.records.control import ControlRecordType, build_end_txn_marker_batch, parse_control_key
from tidelog.records.errors import CorruptBatchError, RecordsError, TruncatedBatchError
from tidelog.records.reader import decode_records

LEADER_CHANGE = Entry(0, 3, (encode_leader_change(2, [1, 2, 3], [2, 3]),), control=True)
OPERATION = Entry(1, 3, (b"topic", b"partition-0", b"partition-1"))
NEXT = Entry(4, 5, (b"config",))


def test_each_entry_is_one_batch_with_its_offset_epoch_and_one_record_per_element() -> None:
    data = encode_entries([LEADER_CHANGE, OPERATION, NEXT], timestamp=1234)
    headers = [header for _, header in iter_batches(data)]
    assert [(h.base_offset, h.last_offset, h.partition_leader_epoch) for h in headers] == [
        (0, 0, 3),
        (1, 3, 3),
        (4, 4, 5),
    ]
    assert [h.is_control for h in headers] == [True, False, False]
    assert {h.producer_id for h in headers} == {NO_PRODUCER_ID}
    assert {h.compression for h in headers} == {Compression.NONE}
    records = decode_records(data, headers[0].size)
    assert [(r.offset, r.key, r.value, r.timestamp) for r in records] == [
        (1, None, b"topic", 1234),
        (2, None, b"partition-0", 1234),
        (3, None, b"partition-1", 1234),
    ]
    assert decode_entries(data) == [LEADER_CHANGE, OPERATION, NEXT]
    assert decode_entries(memoryview(data)) == [LEADER_CHANGE, OPERATION, NEXT]


def test_a_new_leaders_entry_is_a_leader_change_control_batch() -> None:
    data = encode_entries([LEADER_CHANGE])
    (record,) = decode_records(data)
    assert parse_control_key(record.key).type == ControlRecordType.LEADER_CHANGE
    message = decode_leader_change(record.value or b"")
    assert message.leader_id == 2
    assert [v.voter_id for v in message.voters] == [1, 2, 3]
    assert [v.voter_id for v in message.granting_voters] == [2, 3]


def test_a_corrupted_byte_or_a_torn_batch_is_refused() -> None:
    data = bytearray(encode_entries([OPERATION, NEXT]))
    with pytest.raises(TruncatedBatchError):
        decode_entries(data[:-5])
    data[80] ^= 0x01  # inside the first batch's records: its CRC no longer matches
    with pytest.raises(CorruptBatchError, match="CRC"):
        decode_entries(data)


def test_a_control_batch_other_than_leader_change_is_refused() -> None:
    marker = build_end_txn_marker_batch(
        commit=True, producer_id=7, producer_epoch=0, coordinator_epoch=0, timestamp=0
    )
    with pytest.raises(CorruptBatchError, match="not a LeaderChange"):
        decode_entries(marker)


def test_a_snapshot_is_header_records_footer_and_a_torn_one_is_refused() -> None:
    records = [b"state-%d" % i for i in range(5)]
    data = encode_snapshot(OffsetAndEpoch(40, 3), records, last_contained_log_timestamp=99)
    batches = [header for _, header in iter_batches(data)]
    assert [b.is_control for b in batches] == [True, False, True]
    assert {b.partition_leader_epoch for b in batches} == {3}
    assert [b.base_offset for b in batches] == [0, 1, 6]
    kinds = [
        parse_control_key(decode_records(data, pos)[0].key).type
        for pos, header in iter_batches(data)
        if header.is_control
    ]
    assert kinds == [ControlRecordType.SNAPSHOT_HEADER, ControlRecordType.SNAPSHOT_FOOTER]
    assert decode_snapshot(data) == tuple(records)
    assert decode_snapshot(encode_snapshot(OffsetAndEpoch(1, 1), [])) == ()
    footer_at = sum(b.size for b in batches[:2])
    with pytest.raises(CorruptBatchError, match="without its SnapshotFooter"):
        decode_snapshot(data[:footer_at])
    with pytest.raises(RecordsError):
        decode_snapshot(data[: footer_at + 10])
    with pytest.raises(CorruptBatchError, match="SnapshotHeader"):
        decode_snapshot(encode_entries([Entry(0, 3, (b"no header",))]))
