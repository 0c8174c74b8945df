"""The agent: durable local acknowledgement, delivery to the cluster afterwards, exactly once.

``data.dir`` layout::

    agent.lock              flock'ed while an agent runs on the directory
    topics.json             partition count per topic last seen (used while the cluster is away)
    queues/<topic>-<p>/     one disk queue per topic-partition (:mod:`tidelog.agent.queue`)
    parked/<topic>/         events of a topic without metadata yet (:mod:`tidelog.agent.parking`)

Threads: callers append from their own threads (:meth:`Agent.send`, :meth:`Agent.store`; in
the daemon, one thread per socket connection) and the group commit runs on the caller's
thread (:mod:`tidelog.agent.queue`); one background thread runs the asyncio loop with the
metadata cache (:class:`~tidelog.client.cluster.ClusterClient`) and the senders
(:mod:`tidelog.agent.sender`).

Partitioning is the client's: ``murmur2(key) % partitions`` like the Java client, sticky for
events without a key (the partition changes after ``batch.size`` bytes). The partition count of
a topic comes from metadata (refreshed every ``metadata.max.age.ms``, and after errors;
partitions added to a topic are used from then on) and is remembered in ``topics.json`` so that
a restarted agent accepts events for known topics while the cluster is unreachable. An event
for a topic the agent has never seen is acknowledged at once from the topic's parked queue
(event id with partition -1) and moved to its partition queue when the metadata arrives (with
``allow.auto.create.topics`` the metadata request asks the broker to create the topic).
Queues found on disk at start are opened and delivered, and moves a crash interrupted are
finished, before anything else happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from tidelog.agent.errors import AgentClosedError, AgentError, QueueFullError
from tidelog.agent.event import Headers, encode_bodies, encode_body, event_timestamp
from tidelog.agent.metrics import AgentMetricsServer
from tidelog.agent.parking import ParkedTopic, pin
from tidelog.agent.queue import POLICIES, DiskQueue, FsyncFn, QueueSealed, check_entry_sizes
from tidelog.agent.sender import Sender
from tidelog.agent.wire import INT32_MAX, check_partition
from tidelog.client.cluster import ClusterClient
from tidelog.client.config import _bool as config_bool
from tidelog.client.config import _positive as config_positive
from tidelog.client.config import parse_config
from tidelog.client.errors import ClientError, ConfigError
from tidelog.client.partitioner import StickyPartitioner, partition_for_key
from tidelog.protocol import ErrorCode
from tidelog.runtime.filelock import LockHeldError, lock_directory
from tidelog.runtime.http_endpoints import parse_http_listener

_log = logging.getLogger(__name__)
# Longest file name (Linux): a queue directory is named <topic>-<partition>.
NAME_MAX = 255

# Kafka's legal topic names. Queue and parked directories are named after their topic, so
# no other name may reach the file system (".." or "/" would place them outside data.dir).
_TOPIC = re.compile(r"(?!\.{1,2}$)[A-Za-z0-9._-]{1,249}")


def _check_topic(topic: object) -> None:
    if not isinstance(topic, str) or not _TOPIC.fullmatch(topic):
        raise AgentError(f"{topic!r} is not a valid topic name")


def _check_explicit_partition(topic: str, partition: int) -> None:
    """An explicit partition must be one whose queue can exist: checked before the event
    is parked too, or the mover would fail on it for ever, holding back the events after."""
    check_partition(partition)
    if isinstance(topic, str) and len(f"{topic}-{partition}") > NAME_MAX:
        raise AgentError(
            f"topic {topic!r}, partition {partition}: the queue's directory name would be "
            f"longer than {NAME_MAX} bytes"
        )


# str(EventId): the topic (no "/" in a topic name), the partition (-1 for a parked event)
# and the number, in ASCII digits without a sign or leading zeros.
_EVENT_ID_TEXT = re.compile(r"([^/]*)/(-1|0|[1-9][0-9]*)/(0|[1-9][0-9]*)", re.ASCII)


class EventId(NamedTuple):
    """Where an event sits in the agent: its queue and its entry number there."""

    topic: str
    partition: int
    number: int

    def __str__(self) -> str:
        return f"{self.topic}/{self.partition}/{self.number}"

    @classmethod
    def parse(cls, text: str) -> EventId:
        """The id whose ``str()`` is ``text``, exactly: no sign, space, underscore, leading
        zero or non-ASCII digit (``int()`` would take them and answer for another event)."""
        match = _EVENT_ID_TEXT.fullmatch(text)
        try:
            if match is None:
                raise AgentError(text)
            return cls.of((match[1], int(match[2]), int(match[3])))
        except AgentError:
            raise AgentError(f"{text!r:.200} is not an event id (topic/partition/number)") from None

    @classmethod
    def of(cls, value: object) -> EventId:
        """``value`` as an event id: an EventId, a (topic, partition, number) tuple or the
        text ``topic/partition/number``; partition -1 for a parked event.

        :raises AgentError: anything else, or numbers no event id can have.
        """
        if isinstance(value, str):
            return cls.parse(value)
        if isinstance(value, tuple) and len(value) == 3:
            topic, partition, number = value
            if (
                isinstance(topic, str)
                and type(partition) is int
                and type(number) is int
                and -1 <= partition <= INT32_MAX
                and 0 <= number < 1 << 64
            ):
                return value if type(value) is cls else cls(topic, partition, number)
        raise AgentError(
            f"{value!s:.100} is not an event id: (topic, partition from -1, number from 0)"
        )


def _call_with_id(callback: DeliveryCallback, event: EventId, _moved: EventId, offset: int) -> None:
    # A parked event's callback gets the id its send returned, not its id after the move.
    callback(event, offset)


class Delivery(NamedTuple):
    """What the agent knows of an event: ``state`` is pending, delivered, dropped or unknown;
    ``offset`` is its offset in the partition when known (else -1); ``partition`` the
    partition it went to (-1 while a parked event has not moved)."""

    state: str
    offset: int
    partition: int = -1


DeliveryCallback = Callable[[EventId, int], None]


def _policy(name: str, value: Any) -> str:
    text = str(value).strip().lower()
    if text not in POLICIES:
        raise ConfigError(f"{name}: expected one of {', '.join(POLICIES)}, got {value!r}")
    return text


def _data_dir(name: str, value: Any) -> str:
    # Only a path: str(None) would be a directory named "None" in the working directory.
    if not isinstance(value, str | os.PathLike) or not os.fspath(value):
        raise ConfigError(f"{name}: expected a directory path, got {value!r}")
    return str(os.fspath(value))


def _metrics_listener(name: str, value: Any) -> tuple[str, int] | None:
    # Empty: no metrics listener (the default), as for the broker's key of the same name.
    if value is None or value == "":
        return None
    try:
        return parse_http_listener(str(value), name)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


# The agent's own keys; every other key is a producer key of tidelog.client.config.
AGENT_KEYS: dict[str, tuple[Any, Callable[[str, Any], Any]]] = {
    "data.dir": (None, _data_dir),
    "queue.max.bytes": (1 << 30, config_positive),
    "queue.full.policy": ("block", _policy),
    "queue.segment.bytes": (16 * 1024 * 1024, config_positive),
    "retry.backoff.max.ms": (1000, config_positive),
    "allow.auto.create.topics": (True, config_bool),
    "metrics.listener": (None, _metrics_listener),
}

# Producer keys whose setting the agent cannot honour: refused rather than ignored.
REFUSED_PRODUCER_KEYS = {
    "partitioner.class": "events are partitioned as by the Java client's default partitioner",
    "key.serializer": "keys and values are bytes",
    "value.serializer": "keys and values are bytes",
}
# Producer keys with no meaning for the agent, ignored with a warning (Kafka's way with a
# key a client does not use).
IGNORED_PRODUCER_KEYS = {
    "retries": "events are retried until delivered",
    "delivery.timeout.ms": "events are retried until delivered",
    "buffer.memory": "queue.max.bytes bounds what is held, on disk",
    "max.block.ms": "queue.full.policy decides what a send does when the queue is full",
    "compression.gzip.level": "codecs use their default level",
    "compression.lz4.level": "codecs use their default level",
    "compression.zstd.level": "codecs use their default level",
}


def parse_agent_config(config: Mapping[str, Any]) -> dict[str, Any]:
    own: dict[str, Any] = {}
    rest: dict[str, Any] = {}
    for key, value in config.items():
        if key in AGENT_KEYS:
            own[key] = AGENT_KEYS[key][1](key, value)
        else:
            rest[key] = value
    for key, (default, _) in AGENT_KEYS.items():
        own.setdefault(key, default)
    if not own["data.dir"]:
        raise ConfigError("data.dir is required")
    client = parse_config("producer", rest)
    for key in rest:
        if key in REFUSED_PRODUCER_KEYS and client[key] is not None:
            raise ConfigError(f"{key}: not supported by the agent ({REFUSED_PRODUCER_KEYS[key]})")
        if key in IGNORED_PRODUCER_KEYS:
            _log.warning("%s is not used by the agent: %s", key, IGNORED_PRODUCER_KEYS[key])
    # Exactly once into the cluster rests on both: an acks=1 batch can be lost by a
    # failover after the agent counted it delivered, and without idempotence a resend
    # after a crash is written twice.
    if client["acks"] != -1:
        raise ConfigError(f"acks: the agent delivers with acks=all only, got {rest['acks']!r}")
    if not client["enable.idempotence"]:
        raise ConfigError("enable.idempotence: the agent's producer is always idempotent")
    return {**client, **own}


@dataclass(slots=True)
class _Partitions:
    count: int
    available: tuple[int, ...]
    #: The cluster's id of the topic (text), None until known: a new id is a new topic.
    topic_id: str | None = None


class Agent:
    """The reliable event agent, in-process. See the module docstring."""

    def __init__(
        self,
        config: Mapping[str, Any],
        *,
        fsync: FsyncFn = os.fdatasync,
        on_delivery: DeliveryCallback | None = None,
    ) -> None:
        self.config = parse_agent_config(config)
        self.data_dir = Path(self.config["data.dir"])
        try:
            # Locked first: nothing in the directory is touched while another agent owns it.
            self._dir_lock = lock_directory(self.data_dir, "agent.lock")
            try:
                (self.data_dir / "queues").mkdir(exist_ok=True)
            except BaseException:
                self._dir_lock.release()
                raise
        except LockHeldError:
            raise AgentError(f"another agent runs on {self.data_dir}") from None
        except OSError as exc:
            raise ConfigError(
                f"data.dir: cannot use {str(self.data_dir)!r}: {exc.strerror}"
            ) from None
        self.fsync = fsync
        self.on_delivery = on_delivery
        self._lock = threading.Lock()
        self._topics: dict[str, _Partitions] = self._load_topics()
        self._queues: dict[tuple[str, int], DiskQueue] = {}
        self._parked: dict[str, ParkedTopic] = {}
        self._senders: dict[tuple[str, int], Sender] = {}
        self._sticky = StickyPartitioner()
        self._sticky_bytes: dict[str, int] = {}
        self._closed = False
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run_loop, name="tidelog-agent", daemon=True)
        self._thread.start()
        self.cluster: ClusterClient = self._call(self._make_cluster())
        #: ``metrics.listener``'s server (None: off), on the agent's loop
        self.metrics_server: AgentMetricsServer | None = None
        self._refresher = asyncio.run_coroutine_threadsafe(self._refresh_loop(), self.loop)
        for path in sorted((self.data_dir / "queues").iterdir()):
            topic, _, partition = path.name.rpartition("-")
            if path.is_dir() and topic and partition.isdigit():
                self._queue(topic, int(partition))
        parked_dir = self.data_dir / "parked"
        if parked_dir.is_dir():
            for path in sorted(parked_dir.iterdir()):
                if path.is_dir() and _TOPIC.fullmatch(path.name):
                    self._open_parked(path.name)
        if self.config["metrics.listener"] is not None:
            self._serve_metrics(*self.config["metrics.listener"])

    def _serve_metrics(self, host: str, port: int) -> None:
        server = AgentMetricsServer(self.status, host, port)
        try:
            self._call(server.start(), timeout=10)
        except OSError as exc:
            self.close()
            raise ConfigError(
                f"metrics.listener: cannot listen on {host}:{port}: {exc.strerror or exc}"
            ) from None
        self.metrics_server = server
        _log.info("agent metrics on http://%s:%d/metrics", host or "0.0.0.0", server.port)

    # ------------------------------------------------------------------ loop plumbing

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    async def _make_cluster(self) -> ClusterClient:
        return ClusterClient(parse_config("producer", self._client_config()))

    def _client_config(self) -> dict[str, Any]:
        keys = (
            "bootstrap.servers",
            "client.id",
            "request.timeout.ms",
            "metadata.max.age.ms",
            "retry.backoff.ms",
            "socket.connection.setup.timeout.ms",
            "max.in.flight.requests.per.connection",
            "receive.message.max.bytes",
        )
        values = {k: self.config[k] for k in keys}
        values["bootstrap.servers"] = ",".join(
            f"{host}:{port}" for host, port in self.config["bootstrap.servers"]
        )
        return values

    def _call(self, coro: Any, timeout: float | None = None) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    # ------------------------------------------------------------------ topics

    def _load_topics(self) -> dict[str, _Partitions]:
        path = self.data_dir / "topics.json"
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            _log.warning("ignoring unreadable %s: %s", path, exc)
            return {}
        topics = {}
        for name, value in raw.items():
            # {"count": n, "id": "..."}; a bare count is the format before topic ids.
            count, topic_id = (
                (value.get("count"), value.get("id")) if isinstance(value, dict) else (value, None)
            )
            if not isinstance(topic_id, str):
                topic_id = None
            if _TOPIC.fullmatch(name) and type(count) is int and 0 < count <= INT32_MAX:
                topics[name] = _Partitions(count, tuple(range(count)), topic_id)
        return topics

    def _save_topics(self) -> None:
        path = self.data_dir / "topics.json"
        tmp = path.with_suffix(".tmp")
        saved = {n: {"count": p.count, "id": p.topic_id} for n, p in sorted(self._topics.items())}
        tmp.write_text(json.dumps(saved))
        os.replace(tmp, path)

    def _learn(self, topic: str) -> None:
        info = self.cluster.metadata.topics.get(topic)
        if info is None or not info.partitions:
            return
        count = len(info.partitions)
        available = tuple(p.partition for p in info.partitions if p.leader >= 0)
        topic_id = None if info.topic_id is None or not info.topic_id.int else str(info.topic_id)
        known = self._topics.get(topic)
        recreated = (
            known is not None
            and topic_id is not None
            and known.topic_id is not None
            and topic_id != known.topic_id
        )
        # Kafka never shrinks a topic; a smaller answer for the same topic is a stale broker.
        # A topic deleted and created again (by hand, or auto-created by a metadata request
        # after its deletion) has a new id and may have fewer partitions: keys hash over the
        # new count from now on. Events queued for a partition it no longer has wait in
        # their queue, kept, until it has that partition again.
        if known is None or recreated or count >= known.count:
            self._topics[topic] = _Partitions(
                count, available, topic_id or (known.topic_id if known else None)
            )
            if recreated:
                assert known is not None
                _log.warning(
                    "topic %s was created again (id %s, was %s) with %d partitions (was %d)",
                    topic,
                    topic_id,
                    known.topic_id,
                    count,
                    known.count,
                )
            elif known is not None and count != known.count:
                _log.info("topic %s grew from %d to %d partitions", topic, known.count, count)
            if known is None or (count, topic_id) != (known.count, known.topic_id):
                self._save_topics()

    async def refresh_topic(self, topic: str) -> ErrorCode | ClientError:
        """Ask for ``topic``'s metadata; the error the cluster gave for it (NONE if none), or
        why the cluster could not be asked."""
        try:
            errors = await self.cluster.refresh(
                [topic], allow_auto_create=self.config["allow.auto.create.topics"]
            )
        except ClientError as exc:
            _log.debug("metadata refresh failed: %s", exc)
            return exc
        self._learn(topic)
        return errors.get(topic, ErrorCode.NONE)

    async def _refresh_loop(self) -> None:
        period = self.config["metadata.max.age.ms"] / 1000
        while not self._closed:
            await asyncio.sleep(period)
            topics = list(self._topics)
            if not topics:
                continue
            try:
                await self.cluster.refresh(topics)
            except ClientError as exc:
                _log.debug("periodic metadata refresh failed: %s", exc)
                continue
            for topic in topics:
                self._learn(topic)

    def refresh_topic_sync(self, topic: str) -> ErrorCode | Exception | None:
        """Ask for ``topic``'s metadata from another thread (the parked queues' movers):
        the error the cluster gave for it (NONE if none), why the cluster could not be
        asked, or None when the agent is closing."""
        if self._closed:
            return None
        try:
            answer: ErrorCode | ClientError = self._call(
                self.refresh_topic(topic), timeout=self.config["request.timeout.ms"] / 1000
            )
        except Exception as exc:
            return exc
        return answer

    def known_partitions(self, topic: str) -> _Partitions | None:
        return self._topics.get(topic)

    # ------------------------------------------------------------------ queues

    def _queue(self, topic: str, partition: int) -> DiskQueue:
        key = (topic, partition)
        queue = self._queues.get(key)
        if queue is not None:
            return queue
        with self._lock:
            queue = self._queues.get(key)
            if queue is not None:
                return queue
            if self._closed:
                raise AgentClosedError("the agent is closed")
            _check_topic(topic)
            try:
                queue = DiskQueue.open(
                    self.data_dir / "queues" / f"{topic}-{partition}",
                    segment_bytes=self.config["queue.segment.bytes"],
                    max_bytes=self.config["queue.max.bytes"],
                    policy=self.config["queue.full.policy"],
                    max_entry_bytes=self.config["max.request.size"],
                    fsync=self.fsync,
                )
            except OSError as exc:
                if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise AgentError(f"queue {topic}-{partition} cannot be opened: {exc}") from exc
                # Under every policy: there is no queue to wait in or drop from yet.
                raise QueueFullError(
                    f"queue {topic}-{partition} cannot be created: the disk is full "
                    f"({exc.strerror})"
                ) from exc
            # An explicit partition says nothing of the topic's partition count: the count
            # the partitioner uses comes from metadata only (_learn), or keyed events would
            # be hashed over partitions the topic may not have.
            sender = Sender(self, queue, topic, partition)
            self._senders[key] = sender
            loop = self.loop

            queue.on_durable = functools.partial(sender.wake_from_thread, loop)
            # Not waited for: the caller may be the loop itself.
            loop.call_soon_threadsafe(sender.start)
            self._queues[key] = queue
        return queue

    def _partition(self, topic: str, parts: _Partitions, key: bytes | None, size: int) -> int:
        if key is not None and not self.config["partitioner.ignore.keys"]:
            return partition_for_key(key, parts.count)
        with self._lock:
            partition = self._sticky.partition(topic, parts.count, parts.available)
            total = self._sticky_bytes.get(topic, 0) + size
            if total >= self.config["batch.size"]:
                self._sticky.batch_sealed(topic, partition, parts.count, parts.available)
                total = 0
            self._sticky_bytes[topic] = total
        return partition

    def assign_partitions(
        self, topic: str, parts: _Partitions, items: Sequence[tuple[bytes | None, int]]
    ) -> list[int]:
        """The partition of each (key, body size): the key's hash, or the sticky partition
        for events without a key. Per call, not per event: one sticky choice for the events
        without a key (accounted for together afterwards) and one hash per distinct key."""
        ignore_keys = self.config["partitioner.ignore.keys"]
        sticky: int | None = None
        sticky_bytes = 0
        by_key: dict[bytes, int] = {}
        out: list[int] = []
        for key, size in items:
            if key is None or ignore_keys:
                if sticky is None:
                    sticky = self._partition(topic, parts, None, 0)
                out.append(sticky)
                sticky_bytes += size
            else:
                # bytes(): a bytearray or memoryview key is valid too, but not hashable.
                hashable = key if type(key) is bytes else bytes(key)
                p = by_key.get(hashable)
                if p is None:
                    p = by_key[hashable] = partition_for_key(hashable, parts.count)
                out.append(p)
        if sticky_bytes:
            self._partition(topic, parts, None, sticky_bytes)
        return out

    def queue_for(self, topic: str, partition: int) -> DiskQueue:
        return self._queue(topic, partition)

    def sender_callbacks(self, topic: str, partition: int) -> dict[int, Any] | None:
        sender = self._senders.get((topic, partition))
        return None if sender is None else sender.callbacks

    # ------------------------------------------------------------------ parked events

    def _open_parked(self, topic: str) -> ParkedTopic:
        try:
            parked = ParkedTopic(self, topic, self.data_dir / "parked" / topic)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise AgentError(f"the parked queue of {topic} cannot be opened: {exc}") from exc
            raise QueueFullError(
                f"the parked queue of {topic} cannot be created: the disk is full ({exc.strerror})"
            ) from exc
        self._parked[topic] = parked
        parked.start()
        return parked

    def _parked_active(self, topic: str) -> ParkedTopic | None:
        """The parked queue of ``topic`` while it has events to move (every event of the
        topic must go there then, to stay behind them), else None."""
        parked = self._parked.get(topic)
        return parked if parked is not None and parked.active else None

    def _parking(self, topic: str) -> ParkedTopic | None:
        """The parked queue events of ``topic`` without explicit partition must go to
        (opened when the cluster does not know the topic), or None when they go to the
        partition queues."""
        parked = self._parked_active(topic)
        if parked is not None:
            return parked
        if topic in self._topics:
            return None
        _check_topic(topic)
        with self._lock:
            if self._closed:
                raise AgentClosedError("the agent is closed")
            parked = self._parked.get(topic)
            if parked is not None and parked.active:
                return parked
            if topic in self._topics:
                return None
            if parked is not None:
                # Drained earlier, and the topic is unknown again (topics.json was lost).
                parked.close()
            return self._open_parked(topic)

    # ------------------------------------------------------------------ sending

    def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        headers: Headers | None = None,
        *,
        partition: int | None = None,
        timestamp: int | None = None,
        on_delivery: DeliveryCallback | None = None,
    ) -> EventId:
        """Store one event durably in its partition's queue; returns once it is on disk.

        ``on_delivery(event_id, offset)`` runs (on the agent's thread) once the broker has
        acknowledged it (offset -1 when a resend after a crash found it already there), with
        the id this call returned.

        An event for a topic the cluster does not know yet is stored in the topic's parked
        queue: its id has partition -1 until it moves (see :mod:`tidelog.agent.parking`).
        While that queue holds events, an event with an explicit ``partition`` is parked too
        (pinned to it), so that it stays behind them.

        :raises QueueFullError: the queue is at ``queue.max.bytes`` or the disk is full, with
            policy ``reject``; or the partition's queue cannot be created on a full disk.
        """
        if self._closed:
            raise AgentClosedError("the agent is closed")
        if partition is not None:
            _check_explicit_partition(topic, partition)
        body = encode_body(key, value, headers, event_timestamp(timestamp))
        parked = self._parking(topic) if partition is None else self._parked_active(topic)
        if parked is not None:
            with contextlib.suppress(QueueSealed):
                return self._park(parked, [body], partition, on_delivery)[0]
        if partition is None:
            partition = self._partition(topic, self._topics[topic], key, len(body))
        queue = self._queue(topic, partition)
        if on_delivery is None:
            number = queue.append([body])
        else:
            number = self._append_with_callback(topic, partition, queue, [body], on_delivery)
        return EventId(topic, partition, number)

    def send_many(
        self,
        topic: str,
        events: Sequence[tuple[bytes | None, bytes | None]],
        *,
        partition: int | None = None,
    ) -> list[EventId]:
        """Store several (key, value) events with one group commit per partition."""
        bodies = encode_bodies(events, int(time.time() * 1000))
        return self.store(
            topic, partition, [(key, body) for (key, _), body in zip(events, bodies, strict=True)]
        )

    def store(
        self,
        topic: str,
        partition: int | None,
        items: Sequence[tuple[bytes | None, bytes | memoryview]],
        *,
        wait_for_space: bool = True,
    ) -> list[EventId]:
        """Store encoded (key, record body) events of one topic; returns once all are durable.

        One group commit per partition; the ids come in the order of ``items``, and events
        of one partition keep that order. Used by :meth:`send_many` and the socket server.
        """
        if self._closed:
            raise AgentClosedError("the agent is closed")
        if partition is not None:
            _check_explicit_partition(topic, partition)
        parked = self._parking(topic) if partition is None else self._parked_active(topic)
        if parked is not None:
            with contextlib.suppress(QueueSealed):
                return self._park(parked, [b for _, b in items], partition, None, wait_for_space)
        if partition is None:
            chosen = self.assign_partitions(
                topic, self._topics[topic], [(k, len(b)) for k, b in items]
            )
            if chosen and chosen.count(chosen[0]) == len(chosen):
                partition = chosen[0]
        if partition is not None:
            # One queue (an explicit partition, or no keys: the sticky one): no regrouping.
            first = self._queue(topic, partition).append(
                [b for _, b in items], wait_for_space=wait_for_space
            )
            return [EventId(topic, partition, n) for n in range(first, first + len(items))]
        by_queue: dict[int, list[int]] = {}
        for index, p in enumerate(chosen):
            by_queue.setdefault(p, []).append(index)
        ids: list[EventId | None] = [None] * len(items)
        # Every queue first: one that cannot be made (a full disk) fails the call before
        # any of its events is stored, so a caller that retries stores nothing twice.
        queues = {p: self._queue(topic, p) for p in by_queue}
        for p, indexes in by_queue.items():
            queue = queues[p]
            try:
                first = queue.append([items[i][1] for i in indexes], wait_for_space=wait_for_space)
            except AgentError as exc:
                # The queues before this one have stored their events: say which.
                if any(i is not None for i in ids):
                    exc.stored = list(ids)
                raise
            for offset, index in enumerate(indexes):
                ids[index] = EventId(topic, p, first + offset)
        return [i for i in ids if i is not None]

    def _park(
        self,
        parked: ParkedTopic,
        bodies: Sequence[bytes | memoryview],
        partition: int | None,
        callback: DeliveryCallback | None,
        wait_for_space: bool = True,
    ) -> list[EventId]:
        """Store record ``bodies`` in ``parked`` (pinned to ``partition`` if not None)."""
        topic = parked.topic
        # Checked here, against the partition queues' limit: the parked queue's own limit
        # leaves room for the pin, and an event it took must fit where it moves to.
        check_entry_sizes(bodies, self.config["max.request.size"])
        if partition is not None:
            bodies = [pin(partition, b) for b in bodies]

        def numbered(first: int) -> None:
            if callback is None:
                return
            for n in range(first, first + len(bodies)):
                parked.callbacks[n] = functools.partial(
                    _call_with_id, callback, EventId(topic, -1, n)
                )

        first = parked.queue.append(bodies, numbered=numbered, wait_for_space=wait_for_space)
        return [EventId(topic, -1, first + i) for i in range(len(bodies))]

    def _append_with_callback(
        self,
        topic: str,
        partition: int,
        queue: DiskQueue,
        bodies: list[bytes],
        callback: DeliveryCallback,
    ) -> int:
        sender = self._senders[(topic, partition)]

        def numbered(first: int) -> None:
            # Registered before the entries can be durable, hence before they can be sent.
            for n in range(first, first + len(bodies)):
                sender.callbacks[n] = callback

        return queue.append(bodies, numbered=numbered)

    def run_callbacks(self, sender: Sender, first: int, count: int, base_offset: int) -> None:
        """The callbacks of the delivered entries ``[first, first + count)`` of ``sender``'s
        queue (``base_offset`` that of the first, -1 when unknown): each event's own, then
        the agent-wide one. Whatever a callback raises is logged, ``SystemExit`` included:
        it runs on the agent's thread, where it would end delivery for every queue."""
        hook = self.on_delivery
        own = sender.callbacks
        if hook is None and not own:
            return
        for n in range(first, first + count):
            event = EventId(sender.topic, sender.partition, n)
            offset = base_offset + n - first if base_offset >= 0 else -1
            for callback in (own.pop(n, None), hook):
                if callback is not None:
                    try:
                        callback(event, offset)
                    except BaseException:
                        _log.exception("a delivery callback failed")

    # ------------------------------------------------------------------ queries

    def delivery(self, event: EventId | str) -> Delivery:
        """What the agent knows of ``event`` (an id a send returned, or its text form)."""
        event = EventId.of(event)
        if event.partition < 0:
            parked = self._parked.get(event.topic)
            if parked is None:
                return Delivery("unknown", -1)
            state, where = parked.state_of(event.number)
            if where is None:
                return Delivery(state, -1)
            event = EventId(event.topic, *where)
        sender = self._senders.get((event.topic, event.partition))
        if sender is None:
            return Delivery("unknown", -1, event.partition)
        state, offset = sender.offset_of(event.number)
        return Delivery(state, offset, event.partition)

    def partition_count(self, topic: str) -> int | None:
        """The partition count the agent uses for ``topic`` (None: not known yet)."""
        known = self._topics.get(topic)
        return None if known is None else known.count

    def status(self) -> list[dict[str, Any]]:
        parked = [p.status() for _, p in sorted(self._parked.items())]
        return parked + [s.status() for _, s in sorted(self._senders.items())]

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queue is delivered (and its sender done with the last batch, so
        that ``status()`` counts it); False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            # Parked queues first: a move creates and fills the partition queue before the
            # parked queue's depth drops, so the list taken afterwards has that queue.
            parked_empty = all(p.queue.depth() == 0 for p in list(self._parked.values()))
            if (
                parked_empty
                and all(q.depth() == 0 for q in list(self._queues.values()))
                and all(s.batch is None for s in list(self._senders.values()))
            ):
                return True
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(0.01)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._refresher.cancel()
        for parked in list(self._parked.values()):
            parked.close()

        async def stop() -> None:
            if self.metrics_server is not None:
                await self.metrics_server.stop()
            for sender in list(self._senders.values()):
                await sender.stop()
            await self.cluster.close()

        with contextlib.suppress(Exception):
            self._call(stop(), timeout=10)
        for queue in list(self._queues.values()):
            queue.close()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        with contextlib.suppress(Exception):
            self.loop.close()
        self._dir_lock.release()

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
