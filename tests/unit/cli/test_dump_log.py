"""`tidelog dump-log` prints every batch of a segment and stops, with a reason, at bad bytes."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from tidelog.cli.main import main
from tidelog.records import BatchBuilder, Compression, set_base_offset


def _batch(base_offset: int, values: list[bytes], codec: Compression) -> bytes:
    builder = BatchBuilder(compression=codec)
    for n, value in enumerate(values):
        builder.append(b"k%d" % n, value, (("h", b"v"),), timestamp=1_700_000_000_000 + n)
    data = bytearray(builder.close())
    set_base_offset(data, 0, base_offset)
    return bytes(data)


def test_prints_each_batch_and_its_records(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    segment = tmp_path / "00000000000000000000.log"
    segment.write_bytes(
        _batch(0, [b"alpha", b"beta"], Compression.NONE) + _batch(2, [b"gamma"], Compression.LZ4)
    )
    assert main(["dump-log", "--print-data-log", str(segment)]) == 0
    out = capsys.readouterr().out
    assert "baseOffset: 0 lastOffset: 1 count: 2" in out
    assert "baseOffset: 2 lastOffset: 2 count: 1" in out
    assert "compresscodec: lz4" in out
    assert "| offset: 1 timestamp: 1700000000001 keySize: 2 valueSize: 4" in out
    assert "payload: gamma" in out
    assert "headerKeys: [h]" in out


def test_stops_at_a_torn_tail_and_reports_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = _batch(0, [b"alpha"], Compression.NONE)
    torn = _batch(1, [b"beta" * 50], Compression.NONE)[:40]
    segment = tmp_path / "00000000000000000000.log"
    segment.write_bytes(good + torn)
    assert main(["dump-log", str(segment)]) == 1
    out = capsys.readouterr().out
    assert "baseOffset: 0" in out
    assert f"invalid bytes from position {len(good)} on" in out


def test_prints_offset_index_entries_as_absolute_offsets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    index = tmp_path / "00000000000000000100.index"
    index.write_bytes(struct.pack(">iiiiii", 5, 4096, 9, 8192, 0, 0))
    assert main(["dump-log", str(index)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1:] == ["offset: 105 position: 4096", "offset: 109 position: 8192"]


def test_missing_file_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["dump-log", str(tmp_path / "nope.log")]) == 1
    assert (
        capsys.readouterr().err.strip()
        == f"tidelog dump-log: {tmp_path / 'nope.log'}: no such file"
    )


def test_a_partition_directory_dumps_its_segments_in_offset_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Written newest first, so neither creation order nor directory order gives the answer.
    for base in (20, 10, 0):
        (tmp_path / f"{base:020d}.log").write_bytes(
            _batch(base, [b"v%d" % base] * 10, Compression.NONE)
        )
        (tmp_path / f"{base:020d}.index").write_bytes(struct.pack(">ii", 0, 0))
    assert main(["dump-log", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line for line in out if line.startswith("Dumping ")] == [
        f"Dumping {tmp_path / f'{base:020d}.log'}" for base in (0, 10, 20)
    ]
    bases = [int(line.split()[1]) for line in out if line.startswith("baseOffset: ")]
    assert bases == [0, 10, 20]
    # Each section opens with its file's name, then that file's starting offset.
    assert out[out.index(f"Dumping {tmp_path / f'{10:020d}.log'}") + 1] == (
        "Log starting offset: 10"
    )


def test_a_directory_without_segments_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["dump-log", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"tidelog dump-log: {tmp_path}: directory has no .log segment files\n"


def test_shows_transaction_markers_and_the_aborted_transaction_index(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tidelog.records.control import build_end_txn_marker_batch
    from tidelog.storage.txn_index import AbortedTxn, TxnIndex

    builder = BatchBuilder(transactional=True)
    builder.set_producer(7, 0, 0)
    builder.append(b"k", b"aborted", timestamp=1_700_000_000_000)
    data = builder.close()
    marker = bytearray(
        build_end_txn_marker_batch(
            commit=False, producer_id=7, producer_epoch=0, coordinator_epoch=3, timestamp=5
        )
    )
    set_base_offset(marker, 0, 1)
    segment = tmp_path / "00000000000000000000.log"
    segment.write_bytes(data + bytes(marker))
    TxnIndex(tmp_path / "00000000000000000000.txnindex").append(AbortedTxn(7, 0, 1, 2))
    assert main(["dump-log", "--print-data-log", str(segment)]) == 0
    out = capsys.readouterr().out
    assert "isTransactional: true isControl: true" in out
    assert "| offset: 1 timestamp: 5 endTxnMarker: ABORT coordinatorEpoch: 3" in out
    assert main(["dump-log", str(tmp_path / "00000000000000000000.txnindex")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1:] == [
        "version: 0 producerId: 7 firstOffset: 0 lastOffset: 1 lastStableOffset: 2"
    ]
