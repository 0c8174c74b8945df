"""DescribeAcls, CreateAcls and DeleteAcls through their handlers, and Broker.authorizer
following the image's ACLs."""

from __future__ import annotations

from typing import Any

import pytest

from tidelog.broker.broker import Broker
from tidelog.metadata.acls import (
    STANDARD_AUTHORIZER,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)
from tidelog.protocol import ApiKey, ErrorCode
from tidelog.security.principal import KafkaPrincipal

from .admin_fixtures import call, schema, versions

# The handlers are called as User:ANONYMOUS, who manages the ACLs here as a super user.
AUTHORIZER = {
    "authorizer.class.name": STANDARD_AUTHORIZER,
    "super.users": "User:admin;User:ANONYMOUS",
}
ALICE = KafkaPrincipal.user("alice")


def request(api: str, version: int, cls: str, **fields: Any) -> Any:
    return getattr(schema(api, version), cls)(**fields)


def creation(version: int, **overrides: Any) -> Any:
    fields = {
        "resource_type": int(ResourceType.TOPIC),
        "resource_name": "orders",
        "resource_pattern_type": int(PatternType.LITERAL),
        "principal": "User:alice",
        "host": "*",
        "operation": int(AclOperation.READ),
        "permission_type": int(AclPermissionType.ALLOW),
        **overrides,
    }
    return request("create_acls", version, "AclCreation", **fields)


def match_all() -> dict[str, Any]:
    return {
        "resource_type_filter": int(ResourceType.ANY),
        "resource_name_filter": None,
        "pattern_type_filter": int(PatternType.ANY),
        "principal_filter": None,
        "host_filter": None,
        "operation": int(AclOperation.ANY),
        "permission_type": int(AclPermissionType.ANY),
    }


def create(broker: Broker, version: int, *creations: Any) -> Any:
    body = request("create_acls", version, "CreateAclsRequest", creations=creations)
    return call(broker, ApiKey.CREATE_ACLS, version, body)


def describe(broker: Broker, version: int) -> Any:
    body = request("describe_acls", version, "DescribeAclsRequest", **match_all())
    return call(broker, ApiKey.DESCRIBE_ACLS, version, body)


def delete(broker: Broker, version: int, **filter_fields: Any) -> Any:
    item = request("delete_acls", version, "DeleteAclsFilter", **{**match_all(), **filter_fields})
    body = request("delete_acls", version, "DeleteAclsRequest", filters=(item,))
    return call(broker, ApiKey.DELETE_ACLS, version, body)


def alice_may_read(broker: Broker) -> bool:
    assert broker.authorizer is not None
    return broker.authorizer.authorize(
        ALICE, "10.0.0.1", AclOperation.READ, ResourceType.TOPIC, "orders"
    )


@pytest.mark.parametrize("version", versions(ApiKey.CREATE_ACLS))
def test_every_api_answers_security_disabled_without_an_authorizer(
    admin_broker: Broker, version: int
) -> None:
    assert admin_broker.authorizer is None
    [created] = create(admin_broker, version, creation(version)).results
    assert created.error_code == ErrorCode.SECURITY_DISABLED.to_kio()
    described = describe(admin_broker, version)
    assert described.error_code == ErrorCode.SECURITY_DISABLED.to_kio()
    [deleted] = delete(admin_broker, version).filter_results
    assert deleted.error_code == ErrorCode.SECURITY_DISABLED.to_kio()
    assert dict(admin_broker.image.acls) == {}


@pytest.mark.parametrize("version", versions(ApiKey.CREATE_ACLS))
def test_the_authorizer_follows_the_acls(start_admin_broker: Any, version: int) -> None:
    broker = start_admin_broker(AUTHORIZER)
    assert not alice_may_read(broker), "no ACL and allow.everyone.if.no.acl.found=false"
    bad = creation(version, operation=int(AclOperation.ANY))
    results = create(broker, version, creation(version), bad).results
    assert [r.error_code for r in results] == [
        ErrorCode.NONE.to_kio(),
        ErrorCode.INVALID_REQUEST.to_kio(),
    ]
    assert "operation of an ACL must be specific" in (results[1].error_message or "")
    assert alice_may_read(broker)
    [resource] = describe(broker, version).resources
    assert (resource.resource_name, resource.pattern_type) == ("orders", PatternType.LITERAL)
    assert [(a.principal, a.operation) for a in resource.acls] == [
        ("User:alice", AclOperation.READ)
    ]
    [result] = delete(broker, version, principal_filter="User:alice").filter_results
    assert [m.resource_name for m in result.matching_acls] == ["orders"]
    assert not alice_may_read(broker)
    assert broker.authorizer is not None
    assert broker.authorizer.authorize(
        KafkaPrincipal.user("admin"), "h", AclOperation.ALTER, ResourceType.CLUSTER, "kafka-cluster"
    )


def test_unknown_wire_codes_are_refused_per_binding(start_admin_broker: Any) -> None:
    broker = start_admin_broker(AUTHORIZER)
    [result] = create(broker, 3, creation(3, resource_type=99)).results
    assert result.error_code == ErrorCode.INVALID_REQUEST.to_kio()
    [filtered] = delete(broker, 3, operation=99).filter_results
    assert filtered.error_code == ErrorCode.INVALID_REQUEST.to_kio()


def test_a_start_with_another_authorizer_or_bad_super_users_fails(start_admin_broker: Any) -> None:
    with pytest.raises(ValueError, match=r"authorizer\.class\.name"):
        start_admin_broker({"authorizer.class.name": "kafka.security.authorizer.AclAuthorizer"})
    with pytest.raises(ValueError, match=r"super\.users"):
        start_admin_broker({**AUTHORIZER, "super.users": "admin"})
