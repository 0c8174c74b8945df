"""Helpers for storage tests: a settable clock, batch making, log opening, reading back."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tidelog.records import BatchBuilder, Compression, iter_batches, iter_records
from tidelog.storage import Log


class FakeClock:
    """Milliseconds that only move when a test moves them."""

    def __init__(self, now: int = 1_700_000_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


def make_batch(
    values: Sequence[bytes],
    *,
    timestamps: Sequence[int] | None = None,
    timestamp: int = 1000,
    compression: Compression = Compression.NONE,
    base_offset: int = 0,
    epoch: int = -1,
    keys: Sequence[bytes | None] | None = None,
) -> bytes:
    builder = BatchBuilder(
        compression=compression, base_offset=base_offset, partition_leader_epoch=epoch
    )
    for index, value in enumerate(values):
        ts = timestamps[index] if timestamps is not None else timestamp
        key = keys[index] if keys is not None else None
        builder.append(key, value, timestamp=ts)
    return builder.close()


def read_all(log: Log, start: int | None = None) -> list[tuple[int, bytes | None]]:
    """Every (offset, value) from ``start`` (the log start) to the LEO, via read()."""
    offset = log.log_start_offset if start is None else start
    out: list[tuple[int, bytes | None]] = []
    while offset < log.log_end_offset:
        data = log.read_bytes(offset, 1 << 20, whole_batches=True)
        assert data, f"nothing read at {offset} below LEO {log.log_end_offset}"
        for position, header in iter_batches(data):
            for record in iter_records(data, position, header=header):
                if record.offset >= offset:
                    out.append((record.offset, record.value))
            offset = header.next_offset
    return out


LogFactory = Callable[..., Log]
