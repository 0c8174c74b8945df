"""Damaged segment and index files: what opening the log keeps, drops and reports.

One pristine log of several small segments is built per module (records from
``crash_helpers``, some batches compressed); each test copies its files, damages
them the way a crash or a bad disk would, opens the log and checks that

- the log opens and its :class:`RecoveryReport` names what was dropped (segment,
  position, bytes, reason) or which indexes were rebuilt;
- every batch before the damage reads back byte-exactly (the raw batches, through
  :meth:`Log.read_bytes`), the log end offset is the damaged batch's base offset;
- the segment files then hold valid batches only and every index entry agrees with
  them (rebuilt indexes are byte-identical to the pristine ones);
- the log takes new appends.

The rules being checked are those of ``docs/storage.md`` §10: from the segment holding
the recovery point on, every batch is validated and the first bad one truncates its
segment and drops every later segment; below it, only index files are checked.
"""

from __future__ import annotations

import random
import shutil
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from crash_helpers import (
    BASE_TIMESTAMP,
    check_indexes,
    check_record,
    read_raw,
    read_records,
    record_key,
    record_timestamp,
    record_value,
    scan_segment_files,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidelog.records import (
    BatchBuilder,
    BatchHeader,
    Compression,
    CorruptBatchError,
    validate_batch,
)
from tidelog.storage import Log, LogConfig, RecoveryProblem

TOPIC = "damaged"
CONFIG = LogConfig.from_mapping({"segment.bytes": 16000, "index.interval.bytes": 300})
CODECS = (Compression.GZIP, Compression.SNAPPY, Compression.LZ4, Compression.ZSTD)


def _clock() -> int:
    return BASE_TIMESTAMP + 60_000


@dataclass(frozen=True)
class BatchRef:
    segment: int
    position: int
    header: BatchHeader
    raw: bytes


@dataclass(frozen=True, repr=False)
class Pristine:
    directory: Path
    batches: list[BatchRef]
    sizes: dict[int, int]  # segment base -> .log size

    @property
    def bases(self) -> list[int]:
        return sorted(self.sizes)

    @property
    def leo(self) -> int:
        return self.batches[-1].header.next_offset

    def of_segment(self, base: int) -> list[BatchRef]:
        return [ref for ref in self.batches if ref.segment == base]

    def file(self, base: int, kind: str = ".log") -> Path:
        return self.directory / f"{base:020d}{kind}"


def _build(directory: Path) -> Pristine:
    log = Log.open(directory, CONFIG, topic=TOPIC, partition=0, clock=_clock)
    rng = random.Random(20240611)
    seq = 0
    in_active = 0
    while len(log.segments) < 4 or in_active < 6:
        count = rng.choice((1, 1, 2, 3))
        codec = rng.choice(CODECS) if rng.random() < 0.4 else Compression.NONE
        builder = BatchBuilder(compression=codec)
        for item in range(seq, seq + count):
            builder.append(
                record_key(0, item), record_value(0, item), timestamp=record_timestamp(0, item)
            )
        info = log.append(builder.close())
        in_active = 1 if info.first_offset == log.active_segment.base_offset else in_active + 1
        seq += count
    log.close()
    batches: list[BatchRef] = []
    sizes: dict[int, int] = {}
    for scan in scan_segment_files(directory):
        data = (directory / f"{scan.base_offset:020d}.log").read_bytes()
        sizes[scan.base_offset] = scan.size
        for position, header in scan.batches:
            raw = data[position : position + header.size]
            batches.append(BatchRef(scan.base_offset, position, header, raw))
    return Pristine(directory, batches, sizes)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Pristine:
    return _build(tmp_path_factory.mktemp("pristine") / f"{TOPIC}-0")


def _copy(pristine: Pristine, target: Path) -> Pristine:
    shutil.copytree(pristine.directory, target)
    return Pristine(target, pristine.batches, pristine.sizes)


@pytest.fixture
def damaged(pristine: Pristine, tmp_path: Path) -> Pristine:
    """A fresh copy of the pristine log to damage."""
    return _copy(pristine, tmp_path / f"{TOPIC}-0")


def _open(log: Pristine, *, recovery_point: int | None = None, clean: bool = False) -> Log:
    return Log.open(
        log.directory,
        CONFIG,
        topic=TOPIC,
        partition=0,
        clock=_clock,
        recovery_point=log.leo if recovery_point is None else recovery_point,
        clean_shutdown=clean,
    )


def _flip(path: Path, position: int, mask: int = 0xFF) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= mask
    path.write_bytes(bytes(data))


def _check_prefix(log: Log, pristine: Pristine, kept: int) -> None:
    """The log holds exactly the first ``kept`` pristine batches, byte for byte, its
    files and indexes are consistent, and it takes a new append after them."""
    expected = b"".join(ref.raw for ref in pristine.batches[:kept])
    end = (
        pristine.batches[kept].header.base_offset if kept < len(pristine.batches) else pristine.leo
    )
    assert log.log_end_offset == end
    assert read_raw(log) == expected
    for record in read_records(log):
        check_record(record)
    scan_segment_files(log.directory)
    check_indexes(log.directory)
    builder = BatchBuilder()
    builder.append(b"after", b"recovery", timestamp=BASE_TIMESTAMP)
    info = log.append(builder.close(), durable=True)
    assert info.first_offset == end
    assert read_records(log)[-1].value == b"recovery"


def _index_of(pristine: Pristine, ref: BatchRef) -> int:
    return pristine.batches.index(ref)


# -- the active segment's tail --------------------------------------------------------


def _crc_covered_position(header: BatchHeader, choice: int) -> int:
    """A byte of the batch that recovery must notice: length, magic, CRC or the
    CRC-covered part (base offset and leader epoch lie outside the CRC)."""
    positions: list[int] = [*range(8, 12), *range(16, header.size)]
    return positions[choice % len(positions)]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    which=st.integers(min_value=1, max_value=4),
    choice=st.integers(min_value=0, max_value=10**6),
    bit=st.integers(min_value=0, max_value=7),
)
def test_a_flipped_bit_in_the_active_tail_drops_that_batch_and_what_follows(
    pristine: Pristine, which: int, choice: int, bit: int
) -> None:
    active = pristine.bases[-1]
    target = pristine.of_segment(active)[-which]
    position = target.position + _crc_covered_position(target.header, choice)
    with tempfile.TemporaryDirectory() as scratch:
        copy = _copy(pristine, Path(scratch) / f"{TOPIC}-0")
        _flip(copy.file(active), position, 1 << bit)
        log = _open(copy)
        try:
            report = log.recovery_report
            assert report.recovered_segments == [active]
            assert report.rebuilt_indexes == []
            assert len(report.problems) == 1
            problem = report.problems[0]
            assert problem.segment == active
            assert problem.position == target.position
            assert problem.bytes_dropped == pristine.sizes[active] - target.position
            assert problem.reason
            _check_prefix(log, copy, _index_of(pristine, target))
        finally:
            log.close()


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("records", None, "CRC"),
        ("crc", None, "CRC"),
        ("magic", b"\x01", "magic"),
        ("length", b"\x00\x00\x00\x05", "below the header"),
        ("length", b"\x7f\xff\xff\xff", "remain"),
    ],
)
def test_damaged_header_fields_are_reported(
    damaged: Pristine, field: str, value: bytes | None, reason: str
) -> None:
    active = damaged.bases[-1]
    target = damaged.of_segment(active)[-2]
    at = {"records": target.header.size - 1, "crc": 17, "magic": 16, "length": 8}[field]
    path = damaged.file(active)
    data = bytearray(path.read_bytes())
    position = target.position + at
    if value is None:
        data[position] ^= 0x5A
    else:
        data[position : position + len(value)] = value
    path.write_bytes(bytes(data))
    log = _open(damaged)
    assert log.recovery_report.problems == [
        RecoveryProblem(
            active,
            target.position,
            damaged.sizes[active] - target.position,
            log.recovery_report.problems[0].reason,
        )
    ]
    assert reason in log.recovery_report.problems[0].reason
    _check_prefix(log, damaged, _index_of(damaged, target))
    log.close()


