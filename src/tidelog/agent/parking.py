"""Parked events: a durable home for events of a topic the cluster does not know yet.

An event for a topic without metadata cannot be partitioned, but the caller must get its
durable acknowledgement at once. It goes to the topic's *parked queue*, an ordinary
:class:`~tidelog.agent.queue.DiskQueue` (same entries, CRC, group commit) in
``<data.dir>/parked/<topic>/``; its event id has partition -1. While the parked queue holds
events, every new event of the topic is parked too, so that events keep their order; one
sent with an explicit partition is *pinned* to it. A mover thread per parked queue waits for
the topic's metadata (asking the broker to create the topic when
``allow.auto.create.topics``), then moves the parked events, in chunks, into the partition
queues: a pinned event to its partition, the others partitioned as they would have been (the
client's partitioner: same key, same partition; sticky for events without a key). Once
everything submitted has moved, the queue is sealed under its lock: later events go straight
to the partition queues, after the moved ones.

A parked entry's body is a record body (see :mod:`tidelog.agent.event`), or for a pinned
event ``PINNED i64 (-2**63) | partition i32 | record body``: a record body starts with its
timestamp, which is never negative, so the first 8 bytes tell the two apart.

The move journal ``moves`` (next to the parked queue's files) makes a move exactly-once
across crashes. Records, big-endian::

    kind u8 | length u32 (of payload) | crc u32 (CRC-32C of kind, length, payload) | payload

    PLAN   (1): n0 u64 | n1 u64 | end_pos u64 | partitions i32 | (n1 - n0) x partition i32
    PLACED (2): n0 u64 | partition i32 | first u64 | start u32 | count u32

A chunk is the parked entries ``[n0, n1)`` (up to ``end_pos``). The move of a chunk:

1. append and sync PLAN: which partition each entry goes to (its *group*);
2. for each partition, append the group to the partition queue; under that queue's lock,
   once the entry number ``first`` the group gets is known and before the entries can be
   written, append and sync PLACED (group items ``[start, start + count)`` are entries
   ``first...`` of that partition queue); then wait for the append's group commit;
3. commit the parked queue's read position to ``n1``.

Invariant: the entries of a group are in a partition queue only if a PLACED record for
them is on disk, and they are there contiguous from ``first`` (one append is numbered under
one lock hold). Recovery, for a PLAN whose ``n0`` is the parked read position (a move that
did not reach step 3): per group, the last PLACED record says where its latest append
started; the partition queue's recovered end tells how many of those entries survived
(recovery cut any torn tail, so a surviving prefix, nothing after it); the rest of the group
is appended again (with a new PLACED record), then step 3 runs. A group without any PLACED
record has nothing in its partition queue. So every parked event lands in exactly one
partition queue exactly once, in the order of its chunk, and the parked read position never
passes an event that is not durable in a partition queue.

Damaged data found in the chunk of an interrupted move (a parked entry that no longer reads
back, and that its partition queue does not have yet) is lost, not a reason to stop: those
entries are recorded as dropped, the rest of each group is appended in runs around them
(each run with its own PLACED record, so the count above still holds), and the read position
moves to ``n1`` as usual. The chunk is read over the damage without skipping it, and the
mover always finishes a pending plan before it reads anything else: a reading that skips
damage at the plan's start would begin a new plan inside it and place its events twice.

The journal is also the map from a parked event id to its partition queue entry, used by
delivery queries; it is kept (rotated to ``moves.old`` past 8 MiB, so at least the last
8 MiB of records, about two million moved events, stay answerable).
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import logging
import os
import struct
import threading
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from crc32c import crc32c

from tidelog.agent.errors import AgentError, QueueFullError
from tidelog.agent.event import FIXED_SIZE
from tidelog.agent.queue import ENTRY_SIZE, DiskQueue, Entry, QueueSealed, append_whole
from tidelog.agent.sender import forget_callbacks
from tidelog.protocol import ErrorCode

if TYPE_CHECKING:
    from tidelog.agent.agent import Agent

_log = logging.getLogger(__name__)

_HEAD = struct.Struct(">BII")
_PLAN = struct.Struct(">QQQi")
_PLACED = struct.Struct(">QiQII")
_KEY_LEN = struct.Struct(">i")
_PIN = struct.Struct(">qi")
PINNED = -(1 << 63)
PLAN = 1
PLACED = 2
JOURNAL = "moves"
JOURNAL_OLD = "moves.old"
JOURNAL_ROTATE_BYTES = 8 << 20
MOVE_CHUNK_BYTES = 1 << 20
# Metadata answers for a topic that does not exist (yet), or is being created.
_NOT_THERE_YET = frozenset(
    (ErrorCode.NONE, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.LEADER_NOT_AVAILABLE)
)


@dataclass(slots=True)
class Plan:
    n0: int
    n1: int
    end_pos: int
    partitions: int
    assign: array[int]
    # partition -> [(start, first, count)] in the order written
    placed: dict[int, list[tuple[int, int, int]]] = field(default_factory=dict)

    def group(self, partition: int) -> list[int]:
        """Indexes (relative to ``n0``) of the chunk's entries that go to ``partition``."""
        return [i for i, p in enumerate(self.assign) if p == partition]


