"""A cleaner killed (SIGKILL) at every file-system step of its segment swaps.

The parent builds a compacted log with duplicates and tombstones, closes it, and for
a step N copies it and runs a child process that cleans the copy, counting every
``os.replace`` / ``os.rename`` / ``os.unlink`` and killing itself with SIGKILL just
before the N-th. A dry run (no kill) lists the steps; N covers every step of the
first and last swap and the checkpoint write, and every third one between. The parent then
reopens each copy with recovery and checks that it opens, every batch of every
segment file is whole (CRC) and decodes, offsets rise, each key's latest value is the
one appended last, no temporary file is left, and every offset index entry points at
the start of a batch holding the indexed offset. A second, uninterrupted clean of the
recovered copy must keep all of that true.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import struct
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tidelog.records import BatchBuilder, Compression, iter_batches, iter_records
from tidelog.storage import Cleaner, Log, LogConfig

pytestmark = pytest.mark.slow

NOW = 1_700_000_000_000
CONFIG: dict[str, str | int] = {
    "cleanup.policy": "compact",
    "segment.bytes": 2000,
    "index.interval.bytes": 60,
    "min.cleanable.dirty.ratio": "0.0",
}
_OFFSET_ENTRY = struct.Struct(">ii")

CHILD = """
import os, signal, sys
from tidelog.storage import Cleaner, Log, LogConfig
import json

directory, kill_at, now = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
config = LogConfig.from_mapping(json.loads(sys.argv[4]))
# A kill, unlike a power cut, keeps the page cache: fsync is beside the point here.
log = Log.open(directory, config, topic="topic", partition=0, clock=lambda: now,
               clean_shutdown=True, fsync=lambda fd: None)
steps = []

def counting(name, real):
    def step(*args, **kwargs):
        steps.append(name + ":" + os.path.basename(str(args[0])))
        if len(steps) == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(*args, **kwargs)
    return step

for name in ("replace", "rename", "unlink"):
    setattr(os, name, counting(name, getattr(os, name)))
result = Cleaner(fsync=lambda fd: None).clean_log(log, now, force=True)
print(json.dumps({"steps": steps, "removed": result.records_removed}))
"""


def _open(directory: Path, *, clean: bool) -> Log:
    return Log.open(
        directory,
        LogConfig.from_mapping(CONFIG),
        topic="topic",
        partition=0,
        clock=lambda: NOW,
        clean_shutdown=clean,
        fsync=_no_fsync,
    )


def _no_fsync(fd: int) -> None:
    # SIGKILL keeps the page cache, so fsync plays no part in what these tests check.
    return None


def _build(directory: Path) -> dict[bytes, bytes | None]:
    """Six small sealed segments plus an active one (so the cleaner groups several
    into one); returns key -> latest."""
    log = _open(directory, clean=True)
    latest: dict[bytes, bytes | None] = {}
    codecs = list(Compression)
    for i in range(28):
        if i and i % 4 == 0:
            log.roll()
        builder = BatchBuilder(compression=codecs[i % len(codecs)])
        for j in range(3):
            key = b"key-%d" % ((i * 3 + j) % 11)
            value = None if (i + j) % 13 == 5 else b"value-%d-%d" % (i, j) * 2
            builder.append(key, value, [("n", b"%d" % i)], timestamp=NOW - 10_000 + i)
            latest[key] = value
        # A key written once: its value must survive wherever its segment goes.
        once = b"once-%d" % i
        builder.append(once, b"only", timestamp=NOW - 10_000 + i)
        latest[once] = b"only"
        log.append(builder.close())
    assert len(log.segments) == 7
    log.close()
    return latest


def _run_child(script: Path, directory: Path, kill_at: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(script), str(directory), str(kill_at), str(NOW), json.dumps(CONFIG)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def _check(directory: Path, latest: dict[bytes, bytes | None]) -> None:
    log = _open(directory, clean=False)
    try:
        leftovers = [
            p.name for p in directory.iterdir() if p.suffix in (".cleaned", ".swap", ".deleted")
        ]
        assert leftovers == []
        # Through the log: every record from the start, offsets rising.
        seen: dict[bytes, bytes | None] = {}
        offsets: list[int] = []
        offset = log.log_start_offset
        while offset < log.log_end_offset:
            data = log.read_bytes(offset, 1 << 20, whole_batches=True)
            assert data, f"nothing readable at {offset}"
            for position, header in iter_batches(data):
                for record in iter_records(data, position, header=header):
                    assert record.key is not None
                    seen[record.key] = record.value
                    offsets.append(record.offset)
                offset = header.next_offset
        assert offsets == sorted(set(offsets))
        assert seen == latest
        segments = [(s.base_offset, s.log_path, s.offset_index.path) for s in log.segments]
    finally:
        log.close()
    # Through the files: whole batches, rising offsets, index entries at batch starts.
    previous_end = -1
    for base, log_path, index_path in segments:
        data = log_path.read_bytes()
        batches = {}
        for position, header in iter_batches(data):  # verifies every CRC
            list(iter_records(data, position, header=header))
            assert header.base_offset >= max(previous_end, base)
            previous_end = header.next_offset
            batches[position] = header
        index = index_path.read_bytes()
        assert len(index) % _OFFSET_ENTRY.size == 0
        for relative, position in _OFFSET_ENTRY.iter_unpack(index):
            assert position in batches, f"index of {base} points inside a batch ({position})"
            header = batches[position]
            assert header.base_offset <= base + relative <= header.last_offset


def test_kill_at_every_step_of_a_clean_leaves_a_valid_log(tmp_path: Path) -> None:
    original = tmp_path / "original" / "topic-0"
    latest = _build(original)
    script = tmp_path / "clean_child.py"
    script.write_text(CHILD)

    dry = tmp_path / "dry" / "topic-0"
    shutil.copytree(original.parent, dry.parent)
    done = _run_child(script, dry, 0)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    steps: list[str] = summary["steps"]
    assert summary["removed"] > 0
    # Each group starts by clearing its .cleaned file names (leftovers of a crash).
    swaps = [n for n, step in enumerate(steps, 1) if step.endswith(".log.cleaned")]
    swaps = [n for n in swaps if steps[n - 1].startswith("unlink:")]
    assert len(swaps) >= 2, steps
    _check(dry, latest)
    # Every step of the first and of the last swap (and what follows: the cleaner
    # checkpoint), every third step in between: each kind of step at each position.
    first_group = range(1, swaps[1])
    tail = range(swaps[-1], len(steps) + 1)
    kills = sorted({*first_group, *tail, *range(swaps[1], swaps[-1], 3)})
    # The first swap replaces several segments (each old .log renamed .deleted).
    assert sum(step.endswith(".log") for step in steps[: swaps[1] - 1]) >= 2, steps
    print(f"{len(steps)} steps, {len(kills)} kills")

    def kill_and_check(kill_at: int) -> None:
        copy = tmp_path / f"kill-{kill_at}" / "topic-0"
        shutil.copytree(original.parent, copy.parent)
        killed = _run_child(script, copy, kill_at)
        assert killed.returncode == -signal.SIGKILL, (kill_at, killed.stderr)
        _check(copy, latest)
        # The recovered log cleans to the end and still holds the same latest values.
        log = _open(copy, clean=True)
        Cleaner(fsync=_no_fsync).clean_log(log, NOW, force=True)
        log.close()
        _check(copy, latest)
        shutil.rmtree(copy.parent)

    # Children run a few at a time; each works on its own copy.
    with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
        for future in [pool.submit(kill_and_check, n) for n in kills]:
            future.result()
