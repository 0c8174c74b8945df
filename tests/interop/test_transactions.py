"""Transactions against a real `tidelog serve`: every client family's transactional producer,
read back by `read_committed` consumers of several families (confluent-kafka, kcat, the Java
client), which must see exactly the committed records and never an aborted one.

Also: a consume-transform-produce loop with `send_offsets_to_transaction`, zombie fencing by a
second producer of the same transactional id, a transaction left open past its timeout that the
broker aborts, and a broker restart in the middle of transactions.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from interop_broker import BrokerProcess
from interop_data import Rec, wait_until
from java_harness import JavaClient, consume_step, produce_step, step, to_gots

from tidelog.client import Admin as TidelogAdmin
from tidelog.client import ClientError
from tidelog.client import Consumer as TidelogConsumer
from tidelog.client import Producer as TidelogProducer
from tidelog.client import TopicPartition as TidelogTopicPartition
from tidelog.protocol import ErrorCode

TIMEOUT = 30.0
KCAT = shutil.which("kcat") or "kcat"
#: How often the broker looks for transactions past their timeout, in the tests that wait
#: for one (Kafka's default is 10 s).
ABORT_CHECK_MS = 200
#: How many partitions the commit-then-abort transactions span, per client family.
SPAN = 3


def broker_args(*overrides: str) -> list[str]:
    args = []
    for override in (
        "transaction.state.log.num.partitions=4",
        "offsets.topic.num.partitions=4",
        f"transaction.abort.timed.out.transaction.cleanup.interval.ms={ABORT_CHECK_MS}",
        *overrides,
    ):
        args += ["--override", override]
    return args


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    process = BrokerProcess(tmp_path_factory.mktemp("broker"), extra_args=broker_args())
    process.start()
    try:
        yield process
    finally:
        process.stop()


def create_topic(broker: BrokerProcess, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    futures = admin.create_topics([NewTopic(name, partitions, 1)], operation_timeout=TIMEOUT)
    futures[name].result(TIMEOUT)


def txn_producer(broker: BrokerProcess, transactional_id: str, **configs: object) -> Producer:
    producer = Producer(
        {"bootstrap.servers": broker.bootstrap, "transactional.id": transactional_id, **configs}
    )
    producer.init_transactions(TIMEOUT)
    return producer


def produce_in_txn(producer: Producer, topic: str, values: Sequence[str], partitions: int) -> None:
    producer.begin_transaction()
    for i, value in enumerate(values):
        producer.produce(topic, value=value.encode(), partition=i % partitions)
    producer.flush(TIMEOUT)


def read_values(
    broker: BrokerProcess, topic: str, partitions: int, *, committed: bool = True
) -> list[str]:
    """Every value of `topic` up to the end a consumer of that isolation level sees (for
    read_committed: the last stable offset), in partition then offset order."""
    return [value for _, _, value in read_records(broker, topic, partitions, committed=committed)]


def read_records(
    broker: BrokerProcess, topic: str, partitions: int, *, committed: bool = True
) -> list[tuple[int, int, str]]:
    """read_values with each value's (partition, offset) in front of it."""
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": "reader",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed" if committed else "read_uncommitted",
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got: dict[int, list[tuple[int, int, str]]] = {p: [] for p in range(partitions)}
    at_end: set[int] = set()
    deadline = time.monotonic() + TIMEOUT
    try:
        while len(at_end) < partitions:
            assert time.monotonic() < deadline, f"{topic}: no end of partition seen in {got}"
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error():
                if message.error().code() == KafkaError._PARTITION_EOF:
                    at_end.add(message.partition())
                    continue
                raise KafkaException(message.error())
            at_end.discard(message.partition())
            got[message.partition()].append(
                (message.partition(), message.offset(), message.value().decode())
            )
    finally:
        consumer.close()
    return [record for p in range(partitions) for record in got[p]]