class MoveJournal:
    """The ``moves`` file of one parked queue (see the module docstring)."""

    def __init__(self, directory: Path, fsync: Callable[[int], None]) -> None:
        self.directory = directory
        self._fsync = fsync
        self.plans: dict[int, Plan] = {}  # by n0
        self._starts: list[int] = []  # sorted n0 of the plans, for queries
        for name in (JOURNAL_OLD, JOURNAL):
            self._load(directory / name, cut=name == JOURNAL)
        self._fd = os.open(directory / JOURNAL, os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o644)
        self._size = os.fstat(self._fd).st_size
        self._lock = threading.Lock()

    def _load(self, path: Path, *, cut: bool) -> None:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return
        pos = 0
        good_end = 0
        damaged = 0
        while pos + _HEAD.size <= len(data):
            end = self._record_at(data, pos)
            if end is None:
                # Damaged (or torn, at the end): go on after the next record that checks
                # (applied by the search), so that one bad record does not take the records
                # after it.
                for q in range(pos + 1, len(data) - _HEAD.size + 1):
                    if data[q] in (PLAN, PLACED):
                        end = self._record_at(data, q)
                        if end is not None:
                            break
                if end is None:
                    break
                damaged += 1
            pos = good_end = end
        if damaged:
            _log.error("%s: skipped %d damaged part(s) of the journal", path, damaged)
        if good_end != len(data):
            _log.warning("%s: cutting %d bytes of torn journal tail", path, len(data) - good_end)
            if cut:
                os.truncate(path, good_end)

    def _record_at(self, data: bytes, pos: int) -> int | None:
        """Apply the record at ``pos`` if it is whole, checks and applies; its end, or None."""
        if pos + _HEAD.size > len(data):
            return None
        kind, length, crc = _HEAD.unpack_from(data, pos)
        end = pos + _HEAD.size + length
        if end > len(data):
            return None
        payload = data[pos + _HEAD.size : end]
        if crc32c(payload, crc32c(data[pos : pos + 5])) != crc:
            return None
        return end if self._apply(kind, payload) else None

    def _apply(self, kind: int, payload: bytes) -> bool:
        if kind == PLAN and len(payload) >= _PLAN.size:
            n0, n1, end_pos, partitions = _PLAN.unpack_from(payload, 0)
            assign = array("i")
            assign.frombytes(payload[_PLAN.size :])
            if struct.pack("=i", 1) != struct.pack(">i", 1):
                assign.byteswap()
            if len(assign) != n1 - n0 or partitions <= 0:
                return False
            self.plans[n0] = Plan(n0, n1, end_pos, partitions, assign)
            self._starts = sorted(self.plans)
            return True
        if kind == PLACED and len(payload) == _PLACED.size:
            n0, partition, first, start, count = _PLACED.unpack(payload)
            plan = self.plans.get(n0)
            if plan is None:
                return False
            plan.placed.setdefault(partition, []).append((start, first, count))
            return True
        return False

    def _write(self, kind: int, payload: bytes) -> None:
        head = _HEAD.pack(kind, len(payload), 0)[:5]
        crc = crc32c(payload, crc32c(head))
        # Whole or not at all: a torn record would end the journal at the next start.
        append_whole(self._fd, head + struct.pack(">I", crc) + payload)
        self._fsync(self._fd)
        self._size += _HEAD.size + len(payload)
        self._apply(kind, payload)

    def plan(self, n0: int, n1: int, end_pos: int, partitions: int, assign: list[int]) -> Plan:
        with self._lock:
            self._write(
                PLAN,
                _PLAN.pack(n0, n1, end_pos, partitions) + struct.pack(f">{len(assign)}i", *assign),
            )
            return self.plans[n0]

    def placed(self, n0: int, partition: int, first: int, start: int, count: int) -> None:
        with self._lock:
            self._write(PLACED, _PLACED.pack(n0, partition, first, start, count))

    def rotate_if_large(self) -> None:
        """Between chunks only: the plan in progress is always in ``moves``."""
        with self._lock:
            if self._size < JOURNAL_ROTATE_BYTES:
                return
            os.close(self._fd)
            os.replace(self.directory / JOURNAL, self.directory / JOURNAL_OLD)
            self._fd = os.open(
                self.directory / JOURNAL, os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o644
            )
            self._size = 0
            dir_fd = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
            self.plans.clear()
            self._starts = []
            self._load(self.directory / JOURNAL_OLD, cut=False)

    def locate(self, number: int) -> tuple[int, int] | None:
        """(partition, entry number there) of moved parked entry ``number``, if recorded."""
        with self._lock:
            index = bisect.bisect_right(self._starts, number) - 1
            if index < 0:
                return None
            plan = self.plans[self._starts[index]]
            if number >= plan.n1:
                return None
            offset = number - plan.n0
            partition = plan.assign[offset]
            rank = sum(1 for p in plan.assign[:offset] if p == partition)
            found = None
            for start, first, count in plan.placed.get(partition, []):
                if start <= rank < start + count:
                    found = first + rank - start
            return None if found is None else (partition, found)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)


