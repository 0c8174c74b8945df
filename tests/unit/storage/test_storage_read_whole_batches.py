"""``Log.read(..., whole_batches=True)``: the same slices as trimming the plain read to
whole batches, found from the offset index instead of a scan of every header."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from storage_helpers import FakeClock, make_batch

from tidelog.records.batch import parse_header
from tidelog.storage import Log, LogConfig
from tidelog.storage import segment as segment_module

BATCHES = 400


def _whole_prefix(data: bytes) -> int:
    """Length of the longest prefix of ``data`` made of whole batches."""
    position = 0
    while position + 12 <= len(data):
        size = struct.unpack_from(">i", data, position + 8)[0] + 12
        if position + size > len(data):
            break
        position += size
    return position


@pytest.fixture(scope="module")
def many_batches(tmp_path_factory: pytest.TempPathFactory) -> Log:
    """One segment of ``BATCHES`` small batches of 1 to 3 records, indexed every ~300
    bytes."""
    directory = tmp_path_factory.mktemp("whole") / "t-0"
    config = LogConfig.from_mapping({"index.interval.bytes": 300})
    log = Log.open(directory, config, topic="t", partition=0, clock=FakeClock())
    for index in range(BATCHES):
        log.append(make_batch([b"v%d" % index] * (1 + index % 3)))
    return log


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_whole_batches_equal_trimmed_plain_read(many_batches: Log, data: st.DataObject) -> None:
    log = many_batches
    offset = data.draw(st.integers(log.log_start_offset, log.log_end_offset - 1))
    max_bytes = data.draw(st.integers(0, 40_000))
    min_one_batch = data.draw(st.booleans())
    plain = log.read_bytes(offset, max_bytes, min_one_batch=min_one_batch)
    whole = log.read_bytes(offset, max_bytes, min_one_batch=min_one_batch, whole_batches=True)
    assert whole == plain[: _whole_prefix(plain)]


def test_whole_batches_reads_few_headers(
    many_batches: Log, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = 0

    def counting(data: bytes | bytearray | memoryview, offset: int = 0) -> object:
        nonlocal calls
        calls += 1
        return parse_header(data, offset)

    monkeypatch.setattr(segment_module, "parse_header", counting)
    size = many_batches.active_segment.size
    data = many_batches.read_bytes(0, size - 1, whole_batches=True)
    assert 0 < len(data) < size
    assert len(data) == _whole_prefix(many_batches.read_bytes(0, size - 1))
    # Every header from 0 would be BATCHES reads; index entries lie every ~300 bytes.
    assert calls < 20


def test_bad_index_entry_is_not_trusted(tmp_path: Path, clock: FakeClock) -> None:
    config = LogConfig.from_mapping({"index.interval.bytes": 100})
    log = Log.open(tmp_path / "t-0", config, topic="t", partition=0, clock=clock)
    for index in range(50):
        log.append(make_batch([b"value-%d" % index] * 2))
    size = log.active_segment.size
    log.roll()  # the damaged index below belongs to a sealed segment
    log.append(make_batch([b"next"]))
    expected = {
        max_bytes: log.read_bytes(0, max_bytes, whole_batches=True)
        for max_bytes in range(0, size, 97)
    }
    log.close()
    index_path = tmp_path / "t-0" / "00000000000000000000.index"
    entries = bytearray(index_path.read_bytes())
    assert len(entries) >= 16
    # Shift every recorded position by one byte: no entry points at a batch any more.
    for at in range(0, len(entries), 8):
        position = struct.unpack_from(">i", entries, at + 4)[0]
        struct.pack_into(">i", entries, at + 4, position + 1)
    index_path.write_bytes(bytes(entries))
    reopened = Log.open(
        tmp_path / "t-0", config, topic="t", partition=0, clock=clock, clean_shutdown=True
    )
    for max_bytes, data in expected.items():
        assert reopened.read_bytes(0, max_bytes, whole_batches=True) == data
    reopened.close()
