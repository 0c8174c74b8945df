"""Produce through restarts: the trials of the durability tests (test_durability_*.py).

A confluent-kafka producer (acks=all, linger.ms=2) writes numbered records (at most 20,000 a
second, in a few hundred produce requests a second) to a topic of three partitions: value
``<trial>:<n>``, key ``k<n mod 5>`` (so each key stays in one partition and its records have
a production order). At a random moment (seeded RNG, 0.3-1.5 s in) the broker gets SIGKILL
or SIGTERM; it is started again on the same data directory and port. Every delivery report
is recorded: success means acknowledged.

- With idempotence the producer lives on across the restart and is flushed afterwards:
  what it had in flight at the kill is retried against the restarted broker, which must
  recognise what it already wrote (its producer state rebuilt from the log).
- Without idempotence a retry across the restart could legitimately duplicate a record
  the broker wrote but did not acknowledge, so the producer's queue is purged at the kill
  (those records are in doubt: present once, or absent) and a new producer is made.

Each trial writes its own topic. After each restart that topic is read from offset 0 with
our own Fetch and checked: offsets contiguous; every value one that was produced, under its
own key; no value twice; every acknowledged value present; each key's records in production
order. At the end every trial's topic is checked again, and a confluent-kafka consumer must
read exactly the same records. After a SIGTERM the broker must have shut down cleanly (exit
status 0, the clean-shutdown marker written, "broker stopped cleanly" logged), so the next
start skips recovery.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from interop_broker import BrokerProcess
from system_wire import LATEST, WireClient

from tidelog.storage.manager import CLEAN_SHUTDOWN_MARKER

PARTITIONS = 3
KEYS = 5
SEED = 4242
RATE = 20_000  # records per second, at most


def topic_of(trial: int) -> str:
    return f"durable-{trial}"


def key_of(n: int) -> bytes:
    return b"k%d" % (n % KEYS)


@dataclass
class Ledger:
    """What the producers were asked to send and what they were told."""

    produced: dict[bytes, bytes] = field(default_factory=dict)  # value -> key
    acked: set[bytes] = field(default_factory=set)
    failed: Counter[str] = field(default_factory=Counter)

    def report(self, err: KafkaError | None, msg: Any) -> None:
        if err is None:
            self.acked.add(msg.value())
        else:
            self.failed[err.name()] += 1


def make_producer(broker: BrokerProcess, ledger: Ledger, idempotent: bool) -> Producer:
    return Producer(
        {
            "bootstrap.servers": broker.bootstrap,
            "acks": "all",
            "enable.idempotence": idempotent,
            "linger.ms": 2,
            # Many small produce requests rather than few huge ones: what is in flight at
            # the kill is what this test is about, and the read-back stays quick.
            "batch.num.messages": 200,
            "queue.buffering.max.messages": 20_000,
            # Long enough to outlive a restart of the broker (idempotent producers retry
            # across it); short reconnect backoffs so that they notice it is back.
            "message.timeout.ms": 30_000,
            "reconnect.backoff.ms": 20,
            "reconnect.backoff.max.ms": 200,
            "on_delivery": ledger.report,
            "log_level": 0,
        }
    )


def produce_until(producer: Producer, ledger: Ledger, trial: int, stop: threading.Event) -> int:
    """Produce to the trial's topic until ``stop``; the number of records handed over."""
    n = 0
    started = time.monotonic()
    while not stop.is_set():
        value = b"%d:%d" % (trial, n)
        try:
            producer.produce(topic_of(trial), value=value, key=key_of(n))
        except BufferError:
            producer.poll(0.005)
            continue
        ledger.produced[value] = key_of(n)
        n += 1
        if n % 100 == 0:
            producer.poll(0)
            # Bounded, so that reading everything back stays quick; still many requests in
            # flight at any moment.
            ahead = n / RATE - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(ahead)
    return n


Stored = dict[tuple[str, int], list[tuple[bytes, bytes]]]


