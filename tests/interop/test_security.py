"""TLS and SASL listeners against real clients: confluent-kafka, kcat, kafka-python, aiokafka
and the Java client each produce and consume over SSL (with a client certificate),
SASL_PLAINTEXT with PLAIN and with SCRAM-SHA-512, and SASL_SSL with SCRAM-SHA-256; each is
refused with an authentication error for a wrong password, and refused on a listener with
``ssl.client.auth=required`` when it has no certificate.

One `tidelog serve` has every listener: PLAINTEXT (setup), SSL (client certificates
requested), MTLS (SSL, certificates required), SASL_PLAINTEXT and SASL_SSL. The test CA, the
broker's and the client's certificates are made with the `openssl` command
(interop_certs.py). SCRAM users are
created through the PLAINTEXT listener with confluent-kafka's AdminClient
(AlterUserScramCredentials), except one made by `tidelog configs alter --entity-type users`.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import re
import socket
import ssl
import struct
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import test_kcat as kc
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    NewTopic,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from interop_broker import BrokerProcess, free_port, venv_bin
from interop_data import Got, Rec, assert_read_back, base_timestamp, wait_until
from java_harness import JavaClient, JavaClientError, consume_step, produce_step, step, to_gots

COUNT = 6
TIMEOUT = 30.0
PLAIN_USERS = {"alice": "alice-secret", "bob": "bob-secret"}
SCRAM_USERS = {
    ("SCRAM-SHA-256", "carol"): "carol-secret",
    ("SCRAM-SHA-512", "dave"): "dave-secret",
}


# -- the broker --------------------------------------------------------------------------------


def _jaas(users: dict[str, str]) -> str:
    options = " ".join(f'user_{name}="{password}"' for name, password in users.items())
    return f"org.apache.kafka.common.security.plain.PlainLoginModule required {options};"


class SecureBroker(BrokerProcess):
    """`tidelog serve` with PLAINTEXT (`port`, for setup), SSL, MTLS, SASL_PLAINTEXT and
    SASL_SSL listeners, each advertised at its own address."""

    def __init__(self, workdir: Path, certs: dict[str, Path]) -> None:
        super().__init__(workdir, kind="tidelog")
        self.certs = certs
        self.ports = {name: free_port() for name in ("SSL", "MTLS", "SASL_PLAINTEXT", "SASL_SSL")}

    def address(self, listener: str) -> str:
        return f"127.0.0.1:{self.ports[listener]}"

    def command(self) -> list[str]:
        listeners = ",".join(
            [f"PLAINTEXT://127.0.0.1:{self.port}"]
            + [f"{name}://127.0.0.1:{port}" for name, port in self.ports.items()]
        )
        overrides = {
            "listeners": listeners,
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SSL:SSL,MTLS:SSL,"
            "SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL",
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(self.certs["broker_keystore"]),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.certs["ca"]),
            "ssl.client.auth": "requested",
            "listener.name.mtls.ssl.client.auth": "required",
            "ssl.principal.mapping.rules": "RULE:^CN=([^,]+),OU=eng,.*$/$1/L,DEFAULT",
            "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
            "listener.name.sasl_plaintext.plain.sasl.jaas.config": _jaas(PLAIN_USERS),
            "listener.name.sasl_ssl.plain.sasl.jaas.config": _jaas(PLAIN_USERS),
        }
        command = [str(venv_bin() / "tidelog"), "serve", "--data-dir", str(self.data_dir)]
        for key, value in overrides.items():
            command += ["--override", f"{key}={value}"]
        return [*command, "--log-level", "DEBUG"]


@pytest.fixture(scope="module")
def secure(
    tmp_path_factory: pytest.TempPathFactory, certs: dict[str, Path]
) -> Iterator[SecureBroker]:
    process = SecureBroker(tmp_path_factory.mktemp("secure"), certs)
    process.start()
    try:
        admin = AdminClient({"bootstrap.servers": process.bootstrap})
        upsertions = [
            UserScramCredentialUpsertion(
                user,
                ScramCredentialInfo(getattr(ScramMechanism, m.replace("-", "_")), 8192),
                password.encode(),
            )
            for (m, user), password in SCRAM_USERS.items()
            if user != "dave"
        ]
        for future in admin.alter_user_scram_credentials(upsertions).values():
            future.result(TIMEOUT)
        # dave through the kafka-configs style command line.
        result = subprocess.run(
            [str(venv_bin() / "tidelog"), "configs", "alter", "--bootstrap-server",
             process.bootstrap, "--entity-type", "users", "--entity-name", "dave",
             "--add-config", "SCRAM-SHA-512=[iterations=4096,password=dave-secret]"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        yield process
    finally:
        gc.collect()
        process.stop()


# -- what each case hands each client ----------------------------------------------------------


@dataclass(frozen=True)
class Case:
    listener: str
    protocol: str
    mechanism: str | None = None
    user: str | None = None
    password: str | None = None
    client_cert: bool = False

    def wrong(self) -> Case:
        return Case(self.listener, self.protocol, self.mechanism, self.user, "not-the-password")


CASES = {
    "ssl": Case("SSL", "SSL", client_cert=True),
    "sasl-plain": Case("SASL_PLAINTEXT", "SASL_PLAINTEXT", "PLAIN", "alice", "alice-secret"),
    "sasl-scram-512": Case(
        "SASL_PLAINTEXT", "SASL_PLAINTEXT", "SCRAM-SHA-512", "dave", "dave-secret"
    ),
    "sasl-ssl-scram-256": Case("SASL_SSL", "SASL_SSL", "SCRAM-SHA-256", "carol", "carol-secret"),
}
NO_CERT_ON_MTLS = Case("MTLS", "SSL")


@dataclass
class Settings:
    """One case as each client family spells it."""

    bootstrap: str
    librdkafka: dict[str, str] = field(default_factory=dict)
    java: dict[str, str] = field(default_factory=dict)
    python: dict[str, Any] = field(default_factory=dict)


def settings(broker: SecureBroker, case: Case, certs: dict[str, Path]) -> Settings:
    out = Settings(broker.address(case.listener))
    out.librdkafka["security.protocol"] = case.protocol
    out.java["security.protocol"] = case.protocol
    out.python["security_protocol"] = case.protocol
    if case.protocol in ("SSL", "SASL_SSL"):
        out.librdkafka["ssl.ca.location"] = str(certs["ca"])
        out.java.update({"ssl.truststore.type": "PEM", "ssl.truststore.location": str(certs["ca"])})
        out.python["ssl_cafile"] = str(certs["ca"])
        if case.client_cert:
            out.librdkafka["ssl.certificate.location"] = str(certs["client_cert"])
            out.librdkafka["ssl.key.location"] = str(certs["client_key"])
            out.java.update(
                {"ssl.keystore.type": "PEM", "ssl.keystore.location": str(certs["client_keystore"])}
            )
            out.python["ssl_certfile"] = str(certs["client_cert"])
            out.python["ssl_keyfile"] = str(certs["client_key"])
    if case.mechanism is not None:
        out.librdkafka.update(
            {"sasl.mechanism": case.mechanism, "sasl.username": case.user or "",
             "sasl.password": case.password or ""}
        )  # fmt: skip
        module = (
            "org.apache.kafka.common.security.plain.PlainLoginModule"
            if case.mechanism == "PLAIN"
            else "org.apache.kafka.common.security.scram.ScramLoginModule"
        )
        out.java["sasl.mechanism"] = case.mechanism
        out.java["sasl.jaas.config"] = (
            f'{module} required username="{case.user}" password="{case.password}";'
        )
        out.python.update(
            {"sasl_mechanism": case.mechanism, "sasl_plain_username": case.user,
             "sasl_plain_password": case.password}
        )  # fmt: skip
    return out


def records_for(tag: str) -> list[Rec]:
    base = base_timestamp()
    return [Rec(b"k%d" % i, f"{tag}-{i}".encode(), (), 0, base + i) for i in range(COUNT)]


def create_topic(broker: SecureBroker, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(TIMEOUT)


# -- one produce and consume per client --------------------------------------------------------


def confluent_roundtrip(s: Settings, topic: str, records: list[Rec]) -> list[Got]:
    producer = Producer({"bootstrap.servers": s.bootstrap, **s.librdkafka})
    errors: list[object] = []
    for rec in records:
        producer.produce(topic, rec.value, rec.key, partition=0, timestamp=rec.timestamp or 0,
                         on_delivery=lambda err, _msg: errors.append(err) if err else None)  # fmt: skip
    assert producer.flush(TIMEOUT) == 0 and not errors, errors
    consumer = Consumer(
        {"bootstrap.servers": s.bootstrap, "group.id": f"g-{topic}", "enable.auto.commit": False,
         **s.librdkafka}
    )  # fmt: skip
    consumer.assign([TopicPartition(topic, 0, 0)])
    got: list[Got] = []
    try:
        wait_until(lambda: _poll_into(consumer, got) >= len(records), "confluent consume", TIMEOUT)
    finally:
        consumer.close()
    return got


def _poll_into(consumer: Consumer, got: list[Got]) -> int:
    msg = consumer.poll(0.5)
    if msg is not None:
        if msg.error():
            raise KafkaException(msg.error())
        got.append(Got(msg.partition(), msg.offset(), msg.timestamp()[1], msg.key(), msg.value()))
    return len(got)


def kcat_librdkafka_version() -> tuple[int, ...]:
    banner = subprocess.run([kc.KCAT, "-V"], capture_output=True, text=True, timeout=30).stdout
    match = re.search(r"librdkafka (\d+)\.(\d+)\.(\d+)", banner)
    assert match is not None, banner
    return tuple(int(part) for part in match.groups())


# librdkafka before 2.6.1 repeats the client nonce in its SCRAM client-final message; Kafka 4
# refuses that (strict RFC 5802 check since CVE-2024-56128), and so does Tidelog.
SCRAM_NONCE_FIXED = (2, 6, 1)


def _kcat_args(s: Settings) -> list[str]:
    return ["-b", s.bootstrap, *(a for k, v in s.librdkafka.items() for a in ("-X", f"{k}={v}"))]


def kcat_roundtrip(s: Settings, topic: str, records: list[Rec]) -> list[Got]:
    body = b"".join(rec.key + b"\t" + rec.value + b"\n" for rec in records if rec.key and rec.value)
    produced = subprocess.run(
        [kc.KCAT, *_kcat_args(s), "-P", "-t", topic, "-p", "0", "-K", "\t"],
        input=body, capture_output=True, timeout=TIMEOUT,
    )  # fmt: skip
    assert produced.returncode == 0, produced.stderr.decode(errors="replace")
    consumed = subprocess.run(
        [kc.KCAT, *_kcat_args(s), "-C", "-t", topic, "-p", "0", "-o", "beginning",
         "-c", str(len(records)), "-e", "-f", kc.FORMAT],
        capture_output=True, timeout=TIMEOUT,
    )  # fmt: skip
    assert consumed.returncode == 0, consumed.stderr.decode(errors="replace")
    return kc.parse(consumed.stdout)


def kafka_python_roundtrip(s: Settings, topic: str, records: list[Rec]) -> list[Got]:
    from kafka import KafkaConsumer, KafkaProducer
    from kafka import TopicPartition as KpPartition

    producer = KafkaProducer(bootstrap_servers=s.bootstrap, **s.python)
    try:
        for rec in records:
            producer.send(topic, rec.value, rec.key, partition=0, timestamp_ms=rec.timestamp)
        producer.flush(TIMEOUT)
    finally:
        producer.close()
    consumer = KafkaConsumer(bootstrap_servers=s.bootstrap, enable_auto_commit=False, **s.python)
    got: list[Got] = []
    try:
        consumer.assign([KpPartition(topic, 0)])
        consumer.seek_to_beginning()

        def poll() -> int:
            for batch in consumer.poll(500).values():
                got.extend(Got(r.partition, r.offset, r.timestamp, r.key, r.value) for r in batch)
            return len(got)

        wait_until(lambda: poll() >= len(records), "kafka-python consume", TIMEOUT)
    finally:
        consumer.close()
    return got


def _aiokafka_options(s: Settings) -> dict[str, Any]:
    options = {k: v for k, v in s.python.items() if not k.startswith("ssl_")}
    if "ssl_cafile" in s.python:
        from aiokafka.helpers import create_ssl_context

        options["ssl_context"] = create_ssl_context(
            cafile=s.python["ssl_cafile"],
            certfile=s.python.get("ssl_certfile"),
            keyfile=s.python.get("ssl_keyfile"),
        )
    return options


def aiokafka_roundtrip(s: Settings, topic: str, records: list[Rec]) -> list[Got]:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka import TopicPartition as AioPartition

    async def run() -> list[Got]:
        producer = AIOKafkaProducer(bootstrap_servers=s.bootstrap, **_aiokafka_options(s))
        await producer.start()
        try:
            for rec in records:
                await producer.send_and_wait(
                    topic, rec.value, rec.key, partition=0, timestamp_ms=rec.timestamp
                )
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(
            bootstrap_servers=s.bootstrap, enable_auto_commit=False, **_aiokafka_options(s)
        )
        await consumer.start()
        got: list[Got] = []
        try:
            consumer.assign([AioPartition(topic, 0)])
            await consumer.seek_to_beginning()
            while len(got) < len(records):
                batches = await asyncio.wait_for(consumer.getmany(timeout_ms=500), TIMEOUT)
                for batch in batches.values():
                    got.extend(
                        Got(r.partition, r.offset, r.timestamp, r.key, r.value) for r in batch
                    )
        finally:
            await consumer.stop()
        return got

    return asyncio.run(asyncio.wait_for(run(), 2 * TIMEOUT))


def java_roundtrip(java: JavaClient, s: Settings, topic: str, records: list[Rec]) -> list[Got]:
    client = java.bound(s.bootstrap)
    _, consumed = client.batch(
        produce_step(topic, records, configs=s.java),
        consume_step(topic, max_records=len(records), partitions=[0], configs=s.java),
    )
    return to_gots(consumed)


Roundtrip = Callable[[Settings, str, list[Rec]], list[Got]]
CLIENTS: dict[str, Roundtrip] = {
    "confluent-kafka": confluent_roundtrip,
    "kcat": kcat_roundtrip,
    "kafka-python": kafka_python_roundtrip,
    "aiokafka": aiokafka_roundtrip,
}


# -- the tests ---------------------------------------------------------------------------------


@pytest.mark.parametrize("case_name", list(CASES))
@pytest.mark.parametrize("client", [*CLIENTS, "java"])
def test_produce_and_consume(
    secure: SecureBroker,
    certs: dict[str, Path],
    java_client: JavaClient,
    topic_name: str,
    client: str,
    case_name: str,
) -> None:
    case = CASES[case_name]
    s = settings(secure, case, certs)
    records = records_for(f"{client}-{case_name}")
    create_topic(secure, topic_name)
    scram = case.mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512")
    if client == "kcat" and scram and kcat_librdkafka_version() < SCRAM_NONCE_FIXED:
        # The right password, refused as Kafka 4 refuses this librdkafka.
        said = _refused_kcat(s)
        assert "Authentication failed" in said, said
        return
    if client == "java":
        got = java_roundtrip(java_client, s, topic_name, records)
    else:
        got = CLIENTS[client](s, topic_name, records)
    # kcat stamps records itself; the others send the records' timestamps.
    assert_read_back(records, got, check_timestamps=client != "kcat", check_headers=False)


@contextlib.contextmanager
def client_log(*loggers: str) -> Iterator[list[str]]:
    """What the named client loggers say meanwhile: kafka-python and aiokafka report the
    broker's authentication error there, and raise a connection error."""
    said: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            said.append(record.getMessage())

    handler = Keep(logging.DEBUG)
    for name in loggers:
        logging.getLogger(name).addHandler(handler)
    try:
        yield said
    finally:
        for name in loggers:
            logging.getLogger(name).removeHandler(handler)


