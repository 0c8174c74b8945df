"""Segment replacement, the operation the cleaner builds on."""

from __future__ import annotations

from pathlib import Path

import pytest
from storage_helpers import LogFactory, make_batch, read_all

from tidelog.records import iter_batches
from tidelog.storage import SegmentDeletedError


def test_replace_two_segments_with_one(open_log: LogFactory, log_dir: Path) -> None:
    log = open_log()
    for value in (b"a", b"b"):
        log.append(make_batch([value]))
    log.roll()
    for value in (b"c", b"d"):
        log.append(make_batch([value]))
    log.roll()
    log.append(make_batch([b"e"]))
    old = log.segments[:2]
    # Keep offsets 1 and 3 only (what compaction of keys would leave).
    kept = b"".join(
        log.read_bytes(offset, 1 << 20, whole_batches=True)[: len(make_batch([b"x"]))]
        for offset in (1, 3)
    )
    assert [h.base_offset for _, h in iter_batches(kept)] == [1, 3]
    cleaned = log.new_cleaned_segment(0)
    assert cleaned.log_path.name.endswith(".log.cleaned")
    cleaned.append_batches(kept)
    log.replace_segments(cleaned, old)
    assert [s.base_offset for s in log.segments] == [0, 4]
    assert sorted(p.name for p in log_dir.iterdir() if ".log" in p.name) == [
        f"{0:020d}.log",
        f"{4:020d}.log",
    ]
    assert read_all(log) == [(1, b"b"), (3, b"d"), (4, b"e")]
    log.close()
    reopened = open_log()
    assert read_all(reopened) == [(1, b"b"), (3, b"d"), (4, b"e")]


def test_replace_refuses_the_active_segment(open_log: LogFactory) -> None:
    log = open_log()
    log.append(make_batch([b"a"]))
    cleaned = log.new_cleaned_segment(0)
    with pytest.raises(ValueError, match="active"):
        log.replace_segments(cleaned, log.segments)
    log.discard_cleaned_segment(cleaned)
    assert not cleaned.log_path.exists()


def test_a_pinned_segment_survives_its_deletion_until_released(open_log: LogFactory) -> None:
    log = open_log()
    log.append(make_batch([b"a"]))
    log.roll()
    log.append(make_batch([b"b"]))
    old = log.segments[0]
    with log.handle_cache.use(old):
        log.delete_records(1)  # deletes the segment while a reader (the cleaner) uses it
        assert old.retired and old.is_open
        header = old.header_at(0)  # still readable through the open descriptor
        assert header.base_offset == 0
    assert not old.is_open
    with pytest.raises(SegmentDeletedError):
        log.handle_cache.acquire(old)
