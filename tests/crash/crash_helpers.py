"""What the crash writer writes, and the checks a recovered log must pass.

Every record is a pure function of ``(writer, seq)``: its key, value and timestamp can
be rebuilt from the value's prefix ``w<writer> s<seq>|``, so a reader can tell that a
record holds exactly the bytes that were appended, and which one it is. The writer
process (``crash_writer.py``) and the tests both import this module.

The checks look at the files themselves (every batch's CRC, every index entry) as well
as at what :meth:`Log.read_bytes` returns, so a log that only reads well through its
own (possibly wrong) indexes does not pass.
"""

from __future__ import annotations

import bisect
import struct
from dataclasses import dataclass
from pathlib import Path

from tidelog.records import BatchHeader, Record, iter_batches, iter_records
from tidelog.storage import Log

BASE_TIMESTAMP = 1_700_000_000_000
_OFFSET_ENTRY = struct.Struct(">ii")
_TIME_ENTRY = struct.Struct(">qi")


def record_key(writer: int, seq: int) -> bytes | None:
    # Some null keys, so both encodings of the key field appear.
    return None if seq % 7 == 3 else b"k%d-%d" % (writer, seq % 50)


def _value_size(writer: int, seq: int) -> int:
    mixed = (seq * 2654435761 + writer * 40503) % 1000
    if mixed < 5:
        return 12_000 + mixed * 1000  # a few large values
    return mixed * 2


def record_value(writer: int, seq: int) -> bytes:
    prefix = b"w%d s%d|" % (writer, seq)
    filler = b"%d." % (seq * 31 + writer) * (_value_size(writer, seq) // 3 + 1)
    return prefix + filler[: _value_size(writer, seq)]


def record_timestamp(writer: int, seq: int) -> int:
    # Mostly increasing with some going backwards, so the time index has work to do.
    return BASE_TIMESTAMP + seq * 3 + writer + ((seq * 7919) % 41) - 20


def parse_value(value: bytes | None) -> tuple[int, int]:
    """``(writer, seq)`` from a value written by :func:`record_value`."""
    assert value is not None, "a record lost its value"
    head, bar, _ = value.partition(b"|")
    assert bar, f"value without a sequence prefix: {value[:40]!r}"
    writer_text, _, seq_text = head.partition(b" ")
    assert writer_text.startswith(b"w") and seq_text.startswith(b"s"), head
    return int(writer_text[1:]), int(seq_text[1:])


def check_record(record: Record) -> tuple[int, int]:
    """Assert that ``record`` is exactly what the writer appended; returns its id."""
    writer, seq = parse_value(record.value)
    assert record.value == record_value(writer, seq), f"value of w{writer} s{seq} differs"
    assert record.key == record_key(writer, seq), f"key of w{writer} s{seq} differs"
    assert record.timestamp == record_timestamp(writer, seq), f"timestamp of w{writer} s{seq}"
    return writer, seq


def read_raw(log: Log, start: int | None = None) -> bytes:
    """Every batch from ``start`` (the log start) to the LEO, through :meth:`Log.read_bytes`."""
    offset = log.log_start_offset if start is None else start
    parts: list[bytes] = []
    while offset < log.log_end_offset:
        data = log.read_bytes(offset, 1 << 20, whole_batches=True)
        assert data, f"nothing read at {offset} below the LEO {log.log_end_offset}"
        last: BatchHeader | None = None
        for _, header in iter_batches(data):
            last = header
        assert last is not None
        parts.append(data)
        offset = last.next_offset
    return b"".join(parts)


def read_records(log: Log) -> list[Record]:
    """Every record of the log, read through the log, every batch's CRC checked."""
    data = read_raw(log)
    records: list[Record] = []
    for position, header in iter_batches(data):
        records.extend(iter_records(data, position, header=header))
    return records


@dataclass
class SegmentScan:
    base_offset: int
    batches: list[tuple[int, BatchHeader]]
    size: int


def scan_segment_files(directory: Path) -> list[SegmentScan]:
    """Every ``.log`` file of the directory, each batch validated with its CRC.

    Also checks that segments hold whole batches only, that base offsets increase
    within and across segments and that each batch lies in its segment's range.
    """
    scans: list[SegmentScan] = []
    previous_end = -1
    for path in sorted(directory.glob("*.log")):
        base = int(path.stem)
        data = path.read_bytes()
        batches = list(iter_batches(data))  # raises on the first bad batch or CRC
        end = batches[-1][0] + batches[-1][1].size if batches else 0
        assert end == len(data), f"{path.name}: {len(data) - end} bytes after the last batch"
        for _, header in batches:
            assert header.base_offset >= max(base, previous_end), (
                f"{path.name}: batch at {header.base_offset} below {max(base, previous_end)}"
            )
            previous_end = header.next_offset
        scans.append(SegmentScan(base, batches, len(data)))
    return scans


def check_indexes(directory: Path, *, require_files: bool = True) -> None:
    """Every index entry of every segment agrees with the segment's batches.

    ``.index`` entry ``(r, p)``: a batch starts at ``p`` and holds offset ``base + r``;
    entries strictly increase. ``.timeindex`` entry ``(t, r)``: offset ``base + r`` is
    in the segment and ``t`` is at most the largest batch max timestamp up to the batch
    holding it; timestamps strictly increase.
    """
    for scan in scan_segment_files(directory):
        stem = f"{scan.base_offset:020d}"
        by_position = dict(scan.batches)
        lasts = [header.last_offset for _, header in scan.batches]
        running_max: list[int] = []
        highest = -1
        for _, header in scan.batches:
            highest = max(highest, header.max_timestamp)
            running_max.append(highest)

        index_path = directory / (stem + ".index")
        if index_path.exists():
            raw = index_path.read_bytes()
            assert len(raw) % 8 == 0, f"{index_path.name} has a torn entry"
            previous = (-1, -1)
            for relative, position in _OFFSET_ENTRY.iter_unpack(raw):
                assert relative > previous[0] and position > previous[1], (
                    f"{index_path.name}: ({relative}, {position}) after {previous}"
                )
                previous = (relative, position)
                batch = by_position.get(position)
                assert batch is not None, f"{index_path.name}: no batch starts at {position}"
                offset = scan.base_offset + relative
                assert batch.base_offset <= offset <= batch.last_offset, (
                    f"{index_path.name}: batch at {position} does not hold offset {offset}"
                )
        else:
            assert not require_files, f"{index_path.name} is missing"

        time_path = directory / (stem + ".timeindex")
        if time_path.exists():
            raw = time_path.read_bytes()
            assert len(raw) % 12 == 0, f"{time_path.name} has a torn entry"
            previous_ts = -(2**63)
            for timestamp, relative in _TIME_ENTRY.iter_unpack(raw):
                assert timestamp > previous_ts, f"{time_path.name}: {timestamp} not increasing"
                previous_ts = timestamp
                offset = scan.base_offset + relative
                at = bisect.bisect_left(lasts, offset)
                assert at < len(lasts), f"{time_path.name}: offset {offset} is past the segment"
                header = scan.batches[at][1]
                assert header.base_offset <= offset, (
                    f"{time_path.name}: offset {offset} is in no batch"
                )
                assert timestamp <= running_max[at], (
                    f"{time_path.name}: timestamp {timestamp} above the maximum "
                    f"{running_max[at]} up to offset {offset}"
                )
        else:
            assert not require_files, f"{time_path.name} is missing"
