"""Client quotas (AlterClientQuotas, DescribeClientQuotas) from real clients against a real
single-node `tidelog serve`: the Java admin client (kafka-python and confluent-kafka have
no client quota API) and `tidelog configs` for users, clients and ips.

Enforcement of the byte rates is tested in test_quota_throttling.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from interop_broker import BrokerProcess, send_request
from java_harness import JavaClient

from tidelog.cli.main import main
from tidelog.client.messages import build
from tidelog.protocol import ApiKey, request_class


def _described(java: JavaClient, components: list[dict[str, Any]], strict: bool = False) -> Any:
    return java.one("quotas", {"describe": {"components": components, "strict": strict}})[
        "described"
    ]


def test_java_admin_sets_reads_and_removes_quotas(java: JavaClient) -> None:
    altered = java.one(
        "quotas",
        {
            "alter": [
                {
                    "entity": {"user": "jalice", "client-id": "japp"},
                    "ops": {"producer_byte_rate": 1024, "request_percentage": 12.5},
                },
                {"entity": {"user": None}, "ops": {"consumer_byte_rate": 4096}},
                {"entity": {"ip": "10.1.2.3"}, "ops": {"connection_creation_rate": 7}},
                {"entity": {"user": "jbob"}, "ops": {"producer_byte_rate": -1}},
                {"entity": {"ip": "10.1.2.4", "user": "x"}, "ops": {"connection_creation_rate": 1}},
                {"entity": {"user": "jdave"}, "ops": {"connection_creation_rate": 1}},
            ]
        },
    )["altered"]
    assert altered[:3] == [None, None, None]
    assert altered[3].startswith("InvalidRequestException: Quota producer_byte_rate must be")
    assert altered[4].startswith("InvalidRequestException: Invalid quota entity combination")
    assert altered[5].startswith("InvalidRequestException: Invalid configuration key")

    exact = _described(java, [{"type": "user", "match": "exact", "name": "jalice"}])
    assert exact == [
        {
            "entity": {"client-id": "japp", "user": "jalice"},
            "values": {"producer_byte_rate": 1024.0, "request_percentage": 12.5},
        }
    ]
    assert _described(java, [{"type": "user", "match": "exact", "name": "jalice"}], True) == []
    default = _described(java, [{"type": "user", "match": "default"}], strict=True)
    assert default == [{"entity": {"user": None}, "values": {"consumer_byte_rate": 4096.0}}]
    ips = _described(java, [{"type": "ip", "match": "any"}])
    assert {"entity": {"ip": "10.1.2.3"}, "values": {"connection_creation_rate": 7.0}} in ips
    bad = _described(java, [{"type": "ip", "match": "any"}, {"type": "user", "match": "any"}])
    assert bad["error"] == "InvalidRequestException"

    # validate_only checks and changes nothing; a removal takes the key away.
    checked = java.one(
        "quotas",
        {
            "alter": [{"entity": {"user": "jcarol"}, "ops": {"producer_byte_rate": 5}}],
            "validate_only": True,
        },
    )["altered"]
    assert checked == [None]
    assert _described(java, [{"type": "user", "match": "exact", "name": "jcarol"}]) == []
    java.one(
        "quotas",
        {
            "alter": [
                {
                    "entity": {"user": "jalice", "client-id": "japp"},
                    "ops": {"producer_byte_rate": None},
                }
            ]
        },
    )
    after = _described(java, [{"type": "user", "match": "exact", "name": "jalice"}])
    assert after[0]["values"] == {"request_percentage": 12.5}


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(["configs", *argv])
    out, err = capsys.readouterr()
    return status, out, err


def test_tidelog_configs_quotas(
    broker: BrokerProcess, java: JavaClient, capsys: pytest.CaptureFixture[str]
) -> None:
    bs = ("--bootstrap-server", broker.bootstrap)
    status, out, _ = cli(
        capsys,
        "alter",
        *bs,
        "--entity-type",
        "users",
        "--entity-name",
        "cli-user",
        "--entity-type",
        "clients",
        "--entity-name",
        "cli-app",
        "--add-config",
        "producer_byte_rate=2048,consumer_byte_rate=4096",
    )
    assert status == 0, out
    assert "Completed updating config for user-principal 'cli-user', client-id 'cli-app'." in out
    status, out, _ = cli(
        capsys, "alter", *bs, "--entity-type", "clients", "--entity-default",
        "--add-config", "request_percentage=50",
    )  # fmt: skip
    assert status == 0, out
    status, out, _ = cli(
        capsys, "alter", *bs, "--entity-type", "ips", "--entity-name", "10.9.9.9",
        "--add-config", "connection_creation_rate=3",
    )  # fmt: skip
    assert status == 0, out

    # The Java admin client sees what the command line set.
    seen = _described(java, [{"type": "user", "match": "exact", "name": "cli-user"}])
    assert seen == [
        {
            "entity": {"client-id": "cli-app", "user": "cli-user"},
            "values": {"consumer_byte_rate": 4096.0, "producer_byte_rate": 2048.0},
        }
    ]

    status, out, _ = cli(
        capsys, "describe", *bs, "--entity-type", "users", "--entity-name", "cli-user",
        "--entity-type", "clients", "--entity-name", "cli-app",
    )  # fmt: skip
    assert status == 0
    assert (
        "Quota configs for user-principal 'cli-user', client-id 'cli-app' are "
        "consumer_byte_rate=4096.0, producer_byte_rate=2048.0"
    ) in out
    status, out, _ = cli(capsys, "describe", *bs, "--entity-type", "clients", "--entity-default")
    assert status == 0
    assert "Quota configs for the default client-id are request_percentage=50.0" in out

    status, out, _ = cli(
        capsys, "alter", *bs, "--entity-type", "users", "--entity-name", "cli-user",
        "--entity-type", "clients", "--entity-name", "cli-app",
        "--delete-config", "producer_byte_rate",
    )  # fmt: skip
    assert status == 0
    seen = _described(java, [{"type": "user", "match": "exact", "name": "cli-user"}])
    assert seen[0]["values"] == {"consumer_byte_rate": 4096.0}

    # Bad input: one line with Kafka's reason, exit status 1, nothing changed.
    status, out, err = cli(
        capsys, "alter", *bs, "--entity-type", "users", "--entity-name", "cli-user",
        "--add-config", "producer_byte_rate=-5",
    )  # fmt: skip
    assert status == 1
    assert "Quota producer_byte_rate must be greater than 0" in err
    assert len(err.strip().splitlines()) == 1
    status, out, err = cli(
        capsys, "alter", *bs, "--entity-type", "ips", "--entity-name", "10.9.9.9",
        "--add-config", "producer_byte_rate=5",
    )  # fmt: skip
    assert status == 1 and "Invalid configuration key producer_byte_rate" in err
    ips = _described(java, [{"type": "ip", "match": "exact", "name": "10.9.9.9"}])
    assert ips == [{"entity": {"ip": "10.9.9.9"}, "values": {"connection_creation_rate": 3.0}}]


def test_tidelog_configs_describes_a_users_quotas_and_credentials(
    broker: BrokerProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    bs = ("--bootstrap-server", broker.bootstrap)
    user = ("--entity-type", "users", "--entity-name", "quota-only")
    assert cli(capsys, "alter", *bs, *user, "--add-config", "consumer_byte_rate=100")[0] == 0
    status, out, err = cli(capsys, "describe", *bs, *user)
    assert (status, err) == (0, "")
    assert out == "Quota configs for user-principal 'quota-only' are consumer_byte_rate=100.0\n"

    both = ("--entity-type", "users", "--entity-name", "quota-and-scram")
    assert cli(capsys, "alter", *bs, *both, "--add-config", "producer_byte_rate=300")[0] == 0
    scram = "SCRAM-SHA-256=[iterations=4096,password=secret]"
    assert cli(capsys, "alter", *bs, *both, "--add-config", scram)[0] == 0
    status, out, _ = cli(capsys, "describe", *bs, *both)
    assert status == 0
    assert out.splitlines() == [
        "Quota configs for user-principal 'quota-and-scram' are producer_byte_rate=300.0",
        "SCRAM credential configs for user-principal 'quota-and-scram' are "
        "SCRAM-SHA-256=iterations=4096",
    ]


def test_quotas_need_cluster_configs_permissions(tmp_path: Path, java_client: JavaClient) -> None:
    """With an authorizer and no ACL for the client, DescribeClientQuotas (DescribeConfigs
    on the cluster) and AlterClientQuotas (AlterConfigs on the cluster) are refused with
    CLUSTER_AUTHORIZATION_FAILED."""
    process = BrokerProcess(
        tmp_path,
        extra_args=[
            "--override",
            "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        ],
    )
    process.start()
    try:
        java = java_client.bound(process.bootstrap)
        altered = java.one(
            "quotas",
            {"alter": [{"entity": {"user": "mallory"}, "ops": {"producer_byte_rate": 1e9}}]},
        )["altered"]
        assert altered[0].startswith("ClusterAuthorizationException")
        denied = _described(java, [])
        assert denied["error"] == "ClusterAuthorizationException"
    finally:
        process.stop()


def test_version_0_of_both_apis(broker: BrokerProcess) -> None:
    """v0 (not flexible) as older clients send it; the Java client above sends v1."""
    entity = [{"entity_type": "client-id", "entity_name": "v0-app"}]
    alter = build(
        request_class(ApiKey.ALTER_CLIENT_QUOTAS, 0),
        {
            "entries": [
                {
                    "entity": entity,
                    "ops": [{"key": "consumer_byte_rate", "value": 512.0, "remove": False}],
                }
            ],
            "validate_only": False,
        },
    )
    altered = send_request("127.0.0.1", broker.port, alter, timeout=30.0)
    assert [int(e.error_code) for e in altered.entries] == [0]
    describe = build(
        request_class(ApiKey.DESCRIBE_CLIENT_QUOTAS, 0),
        {
            "components": [{"entity_type": "client-id", "match_type": 0, "match": "v0-app"}],
            "strict": True,
        },
    )
    described = send_request("127.0.0.1", broker.port, describe, timeout=30.0)
    assert int(described.error_code) == 0
    assert [
        (
            [(e.entity_type, e.entity_name) for e in entry.entity],
            [(v.key, v.value) for v in entry.values],
        )
        for entry in described.entries
    ] == [([("client-id", "v0-app")], [("consumer_byte_rate", 512.0)])]


def test_tidelog_configs_takes_kafka_configs_action_flags(
    broker: BrokerProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    """`configs --alter|--describe ...` as kafka-configs is called, besides `configs alter`."""
    bs = ("--bootstrap-server", broker.bootstrap)
    entity = ("--entity-type", "clients", "--entity-name", "flag-app")
    status, out, _ = cli(capsys, *bs, "--alter", *entity, "--add-config", "request_percentage=25")
    assert (status, out) == (0, "Completed updating config for client-id 'flag-app'.\n")
    status, out, _ = cli(capsys, "--describe", *bs, *entity)
    assert (status, out) == (
        0,
        "Quota configs for client-id 'flag-app' are request_percentage=25.0\n",
    )
    status, _, err = cli(capsys, *bs, *entity)
    assert status == 2 and "give --alter or --describe" in err
