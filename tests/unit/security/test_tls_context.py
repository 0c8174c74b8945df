"""Listener security from broker configs: key and trust stores in PEM, the per-listener
prefix, and a one-line ConfigError naming the key for each bad setting."""

from __future__ import annotations

import ssl
import sys
from pathlib import Path

import pytest

from tidelog.metadata.configs import BrokerConfig, ConfigError
from tidelog.security import listener_security

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "interop"))
from interop_certs import make_certificates


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_certificates(tmp_path_factory.mktemp("certs"))


def _security(values: dict[str, str], listener: str = "SSL://127.0.0.1:0"):  # type: ignore[no-untyped-def]
    config = BrokerConfig({"listeners": listener, **values})
    return listener_security(config, config.listeners[0])


def test_file_key_store_and_required_client_certificates(certs: dict[str, Path]) -> None:
    security = _security(
        {
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(certs["broker_keystore"]),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(certs["ca"]),
            "ssl.client.auth": "required",
            "ssl.enabled.protocols": "TLSv1.3",
        }
    )
    context = security.ssl_context
    assert context is not None and context.verify_mode == ssl.CERT_REQUIRED
    assert context.minimum_version == ssl.TLSVersion.TLSv1_3
    assert security.sasl is None


def test_inline_chain_and_key_under_the_listener_prefix(certs: dict[str, Path]) -> None:
    key = (certs["broker_keystore"].parent / "broker.key").read_text()
    chain = (certs["broker_keystore"].parent / "broker.pem").read_text()
    security = _security(
        {
            "listener.name.clients.ssl.keystore.type": "PEM",
            "listener.name.clients.ssl.keystore.certificate.chain": chain,
            "listener.name.clients.ssl.keystore.key": key,
            "ssl.keystore.type": "JKS",  # the prefixed key wins, key by key (Kafka's rule)
            "listener.security.protocol.map": "CLIENTS:SSL",
        },
        listener="CLIENTS://127.0.0.1:0",
    )
    assert security.ssl_context is not None


@pytest.mark.parametrize(
    ("values", "key"),
    [
        ({}, "ssl.keystore.location"),
        ({"ssl.keystore.location": "{keystore}"}, "ssl.keystore.type"),
        (
            {"ssl.keystore.type": "PEM", "ssl.keystore.location": "/nonexistent.pem"},
            "ssl.keystore.location",
        ),
        (
            {"ssl.keystore.type": "PEM", "ssl.keystore.location": "{ca}"},
            "ssl.keystore.location",
        ),
        (
            {
                "ssl.keystore.type": "PEM",
                "ssl.keystore.location": "{keystore}",
                "ssl.enabled.protocols": "TLSv1.2,SSLv3",
            },
            "ssl.enabled.protocols",
        ),
        (
            {
                "ssl.keystore.type": "PEM",
                "ssl.keystore.location": "{keystore}",
                "ssl.cipher.suites": "TLS_NOT_A_SUITE",
            },
            "ssl.cipher.suites",
        ),
        (
            {
                "ssl.keystore.type": "PEM",
                "ssl.keystore.location": "{keystore}",
                "ssl.client.auth": "sometimes",
            },
            "ssl.client.auth",
        ),
        (
            {
                "ssl.keystore.type": "PEM",
                "ssl.keystore.location": "{keystore}",
                "ssl.principal.mapping.rules": "RULE:no-slashes",
            },
            "ssl.principal.mapping.rules",
        ),
    ],
)
def test_a_bad_setting_names_its_key(
    certs: dict[str, Path], values: dict[str, str], key: str
) -> None:
    filled = {
        k: v.format(keystore=certs["broker_keystore"], ca=certs["ca"]) for k, v in values.items()
    }
    with pytest.raises(ConfigError) as refused:
        _security(filled)
    assert f"configuration {key}:" in str(refused.value)
    assert "\n" not in str(refused.value)


def test_iana_cipher_names_are_taken(certs: dict[str, Path]) -> None:
    security = _security(
        {
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(certs["broker_keystore"]),
            "ssl.cipher.suites": "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,TLS_AES_128_GCM_SHA256",
        }
    )
    assert security.ssl_context is not None
    names = {c["name"] for c in security.ssl_context.get_ciphers() if c["protocol"] == "TLSv1.2"}
    assert names == {"ECDHE-ECDSA-AES128-GCM-SHA256"}


@pytest.mark.parametrize(
    ("values", "key"),
    [
        ({}, "sasl.enabled.mechanisms"),  # Kafka's default, GSSAPI
        ({"sasl.enabled.mechanisms": "PLAIN"}, "plain.sasl.jaas.config"),
        (
            {
                "sasl.enabled.mechanisms": "PLAIN",
                "listener.name.sasl_plaintext.plain.sasl.jaas.config": "Module required x=1",
            },
            "plain.sasl.jaas.config",
        ),
    ],
)
def test_sasl_settings_name_their_key(values: dict[str, str], key: str) -> None:
    with pytest.raises(ConfigError) as refused:
        _security(values, listener="SASL_PLAINTEXT://127.0.0.1:0")
    assert key in str(refused.value)
    assert "x=1" not in str(refused.value)  # a JAAS value may hold passwords: never shown