def kcat_read_committed(broker: BrokerProcess, topic: str) -> list[str]:
    """The values kcat reads with isolation.level=read_committed up to the end, sorted."""
    result = subprocess.run(
        [KCAT, "-b", broker.bootstrap, "-C", "-t", topic, "-e", "-q", "-f", "%p %s\n",
         "-X", "isolation.level=read_committed"],
        capture_output=True,
        timeout=TIMEOUT,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr.decode(errors="replace")[-2000:]
    # "%p %s": the partition keeps empty lines apart from no output at all
    return sorted(line.split(" ", 1)[1] for line in result.stdout.decode().splitlines())


def committed_and_aborted(prefix: str, n: int = 6) -> tuple[list[str], list[str]]:
    return [f"{prefix}-commit-{i}" for i in range(n)], [f"{prefix}-abort-{i}" for i in range(n)]


def by_partition(values: Sequence[str], partitions: int) -> list[str]:
    """The order read_values returns `values` in, when value i went to partition i % n."""
    return [v for p in range(partitions) for i, v in enumerate(values) if i % partitions == p]


# -- confluent-kafka -----------------------------------------------------------------------


def test_confluent_commit_then_abort(broker: BrokerProcess, topic_name: str) -> None:
    create_topic(broker, topic_name, SPAN)
    committed, aborted = committed_and_aborted("ck")
    producer = txn_producer(broker, f"{topic_name}-tx")
    produce_in_txn(producer, topic_name, committed, SPAN)
    producer.commit_transaction(TIMEOUT)
    produce_in_txn(producer, topic_name, aborted, SPAN)
    producer.abort_transaction(TIMEOUT)
    expected = by_partition(committed, SPAN)
    assert read_values(broker, topic_name, SPAN) == expected
    assert kcat_read_committed(broker, topic_name) == sorted(expected)
    # read_uncommitted sees the aborted records too: the filtering above is real
    uncommitted = read_values(broker, topic_name, SPAN, committed=False)
    assert sorted(uncommitted) == sorted(committed + aborted)


def test_confluent_consume_transform_produce(broker: BrokerProcess, topic_name: str) -> None:
    source, sink, group = f"{topic_name}-in", f"{topic_name}-out", f"{topic_name}-g"
    create_topic(broker, source, 2)
    create_topic(broker, sink, 2)
    plain = Producer({"bootstrap.servers": broker.bootstrap})
    inputs = [f"in-{i}" for i in range(20)]
    for i, value in enumerate(inputs):
        plain.produce(source, value=value.encode(), partition=i % 2)
    plain.flush(TIMEOUT)

    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
        }
    )
    consumer.subscribe([source])
    producer = txn_producer(broker, f"{topic_name}-etl")

    def process_batch(commit: bool) -> int:
        """One transaction: what the consumer has now, transformed; True commits it."""
        messages = [m for m in consumer.consume(10, 1.0) if not m.error()]
        if not messages:
            return 0
        producer.begin_transaction()
        for m in messages:
            producer.produce(sink, value=m.value().upper(), partition=m.partition())
        producer.send_offsets_to_transaction(
            consumer.position(consumer.assignment()), consumer.consumer_group_metadata(), TIMEOUT
        )
        if commit:
            producer.commit_transaction(TIMEOUT)
        else:
            producer.abort_transaction(TIMEOUT)
            # start again from the last committed offsets, as a real loop does after an abort
            committed = consumer.committed(consumer.assignment(), TIMEOUT)
            for tp in committed:
                consumer.seek(TopicPartition(tp.topic, tp.partition, max(tp.offset, 0)))
        return len(messages)

    try:
        wait_until(lambda: process_batch(commit=False) > 0, "a first batch to abort")
        done = 0
        deadline = time.monotonic() + TIMEOUT
        while done < len(inputs):
            assert time.monotonic() < deadline, f"processed {done} of {len(inputs)}"
            done += process_batch(commit=True)
        assert done == len(inputs)
        committed = consumer.committed(
            [TopicPartition(source, 0), TopicPartition(source, 1)], TIMEOUT
        )
        assert [tp.offset for tp in committed] == [10, 10]
    finally:
        consumer.close()
    out = read_values(broker, sink, 2)
    assert sorted(out) == sorted(v.upper() for v in inputs)


