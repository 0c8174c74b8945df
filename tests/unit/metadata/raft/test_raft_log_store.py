"""The Raft log on disk (tidelog.metadata.raft_log.FileRaftLog): durability of appends,
truncations and snapshots across reopening, with crashes simulated by cutting the segment
file back to what was fsynced; and the same random operations on it and on the
simulation's in-memory log (the model the Raft simulation checks) answering alike."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from tidelog.metadata.raft import Entry, OffsetAndEpoch
from tidelog.metadata.raft.batches import decode_snapshot, encode_entries, encode_snapshot
from tidelog.metadata.raft_log import FileRaftLog, snapshot_file_name
from tidelog.testing.sim_disk import SimRaftLog

PARTITION = "__cluster_metadata-0"
FIRST_SEGMENT = "00000000000000000000.log"


def clock() -> int:
    return 1_700_000_000_000


def open_log(root: Path, **kwargs: object) -> FileRaftLog:
    return FileRaftLog.open(root, clock=clock, **kwargs)  # type: ignore[arg-type]


def entries(*shape: tuple[int, int], start: int = 0) -> list[Entry]:
    """Entries of (epoch, record count), one after the other from ``start``."""
    out = []
    offset = start
    for epoch, count in shape:
        out.append(Entry(offset, epoch, tuple(b"r%d" % (offset + i) for i in range(count))))
        offset += count
    return out


def all_entries(log: FileRaftLog) -> list[Entry]:
    """Every entry: a read stops at the end of a segment, as Kafka's does."""
    out: list[Entry] = []
    while (start := out[-1].end_offset if out else log.start_offset()) < log.end_offset():
        out.extend(log.read(start, 1 << 30))
    return out


def segment_files(root: Path) -> list[str]:
    return sorted(p.name for p in (root / PARTITION).iterdir() if p.name.endswith(".log"))


def test_a_crash_keeps_exactly_the_flushed_entries(tmp_path: Path) -> None:
    synced: list[int] = []

    def recording_fsync(fd: int) -> None:
        synced.append(fd)
        os.fsync(fd)

    log = open_log(tmp_path, fsync=recording_fsync)
    first, second, third = entries((1, 1), (1, 3), (2, 2))
    log.append([first, second])
    assert (log.end_offset(), log.flushed_end_offset()) == (4, 0)
    before = len(synced)
    log.flush()
    assert len(synced) > before
    assert log.flushed_end_offset() == 4
    segment = tmp_path / PARTITION / FIRST_SEGMENT
    flushed_size = segment.stat().st_size
    log.append([third])
    assert (log.end_offset(), log.flushed_end_offset()) == (6, 4)
    log.close()
    # The machine fails: what was not fsynced never reached the disk.
    os.truncate(segment, flushed_size)
    reopened = open_log(tmp_path)
    assert all_entries(reopened) == [first, second]
    assert (reopened.end_offset(), reopened.flushed_end_offset()) == (4, 4)
    assert reopened.last_epoch() == 1
    reopened.append([Entry(4, 2, (b"again",))])
    assert reopened.entry_start(4) == 4 and reopened.entry_epoch(4) == 2
    reopened.close()


def test_a_torn_last_batch_is_dropped_on_open_and_what_remains_is_fsynced(
    tmp_path: Path,
) -> None:
    log = open_log(tmp_path)
    kept, torn = entries((1, 2), (1, 4))
    log.append([kept, torn])
    log.flush()
    log.close()
    segment = tmp_path / PARTITION / FIRST_SEGMENT
    os.truncate(segment, segment.stat().st_size - 7)
    reopened = open_log(tmp_path)
    assert all_entries(reopened) == [kept]
    # Whatever survived in the file is durable now: the node may report it.
    assert reopened.flushed_end_offset() == reopened.end_offset() == 2
    reopened.close()


