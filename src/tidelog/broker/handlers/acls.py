"""DescribeAcls (29), CreateAcls (30) and DeleteAcls (31), through the controller
(:mod:`tidelog.metadata.controller.acls` has the checks and Kafka's codes).

Without an authorizer (``authorizer.class.name`` empty) the three answer
SECURITY_DISABLED, per item where the response has items, as Kafka does. A wire code this
broker does not know becomes the enum's UNKNOWN member, as Kafka's ``fromCode`` does, so
that the controller refuses it with INVALID_REQUEST.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import IntEnum
from typing import Any, TypeVar

from kio.static.primitive import i8

from tidelog.broker.authorization import access
from tidelog.broker.connection import RequestContext
from tidelog.broker.handlers.registry import handles
from tidelog.broker.handlers.schema import ZERO_THROTTLE, controller, response_module
from tidelog.metadata.acls import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)
from tidelog.metadata.errors import ApiError
from tidelog.protocol import ApiKey, ErrorCode

E = TypeVar("E", bound=IntEnum)

#: Kafka's answer when no authorizer is configured.
NO_AUTHORIZER = ApiError(ErrorCode.SECURITY_DISABLED, "No Authorizer is configured.")


def _code(enum: type[E], value: int) -> E:
    try:
        return enum(int(value))
    except ValueError:
        return enum(0)  # UNKNOWN in each of these enums


def _authorization_off(ctx: RequestContext) -> bool:
    return ctx.broker.authorizer is None


def _cluster_denied(ctx: RequestContext, operation: AclOperation) -> ApiError | None:
    """Describe on the cluster to list ACLs, Alter to change them (Kafka's rule)."""
    denied = access(ctx).cluster_error(operation)
    return None if denied is None else ApiError(denied, denied.message)


def _filter(request: Any) -> AclBindingFilter:
    """A filter from the fields a DescribeAcls request and a DeleteAcls filter share."""
    return AclBindingFilter(
        resource_type=_code(ResourceType, request.resource_type_filter),
        resource_name=request.resource_name_filter,
        pattern_type=_code(PatternType, request.pattern_type_filter),
        principal=request.principal_filter,
        host=request.host_filter,
        operation=_code(AclOperation, request.operation),
        permission=_code(AclPermissionType, request.permission_type),
    )


@handles(ApiKey.DESCRIBE_ACLS)
async def handle_describe_acls(ctx: RequestContext, request: Any) -> object:
    module = response_module("describe_acls", ctx.api_version)
    acls: tuple[AclBinding, ...] = ()
    if _authorization_off(ctx):
        error = NO_AUTHORIZER
    elif (denied := _cluster_denied(ctx, AclOperation.DESCRIBE)) is not None:
        error = denied
    else:
        result = controller(ctx).describe_acls(_filter(request))
        error, acls = result.error, result.acls
    resources: dict[tuple[int, str, int], list[AclBinding]] = {}
    for binding in acls:
        key = (int(binding.resource_type), binding.resource_name, int(binding.pattern_type))
        resources.setdefault(key, []).append(binding)
    return module.DescribeAclsResponse(
        throttle_time=ZERO_THROTTLE,
        error_code=error.code.to_kio(),
        error_message=error.message,
        resources=tuple(
            module.DescribeAclsResource(
                resource_type=i8(resource_type),
                resource_name=name,
                pattern_type=i8(pattern_type),
                acls=tuple(
                    module.AclDescription(
                        principal=binding.principal,
                        host=binding.host,
                        operation=i8(int(binding.operation)),
                        permission_type=i8(int(binding.permission)),
                    )
                    for binding in bindings
                ),
            )
            for (resource_type, name, pattern_type), bindings in resources.items()
        ),
    )


@handles(ApiKey.CREATE_ACLS)
async def handle_create_acls(ctx: RequestContext, request: Any) -> object:
    module = response_module("create_acls", ctx.api_version)
    bindings = [
        AclBinding(
            _code(ResourceType, creation.resource_type),
            creation.resource_name,
            _code(PatternType, creation.resource_pattern_type),
            creation.principal,
            creation.host,
            _code(AclOperation, creation.operation),
            _code(AclPermissionType, creation.permission_type),
        )
        for creation in request.creations
    ]
    if _authorization_off(ctx):
        errors = [NO_AUTHORIZER] * len(bindings)
    elif (denied := _cluster_denied(ctx, AclOperation.ALTER)) is not None:
        errors = [denied] * len(bindings)
    elif bindings:
        errors = await ctx.broker.run_blocking(controller(ctx).create_acls, bindings)
    else:
        errors = []
    return module.CreateAclsResponse(
        throttle_time=ZERO_THROTTLE,
        results=tuple(
            module.AclCreationResult(error_code=error.code.to_kio(), error_message=error.message)
            for error in errors
        ),
    )


@handles(ApiKey.DELETE_ACLS)
async def handle_delete_acls(ctx: RequestContext, request: Any) -> object:
    module = response_module("delete_acls", ctx.api_version)
    filters = [_filter(item) for item in request.filters]
    if _authorization_off(ctx):
        results: list[tuple[ApiError, Iterable[AclBinding]]] = [(NO_AUTHORIZER, ())] * len(filters)
    elif (denied := _cluster_denied(ctx, AclOperation.ALTER)) is not None:
        results = [(denied, ())] * len(filters)
    elif filters:
        deleted = await ctx.broker.run_blocking(controller(ctx).delete_acls, filters)
        results = [(result.error, result.deleted) for result in deleted]
    else:
        results = []
    return module.DeleteAclsResponse(
        throttle_time=ZERO_THROTTLE,
        filter_results=tuple(
            module.DeleteAclsFilterResult(
                error_code=error.code.to_kio(),
                error_message=error.message,
                matching_acls=tuple(
                    module.DeleteAclsMatchingAcl(
                        error_code=ErrorCode.NONE.to_kio(),
                        error_message=None,
                        resource_type=i8(int(binding.resource_type)),
                        resource_name=binding.resource_name,
                        pattern_type=i8(int(binding.pattern_type)),
                        principal=binding.principal,
                        host=binding.host,
                        operation=i8(int(binding.operation)),
                        permission_type=i8(int(binding.permission)),
                    )
                    for binding in bindings
                ),
            )
            for error, bindings in results
        ),
    )
