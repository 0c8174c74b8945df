"""One sender per disk queue: batches durable entries to the partition leader, exactly once.

Each queue is written by an idempotent producer of its own (InitProducerId without a
transactional id): its producer id, epoch and the sequence of the first unacknowledged entry
live in the queue's cursor, so they survive a crash together with the read position.
Sequences are consecutive over the entries actually sent; ``next_seq`` belongs to entry
``read_n``.

Loop: read up to ``batch.size`` bytes of durable entries (waiting ``linger.ms`` once when less
is there), build one RecordBatch (``compression.type``, producer id, epoch, base sequence),
send it to the leader with ``acks=all`` and keep resending the *same bytes* until an answer
comes; the read position moves (and is fsynced) only after the acknowledgement. One batch is in
flight per queue, so at most one batch is ever in doubt.

* A connection lost or a request timed out: the batch's outcome is unknown; the identical
  batch is resent and the broker recognises a repeat of one of the producer's last five batches
  and answers with its original offset, writing nothing.
* After a crash of the agent the batch in doubt is not in memory any more; before sending
  anything, the sender asks the leader (DescribeProducers) for the producer's last sequence on
  the partition and moves the read position past the entries it already holds.
* NOT_LEADER_OR_FOLLOWER, unknown topic or partition, a broker down: metadata refresh,
  backoff (``retry.backoff.ms`` doubling up to ``retry.backoff.max.ms``), retry, forever.
* OUT_OF_ORDER_SEQUENCE_NUMBER: resolved with DescribeProducers the same way; when the broker
  has lost the producer's later batches, a new producer id is taken.
* UNKNOWN_PRODUCER_ID, INVALID_PRODUCER_EPOCH, PRODUCER_FENCED, INVALID_PRODUCER_ID_MAPPING:
  the broker refused the batch (nothing written): a new producer id, sequences from 0.
* MESSAGE_TOO_LARGE, RECORD_LIST_TOO_LARGE, INVALID_RECORD, INVALID_TIMESTAMP: the broker
  wrote nothing of the batch. Events it names as refused (``record_errors``) are skipped and
  counted as ``rejected`` (they can never be delivered as they are) once they lead the batch;
  the events before the first of them go on their own. Without names the batch is halved
  until the refused event is alone.

The remaining window for a duplicate: the broker forgot the producer (its state expired after
``producer.id.expiration.ms`` of silence, or was removed by retention) while a batch was in
doubt; the resent batch then looks new. See docs/agent.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tidelog.agent.batch import build_batch
from tidelog.agent.queue import ENTRY_SIZE, DiskQueue, Entry
from tidelog.client.cluster import STALE_METADATA_CODES
from tidelog.client.errors import BrokerConnectionError, ClientError, broker_error
from tidelog.protocol import ApiKey, ErrorCode
from tidelog.records import Compression

if TYPE_CHECKING:
    from tidelog.agent.agent import Agent

_log = logging.getLogger(__name__)

SEQ_MOD = 1 << 31

NEW_PRODUCER_CODES = frozenset(
    {
        ErrorCode.UNKNOWN_PRODUCER_ID,
        ErrorCode.INVALID_PRODUCER_EPOCH,
        ErrorCode.PRODUCER_FENCED,
        ErrorCode.INVALID_PRODUCER_ID_MAPPING,
    }
)
# The broker refuses these events themselves, whenever they are sent: retrying cannot help.
REFUSED_CODES = frozenset(
    {
        ErrorCode.MESSAGE_TOO_LARGE,
        ErrorCode.RECORD_LIST_TOO_LARGE,
        ErrorCode.INVALID_RECORD,
        ErrorCode.INVALID_TIMESTAMP,
    }
)
# Partition errors of a Produce that prove the batch was not written: refused before the
# append. Any other may come after it: REQUEST_TIMED_OUT, NOT_ENOUGH_REPLICAS_AFTER_APPEND,
# even NOT_LEADER_OR_FOLLOWER or UNKNOWN_TOPIC_OR_PARTITION (leadership moved, or the
# partition went, while an acks=all request waited for its replicas), KAFKA_STORAGE_ERROR
# (the fsync after the append failed).
NOTHING_WRITTEN_CODES = frozenset(
    {
        ErrorCode.NOT_ENOUGH_REPLICAS,
        ErrorCode.CORRUPT_MESSAGE,
        ErrorCode.UNSUPPORTED_COMPRESSION_TYPE,
        ErrorCode.UNKNOWN_TOPIC_ID,
    }
)
# How many batches keep the event count a halving found before the full batch.size is tried.
SPLIT_COUNT_KEPT_FOR = 32
COMPRESSIONS = {
    "none": Compression.NONE,
    "gzip": Compression.GZIP,
    "snappy": Compression.SNAPPY,
    "lz4": Compression.LZ4,
    "zstd": Compression.ZSTD,
}


@dataclass(slots=True)
class _Batch:
    data: bytes
    first_n: int
    count: int
    end_pos: int
    end_n: int
    sequence: int
    in_doubt: bool = False
    # The entries the broker said it holds, sent again as the repeat of its last batch.
    repeat: bool = False


def forget_callbacks(callbacks: dict[int, Any], first: int, end: int) -> None:
    """Forget the callbacks of entries ``[first, end)``, which will never be delivered
    (dropped, skipped as damaged, refused), whichever is shorter to walk: the range or the
    callbacks held. ``list(callbacks)`` copies the keys in one step, while sending threads
    may add callbacks of new entries."""
    if not callbacks or end <= first:
        return
    if end - first <= len(callbacks):
        for n in range(first, end):
            callbacks.pop(n, None)
    else:
        for n in list(callbacks):
            if first <= n < end:
                callbacks.pop(n, None)


class Sender:
    """Delivers the entries of one queue to the leader of its partition."""

    def __init__(self, agent: Agent, queue: DiskQueue, topic: str, partition: int) -> None:
        self.agent = agent
        self.queue = queue
        self.topic = topic
        self.partition = partition
        cfg = agent.config
        # Bytes read per batch: batch.size, capped as Kafka's producer caps a batch, by
        # max.request.size (a single event above it is refused when sent to the agent).
        self.batch_size: int = min(cfg["batch.size"], cfg["max.request.size"])
        self.linger = cfg["linger.ms"] / 1000
        self.backoff_min = cfg["retry.backoff.ms"] / 1000
        self.backoff_max = max(self.backoff_min, cfg["retry.backoff.max.ms"] / 1000)
        self.compression = COMPRESSIONS[cfg["compression.type"]]
        self.timeout_ms: int = cfg["request.timeout.ms"]
        c = queue.cursor
        self.producer_id = c.producer_id
        self.producer_epoch = c.producer_epoch
        self.next_seq = c.next_seq
        self.pos, self.n = c.read_pos, c.read_n
        # The next batch's count at most: the events before a refused one go alone.
        self.max_count: int | None = None
        # A count found by halving a batch too large for the topic, and for how many more
        # batches it holds (see _refused).
        self.split_count: int | None = None
        # Batches still to be cut at the count a halving found (see _refused).
        self.split_batches_left = 0
        self.batch: _Batch | None = None
        self.must_resolve = self.producer_id >= 0 and queue.durable_n > c.read_n
        self.wakeup = asyncio.Event()
        # Set while the sender waits for entries (from before its last look at the queue):
        # only then does a sync need to wake it. ``wake_pending``: a wake-up is on its way.
        self.idle = False
        self.wake_pending = False
        self.task: asyncio.Task[None] | None = None
        self.closed = False
        self.callbacks: dict[int, Any] = {}
        # Entries dropped, skipped as damaged or refused never reach run_callbacks.
        queue.on_dropped = functools.partial(forget_callbacks, self.callbacks)
        # Counters for the status report.
        self.delivered = 0
        self.batches = 0
        self.duplicates_avoided = 0
        self.rejected = 0
        self.retries = 0
        self.last_error = ""

    # ------------------------------------------------------------------ life

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self.run())

    def wake(self) -> None:
        self.wake_pending = False
        self.wakeup.set()

    def wake_from_thread(self, loop: asyncio.AbstractEventLoop) -> None:
        """Called by a thread that made entries durable: wake the sender if it waits.

        A busy sender reads the queue again before it waits, so it is left alone: a wake-up
        costs the event loop a round trip and the appending thread a write to the loop's
        self-pipe, per sync, on the path of every durable acknowledgement.
        """
        if self.idle and not self.wake_pending:
            self.wake_pending = True
            loop.call_soon_threadsafe(self.wake)

    async def stop(self) -> None:
        self.closed = True
        self.wakeup.set()
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.task

    async def run(self) -> None:
        backoff = self.backoff_min
        while not self.closed:
            try:
                progressed = await self.step()
            except (ClientError, OSError) as exc:
                self.retries += 1
                self.last_error = str(exc)
                _log.debug("%s-%d: %s; retrying in %.2fs", self.topic, self.partition, exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.backoff_max)
                continue
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a bug must not stop delivery for good
                _log.exception("%s-%d: sender failed", self.topic, self.partition)
                self.last_error = repr(exc)
                await asyncio.sleep(self.backoff_max)
                continue
            if progressed:
                backoff = self.backoff_min
                self.last_error = ""
            else:
                self.wakeup.clear()
                # Idle before the last look: entries made durable after it see the flag.
                self.idle = True
                try:
                    if not self._has_data():
                        await self.wakeup.wait()
                finally:
                    self.idle = False

    def _has_data(self) -> bool:
        return self.batch is not None or self.queue.durable_n > max(
            self.n, self.queue.cursor.skip_n
        )

    # ------------------------------------------------------------------ one step

    async def step(self) -> bool:
        if self.producer_id < 0:
            await self._new_producer()
        if self.must_resolve:
            await self._resolve(self.pos, self.n, self.next_seq)
            self.must_resolve = False
        if self.batch is None and not await self._next_batch():
            return False
        assert self.batch is not None
        await self._produce(self.batch)
        return True

    async def _next_batch(self) -> bool:
        while True:
            # (Read under the queue's lock: a drop on a sending thread sets the position
            # and the number of the skip one after the other.)
            skip_pos, skip_n = self.queue.start_of_next_read()
            if skip_n > self.n:
                # Entries were dropped (drop-oldest) or skipped as damaged: move the read
                # position first, so that a batch in flight always starts at the persisted
                # read position.
                await self._commit(skip_pos, skip_n, self.next_seq)
            entries = self.queue.read(self.pos, self.n, self.batch_size)
            if not entries:
                return False
            size = sum(ENTRY_SIZE + len(e.body) for e in entries)
            if size < self.batch_size and self.linger > 0:
                await asyncio.sleep(self.linger)
                entries = self.queue.read(self.pos, self.n, self.batch_size)
            for cap in (self.max_count, self.split_count):
                if cap is not None:
                    entries = entries[:cap]
            if self._make_batch(entries):
                return True
            # drop-oldest dropped entries this batch holds while it was read: they are
            # dropped (and answer so), not to be sent; start again at the skip position.

    def _make_batch(self, entries: list[Entry], *, repeat: bool = False) -> bool:
        """The batch in flight, of ``entries`` (from the read position), unless a drop
        claimed them meanwhile (False)."""
        last = entries[-1]
        end_pos, end_n = last.position + ENTRY_SIZE + len(last.body), last.number + 1
        if not self.queue.claim(self.n, end_pos, end_n):
            return False
        self.batch = _Batch(
            data=build_batch(
                [e.body for e in entries],
                producer_id=self.producer_id,
                producer_epoch=self.producer_epoch,
                base_sequence=self.next_seq,
                compression=self.compression,
            ),
            first_n=entries[0].number,
            count=len(entries),
            end_pos=end_pos,
            end_n=end_n,
            sequence=self.next_seq,
            in_doubt=repeat,
            repeat=repeat,
        )
        return True

    async def _commit(
        self,
        pos: int,
        n: int,
        next_seq: int,
        delivered: tuple[int, int, int] | None = None,
        *,
        refused: tuple[int, int] | None = None,
        producer: tuple[int, int] | None = None,
    ) -> None:
        """Persist the read side; ``producer`` (id, epoch) replaces the producer with it."""
        producer_id, producer_epoch = producer or (self.producer_id, self.producer_epoch)
        await asyncio.to_thread(
            functools.partial(
                self.queue.commit,
                pos,
                n,
                next_seq,
                producer_id,
                producer_epoch,
                delivered=delivered,
                refused=refused,
            )
        )
        self.pos, self.n, self.next_seq = pos, n, next_seq
        self.producer_id, self.producer_epoch = producer_id, producer_epoch

    # ------------------------------------------------------------------ produce

    async def _produce(self, batch: _Batch) -> None:
        cluster = self.agent.cluster
        try:
            conn = await cluster.leader_connection(self.topic, self.partition)
        except ClientError:
            await self.agent.refresh_topic(self.topic)
            raise
        version = conn.version(ApiKey.PRODUCE)
        topic_id = cluster.metadata.topic_id(self.topic)
        if version >= 13 and topic_id is None:
            version = 12
        values = {
            "transactional_id": None,
            "acks": -1,
            "timeout": self.timeout_ms,
            "topic_data": [
                {
                    "name": self.topic,
                    "topic_id": topic_id,
                    "partition_data": [{"index": self.partition, "records": batch.data}],
                }
            ],
        }
        try:
            response = await conn.call(ApiKey.PRODUCE, values, version=version)
        except BrokerConnectionError:
            batch.in_doubt = True
            await cluster.forget(conn)
            raise
        except ClientError as exc:
            if exc.code is ErrorCode.REQUEST_TIMED_OUT:
                batch.in_doubt = True
                await cluster.forget(conn)
            raise
        answer = None
        for t in response.responses:
            for p in t.partition_responses:
                if int(p.index) == self.partition:
                    answer = p
        if answer is None:
            raise broker_error(ErrorCode.UNKNOWN_SERVER_ERROR, "no answer for the partition")
        code = ErrorCode.from_wire(int(answer.error_code))
        if code is ErrorCode.NONE:
            await self._acknowledged(batch, int(answer.base_offset))
        elif code is ErrorCode.DUPLICATE_SEQUENCE_NUMBER:
            batch.in_doubt = True  # counted once, as a duplicate avoided, by _acknowledged
            await self._acknowledged(batch, -1)
        elif code is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER:
            self.batch = None
            # The batch stays in flight (drop-oldest leaves it alone) while it is resolved.
            # A repeat the broker does not recognise as its batch (other boundaries): its
            # answer to DescribeProducers is taken at its word.
            held = await self._resolve(self.pos, self.n, self.next_seq, repeat=not batch.repeat)
            if self.batch is None:
                self.queue.in_flight_end = None
            if held <= 0:
                _log.warning(
                    "%s-%d: the broker lost producer %d's state; taking a new producer id",
                    self.topic,
                    self.partition,
                    self.producer_id,
                )
                await self._new_producer()
        elif code in NEW_PRODUCER_CODES:
            self.batch = None
            self.queue.in_flight_end = None
            await self._new_producer()
        elif code in REFUSED_CODES or (code is ErrorCode.CORRUPT_MESSAGE and batch.count > 1):
            # (A batch of several events the broker calls corrupt, e.g. one that decompresses
            # past its limit, is split like a batch too large; one event alone is retried.)
            self.batch = None
            # A resend refused (the records are validated before the duplicate check: an
            # event aged past message.timestamp.before.max.ms since, a topic config
            # changed) while an earlier attempt may have been written: whatever the broker
            # holds of it is delivered, not refused; its sequence must not be used again.
            held = 0
            if batch.in_doubt:
                self.must_resolve = True  # should the question fail, asked again first
                # Not repeated: the repeat would be refused the same way.
                held = await self._resolve(self.pos, self.n, self.next_seq, repeat=False)
                self.must_resolve = False
            self.queue.in_flight_end = None
            if held <= 0:
                await self._refused(batch, code, answer)
        else:
            if code in STALE_METADATA_CODES:
                await self.agent.refresh_topic(self.topic)
            if code not in NOTHING_WRITTEN_CODES:
                # The broker may have written the batch before it failed (a timeout waiting
                # for replicas, a failed fsync): if its resend is then refused, what the
                # broker holds must be asked for, not taken as refused.
                batch.in_doubt = True
            raise broker_error(
                code,
                getattr(answer, "error_message", None),
                context=f"{self.topic}-{self.partition}",
            )

    async def _refused(self, batch: _Batch, code: ErrorCode, answer: Any) -> None:
        """The broker refused ``batch`` (nothing of it written): skip the refused events at
        its start, or narrow the next batch down to them."""
        named = sorted(
            {
                int(e.batch_index)
                for e in getattr(answer, "record_errors", None) or ()
                if 0 <= int(e.batch_index) < batch.count
            }
        )
        if named and named[0] > 0:
            self.max_count = named[0]  # the events before the first refused one go alone
            return
        if not named and batch.count > 1:
            # Too large as a whole (the topic's max.message.bytes): halved until it fits,
            # and the count that fits is kept for the next batches (see _acknowledged).
            self.split_count = max(1, batch.count // 2)
            self.split_batches_left = SPLIT_COUNT_KEPT_FOR
            return
        skip = 1  # the refused events that lead the batch: 0, 1, ... as named, or the only one
        while skip < len(named) and named[skip] == skip:
            skip += 1
        if skip == batch.count:
            end_pos, end_n = batch.end_pos, batch.end_n
        else:
            last = self.queue.read(self.pos, self.n, self.batch_size)[skip - 1]
            end_pos, end_n = last.position + ENTRY_SIZE + len(last.body), last.number + 1
        _log.error(
            "%s-%d: the broker refuses events %d..%d (%s: %s); they are skipped",
            self.topic,
            self.partition,
            batch.first_n,
            end_n - 1,
            code.name,
            getattr(answer, "error_message", None) or "",
        )
        self.rejected += skip
        # Not delivered, never will be: recorded as dropped (a query answers so), which
        # forgets their callbacks.
        # No sequence was used: the next event sent gets the refused one's.
        await self._commit(end_pos, end_n, self.next_seq, refused=(batch.first_n, end_n))
        self.max_count = None

    async def _acknowledged(self, batch: _Batch, base_offset: int) -> None:
        next_seq = (batch.sequence + batch.count) % SEQ_MOD
        await self._commit(
            batch.end_pos, batch.end_n, next_seq, (batch.first_n, batch.count, base_offset)
        )
        self.delivered += batch.count
        self.batches += 1
        if batch.in_doubt:
            self.duplicates_avoided += batch.count
        # Last: Agent.flush waits for no batch in flight, so that the counters it may read
        # next include this batch.
        self.batch = None
        self.queue.in_flight_end = None
        self.max_count = None
        if self.split_batches_left > 0:
            # A count learned by halving holds for a while: relearning it for every batch
            # would send each one several times (a backlog drained 13 times slower).
            self.split_batches_left -= 1
        else:
            self.split_count = None
        self.agent.run_callbacks(self, batch.first_n, batch.count, base_offset)

    # ------------------------------------------------------------------ producer id

    async def _new_producer(self) -> None:
        conn = await self.agent.cluster.any_connection()
        try:
            response = await conn.call(
                ApiKey.INIT_PRODUCER_ID,
                {
                    "transactional_id": None,
                    "transaction_timeout": 60_000,
                    "producer_id": -1,
                    "producer_epoch": -1,
                },
            )
        except BrokerConnectionError:
            await self.agent.cluster.forget(conn)
            raise
        code = ErrorCode.from_wire(int(response.error_code))
        if code is not ErrorCode.NONE:
            raise broker_error(code, context="InitProducerId")
        self.batch = None
        self.queue.in_flight_end = None
        # Persisted before the first batch under the new id is sent, and used only once
        # persisted: a batch sent under an id a restart does not know would be sent again
        # under another id after the restart.
        await self._commit(
            self.pos, self.n, 0, producer=(int(response.producer_id), int(response.producer_epoch))
        )
        self.must_resolve = False
        _log.info(
            "%s-%d: producer id %d epoch %d",
            self.topic,
            self.partition,
            self.producer_id,
            self.producer_epoch,
        )

    async def _resolve(self, pos: int, n: int, next_seq: int, *, repeat: bool = True) -> int:
        """Ask the leader which of our entries from ``n`` it holds, and deliver them.

        With ``repeat``, they become the batch in flight, sent again exactly as the broker
        holds them (same sequences): the repeat of its last batch is answered with that
        batch's offset once it is durable there (acks=all), or written again if the broker
        lost it since it answered (a failover before replication, its own crash before its
        fsync). DescribeProducers reports a batch before it is durable, so its answer alone
        is not proof of delivery. Without ``repeat`` (or when those entries cannot be read
        as one batch), the read position moves past them at once (offset -1).

        Returns how many it holds, or -1 when the broker's last sequence for our producer
        lies before ``next_seq - 1`` (it lost batches it had acknowledged) or it has no state
        for us while we expected some.
        """
        cluster = self.agent.cluster
        try:
            conn = await cluster.leader_connection(self.topic, self.partition)
        except ClientError:
            await self.agent.refresh_topic(self.topic)
            raise
        if not conn.supports(ApiKey.DESCRIBE_PRODUCERS):
            _log.warning("%s does not serve DescribeProducers; resending in doubt", conn)
            return 0
        try:
            response = await conn.call(
                ApiKey.DESCRIBE_PRODUCERS,
                {"topics": [{"name": self.topic, "partition_indexes": [self.partition]}]},
            )
        except BrokerConnectionError:
            await cluster.forget(conn)
            raise
        last_seq: int | None = None
        for t in response.topics:
            for p in t.partitions:
                if int(p.partition_index) != self.partition:
                    continue
                code = ErrorCode.from_wire(int(p.error_code))
                if code is not ErrorCode.NONE:
                    if code in STALE_METADATA_CODES:
                        await self.agent.refresh_topic(self.topic)
                    raise broker_error(code, context="DescribeProducers")
                for state in p.active_producers:
                    if (
                        int(state.producer_id) == self.producer_id
                        and int(state.producer_epoch) == self.producer_epoch
                    ):
                        last_seq = int(state.last_sequence)
        if last_seq is None:
            # No state: nothing of ours there (or it expired: the documented window).
            return 0 if next_seq == 0 else -1
        held = (last_seq - next_seq + 1) % SEQ_MOD
        pending = self.queue.durable_n - n
        if held == 0:
            return 0
        if held > pending:
            return -1  # last_seq is before next_seq - 1
        if repeat:
            entries = self.queue.read(pos, n, self.batch_size)[:held]
            if len(entries) == held and self._make_batch(entries, repeat=True):
                _log.info(
                    "%s-%d: the broker holds %d in-doubt event(s); sending them again as "
                    "its batch, for their offsets",
                    self.topic,
                    self.partition,
                    held,
                )
                return held
        target_pos, target_n = self.queue.locate(pos, n, n + held)
        if target_n < n + held:
            return -1
        # Past it: the broker's last entry lies in damaged data here. What it holds is
        # delivered; the damaged entries after those can never be sent: dropped.
        lost = (n + held, target_n) if target_n > n + held else None
        _log.info(
            "%s-%d: the broker already holds %d in-doubt event(s); not sending them again",
            self.topic,
            self.partition,
            held,
        )
        self.duplicates_avoided += held
        self.delivered += held
        await self._commit(
            target_pos, target_n, (next_seq + held) % SEQ_MOD, (n, held, -1), refused=lost
        )
        self.agent.run_callbacks(self, n, held, -1)
        return held

    # ------------------------------------------------------------------ queries

    def offset_of(self, number: int) -> tuple[str, int]:
        """("pending" | "delivered" | "unknown", offset or -1) of entry ``number``."""
        if self.queue.was_dropped(number):
            return "dropped", -1
        # The queue's cursor moves (under its lock, with the offset index) before this
        # sender's own read position catches up on the loop.
        if number >= max(self.n, self.queue.cursor.read_n):
            if number < self.queue.durable_n:
                return "pending", -1
            return "unknown", -1
        # Below the read position: delivered (or skipped, counted above); the offset comes
        # from the queue's persisted index while it holds the batch.
        offset = self.queue.delivered_offset(number)
        return "delivered", -1 if offset is None else offset

    def status(self) -> dict[str, Any]:
        q = self.queue
        return {
            "topic": self.topic,
            "partition": self.partition,
            "depth": q.depth(),
            "bytes": q.used_bytes,
            "oldest_age_s": round(q.oldest_age(), 3),
            "appended": q.appended,
            "delivered": self.delivered,
            "batches": self.batches,
            # Events sent and not yet answered, and those of them whose outcome is unknown
            # (a send timed out or its connection was lost): at most one batch.
            "in_flight": 0 if self.batch is None else self.batch.count,
            "in_doubt": self.batch.count if self.batch is not None and self.batch.in_doubt else 0,
            "duplicates_avoided": self.duplicates_avoided,
            "dropped": q.dropped,
            "rejected": self.rejected,
            "corrupt": q.corrupt,
            "disk_full": q.disk_full,
            "disk_full_waits": q.disk_full_waits,
            "fsyncs": q.fsyncs,
            "retries": self.retries,
            "producer_id": self.producer_id,
            "last_error": self.last_error,
            "time": time.time(),
        }