def test_a_second_producer_fences_the_first(broker: BrokerProcess, topic_name: str) -> None:
    create_topic(broker, topic_name, 1)
    tid = f"{topic_name}-zombie"
    zombie = txn_producer(broker, tid)
    produce_in_txn(zombie, topic_name, ["zombie-0", "zombie-1"], 1)
    successor = txn_producer(broker, tid)  # aborts the zombie's open transaction
    produce_in_txn(successor, topic_name, ["new-0"], 1)
    successor.commit_transaction(TIMEOUT)
    with pytest.raises(KafkaException) as raised:
        zombie.commit_transaction(TIMEOUT)
    error = raised.value.args[0]
    assert (error.code(), error.fatal()) == (KafkaError._FENCED, True), error
    assert read_values(broker, topic_name, 1) == ["new-0"]


def test_an_open_transaction_past_its_timeout_is_aborted(
    broker: BrokerProcess, topic_name: str
) -> None:
    create_topic(broker, topic_name, 1)
    hanging = txn_producer(broker, f"{topic_name}-hang", **{"transaction.timeout.ms": 2000})
    produce_in_txn(hanging, topic_name, ["hung-0", "hung-1"], 1)
    # A later committed transaction stays invisible while the hung one holds the LSO back.
    other = txn_producer(broker, f"{topic_name}-other")
    produce_in_txn(other, topic_name, ["after-0"], 1)
    other.commit_transaction(TIMEOUT)
    wait_until(
        lambda: read_values(broker, topic_name, 1) == ["after-0"],
        "the broker to abort the hung transaction and read_committed to reach past it",
        timeout=TIMEOUT,
    )
    assert kcat_read_committed(broker, topic_name) == ["after-0"]
    # the abort bumped the epoch: the producer that hung is fenced (transactions v1)
    with pytest.raises(KafkaException) as raised:
        hanging.commit_transaction(TIMEOUT)
    error = raised.value.args[0]
    assert (error.code(), error.fatal()) == (KafkaError._FENCED, True), error


@pytest.mark.parametrize("hard", [False, True], ids=["sigterm", "sigkill"])
def test_restart_keeps_committed_and_finishes_the_rest(
    tmp_path: Path, topic_name: str, hard: bool
) -> None:
    process = BrokerProcess(tmp_path, extra_args=broker_args())
    process.start()
    try:
        create_topic(process, topic_name, 2)
        producer = txn_producer(process, f"{topic_name}-a")
        produce_in_txn(producer, topic_name, ["first-0", "first-1"], 2)
        producer.commit_transaction(TIMEOUT)
        # open across the restart: its producer goes on and commits it afterwards
        produce_in_txn(producer, topic_name, ["second-0", "second-1"], 2)
        # open across the restart and never finished: aborted once its timeout passes
        abandoned = txn_producer(process, f"{topic_name}-b", **{"transaction.timeout.ms": 3000})
        produce_in_txn(abandoned, topic_name, ["lost-0", "lost-1"], 2)
        # every answer the clients got was fsynced first, so SIGKILL loses none of it
        process.restart(hard=hard)
        producer.commit_transaction(TIMEOUT)
        expected = sorted(["first-0", "first-1", "second-0", "second-1"])
        wait_until(
            lambda: sorted(read_values(process, topic_name, 2)) == expected,
            "the abandoned transaction to be aborted after the restart",
            timeout=TIMEOUT,
        )
        assert sorted(kcat_read_committed(process, topic_name)) == expected
    finally:
        process.stop()


# -- kafka-python and aiokafka -------------------------------------------------------------


def test_kafka_python_commit_then_abort(broker: BrokerProcess, topic_name: str) -> None:
    from kafka import KafkaProducer

    create_topic(broker, topic_name, SPAN)
    committed, aborted = committed_and_aborted("kp")
    producer = KafkaProducer(
        bootstrap_servers=broker.bootstrap, transactional_id=f"{topic_name}-tx"
    )
    try:
        producer.init_transactions()
        for values, commit in ((committed, True), (aborted, False)):
            producer.begin_transaction()
            for i, value in enumerate(values):
                producer.send(topic_name, value=value.encode(), partition=i % SPAN)
            producer.flush()
            if commit:
                producer.commit_transaction()
            else:
                producer.abort_transaction()
    finally:
        producer.close()
    assert read_values(broker, topic_name, SPAN) == by_partition(committed, SPAN)
    assert kcat_read_committed(broker, topic_name) == sorted(committed)
    assert kafka_python_read_committed(broker, topic_name, SPAN) == sorted(committed)


