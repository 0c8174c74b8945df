"""AIOConsumer: a standalone fetcher over manually assigned partitions (no group yet).

State per assigned partition: the *position* (offset of the next record to return) or None,
meaning "resolve by ``auto.offset.reset``" (earliest/latest via ListOffsets; ``none`` raises).
``poll()`` first returns records already fetched; otherwise it sends one Fetch per partition
leader (no fetch session: session id 0, epoch -1, every partition listed each time), waits at
most the time left, and decodes the answers one batch at a time: each batch is validated
(CRC when ``check.crcs``), decoded whole, and only records at or after the position are kept.
Control batches (transaction markers) advance the position without yielding records. A last
batch cut short by the fetch size is left for the next fetch.

Fetch v13+ names topics by id; when the metadata has no id for a topic the request is sent as
v12 (by name), which every broker that speaks v13 also speaks.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict, deque
from collections.abc import Iterable, Mapping
from typing import Any

from tidelog.client.cluster import STALE_METADATA_CODES, ClusterClient
from tidelog.client.config import parse_config
from tidelog.client.errors import BrokerConnectionError, ClientError, broker_error
from tidelog.client.offsets import EARLIEST, LATEST, OffsetSpec, list_offsets
from tidelog.client.types import ConsumerRecord, ListOffsetsResult, TopicPartition
from tidelog.protocol import ApiKey, ErrorCode
from tidelog.records import RecordsError, TruncatedBatchError, decode_records, iter_batches


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
        self._buffer: deque[ConsumerRecord] = deque()
        self._closed = False

    async def __aenter__(self) -> AIOConsumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- assignment and positions ------------------------------------------------------------

    def assign(self, partitions: Iterable[TopicPartition | tuple[str, int]]) -> None:
        """Replace the assignment; partitions kept keep their positions."""
        wanted = [TopicPartition(*tp) for tp in partitions]
        self._positions = {tp: self._positions.get(tp) for tp in wanted}
        self._drop_buffered(lambda tp: tp not in self._positions)

    def assignment(self) -> set[TopicPartition]:
        return set(self._positions)

    def _check_assigned(self, tp: TopicPartition) -> TopicPartition:
        tp = TopicPartition(*tp)
        if tp not in self._positions:
            raise ClientError(f"partition {tp} is not assigned")
        return tp

    def _drop_buffered(self, which: Any) -> None:
        self._buffer = deque(
            r for r in self._buffer if not which(TopicPartition(r.topic, r.partition))
        )

    def seek(self, partition: TopicPartition | tuple[str, int], offset: int) -> None:
        """Next poll returns records of ``partition`` from ``offset`` on."""
        tp = self._check_assigned(TopicPartition(*partition))
        if offset < 0:
            raise ValueError(f"offset must not be negative, got {offset}")
        self._positions[tp] = offset
        self._drop_buffered(lambda x: x == tp)

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
            self._positions[tp] = answer.offset
            self._drop_buffered(lambda x, tp=tp: x == tp)

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
        position = self._positions[tp]
        assert position is not None
        return position

    async def _resolve_positions(self) -> None:
        unknown = [tp for tp, pos in self._positions.items() if pos is None]
        if not unknown:
            return
        if self._reset == "none":
            raise ClientError(
                f"no position for {', '.join(map(str, unknown))} and auto.offset.reset=none",
                code=ErrorCode.OFFSET_OUT_OF_RANGE,
            )
        answers = await self._offsets(dict.fromkeys(unknown, self._reset))
        for tp, answer in answers.items():
            if self._positions.get(tp, 0) is None:
                self._positions[tp] = answer.offset

    # -- polling -----------------------------------------------------------------------------

    async def poll(
        self, timeout_ms: int = 0, max_records: int | None = None
    ) -> list[ConsumerRecord]:
        """Records fetched from the assigned partitions; waits at most ``timeout_ms`` for some."""
        limit = self.config["max.poll.records"] if max_records is None else max_records
        deadline = time.monotonic() + timeout_ms / 1000
        while not self._buffer and self._positions:
            await self._resolve_positions()
            left_ms = int((deadline - time.monotonic()) * 1000)
            await self._fetch(max(0, min(left_ms, self.config["fetch.max.wait.ms"])))
            if self._buffer or time.monotonic() >= deadline:
                break
        out: list[ConsumerRecord] = []
        while self._buffer and len(out) < limit:
            out.append(self._buffer.popleft())
        return out

    async def _fetch(self, max_wait_ms: int) -> None:
        by_leader: dict[int, list[TopicPartition]] = defaultdict(list)
        missing: set[str] = set()
        for tp, position in self._positions.items():
            if position is None:
                continue
            leader = self.cluster.metadata.leader(tp.topic, tp.partition)
            if leader is None:
                missing.add(tp.topic)
            else:
                by_leader[leader].append(tp)
        if missing or self.cluster.stale():
            try:
                await self.cluster.refresh(missing or {tp.topic for tp in self._positions})
            except ClientError:
                await asyncio.sleep(self.config["retry.backoff.ms"] / 1000)
                return
            for tp in list(self._positions):
                leader = self.cluster.metadata.leader(tp.topic, tp.partition)
                if leader is not None and tp.topic in missing and self._positions[tp] is not None:
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
        version = conn.version(ApiKey.FETCH)
        ids = {tp.topic: self.cluster.metadata.topic_id(tp.topic) for tp in tps}
        if version >= 13 and None in ids.values():
            version = 12
        names_by_id: dict[Any, str] = {v: k for k, v in ids.items() if v is not None}
        topics: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for tp in tps:
            topics[tp.topic].append(
                {
                    "partition": tp.partition,
                    "fetch_offset": self._positions[tp],
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
                if tp not in self._positions or self._positions[tp] is None:
                    continue
                code = ErrorCode.from_wire(int(p.error_code))
                if code is ErrorCode.OFFSET_OUT_OF_RANGE:
                    if self._reset == "none":
                        raise broker_error(code, context=f"{tp} at offset {self._positions[tp]}")
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
                    self._take(tp, p.records)
        if stale:
            await self.cluster.refresh({tp.topic for tp in tps})

    def _take(self, tp: TopicPartition, data: bytes) -> None:
        position = self._positions[tp]
        assert position is not None
        topic, partition = tp
        out = self._buffer
        try:
            for pos, header in iter_batches(data, verify_crc=self._check_crcs):
                if header.last_offset < position:
                    continue
                if not header.is_control:
                    records = decode_records(data, pos, header=header)
                    out.extend(
                        ConsumerRecord(
                            topic, partition, r.offset, r.timestamp, r.key, r.value, r.headers
                        )
                        for r in records
                        if r.offset >= position
                    )
                position = header.next_offset
        except TruncatedBatchError:
            pass  # the last batch was cut by the size limit; the next fetch starts at it
        except RecordsError as exc:
            raise ClientError(
                f"{tp}: corrupt record batch after offset {position}: {exc}",
                code=ErrorCode.CORRUPT_MESSAGE,
            ) from exc
        finally:
            self._positions[tp] = position

    async def close(self) -> None:
        self._closed = True
        await self.cluster.close()
