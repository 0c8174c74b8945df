"""The SASL server of one connection, sans-io: Kafka's SaslServerAuthenticator states.

A connection on a SASL listener starts unauthenticated. Before authentication Kafka
takes only ApiVersions and SaslHandshake, then the mechanism's exchange, and closes the
connection on anything else (``ILLEGAL_SASL_STATE``). The exchange is carried either by
SaslAuthenticate requests (handshake v1) or, after a handshake v0, as raw size-prefixed
tokens with no request header (the first SASL flow, KIP-43). A failed exchange answers
SASL_AUTHENTICATION_FAILED with a message (v1; v0 has no way to say it) and the
connection closes. An unknown mechanism answers UNSUPPORTED_SASL_MECHANISM with the
enabled ones and closes too.

Mechanisms: PLAIN (RFC 4616) against the users of the listener's PlainLoginModule entry;
SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802) by :mod:`scramp` against the credentials of the
metadata image, looked up when the client names its user.
"""

from __future__ import annotations

import enum
import hmac
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from scramp import ScramException
from scramp import ScramMechanism as _ScrampMechanism

from tidelog.metadata.scram import ScramCredential, ScramMechanism, mechanism_by_name
from tidelog.protocol.error_codes import ErrorCode
from tidelog.security.principal import KafkaPrincipal

_log = logging.getLogger("tidelog.security")

__all__ = [
    "SUPPORTED_MECHANISMS",
    "CredentialLookup",
    "SaslFailure",
    "SaslServer",
    "SaslSettings",
    "SaslState",
]

SUPPORTED_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")

#: (user name, mechanism) -> the user's credential, None when it has none.
CredentialLookup = Callable[[str, ScramMechanism], ScramCredential | None]


@dataclass(frozen=True)
class SaslSettings:
    """What one SASL listener accepts."""

    mechanisms: tuple[str, ...]
    #: PLAIN's users (name -> password) from the listener's PlainLoginModule entry.
    plain_users: Mapping[str, str] = field(default_factory=dict)


class SaslState(enum.Enum):
    HANDSHAKE = "handshake"  # ApiVersions or SaslHandshake expected
    AUTHENTICATE = "authenticate"  # the mechanism's exchange
    COMPLETE = "complete"
    FAILED = "failed"


