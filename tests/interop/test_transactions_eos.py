"""Exactly-once processing under SIGKILL, against a real `tidelog serve`.

A consume-transform-produce loop run as a child process (eos_worker.py with confluent-kafka,
or the Java harness's `eos-loop` with the Java client) turns each input record `in-<id>` of a
3-partition topic into `out-<id>` of a 3-partition output topic, inside transactions that also
commit the consumed offsets. The test kills it with SIGKILL at
seeded random points (after a random number of output records the broker acknowledged) and
starts it again with the same transactional id, which fences the dead one and aborts its open
transaction. Once the input is consumed:

- the output read with read_committed holds every input id exactly once, none missing;
- the records only read_uncommitted sees are the aborted ones (the kills left some), and a
  read_committed consumer that read the output the whole time never saw one of them (Jepsen's
  G1a, aborted read).

A second test kills the broker itself once in the middle of the run and restarts it; the
loop rides it out, or gives up and is started again (librdkafka's send_offsets_to_transaction
can hang once the group coordinator went away, see eos_worker.bounded), and still every input
is in the output exactly once.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from interop_broker import BrokerProcess
from interop_data import wait_until
from java_harness import JavaClient
from test_transactions import TIMEOUT, broker_args, create_topic, read_records

WORKER = Path(__file__).resolve().parent / "eos_worker.py"
PARTITIONS = 3
INPUTS = 3000
BATCH = 50
KILLS = 10
#: The whole run (kills and restarts included) must be done in this time.
RUN_TIMEOUT = 120.0
#: (partition, offset, value) of one output record.
Seen = tuple[int, int, str]


def eos_broker_args() -> list[str]:
    # A restarted worker joins at once and takes over from a member that died without leaving.
    return broker_args("group.min.session.timeout.ms=1000", "group.initial.rebalance.delay.ms=0")


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    process = BrokerProcess(tmp_path, extra_args=eos_broker_args())
    process.start()
    try:
        yield process
    finally:
        process.stop()


class Worker:
    """One run of a consume-transform-produce loop: eos_worker.py (confluent-kafka) or the Java
    harness's eos-loop; `acked` counts the output records the broker acknowledged to it."""

    def __init__(self, family: Family, broker: BrokerProcess, topic: str) -> None:
        # stderr to a file: a pipe nobody drains would block the worker once it is full
        self.log_path = broker.workdir / f"{topic}-worker.log"
        with self.log_path.open("a") as log:
            self.proc = subprocess.Popen(
                family.command(broker, topic), stdout=subprocess.PIPE, stderr=log, text=True
            )
        self.acked = 0
        #: SIGKILL as soon as `acked` reaches this (from the reading thread, so that the kill
        #: lands right after that acknowledgement, before the transaction can commit)
        self.kill_at: int | None = None
        self.last: dict[str, object] = {}
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.last = json.loads(line)
            if self.last.get("event") == "acked":
                self.acked = int(str(self.last["n"]))
                if self.kill_at is not None and self.acked >= self.kill_at:
                    self.proc.kill()

    def run_until_acked(self, target: int, timeout: float) -> None:
        """Wait until the broker acknowledged `target` of its output records; it must still be
        running then (the input is large enough that it cannot have finished)."""
        wait_until(
            lambda: self.acked >= target or self.exited(),
            f"worker to get {target} records acknowledged",
            timeout=max(timeout, 1.0),
        )
        assert not self.exited(), f"worker exited early: {self.last}\n{self.stderr_tail()}"

    def kill_when_acked(self, target: int, timeout: float) -> None:
        """SIGKILL once the broker acknowledged `target` of its output records."""
        self.kill_at = target
        if self.acked >= target:  # reached before kill_at was set: the reader will not kill
            self.proc.kill()
        wait_until(self.exited, f"worker to get {target} records acknowledged", timeout)
        assert self.proc.returncode == -signal.SIGKILL, (
            f"worker exited by itself with {self.proc.returncode}: {self.last}\n"
            f"{self.stderr_tail()}"
        )

    def exited(self) -> bool:
        return self.proc.poll() is not None

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def stderr_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-2000:]


@dataclass(frozen=True)
class Family:
    """Which client runs the loop; `java` is the built harness (None: confluent-kafka)."""

    java: JavaClient | None = None

    def command(self, broker: BrokerProcess, topic: str) -> list[str]:
        names = {
            "input": f"{topic}-in",
            "output": f"{topic}-out",
            "group": f"{topic}-group",
            "transactional_id": f"{topic}-txn",
        }
        if self.java is not None:
            options = {**names, "total": INPUTS, "batch": BATCH}
            return self.java.bound(broker.bootstrap).argv("eos-loop", options)
        return [sys.executable, str(WORKER), broker.bootstrap, *names.values(), str(INPUTS),
                str(BATCH)]  # fmt: skip


@pytest.fixture(params=["confluent", "java"])
def family(request: pytest.FixtureRequest) -> Family:
    if request.param == "java":
        return Family(request.getfixturevalue("java_client"))
    return Family()


