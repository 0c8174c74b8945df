"""`tidelog dump-log`: print the batches (and optionally records) of segment files.

A partition directory (``<log.dirs>/<topic>-<partition>``) stands for all its `.log` segments,
dumped in base-offset order; each file's section starts with ``Dumping <file>``.
Reads a `.log` segment one batch at a time (never the whole file into memory), prints
each batch header, and stops with a one-line explanation at the first bytes that are
not a valid batch — which is exactly where the log's recovery would truncate.
`.index`, `.timeindex` and `.txnindex` (aborted transactions) files are printed entry by
entry. With ``--print-data-log`` a transaction marker (a control record) is shown as
Kafka's tool shows it: ``endTxnMarker: COMMIT|ABORT coordinatorEpoch: N``.
"""

from __future__ import annotations

import argparse
import struct
import sys
from pathlib import Path
from typing import Any, BinaryIO

from tidelog.records import batch as rb
from tidelog.records.control import parse_end_txn_marker
from tidelog.records.errors import RecordsError
from tidelog.records.reader import decode_records
from tidelog.storage.txn_index import ENTRY_SIZE, decode_entries

_CODECS = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
# A batch larger than this is reported rather than read: no segment written by a broker
# holds one, and a corrupt length must not make the tool allocate gigabytes.
_MAX_BATCH_BYTES = 1 << 30


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "dump-log",
        help="print the batches of segment files (.log) or entries of index files",
        description="Print the record batches of Kafka-format segment files.",
    )
    parser.add_argument(
        "files",
        nargs="+",
        metavar="FILE",
        help=(
            ".log, .index, .timeindex or .txnindex file, or a partition directory (all its "
            ".log files)"
        ),
    )
    parser.add_argument(
        "--print-data-log", action="store_true", help="also print every record of every batch"
    )
    parser.set_defaults(run=run)


def _segments_of(directory: Path) -> list[Path]:
    """The `.log` files of a partition directory, oldest segment first."""
    return sorted(
        (p for p in directory.glob("*.log") if p.is_file()),
        key=lambda p: (_base_offset_of(p), p.name),
    )


def _files_of(name: str) -> list[Path]:
    """The files ``name`` stands for: itself, or a partition directory's segments."""
    path = Path(name)
    if path.is_dir():
        segments = _segments_of(path)
        if not segments:
            raise FileNotFoundError(f"{name}: directory has no .log segment files")
        return segments
    if not path.is_file():
        raise FileNotFoundError(f"{name}: no such file")
    return [path]


def run(args: argparse.Namespace) -> int:
    status = 0
    for given in args.files:
        try:
            files = _files_of(given)
        except FileNotFoundError as exc:
            print(f"tidelog dump-log: {exc}", file=sys.stderr)
            status = 1
            continue
        for path in files:
            if not _dump_file(path, print_records=args.print_data_log):
                status = 1
    return status


def _dump_file(path: Path, *, print_records: bool) -> bool:
    print(f"Dumping {path}")
    try:
        if path.suffix == ".log":
            return _dump_segment(path, print_records=print_records)
        if path.suffix == ".index":
            return _dump_index(path, struct.Struct(">ii"), ("offset", "position"))
        if path.suffix == ".timeindex":
            return _dump_index(path, struct.Struct(">qi"), ("timestamp", "offset"))
        if path.suffix == ".txnindex":
            return _dump_txn_index(path)
        print(
            f"tidelog dump-log: {path}: not a .log, .index, .timeindex or .txnindex file",
            file=sys.stderr,
        )
        return False
    except BrokenPipeError:
        raise  # our reader went away, not the file: `tidelog` main ends quietly
    except OSError as exc:
        print(f"tidelog dump-log: {path}: {exc.strerror or exc}", file=sys.stderr)
        return False


def _base_offset_of(path: Path) -> int:
    try:
        return int(path.stem)
    except ValueError:
        return 0