class SaslFailure(Exception):
    """The exchange failed: ``code`` and a message safe to send to the client (it never
    holds a secret)."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class _Plain:
    def __init__(self, users: Mapping[str, str]) -> None:
        self._users = users

    def step(self, token: bytes) -> tuple[bytes, str | None]:
        parts = token.split(b"\x00")
        if len(parts) != 3:
            raise SaslFailure(
                ErrorCode.SASL_AUTHENTICATION_FAILED,
                "Invalid SASL/PLAIN response: expected 3 tokens",
            )
        try:
            authzid, user, password = (part.decode("utf-8") for part in parts)
        except UnicodeDecodeError:
            raise SaslFailure(
                ErrorCode.SASL_AUTHENTICATION_FAILED, "Invalid SASL/PLAIN response: not UTF-8"
            ) from None
        if not user:
            raise SaslFailure(
                ErrorCode.SASL_AUTHENTICATION_FAILED,
                "Authentication failed: username not specified",
            )
        if authzid and authzid != user:
            raise SaslFailure(
                ErrorCode.SASL_AUTHENTICATION_FAILED,
                "Authentication failed: Client requested an authorization id that is "
                "different from username",
            )
        expected = self._users.get(user)
        # Compared in constant time, and a dummy comparison for an unknown user, so the
        # answer's timing does not tell which users exist.
        matches = hmac.compare_digest(
            password.encode("utf-8"), (expected if expected is not None else "\x00").encode()
        )
        if expected is None or not matches:
            raise SaslFailure(
                ErrorCode.SASL_AUTHENTICATION_FAILED,
                "Authentication failed: Invalid username or password",
            )
        return b"", user


class _Scram:
    def __init__(self, mechanism: ScramMechanism, lookup: CredentialLookup) -> None:
        self._mechanism = mechanism
        self._lookup = lookup
        self._user: str | None = None
        # scramp checks the client-final nonce strictly (RFC 5802), as Kafka 4 does since
        # CVE-2024-56128: librdkafka before 2.6.1 repeats the client nonce there and fails.
        self._server = _ScrampMechanism(mechanism.name).make_server(self._auth_info)
        self._first = True

    def _auth_info(self, user: str) -> tuple[bytes, bytes, bytes, int] | None:
        self._user = user
        credential = self._lookup(user, self._mechanism)
        if credential is None:
            return None
        return (
            credential.salt,
            credential.stored_key,
            credential.server_key,
            credential.iterations,
        )

    def _failed(self) -> SaslFailure:
        return SaslFailure(
            ErrorCode.SASL_AUTHENTICATION_FAILED,
            "Authentication failed during authentication due to invalid credentials with "
            f"SASL mechanism {self._mechanism.name}",
        )

    def step(self, token: bytes) -> tuple[bytes, str | None]:
        try:
            text = token.decode("utf-8")
        except UnicodeDecodeError:
            raise self._failed() from None
        try:
            if self._first:
                self._first = False
                self._server.set_client_first(text)
                return self._server.get_server_first().encode("utf-8"), None
            self._server.set_client_final(text)
            final = self._server.get_server_final()
        except ScramException as exc:
            # scramp's reason (never a secret: it names the message or attribute at fault).
            _log.debug("SCRAM exchange of %r failed: %s", self._user, exc)
            raise self._failed() from None
        assert self._user is not None
        return final.encode("utf-8"), self._user


class SaslServer:
    """One connection's authentication; see the module doc for the states.

    ``handshake`` and ``authenticate`` return what to answer; a :class:`SaslFailure` from
    them means answer with its code and message, then close the connection."""

    def __init__(self, settings: SaslSettings, credentials: CredentialLookup) -> None:
        self._settings = settings
        self._credentials = credentials
        self.state = SaslState.HANDSHAKE
        self.mechanism: str | None = None
        #: handshake v0: the exchange comes as raw tokens, not SaslAuthenticate requests
        self.raw_tokens = False
        self.principal: KafkaPrincipal | None = None
        self._exchange: _Plain | _Scram | None = None

    @property
    def enabled_mechanisms(self) -> tuple[str, ...]:
        return self._settings.mechanisms

    @property
    def complete(self) -> bool:
        return self.state is SaslState.COMPLETE

    def handshake(self, mechanism: str, version: int) -> None:
        """SaslHandshake: choose ``mechanism``; raises SaslFailure (ILLEGAL_SASL_STATE after
        a handshake, UNSUPPORTED_SASL_MECHANISM for one not enabled)."""
        if self.state is not SaslState.HANDSHAKE:
            self.state = SaslState.FAILED
            raise SaslFailure(
                ErrorCode.ILLEGAL_SASL_STATE,
                f"Unexpected handshake request with client mechanism {mechanism}",
            )
        if mechanism not in self._settings.mechanisms:
            self.state = SaslState.FAILED
            raise SaslFailure(
                ErrorCode.UNSUPPORTED_SASL_MECHANISM,
                f"Unsupported SASL mechanism {mechanism}",
            )
        scram = mechanism_by_name(mechanism)
        if scram is not None:
            self._exchange = _Scram(scram, self._credentials)
        else:
            self._exchange = _Plain(self._settings.plain_users)
        self.mechanism = mechanism
        self.raw_tokens = version == 0
        self.state = SaslState.AUTHENTICATE

    def authenticate(self, token: bytes) -> bytes:
        """One token of the exchange; the token to send back. ``complete`` once the
        client is authenticated (``principal`` set)."""
        if self.state is not SaslState.AUTHENTICATE or self._exchange is None:
            self.state = SaslState.FAILED
            raise SaslFailure(
                ErrorCode.ILLEGAL_SASL_STATE,
                "Unexpected SaslAuthenticate request"
                + (" after successful authentication" if self.complete else ""),
            )
        try:
            reply, user = self._exchange.step(bytes(token))
        except SaslFailure:
            self.state = SaslState.FAILED
            raise
        if user is not None:
            self.principal = KafkaPrincipal.user(user)
            self.state = SaslState.COMPLETE
            self._exchange = None
        return reply