def kafka_python_read_committed(broker: BrokerProcess, topic: str, partitions: int) -> list[str]:
    """kafka-python's consumer with read_committed, up to the end it sees (the LSO)."""
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=broker.bootstrap,
        isolation_level="read_committed",
        enable_auto_commit=False,
    )
    try:
        tps = [KTopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        ends = consumer.end_offsets(tps)
        values: list[str] = []
        deadline = time.monotonic() + TIMEOUT
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, f"kafka-python stuck before {ends}"
            for records in consumer.poll(timeout_ms=500).values():
                values.extend(r.value.decode() for r in records)
        return sorted(values)
    finally:
        consumer.close()


def test_kafka_python_zombie_is_fenced(broker: BrokerProcess, topic_name: str) -> None:
    from kafka import KafkaProducer
    from kafka.errors import ProducerFencedError

    create_topic(broker, topic_name, 1)
    tid = f"{topic_name}-zombie"
    zombie = KafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id=tid)
    successor = KafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id=tid)
    try:
        zombie.init_transactions()
        zombie.begin_transaction()
        zombie.send(topic_name, b"zombie", partition=0)
        zombie.flush()
        successor.init_transactions()
        successor.begin_transaction()
        successor.send(topic_name, b"successor", partition=0)
        successor.commit_transaction()
        with pytest.raises(ProducerFencedError):
            zombie.commit_transaction()
    finally:
        successor.close()
        zombie.close(timeout=5)
    assert read_values(broker, topic_name, 1) == ["successor"]


def test_aiokafka_commit_then_abort(broker: BrokerProcess, topic_name: str) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka import TopicPartition as AIOTopicPartition

    create_topic(broker, topic_name, SPAN)
    committed, aborted = committed_and_aborted("aio")

    async def run() -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=broker.bootstrap, transactional_id=f"{topic_name}-tx"
        )
        await producer.start()
        try:
            async with producer.transaction():
                for i, value in enumerate(committed):
                    await producer.send_and_wait(topic_name, value.encode(), partition=i % SPAN)
            await producer.begin_transaction()
            for i, value in enumerate(aborted):
                await producer.send_and_wait(topic_name, value.encode(), partition=i % SPAN)
            await producer.abort_transaction()
        finally:
            await producer.stop()

    async def read_committed() -> list[str]:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=broker.bootstrap,
            isolation_level="read_committed",
            enable_auto_commit=False,
        )
        await consumer.start()
        try:
            tps = [AIOTopicPartition(topic_name, p) for p in range(SPAN)]
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            ends = await consumer.end_offsets(tps)
            values: list[str] = []
            while True:
                positions = [await consumer.position(tp) for tp in tps]
                if all(pos >= ends[tp] for pos, tp in zip(positions, tps, strict=True)):
                    break
                for records in (await consumer.getmany(timeout_ms=500)).values():
                    values.extend(r.value.decode() for r in records)
            return sorted(values)
        finally:
            await consumer.stop()

    asyncio.run(asyncio.wait_for(run(), TIMEOUT))
    assert read_values(broker, topic_name, SPAN) == by_partition(committed, SPAN)
    assert kcat_read_committed(broker, topic_name) == sorted(committed)
    assert asyncio.run(asyncio.wait_for(read_committed(), TIMEOUT)) == sorted(committed)


# -- the Java client -----------------------------------------------------------------------


