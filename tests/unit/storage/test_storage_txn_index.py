"""The aborted-transaction index (``.txnindex``): Kafka's file format, the log keeping it
with its segment (truncation, recovery, deletion, swaps), and the producer state's replay
that re-adds lost entries."""

from __future__ import annotations

import struct
from pathlib import Path

from storage_helpers import FakeClock, LogFactory, make_batch

from tidelog.records import BatchBuilder
from tidelog.records.control import build_end_txn_marker_batch
from tidelog.storage import Log
from tidelog.storage.producer_state import ProducerStateManager
from tidelog.storage.segment import SWAP_SUFFIX, TXN_INDEX_SUFFIX
from tidelog.storage.txn_index import ENTRY_SIZE, AbortedTxn, TxnIndex, decode_entries


def test_entries_are_kafkas_34_byte_records(tmp_path: Path) -> None:
    index = TxnIndex(tmp_path / "00000000000000000000.txnindex")
    index.append(AbortedTxn(5, 10, 20, 12))
    index.append(AbortedTxn(6, 11, 30, 31))
    data = index.path.read_bytes()
    assert ENTRY_SIZE == 34
    assert data[:34] == struct.pack(">hqqqq", 0, 5, 10, 20, 12)
    assert decode_entries(data) == [AbortedTxn(5, 10, 20, 12), AbortedTxn(6, 11, 30, 31)]
    # A torn write leaves the whole entries; the file is trimmed on load.
    index.path.write_bytes(data + b"\x00\x01\x02")
    reloaded = TxnIndex(index.path)
    assert reloaded.entries == [AbortedTxn(5, 10, 20, 12), AbortedTxn(6, 11, 30, 31)]
    assert index.path.stat().st_size == 2 * ENTRY_SIZE


def test_replay_adds_only_missing_entries_in_marker_order(tmp_path: Path) -> None:
    index = TxnIndex(tmp_path / "x.txnindex")
    index.append(AbortedTxn(1, 0, 10, 11))
    index.append(AbortedTxn(3, 12, 30, 31))
    assert not index.append(AbortedTxn(1, 0, 10, 11), if_absent=True)
    assert index.append(AbortedTxn(2, 11, 20, 21), if_absent=True)
    assert [e.last_offset for e in TxnIndex(index.path).entries] == [10, 20, 30]


def test_overlapping_and_truncation(tmp_path: Path) -> None:
    index = TxnIndex(tmp_path / "x.txnindex")
    for entry in (AbortedTxn(1, 0, 10, 11), AbortedTxn(2, 5, 20, 25), AbortedTxn(3, 25, 40, 41)):
        index.append(entry)
    found, complete = index.overlapping(11, 22)
    assert found == [AbortedTxn(2, 5, 20, 25)] and complete  # LSO 25 >= 22: nothing later
    found, complete = index.overlapping(0, 100)
    assert len(found) == 3 and not complete
    assert index.truncate_to(20) == 2
    assert TxnIndex(index.path).entries == [AbortedTxn(1, 0, 10, 11)]
    index.truncate_to(0)
    assert not index.path.exists()


def txn_data(pid: int, seq: int) -> bytes:
    builder = BatchBuilder(transactional=True)
    builder.set_producer(pid, 0, seq)
    builder.append(b"k", b"v", timestamp=1000)
    builder.append(b"k", b"w", timestamp=1000)
    return builder.close()


def abort(pid: int) -> bytes:
    return build_end_txn_marker_batch(
        commit=False, producer_id=pid, producer_epoch=0, coordinator_epoch=0, timestamp=1000
    )


def test_log_keeps_entries_with_their_segments(open_log: LogFactory) -> None:
    log = open_log({"segment.bytes": 200})
    log.append(txn_data(1, 0))  # 0-1
    log.append(abort(1))  # 2
    log.roll()
    log.append(txn_data(2, 0))  # 3-4
    log.append(abort(2))  # 5
    assert log.append_aborted_txn(AbortedTxn(1, 0, 2, 3))
    assert log.append_aborted_txn(AbortedTxn(2, 3, 5, 6))
    first, second = log.segments
    assert [e.producer_id for e in first.txn_index.entries] == [1]
    assert [e.producer_id for e in second.txn_index.entries] == [2]
    # A transaction started in the first segment and aborted in a later one is found.
    assert log.aborted_transactions(0, 3) == [AbortedTxn(1, 0, 2, 3)]
    assert log.aborted_transactions(3, 6) == [AbortedTxn(2, 3, 5, 6)]
    log.truncate_to(5)
    assert log.aborted_transactions(0, 6) == [AbortedTxn(1, 0, 2, 3)]
    log.roll()
    log.append(make_batch([b"x"]))
    log.delete_records(log.log_end_offset - 1)
    assert list(log.directory.glob("*" + TXN_INDEX_SUFFIX)) == []


