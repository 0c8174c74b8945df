"""The authorizer's decisions, rule by rule (Kafka's StandardAuthorizer semantics)."""

from __future__ import annotations

import itertools
import re

from tidelog.security.authorizer import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    Authorizer,
    PatternType,
    ResourceType,
    acl_binding_error,
)
from tidelog.security.principal import KafkaPrincipal

Op = AclOperation
ALICE = KafkaPrincipal.user("alice")
BOB = KafkaPrincipal.user("bob")
TOPIC = ResourceType.TOPIC


def acl(
    name: str,
    operation: AclOperation,
    permission: AclPermissionType = AclPermissionType.ALLOW,
    *,
    principal: str = "User:alice",
    host: str = "*",
    pattern: PatternType = PatternType.LITERAL,
    resource_type: ResourceType = TOPIC,
) -> AclBinding:
    return AclBinding(resource_type, name, pattern, principal, host, operation, permission)


def allows(authorizer: Authorizer, op: AclOperation, name: str = "orders", **kw: object) -> bool:
    principal = kw.get("principal", ALICE)
    host = kw.get("host", "10.0.0.1")
    resource_type = kw.get("resource_type", TOPIC)
    assert isinstance(principal, KafkaPrincipal) and isinstance(host, str)
    assert isinstance(resource_type, ResourceType)
    return authorizer.authorize(principal, host, op, resource_type, name)


def test_no_acls_denies_unless_everyone_is_allowed_and_super_users_always_pass() -> None:
    assert not allows(Authorizer(), Op.READ)
    assert allows(Authorizer(allow_everyone_if_no_acl_found=True), Op.READ)
    assert allows(Authorizer(super_users=["User:alice"]), Op.ALTER)
    assert not allows(Authorizer(super_users=["User:alice"]), Op.ALTER, principal=BOB)
    # A super user passes even an explicit DENY.
    deny = Authorizer([acl("orders", Op.ALL, AclPermissionType.DENY)], super_users=["User:alice"])
    assert allows(deny, Op.WRITE)


def test_deny_beats_allow_whatever_the_order() -> None:
    rules = [acl("orders", Op.READ), acl("orders", Op.READ, AclPermissionType.DENY)]
    for order in itertools.permutations(rules):
        assert not allows(Authorizer(order), Op.READ)
    # A DENY through a wildcard pattern beats a literal ALLOW too.
    wildcard_deny = [acl("orders", Op.READ), acl("*", Op.ALL, AclPermissionType.DENY)]
    assert not allows(Authorizer(wildcard_deny), Op.READ)


def test_allow_implies_describe_and_describe_configs_but_deny_implies_nothing() -> None:
    for granted in (Op.READ, Op.WRITE, Op.DELETE, Op.ALTER):
        assert allows(Authorizer([acl("orders", granted)]), Op.DESCRIBE), granted
    for granted in (Op.CREATE, Op.DESCRIBE_CONFIGS, Op.ALTER_CONFIGS, Op.IDEMPOTENT_WRITE):
        assert not allows(Authorizer([acl("orders", granted)]), Op.DESCRIBE), granted
    assert allows(Authorizer([acl("orders", Op.ALTER_CONFIGS)]), Op.DESCRIBE_CONFIGS)
    assert not allows(Authorizer([acl("orders", Op.ALTER)]), Op.DESCRIBE_CONFIGS)
    # READ does not imply WRITE, and DESCRIBE implies nothing.
    assert not allows(Authorizer([acl("orders", Op.READ)]), Op.WRITE)
    assert not allows(Authorizer([acl("orders", Op.DESCRIBE)]), Op.READ)
    # A DENY of READ leaves an allowed DESCRIBE alone.
    rules = [acl("orders", Op.DESCRIBE), acl("orders", Op.READ, AclPermissionType.DENY)]
    assert allows(Authorizer(rules), Op.DESCRIBE)
    assert not allows(Authorizer(rules), Op.READ)


def test_all_matches_every_operation_for_allow_and_deny() -> None:
    everything = Authorizer([acl("orders", Op.ALL)])
    assert all(allows(everything, op) for op in (Op.READ, Op.WRITE, Op.ALTER_CONFIGS))
    rules = [acl("orders", Op.WRITE), acl("orders", Op.ALL, AclPermissionType.DENY)]
    assert not allows(Authorizer(rules), Op.WRITE)


def test_patterns_literal_wildcard_and_prefixed() -> None:
    authorizer = Authorizer(
        [
            acl("orders", Op.READ),
            acl("pay", Op.WRITE, pattern=PatternType.PREFIXED),
            acl("*", Op.DESCRIBE, principal="User:bob"),
        ]
    )
    assert allows(authorizer, Op.READ, "orders")
    assert not allows(authorizer, Op.READ, "orders-eu")  # literal is exact
    assert allows(authorizer, Op.WRITE, "payments")
    assert allows(authorizer, Op.WRITE, "pay")
    assert not allows(authorizer, Op.WRITE, "repay")
    assert allows(authorizer, Op.DESCRIBE, "anything", principal=BOB)
    # Patterns are per resource type: a topic ACL says nothing of a group of that name.
    assert not allows(authorizer, Op.READ, "orders", resource_type=ResourceType.GROUP)


