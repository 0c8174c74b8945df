"""ACL enforcement against real clients: a `tidelog serve` with StandardAuthorizer and a
SASL_PLAINTEXT listener (PLAIN users alice and bob). Alice may do everything on the topics
starting with ``open-`` and read the groups starting with ``g-open-``; bob has no ACL.
confluent-kafka, kcat, kafka-python, aiokafka and the Java client each

* produce and consume as alice (the Java producer is idempotent: InitProducerId passes on
  Write on some topic, KIP-679);
* fail with their own TOPIC_AUTHORIZATION_FAILED error when bob produces to alice's topic;
* fail with their own GROUP_AUTHORIZATION_FAILED error when alice consumes in a group she
  may not read.

A transactional producer of an id alice may not write fails with each client's
TRANSACTIONAL_ID_AUTHORIZATION_FAILED (kcat has no transactions); with Write on the id, it
commits. A literal DENY of Read inside alice's ALLOW of All refuses her reads, in every
client, and keeps her writes. And through the admin APIs of confluent-kafka, kafka-python and the Java client: bob's
topic listing leaves alice's topics out, his CreateTopics and DescribeConfigs are refused,
and his idempotent Java producer gets ClusterAuthorizationException (no Write anywhere).

The broker is test_security.py's SecureBroker with the authorizer on; its PLAINTEXT
listener (User:ANONYMOUS, a super user) creates the topics and the ACLs.
"""

from __future__ import annotations

import asyncio
import gc
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import test_kcat as kc
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)
from interop_data import assert_read_back, wait_until
from java_harness import JavaClient, JavaClientError, consume_step, produce_step, step
from test_security import (
    CASES,
    CLIENTS,
    TIMEOUT,
    Case,
    SecureBroker,
    Settings,
    _aiokafka_options,
    _kcat_args,
    create_topic,
    java_roundtrip,
    records_for,
    settings,
)

AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
ALICE = CASES["sasl-plain"]
BOB = Case("SASL_PLAINTEXT", "SASL_PLAINTEXT", "PLAIN", "bob", "bob-secret")
FAMILIES = ["confluent-kafka", "kcat", "kafka-python", "aiokafka", "java"]


class AclBroker(SecureBroker):
    def command(self) -> list[str]:
        return [
            *super().command(),
            "--override",
            f"authorizer.class.name={AUTHORIZER}",
            "--override",
            "super.users=User:ANONYMOUS",
        ]


def _acl(
    resource: ResourceType, prefix: str, operation: AclOperation, principal: str = "User:alice"
) -> AclBinding:
    return AclBinding(
        resource,
        prefix,
        ResourcePatternType.PREFIXED,
        principal,
        "*",
        operation,
        AclPermissionType.ALLOW,
    )


@pytest.fixture(scope="module")
def acl_broker(
    tmp_path_factory: pytest.TempPathFactory, certs: dict[str, Path]
) -> Iterator[AclBroker]:
    process = AclBroker(tmp_path_factory.mktemp("acls"), certs)
    process.start()
    try:
        admin = AdminClient({"bootstrap.servers": process.bootstrap})
        bindings = [
            _acl(ResourceType.TOPIC, "open-", AclOperation.ALL),
            _acl(ResourceType.GROUP, "g-open-", AclOperation.READ),
        ]
        for future in admin.create_acls(bindings).values():
            assert future.result(TIMEOUT) is None
        yield process
    finally:
        gc.collect()
        process.stop()


@pytest.fixture
def open_topic(acl_broker: AclBroker) -> str:
    name = f"open-{uuid.uuid4().hex[:10]}"
    create_topic(acl_broker, name)
    return name


@pytest.mark.parametrize("client", FAMILIES)
def test_allowed_user_produces_and_consumes(
    acl_broker: AclBroker,
    certs: dict[str, Path],
    java_client: JavaClient,
    open_topic: str,
    client: str,
) -> None:
    s = settings(acl_broker, ALICE, certs)
    records = records_for(f"{client}-allowed")
    if client == "java":
        got = java_roundtrip(java_client, s, open_topic, records)
    else:
        got = CLIENTS[client](s, open_topic, records)
    assert_read_back(records, got, check_timestamps=client != "kcat", check_headers=False)


# -- a topic bob may not write -----------------------------------------------------------


