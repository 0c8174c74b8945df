"""Every record's CreateTime is checked against the topic's window, with every real client.

A topic with ``message.timestamp.before.max.ms`` and ``message.timestamp.after.max.ms`` of one
hour accepts a record only if its timestamp is within ``[now - 1 h, now + 1 h]``. Kafka checks
EVERY record of a produced batch (``LogValidator.validateTimestamp``), not just the batch
header, and refuses the whole partition's batch with INVALID_TIMESTAMP (32) and one Produce
``record_errors`` entry (KIP-467) per offending record, naming its index in the batch, with
Kafka's message "Timestamp T of message with offset O is out of range. The timestamp should
be within [L, U]". Nothing of a refused batch is stored.

Each client writes three records in ONE batch (one partition, a linger long enough that they
are sent together), the middle one two hours old: ``[now, now - 2 h, now]``. The first and the
last are valid on their own, so their failing shows they travelled in the refused batch. What
each client reports is what its own code does with such a response:

- Java (``kafka-clients`` 3.9, ``Sender.failBatch``): with one record error, the named record
  fails with the exception of the partition error (``InvalidTimestampException``) carrying the
  record error's message; with several, each named record fails with
  ``InvalidRecordException``; every other record of the batch fails with a plain
  ``KafkaException`` "Failed to append record because it was part of a batch which had one
  more more invalid records" (sic). The harness reports the first record's failure only, so a
  second Java test puts the old record first to see its ``InvalidTimestampException``.
- kafka-python (3.x, ``Sender._record_exceptions_fn``) does exactly what the Java client does:
  ``InvalidTimestampError`` / ``InvalidRecordError`` with the record error's message, plain
  ``KafkaError`` with the same sentence for the others.
- librdkafka / confluent-kafka (``rd_kafka_msgbatch_handle_Produce_result_record_errors``):
  with several record errors the named records get INVALID_RECORD (87) and the others
  ``_INVALID_DIFFERENT_RECORD`` (-138); with ONE record error ``rd_kafka_dr_msgq0`` then
  forces the partition error on every message of the batch, so all three delivery reports
  carry INVALID_TIMESTAMP (32). Both shapes are tested.
- aiokafka (0.14) ignores ``record_errors`` and the error message: every record's future
  fails with ``InvalidTimestampError()`` (no message); the error is not retriable, so it is
  not retried.

The same batch with a record two hours in the future, ``[now, now + 2 h, now]``, is refused
too (the upper bound), and ``[now, now - 2 h, now + 2 h]`` names two records. Then a batch
whose records are all inside the window, the middle one 59 minutes old, is stored and read
back byte for byte, timestamps included, from offset 0: the refused batch left nothing.

On a compacted topic Kafka checks a record's key before its timestamp
(``LogValidator.validateRecord``) and refuses a batch with INVALID_TIMESTAMP as soon as one
record error is a timestamp error (``processRecordErrors``), naming every bad record: a batch
``[keyless, two hours old, fine]`` gets INVALID_TIMESTAMP with two record errors, index 0
"Compacted topic cannot accept message without key in topic partition T-0" and index 1 the
out-of-range text. So each client shows its "several record errors" shape, and aiokafka
``InvalidTimestampError`` (a refusal for the key alone would be INVALID_RECORD).

kcat cannot produce the refused batch: its producer (``kcat -h``, 1.7.1) reads keys, values
and headers (-K, -D, -k, -H, -Z) but has no way to set a record's timestamp, so librdkafka
stamps each record with the current time, always inside the window. kcat is covered as a
reader: after confluent-kafka's refused and accepted batches, kcat reads the partition from
the beginning to its end and sees exactly the accepted records with their CreateTime
timestamps (``%T`` in its format string).
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import TypeVar

import test_aiokafka as aio
import test_confluent_kafka as ck
import test_kafka_python as kp
import test_kcat as kc
from aiokafka import TopicPartition as AioTopicPartition
from aiokafka.errors import InvalidTimestampError as AioInvalidTimestampError
from aiokafka.structs import RecordMetadata
from confluent_kafka import OFFSET_BEGINNING, KafkaError, TopicPartition
from interop_broker import BrokerProcess
from interop_data import Got, Rec, assert_read_back, make_records
from java_harness import JavaClient, JavaClientError, consume_step, delivered, produce_step, step
from java_harness import to_gots as java_gots
from kafka import KafkaAdminClient
from kafka import TopicPartition as KpTopicPartition
from kafka import errors as kp_errors
from kafka.producer.future import RecordMetadata as KpRecordMetadata

HOUR_MS = 3_600_000
# The topic's window: one hour either side of the broker's clock.
BOUNDS = {
    "message.timestamp.before.max.ms": str(HOUR_MS),
    "message.timestamp.after.max.ms": str(HOUR_MS),
}
# Out of the window by an hour: no clock skew or slow test can bring these back in.
TOO_OLD = -2 * HOUR_MS
TOO_NEW = 2 * HOUR_MS
# Inside the window by a minute: the test takes seconds between stamping and producing.
OLD_BUT_IN_RANGE = -59 * 60_000
# Long enough that the three records of a send loop travel in one batch, even on a loaded
# CI machine. The clients' flush() sends a lingering batch at once (librdkafka, kafka-python,
# Java); aiokafka waits it out. librdkafka also needs the topic's metadata before the first
# record (`topic_known` in ck_produce_batch), or flush() may send the records one by one.
LINGER_MS = 3000
TIMEOUT = 30.0

# The text the Java client (and kafka-python, librdkafka after it) gives the records of a
# refused batch that record_errors does not name; "more more" is Kafka's own typo.
PART_OF_BATCH = (
    "Failed to append record because it was part of a batch which had one more more invalid records"
)
JAVA_KAFKA_EXCEPTION = "org.apache.kafka.common.KafkaException"
JAVA_INVALID_TIMESTAMP = "org.apache.kafka.common.errors.InvalidTimestampException"
JAVA_INVALID_RECORD = "org.apache.kafka.common.InvalidRecordException"

E = TypeVar("E", bound=BaseException)


def now_ms() -> int:
    return int(time.time() * 1000)


def stamped(deltas: Sequence[int], *, seed: int, base: int, headers: bool = True) -> list[Rec]:
    """Records to partition 0 (keys, a non-UTF-8 value, an empty and a null value, headers),
    the i-th stamped ``base + deltas[i]``."""
    records = make_records(len(deltas), seed=seed, headers=headers)
    return [
        replace(r, partition=0, timestamp=base + d) for r, d in zip(records, deltas, strict=True)
    ]


def exactly(outcome: object, cls: type[E]) -> E:
    """`outcome` is an exception of class `cls` itself, not of a subclass."""
    assert type(outcome) is cls, f"expected {cls.__name__}, got {outcome!r}"
    assert isinstance(outcome, cls)
    return outcome


def assert_out_of_range_message(message: str, timestamp: int, index: int, sent: int) -> None:
    """Kafka's record error text for a timestamp outside a window of one hour either side of
    the broker's clock at the time of the Produce request (between `sent` and now)."""
    found = re.fullmatch(
        rf"Timestamp {timestamp} of message with offset {index} is out of range\. "
        r"The timestamp should be within \[(-?\d+), (-?\d+)\]",
        message,
    )
    assert found is not None, f"not Kafka's out-of-range record error: {message!r}"
    lower, upper = int(found[1]), int(found[2])
    assert upper - lower == 2 * HOUR_MS, (lower, upper)
    assert sent <= lower + HOUR_MS <= now_ms(), (sent, lower)


