"""Batch and streaming reads of Tidelog topics.

Where each piece runs: the readers are built on the driver, which resolves offsets
(ListOffsets) and plans one :class:`OffsetRange` per topic-partition (more with
``minPartitions``); Spark pickles the reader to the executors, whose ``read()`` fetches the
raw record batches of its range and yields one ``pyarrow.RecordBatch`` per fetch
(:func:`tidelog.spark.arrow_decode.decode_chunk`). The driver-side client is not pickled.

Offsets are Spark's Kafka offsets: ``{"topic": {"0": 10, "1": 7}}``, the next offset to read
of each partition. A micro-batch reads ``[start, end)`` of each partition; partitions missing
from ``start`` (created after the previous batch) start at their earliest offset.

Data loss: a range whose start lies below the partition's log start offset (records deleted
by retention or DeleteRecords), or whose end lies above the log end (a truncated or recreated
partition), or a partition that disappeared, raises :class:`DataLossError` when
``failOnDataLoss`` is true (the default) and otherwise logs a warning and reads what is left.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import gc
import logging
import re
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from tidelog.client.errors import ClientClosedError, ClientError
from tidelog.client.fetch_raw import RawFetch, RawPartitionReader
from tidelog.client.types import TopicPartition
from tidelog.protocol import ErrorCode
from tidelog.records import TruncatedBatchError, iter_batches
from tidelog.spark.arrow_decode import decode_chunk
from tidelog.spark.options import EARLIEST, LATEST, OffsetSpec, SourceOptions, TidelogOptionError

log = logging.getLogger(__name__)

Offsets = dict[TopicPartition, int]


class DataLossError(RuntimeError):
    """Records the query should read are gone (and failOnDataLoss is true)."""


def to_json(offsets: Mapping[TopicPartition, int]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for tp in sorted(offsets):
        out.setdefault(tp.topic, {})[str(tp.partition)] = int(offsets[tp])
    return out


def from_json(data: Mapping[str, Any]) -> Offsets:
    try:
        return {
            TopicPartition(str(topic), int(part)): int(offset)
            for topic, parts in data.items()
            for part, offset in parts.items()
        }
    except (AttributeError, TypeError, ValueError):
        raise ValueError(f"not an offsets object of the tidelog source: {data!r}") from None


def _data_loss(fail: bool, message: str) -> None:
    if fail:
        raise DataLossError(
            f"{message}. Some data may have been lost. Set the source option "
            "failOnDataLoss=false to go on with a warning instead."
        )
    log.warning("%s; going on because failOnDataLoss is false", message)


@dataclass(frozen=True)
class OffsetRange(InputPartition):
    """Offsets [start, end) of one topic-partition, read by one Spark task."""

    topic: str
    partition: int
    start: int
    end: int


def _cut(r: OffsetRange, pieces: int) -> list[OffsetRange]:
    step, extra = divmod(r.end - r.start, pieces)
    out: list[OffsetRange] = []
    at = r.start
    for i in range(pieces):
        stop = at + step + (1 if i < extra else 0)
        out.append(OffsetRange(r.topic, r.partition, at, stop))
        at = stop
    return out


def split_ranges(
    ranges: list[OffsetRange], min_partitions: int | None, max_records: int | None = None
) -> list[OffsetRange]:
    """Cut every range longer than ``max_records`` into equal pieces of at most that many
    offsets, then, while there are fewer than ``min_partitions`` pieces, cut them into at
    least ``min_partitions``, larger ranges into more."""
    if max_records:
        ranges = [p for r in ranges for p in _cut(r, max(1, -(-(r.end - r.start) // max_records)))]
    total = sum(r.end - r.start for r in ranges)
    if not min_partitions or len(ranges) >= min_partitions or total <= 0:
        return ranges
    out: list[OffsetRange] = []
    for r in ranges:
        size = r.end - r.start
        out.extend(_cut(r, max(1, min(size, round(size * min_partitions / total + 0.4999)))))
    return out


def rate_limit(limit: int, begin: Offsets, end: Offsets) -> Offsets:
    """``end`` cut so that at most ``limit`` records are read in all, each partition getting
    a share proportional to what it has (Spark's Kafka source does the same)."""
    sizes = {tp: end[tp] - begin.get(tp, end[tp]) for tp in end}
    total = sum(s for s in sizes.values() if s > 0)
    if total <= limit:
        return dict(end)
    share = {tp: (s * limit // total if s > 0 else 0) for tp, s in sizes.items()}
    left = limit - sum(share.values())
    for tp in sorted(sizes, key=lambda t: (-(sizes[t] - share[t]), t)):
        if left <= 0:
            break
        if share[tp] < sizes[tp]:
            share[tp] += 1
            left -= 1
    return {tp: (begin[tp] + share[tp] if tp in begin else end[tp]) for tp in end}


class _Offsets:
    """Driver-side look-ups: which partitions, and offsets by spec."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._reader: RawPartitionReader | None = None

    @property
    def reader(self) -> RawPartitionReader:
        if self._reader is None:
            self._reader = RawPartitionReader(self.options.client)
        return self._reader

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def partitions(self, *, must_exist: bool) -> list[TopicPartition]:
        o = self.options
        if o.assign is not None:
            return sorted(TopicPartition(t, p) for t, parts in o.assign.items() for p in parts)
        if o.pattern is not None:
            regex = re.compile(o.pattern)
            topics = [t for t in self.reader.topics() if regex.fullmatch(t)]
        else:
            topics = list(o.subscribe)
        out: list[TopicPartition] = []
        for topic in topics:
            try:
                out.extend(TopicPartition(topic, p) for p in self.reader.partitions_for(topic))
            except ClientError as exc:
                if must_exist or exc.code is not ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                    raise
        return sorted(out)

    def named(self, tps: list[TopicPartition], which: str) -> Offsets:
        if not tps:
            return {}
        return {
            tp: r.offset for tp, r in self.reader.list_offsets(dict.fromkeys(tps, which)).items()
        }

    def resolve(self, spec: OffsetSpec, tps: list[TopicPartition], *, starting: bool) -> Offsets:
        """Offsets for ``tps`` by ``spec``; partitions it does not name get earliest
        (starting) or latest (ending)."""
        default = "earliest" if starting else "latest"
        if spec.kind in ("earliest", "latest"):
            return self.named(tps, spec.kind)
        if spec.kind == "offsets":
            out: Offsets = {}
            named: dict[str, list[TopicPartition]] = {"earliest": [], "latest": []}
            for tp in tps:
                value = spec.offsets.get(tp.topic, {}).get(tp.partition)
                if value is None:
                    named[default].append(tp)
                elif value == EARLIEST:
                    named["earliest"].append(tp)
                elif value == LATEST:
                    named["latest"].append(tp)
                else:
                    out[tp] = value
            for which, group in named.items():
                out.update(self.named(group, which))
            return out
        stamps: dict[TopicPartition, int] = {}
        rest: list[TopicPartition] = []
        for tp in tps:
            if spec.kind == "timestamp":
                stamps[tp] = spec.timestamp
            elif (ts := spec.offsets.get(tp.topic, {}).get(tp.partition)) is not None:
                stamps[tp] = ts
            else:
                rest.append(tp)
        out = self.named(rest, default)
        answers = self.reader.list_offsets(stamps) if stamps else {}
        missing = [tp for tp, a in answers.items() if a.offset < 0]
        out.update({tp: a.offset for tp, a in answers.items() if a.offset >= 0})
        if missing:
            if starting and self.options.timestamp_strategy == "error":
                raise TidelogOptionError(
                    "no record at or after the starting timestamp in "
                    f"{', '.join(map(str, missing))}; set "
                    "startingOffsetsByTimestampStrategy=latest to start at the end instead"
                )
            out.update(self.named(missing, "latest"))
        return out


# Bytes asked by the first fetch of a task (at most fetchMaxBytes); each next fetch asks
# twice as much, up to fetchMaxBytes.
FIRST_FETCH_BYTES = 1 << 20


def read_range(
    options: SourceOptions, topic: str, partition: int, start: int, end: int
) -> Iterator[Any]:
    """Arrow batches of ``topic``-``partition`` offsets [start, end), one per fetch; the next
    fetch runs in a helper thread while a batch is decoded.

    Fetches start at :data:`FIRST_FETCH_BYTES` and double up to ``fetchMaxBytes``: Spark
    consumes the first batch while the larger fetches after it are read and decoded.
    """
    tp = TopicPartition(topic, partition)
    reader = RawPartitionReader(options.client)
    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tidelog-fetch")
    max_bytes = options.fetch_max_bytes
    ask = min(FIRST_FETCH_BYTES, max_bytes)
    deadline_s = options.poll_timeout_ms / 1000
    try:
        position = start
        pending: concurrent.futures.Future[RawFetch] | None = None
        pending_at = -1
        stalled_since: float | None = None
        while position < end:
            if pending is None or pending_at != position:
                if pending is not None:
                    # A read-ahead for another offset: wait it out, drop its outcome.
                    with contextlib.suppress(Exception):
                        pending.result()
                pending = pool.submit(reader.fetch, tp, position, max_bytes=ask)
            fetched = pending.result()
            pending = None
            if fetched.error is ErrorCode.OFFSET_OUT_OF_RANGE:
                first = reader.list_offsets({tp: "earliest"})[tp].offset
                if position < first:
                    _data_loss(
                        options.fail_on_data_loss,
                        f"{tp}: offsets {position}..{min(first, end) - 1} were deleted "
                        f"(the log now starts at {first})",
                    )
                    position = first
                    continue
                _data_loss(
                    options.fail_on_data_loss,
                    f"{tp}: offset {position} is beyond the end of the log, which was "
                    "truncated or recreated",
                )
                return
            ask = min(2 * ask, max_bytes)
            ahead = _next_offset(fetched.records, position)
            if position < ahead < end:
                pending = pool.submit(reader.fetch, tp, ahead, max_bytes=ask)
                pending_at = ahead
            decoded = decode_chunk(
                fetched.records,
                topic,
                partition,
                position,
                end,
                include_headers=options.include_headers,
                aborted=fetched.aborted_transactions,
            )
            if decoded.batch is not None:
                yield decoded.batch
            if decoded.next_offset > position:
                position = decoded.next_offset
                stalled_since = None
                continue
            # No whole batch came back.
            if fetched.records and decoded.complete_batches == 0:
                # One batch is larger than the fetch size.
                max_bytes = ask = max(max_bytes, 2 * ask)
                continue
            if fetched.high_watermark <= position:
                _data_loss(
                    options.fail_on_data_loss,
                    f"{tp}: offsets {position}..{end - 1} were planned but the log ends at "
                    f"{fetched.high_watermark}",
                )
                return
            now = time.monotonic()
            stalled_since = stalled_since or now
            if now - stalled_since > deadline_s:
                raise TimeoutError(
                    f"{tp}: no records at offset {position} for {deadline_s:g}s although the "
                    f"log ends at {fetched.high_watermark}"
                )
            time.sleep(0.05)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        reader.close()


def _next_offset(data: bytes, position: int) -> int:
    """The offset after the last whole batch in ``data`` (headers only, no CRC)."""
    last = position
    try:
        for _, header in iter_batches(data, verify_crc=False):
            last = header.next_offset
    except TruncatedBatchError:
        pass
    except ValueError:
        return position  # corrupt: decode_chunk reports it
    return last


_worker_prepared = False

# glibc's mallopt parameters (malloc.h) and what the readers set them to: blocks up to the
# largest allowed threshold come from the heap, and freed heap memory is kept for reuse.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD = 32 << 20
_TRIM_THRESHOLD = 1 << 30


def prepare_worker() -> None:
    """Set up the Python process a task runs in, once per process; called by the readers as
    a task starts, i.e. in a Spark Python worker. Two settings, both process-wide:

    - **The heap is frozen** (``gc.freeze()``). A reused Python worker (Spark's default,
      ``spark.python.worker.reuse``) runs a full ``gc.collect()`` after every task. With
      pyspark, pyarrow, numpy and the client imported that walks some 100,000 long-lived
      objects, tens of ms of CPU per task, and the next task handed to the worker waits for
      it. Frozen objects are skipped by every later collection; objects created afterwards
      are collected as usual. The price: reference cycles that are already garbage at this
      moment (a few left by imports) and the objects of the first task are never reclaimed,
      once per worker.
    - **Freed memory is kept** (glibc only, through ``mallopt``). A read allocates buffers of
      megabytes per fetch (the response, the records' copy, the decoded columns). glibc
      gives blocks that large their own mapping and unmaps them when freed, so every fetch
      paid again for faulting in fresh pages: about 2,600 page faults, half the decoding
      time of a chunk. Blocks up to 32 MiB now come from the heap, and the heap keeps what
      is freed. The price: the worker's resident size stays at its peak (tens of MiB per
      task running in it) until it exits.
    """
    global _worker_prepared
    if _worker_prepared:
        return
    _worker_prepared = True
    gc.freeze()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to set
        libc = ctypes.CDLL(None)
        libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)
        libc.mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD)


class GroupCommitter:
    """Commits a stream's offsets as a consumer group through an admin client kept open
    between micro-batches (commits from outside the group: it has no members).

    Never raises: a failure is logged as a warning when it is new or when
    ``WARN_EVERY_S`` passed since the last warning, and recovery is logged too.
    """

    WARN_EVERY_S = 300.0

    def __init__(self) -> None:
        self._admin: Any = None
        self._failing: str | None = None
        self._warned_at = 0.0
        self._last: Offsets | None = None

    def commit(self, group: str, config: Mapping[str, Any], offsets: Offsets) -> bool:
        """Commit ``offsets`` for ``group`` unless they are what was last committed; True
        when the group holds them."""
        if not offsets or offsets == self._last:
            return True
        try:
            if self._admin is None:
                from tidelog.client import Admin

                self._admin = Admin(dict(config))
            self._admin.alter_consumer_group_offsets(group, offsets)
        except Exception as exc:  # advisory progress: nothing here may fail the query
            if not isinstance(exc, ClientError) or isinstance(exc, ClientClosedError):
                self._drop_admin()  # start afresh next time
            text = f"{type(exc).__name__}: {exc}"
            now = time.monotonic()
            if text != self._failing or now - self._warned_at >= self.WARN_EVERY_S:
                log.warning(
                    "cannot record the query's progress as consumer group %r (%s); the "
                    "checkpoint still holds it, and the next micro-batch tries again",
                    group,
                    text,
                )
                self._warned_at = now
            self._failing = text
            return False
        self._last = dict(offsets)
        if self._failing is not None:
            log.info("recording progress as consumer group %r works again", group)
            self._failing = None
        return True

    def _drop_admin(self) -> None:
        admin, self._admin = self._admin, None
        if admin is not None:
            with contextlib.suppress(Exception):
                admin.close()

    def close(self) -> None:
        self._drop_admin()


class TidelogBatchReader(DataSourceReader):
    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> list[InputPartition]:
        o = self.options
        offsets = _Offsets(o)
        try:
            tps = offsets.partitions(must_exist=True)
            starts = offsets.resolve(o.starting, tps, starting=True)
            ends = offsets.resolve(o.ending, tps, starting=False)
            first = offsets.named(tps, "earliest")
        finally:
            offsets.close()
        ranges: list[OffsetRange] = []
        for tp in tps:
            start, end = starts[tp], ends[tp]
            if start < first[tp]:
                _data_loss(
                    o.fail_on_data_loss,
                    f"{tp}: starting offset {start} lies below the log start {first[tp]}",
                )
                start = first[tp]
            if end < start:
                raise TidelogOptionError(
                    f"{tp}: ending offset {end} lies before the starting offset {start}"
                )
            if end > start:
                ranges.append(OffsetRange(tp.topic, tp.partition, start, end))
        return list(split_ranges(ranges, o.min_partitions, o.max_records_per_partition))

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, OffsetRange)
        prepare_worker()
        yield from read_range(
            self.options, partition.topic, partition.partition, partition.start, partition.end
        )


class TidelogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._offsets: _Offsets | None = None
        self._target: Offsets | None = None
        self._group_commits = GroupCommitter()

    def __getstate__(self) -> dict[str, Any]:
        # Executors need only the options; clients stay on the driver.
        return {"options": self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["options"])  # type: ignore[misc]

    @property
    def _lookup(self) -> _Offsets:
        if self._offsets is None:
            self._offsets = _Offsets(self.options)
        return self._offsets

    def _current(self) -> list[TopicPartition]:
        return self._lookup.partitions(must_exist=False)

    def initialOffset(self) -> dict[str, Any]:
        tps = self._current()
        return to_json(self._lookup.resolve(self.options.starting, tps, starting=True))

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.options.max_offsets_per_trigger
        return ReadAllAvailable() if n is None else ReadMaxRows(n)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._lookup.named(self._current(), "latest")

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return to_json(self._lookup.named(self._current(), "latest"))

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        begin = from_json(start)
        self._record_progress(begin)
        if self._target is not None:
            latest = dict(self._target)
        else:
            latest = self._lookup.named(self._current(), "latest")
        for tp in sorted(set(begin) - set(latest)):
            if self._target is None:
                _data_loss(
                    self.options.fail_on_data_loss, f"{tp} was being read and no longer exists"
                )
        fresh = [tp for tp in latest if tp not in begin]
        begin = {**begin, **self._lookup.named(fresh, "earliest")}
        for tp, end in latest.items():
            if end < begin[tp]:
                _data_loss(
                    self.options.fail_on_data_loss,
                    f"{tp}: the log ends at {end}, before offset {begin[tp]} already read "
                    "(truncated or recreated)",
                )
                latest[tp] = begin[tp]
        if isinstance(limit, ReadMaxRows):
            latest = rate_limit(limit.max_rows, begin, latest)
        # Partitions read before and now gone keep their last offset in the checkpoint.
        kept = {tp: off for tp, off in from_json(start).items() if tp not in latest}
        return to_json({**kept, **latest})

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        begin, stop = from_json(start), from_json(end)
        fresh = [tp for tp in stop if tp not in begin]
        # New partitions start at earliest, which is 0 unless records were already deleted.
        begin.update(self._lookup.named(fresh, "earliest") if fresh else {})
        ranges = [
            OffsetRange(tp.topic, tp.partition, begin[tp], stop[tp])
            for tp in sorted(stop)
            if stop[tp] > begin[tp]
        ]
        return list(
            split_ranges(
                ranges, self.options.min_partitions, self.options.max_records_per_partition
            )
        )

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, OffsetRange)
        prepare_worker()
        yield from read_range(
            self.options, partition.topic, partition.partition, partition.start, partition.end
        )

    def commit(self, end: dict[str, Any]) -> None:
        # Spark calls this for micro-batch N only when it plans batch N+1, after latestOffset
        # has already recorded the same offsets; kept for engines that call it sooner.
        self._record_progress(from_json(end))

    def _record_progress(self, done: Offsets) -> None:
        """Record ``done`` (offsets every committed micro-batch has read up to) as the offsets
        of the consumer group named by ``kafka.group.id`` or ``groupIdPrefix``, if any.

        Spark asks ``latestOffset(start)`` only after the micro-batch ending at ``start`` is
        in the checkpoint's commit log, so ``start`` is the query's progress; recording it
        there (rather than only in ``commit``, which Spark calls one batch late) makes a
        drained query show no lag. The group is a view for lag tools: progress lives in the
        checkpoint, and a failed group commit never fails the query.
        """
        group = self.options.group_id
        if group is not None:
            self._group_commits.commit(group, self.options.admin_client, done)

    def stop(self) -> None:
        self._group_commits.close()
        if self._offsets is not None:
            self._offsets.close()
            self._offsets = None
