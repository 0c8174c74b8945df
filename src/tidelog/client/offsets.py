"""ListOffsets for many partitions: one request per partition leader, answers merged.

Shared by the admin (``list_offsets``) and the consumer (seeking to earliest, latest or a
timestamp). A spec is ``"earliest"`` (Kafka's -2), ``"latest"`` (-1), ``"max_timestamp"`` (-3)
or a timestamp in epoch milliseconds (the first offset whose timestamp is at or after it; the
broker answers offset -1 when there is none).
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from tidelog.client.cluster import STALE_METADATA_CODES, ClusterClient
from tidelog.client.errors import BrokerConnectionError, ClientError, broker_error
from tidelog.client.types import ListOffsetsResult, TopicPartition
from tidelog.protocol import ApiKey, ErrorCode

EARLIEST = -2
LATEST = -1
MAX_TIMESTAMP = -3

_NAMED = {"earliest": EARLIEST, "latest": LATEST, "max_timestamp": MAX_TIMESTAMP}

OffsetSpec = str | int


def spec_timestamp(spec: OffsetSpec) -> int:
    """The ListOffsets timestamp of a spec."""
    if isinstance(spec, str):
        try:
            return _NAMED[spec.lower()]
        except KeyError:
            raise ValueError(
                f"offset spec {spec!r}: expected earliest, latest, max_timestamp or a timestamp"
            ) from None
    if isinstance(spec, bool) or not isinstance(spec, int):
        raise ValueError(f"offset spec {spec!r}: expected a name or an int timestamp")
    if spec < 0 and spec not in _NAMED.values():
        raise ValueError(f"offset spec {spec}: a timestamp is not negative")
    return spec


async def list_offsets(
    cluster: ClusterClient,
    specs: Mapping[TopicPartition, OffsetSpec],
    *,
    isolation_level: int = 0,
    attempts: int = 3,
) -> dict[TopicPartition, ListOffsetsResult | ClientError]:
    """The answer for each partition: a result, or the error the broker gave for it."""
    wanted = {TopicPartition(*tp): spec_timestamp(spec) for tp, spec in specs.items()}
    results: dict[TopicPartition, ListOffsetsResult | ClientError] = {}
    remaining = dict(wanted)
    for attempt in range(attempts):
        retry: dict[TopicPartition, int] = {}
        by_leader: dict[int, dict[TopicPartition, int]] = defaultdict(dict)
        for topic in {tp.topic for tp in remaining}:
            try:
                await cluster.topic(topic)
            except ClientError as exc:
                for tp in remaining:
                    if tp.topic == topic:
                        results[tp] = exc
        for tp, ts in remaining.items():
            if tp in results:
                continue
            leader = cluster.metadata.leader(tp.topic, tp.partition)
            if leader is None:
                info = cluster.metadata.topics.get(tp.topic)
                if info is not None and not 0 <= tp.partition < len(info.partitions):
                    results[tp] = broker_error(
                        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, context=str(tp)
                    )
                else:
                    retry[tp] = ts
                continue
            by_leader[leader][tp] = ts
        answers = await asyncio.gather(
            *(_ask(cluster, leader, parts, isolation_level) for leader, parts in by_leader.items()),
            return_exceptions=True,
        )
        for (_leader, parts), answer in zip(by_leader.items(), answers, strict=True):
            if isinstance(answer, BaseException):
                if not isinstance(answer, ClientError):
                    raise answer
                if answer.retriable:
                    retry.update(parts)
                else:
                    results.update(dict.fromkeys(parts, answer))
                continue
            for tp, outcome in answer.items():
                if (
                    isinstance(outcome, ClientError)
                    and outcome.retriable
                    and attempt + 1 < attempts
                ):
                    retry[tp] = parts[tp]
                else:
                    results[tp] = outcome
        if not retry:
            break
        remaining = retry
        await cluster.refresh({tp.topic for tp in retry})
        await asyncio.sleep(cluster.config["retry.backoff.ms"] / 1000)
    else:
        for tp in remaining:
            results.setdefault(tp, broker_error(ErrorCode.LEADER_NOT_AVAILABLE, context=str(tp)))
    return results


async def _ask(
    cluster: ClusterClient,
    leader: int,
    parts: Mapping[TopicPartition, int],
    isolation_level: int,
) -> dict[TopicPartition, ListOffsetsResult | ClientError]:
    conn = await cluster.connection(leader)
    topics: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for tp, ts in parts.items():
        topics[tp.topic].append(
            {"partition_index": tp.partition, "timestamp": ts, "max_num_offsets": 1}
        )
    try:
        response = await conn.call(
            ApiKey.LIST_OFFSETS,
            {
                "replica_id": -1,
                "isolation_level": isolation_level,
                "topics": [{"name": t, "partitions": p} for t, p in topics.items()],
            },
        )
    except BrokerConnectionError:
        await cluster.forget(conn)
        raise
    out: dict[TopicPartition, ListOffsetsResult | ClientError] = {}
    for t in response.topics:
        for p in t.partitions:
            tp = TopicPartition(t.name, int(p.partition_index))
            if tp not in parts:
                continue
            code = ErrorCode.from_wire(int(p.error_code))
            if code is not ErrorCode.NONE:
                out[tp] = broker_error(code, context=str(tp))
                continue
            out[tp] = ListOffsetsResult(
                offset=int(p.offset),
                timestamp=int(p.timestamp),
                leader_epoch=int(getattr(p, "leader_epoch", -1)),
            )
    for tp in parts:
        out.setdefault(
            tp,
            broker_error(
                ErrorCode.UNKNOWN_SERVER_ERROR, "the broker did not answer for it", context=str(tp)
            ),
        )
    if any(isinstance(v, ClientError) and v.code in STALE_METADATA_CODES for v in out.values()):
        await cluster.refresh({tp.topic for tp in parts})
    return out