def test_java_commit_then_abort(java: JavaClient, broker: BrokerProcess, topic_name: str) -> None:
    create_topic(broker, topic_name, SPAN)
    committed, aborted = committed_and_aborted("java")

    def recs(values: Sequence[str]) -> list[Rec]:
        return [Rec(None, v.encode(), partition=i % SPAN) for i, v in enumerate(values)]

    tid = f"{topic_name}-tx"
    read = {"max_records": 100, "timeout_ms": 5000}
    results = java.batch(
        produce_step(topic_name, recs(committed), transactional_id=tid),
        produce_step(topic_name, recs(aborted), transactional_id=tid, end="abort"),
        consume_step(topic_name, **read, configs={"isolation.level": "read_committed"}),
        consume_step(topic_name, **read, configs={"isolation.level": "read_uncommitted"}),
    )
    seen_committed = to_gots(results[2])
    seen_uncommitted = to_gots(results[3])
    assert sorted(g.value.decode() for g in seen_committed if g.value) == sorted(committed)
    assert sorted(g.value.decode() for g in seen_uncommitted if g.value) == sorted(
        committed + aborted
    )
    assert read_values(broker, topic_name, SPAN) == by_partition(committed, SPAN)
    assert kcat_read_committed(broker, topic_name) == sorted(committed)


def test_java_admin_lists_and_describes_transactions(
    java: JavaClient, broker: BrokerProcess, topic_name: str
) -> None:
    """KIP-664 through the Java admin client: ListTransactions and DescribeTransactions of an
    open transaction and of a committed one."""
    create_topic(broker, topic_name, 2)
    done_id, open_id = f"{topic_name}-done", f"{topic_name}-open"
    done = txn_producer(broker, done_id)
    produce_in_txn(done, topic_name, ["d-0"], 2)
    done.commit_transaction(TIMEOUT)
    ongoing = txn_producer(broker, open_id, **{"transaction.timeout.ms": 60_000})
    produce_in_txn(ongoing, topic_name, ["o-0", "o-1"], 2)
    try:
        [[found]] = java.batch(step("transactions", describe=[open_id, done_id]))
        listed = {tid: found["listed"][tid] for tid in (done_id, open_id)}
        assert {tid: entry["state"] for tid, entry in listed.items()} == {
            done_id: "CompleteCommit",
            open_id: "Ongoing",
        }
        described = found["described"]
        assert described[open_id]["state"] == "Ongoing"
        assert described[open_id]["partitions"] == [f"{topic_name}-0", f"{topic_name}-1"]
        assert described[open_id]["timeout_ms"] == 60_000
        assert described[open_id]["producer_id"] == listed[open_id]["producer_id"]
        assert described[done_id]["state"] == "CompleteCommit"
        assert described[done_id]["partitions"] == []
    finally:
        ongoing.abort_transaction(TIMEOUT)


# -- the Tidelog client --------------------------------------------------------------------


def tidelog_txn_producer(broker: BrokerProcess, transactional_id: str) -> TidelogProducer:
    producer = TidelogProducer(
        {"bootstrap.servers": broker.bootstrap, "transactional.id": transactional_id}
    )
    try:
        producer.init_transactions(TIMEOUT)
    except BaseException:
        producer.close()
        raise
    return producer


def tidelog_read_committed(broker: BrokerProcess, topic: str, partitions: int) -> list[str]:
    """Every value the Tidelog consumer reads with read_committed up to the LSO, sorted."""
    tps = [TidelogTopicPartition(topic, p) for p in range(partitions)]
    with TidelogAdmin({"bootstrap.servers": broker.bootstrap}) as admin:
        ends = admin.list_offsets(dict.fromkeys(tps, "latest"), isolation_level="read_committed")
    consumer = TidelogConsumer(
        {"bootstrap.servers": broker.bootstrap, "isolation.level": "read_committed"}
    )
    got: list[str] = []
    try:
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        deadline = time.monotonic() + TIMEOUT
        while any(consumer.position(tp) < ends[tp].offset for tp in tps):
            assert time.monotonic() < deadline, f"{topic}: read {got}"
            got += [record.value.decode() for record in consumer.poll(0.5) if record.value]
    finally:
        consumer.close()
    return sorted(got)


