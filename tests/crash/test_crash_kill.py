"""kill -9 a process that appends to a log, then recover the log and check every record.

The child (``crash_writer.py``) appends batches from one or four threads, prints what
each append acknowledged, and is killed with SIGKILL at a random moment (seeded). The
test then opens the log in this process, as a restarted broker would, and checks:

- every batch of every segment file passes its CRC, segments hold whole batches only;
- the log is a prefix of what was written: offsets consecutive from 0, each writer's
  records in its order with consecutive sequence numbers from 0 (no gap, no
  duplicate), every record byte-exact (key, value, timestamp);
- every acknowledged record is there, at the offset its append reported;
- every ``.index`` / ``.timeindex`` entry agrees with the batches (crash_helpers);
- what the recovery report says is consistent (only the last segment can lose bytes,
  every segment from the recovery point on was scanned);
- the log takes new appends, and a clean reopen returns everything again.

A process kill leaves the OS page cache intact, so even non-durable writes survive it;
these tests check recovery of whatever a dying process left (torn roll, index entries
behind the data, empty new segments), not power loss, which would need a fault
injecting file system.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from crash_helpers import (
    check_indexes,
    check_record,
    parse_value,
    read_records,
    record_key,
    record_timestamp,
    record_value,
    scan_segment_files,
)

from tidelog.records import BatchBuilder, Record
from tidelog.storage import Log, LogConfig, LogManager, RecoveryReport

WRITER_SCRIPT = Path(__file__).with_name("crash_writer.py")
TOPIC = "crash"
DURABLE_RUNS = 20
BUFFERED_RUNS = 4

# Small segments (and in one case small indexes) so that the writer rolls all the time.
CONFIGS: tuple[dict[str, str | int], ...] = (
    {"segment.bytes": 48 * 1024, "index.interval.bytes": 1024},
    {"segment.bytes": 96 * 1024, "index.interval.bytes": 2048, "segment.index.bytes": 96},
    {"segment.bytes": 24 * 1024, "index.interval.bytes": 256},
)


@dataclass(frozen=True)
class Ack:
    writer: int
    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int


@dataclass(frozen=True)
class Scenario:
    seed: int
    writers: int
    durable: bool
    mode: str  # "log": Log.open, recovery from offset 0; "manager": LogManager + checkpoints
    config: dict[str, str | int]


def _clock() -> int:
    return time.time_ns() // 1_000_000


def _run_and_kill(directory: Path, scenario: Scenario, rng: random.Random) -> list[Ack]:
    """Start the writer, let it append for 0.1-0.6 s, SIGKILL it; the acks it printed."""
    stderr_path = directory.parent / f"writer-{scenario.seed}.stderr"
    with open(stderr_path, "wb") as stderr:
        child = subprocess.Popen(
            [
                sys.executable,
                str(WRITER_SCRIPT),
                str(directory),
                str(scenario.seed),
                str(scenario.writers),
                "durable" if scenario.durable else "buffered",
                scenario.mode,
                json.dumps(scenario.config),
            ],
            stdout=subprocess.PIPE,
            stderr=stderr,
        )
    lines: list[bytes] = []
    ready = threading.Event()

    def pump() -> None:
        assert child.stdout is not None
        for line in child.stdout:
            if line == b"READY\n":
                ready.set()
            else:
                lines.append(line)
        ready.set()

    reader = threading.Thread(target=pump)
    reader.start()
    try:
        assert ready.wait(60), "the writer did not start"
        time.sleep(rng.uniform(0.1, 0.6))
        alive = child.poll() is None
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        reader.join()
    assert alive, f"the writer died on its own:\n{stderr_path.read_text()}"
    assert child.returncode == -signal.SIGKILL
    acks = []
    for line in lines:
        # A line cut by the kill was never a complete acknowledgement.
        if line.startswith(b"A ") and line.endswith(b"\n"):
            acks.append(Ack(*(int(field) for field in line.split()[1:])))
    assert acks, "the writer acknowledged nothing before the kill"
    return acks


def _check_recovered(
    log: Log,
    report: RecoveryReport,
    acks: list[Ack],
    writers: int,
    bases_before: list[int],
) -> list[Record]:
    directory = log.directory
    assert not report.clean_shutdown
    scans = scan_segment_files(directory)
    bases = [scan.base_offset for scan in scans]
    assert bases == [segment.base_offset for segment in log.segments]
    # A killed process leaves sealed segments whole: only the last one may lose bytes.
    for problem in report.problems:
        assert problem.segment == bases_before[-1], report
    assert report.recovered_segments, "the active segment was not scanned"
    assert report.recovered_segments == bases[len(bases) - len(report.recovered_segments) :]
    check_indexes(directory)

    records = read_records(log)
    assert [record.offset for record in records] == list(range(len(records)))
    assert log.log_start_offset == 0 and log.log_end_offset == len(records)
    next_seq = [0] * writers
    for record in records:
        writer, seq = check_record(record)
        assert seq == next_seq[writer], f"writer {writer}: seq {seq}, expected {next_seq[writer]}"
        next_seq[writer] += 1
    for ack in acks:
        assert ack.last_offset - ack.first_offset == ack.last_seq - ack.first_seq
        assert ack.last_offset < len(records), f"acknowledged {ack} lost ({len(records)} kept)"
        for index, offset in enumerate(range(ack.first_offset, ack.last_offset + 1)):
            assert parse_value(records[offset].value) == (ack.writer, ack.first_seq + index)
    return records


def _append_after_recovery(log: Log, writers: int) -> Record:
    """One more record from a new writer id; checks where it lands."""
    builder = BatchBuilder()
    builder.append(
        record_key(writers, 0), record_value(writers, 0), timestamp=record_timestamp(writers, 0)
    )
    leo = log.log_end_offset
    info = log.append(builder.close(), durable=True)
    assert info.first_offset == info.last_offset == leo
    assert log.log_end_offset == leo + 1
    return read_records(log)[-1]


def _bases_on_disk(directory: Path) -> list[int]:
    return sorted(int(path.stem) for path in directory.glob("*.log"))


def _run_scenario(tmp_path: Path, scenario: Scenario) -> None:
    rng = random.Random(scenario.seed)
    root = tmp_path / "logs"
    root.mkdir()
    acks = _run_and_kill(root, scenario, rng)
    directory = root / f"{TOPIC}-0"
    bases_before = _bases_on_disk(directory)
    config = LogConfig.from_mapping(scenario.config)

    if scenario.mode == "manager":
        manager = LogManager([root], clock=_clock, default_config=config)
        manager.open()
        log = manager.get_log(TOPIC, 0)
        assert log is not None
        records = _check_recovered(
            log, manager.recovery_reports[(TOPIC, 0)], acks, scenario.writers, bases_before
        )
        extra = _append_after_recovery(log, scenario.writers)
        manager.close()
        manager = LogManager([root], clock=_clock, default_config=config)
        manager.open()
        reopened = manager.get_log(TOPIC, 0)
        assert reopened is not None
        assert manager.recovery_reports[(TOPIC, 0)].clean_shutdown
        assert read_records(reopened) == [*records, extra]
        manager.close()
    else:
        log = Log.open(directory, config, topic=TOPIC, partition=0, clock=_clock)
        assert log.recovery_report.recovered_segments == bases_before
        records = _check_recovered(log, log.recovery_report, acks, scenario.writers, bases_before)
        extra = _append_after_recovery(log, scenario.writers)
        log.close()
        reopened = Log.open(
            directory, config, topic=TOPIC, partition=0, clock=_clock, clean_shutdown=True
        )
        assert read_records(reopened) == [*records, extra]
        reopened.close()
    check_indexes(directory)


def _scenario(run: int, durable: bool) -> Scenario:
    return Scenario(
        seed=run if durable else 1000 + run,
        writers=(1, 4)[run % 2],
        durable=durable,
        mode=("log", "log", "manager", "manager")[run % 4],
        config=CONFIGS[run % len(CONFIGS)],
    )


@pytest.mark.slow
@pytest.mark.parametrize("run", range(DURABLE_RUNS))
def test_kill_during_durable_appends(tmp_path: Path, run: int) -> None:
    _run_scenario(tmp_path, _scenario(run, durable=True))


@pytest.mark.slow
@pytest.mark.parametrize("run", range(BUFFERED_RUNS))
def test_kill_during_buffered_appends(tmp_path: Path, run: int) -> None:
    # acks=1 semantics: nothing was fsynced. Only the process died, so the page cache
    # still holds every acknowledged write and the tests may (and do) expect them all.
    _run_scenario(tmp_path, _scenario(run, durable=False))
