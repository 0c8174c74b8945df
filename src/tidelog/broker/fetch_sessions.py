"""Incremental fetch sessions (Kafka's KIP-227): the broker remembers what a fetcher asks for.

A fetcher that sends a *full* fetch (session epoch 0) gets a session id back. Its next
requests are *incremental*: they carry the session id and the next epoch, list only the
partitions whose fetch parameters changed (new ones are added) and the partitions to
drop (``forgotten_topics_data``). The broker fetches every partition of the session and
answers only with partitions that have records, a changed high watermark or log start
offset, or an error. Epoch -1 closes the session; session id 0 with epoch -1 is a fetch
without any session.

Each :class:`CachedPartition` keeps the request parameters (fetch offset, byte limit,
leader epochs) and what was last sent (high watermark, log start offset); sending an
error sets the remembered high watermark to -1 so that the partition is sent again once
the error is gone. Partitions stay in insertion order, and a partition included in a
response moves to the end, so that under a byte limit every partition gets its turn.

The cache holds at most ``max.incremental.fetch.session.cache.slots`` sessions (Kafka's
name and default, 1000). When it is full, a new session evicts, as in Kafka,

1. the least recently used session if it has been idle longer than
   :data:`EVICTION_MS` (Kafka's fixed 120 s), else
2. the session with the fewest partitions (least recently used among equals), but only
   when the new session has at least as many partitions; otherwise the new fetcher gets
   no session (session id 0) and keeps sending full fetches.

Kafka additionally protects follower sessions from consumer sessions; with no followers
on a single node there is nothing to protect.

Everything runs on the event loop thread; nothing here locks.
"""

from __future__ import annotations

import random
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Final

INVALID_SESSION_ID: Final = 0
INITIAL_EPOCH: Final = 0
FINAL_EPOCH: Final = -1
MAX_SLOTS_DEFAULT: Final = 1000
EVICTION_MS: Final = 120_000
_INT32_MAX: Final = 2**31 - 1

#: A partition in a session: (topic id, index) when the session uses topic ids (Fetch v13+),
#: else (topic name, index).
PartitionKey = tuple[uuid.UUID | str | None, int]


def next_epoch(epoch: int) -> int:
    """The epoch after ``epoch``; it wraps to 1 (0 is reserved for full fetches)."""
    return 1 if epoch >= _INT32_MAX else epoch + 1


@dataclass(slots=True)
class CachedPartition:
    """One partition of a session: the fetcher's parameters and what it was last told."""

    topic: str | None  # None: a topic id that names no topic (yet)
    topic_id: uuid.UUID | None
    partition: int
    fetch_offset: int
    max_bytes: int
    current_leader_epoch: int = -1
    last_fetched_epoch: int = -1
    high_watermark: int = -1  # -1: never sent, or an error was sent
    log_start_offset: int = -1

    def update_request(self, other: CachedPartition) -> None:
        self.topic = other.topic
        self.fetch_offset = other.fetch_offset
        self.max_bytes = other.max_bytes
        self.current_leader_epoch = other.current_leader_epoch
        self.last_fetched_epoch = other.last_fetched_epoch

    def must_respond(
        self,
        *,
        records_size: int,
        high_watermark: int,
        log_start_offset: int,
        error_code: int,
        diverging: bool,
    ) -> bool:
        """Whether an incremental response includes this partition; remembers what is sent."""
        respond = records_size > 0 or diverging
        if self.high_watermark != high_watermark:
            respond = True
            self.high_watermark = high_watermark
        if self.log_start_offset != log_start_offset:
            respond = True
            self.log_start_offset = log_start_offset
        if error_code != 0:
            respond = True
            self.high_watermark = -1
        return respond


class FetchSession:
    """A session: its partitions in order, the epoch expected next, when it was last used."""

    __slots__ = ("epoch", "id", "last_used_ms", "partitions", "uses_topic_ids")

    def __init__(
        self,
        session_id: int,
        partitions: OrderedDict[PartitionKey, CachedPartition],
        *,
        uses_topic_ids: bool,
        now_ms: int,
    ) -> None:
        self.id = session_id
        self.partitions = partitions
        self.uses_topic_ids = uses_topic_ids
        self.epoch = next_epoch(INITIAL_EPOCH)
        self.last_used_ms = now_ms

    def __len__(self) -> int:
        return len(self.partitions)

    def update(
        self,
        changes: OrderedDict[PartitionKey, CachedPartition],
        forgotten: list[PartitionKey],
    ) -> None:
        """Apply an incremental request: add or update ``changes``, then drop ``forgotten``."""
        for key, change in changes.items():
            cached = self.partitions.get(key)
            if cached is None:
                self.partitions[key] = change
            else:
                cached.update_request(change)
        for key in forgotten:
            self.partitions.pop(key, None)


class FetchSessionCache:
    """At most ``max_slots`` sessions, by id; see the module docstring for eviction."""

    def __init__(
        self,
        max_slots: int = MAX_SLOTS_DEFAULT,
        *,
        eviction_ms: int = EVICTION_MS,
        rng: random.Random | None = None,
    ) -> None:
        self.max_slots = max_slots
        self.eviction_ms = eviction_ms
        self._rng = rng or random.Random()
        # Least recently used first.
        self._sessions: OrderedDict[int, FetchSession] = OrderedDict()
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._sessions

    def get(self, session_id: int) -> FetchSession | None:
        return self._sessions.get(session_id)

    def touch(self, session: FetchSession, now_ms: int) -> None:
        session.last_used_ms = now_ms
        if session.id in self._sessions:
            self._sessions.move_to_end(session.id)

    def remove(self, session_id: int) -> FetchSession | None:
        return self._sessions.pop(session_id, None)

    def create(
        self,
        partitions: OrderedDict[PartitionKey, CachedPartition],
        *,
        uses_topic_ids: bool,
        now_ms: int,
    ) -> FetchSession | None:
        """A new session, or None when the cache is full and nothing may be evicted."""
        if self.max_slots <= 0:
            return None
        if len(self._sessions) >= self.max_slots and not self._evict_for(len(partitions), now_ms):
            return None
        session = FetchSession(
            self._new_id(), partitions, uses_topic_ids=uses_topic_ids, now_ms=now_ms
        )
        self._sessions[session.id] = session
        return session

    def _new_id(self) -> int:
        while True:
            candidate = self._rng.randint(1, _INT32_MAX)
            if candidate not in self._sessions:
                return candidate

    def _evict_for(self, size: int, now_ms: int) -> bool:
        oldest = next(iter(self._sessions.values()))
        if now_ms - oldest.last_used_ms > self.eviction_ms:
            del self._sessions[oldest.id]
            self.evictions += 1
            return True
        # The least valuable session: fewest partitions, least recently used among equals.
        smallest = min(self._sessions.values(), key=len)
        if len(smallest) > size:
            return False
        del self._sessions[smallest.id]
        self.evictions += 1
        return True


def sessions_of(broker: object) -> FetchSessionCache:
    """The broker's session cache, created on first use."""
    cache = getattr(broker, "fetch_sessions", None)
    if not isinstance(cache, FetchSessionCache):
        cache = FetchSessionCache()
        setattr(broker, "fetch_sessions", cache)  # noqa: B010
    return cache
