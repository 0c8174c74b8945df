"""read_committed: which batches of a fetched range belong to aborted transactions.

A broker answers a read_committed Fetch up to the last stable offset only, so every
transaction in the range has ended; but the records of aborted ones are still in the log and
in the answer. Next to them the answer lists the aborted transactions that overlap the range,
as (producer id, first offset). A consumer drops them as Kafka's consumer does: an aborted
transaction applies to its producer's transactional batches from the first batch whose last
offset reaches the transaction's first offset, until that producer's ABORT marker. Control
batches (the markers) never carry records for the application.

Any reader of fetched batches uses it (the consumer; readers of raw batches can too):
:meth:`AbortedTransactions.skips` is asked once per batch, in offset order.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from tidelog.client.types import ConsumerRecord
from tidelog.records import BatchHeader, decode_rows
from tidelog.records.control import ControlRecordType, parse_control_key
from tidelog.records.errors import CorruptBatchError


class AbortedTransactions:
    """The aborted transactions of one fetched range, consumed batch by batch."""

    __slots__ = ("_aborting", "_pending")

    def __init__(self, aborted: Iterable[tuple[int, int]]) -> None:
        """``aborted``: (producer id, first offset) pairs, as the Fetch answer lists them."""
        self._pending = deque(sorted((first, producer) for producer, first in aborted))
        self._aborting: set[int] = set()

    def skips(self, data: bytes | memoryview, pos: int, header: BatchHeader) -> bool:
        """Whether the batch at ``pos`` of ``data`` (with ``header``) yields no records: a
        control batch, or a transactional batch of a producer whose transaction aborted."""
        pending = self._pending
        while pending and pending[0][0] <= header.last_offset:
            self._aborting.add(pending.popleft()[1])
        if header.is_control:
            if header.producer_id in self._aborting and _is_abort_marker(data, pos, header):
                self._aborting.discard(header.producer_id)
            return True
        return header.is_transactional and header.producer_id in self._aborting


def _is_abort_marker(data: bytes | memoryview, pos: int, header: BatchHeader) -> bool:
    records = decode_rows(data, pos, ConsumerRecord, "", 0, header=header)
    try:
        return bool(records) and parse_control_key(records[0].key).type == ControlRecordType.ABORT
    except CorruptBatchError:
        return False  # not a transaction marker Kafka's way: it ends nothing
