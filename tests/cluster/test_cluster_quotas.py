"""Client quotas in quorum mode: AlterClientQuotas sent to a node that is not the active
controller is forwarded to it, and every node then describes the same quotas
(DescribeClientQuotas answers from each node's own replica of the metadata).

Three real `tidelog serve` nodes (tests/cluster/cluster_harness.py); requests go by hand,
one node each, so which node takes each one is known.
"""

from __future__ import annotations

from typing import Any

import pytest
from cluster_harness import Cluster, send_request, wait_until

from tidelog.client.messages import build
from tidelog.protocol import ApiKey, request_class

pytestmark = pytest.mark.slow


def _send(cluster: Cluster, node: int, api: ApiKey, values: dict[str, Any]) -> Any:
    request = build(request_class(api, 1), values)
    return send_request("127.0.0.1", cluster.nodes[node].port, request, timeout=30.0)


def _quotas_on(cluster: Cluster, node: int) -> dict[tuple[tuple[str, str | None], ...], Any]:
    response = _send(
        cluster, node, ApiKey.DESCRIBE_CLIENT_QUOTAS, {"components": [], "strict": False}
    )
    assert int(response.error_code) == 0, response.error_message
    return {
        tuple((e.entity_type, e.entity_name) for e in entry.entity): {
            v.key: float(v.value) for v in entry.values
        }
        for entry in response.entries
    }


def _entry(entity: dict[str, str | None], **ops: float | None) -> dict[str, Any]:
    return {
        "entity": [{"entity_type": t, "entity_name": n} for t, n in entity.items()],
        "ops": [
            {"key": k, "value": 0.0 if v is None else v, "remove": v is None}
            for k, v in ops.items()
        ],
    }


def test_quotas_altered_through_a_follower_reach_every_node(cluster: Cluster) -> None:
    leader = cluster.wait_ready()
    follower = next(n for n in cluster.nodes if n != leader)
    altered = _send(
        cluster,
        follower,
        ApiKey.ALTER_CLIENT_QUOTAS,
        {
            "entries": [
                _entry({"user": "alice", "client-id": None}, producer_byte_rate=1024.0),
                _entry({"ip": None}, connection_creation_rate=5.0),
                _entry({"user": "bob"}, producer_byte_rate=0.0),
            ],
            "validate_only": False,
        },
    )
    assert [int(e.error_code) for e in altered.entries] == [0, 0, 42]  # 42 INVALID_REQUEST
    expected = {
        (("client-id", None), ("user", "alice")): {"producer_byte_rate": 1024.0},
        (("ip", None),): {"connection_creation_rate": 5.0},
    }
    for node in cluster.nodes:
        wait_until(
            lambda n=node: _quotas_on(cluster, n) == expected, f"node {node} to list the quotas"
        )

    removed = _send(
        cluster,
        follower,
        ApiKey.ALTER_CLIENT_QUOTAS,
        {"entries": [_entry({"ip": None}, connection_creation_rate=None)], "validate_only": False},
    )
    assert [int(e.error_code) for e in removed.entries] == [0]
    remaining = {(("client-id", None), ("user", "alice")): {"producer_byte_rate": 1024.0}}
    for node in cluster.nodes:
        wait_until(
            lambda n=node: _quotas_on(cluster, n) == remaining, f"node {node} to drop the ip quota"
        )
