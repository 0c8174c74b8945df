"""The security of one listener, built from the broker config before anything is opened.

Every key is looked up with Kafka's per-listener rule: ``listener.name.<name>.<key>``
(listener name in lower case) first, then ``<key>``; errors name the key as found. The
PLAIN users come only from ``listener.name.<name>.plain.sasl.jaas.config``, as a Kafka
broker takes them (or from a static JAAS file, which Tidelog does not read).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass

from tidelog.metadata.configs import BrokerConfig, ConfigError, ConfigValue, Endpoint
from tidelog.security.jaas import JaasConfigError, plain_users
from tidelog.security.principal import PrincipalMappingError, SslPrincipalMapper
from tidelog.security.sasl import SUPPORTED_MECHANISMS, SaslSettings
from tidelog.security.tls import Lookup, server_context

__all__ = ["ListenerSecurity", "listener_security"]

_TLS_PROTOCOLS = frozenset({"SSL", "SASL_SSL"})
_SASL_PROTOCOLS = frozenset({"SASL_PLAINTEXT", "SASL_SSL"})


@dataclass(frozen=True)
class ListenerSecurity:
    name: str
    protocol: str
    #: None: plain TCP
    ssl_context: ssl.SSLContext | None
    #: How an SSL client's certificate subject becomes its principal
    principal_mapper: SslPrincipalMapper
    #: None: no SASL; the connection is authenticated by TLS (or not at all)
    sasl: SaslSettings | None
    #: Largest request read before a SASL client has authenticated
    sasl_max_receive_size: int
    #: How long a connection whose authentication failed stays open after the answer
    #: (Kafka's connection.failed.authentication.delay.ms): clients that see the close
    #: before reading the answer (kafka-python) then still report why
    failed_authentication_delay_ms: int = 100

    @property
    def uses_tls(self) -> bool:
        return self.ssl_context is not None


def _lookup(config: BrokerConfig, listener: str) -> Lookup:
    prefix = f"listener.name.{listener.lower()}."

    def lookup(key: str) -> tuple[str, ConfigValue | None]:
        prefixed = prefix + key
        if config.is_set(prefixed):
            return prefixed, config.get(prefixed)
        return key, config.get(key)

    return lookup


def _sasl_settings(config: BrokerConfig, endpoint: Endpoint, lookup: Lookup) -> SaslSettings:
    key, value = lookup("sasl.enabled.mechanisms")
    mechanisms = tuple(
        item.strip().upper() for item in (value if isinstance(value, tuple) else ()) if item
    )
    if not mechanisms:
        raise ConfigError(key, "", f"listener {endpoint.name} needs at least one SASL mechanism")
    unsupported = [m for m in mechanisms if m not in SUPPORTED_MECHANISMS]
    if unsupported:
        raise ConfigError(
            key,
            ",".join(mechanisms),
            f"{unsupported[0]} is not supported; the mechanisms are "
            f"{', '.join(SUPPORTED_MECHANISMS)}",
        )
    users: dict[str, str] = {}
    if "PLAIN" in mechanisms:
        jaas_key = f"listener.name.{endpoint.name.lower()}.plain.sasl.jaas.config"
        text = config.get(jaas_key)
        if not isinstance(text, str) or not text:
            raise ConfigError(
                jaas_key,
                None,
                "PLAIN is enabled but has no users: set it to "
                "'org.apache.kafka.common.security.plain.PlainLoginModule required "
                'user_<name>="<password>";\'',
            )
        try:
            users = plain_users(text)
        except JaasConfigError as exc:
            # The value holds passwords: never shown.
            raise ConfigError(jaas_key, "[hidden]", str(exc)) from None
    return SaslSettings(mechanisms, users)


def listener_security(config: BrokerConfig, endpoint: Endpoint) -> ListenerSecurity:
    """The security ``endpoint`` is served with; ConfigError naming the key if a setting
    is missing or wrong (a file that cannot be read, a key that does not load...)."""
    lookup = _lookup(config, endpoint.name)
    protocol = endpoint.security_protocol
    rules_key, rules = lookup("ssl.principal.mapping.rules")
    try:
        mapper = SslPrincipalMapper(rules if isinstance(rules, str) else "DEFAULT")
    except PrincipalMappingError as exc:
        raise ConfigError(rules_key, rules, str(exc)) from None
    context = server_context(lookup) if protocol in _TLS_PROTOCOLS else None
    sasl = _sasl_settings(config, endpoint, lookup) if protocol in _SASL_PROTOCOLS else None
    size_key, size = lookup("sasl.server.max.receive.size")
    if not isinstance(size, int) or size <= 0:
        raise ConfigError(size_key, size, "must be a positive number of bytes")
    delay_key, delay = lookup("connection.failed.authentication.delay.ms")
    if not isinstance(delay, int) or delay < 0:
        raise ConfigError(delay_key, delay, "must be a number of milliseconds, at least 0")
    return ListenerSecurity(endpoint.name, protocol, context, mapper, sasl, size, delay)