def _bob_produces_confluent(s: Settings, topic: str) -> object:
    producer = Producer({"bootstrap.servers": s.bootstrap, **s.librdkafka})
    errors: list[KafkaError | None] = []
    producer.produce(topic, b"v", on_delivery=lambda err, _msg: errors.append(err))
    producer.flush(TIMEOUT)
    assert len(errors) == 1 and errors[0] is not None, errors
    return errors[0].code()


def _bob_produces_kcat(s: Settings, topic: str) -> object:
    result = subprocess.run(
        [kc.KCAT, *_kcat_args(s), "-P", "-t", topic, "-p", "0"],
        input=b"v\n", capture_output=True, timeout=TIMEOUT,
    )  # fmt: skip
    said = result.stderr.decode(errors="replace")
    assert result.returncode != 0, said
    return said


def _bob_produces_kafka_python(s: Settings, topic: str) -> object:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=s.bootstrap, max_block_ms=10000, **s.python)
    try:
        with pytest.raises(Exception) as refused:
            producer.send(topic, b"v").get(TIMEOUT)
    finally:
        producer.close()
    return type(refused.value)


def _bob_produces_aiokafka(s: Settings, topic: str) -> object:
    from aiokafka import AIOKafkaProducer

    async def run() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=s.bootstrap, **_aiokafka_options(s))
        await producer.start()
        try:
            await producer.send_and_wait(topic, b"v")
        finally:
            await producer.stop()

    with pytest.raises(Exception) as refused:
        asyncio.run(asyncio.wait_for(run(), 2 * TIMEOUT))
    return type(refused.value)


def _bob_produces_java(java: JavaClient, s: Settings, topic: str) -> object:
    client = java.bound(s.bootstrap)
    configs = {**s.java, "max.block.ms": "10000", "delivery.timeout.ms": "20000"}
    with pytest.raises(JavaClientError) as refused:
        client.batch(produce_step(topic, records_for("bob"), idempotence=False, configs=configs))
    return refused.value.error


def test_denied_topic_is_each_clients_topic_authorization_error(
    acl_broker: AclBroker, certs: dict[str, Path], java_client: JavaClient, open_topic: str
) -> None:
    from aiokafka import errors as aio_errors
    from kafka import errors as kp_errors

    s = settings(acl_broker, BOB, certs)
    assert _bob_produces_confluent(s, open_topic) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert "Topic authorization failed" in str(_bob_produces_kcat(s, open_topic))
    assert _bob_produces_kafka_python(s, open_topic) is kp_errors.TopicAuthorizationFailedError
    assert _bob_produces_aiokafka(s, open_topic) is aio_errors.TopicAuthorizationFailedError
    assert _bob_produces_java(java_client, s, open_topic) == (
        "org.apache.kafka.common.errors.TopicAuthorizationException"
    )
    # Nothing bob sent was written.
    consumer = Consumer({"bootstrap.servers": acl_broker.bootstrap, "group.id": "admin-check"})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(open_topic, 0), timeout=TIMEOUT)
    finally:
        consumer.close()
    assert (low, high) == (0, 0)


# -- a group alice may not read ----------------------------------------------------------


def _group_confluent(s: Settings, topic: str, group: str) -> object:
    consumer = Consumer({"bootstrap.servers": s.bootstrap, "group.id": group, **s.librdkafka})
    errors: list[KafkaError | None] = []

    def poll() -> bool:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error():
            errors.append(msg.error())
        return bool(errors)

    try:
        consumer.subscribe([topic])
        wait_until(poll, "librdkafka's consumer error", TIMEOUT)
    finally:
        consumer.close()
    first = errors[0]
    assert first is not None
    return first.code()


