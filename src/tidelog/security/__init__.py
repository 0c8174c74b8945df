"""Authentication: TLS server contexts, SASL mechanisms, SCRAM credentials, principals.

Sans-io apart from reading key files: the broker's connections (``tidelog.broker``) drive
TLS through :class:`ssl.SSLObject` and SASL through :class:`~.sasl.SaslServer`, and put the
resulting :class:`~.principal.KafkaPrincipal` on each request. See docs/security.md.
"""

from tidelog.metadata.scram import (
    MAX_ITERATIONS,
    MIN_ITERATIONS,
    SCRAM_MECHANISMS,
    ScramCredential,
    ScramMechanism,
    credential_from_password,
    credential_from_salted_password,
    mechanism_by_name,
    mechanism_by_type,
)
from tidelog.security.listener import ListenerSecurity, listener_security
from tidelog.security.principal import (
    ANONYMOUS,
    KafkaPrincipal,
    PrincipalMappingError,
    SslPrincipalMapper,
    rfc2253_subject,
)
from tidelog.security.sasl import (
    SUPPORTED_MECHANISMS,
    CredentialLookup,
    SaslFailure,
    SaslServer,
    SaslSettings,
    SaslState,
)

__all__ = [
    "ANONYMOUS",
    "MAX_ITERATIONS",
    "MIN_ITERATIONS",
    "SCRAM_MECHANISMS",
    "SUPPORTED_MECHANISMS",
    "CredentialLookup",
    "KafkaPrincipal",
    "ListenerSecurity",
    "PrincipalMappingError",
    "SaslFailure",
    "SaslServer",
    "SaslSettings",
    "SaslState",
    "ScramCredential",
    "ScramMechanism",
    "SslPrincipalMapper",
    "credential_from_password",
    "credential_from_salted_password",
    "listener_security",
    "mechanism_by_name",
    "mechanism_by_type",
    "rfc2253_subject",
]
