"""Control records: the batches a broker writes into a partition for itself.

A control batch has the control bit (0x20) and, for transaction markers, the
transactional bit (0x10) set; it holds one record whose key and value are fixed-width
big-endian structures rather than user data::

    key    version int16 (0), type int16
    value  (transaction markers, types 0 and 1)
           version int16 (0), coordinator_epoch int32

Types: 0 abort and 1 commit (transaction markers); 2 leader change and 3-6 the KRaft
snapshot and voter records, whose values this module does not interpret. The marker's
producer id and epoch are the batch's; its base sequence is -1.
"""

from __future__ import annotations

import struct
from enum import IntEnum
from typing import NamedTuple

from tidelog.records.batch import NO_SEQUENCE
from tidelog.records.builder import BatchBuilder
from tidelog.records.errors import CorruptBatchError

CONTROL_KEY_VERSION = 0
END_TXN_MARKER_VERSION = 0

_KEY = struct.Struct(">hh")
_END_TXN_VALUE = struct.Struct(">hi")


class ControlRecordType(IntEnum):
    ABORT = 0
    COMMIT = 1
    LEADER_CHANGE = 2
    SNAPSHOT_HEADER = 3
    SNAPSHOT_FOOTER = 4
    KRAFT_VERSION = 5
    KRAFT_VOTERS = 6


class ControlKey(NamedTuple):
    version: int
    type: int

    @property
    def is_transaction_marker(self) -> bool:
        return self.type in (ControlRecordType.ABORT, ControlRecordType.COMMIT)


class EndTransactionMarker(NamedTuple):
    """A commit or abort marker as read from a control record."""

    commit: bool
    coordinator_epoch: int
    version: int = END_TXN_MARKER_VERSION


def encode_control_key(
    control_type: ControlRecordType | int, version: int = CONTROL_KEY_VERSION
) -> bytes:
    return _KEY.pack(version, control_type)


def parse_control_key(key: bytes | bytearray | memoryview | None) -> ControlKey:
    """Read a control record's key; :class:`CorruptBatchError` if it is not one."""
    if key is None or len(key) < _KEY.size:
        raise CorruptBatchError(
            f"control record key needs {_KEY.size} bytes, got {'null' if key is None else len(key)}"
        )
    version, control_type = _KEY.unpack_from(key, 0)
    if version < 0:
        raise CorruptBatchError(f"control record key has negative version {version}")
    return ControlKey(version, control_type)


def encode_end_txn_marker_value(
    coordinator_epoch: int, version: int = END_TXN_MARKER_VERSION
) -> bytes:
    return _END_TXN_VALUE.pack(version, coordinator_epoch)


def parse_end_txn_marker(
    key: bytes | bytearray | memoryview | None,
    value: bytes | bytearray | memoryview | None,
) -> EndTransactionMarker:
    """Read a commit/abort marker from a control record's key and value.

    Later value versions may append fields; like Kafka, the known prefix is read.
    """
    control_key = parse_control_key(key)
    if not control_key.is_transaction_marker:
        raise CorruptBatchError(
            f"control record of type {control_key.type} is not a transaction marker"
        )
    if value is None or len(value) < _END_TXN_VALUE.size:
        raise CorruptBatchError(
            f"transaction marker value needs {_END_TXN_VALUE.size} bytes, got "
            f"{'null' if value is None else len(value)}"
        )
    version, coordinator_epoch = _END_TXN_VALUE.unpack_from(value, 0)
    if version < 0:
        raise CorruptBatchError(f"transaction marker value has negative version {version}")
    return EndTransactionMarker(
        control_key.type == ControlRecordType.COMMIT, coordinator_epoch, version
    )


def build_end_txn_marker_batch(
    *,
    commit: bool,
    producer_id: int,
    producer_epoch: int,
    coordinator_epoch: int,
    timestamp: int,
    base_offset: int = 0,
    partition_leader_epoch: int = -1,
) -> bytes:
    """The control batch a broker appends to end a transaction on one partition."""
    builder = BatchBuilder(
        base_offset=base_offset,
        partition_leader_epoch=partition_leader_epoch,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=NO_SEQUENCE,
        transactional=True,
        control=True,
    )
    control_type = ControlRecordType.COMMIT if commit else ControlRecordType.ABORT
    builder.append(
        encode_control_key(control_type),
        encode_end_txn_marker_value(coordinator_epoch),
        timestamp=timestamp,
    )
    return builder.close()
