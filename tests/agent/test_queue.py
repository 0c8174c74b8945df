"""The disk queue on its own: format, recovery, cursor, group commit, full-queue policies."""

from __future__ import annotations

import os
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.agent import queue as queue_module
from tidelog.agent.errors import (
    AgentClosedError,
    EventFormatError,
    EventTooLargeError,
    QueueFullError,
)
from tidelog.agent.event import check_body, decode_body, encode_body
from tidelog.agent.queue import CURSOR_SLOT, ENTRY_SIZE, DiskQueue


def body(i: int, size: int = 20) -> bytes:
    return encode_body(b"k%d" % i, (b"v%d-" % i).ljust(size, b"."), None, 1000 + i)


def read_all(queue: DiskQueue, *, commit: bool = False) -> list[tuple[int, bytes]]:
    """Every entry readable from the start of the next read; with ``commit``, each read is
    committed as the sender does after the broker's acknowledgement."""
    pos, n = queue.start_of_next_read()
    out = []
    while True:
        entries = queue.read(pos, n, 1 << 16)
        if not entries:
            # Damaged data moves the queue's skip position, as the sender would see it.
            skip = queue.start_of_next_read()
            if skip[0] > pos:
                pos, n = skip
                continue
            return out
        for e in entries:
            out.append((e.number, bytes(e.body)))
        last = entries[-1]
        pos, n = last.position + ENTRY_SIZE + len(last.body), last.number + 1
        if commit:
            queue.commit(pos, n, n, -1, -1)


