"""SaslHandshake (17) and SaslAuthenticate (36): the broker side of SASL.

The exchange itself is :class:`tidelog.security.SaslServer`'s; these handlers carry its
tokens and answer with Kafka's codes. Before authentication the connection lets only
ApiVersions and these two through (see ``broker/connection.py``). A refused handshake
(UNSUPPORTED_SASL_MECHANISM) or a failed exchange (SASL_AUTHENTICATION_FAILED, with a
message) is answered, then the connection closes, as Kafka's SaslServerAuthenticator does.
On a listener without SASL, or after authentication, both answer ILLEGAL_SASL_STATE.
Re-authentication (KIP-368) is not offered: the session lifetime is 0.
"""

from __future__ import annotations

import datetime
import logging
from typing import Any

from kio.static.primitive import i64Timedelta

from tidelog.broker.connection import RequestContext
from tidelog.broker.handlers.registry import handles
from tidelog.broker.handlers.schema import make, response_module
from tidelog.protocol import ApiKey, ErrorCode
from tidelog.security import SaslFailure

_log = logging.getLogger("tidelog.security")

_NO_SESSION_LIMIT = i64Timedelta.parse(datetime.timedelta(0))


@handles(ApiKey.SASL_HANDSHAKE)
async def handle_sasl_handshake(ctx: RequestContext, request: Any) -> object:
    module = response_module("sasl_handshake", ctx.api_version)
    sasl = ctx.connection.sasl
    if sasl is None or sasl.complete:
        # Kafka answers a handshake on a non-SASL listener, or a second one, this way.
        return module.SaslHandshakeResponse(
            error_code=ErrorCode.ILLEGAL_SASL_STATE.to_kio(), mechanisms=()
        )
    try:
        sasl.handshake(request.mechanism, ctx.api_version)
    except SaslFailure as failure:
        _log.info("SASL handshake from %s refused: %s", ctx.peer, failure.message)
        ctx.connection.close_after_reply()
        return module.SaslHandshakeResponse(
            error_code=failure.code.to_kio(), mechanisms=sasl.enabled_mechanisms
        )
    return module.SaslHandshakeResponse(
        error_code=ErrorCode.NONE.to_kio(), mechanisms=sasl.enabled_mechanisms
    )


@handles(ApiKey.SASL_AUTHENTICATE)
async def handle_sasl_authenticate(ctx: RequestContext, request: Any) -> object:
    module = response_module("sasl_authenticate", ctx.api_version)
    sasl = ctx.connection.sasl

    def answer(code: ErrorCode, message: str | None, token: bytes = b"") -> Any:
        return make(
            module.SaslAuthenticateResponse,
            error_code=code.to_kio(),
            error_message=message,
            auth_bytes=token,
            session_lifetime=_NO_SESSION_LIMIT,
        )

    if sasl is None or sasl.complete:
        return answer(
            ErrorCode.ILLEGAL_SASL_STATE,
            "SaslAuthenticate request received after successful authentication"
            if sasl is not None
            else "SaslAuthenticate request received on a listener without SASL",
        )
    try:
        token = sasl.authenticate(request.auth_bytes)
    except SaslFailure as failure:
        # Logged once with the client's address and mechanism; the message holds no secret.
        _log.warning(
            "SASL authentication from %s with %s failed: %s",
            ctx.peer,
            sasl.mechanism,
            failure.message,
        )
        ctx.connection.close_after_reply()
        return answer(failure.code, failure.message)
    if sasl.complete:
        ctx.connection.authenticated()
    return answer(ErrorCode.NONE, None, token)
