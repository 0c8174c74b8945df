"""ACLs and the decision whether a principal may do an operation on a resource, with the
semantics of Kafka's StandardAuthorizer.

An ACL binding says "principal P is ALLOWED (or DENIED) operation O from host H on the
resources matching pattern R". A pattern is a resource type and a name, LITERAL (that
name; ``*`` is every resource of the type) or PREFIXED (every name starting with it). The
decision for (principal, host, operation, resource):

1. a super user (``super.users``) is allowed everything;
2. the ACLs whose pattern matches the resource and whose principal (or ``User:*``) and
   host (or ``*``) match the request are the *matching* ACLs;
3. a matching DENY for the operation, or for ALL, denies — DENY always beats ALLOW;
4. a matching ALLOW for the operation, or for ALL, allows; an ALLOW of READ, WRITE,
   DELETE or ALTER also allows DESCRIBE, and an ALLOW of ALTER_CONFIGS allows
   DESCRIBE_CONFIGS (implication is for ALLOW only: a DENY of READ does not deny DESCRIBE);
5. otherwise, when no ACL at all has a pattern matching the resource (whatever its
   principal, host or operation), ``allow.everyone.if.no.acl.found`` decides (default:
   deny); a resource that has any ACL is denied. That a READ-only ACL of one user also
   closes WRITE to everyone else, whatever the flag, is the case KAFKA-14435 got wrong.

Lookups are per request, so the ACLs are indexed by resource type: literal names in a
dict, the ``*`` wildcard apart, prefixes in a dict probed with each prefix of the name
(as many probes as the name has characters, only when prefixed ACLs exist).

This module is sans-io: the ACLs come from the metadata image, the decision is a pure
function of them. The ACL types live in :mod:`tidelog.metadata.acls` (the image and the
controller use them too) and are re-exported here.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from tidelog.metadata.acls import (
    CLUSTER_NAME,
    STANDARD_AUTHORIZER,
    WILDCARD,
    WILDCARD_PRINCIPAL,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
    acl_binding_error,
    parse_super_users,
)
from tidelog.metadata.configs import BrokerConfig
from tidelog.security.principal import KafkaPrincipal

__all__ = [
    "CLUSTER_NAME",
    "WILDCARD",
    "WILDCARD_PRINCIPAL",
    "AclBinding",
    "AclBindingFilter",
    "AclOperation",
    "AclPermissionType",
    "Authorizer",
    "PatternType",
    "ResourceType",
    "acl_binding_error",
    "configured_authorizer",
]

# An ALLOW of these operations also allows the key (ALLOW only).
_IMPLIED_BY: dict[AclOperation, frozenset[AclOperation]] = {
    AclOperation.DESCRIBE: frozenset(
        {AclOperation.READ, AclOperation.WRITE, AclOperation.DELETE, AclOperation.ALTER}
    ),
    AclOperation.DESCRIBE_CONFIGS: frozenset({AclOperation.ALTER_CONFIGS}),
}

#: The resource name Kafka's authorizeByResourceType probes first: a name no ACL is
#: expected to name, so it is allowed exactly when any resource without ACLs would be.
_ANY_RESOURCE_PROBE = "hardcode"


@dataclass(slots=True)
class _TypeIndex:
    literal: dict[str, list[AclBinding]] = field(default_factory=dict)
    wildcard: list[AclBinding] = field(default_factory=list)
    prefixed: dict[str, list[AclBinding]] = field(default_factory=dict)

    def add(self, binding: AclBinding) -> None:
        if binding.pattern_type == PatternType.PREFIXED:
            self.prefixed.setdefault(binding.resource_name, []).append(binding)
        elif binding.resource_name == WILDCARD:
            self.wildcard.append(binding)
        else:
            self.literal.setdefault(binding.resource_name, []).append(binding)

    def for_resource(self, name: str) -> Iterator[AclBinding]:
        """Every ACL whose pattern matches ``name``."""
        yield from self.literal.get(name, ())
        yield from self.wildcard
        if self.prefixed:
            for end in range(1, len(name) + 1):
                yield from self.prefixed.get(name[:end], ())


class Authorizer:
    """The decision of the module docstring over one set of ACLs (rebuilt when they change)."""

    def __init__(
        self,
        acls: Iterable[AclBinding] = (),
        *,
        super_users: Iterable[str] = (),
        allow_everyone_if_no_acl_found: bool = False,
    ) -> None:
        self.super_users = frozenset(super_users)
        self.allow_everyone_if_no_acl_found = allow_everyone_if_no_acl_found
        self._by_type: dict[ResourceType, _TypeIndex] = {}
        for binding in acls:
            self._by_type.setdefault(binding.resource_type, _TypeIndex()).add(binding)

    def authorize(
        self,
        principal: KafkaPrincipal,
        host: str,
        operation: AclOperation,
        resource_type: ResourceType,
        name: str,
    ) -> bool:
        text = str(principal)
        if text in self.super_users:
            return True
        index = self._by_type.get(resource_type)
        allowed = False
        any_acl = False
        if index is not None:
            for acl in index.for_resource(name):
                any_acl = True
                if acl.principal not in (text, WILDCARD_PRINCIPAL):
                    continue
                if acl.host not in (host, WILDCARD):
                    continue
                if acl.permission == AclPermissionType.DENY:
                    if acl.operation in (operation, AclOperation.ALL):
                        return False
                elif acl.operation in (operation, AclOperation.ALL) or acl.operation in (
                    _IMPLIED_BY.get(operation, ())
                ):
                    allowed = True
        if allowed:
            return True
        return not any_acl and self.allow_everyone_if_no_acl_found

    def authorize_any(
        self,
        principal: KafkaPrincipal,
        host: str,
        operation: AclOperation,
        resource_type: ResourceType,
    ) -> bool:
        """Whether ``principal`` may do ``operation`` on some resource of the type (Kafka's
        ``authorizeByResourceType``, which InitProducerId asks for Write on any topic,
        KIP-679): allowed when a resource with no ACL of its own would be; else when an
        ALLOW of the principal (or ``User:*``) for the operation (or All) exists whose
        pattern no DENY of the same scope covers — a literal name denied literally or by a
        prefix of it, a prefix denied by a shorter or equal prefix; a literal ``*`` DENY
        covers all, a literal ``*`` ALLOW not covered by that allows."""
        if self.authorize(principal, host, operation, resource_type, _ANY_RESOURCE_PROBE):
            return True
        index = self._by_type.get(resource_type)
        if index is None:
            return False
        text = str(principal)
        denied_literal: set[str] = set()
        denied_prefixes: set[str] = set()
        allowed: list[AclBinding] = []
        bindings = [b for group in index.literal.values() for b in group]
        bindings += index.wildcard
        bindings += [b for group in index.prefixed.values() for b in group]
        for acl in bindings:
            if acl.principal not in (text, WILDCARD_PRINCIPAL) or acl.host not in (host, WILDCARD):
                continue
            if acl.operation not in (operation, AclOperation.ALL):
                continue
            if acl.permission == AclPermissionType.DENY:
                if acl.pattern_type == PatternType.PREFIXED:
                    denied_prefixes.add(acl.resource_name)
                elif acl.resource_name == WILDCARD:
                    return False
                else:
                    denied_literal.add(acl.resource_name)
            else:
                allowed.append(acl)
        if any(
            a.pattern_type == PatternType.LITERAL and a.resource_name == WILDCARD for a in allowed
        ):
            return True
        for acl in allowed:
            name = acl.resource_name
            if acl.pattern_type == PatternType.LITERAL and name in denied_literal:
                continue
            if not any(name[:end] in denied_prefixes for end in range(1, len(name) + 1)):
                return True
        return False


def configured_authorizer(config: BrokerConfig, acls: Iterable[AclBinding]) -> Authorizer | None:
    """The authorizer ``config`` asks for over ``acls``, or None when
    ``authorizer.class.name`` is empty (no authorization). The configuration checked the
    class name and ``super.users`` when it was loaded."""
    if config.get_str("authorizer.class.name") != STANDARD_AUTHORIZER:
        return None
    return Authorizer(
        acls,
        super_users=parse_super_users(config.get_str("super.users") or ""),
        allow_everyone_if_no_acl_found=config.get_bool("allow.everyone.if.no.acl.found"),
    )
