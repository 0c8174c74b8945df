"""AIOConsumer: a consumer of manually assigned partitions or, with ``group.id``, of the
partitions its consumer group gives it.

Partition state. For each assigned partition the consumer keeps the *fetch position* (offset of
the next record to fetch; None means "resolve by ``auto.offset.reset``": earliest/latest via
ListOffsets, ``none`` raises) and a buffer of fetched records not yet returned. The *position*
a caller sees (and what ``commit()`` commits) is the offset of the first buffered record, or
the fetch position when the buffer is empty, so that skipped control batches move it too.
Partitions with buffered records, paused partitions and partitions without a position are not
fetched.

Fetching. One Fetch per partition leader (no fetch session: session id 0, epoch -1), answers
decoded one batch at a time: each batch is validated (CRC when ``check.crcs``), decoded whole,
and only records at or after the position it was fetched from are kept (an answer for a
partition whose position moved meanwhile is dropped). Control batches advance the position
without yielding records, and so, with ``isolation.level=read_committed``, do the batches of
the aborted transactions the answer lists (:mod:`tidelog.client.aborted`). A last batch cut short by the fetch size is left for the next fetch.
Fetch v13+ names topics by id; without an id for a topic the request is sent as v12. A fetch
runs as its own task: :meth:`AIOConsumer.wakeup` ends the waiting poll with
:class:`~tidelog.client.membership.WakeupError` without abandoning the fetch, whose records the
next poll returns. Like the Java client, a poll that returns records first sends the next fetch
for the partitions it emptied, so that the broker prepares it while the caller works; its
failure is raised by the next poll.

Per-record work. The records of a batch become :class:`ConsumerRecord` tuples in one pass of C
iterators (no Python frame per record), a partition's records wait in one list with a read
index (:class:`_Fetched`), and a poll takes them as slices of that list.

Groups (see :mod:`tidelog.client.membership`). ``subscribe`` joins from the next ``poll``.
Rebalance callbacks and their effects run inside ``poll``: with the eager protocol every
partition is revoked (offsets auto-committed first) before JoinGroup; with the cooperative one
only the partitions the new assignment takes away are revoked, after which the member rejoins
at once. Newly assigned partitions start at the group's committed offsets. Partitions whose
membership ended (session expiry, fencing, a poll gap over ``max.poll.interval.ms``) are
*lost*, not revoked, and their offsets are not committed. JoinGroup runs as a task that a poll
waits for at most its timeout; a later poll picks the result up. The leader (and any member
subscribed by pattern) rejoins when the metadata, refreshed every ``metadata.max.age.ms``, shows
different partition counts or a different set of matching topics.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import inspect
import logging
import re
import time
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Awaitable, Iterable, Mapping
from operator import attrgetter
from typing import Any

from tidelog.client.aborted import AbortedTransactions
from tidelog.client.assignors import COOPERATIVE, assignors_for, rebalance_protocol
from tidelog.client.cluster import STALE_METADATA_CODES, ClusterClient
from tidelog.client.config import parse_config
from tidelog.client.errors import (
    BrokerConnectionError,
    ClientClosedError,
    ClientError,
    PartialFailureError,
    broker_error,
)
from tidelog.client.groups import ConsumerGroupMetadata, OffsetAndMetadata
from tidelog.client.membership import (
    COORDINATOR_RETRY_CODES,
    CommitFailedError,
    CoordinatorLink,
    GroupMembership,
    RebalanceListener,
    State,
    WakeupError,
)
from tidelog.client.offsets import EARLIEST, LATEST, OffsetSpec, list_offsets
from tidelog.client.types import ConsumerRecord, ListOffsetsResult, TopicPartition
from tidelog.protocol import ApiKey, ErrorCode
from tidelog.records import RecordsError, TruncatedBatchError, decode_rows, iter_batches

log = logging.getLogger(__name__)

# v10 of these names topics only by id.
_MAX_OFFSET_FETCH_VERSION = 9
_MAX_OFFSET_COMMIT_VERSION = 9
# A commit that finds the member outside the group's current generation.
_MEMBERSHIP_CODES = frozenset(
    {ErrorCode.ILLEGAL_GENERATION, ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.FENCED_INSTANCE_ID}
)

Offsets = Mapping[TopicPartition, OffsetAndMetadata | int]


_offset_of = attrgetter("offset")


class _Fetched:
    """The fetched records of one partition that poll has not returned yet:
    ``records[start:]``, never empty while the consumer keeps it."""

    __slots__ = ("records", "start")

    def __init__(self, records: list[ConsumerRecord]) -> None:
        self.records = records
        self.start = 0

    def __len__(self) -> int:
        return len(self.records) - self.start

    @property
    def next_offset(self) -> int:
        return self.records[self.start].offset

    def take(self, n: int) -> list[ConsumerRecord]:
        end = self.start + n
        taken = self.records[self.start : end]
        self.start = min(end, len(self.records))
        return taken


async def _maybe_await(result: Any) -> None:
    if inspect.isawaitable(result):
        await result


class AIOConsumer:
    """Reads assigned partitions; ``config`` takes Kafka's consumer property names."""

    def __init__(self, config: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        self.config = parse_config("consumer", config, **kwargs)
        self.cluster = ClusterClient(self.config)
        c = self.config
        self._reset: str = c["auto.offset.reset"]
        self._isolation = 1 if c["isolation.level"] == "read_committed" else 0
        self._check_crcs: bool = c["check.crcs"]
        self._positions: dict[TopicPartition, int | None] = {}
        self._buffers: dict[TopicPartition, _Fetched] = {}
        self._paused: set[TopicPartition] = set()
        self._fetch_task: asyncio.Task[None] | None = None
        self._wakeup = asyncio.Event()
        self._closed = False
        # Group state.
        self.group_id: str | None = c["group.id"]
        self._link: CoordinatorLink | None = None
        self._membership: GroupMembership | None = None
        self._assignors = assignors_for(c["partition.assignment.strategy"])
        self._protocol = rebalance_protocol(self._assignors)
        if self.group_id is not None:
            self._link = CoordinatorLink(self.cluster, self.group_id, c)
            self._membership = GroupMembership(
                self._link, c, self._assignors, self._partition_counts
            )
        self._subscription: frozenset[str] = frozenset()
        self._pattern: re.Pattern[str] | None = None
        self._listener: RebalanceListener | None = None
        self._join_task: asyncio.Task[list[TopicPartition]] | None = None
        self._auto_commit: bool = bool(c["enable.auto.commit"]) and self.group_id is not None
        self._next_auto_commit = time.monotonic() + c["auto.commit.interval.ms"] / 1000
        self._commit_tasks: set[asyncio.Task[Any]] = set()
        # The fetcher refreshes metadata of the partitions it reads; the group checks its own.
        self._next_metadata_check = time.monotonic() + c["metadata.max.age.ms"] / 1000

    async def __aenter__(self) -> AIOConsumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- assignment and positions ------------------------------------------------------------

    @property
    def subscribed(self) -> bool:
        return bool(self._subscription) or self._pattern is not None

    def assign(self, partitions: Iterable[TopicPartition | tuple[str, int]]) -> None:
        """Replace the assignment; partitions kept keep their positions. Not with subscribe."""
        if self.subscribed:
            raise ClientError("assign() cannot be used while subscribed; unsubscribe() first")
        self._set_assignment([TopicPartition(*tp) for tp in partitions])

    def _set_assignment(self, wanted: Iterable[TopicPartition]) -> None:
        wanted = list(wanted)
        self._positions = {tp: self._positions.get(tp) for tp in wanted}
        self._buffers = {tp: b for tp, b in self._buffers.items() if tp in self._positions}
        self._paused &= set(wanted)

    def assignment(self) -> set[TopicPartition]:
        return set(self._positions)

    def _check_assigned(self, tp: TopicPartition) -> TopicPartition:
        tp = TopicPartition(*tp)
        if tp not in self._positions:
            raise ClientError(f"partition {tp} is not assigned")
        return tp

    def _consumed(self, tp: TopicPartition) -> int | None:
        """The position: offset of the next record poll would return."""
        buffered = self._buffers.get(tp)
        if buffered is not None:
            return buffered.next_offset
        return self._positions.get(tp)

    def _move(self, tp: TopicPartition, offset: int | None) -> None:
        self._positions[tp] = offset
        self._buffers.pop(tp, None)

    def seek(self, partition: TopicPartition | tuple[str, int], offset: int) -> None:
        """Next poll returns records of ``partition`` from ``offset`` on."""
        tp = self._check_assigned(TopicPartition(*partition))
        if offset < 0:
            raise ValueError(f"offset must not be negative, got {offset}")
        self._move(tp, offset)

    async def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        await self._seek_spec({tp: "earliest" for tp in partitions or self._positions})

    async def seek_to_end(self, *partitions: TopicPartition) -> None:
        await self._seek_spec({tp: "latest" for tp in partitions or self._positions})

    async def seek_to_timestamp(self, timestamp_ms: int, *partitions: TopicPartition) -> None:
        """Each partition to its first offset with a timestamp >= ``timestamp_ms`` (or its end)."""
        await self._seek_spec({tp: timestamp_ms for tp in partitions or self._positions})

    async def _seek_spec(self, specs: Mapping[TopicPartition, OffsetSpec]) -> None:
        wanted = {self._check_assigned(TopicPartition(*tp)): s for tp, s in specs.items()}
        answers = await self._offsets(wanted)
        latest_needed = {
            tp: "latest" for tp, a in answers.items() if a.offset < 0
        }  # no record at or after the timestamp: the end
        if latest_needed:
            answers.update(await self._offsets(latest_needed))
        for tp, answer in answers.items():
            if tp in self._positions:
                self._move(tp, answer.offset)

    async def _offsets(
        self, specs: Mapping[TopicPartition, OffsetSpec]
    ) -> dict[TopicPartition, ListOffsetsResult]:
        answers = await list_offsets(self.cluster, specs, isolation_level=self._isolation)
        out: dict[TopicPartition, ListOffsetsResult] = {}
        for tp, answer in answers.items():
            if isinstance(answer, ClientError):
                raise answer
            out[tp] = answer
        return out

    async def offsets_for_times(
        self, timestamps: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, ListOffsetsResult | None]:
        """For each partition, the first offset with a timestamp >= the given one (or None)."""
        answers = await self._offsets(timestamps)
        return {tp: (a if a.offset >= 0 else None) for tp, a in answers.items()}

    async def beginning_offsets(
        self, partitions: Iterable[TopicPartition]
    ) -> dict[TopicPartition, int]:
        answers = await self._offsets({TopicPartition(*tp): EARLIEST for tp in partitions})
        return {tp: a.offset for tp, a in answers.items()}

    async def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        answers = await self._offsets({TopicPartition(*tp): LATEST for tp in partitions})
        return {tp: a.offset for tp, a in answers.items()}

    async def position(self, partition: TopicPartition | tuple[str, int]) -> int:
        tp = self._check_assigned(TopicPartition(*partition))
        await self._resolve_positions()
        position = self._consumed(tp)
        assert position is not None
        return position

    async def _resolve_positions(self) -> None:
        unknown = [tp for tp, pos in self._positions.items() if pos is None]
        if not unknown:
            return
        if self.group_id is not None and not self.subscribed:
            # Manually assigned partitions of a group start at its committed offsets too.
            committed = await self.committed(unknown)
            for tp, found in committed.items():
                if found is not None and tp in self._positions and self._positions[tp] is None:
                    self._positions[tp] = found.offset
            unknown = [tp for tp in unknown if self._positions.get(tp) is None]
            if not unknown:
                return
        if self._reset == "none":
            raise ClientError(
                f"no position for {', '.join(map(str, unknown))} and auto.offset.reset=none",
                code=ErrorCode.OFFSET_OUT_OF_RANGE,
            )
        answers = await self._offsets(dict.fromkeys(unknown, self._reset))
        for tp, answer in answers.items():
            if tp in self._positions and self._positions[tp] is None:
                self._positions[tp] = answer.offset

    # -- pause, resume, wakeup -----------------------------------------------------------------

    def pause(self, *partitions: TopicPartition) -> None:
        """Stop fetching and returning records of ``partitions`` until :meth:`resume`."""
        self._paused.update(self._check_assigned(TopicPartition(*tp)) for tp in partitions)

    def resume(self, *partitions: TopicPartition) -> None:
        self._paused.difference_update(TopicPartition(*tp) for tp in partitions)

    def paused(self) -> set[TopicPartition]:
        return set(self._paused)

    def wakeup(self) -> None:
        """Make the running (or else the next) poll raise WakeupError. Call it on the loop."""
        self._wakeup.set()

    def _check_wakeup(self) -> None:
        if self._wakeup.is_set():
            self._wakeup.clear()
            raise WakeupError("poll was woken up")

    async def _wait(self, task: asyncio.Future[Any] | None, deadline: float) -> None:
        """Wait for ``task`` (or just time) until ``deadline``; a wakeup raises WakeupError."""
        left = deadline - time.monotonic()
        waker = asyncio.ensure_future(self._wakeup.wait())
        try:
            waiting: set[asyncio.Future[Any]] = {waker}
            if task is not None:
                waiting.add(task)
            await asyncio.wait(waiting, timeout=max(0.0, left), return_when=asyncio.FIRST_COMPLETED)
        finally:
            waker.cancel()
        self._check_wakeup()

    # -- subscriptions -------------------------------------------------------------------------

    def group_metadata(self) -> ConsumerGroupMetadata:
        """This member as a transactional producer's ``send_offsets_to_transaction`` names
        it (KIP-447): the group, and the member id and generation while subscribed."""
        group, _ = self._require_group()
        membership = self._membership
        if membership is None or not self.subscribed or not membership.member_id:
            return ConsumerGroupMetadata(group)
        return ConsumerGroupMetadata(
            group,
            membership.generation,
            membership.member_id,
            self.config["group.instance.id"],
        )

    def subscribe(
        self,
        topics: Iterable[str] | str | None = None,
        *,
        pattern: str | re.Pattern[str] | None = None,
        listener: RebalanceListener | None = None,
    ) -> None:
        """Consume ``topics`` (or every topic whose whole name matches ``pattern``; a single
        topic string starting with ``^`` is taken as a pattern) as a member of ``group.id``."""
        if self._membership is None:
            raise ClientError("subscribe() needs group.id; use assign() without a group")
        if isinstance(topics, str):
            if topics.startswith("^"):
                pattern, topics = topics, None
            else:
                topics = [topics]
        names = frozenset(topics or ())
        if bool(names) == (pattern is not None):
            raise ValueError("subscribe to a list of topics or to a pattern (exactly one)")
        if not self.subscribed and self._positions:
            raise ClientError("subscribe() cannot be used after assign(); assign([]) first")
        if pattern is not None:
            self._pattern = re.compile(pattern) if isinstance(pattern, str) else pattern
            self._subscription = frozenset()
        else:
            self._pattern = None
            self._subscription = names
        self._listener = listener
        self._membership.need_rejoin = True

    def subscription(self) -> set[str]:
        return set(self._subscription)

    async def unsubscribe(self) -> None:
        """Give the partitions back (revoking them) and leave the group."""
        if self._membership is None or not self.subscribed:
            return
        await self._cancel_join()
        await self._revoke(sorted(self._positions))
        self._subscription = frozenset()
        self._pattern = None
        await self._membership.leave("the consumer unsubscribed")
        self._membership.lost = False

    async def _partition_counts(self, topics: Iterable[str]) -> dict[str, int]:
        wanted = sorted(set(topics))
        if wanted:
            await self.cluster.refresh(wanted)
        md = self.cluster.metadata
        return {t: len(md.topics[t].partitions) for t in wanted if t in md.topics}

    async def _resolve_pattern(self) -> None:
        assert self._pattern is not None and self._membership is not None
        await self.cluster.refresh(None)
        exclude_internal = self.config["exclude.internal.topics"]
        matched = frozenset(
            name
            for name, info in self.cluster.metadata.topics.items()
            if self._pattern.fullmatch(name) and not (exclude_internal and info.is_internal)
        )
        if matched != self._subscription:
            self._subscription = matched
            self._membership.need_rejoin = True

    async def _check_metadata(self) -> None:
        """Rejoin when the subscribed topics or their partition counts changed."""
        membership = self._membership
        assert membership is not None
        now = time.monotonic()
        if now < self._next_metadata_check or membership.state is not State.STABLE:
            return
        self._next_metadata_check = now + self.config["metadata.max.age.ms"] / 1000
        try:
            if self._pattern is not None:
                await self._resolve_pattern()
            if membership.is_leader and membership.group_topics:
                counts = await self._partition_counts(membership.group_topics)
                if counts != {t: c for t, c in membership.assigned_counts.items() if c}:
                    membership.need_rejoin = True
            elif self._pattern is None:
                await self.cluster.refresh(self._subscription)
        except ClientError as exc:
            log.debug("group %r: metadata refresh failed: %s", self.group_id, exc)

    async def _call_listener(self, method: str, partitions: list[TopicPartition]) -> None:
        if self._listener is None or not partitions:
            return
        try:
            await _maybe_await(getattr(self._listener, method)(partitions))
        except Exception:
            log.exception("group %r: rebalance listener %s failed", self.group_id, method)

    async def _revoke(self, partitions: list[TopicPartition]) -> None:
        """Hand ``partitions`` back in order: commit (auto commit), tell the listener, drop."""
        if not partitions:
            return
        if self._auto_commit:
            await self._commit_quietly(self._consumed_offsets(partitions))
        await self._call_listener("on_revoked", partitions)
        keep = [tp for tp in self._positions if tp not in set(partitions)]
        self._set_assignment(keep)

    async def _lose(self) -> None:
        assert self._membership is not None
        self._membership.lost = False
        lost = sorted(self._positions)
        if lost:
            await self._call_listener("on_lost", lost)
        self._set_assignment([])

    async def _cancel_join(self) -> None:
        task, self._join_task = self._join_task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, ClientError):
                await task

    async def _group_step(self, deadline: float) -> None:
        """Advance the membership: act on lost partitions, start or finish a rejoin."""
        membership = self._membership
        assert membership is not None
        if membership.error is not None:
            raise membership.error
        if membership.lost:
            await self._cancel_join()
            await self._lose()
        if self._join_task is None:
            await self._check_metadata()
            if not membership.need_rejoin and membership.state is State.STABLE:
                return
            if self._pattern is not None:
                await self._resolve_pattern()
            if self._protocol != COOPERATIVE:
                await self._revoke(sorted(self._positions))
            topics = sorted(self._subscription)
            owned = sorted(self._positions)
            self._join_task = asyncio.get_running_loop().create_task(membership.join(topics, owned))
        if not self._join_task.done() and not self._positions:
            await self._wait(self._join_task, deadline)
        if self._join_task.done():
            task, self._join_task = self._join_task, None
            try:
                assigned = task.result()
            except ClientError as exc:
                if not exc.retriable:
                    raise
                # The coordinator stayed out of reach for the whole join: the next poll
                # tries again, as Kafka's consumer keeps trying while it polls.
                log.warning("group %r: joining failed, will retry: %s", self.group_id, exc)
                membership.state = State.UNJOINED
                membership.need_rejoin = True
                return
            await self._finish_join(assigned)

    async def _finish_join(self, assigned: list[TopicPartition]) -> None:
        membership = self._membership
        assert membership is not None
        new = set(assigned)
        revoked = sorted(tp for tp in self._positions if tp not in new)
        added = sorted(tp for tp in new if tp not in self._positions)
        if revoked:
            await self._revoke(revoked)
            if self._protocol == COOPERATIVE:
                membership.need_rejoin = True  # so that the revoked partitions move on
        if added:
            try:
                committed = await self.committed(added)
            except ClientError as exc:
                # Not taken up: the next join reports them as not owned and they are reassigned.
                log.warning("group %r: reading committed offsets failed: %s", self.group_id, exc)
                membership.need_rejoin = True
                return
            for tp in added:
                found = committed.get(tp)
                self._positions[tp] = None if found is None else found.offset
            await self._call_listener("on_assigned", added)

    # -- polling -----------------------------------------------------------------------------

    async def poll(
        self, timeout_ms: int = 0, max_records: int | None = None
    ) -> list[ConsumerRecord]:
        """Records of the assigned partitions; waits at most ``timeout_ms`` for some."""
        if self._closed:
            raise ClientClosedError("the consumer is closed")
        self._check_wakeup()
        limit = self.config["max.poll.records"] if max_records is None else max_records
        deadline = time.monotonic() + timeout_ms / 1000
        membership = self._membership if self.subscribed else None
        if membership is not None:
            membership.poll_started()
        try:
            if self._auto_commit and time.monotonic() >= self._next_auto_commit:
                self._next_auto_commit = (
                    time.monotonic() + self.config["auto.commit.interval.ms"] / 1000
                )
                if self._positions and (membership is None or membership.state is State.STABLE):
                    self._commit_in_background(self._consumed_offsets())
            self._finish_fetch()
            while True:
                if membership is not None:
                    await self._group_step(deadline)
                if self._ready():
                    break
                if self._fetchable():
                    await self._resolve_positions()
                    if self._fetch_task is None:
                        left_ms = int((deadline - time.monotonic()) * 1000)
                        wait_ms = max(0, min(left_ms, self.config["fetch.max.wait.ms"]))
                        self._fetch_task = asyncio.get_running_loop().create_task(
                            self._fetch(wait_ms)
                        )
                    await self._wait(self._fetch_task, deadline)
                    self._finish_fetch()
                elif membership is not None and self._join_task is not None:
                    await self._wait(self._join_task, deadline)
                else:
                    await self._wait(None, min(deadline, time.monotonic() + 0.1))
                if self._ready() or time.monotonic() >= deadline:
                    break
            records = self._drain(limit)
            if records:
                self._prefetch()
            return records
        finally:
            if membership is not None:
                membership.poll_finished()

    def _finish_fetch(self) -> None:
        """Forget the fetch task once it is done, raising what it raised."""
        task = self._fetch_task
        if task is not None and task.done():
            self._fetch_task = None
            task.result()

    def _prefetch(self) -> None:
        """Send the next fetch now when partitions with a known position have nothing
        buffered, instead of at the next poll, so the broker works while the caller does.

        While other partitions still hold records, the fetch asks the broker not to wait:
        one fetch is in flight at a time, and a request for partitions that are at their
        end would otherwise park at the broker for fetch.max.wait.ms, holding back the
        fetch the still-buffered partitions need once the caller has drained them
        (measured: a 500 ms stall per drained topic, a third of the consumer's speed)."""
        if self._fetch_task is not None:
            return
        buffers, paused = self._buffers, self._paused
        fetchable = still_buffered = False
        for tp, position in self._positions.items():
            if tp in paused:
                continue
            if tp in buffers:
                still_buffered = True
            elif position is not None:
                fetchable = True
        if fetchable:
            wait_ms = 0 if still_buffered else self.config["fetch.max.wait.ms"]
            self._fetch_task = asyncio.get_running_loop().create_task(self._fetch(wait_ms))

    def _ready(self) -> bool:
        paused = self._paused
        return any(tp not in paused for tp in self._buffers)

    def _fetchable(self) -> bool:
        buffers, paused = self._buffers, self._paused
        return any(tp not in paused and tp not in buffers for tp in self._positions)

    def _drain(self, limit: int) -> list[ConsumerRecord]:
        out: list[ConsumerRecord] = []
        emptied = False
        for tp, buffered in self._buffers.items():
            room = limit - len(out)
            if room <= 0:
                break
            if tp in self._paused:
                continue
            out += buffered.take(room)
            emptied = emptied or not buffered
        if emptied:
            # A partition refilled later goes to the end of the order: each gets its turn.
            self._buffers = {tp: b for tp, b in self._buffers.items() if b}
        return out

    async def _fetch(self, max_wait_ms: int) -> None:
        by_leader: dict[int, list[TopicPartition]] = defaultdict(list)
        missing: set[str] = set()
        wanted = [
            tp
            for tp, position in self._positions.items()
            if position is not None and tp not in self._paused and tp not in self._buffers
        ]
        for tp in wanted:
            leader = self.cluster.metadata.leader(tp.topic, tp.partition)
            if leader is None:
                missing.add(tp.topic)
            else:
                by_leader[leader].append(tp)
        if missing or self.cluster.stale():
            try:
                await self.cluster.refresh(missing or {tp.topic for tp in wanted})
            except ClientError:
                await asyncio.sleep(self.config["retry.backoff.ms"] / 1000)
                return
            for tp in wanted:
                leader = self.cluster.metadata.leader(tp.topic, tp.partition)
                if leader is not None and tp.topic in missing:
                    by_leader[leader].append(tp)
        if not by_leader:
            await asyncio.sleep(min(max_wait_ms, self.config["retry.backoff.ms"]) / 1000)
            return
        results = await asyncio.gather(
            *(self._fetch_from(leader, tps, max_wait_ms) for leader, tps in by_leader.items()),
            return_exceptions=True,
        )
        for result in results:
            if isinstance(result, BaseException):
                if isinstance(result, ClientError) and result.retriable:
                    await asyncio.sleep(self.config["retry.backoff.ms"] / 1000)
                    continue
                raise result

    async def _fetch_from(self, leader: int, tps: list[TopicPartition], max_wait_ms: int) -> None:
        c = self.config
        conn = await self.cluster.connection(leader)
        # Connecting took a while: the partitions may have been revoked, lost or moved by now.
        tps = [tp for tp in tps if self._positions.get(tp) is not None]
        if not tps:
            return
        version = conn.version(ApiKey.FETCH)
        ids = {tp.topic: self.cluster.metadata.topic_id(tp.topic) for tp in tps}
        if version >= 13 and None in ids.values():
            version = 12
        names_by_id: dict[Any, str] = {v: k for k, v in ids.items() if v is not None}
        requested = {tp: self._positions[tp] for tp in tps}
        topics: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for tp in tps:
            topics[tp.topic].append(
                {
                    "partition": tp.partition,
                    "fetch_offset": requested[tp],
                    "partition_max_bytes": c["max.partition.fetch.bytes"],
                    "log_start_offset": -1,
                    "current_leader_epoch": -1,
                    "last_fetched_epoch": -1,
                }
            )
        values = {
            "replica_id": -1,
            "max_wait": max_wait_ms,
            "min_bytes": c["fetch.min.bytes"],
            "max_bytes": c["fetch.max.bytes"],
            "isolation_level": self._isolation,
            "session_id": 0,
            "session_epoch": -1,
            "topics": [
                {"topic": t, "topic_id": ids[t], "partitions": parts} for t, parts in topics.items()
            ],
            "forgotten_topics_data": [],
            "rack_id": c["client.rack"],
        }
        try:
            response = await conn.call(
                ApiKey.FETCH,
                values,
                version=version,
                timeout_ms=c["request.timeout.ms"] + max_wait_ms,
            )
        except BrokerConnectionError:
            await self.cluster.forget(conn)
            raise
        top = ErrorCode.from_wire(int(getattr(response, "error_code", 0)))
        if top is not ErrorCode.NONE:
            raise broker_error(top, context="fetch")
        stale = False
        for t in response.responses:
            name = getattr(t, "topic", None) or names_by_id.get(getattr(t, "topic_id", None))
            if name is None:
                continue
            for p in t.partitions:
                tp = TopicPartition(name, int(p.partition_index))
                position = self._positions.get(tp)
                if position is None or position != requested.get(tp) or tp in self._buffers:
                    continue  # no longer assigned, or moved since the fetch was sent
                code = ErrorCode.from_wire(int(p.error_code))
                if code is ErrorCode.OFFSET_OUT_OF_RANGE:
                    if self._reset == "none":
                        raise broker_error(code, context=f"{tp} at offset {position}")
                    self._positions[tp] = None
                    continue
                if code is not ErrorCode.NONE:
                    if code in STALE_METADATA_CODES:
                        stale = True
                        continue
                    if code.retriable:
                        continue
                    raise broker_error(code, context=str(tp))
                if p.records:
                    aborted = None
                    if self._isolation:
                        aborted = AbortedTransactions(
                            (int(a.producer_id), int(a.first_offset))
                            for a in getattr(p, "aborted_transactions", None) or ()
                        )
                    self._take(tp, position, p.records, aborted)
        if stale:
            await self.cluster.refresh({tp.topic for tp in tps})

    def _take(
        self,
        tp: TopicPartition,
        position: int,
        data: bytes,
        aborted: AbortedTransactions | None = None,
    ) -> None:
        """Buffer the records of ``data`` from ``position`` on; with ``aborted``
        (read_committed) without those of aborted transactions."""
        topic, partition = tp
        out: list[ConsumerRecord] = []
        # Decoding makes a tuple per record: with the collector running, a young-generation
        # collection every 700 of them would scan the records just made (measured at a third
        # of the decoding time). It is paused for this one response, which fetch.max.bytes
        # bounds, and runs once afterwards; an application that disabled it keeps it so.
        collecting = gc.isenabled()
        if collecting:
            gc.disable()
        try:
            for pos, header in iter_batches(data, verify_crc=self._check_crcs):
                # Asked of every batch, in order: it follows the aborted transactions' ends.
                skipped = header.is_control if aborted is None else aborted.skips(data, pos, header)
                if header.last_offset < position:
                    continue
                if not skipped:
                    records = decode_rows(
                        data, pos, ConsumerRecord, topic, partition, header=header
                    )
                    if header.base_offset < position:  # the fetch began inside this batch
                        records = records[bisect_left(records, position, key=_offset_of) :]
                    out += records
                position = header.next_offset
        except TruncatedBatchError:
            pass  # the last batch was cut by the size limit; the next fetch starts at it
        except RecordsError as exc:
            raise ClientError(
                f"{tp}: corrupt record batch after offset {position}: {exc}",
                code=ErrorCode.CORRUPT_MESSAGE,
            ) from exc
        finally:
            if collecting:
                gc.enable()
            self._positions[tp] = position
            if out:
                self._buffers[tp] = _Fetched(out)

    # -- committed offsets ---------------------------------------------------------------------

    def _require_group(self) -> tuple[str, CoordinatorLink]:
        if self.group_id is None or self._link is None:
            raise ClientError("committed offsets need group.id")
        return self.group_id, self._link

    def _consumed_offsets(
        self, partitions: Iterable[TopicPartition] | None = None
    ) -> dict[TopicPartition, OffsetAndMetadata]:
        chosen = self._positions if partitions is None else partitions
        out: dict[TopicPartition, OffsetAndMetadata] = {}
        for tp in chosen:
            position = self._consumed(tp)
            if position is not None:
                out[tp] = OffsetAndMetadata(position, "")
        return out

    async def commit(
        self, offsets: Offsets | None = None, *, asynchronous: bool = False
    ) -> (
        dict[TopicPartition, OffsetAndMetadata]
        | asyncio.Task[dict[TopicPartition, OffsetAndMetadata]]
    ):
        """Commit ``offsets`` (default: the position of every assigned partition, i.e. after
        every record poll has returned). Synchronous: returns what was committed. Asynchronous:
        returns the task doing it at once (commits are sent in the order they are made)."""
        if offsets is None:
            commits = self._consumed_offsets()
        else:
            commits = {
                TopicPartition(*tp): (
                    o if isinstance(o, OffsetAndMetadata) else OffsetAndMetadata(int(o))
                )
                for tp, o in offsets.items()
            }
        for tp, o in commits.items():
            if o.offset < 0:
                raise ValueError(f"offset {o.offset} for {tp}: offsets are not negative")
        if asynchronous:
            return self._commit_in_background(commits)
        return await self._commit(commits)

    def _commit_in_background(
        self, commits: dict[TopicPartition, OffsetAndMetadata]
    ) -> asyncio.Task[dict[TopicPartition, OffsetAndMetadata]]:
        task = asyncio.get_running_loop().create_task(self._commit(commits))
        self._commit_tasks.add(task)

        def done(t: asyncio.Task[Any]) -> None:
            self._commit_tasks.discard(t)
            if not t.cancelled() and (error := t.exception()) is not None:
                log.warning("group %r: asynchronous commit failed: %s", self.group_id, error)

        task.add_done_callback(done)
        return task

    async def _commit_quietly(self, commits: dict[TopicPartition, OffsetAndMetadata]) -> None:
        if not commits:
            return
        try:
            await self._commit(commits)
        except ClientError as exc:
            log.warning("group %r: commit failed: %s", self.group_id, exc)

    async def _commit(
        self, commits: dict[TopicPartition, OffsetAndMetadata]
    ) -> dict[TopicPartition, OffsetAndMetadata]:
        group, link = self._require_group()
        if not commits:
            return {}
        membership = self._membership
        generation, member_id = -1, ""
        if membership is not None and self.subscribed:
            generation, member_id = membership.generation, membership.member_id
        by_topic: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for tp, o in sorted(commits.items()):
            by_topic[tp.topic].append(
                {
                    "partition_index": tp.partition,
                    "committed_offset": o.offset,
                    "committed_leader_epoch": o.leader_epoch,
                    "committed_metadata": o.metadata,
                    "commit_timestamp": -1,
                }
            )
        values = {
            "group_id": group,
            "generation_id_or_member_epoch": generation,
            "member_id": member_id,
            "group_instance_id": self.config["group.instance.id"] if member_id else None,
            "retention_time_ms": -1,
            "topics": [{"name": t, "partitions": p} for t, p in by_topic.items()],
        }
        errors: dict[object, ClientError] = {}

        def check(response: Any) -> None:
            errors.clear()
            for t in response.topics:
                for p in t.partitions:
                    tp = TopicPartition(t.name, int(p.partition_index))
                    code = ErrorCode.from_wire(int(p.error_code))
                    if code is ErrorCode.NONE:
                        continue
                    if code in COORDINATOR_RETRY_CODES:
                        raise broker_error(code, context=f"group {group!r}")
                    if code in _MEMBERSHIP_CODES or code is ErrorCode.REBALANCE_IN_PROGRESS:
                        raise CommitFailedError(
                            f"group {group!r}: commit refused ({code.name}): this member is "
                            "not in the group's current generation, its partitions may "
                            "have moved",
                            code=code,
                        )
                    errors[tp] = broker_error(code, context=str(tp))

        try:
            await link.call(
                ApiKey.OFFSET_COMMIT,
                values,
                max_version=_MAX_OFFSET_COMMIT_VERSION,
                check=check,
                deadline=time.monotonic() + self.config["default.api.timeout.ms"] / 1000,
            )
        except CommitFailedError as exc:
            if membership is not None and self.subscribed and generation == membership.generation:
                if exc.code is ErrorCode.REBALANCE_IN_PROGRESS:
                    membership.need_rejoin = True
                else:
                    membership.reset(forget_member=exc.code is not ErrorCode.ILLEGAL_GENERATION)
            raise
        if errors:
            raise PartialFailureError(f"commit for group {group!r}", errors)
        return commits

    async def committed(
        self, partitions: Iterable[TopicPartition]
    ) -> dict[TopicPartition, OffsetAndMetadata | None]:
        """The group's committed offset of each partition (None where it has none)."""
        group, link = self._require_group()
        wanted = [TopicPartition(*tp) for tp in partitions]
        if not wanted:
            return {}
        by_topic: dict[str, list[int]] = defaultdict(list)
        for tp in wanted:
            by_topic[tp.topic].append(tp.partition)
        topics = [{"name": t, "partition_indexes": p} for t, p in by_topic.items()]
        found: dict[TopicPartition, OffsetAndMetadata | None] = {}

        def check(response: Any) -> None:
            found.clear()
            answer = response
            if hasattr(response, "groups"):
                answer = next((g for g in response.groups if g.group_id == group), None)
                if answer is None:
                    raise broker_error(ErrorCode.UNKNOWN_SERVER_ERROR, context=f"group {group!r}")
            code = ErrorCode.from_wire(int(getattr(answer, "error_code", 0)))
            if code is not ErrorCode.NONE:
                raise broker_error(code, context=f"group {group!r}")
            for t in answer.topics:
                for p in t.partitions:
                    tp = TopicPartition(t.name, int(p.partition_index))
                    pcode = ErrorCode.from_wire(int(p.error_code))
                    if pcode is not ErrorCode.NONE:
                        raise broker_error(pcode, context=f"group {group!r} {tp}")
                    offset = int(p.committed_offset)
                    found[tp] = (
                        None
                        if offset < 0
                        else OffsetAndMetadata(
                            offset, p.metadata, int(getattr(p, "committed_leader_epoch", -1))
                        )
                    )

        await link.call(
            ApiKey.OFFSET_FETCH,
            {
                "group_id": group,
                "topics": topics,
                "groups": [{"group_id": group, "topics": topics}],
                "require_stable": False,
            },
            max_version=_MAX_OFFSET_FETCH_VERSION,
            check=check,
            deadline=time.monotonic() + self.config["default.api.timeout.ms"] / 1000,
        )
        return {tp: found.get(tp) for tp in wanted}

    # -- closing -------------------------------------------------------------------------------

    async def close(self) -> None:
        """Commit (with auto commit), revoke, leave the group, and close the connections."""
        if self._closed:
            return
        try:
            if self._membership is not None and self.subscribed:
                await self._cancel_join()
                if self._membership.state is State.STABLE and not self._membership.lost:
                    await self._revoke(sorted(self._positions))
                else:
                    await self._lose()
                await self._membership.leave("the consumer is being closed")
            elif self._auto_commit and self._positions:
                await self._commit_quietly(self._consumed_offsets())
            if self._commit_tasks:
                await asyncio.gather(*self._commit_tasks, return_exceptions=True)
        finally:
            self._closed = True
            for task in (self._fetch_task,):
                if task is not None and not task.done():
                    task.cancel()
                    with contextlib.suppress(BaseException):
                        await task
            if self._membership is not None:
                await self._membership.close()
            if self._link is not None:
                await self._link.close()
            await self.cluster.close()


def listener_in_threads(listener: RebalanceListener) -> RebalanceListener:
    """``listener`` with each callback run in a worker thread, for the synchronous facade: a
    callback may then call the facade (commit, seek) while the loop waits for it."""

    class Threaded(RebalanceListener):
        async def on_assigned(self, partitions: list[TopicPartition]) -> None:
            await _in_thread(listener.on_assigned, partitions)

        async def on_revoked(self, partitions: list[TopicPartition]) -> None:
            await _in_thread(listener.on_revoked, partitions)

        async def on_lost(self, partitions: list[TopicPartition]) -> None:
            await _in_thread(listener.on_lost, partitions)

    return Threaded()


async def _in_thread(method: Any, partitions: list[TopicPartition]) -> None:
    result = await asyncio.to_thread(method, partitions)
    if isinstance(result, Awaitable):
        await result


__all__ = [
    "AIOConsumer",
    "CommitFailedError",
    "RebalanceListener",
    "WakeupError",
    "listener_in_threads",
]
