"""ACLs against a real `tidelog serve`: CreateAcls, DescribeAcls and DeleteAcls through the
admin APIs of confluent-kafka, the Java client and kafka-python, and `tidelog acls`.

The broker runs with `authorizer.class.name` set to Kafka's StandardAuthorizer and
`super.users=User:ANONYMOUS`, so a PLAINTEXT client may manage ACLs (their enforcement
against real clients is test_security_acls.py). Also: ACLs survive a restart, an invalid
binding fails alone with INVALID_REQUEST, and without an authorizer every client sees
SECURITY_DISABLED.
"""

from __future__ import annotations

import io
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)
from interop_broker import BrokerProcess
from java_harness import JavaClient
from kafka import errors as kafka_errors
from kafka.admin import (
    ACL,
    ACLFilter,
    ACLOperation,
    ACLPermissionType,
    ACLResourcePatternType,
    KafkaAdminClient,
    ResourcePattern,
    ResourcePatternFilter,
)
from kafka.admin import ResourceType as KpResourceType

from tidelog.cli.main import main

TIMEOUT = 30.0
AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
SECURED_ARGS = [
    "--override",
    f"authorizer.class.name={AUTHORIZER}",
    "--override",
    "super.users=User:ANONYMOUS",
]


def start(workdir: Path, args: list[str]) -> BrokerProcess:
    process = BrokerProcess(workdir, extra_args=args)
    process.start()
    return process


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    process = start(tmp_path_factory.mktemp("secured"), SECURED_ARGS)
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def unsecured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    process = start(tmp_path_factory.mktemp("unsecured"), [])
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def name() -> str:
    """A resource name no other test uses (the secured broker is shared)."""
    return f"acl-{uuid.uuid4().hex[:8]}"


# -- confluent-kafka ----------------------------------------------------------------------


def ck_admin(broker: BrokerProcess) -> AdminClient:
    return AdminClient({"bootstrap.servers": broker.bootstrap})


def ck_acl(
    name: str,
    principal: str,
    operation: AclOperation,
    *,
    pattern: ResourcePatternType = ResourcePatternType.LITERAL,
    permission: AclPermissionType = AclPermissionType.ALLOW,
    resource: ResourceType = ResourceType.TOPIC,
) -> AclBinding:
    return AclBinding(resource, name, pattern, principal, "*", operation, permission)


def ck_filter(
    name: str | None,
    pattern: ResourcePatternType,
    principal: str | None = None,
    resource: ResourceType = ResourceType.ANY,
) -> AclBindingFilter:
    return AclBindingFilter(
        resource, name, pattern, principal, None, AclOperation.ANY, AclPermissionType.ANY
    )


def ck_describe(admin: AdminClient, acl_filter: AclBindingFilter) -> set[AclBinding]:
    return set(admin.describe_acls(acl_filter, request_timeout=TIMEOUT).result(TIMEOUT))


def test_confluent_kafka_literal_and_prefixed_acls(secured: BrokerProcess, name: str) -> None:
    admin = ck_admin(secured)
    alice_read = ck_acl(name, "User:alice", AclOperation.READ)
    bob_denied = ck_acl(
        f"{name}-pay",
        "User:bob",
        AclOperation.WRITE,
        pattern=ResourcePatternType.PREFIXED,
        permission=AclPermissionType.DENY,
    )
    group_read = ck_acl(name, "User:alice", AclOperation.READ, resource=ResourceType.GROUP)
    for future in admin.create_acls([alice_read, bob_denied, group_read]).values():
        assert future.result(TIMEOUT) is None

    assert ck_describe(admin, ck_filter(name, ResourcePatternType.LITERAL)) == {
        alice_read,
        group_read,
    }
    # MATCH: the ACLs that apply to a topic of that name, the prefixed one included.
    matching = ck_filter(f"{name}-payments", ResourcePatternType.MATCH, resource=ResourceType.TOPIC)
    assert ck_describe(admin, matching) == {bob_denied}
    prefixed = ck_filter(f"{name}-pay", ResourcePatternType.PREFIXED)
    assert ck_describe(admin, prefixed) == {bob_denied}
    # The same ACL again is accepted and still listed once.
    [again] = admin.create_acls([alice_read]).values()
    assert again.result(TIMEOUT) is None
    assert ck_describe(admin, ck_filter(name, ResourcePatternType.LITERAL, "User:alice")) == {
        alice_read,
        group_read,
    }