def segments(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.q"))


def test_append_read_across_segments(tmp_path: Path) -> None:
    q = DiskQueue.open(tmp_path / "q", segment_bytes=4096)
    bodies = [body(i, 100) for i in range(200)]
    for i in range(0, 200, 10):
        assert q.append(bodies[i : i + 10]) == i
    assert len(segments(tmp_path / "q")) > 3
    assert read_all(q) == list(enumerate(bodies))
    q.close()
    q = DiskQueue.open(tmp_path / "q", segment_bytes=4096)
    assert q.write_n == 200
    assert read_all(q) == list(enumerate(bodies))
    assert q.append([body(200)]) == 200
    q.close()


def test_torn_tail_is_cut(tmp_path: Path) -> None:
    q = DiskQueue.open(tmp_path / "q")
    q.append([body(i) for i in range(5)])
    q.close()
    seg = segments(tmp_path / "q")[-1]
    size = seg.stat().st_size
    full = encode_body(None, b"never acknowledged", None, 0)
    with seg.open("ab") as f:
        # A header and part of a body: what a crash in the middle of a write leaves.
        f.write((len(full)).to_bytes(4, "big") + b"\0\0\0\0" + (5).to_bytes(8, "big") + full[-7:])
    q = DiskQueue.open(tmp_path / "q")
    assert q.truncated_bytes == ENTRY_SIZE + 7
    assert seg.stat().st_size == size
    assert [n for n, _ in read_all(q)] == [0, 1, 2, 3, 4]
    assert q.append([body(5)]) == 5
    assert read_all(q)[-1] == (5, body(5))
    q.close()


def test_zeros_written_ahead_are_not_a_torn_tail(tmp_path: Path) -> None:
    q = DiskQueue.open(tmp_path / "q")
    bodies = [body(i) for i in range(50)]
    q.append(bodies[:30])
    q.append(bodies[30:])
    seg = segments(tmp_path / "q")[-1]
    data_end = q.durable_pos
    # While the queue is open its file runs ahead of the entries, with zeros.
    assert seg.stat().st_size > data_end
    assert seg.read_bytes()[data_end:].strip(b"\0") == b""
    # What a killed process leaves: the files as they are now, with no close.
    crashed = tmp_path / "crashed"
    crashed.mkdir()
    for path in (tmp_path / "q").iterdir():
        (crashed / path.name).write_bytes(path.read_bytes())
    torn = tmp_path / "torn"
    torn.mkdir()
    for path in (tmp_path / "q").iterdir():
        (torn / path.name).write_bytes(path.read_bytes())
    q.close()
    assert seg.stat().st_size == data_end

    r = DiskQueue.open(crashed)
    assert r.truncated_bytes == 0
    assert r.write_n == 50
    assert read_all(r) == list(enumerate(bodies))
    assert r.append([body(50)]) == 50
    r.close()
    r = DiskQueue.open(crashed)
    assert read_all(r) == [*enumerate(bodies), (50, body(50))]
    r.close()

    # A torn entry inside the zeros: cut, and only its bytes count as torn.
    with (torn / seg.name).open("r+b") as f:
        f.seek(data_end)
        f.write((40).to_bytes(4, "big") + b"\x01\x02\x03\x04" + (50).to_bytes(8, "big") + b"part")
    r = DiskQueue.open(torn)
    assert r.truncated_bytes == ENTRY_SIZE + 4
    assert read_all(r) == list(enumerate(bodies))
    assert (torn / seg.name).stat().st_size == data_end
    r.close()


def written_segment(directory: Path, count: int) -> Path:
    """A closed queue of ``count`` small entries in one segment; that segment."""
    q = DiskQueue.open(directory)
    q.append([body(i) for i in range(count)])
    q.close()
    return segments(directory)[-1]


def flip(path: Path, at: int, mask: int = 0x40) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= mask
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("where", ["body", "length"])
def test_damage_in_the_newest_segment_skips_only_the_damaged_entry(
    tmp_path: Path, where: str
) -> None:
    """Acknowledged entries after damaged bytes are not a torn tail: they stay, and only
    the damaged entry is skipped (recorded as dropped). A damaged length is found past by
    the next entry's number."""
    seg = written_segment(tmp_path / "q", 10)
    entry = seg.stat().st_size // 10
    flip(seg, 6 * entry + (ENTRY_SIZE + 3 if where == "body" else 1))
    q = DiskQueue.open(tmp_path / "q")
    assert q.write_n == 10 and q.truncated_bytes == 0
    # Delivered as a sender would: what precedes the damage, then the skip past it.
    assert [n for n, _ in read_all(q, commit=True)] == [0, 1, 2, 3, 4, 5, 7, 8, 9]
    assert q.corrupt == 1
    assert list(q.dropped_ranges) == [(6, 7)]
    q.close()
    q = DiskQueue.open(tmp_path / "q")  # the damage is below the cursor now
    assert q.write_n == 10 and read_all(q) == []
    assert list(q.dropped_ranges) == [(6, 7)]
    assert q.append([body(10)]) == 10
    q.close()


def test_a_crash_before_the_entries_ahead_of_damage_are_delivered_keeps_them(
    tmp_path: Path,
) -> None:
    seg = written_segment(tmp_path / "q", 10)
    flip(seg, 6 * (seg.stat().st_size // 10) + ENTRY_SIZE + 3)
    q = DiskQueue.open(tmp_path / "q")
    assert [e.number for e in q.read(0, 0, 1 << 16)] == [0, 1, 2, 3, 4, 5]
    q.close()  # "crash": nothing delivered
    q = DiskQueue.open(tmp_path / "q")
    assert [n for n, _ in read_all(q, commit=True)] == [0, 1, 2, 3, 4, 5, 7, 8, 9]
    q.close()


def test_damage_below_the_cursor_neither_stops_the_queue_nor_cuts(tmp_path: Path) -> None:
    """An entry already delivered is damaged: the queue opens (the cursor is a known entry
    boundary), and the undelivered entries after it are all there."""
    q = DiskQueue.open(tmp_path / "q")
    q.append([body(i) for i in range(10)])
    pos, n = q.locate(0, 0, 8)
    q.commit(pos, n, 8, -1, -1)
    q.close()
    seg = segments(tmp_path / "q")[-1]
    entry = seg.stat().st_size // 10
    flip(seg, 6 * entry + 1)  # entry 6's length: nothing tells where entry 7 starts
    flip(seg, 7 * entry + 1)  # nor entry 8
    q = DiskQueue.open(tmp_path / "q")
    assert q.write_n == 10
    assert [n for n, _ in read_all(q)] == [8, 9]
    q.close()


def test_damage_in_an_older_segment_skips_only_the_damaged_entry(tmp_path: Path) -> None:
    q = DiskQueue.open(tmp_path / "q", segment_bytes=4096)
    q.append([body(i, 100) for i in range(100)])
    q.close()
    first = segments(tmp_path / "q")[0]
    flip(first, ENTRY_SIZE + 2, 0x01)  # entry 0's body
    q = DiskQueue.open(tmp_path / "q", segment_bytes=4096)
    numbers = [n for n, _ in read_all(q)]
    assert q.corrupt == 1
    assert numbers == list(range(1, 100))
    assert list(q.dropped_ranges) == [(0, 1)]
    q.close()


def test_a_missing_segment_is_said_counted_and_answers_dropped(tmp_path: Path) -> None:
    q = DiskQueue.open(tmp_path / "q", segment_bytes=4096)
    q.append([body(i, 100) for i in range(100)])
    pos, n = q.locate(0, 0, 10)
    q.commit(pos, n, n, -1, -1)
    q.close()
    first, second = segments(tmp_path / "q")[:2]
    first.unlink()  # the segment holding entry 10, the next to deliver
    lost_end = int(second.stem.split("-")[1])
    q = DiskQueue.open(tmp_path / "q", segment_bytes=4096)
    assert q.corrupt == 1
    assert list(q.dropped_ranges) == [(10, lost_end)]
    assert [n for n, _ in read_all(q)] == list(range(lost_end, 100))
    q.close()
    q = DiskQueue.open(tmp_path / "q", segment_bytes=4096)  # said once, not at every start
    assert q.corrupt == 0 and list(q.dropped_ranges) == [(10, lost_end)]
    q.close()


def test_a_lost_page_of_many_small_entries_is_skipped_not_cut(tmp_path: Path) -> None:
    """A 4 KiB page of zeros in the middle (a lost page write): some 70 small entries
    damaged in a row, and still nothing after them is cut."""
    seg = written_segment(tmp_path / "q", 200)
    data = bytearray(seg.read_bytes())
    data[4096:8192] = bytes(4096)
    seg.write_bytes(bytes(data))
    q = DiskQueue.open(tmp_path / "q")
    assert q.write_n == 200 and q.truncated_bytes == 0
    numbers = [n for n, _ in read_all(q, commit=True)]
    (lost,) = q.dropped_ranges
    assert lost[1] - lost[0] > 64
    assert numbers == [n for n in range(200) if not lost[0] <= n < lost[1]]
    q.close()


def test_reading_ahead_to_locate_an_entry_never_skips(tmp_path: Path) -> None:
    """locate() reads ahead of the delivered entries (to find where entries the broker holds
    end): damage on the way is passed over, not skipped, so that the entries before it are
    still delivered after a restart."""
    seg = written_segment(tmp_path / "q", 10)
    flip(seg, 6 * (seg.stat().st_size // 10) + ENTRY_SIZE + 3)
    q = DiskQueue.open(tmp_path / "q")
    pos, n = q.locate(0, 0, 8)
    assert n == 8 and pos == 8 * (seg.stat().st_size // 10)
    assert q.cursor.skip_n == 0 and list(q.dropped_ranges) == []
    q.close()
    q = DiskQueue.open(tmp_path / "q")
    assert [n for n, _ in read_all(q, commit=True)] == [0, 1, 2, 3, 4, 5, 7, 8, 9]
    q.close()


def test_damage_with_nothing_valid_after_it_is_a_torn_tail(tmp_path: Path) -> None:
    seg = written_segment(tmp_path / "q", 10)
    entry = seg.stat().st_size // 10
    flip(seg, 9 * entry + ENTRY_SIZE + 3)  # the last entry: a torn append looks the same
    q = DiskQueue.open(tmp_path / "q")
    assert [n for n, _ in read_all(q)] == list(range(9))
    assert q.write_n == 9 and q.corrupt == 0 and q.truncated_bytes == entry
    q.close()


def test_cursor_persists_and_survives_a_torn_slot(tmp_path: Path) -> None:
    q = DiskQueue.open(tmp_path / "q")
    q.append([body(i) for i in range(10)])
    entries = q.read(0, 0, 1 << 16)
    third = entries[3]
    q.commit(third.position, 3, 17, 42, 0)
    seventh = entries[7]
    q.commit(seventh.position, 7, 21, 42, 0)
    generation = q.cursor.generation
    q.close()
    q = DiskQueue.open(tmp_path / "q")
    c = q.cursor
    assert (c.read_pos, c.read_n, c.next_seq, c.producer_id, c.producer_epoch) == (
        seventh.position,
        7,
        21,
        42,
        0,
    )
    assert [n for n, _ in read_all(q)] == [7, 8, 9]
    q.close()
    # Damage the newest slot: the previous commit is what remains.
    path = tmp_path / "q" / "cursor"
    raw = bytearray(path.read_bytes())
    raw[(generation % 2) * CURSOR_SLOT + 10] ^= 0xFF
    path.write_bytes(bytes(raw))
    q = DiskQueue.open(tmp_path / "q")
    assert (q.cursor.read_n, q.cursor.next_seq) == (3, 17)
    q.close()


def test_delivered_segments_are_deleted(tmp_path: Path) -> None:
    q = DiskQueue.open(tmp_path / "q", segment_bytes=4096)
    q.append([body(i, 100) for i in range(100)])
    before = len(segments(tmp_path / "q"))
    q.commit(q.durable_pos, q.durable_n, 100, 1, 0)
    assert len(segments(tmp_path / "q")) == 1 < before
    assert q.depth() == 0
    q.close()


class HeldFsync:
    """``fdatasync`` that holds its ``hold``-th call until released, and fails (EIO) from call
    ``fail_from`` on. Calls are counted once ``armed`` (after the queue is open: creating a
    queue syncs its cursor file)."""

    def __init__(self, hold: int, fail_from: int | None = None) -> None:
        self.armed = False
        self.calls = 0
        self.hold = hold
        self.fail_from = fail_from
        self.held = threading.Event()
        self.release = threading.Event()

    def __call__(self, fd: int) -> None:
        if not self.armed:
            os.fdatasync(fd)
            return
        self.calls += 1
        if self.calls == self.hold:
            self.held.set()
            self.release.wait(10)
        if self.fail_from is not None and self.calls >= self.fail_from:
            raise OSError(5, "Input/output error")
        os.fdatasync(fd)


def append_behind_a_held_sync(
    q: DiskQueue, fsync: HeldFsync, append: Callable[[int], None], numbers: range
) -> None:
    """``append(numbers[0])`` leads a sync that ``fsync`` holds; every other number is appended
    by its own thread meanwhile; then the sync is released and all threads finish."""
    leader = threading.Thread(target=append, args=(numbers[0],))
    leader.start()
    assert fsync.held.wait(10)
    followers = [threading.Thread(target=append, args=(i,)) for i in numbers[1:]]
    for w in followers:
        w.start()
    while q.write_n < numbers[-1] + 1:
        threading.Event().wait(0.001)
    fsync.release.set()
    for w in [leader, *followers]:
        w.join(10)


def test_group_commit_shares_one_fsync(tmp_path: Path) -> None:
    fsync = HeldFsync(hold=1)
    q = DiskQueue.open(tmp_path / "q", fsync=fsync)
    fsync.armed = True
    done: list[int] = []
    # While the first sync runs, 20 writers arrive; they must all share the next one.
    append_behind_a_held_sync(q, fsync, lambda i: done.append(q.append([body(i)])), range(21))
    assert sorted(done) == list(range(21))
    assert fsync.calls == 2
    assert q.fsyncs == 2
    q.close()


def test_a_lone_caller_syncs_on_its_own_thread(tmp_path: Path) -> None:
    syncing_threads: list[threading.Thread] = []

    def fsync(fd: int) -> None:
        syncing_threads.append(threading.current_thread())
        os.fdatasync(fd)

    q = DiskQueue.open(tmp_path / "q", fsync=fsync)
    syncing_threads.clear()  # creating the queue synced its cursor file
    for i in range(3):
        assert q.append([body(i)]) == i
    assert syncing_threads == [threading.current_thread()] * 3
    assert q.durable_n == 3
    q.close()


def test_with_the_real_fdatasync_each_sync_is_one_dsync_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default queue writes a sync's entries with RWF_DSYNC (durable when the write
    returns) and calls no fdatasync for them; what it wrote reads back after a reopen."""
    if not hasattr(os, "RWF_DSYNC"):
        pytest.skip("this system has no RWF_DSYNC")
    q = DiskQueue.open(tmp_path / "q")
    dsync_writes: list[int] = []
    fdatasyncs: list[int] = []
    real_pwritev, real_fdatasync = os.pwritev, os.fdatasync

    def pwritev(fd: int, buffers: list[memoryview], at: int, flags: int = 0) -> int:
        if flags & os.RWF_DSYNC:
            dsync_writes.append(fd)
        return real_pwritev(fd, buffers, at, flags)

    def fdatasync(fd: int) -> None:
        fdatasyncs.append(fd)
        real_fdatasync(fd)

    monkeypatch.setattr(queue_module.os, "pwritev", pwritev)
    monkeypatch.setattr(queue_module.os, "fdatasync", fdatasync)
    for i in range(5):
        assert q.append([body(i)]) == i
    assert len(dsync_writes) == 5 and not fdatasyncs
    assert q.fsyncs == 5 and q.durable_n == 5
    q.close()
    reopened = DiskQueue.open(tmp_path / "q")
    assert read_all(reopened) == [(i, body(i)) for i in range(5)]
    reopened.close()


def test_a_file_system_without_dsync_writes_falls_back_to_fdatasync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not hasattr(os, "RWF_DSYNC"):
        pytest.skip("this system has no RWF_DSYNC")
    import errno

    q = DiskQueue.open(tmp_path / "q")
    fdatasyncs: list[int] = []
    real_fdatasync = os.fdatasync

    def refuse(fd: int, buffers: list[memoryview], at: int, flags: int = 0) -> int:
        raise OSError(errno.EOPNOTSUPP, "not supported")

    def fdatasync(fd: int) -> None:
        fdatasyncs.append(fd)
        real_fdatasync(fd)

    monkeypatch.setattr(queue_module.os, "pwritev", refuse)
    monkeypatch.setattr(queue_module.os, "fdatasync", fdatasync)
    q._fsync = fdatasync  # the queue calls the sync function it was given
    for i in range(3):
        assert q.append([body(i)]) == i
    assert len(fdatasyncs) == 3
    q.close()
    reopened = DiskQueue.open(tmp_path / "q")
    assert read_all(reopened) == [(i, body(i)) for i in range(3)]
    reopened.close()


def test_a_failed_sync_fails_every_waiter_and_the_queue(tmp_path: Path) -> None:
    fsync = HeldFsync(hold=2, fail_from=2)
    q = DiskQueue.open(tmp_path / "q", fsync=fsync)
    fsync.armed = True
    assert q.append([body(0)]) == 0
    errors: list[BaseException] = []

    def append(i: int) -> None:
        try:
            q.append([body(i)])
        except AgentClosedError as exc:
            errors.append(exc)

    append_behind_a_held_sync(q, fsync, append, range(1, 6))
    # The leader's sync failed: it and every follower waiting behind it get the error.
    assert len(errors) == 5
    assert all("Input/output error" in str(e) for e in errors)
    with pytest.raises(AgentClosedError, match="failed"):
        q.append([body(6)])
    q.close()
    q = DiskQueue.open(tmp_path / "q")
    assert read_all(q)[0] == (0, body(0))
    q.close()


def test_appends_do_not_wait_for_a_cursor_sync(tmp_path: Path) -> None:
    cursor_sync_started = threading.Event()
    release = threading.Event()
    q: DiskQueue | None = None

    def fsync(fd: int) -> None:
        if q is not None and fd == q._cursor_fd:
            cursor_sync_started.set()
            release.wait(10)
        os.fdatasync(fd)

    q = queue = DiskQueue.open(tmp_path / "q", fsync=fsync)
    q.append([body(i) for i in range(10)])
    committing = threading.Thread(target=q.commit, args=(q.durable_pos, 10, 10, 1, 0))
    committing.start()
    assert cursor_sync_started.wait(10)
    # While the delivered position is being synced, events are still acknowledged.
    numbers: list[int] = []
    appender = threading.Thread(
        target=lambda: numbers.extend(queue.append([body(i)]) for i in (10, 11))
    )
    appender.start()
    appender.join(5)
    appended_during_sync = not appender.is_alive()
    release.set()
    appender.join(10)
    assert appended_during_sync
    assert numbers == [10, 11]
    committing.join(10)
    q.close()
    q = DiskQueue.open(tmp_path / "q")
    assert (q.cursor.read_n, q.cursor.next_seq) == (10, 10)
    assert read_all(q) == [(10, body(10)), (11, body(11))]
    q.close()


def test_reject_policy_raises_and_keeps_what_fits(tmp_path: Path) -> None:
    q = DiskQueue.open(tmp_path / "q", max_bytes=2000, policy="reject")
    accepted = 0
    with pytest.raises(QueueFullError, match=r"queue\.max\.bytes"):
        for i in range(100):
            q.append([body(i, 100)])
            accepted += 1
    assert 0 < accepted < 100
    assert [n for n, _ in read_all(q)] == list(range(accepted))
    q.close()


def test_block_policy_waits_for_delivery(tmp_path: Path) -> None:
    q = DiskQueue.open(tmp_path / "q", max_bytes=2000, policy="block")
    while q.used_bytes + ENTRY_SIZE + len(body(0, 100)) <= 2000:
        q.append([body(q.write_n, 100)])
    full_at = q.write_n
    done = threading.Event()
    t = threading.Thread(target=lambda: (q.append([body(full_at, 100)]), done.set()))
    t.start()
    assert not done.wait(0.2)
    # The sender acknowledges everything so far: the blocked writer gets its space.
    q.commit(q.durable_pos, q.durable_n, 0, 1, 0)
    assert done.wait(10)
    t.join()
    assert [n for n, _ in read_all(q)] == [full_at]
    q.close()


def test_drop_oldest_policy_counts_and_keeps_newest(tmp_path: Path) -> None:
    q = DiskQueue.open(tmp_path / "q", max_bytes=40_000, segment_bytes=8192, policy="drop-oldest")
    for i in range(2000):
        q.append([body(i, 100)])
    numbers = [n for n, _ in read_all(q)]
    assert numbers[-1] == 1999
    assert numbers == list(range(numbers[0], 2000))
    assert q.dropped == numbers[0] > 0
    # The budget holds up to one segment of overshoot.
    total = sum(p.stat().st_size for p in segments(tmp_path / "q"))
    assert total <= 40_000 + 8192
    dropped = list(q.dropped_ranges)
    assert dropped[0][0] == 0 and dropped[-1][1] == numbers[0]
    q.close()
    q = DiskQueue.open(tmp_path / "q", max_bytes=40_000, segment_bytes=8192, policy="drop-oldest")
    assert [n for n, _ in read_all(q)] == numbers
    # What was dropped is known across the restart, for event queries.
    assert list(q.dropped_ranges) == dropped
    q.close()


def test_dropped_ranges_load_only_durable_skips_and_cut_a_torn_record(tmp_path: Path) -> None:
    """A record of a drop whose cursor never made it (a crash between the two) is not a
    drop, nor is a torn record: both are cut, so that later drops (and skips past them)
    never make them count."""
    kwargs: dict = {"max_bytes": 40_000, "segment_bytes": 8192, "policy": "drop-oldest"}
    q = DiskQueue.open(tmp_path / "q", **kwargs)
    for i in range(600):
        q.append([body(i, 100)])
    dropped = list(q.dropped_ranges)
    skip_n = q.cursor.skip_n
    q.close()
    path = tmp_path / "q" / queue_module.DROPPED_RANGES
    intact = path.read_bytes()
    # A drop beyond the cursor's skip position, then half a record.
    path.write_bytes(intact + queue_module._dropped_record(skip_n, skip_n + 50) + b"\x01" * 7)
    q = DiskQueue.open(tmp_path / "q", **kwargs)
    assert list(q.dropped_ranges) == dropped
    assert path.read_bytes() == intact
    for i in range(600, 1200):
        q.append([body(i, 100)])
    more = list(q.dropped_ranges)
    assert len(more) > len(dropped)
    q.close()
    q = DiskQueue.open(tmp_path / "q", **kwargs)
    assert list(q.dropped_ranges) == more
    q.close()


def test_one_damaged_record_of_the_index_or_the_drops_does_not_take_the_rest(
    tmp_path: Path,
) -> None:
    """A bit flip in a record of ``offsets`` or ``dropped`` loses that record only: the
    records after it are read, and the files are not cut."""
    kwargs: dict = {"max_bytes": 40_000, "segment_bytes": 8192, "policy": "drop-oldest"}
    q = DiskQueue.open(tmp_path / "q", **kwargs)
    for i in range(600):
        q.append([body(i, 100)])
    dropped = list(q.dropped_ranges)
    assert len(dropped) >= 3
    pos, n = q.start_of_next_read()
    for batch in range(4):  # four acknowledged batches of 5 entries
        pos, n = q.locate(pos, n, n + 5)
        q.commit(pos, n, n, 7, 0, delivered=(n - 5, 5, 1000 + 10 * batch))
    offsets = [q.delivered_offset(number) for number in range(dropped[-1][1], n)]
    q.close()
    for name, layout in (
        (queue_module.OFFSET_INDEX, queue_module._OFFSET),
        (queue_module.DROPPED_RANGES, queue_module._DROPPED),
    ):
        path = tmp_path / "q" / name
        flip(path, layout.size + 3)  # the second record
    q = DiskQueue.open(tmp_path / "q", **kwargs)
    assert list(q.dropped_ranges) == dropped[:1] + dropped[2:]
    first = dropped[-1][1]
    assert [q.delivered_offset(number) for number in range(first, n)] == (
        offsets[:5] + [None] * 5 + offsets[10:]
    )
    q.close()
    assert (
        tmp_path / "q" / queue_module.OFFSET_INDEX
    ).stat().st_size == 4 * queue_module._OFFSET.size


def test_the_dropped_ranges_file_keeps_the_newest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At twice the number kept, the file is rewritten with the newest ranges only."""
    monkeypatch.setattr(queue_module, "DROPPED_RANGES_KEPT", 3)
    kwargs: dict = {"max_bytes": 40_000, "segment_bytes": 8192, "policy": "drop-oldest"}
    q = DiskQueue.open(tmp_path / "q", **kwargs)
    for i in range(2000):
        q.append([body(i, 100)])
    kept = list(q.dropped_ranges)
    assert len(kept) == 3 and q.dropped > kept[-1][1] - kept[0][0]
    q.close()
    records = (tmp_path / "q" / queue_module.DROPPED_RANGES).stat().st_size
    assert records <= 6 * queue_module._DROPPED.size
    q = DiskQueue.open(tmp_path / "q", **kwargs)
    assert list(q.dropped_ranges) == kept
    q.close()


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.none() | st.binary(max_size=30),
            st.none() | st.binary(max_size=200),
            st.lists(
                st.tuples(st.text(max_size=10), st.none() | st.binary(max_size=20)), max_size=3
            ),
            st.integers(min_value=0, max_value=2**63 - 1),
        ),
        min_size=1,
        max_size=30,
    )
)
def test_bodies_round_trip_through_the_queue(
    tmp_path_factory: pytest.TempPathFactory,
    events: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int]],
) -> None:
    directory = tmp_path_factory.mktemp("q")
    q = DiskQueue.open(directory, segment_bytes=4096)
    bodies = [encode_body(k, v, h, ts) for k, v, h, ts in events]
    q.append(bodies)
    q.close()
    q = DiskQueue.open(directory, segment_bytes=4096)
    stored = read_all(q)
    q.close()
    assert [b for _, b in stored] == bodies
    for (k, v, h, ts), (_, raw) in zip(events, stored, strict=True):
        assert check_body(raw) == k
        assert decode_body(raw) == (ts, k, v, h)
        # A body's timestamp is never negative (a parked entry relies on it).
        with pytest.raises(EventFormatError, match="timestamp must be epoch milliseconds"):
            check_body(struct.pack(">q", -1 - ts) + raw[8:])


