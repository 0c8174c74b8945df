"""Child of test_queue_disk_full.py: one disk queue on a small tmpfs (argv[1]) that a filler
file makes full at a chosen moment; prints one JSON line of what it saw.

Scenarios (argv[2]):

* ``roll``: one append of 20 events whose second half starts a new segment, while the disk
  has no room for the new segment's first write; room is made after a second.
* ``new-queue``: queues opened (and closed) on a full disk, then used once there is room.
* ``dropped-record``: drop-oldest drops a segment on a full disk when the 20-byte record of
  the drop crosses a page of the file system (a write the kernel cuts short).
* ``offset-index``: a delivery recorded on a full disk when its 24-byte index record crosses
  a page; later deliveries recorded with room again.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tidelog.agent.queue import ENTRY_SIZE, DiskQueue

PAGE = 4096


class Filler:
    """Takes every free byte of the file system, and gives it back."""

    def __init__(self, root: Path) -> None:
        self.path = root / "filler"

    def fill(self) -> None:
        fd = os.open(self.path, os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o644)
        try:
            while True:
                os.write(fd, b"\1" * PAGE)
        except OSError:
            pass
        finally:
            os.close(fd)
        # The last pages a page-sized write could not take.
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            while True:
                os.write(fd, b"\1")
        except OSError:
            pass
        finally:
            os.close(fd)

    def free(self) -> None:
        self.path.unlink()


def read_all(queue: DiskQueue) -> list[tuple[int, bytes]]:
    pos, n = queue.start_of_next_read()
    out: list[tuple[int, bytes]] = []
    while entries := queue.read(pos, n, 1 << 20):
        out.extend((e.number, bytes(e.body)) for e in entries)
        last = entries[-1]
        pos, n = last.position + ENTRY_SIZE + len(last.body), last.number + 1
    return out


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


ROLL_SEGMENT = 65536
ROLL_BODY = b"x" * 1000


def near_a_roll_on_a_full_disk(root: Path) -> tuple[DiskQueue, int, Filler]:
    """A queue whose first segment is 8 events of ROLL_BODY short of its end (the next
    appends roll mid-way), on a disk just made full; and its next entry number."""
    queue = DiskQueue.open(root / "q", segment_bytes=ROLL_SEGMENT, max_bytes=1 << 30)
    while queue._active_bytes < ROLL_SEGMENT - 8 * (ENTRY_SIZE + len(ROLL_BODY)):
        queue.append([ROLL_BODY])
    filler = Filler(root)
    filler.fill()
    return queue, queue.durable_n, filler


def roll(root: Path) -> dict[str, Any]:
    directory = root / "q"
    segment, body = ROLL_SEGMENT, ROLL_BODY
    queue, before, filler = near_a_roll_on_a_full_disk(root)
    outcome: dict[str, Any] = {}

    def append() -> None:
        try:
            outcome["first"] = queue.append([b"%04d" % i + body for i in range(20)])
        except Exception as exc:  # reported to the test, which expects none
            outcome["error"] = repr(exc)

    sender = threading.Thread(target=append)
    sender.start()
    # Until the append meets the full disk (a loaded machine may take more than a moment).
    deadline = time.monotonic() + 10
    while sender.is_alive() and not queue.disk_full and time.monotonic() < deadline:
        time.sleep(0.01)
    waited_while_full = sender.is_alive() and queue.disk_full
    filler.free()
    sender.join(30)
    later = queue.append([b"later"])
    queue.close()
    reopened = DiskQueue.open(directory, segment_bytes=segment, max_bytes=1 << 30)
    entries = read_all(reopened)
    reopened.close()
    return {
        "before": before,
        "waited_while_full": waited_while_full,
        "outcome": outcome,
        "later": later,
        "numbers": [n for n, _ in entries],
        "rolled_bodies": [b[:4].decode() for n, b in entries if before <= n < before + 20],
        "segments": len(list(directory.glob("*.q"))),
    }


def new_queue(root: Path) -> dict[str, Any]:
    filler = Filler(root)
    filler.fill()
    fds = open_fds()
    errors = []
    for i in range(20):
        try:
            DiskQueue.open(root / f"q{i}").close()
        except OSError as exc:
            errors.append(repr(exc))
    leaked = open_fds() - fds
    filler.free()
    queue = DiskQueue.open(root / "q0")
    queue.append([b"a", b"b"])
    pos = queue.start_of_next_read()[0]
    queue.commit(pos + ENTRY_SIZE + 1, 1, 1, 7, 0, delivered=(0, 1, 100))
    queue.close()
    reopened = DiskQueue.open(root / "q0")
    result = {
        "errors": errors,
        "leaked_fds": leaked,
        "read_n": reopened.cursor.read_n,
        "left": [(n, b.decode()) for n, b in read_all(reopened)],
        "offset_of_0": reopened.delivered_offset(0),
    }
    reopened.close()
    return result


def dropped_record(root: Path) -> dict[str, Any]:
    options: dict[str, Any] = {"segment_bytes": 4096, "max_bytes": 16384, "policy": "drop-oldest"}
    directory = root / "q"
    queue = DiskQueue.open(directory, **options)
    body = b"d" * 1000
    record = 20
    # Drops until the next record of one crosses a page of the `dropped` file.
    while (queue._dropped_records + 1) * record <= PAGE:
        queue.append([body])
    filler = Filler(root)
    filler.fill()
    records = queue._dropped_records
    while queue._dropped_records == records:
        queue.append([body])
    full_drop = queue.dropped_ranges[-1]
    filler.free()
    for _ in range(6):
        queue.append([body])
    last_drop = queue.dropped_ranges[-1]
    counted = queue.dropped
    queue.close()
    reopened = DiskQueue.open(directory, **options)
    ranges = list(reopened.dropped_ranges)
    result = {
        "full_drop": full_drop,
        "last_drop": last_drop,
        "counted": counted,
        "ranges_after_restart": ranges,
        "file_bytes": (directory / "dropped").stat().st_size,
        "record_bytes": record,
        "skip_n": reopened.cursor.skip_n,
    }
    reopened.close()
    return result


def offset_index(root: Path) -> dict[str, Any]:
    directory = root / "q"
    queue = DiskQueue.open(directory, segment_bytes=1 << 20)
    body = b"o" * 100
    for _ in range(400):
        queue.append([body])
    record = 24

    def deliver(n: int) -> None:
        # What the sender does once the broker acknowledged entry n (at offset 1000 + n).
        pos = queue.start_of_next_read()[0]
        queue.commit(pos + ENTRY_SIZE + len(body), n + 1, n + 1, 7, 0, delivered=(n, 1, 1000 + n))

    crossing = PAGE // record  # the first record that crosses a page
    for n in range(crossing):
        deliver(n)
    filler = Filler(root)
    filler.fill()
    deliver(crossing)
    filler.free()
    for n in range(crossing + 1, 300):
        deliver(n)
    queue.close()
    reopened = DiskQueue.open(directory, segment_bytes=1 << 20)
    offsets = {n: reopened.delivered_offset(n) for n in range(300)}
    reopened.close()
    return {"crossing": crossing, "offsets": offsets}


def opened_full(root: Path) -> dict[str, Any]:
    """A drop-oldest queue opened on a full disk, which then has room until the queue itself
    fills it: the queue takes its cursor blocks and reserve once it can, so it drops."""
    filler = Filler(root)
    filler.fill()
    directory = root / "q"
    options: dict[str, Any] = {
        "segment_bytes": 65536,
        "max_bytes": 1 << 30,
        "policy": "drop-oldest",
    }
    queue = DiskQueue.open(directory, **options)
    opened = {
        "cursor_bytes": (directory / "cursor").stat().st_size,
        "reserve": (directory / "reserve").exists(),
    }
    filler.free()
    events = 6000  # 6 MB of events into a 3 MiB disk
    outcome: dict[str, Any] = {}

    def append() -> None:
        try:
            for i in range(events):
                queue.append([b"%05d" % i + b"x" * 1000])
            outcome["appended"] = events
        except Exception as exc:  # reported to the test, which expects none
            outcome["error"] = repr(exc)

    sender = threading.Thread(target=append, daemon=True)
    sender.start()
    sender.join(60)
    result = {
        "opened": opened,
        "outcome": outcome,
        "dropped": queue.dropped,
        "cursor_bytes": (directory / "cursor").stat().st_size,
    }
    queue.close()
    reopened = DiskQueue.open(directory, **options)
    numbers = [n for n, _ in read_all(reopened)]
    reopened.close()
    result["kept"] = [numbers[0], numbers[-1], len(numbers)]
    return result


def roll_then_close(root: Path) -> dict[str, Any]:
    """Two callers in one sync that spans a segment roll; the disk has no room for the new
    segment and the queue is closed while it waits: the caller whose events were all before
    the roll (made durable by it) is answered, the other is told the write failed."""
    directory = root / "q"
    segment, body = ROLL_SEGMENT, ROLL_BODY
    queue, before, filler = near_a_roll_on_a_full_disk(root)
    outcome: dict[str, Any] = {}

    def append(name: str, bodies: list[bytes]) -> None:
        try:
            outcome[name] = queue.append(bodies)
        except Exception as exc:
            outcome[name] = type(exc).__name__

    with queue._lock:
        queue._syncing = True  # as if a sync were running: both callers buffer behind it
    callers = [
        threading.Thread(
            target=append, args=("before_roll", [b"A%03d" % i + body for i in range(7)])
        ),
        threading.Thread(
            target=append, args=("after_roll", [b"B%03d" % i + body for i in range(13)])
        ),
    ]
    for caller in callers:
        buffered = queue.write_n
        caller.start()
        # Each caller's entries are buffered before the next caller starts: their order.
        deadline = time.monotonic() + 10
        while queue.write_n == buffered and time.monotonic() < deadline:
            time.sleep(0.005)
    with queue._lock:
        queue._syncing = False
        queue._batch.notify_all()
    deadline = time.monotonic() + 10
    while not queue.disk_full and time.monotonic() < deadline:
        time.sleep(0.01)
    waited = queue.disk_full
    queue.close()
    for caller in callers:
        caller.join(10)
    filler.free()
    reopened = DiskQueue.open(directory, segment_bytes=segment, max_bytes=1 << 30)
    found = [bytes(b[:4]).decode() for n, b in read_all(reopened) if n >= before]
    reopened.close()
    return {"before": before, "waited": waited, "outcome": outcome, "found": found}


SCENARIOS = {
    "opened-full": opened_full,
    "roll-then-close": roll_then_close,
    "roll": roll,
    "new-queue": new_queue,
    "dropped-record": dropped_record,
    "offset-index": offset_index,
}

if __name__ == "__main__":
    print(json.dumps(SCENARIOS[sys.argv[2]](Path(sys.argv[1]))), flush=True)