@pytest.mark.parametrize("cut", [5, 12, 40, 61, "half"])
def test_a_batch_cut_short_is_dropped(damaged: Pristine, cut: int | str) -> None:
    active = damaged.bases[-1]
    target = damaged.of_segment(active)[-1]
    keep = target.header.size // 2 if cut == "half" else int(cut)
    with open(damaged.file(active), "r+b") as file:
        file.truncate(target.position + keep)
    log = _open(damaged)
    problems = log.recovery_report.problems
    assert problems == [RecoveryProblem(active, target.position, keep, problems[0].reason)]
    assert "remain" in problems[0].reason
    _check_prefix(log, damaged, len(damaged.batches) - 1)
    log.close()


@pytest.mark.parametrize("garbage", ["random", "zeros", "old batch"])
def test_garbage_after_the_active_segment_is_dropped(damaged: Pristine, garbage: str) -> None:
    active = damaged.bases[-1]
    tail = {
        "random": random.Random(5).randbytes(1000),
        "zeros": bytes(4096),  # what a file system may show after a power cut
        # A valid batch (right CRC) whose offsets go backwards.
        "old batch": damaged.batches[0].raw,
    }[garbage]
    with open(damaged.file(active), "ab") as file:
        file.write(tail)
    log = _open(damaged)
    problems = log.recovery_report.problems
    assert problems == [
        RecoveryProblem(active, damaged.sizes[active], len(tail), problems[0].reason)
    ]
    if garbage == "old batch":
        assert "below the expected" in problems[0].reason
    _check_prefix(log, damaged, len(damaged.batches))
    log.close()


