"""Raw partition reads: the record-batch bytes of one partition from an offset, undecoded.

For readers that decode whole batches themselves (the Spark source turns them into Arrow
columns): :func:`fetch_raw` sends one Fetch for one partition to its leader and returns the
``records`` bytes as the broker sent them, with the partition's watermarks. Nothing is
decoded or validated here; the bytes may begin before the requested offset (a fetch returns
whole batches) and may end with a batch cut short by the size limit.

:class:`RawPartitionReader` is the synchronous face: it owns a private event loop (driven in
the caller's thread, no background thread) and one :class:`ClusterClient`. It suits code
that reads a few partitions from a plain thread, such as a Spark task.

Errors: OFFSET_OUT_OF_RANGE is not raised but reported (``RawFetch.error``) so that the
caller can apply its own data-loss policy; errors that mean stale metadata refresh it and are
retried; every other broker error raises :class:`~tidelog.client.errors.ClientError`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from tidelog.client.cluster import STALE_METADATA_CODES, ClusterClient
from tidelog.client.config import parse_config
from tidelog.client.errors import BrokerConnectionError, ClientError, broker_error
from tidelog.client.offsets import list_offsets
from tidelog.client.types import ListOffsetsResult, TopicPartition
from tidelog.protocol import ApiKey, ErrorCode

T = TypeVar("T")

# Attempts at one fetch when the leader moved or the connection dropped.
_ATTEMPTS = 5


@dataclass(frozen=True, slots=True)
class RawFetch:
    """One partition's part of a Fetch response."""

    records: bytes
    high_watermark: int
    log_start_offset: int
    last_stable_offset: int
    error: ErrorCode = ErrorCode.NONE
    #: read_committed: the aborted transactions of the range, (producer id, first offset);
    #: see :class:`tidelog.client.aborted.AbortedTransactions`
    aborted_transactions: tuple[tuple[int, int], ...] = ()


async def _fetch_once(
    cluster: ClusterClient,
    tp: TopicPartition,
    offset: int,
    max_bytes: int,
    max_wait_ms: int,
    isolation_level: int,
) -> RawFetch | ErrorCode:
    conn = await cluster.leader_connection(tp.topic, tp.partition)
    version = conn.version(ApiKey.FETCH)
    topic_id = cluster.metadata.topic_id(tp.topic)
    if version >= 13 and topic_id is None:
        version = 12
    values = {
        "replica_id": -1,
        "max_wait": max_wait_ms,
        "min_bytes": 1,
        "max_bytes": max_bytes,
        "isolation_level": isolation_level,
        "session_id": 0,
        "session_epoch": -1,
        "topics": [
            {
                "topic": tp.topic,
                "topic_id": topic_id,
                "partitions": [
                    {
                        "partition": tp.partition,
                        "fetch_offset": offset,
                        "partition_max_bytes": max_bytes,
                        "log_start_offset": -1,
                        "current_leader_epoch": -1,
                        "last_fetched_epoch": -1,
                    }
                ],
            }
        ],
        "forgotten_topics_data": [],
        "rack_id": cluster.config["client.rack"],
    }
    try:
        response = await conn.call(
            ApiKey.FETCH,
            values,
            version=version,
            timeout_ms=cluster.config["request.timeout.ms"] + max_wait_ms,
        )
    except BrokerConnectionError:
        await cluster.forget(conn)
        return ErrorCode.NETWORK_EXCEPTION
    top = ErrorCode.from_wire(int(getattr(response, "error_code", 0)))
    if top is not ErrorCode.NONE:
        raise broker_error(top, context="fetch")
    for t in response.responses:
        for p in t.partitions:
            if int(p.partition_index) != tp.partition:
                continue
            code = ErrorCode.from_wire(int(p.error_code))
            if code is not ErrorCode.NONE and code is not ErrorCode.OFFSET_OUT_OF_RANGE:
                if code in STALE_METADATA_CODES or code.retriable:
                    return code
                raise broker_error(code, context=f"{tp} at offset {offset}")
            return RawFetch(
                records=bytes(p.records or b""),
                high_watermark=int(p.high_watermark),
                log_start_offset=int(getattr(p, "log_start_offset", -1)),
                last_stable_offset=int(getattr(p, "last_stable_offset", -1)),
                error=code,
                aborted_transactions=tuple(
                    (int(a.producer_id), int(a.first_offset))
                    for a in getattr(p, "aborted_transactions", None) or ()
                ),
            )
    return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


