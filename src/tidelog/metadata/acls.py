"""ACLs as data: Kafka's resource, pattern, operation and permission types (with their
wire codes), an ACL binding, a filter over bindings, and the check an ACL must pass to be
created.

The metadata image holds the ACLs and the controller creates and deletes them with these
types; :mod:`tidelog.security.authorizer` decides requests with them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = [
    "CLUSTER_NAME",
    "STANDARD_AUTHORIZER",
    "WILDCARD",
    "WILDCARD_PRINCIPAL",
    "AclBinding",
    "AclBindingFilter",
    "AclOperation",
    "AclPermissionType",
    "PatternType",
    "ResourceType",
    "acl_binding_error",
    "parse_super_users",
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


#: The one ``authorizer.class.name`` served: Kafka's KRaft authorizer, whose semantics
#: :mod:`tidelog.security.authorizer` has (empty: no authorization).
STANDARD_AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"


def parse_super_users(text: str) -> frozenset[str]:
    """``super.users``: principals separated by ``;`` (``User:admin;User:ops``), as
    Kafka splits them; ValueError naming the first entry that is not ``Type:name``."""
    users = set()
    for item in text.split(";"):
        entry = item.strip()
        if not entry:
            continue
        kind, sep, name = entry.partition(":")
        if not sep or not kind or not name:
            raise ValueError(f"{entry!r} is not a principal Type:name (e.g. User:admin)")
        users.add(entry)
    return frozenset(users)