def _dump_index(path: Path, entry: struct.Struct, names: tuple[str, str]) -> bool:
    """Print index entries; relative offsets are shown as absolute ones."""
    base = _base_offset_of(path)
    data = path.read_bytes()
    usable = len(data) - len(data) % entry.size
    offset_first = names[0] == "offset"
    for n, (first, second) in enumerate(entry.iter_unpack(data[:usable])):
        if n > 0 and first == 0 and second == 0:
            break  # the preallocated, never-written tail of the file
        if offset_first:
            print(f"offset: {base + first} position: {second}")
        else:
            print(f"timestamp: {first} offset: {base + second}")
    if usable != len(data):
        print(f"index has {len(data) - usable} trailing bytes that are not a whole entry")
        return False
    return True


def _dump_txn_index(path: Path) -> bool:
    """Print the aborted transactions of a ``.txnindex`` file (Kafka's field names)."""
    data = path.read_bytes()
    for entry in decode_entries(data):
        print(
            f"version: 0 producerId: {entry.producer_id} firstOffset: {entry.first_offset} "
            f"lastOffset: {entry.last_offset} lastStableOffset: {entry.last_stable_offset}"
        )
    trailing = len(data) % ENTRY_SIZE
    if trailing:
        print(f"index has {trailing} trailing bytes that are not a whole entry")
        return False
    return True


def _read_exact(f: BinaryIO, size: int) -> bytes:
    data = f.read(size)
    return data if data is not None else b""


def _dump_segment(path: Path, *, print_records: bool) -> bool:
    print(f"Log starting offset: {_base_offset_of(path)}")
    position = 0
    with path.open("rb") as f:
        while True:
            head = _read_exact(f, rb.LOG_OVERHEAD)
            if not head:
                return True
            try:
                size = rb.peek_batch_size(head)
                if size > _MAX_BATCH_BYTES:
                    raise RecordsError(f"batch at position {position} declares {size} bytes")
                data = head + _read_exact(f, size - rb.LOG_OVERHEAD)
                header = rb.validate_batch(data)
            except RecordsError as exc:
                print(f"invalid bytes from position {position} on: {exc}")
                return False
            _print_batch(position, header)
            if print_records:
                _print_records(data, header.is_control)
            position += size


def _print_batch(position: int, h: rb.BatchHeader) -> None:
    time_type = "LogAppendTime" if h.is_log_append_time else "CreateTime"
    print(
        f"baseOffset: {h.base_offset} lastOffset: {h.last_offset} count: {h.record_count} "
        f"baseSequence: {h.base_sequence} lastSequence: {h.last_sequence} "
        f"producerId: {h.producer_id} producerEpoch: {h.producer_epoch} "
        f"partitionLeaderEpoch: {h.partition_leader_epoch} "
        f"isTransactional: {str(h.is_transactional).lower()} "
        f"isControl: {str(h.is_control).lower()} position: {position} "
        f"{time_type}: {h.max_timestamp} size: {h.size} magic: {h.magic} "
        f"compresscodec: {_CODECS.get(h.compression, h.compression)} crc: {h.crc} isvalid: true"
    )


def _print_records(data: bytes, control: bool) -> None:
    for rec in decode_records(data, verify_crc=False):
        if control:
            try:
                marker = parse_end_txn_marker(rec.key, rec.value)
            except RecordsError:
                pass  # another control record (leader change, KRaft): printed as bytes
            else:
                print(
                    f"| offset: {rec.offset} timestamp: {rec.timestamp} "
                    f"endTxnMarker: {'COMMIT' if marker.commit else 'ABORT'} "
                    f"coordinatorEpoch: {marker.coordinator_epoch}"
                )
                continue
        header_keys = ", ".join(k for k, _ in rec.headers)
        key = "null" if rec.key is None else rec.key.decode("utf-8", "backslashreplace")
        value = "null" if rec.value is None else rec.value.decode("utf-8", "backslashreplace")
        print(
            f"| offset: {rec.offset} timestamp: {rec.timestamp} "
            f"keySize: {-1 if rec.key is None else len(rec.key)} "
            f"valueSize: {-1 if rec.value is None else len(rec.value)} "
            f"headerKeys: [{header_keys}] key: {key} payload: {value}"
        )
