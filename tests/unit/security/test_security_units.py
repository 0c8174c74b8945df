"""The sans-io parts of tidelog.security: principal mapping, the JAAS entry, the SASL server
(PLAIN, and SCRAM against scramp's client), and the controller's SCRAM credential checks."""

from __future__ import annotations

from pathlib import Path

import pytest
from scramp import ScramClient

from tidelog.metadata.bootstrap import read_bootstrap, write_bootstrap
from tidelog.metadata.controller.scram import (
    ScramDeletion,
    ScramUpsertion,
    alter_user_scram_credentials,
    describe_user_scram_credentials,
)
from tidelog.metadata.errors import MetadataRecordError
from tidelog.metadata.image import MetadataImage
from tidelog.metadata.records import (
    RemoveUserScramCredentialRecord,
    UserScramCredentialRecord,
    decode_record,
    encode_record,
)
from tidelog.metadata.scram import credential_from_password, mechanism_by_name, salted_password
from tidelog.protocol import ErrorCode
from tidelog.security import (
    KafkaPrincipal,
    PrincipalMappingError,
    SaslFailure,
    SaslServer,
    SaslSettings,
    SslPrincipalMapper,
    rfc2253_subject,
)
from tidelog.security.jaas import JaasConfigError, plain_users

SUBJECT = (
    (("countryName", "DE"),),
    (("organizationName", "Acme, Inc"),),
    (("commonName", "Alice"),),
)


def test_subject_is_written_last_rdn_first_with_escapes() -> None:
    assert rfc2253_subject(SUBJECT) == "CN=Alice,O=Acme\\, Inc,C=DE"


def test_mapping_rules_first_match_wins_with_case() -> None:
    mapper = SslPrincipalMapper(r"RULE:^CN=([^,]+),O=.*$/$1/L, RULE:^OU=(.*)$/ou-$1/U,DEFAULT")
    assert mapper.principal("CN=Alice,O=Acme\\, Inc,C=DE") == KafkaPrincipal("User", "alice")
    assert mapper.name("OU=eng") == "OU-ENG"
    assert mapper.name("C=DE") == "C=DE"  # DEFAULT: the DN as it is
    with pytest.raises(PrincipalMappingError):
        SslPrincipalMapper("RULE:^CN=(.*)$/$1/").name("O=x")  # no rule applies
    with pytest.raises(PrincipalMappingError):
        SslPrincipalMapper("RULES:x/y/")


def test_plain_jaas_is_parsed_strictly() -> None:
    text = (
        "org.apache.kafka.common.security.plain.PlainLoginModule required "
        'username="admin" password="a" user_admin="a" user_alice="s3 \\"q\\"";'
    )
    assert plain_users(text) == {"admin": "a", "alice": 's3 "q"'}
    for bad in (
        'org.apache.kafka.common.security.plain.PlainLoginModule required user_a="x"',  # no ;
        'org.apache.kafka.common.security.plain.PlainLoginModule sometimes user_a="x";',
        'org.example.Other required user_a="x";',
        "org.apache.kafka.common.security.plain.PlainLoginModule required;",  # no user
    ):
        with pytest.raises(JaasConfigError):
            plain_users(bad)


def _plain_server() -> SaslServer:
    return SaslServer(SaslSettings(("PLAIN",), {"alice": "secret"}), lambda user, m: None)


def test_plain_accepts_the_password_and_refuses_others() -> None:
    server = _plain_server()
    server.handshake("PLAIN", 1)
    assert server.authenticate(b"\x00alice\x00secret") == b""
    assert server.complete and server.principal == KafkaPrincipal("User", "alice")
    for token in (b"\x00alice\x00wrong", b"\x00bob\x00secret", b"bob\x00alice\x00secret", b"x"):
        server = _plain_server()
        server.handshake("PLAIN", 1)
        with pytest.raises(SaslFailure) as failed:
            server.authenticate(token)
        assert failed.value.code is ErrorCode.SASL_AUTHENTICATION_FAILED
        assert not server.complete and server.principal is None


