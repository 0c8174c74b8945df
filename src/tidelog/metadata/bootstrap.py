"""Records a node commits first, written by ``tidelog storage format`` before any start.

Kafka's ``kafka-storage format --add-scram`` writes SCRAM credentials into a bootstrap
snapshot, so that the first user exists before any broker runs (a SASL-only cluster has
no other way in). Tidelog writes them, with
:func:`write_bootstrap`, as ``bootstrap.checkpoint`` in ``metadata.log.dir``: one metadata
record batch as the metadata log holds them (RecordBatch v2, CRC-checked on read). The
first start, finding the metadata log empty, commits these records through the controller
ahead of everything else (:func:`read_bootstrap`); later starts ignore the file, as Kafka
ignores its bootstrap once the log has records. Only SCRAM credential records are taken.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tidelog.metadata.errors import MetadataRecordError
from tidelog.metadata.log import MetadataLog
from tidelog.metadata.records import MetadataRecord, UserScramCredentialRecord, decode_record
from tidelog.records import RecordsError
from tidelog.records.batch import iter_batches
from tidelog.records.reader import iter_records
from tidelog.storage.checkpoint import FsyncFn, write_durably

__all__ = ["BOOTSTRAP_FILE", "read_bootstrap", "write_bootstrap"]

BOOTSTRAP_FILE = "bootstrap.checkpoint"
_BOOTSTRAP_RECORDS = (UserScramCredentialRecord,)


def write_bootstrap(
    directory: Path, records: Sequence[MetadataRecord], timestamp: int, fsync: FsyncFn
) -> Path:
    """Write ``records`` durably as ``directory``/bootstrap.checkpoint; its path."""
    path = directory / BOOTSTRAP_FILE
    write_durably(path, MetadataLog.build_batch(records, timestamp), fsync)
    return path


def read_bootstrap(directory: Path) -> list[MetadataRecord]:
    """The records of ``directory``/bootstrap.checkpoint (none when there is no file);
    MetadataRecordError for a file that is damaged or holds other records."""
    path = directory / BOOTSTRAP_FILE
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    records: list[MetadataRecord] = []
    try:
        for position, header in iter_batches(data):
            for stored in iter_records(data, position, header=header):
                records.append(decode_record(stored.value))
    except RecordsError as exc:
        raise MetadataRecordError(f"{path} does not decode: {exc}") from exc
    for record in records:
        if not isinstance(record, _BOOTSTRAP_RECORDS):
            raise MetadataRecordError(
                f"{path} holds a {type(record).__name__}, not a bootstrap record"
            )
    return records
