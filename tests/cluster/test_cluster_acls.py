"""ACLs in quorum mode: CreateAcls and DeleteAcls sent to a node that is not the active
controller are forwarded to it, and every node then serves the same ACLs (DescribeAcls
answers from each node's own replica of the metadata).

Three real `tidelog serve` nodes (tests/cluster/cluster_harness.py) with Kafka's
StandardAuthorizer and `super.users=User:ANONYMOUS`. Requests go by hand, one node each
(through the protocol codec), so which node takes each one is known.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_harness import Cluster, send_request, wait_until

from tidelog.client.messages import build
from tidelog.protocol import ApiKey, ErrorCode, request_class
from tidelog.protocol.acls import AclOperation, AclPermissionType, PatternType, ResourceType

pytestmark = pytest.mark.slow

AUTHORIZER = {
    "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    "super.users": "User:ANONYMOUS",
}
ALICE = (ResourceType.TOPIC, "orders", PatternType.LITERAL, "User:alice", "*",
         AclOperation.READ, AclPermissionType.ALLOW)  # fmt: skip
BOB = (ResourceType.GROUP, "billing-", PatternType.PREFIXED, "User:bob", "*",
       AclOperation.ALL, AclPermissionType.DENY)  # fmt: skip
ANY_FILTER = {
    "resource_type_filter": ResourceType.ANY, "resource_name_filter": None,
    "pattern_type_filter": PatternType.ANY, "principal_filter": None, "host_filter": None,
    "operation": AclOperation.ANY, "permission_type": AclPermissionType.ANY,
}  # fmt: skip


@pytest.fixture
def secured_cluster(tmp_path: Path) -> Iterator[Cluster]:
    nodes = Cluster(tmp_path, overrides=AUTHORIZER)
    try:
        nodes.start()
        yield nodes
    finally:
        nodes.close()


def _send(cluster: Cluster, node: int, api: ApiKey, values: dict[str, Any]) -> Any:
    request = build(request_class(api, 3), values)
    return send_request("127.0.0.1", cluster.nodes[node].port, request, timeout=30.0)


def _acls_on(cluster: Cluster, node: int) -> set[tuple[Any, ...]]:
    response = _send(cluster, node, ApiKey.DESCRIBE_ACLS, ANY_FILTER)
    assert int(response.error_code) == 0
    return {
        (r.resource_type, r.resource_name, r.pattern_type, a.principal, a.host, a.operation,
         a.permission_type)
        for r in response.resources
        for a in r.acls
    }  # fmt: skip


def test_acls_changed_through_followers_reach_every_node(secured_cluster: Cluster) -> None:
    cluster = secured_cluster
    leader = cluster.wait_leader()
    first, second = [n for n in cluster.nodes if n != leader]
    fields = ("resource_type", "resource_name", "resource_pattern_type", "principal", "host",
              "operation", "permission_type")  # fmt: skip
    creations = [dict(zip(fields, acl, strict=True)) for acl in (ALICE, BOB)]
    created = _send(cluster, first, ApiKey.CREATE_ACLS, {"creations": creations})
    assert [int(r.error_code) for r in created.results] == [0, 0]
    for node in cluster.nodes:
        wait_until(
            lambda n=node: _acls_on(cluster, n) == {ALICE, BOB}, f"node {node} to list the ACLs"
        )

    by_bob = {**ANY_FILTER, "principal_filter": "User:bob"}
    deleted = _send(cluster, second, ApiKey.DELETE_ACLS, {"filters": [by_bob]})
    [result] = deleted.filter_results
    assert int(result.error_code) == ErrorCode.NONE
    assert [m.principal for m in result.matching_acls] == ["User:bob"]
    for node in cluster.nodes:
        wait_until(lambda n=node: _acls_on(cluster, n) == {ALICE}, f"node {node} to drop BOB")
