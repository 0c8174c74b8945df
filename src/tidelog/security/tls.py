"""TLS server contexts from Kafka's ``ssl.*`` configs, PEM form only.

Key store: ``ssl.keystore.type=PEM`` with either ``ssl.keystore.location`` (one PEM file
holding the private key and the certificate chain) or ``ssl.keystore.certificate.chain``
and ``ssl.keystore.key`` given inline; ``ssl.key.password`` decrypts an encrypted key.
Trust store: ``ssl.truststore.type=PEM`` with ``ssl.truststore.location`` (a PEM file of CA
certificates) or ``ssl.truststore.certificates`` inline; without either, client
certificates are checked against the system's CAs (Kafka: the JVM's default trust store).

``ssl.client.auth`` none|requested|required, ``ssl.enabled.protocols`` (TLSv1.2, TLSv1.3),
``ssl.protocol`` (checked; the enabled protocols decide), ``ssl.cipher.suites`` (IANA names
as Java writes them, or OpenSSL's; they restrict TLS 1.2, as OpenSSL through Python's
``ssl`` cannot restrict TLS 1.3's five suites, which are all strong).

Every key is looked up through a :data:`Lookup`, so the caller decides the listener
prefix (``listener.name.<l>.ssl.*`` before ``ssl.*``, Kafka's rule) and the names in
errors. A bad or missing file, key or value raises :class:`~tidelog.metadata.configs.
ConfigError` naming the key.
"""

from __future__ import annotations

import contextlib
import os
import re
import ssl
import tempfile
from collections.abc import Callable
from pathlib import Path

from tidelog.metadata.configs import ConfigError, ConfigValue

__all__ = ["CLIENT_AUTH", "Lookup", "server_context"]

#: (the key as it was found, e.g. ``listener.name.ssl.ssl.keystore.location``; its value)
Lookup = Callable[[str], tuple[str, ConfigValue | None]]

CLIENT_AUTH = {
    "none": ssl.CERT_NONE,
    "requested": ssl.CERT_OPTIONAL,
    "required": ssl.CERT_REQUIRED,
}
_PROTOCOLS = {
    "TLSv1.2": ssl.TLSVersion.TLSv1_2,
    "TLSv1.3": ssl.TLSVersion.TLSv1_3,
}
_SSL_PROTOCOLS = frozenset({"TLS", "TLSv1.2", "TLSv1.3"})
_TLS13_SUITES = frozenset(
    {
        "TLS_AES_128_GCM_SHA256",
        "TLS_AES_256_GCM_SHA384",
        "TLS_CHACHA20_POLY1305_SHA256",
        "TLS_AES_128_CCM_SHA256",
        "TLS_AES_128_CCM_8_SHA256",
    }
)
_IANA = re.compile(
    r"TLS_(?:(?P<kx>ECDHE|DHE)_)?(?P<auth>RSA|ECDSA)_WITH_"
    r"(?:AES_(?P<bits>128|256)_GCM_(?P<mac>SHA256|SHA384)|(?P<chacha>CHACHA20_POLY1305)_SHA256)"
)


def _openssl_cipher(name: str) -> str:
    """OpenSSL's name of a TLS 1.2 suite given by its IANA (Java) name; other names are
    taken to be OpenSSL's already."""
    match = _IANA.fullmatch(name)
    if match is None:
        return name
    kx, auth = match.group("kx"), match.group("auth")
    prefix = f"{kx}-{auth}-" if kx else ""
    if match.group("chacha"):
        return f"{prefix}CHACHA20-POLY1305"
    return f"{prefix}AES{match.group('bits')}-GCM-{match.group('mac')}"


def _text(lookup: Lookup, key: str) -> tuple[str, str | None]:
    name, value = lookup(key)
    if value is None or value == "":
        return name, None
    return name, str(value)


def _list(lookup: Lookup, key: str) -> tuple[str, tuple[str, ...]]:
    name, value = lookup(key)
    if isinstance(value, tuple):
        return name, tuple(item for item in value if item)
    if isinstance(value, str) and value:
        return name, tuple(item.strip() for item in value.split(",") if item.strip())
    return name, ()


def _check_pem_type(lookup: Lookup, key: str) -> None:
    name, kind = _text(lookup, key)
    if kind is not None and kind.upper() != "PEM":
        raise ConfigError(name, kind, "Tidelog reads PEM key and trust stores only; set it to PEM")


def _readable(name: str, path_text: str) -> Path:
    path = Path(path_text)
    try:
        with path.open("rb") as handle:
            handle.read(1)
    except OSError as exc:
        raise ConfigError(name, path_text, f"cannot read it: {exc.strerror or exc}") from None
    return path


