"""SIGKILL during transactional writes: after recovery, the producer state's open
transactions, the last stable offset and the aborted-transaction index equal what the
recovered log itself says, read batch by batch and marker by marker.

The writer (``txn_crash_writer.py``) appends transactional batches, plain batches and
COMMIT/ABORT markers through the broker's partition, with segments small enough that rolls
write producer snapshots; it is killed after a random number of steps (no clean shutdown,
no shutdown snapshot). Each run then continues from the recovered state and is killed
again, so later runs start from snapshots and indexes an earlier crash left.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tidelog.broker.partitions import Partition, Partitions
from tidelog.records import iter_batches, iter_records
from tidelog.records.control import parse_end_txn_marker
from tidelog.storage import LogConfig, LogManager
from tidelog.storage.txn_index import AbortedTxn

WRITER = Path(__file__).with_name("txn_crash_writer.py")


def _run_and_kill(directory: Path, seed: int, steps: int) -> int:
    """Run the writer until it acknowledged ``steps`` steps, SIGKILL it; the last log end
    offset it acknowledged."""
    child = subprocess.Popen(
        [sys.executable, str(WRITER), str(directory), str(seed)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    acks: list[int] = []
    enough = threading.Event()

    def pump() -> None:
        assert child.stdout is not None
        for line in child.stdout:
            if line.startswith(b"A ") and line.endswith(b"\n"):
                acks.append(int(line.split()[1]))
                if len(acks) >= steps:
                    enough.set()
        enough.set()

    reader = threading.Thread(target=pump)
    reader.start()
    try:
        assert enough.wait(120), "the writer made no progress"
        alive = child.poll() is None
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        reader.join()
    assert child.stderr is not None
    assert alive, f"the writer died on its own:\n{child.stderr.read().decode()}"
    return acks[-1]


def _expected(partition: Partition) -> tuple[dict[int, int], list[AbortedTxn], int]:
    """Open transactions, aborted-index entries and LSO, from the log's batches alone."""
    log = partition.log
    data = log.read_bytes(log.log_start_offset, 1 << 30) if log.log_end_offset else b""
    open_txns: dict[int, int] = {}
    aborted: list[AbortedTxn] = []
    while True:
        for position, header in iter_batches(data):
            if header.is_control:
                (record,) = list(iter_records(data, position, header=header))
                marker = parse_end_txn_marker(record.key, record.value)
                start = open_txns.pop(header.producer_id, None)
                if start is not None and not marker.commit:
                    lso = min(open_txns.values(), default=header.base_offset + 1)
                    aborted.append(AbortedTxn(header.producer_id, start, header.base_offset, lso))
            elif header.is_transactional:
                open_txns.setdefault(header.producer_id, header.base_offset)
            last = header.next_offset
        if not data or last >= log.log_end_offset:
            break
        data = log.read_bytes(last, 1 << 30)
    return open_txns, aborted, min(open_txns.values(), default=log.log_end_offset)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_kill_during_transactions_recovers_what_the_log_says(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    directory = tmp_path / "data"
    acknowledged = 0
    for run in range(3):
        acknowledged = _run_and_kill(directory, seed * 10 + run, rng.randint(50, 400))
        (directory / ".clean-shutdown").unlink(missing_ok=True)
        logs = LogManager([directory], clock=lambda: time.time_ns() // 1_000_000)
        logs.open()
        try:
            partition = Partitions(logs).ensure(
                "txn", 0, config=LogConfig(), topic_id=None, leader_epoch=0
            )
            # Nothing acknowledged was lost (a kill keeps the page cache).
            assert partition.log.log_end_offset >= acknowledged
            open_txns, aborted, lso = _expected(partition)
            assert partition.producers.ongoing == open_txns
            assert partition.last_stable_offset == lso
            entries = [e for s in partition.log.segments for e in s.txn_index.entries]
            assert entries == aborted
            assert len(partition.log.segments) > 1
        finally:
            logs.close()
