"""A log dir whose disk starts failing, under a real `tidelog serve` and confluent-kafka.

The broker runs with two log dirs and the failing-disk hook (`tidelog.runtime.failing_disk`,
turned on by an environment variable only this test sets): once the test lists a dir in the
hook's control file, every fsync of a partition file there fails with EIO. Then:

1. the producer's acks=all write to the partition on that dir is answered
   KAFKA_STORAGE_ERROR, the broker logs one line naming the dir and the cause, and the
   partition on the other dir keeps taking writes;
2. after a restart with a healthy disk, every acknowledged record of both partitions is
   there (the failed write is at most present, never anything else);
3. when every log dir fails, the broker stops by itself with one line and exit status 1,
   and the next start still has every acknowledged record.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, Producer
from interop_broker import BrokerProcess
from interop_data import wait_until
from system_durability import consume_all
from system_wire import LATEST, WireClient

from tidelog.runtime.failing_disk import FAILING_DIRS_ENV

TOPIC = "disk"


class Deliveries:
    def __init__(self) -> None:
        self.acked: dict[int, list[bytes]] = {0: [], 1: []}
        self.errors: list[tuple[int, int, bytes]] = []  # (partition, error code, value)

    def report(self, err: KafkaError | None, msg: Any) -> None:
        if err is None:
            self.acked[msg.partition()].append(msg.value())
        else:
            self.errors.append((msg.partition(), err.code(), msg.value()))


def producer_for(broker: BrokerProcess, deliveries: Deliveries) -> Producer:
    return Producer(
        {
            "bootstrap.servers": broker.bootstrap,
            "acks": "all",
            "enable.idempotence": False,
            # The error of the write that hit the failure is what the test looks at: no
            # retry that would turn it into a timeout.
            "retries": 0,
            "linger.ms": 0,
            "message.timeout.ms": 20_000,
            "on_delivery": deliveries.report,
            "log_level": 0,
        }
    )


def send(producer: Producer, partition: int, value: bytes) -> None:
    producer.produce(TOPIC, value=value, key=b"k", partition=partition)
    assert producer.flush(30) == 0


def stored(broker: BrokerProcess, deliveries: Deliveries) -> dict[int, list[bytes]]:
    """Every value of both partitions, read with confluent-kafka's consumer up to the ends
    the broker reports."""
    with WireClient(broker.host, broker.port) as client:
        ends = {(TOPIC, p): client.list_offset(TOPIC, p, LATEST) for p in (0, 1)}
    got = consume_all(broker, ends)  # type: ignore[arg-type]
    return {p: [value for _, value in got[(TOPIC, p)]] for p in (0, 1)}


def assert_acknowledged_kept(values: list[bytes], acked: list[bytes], in_doubt: set[bytes]) -> None:
    """The partition holds every acknowledged value in order, plus at most the writes
    whose fsync failed (in the page cache when the disk broke), nothing else."""
    assert [v for v in values if v not in in_doubt] == acked
    assert set(values) - set(acked) <= in_doubt


def test_a_failing_log_dir_goes_offline_and_loses_no_acknowledged_record(
    brokers: Callable[..., BrokerProcess], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    control = tmp_path / "failing-dirs"
    monkeypatch.setenv(FAILING_DIRS_ENV, str(control))
    dir_a, dir_b = tmp_path / "dir-a", tmp_path / "dir-b"
    # The last --data-dir wins: two log dirs. No scheduled checkpoint: only the test's own
    # writes meet the failing disk, so each failure is the one the test expects.
    broker = brokers(
        extra_args=[
            *("--data-dir", f"{dir_a},{dir_b}"),
            *("--override", "log.flush.offset.checkpoint.interval.ms=3600000"),
        ]
    )
    with WireClient(broker.host, broker.port) as client:
        client.create_topic(TOPIC, 2)
    # A new log goes to the dir with fewest logs: partition 0 in dir-a, partition 1 in dir-b.
    wait_until(
        lambda: (dir_a / f"{TOPIC}-0").is_dir() and (dir_b / f"{TOPIC}-1").is_dir(),
        "the partitions' logs in both dirs",
    )
    deliveries = Deliveries()
    producer = producer_for(broker, deliveries)
    for n in range(5):
        for partition in (0, 1):
            send(producer, partition, b"before-%d-%d" % (partition, n))
    assert not deliveries.errors

    # 1. dir-b's disk fails.
    control.write_text(f"{dir_b}\n")
    send(producer, 1, b"hit")
    assert [(p, code) for p, code, _ in deliveries.errors] == [
        (1, KafkaError.KAFKA_STORAGE_ERROR)
    ], deliveries.errors
    wait_until(
        lambda: any(
            str(dir_b) in line and "offline" in line and "injected I/O error" in line
            for line in broker.log_tail(200).splitlines()
        ),
        "a log line naming the failed dir and the cause",
    )
    for n in range(5):
        send(producer, 0, b"after-%d" % n)  # the other dir keeps working
    assert len(deliveries.errors) == 1
    assert broker.running()

    # 2. A restart with a healthy disk brings dir-b back with everything acknowledged.
    control.unlink()
    broker.restart()
    in_doubt = {b"hit"}
    values = stored(broker, deliveries)
    assert_acknowledged_kept(values[0], deliveries.acked[0], set())
    assert_acknowledged_kept(values[1], deliveries.acked[1], in_doubt)
    producer = producer_for(broker, deliveries)
    send(producer, 1, b"back")
    assert deliveries.acked[1][-1] == b"back"

    # 3. Both dirs fail: the broker stops by itself, with one line.
    control.write_text(f"{dir_a}\n{dir_b}\n")
    send(producer, 0, b"last-a")
    send(producer, 1, b"last-b")
    in_doubt |= {b"last-a", b"last-b"}
    assert {code for _, code, _ in deliveries.errors} == {KafkaError.KAFKA_STORAGE_ERROR}
    wait_until(lambda: not broker.running(), "the broker to stop with no log dir left", 30)
    assert broker.stop() == 1
    said = broker.log_tail(20)
    assert "tidelog serve: every log dir is offline" in said
    assert "stopped cleanly" not in said
    del producer
    control.unlink()
    broker.start()
    values = stored(broker, deliveries)
    assert_acknowledged_kept(values[0], deliveries.acked[0], in_doubt)
    assert_acknowledged_kept(values[1], deliveries.acked[1], in_doubt)