def test_principal_and_host_must_match() -> None:
    authorizer = Authorizer(
        [
            acl("orders", Op.READ, host="10.0.0.1"),
            acl("orders", Op.WRITE, principal="User:*"),
        ]
    )
    assert allows(authorizer, Op.READ)
    assert not allows(authorizer, Op.READ, host="10.0.0.2")
    assert not allows(authorizer, Op.READ, principal=BOB)
    assert allows(authorizer, Op.WRITE, principal=BOB, host="192.168.1.9")


def test_a_resource_with_any_acl_is_closed_to_the_rest_whatever_the_flag() -> None:
    # KAFKA-14435: alice may READ; with allow.everyone.if.no.acl.found, neither she nor bob
    # may WRITE, because the topic has an ACL.
    for rules, other_topic_open in (
        ([acl("orders", Op.READ)], True),
        ([acl("ord", Op.READ, pattern=PatternType.PREFIXED)], True),
        # LITERAL "*" matches every topic: none is left without an ACL.
        ([acl("*", Op.READ)], False),
    ):
        authorizer = Authorizer(rules, allow_everyone_if_no_acl_found=True)
        assert allows(authorizer, Op.READ)
        assert not allows(authorizer, Op.WRITE)
        assert not allows(authorizer, Op.WRITE, principal=BOB)
        # Another topic, with no ACL matching it, stays open under the flag.
        assert allows(authorizer, Op.WRITE, "invoices", principal=BOB) is other_topic_open


def test_invalid_bindings_are_named() -> None:
    good = acl("orders", Op.READ)
    assert acl_binding_error(good) is None
    cases = {
        "resource type": acl("orders", Op.READ, resource_type=ResourceType.ANY),
        "pattern type": acl("orders", Op.READ, pattern=PatternType.MATCH),
        "operation": acl("orders", Op.ANY),
        "permission": acl("orders", Op.READ, AclPermissionType.ANY),
        "empty": acl("", Op.READ),
        "PREFIXED pattern of '\\*'": acl("*", Op.READ, pattern=PatternType.PREFIXED),
        "kafka-cluster": acl("my-cluster", Op.ALTER, resource_type=ResourceType.CLUSTER),
        "Type:name": acl("orders", Op.READ, principal="alice"),
        "host": acl("orders", Op.READ, host=""),
    }
    for words, binding in cases.items():
        error = acl_binding_error(binding)
        assert error is not None and re.search(words, error), (words, error)
    assert (
        acl_binding_error(acl("kafka-cluster", Op.ALTER, resource_type=ResourceType.CLUSTER))
        is None
    )


def test_filters_select_as_describe_and_delete_acls_do() -> None:
    rules = [
        acl("orders", Op.READ),
        acl("ord", Op.WRITE, pattern=PatternType.PREFIXED, principal="User:bob"),
        acl("*", Op.DESCRIBE, AclPermissionType.DENY),
        acl("g1", Op.READ, resource_type=ResourceType.GROUP),
    ]

    def select(f: AclBindingFilter) -> list[AclBinding]:
        return [r for r in rules if f.matches(r)]

    assert select(AclBindingFilter()) == rules
    assert select(AclBindingFilter(resource_type=TOPIC)) == rules[:3]
    assert select(AclBindingFilter(TOPIC, "orders", PatternType.LITERAL)) == rules[:1]
    assert select(AclBindingFilter(TOPIC, "orders", PatternType.MATCH)) == rules[:3]
    assert select(AclBindingFilter(TOPIC, "invoices", PatternType.MATCH)) == rules[2:3]
    assert select(AclBindingFilter(principal="User:bob")) == rules[1:2]
    assert select(AclBindingFilter(permission=AclPermissionType.DENY)) == rules[2:3]
    assert select(AclBindingFilter(operation=Op.READ)) == [rules[0], rules[3]]


def test_authorize_any_is_kafkas_authorize_by_resource_type() -> None:
    def any_write(
        *acls: AclBinding,
        super_users: tuple[str, ...] = (),
        allow_everyone_if_no_acl_found: bool = False,
    ) -> bool:
        authorizer = Authorizer(
            acls,
            super_users=super_users,
            allow_everyone_if_no_acl_found=allow_everyone_if_no_acl_found,
        )
        return authorizer.authorize_any(ALICE, "10.0.0.1", Op.WRITE, TOPIC)

    deny = AclPermissionType.DENY
    prefixed = PatternType.PREFIXED
    assert not any_write()
    assert any_write(allow_everyone_if_no_acl_found=True)
    assert any_write(super_users=("User:alice",))
    assert any_write(acl("orders", Op.WRITE))
    assert any_write(acl("orders", Op.ALL, principal="User:*"))
    assert not any_write(acl("orders", Op.READ)), "another operation"
    assert not any_write(acl("orders", Op.WRITE, principal="User:bob"))
    assert not any_write(acl("orders", Op.WRITE), acl("orders", Op.WRITE, deny))
    assert not any_write(acl("orders", Op.WRITE), acl("ord", Op.WRITE, deny, pattern=prefixed))
    assert any_write(acl("orders", Op.WRITE), acl("ordersx", Op.WRITE, deny, pattern=prefixed))
    assert not any_write(
        acl("pay", Op.WRITE, pattern=prefixed), acl("pa", Op.ALL, deny, pattern=prefixed)
    )
    # A literal DENY does not cover a prefix: names under it that are not that literal pass.
    assert any_write(acl("pay", Op.WRITE, pattern=prefixed), acl("pay", Op.WRITE, deny))
    assert not any_write(acl("orders", Op.WRITE), acl("*", Op.WRITE, deny))
    assert any_write(acl("*", Op.WRITE), acl("orders", Op.WRITE, deny))
