"""ACLs as the broker keeps them: the check an ACL must pass to be created, and the
authorizer's settings. The ACL types themselves are the protocol's
(:mod:`tidelog.protocol.acls`), re-exported here for the image, the controller and the
authorizer.
"""

from __future__ import annotations

from tidelog.protocol.acls import (
    CLUSTER_NAME,
    WILDCARD,
    WILDCARD_PRINCIPAL,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)

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