# ---- confluent-kafka (librdkafka) ----------------------------------------------------------


def ck_produce_batch(
    broker: BrokerProcess, topic: str, records: Sequence[Rec]
) -> list[ck.DeliveryReport]:
    """Sends `records` with one producer in one batch; returns each one's delivery report:
    a KafkaError, or (partition, offset)."""
    return ck.produce_reports(broker, topic, records, topic_known=True, **{"linger.ms": LINGER_MS})


def ck_read_all(broker: BrokerProcess, topic: str) -> list[Got]:
    """Partition 0 from the beginning until librdkafka reports its end (nothing: [])."""
    consumer = ck.consumer_for(broker, **{"enable.partition.eof": True})
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        got: list[Got] = []
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            err = msg.error()
            if err is not None and err.code() == KafkaError._PARTITION_EOF:
                return got
            got.append(ck.to_got(msg))
        raise AssertionError(f"no end of partition within {TIMEOUT}s; read {got!r}")
    finally:
        consumer.close()


def codes(reports: Sequence[ck.DeliveryReport]) -> list[int | None]:
    return [r.code() if isinstance(r, KafkaError) else None for r in reports]


def test_confluent_kafka_middle_record_too_old(broker: BrokerProcess, topic_name: str) -> None:
    ck.create_topic(broker, topic_name, 1, BOUNDS)
    refused = stamped([0, TOO_OLD, 0], seed=701, base=now_ms())
    reports = ck_produce_batch(broker, topic_name, refused)
    # One record error: librdkafka sets the partition's error on every message of the batch.
    assert codes(reports) == [KafkaError.INVALID_TIMESTAMP] * 3, reports
    for report in reports:
        assert isinstance(report, KafkaError)
        assert not report.retriable() and not report.fatal(), report
    assert ck_read_all(broker, topic_name) == []

    accepted = stamped([0, OLD_BUT_IN_RANGE, 0], seed=702, base=now_ms())
    assert ck.produce(broker, topic_name, accepted) == [(0, 0), (0, 1), (0, 2)]
    assert_read_back(accepted, ck_read_all(broker, topic_name))


