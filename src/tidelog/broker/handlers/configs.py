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

from typing import Any

from tidelog.broker.connection import RequestContext
from tidelog.broker.handlers.registry import handles
from tidelog.broker.handlers.schema import ZERO_THROTTLE, controller, make, response_module
from tidelog.metadata.configs import ConfigEntry
from tidelog.metadata.controller import (
    AlterConfigsResource,
    ConfigResourceResult,
    DescribeConfigsResource,
    IncrementalAlterConfigsResource,
)
from tidelog.protocol import ApiKey

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
    resources = [
        DescribeConfigsResource(
            resource_type=int(resource.resource_type),
            resource_name=resource.resource_name,
            keys=tuple(resource.configuration_keys) if resource.configuration_keys else None,
        )
        for resource in request.resources
    ]
    described = controller(ctx).describe_configs(
        resources,
        include_synonyms=bool(request.include_synonyms),
        include_documentation=bool(getattr(request, "include_documentation", False)),
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
    results: list[ConfigResourceResult] = []
    if resources:
        results = await ctx.broker.run_blocking(
            controller(ctx).alter_configs, resources, validate_only=bool(request.validate_only)
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
    results: list[ConfigResourceResult] = []
    if resources:
        results = await ctx.broker.run_blocking(
            controller(ctx).incremental_alter_configs,
            resources,
            validate_only=bool(request.validate_only),
        )
    return _alter_response(module, module.IncrementalAlterConfigsResponse, results)