def test_unknown_mechanism_and_second_handshake_are_refused() -> None:
    server = _plain_server()
    with pytest.raises(SaslFailure) as failed:
        server.handshake("GSSAPI", 1)
    assert failed.value.code is ErrorCode.UNSUPPORTED_SASL_MECHANISM
    server = _plain_server()
    server.handshake("PLAIN", 0)
    assert server.raw_tokens
    with pytest.raises(SaslFailure) as failed:
        server.handshake("PLAIN", 1)
    assert failed.value.code is ErrorCode.ILLEGAL_SASL_STATE


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
@pytest.mark.parametrize("password", ["carol-secret", "wrong"])
def test_scram_exchange_against_scramps_client(mechanism: str, password: str) -> None:
    scram = mechanism_by_name(mechanism)
    assert scram is not None
    stored = credential_from_password(scram, "carol-secret", 4096)
    server = SaslServer(
        SaslSettings((mechanism,)),
        lambda user, m: stored if (user, m.name) == ("carol", mechanism) else None,
    )
    server.handshake(mechanism, 1)
    client = ScramClient([mechanism], "carol", password)
    client.set_server_first(server.authenticate(client.get_client_first().encode()).decode())
    if password != "carol-secret":
        with pytest.raises(SaslFailure):
            server.authenticate(client.get_client_final().encode())
        assert not server.complete
        return
    final = server.authenticate(client.get_client_final().encode())
    client.set_server_final(final.decode())  # the client checks the server's signature
    assert server.principal == KafkaPrincipal("User", "carol")


def _image_with(records: list[object]) -> MetadataImage:
    image, _ = MetadataImage.empty("c").apply(enumerate(records))  # type: ignore[arg-type]
    return image


class _View:
    def __init__(self, image: MetadataImage) -> None:
        self.image = image


def test_alter_checks_and_records_only_keys() -> None:
    sha256 = mechanism_by_name("SCRAM-SHA-256")
    assert sha256 is not None
    salted = salted_password(sha256, "pw", b"salt", 4096)
    view = _View(MetadataImage.empty("c"))
    result = alter_user_scram_credentials(
        view,  # type: ignore[arg-type]
        [ScramDeletion("ghost", 1)],
        [
            ScramUpsertion("alice", 1, 4096, b"salt", salted),
            ScramUpsertion("bob", 1, 100, b"salt", salted),
            ScramUpsertion("carol", 1, 20000, b"salt", salted),
            ScramUpsertion("dave", 9, 4096, b"salt", salted),
            ScramUpsertion("", 1, 4096, b"salt", salted),
            ScramUpsertion("erin", 1, 4096, b"salt", salted),
            ScramUpsertion("erin", 1, 8192, b"salt", salted),
        ],
    )
    codes = {r.user: r.error.code for r in result.response}
    assert codes == {
        "ghost": ErrorCode.RESOURCE_NOT_FOUND,
        "alice": ErrorCode.NONE,
        "bob": ErrorCode.UNACCEPTABLE_CREDENTIAL,
        "carol": ErrorCode.UNACCEPTABLE_CREDENTIAL,
        "dave": ErrorCode.UNSUPPORTED_SASL_MECHANISM,
        "": ErrorCode.UNACCEPTABLE_CREDENTIAL,
        "erin": ErrorCode.DUPLICATE_RESOURCE,
    }
    (record,) = result.records
    assert isinstance(record, UserScramCredentialRecord)
    assert record.name == "alice" and salted not in encode_record(record)
    assert decode_record(encode_record(record)) == record
    image = _image_with([record])
    described = describe_user_scram_credentials(image, None)
    assert [(d.user, d.credentials) for d in described] == [("alice", ((1, 4096),))]
    missing = describe_user_scram_credentials(image, ["alice", "nobody"])
    assert [d.error.code for d in missing] == [ErrorCode.NONE, ErrorCode.RESOURCE_NOT_FOUND]
    removed = _image_with([record, RemoveUserScramCredentialRecord("alice", 1)])
    assert removed.scram_credential("alice", 1) is None


def test_bootstrap_file_round_trip_and_damage(tmp_path: Path) -> None:
    sha512 = mechanism_by_name("SCRAM-SHA-512")
    assert sha512 is not None
    credential = credential_from_password(sha512, "admin-secret", 4096)
    record = UserScramCredentialRecord(
        "admin", 2, credential.salt, credential.stored_key, credential.server_key, 4096
    )
    assert read_bootstrap(tmp_path) == []
    path = write_bootstrap(tmp_path, [record], timestamp=0, fsync=lambda fd: None)
    assert read_bootstrap(tmp_path) == [record]
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF  # inside the CRC-covered records
    path.write_bytes(bytes(data))
    with pytest.raises(MetadataRecordError):
        read_bootstrap(tmp_path)
    write_bootstrap(tmp_path, [RemoveUserScramCredentialRecord("admin", 2)], 0, lambda fd: None)
    with pytest.raises(MetadataRecordError):
        read_bootstrap(tmp_path)