def check_log(broker: BrokerProcess, ledger: Ledger, trials: range) -> Stored:
    """Read the trials' topics from offset 0 and check them against the ledger (for what
    those trials produced); the (key, value)s of each partition."""
    stored: Stored = {}
    with WireClient(broker.host, broker.port) as client:
        for trial in trials:
            for p in range(PARTITIONS):
                records = client.fetch_records(topic_of(trial), p)
                assert [r.offset for r in records] == list(range(len(records)))
                assert client.list_offset(topic_of(trial), p, LATEST) == len(records)
                stored[(topic_of(trial), p)] = [(r.key or b"", r.value or b"") for r in records]
    counts = Counter(v for records in stored.values() for _, v in records)
    duplicates = sorted(v for v, c in counts.items() if c > 1)
    assert not duplicates, f"{len(duplicates)} values stored more than once: {duplicates[:10]}"
    unknown = [v for v in counts if v not in ledger.produced]
    assert not unknown, f"values nobody produced: {unknown[:10]}"
    wrong_key = [
        (k, v) for records in stored.values() for k, v in records if ledger.produced[v] != k
    ]
    assert not wrong_key, f"records under another key: {wrong_key[:10]}"
    prefixes = tuple(b"%d:" % t for t in trials)
    lost = sorted(v for v in ledger.acked - counts.keys() if v.startswith(prefixes))
    assert not lost, f"{len(lost)} acknowledged values missing: {lost[:10]}"
    for tp, records in stored.items():
        last: dict[bytes, tuple[int, int]] = {}
        for k, v in records:
            trial, n = (int(x) for x in v.split(b":"))
            assert last.get(k, (-1, -1)) < (trial, n), f"{tp}, key {k!r}: {v!r} after {last[k]}"
            last[k] = (trial, n)
    return stored


def consume_all(
    broker: BrokerProcess, ends: dict[int, int]
) -> dict[int, list[tuple[bytes, bytes]]]:
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": f"durability-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "log_level": 0,
        }
    )
    consumer.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t, p in ends])
    got: Stored = {tp: [] for tp in ends}
    deadline = time.monotonic() + 30
    try:
        while any(len(got[tp]) < end for tp, end in ends.items()):
            assert time.monotonic() < deadline, {tp: len(r) for tp, r in got.items()}
            for msg in consumer.consume(10_000, 0.2):
                assert msg.error() is None, msg.error()
                records = got[(msg.topic(), msg.partition())]
                assert msg.offset() == len(records)
                records.append((msg.key() or b"", msg.value() or b""))
    finally:
        consumer.close()
    return got


def assert_clean_stop(broker: BrokerProcess) -> None:
    assert broker.stop() == 0
    assert (broker.data_dir / CLEAN_SHUTDOWN_MARKER).exists()
    assert broker.log_tail(5).splitlines()[-1].endswith("broker stopped cleanly")


def run_trials(broker: BrokerProcess, *, idempotent: bool, signal_name: str, trials: int) -> None:
    """The trials described in the module docstring, on ``broker``."""
    with WireClient(broker.host, broker.port) as client:
        for trial in range(trials):
            client.create_topic(topic_of(trial), PARTITIONS)
    rng = random.Random(f"{SEED}-{idempotent}-{signal_name}")
    ledger = Ledger()
    producer = make_producer(broker, ledger, idempotent)
    stats = []
    for trial in range(trials):
        window = rng.uniform(0.3, 1.5)
        stop = threading.Event()
        exit_status: list[int | None] = []

        def strike(
            window: float = window, stop: threading.Event = stop, status: list = exit_status
        ) -> None:
            time.sleep(window)
            if signal_name == "SIGKILL":
                broker.kill()
            else:
                status.append(broker.stop())
            stop.set()

        striker = threading.Thread(target=strike)
        striker.start()
        sent = produce_until(producer, ledger, trial, stop)
        striker.join()
        acked_before = len(ledger.acked)
        if signal_name == "SIGTERM":
            assert exit_status == [0]
            assert (broker.data_dir / CLEAN_SHUTDOWN_MARKER).exists()
            assert broker.log_tail(5).splitlines()[-1].endswith("broker stopped cleanly")
        if not idempotent:
            # Whatever is not acknowledged now stays in doubt; nothing is retried.
            producer.purge()
            producer.flush(10)
            producer = make_producer(broker, ledger, idempotent)
        broker.start()
        if idempotent:
            assert producer.flush(30) == 0
        stored = check_log(broker, ledger, range(trial, trial + 1))
        stats.append(
            f"trial {trial}: {window:.2f}s, {sent} sent, {acked_before} acked at the "
            f"{signal_name} ({len(ledger.acked)} after), {sum(map(len, stored.values()))} stored"
        )

    print("\n".join(stats), f"\ndelivery failures: {dict(ledger.failed)}")

    if idempotent:
        # Everything was retried to success: every record produced is there, once.
        assert ledger.acked == set(ledger.produced)
    # After the last restart, every trial's records once more, and by a real consumer too.
    stored = check_log(broker, ledger, range(trials))
    ends = {tp: len(records) for tp, records in stored.items()}
    assert consume_all(broker, ends) == stored
    producer.flush(5)
    assert_clean_stop(broker)
