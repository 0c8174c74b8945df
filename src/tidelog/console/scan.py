"""Reading a topic for the console: browse a page of records or search them, bounded.

Both are one scan: every chosen partition is read from a start offset up to the end offset
it had when the scan began (a snapshot taken with ListOffsets, so records that arrive
during the scan do not keep it going), and stops at the first of: ``limit`` records
kept, ``max_records`` records examined, ``max_seconds`` passed, every partition at its end.

A partition whose start is already at its end is never fetched, and a partition leaves the
consumer's assignment as soon as its position reaches its end. Every fetch therefore asks
only for partitions that hold records still to read, so the broker answers at once: a scan
never waits out a fetch or poll timeout on an empty or exhausted partition (the complaint
about other consoles). Positions are taken from the consumer, not from the last record
seen, so that control batches and compacted gaps at the end of a partition count as read.

The result says how far the scan got in each partition (:class:`PartitionProgress`), which
is what a page shows and what its "next page" / "continue" link resumes from.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from tidelog.client import ConsumerRecord, TopicPartition
from tidelog.client.aio.consumer import AIOConsumer

# Why a scan stopped.
STOP_LIMIT = "limit"
STOP_END = "end"
STOP_RECORDS = "records budget"
STOP_TIME = "time budget"

# Records taken from one poll: the consumer decodes whole fetches anyway, and fewer trips
# through this loop per record are faster (500 -> 5000: 125k -> 180k records/s searched).
_POLL_RECORDS = 5000


@dataclass(slots=True)
class PartitionProgress:
    partition: int
    start: int  # where this scan began reading
    next: int  # first offset not yet examined
    end: int  # the end offset when the scan began
    scanned: int = 0  # records examined (offsets of control batches and gaps are not counted)

    @property
    def done(self) -> bool:
        return self.next >= self.end


@dataclass(frozen=True, slots=True)
class ScanResult:
    records: list[ConsumerRecord]
    progress: dict[int, PartitionProgress]
    stopped: str

    @property
    def scanned(self) -> int:
        return sum(p.scanned for p in self.progress.values())

    @property
    def complete(self) -> bool:
        return all(p.done for p in self.progress.values())

    def cursor(self) -> dict[int, int]:
        """Where a next page or a continued search starts, per partition."""
        return {p.partition: p.next for p in self.progress.values()}


Matcher = Callable[[ConsumerRecord], bool]
# Told how far a scan has got: the progress per partition, records examined, records kept.
ProgressCallback = Callable[[dict[int, PartitionProgress], int, int], None]


def text_matcher(text: str, fields: str = "any") -> Matcher:
    """Records whose key, value or a header value contains ``text`` (UTF-8 bytes, case
    sensitive). ``fields`` is "key", "value", "headers" or "any". Raw bytes are compared, so
    a search decodes nothing and also finds text inside binary values."""
    needle = text.encode("utf-8")
    in_key = fields in ("key", "any")
    in_value = fields in ("value", "any")
    in_headers = fields in ("headers", "any")

    def match(record: ConsumerRecord) -> bool:
        if in_value and record.value is not None and needle in record.value:
            return True
        if in_key and record.key is not None and needle in record.key:
            return True
        if in_headers:
            return any(v is not None and needle in v for _, v in record.headers)
        return False

    return match


async def scan(
    consumer_config: Mapping[str, object],
    topic: str,
    start: Mapping[int, int],
    end: Mapping[int, int],
    *,
    limit: int,
    max_records: int,
    max_seconds: float,
    matcher: Matcher | None = None,
    on_progress: ProgressCallback | None = None,
    progress_every: float = 0.5,
) -> ScanResult:
    """Read ``topic``'s partitions from ``start`` up to ``end`` (both per partition).

    ``on_progress`` is called after a poll at most every ``progress_every`` seconds."""
    progress = {
        p: PartitionProgress(p, min(start[p], end[p]), min(start[p], end[p]), end[p])
        for p in sorted(start)
    }
    found: list[ConsumerRecord] = []
    pending = {TopicPartition(topic, p) for p, prog in progress.items() if not prog.done}
    if not pending or limit <= 0:
        return ScanResult(found, progress, STOP_END if not pending else STOP_LIMIT)
    deadline = time.monotonic() + max_seconds
    next_report = time.monotonic() + progress_every
    examined = 0
    consumer = AIOConsumer(
        dict(consumer_config),
        **{
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            # Only partitions with records left are fetched, so the broker answers at once;
            # a short wait bounds a fetch even for a partition emptied meanwhile. Not 0:
            # Tansu answers a fetch with max wait 0 without records, ever.
            "fetch.max.wait.ms": 10,
        },
    )
    try:
        consumer.assign(sorted(pending))
        for tp in pending:
            consumer.seek(tp, progress[tp.partition].next)
        stopped = STOP_END
        while pending:
            if len(found) >= limit:
                stopped = STOP_LIMIT
                break
            if examined >= max_records:
                stopped = STOP_RECORDS
                break
            left = deadline - time.monotonic()
            if left <= 0:
                stopped = STOP_TIME
                break
            batch = await consumer.poll(
                timeout_ms=max(1, int(left * 1000)),
                max_records=min(_POLL_RECORDS, max_records - examined),
            )
            for record in batch:
                prog = progress[record.partition]
                if record.offset >= prog.end:
                    prog.next = prog.end
                    continue
                prog.next = record.offset + 1
                prog.scanned += 1
                examined += 1
                if matcher is None or matcher(record):
                    found.append(record)
                    if len(found) >= limit:
                        break
            if len(found) >= limit:
                continue
            finished = set()
            for tp in pending:
                prog = progress[tp.partition]
                position = await consumer.position(tp)
                # Past what poll returned: control batches or compacted offsets.
                prog.next = min(max(prog.next, position), prog.end)
                if prog.done:
                    finished.add(tp)
            if finished:
                pending -= finished
                consumer.assign(sorted(pending))
            if on_progress is not None and time.monotonic() >= next_report:
                next_report = time.monotonic() + progress_every
                on_progress(progress, examined, len(found))
        return ScanResult(found, progress, stopped)
    finally:
        await consumer.close()


__all__ = [
    "STOP_END",
    "STOP_LIMIT",
    "STOP_RECORDS",
    "STOP_TIME",
    "PartitionProgress",
    "ProgressCallback",
    "ScanResult",
    "scan",
    "text_matcher",
]
