"""Helpers of the admin API tests: build kio requests, call a handler, read the answer
back as a client would (the response is encoded and decoded again)."""

from __future__ import annotations

import asyncio
import importlib
from typing import Any

import tidelog.broker.handlers  # noqa: F401  (registers every handler)
from tidelog.broker.handlers.registry import HANDLERS
from tidelog.protocol import SUPPORTED_VERSIONS, ApiKey, decode_response, encode_response

from .conftest import context


def versions(api_key: ApiKey) -> range:
    """Every version the protocol table accepts for ``api_key``."""
    entry = SUPPORTED_VERSIONS[api_key]
    return range(entry.min_accepted, entry.max_version + 1)


def edge_versions(api_key: ApiKey) -> list[int]:
    """The lowest and highest accepted versions."""
    entry = SUPPORTED_VERSIONS[api_key]
    return sorted({entry.min_accepted, entry.max_version})


def schema(api: str, version: int) -> Any:
    """The kio request module of ``api`` (e.g. "create_topics") at ``version``."""
    return importlib.import_module(f"kio.schema.{api}.v{version}.request")


def call(broker: Any, api_key: ApiKey, version: int, request: Any) -> Any:
    """Run the handler and return its response as a client decodes it."""
    ctx = context(broker, api_key, version)
    response = asyncio.run(HANDLERS[api_key](ctx, request))
    frame = encode_response(ctx.header, response)
    _, decoded = decode_response(
        memoryview(frame)[4:], api_key=int(api_key), api_version=version, correlation_id=1
    )
    return decoded


def timeout() -> Any:
    import datetime

    from kio.static.primitive import i32Timedelta

    return i32Timedelta.parse(datetime.timedelta(seconds=30))


def create_topics_request(
    version: int,
    topics: list[dict[str, Any]],
    *,
    validate_only: bool = False,
) -> Any:
    """CreateTopics; each topic a dict: name, partitions (-1), replication (-1),
    assignments {partition: [brokers]} and configs {key: value} (both optional)."""
    module = schema("create_topics", version)
    creatable = tuple(
        module.CreatableTopic(
            name=t["name"],
            num_partitions=t.get("partitions", -1),
            replication_factor=t.get("replication", -1),
            assignments=tuple(
                module.CreatableReplicaAssignment(partition_index=p, broker_ids=tuple(b))
                for p, b in t.get("assignments", [])
            ),
            configs=tuple(
                module.CreatableTopicConfig(name=k, value=v) for k, v in t.get("configs", [])
            ),
        )
        for t in topics
    )
    return module.CreateTopicsRequest(
        topics=creatable, timeout=timeout(), validate_only=validate_only
    )


def create_topic(
    broker: Any, name: str, partitions: int = 1, configs: dict[str, str] | None = None
) -> Any:
    """Create a topic through the CreateTopics handler (newest version); its result."""
    version = versions(ApiKey.CREATE_TOPICS)[-1]
    request = create_topics_request(
        version,
        [{"name": name, "partitions": partitions, "configs": list((configs or {}).items())}],
    )
    result = call(broker, ApiKey.CREATE_TOPICS, version, request).topics[0]
    assert result.error_code == 0, result.error_message
    return result
