"""Raft entries as Kafka record batches: the bytes of ``__cluster_metadata-0`` and of Fetch.

One :class:`~tidelog.metadata.raft.messages.Entry` is one RecordBatch v2 (built with the one
batch builder of :mod:`tidelog.records`): ``baseOffset`` is the entry's offset,
``partitionLeaderEpoch`` its epoch, one record per element of ``records`` (key null, the
element as value), uncompressed, producer id -1. A control entry is a control batch whose
records are KRaft's LeaderChange control records (type 2); their value is Kafka's
``LeaderChangeMessage`` (an int16 version, then the message), as a new leader writes it.

A snapshot (KIP-630) is a sequence of batches too, as Kafka writes its ``.checkpoint``
files: a control batch with a SnapshotHeader record (type 3), the batches of the state's
records, a control batch with a SnapshotFooter record (type 4). Its offsets count from 0
and every batch carries the snapshot's epoch.

Decoding checks every batch's CRC; bytes that are not whole, valid batches of this shape
raise a :class:`~tidelog.records.errors.RecordsError` saying what is wrong.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Iterable, Sequence
from typing import Final, TypeVar

from kio.schema.leader_change_message.v0 import LeaderChangeMessage
from kio.schema.leader_change_message.v0.data import Voter
from kio.schema.snapshot_footer_record.v0 import SnapshotFooterRecord
from kio.schema.snapshot_header_record.v0 import SnapshotHeaderRecord
from kio.schema.types import BrokerId
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i16, i32, i64

from tidelog.metadata.raft.messages import Entry, OffsetAndEpoch
from tidelog.protocol.errors import ProtocolError
from tidelog.protocol.validate import check_body
from tidelog.records.batch import iter_batches
from tidelog.records.builder import BatchBuilder
from tidelog.records.control import ControlRecordType, encode_control_key, parse_control_key
from tidelog.records.errors import CorruptBatchError
from tidelog.records.reader import iter_records

__all__ = [
    "NO_TIMESTAMP",
    "decode_entries",
    "decode_leader_change",
    "decode_snapshot",
    "encode_entries",
    "encode_leader_change",
    "encode_snapshot",
]

#: The record timestamp when none is given (Kafka's RecordBatch.NO_TIMESTAMP).
NO_TIMESTAMP: Final = -1
# The version prefix of a control record's value (Kafka's ControlRecordUtils versions).
_CONTROL_VALUE_VERSION: Final = 0
_INT16: Final = struct.Struct(">h")
# Records per snapshot batch are gathered up to this many bytes, so that a large state is
# served and checked batch by batch rather than as one huge batch.
_SNAPSHOT_BATCH_BYTES: Final = 1 << 20

_Message = TypeVar("_Message", LeaderChangeMessage, SnapshotHeaderRecord, SnapshotFooterRecord)


# -- control record values ---------------------------------------------------------------


def _encode_control_value(
    message: LeaderChangeMessage | SnapshotHeaderRecord | SnapshotFooterRecord,
) -> bytes:
    out = io.BytesIO()
    out.write(_INT16.pack(_CONTROL_VALUE_VERSION))
    entity_writer(type(message))(out, message)
    return out.getvalue()


def _decode_control_value(message_type: type[_Message], value: bytes | None) -> _Message:
    name = message_type.__name__
    if value is None or len(value) < _INT16.size:
        raise CorruptBatchError(f"{name} control record has no value")
    (version,) = _INT16.unpack_from(value, 0)
    if version != _CONTROL_VALUE_VERSION:
        raise CorruptBatchError(f"{name} control record of unknown version {version}")
    view = memoryview(value).toreadonly()
    try:
        # Lengths are checked against the value before kio allocates anything for them.
        data, start = check_body(message_type, view, _INT16.size)
        message, size = entity_reader(message_type)(data, start)
    except (ProtocolError, ValueError) as exc:
        raise CorruptBatchError(f"{name} control record does not decode: {exc}") from exc
    if start + size != len(data):
        raise CorruptBatchError(f"{name} control record has trailing bytes")
    return message


def encode_leader_change(
    leader_id: int, voters: Iterable[int], granting_voters: Iterable[int] = ()
) -> bytes:
    """The value of the LeaderChange control record a new leader appends: itself, the voters
    of its epoch and those that voted for it."""
    return _encode_control_value(
        LeaderChangeMessage(
            version=i16(0),
            leader_id=BrokerId(leader_id),
            voters=tuple(Voter(voter_id=i32(v)) for v in sorted(voters)),
            granting_voters=tuple(Voter(voter_id=i32(v)) for v in sorted(granting_voters)),
        )
    )


def decode_leader_change(value: bytes) -> LeaderChangeMessage:
    return _decode_control_value(LeaderChangeMessage, value)


# -- entries -----------------------------------------------------------------------------


def _entry_batch(entry: Entry, timestamp: int) -> bytes:
    builder = BatchBuilder(
        base_offset=entry.offset, partition_leader_epoch=entry.epoch, control=entry.control
    )
    key = encode_control_key(ControlRecordType.LEADER_CHANGE) if entry.control else None
    for record in entry.records:
        builder.append(key, record, timestamp=timestamp)
    return builder.close()


def encode_entries(entries: Sequence[Entry], *, timestamp: int = NO_TIMESTAMP) -> bytes:
    """One record batch per entry, concatenated (what Fetch's ``records`` and the log hold).

    ``timestamp`` is every record's timestamp: the time the leader appended it, when the
    caller has a clock (the entry itself carries none)."""
    return b"".join(_entry_batch(entry, timestamp) for entry in entries)


def decode_entries(data: bytes | bytearray | memoryview) -> list[Entry]:
    """The entries of ``data``: whole record batches, each CRC checked.

    Raises a :class:`~tidelog.records.errors.RecordsError` for a torn or corrupt batch, an
    empty one, or a control batch that is not a LeaderChange."""
    entries: list[Entry] = []
    for position, header in iter_batches(data):
        records = []
        for record in iter_records(data, position, header=header):
            if header.is_control:
                control = parse_control_key(record.key)
                if control.type != ControlRecordType.LEADER_CHANGE:
                    raise CorruptBatchError(
                        f"control record of type {control.type} at offset {record.offset} "
                        "is not a LeaderChange: the metadata log holds no other"
                    )
            if record.value is None:
                raise CorruptBatchError(f"record at offset {record.offset} has a null value")
            records.append(record.value)
        if len(records) != header.last_offset_delta + 1:
            # Raft entries have no gaps: a batch with missing offsets (compacted, or
            # empty) is not one of ours.
            raise CorruptBatchError(
                f"batch at offset {header.base_offset} holds {len(records)} records for "
                f"{header.last_offset_delta + 1} offsets"
            )
        entries.append(
            Entry(
                header.base_offset,
                header.partition_leader_epoch,
                tuple(records),
                control=header.is_control,
            )
        )
    return entries


# -- snapshots ---------------------------------------------------------------------------


def encode_snapshot(
    snapshot_id: OffsetAndEpoch,
    records: Sequence[bytes],
    *,
    last_contained_log_timestamp: int = NO_TIMESTAMP,
    timestamp: int = NO_TIMESTAMP,
) -> bytes:
    """The bytes of snapshot ``snapshot_id`` holding ``records`` (the state machine's state),
    between a SnapshotHeader and a SnapshotFooter control batch."""
    epoch = snapshot_id.epoch
    batches: list[bytes] = []
    offset = 0

    def control(record_type: ControlRecordType, value: bytes) -> None:
        nonlocal offset
        builder = BatchBuilder(base_offset=offset, partition_leader_epoch=epoch, control=True)
        builder.append(encode_control_key(record_type), value, timestamp=timestamp)
        batches.append(builder.close())
        offset += 1

    control(
        ControlRecordType.SNAPSHOT_HEADER,
        _encode_control_value(
            SnapshotHeaderRecord(
                version=i16(0), last_contained_log_timestamp=i64(last_contained_log_timestamp)
            )
        ),
    )
    builder: BatchBuilder | None = None
    for record in records:
        if builder is None:
            builder = BatchBuilder(base_offset=offset, partition_leader_epoch=epoch)
        builder.append(None, record, timestamp=timestamp)
        offset += 1
        if builder.uncompressed_size >= _SNAPSHOT_BATCH_BYTES:
            batches.append(builder.close())
            builder = None
    if builder is not None:
        batches.append(builder.close())
    control(
        ControlRecordType.SNAPSHOT_FOOTER,
        _encode_control_value(SnapshotFooterRecord(version=i16(0))),
    )
    return b"".join(batches)


def decode_snapshot(data: bytes | bytearray | memoryview) -> tuple[bytes, ...]:
    """The records of a snapshot, every batch CRC checked; a snapshot without its header
    or footer (torn) raises a :class:`~tidelog.records.errors.RecordsError`."""
    records: list[bytes] = []
    seen_header = seen_footer = False
    expected = 0
    for position, header in iter_batches(data):
        if seen_footer:
            raise CorruptBatchError("snapshot has batches after its footer")
        if header.base_offset != expected:
            raise CorruptBatchError(
                f"snapshot batch at offset {header.base_offset}, expected {expected}"
            )
        for record in iter_records(data, position, header=header):
            if header.is_control:
                kind = parse_control_key(record.key).type
                if kind == ControlRecordType.SNAPSHOT_HEADER and not seen_header:
                    _decode_control_value(SnapshotHeaderRecord, record.value)
                    seen_header = True
                elif kind == ControlRecordType.SNAPSHOT_FOOTER and seen_header:
                    _decode_control_value(SnapshotFooterRecord, record.value)
                    seen_footer = True
                else:
                    raise CorruptBatchError(
                        f"snapshot control record of type {kind} at offset {record.offset} "
                        "is out of place"
                    )
            elif not seen_header:
                raise CorruptBatchError("snapshot does not start with a SnapshotHeader")
            elif record.value is None:
                raise CorruptBatchError(f"snapshot record {record.offset} has a null value")
            else:
                records.append(record.value)
        expected = header.next_offset
    if not seen_footer:
        raise CorruptBatchError(
            "snapshot ends without its SnapshotFooter (torn or empty)"
            if seen_header
            else "snapshot does not start with a SnapshotHeader"
        )
    return tuple(records)