def _group_kcat(s: Settings, topic: str, group: str) -> object:
    # A balanced consumer reports the error and goes on trying: read its stderr until the
    # error is there, then stop it.
    process = subprocess.Popen(
        [kc.KCAT, *_kcat_args(s), "-G", group, topic],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert process.stderr is not None
    said: list[str] = []
    try:

        def reported() -> bool:
            line = process.stderr.readline().decode(errors="replace")  # type: ignore[union-attr]
            said.append(line)
            return "not authorized" in line.lower() or process.poll() is not None

        wait_until(reported, "kcat's group error", TIMEOUT)
    finally:
        process.kill()
        process.wait(TIMEOUT)
        process.stderr.close()
    return "".join(said)


def _group_kafka_python(s: Settings, topic: str, group: str) -> object:
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(
        topic, bootstrap_servers=s.bootstrap, group_id=group, enable_auto_commit=False, **s.python
    )
    try:
        with pytest.raises(Exception) as refused:
            wait_until(lambda: consumer.poll(500) is None, "kafka-python's group error", TIMEOUT)
    finally:
        consumer.close()
    return type(refused.value)


def _group_aiokafka(s: Settings, topic: str, group: str) -> object:
    from aiokafka import AIOKafkaConsumer

    async def run() -> None:
        consumer = AIOKafkaConsumer(
            topic, bootstrap_servers=s.bootstrap, group_id=group, **_aiokafka_options(s)
        )
        await consumer.start()
        try:
            while True:
                await consumer.getmany(timeout_ms=500)
        finally:
            await consumer.stop()

    with pytest.raises(Exception) as refused:
        asyncio.run(asyncio.wait_for(run(), 2 * TIMEOUT))
    return type(refused.value)


def _group_java(java: JavaClient, s: Settings, topic: str, group: str) -> object:
    client = java.bound(s.bootstrap)
    with pytest.raises(JavaClientError) as refused:
        client.batch(consume_step(topic, max_records=1, group=group, configs=s.java))
    return refused.value.error


def test_denied_group_is_each_clients_group_authorization_error(
    acl_broker: AclBroker, certs: dict[str, Path], java_client: JavaClient, open_topic: str
) -> None:
    from aiokafka import errors as aio_errors
    from kafka import errors as kp_errors

    s = settings(acl_broker, ALICE, certs)
    group = f"closed-{uuid.uuid4().hex[:8]}"
    assert _group_confluent(s, open_topic, group) == KafkaError.GROUP_AUTHORIZATION_FAILED
    # librdkafka passes the broker's error message on.
    said = str(_group_kcat(s, open_topic, group))
    assert "FindCoordinator response error: Not authorized to access the group" in said, said
    assert _group_kafka_python(s, open_topic, group) is kp_errors.GroupAuthorizationFailedError
    assert _group_aiokafka(s, open_topic, group) is aio_errors.GroupAuthorizationFailedError
    assert _group_java(java_client, s, open_topic, group) == (
        "org.apache.kafka.common.errors.GroupAuthorizationException"
    )


# -- administration and metadata ---------------------------------------------------------


def test_admin_apis_and_metadata_answer_each_user_by_their_acls(
    acl_broker: AclBroker, certs: dict[str, Path], java_client: JavaClient, open_topic: str
) -> None:
    from confluent_kafka.admin import ConfigResource, NewTopic
    from kafka import KafkaAdminClient
    from kafka import errors as kp_errors
    from kafka.admin import NewTopic as KpNewTopic

    alice, bob = settings(acl_broker, ALICE, certs), settings(acl_broker, BOB, certs)
    # Metadata: bob's listing leaves alice's topics out; alice sees hers.
    bob_admin = AdminClient({"bootstrap.servers": bob.bootstrap, **bob.librdkafka})
    alice_admin = AdminClient({"bootstrap.servers": alice.bootstrap, **alice.librdkafka})
    assert open_topic not in bob_admin.list_topics(timeout=TIMEOUT).topics
    assert open_topic in alice_admin.list_topics(timeout=TIMEOUT).topics

    # CreateTopics: Create on the topic (alice's prefix) or nothing.
    wanted = f"open-{uuid.uuid4().hex[:8]}"
    with pytest.raises(KafkaException) as refused:
        bob_admin.create_topics([NewTopic(wanted, 1, 1)])[wanted].result(TIMEOUT)
    assert refused.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    alice_admin.create_topics([NewTopic(wanted, 1, 1)])[wanted].result(TIMEOUT)

    # DescribeConfigs on a topic: DescribeConfigs, which alice's All implies.
    resource = ConfigResource(ConfigResource.Type.TOPIC, open_topic)
    with pytest.raises(KafkaException) as refused:
        bob_admin.describe_configs([resource])[resource].result(TIMEOUT)
    assert refused.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert "retention.ms" in alice_admin.describe_configs([resource])[resource].result(TIMEOUT)

    kp_admin = KafkaAdminClient(bootstrap_servers=bob.bootstrap, **bob.python)
    try:
        with pytest.raises(kp_errors.TopicAuthorizationFailedError):
            kp_admin.create_topics([KpNewTopic(f"open-{uuid.uuid4().hex[:8]}", 1, 1)])
    finally:
        kp_admin.close()

    java = java_client.bound(bob.bootstrap)
    with pytest.raises(JavaClientError) as java_refused:
        java.batch(step("create-topic", topic=f"open-{uuid.uuid4().hex[:8]}", configs=bob.java))
    assert java_refused.value.error == "org.apache.kafka.common.errors.TopicAuthorizationException"
    # An idempotent producer needs IdempotentWrite on the cluster or Write on some topic:
    # bob may describe a topic (so its metadata is his) and write none.
    visible = f"visible-{uuid.uuid4().hex[:8]}"
    create_topic(acl_broker, visible)
    setup = AdminClient({"bootstrap.servers": acl_broker.bootstrap})
    describe = _acl(ResourceType.TOPIC, visible, AclOperation.DESCRIBE, "User:bob")
    assert setup.create_acls([describe])[describe].result(TIMEOUT) is None
    with pytest.raises(JavaClientError) as no_producer_id:
        java.batch(produce_step(visible, records_for("bob-idem"), configs=bob.java))
    # On the record's future, or, when InitProducerId failed before send() was called,
    # from send() as a KafkaException caused by it (the harness keeps the stack trace).
    failure = no_producer_id.value
    cluster_denied = "org.apache.kafka.common.errors.ClusterAuthorizationException"
    assert failure.error == cluster_denied or (
        failure.error == "org.apache.kafka.common.KafkaException"
        and f"Caused by: {cluster_denied}" in str(failure)
    ), str(failure)


# -- transactional ids ---------------------------------------------------------------------


def _txn_confluent(s: Settings, topic: str, transactional_id: str) -> object:
    producer = Producer(
        {"bootstrap.servers": s.bootstrap, "transactional.id": transactional_id, **s.librdkafka}
    )
    try:
        producer.init_transactions(TIMEOUT)
    except KafkaException as refused:
        return refused.args[0].code()
    producer.begin_transaction()
    producer.produce(topic, b"in-a-transaction", partition=0)
    producer.commit_transaction(TIMEOUT)
    return KafkaError.NO_ERROR


def _txn_kafka_python(s: Settings, topic: str, transactional_id: str) -> object:
    from kafka import KafkaProducer

    producer = KafkaProducer(
        bootstrap_servers=s.bootstrap, transactional_id=transactional_id, **s.python
    )
    try:
        with pytest.raises(Exception) as refused:
            producer.init_transactions()
    finally:
        producer.close(timeout=0)
    return type(refused.value)


def _txn_aiokafka(s: Settings, topic: str, transactional_id: str) -> object:
    from aiokafka import AIOKafkaProducer

    async def run() -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=s.bootstrap,
            transactional_id=transactional_id,
            **_aiokafka_options(s),
        )
        try:
            await producer.start()
        finally:
            await producer.stop()

    with pytest.raises(Exception) as refused:
        asyncio.run(asyncio.wait_for(run(), 2 * TIMEOUT))
    return type(refused.value)


