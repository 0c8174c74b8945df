"""The disk queue where a real full disk cuts writes short or refuses them in the middle of
its work: each case runs queue_disk_full_child.py on a 3 MiB tmpfs in a private mount
namespace (``unshare --map-root-user``: no privileges needed), which a filler file makes full
and then empties again.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MOUNT = 'mount -t tmpfs -o size=3m tmpfs "$1" && shift && exec "$@"'


def run_scenario(tmp_path: Path, scenario: str) -> dict[str, Any]:
    root = tmp_path / "tmpfs"
    root.mkdir()
    command = ["unshare", "--mount", "--map-root-user", "sh", "-c", MOUNT, "sh", str(root)]
    command += [sys.executable, str(HERE / "queue_disk_full_child.py"), str(root), scenario]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


def test_a_full_disk_after_a_segment_roll_is_waited_out(tmp_path: Path) -> None:
    """An append whose events span a segment roll, on a disk with no room for the new
    segment: it waits, and once there is room it completes. The events before the roll
    (made durable by it) are not written again into the new segment, every event keeps its
    number, and the queue goes on accepting events."""
    seen = run_scenario(tmp_path, "roll")
    before = seen["before"]
    assert seen["waited_while_full"]
    assert seen["outcome"] == {"first": before}
    assert seen["later"] == before + 20
    assert seen["numbers"] == list(range(before + 21))
    assert seen["rolled_bodies"] == [f"{i:04d}" for i in range(20)]
    assert seen["segments"] == 2


def test_queues_open_on_a_full_disk(tmp_path: Path) -> None:
    """A new queue opens on a full disk (its cursor takes its blocks at the first delivery
    instead), without leaking a file descriptor, and works once there is room."""
    seen = run_scenario(tmp_path, "new-queue")
    assert seen["errors"] == []
    assert seen["leaked_fds"] == 0
    assert seen["read_n"] == 1
    assert seen["left"] == [[1, "b"]]
    assert seen["offset_of_0"] == 100


def test_a_drop_recorded_on_a_full_disk_survives_a_restart(tmp_path: Path) -> None:
    """The record of a drop cut short by the full disk is written whole (from the reserve)
    or not at all: after a restart every drop is still known, so the dropped events answer
    "dropped", and the file holds whole records only."""
    seen = run_scenario(tmp_path, "dropped-record")
    ranges = [tuple(r) for r in seen["ranges_after_restart"]]
    assert tuple(seen["full_drop"]) in ranges
    assert ranges[-1] == tuple(seen["last_drop"])
    assert ranges[-1][1] == seen["skip_n"]
    assert sum(end - first for first, end in ranges) == seen["counted"]
    assert seen["file_bytes"] == len(ranges) * seen["record_bytes"]


def test_an_index_record_cut_short_loses_only_its_own_offsets(tmp_path: Path) -> None:
    """The offset index is best effort on a full disk: the record that did not fit is left
    out whole, and every offset recorded before and after it is still known after a
    restart."""
    seen = run_scenario(tmp_path, "offset-index")
    crossing = seen["crossing"]
    offsets = {int(n): o for n, o in seen["offsets"].items()}
    lost = [n for n, o in offsets.items() if o is None]
    assert lost in ([], [crossing])
    assert all(offsets[n] == 1000 + n for n in offsets if n not in lost)


def test_a_queue_opened_on_a_full_disk_takes_its_room_later(tmp_path: Path) -> None:
    """Opened on a full disk, a queue goes without its cursor blocks and reserve; it takes
    them at its first write with room, so that once it fills the disk itself, drop-oldest
    can still record a drop and move the cursor: it drops, and never stops."""
    seen = run_scenario(tmp_path, "opened-full")
    assert seen["opened"] == {"cursor_bytes": 0, "reserve": False}
    assert seen["outcome"] == {"appended": 6000}
    assert seen["dropped"] > 0
    assert seen["cursor_bytes"] == 128
    first, last, count = seen["kept"]
    assert last == 5999 and count == 6000 - first
    assert first >= seen["dropped"]


def test_events_made_durable_by_a_roll_are_acknowledged_when_the_queue_then_closes(
    tmp_path: Path,
) -> None:
    seen = run_scenario(tmp_path, "roll-then-close")
    assert seen["waited"]
    assert seen["outcome"] == {"before_roll": seen["before"], "after_roll": "AgentClosedError"}
    # What the answered caller stored is there after a restart; nothing of the other is.
    assert seen["found"] == [f"A{i:03d}" for i in range(7)]