# -- index files ---------------------------------------------------------------------


def _index_files(pristine: Pristine) -> dict[str, bytes]:
    return {
        path.name: path.read_bytes()
        for kind in ("*.index", "*.timeindex")
        for path in pristine.directory.glob(kind)
    }


def _first_offset_at_or_after(log: Log, timestamp: int) -> tuple[int, int] | None:
    for record in read_records(log):
        if record.timestamp >= timestamp:
            return record.offset, record.timestamp
    return None


def _check_lookups(log: Log, pristine: Pristine) -> None:
    """Every offset finds its batch and timestamp lookups match a brute-force scan."""
    for ref in pristine.batches:
        for offset in (ref.header.base_offset, ref.header.last_offset):
            data = log.read_bytes(offset, 1)
            assert data[: ref.header.size] == ref.raw, f"offset {offset}"
    timestamps = sorted({record.timestamp for record in read_records(log)})
    for timestamp in [*timestamps[::3], timestamps[-1] + 1, timestamps[0] - 1]:
        found = log.offset_for_timestamp(timestamp)
        expected = _first_offset_at_or_after(log, timestamp)
        assert (None if found is None else (found.offset, found.timestamp)) == expected, timestamp


@pytest.mark.parametrize("kinds", [(".index",), (".timeindex",), (".index", ".timeindex")])
@pytest.mark.parametrize("clean", [False, True])
def test_deleted_indexes_are_rebuilt(
    damaged: Pristine, kinds: tuple[str, ...], clean: bool
) -> None:
    good = _index_files(damaged)
    for base in damaged.bases:
        for kind in kinds:
            damaged.file(base, kind).unlink()
    log = _open(damaged, clean=clean)
    report = log.recovery_report
    assert report.problems == []
    if clean:
        assert report.recovered_segments == [] and report.rebuilt_indexes == []
    else:
        assert report.recovered_segments == [damaged.bases[-1]]
        assert [base for base, _ in report.rebuilt_indexes] == damaged.bases[:-1]
        assert all("missing" in reason for _, reason in report.rebuilt_indexes)
    assert read_raw(log) == b"".join(ref.raw for ref in damaged.batches)
    _check_lookups(log, damaged)
    log.close()
    assert _index_files(damaged) == good