def _txn_java(java: JavaClient, s: Settings, topic: str, transactional_id: str) -> object:
    client = java.bound(s.bootstrap)
    configs = {**s.java, "max.block.ms": "10000"}
    step_ = produce_step(
        topic, records_for("txn"), configs=configs, transactional_id=transactional_id
    )
    with pytest.raises(JavaClientError) as refused:
        client.batch(step_)
    return refused.value.error


def test_transactional_ids_are_checked_for_every_client(
    acl_broker: AclBroker, certs: dict[str, Path], java_client: JavaClient, open_topic: str
) -> None:
    """kcat has no transactions, so it is not in this one."""
    from aiokafka import errors as aio_errors
    from kafka import errors as kp_errors

    s = settings(acl_broker, ALICE, certs)
    closed = f"closed-tx-{uuid.uuid4().hex[:8]}"
    assert _txn_confluent(s, open_topic, closed) == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert _txn_kafka_python(s, open_topic, closed) is (
        kp_errors.TransactionalIdAuthorizationFailedError
    )
    assert _txn_aiokafka(s, open_topic, closed) is aio_errors.TransactionalIdAuthorizationFailed
    assert _txn_java(java_client, s, open_topic, closed) == (
        "org.apache.kafka.common.errors.TransactionalIdAuthorizationException"
    )
    # With Write on the id, the same producer commits.
    setup = AdminClient({"bootstrap.servers": acl_broker.bootstrap})
    allowed = _acl(ResourceType.TRANSACTIONAL_ID, "open-tx-", AclOperation.WRITE)
    assert setup.create_acls([allowed])[allowed].result(TIMEOUT) is None
    opened = f"open-tx-{uuid.uuid4().hex[:8]}"
    assert _txn_confluent(s, open_topic, opened) == KafkaError.NO_ERROR


