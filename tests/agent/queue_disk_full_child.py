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


def roll(root: Path) -> dict[str, Any]:
    segment = 65536
    directory = root / "q"
    queue = DiskQueue.open(directory, segment_bytes=segment, max_bytes=1 << 30)
    body = b"x" * 1000
    # Fill the first segment to 8 events short of its end: the append below rolls mid-way.
    while queue._active_bytes < segment - 8 * (ENTRY_SIZE + len(body)):
        queue.append([body])
    before = queue.durable_n
    filler = Filler(root)
    filler.fill()
    outcome: dict[str, Any] = {}

    def append() -> None:
        try:
            outcome["first"] = queue.append([b"%04d" % i + body for i in range(20)])
        except Exception as exc:  # reported to the test, which expects none
            outcome["error"] = repr(exc)

    sender = threading.Thread(target=append)
    sender.start()
    sender.join(1.0)
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


SCENARIOS = {
    "roll": roll,
    "new-queue": new_queue,
    "dropped-record": dropped_record,
    "offset-index": offset_index,
}

if __name__ == "__main__":
    print(json.dumps(SCENARIOS[sys.argv[2]](Path(sys.argv[1]))), flush=True)