def test_garbage_indexes_are_rebuilt_after_an_unclean_shutdown(damaged: Pristine) -> None:
    good = _index_files(damaged)
    rng = random.Random(99)
    for base in damaged.bases:
        damaged.file(base, ".index").write_bytes(rng.randbytes(8 * 40))
        damaged.file(base, ".timeindex").write_bytes(rng.randbytes(12 * 40))
    log = _open(damaged)
    report = log.recovery_report
    assert report.problems == []
    assert [base for base, _ in report.rebuilt_indexes] == damaged.bases[:-1]
    _check_lookups(log, damaged)
    log.close()
    assert _index_files(damaged) == good


def _plausible_garbage(good: bytes, entry: struct.Struct, rng: random.Random) -> bytes:
    """Random entries ending with the real last entry, so a check of the last entry
    alone (all a clean open does) cannot tell."""
    count = max(len(good) // entry.size, 2)
    return rng.randbytes(entry.size * (count - 1)) + good[-entry.size :]


def test_a_plausible_garbage_offset_index_never_misleads_reads(damaged: Pristine) -> None:
    """A clean open only checks an index's last entry; the rest may be garbage (a bad
    disk, a stray write). Lookups must still never trust the index over the log:
    positions it gives that are not batch starts, or overshoot, fall back to a scan.

    Fails today: an entry with a negative position reaches ``os.pread`` (OSError
    EINVAL from ``Segment.iter_headers`` via ``Segment.find_batch``), and a position
    inside a batch makes ``Segment.find_by_timestamp`` raise CorruptSegmentError.
    """
    rng = random.Random(3)
    for base in damaged.bases[:-1]:
        path = damaged.file(base, ".index")
        path.write_bytes(_plausible_garbage(path.read_bytes(), struct.Struct(">ii"), rng))
    log = _open(damaged, clean=True)
    assert read_raw(log) == b"".join(ref.raw for ref in damaged.batches)
    for ref in damaged.batches:
        for offset in range(ref.header.base_offset, ref.header.next_offset):
            assert log.read_bytes(offset, 1)[: ref.header.size] == ref.raw, offset
    _check_lookups(log, damaged)
    log.close()


@pytest.mark.parametrize("position", [-5, "inside the first batch"])
def test_an_index_entry_off_the_batch_starts_is_not_trusted(
    damaged: Pristine, position: int | str
) -> None:
    """Fails today (see above): the first entry of a sealed segment's ``.index`` points
    before the file or into a batch; its last entry is right, so a clean open keeps it."""
    base = damaged.bases[1]
    first = damaged.of_segment(base)[0]
    path = damaged.file(base, ".index")
    good = path.read_bytes()
    at = position if isinstance(position, int) else first.position + 30
    relative = first.header.last_offset - base
    path.write_bytes(struct.pack(">ii", relative, at) + good[-8:])
    log = _open(damaged, clean=True)
    for ref in damaged.of_segment(base):
        assert log.read_bytes(ref.header.last_offset, 1)[: ref.header.size] == ref.raw
        found = log.offset_for_timestamp(ref.header.max_timestamp)
        assert found is not None and found.offset <= ref.header.last_offset
    _check_lookups(log, damaged)
    log.close()


def test_torn_indexes_are_rebuilt_after_an_unclean_shutdown(damaged: Pristine) -> None:
    good = _index_files(damaged)
    for path in damaged.directory.glob("*index"):
        data = path.read_bytes()
        path.write_bytes(data[: max(len(data) - 3, 0)])
    log = _open(damaged)
    report = log.recovery_report
    assert report.problems == []
    torn = [
        base
        for base in damaged.bases[:-1]
        if good[f"{base:020d}.index"] or good[f"{base:020d}.timeindex"]
    ]
    assert torn and [base for base, _ in report.rebuilt_indexes] == torn
    assert all("multiple" in reason for _, reason in report.rebuilt_indexes)
    _check_lookups(log, damaged)
    log.close()
    assert _index_files(damaged) == good


def test_an_offset_index_that_lost_entries_is_only_sparser(damaged: Pristine) -> None:
    """Whole entries lost from ``.index`` files (clean open, so nothing is checked
    beyond the last entry): lookups scan further but find the same batches."""
    for base in damaged.bases:
        path = damaged.file(base, ".index")
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 16 * 8])
    log = _open(damaged, clean=True)
    assert log.recovery_report.rebuilt_indexes == []
    _check_lookups(log, damaged)
    log.close()
    check_indexes(damaged.directory)