@given(st.binary(max_size=64))
def test_garbage_bodies_raise_the_agents_error(data: bytes) -> None:
    try:
        check_body(data)
    except EventFormatError:
        return
    # Accepted: it must then decode to something that encodes back to the same bytes.
    ts, k, v, h = decode_body(data)
    assert encode_body(k, v, h, ts) == data


def test_offset_index_survives_reopen_and_rotates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(queue_module, "OFFSET_INDEX_RECORDS", 10)
    q = DiskQueue.open(tmp_path / "q")
    q.append([body(i) for i in range(100)])
    entries = q.read(0, 0, 1 << 20)
    # Batches of 4 events acknowledged at offsets 1000, 1010, ...; one found already there.
    for b in range(25):
        end = entries[4 * b + 3]
        base = -1 if b == 20 else 1000 + 10 * b
        q.commit(
            end.position + ENTRY_SIZE + len(end.body),
            4 * b + 4,
            0,
            1,
            0,
            delivered=(4 * b, 4, base),
        )
    q.close()
    q = DiskQueue.open(tmp_path / "q")
    # Two files of at most 10 records: the last 15-20 batches are answered.
    assert q.delivered_offset(99) == 1000 + 10 * 24 + 3
    assert q.delivered_offset(81) == -1
    assert q.delivered_offset(4 * 15 + 1) == 1000 + 10 * 15 + 1
    assert q.delivered_offset(0) is None
    assert q.delivered_offset(100) is None
    q.close()
    # A torn record at the end of the index is cut, the rest kept.
    index = tmp_path / "q" / "offsets"
    index.write_bytes(index.read_bytes() + b"\x00\x01\x02")
    q = DiskQueue.open(tmp_path / "q")
    assert q.delivered_offset(99) == 1000 + 10 * 24 + 3
    q.close()
    assert index.stat().st_size % 24 == 0


