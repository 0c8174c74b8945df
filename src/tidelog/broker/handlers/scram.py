"""DescribeUserScramCredentials (50) and AlterUserScramCredentials (51), through the
controller (:mod:`tidelog.metadata.controller.scram` has the checks and Kafka's codes)."""

from __future__ import annotations

from typing import Any

from tidelog.broker.authorization import access
from tidelog.broker.connection import RequestContext
from tidelog.broker.handlers.registry import handles
from tidelog.broker.handlers.schema import ZERO_THROTTLE, controller, response_module
from tidelog.metadata.acls import AclOperation
from tidelog.metadata.controller import AlterScramResult, ScramDeletion, ScramUpsertion
from tidelog.metadata.errors import ApiError
from tidelog.protocol import ApiKey, ErrorCode


@handles(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS)
async def handle_describe_user_scram_credentials(ctx: RequestContext, request: Any) -> object:
    module = response_module("describe_user_scram_credentials", ctx.api_version)
    users = None if request.users is None else [user.name for user in request.users]
    denied = access(ctx).cluster_error(AclOperation.DESCRIBE)
    results = [] if denied else controller(ctx).describe_user_scram_credentials(users)
    return module.DescribeUserScramCredentialsResponse(
        throttle_time=ZERO_THROTTLE,
        error_code=(denied or ErrorCode.NONE).to_kio(),
        error_message=denied.message if denied else None,
        results=tuple(
            module.DescribeUserScramCredentialsResult(
                user=result.user,
                error_code=result.error.code.to_kio(),
                error_message=result.error.message,
                credential_infos=tuple(
                    module.CredentialInfo(mechanism=mechanism, iterations=iterations)
                    for mechanism, iterations in result.credentials
                ),
            )
            for result in results
        ),
    )


@handles(ApiKey.ALTER_USER_SCRAM_CREDENTIALS)
async def handle_alter_user_scram_credentials(ctx: RequestContext, request: Any) -> object:
    module = response_module("alter_user_scram_credentials", ctx.api_version)
    deletions = [ScramDeletion(d.name, int(d.mechanism)) for d in request.deletions]
    upsertions = [
        ScramUpsertion(
            u.name, int(u.mechanism), int(u.iterations), bytes(u.salt), bytes(u.salted_password)
        )
        for u in request.upsertions
    ]
    results = []
    denied = access(ctx).cluster_error(AclOperation.ALTER)
    if denied is not None:
        # Every user of the request gets the error, once, as Kafka answers it.
        users = dict.fromkeys([d.name for d in deletions] + [u.name for u in upsertions])
        results = [AlterScramResult(user, ApiError(denied, denied.message)) for user in users]
    elif deletions or upsertions:
        results = await ctx.broker.run_blocking(
            controller(ctx).alter_user_scram_credentials, deletions, upsertions
        )
    return module.AlterUserScramCredentialsResponse(
        throttle_time=ZERO_THROTTLE,
        results=tuple(
            module.AlterUserScramCredentialsResult(
                user=result.user,
                error_code=result.error.code.to_kio(),
                error_message=result.error.message,
            )
            for result in results
        ),
    )