# -- sealed segments after an unclean shutdown ---------------------------------------


def _records_byte(ref: BatchRef) -> int:
    return ref.position + ref.header.size - 2


def test_a_corrupt_sealed_segment_below_the_recovery_point_is_not_scanned(
    damaged: Pristine,
) -> None:
    """docs/storage.md §10: below the recovery point only indexes are checked (those
    bytes were fsynced before the crash), so a byte rotted there is not noticed at
    open; the batch is served as stored and its CRC tells the consumer."""
    sealed = damaged.bases[1]
    target = damaged.of_segment(sealed)[1]
    _flip(damaged.file(sealed), _records_byte(target))
    log = _open(damaged)  # recovery point = LEO, as the checkpoint would say
    report = log.recovery_report
    assert report.problems == [] and report.recovered_segments == [damaged.bases[-1]]
    assert log.log_end_offset == damaged.leo
    served = log.read_bytes(target.header.base_offset, 1)
    assert len(served) >= target.header.size
    with pytest.raises(CorruptBatchError, match="CRC"):
        validate_batch(served)
    for ref in damaged.batches:
        if ref is not target:
            assert log.read_bytes(ref.header.base_offset, 1)[: ref.header.size] == ref.raw
    log.close()


@pytest.mark.parametrize("damage", ["flipped byte", "garbage appended"])
def test_a_damaged_sealed_segment_scanned_from_offset_0_ends_the_log_there(
    damaged: Pristine, damage: str
) -> None:
    """With no recovery point (no checkpoint), every segment is scanned: the first bad
    batch truncates its segment and every later segment is dropped (docs §10)."""
    sealed = damaged.bases[1]
    if damage == "flipped byte":
        target = damaged.of_segment(sealed)[1]
        _flip(damaged.file(sealed), _records_byte(target))
        cut = target.position
        kept = _index_of(damaged, target)
    else:
        with open(damaged.file(sealed), "ab") as file:
            file.write(random.Random(8).randbytes(500))
        cut = damaged.sizes[sealed]
        kept = _index_of(damaged, damaged.of_segment(sealed)[-1]) + 1
    log = _open(damaged, recovery_point=0)
    report = log.recovery_report
    assert report.recovered_segments == damaged.bases[:2]
    first, *later = report.problems
    assert first.segment == sealed and first.position == cut
    assert first.bytes_dropped == (
        500 if damage == "garbage appended" else damaged.sizes[sealed] - cut
    )
    if damage == "flipped byte":
        assert "CRC" in first.reason
    assert later == [
        RecoveryProblem(
            base, 0, damaged.sizes[base], f"follows a corrupt batch in segment {sealed}"
        )
        for base in damaged.bases[2:]
    ]
    for base in damaged.bases[2:]:
        assert not damaged.file(base).exists()
    assert [segment.base_offset for segment in log.segments] == damaged.bases[:2]
    _check_prefix(log, damaged, kept)
    log.close()