def pin(partition: int, body: bytes | memoryview) -> bytes:
    """The parked entry of ``body`` sent with the explicit ``partition``."""
    return _PIN.pack(PINNED, partition) + body


def unpin(entry: bytes | memoryview) -> tuple[int | None, bytes | memoryview]:
    """(explicit partition or None, record body) of a parked entry."""
    mark, partition = _PIN.unpack_from(entry, 0)
    if mark != PINNED:
        return None, entry
    return partition, entry[_PIN.size :]


def body_key(body: bytes | memoryview) -> bytes | None:
    """The key of a stored (already checked) record body."""
    (key_len,) = _KEY_LEN.unpack_from(body, 8)
    return None if key_len < 0 else bytes(body[FIXED_SIZE : FIXED_SIZE + key_len])


class ParkedTopic:
    """The parked queue of one topic, its journal and its mover thread."""

    def __init__(self, agent: Agent, topic: str, directory: Path) -> None:
        self.agent = agent
        self.topic = topic
        cfg = agent.config
        self.queue = DiskQueue.open(
            directory,
            segment_bytes=cfg["queue.segment.bytes"],
            max_bytes=cfg["queue.max.bytes"],
            policy=cfg["queue.full.policy"],
            # Room for the pin; the record bodies are held to max.request.size by the agent,
            # so that each fits in the partition queue it moves to.
            max_entry_bytes=cfg["max.request.size"] + _PIN.size,
            fsync=agent.fsync,
        )
        self.journal = MoveJournal(directory, agent.fsync)
        self.moved = 0
        self.callbacks: dict[int, Callable[[Any, int], None]] = {}
        self._wake = threading.Event()
        self.queue.on_durable = self._wake.set
        # Parked entries dropped or skipped as damaged never move: their callbacks go.
        self.queue.on_dropped = functools.partial(forget_callbacks, self.callbacks)
        self._closed = False
        self._thread: threading.Thread | None = None
        self.last_error = ""

    # ------------------------------------------------------------------ life

    def start(self) -> None:
        """Finish a move a crash interrupted, then start the mover thread."""
        try:
            self._recover()
        except (OSError, AgentError) as exc:
            # The mover finishes it (a chunk with a plan resumes that plan): the agent must
            # start, and the parked topic must have its mover.
            _log.warning("%s: an interrupted move is left to the mover: %s", self.topic, exc)
        self.queue.unseal()
        self._thread = threading.Thread(
            target=self._run, name=f"agent-park-{self.topic}", daemon=True
        )
        self._thread.start()

    @property
    def active(self) -> bool:
        return not self.queue.sealed

    def close(self) -> None:
        self._closed = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(30)
        self.queue.close()
        self.journal.close()

    # ------------------------------------------------------------------ moving

    def _run(self) -> None:
        cfg = self.agent.config
        backoff_min = cfg["retry.backoff.ms"] / 1000
        backoff_max = max(backoff_min, cfg["retry.backoff.max.ms"] / 1000)
        backoff = backoff_min
        while not self._closed:
            parts = self.agent.known_partitions(self.topic)
            if parts is None:
                answer = self.agent.refresh_topic_sync(self.topic)
                self._note_answer(answer)
                if self.agent.known_partitions(self.topic) is None:
                    self._wake.wait(backoff)
                    self._wake.clear()
                    backoff = min(backoff * 2, backoff_max)
                continue
            try:
                pos, n = self.queue.start_of_next_read()
                planned = self.journal.plans.get(n)
                if planned is not None:
                    # A move stopped after its plan (an error, or a crash that _recover
                    # could not finish): finish that plan. Planning again would append
                    # its placed groups twice, and a reading that skips damage here would
                    # start the next plan inside this one.
                    self._finish_plan(planned, pos)
                else:
                    entries = self.queue.read(pos, n, MOVE_CHUNK_BYTES)
                    if not entries:
                        if self.queue.seal_if_moved(n):
                            _log.info("%s: every parked event has moved", self.topic)
                            self.last_error = ""
                            return
                        self._wake.wait(0.5)
                        self._wake.clear()
                        continue
                    self._move(entries)
            except (OSError, AgentError) as exc:
                if self._closed:
                    return
                self.last_error = str(exc)
                _log.warning("%s: moving parked events failed: %s; retrying", self.topic, exc)
                self._wake.wait(backoff)
                self._wake.clear()
                backoff = min(backoff * 2, backoff_max)
                continue
            backoff = backoff_min
            self.last_error = ""

    def _note_answer(self, answer: ErrorCode | Exception | None) -> None:
        """What the status shows while the topic is unknown: the cluster's own answer when
        it is not just "not there yet" (e.g. a name it refuses, which no wait will change:
        logged once per answer, the events stay parked), or why it could not be asked."""
        if isinstance(answer, Exception):
            self.last_error = f"cannot reach the cluster: {str(answer) or type(answer).__name__}"
            return
        if answer is None or answer in _NOT_THERE_YET:
            self.last_error = "the cluster does not know the topic yet"
            return
        if answer.retriable:
            self.last_error = f"the cluster does not know the topic yet ({answer.name})"
            return
        why = f"the cluster refuses the topic: {answer.name}"
        if why != self.last_error:
            _log.error("%s: %s; its parked events wait", self.topic, why)
        self.last_error = why

    def _move(self, entries: list[Entry]) -> None:
        parts = self.agent.known_partitions(self.topic)
        if parts is None or self._closed:
            return
        n0 = entries[0].number
        last = entries[-1]
        end_pos = last.position + ENTRY_SIZE + len(last.body)
        if not self.queue.claim(n0, end_pos, last.number + 1):
            return  # drop-oldest dropped some of them meanwhile: read again
        pins = [unpin(e.body) for e in entries]
        free = [i for i, (pinned, _) in enumerate(pins) if pinned is None]
        chosen = self.agent.assign_partitions(
            self.topic, parts, [(body_key(pins[i][1]), len(pins[i][1])) for i in free]
        )
        # A pinned partition past the known count waits in its queue for the partition to
        # exist, as an explicit partition sent directly does.
        assign = [-1 if pinned is None else pinned for pinned, _ in pins]
        for i, partition in zip(free, chosen, strict=True):
            assign[i] = partition
        plan = self.journal.plan(n0, last.number + 1, end_pos, parts.count, assign)
        self._finish(plan, entries)

    def _finish_plan(self, plan: Plan, pos: int) -> None:
        """Finish the move of ``plan``, whose chunk starts at ``pos`` (the read position)."""
        if not self.queue.claim(plan.n0, plan.end_pos, plan.n1):
            return  # drop-oldest skipped past it meanwhile: read again
        self._finish(plan, self._entries_of(plan, pos))

    def _finish(self, plan: Plan, entries: Sequence[Entry | None]) -> None:
        """Steps 2 and 3 for the groups of ``plan`` not (wholly) in their queues yet.

        An entry that cannot be read back (None: damaged since it was planned) and is not in
        its partition queue yet is lost: it is recorded as dropped first, then the rest of
        its group is appended without it, each run between lost entries with a PLACED
        record of its own. So a recovery's count of what a group has (its last PLACED
        record and the queue's end) still holds: a lost entry is never placed.
        """
        todo: list[tuple[int, list[int], DiskQueue, int]] = []
        lost: list[int] = []
        for partition in sorted(set(plan.assign)):
            group = plan.group(partition)
            queue = self.agent.queue_for(self.topic, partition)
            have = 0
            placed = plan.placed.get(partition)
            if placed:
                start, first, count = placed[-1]
                have = start + max(0, min(count, queue.write_n - first))
            todo.append((partition, group, queue, have))
            # In the partition queue: under a PLACED run, below what the queue has.
            in_queue = {k for start, _, count in placed or () for k in range(start, start + count)}
            lost.extend(
                i
                for k, i in enumerate(group)
                if entries[i] is None and not (k < have and k in in_queue)
            )
        # Recorded before anything after them is placed, and again by an attempt after a
        # crash before the commit below (a drop record past the cursor is dropped at load).
        lost = [i for i in lost if not self.queue.was_dropped(plan.n0 + i)]
        for first, end in _runs(sorted(lost)):
            self.queue.record_damage(plan.n0 + first, plan.n0 + end)
        for partition, group, queue, have in todo:
            k = have
            while k < len(group):
                if entries[group[k]] is None:
                    k += 1
                    continue
                run_start = k
                bodies: list[bytes | memoryview] = []
                while k < len(group) and (entry := entries[group[k]]) is not None:
                    bodies.append(unpin(entry.body)[1])
                    k += 1
                self._append(plan, partition, queue, run_start, group[run_start:k], bodies)
        self.queue.commit(plan.end_pos, plan.n1, 0, -1, -1)
        self.queue.in_flight_end = None
        self.moved += plan.n1 - plan.n0 - len(lost)
        self.journal.rotate_if_large()

    def _append(
        self,
        plan: Plan,
        partition: int,
        queue: DiskQueue,
        start: int,
        indexes: list[int],
        bodies: list[bytes | memoryview],
    ) -> None:
        sender_callbacks = self.agent.sender_callbacks(self.topic, partition)

        def numbered(first: int) -> None:
            self.journal.placed(plan.n0, partition, first, start, len(bodies))
            for k, i in enumerate(indexes):
                callback = self.callbacks.pop(plan.n0 + i, None)
                if callback is not None and sender_callbacks is not None:
                    sender_callbacks[first + k] = callback

        # Their age counts from when they were parked: the chunk is the oldest of the
        # parked queue's undelivered entries.
        since = time.time() - self.queue.oldest_age()
        delay = 0.01
        while True:
            try:
                queue.append(bodies, numbered=numbered, since=since)
                return
            except QueueFullError:
                # Policy reject: these events were acknowledged already; wait for space.
                if self._closed:
                    raise
                threading.Event().wait(delay)
                delay = min(delay * 2, 0.5)

    def _recover(self) -> None:
        # The next chunk starts at the read position, or at the skip position past a drop.
        pos, n = self.queue.start_of_next_read()
        plan = self.journal.plans.get(n)
        if plan is None or plan.n1 <= plan.n0:
            return
        _log.info(
            "%s: finishing the move of parked events %d..%d", self.topic, plan.n0, plan.n1 - 1
        )
        # The plan's entries were durable: the queue's recovery may have cut the last of
        # them as a torn tail (damaged data at its end). New entries must not take their
        # numbers (nor the read position land inside a new entry): before any append.
        self.queue.continue_after(plan.end_pos, plan.n1)
        self._finish_plan(plan, pos)

    def _entries_of(self, plan: Plan, pos: int) -> list[Entry | None]:
        """The parked entries of ``plan``'s chunk, which starts at ``pos``, by index in the
        chunk; None for each one that cannot be read back (damaged data, or a tail the
        queue's recovery cut). Reads over damage without skipping it: the chunk's read
        position moves only once the plan is finished."""
        entries: list[Entry | None] = []
        n = plan.n0
        while n < plan.n1:
            got = self.queue.read(pos, n, plan.end_pos - pos, skip_damage=False)
            if got:
                entries.extend(e for e in got if e.number < plan.n1)
                last = got[-1]
                pos, n = last.position + ENTRY_SIZE + len(last.body), last.number + 1
                continue
            beyond = self.queue.after_damage(pos, n)
            resume = plan.n1 if beyond is None else min(beyond[1], plan.n1)
            entries.extend([None] * (resume - n))
            if beyond is None:
                break
            pos, n = beyond
        return entries

    # ------------------------------------------------------------------ queries

    def state_of(self, number: int) -> tuple[str, tuple[int, int] | None]:
        """("pending" | "dropped" | "unknown", None) or ("moved", (partition, number))."""
        if self.queue.was_dropped(number):
            return "dropped", None
        moved_n = self.queue.cursor.read_n
        if number >= moved_n:
            return ("pending" if number < self.queue.durable_n else "unknown"), None
        where = self.journal.locate(number)
        return ("moved", where) if where is not None else ("unknown", None)

    def status(self) -> dict[str, Any]:
        q = self.queue
        return {
            "topic": self.topic,
            "partition": -1,
            "depth": q.depth(),
            "bytes": q.used_bytes,
            "oldest_age_s": round(q.oldest_age(), 3),
            "appended": q.appended,
            "delivered": 0,
            "moved": self.moved,
            "batches": 0,
            "in_flight": 0,
            "in_doubt": 0,
            "duplicates_avoided": 0,
            "dropped": q.dropped,
            "rejected": 0,
            "corrupt": q.corrupt,
            "disk_full": q.disk_full,
            "disk_full_waits": q.disk_full_waits,
            "fsyncs": q.fsyncs,
            "retries": 0,
            "producer_id": -1,
            "last_error": self.last_error,
        }


def _runs(indexes: list[int]) -> list[tuple[int, int]]:
    """Sorted ``indexes`` as ``[first, end)`` runs of consecutive values."""
    runs: list[tuple[int, int]] = []
    for i in indexes:
        if runs and runs[-1][1] == i:
            runs[-1] = (runs[-1][0], i + 1)
        else:
            runs.append((i, i + 1))
    return runs


__all__ = ["MoveJournal", "ParkedTopic", "Plan", "QueueSealed", "body_key", "pin", "unpin"]