async def fetch_raw(
    cluster: ClusterClient,
    tp: TopicPartition,
    offset: int,
    *,
    max_bytes: int = 8 * 1024 * 1024,
    max_wait_ms: int = 0,
    isolation_level: int = 0,
) -> RawFetch:
    """The record-batch bytes of ``tp`` from ``offset`` on (at most about ``max_bytes``).

    The broker always returns at least one whole batch when there is one, however large.
    """
    tp = TopicPartition(*tp)
    last = ErrorCode.NONE
    for attempt in range(_ATTEMPTS):
        answer = await _fetch_once(cluster, tp, offset, max_bytes, max_wait_ms, isolation_level)
        if isinstance(answer, RawFetch):
            return answer
        last = answer
        if answer in STALE_METADATA_CODES:
            await cluster.refresh([tp.topic])
        await asyncio.sleep(cluster.config["retry.backoff.ms"] / 1000 * (attempt + 1))
    raise broker_error(last, context=f"fetch {tp} at offset {offset}")


class RawPartitionReader:
    """Synchronous raw fetches and offset look-ups; ``config`` takes consumer property names."""

    def __init__(self, config: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self.config = parse_config("consumer", config, **kwargs)
        self._isolation = 1 if self.config["isolation.level"] == "read_committed" else 0
        self.cluster = self._run(self._make_cluster())

    async def _make_cluster(self) -> ClusterClient:
        # The cluster creates asyncio primitives: build it inside the loop that runs it.
        return ClusterClient(self.config)

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._loop.run_until_complete(coro)

    def __enter__(self) -> RawPartitionReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def fetch(
        self,
        tp: TopicPartition | tuple[str, int],
        offset: int,
        *,
        max_bytes: int = 8 * 1024 * 1024,
        max_wait_ms: int = 0,
    ) -> RawFetch:
        return self._run(
            fetch_raw(
                self.cluster,
                TopicPartition(*tp),
                offset,
                max_bytes=max_bytes,
                max_wait_ms=max_wait_ms,
                isolation_level=self._isolation,
            )
        )

    def list_offsets(
        self, specs: Mapping[TopicPartition, str | int]
    ) -> dict[TopicPartition, ListOffsetsResult]:
        """ListOffsets for ``{partition: "earliest" | "latest" | timestamp_ms}``; raises the
        first error a partition got."""
        answers = self._run(list_offsets(self.cluster, specs, isolation_level=self._isolation))
        out: dict[TopicPartition, ListOffsetsResult] = {}
        for tp, answer in answers.items():
            if isinstance(answer, ClientError):
                raise answer
            out[tp] = answer
        return out

    def partitions_for(self, topic: str) -> list[int]:
        """The partition ids of ``topic`` (raises ClientError when it does not exist)."""

        async def partitions() -> list[int]:
            await self.cluster.refresh([topic])
            info = await self.cluster.topic(topic)
            return [p.partition for p in info.partitions]

        return self._run(partitions())

    def topics(self) -> list[str]:
        """Every non-internal topic."""

        async def names() -> list[str]:
            await self.cluster.refresh()
            return sorted(n for n, i in self.cluster.metadata.topics.items() if not i.is_internal)

        return self._run(names())

    def close(self) -> None:
        if self._loop.is_closed():
            return
        try:
            self._run(self.cluster.close())
        finally:
            self._loop.close()