def _refused_confluent(s: Settings) -> str:
    errors: list[str] = []
    admin = AdminClient(
        {"bootstrap.servers": s.bootstrap, **s.librdkafka,
         "error_cb": lambda err: errors.append(str(err))}
    )  # fmt: skip
    with pytest.raises(KafkaException) as refused:
        admin.list_topics(timeout=10)
    # error_cb runs from poll(): serve it until librdkafka has reported the failure.
    wait_until(lambda: admin.poll(0.2) is not None and errors, "librdkafka's error callback")
    return "\n".join([str(refused.value), *errors])


def _refused_kcat(s: Settings) -> str:
    result = subprocess.run(
        [kc.KCAT, *_kcat_args(s), "-L", "-m", "10"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0, result.stdout
    return result.stderr


def _refused_kafka_python(s: Settings) -> str:
    from kafka import KafkaProducer
    from kafka.errors import KafkaError

    with client_log("kafka") as said, pytest.raises(KafkaError) as refused:
        KafkaProducer(bootstrap_servers=s.bootstrap, request_timeout_ms=10000,
                      max_block_ms=10000, **s.python).close()  # fmt: skip
    return "\n".join([f"{type(refused.value).__name__}: {refused.value}", *said])


def _refused_aiokafka(s: Settings) -> str:
    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import KafkaError

    async def start() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=s.bootstrap, request_timeout_ms=10000,
                                    **_aiokafka_options(s))  # fmt: skip
        try:
            await producer.start()
        finally:
            await producer.stop()

    with (
        client_log("aiokafka") as said,
        pytest.raises((KafkaError, ssl.SSLError, ConnectionError)) as refused,
    ):
        asyncio.run(start())
    return "\n".join([f"{type(refused.value).__name__}: {refused.value}", *said])


def _refused_java(java: JavaClient, s: Settings) -> str:
    client = java.bound(s.bootstrap)
    with pytest.raises(JavaClientError) as refused:
        client.batch(step("list-topics", configs={**s.java, "default.api.timeout.ms": "10000",
                                                   "request.timeout.ms": "5000"}))  # fmt: skip
    return f"{refused.value.error}: {refused.value.message}"


REFUSALS: dict[str, Callable[[Settings], str]] = {
    "confluent-kafka": _refused_confluent,
    "kcat": _refused_kcat,
    "kafka-python": _refused_kafka_python,
    "aiokafka": _refused_aiokafka,
}


@pytest.mark.parametrize("case_name", ["sasl-plain", "sasl-scram-512", "sasl-ssl-scram-256"])
@pytest.mark.parametrize("client", [*REFUSALS, "java"])
def test_wrong_password_is_refused(
    secure: SecureBroker, certs: dict[str, Path], java_client: JavaClient, client: str,
    case_name: str,
) -> None:  # fmt: skip
    s = settings(secure, CASES[case_name].wrong(), certs)
    said = _refused_java(java_client, s) if client == "java" else REFUSALS[client](s)
    # The broker's SASL_AUTHENTICATION_FAILED message, as each client passes it on.
    assert "Authentication failed" in said, said


@pytest.mark.parametrize("client", [*REFUSALS, "java"])
def test_no_certificate_is_refused_when_required(
    secure: SecureBroker, certs: dict[str, Path], java_client: JavaClient, client: str
) -> None:
    s = settings(secure, NO_CERT_ON_MTLS, certs)
    said = _refused_java(java_client, s) if client == "java" else REFUSALS[client](s)
    assert said


def test_certificate_subject_is_mapped_to_the_principal(
    secure: SecureBroker, certs: dict[str, Path], topic_name: str
) -> None:
    s = settings(secure, CASES["ssl"], certs)
    create_topic(secure, topic_name)
    confluent_roundtrip(s, topic_name, records_for("principal"))
    # RULE:^CN=([^,]+),OU=eng,.*$/$1/L on CN=Erin.Example,OU=eng,O=Tidelog
    wait_until(
        lambda: (
            "is User:erin.example (certificate subject CN=Erin.Example,OU=eng,O=Tidelog)"
            in secure.log_path.read_text(errors="replace")
        ),
        "the mapped principal in the broker log",
    )


def test_storage_format_add_scram_creates_the_first_user(tmp_path: Path) -> None:
    """`tidelog storage format --add-scram` before the first start: the user can
    authenticate at once (no AlterUserScramCredentials), and still after a restart."""
    data = tmp_path / "data"
    config = tmp_path / "server.properties"
    config.write_text(f"log.dirs={data}\n")
    tidelog = str(venv_bin() / "tidelog")
    cluster_id = subprocess.run(
        [tidelog, "storage", "random-uuid"], capture_output=True, text=True, check=True
    ).stdout.strip()
    formatted = subprocess.run(
        [tidelog, "storage", "format", "-c", str(config), "-t", cluster_id,
         "--add-scram", "SCRAM-SHA-512=[name=admin,iterations=8192,password=admin-secret]"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert formatted.returncode == 0, formatted.stderr
    assert "SCRAM-SHA-512 credential for user admin" in formatted.stdout
    assert b"admin-secret" not in (data / "bootstrap.checkpoint").read_bytes()

    class Formatted(BrokerProcess):
        sasl_port = free_port()

        def command(self) -> list[str]:
            return [
                tidelog, "serve", "--config", str(config), "--override",
                f"listeners=PLAINTEXT://127.0.0.1:{self.port},"
                f"SASL_PLAINTEXT://127.0.0.1:{self.sasl_port}",
                "--override", "sasl.enabled.mechanisms=SCRAM-SHA-512",
            ]  # fmt: skip

    broker = Formatted(tmp_path, kind="tidelog")
    admin_case = Case("SASL_PLAINTEXT", "SASL_PLAINTEXT", "SCRAM-SHA-512", "admin", "admin-secret")
    s = Settings(f"127.0.0.1:{Formatted.sasl_port}")
    s.librdkafka.update(
        {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512",
         "sasl.username": admin_case.user or "", "sasl.password": admin_case.password or ""}
    )  # fmt: skip
    broker.start()
    try:
        for start in range(2):
            topic = f"bootstrapped-{start}"
            admin = AdminClient({"bootstrap.servers": s.bootstrap, **s.librdkafka})
            admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(TIMEOUT)
            records = records_for(topic)
            assert_read_back(records, confluent_roundtrip(s, topic, records), check_headers=False)
            if start == 0:
                gc.collect()
                broker.restart()
    finally:
        gc.collect()
        broker.stop()


# -- the wire, byte by byte: what no client library lets a test choose ------------------------


class RawConnection:
    """Kafka requests by hand (request header v1, non-flexible versions only)."""

    def __init__(self, address: str) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=TIMEOUT)
        self.correlation = 0

    def send(self, api_key: int, version: int, body: bytes) -> None:
        self.correlation += 1
        client = b"raw"
        header = struct.pack(">hhih", api_key, version, self.correlation, len(client)) + client
        self.send_frame(header + body)

    def send_frame(self, payload: bytes) -> None:
        self.sock.sendall(struct.pack(">i", len(payload)) + payload)

    def receive(self) -> bytes | None:
        """One size-prefixed frame, None when the broker closed the connection."""
        data = b""
        while len(data) < 4 or len(data) < 4 + struct.unpack(">i", data[:4])[0]:
            chunk = self.sock.recv(65536)
            if not chunk:
                return None
            data += chunk
        return data[4:]

    def close(self) -> None:
        self.sock.close()


def _string(text: str) -> bytes:
    return struct.pack(">h", len(text)) + text.encode()


SASL_HANDSHAKE, METADATA = 17, 3


def test_unframed_sasl_after_handshake_v0(secure: SecureBroker) -> None:
    """SaslHandshake v0, then the PLAIN token raw (KIP-43's first flow): an empty raw token
    back, and the connection is then authenticated for ordinary requests."""
    raw = RawConnection(secure.address("SASL_PLAINTEXT"))
    try:
        raw.send(SASL_HANDSHAKE, 0, _string("PLAIN"))
        answer = raw.receive()
        assert answer is not None and answer[4:6] == b"\x00\x00", answer  # error_code NONE
        raw.send_frame(b"\x00alice\x00alice-secret")
        assert raw.receive() == b""  # PLAIN's empty server token, unframed
        raw.send(METADATA, 1, struct.pack(">i", 0))  # Metadata v1, no topics
        answer = raw.receive()
        assert answer is not None and struct.unpack(">i", answer[:4])[0] == raw.correlation
    finally:
        raw.close()


def test_unframed_sasl_with_a_wrong_password_closes(secure: SecureBroker) -> None:
    raw = RawConnection(secure.address("SASL_PLAINTEXT"))
    try:
        raw.send(SASL_HANDSHAKE, 0, _string("PLAIN"))
        assert raw.receive() is not None
        raw.send_frame(b"\x00alice\x00wrong")
        assert raw.receive() is None
    finally:
        raw.close()


def test_a_request_before_authentication_closes_the_connection(secure: SecureBroker) -> None:
    raw = RawConnection(secure.address("SASL_PLAINTEXT"))
    try:
        raw.send(METADATA, 1, struct.pack(">i", 0))
        assert raw.receive() is None
    finally:
        raw.close()


def test_unknown_mechanism_gets_the_enabled_list_then_a_close(secure: SecureBroker) -> None:
    raw = RawConnection(secure.address("SASL_PLAINTEXT"))
    try:
        raw.send(SASL_HANDSHAKE, 1, _string("GSSAPI"))
        answer = raw.receive()
        assert answer is not None
        assert struct.unpack(">h", answer[4:6])[0] == 33  # UNSUPPORTED_SASL_MECHANISM
        assert b"SCRAM-SHA-512" in answer and b"PLAIN" in answer
        assert raw.receive() is None
    finally:
        raw.close()