def test_confluent_kafka_middle_record_too_new(broker: BrokerProcess, topic_name: str) -> None:
    ck.create_topic(broker, topic_name, 1, BOUNDS)
    refused = stamped([0, TOO_NEW, 0], seed=703, base=now_ms())
    reports = ck_produce_batch(broker, topic_name, refused)
    assert codes(reports) == [KafkaError.INVALID_TIMESTAMP] * 3, reports
    assert ck_read_all(broker, topic_name) == []


def test_confluent_kafka_two_records_out_of_range(broker: BrokerProcess, topic_name: str) -> None:
    ck.create_topic(broker, topic_name, 1, BOUNDS)
    refused = stamped([0, TOO_OLD, TOO_NEW], seed=704, base=now_ms())
    reports = ck_produce_batch(broker, topic_name, refused)
    # Several record errors: the named records INVALID_RECORD, the other one
    # _INVALID_DIFFERENT_RECORD ("an invalid record in the same batch caused the failure").
    assert codes(reports) == [
        KafkaError._INVALID_DIFFERENT_RECORD,
        KafkaError.INVALID_RECORD,
        KafkaError.INVALID_RECORD,
    ], reports
    assert ck_read_all(broker, topic_name) == []


def compacted_bounds() -> dict[str, str]:
    return {"cleanup.policy": "compact", **BOUNDS}


def keyless_and_too_old(seed: int, *, too_old_first: bool = False) -> list[Rec]:
    """[keyless, two hours old, fine] (or [two hours old, keyless, fine]), all keyed but one."""
    records = stamped(
        [TOO_OLD, 0, 0] if too_old_first else [0, TOO_OLD, 0], seed=seed, base=now_ms()
    )
    keyless = 1 if too_old_first else 0
    return [replace(r, key=None if i == keyless else b"key-%d" % i) for i, r in enumerate(records)]


def keyless_message(topic: str) -> str:
    return f"Compacted topic cannot accept message without key in topic partition {topic}-0"


