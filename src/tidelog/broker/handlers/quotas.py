"""DescribeClientQuotas (48) and AlterClientQuotas (49), through the controller
(:mod:`tidelog.metadata.controller.quotas` has the checks and Kafka's codes).

As in Kafka, describing needs DescribeConfigs on the cluster and altering AlterConfigs on
the cluster. A quota value travels as a float64 on the wire and is stored as one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tidelog.broker.authorization import access
from tidelog.broker.connection import RequestContext
from tidelog.broker.handlers.registry import handles
from tidelog.broker.handlers.schema import ZERO_THROTTLE, controller, response_module
from tidelog.metadata.acls import AclOperation
from tidelog.metadata.controller import AlterQuotaResult, QuotaAlteration, QuotaFilterComponent
from tidelog.metadata.errors import ApiError
from tidelog.metadata.quotas import QuotaEntity
from tidelog.protocol import ApiKey


@handles(ApiKey.DESCRIBE_CLIENT_QUOTAS)
async def handle_describe_client_quotas(ctx: RequestContext, request: Any) -> object:
    module = response_module("describe_client_quotas", ctx.api_version)
    denied = access(ctx).cluster_error(AclOperation.DESCRIBE_CONFIGS)
    if denied is not None:
        error = ApiError(denied, denied.message)
        found: list[tuple[QuotaEntity, Mapping[str, float]]] = []
    else:
        components = [
            QuotaFilterComponent(c.entity_type, int(c.match_type), c.match)
            for c in request.components
        ]
        error, found = controller(ctx).describe_client_quotas(components, strict=request.strict)
    return module.DescribeClientQuotasResponse(
        throttle_time=ZERO_THROTTLE,
        error_code=error.code.to_kio(),
        error_message=error.message,
        # Kafka answers null entries with an error.
        entries=None
        if not error.ok
        else tuple(
            module.EntryData(
                entity=tuple(
                    module.EntityData(entity_type=kind, entity_name=name) for kind, name in entity
                ),
                values=tuple(
                    module.ValueData(key=key, value=value) for key, value in sorted(values.items())
                ),
            )
            for entity, values in found
        ),
    )


@handles(ApiKey.ALTER_CLIENT_QUOTAS)
async def handle_alter_client_quotas(ctx: RequestContext, request: Any) -> object:
    module = response_module("alter_client_quotas", ctx.api_version)
    alterations = [
        QuotaAlteration(
            tuple((e.entity_type, e.entity_name) for e in entry.entity),
            tuple((op.key, None if op.remove else float(op.value)) for op in entry.ops),
        )
        for entry in request.entries
    ]
    denied = access(ctx).cluster_error(AclOperation.ALTER_CONFIGS)
    results: list[AlterQuotaResult]
    if denied is not None:
        results = [
            AlterQuotaResult(a.entity, ApiError(denied, denied.message)) for a in alterations
        ]
    elif alterations:
        results = await ctx.broker.run_blocking(
            controller(ctx).alter_client_quotas, alterations, validate_only=request.validate_only
        )
    else:
        results = []
    return module.AlterClientQuotasResponse(
        throttle_time=ZERO_THROTTLE,
        entries=tuple(
            module.EntryData(
                error_code=result.error.code.to_kio(),
                error_message=result.error.message,
                entity=tuple(
                    module.EntityData(entity_type=kind, entity_name=name)
                    for kind, name in result.entity
                ),
            )
            for result in results
        ),
    )


__all__ = ["handle_alter_client_quotas", "handle_describe_client_quotas"]
