"""Throughput of the partition log against plain file writes on the same disk.

Figures (MiB/s, 1 MiB = 2**20 bytes), all measured in one run in one directory:

- ``append_mb_s``: ``Log.append`` of 1 MiB batches, no fsync; ``plain_write_mb_s``:
  the same bytes written sequentially to one file with ``os.write``, no fsync.
- ``durable_mb_s``: ``Log.append(..., durable=True)`` of 64 KiB batches from 8 threads
  (group commit); ``plain_synced_mb_s``: the same bytes written sequentially to one
  file, then one ``fdatasync``.
- ``read_mb_s``: the whole log of the first case read back through ``Log.read`` slices
  (4 MiB fetches, whole batches), from the page cache as consumers at the head do.
- ``recovery_s_per_gib``: that log closed, its pages dropped from the page cache
  (``posix_fadvise(DONTNEED)``, so reads come from the disk), then opened as after an
  unclean shutdown with recovery point 0, so every batch is read and its CRC checked;
  the time of the open scaled to one GiB.

The last line is one JSON object with those keys plus ``append_ratio`` and
``durable_ratio``. The directory defaults to a temporary one under the current
directory (``/tmp`` may be a tmpfs, which would measure memory, not a disk); the
file system used is printed. ``--quick`` uses a 256 MiB log instead of 1 GiB and five
rounds instead of seven. Each figure is the best of its rounds (a shared or virtual
disk is noisy; every round is printed). ``--profile`` prints cProfile summaries of the
append, durable (all writer threads) and recovery phases.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import random
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from tidelog.records import BatchBuilder, iter_batches
from tidelog.storage import Log, LogConfig

MIB = 1 << 20
BIG_BATCH = 1 * MIB
SMALL_BATCH = 64 * 1024
WRITERS = 8
CONFIG = LogConfig.from_mapping({"max.message.bytes": 2 * MIB})
TIMESTAMP = 1_700_000_000_000


def _clock() -> int:
    return time.time_ns() // 1_000_000


def make_batch(size: int, rng: random.Random) -> bytes:
    """An uncompressed batch of about ``size`` bytes: 1 KiB values, 16-byte keys."""
    builder = BatchBuilder()
    value_size = 1024
    count = max((size - 61) // (value_size + 30), 1)
    payload = rng.randbytes(value_size * 4)
    for index in range(count):
        start = index % (3 * value_size)
        builder.append(
            b"key-%012d" % index, payload[start : start + value_size], timestamp=TIMESTAMP + index
        )
    return builder.close()


def file_system(path: Path) -> str:
    """``type source mountpoint`` of the mount holding ``path`` (from mountinfo)."""
    target = str(path.resolve())
    best = ("?", "?", "/")
    with open("/proc/self/mountinfo", encoding="utf-8") as mounts:
        for line in mounts:
            fields = line.split()
            mount_point = fields[4]
            after = fields[fields.index("-") + 1 :]
            inside = target == mount_point or target.startswith(mount_point.rstrip("/") + "/")
            if inside and len(mount_point) >= len(best[2]):
                best = (after[0], after[1], mount_point)
    return f"{best[0]} ({best[1]}) mounted at {best[2]}"


def drop_cache(directory: Path) -> None:
    """Ask the kernel to forget the cached pages of every file (they are clean: fsynced)."""
    for path in directory.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


@contextmanager
def profiled(enabled: bool, title: str) -> Iterator[None]:
    if not enabled:
        yield
        return
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        yield
    finally:
        profiler.disable()
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(12)
        print(f"--- profile: {title} (sorted by own time) ---")
        print(out.getvalue())


def mib_per_s(size: int, seconds: float) -> float:
    return size / MIB / seconds


class TimedFsync:
    """An ``fsync`` for the log that counts calls and the time spent in them; its
    :meth:`datasync` does the same with ``fdatasync``, which the log uses for segment
    files when left to its defaults."""

    def __init__(self) -> None:
        self.calls = 0
        self.seconds = 0.0
        self._lock = threading.Lock()

    def __call__(self, fd: int) -> None:
        self._timed(os.fsync, fd)

    def datasync(self, fd: int) -> None:
        self._timed(os.fdatasync, fd)

    def _timed(self, sync: Callable[[int], None], fd: int) -> None:
        start = time.perf_counter()
        sync(fd)
        elapsed = time.perf_counter() - start
        with self._lock:
            self.calls += 1
            self.seconds += elapsed


def plain_write(path: Path, batch: bytes, count: int, sync: bool) -> float:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        start = time.perf_counter()
        for _ in range(count):
            view = memoryview(batch)
            while view:
                view = view[os.write(fd, view) :]
        if sync:
            os.fdatasync(fd)
        elapsed = time.perf_counter() - start
    finally:
        os.close(fd)
    return elapsed


def open_log(directory: Path, **kwargs: object) -> Log:
    return Log.open(
        directory,
        CONFIG,
        topic="bench",
        partition=0,
        clock=_clock,
        **kwargs,  # type: ignore[arg-type]
    )


def bench_append(directory: Path, batch: bytes, count: int, profile: bool) -> float:
    log = open_log(directory)
    buffer = bytearray(batch)  # the produce path writes offsets into it in place
    with profiled(profile, "append (no fsync)"):
        start = time.perf_counter()
        for _ in range(count):
            log.append(buffer)
        elapsed = time.perf_counter() - start
    log.close()
    return elapsed


def bench_durable(
    directory: Path, batch: bytes, per_writer: int, profile: bool, fsync: TimedFsync
) -> float:
    log = open_log(directory, fsync=fsync, datasync=fsync.datasync)
    errors: list[BaseException] = []
    profiles: list[cProfile.Profile] = []
    barrier = threading.Barrier(WRITERS + 1)

    def writer() -> None:
        profiler = cProfile.Profile() if profile else None
        try:
            buffer = bytearray(batch)
            barrier.wait()
            if profiler is not None:
                profiler.enable()
            for _ in range(per_writer):
                log.append(buffer, durable=True)
        except BaseException as exc:  # reported after the join
            errors.append(exc)
        finally:
            if profiler is not None:
                profiler.disable()
                profiles.append(profiler)

    threads = [threading.Thread(target=writer) for _ in range(WRITERS)]
    for thread in threads:
        thread.start()
    barrier.wait()
    start = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise errors[0]
    log.close()
    if profiles:
        out = io.StringIO()
        stats = pstats.Stats(profiles[0], stream=out)
        for other in profiles[1:]:
            stats.add(other)
        stats.sort_stats("tottime").print_stats(12)
        print("--- profile: durable appends, 8 writer threads summed (sorted by own time) ---")
        print(out.getvalue())
    return elapsed


def bench_read(directory: Path) -> tuple[float, int]:
    log = open_log(directory, clean_shutdown=True)
    total = 0
    offset = log.log_start_offset
    start = time.perf_counter()
    while offset < log.log_end_offset:
        piece = log.read(offset, 4 * MIB, whole_batches=True)
        assert piece is not None
        with piece:
            data = piece.read()
        total += len(data)
        for _, header in iter_batches(data, verify_crc=False):
            offset = header.next_offset
    elapsed = time.perf_counter() - start
    log.close()
    return elapsed, total


def bench_recovery(directory: Path, size: int, profile: bool) -> float:
    drop_cache(directory)
    with profiled(profile, "recovery (open with recovery point 0)"):
        start = time.perf_counter()
        log = open_log(directory, recovery_point=0, clean_shutdown=False)
        elapsed = time.perf_counter() - start
    report = log.recovery_report
    assert not report.problems, report.problems
    assert len(report.recovered_segments) == len(log.segments)
    assert log.size_in_bytes == size
    log.close()
    return elapsed


def plain_group_commit(path: Path, batch: bytes, count: int) -> float:
    """What ideal group commit of ``WRITERS`` writers reaches: ``WRITERS`` batches
    written, one fdatasync, repeated (no Python log in between)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        start = time.perf_counter()
        for index in range(count):
            os.write(fd, batch)
            if index % WRITERS == WRITERS - 1:
                os.fdatasync(fd)
        os.fdatasync(fd)
        elapsed = time.perf_counter() - start
    finally:
        os.close(fd)
    return elapsed


