"""DescribeConfigs, AlterConfigs and IncrementalAlterConfigs on topic and broker resources.

Resources are TOPIC (2, named by the topic) and BROKER (4, named by this node's id, or ""
for the cluster-wide default). Any other type gets INVALID_REQUEST, as does a broker name
that is neither (see ``docs/metadata.md``); BROKER_LOGGER (8) is not served.

DescribeConfigs answers from the current metadata image without the controller's lock:
every config of the resource, or only the requested keys (a null or empty key list means
all; unknown keys are left out). Each entry carries Kafka's source numbers, read-only,
sensitivity (sensitive values are null), the synonyms when asked (v1+) and, from v3, the
config type and the documentation when asked. See ``docs/configuration.md`` for how values,
sources and synonyms are derived.

AlterConfigs (legacy) replaces a resource's whole set of dynamic configs: a key the
request does not list loses its override, as in Kafka. IncrementalAlterConfigs applies
SET, DELETE, APPEND and SUBTRACT key by key. Both run in a worker thread (the controller
fsyncs its log), honour ``validate_only`` (every check, nothing written) and answer per
resource with the controller's error code and message. A key listed twice in a legacy
AlterConfigs resource takes its last value, as in Kafka.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from tidelog.broker.authorization import access, in_request_order
from tidelog.broker.connection import RequestContext
from tidelog.broker.handlers.registry import handles
from tidelog.broker.handlers.schema import ZERO_THROTTLE, controller, make, response_module
from tidelog.metadata.acls import AclOperation
from tidelog.metadata.configs import ConfigEntry
from tidelog.metadata.controller import (
    AlterConfigsResource,
    ConfigResourceResult,
    DescribeConfigsResource,
    DescribeConfigsResult,
    IncrementalAlterConfigsResource,
)
from tidelog.metadata.errors import ApiError
from tidelog.protocol import ApiKey, ErrorCode

R = TypeVar("R")


def _denials(
    ctx: RequestContext, operation: AclOperation, resources: Sequence[Any]
) -> list[ErrorCode | None]:
    """Per requested resource, its authorization error (None: allowed)."""
    checks = access(ctx)
    return [
        checks.config_resource_error(operation, int(r.resource_type), r.resource_name)
        for r in resources
    ]


def _refusal(code: ErrorCode | None) -> ApiError:
    assert code is not None, "only denied resources are refused"
    return ApiError(code, code.message)


# -- DescribeConfigs -----------------------------------------------------------------------


def _entry(module: Any, entry: ConfigEntry) -> Any:
    synonym_cls = module.DescribeConfigsSynonym
    return make(
        module.DescribeConfigsResourceResult,
        name=entry.name,
        value=entry.value,
        read_only=entry.read_only,
        config_source=int(entry.config_source),
        is_sensitive=entry.is_sensitive,
        synonyms=tuple(
            synonym_cls(name=s.name, value=s.value, source=int(s.source)) for s in entry.synonyms
        ),
        config_type=int(entry.config_type),
        documentation=entry.documentation,
    )


@handles(ApiKey.DESCRIBE_CONFIGS)
async def handle_describe_configs(ctx: RequestContext, request: Any) -> object:
    module = response_module("describe_configs", ctx.api_version)
    denied = _denials(ctx, AclOperation.DESCRIBE_CONFIGS, request.resources)
    resources = [
        DescribeConfigsResource(
            resource_type=int(resource.resource_type),
            resource_name=resource.resource_name,
            keys=tuple(resource.configuration_keys) if resource.configuration_keys else None,
        )
        for resource, refused in zip(request.resources, denied, strict=True)
        if refused is None
    ]
    answered = controller(ctx).describe_configs(
        resources,
        include_synonyms=bool(request.include_synonyms),
        include_documentation=bool(getattr(request, "include_documentation", False)),
    )
    described = in_request_order(
        list(zip(request.resources, denied, strict=True)),
        [refused is None for refused in denied],
        answered,
        lambda item: DescribeConfigsResult(
            int(item[0].resource_type), item[0].resource_name, _refusal(item[1])
        ),
    )
    results = tuple(
        module.DescribeConfigsResult(
            error_code=result.error.code.to_kio(),
            error_message=result.error.message,
            resource_type=result.resource_type,
            resource_name=result.resource_name,
            configs=tuple(_entry(module, entry) for entry in result.entries),
        )
        for result in described
    )
    return module.DescribeConfigsResponse(throttle_time=ZERO_THROTTLE, results=results)


# -- AlterConfigs / IncrementalAlterConfigs ------------------------------------------------


async def _alter_authorized(
    ctx: RequestContext,
    requested: Sequence[Any],
    resources: list[R],
    alter: Callable[..., list[ConfigResourceResult]],
    validate_only: bool,
) -> list[ConfigResourceResult]:
    """``alter`` run on the ``resources`` (built from ``requested``, in order) that the
    principal may alter, the others answered with the authorization error."""
    denied = _denials(ctx, AclOperation.ALTER_CONFIGS, requested)
    allowed = [refused is None for refused in denied]
    permitted = [r for r, ok in zip(resources, allowed, strict=True) if ok]
    results: list[ConfigResourceResult] = []
    if permitted:
        results = await ctx.broker.run_blocking(alter, permitted, validate_only=validate_only)
    return in_request_order(
        list(zip(requested, denied, strict=True)),
        allowed,
        results,
        lambda item: ConfigResourceResult(
            int(item[0].resource_type), item[0].resource_name, _refusal(item[1])
        ),
    )


def _alter_response(module: Any, response_cls: Any, results: list[ConfigResourceResult]) -> Any:
    return response_cls(
        throttle_time=ZERO_THROTTLE,
        responses=tuple(
            module.AlterConfigsResourceResponse(
                error_code=result.error.code.to_kio(),
                error_message=result.error.message,
                resource_type=result.resource_type,
                resource_name=result.resource_name,
            )
            for result in results
        ),
    )


@handles(ApiKey.ALTER_CONFIGS)
async def handle_alter_configs(ctx: RequestContext, request: Any) -> object:
    module = response_module("alter_configs", ctx.api_version)
    resources = [
        AlterConfigsResource(
            resource_type=int(resource.resource_type),
            resource_name=resource.resource_name,
            configs={config.name: config.value for config in resource.configs},
        )
        for resource in request.resources
    ]
    results = await _alter_authorized(
        ctx,
        request.resources,
        resources,
        controller(ctx).alter_configs,
        bool(request.validate_only),
    )
    return _alter_response(module, module.AlterConfigsResponse, results)


@handles(ApiKey.INCREMENTAL_ALTER_CONFIGS)
async def handle_incremental_alter_configs(ctx: RequestContext, request: Any) -> object:
    module = response_module("incremental_alter_configs", ctx.api_version)
    resources = [
        IncrementalAlterConfigsResource(
            resource_type=int(resource.resource_type),
            resource_name=resource.resource_name,
            changes=[
                (config.name, int(config.config_operation), config.value)
                for config in resource.configs
            ],
        )
        for resource in request.resources
    ]
    results = await _alter_authorized(
        ctx,
        request.resources,
        resources,
        controller(ctx).incremental_alter_configs,
        bool(request.validate_only),
    )
    return _alter_response(module, module.IncrementalAlterConfigsResponse, results)
