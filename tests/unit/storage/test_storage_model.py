"""The whole partition log against an in-memory model (Hypothesis state machine).

Rules: append (keys from a small set, sometimes tombstones, every codec), roll, clock
advance, truncate_to, retention (delete_old_segments with the fake clock),
delete_records, compaction, close + reopen (clean, and unclean: no clean-shutdown flag,
every batch re-validated). After every step the records read back through Log.read
(offset, key, value, timestamp) must be exactly those the model predicts.

The model predicts from records only, plus the segment boundaries the log reports
(retention and compaction work per segment): a compaction pass with end E (the active
segment's base) drops every record below E that a newer record of its key below E
supersedes, and every tombstone whose batch got a delete horizon in an earlier pass
that has passed; it gives a horizon (now + delete.retention.ms) to every batch below E
left holding a tombstone.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from storage_helpers import FakeClock

from tidelog.records import BatchBuilder, Compression, iter_batches, iter_records
from tidelog.storage import Cleaner, HandleCache, Log, LogConfig

KEYS = [b"a", b"b", b"c", b"d", b"e"]
DELETE_RETENTION_MS = 2_000
RETENTION_MS = 6_000


def _no_fsync(fd: int) -> None:
    return None


@dataclass
class ModelRecord:
    offset: int
    key: bytes
    value: bytes | None
    timestamp: int
    alive: bool = True


@dataclass
class ModelBatch:
    base: int
    last: int
    timestamp: int
    records: list[ModelRecord]
    horizon: int | None = None


@dataclass
class Model:
    start: int = 0
    leo: int = 0
    batches: list[ModelBatch] = field(default_factory=list)

    def alive(self) -> list[ModelRecord]:
        return [r for b in self.batches for r in b.records if r.alive]

    def visible(self) -> list[tuple[int, bytes | None, bytes | None, int]]:
        return [
            (r.offset, r.key, r.value, r.timestamp) for r in self.alive() if r.offset >= self.start
        ]

    def segment_max_timestamp(self, low: int, high: int) -> int:
        return max((b.timestamp for b in self.batches if low <= b.base < high), default=-1)

    def compact(self, end: int, now: int) -> None:
        newest: dict[bytes, int] = {}
        for record in self.alive():
            if record.offset < end:
                newest[record.key] = record.offset
        for batch in self.batches:
            if batch.base >= end:
                continue
            for record in batch.records:
                if not record.alive:
                    continue
                superseded = newest[record.key] > record.offset
                expired = (
                    record.value is None and batch.horizon is not None and now >= batch.horizon
                )
                if superseded or expired:
                    record.alive = False
            if batch.horizon is None and any(r.alive and r.value is None for r in batch.records):
                batch.horizon = now + DELETE_RETENTION_MS


class LogMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="tidelog-model-"))
        self.dir = self.root / "topic-0"
        self.clock = FakeClock()
        self.model = Model()
        self.cleaner = Cleaner(fsync=_no_fsync)
        self.config = LogConfig()
        self.log: Log | None = None

    @initialize(
        policy=st.sampled_from(["compact", "compact,delete"]),
        segment_bytes=st.sampled_from([250, 500, 4000]),
    )
    def start(self, policy: str, segment_bytes: int) -> None:
        self.config = LogConfig.from_mapping(
            {
                "cleanup.policy": policy,
                "segment.bytes": segment_bytes,
                "delete.retention.ms": DELETE_RETENTION_MS,
                "retention.ms": RETENTION_MS,
                "min.cleanable.dirty.ratio": "0.0",
                "index.interval.bytes": 100,
            }
        )
        self.log = self._open(clean=True, recovery_point=0)

    def _open(self, *, clean: bool, recovery_point: int) -> Log:
        log = Log.open(
            self.dir,
            self.config,
            topic="topic",
            partition=0,
            clock=self.clock,
            recovery_point=recovery_point,
            log_start_offset=self.model.start,
            clean_shutdown=clean,
            fsync=_no_fsync,
            handle_cache=HandleCache(8),
        )
        self.cleaner.attach(log)
        return log

    def teardown(self) -> None:
        if self.log is not None and not self.log.closed:
            self.log.close()
        shutil.rmtree(self.root, ignore_errors=True)

    @property
    def active_log(self) -> Log:
        assert self.log is not None
        return self.log

    # -- rules ---------------------------------------------------------------------------

    @rule(
        records=st.lists(
            st.tuples(
                st.sampled_from(KEYS),
                st.one_of(st.none(), st.binary(min_size=0, max_size=12)),
            ),
            min_size=1,
            max_size=4,
        ),
        codec=st.sampled_from(list(Compression)),
    )
    def append(self, records: list[tuple[bytes, bytes | None]], codec: Compression) -> None:
        now = self.clock()
        builder = BatchBuilder(compression=codec)
        for key, value in records:
            builder.append(key, value, timestamp=now)
        info = self.active_log.append(builder.close())
        base = self.model.leo
        assert info.first_offset == base
        batch = ModelBatch(
            base,
            base + len(records) - 1,
            now,
            [ModelRecord(base + i, k, v, now) for i, (k, v) in enumerate(records)],
        )
        self.model.batches.append(batch)
        self.model.leo = batch.last + 1

    @rule()
    def roll(self) -> None:
        self.active_log.roll()

    # Exact horizon and retention boundaries are the interesting steps.
    @rule(
        ms=st.one_of(
            st.sampled_from([1, DELETE_RETENTION_MS, RETENTION_MS]),
            st.integers(min_value=0, max_value=3_000),
        )
    )
    def advance(self, ms: int) -> None:
        self.clock.advance(ms)

    @rule(data=st.data())
    def truncate(self, data: st.DataObject) -> None:
        log = self.active_log
        offset = data.draw(st.integers(min_value=0, max_value=self.model.leo), label="offset")
        first_base = log.segments[0].base_offset
        old_start = self.model.start
        log.truncate_to(offset)
        if offset >= self.model.leo:
            return
        leo = log.log_end_offset
        assert leo <= offset
        self.model.batches = [b for b in self.model.batches if b.last < offset and b.base < leo]
        assert all(r.offset < leo for r in self.model.alive())
        self.model.leo = leo
        self.model.start = offset if offset < first_base else min(old_start, leo)

    @rule()
    def retention(self) -> None:
        log = self.active_log
        now = self.clock()
        bases = [segment.base_offset for segment in log.segments]
        below_start = 0
        for index in range(len(bases) - 1):
            if bases[index + 1] > self.model.start:
                break
            below_start = index + 1
        expired = 0
        if self.config.delete:
            for index in range(len(bases) - 1):
                largest = self.model.segment_max_timestamp(bases[index], bases[index + 1])
                if largest >= now - RETENTION_MS:
                    break
                expired = index + 1
        count = max(below_start, expired)
        assert log.delete_old_segments(now) == count
        if count:
            self.model.start = max(self.model.start, bases[count])

    @rule(data=st.data())
    def delete_records(self, data: st.DataObject) -> None:
        offset = data.draw(
            st.integers(min_value=self.model.start, max_value=self.model.leo), label="offset"
        )
        self.active_log.delete_records(offset)
        self.model.start = max(self.model.start, offset)

    @rule()
    def compact(self) -> None:
        log = self.active_log
        now = self.clock()
        end = log.active_segment.base_offset
        self.cleaner.clean_log(log, now, force=True)
        self.model.compact(end, now)

    @rule()
    def reopen_clean(self) -> None:
        log = self.active_log
        recovery_point = log.recovery_point
        log.close()
        self.log = self._open(clean=True, recovery_point=recovery_point)

    @precondition(lambda self: self.log is not None)
    @rule(from_zero=st.booleans())
    def reopen_unclean(self, from_zero: bool) -> None:
        log = self.active_log
        recovery_point = 0 if from_zero else log.recovery_point
        # A crash: the process goes away without flushing or closing the log. The
        # page cache keeps every write, so recovery must keep every record.
        cache = log.handle_cache
        segments = log.segments
        for segment in segments:
            cache.retire(segment)
        cache.release(segments[-1])
        self.log = self._open(clean=False, recovery_point=recovery_point)
        assert self.log.recovery_report.problems == []

    # -- checks --------------------------------------------------------------------------

    @invariant()
    def matches_model(self) -> None:
        if self.log is None:
            return
        log = self.log
        assert log.log_end_offset == self.model.leo
        assert log.log_start_offset == self.model.start
        got: list[tuple[int, bytes | None, bytes | None, int]] = []
        offset = log.log_start_offset
        while offset < log.log_end_offset:
            data = log.read_bytes(offset, 1 << 20, whole_batches=True)
            assert data, f"nothing read at {offset}"
            for position, header in iter_batches(data):
                for record in iter_records(data, position, header=header):
                    if record.offset >= offset:
                        got.append((record.offset, record.key, record.value, record.timestamp))
                offset = header.next_offset
        assert got == self.model.visible()


LogMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestLogModel = LogMachine.TestCase
