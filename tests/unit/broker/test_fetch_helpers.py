"""Helpers shared by the Fetch and offsets tests (no tests here).

Requests are built as kio objects of the wanted version, encoded and parsed back through
the protocol layer, so handlers see exactly what they would get from a socket. Responses
are decoded the same way a client would.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import uuid
from collections.abc import Sequence
from functools import cache
from typing import Any

from kio.serial import entity_writer

from tidelog.broker.broker import Broker
from tidelog.broker.connection import RequestContext
from tidelog.broker.partitions import Partition
from tidelog.broker.reply import Deferred, EncodedResponse, join_parts
from tidelog.protocol import (
    ApiKey,
    ResponseHeader,
    decode_response,
    encode_request,
    parse_request,
    response_header_version,
)
from tidelog.protocol.headers import encode_response_header
from tidelog.records import BatchBuilder
from tidelog.security.principal import ANONYMOUS
from tidelog.storage import LogConfig


class _NoConnection:
    peer = "test:0"
    listener = "PLAINTEXT"
    principal = ANONYMOUS

    def __init__(self) -> None:
        #: the throttle times a handler muted this connection for (quotas)
        self.muted_ms: list[int] = []

    def mute_for(self, throttle_ms: int) -> None:
        self.muted_ms.append(throttle_ms)


def add_partitions(
    broker: Broker,
    topic: str,
    count: int = 1,
    *,
    leader_epoch: int = 0,
    config: dict[str, str | int] | None = None,
) -> uuid.UUID:
    """Create ``topic`` with ``count`` partitions and make its id known to the broker."""
    topic_id = uuid.uuid4()
    log_config = LogConfig.from_mapping(config or {})
    for index in range(count):
        broker.partitions.ensure(
            topic, index, config=log_config, topic_id=topic_id, leader_epoch=leader_epoch
        )
    ids: dict[uuid.UUID, str] = getattr(broker, "_test_topic_ids", {})
    ids[topic_id] = topic
    broker._test_topic_ids = ids  # type: ignore[attr-defined]
    broker.topic_name_of = ids.get  # type: ignore[method-assign]
    broker.topic_id_of = lambda name: next(  # type: ignore[method-assign]
        (k for k, v in ids.items() if v == name), None
    )
    return topic_id


def batch(values: Sequence[bytes], *, timestamp: int = 1000, step: int = 0) -> bytes:
    builder = BatchBuilder()
    for index, value in enumerate(values):
        builder.append(None, value, timestamp=timestamp + index * step)
    return builder.close()


def append(partition: Partition, *batches: bytes) -> None:
    """Append whole batches as leader (offsets assigned by the log), waking fetchers."""
    partition.append(bytearray(b"".join(batches)))


def run(awaitable: Any) -> Any:
    async def main() -> Any:
        return await awaitable

    return asyncio.run(main())


async def handle(broker: Broker, api_key: ApiKey, request: Any) -> Any:
    """Parse ``request`` as the broker would and run its handler; the immediate reply."""
    from tidelog.broker.handlers import HANDLERS

    frame = encode_request(request, correlation_id=7, client_id="test")
    header, parsed = parse_request(memoryview(frame)[4:])
    assert header.api_key == api_key
    ctx = RequestContext(broker, _NoConnection(), header)  # type: ignore[arg-type]
    return await HANDLERS[api_key](ctx, parsed)


def call(broker: Broker, api_key: ApiKey, request: Any) -> Any:
    """:func:`handle` in a fresh event loop."""
    return run(handle(broker, api_key, request))


def decode_body(api_key: ApiKey, version: int, body: bytes) -> Any:
    header = encode_response_header(ResponseHeader(7, response_header_version(api_key, version)))
    _, response = decode_response(header + body, api_key=api_key, api_version=version)
    return response


def kio_encode(entity: Any) -> bytes:
    import io

    out = io.BytesIO()
    entity_writer(type(entity))(out, entity)
    return out.getvalue()


@cache
def _fields(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls))


def make(cls: type, **values: Any) -> Any:
    names = _fields(cls)
    return cls(**{k: v for k, v in values.items() if k in names})


def module(api: str, version: int, kind: str = "request") -> Any:
    return importlib.import_module(f"kio.schema.{api}.v{version}.{kind}")


# -- Fetch -------------------------------------------------------------------------------


@dataclasses.dataclass
class Want:
    """One partition to fetch."""

    topic: str
    partition: int = 0
    offset: int = 0
    max_bytes: int = 1 << 20
    current_leader_epoch: int = -1
    last_fetched_epoch: int = -1


def fetch_request(
    broker: Broker,
    version: int,
    wants: Sequence[Want] = (),
    *,
    max_wait_ms: int = 0,
    min_bytes: int = 1,
    max_bytes: int = 50 << 20,
    isolation_level: int = 0,
    session_id: int = 0,
    session_epoch: int = -1,
    forgotten: Sequence[tuple[str, int]] = (),
    replica_id: int = -1,
    topic_ids: dict[str, uuid.UUID | None] | None = None,
) -> Any:
    """A kio FetchRequest of ``version``; topics by id from v13 (``topic_ids`` overrides)."""
    import datetime

    from kio.static.primitive import i32Timedelta

    schema = module("fetch", version)

    def topic_key(name: str) -> dict[str, Any]:
        if version >= 13:
            if topic_ids is not None and name in topic_ids:
                return {"topic_id": topic_ids[name]}
            return {"topic_id": broker.topic_id_of(name)}
        return {"topic": name}

    grouped: dict[str, list[Want]] = {}
    for want in wants:
        grouped.setdefault(want.topic, []).append(want)
    topics = tuple(
        make(
            schema.FetchTopic,
            **topic_key(name),
            partitions=tuple(
                make(
                    schema.FetchPartition,
                    partition=w.partition,
                    current_leader_epoch=w.current_leader_epoch,
                    fetch_offset=w.offset,
                    last_fetched_epoch=w.last_fetched_epoch,
                    log_start_offset=-1,
                    partition_max_bytes=w.max_bytes,
                )
                for w in items
            ),
        )
        for name, items in grouped.items()
    )
    forgotten_grouped: dict[str, list[int]] = {}
    for name, index in forgotten:
        forgotten_grouped.setdefault(name, []).append(index)
    forgotten_topics = tuple(
        make(schema.ForgottenTopic, **topic_key(name), partitions=tuple(indexes))
        for name, indexes in forgotten_grouped.items()
    )
    extra: dict[str, Any] = {}
    if version >= 15:
        extra["replica_state"] = schema.ReplicaState(replica_id=replica_id)
    else:
        extra["replica_id"] = replica_id
    return make(
        schema.FetchRequest,
        max_wait=i32Timedelta.parse(datetime.timedelta(milliseconds=max_wait_ms)),
        min_bytes=min_bytes,
        max_bytes=max_bytes,
        isolation_level=isolation_level,
        session_id=session_id,
        session_epoch=session_epoch,
        topics=topics,
        forgotten_topics_data=forgotten_topics,
        rack_id="",
        **extra,
    )


def resolve(reply: Any) -> EncodedResponse:
    """The EncodedResponse of a reply, running a Deferred's long poll to its end."""
    if isinstance(reply, Deferred):
        reply = run(reply.waiter)
    assert isinstance(reply, EncodedResponse)
    return reply


def fetch(broker: Broker, request: Any) -> tuple[Any, bytes]:
    """Run a Fetch to its end; (decoded kio response, the raw body bytes)."""
    encoded = resolve(call(broker, ApiKey.FETCH, request))
    try:
        body = join_parts(encoded.parts)
    finally:
        encoded.close()
    return decode_body(ApiKey.FETCH, int(request.__version__), body), body


def partitions_of(response: Any) -> dict[tuple[Any, int], Any]:
    """Response partitions by (topic name or id, index)."""
    out = {}
    for topic in response.responses:
        key = topic.topic_id if hasattr(topic, "topic_id") else topic.topic
        for p in topic.partitions:
            out[(key, int(p.partition_index))] = p
    return out