def test_recovery_drops_entries_of_lost_markers_and_replay_restores_lost_ones(
    log_dir: Path, clock: FakeClock
) -> None:
    log = Log.open(log_dir, topic="t", partition=0, clock=clock)
    log.append(txn_data(1, 0))
    log.append(abort(1))  # 2
    log.append(txn_data(2, 0))
    log.append(abort(2))  # 5
    log.append_aborted_txn(AbortedTxn(1, 0, 2, 3))
    log.append_aborted_txn(AbortedTxn(2, 3, 5, 6))
    log.close()
    (segment,) = log_dir.glob("*.log")
    with segment.open("r+b") as f:  # the last marker was torn by a crash
        f.truncate(segment.stat().st_size - 10)
    reopened = Log.open(log_dir, topic="t", partition=0, clock=clock)
    assert reopened.log_end_offset == 5
    assert reopened.aborted_transactions(0, 5) == [AbortedTxn(1, 0, 2, 3)]
    reopened.close()
    # The index file of the surviving marker is lost too: replay re-adds its entry.
    for path in log_dir.glob("*" + TXN_INDEX_SUFFIX):
        path.unlink()
    again = Log.open(log_dir, topic="t", partition=0, clock=clock)
    try:
        assert again.aborted_transactions(0, 5) == []
        state = ProducerStateManager.load(again, now_ms=clock())
        assert state.ongoing == {2: 3}  # its ABORT marker was lost
        assert state.first_unstable_offset == 3
        assert again.aborted_transactions(0, 5) == [AbortedTxn(1, 0, 2, 3)]
    finally:
        again.close()


def test_an_interrupted_swap_keeps_the_swap_segments_entries(
    log_dir: Path, clock: FakeClock
) -> None:
    """A crash after the cleaned segment was complete (``.swap``) but before it replaced the
    old ones: recovery completes the swap with the swap's own txn index."""
    log = Log.open(log_dir, topic="t", partition=0, clock=clock)
    log.append(txn_data(1, 0))
    log.append(abort(1))
    log.append_aborted_txn(AbortedTxn(1, 0, 2, 3))
    log.roll()
    log.append(make_batch([b"x"]))
    log.close()
    stem = "00000000000000000000"
    for kind in (".log", ".index", ".timeindex", TXN_INDEX_SUFFIX):
        source = log_dir / (stem + kind)
        (log_dir / (stem + kind + SWAP_SUFFIX)).write_bytes(source.read_bytes())
    (log_dir / (stem + TXN_INDEX_SUFFIX)).unlink()  # the old one is half gone
    reopened = Log.open(log_dir, topic="t", partition=0, clock=clock)
    try:
        assert reopened.recovery_report.completed_swaps == [0]
        assert reopened.aborted_transactions(0, 3) == [AbortedTxn(1, 0, 2, 3)]
        assert list(log_dir.glob("*" + SWAP_SUFFIX)) == []
    finally:
        reopened.close()


def test_an_orphan_swap_txn_index_is_removed(log_dir: Path, clock: FakeClock) -> None:
    log = Log.open(log_dir, topic="t", partition=0, clock=clock)
    log.append(make_batch([b"x"]))
    log.close()
    orphan = log_dir / ("00000000000000000000" + TXN_INDEX_SUFFIX + SWAP_SUFFIX)
    orphan.write_bytes(struct.pack(">hqqqq", 0, 1, 0, 0, 1))
    reopened = Log.open(log_dir, topic="t", partition=0, clock=clock)
    try:
        assert not orphan.exists()
        assert reopened.aborted_transactions(0, 1) == []
    finally:
        reopened.close()
