"""The admin client's ElectLeaders, AlterPartitionReassignments and
ListPartitionReassignments: what it sends (partitions grouped under their topic, null for
"every partition" and for a cancel) and how it reads the answers, against a connection
that records the request and answers with a kio response."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tidelog.client import ClientError, PartialFailureError, TopicPartition
from tidelog.client.aio.admin import AIOAdmin
from tidelog.client.errors import UnsupportedApiError
from tidelog.client.messages import build
from tidelog.client.types import PartitionReassignment
from tidelog.protocol import ApiKey, ErrorCode, response_class


class FakeConnection:
    address = "127.0.0.1:9"

    def __init__(self, answer: dict[str, Any], elect_max: int = 2) -> None:
        self.answer = answer
        self.broker_ranges = {ApiKey.ELECT_LEADERS: (0, elect_max)}
        self.sent: list[tuple[ApiKey, dict[str, Any]]] = []

    async def call(self, api_key: ApiKey, values: Any, **_: Any) -> Any:
        self.sent.append((api_key, dict(values)))
        return build(
            response_class(api_key, 0 if api_key != ApiKey.ELECT_LEADERS else 2), self.answer
        )


def _admin(conn: FakeConnection) -> AIOAdmin:
    admin = AIOAdmin({"bootstrap.servers": "127.0.0.1:9"})

    async def controller_connection() -> FakeConnection:
        return conn

    admin.cluster.controller_connection = controller_connection  # type: ignore[method-assign]
    return admin


def test_elect_leaders_groups_partitions_and_reads_each_outcome() -> None:
    conn = FakeConnection(
        {
            "error_code": 0,
            "replica_election_results": [
                {
                    "topic": "a",
                    "partition_result": [
                        {"partition_id": 0, "error_code": 0},
                        {"partition_id": 2, "error_code": ErrorCode.ELECTION_NOT_NEEDED.value},
                    ],
                }
            ],
        }
    )
    wanted = [TopicPartition("a", 0), TopicPartition("a", 2)]
    outcomes = asyncio.run(_admin(conn).elect_leaders("unclean", wanted))
    api, sent = conn.sent[0]
    assert api is ApiKey.ELECT_LEADERS
    assert sent["election_type"] == 1
    assert sent["topic_partitions"] == [{"topic": "a", "partitions": [0, 2]}]
    assert outcomes[TopicPartition("a", 0)] is None
    not_needed = outcomes[TopicPartition("a", 2)]
    assert isinstance(not_needed, ClientError)
    assert not_needed.code is ErrorCode.ELECTION_NOT_NEEDED

    asyncio.run(_admin(conn).elect_leaders("preferred"))
    assert conn.sent[1][1]["topic_partitions"] is None
    assert conn.sent[1][1]["election_type"] == 0


def test_an_unclean_election_is_refused_by_a_broker_without_election_types() -> None:
    conn = FakeConnection({"error_code": 0, "replica_election_results": []}, elect_max=0)
    with pytest.raises(UnsupportedApiError, match="cannot run unclean elections"):
        asyncio.run(_admin(conn).elect_leaders("unclean"))
    assert conn.sent == []
    with pytest.raises(ValueError, match="election type 'random'"):
        asyncio.run(_admin(conn).elect_leaders("random"))


def test_alter_reassignments_sends_targets_and_cancels_and_names_refused_partitions() -> None:
    code = ErrorCode.INVALID_REPLICA_ASSIGNMENT.value
    conn = FakeConnection(
        {
            "error_code": 0,
            "responses": [
                {
                    "name": "a",
                    "partitions": [
                        {"partition_index": 0, "error_code": 0},
                        {"partition_index": 1, "error_code": code, "error_message": "broker 9"},
                    ],
                }
            ],
        }
    )
    targets = {TopicPartition("a", 0): [2, 3], TopicPartition("a", 1): None}
    with pytest.raises(PartialFailureError) as failed:
        asyncio.run(_admin(conn).alter_partition_reassignments(targets))
    assert failed.value.code is ErrorCode.INVALID_REPLICA_ASSIGNMENT
    assert "a-1" in str(failed.value) and "broker 9" in str(failed.value)
    sent = conn.sent[0][1]
    assert sent["topics"] == [
        {
            "name": "a",
            "partitions": [
                {"partition_index": 0, "replicas": [2, 3]},
                {"partition_index": 1, "replicas": None},
            ],
        }
    ]


def test_list_reassignments_reads_adding_and_removing_replicas() -> None:
    conn = FakeConnection(
        {
            "error_code": 0,
            "topics": [
                {
                    "name": "a",
                    "partitions": [
                        {
                            "partition_index": 1,
                            "replicas": [2, 1],
                            "adding_replicas": [2],
                            "removing_replicas": [1],
                        }
                    ],
                }
            ],
        }
    )
    found = asyncio.run(
        _admin(conn).list_partition_reassignments([TopicPartition("a", 1), TopicPartition("b", 0)])
    )
    assert found == {TopicPartition("a", 1): PartitionReassignment((2, 1), (2,), (1,))}
    assert conn.sent[0][1]["topics"] == [
        {"name": "a", "partition_indexes": [1]},
        {"name": "b", "partition_indexes": [0]},
    ]
    asyncio.run(_admin(conn).list_partition_reassignments())
    assert conn.sent[1][1]["topics"] is None
