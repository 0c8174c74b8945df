"""ACLs: CreateAcls, DeleteAcls and DescribeAcls (KIP-140), as Kafka's AclControlManager
answers them.

* CreateAcls: one result per binding, in request order. A binding that is not a valid ACL
  (:func:`~tidelog.metadata.acls.acl_binding_error`) is INVALID_REQUEST with the reason.
  An ACL equal to one that exists, or to one earlier in the same request, succeeds
  without a second record: an ACL is a set member, not a counted thing.
* DeleteAcls: per filter, the ACLs it matches (each removed once, even when several
  filters match it) or INVALID_REQUEST for a filter with an UNKNOWN value.
* DescribeAcls: the ACLs a filter matches; the same filter check.

Each new ACL gets an id from the view's random source, so that a removal names it alone.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from tidelog.metadata.acls import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
    acl_binding_error,
)
from tidelog.metadata.controller.base import ControllerResult, ControllerView, per_item
from tidelog.metadata.errors import OK, ApiError
from tidelog.metadata.image import MetadataImage
from tidelog.metadata.records import (
    AccessControlEntryRecord,
    MetadataRecord,
    RemoveAccessControlEntryRecord,
)
from tidelog.protocol.error_codes import ErrorCode
from tidelog.runtime.system import random_uuid

__all__ = [
    "AclDeleteResult",
    "AclDescribeResult",
    "create_acls",
    "delete_acls",
    "describe_acls",
    "filter_error",
]


@dataclass(frozen=True)
class AclDeleteResult:
    """What one DeleteAcls filter removed, or why it could not be applied."""

    error: ApiError = OK
    deleted: tuple[AclBinding, ...] = ()


@dataclass(frozen=True)
class AclDescribeResult:
    error: ApiError = OK
    acls: tuple[AclBinding, ...] = ()


def filter_error(acl_filter: AclBindingFilter) -> ApiError | None:
    """INVALID_REQUEST for a filter holding an UNKNOWN value (a code this broker does
    not know, or one the client could not name), which could match nothing sensibly."""
    unknown = [
        name
        for name, is_unknown in (
            ("resource type", acl_filter.resource_type == ResourceType.UNKNOWN),
            ("pattern type", acl_filter.pattern_type == PatternType.UNKNOWN),
            ("operation", acl_filter.operation == AclOperation.UNKNOWN),
            ("permission type", acl_filter.permission == AclPermissionType.UNKNOWN),
        )
        if is_unknown
    ]
    if unknown:
        return ApiError(ErrorCode.INVALID_REQUEST, f"the filter has an unknown {unknown[0]}")
    return None


def _record(acl_id: uuid.UUID, binding: AclBinding) -> AccessControlEntryRecord:
    return AccessControlEntryRecord(
        acl_id,
        int(binding.resource_type),
        binding.resource_name,
        int(binding.pattern_type),
        binding.principal,
        binding.host,
        int(binding.operation),
        int(binding.permission),
    )


def _new_id(view: ControllerView, taken: set[uuid.UUID]) -> uuid.UUID:
    while True:
        candidate = random_uuid(view.random)
        if candidate not in view.image.acls and candidate not in taken:
            taken.add(candidate)
            return candidate


def create_acls(
    view: ControllerView, bindings: Sequence[AclBinding]
) -> ControllerResult[list[ApiError]]:
    """One error (OK when created or already there) per binding, in request order."""
    existing = set(view.image.acls.values())
    ids: set[uuid.UUID] = set()
    results: list[ApiError] = []
    planned: list[tuple[int, list[MetadataRecord]]] = []
    for index, binding in enumerate(bindings):
        reason = acl_binding_error(binding)
        if reason is not None:
            results.append(ApiError(ErrorCode.INVALID_REQUEST, reason))
            continue
        results.append(OK)
        if binding not in existing:
            existing.add(binding)
            planned.append((index, [_record(_new_id(view, ids), binding)]))
    return per_item(results, planned, lambda _result, error: error)


def delete_acls(
    view: ControllerView, filters: Sequence[AclBindingFilter]
) -> ControllerResult[list[AclDeleteResult]]:
    """Per filter, the ACLs it matched (removed) or its error, in request order."""
    removed: set[uuid.UUID] = set()
    results: list[AclDeleteResult] = []
    planned: list[tuple[int, list[MetadataRecord]]] = []
    for index, acl_filter in enumerate(filters):
        error = filter_error(acl_filter)
        if error is not None:
            results.append(AclDeleteResult(error))
            continue
        matched = [(i, b) for i, b in sorted(view.image.acls.items()) if acl_filter.matches(b)]
        results.append(AclDeleteResult(OK, tuple(binding for _, binding in matched)))
        records: list[MetadataRecord] = [
            RemoveAccessControlEntryRecord(acl_id) for acl_id, _ in matched if acl_id not in removed
        ]
        removed.update(acl_id for acl_id, _ in matched)
        if records:
            planned.append((index, records))
    return per_item(results, planned, lambda _result, error: AclDeleteResult(error))


def describe_acls(image: MetadataImage, acl_filter: AclBindingFilter) -> AclDescribeResult:
    """The ACLs ``acl_filter`` matches, in a stable order (by resource, then entry)."""
    error = filter_error(acl_filter)
    if error is not None:
        return AclDescribeResult(error)
    matched = [binding for binding in image.acls.values() if acl_filter.matches(binding)]
    return AclDescribeResult(OK, tuple(sorted(matched, key=_order)))


def _order(binding: AclBinding) -> tuple[int, str, int, str, str, int, int]:
    return (
        int(binding.resource_type),
        binding.resource_name,
        int(binding.pattern_type),
        binding.principal,
        binding.host,
        int(binding.operation),
        int(binding.permission),
    )
