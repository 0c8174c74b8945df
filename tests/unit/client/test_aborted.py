"""read_committed filtering of fetched batches (:mod:`tidelog.client.aborted`), on batches
laid out as a partition holds them."""

from __future__ import annotations

from tidelog.client.aborted import AbortedTransactions
from tidelog.records import BatchBuilder, iter_batches
from tidelog.records.control import build_end_txn_marker_batch

A, B = 7001, 7002
TS = 1_700_000_000_000


def _data(offset: int, value: bytes, producer: int | None) -> bytes:
    builder = BatchBuilder(base_offset=offset, transactional=producer is not None)
    if producer is not None:
        builder.set_producer(producer, 0, offset)
    builder.append(None, value, timestamp=TS)
    return builder.close()


def _marker(offset: int, producer: int, *, commit: bool) -> bytes:
    return build_end_txn_marker_batch(
        commit=commit,
        producer_id=producer,
        producer_epoch=0,
        coordinator_epoch=0,
        timestamp=TS,
        base_offset=offset,
    )


def _kept(data: bytes, aborted: list[tuple[int, int]]) -> list[int]:
    """Base offsets of the batches that yield records."""
    filter_ = AbortedTransactions(aborted)
    return [h.base_offset for pos, h in iter_batches(data) if not filter_.skips(data, pos, h)]


def test_a_producer_aborts_then_commits_its_next_transaction() -> None:
    data = b"".join(
        [
            _data(0, b"plain", None),
            _data(1, b"a-aborted", A),
            _data(2, b"b-committed", B),
            _marker(3, A, commit=False),
            _data(4, b"a-committed", A),
            _marker(5, B, commit=True),
            _marker(6, A, commit=True),
        ]
    )
    assert _kept(data, [(A, 1)]) == [0, 2, 4]
    # Without the broker's list nothing is dropped but the markers.
    assert _kept(data, []) == [0, 1, 2, 4]


def test_an_aborted_transaction_applies_only_from_its_first_offset() -> None:
    # A's first transaction commits; only its second (from offset 3) is aborted.
    data = b"".join(
        [
            _data(0, b"a-committed", A),
            _marker(1, A, commit=True),
            _data(2, b"plain", None),
            _data(3, b"a-aborted", A),
            _marker(4, A, commit=False),
        ]
    )
    assert _kept(data, [(A, 3)]) == [0, 2]