def test_confluent_kafka_compacted_keyless_and_too_old(
    broker: BrokerProcess, topic_name: str
) -> None:
    ck.create_topic(broker, topic_name, 1, compacted_bounds())
    reports = ck_produce_batch(broker, topic_name, keyless_and_too_old(705))
    # Two record errors (the key, the timestamp): librdkafka's "several" shape.
    assert codes(reports) == [
        KafkaError.INVALID_RECORD,
        KafkaError.INVALID_RECORD,
        KafkaError._INVALID_DIFFERENT_RECORD,
    ], reports
    assert ck_read_all(broker, topic_name) == []


# ---- kafka-python ----------------------------------------------------------------------------


def kp_create_topic(broker: BrokerProcess, topic: str, configs: dict[str, str] = BOUNDS) -> None:
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=20_000)
    try:
        kp.create_topic(admin, topic, 1, configs)
    finally:
        admin.close()


def kp_produce_batch(
    broker: BrokerProcess, topic: str, records: Sequence[Rec]
) -> list[KpRecordMetadata | kp_errors.KafkaError]:
    """Sends `records` in one batch; returns each one's RecordMetadata or exception."""
    return kp.produce_outcomes(broker, topic, records, linger_ms=LINGER_MS)


def kp_read_all(broker: BrokerProcess, topic: str) -> list[Got]:
    """Partition 0 from the beginning up to its end offset (nothing: [])."""
    consumer = kp.consumer_for(broker)
    try:
        tp = KpTopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        end = consumer.end_offsets([tp])[tp]
        got: list[Got] = []
        deadline = time.monotonic() + TIMEOUT
        while consumer.position(tp) < end:
            assert time.monotonic() < deadline, f"read {got!r}, end offset {end}"
            for records in consumer.poll(timeout_ms=500).values():
                got.extend(kp.to_got(r) for r in records)
        return got
    finally:
        consumer.close()


def test_kafka_python_middle_record_too_old(broker: BrokerProcess, topic_name: str) -> None:
    kp_create_topic(broker, topic_name)
    sent = now_ms()
    refused = stamped([0, TOO_OLD, 0], seed=711, base=sent)
    first, middle, last = kp_produce_batch(broker, topic_name, refused)
    # The record named in record_errors: the partition error's class, the record's message.
    named = exactly(middle, kp_errors.InvalidTimestampError)
    assert refused[1].timestamp is not None
    assert_out_of_range_message(named.args[0], refused[1].timestamp, 1, sent)
    # The records of the same batch it took down: a plain KafkaError, Kafka's sentence.
    for other in (first, last):
        assert exactly(other, kp_errors.KafkaError).args == (PART_OF_BATCH,)
    assert kp_read_all(broker, topic_name) == []

    accepted = stamped([0, OLD_BUT_IN_RANGE, 0], seed=712, base=now_ms())
    assert kp.produce(broker, topic_name, accepted) == [(0, 0), (0, 1), (0, 2)]
    assert_read_back(accepted, kp_read_all(broker, topic_name))


def test_kafka_python_two_records_out_of_range(broker: BrokerProcess, topic_name: str) -> None:
    kp_create_topic(broker, topic_name)
    sent = now_ms()
    refused = stamped([0, TOO_OLD, TOO_NEW], seed=713, base=sent)
    first, *outcomes = kp_produce_batch(broker, topic_name, refused)
    # Several record errors: each named record InvalidRecordError with its own message.
    for index, outcome in enumerate(outcomes, start=1):
        error = exactly(outcome, kp_errors.InvalidRecordError)
        timestamp = refused[index].timestamp
        assert timestamp is not None
        assert_out_of_range_message(error.args[0], timestamp, index, sent)
    assert exactly(first, kp_errors.KafkaError).args == (PART_OF_BATCH,)
    assert kp_read_all(broker, topic_name) == []