def test_tidelog_client_commit_then_abort(broker: BrokerProcess, topic_name: str) -> None:
    create_topic(broker, topic_name, SPAN)
    committed, aborted = committed_and_aborted("tl")
    producer = tidelog_txn_producer(broker, f"{topic_name}-tx")
    try:
        with pytest.raises(ClientError, match="only inside a transaction"):
            producer.send(topic_name, b"outside")
        producer.begin_transaction()
        for i, value in enumerate(committed):
            producer.send(topic_name, value.encode(), partition=i % SPAN)
        producer.commit_transaction(TIMEOUT)
        producer.begin_transaction()
        futures = [
            producer.send(topic_name, value.encode(), partition=i % SPAN)
            for i, value in enumerate(aborted)
        ]
        assert producer.flush(TIMEOUT) == 0
        assert all(f.result().offset >= 0 for f in futures)  # written, then aborted
        producer.abort_transaction(TIMEOUT)
    finally:
        producer.close()
    expected = by_partition(committed, SPAN)
    assert read_values(broker, topic_name, SPAN) == expected
    assert kcat_read_committed(broker, topic_name) == sorted(expected)
    assert tidelog_read_committed(broker, topic_name, SPAN) == sorted(expected)
    uncommitted = read_values(broker, topic_name, SPAN, committed=False)
    assert sorted(uncommitted) == sorted(committed + aborted)


def test_tidelog_client_offsets_count_only_when_the_transaction_commits(
    broker: BrokerProcess, topic_name: str
) -> None:
    create_topic(broker, topic_name, 1)
    create_topic(broker, f"{topic_name}-in", 1)
    group, source = f"{topic_name}-g", TidelogTopicPartition(f"{topic_name}-in", 0)
    producer = tidelog_txn_producer(broker, f"{topic_name}-etl")
    try:
        producer.begin_transaction()
        producer.send(topic_name, b"out-aborted", partition=0)
        producer.send_offsets_to_transaction({source: 5}, group, TIMEOUT)
        producer.abort_transaction(TIMEOUT)
        with TidelogAdmin({"bootstrap.servers": broker.bootstrap}) as admin:
            assert admin.list_consumer_group_offsets(group, [source]) == {source: None}
        producer.begin_transaction()
        producer.send(topic_name, b"out-committed", partition=0)
        producer.send_offsets_to_transaction({source: 7}, group, TIMEOUT)
        producer.commit_transaction(TIMEOUT)
    finally:
        producer.close()
    with TidelogAdmin({"bootstrap.servers": broker.bootstrap}) as admin:
        offsets = admin.list_consumer_group_offsets(group, [source])
    assert offsets[source] is not None and offsets[source].offset == 7
    assert read_values(broker, topic_name, 1) == ["out-committed"]


def test_tidelog_client_second_producer_fences_the_first(
    broker: BrokerProcess, topic_name: str
) -> None:
    create_topic(broker, topic_name, 1)
    tid = f"{topic_name}-zombie"
    zombie = tidelog_txn_producer(broker, tid)
    successor = None
    try:
        zombie.begin_transaction()
        zombie.send(topic_name, b"zombie-0", partition=0)
        assert zombie.flush(TIMEOUT) == 0
        successor = tidelog_txn_producer(broker, tid)  # aborts the zombie's transaction
        successor.begin_transaction()
        successor.send(topic_name, b"new-0", partition=0)
        successor.commit_transaction(TIMEOUT)
        with pytest.raises(ClientError) as raised:
            zombie.commit_transaction(TIMEOUT)
        fenced = {ErrorCode.PRODUCER_FENCED, ErrorCode.INVALID_PRODUCER_EPOCH}
        assert raised.value.code in fenced, raised.value
        # Fenced is final: nothing but close is left.
        with pytest.raises(ClientError) as again:
            zombie.begin_transaction()
        assert again.value.code in fenced
    finally:
        zombie.close()
        if successor is not None:
            successor.close()
    assert read_values(broker, topic_name, 1) == ["new-0"]


