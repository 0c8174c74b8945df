"""Kafka's ACL model as the protocol carries it (KIP-140): resource, pattern, operation
and permission types with their wire codes, an ACL binding and a filter over bindings.

Clients and the broker share these: the admin client builds CreateAcls, DescribeAcls and
DeleteAcls requests from them, the metadata image holds bindings, and the authorizer
decides with them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = [
    "CLUSTER_NAME",
    "WILDCARD",
    "WILDCARD_PRINCIPAL",
    "AclBinding",
    "AclBindingFilter",
    "AclOperation",
    "AclPermissionType",
    "PatternType",
    "ResourceType",
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

    def __str__(self) -> str:
        return (
            f"{self.permission.name} {self.principal} from {self.host} {self.operation.name} "
            f"on {self.resource_type.name} {self.pattern_type.name} {self.resource_name!r}"
        )

    def matches_resource(self, resource_type: ResourceType, name: str) -> bool:
        if self.resource_type != resource_type:
            return False
        if self.pattern_type == PatternType.LITERAL:
            return self.resource_name in (name, WILDCARD)
        return self.pattern_type == PatternType.PREFIXED and name.startswith(self.resource_name)


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