def _load_key_store(context: ssl.SSLContext, lookup: Lookup) -> None:
    location_key, location = _text(lookup, "ssl.keystore.location")
    chain_key, chain = _text(lookup, "ssl.keystore.certificate.chain")
    key_key, key = _text(lookup, "ssl.keystore.key")
    password_key, password = _text(lookup, "ssl.keystore.password")
    _, key_password = _text(lookup, "ssl.key.password")
    if password is not None:
        raise ConfigError(
            password_key, "[hidden]", "a PEM key store has no store password; use ssl.key.password"
        )
    if location is not None or chain is not None or key is not None:
        # Kafka's default type is JKS: a PEM store must say so, as Kafka requires.
        _check_pem_type(lookup, "ssl.keystore.type")
    if location is not None and (chain is not None or key is not None):
        raise ConfigError(
            location_key, location, "give either the file or the inline certificate chain and key"
        )
    if location is not None:
        path = _readable(location_key, location)
        try:
            context.load_cert_chain(path, password=key_password)
        except ssl.SSLError as exc:
            raise ConfigError(
                location_key,
                location,
                f"not a PEM private key and certificate chain (or wrong ssl.key.password): "
                f"{exc.reason or exc}",
            ) from None
        return
    if chain is None or key is None:
        missing = chain_key if chain is None else key_key
        raise ConfigError(
            location_key if chain is None and key is None else missing,
            None,
            "an SSL listener needs a key store: ssl.keystore.location, or "
            "ssl.keystore.certificate.chain with ssl.keystore.key",
        )
    # The ssl module loads keys from files only: a private directory, removed at once.
    with tempfile.TemporaryDirectory(prefix="tidelog-key-") as directory:
        chain_path, key_path = Path(directory, "chain.pem"), Path(directory, "key.pem")
        for path, text in ((chain_path, chain), (key_path, key)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as handle:
                handle.write(text if text.endswith("\n") else text + "\n")
        try:
            context.load_cert_chain(chain_path, key_path, password=key_password)
        except ssl.SSLError as exc:
            raise ConfigError(
                chain_key,
                "[hidden]",
                f"the inline certificate chain and ssl.keystore.key do not load "
                f"(or ssl.key.password is wrong): {exc.reason or exc}",
            ) from None


def _load_trust_store(context: ssl.SSLContext, lookup: Lookup) -> None:
    location_key, location = _text(lookup, "ssl.truststore.location")
    inline_key, inline = _text(lookup, "ssl.truststore.certificates")
    if location is not None or inline is not None:
        _check_pem_type(lookup, "ssl.truststore.type")
    password_key, password = _text(lookup, "ssl.truststore.password")
    if password is not None:
        raise ConfigError(password_key, "[hidden]", "a PEM trust store has no password")
    try:
        if location is not None:
            context.load_verify_locations(cafile=_readable(location_key, location))
        elif inline is not None:
            context.load_verify_locations(cadata=inline)
        else:
            context.load_default_certs(ssl.Purpose.CLIENT_AUTH)
    except ssl.SSLError as exc:
        name, value = (location_key, location) if location else (inline_key, "[hidden]")
        raise ConfigError(name, value, f"not PEM CA certificates: {exc.reason or exc}") from None


def server_context(lookup: Lookup) -> ssl.SSLContext:
    """The server-side context a TLS listener serves with."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    protocol_key, protocol = _text(lookup, "ssl.protocol")
    if protocol is not None and protocol not in _SSL_PROTOCOLS:
        raise ConfigError(
            protocol_key, protocol, f"must be one of {', '.join(sorted(_SSL_PROTOCOLS))}"
        )
    enabled_key, enabled = _list(lookup, "ssl.enabled.protocols")
    if enabled:
        unknown = [name for name in enabled if name not in _PROTOCOLS]
        if unknown:
            raise ConfigError(
                enabled_key,
                ",".join(enabled),
                f"{unknown[0]} is not served; the protocols are {', '.join(_PROTOCOLS)}",
            )
        versions = sorted(_PROTOCOLS[name] for name in enabled)
        context.minimum_version = versions[0]
        context.maximum_version = versions[-1]
    else:
        context.minimum_version = ssl.TLSVersion.TLSv1_2
    suites_key, suites = _list(lookup, "ssl.cipher.suites")
    tls12 = [_openssl_cipher(name) for name in suites if name not in _TLS13_SUITES]
    if tls12:
        try:
            context.set_ciphers(":".join(tls12))
        except ssl.SSLError:
            raise ConfigError(
                suites_key, ",".join(suites), "OpenSSL knows none of these cipher suites"
            ) from None
    _load_key_store(context, lookup)
    auth_key, auth = _text(lookup, "ssl.client.auth")
    mode = CLIENT_AUTH.get((auth or "none").lower())
    if mode is None:
        raise ConfigError(auth_key, auth, "must be none, requested or required")
    if mode != ssl.CERT_NONE:
        _load_trust_store(context, lookup)
    context.verify_mode = mode
    # No renegotiation, no compression: as the JDK serves Kafka (and fewer attack paths).
    context.options |= ssl.OP_NO_COMPRESSION
    with contextlib.suppress(AttributeError):
        context.options |= ssl.OP_NO_RENEGOTIATION
    return context