def test_tidelog_client_a_failed_record_makes_the_transaction_abort_only(
    broker: BrokerProcess, topic_name: str
) -> None:
    """A record the broker refuses (too large for the topic) fails the transaction: commit
    raises, abort ends it, and the producer goes on with its next transaction."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    small = NewTopic(topic_name, 1, 1, config={"max.message.bytes": "2000"})
    admin.create_topics([small], operation_timeout=TIMEOUT)[topic_name].result(TIMEOUT)
    producer = tidelog_txn_producer(broker, f"{topic_name}-tx")
    try:
        producer.begin_transaction()
        producer.send(topic_name, b"fits", partition=0)
        too_large = producer.send(topic_name, b"x" * 5000, partition=0)
        with pytest.raises(ClientError) as failed:
            too_large.result(TIMEOUT)
        assert failed.value.code is ErrorCode.MESSAGE_TOO_LARGE
        with pytest.raises(ClientError) as refused:
            producer.commit_transaction(TIMEOUT)
        assert refused.value.code is ErrorCode.MESSAGE_TOO_LARGE
        producer.abort_transaction(TIMEOUT)
        producer.begin_transaction()
        producer.send(topic_name, b"next", partition=0)
        producer.commit_transaction(TIMEOUT)
    finally:
        producer.close()
    assert read_values(broker, topic_name, 1) == ["next"]
    assert tidelog_read_committed(broker, topic_name, 1) == ["next"]


def test_tidelog_client_consume_transform_produce_with_group_metadata(
    broker: BrokerProcess, topic_name: str
) -> None:
    """The Tidelog consumer in a group and the Tidelog transactional producer: offsets go
    with the output in each transaction, named by the member (KIP-447); a member from
    another generation is refused, and only an abort ends that transaction."""
    from tidelog.client import ConsumerGroupMetadata

    source, sink, group = f"{topic_name}-in", f"{topic_name}-out", f"{topic_name}-g"
    create_topic(broker, source, 2)
    create_topic(broker, sink, 2)
    plain = Producer({"bootstrap.servers": broker.bootstrap})
    inputs = [f"in-{i}" for i in range(20)]
    for i, value in enumerate(inputs):
        plain.produce(source, value=value.encode(), partition=i % 2)
    plain.flush(TIMEOUT)
    consumer = TidelogConsumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
        }
    )
    producer = tidelog_txn_producer(broker, f"{topic_name}-etl")
    try:
        consumer.subscribe([source])
        records = wait_until(lambda: consumer.poll(0.5), "the member's first records")
        member = consumer.group_metadata()
        assert member.member_id and member.generation_id >= 1
        positions = {tp: consumer.position(tp) for tp in consumer.assignment()}

        # A zombie: the same member id from another generation is fenced by the coordinator.
        producer.begin_transaction()
        stale = ConsumerGroupMetadata(group, member.generation_id + 1, member.member_id)
        with pytest.raises(ClientError) as fenced:
            producer.send_offsets_to_transaction(positions, stale, TIMEOUT)
        assert fenced.value.code is ErrorCode.ILLEGAL_GENERATION
        with pytest.raises(ClientError):
            producer.commit_transaction(TIMEOUT)
        producer.abort_transaction(TIMEOUT)

        done = 0
        deadline = time.monotonic() + TIMEOUT
        while True:
            producer.begin_transaction()
            for r in records:
                producer.send(sink, r.value.upper(), partition=r.partition)
            positions = {tp: consumer.position(tp) for tp in consumer.assignment()}
            producer.send_offsets_to_transaction(positions, consumer.group_metadata(), TIMEOUT)
            producer.commit_transaction(TIMEOUT)
            done += len(records)
            if done >= len(inputs):
                break
            assert time.monotonic() < deadline, f"processed {done} of {len(inputs)}"
            records = consumer.poll(0.5)
        assert done == len(inputs)
    finally:
        producer.close()
        consumer.close()
    with TidelogAdmin({"bootstrap.servers": broker.bootstrap}) as admin:
        committed = admin.list_consumer_group_offsets(group)
    assert {tp.partition: o.offset for tp, o in committed.items() if o} == {0: 10, 1: 10}
    assert sorted(read_values(broker, sink, 2)) == sorted(v.upper() for v in inputs)