class RefusedWrites:
    """``os.pwrite``/``os.pwritev`` that refuse the writes to some of a queue's files with
    ``errno`` (an injected full disk or I/O error), and let the rest through."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, refuse: Callable[[int], int | None]):
        real_pwrite, real_pwritev = os.pwrite, os.pwritev

        def pwrite(fd: int, data: bytes, at: int) -> int:
            code = refuse(fd)
            if code is not None:
                raise OSError(code, os.strerror(code))
            return real_pwrite(fd, data, at)

        def pwritev(fd: int, buffers: list[memoryview], at: int, flags: int = 0) -> int:
            code = refuse(fd)
            if code is not None:
                raise OSError(code, os.strerror(code))
            return real_pwritev(fd, buffers, at, flags)

        monkeypatch.setattr(queue_module.os, "pwrite", pwrite)
        monkeypatch.setattr(queue_module.os, "pwritev", pwritev)


def in_thread(work: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(work())
        except Exception as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def test_an_error_while_making_room_fails_the_queue_without_hanging(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """drop-oldest on a full disk whose drop cannot write the cursor (a copy-on-write file
    system may refuse even an overwrite): the sync fails, its caller hears why, and the
    queue answers every later call and closes, instead of leaving them waiting for a sync
    that never ends."""
    import errno

    q = DiskQueue.open(tmp_path / "q", segment_bytes=4096, policy="drop-oldest")
    for i in range(40):
        q.append([body(i, 300)])
    RefusedWrites(monkeypatch, lambda fd: errno.ENOSPC if fd in (q._fd, q._cursor_fd) else None)
    first, outcome = in_thread(lambda: q.append([body(40, 300)]))
    first.join(10)
    assert not first.is_alive()
    assert isinstance(outcome[0], AgentClosedError) and "No space left" in str(outcome[0])
    monkeypatch.undo()
    later, outcome = in_thread(lambda: q.append([body(41, 300)]))
    later.join(10)
    assert isinstance(outcome[0], AgentClosedError) and "failed" in str(outcome[0])
    closing, _ = in_thread(q.close)
    closing.join(10)
    assert not closing.is_alive()


def test_callers_waiting_for_room_hear_when_the_queue_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """block on a full disk: a caller that arrived while the disk was full waits for room;
    when the waiting sync then fails for good (an I/O error), that caller is told at once."""
    import errno

    q = DiskQueue.open(tmp_path / "q", segment_bytes=4096, policy="block")
    for i in range(5):
        q.append([body(i, 300)])
    code = [errno.ENOSPC]
    RefusedWrites(monkeypatch, lambda fd: code[0] if fd == q._fd else None)
    leader, led = in_thread(lambda: q.append([body(5, 300)]))
    deadline = time.monotonic() + 10
    while not q.disk_full and time.monotonic() < deadline:
        time.sleep(0.01)
    assert q.disk_full
    follower, followed = in_thread(lambda: q.append([body(6, 300)]))
    time.sleep(0.2)
    assert follower.is_alive()  # waiting for room
    code[0] = errno.EIO
    leader.join(10)
    follower.join(3)
    assert isinstance(led[0], AgentClosedError) and "Input/output error" in str(led[0])
    assert not follower.is_alive()
    assert isinstance(followed[0], AgentClosedError) and "failed" in str(followed[0])
    q.close()


def test_entries_larger_than_a_lowered_limit_are_kept_and_read(tmp_path: Path) -> None:
    """max.request.size lowered across a restart: the entries acknowledged under the old
    limit are neither cut at recovery as a torn tail nor skipped as damaged when read."""
    big = [body(i, 100_000) for i in range(3)]
    q = DiskQueue.open(tmp_path / "q", max_entry_bytes=200_000)
    q.append(big[:2])
    q.append([body(2)])
    q.append(big[2:])
    q.close()
    reopened = DiskQueue.open(tmp_path / "q", max_entry_bytes=1000)
    assert (reopened.durable_n, reopened.truncated_bytes) == (4, 0)
    assert read_all(reopened) == [(0, big[0]), (1, big[1]), (2, body(2)), (3, big[2])]
    assert reopened.corrupt == 0
    with pytest.raises(EventTooLargeError):
        reopened.append(big[:1])  # the new limit holds for new events
    reopened.close()


def test_entries_claimed_in_flight_are_not_dropped(tmp_path: Path) -> None:
    """A reader (the sender, the parked mover) claims what it read; a drop that came in
    between makes the claim fail, so those entries are not sent after being counted as
    dropped, and once claimed, drops leave them alone."""
    q = DiskQueue.open(tmp_path / "q", segment_bytes=4096, max_bytes=16384, policy="drop-oldest")
    number = 0
    while number < 40:
        q.append([body(number, 300)])
        number += 1
    pos, n = q.start_of_next_read()
    read = q.read(pos, n, 1 << 16)
    end = (read[-1].position + ENTRY_SIZE + len(read[-1].body), read[-1].number + 1)
    while q.cursor.skip_n <= n:  # appends over the budget drop the oldest segment
        q.append([body(number, 300)])
        number += 1
    assert not q.claim(n, *end)
    assert q.in_flight_end is None
    pos, n = q.start_of_next_read()
    read = q.read(pos, n, 1 << 16)
    end = (read[-1].position + ENTRY_SIZE + len(read[-1].body), read[-1].number + 1)
    assert q.claim(n, *end)
    dropped = q.dropped
    while q.dropped < dropped + 20:
        q.append([body(number, 300)])
        number += 1
    # The drops went past the claimed entries, none of which counts as dropped.
    assert q.cursor.skip_n > end[1]
    assert not [e.number for e in read for f, s in q.dropped_ranges if f <= e.number < s]
    q.close()


def test_an_index_rotation_that_fails_half_way_keeps_the_rotated_offsets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rotation renamed `offsets` to `offsets.old`, then could not make the new file
    (a full disk): the next record opens it, and no second rotation replaces the full
    `offsets.old` with a short one."""
    import errno

    monkeypatch.setattr(queue_module, "OFFSET_INDEX_RECORDS", 10)
    q = DiskQueue.open(tmp_path / "q")
    q.append([body(i) for i in range(13)])
    entries = q.read(0, 0, 1 << 20)
    real_open = os.open
    refuse = [False]

    def open_(path: object, flags: int, *args: int) -> int:
        if refuse[0] and str(path).endswith("/offsets"):
            refuse[0] = False
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_open(path, flags, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(queue_module.os, "open", open_)
    for n, entry in enumerate(entries):
        refuse[0] = n == 9  # the rotation after the 10th record
        q.commit(
            entry.position + ENTRY_SIZE + len(entry.body),
            n + 1,
            0,
            1,
            0,
            delivered=(n, 1, 1000 + n),
        )
    monkeypatch.undo()
    q.close()
    q = DiskQueue.open(tmp_path / "q")
    assert [q.delivered_offset(n) for n in range(13)] == [1000 + n for n in range(13)]
    q.close()


def test_the_age_of_the_oldest_event_skips_dropped_ones_and_keeps_a_moved_ones_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [1_000_000.0]
    monkeypatch.setattr(queue_module.time, "time", lambda: clock[0])
    q = DiskQueue.open(tmp_path / "q", max_bytes=40_000, segment_bytes=8192, policy="drop-oldest")
    for i in range(100):
        q.append([body(i, 100)])
    clock[0] += 60
    assert q.oldest_age() == pytest.approx(60)
    # Nothing delivered (the broker is down); drop-oldest drops every event of a minute ago.
    for i in range(100, 700):
        q.append([body(i, 100)])
        clock[0] += 0.001
    assert q.dropped > 100
    assert q.oldest_age() < 1
    q.close()
    # Entries moved from a parked queue: their age runs from when they were parked.
    q = DiskQueue.open(tmp_path / "m")
    q.append([body(0)], since=clock[0] - 30)
    clock[0] += 1
    assert q.oldest_age() == pytest.approx(31)
    q.close()