def test_confluent_kafka_delete_reports_per_filter(secured: BrokerProcess, name: str) -> None:
    admin = ck_admin(secured)
    alice_read = ck_acl(name, "User:alice", AclOperation.READ)
    bob_denied = ck_acl(
        name, "User:bob", AclOperation.ALL, pattern=ResourcePatternType.PREFIXED,
        permission=AclPermissionType.DENY,
    )  # fmt: skip
    for future in admin.create_acls([alice_read, bob_denied]).values():
        future.result(TIMEOUT)
    by_alice = ck_filter(name, ResourcePatternType.ANY, "User:alice", ResourceType.TOPIC)
    prefixed = ck_filter(name, ResourcePatternType.PREFIXED)
    futures = admin.delete_acls([by_alice, prefixed], request_timeout=TIMEOUT)
    assert futures[by_alice].result(TIMEOUT) == [alice_read]
    assert futures[prefixed].result(TIMEOUT) == [bob_denied]
    assert ck_describe(admin, ck_filter(name, ResourcePatternType.ANY)) == set()
    [none_left] = admin.delete_acls([prefixed]).values()
    assert none_left.result(TIMEOUT) == []


def test_confluent_kafka_invalid_binding_fails_alone(secured: BrokerProcess, name: str) -> None:
    admin = ck_admin(secured)
    valid = ck_acl(name, "User:alice", AclOperation.DESCRIBE)
    # The CLUSTER resource has one name; the client does not check it, the broker does.
    invalid = ck_acl(
        "not-the-cluster", "User:alice", AclOperation.ALTER, resource=ResourceType.BROKER
    )
    futures = admin.create_acls([valid, invalid])
    assert futures[valid].result(TIMEOUT) is None
    with pytest.raises(KafkaException) as refused:
        futures[invalid].result(TIMEOUT)
    assert refused.value.args[0].code() == KafkaError.INVALID_REQUEST
    assert "kafka-cluster" in refused.value.args[0].str()
    assert ck_describe(admin, ck_filter(None, ResourcePatternType.ANY, "User:alice")) >= {valid}
    assert not any(
        b.restype == ResourceType.BROKER
        for b in ck_describe(admin, ck_filter(None, ResourcePatternType.ANY))
    )


# -- the Java client ----------------------------------------------------------------------


def java_acl(name: str, principal: str, operation: str, **fields: str) -> dict[str, str]:
    return {
        "resource_type": "TOPIC",
        "name": name,
        "pattern": "LITERAL",
        "principal": principal,
        "host": "*",
        "operation": operation,
        "permission": "ALLOW",
        **fields,
    }


def java_filter(**fields: str | None) -> dict[str, str | None]:
    return {
        "resource_type": "ANY",
        "name": None,
        "pattern": "ANY",
        "principal": None,
        "host": None,
        "operation": "ANY",
        "permission": "ANY",
        **fields,
    }


def test_java_client_creates_describes_and_deletes_acls(
    java_client: JavaClient, secured: BrokerProcess, name: str
) -> None:
    java = java_client.bound(secured.bootstrap)
    alice = java_acl(name, "User:alice", "READ")
    carol = java_acl(name, "User:carol", "WRITE", pattern="PREFIXED", permission="DENY")
    invalid = java_acl("elsewhere", "User:alice", "ALTER", resource_type="CLUSTER")
    result = java.one(
        "acls",
        {
            "create": [alice, carol, invalid],
            "describe": java_filter(name=f"{name}-x", pattern="MATCH", resource_type="TOPIC"),
        },
    )
    assert result["created"] == [None, None, "InvalidRequestException"]
    assert result["described"] == [carol]
    result = java.one(
        "acls",
        {
            "describe": java_filter(name=name, pattern="LITERAL"),
            "delete": [java_filter(principal="User:carol"), java_filter(principal="User:nobody")],
        },
    )
    assert result["described"] == [alice]
    assert result["deleted"][0] == [carol]
    assert result["deleted"][1] == []
    after = java.one("acls", {"describe": java_filter(name=name, pattern="ANY")})
    assert after["described"] == [alice]


def test_java_client_sees_security_disabled(
    java_client: JavaClient, unsecured: BrokerProcess, name: str
) -> None:
    java = java_client.bound(unsecured.bootstrap)
    result = java.one(
        "acls",
        {
            "create": [java_acl(name, "User:alice", "READ")],
            "describe": java_filter(),
            "delete": [java_filter()],
        },
    )
    assert result == {
        "created": ["SecurityDisabledException"],
        "described": {"error": "SecurityDisabledException"},
        "deleted": [{"error": "SecurityDisabledException"}],
    }


# -- kafka-python -------------------------------------------------------------------------


def kp_admin(broker: BrokerProcess) -> KafkaAdminClient:
    return KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=30000)