def test_kafka_python_compacted_keyless_and_too_old(broker: BrokerProcess, topic_name: str) -> None:
    kp_create_topic(broker, topic_name, compacted_bounds())
    sent = now_ms()
    refused = keyless_and_too_old(714)
    keyless, too_old, fine = kp_produce_batch(broker, topic_name, refused)
    # Each named record for its own first fault: the key, then the timestamp.
    assert exactly(keyless, kp_errors.InvalidRecordError).args == (keyless_message(topic_name),)
    error = exactly(too_old, kp_errors.InvalidRecordError)
    assert refused[1].timestamp is not None
    assert_out_of_range_message(error.args[0], refused[1].timestamp, 1, sent)
    assert exactly(fine, kp_errors.KafkaError).args == (PART_OF_BATCH,)
    assert kp_read_all(broker, topic_name) == []


# ---- aiokafka --------------------------------------------------------------------------------


def test_aiokafka_middle_record_too_old(broker: BrokerProcess, topic_name: str) -> None:
    refused = stamped([0, TOO_OLD, 0], seed=721, base=now_ms())

    async def read_all(consumer_topic: str) -> list[Got]:
        consumer = aio.consumer_for(broker)
        await consumer.start()
        try:
            tp = AioTopicPartition(consumer_topic, 0)
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            end = (await consumer.end_offsets([tp]))[tp]
            got: list[Got] = []
            while await consumer.position(tp) < end:
                for records in (await consumer.getmany(tp, timeout_ms=500)).values():
                    got.extend(aio.to_got(r) for r in records)
            return got
        finally:
            await consumer.stop()

    async def refuse() -> tuple[list[RecordMetadata | BaseException], list[Got]]:
        admin = await aio.started_admin(broker)
        try:
            await aio.create_topic(admin, topic_name, 1, BOUNDS)
        finally:
            await admin.close()
        outcomes = await aio.produce_outcomes(broker, topic_name, refused, linger_ms=LINGER_MS)
        return outcomes, await read_all(topic_name)

    outcomes, stored = aio.run(refuse)
    # aiokafka fails the whole batch with the partition's error, without its message.
    for outcome in outcomes:
        error = exactly(outcome, AioInvalidTimestampError)
        assert (error.errno, error.args, error.retriable) == (32, (), False), error
    assert stored == []

    accepted = stamped([0, OLD_BUT_IN_RANGE, 0], seed=722, base=now_ms())

    async def accept() -> tuple[list[tuple[int, int]], list[Got]]:
        produced = await aio.produce(broker, topic_name, accepted)
        return produced, await read_all(topic_name)

    produced, got = aio.run(accept)
    assert produced == [(0, 0), (0, 1), (0, 2)]
    assert_read_back(accepted, got)


def test_aiokafka_compacted_keyless_and_too_old(broker: BrokerProcess, topic_name: str) -> None:
    refused = keyless_and_too_old(723)

    async def refuse() -> list[RecordMetadata | BaseException]:
        admin = await aio.started_admin(broker)
        try:
            await aio.create_topic(admin, topic_name, 1, compacted_bounds())
        finally:
            await admin.close()
        return await aio.produce_outcomes(broker, topic_name, refused, linger_ms=LINGER_MS)

    # The partition's code decides: INVALID_TIMESTAMP, since one record error is a timestamp.
    for outcome in aio.run(refuse):
        error = exactly(outcome, AioInvalidTimestampError)
        assert (error.errno, error.retriable) == (32, False), error
    assert ck_read_all(broker, topic_name) == []


# ---- the Java client -------------------------------------------------------------------------


def java_produce_refused(java: JavaClient, topic: str, records: Sequence[Rec]) -> JavaClientError:
    """Creates `topic` and sends `records` in one batch, which must fail; the harness reports
    the first record's failure."""
    try:
        java.batch(
            step("create-topic", topic=topic, partitions=1, topic_configs=BOUNDS),
            produce_step(topic, records, configs={"linger.ms": str(LINGER_MS)}),
        )
    except JavaClientError as exc:
        return exc
    raise AssertionError(f"the Java producer stored {records!r}")


