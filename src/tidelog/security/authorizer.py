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
function of them.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

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
]

#: The name of the one CLUSTER resource.
CLUSTER_NAME = "kafka-cluster"
#: A LITERAL pattern of this name matches every resource of its type; a host of this
#: value matches every host.
WILDCARD = "*"
WILDCARD_PRINCIPAL = "User:*"


class ResourceType(enum.IntEnum):
    """Kafka's wire codes of resource types."""

    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    #: Filters only: LITERAL of the name, LITERAL ``*``, or PREFIXED matching the name.
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class AclOperation(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14


class AclPermissionType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


# An ALLOW of these operations also allows the key (ALLOW only).
_IMPLIED_BY: dict[AclOperation, frozenset[AclOperation]] = {
    AclOperation.DESCRIBE: frozenset(
        {AclOperation.READ, AclOperation.WRITE, AclOperation.DELETE, AclOperation.ALTER}
    ),
    AclOperation.DESCRIBE_CONFIGS: frozenset({AclOperation.ALTER_CONFIGS}),
}


@dataclass(frozen=True, slots=True)
class AclBinding:
    """One ACL. ``principal`` is ``Type:name`` text as on the wire (``User:alice``,
    ``User:*``); ``host`` an address or ``*``."""

    resource_type: ResourceType
    resource_name: str
    pattern_type: PatternType
    principal: str
    host: str
    operation: AclOperation
    permission: AclPermissionType

    def matches_resource(self, resource_type: ResourceType, name: str) -> bool:
        if self.resource_type != resource_type:
            return False
        if self.pattern_type == PatternType.LITERAL:
            return self.resource_name in (name, WILDCARD)
        return self.pattern_type == PatternType.PREFIXED and name.startswith(self.resource_name)


def acl_binding_error(binding: AclBinding) -> str | None:
    """Why ``binding`` cannot be created (CreateAcls answers INVALID_REQUEST with it), or
    None. The ANY/MATCH/UNKNOWN values are for filters, never for an ACL."""
    if binding.resource_type in (ResourceType.UNKNOWN, ResourceType.ANY):
        return f"the resource type of an ACL must be specific, not {binding.resource_type.name}"
    if binding.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
        return f"the pattern type of an ACL must be LITERAL or PREFIXED, not {binding.pattern_type.name}"
    if binding.operation in (AclOperation.UNKNOWN, AclOperation.ANY):
        return f"the operation of an ACL must be specific, not {binding.operation.name}"
    if binding.permission not in (AclPermissionType.ALLOW, AclPermissionType.DENY):
        return f"the permission of an ACL must be ALLOW or DENY, not {binding.permission.name}"
    if not binding.resource_name:
        return "the resource name of an ACL must not be empty"
    if binding.pattern_type == PatternType.PREFIXED and binding.resource_name == WILDCARD:
        return "a PREFIXED pattern of '*' is not allowed: use LITERAL '*' for every resource"
    if binding.resource_type == ResourceType.CLUSTER and binding.resource_name != CLUSTER_NAME:
        return f"the CLUSTER resource is named {CLUSTER_NAME!r}, not {binding.resource_name!r}"
    kind, sep, name = binding.principal.partition(":")
    if not sep or not kind or not name:
        return f"a principal is Type:name (e.g. User:alice), not {binding.principal!r}"
    if not binding.host:
        return "the host of an ACL must be an address or '*'"
    return None


@dataclass(frozen=True, slots=True)
class AclBindingFilter:
    """What DescribeAcls and DeleteAcls select: None (or the ANY values) matches anything.

    A MATCH pattern selects the ACLs that would apply to the resource named: its LITERAL
    ACLs, the LITERAL ``*`` ACLs and the PREFIXED ACLs whose prefix starts the name."""

    resource_type: ResourceType = ResourceType.ANY
    resource_name: str | None = None
    pattern_type: PatternType = PatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: AclOperation = AclOperation.ANY
    permission: AclPermissionType = AclPermissionType.ANY

    def matches(self, binding: AclBinding) -> bool:
        if self.resource_type != ResourceType.ANY and binding.resource_type != self.resource_type:
            return False
        if not self._matches_pattern(binding):
            return False
        if self.principal is not None and binding.principal != self.principal:
            return False
        if self.host is not None and binding.host != self.host:
            return False
        if self.operation != AclOperation.ANY and binding.operation != self.operation:
            return False
        return self.permission == AclPermissionType.ANY or binding.permission == self.permission

    def _matches_pattern(self, binding: AclBinding) -> bool:
        if self.pattern_type == PatternType.MATCH:
            if self.resource_name is None:
                return True
            return binding.matches_resource(binding.resource_type, self.resource_name)
        if self.pattern_type != PatternType.ANY and binding.pattern_type != self.pattern_type:
            return False
        return self.resource_name is None or binding.resource_name == self.resource_name


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