def test_appends_must_continue_the_log(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append(entries((2, 2)))
    with pytest.raises(ValueError, match="does not continue"):
        log.append([Entry(3, 2, (b"gap",))])
    with pytest.raises(ValueError, match="does not continue"):
        log.append([Entry(2, 1, (b"older epoch",))])
    log.close()


def test_a_truncation_is_durable_and_only_at_entry_boundaries(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    first, second, third = entries((1, 2), (2, 3), (3, 1))
    log.append([first, second, third])
    log.flush()
    with pytest.raises(ValueError, match="inside the entry from 2"):
        log.truncate_to(3)
    log.truncate_to(2)
    assert (log.end_offset(), log.flushed_end_offset(), log.last_epoch()) == (2, 2, 1)
    assert log.end_offset_for_epoch(3) == OffsetAndEpoch(2, 1)
    log.close()
    reopened = open_log(tmp_path)
    assert all_entries(reopened) == [first]
    assert reopened.end_offset_for_epoch(2) == OffsetAndEpoch(2, 1)
    reopened.close()


def test_the_epoch_cache_answers_raft_and_is_rebuilt_when_its_checkpoint_is_lost(
    tmp_path: Path,
) -> None:
    log = open_log(tmp_path)
    log.append(entries((1, 2), (1, 1), (3, 2), (5, 1)))
    log.flush()
    expected = {
        0: OffsetAndEpoch(0, 0),
        1: OffsetAndEpoch(3, 1),
        2: OffsetAndEpoch(3, 1),
        3: OffsetAndEpoch(5, 3),
        4: OffsetAndEpoch(5, 3),
        5: OffsetAndEpoch(6, 5),
        9: OffsetAndEpoch(6, 5),
    }
    assert {e: log.end_offset_for_epoch(e) for e in expected} == expected
    assert [log.entry_epoch(o) for o in range(6)] == [1, 1, 1, 3, 3, 5]
    log.close()
    (tmp_path / PARTITION / "leader-epoch-checkpoint").write_text("garbage\n")
    reopened = open_log(tmp_path)
    assert {e: reopened.end_offset_for_epoch(e) for e in expected} == expected
    assert [reopened.entry_epoch(o) for o in range(6)] == [1, 1, 1, 3, 3, 5]
    reopened.close()


def test_a_snapshot_moves_the_log_start_deletes_older_segments_and_survives_reopen(
    tmp_path: Path,
) -> None:
    # Tiny segments: each entry gets one of its own.
    log = open_log(tmp_path, segment_bytes=100)
    written = entries((1, 1), (1, 2), (2, 2), (2, 1), (4, 3))
    for entry in written:
        log.append([entry])
    log.flush()
    assert len(segment_files(tmp_path)) == 5
    snapshot_id = OffsetAndEpoch(6, 2)
    with pytest.raises(ValueError, match="inside the entry"):
        log.write_snapshot(OffsetAndEpoch(4, 2), encode_snapshot(OffsetAndEpoch(4, 2), []))
    with pytest.raises(ValueError, match="epoch"):
        log.write_snapshot(OffsetAndEpoch(6, 1), encode_snapshot(OffsetAndEpoch(6, 1), []))
    payload = encode_snapshot(snapshot_id, [b"state-a", b"state-b"])
    log.write_snapshot(snapshot_id, payload)
    files = sorted(p.name for p in (tmp_path / PARTITION).iterdir())
    assert snapshot_file_name(snapshot_id) == "00000000000000000006-0000000002.checkpoint"
    assert snapshot_file_name(snapshot_id) in files
    assert not any(name.endswith(".tmp") for name in files)
    # The segments wholly below the entry ending at the snapshot are gone.
    assert segment_files(tmp_path) == [f"{o:020d}.log" for o in (5, 6)]
    assert log.start_offset() == 6 and log.latest_snapshot_id() == snapshot_id
    assert all_entries(log) == written[4:]
    assert log.end_offset_for_epoch(2) == OffsetAndEpoch(6, 2)
    assert log.end_offset_for_epoch(1) == OffsetAndEpoch(6, 2)
    log.close()

    reopened = open_log(tmp_path, segment_bytes=100)
    assert reopened.start_offset() == 6 and reopened.latest_snapshot_id() == snapshot_id
    assert reopened.read_snapshot() == (snapshot_id, payload)
    assert decode_snapshot(payload) == (b"state-a", b"state-b")
    assert all_entries(reopened) == written[4:]
    assert reopened.last_epoch() == 4
    with pytest.raises(ValueError, match="below the log start"):
        reopened.read(3, 1 << 20)
    # A later snapshot replaces the earlier one.
    later = OffsetAndEpoch(9, 4)
    reopened.write_snapshot(later, encode_snapshot(later, [b"state-c"]))
    names = [p.name for p in (tmp_path / PARTITION).iterdir() if p.name.endswith(".checkpoint")]
    assert names == [snapshot_file_name(later)]
    assert (reopened.start_offset(), reopened.end_offset(), reopened.last_epoch()) == (9, 9, 4)
    reopened.close()
    empty_past_snapshot = open_log(tmp_path, segment_bytes=100)
    assert (empty_past_snapshot.start_offset(), empty_past_snapshot.last_epoch()) == (9, 4)
    assert empty_past_snapshot.end_offset_for_epoch(7) == OffsetAndEpoch(9, 4)
    empty_past_snapshot.close()


def test_an_installed_snapshot_replaces_the_whole_log(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append(entries((1, 3), (2, 2)))
    log.flush()
    snapshot_id = OffsetAndEpoch(40, 7)
    payload = encode_snapshot(snapshot_id, [b"leader's state"])
    log.install_snapshot(snapshot_id, payload)
    assert (log.start_offset(), log.end_offset(), log.flushed_end_offset()) == (40, 40, 40)
    assert (log.last_epoch(), log.end_offset_for_epoch(2)) == (7, OffsetAndEpoch(40, 7))
    log.close()
    reopened = open_log(tmp_path)
    assert (reopened.start_offset(), reopened.end_offset()) == (40, 40)
    assert reopened.read_snapshot() == (snapshot_id, payload)
    after = Entry(40, 8, (b"next",))
    reopened.append([after])
    reopened.flush()
    reopened.close()
    again = open_log(tmp_path)
    assert all_entries(again) == [after] and again.start_offset() == 40
    again.close()


def test_a_torn_snapshot_is_ignored_and_deleted(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append(entries((1, 2), (1, 2), (1, 2)))
    log.flush()
    good = OffsetAndEpoch(2, 1)
    log.write_snapshot(good, encode_snapshot(good, [b"good"]))
    log.close()
    newer = OffsetAndEpoch(4, 1)
    torn = encode_snapshot(newer, [b"newer"])[:-9]
    (tmp_path / PARTITION / snapshot_file_name(newer)).write_bytes(torn)
    reopened = open_log(tmp_path)
    assert reopened.latest_snapshot_id() == good
    assert not (tmp_path / PARTITION / snapshot_file_name(newer)).exists()
    assert reopened.start_offset() == 2 and reopened.end_offset() == 6
    reopened.close()


def test_a_snapshot_the_log_does_not_continue_empties_it(tmp_path: Path) -> None:
    """A crash while a fetched snapshot replaced the log: the snapshot file is there, the
    old log (which parts from the leader's) too."""
    log = open_log(tmp_path)
    log.append(entries((1, 2), (2, 2)))
    log.flush()
    log.close()
    for snapshot_id in (OffsetAndEpoch(4, 3), OffsetAndEpoch(3, 1)):
        # An epoch the log does not have there, and an offset inside an entry.
        root = tmp_path / f"case-{snapshot_id.offset}"
        (root / PARTITION).mkdir(parents=True)
        for path in (tmp_path / PARTITION).iterdir():
            (root / PARTITION / path.name).write_bytes(path.read_bytes())
        name = snapshot_file_name(snapshot_id)
        (root / PARTITION / name).write_bytes(encode_snapshot(snapshot_id, [b"leader"]))
        reopened = open_log(root)
        assert (reopened.start_offset(), reopened.end_offset()) == (snapshot_id.offset,) * 2
        assert all_entries(reopened) == []
        reopened.close()
    # The same log with a snapshot it does continue keeps its entries past it.
    continued = OffsetAndEpoch(2, 1)
    name = snapshot_file_name(continued)
    (tmp_path / PARTITION / name).write_bytes(encode_snapshot(continued, [b"mine"]))
    reopened = open_log(tmp_path)
    assert all_entries(reopened) == entries((2, 2), start=2)
    reopened.close()


def test_the_bytes_on_disk_are_the_entries_record_batches(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    written = entries((1, 2), (3, 1))
    log.append(written)
    log.flush()
    log.close()
    data = (tmp_path / PARTITION / FIRST_SEGMENT).read_bytes()
    assert data == encode_entries(written, timestamp=clock())


def open_file_log(root: Path) -> FileRaftLog:
    return FileRaftLog.open(root, clock=lambda: 0, segment_bytes=300)


def assert_same(model: SimRaftLog, real: FileRaftLog, step: str) -> None:
    where = f"after {step}"
    facts = [
        ("start", model.start_offset(), real.start_offset()),
        ("end", model.end_offset(), real.end_offset()),
        ("last epoch", model.last_epoch(), real.last_epoch()),
        ("snapshot", model.read_snapshot(), real.read_snapshot()),
        ("entries", model.entries(), all_entries(real)),
    ]
    for name, expected, actual in facts:
        assert actual == expected, f"{name} {where}"
    # Rolling a segment fsyncs the one it seals, so the file may be durable further than
    # the model (never less, never past the end).
    flushed = real.flushed_end_offset()
    assert model.flushed_end_offset() <= flushed <= real.end_offset(), f"flushed {where}"
    assert flushed == real.end_offset() or real.entry_start(flushed) == flushed, where
    top = model.last_epoch() + 2
    for epoch in range(top):
        assert real.end_offset_for_epoch(epoch) == model.end_offset_for_epoch(epoch), (
            f"end offset for epoch {epoch} {where}"
        )
    for offset in range(model.start_offset(), model.end_offset()):
        assert real.entry_start(offset) == model.entry_start(offset), f"{offset} {where}"
        assert real.entry_epoch(offset) == model.entry_epoch(offset), f"{offset} {where}"


@pytest.mark.parametrize("seed", range(12))
def test_the_file_log_behaves_as_the_simulated_one(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    model = SimRaftLog()
    real = open_file_log(tmp_path)
    epoch = 1
    for number in range(80):
        action = rng.choice(
            ["append"] * 5 + ["flush"] * 2 + ["truncate", "snapshot", "install", "reopen"]
        )
        if action == "append":
            if rng.random() < 0.3:
                epoch += rng.randint(1, 2)
            batch = []
            offset = model.end_offset()
            for _ in range(rng.randint(1, 3)):
                count = rng.randint(1, 4)
                records = tuple(b"%d-%d" % (number, i) for i in range(count))
                batch.append(Entry(offset, epoch, records, control=rng.random() < 0.1))
                offset += count
            model.append(batch)
            real.append(batch)
        elif action == "flush":
            model.flush()
            real.flush()
            assert real.flushed_end_offset() == real.end_offset()
        elif action == "truncate":
            entries = model.entries()
            if not entries:
                continue
            # Truncation never goes below what is committed; keep at least the first entry
            # past the start sometimes, and sometimes cut at the start itself.
            cut = rng.choice([model.start_offset(), *(e.offset for e in entries)])
            model.truncate_to(cut)
            real.truncate_to(cut)
        elif action == "snapshot":
            ends = [
                e.end_offset for e in model.entries() if e.end_offset <= model.flushed_end_offset()
            ]
            if not ends:
                continue
            end = rng.choice(ends)
            snapshot_id = OffsetAndEpoch(end, model.entry_epoch(end - 1))
            payload = encode_snapshot(snapshot_id, [b"state-%d" % number])
            model.write_snapshot(snapshot_id, payload)
            real.write_snapshot(snapshot_id, payload)
        elif action == "install":
            epoch += 1
            snapshot_id = OffsetAndEpoch(model.end_offset() + rng.randint(0, 5), epoch)
            payload = encode_snapshot(snapshot_id, [b"leader-%d" % number])
            model.install_snapshot(snapshot_id, payload)
            real.install_snapshot(snapshot_id, payload)
        else:
            # A restart that loses nothing: flush first (losing unflushed entries is
            # covered by the crash tests, which cut the segment files).
            model.flush()
            real.flush()
            real.close()
            real = open_file_log(tmp_path)
        assert_same(model, real, f"step {number} ({action}), seed {seed}")
    real.close()
