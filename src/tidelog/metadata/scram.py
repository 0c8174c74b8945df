"""SCRAM credentials (RFC 5802, RFC 7677) as Kafka stores them: salted keys, never passwords.

Here, below the controller, because the controller derives the keys it commits (Kafka's
ScramControlManager does too); the SASL exchange in tidelog.security reads them.

A credential is (salt, StoredKey, ServerKey, iterations). The client of
AlterUserScramCredentials sends the salt and ``SaltedPassword = Hi(password, salt, i)``;
the broker keeps only ``StoredKey = H(HMAC(SaltedPassword, "Client Key"))`` and
``ServerKey = HMAC(SaltedPassword, "Server Key")``, which verify a client's proof without
being able to produce one. The exchange itself is :mod:`scramp`'s (see :mod:`tidelog.security.sasl`).
"""

from __future__ import annotations

import hashlib
import hmac
import os
from dataclasses import dataclass

__all__ = [
    "MAX_ITERATIONS",
    "MIN_ITERATIONS",
    "SCRAM_MECHANISMS",
    "ScramCredential",
    "ScramMechanism",
    "credential_from_password",
    "credential_from_salted_password",
    "mechanism_by_name",
    "mechanism_by_type",
    "salted_password",
]

#: Kafka's bounds on a SCRAM credential's iteration count.
MIN_ITERATIONS = 4096
MAX_ITERATIONS = 16384


@dataclass(frozen=True, slots=True)
class ScramMechanism:
    name: str
    #: Kafka's ScramMechanism type id, the ``mechanism`` of the wire and the record.
    type: int
    hash_name: str


SCRAM_MECHANISMS = (
    ScramMechanism("SCRAM-SHA-256", 1, "sha256"),
    ScramMechanism("SCRAM-SHA-512", 2, "sha512"),
)
_BY_NAME = {m.name: m for m in SCRAM_MECHANISMS}
_BY_TYPE = {m.type: m for m in SCRAM_MECHANISMS}


def mechanism_by_name(name: str) -> ScramMechanism | None:
    return _BY_NAME.get(name)


def mechanism_by_type(type_id: int) -> ScramMechanism | None:
    return _BY_TYPE.get(type_id)


@dataclass(frozen=True, slots=True)
class ScramCredential:
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int


def salted_password(
    mechanism: ScramMechanism, password: str, salt: bytes, iterations: int
) -> bytes:
    # Kafka's clients send the password's UTF-8 bytes as they are (no SASLprep).
    return hashlib.pbkdf2_hmac(mechanism.hash_name, password.encode("utf-8"), salt, iterations)


def credential_from_salted_password(
    mechanism: ScramMechanism, salt: bytes, salted: bytes, iterations: int
) -> ScramCredential:
    client_key = hmac.digest(salted, b"Client Key", mechanism.hash_name)
    stored_key = hashlib.new(mechanism.hash_name, client_key).digest()
    server_key = hmac.digest(salted, b"Server Key", mechanism.hash_name)
    return ScramCredential(salt, stored_key, server_key, iterations)


def credential_from_password(
    mechanism: ScramMechanism, password: str, iterations: int, salt: bytes | None = None
) -> ScramCredential:
    """A new credential for ``password`` (``storage format --add-scram``); a random salt
    unless one is given."""
    salt = os.urandom(32) if salt is None else salt
    return credential_from_salted_password(
        mechanism, salt, salted_password(mechanism, password, salt, iterations), iterations
    )