class LiveReader:
    """A read_committed consumer reading the output for the whole run, in a thread."""

    def __init__(self, broker: BrokerProcess, topic: str) -> None:
        self.seen: list[Seen] = []
        self._stop = threading.Event()
        self._consumer = Consumer(
            {
                "bootstrap.servers": broker.bootstrap,
                "group.id": f"{topic}-live",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
            }
        )
        self._consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            message = self._consumer.poll(0.2)
            if message is None or message.error():
                continue  # a broker restart shows up as transport errors; it reconnects
            self.seen.append((message.partition(), message.offset(), message.value().decode()))

    def stop(self) -> list[Seen]:
        self._stop.set()
        self._thread.join(TIMEOUT)
        self._consumer.close()
        return self.seen


def read_all(broker: BrokerProcess, topic: str, *, committed: bool) -> list[Seen]:
    return read_records(broker, topic, PARTITIONS, committed=committed)


def write_inputs(broker: BrokerProcess, topic: str) -> None:
    create_topic(broker, f"{topic}-in", PARTITIONS)
    create_topic(broker, f"{topic}-out", PARTITIONS)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    for i in range(INPUTS):
        producer.produce(f"{topic}-in", key=str(i).encode(), value=f"in-{i}".encode(),
                         partition=i % PARTITIONS)  # fmt: skip
    assert producer.flush(TIMEOUT) == 0


def run_to_completion(family: Family, broker: BrokerProcess, topic: str, deadline: float) -> int:
    """Start workers until one exits 0 (an exit 3 is a worker that gave up after a broker
    restart: it is started again, as the kills are). Returns how many were started."""
    starts = 0
    while True:
        assert time.monotonic() < deadline, "the input was not consumed in time"
        worker = Worker(family, broker, topic)
        starts += 1
        status = worker.proc.wait(max(deadline - time.monotonic(), 1.0))
        if status == 0:
            return starts
        assert status == 3, f"worker exit {status}: {worker.last}\n{worker.stderr_tail()}"


def check_exactly_once(broker: BrokerProcess, topic: str, live: list[Seen]) -> None:
    committed = read_all(broker, f"{topic}-out", committed=True)
    uncommitted = read_all(broker, f"{topic}-out", committed=False)
    counts = Counter(value for _, _, value in committed)
    expected = {f"out-{i}" for i in range(INPUTS)}
    missing = expected - counts.keys()
    twice = {value: n for value, n in counts.items() if n > 1}
    assert not missing, f"{len(missing)} inputs missing from the output, e.g. {sorted(missing)[:5]}"
    assert not twice, f"{len(twice)} inputs in the output more than once, e.g. {list(twice)[:5]}"
    assert counts.keys() == expected, sorted(counts.keys() - expected)[:5]
    # read_committed is a subset of read_uncommitted, record for record
    assert set(committed) <= set(uncommitted)
    aborted = set(uncommitted) - set(committed)
    # the kills left aborted transactions behind: without some, G1a below would prove nothing
    assert aborted, "no aborted output record: no kill landed inside a transaction"
    # every aborted record repeats an input id whose committed copy is elsewhere
    assert {value for _, _, value in aborted} <= expected
    # G1a: the consumer reading during the run never saw an aborted record, nor a duplicate
    assert live, "the consumer reading during the run saw nothing"
    assert not set(live) & aborted, sorted(set(live) & aborted)[:5]
    assert set(live) <= set(committed)
    assert len({value for _, _, value in live}) == len(live)


def test_worker_killed_ten_times_processes_every_input_exactly_once(
    family: Family, broker: BrokerProcess, topic_name: str
) -> None:
    write_inputs(broker, topic_name)
    live = LiveReader(broker, f"{topic_name}-out")
    rng = random.Random(20261128)
    deadline = time.monotonic() + RUN_TIMEOUT
    kills = 0
    try:
        while kills < KILLS:
            worker = Worker(family, broker, topic_name)
            # at most KILLS * 250 < INPUTS acknowledged before the kills: input remains for each
            target = rng.randint(1, 250)
            worker.kill_when_acked(target, max(deadline - time.monotonic(), 1.0))
            kills += 1
        run_to_completion(family, broker, topic_name, deadline)
    finally:
        seen_live = live.stop()
    check_exactly_once(broker, topic_name, seen_live)


def test_broker_killed_mid_run_loses_and_repeats_nothing(
    family: Family, broker: BrokerProcess, topic_name: str
) -> None:
    write_inputs(broker, topic_name)
    deadline = time.monotonic() + RUN_TIMEOUT
    worker = Worker(family, broker, topic_name)
    target = random.Random(7).randint(300, 1500)
    try:
        worker.run_until_acked(target, RUN_TIMEOUT)
        broker.restart(hard=True)
        # the worker rides out the restart (or gives up and is started again)
        status = worker.proc.wait(max(deadline - time.monotonic(), 1.0))
        assert status in (0, 3), f"worker exit {status}: {worker.last}\n{worker.stderr_tail()}"
        if status == 3:
            run_to_completion(family, broker, topic_name, deadline)
    finally:
        if not worker.exited():
            worker.kill()
    committed = read_all(broker, f"{topic_name}-out", committed=True)
    counts = Counter(value for _, _, value in committed)
    assert counts == Counter(f"out-{i}" for i in range(INPUTS)), (
        sorted(v for v, n in counts.items() if n > 1)[:5],
        len(counts),
    )
