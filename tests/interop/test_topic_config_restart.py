"""A topic's own settings hold after the broker restarts, for every real client.

A topic created with ``max.message.bytes=20000`` refuses a 100 kB record with
MESSAGE_TOO_LARGE (10), and a compacted topic (``cleanup.policy=compact``) refuses a record
without a key with INVALID_RECORD (87). The broker keeps topic settings in its metadata log;
the logs it finds on disk at start must take them again, not the broker's defaults. Each test
creates the topics, kills the broker (SIGKILL: the recovery path) and starts it again on the
same data, then has the client send what the topic must refuse and what it must take.

What each client reports for the refused record is its own code's mapping of the error:
``MSG_SIZE_TOO_LARGE`` (librdkafka), ``MessageSizeTooLargeError`` (kafka-python, aiokafka),
``RecordTooLargeException`` (Java), and kcat's "Delivery failed ... Message size too large"
with exit status 1; INVALID_RECORD is ``INVALID_RECORD`` (librdkafka), ``InvalidRecordError``
(kafka-python) and ``UnknownError`` (aiokafka, which has no class for code 87). A record within the limit is stored, so the refusal is the topic's
setting and not a broken broker.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import test_aiokafka as aio
import test_confluent_kafka as ck
import test_kafka_python as kp
import test_kcat as kc
from aiokafka.errors import MessageSizeTooLargeError as AioMessageSizeTooLargeError
from aiokafka.errors import UnknownError as AioUnknownError
from confluent_kafka import KafkaError
from interop_broker import BrokerProcess
from interop_data import Rec
from java_harness import JavaClient, JavaClientError, delivered, produce_step
from kafka import errors as kp_errors

LIMIT = {"max.message.bytes": "20000"}
COMPACT = {"cleanup.policy": "compact"}
BIG = Rec(key=b"k", value=b"x" * 100_000)
SMALL = Rec(key=b"k", value=b"x" * 1_000)
KEYLESS = Rec(key=None, value=b"no key")
# The clients' own limits are far above the records: only the broker can refuse them.
CLIENT_LIMIT = 1_000_000


def restarted(broker_factory: Callable[[], BrokerProcess], prefix: str) -> BrokerProcess:
    """A broker with `<prefix>-limit` and `<prefix>-compact`, killed and started again."""
    broker = broker_factory()
    ck.create_topic(broker, f"{prefix}-limit", 1, LIMIT)
    ck.create_topic(broker, f"{prefix}-compact", 1, COMPACT)
    broker.restart(hard=True)
    return broker


def test_confluent_kafka(broker_factory: Callable[[], BrokerProcess]) -> None:
    broker = restarted(broker_factory, "ck")
    config = {"message.max.bytes": CLIENT_LIMIT}
    (big,) = ck.produce_reports(broker, "ck-limit", [BIG], **config)
    assert isinstance(big, KafkaError) and big.code() == KafkaError.MSG_SIZE_TOO_LARGE, big
    (keyless,) = ck.produce_reports(broker, "ck-compact", [KEYLESS])
    assert isinstance(keyless, KafkaError) and keyless.code() == KafkaError.INVALID_RECORD
    assert ck.produce(broker, "ck-limit", [SMALL]) == [(0, 0)]
    assert ck.produce(broker, "ck-compact", [SMALL]) == [(0, 0)]


def test_kafka_python(broker_factory: Callable[[], BrokerProcess]) -> None:
    broker = restarted(broker_factory, "kp")
    (big,) = kp.produce_outcomes(broker, "kp-limit", [BIG], max_request_size=CLIENT_LIMIT)
    assert type(big) is kp_errors.MessageSizeTooLargeError, big
    (keyless,) = kp.produce_outcomes(broker, "kp-compact", [KEYLESS])
    assert type(keyless) is kp_errors.InvalidRecordError, keyless
    assert kp.produce(broker, "kp-limit", [SMALL]) == [(0, 0)]


def test_aiokafka(broker_factory: Callable[[], BrokerProcess]) -> None:
    broker = restarted(broker_factory, "aio")

    async def run() -> list[object]:
        (big,) = await aio.produce_outcomes(
            broker, "aio-limit", [BIG], max_request_size=CLIENT_LIMIT
        )
        (keyless,) = await aio.produce_outcomes(broker, "aio-compact", [KEYLESS])
        stored = await aio.produce(broker, "aio-limit", [SMALL])
        return [big, keyless, stored]

    big, keyless, stored = aio.run(run)
    assert type(big) is AioMessageSizeTooLargeError, big
    # aiokafka has no class for INVALID_RECORD (87): it reports the code as UnknownError.
    assert type(keyless) is AioUnknownError, keyless
    assert stored == [(0, 0)]


def test_java_client(broker_factory: Callable[[], BrokerProcess], java_client: JavaClient) -> None:
    broker = restarted(broker_factory, "java")
    java = java_client.bound(broker.bootstrap)
    configs = {"max.request.size": str(CLIENT_LIMIT)}
    try:
        java.batch(produce_step("java-limit", [BIG], configs=configs))
    except JavaClientError as failure:
        assert failure.error == "org.apache.kafka.common.errors.RecordTooLargeException", failure
    else:
        raise AssertionError("the Java producer stored a record over max.message.bytes")
    (stored,) = java.batch(produce_step("java-limit", [SMALL]))
    assert delivered(stored) == [(0, 0)]


def test_kcat(broker_factory: Callable[[], BrokerProcess]) -> None:
    broker = restarted(broker_factory, "kcat")
    refused = subprocess.run(
        [kc.KCAT, "-b", broker.bootstrap, "-P", "-t", "kcat-limit", "-p", "0"],
        input=BIG.value,
        capture_output=True,
        timeout=kc.TIMEOUT,
    )
    assert refused.returncode == 1, refused
    assert b"Delivery failed" in refused.stderr and b"Message size too large" in refused.stderr
    kc.produce(broker, "kcat-limit", [SMALL])
    assert [(g.offset, g.value) for g in kc.consume(broker, "kcat-limit", 0, 10)] == [
        (0, SMALL.value)
    ]