# -- a DENY inside an ALLOW --------------------------------------------------------------------


def _read_confluent(s: Settings, topic: str) -> object:
    consumer = Consumer(
        {"bootstrap.servers": s.bootstrap, "group.id": f"g-{topic}", **s.librdkafka}
    )
    errors: list[KafkaError | None] = []

    def poll() -> bool:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error():
            errors.append(msg.error())
        return bool(errors)

    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        wait_until(poll, "librdkafka's fetch error", TIMEOUT)
    finally:
        consumer.close()
    first = errors[0]
    assert first is not None
    return first.code()


def _read_kcat(s: Settings, topic: str) -> object:
    result = subprocess.run(
        [kc.KCAT, *_kcat_args(s), "-C", "-t", topic, "-p", "0", "-o", "beginning", "-e"],
        capture_output=True, timeout=TIMEOUT,
    )  # fmt: skip
    return result.stderr.decode(errors="replace")


def _read_kafka_python(s: Settings, topic: str) -> object:
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KpPartition

    consumer = KafkaConsumer(bootstrap_servers=s.bootstrap, enable_auto_commit=False, **s.python)
    try:
        consumer.assign([KpPartition(topic, 0)])
        with pytest.raises(Exception) as refused:
            wait_until(lambda: bool(consumer.poll(500)), "kafka-python's fetch error", TIMEOUT)
    finally:
        consumer.close()
    return type(refused.value)


def _read_aiokafka(s: Settings, topic: str) -> object:
    from aiokafka import AIOKafkaConsumer
    from aiokafka import TopicPartition as AioPartition

    async def run() -> None:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=s.bootstrap, enable_auto_commit=False, **_aiokafka_options(s)
        )
        await consumer.start()
        try:
            consumer.assign([AioPartition(topic, 0)])
            await consumer.seek_to_beginning()
            while True:
                await consumer.getmany(timeout_ms=500)
        finally:
            await consumer.stop()

    with pytest.raises(Exception) as refused:
        asyncio.run(asyncio.wait_for(run(), 2 * TIMEOUT))
    return type(refused.value)


def _read_java(java: JavaClient, s: Settings, topic: str) -> object:
    client = java.bound(s.bootstrap)
    with pytest.raises(JavaClientError) as refused:
        client.batch(consume_step(topic, max_records=1, partitions=[0], configs=s.java))
    return refused.value.error


def test_a_deny_beats_the_allow_for_every_client(
    acl_broker: AclBroker, certs: dict[str, Path], java_client: JavaClient
) -> None:
    from aiokafka import errors as aio_errors
    from kafka import errors as kp_errors

    topic = f"open-deny-{uuid.uuid4().hex[:8]}"
    create_topic(acl_broker, topic)
    setup = AdminClient({"bootstrap.servers": acl_broker.bootstrap})
    deny = AclBinding(
        ResourceType.TOPIC,
        topic,
        ResourcePatternType.LITERAL,
        "User:alice",
        "*",
        AclOperation.READ,
        AclPermissionType.DENY,
    )
    assert setup.create_acls([deny])[deny].result(TIMEOUT) is None
    s = settings(acl_broker, ALICE, certs)
    # Writing is still allowed (All on the prefix); reading is denied.
    producer = Producer({"bootstrap.servers": s.bootstrap, **s.librdkafka})
    outcomes: list[KafkaError | None] = []
    producer.produce(topic, b"written", partition=0, on_delivery=lambda e, _: outcomes.append(e))
    assert producer.flush(TIMEOUT) == 0 and outcomes == [None], outcomes
    assert _read_confluent(s, topic) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert "Topic authorization failed" in str(_read_kcat(s, topic))
    assert _read_kafka_python(s, topic) is kp_errors.TopicAuthorizationFailedError
    assert _read_aiokafka(s, topic) is aio_errors.TopicAuthorizationFailedError
    assert _read_java(java_client, s, topic) == (
        "org.apache.kafka.common.errors.TopicAuthorizationException"
    )