def kp_acl(
    name: str,
    principal: str,
    operation: ACLOperation,
    pattern: ACLResourcePatternType = ACLResourcePatternType.LITERAL,
    resource: KpResourceType = KpResourceType.TOPIC,
) -> ACL:
    return ACL(
        principal, "*", operation, ACLPermissionType.ALLOW, ResourcePattern(resource, name, pattern)
    )


def kp_filter(
    name: str | None, pattern: ACLResourcePatternType, principal: str | None = None
) -> ACLFilter:
    return ACLFilter(
        principal,
        None,
        ACLOperation.ANY,
        ACLPermissionType.ANY,
        ResourcePatternFilter(KpResourceType.ANY, name, pattern),
    )


def kp_key(acl: ACL) -> tuple[Any, ...]:
    pattern = acl.resource_pattern
    return (
        acl.principal, acl.host, acl.operation, acl.permission_type,
        pattern.resource_type, pattern.resource_name, pattern.pattern_type,
    )  # fmt: skip


def test_kafka_python_creates_describes_and_deletes_acls(secured: BrokerProcess, name: str) -> None:
    admin = kp_admin(secured)
    try:
        alice = kp_acl(name, "User:alice", ACLOperation.DESCRIBE)
        dave = kp_acl(name, "User:dave", ACLOperation.READ, ACLResourcePatternType.PREFIXED)
        invalid = kp_acl("other", "User:dave", ACLOperation.ALTER, resource=KpResourceType.CLUSTER)
        created = admin.create_acls([alice, dave, invalid])
        assert [kp_key(a) for a in created["succeeded"]] == [kp_key(alice), kp_key(dave)]
        assert created["failed"] == [kafka_errors.InvalidRequestError]

        acls, error = admin.describe_acls(kp_filter(f"{name}-z", ACLResourcePatternType.MATCH))
        assert error is kafka_errors.NoError
        assert [kp_key(a) for a in acls] == [kp_key(dave)]

        [(_, deleted, error)] = admin.delete_acls([kp_filter(name, ACLResourcePatternType.ANY)])
        assert error is kafka_errors.NoError
        assert sorted(map(kp_key, deleted)) == sorted([kp_key(alice), kp_key(dave)])
        acls, _ = admin.describe_acls(kp_filter(name, ACLResourcePatternType.ANY))
        assert acls == []
    finally:
        admin.close()


def test_kafka_python_sees_security_disabled(unsecured: BrokerProcess, name: str) -> None:
    admin = kp_admin(unsecured)
    try:
        created = admin.create_acls([kp_acl(name, "User:alice", ACLOperation.READ)])
        assert created == {"succeeded": [], "failed": [kafka_errors.SecurityDisabledError]}
        with pytest.raises(kafka_errors.SecurityDisabledError):
            admin.describe_acls(kp_filter(None, ACLResourcePatternType.ANY))
        [(_, deleted, error)] = admin.delete_acls([kp_filter(None, ACLResourcePatternType.ANY)])
        assert (deleted, error) == ([], kafka_errors.SecurityDisabledError)
    finally:
        admin.close()


# -- no authorizer, restarts --------------------------------------------------------------


def test_confluent_kafka_sees_security_disabled(unsecured: BrokerProcess, name: str) -> None:
    admin = ck_admin(unsecured)
    acl = ck_acl(name, "User:alice", AclOperation.READ)
    everything = ck_filter(None, ResourcePatternType.ANY)
    calls = [
        lambda: admin.create_acls([acl])[acl].result(TIMEOUT),
        lambda: admin.delete_acls([everything])[everything].result(TIMEOUT),
    ]
    for call in calls:
        with pytest.raises(KafkaException) as refused:
            call()
        assert refused.value.args[0].code() == KafkaError.SECURITY_DISABLED
    # librdkafka reads DescribeAcls's top-level error code and drops it (also against
    # Kafka), so its describe is an empty success; the Java client and kafka-python above
    # show that the code on the wire is SECURITY_DISABLED.
    assert admin.describe_acls(everything).result(TIMEOUT) == []


def test_acls_survive_a_restart(tmp_path: Path, name: str) -> None:
    process = start(tmp_path, SECURED_ARGS)
    try:
        admin = ck_admin(process)
        acls = [
            ck_acl(name, "User:alice", AclOperation.READ),
            ck_acl(name, "User:bob", AclOperation.WRITE, pattern=ResourcePatternType.PREFIXED),
            ck_acl("kafka-cluster", "User:ops", AclOperation.ALTER, resource=ResourceType.BROKER),
        ]
        for future in admin.create_acls(acls).values():
            future.result(TIMEOUT)
        deleted = ck_filter(name, ResourcePatternType.ANY, "User:alice")
        admin.delete_acls([deleted])[deleted].result(TIMEOUT)
        del admin
        process.restart()
        admin = ck_admin(process)
        assert ck_describe(admin, ck_filter(None, ResourcePatternType.ANY)) == set(acls[1:])
        process.restart(hard=True)
        admin = ck_admin(process)
        assert ck_describe(admin, ck_filter(None, ResourcePatternType.ANY)) == set(acls[1:])
    finally:
        process.stop()


