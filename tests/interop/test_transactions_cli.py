"""`tidelog transactions` against a real `tidelog serve`, with confluent-kafka transactional
producers: list, describe and describe-producers show an open transaction; abort ends it so
that a `read_committed` consumer moves past it; find-hanging finds a transaction whose
coordinator state was lost (and does not report one its coordinator still runs).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator

import pytest
from interop_broker import BrokerProcess, venv_bin
from interop_data import wait_until
from test_transactions import TIMEOUT, broker_args, create_topic, read_values, txn_producer

from tidelog.cli.main import main
from tidelog.client import Admin, TopicPartition

#: A producer that opens a transaction on partition 0 of a topic, writes 3 records in it,
#: says so and then waits to be killed: its transaction is never ended by its producer.
OPEN_AND_WAIT = """
import sys, time
from confluent_kafka import Producer
bootstrap, tid, topic = sys.argv[1:4]
producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid,
                     "transaction.timeout.ms": 900000})
producer.init_transactions(30)
producer.begin_transaction()
for i in range(3):
    producer.produce(topic, value=f"open-{i}".encode(), partition=0)
producer.flush(30)
print("open", flush=True)
time.sleep(3600)
"""


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A broker set up as the transaction tests' (small internal topics)."""
    process = BrokerProcess(tmp_path_factory.mktemp("broker"), extra_args=broker_args())
    process.start()
    try:
        yield process
    finally:
        process.stop()