def test_java_client_middle_record_too_old(java: JavaClient, topic_name: str) -> None:
    refused = stamped([0, TOO_OLD, 0], seed=731, base=now_ms())
    failure = java_produce_refused(java, topic_name, refused)
    # Record 0 is not named in record_errors: the plain KafkaException of Sender.failBatch.
    assert (failure.error, failure.message) == (JAVA_KAFKA_EXCEPTION, PART_OF_BATCH), failure

    accepted = stamped([0, OLD_BUT_IN_RANGE, 0], seed=732, base=now_ms())
    (earliest,), (latest,), empty, produced, consumed = java.batch(
        step("list-offsets", topic=topic_name, partitions=[0], spec="earliest"),
        step("list-offsets", topic=topic_name, partitions=[0], spec="latest"),
        consume_step(topic_name, max_records=len(refused), timeout_ms=1500),
        produce_step(topic_name, accepted, configs={"linger.ms": str(LINGER_MS)}),
        consume_step(topic_name, max_records=len(accepted)),
    )
    assert (earliest["0"]["offset"], latest["0"]["offset"]) == (0, 0)
    assert empty == []
    assert delivered(produced) == [(0, 0), (0, 1), (0, 2)]
    assert_read_back(accepted, java_gots(consumed))


def test_java_client_first_record_too_old(java: JavaClient, topic_name: str) -> None:
    """The harness shows the first record's failure: here the record record_errors names."""
    sent = now_ms()
    refused = stamped([TOO_OLD, 0, 0], seed=733, base=sent)
    failure = java_produce_refused(java, topic_name, refused)
    # One record error: the partition error's exception, with the record error's message.
    assert failure.error == JAVA_INVALID_TIMESTAMP, failure
    assert refused[0].timestamp is not None
    assert_out_of_range_message(failure.message, refused[0].timestamp, 0, sent)
    ((latest,),) = java.batch(step("list-offsets", topic=topic_name, partitions=[0], spec="latest"))
    assert latest["0"]["offset"] == 0


def test_java_client_compacted_too_old_and_keyless(java: JavaClient, topic_name: str) -> None:
    """The too-old record first, so that the harness shows it: named among two record
    errors, it fails with InvalidRecordException and its own message."""
    sent = now_ms()
    refused = keyless_and_too_old(734, too_old_first=True)
    try:
        java.batch(
            step("create-topic", topic=topic_name, partitions=1, topic_configs=compacted_bounds()),
            produce_step(topic_name, refused, configs={"linger.ms": str(LINGER_MS)}),
        )
    except JavaClientError as failure:
        assert failure.error == JAVA_INVALID_RECORD, failure
        assert refused[0].timestamp is not None
        assert_out_of_range_message(failure.message, refused[0].timestamp, 0, sent)
    else:
        raise AssertionError(f"the Java producer stored {refused!r}")
    ((latest,),) = java.batch(step("list-offsets", topic=topic_name, partitions=[0], spec="latest"))
    assert latest["0"]["offset"] == 0


# ---- kcat (a reader only: it cannot set a record's timestamp) --------------------------------


def test_kcat_reads_only_the_accepted_batch(broker: BrokerProcess, topic_name: str) -> None:
    ck.create_topic(broker, topic_name, 1, BOUNDS)
    # kcat prints headers as text: these records have none.
    refused = stamped([0, TOO_OLD, 0], seed=741, base=now_ms(), headers=False)
    assert (
        codes(ck_produce_batch(broker, topic_name, refused)) == [KafkaError.INVALID_TIMESTAMP] * 3
    )
    accepted = stamped([0, OLD_BUT_IN_RANGE, 0], seed=742, base=now_ms(), headers=False)
    assert ck.produce(broker, topic_name, accepted) == [(0, 0), (0, 1), (0, 2)]
    # -e: kcat stops at the end of the partition, so it shows everything stored (-c is a cap).
    assert_read_back(accepted, kc.consume(broker, topic_name, 0, 100))