def warm_up(root: Path) -> None:
    """Write and drop 256 MiB once: a VM's first touch of page cache memory is slow."""
    path = root / "warm-up.bin"
    plain_write(path, os.urandom(MIB), 256, sync=True)
    path.unlink()


def run(root: Path, quick: bool, profile: bool) -> dict[str, float]:
    rng = random.Random(1)
    big = make_batch(BIG_BATCH, rng)
    small = make_batch(SMALL_BATCH, rng)
    rounds = 5 if quick else 7
    big_count = (256 if quick else 1024) * MIB // len(big)
    per_writer = (32 if quick else 128) * MIB // len(small) // WRITERS
    log_dir = root / "bench-0"
    durable_dir = root / "durable-0"
    # Each case overwrites (truncates) its own files from the previous round just before
    # writing: page cache memory freed long before is slow to touch again in a VM whose
    # host reclaims free guest pages, and both sides of a comparison must pay the same.
    plain = root / "plain.bin"
    plain_small = root / "plain-small.bin"
    big_bytes = len(big) * big_count
    durable_bytes = len(small) * per_writer * WRITERS
    print(f"batches: {len(big)} bytes x {big_count}; {len(small)} bytes x {per_writer} x {WRITERS}")
    print(f"{rounds} rounds, each figure is the best round (all rounds shown)")
    warm_up(root)
    runs: dict[str, list[float]] = {
        key: [] for key in ("plain_write_mb_s", "append_mb_s", "plain_synced_mb_s", "durable_mb_s")
    }
    group: list[float] = []
    fsync_notes: list[str] = []
    for round_number in range(rounds):
        last = round_number == rounds - 1
        plain_first = round_number % 2 == 0

        def plain_case() -> None:
            os.sync()  # no dirty pages of an earlier phase waiting to be written back
            elapsed = plain_write(plain, big, big_count, sync=False)
            runs["plain_write_mb_s"].append(mib_per_s(big_bytes, elapsed))

        def log_case(profile_it: bool = last and profile) -> None:
            shutil.rmtree(log_dir, ignore_errors=True)
            os.sync()
            elapsed = bench_append(log_dir, big, big_count, profile_it)
            runs["append_mb_s"].append(mib_per_s(big_bytes, elapsed))

        def synced_case() -> None:
            os.sync()
            elapsed = plain_write(plain_small, small, per_writer * WRITERS, sync=True)
            runs["plain_synced_mb_s"].append(mib_per_s(durable_bytes, elapsed))
            os.sync()
            elapsed = plain_group_commit(plain_small, small, per_writer * WRITERS)
            group.append(mib_per_s(durable_bytes, elapsed))

        def durable_case(profile_it: bool = last and profile) -> None:
            shutil.rmtree(durable_dir, ignore_errors=True)
            os.sync()
            fsync = TimedFsync()
            elapsed = bench_durable(durable_dir, small, per_writer, profile_it, fsync)
            runs["durable_mb_s"].append(mib_per_s(durable_bytes, elapsed))
            appends = per_writer * WRITERS
            fsync_notes.append(
                f"{fsync.calls} fsyncs for {appends} appends, "
                f"{fsync.seconds / max(fsync.calls, 1) * 1000:.2f} ms each, "
                f"{fsync.seconds / elapsed:.0%} of the wall time"
            )

        cases = [plain_case, log_case, synced_case, durable_case]
        if not plain_first:
            cases = [log_case, plain_case, durable_case, synced_case]
        for case in cases:
            case()

    timed = {key: max(values) for key, values in runs.items()}

    def show(label: str, key: str) -> None:
        rounds_text = ", ".join(f"{value:.0f}" for value in runs[key])
        print(f"{label:<28}{timed[key]:9.1f} MiB/s   rounds: {rounds_text}")

    show("plain write", "plain_write_mb_s")
    show("log append (1 MiB)", "append_mb_s")
    show("plain write + 1 fdatasync", "plain_synced_mb_s")
    show("durable append (8 x 64 KiB)", "durable_mb_s")
    print(
        f"{'  (8 writes + fdatasync)*n':<28}{max(group):9.1f} MiB/s   reference: ideal group commit"
    )
    for note in fsync_notes:
        print(f"  durable: {note}")

    elapsed, total = bench_read(log_dir)
    timed["read_mb_s"] = mib_per_s(total, elapsed)
    print(f"{'log read (4 MiB fetches)':<28}{timed['read_mb_s']:9.1f} MiB/s   page cache")

    elapsed = bench_recovery(log_dir, big_bytes, profile)
    timed["recovery_s_per_gib"] = elapsed * (1 << 30) / big_bytes
    print(
        f"{'recovery':<28}{timed['recovery_s_per_gib']:9.2f} s/GiB   "
        f"{elapsed:.2f} s for {big_bytes / MIB:.0f} MiB, cold cache"
    )
    timed["append_ratio"] = timed["append_mb_s"] / timed["plain_write_mb_s"]
    timed["durable_ratio"] = timed["durable_mb_s"] / timed["plain_synced_mb_s"]
    print(f"append_ratio {timed['append_ratio']:.2f} (target >= 0.8)")
    print(f"durable_ratio {timed['durable_ratio']:.2f} (target >= 0.7)")
    print(f"recovery_s_per_gib {timed['recovery_s_per_gib']:.2f} (target <= 5)")
    return timed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, help="parent directory (default: the current one)")
    parser.add_argument(
        "--quick", action="store_true", help="a 256 MiB log, five rounds: under a minute"
    )
    parser.add_argument("--profile", action="store_true", help="cProfile the slow phases")
    parser.add_argument("--keep", action="store_true", help="keep the files afterwards")
    args = parser.parse_args(argv)
    parent = (args.dir or Path.cwd()).resolve()
    parent.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix=".storage-bench-", dir=parent))
    fs = file_system(root)
    print(f"directory: {root}")
    print(f"file system: {fs}")
    if fs.startswith("tmpfs"):
        print("warning: tmpfs is memory, not a disk; pass --dir on a real disk")
    try:
        results = run(root, args.quick, args.profile)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    print(json.dumps({key: round(value, 3) for key, value in sorted(results.items())}))


if __name__ == "__main__":
    main()