def tx(broker: BrokerProcess, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """Run `tidelog transactions ARGV`: (status, stdout), or (status, stderr) when it failed."""
    status = main(["transactions", *argv, "--bootstrap-server", broker.bootstrap])
    out, err = capsys.readouterr()
    if status != 0:
        return status, err
    return status, out


def rows(table: str) -> list[list[str]]:
    return [line.split() for line in table.splitlines()[1:]]


def header(table: str) -> list[str]:
    return table.splitlines()[0].split()


def last_stable_offset(broker: BrokerProcess, tp: TopicPartition) -> int:
    with Admin({"bootstrap.servers": broker.bootstrap}) as admin:
        answer = admin.list_offsets({tp: "latest"}, isolation_level="read_committed")
    return answer[tp].offset


def commit_one(broker: BrokerProcess, topic: str, tid: str, value: str) -> None:
    producer = txn_producer(broker, tid)
    producer.begin_transaction()
    producer.produce(topic, value=value.encode(), partition=0)
    producer.commit_transaction(TIMEOUT)


def test_an_open_transaction_is_listed_described_and_aborted(
    broker: BrokerProcess, topic_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    create_topic(broker, topic_name, 1)
    tp = TopicPartition(topic_name, 0)
    tid = f"{topic_name}-open"
    producer = txn_producer(broker, tid, **{"transaction.timeout.ms": 900_000})
    producer.begin_transaction()
    for i in range(3):
        producer.produce(topic_name, value=f"open-{i}".encode(), partition=0)
    producer.flush(TIMEOUT)

    status, out = tx(broker, capsys, "list")
    assert status == 0, out
    assert header(out) == ["TransactionalId", "Coordinator", "ProducerId", "TransactionState"]
    mine = [r for r in rows(out) if r[0] == tid]
    assert len(mine) == 1 and mine[0][1] == "1" and mine[0][3] == "Ongoing"
    producer_id = mine[0][2]
    assert tid in {r[0] for r in rows(tx(broker, capsys, "list", "--state", "Ongoing")[1])}
    assert tid not in {r[0] for r in rows(tx(broker, capsys, "list", "--state", "Empty")[1])}
    by_producer = rows(tx(broker, capsys, "list", "--producer-id", producer_id)[1])
    assert [r[0] for r in by_producer] == [tid]

    status, out = tx(broker, capsys, "describe", "--transactional-id", tid)
    assert status == 0, out
    described = dict(zip(header(out), rows(out)[0], strict=True))
    assert described["CoordinatorId"] == "1" and described["ProducerId"] == producer_id
    assert described["TransactionState"] == "Ongoing"
    assert described["TransactionTimeoutMs"] == "900000"
    assert int(described["CurrentTransactionStartTimeMs"]) > 0
    assert int(described["TransactionDurationMs"]) >= 0
    assert described["TopicPartitions"] == f"{topic_name}-0"

    status, out = tx(
        broker, capsys, "describe-producers", "--topic", topic_name, "--partition", "0"
    )
    assert status == 0, out
    assert header(out) == [
        "ProducerId",
        "ProducerEpoch",
        "LatestCoordinatorEpoch",
        "LastSequence",
        "LastTimestamp",
        "CurrentTransactionStartOffset",
    ]
    (producer_row,) = rows(out)
    assert producer_row[0] == producer_id and producer_row[3] == "2"
    assert producer_row[5] == "0"
    on_replica = ("describe-producers", "--topic", topic_name, "--partition", "0", "--broker-id")
    assert rows(tx(broker, capsys, *on_replica, "1")[1]) == [producer_row]
    status, err = tx(broker, capsys, *on_replica, "99")
    assert status == 1 and err.startswith("tidelog transactions: ") and err.count("\n") == 1

    # Its coordinator still runs it: not hanging, however short the timeout searched for.
    status, out = tx(
        broker, capsys, "find-hanging", "--topic", topic_name, "--max-transaction-timeout", "0"
    )
    assert status == 0 and rows(out) == [], out

    # A transaction committed after the open one is held back by it from read_committed.
    commit_one(broker, topic_name, f"{topic_name}-later", "after")
    assert last_stable_offset(broker, tp) == 0
    assert read_values(broker, topic_name, 1) == []

    status, out = tx(
        broker, capsys, "abort", "--topic", topic_name, "--partition", "0", "--start-offset", "99"
    )
    assert status == 1 and f"no open transaction starts at offset 99 on {tp}" in out
    status, out = tx(
        broker, capsys, "abort", "--topic", topic_name, "--partition", "0", "--start-offset", "0"
    )
    assert status == 0, out
    assert f"Aborted the transaction of producer {producer_id}" in out

    # The read_committed consumer moves past the aborted records to the committed one.
    assert read_values(broker, topic_name, 1) == ["after"]
    assert read_values(broker, topic_name, 1, committed=False) == [
        "open-0",
        "open-1",
        "open-2",
        "after",
    ]
    status, out = tx(
        broker, capsys, "describe-producers", "--topic", topic_name, "--partition", "0"
    )
    assert [r[5] for r in rows(out) if r[0] == producer_id] == ["None"]


def test_describe_of_an_unknown_transactional_id_fails_in_one_line(
    broker: BrokerProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    status, err = tx(broker, capsys, "describe", "--transactional-id", "never-used")
    assert status == 1
    assert err == "tidelog transactions: transactional id 'never-used' does not exist\n"


def test_find_hanging_finds_a_transaction_whose_coordinator_state_was_lost(
    tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    """The producer is killed inside its transaction, and the broker is restarted without
    `__transaction_state` (its coordinator's log lost, as after an unclean election of that
    partition): the partition still holds the open transaction, which no coordinator will
    ever end or time out, so its last stable offset is stuck. find-hanging reports it and
    abort releases it."""
    broker = BrokerProcess(tmp_path_factory.mktemp("hanging"), extra_args=broker_args())
    broker.start()
    producer: subprocess.Popen[str] | None = None
    try:
        topic = "hangs"
        create_topic(broker, topic, 1)
        tp = TopicPartition(topic, 0)
        producer = subprocess.Popen(
            [sys.executable, "-c", OPEN_AND_WAIT, broker.bootstrap, "lost-tid", topic],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert producer.stdout is not None and producer.stdout.readline() == "open\n"
        producer.kill()
        producer.wait()
        broker.stop()
        lost = sorted(broker.data_dir.glob("__transaction_state-*"))
        assert lost, "the coordinator's log was never written"
        for directory in lost:
            shutil.rmtree(directory)
        broker.start()

        status, out = tx(broker, capsys, "list")
        assert status == 0 and "lost-tid" not in out
        status, out = tx(broker, capsys, "describe-producers", "--topic", topic, "--partition", "0")
        assert status == 0 and [r[5] for r in rows(out)] == ["0"], out
        producer_id = rows(out)[0][0]
        assert last_stable_offset(broker, tp) == 0

        status, out = tx(
            broker, capsys, "find-hanging", "--broker-id", "1", "--max-transaction-timeout", "0"
        )
        assert status == 0, out
        assert header(out) == [
            "Topic",
            "Partition",
            "ProducerId",
            "ProducerEpoch",
            "CoordinatorEpoch",
            "StartOffset",
            "LastTimestamp",
            "Duration(min)",
        ]
        assert [r[:3] + r[5:6] for r in rows(out)] == [[topic, "0", producer_id, "0"]]
        # Kafka's default search (open longer than 15 minutes) does not report it yet.
        status, out = tx(broker, capsys, "find-hanging", "--broker-id", "1")
        assert status == 0 and rows(out) == []

        status, out = tx(
            broker, capsys, "abort", "--topic", topic, "--partition", "0", "--start-offset", "0"
        )
        assert status == 0, out
        wait_until(lambda: last_stable_offset(broker, tp) == 4, "the LSO to pass the marker")
        commit_one(broker, topic, "after-tid", "after")
        assert read_values(broker, topic, 1) == ["after"]
        status, out = tx(
            broker, capsys, "find-hanging", "--broker-id", "1", "--max-transaction-timeout", "0"
        )
        assert status == 0 and rows(out) == [], out
    finally:
        if producer is not None and producer.poll() is None:
            producer.kill()
            producer.wait()
        broker.stop()


def test_the_cli_is_on_path_as_tidelog_transactions() -> None:
    result = subprocess.run(
        [str(venv_bin() / "tidelog"), "transactions", "--help"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert result.returncode == 0
    for action in ("list", "describe", "describe-producers", "abort", "find-hanging"):
        assert action in result.stdout
