"""ApiVersions: the versions of every API served on the listener the request came in on."""

from __future__ import annotations

from kio.schema.api_versions.v0.request import ApiVersionsRequest as _V0

from tidelog.broker.connection import RequestContext
from tidelog.broker.handlers.registry import HANDLERS, handles
from tidelog.protocol import ApiKey, ErrorCode, api_versions_response

# Kafka checks the client software name and version of ApiVersions v3+ against this.
_SOFTWARE_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-")


def _valid_software_field(value: str) -> bool:
    # Must start and end with an alphanumeric character (Kafka's rule for these fields).
    return (
        bool(value)
        and set(value) <= _SOFTWARE_NAME_CHARS
        and value[0].isalnum()
        and value[-1].isalnum()
    )


@handles(ApiKey.API_VERSIONS)
async def handle_api_versions(ctx: RequestContext, request: object) -> object:
    version = ctx.api_version
    error = ErrorCode.NONE
    if version >= 3 and not isinstance(request, _V0):
        name = getattr(request, "client_software_name", "")
        software_version = getattr(request, "client_software_version", "")
        if not (_valid_software_field(name) and _valid_software_field(software_version)):
            error = ErrorCode.INVALID_REQUEST
    # A controller listener has its own table (with the APIs brokers send the controller).
    listener_table = ctx.broker.listener_versions.get(ctx.listener)
    return api_versions_response(
        version,
        api_keys=HANDLERS.keys() if listener_table is None else listener_table.keys(),
        supported=ctx.broker.advertised_versions if listener_table is None else listener_table,
        error_code=error,
    )