# -- tidelog acls -------------------------------------------------------------------------


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(["acls", *argv])
    out, err = capsys.readouterr()
    return status, out, err


def table(out: str) -> list[list[str]]:
    return [line.split() for line in out.splitlines()[1:] if line.strip()]


def test_tidelog_acls_add_list_remove(
    secured: BrokerProcess,
    name: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bs = ("--bootstrap-server", secured.bootstrap)
    status, out, _ = cli(
        capsys, *bs, "--add", "--allow-principal", "User:alice", "--operation", "Read",
        "--operation", "Describe", "--topic", name,
    )  # fmt: skip
    assert status == 0 and out.startswith("Added 2 ACL(s):")
    status, _, _ = cli(
        capsys, *bs, "--add", "--allow-principal", "User:carol", "--consumer", "--topic",
        f"{name}-in", "--group", name, "--resource-pattern-type", "prefixed",
    )  # fmt: skip
    assert status == 0
    status, out, _ = cli(
        capsys, *bs, "--list", "--topic", f"{name}-in-x", "--resource-pattern-type", "match"
    )
    assert status == 0
    assert out.splitlines()[0].split() == [
        "RESOURCE-TYPE", "NAME", "PATTERN", "PRINCIPAL", "HOST", "OPERATION", "PERMISSION"
    ]  # fmt: skip
    assert table(out) == [
        ["TOPIC", f"{name}-in", "PREFIXED", "User:carol", "*", "DESCRIBE", "ALLOW"],
        ["TOPIC", f"{name}-in", "PREFIXED", "User:carol", "*", "READ", "ALLOW"],
    ]
    status, out, _ = cli(capsys, *bs, "--list", "--group", name, "--resource-pattern-type", "any")
    assert table(out) == [["GROUP", name, "PREFIXED", "User:carol", "*", "READ", "ALLOW"]]

    # Removal asks first; anything but yes removes nothing.
    monkeypatch.setattr(sys, "stdin", io.StringIO("n\n"))
    status, _, err = cli(capsys, *bs, "--remove", "--topic", name)
    assert status == 2 and "Are you sure?" in err and "nothing removed" in err
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))
    status, out, _ = cli(
        capsys, *bs, "--remove", "--topic", name, "--allow-principal", "User:alice",
        "--operation", "Read",
    )  # fmt: skip
    assert status == 0 and table(out)[1:] == [
        ["TOPIC", name, "LITERAL", "User:alice", "*", "READ", "ALLOW"]
    ]
    status, out, _ = cli(capsys, *bs, "--remove", "--topic", name, "--force")
    assert status == 0 and out.startswith("Removed 1 ACL(s):")
    status, out, _ = cli(capsys, *bs, "--list", "--topic", name)
    assert status == 0 and table(out) == []


def test_tidelog_acls_bad_input_is_one_line(
    secured: BrokerProcess, unsecured: BrokerProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    bs = ("--bootstrap-server", secured.bootstrap)
    status, _, err = cli(capsys, *bs, "--add", "--allow-principal", "alice", "--topic", "t")
    assert status == 1 and "INVALID_REQUEST" in err and "Type:name" in err
    assert len(err.strip().splitlines()) == 1
    status, _, err = cli(
        capsys, *bs, "--add", "--allow-principal", "User:a", "--operation", "Reed", "--topic", "t"
    )
    assert status == 2 and "--operation 'Reed'" in err
    status, _, err = cli(capsys, *bs, "--add", "--allow-principal", "User:a")
    assert status == 2 and "--topic" in err
    status, _, err = cli(capsys, "--bootstrap-server", unsecured.bootstrap, "--list")
    assert status == 1 and "SECURITY_DISABLED" in err


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("authorizer.class.name=kafka.security.authorizer.AclAuthorizer", "authorizer.class.name"),
        ("super.users=User:admin;ops", "super.users"),
    ],
)
def test_a_wrong_authorizer_setting_stops_the_start_with_one_line(
    tmp_path: Path, override: str, named: str
) -> None:
    process = BrokerProcess(tmp_path, extra_args=[*SECURED_ARGS, "--override", override])
    process.data_dir.mkdir(parents=True)
    result = process.run_to_exit()
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and named in lines[0], result.stderr
    assert not any(process.data_dir.iterdir()), "nothing is written before the check"
