"""ListOffsets lookups: earliest, latest, max timestamp and by timestamp."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from storage_helpers import FakeClock, LogFactory, make_batch

from tidelog.records import Compression
from tidelog.storage import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    MAX_TIMESTAMP,
    InvalidTimestampError,
    Log,
    LogConfig,
)


def _log_with_timestamps(open_log: LogFactory, compression: Compression) -> Log:
    log = open_log({"index.interval.bytes": 1, "segment.bytes": 400})
    # offsets:      0    1    2  | 3    4  | 5    6    7  | 8
    batches = [[100, 300, 200], [250, 400], [150, 500, 500], [450]]
    noise = random.Random(7)  # incompressible values: same segment layout for every codec
    for epoch, stamps in enumerate(batches):
        values = [noise.randbytes(40) for _ in stamps]
        log.append(
            make_batch(values, timestamps=stamps, compression=compression),
            leader_epoch=epoch,
        )
    return log


@pytest.mark.parametrize("compression", [Compression.NONE, Compression.ZSTD, Compression.GZIP])
def test_all_four_modes(open_log: LogFactory, compression: Compression) -> None:
    log = _log_with_timestamps(open_log, compression)
    assert len(log.segments) > 1
    assert log.offset_for_timestamp(EARLIEST_TIMESTAMP) == (0, -1, 0)
    assert log.offset_for_timestamp(LATEST_TIMESTAMP) == (9, -1, 3)
    assert log.offset_for_timestamp(MAX_TIMESTAMP) == (6, 500, 2)
    assert log.offset_for_timestamp(0) == (0, 100, 0)
    assert log.offset_for_timestamp(101) == (1, 300, 0)
    assert log.offset_for_timestamp(300) == (1, 300, 0)
    assert log.offset_for_timestamp(301) == (4, 400, 1)
    assert log.offset_for_timestamp(401) == (6, 500, 2)
    assert log.offset_for_timestamp(501) is None
    with pytest.raises(InvalidTimestampError):
        log.offset_for_timestamp(-7)


def test_lookup_respects_log_start(open_log: LogFactory) -> None:
    log = _log_with_timestamps(open_log, Compression.NONE)
    log.delete_records(2)
    assert log.offset_for_timestamp(EARLIEST_TIMESTAMP) == (2, -1, 0)
    assert log.offset_for_timestamp(0) == (2, 200, 0)


def test_empty_log(open_log: LogFactory) -> None:
    log = open_log()
    assert log.offset_for_timestamp(MAX_TIMESTAMP) is None
    assert log.offset_for_timestamp(0) is None
    assert log.offset_for_timestamp(LATEST_TIMESTAMP) == (0, -1, -1)


def test_lookup_after_reopen_uses_time_index(open_log: LogFactory) -> None:
    log = _log_with_timestamps(open_log, Compression.LZ4)
    log.close()
    reopened = open_log({"index.interval.bytes": 1, "segment.bytes": 400}, clean_shutdown=True)
    assert reopened.offset_for_timestamp(MAX_TIMESTAMP) == (6, 500, 2)
    assert reopened.offset_for_timestamp(301) == (4, 400, 1)


@settings(max_examples=40, deadline=None)
@given(
    batches=st.lists(
        st.lists(st.integers(0, 1000), min_size=1, max_size=4), min_size=1, max_size=12
    ),
    target=st.integers(0, 1100),
    interval=st.sampled_from([1, 50, 4096]),
)
def test_lookup_matches_a_linear_scan(
    tmp_path_factory: pytest.TempPathFactory,
    batches: list[list[int]],
    target: int,
    interval: int,
) -> None:
    directory = tmp_path_factory.mktemp("ts") / "t-0"
    config = LogConfig.from_mapping({"index.interval.bytes": interval, "segment.bytes": 300})
    log = Log.open(directory, config, topic="t", partition=0, clock=FakeClock())
    try:
        stamps = [ts for batch in batches for ts in batch]
        for batch in batches:
            log.append(make_batch([b"x" * 30] * len(batch), timestamps=batch))
        expected = next(((o, ts) for o, ts in enumerate(stamps) if ts >= target), None)
        found = log.offset_for_timestamp(target)
        assert (None if found is None else (found.offset, found.timestamp)) == expected
        top = max(stamps)
        found = log.offset_for_timestamp(MAX_TIMESTAMP)
        assert found is not None and (found.offset, found.timestamp) == (stamps.index(top), top)
    finally:
        log.close()
